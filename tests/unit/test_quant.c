/* Tests of the weight types (kernels/cpu/ktype.c, fp16.c, quant_*.c):
 *   - the type table: sizes of every ggml id, unknown ids, ktype_row_bytes limits and overflow;
 *   - fp16 / bf16 conversions: all 65536 halves round-trip, fp32 -> fp16 agrees with F16C and
 *     with an independent double-precision rounding on random and edge values;
 *   - per compute type, on seeded random rows (seed printed; TANDEM_SEED=... replays): quantize
 *     then dequantize stays within the type's error bound, SIMD dequant == scalar dequant bit for
 *     bit, dot_row and dot_row_ref agree with a double-precision dot of the dequantized row. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static int n_fail;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

/* ---- seeded random numbers ---------------------------------------------------------------- */
static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double rng_unif(void) /* (0, 1) */
{
	return ((double)(rng_next() >> 11) + 0.5) * 0x1p-53;
}

static float rng_gauss(void)
{
	return (float)(sqrt(-2.0 * log(rng_unif())) * cos(2.0 * M_PI * rng_unif()));
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- type table ------------------------------------------------------------------------------ */
static void test_type_table(void)
{
	static const struct {
		int id;
		const char *name;
		int blck, bytes;
		bool compute;
	} want[] = {
	    {0, "F32", 1, 4, true},         {1, "F16", 1, 2, true},         {2, "Q4_0", 32, 18, true},
	    {3, "Q4_1", 32, 20, true},      {6, "Q5_0", 32, 22, true},      {7, "Q5_1", 32, 24, true},
	    {8, "Q8_0", 32, 34, true},      {9, "Q8_1", 32, 36, false},     {10, "Q2_K", 256, 84, true},
	    {11, "Q3_K", 256, 110, true},   {12, "Q4_K", 256, 144, true},   {13, "Q5_K", 256, 176, true},
	    {14, "Q6_K", 256, 210, true},   {15, "Q8_K", 256, 292, false},  {16, "IQ2_XXS", 256, 66, true},
	    {17, "IQ2_XS", 256, 74, true},  {18, "IQ3_XXS", 256, 98, true}, {19, "IQ1_S", 256, 50, true},
	    {20, "IQ4_NL", 32, 18, true},   {21, "IQ3_S", 256, 110, true},  {22, "IQ2_S", 256, 82, true},
	    {23, "IQ4_XS", 256, 136, true}, {24, "I8", 1, 1, false},        {25, "I16", 1, 2, false},
	    {26, "I32", 1, 4, false},       {27, "I64", 1, 8, false},       {28, "F64", 1, 8, false},
	    {29, "IQ1_M", 256, 56, true},   {30, "BF16", 1, 2, true},       {34, "TQ1_0", 256, 54, false},
	    {35, "TQ2_0", 256, 66, false},  {39, "MXFP4", 32, 17, false},
	};
	static const int unknown[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 1000, -1000};
	size_t sz;

	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		const struct ktype_info *t = ktype_get(want[i].id);
		CHECK(t != NULL, "type %d missing", want[i].id);
		if (!t)
			continue;
		CHECK(strcmp(t->name, want[i].name) == 0, "type %d name %s", want[i].id, t->name);
		CHECK(t->blck == want[i].blck && t->bytes == want[i].bytes,
		      "type %s: %d elements / %d bytes, want %d / %d", t->name, t->blck, t->bytes,
		      want[i].blck, want[i].bytes);
		CHECK(t->compute == want[i].compute, "type %s compute %d", t->name, t->compute);
		CHECK(strcmp(ktype_name(want[i].id), want[i].name) == 0, "ktype_name(%d)", want[i].id);
		/* one row of 4096 elements, and a partial block */
		CHECK(ktype_row_bytes(want[i].id, 4096, &sz) &&
		          sz == (size_t)(4096 / want[i].blck) * (size_t)want[i].bytes,
		      "row bytes %s", t->name);
		if (want[i].blck > 1)
			CHECK(!ktype_row_bytes(want[i].id, want[i].blck + 1, &sz),
			      "%s accepts a partial block", t->name);
		CHECK(!ktype_row_bytes(want[i].id, -want[i].blck, &sz), "%s accepts n < 0", t->name);
		CHECK(ktype_row_bytes(want[i].id, 0, &sz) && sz == 0, "%s n = 0", t->name);
	}
	for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
		char buf[32];
		snprintf(buf, sizeof buf, "type %d", unknown[i]);
		CHECK(ktype_get(unknown[i]) == NULL, "id %d should be unknown", unknown[i]);
		CHECK(!ktype_row_bytes(unknown[i], 32, &sz), "row bytes of unknown id %d", unknown[i]);
		CHECK(strcmp(ktype_name(unknown[i]), buf) == 0, "ktype_name(%d) = %s", unknown[i],
		      ktype_name(unknown[i]));
	}
	/* overflow (64-bit size_t): F32 n = INT64_MAX/2 needs exactly SIZE_MAX - 3 bytes, one more
	 * element overflows; F64 overflows from INT64_MAX/4 + 1 on; block types cannot overflow
	 * with an int64 n but must still give exact sizes at the top of the range */
	if (sizeof(size_t) == 8) {
		CHECK(ktype_row_bytes(KT_F32, INT64_MAX / 2, &sz) && sz == SIZE_MAX - 3, "F32 max");
		CHECK(!ktype_row_bytes(KT_F32, INT64_MAX / 2 + 1, &sz), "F32 overflow not caught");
		CHECK(!ktype_row_bytes(KT_F32, INT64_MAX, &sz), "F32 INT64_MAX");
		CHECK(ktype_row_bytes(KT_F64, INT64_MAX / 4, &sz) && sz == (size_t)(INT64_MAX / 4) * 8,
		      "F64 max");
		CHECK(!ktype_row_bytes(KT_F64, INT64_MAX / 4 + 1, &sz), "F64 overflow not caught");
		CHECK(ktype_row_bytes(KT_Q8_0, (INT64_MAX / 32) * 32, &sz) &&
		          sz == (size_t)(INT64_MAX / 32) * 34,
		      "Q8_0 top of range");
	}
	CHECK(ktype_row_bytes(KT_Q8_0, (int64_t)1 << 40, &sz) && sz == ((size_t)1 << 35) * 34,
	      "Q8_0 2^40 elements");
	CHECK(!ktype_row_bytes(KT_Q4_K, INT64_MAX, &sz), "Q4_K INT64_MAX is not whole blocks");
	printf("type table: %zu known ids, %zu unknown ids checked\n", sizeof want / sizeof want[0],
	       sizeof unknown / sizeof unknown[0]);
}

