/* Y = X W^T on the CPU for every weight type: kcpu_matmul, threaded over output rows (each
 * thread a contiguous range of rows; row r starts at data + r * row_bytes, and row_bytes may be
 * longer than the row, e.g. a TP rank's slice of the input dimension).
 *
 * 1 token (decode; up to 3 for float types): fused dequant-dots (kcpu_dot_row) per row and
 * token; the row is read from memory once and stays in L1 for the other tokens. Memory-bound,
 * so nothing is dequantized to memory.
 *
 * 2..7 tokens: a weight row is dequantized once per (token block, k block) into a per-thread
 * fp32 tile and reused by every token of the block:
 *   token block of TB tokens  (x slice of TB x KB floats stays in L2)
 *     k block of KB elements  (a multiple of 256, so every block type splits cleanly)
 *       4-row group: dequantize 4 x KB floats (L1), then a 4-row x 2-token dot kernel.
 *
 * 8+ tokens (prefill): the same tiling with 6-row x 16-token (and 6 x 8 for tails of <= 8)
 * outer-product kernels on X packed as X^T per k block (rows_gemm below): no horizontal sums.
 *
 * Sums are fp32; their order differs from kcpu_dot_row (k blocks), within fp32 rounding.
 *
 * kcpu_matmul_fast (opt-in, approximate): for fewer than FAST_TOK_MAX tokens, quantizes each
 * token's activations once to int8 blocks of 256 (quant_act.c), then integer dots per row and
 * token, threaded over rows like the fused path; more tokens use the exact paths. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/quant_impl.h"

/* Below this many tokens the fused dots win: for quantized types (whose dequantization costs
 * about as much as a fused dot) only a single token; float types' dots are cheap enough to
 * repeat for up to 3 tokens (measured with Q4_K/Q8_0/Q6_K/BF16 at 2048 x 6144, 2026-11-29). */
#define SMALL_TOK_QUANT 2
#define SMALL_TOK_FLOAT 4
#define TB 64 /* tokens per block */
#define KB 1024 /* elements per k block */
#define RG 4 /* rows per group (kernel height) */
#define FAST_TOK_MAX 4 /* kcpu_matmul_fast: integer dots below this many tokens */

struct mm {
	const struct kweight *w;
	const float *x;
	int64_t ldx, n_tok;
	float *y;
	int64_t ldy;
	struct kpool *p;
};

static void rows_dot(void *u, int64_t r0, int64_t r1, int thread)
{
	const struct mm *m = u;
	const struct kweight *w = m->w;
	const char *base = w->data;

	quant_dot_ref_fn ref;
	quant_dot_fn dot = quant_dot_for(w->type, &ref);
	quant_dot_xsum_fn dot_xs = quant_dot_xsum_for(w->type);
	float *xs = NULL;

	/* sums of x per 32 for the types with mins, once per token for this thread's rows */
	if (dot_xs && w->n_in % 32 == 0 && r1 - r0 > 1)
		xs = kpool_scratch(m->p, thread, sizeof(float) * (size_t)(m->n_tok * (w->n_in / 32)));
	if (xs) {
		int64_t nb = w->n_in / 32;
		for (int64_t t = 0; t < m->n_tok; t++) {
			const float *x = m->x + t * m->ldx;
			for (int64_t j = 0; j < nb; j++) {
				float sum = 0.0f;
				for (int k = 0; k < 32; k++)
					sum += x[32 * j + k];
				xs[t * nb + j] = sum;
			}
		}
		for (int64_t r = r0; r < r1; r++) {
			const void *row = base + (size_t)r * w->row_bytes;
			for (int64_t t = 0; t < m->n_tok; t++)
				m->y[t * m->ldy + r] = dot_xs(row, m->x + t * m->ldx, xs + t * nb, w->n_in);
		}
		return;
	}
	for (int64_t r = r0; r < r1; r++) {
		const void *row = base + (size_t)r * w->row_bytes;
		for (int64_t t = 0; t < m->n_tok; t++) {
			const float *x = m->x + t * m->ldx;
			m->y[t * m->ldy + r] = dot ? dot(row, x, w->n_in) : ref(w->type, row, x, w->n_in);
		}
	}
}

