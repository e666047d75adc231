/* Host emulation of the index math of the fast CUDA attention kernels (no GPU needed, so CI runs
 * it): kernels/cuda/mla_attn_mma.cu, indexer_fast.cu and topk_idx_radix.cu re-enacted thread by thread, phase
 * by phase (one phase = the code between two __syncthreads), with the same index expressions, the tensor-core
 * mma.sync m16n8k16 emulated from the PTX fragment layout (groupID = lane / 4, threadID_in_group = lane % 4;
 * A regs {row g | g+8} x {cols 2t | 2t+8}, B regs k {2t | 2t+8} at column g, C {row g | g+8} at cols 2t,
 * 2t+1), and the host-side split policy. Checked against the CPU ops (kcpu_mla_attn_head, kcpu_indexer_scores
 * (bit-equal on integer data), kcpu_topk) on random data, with the edge cases the GPU tests have (contexts 1,
 * 31, 33, 64, 65, 2049; top-k lists; a bad block id; heads not a multiple of 16; C 64 / 96; splits with no
 * keys). This checks the fragment/tile/split arithmetic only: races, cp.async ordering and the real mma
 * hardware need the GPU (tests/ops/test_ops_mla, test_ops_indexer). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int n_fail, n_check;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		n_check++;                                                                                   \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

static uint64_t rng = 0x1234567;
static uint64_t rnext(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}
static float runif(void)
{
	return (float)((double)(rnext() >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* ---- bf16 and the mma ---------------------------------------------------------------------- */
static float bf(uint16_t h)
{
	return kbf16_to_f32(h);
}
static uint32_t pack2(float x, float y)
{
	return (uint32_t)kf32_to_bf16(x) | ((uint32_t)kf32_to_bf16(y) << 16);
}
static void split2(float x, float y, uint32_t *hi, uint32_t *lo)
{
	*hi = pack2(x, y);
	*lo = pack2(x - bf((uint16_t)(*hi & 0xffff)), y - bf((uint16_t)(*hi >> 16)));
}
/* one warp's mma.sync.m16n8k16 (bf16 in, fp32 accumulate): per-lane registers */
static void emu_mma(float d[32][4], uint32_t a[32][4], const uint32_t b0[32], const uint32_t b1[32])
{
	float A[16][16], B[16][8], D[16][8];
	for (int lane = 0; lane < 32; lane++) {
		const int g = lane >> 2, t = lane & 3;
		for (int r = 0; r < 4; r++) {
			const int row = g + ((r & 1) ? 8 : 0), col = 2 * t + ((r & 2) ? 8 : 0);
			A[row][col] = bf((uint16_t)(a[lane][r] & 0xffff));
			A[row][col + 1] = bf((uint16_t)(a[lane][r] >> 16));
		}
		B[2 * t][g] = bf((uint16_t)(b0[lane] & 0xffff));
		B[2 * t + 1][g] = bf((uint16_t)(b0[lane] >> 16));
		B[2 * t + 8][g] = bf((uint16_t)(b1[lane] & 0xffff));
		B[2 * t + 9][g] = bf((uint16_t)(b1[lane] >> 16));
		D[g][2 * t] = d[lane][0];
		D[g][2 * t + 1] = d[lane][1];
		D[g + 8][2 * t] = d[lane][2];
		D[g + 8][2 * t + 1] = d[lane][3];
	}
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 8; j++) {
			double s = D[i][j];
			for (int k = 0; k < 16; k++)
				s += (double)A[i][k] * B[k][j];
			D[i][j] = (float)s;
		}
	for (int lane = 0; lane < 32; lane++) {
		const int g = lane >> 2, t = lane & 3;
		d[lane][0] = D[g][2 * t];
		d[lane][1] = D[g][2 * t + 1];
		d[lane][2] = D[g + 8][2 * t];
		d[lane][3] = D[g + 8][2 * t + 1];
	}
}

/* ---- MLA: mla_mma_kernel + mla_mma_combine + the host split policy --------------------------- */
#define MM_WARPS 4
#define MM_HG 16
#define MM_TK 32
#define MM_KSW 9
#define MM_NTW 16
#define MM_PS 40
#define MM_MAX_SPLIT 1024

struct mm_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, dim, elt; /* elt 2: bf16 pool, 4: fp32 pool */
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	const float *q;
	int H, C;
	float scale;
	int chunk, nsplit;
	float *out, *pacc, *pm, *pl;
	unsigned err;
};

static const uint8_t *mm_key_row(const struct mm_args *a, int64_t row, int j)
{
	const int64_t p = a->sel ? (int64_t)a->sel[row * a->ld_sel + j] : (int64_t)j;
	if (p < 0 || p >= a->ld_blocks * a->bt)
		return NULL;
	const int32_t tbl = a->qseq ? a->qseq[row] : 0;
	const int64_t blk = a->blocks[(int64_t)tbl * a->ld_blocks + p / a->bt];
	if (blk < 0 || blk >= a->n_blocks)
		return NULL;
	return a->base + (size_t)blk * a->block_bytes + a->offset +
	       (size_t)(p % a->bt) * (size_t)a->dim * (size_t)a->elt;
}

/* value i of a shared tile row block (bf16 bits or fp32) */
static float kv_val(const uint8_t *kt, int i, int elt)
{
	if (elt == 4) {
		float v;
		memcpy(&v, kt + 4 * (size_t)i, 4);
		return v;
	}
	uint16_t h;
	memcpy(&h, kt + 2 * (size_t)i, 2);
	return bf(h);
}

/* per-thread state of one block */
struct mm_thr {
	uint32_t qh[MM_KSW][4], ql[MM_KSW][4];
	float oacc[MM_NTW][4];
	float m_run, l_run;
};