/* ---- fp16 / bf16 -------------------------------------------------------------------------- */

/* independent reference: round a float to the nearest fp16 value (ties to even) in double */
static uint16_t fp16_from_double_ref(float f)
{
	if (isnan(f))
		return 0x7e00;
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	double a = fabs((double)f);
	if (a >= 65520.0)
		return sign | 0x7c00;
	int e;
	frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	int exp = e - 1; /* a in [2^exp, 2^(exp+1)) */
	if (exp < -14)
		exp = -14; /* subnormal spacing */
	double ulp = ldexp(1.0, exp - 10);
	double q = a / ulp; /* exact */
	double r = nearbyint(q); /* ties to even under the default rounding mode */
	double v = r * ulp;
	/* encode v */
	if (v == 0.0)
		return sign;
	frexp(v, &e);
	exp = e - 1;
	if (exp < -14)
		return sign | (uint16_t)(v / ldexp(1.0, -24));
	uint16_t mant = (uint16_t)(v / ldexp(1.0, exp - 10)) - 1024;
	return sign | (uint16_t)((exp + 15) << 10) | mant;
}

static void test_fp16(void)
{
	int bad = 0;

	for (uint32_t h = 0; h < 65536; h++) {
		float f = kfp16_to_f32((uint16_t)h);
		bool is_nan = ((h >> 10) & 31) == 31 && (h & 0x3ff);
#if defined(__F16C__)
		float hw = _cvtsh_ss((unsigned short)h);
		if (f32_bits(hw) != f32_bits(f) && !(is_nan && isnan(hw)))
			bad++;
#endif
		if (!is_nan && kf32_to_fp16(f) != h)
			bad++;
		if (is_nan && !isnan(f))
			bad++;
	}
	CHECK(bad == 0, "fp16 round trip: %d of 65536 halves wrong", bad);

	int bad_rand = 0, n_rand = 2000000;
	for (int i = 0; i < n_rand; i++) {
		/* random bit patterns concentrated around the fp16 range */
		uint32_t u = (uint32_t)rng_next();
		if (i & 1)
			u = (u & 0x807fffffu) | ((uint32_t)(100 + (rng_next() % 48)) << 23);
		float f = bits_f32(u);
		uint16_t got = kf32_to_fp16(f);
		if (isnan(f)) {
			if (((got >> 10) & 31) != 31 || !(got & 0x3ff))
				bad_rand++;
			continue;
		}
		uint16_t want = fp16_from_double_ref(f);
#if defined(__F16C__)
		uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
		if (hw != want)
			bad_rand++;
#endif
		if (got != want) {
			if (bad_rand < 5)
				printf("  fp16(%a) = %04x want %04x\n", (double)f, got, want);
			bad_rand++;
		}
	}
	CHECK(bad_rand == 0, "fp32 -> fp16: %d of %d random values wrong", bad_rand, n_rand);
	/* edges */
	CHECK(kf32_to_fp16(65504.0f) == 0x7bff, "max half");
	CHECK(kf32_to_fp16(65519.99f) == 0x7bff, "just below the inf threshold");
	CHECK(kf32_to_fp16(65520.0f) == 0x7c00, "65520 -> inf");
	CHECK(kf32_to_fp16(0x1p-24f) == 0x0001, "min subnormal");
	CHECK(kf32_to_fp16(0x1p-25f) == 0x0000, "half of min subnormal ties to even (0)");
	CHECK(kf32_to_fp16(0x1.8p-24f) == 0x0002, "1.5 * min subnormal ties to even (2)");
	CHECK(kf32_to_fp16(-0.0f) == 0x8000, "-0");
	CHECK(kf32_to_fp16(-INFINITY) == 0xfc00, "-inf");
	CHECK(kfp16_to_f32(0x3c00) == 1.0f && kfp16_to_f32(0xc000) == -2.0f, "1, -2");

	/* bf16: exact widening, ties-to-even narrowing, NaN stays NaN */
	CHECK(kbf16_to_f32(0x3f80) == 1.0f, "bf16 1");
	CHECK(kf32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80, "bf16 tie to even (down)");
	CHECK(kf32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82, "bf16 tie to even (up)");
	CHECK(kf32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81, "bf16 above tie");
	CHECK(kf32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80, "bf16 max float -> inf");
	CHECK(isnan(kbf16_to_f32(kf32_to_bf16(bits_f32(0x7fffffffu)))), "bf16 NaN");
	CHECK(isnan(kbf16_to_f32(kf32_to_bf16(bits_f32(0x7f800001u)))), "bf16 sNaN stays NaN");
	int bad_bf = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kbf16_to_f32((uint16_t)h);
		if (!isnan(f) && kf32_to_bf16(f) != h)
			bad_bf++;
	}
	CHECK(bad_bf == 0, "bf16 round trip: %d wrong", bad_bf);
	printf("fp16/bf16: 65536 halves, %d random floats, edges\n", n_rand);
}

