/* Row functions of the codebook ("grid") types that low-bit GLM-5 / DeepSeek GGUFs put on their routed
 * experts: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (MODEL-SPEC.md §5.3). Every type has
 * 256-element blocks of eight 32-element sub-blocks; a sub-block holds groups of 8 (or 4) elements,
 * each an index into a fixed codebook (kernels/iq_grids.inc, ggml's tables) plus signs, under one or
 * two scales. One decoder per type turns sub-block ib into four 8-byte codebook words with their sign
 * bits (or IQ1's +-1/8 shifts) and the scales of its two 16-element halves (struct iqg); element j is
 * then s[j / 16] * v[j], v the codebook value with its sign or shift: exactly ggml's dequantize_row_*
 * (the same float operations; tests/unit/test_quant compares against rows ggml decoded). The
 * dequantizer and the dot (AVX2: a group's 8 bytes widened to floats, signs by XOR) share it.
 *
 * The quantizers are simple (nearest codebook entry by exhaustive search under a least-squares
 * sub-block scale, no importance weights): they exist so that mkmodel and the tests can write these
 * types, not to compete with llama-quantize. */
#include <math.h>
#include <pthread.h>

#include "kernels/cpu/quant_impl.h"
#include "kernels/iq_grids.inc"

#define QK_K 256

static const uint64_t grid_iq2xxs[256] = {IQ_GRID_IQ2XXS};
static const uint64_t grid_iq2xs[512] = {IQ_GRID_IQ2XS};
static const uint64_t grid_iq2s[1024] = {IQ_GRID_IQ2S};
static const uint32_t grid_iq3xxs[256] = {IQ_GRID_IQ3XXS};
static const uint32_t grid_iq3s[512] = {IQ_GRID_IQ3S};
static const uint64_t grid_iq1s[2048] = {IQ_GRID_IQ1S};
static const uint8_t ksigns[128] = {IQ_KSIGNS};

#define IQ1_DELTA 0.125f
/* an IQ1 delta by its sign bit: a load, not a branch (the bits are random, a branch mispredicts half
 * the time: IQ1_M's dot ran 5x slower that way) */
static const float iq1_delta[2] = {IQ1_DELTA, -IQ1_DELTA};

/* byte j of a codebook entry */
static inline int gb(uint64_t e, int j)
{
	return (int)((e >> (8 * j)) & 255);
}

/* A sub-block in a form every type shares: four groups of 8, each an 8-byte codebook word e[l]
 * (two 4-byte entries for IQ3) whose bytes are magnitudes under sign bits sg[l] (bit j: element j
 * negative), or for IQ1 int8 values plus delta[l] (sg[l] 0); s[h] scales elements 16h .. 16h + 15. */
struct iqg {
	uint64_t e[4];
	uint32_t sg[4];
	float delta[4];
	float s[2];
	bool i1; /* IQ1: signed bytes plus delta, no sign bits */
};

/* ---- decoders: sub-block ib of block b ---- */

static inline __attribute__((always_inline)) void grp_iq2_xxs(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint8_t *p = b + 2 + 8 * ib;
	const uint32_t a1 = quant_rd32(p + 4);
	g->i1 = false;
	g->s[0] = g->s[1] = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
	for (int l = 0; l < 4; l++)
		g->e[l] = grid_iq2xxs[p[l]], g->sg[l] = ksigns[(a1 >> (7 * l)) & 127];
}

static inline __attribute__((always_inline)) void grp_iq2_xs(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint8_t sc = b[66 + ib];
	g->i1 = false;
	g->s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
	g->s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
	for (int l = 0; l < 4; l++) {
		const uint16_t q = quant_rd16(b + 2 + 2 * (4 * ib + l));
		g->e[l] = grid_iq2xs[q & 511], g->sg[l] = ksigns[q >> 9];
	}
}

static inline __attribute__((always_inline)) void grp_iq2_s(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint8_t sc = b[74 + ib], qh = b[66 + ib];
	g->i1 = false;
	g->s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
	g->s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
	for (int l = 0; l < 4; l++) {
		g->e[l] = grid_iq2s[b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300)];
		g->sg[l] = b[34 + 4 * ib + l];
	}
}