/* out[i*2 + j] = dot(w row i, x_j) over kb elements, rows at stride ldw */
static void kernel_4x2(const float *w, int64_t ldw, const float *x0, const float *x1, int64_t kb, float *out)
{
	int64_t k = 0;
#if QUANT_AVX2
	__m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
	__m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
	for (; k + 8 <= kb; k += 8) {
		__m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
		__m256 w0 = _mm256_loadu_ps(w + k);
		a00 = _mm256_fmadd_ps(w0, v0, a00);
		a01 = _mm256_fmadd_ps(w0, v1, a01);
		__m256 w1 = _mm256_loadu_ps(w + ldw + k);
		a10 = _mm256_fmadd_ps(w1, v0, a10);
		a11 = _mm256_fmadd_ps(w1, v1, a11);
		__m256 w2 = _mm256_loadu_ps(w + 2 * ldw + k);
		a20 = _mm256_fmadd_ps(w2, v0, a20);
		a21 = _mm256_fmadd_ps(w2, v1, a21);
		__m256 w3 = _mm256_loadu_ps(w + 3 * ldw + k);
		a30 = _mm256_fmadd_ps(w3, v0, a30);
		a31 = _mm256_fmadd_ps(w3, v1, a31);
	}
	out[0] = quant_hsum(a00);
	out[1] = quant_hsum(a01);
	out[2] = quant_hsum(a10);
	out[3] = quant_hsum(a11);
	out[4] = quant_hsum(a20);
	out[5] = quant_hsum(a21);
	out[6] = quant_hsum(a30);
	out[7] = quant_hsum(a31);
#else
	for (int i = 0; i < 8; i++)
		out[i] = 0.0f;
#endif
	for (; k < kb; k++) {
		for (int i = 0; i < RG; i++) {
			out[2 * i] += w[i * ldw + k] * x0[k];
			out[2 * i + 1] += w[i * ldw + k] * x1[k];
		}
	}
}

static void rows_tiled(void *u, int64_t r0, int64_t r1, int thread)
{
	const struct mm *m = u;
	const struct kweight *w = m->w;
	const struct ktype_info *ti = ktype_get(w->type);
	const char *base = w->data;
	float *tile = kpool_scratch(m->p, thread, sizeof(float) * RG * KB);
	quant_dequant_fn deq = quant_dequant_for(w->type);

	if (!tile) { /* out of memory for a 16 KiB tile: fall back to the allocation-free path */
		rows_dot(u, r0, r1, thread);
		return;
	}
	for (int64_t t0 = 0; t0 < m->n_tok; t0 += TB) {
		int64_t t1 = t0 + TB < m->n_tok ? t0 + TB : m->n_tok;
		for (int64_t k0 = 0; k0 < w->n_in; k0 += KB) {
			int64_t kb = w->n_in - k0 < KB ? w->n_in - k0 : KB;
			size_t off = (size_t)(k0 / ti->blck) * (size_t)ti->bytes;
			for (int64_t g = r0; g < r1; g += RG) {
				int nr = r1 - g < RG ? (int)(r1 - g) : RG;
				for (int i = 0; i < RG; i++) {
					/* short groups repeat their last row; its results are dropped */
					int64_t r = g + (i < nr ? i : nr - 1);
					deq(base + (size_t)r * w->row_bytes + off, tile + (size_t)i * KB, kb);
				}
				for (int64_t t = t0; t < t1; t += 2) {
					int two = t + 1 < t1;
					const float *x0 = m->x + t * m->ldx + k0;
					const float *x1 = two ? x0 + m->ldx : x0;
					float out[8];
					kernel_4x2(tile, KB, x0, x1, kb, out);
					for (int i = 0; i < nr; i++) {
						for (int j = 0; j <= two; j++) {
							float *yy = m->y + (t + j) * m->ldy + g + i;
							*yy = k0 == 0 ? out[2 * i + j] : *yy + out[2 * i + j];
						}
					}
				}
			}
		}
	}
}