/* ---- per-type round trip and dots ---------------------------------------------------------- */
/* RMS bounds of the codebook types (2, 2.3, 2.5, 3, 3.4, 1.6, 1.75 bits a weight) */
#define IQB_2XXS 0.45
#define IQB_2XS 0.42
#define IQB_2S 0.36
#define IQB_3XXS 0.25
#define IQB_3S 0.19
#define IQB_1S 0.68
#define IQB_1M 0.63

struct type_case {
	int type;
	double rms_bound; /* max RMS(dequant - x) / RMS(x) on N(0,1) data */
};

static const struct type_case cases[] = {
    {KT_F32, 0.0},
    {KT_F16, 0.0005},
    {KT_BF16, 0.004},
    {KT_Q8_0, 0.01},
    {KT_Q4_0, 0.12},
    {KT_Q4_1, 0.11},
    {KT_Q5_0, 0.06},
    {KT_Q5_1, 0.055},
    {KT_IQ4_NL, 0.11},
    {KT_Q2_K, 0.45},
    {KT_Q3_K, 0.22},
    {KT_Q4_K, 0.12},
    {KT_Q5_K, 0.06},
    {KT_Q6_K, 0.03},
    {KT_IQ4_XS, 0.12},
    /* the codebook types' quantizers are simple (quant_iqg.c): bounds as measured, with margin */
    {KT_IQ2_XXS, IQB_2XXS},
    {KT_IQ2_XS, IQB_2XS},
    {KT_IQ2_S, IQB_2S},
    {KT_IQ3_XXS, IQB_3XXS},
    {KT_IQ3_S, IQB_3S},
    {KT_IQ1_S, IQB_1S},
    {KT_IQ1_M, IQB_1M},
};