static inline __attribute__((always_inline)) void grp_iq3_xxs(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint8_t *qs = b + 2 + 8 * ib;
	const uint32_t aux = quant_rd32(b + 66 + 4 * ib);
	g->i1 = false;
	g->s[0] = g->s[1] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
	for (int l = 0; l < 4; l++) {
		g->e[l] = (uint64_t)grid_iq3xxs[qs[2 * l]] | (uint64_t)grid_iq3xxs[qs[2 * l + 1]] << 32;
		g->sg[l] = ksigns[(aux >> (7 * l)) & 127];
	}
}

static inline __attribute__((always_inline)) void grp_iq3_s(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint8_t *qs = b + 2 + 8 * ib, qh = b[66 + ib];
	g->i1 = false;
	g->s[0] = g->s[1] = d * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));
	for (int l = 0; l < 4; l++) {
		const int i1 = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
		const int i2 = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
		g->e[l] = (uint64_t)grid_iq3s[i1] | (uint64_t)grid_iq3s[i2] << 32;
		g->sg[l] = b[74 + 4 * ib + l];
	}
}

static inline __attribute__((always_inline)) void grp_iq1_s(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = quant_fp16(b);
	const uint16_t h = quant_rd16(b + 34 + 2 * ib);
	g->i1 = true;
	g->s[0] = g->s[1] = d * (float)(2 * ((h >> 12) & 7) + 1);
	for (int l = 0; l < 4; l++) {
		g->e[l] = grid_iq1s[b[2 + 4 * ib + l] | (((h >> (3 * l)) & 7) << 8)];
		g->sg[l] = 0;
		g->delta[l] = iq1_delta[h >> 15];
	}
}

/* IQ1_M's fp16 super-scale: the top nibbles of its four 16-bit scale words */
static float iq1m_d(const uint8_t *b)
{
	const uint16_t u = (uint16_t)((quant_rd16(b + 48) >> 12) | ((quant_rd16(b + 50) >> 8) & 0x00f0) |
	                              ((quant_rd16(b + 52) >> 4) & 0x0f00) | (quant_rd16(b + 54) & 0xf000));
	return quant_h2f(u);
}

static inline __attribute__((always_inline)) void grp_iq1_m(const uint8_t *b, int ib, struct iqg *g)
{
	const float d = iq1m_d(b);
	const uint16_t sc = quant_rd16(b + 48 + 2 * (ib / 2));
	const int sh = 6 * (ib % 2);
	g->i1 = true;
	g->s[0] = d * (float)(2 * ((sc >> sh) & 7) + 1);
	g->s[1] = d * (float)(2 * ((sc >> (sh + 3)) & 7) + 1);
	const uint8_t *qs = b + 4 * ib, *qh = b + 32 + 2 * ib;
	for (int l = 0; l < 4; l++) {
		const int h = qh[l / 2] >> (4 * (l % 2)); /* 3 index bits, then the delta's sign */
		g->e[l] = grid_iq1s[qs[l] | ((h & 7) << 8)];
		g->sg[l] = 0;
		g->delta[l] = iq1_delta[(h >> 3) & 1];
	}
}

/* the 32 values of a sub-block: ggml's floats are s * v (grid * +-1, or int8 + delta) */
static void grp_values(const struct iqg *g, float *v)
{
	if (g->i1) {
		for (int l = 0; l < 4; l++)
			for (int j = 0; j < 8; j++)
				v[8 * l + j] = (float)(int8_t)gb(g->e[l], j) + g->delta[l];
		return;
	}
	for (int l = 0; l < 4; l++)
		for (int j = 0; j < 8; j++) {
			const float q = (float)gb(g->e[l], j);
			v[8 * l + j] = ((g->sg[l] >> j) & 1) ? -q : q;
		}
}

/* ---- the shared row loops ---- */

typedef void (*grp_fn)(const uint8_t *b, int ib, struct iqg *g);