#if QUANT_AVX2
/* ---- many tokens: 6-row x 16-token outer-product kernel ---------------------------------------
 * X is packed per k block as xt[k][16 tokens] (zero-padded), the weight tile as 6 dequantized
 * rows; per k the kernel loads two 8-token vectors of xt, broadcasts 6 weights and does 12 FMAs
 * into 12 accumulators (6 rows x 16 tokens), so no horizontal sums and 8 loads per 12 FMAs.
 * Loop nest per thread's rows: token super-block (GT tokens, xt of GK x GT floats in L2)
 *   k block (GK)  -> pack xt
 *     6-row group -> dequantize 6 x GK (L1), then the kernel for each 16- (or 8-) token block. */
#define GR 6 /* rows per kernel */
#define GK 512 /* k block (multiple of 256) */
#define GT 128 /* tokens per super-block (multiple of 16) */
#define GEMM_MIN_TOK 8

static void kernel_6x16(const float *tile, const float *xt, int64_t kb, float *out /* [6][16] */)
{
	__m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
	__m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;

	for (int64_t k = 0; k < kb; k++) {
		__m256 x0 = _mm256_loadu_ps(xt + 16 * k), x1 = _mm256_loadu_ps(xt + 16 * k + 8);
		__m256 w;
		w = _mm256_broadcast_ss(tile + k);
		c00 = _mm256_fmadd_ps(w, x0, c00);
		c01 = _mm256_fmadd_ps(w, x1, c01);
		w = _mm256_broadcast_ss(tile + GK + k);
		c10 = _mm256_fmadd_ps(w, x0, c10);
		c11 = _mm256_fmadd_ps(w, x1, c11);
		w = _mm256_broadcast_ss(tile + 2 * GK + k);
		c20 = _mm256_fmadd_ps(w, x0, c20);
		c21 = _mm256_fmadd_ps(w, x1, c21);
		w = _mm256_broadcast_ss(tile + 3 * GK + k);
		c30 = _mm256_fmadd_ps(w, x0, c30);
		c31 = _mm256_fmadd_ps(w, x1, c31);
		w = _mm256_broadcast_ss(tile + 4 * GK + k);
		c40 = _mm256_fmadd_ps(w, x0, c40);
		c41 = _mm256_fmadd_ps(w, x1, c41);
		w = _mm256_broadcast_ss(tile + 5 * GK + k);
		c50 = _mm256_fmadd_ps(w, x0, c50);
		c51 = _mm256_fmadd_ps(w, x1, c51);
	}
	_mm256_storeu_ps(out + 0, c00);
	_mm256_storeu_ps(out + 8, c01);
	_mm256_storeu_ps(out + 16, c10);
	_mm256_storeu_ps(out + 24, c11);
	_mm256_storeu_ps(out + 32, c20);
	_mm256_storeu_ps(out + 40, c21);
	_mm256_storeu_ps(out + 48, c30);
	_mm256_storeu_ps(out + 56, c31);
	_mm256_storeu_ps(out + 64, c40);
	_mm256_storeu_ps(out + 72, c41);
	_mm256_storeu_ps(out + 80, c50);
	_mm256_storeu_ps(out + 88, c51);
}