static void test_type(const struct type_case *c)
{
	const struct ktype_info *t = ktype_get(c->type);
	static const int64_t sizes[] = {256, 512, 2048, 6144};
	double worst_rms = 0.0, worst_dot = 0.0, worst_ref = 0.0, worst_pair = 0.0;

	for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
		int64_t n = sizes[si];
		size_t rb;
		if (!ktype_row_bytes(c->type, n, &rb)) {
			CHECK(0, "%s row bytes", t->name);
			return;
		}
		float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
		float *y2 = malloc(sizeof(float) * (size_t)n), *a = malloc(sizeof(float) * (size_t)n);
		uint8_t *q = malloc(rb + 64);

		for (int rep = 0; rep < 4; rep++) {
			/* rep 0: N(0,1); 1: scaled small; 2: with outliers; 3: positive shifted */
			for (int64_t i = 0; i < n; i++) {
				float v = rng_gauss();
				if (rep == 1)
					v *= 1e-3f;
				if (rep == 2 && rng_next() % 64 == 0)
					v *= 8.0f;
				if (rep == 3)
					v = v * 0.5f + 1.0f;
				x[i] = v;
				a[i] = rng_gauss();
			}
			memset(q, 0xa5, rb + 64);
			kcpu_quantize_row(c->type, x, q, n);
			CHECK(q[rb] == 0xa5, "%s quantize wrote past the row", t->name);
			kcpu_dequant_row_ref(c->type, q, y, n);
			kcpu_dequant_row(c->type, q, y2, n);
			CHECK(memcmp(y, y2, sizeof(float) * (size_t)n) == 0,
			      "%s: SIMD dequant differs from the scalar reference (n=%lld)", t->name,
			      (long long)n);
			double se = 0, sx = 0;
			for (int64_t i = 0; i < n; i++) {
				se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
				sx += (double)x[i] * x[i];
			}
			double rel = sqrt(se / sx);
			if (rep != 2 && rel > worst_rms)
				worst_rms = rel;
			/* outliers make RMS error larger; allow twice the bound there */
			CHECK(rel <= (rep == 2 ? 2 : 1) * c->rms_bound,
			      "%s: dequant rms error %.5f > %.5f (n=%lld rep %d)", t->name, rel, c->rms_bound,
			      (long long)n, rep);

			/* dots against the dequantized row, exact in double */
			double exact = 0, mag = 0;
			for (int64_t i = 0; i < n; i++) {
				exact += (double)y[i] * a[i];
				mag += fabs((double)y[i] * a[i]);
			}
			float d_fast = kcpu_dot_row(c->type, q, a, n);
			float d_ref = kcpu_dot_row_ref(c->type, q, a, n);
			double e_fast = fabs(d_fast - exact) / mag, e_ref = fabs(d_ref - exact) / mag;
			worst_dot = fmax(worst_dot, e_fast);
			worst_ref = fmax(worst_ref, e_ref);
			/* fp32 accumulation: relative to sum |w x| (the scale of the rounding errors) */
			CHECK(e_fast < 1e-5, "%s: dot_row %.9g vs exact %.9g (err %.3g of sum|wx|, n=%lld)",
			      t->name, d_fast, exact, e_fast, (long long)n);
			CHECK(e_ref < 1e-5, "%s: dot_row_ref %.9g vs exact %.9g (err %.3g, n=%lld)", t->name,
			      d_ref, exact, e_ref, (long long)n);
			/* SIMD vs scalar reference directly: the same sum in another order, so they may
			 * differ by fp32 reassociation only: a few ulp of sum |w x| times log2(n) */
			double e_pair = fabs((double)d_fast - d_ref) / mag;
			worst_pair = fmax(worst_pair, e_pair);
			CHECK(e_pair < 2e-6,
			      "%s: dot_row %.9g vs dot_row_ref %.9g (diff %.3g of sum|wx|, n=%lld)", t->name,
			      d_fast, d_ref, e_pair, (long long)n);
		}
		free(x);
		free(y);
		free(y2);
		free(a);
		free(q);
	}
	printf("%-7s rms err %.5f (bound %.5f)  dot err %.2e  ref dot err %.2e  simd-ref %.2e (of "
	       "sum|wx|)\n",
	       t->name, worst_rms, c->rms_bound, worst_dot, worst_ref, worst_pair);
}

/* ---- hand-built blocks ----------------------------------------------------------------------
 * Blocks with chosen bit patterns; the expected values are worked out here from the formulas in
 * MODEL-SPEC.md §5 (not from the kernels), and must match both decoders bit for bit. */
#define H_1 0x3c00 /* fp16  1.0 */
#define H_HALF 0x3800 /* fp16  0.5 */
#define H_2 0x4000 /* fp16  2.0 */
#define H_M1 0xbc00 /* fp16 -1.0 */
#define H_Q 0x3400 /* fp16  0.25 */

static const float T4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void check_hand(int type, const uint8_t *blk, const float *want, int64_t n, const char *what)
{
	float *got = malloc(sizeof(float) * (size_t)n), *got2 = malloc(sizeof(float) * (size_t)n);
	int bad = 0;

	kcpu_dequant_row_ref(type, blk, got, n);
	kcpu_dequant_row(type, blk, got2, n);
	for (int64_t i = 0; i < n; i++) {
		bool same = f32_bits(got[i]) == f32_bits(want[i]) && f32_bits(got2[i]) == f32_bits(want[i]);
		if (!same && bad++ < 3)
			printf("  %s %s element %lld: ref %.9g simd %.9g want %.9g\n", ktype_name(type), what,
			       (long long)i, got[i], got2[i], want[i]);
	}
	CHECK(bad == 0, "%s hand-built block (%s): %d of %lld values differ", ktype_name(type), what, bad,
	      (long long)n);
	free(got);
	free(got2);
}