static void emu_mla_block(struct mm_args *a, int64_t row, int split, int bz)
{
	const int dim = a->dim, elt = a->elt, RS = elt == 4 ? dim + 4 : dim + 8, C = a->C, h0 = bz * MM_HG;
	uint8_t *kv_s = calloc((size_t)2 * MM_TK * RS, (size_t)elt);
	float sred[MM_WARPS][MM_HG][MM_TK];
	uint16_t phi[MM_HG * MM_PS], plo[MM_HG * MM_PS];
	float corr_s[MM_HG], ml_s[2 * MM_HG];
	const uint8_t *addr_s[2 * MM_TK];
	static struct mm_thr th[128];
	memset(th, 0, sizeof(th));

	int64_t nk64 = a->n_keys ? (int64_t)a->n_keys[row] : a->pos0 + row + 1;
	if (nk64 < 0 || nk64 > a->max_keys) {
		if (split == 0 && bz == 0)
			a->err++;
		nk64 = nk64 < 0 ? 0 : a->max_keys;
	}
	const int nk = (int)nk64;
	const int k0 = split * a->chunk, k1 = nk < k0 + a->chunk ? nk : k0 + a->chunk;
	const int ntiles = k1 > k0 ? (k1 - k0 + MM_TK - 1) / MM_TK : 0;
	const int nks = dim / 16;
	for (int tid = 0; tid < 128; tid++) {
		const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
		for (int i = 0; i < MM_KSW; i++) {
			const int ks = warp + MM_WARPS * i;
			for (int r = 0; r < 4; r++) {
				const int h = h0 + g + ((r & 1) ? 8 : 0);
				const int col = ks * 16 + 2 * t + ((r & 2) ? 8 : 0);
				float vx = 0, vy = 0;
				if (ks < nks && h < a->H) {
					vx = a->q[(row * a->H + h) * (int64_t)dim + col];
					vy = a->q[(row * a->H + h) * (int64_t)dim + col + 1];
				}
				split2(vx, vy, &th[tid].qh[i][r], &th[tid].ql[i][r]);
			}
		}
		th[tid].m_run = -INFINITY;
		th[tid].l_run = 0;
	}
#define FILL_ADDR(n, st)                                                                                     \
	for (int lane = 0; lane < 32; lane++) {                                                              \
		const int j = k0 + (n)*MM_TK + lane;                                                         \
		const uint8_t *p = NULL;                                                                     \
		if (j < k1) {                                                                                \
			p = mm_key_row(a, row, j);                                                           \
			if (!p)                                                                              \
				a->err++;                                                                    \
		}                                                                                            \
		addr_s[(st)*MM_TK + lane] = p;                                                               \
	}
#define ISSUE(st)                                                                                            \
	for (int warp = 0; warp < MM_WARPS; warp++)                                                          \
		for (int r = warp; r < MM_TK; r += MM_WARPS) {                                               \
			const uint8_t *p = addr_s[(st)*MM_TK + r];                                           \
			uint8_t *dst = kv_s + (size_t)((st)*MM_TK + r) * RS * elt;                           \
			for (int c = 0; c < dim * elt / 16; c++) {                                           \
				if (p)                                                                       \
					memcpy(dst + 16 * c, p + 16 * c, 16);                                \
				else                                                                         \
					memset(dst + 16 * c, 0, 16);                                         \
			}                                                                                    \
		}
	if (ntiles > 0) {
		FILL_ADDR(0, 0);
		ISSUE(0);
	}
	const int cw = C / MM_WARPS, ntw = cw / 8;
	for (int n = 0; n < ntiles; n++) {
		const int st = n & 1;
		if (n + 1 < ntiles) {
			FILL_ADDR(n + 1, st ^ 1);
			ISSUE(st ^ 1);
		}
		const uint8_t *kt = kv_s + (size_t)st * MM_TK * RS * elt;
		/* QK: per warp, registers of all lanes */
		for (int warp = 0; warp < MM_WARPS; warp++) {
			static float sacc[4][32][4];
			memset(sacc, 0, sizeof(sacc));
			for (int i = 0; i < MM_KSW; i++) {
				const int ks = warp + MM_WARPS * i;
				if (ks >= nks)
					continue;
				for (int j = 0; j < 4; j++) {
					uint32_t b0[32], b1[32], c0[32], c1[32], ah[32][4], al[32][4];
					for (int lane = 0; lane < 32; lane++) {
						const int g = lane >> 2, t = lane & 3;
						const int kr = (8 * j + g) * RS + ks * 16 + 2 * t;
						split2(kv_val(kt, kr, elt), kv_val(kt, kr + 1, elt),
						       &b0[lane], &c0[lane]);
						split2(kv_val(kt, kr + 8, elt), kv_val(kt, kr + 9, elt),
						       &b1[lane], &c1[lane]);
						memcpy(ah[lane], th[warp * 32 + lane].qh[i], 16);
						memcpy(al[lane], th[warp * 32 + lane].ql[i], 16);
					}
					emu_mma(sacc[j], ah, b0, b1);
					emu_mma(sacc[j], al, b0, b1);
					if (elt == 4)
						emu_mma(sacc[j], ah, c0, c1);
				}
			}
			for (int lane = 0; lane < 32; lane++) {
				const int g = lane >> 2, t = lane & 3;
				for (int j = 0; j < 4; j++) {
					sred[warp][g][8 * j + 2 * t] = sacc[j][lane][0];
					sred[warp][g][8 * j + 2 * t + 1] = sacc[j][lane][1];
					sred[warp][g + 8][8 * j + 2 * t] = sacc[j][lane][2];
					sred[warp][g + 8][8 * j + 2 * t + 1] = sacc[j][lane][3];
				}
			}
		}
		/* softmax: groups of 8 threads (the shuffles = reductions over the group) */
		for (int grp = 0; grp < 16; grp++) {
			const int sh = grp;
			float s[8][4], mt = -INFINITY, ps = 0;
			for (int q8 = 0; q8 < 8; q8++) {
				const int sk = q8 * 4;
				for (int u = 0; u < 4; u++) {
					float d = 0;
					for (int w = 0; w < MM_WARPS; w++)
						d += sred[w][sh][sk + u];
					s[q8][u] = addr_s[st * MM_TK + sk + u] ? d * a->scale : -INFINITY;
					mt = fmaxf(mt, s[q8][u]);
				}
			}
			const int tid0 = grp * 8;
			const float m_old = th[tid0].m_run;
			const float mn = fmaxf(m_old, mt);
			const float corr = mn == -INFINITY ? 1.0f : expf(m_old - mn);
			for (int q8 = 0; q8 < 8; q8++)
				for (int u = 0; u < 4; u++) {
					const float p = mn == -INFINITY ? 0.0f : expf(s[q8][u] - mn);
					ps += p;
					const uint16_t hi = kf32_to_bf16(p);
					phi[sh * MM_PS + q8 * 4 + u] = hi;
					plo[sh * MM_PS + q8 * 4 + u] = kf32_to_bf16(p - bf(hi));
				}
			for (int q8 = 0; q8 < 8; q8++) {
				th[tid0 + q8].l_run = th[tid0 + q8].l_run * corr + ps;
				th[tid0 + q8].m_run = mn;
			}
			corr_s[sh] = corr;
		}
		/* PV */
		for (int warp = 0; warp < MM_WARPS; warp++) {
			for (int lane = 0; lane < 32; lane++) {
				const int g = lane >> 2;
				for (int j = 0; j < MM_NTW; j++) {
					th[warp * 32 + lane].oacc[j][0] *= corr_s[g];
					th[warp * 32 + lane].oacc[j][1] *= corr_s[g];
					th[warp * 32 + lane].oacc[j][2] *= corr_s[g + 8];
					th[warp * 32 + lane].oacc[j][3] *= corr_s[g + 8];
				}
			}
			for (int kk = 0; kk < MM_TK / 16; kk++) {
				uint32_t ah[32][4], al[32][4];
				for (int lane = 0; lane < 32; lane++) {
					const int g = lane >> 2, t = lane & 3, pc = kk * 16 + 2 * t;
					const uint16_t *P[2] = {phi, plo};
					uint32_t *dst[2] = {ah[lane], al[lane]};
					for (int x = 0; x < 2; x++) {
						const uint16_t *pp = P[x];
						dst[x][0] = pp[g * MM_PS + pc] |
						            ((uint32_t)pp[g * MM_PS + pc + 1] << 16);
						dst[x][1] = pp[(g + 8) * MM_PS + pc] |
						            ((uint32_t)pp[(g + 8) * MM_PS + pc + 1] << 16);
						dst[x][2] = pp[g * MM_PS + pc + 8] |
						            ((uint32_t)pp[g * MM_PS + pc + 9] << 16);
						dst[x][3] = pp[(g + 8) * MM_PS + pc + 8] |
						            ((uint32_t)pp[(g + 8) * MM_PS + pc + 9] << 16);
					}
				}
				for (int j = 0; j < ntw; j++) {
					uint32_t b0[32], b1[32], c0[32], c1[32];
					float acc[32][4];
					for (int lane = 0; lane < 32; lane++) {
						const int g = lane >> 2, t = lane & 3, pc = kk * 16 + 2 * t;
						const int v = pc * RS + warp * cw + g + 8 * j;
						split2(kv_val(kt, v, elt), kv_val(kt, v + RS, elt), &b0[lane],
						       &c0[lane]);
						split2(kv_val(kt, v + 8 * RS, elt),
						       kv_val(kt, v + 9 * RS, elt), &b1[lane], &c1[lane]);
						memcpy(acc[lane], th[warp * 32 + lane].oacc[j], 16);
					}
					emu_mma(acc, ah, b0, b1);
					emu_mma(acc, al, b0, b1);
					if (elt == 4)
						emu_mma(acc, ah, c0, c1);
					for (int lane = 0; lane < 32; lane++)
						memcpy(th[warp * 32 + lane].oacc[j], acc[lane], 16);
				}
			}
		}
	}
	for (int sh = 0; sh < 16; sh++) {
		ml_s[2 * sh] = th[sh * 8].m_run;
		ml_s[2 * sh + 1] = th[sh * 8].l_run;
	}
	for (int tid = 0; tid < 128; tid++) {
		const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
		for (int j = 0; j < ntw; j++) {
			const int cc = warp * cw + 8 * j + 2 * t;
			for (int half = 0; half < 2; half++) {
				const int hl = g + 8 * half;
				if (h0 + hl >= a->H)
					continue;
				const int64_t rh = row * a->H + h0 + hl;
				const float l = ml_s[2 * hl + 1];
				const float v0 = th[tid].oacc[j][2 * half],
				            v1 = th[tid].oacc[j][2 * half + 1];
				if (a->nsplit == 1) {
					const float inv = l > 0.0f ? 1.0f / l : 0.0f;
					a->out[rh * C + cc] = v0 * inv;
					a->out[rh * C + cc + 1] = v1 * inv;
				} else if (l > 0.0f) {
					const int64_t ps = rh * a->nsplit + split;
					a->pacc[ps * C + cc] = v0;
					a->pacc[ps * C + cc + 1] = v1;
				}
			}
		}
	}
	if (a->nsplit > 1)
		for (int tid = 0; tid < MM_HG && h0 + tid < a->H; tid++) {
			const int64_t ps = (row * a->H + h0 + tid) * a->nsplit + split;
			a->pm[ps] = ml_s[2 * tid];
			a->pl[ps] = ml_s[2 * tid + 1];
		}
	free(kv_s);
#undef FILL_ADDR
#undef ISSUE
}