static void dequant_with(grp_fn grp, int bytes, const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	struct iqg g;
	float v[32];

	for (int64_t i = 0; i < n / QK_K; i++, b += bytes)
		for (int ib = 0; ib < 8; ib++) {
			grp(b, ib, &g);
			grp_values(&g, v);
			float *y = dst + i * QK_K + 32 * ib;
			for (int j = 0; j < 32; j++)
				y[j] = g.s[j / 16] * v[j];
		}
}

#if QUANT_AVX2
/* 8 values of group l as floats: bytes widened, then signed (sign bits) or shifted (IQ1) */
static inline __m256 grp_v8(const struct iqg *g, int l)
{
	const __m128i q = _mm_cvtsi64_si128((long long)g->e[l]);
	if (g->i1)
		return _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
		                     _mm256_set1_ps(g->delta[l]));
	const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
	const __m256i neg = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)g->sg[l]), bit), bit);
	const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
	return _mm256_xor_ps(v, _mm256_and_ps(_mm256_castsi256_ps(neg), _mm256_set1_ps(-0.0f)));
}

static inline __attribute__((always_inline)) float dot_with(grp_fn grp, int bytes, const void *row,
                                                            const float *x, int64_t n)
{
	const uint8_t *b = row;
	struct iqg g;
	__m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();

	for (int64_t i = 0; i < n / QK_K; i++, b += bytes)
		for (int ib = 0; ib < 8; ib++, x += 32) {
			grp(b, ib, &g);
			__m256 h0 = _mm256_mul_ps(grp_v8(&g, 0), _mm256_loadu_ps(x));
			__m256 h1 = _mm256_mul_ps(grp_v8(&g, 2), _mm256_loadu_ps(x + 16));
			h0 = _mm256_fmadd_ps(grp_v8(&g, 1), _mm256_loadu_ps(x + 8), h0);
			h1 = _mm256_fmadd_ps(grp_v8(&g, 3), _mm256_loadu_ps(x + 24), h1);
			acc = _mm256_fmadd_ps(_mm256_set1_ps(g.s[0]), h0, acc);
			acc2 = _mm256_fmadd_ps(_mm256_set1_ps(g.s[1]), h1, acc2);
		}
	return quant_hsum(_mm256_add_ps(acc, acc2));
}

/* the same floats as dequant_with (each value exact, one product by the scale) */
static inline __attribute__((always_inline)) void dequant_avx2_with(grp_fn grp, int bytes, const void *src,
                                                                    float *dst, int64_t n)
{
	const uint8_t *b = src;
	struct iqg g;

	for (int64_t i = 0; i < n / QK_K; i++, b += bytes)
		for (int ib = 0; ib < 8; ib++, dst += 32) {
			grp(b, ib, &g);
			for (int l = 0; l < 4; l++)
				_mm256_storeu_ps(dst + 8 * l,
				                 _mm256_mul_ps(_mm256_set1_ps(g.s[l / 2]), grp_v8(&g, l)));
		}
}
#else
static inline __attribute__((always_inline)) float dot_with(grp_fn grp, int bytes, const void *row,
                                                            const float *x, int64_t n)
{
	const uint8_t *b = row;
	struct iqg g;
	float v[32], acc = 0.0f;

	for (int64_t i = 0; i < n / QK_K; i++, b += bytes)
		for (int ib = 0; ib < 8; ib++, x += 32) {
			grp(b, ib, &g);
			grp_values(&g, v);
			float h0 = 0.0f, h1 = 0.0f;
			for (int j = 0; j < 16; j++) {
				h0 += v[j] * x[j];
				h1 += v[16 + j] * x[16 + j];
			}
			acc += g.s[0] * h0 + g.s[1] * h1;
		}
	return acc;
}
#endif

