/* Y = X W^T on the CPU for every weight type: kcpu_matmul, threaded over output rows.
 *
 * One token (decode; up to 3 for float types): each thread takes a contiguous range of rows and computes fused
 * dequant-dots (kcpu_dot_row) per row and token; the row is read from memory once and stays in
 * L1 for the other tokens. This is memory-bound, so nothing is dequantized to memory.
 *
 * Many tokens (prefill): a weight row is dequantized once per (token block, k block) into a
 * per-thread fp32 tile and reused by every token of the block. Loop nest per thread's rows:
 *   token block of TB tokens  (x slice of TB x KB floats stays in L2)
 *     k block of KB elements  (a multiple of 256, so every block type splits cleanly)
 *       4-row group: dequantize 4 x KB floats (L1), then a 4-row x 2-token FMA kernel over all
 *       tokens of the block, accumulating into Y (first k block stores).
 * The sums are fp32; their order differs from kcpu_dot_row (k blocks), within fp32 rounding.
 *
 * kcpu_matmul_fast (opt-in, approximate): for fewer than FAST_TOK_MAX tokens, quantizes each
 * token's activations once to int8 blocks of 32 (quant_act.c), then integer dots per row and
 * token, threaded over rows like the fused path; more tokens use the exact tiled path. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/quant_impl.h"

/* Below this many tokens the fused dots win: for quantized types (whose dequantization costs
 * about as much as a fused dot) only a single token; float types' dots are cheap enough to
 * repeat for up to 3 tokens (measured with Q4_K/Q8_0/Q6_K/BF16 at 2048 x 6144, 2026-11-29). */
#define SMALL_TOK_QUANT 2
#define SMALL_TOK_FLOAT 4
#define TB 64        /* tokens per block */
#define KB 1024      /* elements per k block */
#define RG 4         /* rows per group (kernel height) */
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

	(void)thread;
	for (int64_t r = r0; r < r1; r++) {
		const void *row = base + (size_t)r * w->row_bytes;
		for (int64_t t = 0; t < m->n_tok; t++)
			m->y[t * m->ldy + r] = kcpu_dot_row(w->type, row, m->x + t * m->ldx, w->n_in);
	}
}

/* out[i*2 + j] = dot(w row i, x_j) over kb elements, rows at stride ldw */
static void kernel_4x2(const float *w, int64_t ldw, const float *x0, const float *x1, int64_t kb,
		       float *out)
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
					kcpu_dequant_row(w->type, base + (size_t)r * w->row_bytes + off,
							 tile + (size_t)i * KB, kb);
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

void kcpu_matmul(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
		 float *y, int64_t ldy)
{
	struct mm m = {.w = w, .x = x, .ldx = ldx, .n_tok = n_tok, .y = y, .ldy = ldy, .p = p};

	if (n_tok <= 0 || w->n_out <= 0)
		return;
	bool is_float = w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16;
	if (n_tok < (is_float ? SMALL_TOK_FLOAT : SMALL_TOK_QUANT)) {
		/* about 64 KiB of weights per chunk so small matrices stay on one thread */
		int64_t grain = (int64_t)(65536 / (w->row_bytes ? w->row_bytes : 1));
		kpool_for(p, w->n_out, grain < 1 ? 1 : grain, rows_dot, &m);
	} else {
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
	int64_t nb = w->n_in / 32;

	(void)thread;
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

void kcpu_matmul_fast(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx,
		      int64_t n_tok, float *y, int64_t ldy)
{
	if (n_tok <= 0 || w->n_out <= 0)
		return;
	struct quant_xq8 *xq = NULL;
	/* from FAST_TOK_MAX tokens on, the fp32 tiles of kcpu_matmul (register-blocked over rows and
	 * tokens) beat per-token integer dots (bench_matmul, 2026-11-29) */
	if (quant_has_xq8(w->type) && w->n_in % 256 == 0 && n_tok < FAST_TOK_MAX)
		xq = kpool_scratch(p, kpool_n_threads(p),
				   sizeof(struct quant_xq8) * (size_t)(w->n_in / 32) * (size_t)n_tok);
	if (!xq) {
		kcpu_matmul(p, w, x, ldx, n_tok, y, ldy);
		return;
	}
	for (int64_t t = 0; t < n_tok; t++)
		quant_xq8_row(x + t * ldx, xq + t * (w->n_in / 32), w->n_in);
	struct mm_fast m = {.w = w, .xq = xq, .n_tok = n_tok, .y = y, .ldy = ldy};
	int64_t grain = (int64_t)(65536 / (w->row_bytes ? w->row_bytes : 1));
	kpool_for(p, w->n_out, grain < 1 ? 1 : grain, rows_fast, &m);
}