static void emu_mla_combine(const struct mm_args *a, int64_t n_q, float *out)
{
	const int ns = a->nsplit, C = a->C;
	float *w_s = malloc(sizeof(float) * (size_t)ns);
	for (int64_t rh = 0; rh < n_q * a->H; rh++) {
		const float *m = a->pm + rh * ns, *l = a->pl + rh * ns;
		float M = -INFINITY, L = 0;
		for (int s = 0; s < ns; s++)
			if (l[s] > 0)
				M = fmaxf(M, m[s]);
		for (int s = 0; s < ns; s++)
			if (l[s] > 0)
				L += l[s] * expf(m[s] - M);
		const float inv = L > 0 ? 1.0f / L : 0.0f;
		for (int s = 0; s < ns; s++)
			w_s[s] = l[s] > 0 ? expf(m[s] - M) * inv : 0.0f;
		for (int cc = 0; cc < C; cc++) {
			float part[4];
			for (int warp = 0; warp < 4; warp++) { /* warp w: splits w, w + 4, ... */
				float v = 0;
				for (int s = warp; s < ns; s += 4)
					if (w_s[s] != 0.0f)
						v = fmaf(w_s[s], a->pacc[(rh * ns + s) * C + cc], v);
				part[warp] = v;
			}
			out[rh * C + cc] = (part[0] + part[1]) + (part[2] + part[3]);
		}
	}
	free(w_s);
}