static void test_hand_blocks(void)
{
	uint8_t b[2 * 210];
	float w[512];

	/* F16 / BF16 / F32: specials */
	static const uint16_t h16[8] = {0x3c00, 0x0001, 0x7bff, 0xfc00, 0x8000, 0x3555, 0x03ff, 0xc000};
	static const float h16v[8] = {1.0f,  0x1p-24f,    65504.0f,     -INFINITY,
	                              -0.0f, 0x1.554p-2f, 0x1.ff8p-15f, -2.0f};
	for (int i = 0; i < 8; i++)
		put16(b + 2 * i, h16[i]);
	check_hand(KT_F16, b, h16v, 8, "specials");
	static const uint16_t hb[6] = {0x3f80, 0xc040, 0x0001, 0x7f80, 0x8000, 0x4049};
	static const float hbv[6] = {1.0f, -3.0f, 0x1p-133f, INFINITY, -0.0f, 3.140625f};
	for (int i = 0; i < 6; i++)
		put16(b + 2 * i, hb[i]);
	check_hand(KT_BF16, b, hbv, 6, "specials");
	memcpy(b, hbv, sizeof hbv);
	check_hand(KT_F32, b, hbv, 6, "copy");

	/* Q8_0: d = 0.5, q_j = 8j - 128 */
	put16(b, H_HALF);
	for (int j = 0; j < 32; j++) {
		b[2 + j] = (uint8_t)(int8_t)(8 * j - 128);
		w[j] = 0.5f * (float)(8 * j - 128);
	}
	check_hand(KT_Q8_0, b, w, 32, "d=0.5 ramp");

	/* Q4_0: d = 2, low nibble j, high nibble 15 - j */
	put16(b, H_2);
	for (int j = 0; j < 16; j++) {
		b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
		w[j] = 2.0f * (float)(j - 8);
		w[j + 16] = 2.0f * (float)(7 - j);
	}
	check_hand(KT_Q4_0, b, w, 32, "nibble ramps");

	/* Q4_1: d = 0.5, m = -1 */
	put16(b, H_HALF);
	put16(b + 2, H_M1);
	for (int j = 0; j < 16; j++) {
		b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
		w[j] = 0.5f * (float)j - 1.0f;
		w[j + 16] = 0.5f * (float)(15 - j) - 1.0f;
	}
	check_hand(KT_Q4_1, b, w, 32, "d=0.5 m=-1");

	/* Q5_0: d = 1, qh = 0xAAAA5555 (even j < 16 and odd j >= 16 get the 5th bit), nibbles j, j */
	put16(b, H_1);
	b[2] = 0x55, b[3] = 0x55, b[4] = 0xaa, b[5] = 0xaa;
	for (int j = 0; j < 16; j++) {
		b[6 + j] = (uint8_t)(j | (j << 4));
		w[j] = (float)(j + (j % 2 == 0 ? 16 : 0) - 16);
		w[j + 16] = (float)(j + (j % 2 == 1 ? 16 : 0) - 16);
	}
	check_hand(KT_Q5_0, b, w, 32, "qh 0xAAAA5555");

	/* Q5_1: d = 0.25, m = 1, qh = 0xFFFF0000 */
	put16(b, H_Q);
	put16(b + 2, H_1);
	b[4] = 0, b[5] = 0, b[6] = 0xff, b[7] = 0xff;
	for (int j = 0; j < 16; j++) {
		b[8 + j] = (uint8_t)(j | (j << 4));
		w[j] = 0.25f * (float)j + 1.0f;
		w[j + 16] = 0.25f * (float)(j + 16) + 1.0f;
	}
	check_hand(KT_Q5_1, b, w, 32, "qh 0xFFFF0000");

	/* IQ4_NL: d = -1, low nibble j, high 15 - j */
	put16(b, H_M1);
	for (int j = 0; j < 16; j++) {
		b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
		w[j] = -1.0f * T4[j];
		w[j + 16] = -1.0f * T4[15 - j];
	}
	check_hand(KT_IQ4_NL, b, w, 32, "grid ramps");

	/* Q2_K, two blocks: scales[s] = s | (15 - s) << 4 (scale s, min 15 - s), d = 1, dmin = 0.5.
	 * Block 0: every qs byte 0xE4 (2-bit fields 0,1,2,3 -> field j = j). Block 1: byte k holds
	 * k % 4 in all four fields. Element e: n = e/128, j = (e%128)/32, half = (e%32)/16,
	 * l = e%16, scale index s = 8n + 2j + half, byte 32n + 16half + l. */
	for (int blk = 0; blk < 2; blk++) {
		uint8_t *q = b + 84 * blk;
		for (int s = 0; s < 16; s++)
			q[s] = (uint8_t)(s | ((15 - s) << 4));
		for (int k = 0; k < 64; k++)
			q[16 + k] = blk == 0 ? 0xe4 : (uint8_t)((k % 4) * 0x55);
		put16(q + 80, H_1);
		put16(q + 82, H_HALF);
		for (int e = 0; e < 256; e++) {
			int n = e / 128, j = (e % 128) / 32, half = (e % 32) / 16, l = e % 16;
			int s = 8 * n + 2 * j + half;
			int qv = blk == 0 ? j : (32 * n + 16 * half + l) % 4;
			w[256 * blk + e] = 1.0f * (float)s * (float)qv - 0.5f * (float)(15 - s);
		}
	}
	check_hand(KT_Q2_K, b, w, 512, "scale/min ramps");

	/* Q3_K: d = 1; scale bytes b[k] = k | (15 - k) << 4 (k < 8), b[8..11] = 0xE4, which gives
	 * (by the §5.2 unpacking) S_s = s - 32 (s < 4), s - 16 (s < 8), 23 - s (s < 12), 39 - s;
	 * hmask[k] = 0x0F for k < 16, 0xF0 after: the high bit (4n + j) is set iff half == n;
	 * qs bytes 0xE4: q2 = j. x = d * S * (q2 - (hbit ? 0 : 4)). */
	memset(b, 0, 110);
	for (int k = 0; k < 32; k++)
		b[k] = k < 16 ? 0x0f : 0xf0;
	for (int k = 0; k < 64; k++)
		b[32 + k] = 0xe4;
	for (int k = 0; k < 8; k++)
		b[96 + k] = (uint8_t)(k | ((15 - k) << 4));
	for (int k = 0; k < 4; k++)
		b[104 + k] = 0xe4;
	put16(b + 108, H_1);
	for (int e = 0; e < 256; e++) {
		int n = e / 128, j = (e % 128) / 32, half = (e % 32) / 16;
		int s = 8 * n + 2 * j + half;
		int S = s < 4 ? s - 32 : s < 8 ? s - 16 : s < 12 ? 23 - s : 39 - s;
		int hbit = half == n;
		w[e] = 1.0f * (float)S * (float)(j - (hbit ? 0 : 4));
	}
	check_hand(KT_Q3_K, b, w, 256, "signed 6-bit scales");

	/* Q4_K / Q5_K: d = 1, dmin = 0.5, scales bytes chosen so that (§5.2) sc = {1,2,3,4,1,51,5,23}
	 * and m = {5,6,7,8,2,4,38,8} (top bits of bytes 0..7 feed sub-blocks 4..7). Nibbles in chunk
	 * c: low = (l + c) & 15, high = 15 - (l & 15). Q5_K adds qh[l] = l: bit 2c of l for the low
	 * half, bit 2c+1 for the high half. */
	static const uint8_t k4s[12] = {0x01, 0xc2, 0x03, 0x44, 0x05, 0x06,
	                                0x87, 0x08, 0x21, 0x43, 0x65, 0x87};
	static const int k4sc[8] = {1, 2, 3, 4, 1, 51, 5, 23}, k4m[8] = {5, 6, 7, 8, 2, 4, 38, 8};
	for (int five = 0; five < 2; five++) {
		uint8_t *qs = b + (five ? 48 : 16);
		put16(b, H_1);
		put16(b + 2, H_HALF);
		memcpy(b + 4, k4s, 12);
		if (five)
			for (int l = 0; l < 32; l++)
				b[16 + l] = (uint8_t)l;
		for (int c = 0; c < 4; c++)
			for (int l = 0; l < 32; l++)
				qs[32 * c + l] = (uint8_t)(((l + c) & 15) | ((15 - (l & 15)) << 4));
		for (int e = 0; e < 256; e++) {
			int c = e / 64, r = e % 64, sb = e / 32, l = e % 32;
			int q = r < 32 ? (l + c) & 15 : 15 - (l & 15);
			if (five)
				q += 16 * ((l >> (r < 32 ? 2 * c : 2 * c + 1)) & 1);
			w[e] = 1.0f * (float)k4sc[sb] * (float)q - 0.5f * (float)k4m[sb];
		}
		check_hand(five ? KT_Q5_K : KT_Q4_K, b, w, 256, "6-bit scale/min packing");
	}

	/* Q6_K: d = 0.5, scales s[k] = k - 8, ql[k] = (k & 15) | ((k >> 1) & 15) << 4, qh[k] = k.
	 * Expected straight from the §5.2 element formulas. */
	for (int k = 0; k < 128; k++)
		b[k] = (uint8_t)((k & 15) | (((k >> 1) & 15) << 4));
	for (int k = 0; k < 64; k++)
		b[128 + k] = (uint8_t)k;
	for (int k = 0; k < 16; k++)
		b[192 + k] = (uint8_t)(int8_t)(k - 8);
	put16(b + 208, H_HALF);
	for (int n = 0; n < 2; n++) {
		const uint8_t *QL = b + 64 * n, *QH = b + 128 + 32 * n;
		const int8_t *SC = (const int8_t *)(b + 192 + 8 * n);
		for (int l = 0; l < 32; l++) {
			int is = l / 16;
			int q0 = (QL[l] & 15) | (((QH[l] >> 0) & 3) << 4);
			int q1 = (QL[l + 32] & 15) | (((QH[l] >> 2) & 3) << 4);
			int q2 = (QL[l] >> 4) | (((QH[l] >> 4) & 3) << 4);
			int q3 = (QL[l + 32] >> 4) | (((QH[l] >> 6) & 3) << 4);
			w[128 * n + l] = 0.5f * (float)SC[is] * (float)(q0 - 32);
			w[128 * n + l + 32] = 0.5f * (float)SC[is + 2] * (float)(q1 - 32);
			w[128 * n + l + 64] = 0.5f * (float)SC[is + 4] * (float)(q2 - 32);
			w[128 * n + l + 96] = 0.5f * (float)SC[is + 6] * (float)(q3 - 32);
		}
	}
	check_hand(KT_Q6_K, b, w, 256, "int8 scales, qh = k");

	/* IQ4_XS: d = 0.5, scales_l = {0x10,0x32,0x54,0x76} (low 4 bits of ls = ib), scales_h =
	 * 0xE4E4 (high 2 bits = ib & 3): ls = ib | (ib & 3) << 4, dl = 0.5 * (ls - 32) */
	put16(b, H_HALF);
	put16(b + 2, 0xe4e4);
	b[4] = 0x10, b[5] = 0x32, b[6] = 0x54, b[7] = 0x76;
	for (int ib = 0; ib < 8; ib++) {
		float dl = 0.5f * (float)((ib | ((ib & 3) << 4)) - 32);
		for (int j = 0; j < 16; j++) {
			b[8 + 16 * ib + j] = (uint8_t)(j | ((15 - j) << 4));
			w[32 * ib + j] = dl * T4[j];
			w[32 * ib + j + 16] = dl * T4[15 - j];
		}
	}
	check_hand(KT_IQ4_XS, b, w, 256, "6-bit scales");
	printf("hand-built blocks: 15 types checked bit for bit\n");
}