#if QUANT_AVX2
#define DEQ_FAST(name, bytes)                                                                                \
	static void name##_dequant_avx2(const void *src, float *dst, int64_t n)                              \
	{                                                                                                    \
		dequant_avx2_with(grp_##name, bytes, src, dst, n);                                           \
	}
#define DEQ_OP(name) .dequant = name##_dequant_avx2,
#else
#define DEQ_FAST(name, bytes)
#define DEQ_OP(name)
#endif

#define ROW_FUNCS(name, bytes)                                                                               \
	DEQ_FAST(name, bytes)                                                                                \
	static void name##_dequant(const void *src, float *dst, int64_t n)                                   \
	{                                                                                                    \
		dequant_with(grp_##name, bytes, src, dst, n);                                                \
	}                                                                                                    \
	static float name##_dot(const void *row, const float *x, int64_t n)                                  \
	{                                                                                                    \
		return dot_with(grp_##name, bytes, row, x, n);                                               \
	}

ROW_FUNCS(iq2_xxs, 66)
ROW_FUNCS(iq2_xs, 74)
ROW_FUNCS(iq2_s, 82)
ROW_FUNCS(iq3_xxs, 98)
ROW_FUNCS(iq3_s, 110)
ROW_FUNCS(iq1_s, 50)
ROW_FUNCS(iq1_m, 56)

/* ---- quantizers ---- */

/* The codebooks as floats, made once (quantizers may run on several threads), stored by value index
 * first (entry e's value j at [j][e]) so a search loads 8 entries' value j at once. */
static float f2xxs[8][256], f2xs[8][512], f2s[8][1024], f3xxs[4][256], f3s[4][512], f1s[8][2048];
static pthread_once_t tabs_once = PTHREAD_ONCE_INIT;

static void tabs_init(void)
{
	for (int e = 0; e < 2048; e++)
		for (int j = 0; j < 8; j++) {
			if (e < 256)
				f2xxs[j][e] = (float)gb(grid_iq2xxs[e], j);
			if (e < 512)
				f2xs[j][e] = (float)gb(grid_iq2xs[e], j);
			if (e < 1024)
				f2s[j][e] = (float)gb(grid_iq2s[e], j);
			if (e < 256 && j < 4)
				f3xxs[j][e] = (float)gb(grid_iq3xxs[e], j);
			if (e < 512 && j < 4)
				f3s[j][e] = (float)gb(grid_iq3s[e], j);
			f1s[j][e] = (float)(int8_t)gb(grid_iq1s[e], j);
		}
}

/* The entry of a codebook of n entries of w values (tab[j * n + e], n a multiple of 8) nearest to a / db
 * (least squares; the first of equal errors); a holds the targets with their signs already taken out.
 * The AVX2 search takes 8 entries a step with the scalar loop's roundings (a product, then a
 * difference; a square, then a sum: no fused multiply-adds, as -std=c11 compiles the scalar one), so
 * both choose the same entries and a file's bytes do not depend on the build. */
static int nearest(const float *tab, int n, int w, const float *a, float db)
{
#if QUANT_AVX2
	const __m256 vdb = _mm256_set1_ps(db);
	__m256 best = _mm256_set1_ps(INFINITY);
	__m256i bidx = _mm256_setzero_si256(), idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const __m256i eight = _mm256_set1_epi32(8);
	for (int e = 0; e < n; e += 8, idx = _mm256_add_epi32(idx, eight)) {
		__m256 err = _mm256_setzero_ps();
		for (int j = 0; j < w; j++) {
			const __m256 t =
			    _mm256_sub_ps(_mm256_set1_ps(a[j]),
			                  _mm256_mul_ps(vdb, _mm256_loadu_ps(tab + (size_t)j * n + e)));
			err = _mm256_add_ps(err, _mm256_mul_ps(t, t));
		}
		const __m256 lt = _mm256_cmp_ps(err, best, _CMP_LT_OQ); /* strictly: the first of equals */
		best = _mm256_blendv_ps(best, err, lt);
		bidx = _mm256_castps_si256(
		    _mm256_blendv_ps(_mm256_castsi256_ps(bidx), _mm256_castsi256_ps(idx), lt));
	}
	float be[8];
	int bi[8];
	_mm256_storeu_ps(be, best);
	_mm256_storeu_si256((__m256i *)bi, bidx);
	int r = bi[0];
	float re = be[0];
	for (int l = 1; l < 8; l++)
		if (be[l] < re || (be[l] == re && bi[l] < r))
			re = be[l], r = bi[l];
	return r;
#else
	int best = 0;
	float best_e = INFINITY;
	for (int e = 0; e < n; e++) {
		float err = 0.0f;
		for (int j = 0; j < w; j++) {
			const float t = a[j] - db * tab[j * n + e];
			err += t * t;
		}
		if (err < best_e)
			best_e = err, best = e;
	}
	return best;
#endif
}

/* Signs of 8 values as a mask (bit j: x[j] < 0) and the targets a[j] = |x[j]| under it. With
 * even set, a mask with an odd count has the bit of the smallest |x| flipped (the 7-bit sign
 * codes of IQ2_XXS / IQ2_XS / IQ3_XXS only hold masks with an even count); that element's target
 * becomes -|x| so the search gives it the smallest magnitude. */
static unsigned signs8(const float *x, bool even, float *a)
{
	unsigned m = 0;
	int jmin = 0;
	for (int j = 0; j < 8; j++) {
		m |= (unsigned)(x[j] < 0.0f) << j;
		a[j] = fabsf(x[j]);
		if (a[j] < a[jmin])
			jmin = j;
	}
	if (even && (__builtin_popcount(m) & 1)) {
		m ^= 1u << jmin;
		a[jmin] = -a[jmin];
	}
	return m;
}

/* codebook of a magnitude type */
struct mtype {
	const float *tab; /* n entries of w values, value j of entry e at [j * n + e] */
	int n, w;
	bool even; /* 7-bit sign codes */
	float gmax; /* largest codebook value */
	float (*f)(int s); /* scale factor of a 4-bit scale s: db = d f(s) */
};

static float f_iq2(int s)
{
	return (0.5f + (float)s) * 0.25f;
}
static float f_iq3xxs(int s)
{
	return (0.5f + (float)s) * 0.5f;
}
static float f_odd(int s)
{
	return (float)(2 * s + 1);
}

/* Entries (idx[4] for 8-value entries, idx[8] for 4-value ones) and sign masks of 32 values under
 * scale db; returns the least-squares scale of the chosen entries. */
static float fit32(const struct mtype *t, const float *x, float db, int *idx, unsigned *sg)
{
	float num = 0.0f, den = 0.0f, a[8];
	for (int l = 0; l < 4; l++) {
		sg[l] = signs8(x + 8 * l, t->even, a);
		for (int h = 0; h < 8 / t->w; h++) {
			const int k = l * (8 / t->w) + h, e = nearest(t->tab, t->n, t->w, a + h * t->w, db);
			idx[k] = e;
			for (int j = 0; j < t->w; j++) {
				num += a[h * t->w + j] * t->tab[j * t->n + e];
				den += t->tab[j * t->n + e] * t->tab[j * t->n + e];
			}
		}
	}
	return den > 0.0f ? num / den : 0.0f;
}

/* the 4-bit scale whose factor times d is nearest to db */
static int best_scale(float (*f)(int), int smax, float d, float db)
{
	int best = 0;
	for (int s = 1; s <= smax; s++)
		if (fabsf(d * f(s) - db) < fabsf(d * f(best) - db))
			best = s;
	return best;
}

/* Scales of a 256-value block: per 32 (or per 16 with halves) a first scale from max |x|, refit by
 * least squares on the chosen entries; then the fp16 super-scale so the largest fits. Returns d and
 * fills db[nsub], the scales the caller quantizes against (sub-scale s[i] applied). */
static float block_scales(const struct mtype *t, const float *x, int nsub, int smax, int *s, float *db)
{
	const int len = QK_K / nsub;
	int idx[8];
	unsigned sg[4];
	float dmax = 0.0f;
	for (int i = 0; i < nsub; i++) {
		float amax = 0.0f;
		for (int j = 0; j < len; j++)
			amax = fmaxf(amax, fabsf(x[len * i + j]));
		db[i] = amax / t->gmax;
		if (len == 32 && db[i] > 0.0f) {
			const float ls = fit32(t, x + 32 * i, db[i], idx, sg);
			if (ls > 0.0f)
				db[i] = ls;
		}
		dmax = fmaxf(dmax, db[i]);
	}
	const float d = kfp16_to_f32(kf32_to_fp16(dmax / t->f(smax)));
	for (int i = 0; i < nsub; i++) {
		s[i] = d > 0.0f ? best_scale(t->f, smax, d, db[i]) : 0;
		db[i] = d * t->f(s[i]);
	}
	return d;
}

/* IQ2_XXS / IQ3_XXS: a sub-block's 4-bit scale s and four 7-bit sign codes as one little-endian word */
static void wr_aux(uint8_t *p, int s, const unsigned *sg)
{
	uint32_t a = (uint32_t)s << 28;
	for (int l = 0; l < 4; l++)
		a |= (sg[l] & 127u) << (7 * l);
	for (int k = 0; k < 4; k++)
		p[k] = (uint8_t)(a >> (8 * k));
}

static void q_iq2_xxs(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	const struct mtype t = {&f2xxs[0][0], 256, 8, true, 43.0f, f_iq2};
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 66) {
		const float *x = src + i * QK_K;
		int s[8], idx[8];
		unsigned sg[4];
		float db[8];
		const float d = block_scales(&t, x, 8, 15, s, db);
		memset(b, 0, 66);
		quant_wr16(b, kf32_to_fp16(d));
		for (int ib = 0; ib < 8; ib++) {
			fit32(&t, x + 32 * ib, db[ib], idx, sg);
			for (int l = 0; l < 4; l++)
				b[2 + 8 * ib + l] = (uint8_t)idx[l];
			wr_aux(b + 6 + 8 * ib, s[ib], sg);
		}
	}
}

static void q_iq2_xs(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	const struct mtype t = {&f2xs[0][0], 512, 8, true, 43.0f, f_iq2};
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 74) {
		const float *x = src + i * QK_K;
		int s[16];
		float db[16], a[8];
		const float d = block_scales(&t, x, 16, 15, s, db); /* a 4-bit scale per 16 values */
		memset(b, 0, 74);
		quant_wr16(b, kf32_to_fp16(d));
		for (int k = 0; k < 32; k++) { /* group k of 8: scale k / 2 */
			const unsigned sg = signs8(x + 8 * k, true, a);
			const int e = nearest(t.tab, t.n, 8, a, db[k / 2]);
			quant_wr16(b + 2 + 2 * k, (uint16_t)(e | (sg & 127u) << 9));
		}
		for (int ib = 0; ib < 8; ib++)
			b[66 + ib] = (uint8_t)(s[2 * ib] | s[2 * ib + 1] << 4);
	}
}

static void q_iq2_s(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	const struct mtype t = {&f2s[0][0], 1024, 8, false, 43.0f, f_iq2};
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 82) {
		const float *x = src + i * QK_K;
		int s[16];
		float db[16], a[8];
		const float d = block_scales(&t, x, 16, 15, s, db); /* a 4-bit scale per 16 values */
		memset(b, 0, 82);
		quant_wr16(b, kf32_to_fp16(d));
		for (int k = 0; k < 32; k++) {
			const unsigned sg = signs8(x + 8 * k, false, a);
			const int e = nearest(t.tab, t.n, 8, a, db[k / 2]);
			b[2 + k] = (uint8_t)e;
			b[34 + k] = (uint8_t)sg;
			b[66 + k / 4] |= (uint8_t)((e >> 8) << (2 * (k % 4)));
		}
		for (int ib = 0; ib < 8; ib++)
			b[74 + ib] = (uint8_t)(s[2 * ib] | s[2 * ib + 1] << 4);
	}
}