/* kcuda_mla_attn's host part (n_sm SMs, ws_bytes workspace) + the emulated kernels */
static void emu_mla(struct mm_args *a, int64_t n_q, int n_sm, size_t ws_bytes, float *out)
{
	const int n_hg = (a->H + MM_HG - 1) / MM_HG;
	const int64_t max_tiles = (a->max_keys + MM_TK - 1) / MM_TK;
	const int64_t blocks = n_q * n_hg;
	int64_t want = ((a->elt == 2 ? 2 : 1) * (int64_t)n_sm + blocks - 1) / blocks;
	if (want > max_tiles)
		want = max_tiles;
	if (want > MM_MAX_SPLIT)
		want = MM_MAX_SPLIT;
	const size_t per_split = (size_t)n_q * (size_t)a->H * ((size_t)a->C + 2) * sizeof(float);
	if (want > 1 && (size_t)want * per_split > ws_bytes)
		want = (int64_t)(ws_bytes / per_split);
	if (want < 1)
		want = 1;
	const int64_t tiles_per = max_tiles > 0 ? (max_tiles + want - 1) / want : 1;
	a->chunk = (int)(tiles_per * MM_TK);
	a->nsplit = max_tiles > 0 ? (int)((max_tiles + tiles_per - 1) / tiles_per) : 1;
	const size_t n_ps = (size_t)n_q * (size_t)a->H * (size_t)a->nsplit;
	CHECK(n_ps * ((size_t)a->C + 2) * sizeof(float) <= ws_bytes || a->nsplit == 1,
	      "partials (%zu splits) overflow the workspace", (size_t)a->nsplit);
	/* the partials start as NaN: whatever the combine reads must have been written */
	float *ws = malloc(sizeof(float) * n_ps * ((size_t)a->C + 2));
	for (size_t i = 0; i < n_ps * ((size_t)a->C + 2); i++)
		ws[i] = NAN;
	a->pacc = ws;
	a->pm = ws + n_ps * (size_t)a->C;
	a->pl = a->pm + n_ps;
	a->out = out;
	for (int64_t row = 0; row < n_q; row++)
		for (int s = 0; s < a->nsplit; s++)
			for (int z = 0; z < n_hg; z++)
				emu_mla_block(a, row, s, z);
	if (a->nsplit > 1)
		emu_mla_combine(a, n_q, out);
	free(ws);
}