/* Degenerate rows: all zeros must come back as exact zeros; constant rows, tiny (subnormal)
 * and large values must stay finite and within the type's error; NaN inputs must not crash. */
static void test_degenerate(void)
{
	enum { N = 512 };
	static const int types[] = {KT_F32,     KT_F16,   KT_BF16,   KT_Q8_0,    KT_Q4_0,   KT_Q4_1,
	                            KT_Q5_0,    KT_Q5_1,  KT_IQ4_NL, KT_Q2_K,    KT_Q3_K,   KT_Q4_K,
	                            KT_Q5_K,    KT_Q6_K,  KT_IQ4_XS, KT_IQ2_XXS, KT_IQ2_XS, KT_IQ2_S,
	                            KT_IQ3_XXS, KT_IQ3_S, KT_IQ1_S,  KT_IQ1_M};
	float x[N], y[N];
	uint8_t q[4 * N];

	for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
		int t = types[ti];
		const char *nm = ktype_name(t);
		memset(x, 0, sizeof x);
		kcpu_quantize_row(t, x, q, N);
		kcpu_dequant_row(t, q, y, N);
		int nz = 0;
		for (int i = 0; i < N; i++)
			nz += y[i] != 0.0f;
		CHECK(nz == 0, "%s: zero row dequantizes to %d non-zeros", nm, nz);
		CHECK(kcpu_dot_row(t, q, x, N) == 0.0f, "%s: zero dot", nm);

		static const float scales[] = {1e-30f, 1e-6f, 1.0f, 1000.0f};
		for (int k = 0; k < 4; k++) {
			for (int i = 0; i < N; i++)
				x[i] = scales[k] * (i % 2 ? 1.0f : 0.75f) * (i % 5 == 0 ? -1.0f : 1.0f);
			kcpu_quantize_row(t, x, q, N);
			kcpu_dequant_row(t, q, y, N);
			/* fp16 block scales cannot represent blocks below ~1e-5 (the scale is max/127 or
			 * smaller and fp16 ends at 6e-8): such blocks may flush to zero (error = |x|) */
			float bound = scales[k] < 1e-4f ? 1.0001f * scales[k] : 0.6f * scales[k];
			/* Codebook types cannot place every value: IQ2_XXS / IQ2_XS / IQ3_XXS store 7 of 8
			 * signs (the count of negatives is even), so a group with an odd count has one
			 * value on the wrong side, and a small codebook lacks some magnitude patterns.
			 * There at most one value a group of 8 may be off, by at most 2 |x|. */
			const bool cb = t == KT_IQ2_XXS || t == KT_IQ2_XS || t == KT_IQ2_S ||
			                t == KT_IQ3_XXS || t == KT_IQ3_S || t == KT_IQ1_S || t == KT_IQ1_M;
			int bad = 0, off = 0, far = 0;
			for (int i = 0; i < N; i++) {
				const float e = fabsf(y[i] - x[i]);
				bad += !isfinite(y[i]) || e > bound;
				far += !isfinite(y[i]) || e > 2.0f * fabsf(x[i]) + bound;
			}
			for (int g = 0; cb && g < N / 8; g++) {
				int m = 0;
				for (int j = 0; j < 8; j++)
					m += !(fabsf(y[8 * g + j] - x[8 * g + j]) <= bound);
				off += m > 1;
			}
			if (cb)
				CHECK(off == 0 && far == 0,
				      "%s: %d groups of 8 with two values off, %d values off by > 2|x|, "
				      "scale %g",
				      nm, off, far, (double)scales[k]);
			else
				CHECK(bad == 0, "%s: %d of %d values off for a two-level row of scale %g", nm,
				      bad, N, (double)scales[k]);
		}
		for (int i = 0; i < N; i++)
			x[i] = i == 3 ? NAN : 0.5f;
		kcpu_quantize_row(t, x, q, N); /* must not crash; the result is unspecified */
	}
	printf("degenerate rows: zeros, two-level rows at 1e-30..1e3, NaN input\n");
}