/* 6 rows x 8 tokens, for token counts (or tails) of 8 or fewer: 7 loads per 6 FMAs */
static void kernel_6x8(const float *tile, const float *xt, int64_t kb, float *out /* [6][16] */)
{
	__m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;

	for (int64_t k = 0; k < kb; k++) {
		__m256 x0 = _mm256_loadu_ps(xt + 8 * k);
		c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + k), x0, c0);
		c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + GK + k), x0, c1);
		c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + 2 * GK + k), x0, c2);
		c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + 3 * GK + k), x0, c3);
		c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + 4 * GK + k), x0, c4);
		c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + 5 * GK + k), x0, c5);
	}
	_mm256_storeu_ps(out + 0, c0);
	_mm256_storeu_ps(out + 16, c1);
	_mm256_storeu_ps(out + 32, c2);
	_mm256_storeu_ps(out + 48, c3);
	_mm256_storeu_ps(out + 64, c4);
	_mm256_storeu_ps(out + 80, c5);
}

/* width of the token block starting at tb of nt tokens: 16, or 8 for a tail of at most 8 */
static inline int64_t block_width(int64_t tb, int64_t nt)
{
	return nt - tb <= 8 ? 8 : 16;
}

static void rows_gemm(void *u, int64_t r0, int64_t r1, int thread)
{
	const struct mm *m = u;
	const struct kweight *w = m->w;
	const struct ktype_info *ti = ktype_get(w->type);
	const char *base = w->data;
	float *tile = kpool_scratch(m->p, thread, sizeof(float) * (GR * GK + GK * GT));
	quant_dequant_fn deq = quant_dequant_for(w->type);

	if (!tile) { /* out of memory for the 280 KiB of scratch: the allocation-free path */
		rows_dot(u, r0, r1, thread);
		return;
	}
	float *xt = tile + GR * GK;
	float out[GR * 16];

	for (int64_t t0 = 0; t0 < m->n_tok; t0 += GT) {
		int64_t nt = m->n_tok - t0 < GT ? m->n_tok - t0 : GT;
		for (int64_t k0 = 0; k0 < w->n_in; k0 += GK) {
			int64_t kb = w->n_in - k0 < GK ? w->n_in - k0 : GK;
			size_t off = (size_t)(k0 / ti->blck) * (size_t)ti->bytes;
			/* pack: token block at tb of width bw is xt[tb * GK + k * bw + j], zero past nt */
			for (int64_t tb = 0; tb < nt; tb += block_width(tb, nt)) {
				int64_t bw = block_width(tb, nt);
				float *dst = xt + tb * GK;
				for (int64_t j = 0; j < bw; j++) {
					if (tb + j < nt) {
						const float *src = m->x + (t0 + tb + j) * m->ldx + k0;
						for (int64_t k = 0; k < kb; k++)
							dst[bw * k + j] = src[k];
					} else {
						for (int64_t k = 0; k < kb; k++)
							dst[bw * k + j] = 0.0f;
					}
				}
			}
			for (int64_t g = r0; g < r1; g += GR) {
				int nr = r1 - g < GR ? (int)(r1 - g) : GR;
				for (int i = 0; i < GR; i++) {
					int64_t r = g + (i < nr ? i : nr - 1);
					deq(base + (size_t)r * w->row_bytes + off, tile + (size_t)i * GK, kb);
				}
				for (int64_t tb = 0; tb < nt; tb += block_width(tb, nt)) {
					int64_t bw = block_width(tb, nt);
					if (bw == 16)
						kernel_6x16(tile, xt + tb * GK, kb, out);
					else
						kernel_6x8(tile, xt + tb * GK, kb, out);
					int nj = nt - tb < bw ? (int)(nt - tb) : (int)bw;
					for (int j = 0; j < nj; j++) {
						float *yy = m->y + (t0 + tb + j) * m->ldy + g;
						for (int i = 0; i < nr; i++)
							yy[i] = k0 == 0 ? out[16 * i + j]
							                : yy[i] + out[16 * i + j];
					}
				}
			}
		}
	}
}
#endif

/* A row stride (row_bytes) shorter than n_in elements of the type, or activation strides shorter
 * than a row, are bugs in the caller (the loader validated the file); reading with them would run
 * past tensors. A longer row_bytes is fine: a TP rank's slice of the input dimension keeps the
 * full row as stride. */