#define BT 64
static void mla_case(const char *name, int f32, int H, int C, int R, int n_seq, const int *lens, int K,
                     int bad_block, int n_sm, size_t ws_bytes, float qmul)
{
	const int dim = C + R, elt = f32 ? 4 : 2;
	int max_len = 0, tot = 0;
	for (int s = 0; s < n_seq; s++) {
		max_len = lens[s] > max_len ? lens[s] : max_len;
		tot += (lens[s] + BT - 1) / BT;
	}
	const int ld_blocks = (max_len + BT - 1) / BT + 1, n_blocks = tot + 2;
	const size_t block_bytes = (size_t)BT * dim * elt + 64; /* + an unused tail: offsets matter */
	uint8_t *pool = malloc(block_bytes * (size_t)n_blocks);
	for (size_t i = 0; i < block_bytes * (size_t)n_blocks / (size_t)elt; i++) {
		const float v = runif();
		const uint16_t b = kf32_to_bf16(v);
		if (f32)
			memcpy(pool + 4 * i, &v, 4);
		else
			memcpy(pool + 2 * i, &b, 2);
	}
	int32_t *tbl = malloc(sizeof(int32_t) * (size_t)(n_seq * ld_blocks)),
	        *nk = malloc(sizeof(int32_t) * n_seq);
	int32_t *qseq = malloc(sizeof(int32_t) * n_seq),
	        *sel = malloc(sizeof(int32_t) * (size_t)(n_seq * (K ? K : 1)));
	int used = n_blocks - 1; /* hand out blocks backwards: tables are not the identity */
	for (int s = 0; s < n_seq; s++) {
		qseq[s] = n_seq - 1 - s; /* rows use tables in reverse */
		for (int b = 0; b < ld_blocks; b++)
			tbl[s * ld_blocks + b] = b < (lens[s] + BT - 1) / BT ? used-- : -1;
	}
	float *tmp = malloc(sizeof(float) * (size_t)(max_len + 1));
	for (int i = 0; i < n_seq; i++) {
		const int vis = lens[qseq[i]];
		if (K > 0) {
			for (int j = 0; j < vis; j++)
				tmp[j] = runif();
			nk[i] = kcpu_topk(tmp, vis, K, sel + i * K);
		} else {
			nk[i] = vis;
		}
	}
	if (bad_block && lens[qseq[0]] > 0)
		tbl[qseq[0] * ld_blocks] = n_blocks + 5; /* row 0's first block: out of the pool */
	float *q = malloc(sizeof(float) * (size_t)(n_seq * H * dim));
	for (int i = 0; i < n_seq * H * dim; i++)
		q[i] = runif() * qmul;
	const float scale = 1.0f / sqrtf((float)dim);
	float *ref = calloc((size_t)(n_seq * H * C), sizeof(float)),
	      *got = calloc((size_t)(n_seq * H * C), sizeof(float));
	const void **keys = malloc(sizeof(void *) * (size_t)(max_len + 1));
	float *sc = malloc(sizeof(float) * (size_t)(max_len + 1));
	unsigned want_err = 0;
	for (int i = 0; i < n_seq; i++) {
		const int32_t *t = tbl + (size_t)qseq[i] * ld_blocks;
		int nv = 0;
		for (int j = 0; j < nk[i]; j++) {
			const int p = K > 0 ? sel[i * K + j] : j;
			const int32_t blk = t[p / BT];
			if (blk < 0 || blk >= n_blocks) {
				want_err++;
				continue; /* skipped, as the kernel does */
			}
			keys[nv++] = pool + (size_t)blk * block_bytes + 32 + (size_t)(p % BT) * dim * elt;
		}
		for (int h = 0; h < H; h++) {
			if (nv == 0)
				memset(ref + (i * H + h) * C, 0, sizeof(float) * (size_t)C);
			else
				kcpu_mla_attn_head(q + (i * H + h) * dim, C, R, keys, nv, !f32, scale, sc,
				                   ref + (i * H + h) * C);
		}
	}
	struct mm_args a = {.base = pool,
	                    .n_blocks = n_blocks,
	                    .block_bytes = block_bytes,
	                    .offset = 32,
	                    .bt = BT,
	                    .dim = dim,
	                    .elt = elt,
	                    .qseq = qseq,
	                    .blocks = tbl,
	                    .n_keys = nk,
	                    .sel = K > 0 ? sel : NULL,
	                    .ld_blocks = ld_blocks,
	                    .ld_sel = K > 0 ? K : 1,
	                    .max_keys = K > 0 && K < max_len ? K : max_len,
	                    .q = q,
	                    .H = H,
	                    .C = C,
	                    .scale = scale};
	emu_mla(&a, n_seq, n_sm, ws_bytes, got);
	double maxref = 0, maxerr = 0;
	int nonfinite = 0;
	for (int i = 0; i < n_seq * H * C; i++) {
		if (!isfinite(got[i])) {
			nonfinite++;
			continue;
		}
		maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
		const double e = fabs((double)got[i] - ref[i]);
		maxerr = e > maxerr ? e : maxerr;
	}
	const int n_hg = (H + MM_HG - 1) / MM_HG;
	CHECK(nonfinite == 0, "%s: %d non-finite outputs", name, nonfinite);
	CHECK(maxerr <= 5e-5 * maxref, "%s: max err %.3g, max |ref| %.3g", name, maxerr, maxref);
	CHECK(want_err == 0 ? a.err == 0 : a.err == want_err * (unsigned)n_hg,
	      "%s: %u errors counted, want %u", name, a.err, want_err * (unsigned)n_hg);
	printf("mla emul %-40s splits %4d chunk %5d max err %.2g (rel %.2g) errors %u\n", name, a.nsplit,
	       a.chunk, maxerr, maxref > 0 ? maxerr / maxref : 0.0, a.err);
	free(pool);
	free(tbl);
	free(nk);
	free(qseq);
	free(sel);
	free(tmp);
	free(q);
	free(ref);
	free(got);
	free(keys);
	free(sc);
}

/* ---- indexer: indexer_fast_kernel ------------------------------------------------------------ */
#define IF_TK 64
#define IF_TILES 2
#define IF_SP 65

/* the three bf16 parts of (x, y) as the kernel's if_split3 */
static void split3(float x, float y, uint32_t *p0, uint32_t *p1, uint32_t *p2)
{
	*p0 = pack2(x, y);
	const float rx = x - bf((uint16_t)(*p0 & 0xffff)), ry = y - bf((uint16_t)(*p0 >> 16));
	*p1 = pack2(rx, ry);
	*p2 = pack2(rx - bf((uint16_t)(*p1 & 0xffff)), ry - bf((uint16_t)(*p1 >> 16)));
}

