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
#include <time.h>

#include "kernels/kernels.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static int n_fail;

#define CHECK(cond, ...)                                                                        \
	do {                                                                                    \
		if (!(cond)) {                                                                  \
			n_fail++;                                                               \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                             \
			printf(__VA_ARGS__);                                                    \
			printf("\n");                                                           \
		}                                                                               \
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
		{0, "F32", 1, 4, true},           {1, "F16", 1, 2, true},
		{2, "Q4_0", 32, 18, true},        {3, "Q4_1", 32, 20, true},
		{6, "Q5_0", 32, 22, true},        {7, "Q5_1", 32, 24, true},
		{8, "Q8_0", 32, 34, true},        {9, "Q8_1", 32, 36, false},
		{10, "Q2_K", 256, 84, true},      {11, "Q3_K", 256, 110, true},
		{12, "Q4_K", 256, 144, true},     {13, "Q5_K", 256, 176, true},
		{14, "Q6_K", 256, 210, true},     {15, "Q8_K", 256, 292, false},
		{16, "IQ2_XXS", 256, 66, false},  {17, "IQ2_XS", 256, 74, false},
		{18, "IQ3_XXS", 256, 98, false},  {19, "IQ1_S", 256, 50, false},
		{20, "IQ4_NL", 32, 18, true},     {21, "IQ3_S", 256, 110, false},
		{22, "IQ2_S", 256, 82, false},    {23, "IQ4_XS", 256, 136, true},
		{24, "I8", 1, 1, false},          {25, "I16", 1, 2, false},
		{26, "I32", 1, 4, false},         {27, "I64", 1, 8, false},
		{28, "F64", 1, 8, false},         {29, "IQ1_M", 256, 56, false},
		{30, "BF16", 1, 2, true},         {34, "TQ1_0", 256, 54, false},
		{35, "TQ2_0", 256, 66, false},    {39, "MXFP4", 32, 17, false},
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
	frexp(a, &e);           /* a = m * 2^e, m in [0.5, 1) */
	int exp = e - 1;        /* a in [2^exp, 2^(exp+1)) */
	if (exp < -14)
		exp = -14;      /* subnormal spacing */
	double ulp = ldexp(1.0, exp - 10);
	double q = a / ulp;     /* exact */
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
struct type_case {
	int type;
	double rms_bound; /* max RMS(dequant - x) / RMS(x) on N(0,1) data */
};

static const struct type_case cases[] = {
	{KT_F32, 0.0},     {KT_F16, 0.0005},  {KT_BF16, 0.004},  {KT_Q8_0, 0.01},
	{KT_Q4_0, 0.12},   {KT_Q4_1, 0.11},   {KT_Q5_0, 0.06},   {KT_Q5_1, 0.055},
	{KT_IQ4_NL, 0.11}, {KT_Q2_K, 0.45},   {KT_Q3_K, 0.22},   {KT_Q4_K, 0.12},
	{KT_Q5_K, 0.06},   {KT_Q6_K, 0.03},   {KT_IQ4_XS, 0.12},
};

static bool has_ops(int type)
{
	(void)type;
	return true;
}

static void test_type(const struct type_case *c)
{
	const struct ktype_info *t = ktype_get(c->type);
	static const int64_t sizes[] = {256, 512, 2048, 6144};
	double worst_rms = 0.0, worst_dot = 0.0, worst_ref = 0.0;

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
			      "%s: dequant rms error %.5f > %.5f (n=%lld rep %d)", t->name, rel,
			      c->rms_bound, (long long)n, rep);

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
			CHECK(e_ref < 1e-5, "%s: dot_row_ref %.9g vs exact %.9g (err %.3g, n=%lld)",
			      t->name, d_ref, exact, e_ref, (long long)n);
		}
		free(x);
		free(y);
		free(y2);
		free(a);
		free(q);
	}
	printf("%-7s rms err %.5f (bound %.5f)  dot err %.2e  ref dot err %.2e  (of sum|wx|)\n",
	       t->name, worst_rms, c->rms_bound, worst_dot, worst_ref);
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
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (has_ops(cases[i].type))
			test_type(&cases[i]);

	printf("%s: %d failures\n", n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