/* The codebook types against ggml itself: tests/data/iq_ggml_ref.bin holds rows of random blocks and
 * rows ggml quantized, each with the floats ggml's dequantize_row_* gave (scripts/ggml_iq_probe.c).
 * Both of tandem's decoders must give exactly those floats; the dot must agree with them. */
static void test_ggml_ref(void)
{
	const char *d = getenv("TANDEM_TESTDATA");
	char path[512];
	snprintf(path, sizeof path, "%s/iq_ggml_ref.bin", d ? d : "tests/data");
	FILE *f = fopen(path, "rb");
	CHECK(f != NULL, "%s: cannot open", path);
	if (!f)
		return;
	char magic[8];
	int rows = 0, seen[KT_COUNT] = {0};
	CHECK(fread(magic, 1, 8, f) == 8 && memcmp(magic, "IQREF1\0\0", 8) == 0, "%s: bad magic", path);
	for (;;) {
		uint32_t h[3];
		if (fread(h, 4, 1, f) != 1) {
			CHECK(0, "%s: truncated", path);
			break;
		}
		if (h[0] == 0)
			break;
		size_t rb;
		if (fread(h + 1, 4, 2, f) != 2 || h[0] >= KT_COUNT || h[1] == 0 || h[1] > 4096 ||
		    h[2] > 8192 || !ktype_row_bytes((int)h[0], h[1], &rb) || rb != h[2]) {
			CHECK(0, "%s: bad record header after %d rows", path, rows);
			break;
		}
		const int t = (int)h[0], n = (int)h[1];
		uint8_t q[8192];
		float want[4096], y[4096], y2[4096], x[4096];
		if (fread(q, 1, rb, f) != rb || fread(want, 4, (size_t)n, f) != (size_t)n) {
			CHECK(0, "%s: truncated record", path);
			break;
		}
		kcpu_dequant_row_ref(t, q, y, n);
		kcpu_dequant_row(t, q, y2, n);
		int bad = 0, bad2 = 0, first = -1;
		for (int i = 0; i < n; i++) {
			if (memcmp(&y[i], &want[i], 4) && first < 0)
				first = i;
			bad += memcmp(&y[i], &want[i], 4) != 0;
			bad2 += memcmp(&y2[i], &want[i], 4) != 0;
		}
		CHECK(bad == 0 && bad2 == 0,
		      "%s row %d: %d (ref) / %d values differ from ggml, first at %d: %.9g vs %.9g",
		      ktype_name(t), rows, bad, bad2, first, first >= 0 ? (double)y[first] : 0.0,
		      first >= 0 ? (double)want[first] : 0.0);
		double exact = 0, mag = 0;
		for (int i = 0; i < n; i++) {
			x[i] = rng_gauss();
			exact += (double)want[i] * x[i];
			mag += fabs((double)want[i] * x[i]);
		}
		const double e = fabs(kcpu_dot_row(t, q, x, n) - exact) / (mag > 0 ? mag : 1);
		CHECK(e < 1e-5, "%s row %d: dot off by %.3g of sum|wx|", ktype_name(t), rows, e);
		seen[t]++, rows++;
	}
	fclose(f);
	static const int need[] = {KT_IQ2_XXS, KT_IQ2_XS, KT_IQ2_S, KT_IQ3_XXS, KT_IQ3_S, KT_IQ1_S, KT_IQ1_M};
	for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
		CHECK(seen[need[i]] >= 8, "%s: %d reference rows, expected 8", ktype_name(need[i]),
		      seen[need[i]]);
	printf("ggml reference rows: %d (IQ2_XXS .. IQ1_M), decoded bit for bit\n", rows);
}