/* one row's scores over keys [0, nk) (positions = key index, rows of DI bf16 at keys[p]) */
static void emu_indexer_row(const float *q, const float *w, int HI, int DI, int elt,
                            const uint8_t *const *keys, int nk, float scale, float *scores)
{
	const int MW = HI <= 16 ? 1 : (HI <= 32 ? 2 : 4), KG = 4 / MW, NT = IF_TK / 8 / KG,
	          RS = elt == 4 ? DI + 4 : DI + 8;
	const int nks = DI / 16;
	static uint32_t qf[128][8][3][4];
	for (int tid = 0; tid < 128; tid++) {
		const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, mw = warp % MW;
		for (int ks = 0; ks < 8; ks++)
			for (int r = 0; r < 4; r++) {
				const int h = 16 * mw + g + ((r & 1) ? 8 : 0);
				const int col = ks * 16 + 2 * t + ((r & 2) ? 8 : 0);
				float vx = 0, vy = 0;
				if (ks < nks && h < HI) {
					vx = q[h * DI + col];
					vy = q[h * DI + col + 1];
				}
				split3(vx, vy, &qf[tid][ks][0][r], &qf[tid][ks][1][r], &qf[tid][ks][2][r]);
				/* the parts add up to the value exactly */
				const float sx = bf((uint16_t)(qf[tid][ks][0][r] & 0xffff)) +
				                 bf((uint16_t)(qf[tid][ks][1][r] & 0xffff)) +
				                 bf((uint16_t)(qf[tid][ks][2][r] & 0xffff));
				if (sx != vx) {
					CHECK(0, "split3(%.9g) = %.9g", vx, sx);
					return;
				}
			}
	}
	uint8_t *k_s = calloc((size_t)IF_TK * RS, (size_t)elt);
	float *d_s = calloc((size_t)IF_TK * IF_SP, 4);
	for (int64_t k0 = 0; k0 < nk; k0 += IF_TK * IF_TILES) {
		const int64_t k1 = nk < k0 + IF_TK * IF_TILES ? nk : k0 + IF_TK * IF_TILES;
		const int ntiles = (int)((k1 - k0 + IF_TK - 1) / IF_TK);
		for (int n = 0; n < ntiles; n++) {
			for (int r = 0; r < IF_TK; r++) {
				const int64_t p = k0 + (int64_t)n * IF_TK + r;
				if (p < k1)
					memcpy(k_s + (size_t)r * RS * elt, keys[p], (size_t)DI * elt);
				else
					memset(k_s + (size_t)r * RS * elt, 0, (size_t)DI * elt);
			}
			for (int warp = 0; warp < 4; warp++) {
				const int mw = warp % MW, kg = warp / MW;
				if (16 * mw >= HI)
					continue;
				static float acc[8][32][4];
				memset(acc, 0, sizeof(acc));
				for (int ks = 0; ks < nks; ks++)
					for (int j = 0; j < NT; j++) {
						uint32_t b0[3][32], b1[3][32], a3[3][32][4];
						for (int lane = 0; lane < 32; lane++) {
							const int g = lane >> 2, t = lane & 3;
							const int kr =
							    (kg * NT * 8 + 8 * j + g) * RS + ks * 16 + 2 * t;
							split3(kv_val(k_s, kr, elt), kv_val(k_s, kr + 1, elt),
							       &b0[0][lane], &b0[1][lane], &b0[2][lane]);
							split3(kv_val(k_s, kr + 8, elt),
							       kv_val(k_s, kr + 9, elt), &b1[0][lane],
							       &b1[1][lane], &b1[2][lane]);
							for (int x = 0; x < 3; x++)
								memcpy(a3[x][lane],
								       qf[warp * 32 + lane][ks][x], 16);
						}
						if (elt == 4) { /* the kernel's six products, in its order */
							emu_mma(acc[j], a3[0], b0[0], b1[0]);
							emu_mma(acc[j], a3[1], b0[0], b1[0]);
							emu_mma(acc[j], a3[0], b0[1], b1[1]);
							emu_mma(acc[j], a3[2], b0[0], b1[0]);
							emu_mma(acc[j], a3[1], b0[1], b1[1]);
							emu_mma(acc[j], a3[0], b0[2], b1[2]);
						} else {
							for (int x = 0; x < 3; x++)
								emu_mma(acc[j], a3[x], b0[0], b1[0]);
						}
					}
				for (int lane = 0; lane < 32; lane++) {
					const int g = lane >> 2, t = lane & 3;
					for (int j = 0; j < NT; j++) {
						const int key = kg * NT * 8 + 8 * j + 2 * t, h = 16 * mw + g;
						d_s[key * IF_SP + h] = acc[j][lane][0] * scale;
						d_s[(key + 1) * IF_SP + h] = acc[j][lane][1] * scale;
						d_s[key * IF_SP + h + 8] = acc[j][lane][2] * scale;
						d_s[(key + 1) * IF_SP + h + 8] = acc[j][lane][3] * scale;
					}
				}
			}
			for (int tid = 0; tid < IF_TK; tid++) {
				const int64_t p = k0 + (int64_t)n * IF_TK + tid;
				if (p < k1) {
					float sc = 0.0f;
					for (int h = 0; h < HI; h++) {
						const float d = d_s[tid * IF_SP + h];
						if (d > 0.0f)
							sc += w[h] * d;
					}
					scores[p] = sc;
				}
			}
		}
	}
	free(k_s);
	free(d_s);
}

static void indexer_case(const char *name, int f32, int HI, int DI, int nk, int exact)
{
	const int elt = f32 ? 4 : 2;
	uint8_t *kv = malloc((size_t)elt * (size_t)nk * DI);
	const uint8_t **keys = malloc(sizeof(void *) * (size_t)nk);
	float *q = malloc(sizeof(float) * (size_t)HI * DI), *w = malloc(sizeof(float) * HI);
	float *ref = malloc(sizeof(float) * (size_t)nk), *got = malloc(sizeof(float) * (size_t)nk);
	for (int i = 0; i < nk * DI; i++) {
		const float v = exact ? (float)((int)(rnext() % 5) - 2) : runif();
		const uint16_t b = kf32_to_bf16(v);
		if (f32)
			memcpy(kv + 4 * (size_t)i, &v, 4);
		else
			memcpy(kv + 2 * (size_t)i, &b, 2);
	}
	for (int i = 0; i < nk; i++)
		keys[i] = kv + (size_t)i * DI * elt;
	for (int i = 0; i < HI * DI; i++)
		q[i] = exact ? (float)((int)(rnext() % 5) - 2) : runif();
	for (int i = 0; i < HI; i++)
		w[i] = exact ? (float)((int)(rnext() % 9) - 3) / 8.0f : runif() / sqrtf((float)HI);
	const float scale = 1.0f / sqrtf((float)DI);
	kcpu_indexer_scores(q, w, HI, DI, (const void *const *)keys, nk, !f32, scale, ref);
	emu_indexer_row(q, w, HI, DI, elt, keys, nk, scale, got);
	double mx = 0, maxerr = 0;
	int bitdiff = 0;
	for (int i = 0; i < nk; i++)
		mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
	for (int i = 0; i < nk; i++) {
		bitdiff += memcmp(&ref[i], &got[i], 4) != 0;
		const double e = fabs((double)got[i] - ref[i]) / (mx > 0 ? mx : 1);
		maxerr = e > maxerr ? e : maxerr;
	}
	if (exact)
		CHECK(bitdiff == 0, "indexer %s: %d of %d scores not bit-equal", name, bitdiff, nk);
	CHECK(maxerr <= 2e-6, "indexer %s: max err %.3g of max|score|", name, maxerr);
	printf("indexer emul %-36s keys %6d bit-diff %d max err %.2g\n", name, nk, bitdiff, maxerr);
	free(kv);
	free(keys);
	free(q);
	free(w);
	free(ref);
	free(got);
}