static void q_iq3_xxs(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	const struct mtype t = {&f3xxs[0][0], 256, 4, true, 62.0f, f_iq3xxs};
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 98) {
		const float *x = src + i * QK_K;
		int s[8], idx[8];
		unsigned sg[4];
		float db[8];
		const float d = block_scales(&t, x, 8, 15, s, db);
		memset(b, 0, 98);
		quant_wr16(b, kf32_to_fp16(d));
		for (int ib = 0; ib < 8; ib++) {
			fit32(&t, x + 32 * ib, db[ib], idx, sg);
			for (int k = 0; k < 8; k++)
				b[2 + 8 * ib + k] = (uint8_t)idx[k];
			wr_aux(b + 66 + 4 * ib, s[ib], sg);
		}
	}
}

static void q_iq3_s(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	const struct mtype t = {&f3s[0][0], 512, 4, false, 15.0f, f_odd};
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 110) {
		const float *x = src + i * QK_K;
		int s[8], idx[8];
		unsigned sg[4];
		float db[8];
		const float d = block_scales(&t, x, 8, 15, s, db);
		memset(b, 0, 110);
		quant_wr16(b, kf32_to_fp16(d));
		for (int ib = 0; ib < 8; ib++) {
			fit32(&t, x + 32 * ib, db[ib], idx, sg);
			for (int k = 0; k < 8; k++) {
				b[2 + 8 * ib + k] = (uint8_t)idx[k];
				b[66 + ib] |= (uint8_t)((idx[k] >> 8) << k);
			}
			for (int l = 0; l < 4; l++)
				b[74 + 4 * ib + l] = (uint8_t)sg[l];
			b[106 + ib / 2] |= (uint8_t)(s[ib] << (4 * (ib % 2)));
		}
	}
}