/* Kernels called with a type they cannot handle, or a partial block, abort with a message (the
 * GGUF reader rejects such tensors first, so this is a caller bug): checked in child processes. */
static bool dies(int type, int64_t n, int which)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		static uint8_t blk[4096];
		static float out[1024];
		freopen("/dev/null", "w", stderr);
		if (which == 0)
			kcpu_dequant_row(type, blk, out, n);
		else if (which == 1)
			(void)kcpu_dot_row(type, blk, out, n);
		else
			kcpu_quantize_row(type, out, blk, n);
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void test_misuse(void)
{
	for (int which = 0; which < 3; which++) {
		CHECK(dies(KT_TQ2_0, 256, which), "TQ2_0 (no CPU kernels) accepted (%d)", which);
		CHECK(dies(77, 32, which), "unknown type 77 accepted (%d)", which);
		CHECK(dies(KT_Q4_K, 128, which), "Q4_K with half a block accepted (%d)", which);
		CHECK(dies(KT_Q8_0, -32, which), "negative n accepted (%d)", which);
		CHECK(!dies(KT_Q8_0, 64, which), "valid call died (%d)", which);
	}
	printf("misuse: non-compute/unknown types and partial blocks abort\n");
}

int main(void)
{
	uint64_t seed = (uint64_t)time(NULL);
	const char *env = getenv("TANDEM_SEED");

	if (env)
		seed = strtoull(env, NULL, 0);
	printf("seed %" PRIu64 " (replay with TANDEM_SEED=%" PRIu64 ")\n", seed, seed);
	rng_state = seed;

	test_type_table();
	test_fp16();
	test_hand_blocks();
	test_degenerate();
	test_misuse();
	test_ggml_ref();
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		test_type(&cases[i]);

	printf("%s: %d failures\n", n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