/* ---- radix top-k: tr_hist_kernel x 3, tr_out_kernel x 2 ----------------------------------------- */
#define TR_THREADS 256
#define TR_PER 8
#define TR_SLICE (TR_THREADS * TR_PER)
#define TR_H0 2048
#define TR_H1 2048
#define TR_H2 1024
#define TR_HIST (TR_H0 + TR_H1 + TR_H2)

static uint32_t tr_key(float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	if (v == 0.0f)
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
/* tr_find: thread tid covers bins NB-1-PER*tid-q; exclusive scan of the per-thread totals */
static void tr_find(int NB, const unsigned *hist, unsigned need, unsigned *bin_out, unsigned *need_out)
{
	const int PER = NB / TR_THREADS;
	unsigned bin = 0, nd = need, excl = 0;
	for (int tid = 0; tid < TR_THREADS; tid++) {
		unsigned c[8], tot = 0;
		for (int q = 0; q < PER; q++) {
			c[q] = hist[NB - 1 - PER * tid - q];
			tot += c[q];
		}
		if (excl < need && excl + tot >= need) {
			unsigned cum = excl;
			for (int q = 0; q < PER; q++) {
				if (cum + c[q] >= need) {
					bin = (unsigned)(NB - 1 - PER * tid - q);
					nd = need - cum;
					break;
				}
				cum += c[q];
			}
		}
		excl += tot;
	}
	*bin_out = bin;
	*need_out = nd;
}
static void tr_select(const unsigned *hs, int pass, int kk, uint32_t *prefix, unsigned *need)
{
	unsigned b, nd = (unsigned)kk;
	uint32_t p = 0;
	if (pass >= 1) {
		tr_find(TR_H0, hs, nd, &b, &nd);
		p = b;
	}
	if (pass >= 2) {
		tr_find(TR_H1, hs + TR_H0, nd, &b, &nd);
		p = (p << 11) | b;
	}
	if (pass >= 3) {
		tr_find(TR_H2, hs + TR_H0 + TR_H1, nd, &b, &nd);
		p = (p << 10) | b;
	}
	*prefix = p;
	*need = nd;
}
/* one row (the kernels' blocks in order; blocks are independent within a launch) */
static int emu_topk_row(const float *s, int n, int ld, int k, int32_t *o)
{
	const int nb = (ld + TR_SLICE - 1) / TR_SLICE;
	unsigned *hs = calloc((size_t)(TR_HIST + 2 * nb), sizeof(unsigned)), *cnt = hs + TR_HIST;
	const int kk = k < n ? k : n;
	for (int pass = 0; pass < 3; pass++)
		for (int bx = 0; bx < nb; bx++) {
			const int i0 = bx * TR_SLICE;
			if (kk <= 0 || kk >= n || i0 >= n)
				continue;
			uint32_t prefix;
			unsigned need;
			tr_select(hs, pass, kk, &prefix, &need);
			const int nbins = pass == 2 ? TR_H2 : TR_H0;
			const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
			const int hshift = pass == 0 ? 32 : (pass == 1 ? 21 : 10);
			unsigned *gh = hs + (pass == 0 ? 0 : (pass == 1 ? TR_H0 : TR_H0 + TR_H1));
			const int i1 = n < i0 + TR_SLICE ? n : i0 + TR_SLICE;
			for (int i = i0; i < i1; i++) {
				const uint32_t key = tr_key(s[i]);
				if (pass == 0 || (key >> hshift) == prefix)
					gh[(key >> shift) & (uint32_t)(nbins - 1)]++;
			}
		}
	for (int write = 0; write < 2; write++)
		for (int bx = 0; bx < nb; bx++) {
			const int i0 = bx * TR_SLICE, i1 = n < i0 + TR_SLICE ? n : i0 + TR_SLICE;
			if (kk <= 0)
				continue;
			if (kk >= n) {
				if (write)
					for (int i = i0; i < i1; i++)
						o[i] = i;
				continue;
			}
			uint32_t T;
			unsigned need;
			tr_select(hs, 3, kk, &T, &need);
			unsigned gtt[TR_THREADS], eqt[TR_THREADS], gsum = 0, esum = 0;
			for (int tid = 0; tid < TR_THREADS; tid++) {
				const int j0 = i0 + tid * TR_PER;
				gtt[tid] = eqt[tid] = 0;
				for (int u = 0; u < TR_PER; u++) {
					gtt[tid] += j0 + u < i1 && tr_key(s[j0 + u]) > T;
					eqt[tid] += j0 + u < i1 && tr_key(s[j0 + u]) == T;
				}
				gsum += gtt[tid];
				esum += eqt[tid];
			}
			if (!write) {
				cnt[2 * bx] = gsum;
				cnt[2 * bx + 1] = esum;
				continue;
			}
			unsigned gt_before = 0, eq_before = 0;
			for (int b = 0; b < bx; b++) {
				gt_before += cnt[2 * b];
				eq_before += cnt[2 * b + 1];
			}
			unsigned eq_excl = 0, take_excl = 0;
			unsigned takes[TR_THREADS][TR_PER], take_t[TR_THREADS];
			for (int tid = 0; tid < TR_THREADS; tid++) {
				const int j0 = i0 + tid * TR_PER;
				unsigned eq_rank = eq_before + eq_excl;
				take_t[tid] = 0;
				for (int u = 0; u < TR_PER; u++) {
					const int in = j0 + u < i1;
					const uint32_t key = in ? tr_key(s[j0 + u]) : 0;
					const int isgt = in && key > T, iseq = in && key == T;
					takes[tid][u] = isgt || (iseq && eq_rank < need);
					eq_rank += (unsigned)iseq;
					take_t[tid] += takes[tid][u];
				}
				eq_excl += eqt[tid];
			}
			for (int tid = 0; tid < TR_THREADS; tid++) {
				unsigned pos = take_excl + gt_before + (eq_before < need ? eq_before : need);
				const int j0 = i0 + tid * TR_PER;
				for (int u = 0; u < TR_PER; u++)
					if (takes[tid][u]) {
						if (pos < (unsigned)kk)
							o[pos] = j0 + u;
						pos++;
					}
				take_excl += take_t[tid];
			}
		}
	free(hs);
	return kk > 0 ? kk : 0;
}

static void topk_cases(void)
{
	/* n 41 / 50 with k 33 and 3 levels put the k-th place among the zeros, where +0 and -0 must tie
	 * (the H200 run of 14:32 found the kernels ranking +0 above -0) */
	static const int ns[] = {1, 2, 31, 41, 50, 2047, 2048, 2049, 5000, 32768, 100000};
	static const int ks[] = {1, 7, 33, 2048, 3000};
	const int ld = 100000;
	float *s = malloc(sizeof(float) * ld);
	int32_t *ref = malloc(sizeof(int32_t) * 3000), *got = malloc(sizeof(int32_t) * 3000);
	int rows = 0;
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
		for (int lv = 0; lv < 3; lv++) {
			const int levels = lv == 0 ? 3 : (lv == 1 ? 50 : 0);
			for (int j = 0; j < ld; j++) {
				float v = runif();
				if (levels)
					v = (float)(int)((v + 1.0f) * 0.5f * levels);
				const unsigned z = (unsigned)(rnext() % 64);
				v = z == 0 ? NAN
				           : (z == 1 ? -INFINITY : (z == 2 ? 0.0f : (z == 3 ? -0.0f : v)));
				s[j] = v;
			}
			for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
				const int m = kcpu_topk(s, ns[ni], ks[ki], ref);
				memset(got, 0xff, sizeof(int32_t) * 3000);
				const int gm = emu_topk_row(s, ns[ni], ld, ks[ki], got);
				CHECK(gm == m && memcmp(ref, got, sizeof(int32_t) * (size_t)m) == 0,
				      "radix top-k n %d k %d levels %d: differs from kcpu_topk", ns[ni],
				      ks[ki], levels);
				rows++;
			}
		}
	printf("radix top-k emul: %d rows against kcpu_topk\n", rows);
	free(s);
	free(ref);
	free(got);
}