/* IQ1: the entry and delta nearest to 8 values x under scale dl (*neg_out: 0 for +1/8, 1 for -1/8;
 * force >= 0 fixes it). Returns the squared error. */
static float iq1_pick(const float *x, float dl, int force, int *e_out, int *neg_out)
{
	float best_e = INFINITY;
	int be = 0, bn = 0;
	for (int neg = 0; neg < 2; neg++) {
		if (force >= 0 && neg != force)
			continue;
		const float dd = neg ? -IQ1_DELTA : IQ1_DELTA;
		float t[8];
		for (int j = 0; j < 8; j++)
			t[j] = x[j] - dl * dd;
		const int e = nearest(&f1s[0][0], 2048, 8, t, dl);
		float err = 0.0f;
		for (int j = 0; j < 8; j++) {
			const float r = x[j] - dl * (f1s[j][e] + dd);
			err += r * r;
		}
		if (err < best_e)
			best_e = err, be = e, bn = neg;
	}
	*e_out = be, *neg_out = bn;
	return best_e;
}

/* first scale of len IQ1 values: max |x| over the largest magnitude 1.125 */
static float iq1_first(const float *x, int len)
{
	float amax = 0.0f;
	for (int j = 0; j < len; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	return amax / (1.0f + IQ1_DELTA);
}

/* least-squares refit of len values against the chosen entries (e, neg per 8) */
static float iq1_refit(const float *x, int len, const int *e, const int *neg, float dl)
{
	float num = 0.0f, den = 0.0f;
	for (int j = 0; j < len; j++) {
		const float g = f1s[j % 8][e[j / 8]] + (neg[j / 8] ? -IQ1_DELTA : IQ1_DELTA);
		num += x[j] * g, den += g * g;
	}
	return den > 0.0f && num > 0.0f ? num / den : dl;
}

static void q_iq1_s(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 50) {
		const float *x = src + i * QK_K;
		float dl[8], dmax = 0.0f;
		int e[4], ng[4], dneg[8];
		for (int ib = 0; ib < 8; ib++) {
			const float *xs = x + 32 * ib;
			dl[ib] = iq1_first(xs, 32);
			dneg[ib] = 0;
			if (dl[ib] > 0.0f) { /* one delta for the 32: the better of the two */
				float err[2];
				for (int neg = 0; neg < 2; neg++) {
					err[neg] = 0.0f;
					for (int l = 0; l < 4; l++)
						err[neg] += iq1_pick(xs + 8 * l, dl[ib], neg, &e[l], &ng[l]);
				}
				dneg[ib] = err[1] < err[0];
				for (int l = 0; l < 4; l++)
					iq1_pick(xs + 8 * l, dl[ib], dneg[ib], &e[l], &ng[l]);
				dl[ib] = iq1_refit(xs, 32, e, ng, dl[ib]);
			}
			dmax = fmaxf(dmax, dl[ib]);
		}
		const float d = kfp16_to_f32(kf32_to_fp16(dmax / 15.0f));
		memset(b, 0, 50);
		quant_wr16(b, kf32_to_fp16(d));
		for (int ib = 0; ib < 8; ib++) {
			const int s = d > 0.0f ? best_scale(f_odd, 7, d, dl[ib]) : 0;
			const float q = d * f_odd(s);
			uint16_t h = (uint16_t)(s << 12 | dneg[ib] << 15);
			for (int l = 0; l < 4; l++) {
				iq1_pick(x + 32 * ib + 8 * l, q, dneg[ib], &e[l], &ng[l]);
				b[2 + 4 * ib + l] = (uint8_t)e[l];
				h |= (uint16_t)((e[l] >> 8) << (3 * l));
			}
			quant_wr16(b + 34 + 2 * ib, h);
		}
	}
}