static void check_args(const char *what, const struct kweight *w, int64_t ldx, int64_t n_tok, int64_t ldy)
{
	size_t rb = 0;

	if (!ktype_row_bytes(w->type, w->n_in, &rb) || rb > w->row_bytes || w->n_in <= 0 ||
	    (n_tok > 1 && (ldx < w->n_in || ldy < w->n_out))) {
		fprintf(
		    stderr,
		    "%s: bad weight %s n_in %lld row_bytes %zu (need >= %zu) or strides ldx %lld ldy %lld\n",
		    what, ktype_name(w->type), (long long)w->n_in, w->row_bytes, rb, (long long)ldx,
		    (long long)ldy);
		abort();
	}
}

void kcpu_matmul(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                 float *y, int64_t ldy)
{
	struct mm m = {.w = w, .x = x, .ldx = ldx, .n_tok = n_tok, .y = y, .ldy = ldy, .p = p};

	if (n_tok <= 0 || w->n_out <= 0)
		return;
	check_args("kcpu_matmul", w, ldx, n_tok, ldy);
	bool is_float = w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16;
	if (n_tok < (is_float ? SMALL_TOK_FLOAT : SMALL_TOK_QUANT)) {
		/* about 64 KiB of weights per chunk so small matrices stay on one thread */
		int64_t grain = (int64_t)(65536 / (w->row_bytes ? w->row_bytes : 1));
		kpool_for(p, w->n_out, grain < 1 ? 1 : grain, rows_dot, &m);
	} else {
#if QUANT_AVX2
		if (n_tok >= GEMM_MIN_TOK) {
			kpool_for(p, w->n_out, 2 * GR, rows_gemm, &m);
			return;
		}
#endif
		kpool_for(p, w->n_out, 2 * RG, rows_tiled, &m);
	}
}

struct mm_fast {
	const struct kweight *w;
	const struct quant_xq8 *xq;
	int64_t n_tok;
	float *y;
	int64_t ldy;
};

static void rows_fast(void *u, int64_t r0, int64_t r1, int thread)
{
	const struct mm_fast *m = u;
	const struct kweight *w = m->w;
	const char *base = w->data;
	int64_t nb = w->n_in / 256;

	for (int64_t r = r0; r < r1; r++) {
		const void *row = base + (size_t)r * w->row_bytes;
		for (int64_t t = 0; t < m->n_tok; t++)
			m->y[t * m->ldy + r] = quant_dot_xq8(w->type, row, m->xq + t * nb, w->n_in);
	}
}

bool kcpu_matmul_fast_supported(int type)
{
	return quant_has_xq8(type);
}

void kcpu_matmul_fast(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                      float *y, int64_t ldy)
{
	if (n_tok <= 0 || w->n_out <= 0)
		return;
	check_args("kcpu_matmul_fast", w, ldx, n_tok, ldy);
	struct quant_xq8 *xq = NULL;
	/* from FAST_TOK_MAX tokens on, the fp32 tiles of kcpu_matmul (register-blocked over rows and
	 * tokens) beat per-token integer dots (bench_matmul, 2026-11-29) */
	if (quant_has_xq8(w->type) && w->n_in % 256 == 0 && n_tok < FAST_TOK_MAX)
		xq = kpool_scratch(p, kpool_n_threads(p),
		                   sizeof(struct quant_xq8) * (size_t)(w->n_in / 256) * (size_t)n_tok);
	if (!xq) {
		kcpu_matmul(p, w, x, ldx, n_tok, y, ldy);
		return;
	}
	for (int64_t t = 0; t < n_tok; t++)
		quant_xq8_row(x + t * ldx, xq + t * (w->n_in / 256), w->n_in);
	struct mm_fast m = {.w = w, .xq = xq, .n_tok = n_tok, .y = y, .ldy = ldy};
	int64_t grain = (int64_t)(65536 / (w->row_bytes ? w->row_bytes : 1));
	kpool_for(p, w->n_out, grain < 1 ? 1 : grain, rows_fast, &m);
}