int main(void)
{
	static const int l_small[] = {1, 31, 33, 64, 65};
	static const int l_mid[] = {2049, 7, 100, 1};
	static const int l_one[] = {2049};
	static const int l_zero[] = {0, 40};
	/* n_sm 132 (H200): many splits of one tile; n_sm 2: few splits of many tiles (double buffer) */
	mla_case("H8 ctx 1/31/33/64/65", 0, 8, 512, 64, 5, l_small, 0, 0, 132, 64u << 20, 1.0f);
	mla_case("H16 ctx 2049/7/100/1 few splits", 0, 16, 512, 64, 4, l_mid, 0, 0, 2, 64u << 20, 3.0f);
	mla_case("H8 ctx 2049, 13 splits of 5 tiles", 0, 8, 512, 64, 1, l_one, 0, 0, 8, 64u << 20, 3.0f);
	mla_case("H8 ctx 2049 one split (prefill-like)", 0, 8, 512, 64, 1, l_one, 0, 0, 1, 1, 3.0f);
	mla_case("H20 C96 R32 sparse K100 mix", 0, 20, 96, 32, 4, l_mid, 100, 0, 132, 64u << 20, 2.0f);
	mla_case("H3 C64 R16 ctx 0/40", 0, 3, 64, 16, 2, l_zero, 0, 0, 132, 64u << 20, 2.0f);
	mla_case("H8 ctx mix, bad block id", 0, 8, 512, 64, 4, l_mid, 0, 1, 132, 64u << 20, 1.0f);
	mla_case("f32 H8 ctx 1/31/33/64/65", 1, 8, 512, 64, 5, l_small, 0, 0, 132, 64u << 20, 3.0f);
	mla_case("f32 H16 ctx 2049, 13 splits", 1, 16, 512, 64, 1, l_one, 0, 0, 8, 64u << 20, 3.0f);
	mla_case("f32 H20 C96 R32 sparse K100 mix, bad block", 1, 20, 96, 32, 4, l_mid, 100, 1, 132,
	         64u << 20, 2.0f);
	mla_case("H16 sparse K2048 of 2049, bad block", 0, 16, 512, 64, 1, l_one, 2048, 1, 132, 64u << 20,
	         1.0f);
	indexer_case("exact HI32 DI128", 0, 32, 128, 2049, 1);
	indexer_case("random HI32 DI128", 0, 32, 128, 1000, 0);
	indexer_case("exact HI64 DI128", 0, 64, 128, 300, 1);
	indexer_case("random HI40 DI48", 0, 40, 48, 333, 0);
	indexer_case("exact HI16 DI64", 0, 16, 64, 65, 1);
	indexer_case("random HI5 DI16", 0, 5, 16, 31, 0);
	indexer_case("f32 exact HI32 DI128", 1, 32, 128, 700, 1);
	indexer_case("f32 random HI32 DI128", 1, 32, 128, 700, 0);
	indexer_case("f32 random HI64 DI128", 1, 64, 128, 130, 0);
	indexer_case("f32 exact HI5 DI48", 1, 5, 48, 65, 1);
	topk_cases();
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