static void q_iq1_m(const float *src, void *dst, int64_t n)
{
	pthread_once(&tabs_once, tabs_init);
	uint8_t *b = dst;
	for (int64_t i = 0; i < n / QK_K; i++, b += 56) {
		const float *x = src + i * QK_K;
		float dl[16], dmax = 0.0f;
		int e[2], ng[2];
		for (int k = 0; k < 16; k++) { /* scale per 16, delta per 8 */
			const float *xs = x + 16 * k;
			dl[k] = iq1_first(xs, 16);
			if (dl[k] > 0.0f) {
				for (int l = 0; l < 2; l++)
					iq1_pick(xs + 8 * l, dl[k], -1, &e[l], &ng[l]);
				dl[k] = iq1_refit(xs, 16, e, ng, dl[k]);
			}
			dmax = fmaxf(dmax, dl[k]);
		}
		const uint16_t dh = kf32_to_fp16(dmax / 15.0f);
		const float d = kfp16_to_f32(dh);
		uint16_t sc[4] = {0, 0, 0, 0};
		memset(b, 0, 56);
		for (int k = 0; k < 16; k++) {
			const int s = d > 0.0f ? best_scale(f_odd, 7, d, dl[k]) : 0;
			const int ib = k / 2;
			sc[ib / 2] |= (uint16_t)(s << (6 * (ib % 2) + 3 * (k % 2)));
			for (int l = 0; l < 2; l++) {
				iq1_pick(x + 16 * k + 8 * l, d * f_odd(s), -1, &e[l], &ng[l]);
				const int g = 2 * (k % 2) + l; /* group 0..3 of sub-block ib */
				b[4 * ib + g] = (uint8_t)e[l];
				b[32 + 2 * ib + g / 2] |=
				    (uint8_t)(((e[l] >> 8) | ng[l] << 3) << (4 * (g % 2)));
			}
		}
		for (int k = 0; k < 4; k++)
			quant_wr16(b + 48 + 2 * k, (uint16_t)(sc[k] | ((dh >> (4 * k)) & 15) << 12));
	}
}

#define OPS(name, qname)                                                                                     \
	const struct quant_ops quant_ops_##name = {                                                          \
	    .dequant_ref = name##_dequant, DEQ_OP(name).dot = name##_dot, .quantize = qname}

OPS(iq2_xxs, q_iq2_xxs);
OPS(iq2_xs, q_iq2_xs);
OPS(iq2_s, q_iq2_s);
OPS(iq3_xxs, q_iq3_xxs);
OPS(iq3_s, q_iq3_s);
OPS(iq1_s, q_iq1_s);
OPS(iq1_m, q_iq1_m);
