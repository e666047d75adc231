/* MLA attention (absorbed form) over the paged KV cache on tensor cores: the fast path behind
 * kcuda_mla_attn (the first kernel, mla_attn.cu, stays selectable: TANDEM_CUDA_ATTN=ref, and takes
 * the shapes this one does not: dim > 576 or not a multiple of 16, C not a multiple of 32, misaligned
 * pools).
 *
 * Why tensor cores: a key row (576 bf16 = 1152 B) meets H heads for ~2 x 576 + 2 x 512 FLOP each;
 * at 16 heads that is 30 FLOP per byte, 120 TFLOP/s at 4 TB/s: more than the fp32 CUDA cores give.
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80 and later, so sm_90/100/120) does it at a
 * small fraction of its rate. To keep the CPU's fp32 accuracy, the fp32 operands (q, and the
 * softmax weights p) are split into bf16 hi + lo parts and multiplied twice (the keys are bf16
 * already, so both products are exact up to the fp32 accumulation): ~2^-16 relative operand error
 * instead of bf16's 2^-8.
 *
 * Grid (query row, key split, group of 16 heads); 4 warps. The block walks its key range in tiles
 * of 32 rows: the 32 row addresses are looked up first (block table, top-k list) by one warp, then
 * the rows are copied into shared memory with 16-byte cp.async (one tile a block: the overlap of
 * copy and products comes from the other blocks on the SM; the next tile's addresses are looked up
 * while the current one is used). K (QK^T) and V (PV) fragments of bf16 tiles come by ldmatrix.
 * QK^T: warp w multiplies its quarter of the 36 dim steps (q fragments held in registers for the
 * whole kernel) for all 32 keys; the 4 partial score tiles are summed in shared memory, where 8
 * threads per head do the online softmax (running max / sum in registers) and write p (bf16 hi/lo)
 * and the rescale factor. PV: warp w owns channels
 * [w C/4, (w + 1) C/4) of all 16 heads (C/32 n-tiles of 8), fp32 accumulators in registers.
 * Split-K (flash-decoding) as the first kernel: each split writes (max, sum, unnormalised acc) to
 * the workspace and a combine kernel merges them (log-sum-exp), weights computed once per block.
 * With one split (prefill, many rows) the kernel normalises and writes out directly. Invalid keys
 * (bad position or block id) get score -inf and a zeroed row (no NaN from stale shared memory) and
 * are counted in the context's error counter, as in the first kernel. */
#include <errno.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#include "kernels/cuda/fused.h"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/mla_attn_tile.cuh"

#define MM_WARPS 4
#define MM_THREADS (32 * MM_WARPS)
#define MM_HG 16 /* heads per block (one m16 tile) */
#define MM_TK 32 /* keys per tile */
#define MM_DMAX 576
#define MM_KSW (MM_DMAX / 16 / MM_WARPS) /* k-steps of QK^T per warp: 9 */
#define MM_NTW (512 / 8 / MM_WARPS) /* PV n-tiles per warp at C = 512: 16 */
#define MM_PS 40 /* p row stride (bf16): 20 words, conflict-free fragment loads */
#define MM_MAX_SPLIT 1024

struct mm_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt;
	int dim, elt; /* elt: bytes per cached value, 2 (bf16) or 4 (fp32) */
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	const float *q;
	int H, C;
	float scale;
	int chunk, nsplit;
	int even; /* a split's keys from its row's own count (see mla_mma_kernel), not from chunk */
	float *out;
	float *pacc, *pm, *pl; /* partials: [row][h][split][C], [row][h][split] */
	unsigned *err;
	/* qr set (kfuse_mla_attn_rope): q's dims [C, dim) are not read from q but roped from
	 * qr[row * ldqr + h * qrhs + 0 .. R) at position pos[row] (rope_copy's arithmetic) */
	const float *qr;
	int64_t ldqr, qrhs;
	const float *inv_freq;
	const int32_t *pos;
	int pairing;
	int cp3; /* TANDEM_MLA_CP3: a bf16 row of 576 copied by one asm of three cp.async a lane */
};

/* element e of a rotary part of width 2 * half (src unroped) after RoPE at position pos: fused.cu's
 * fu_rot on the pair holding e (angle pos * inv_freq[pair], precise sincosf, mscale 1) */
__device__ __forceinline__ float mm_rope_elem(const float *src, int e, int half, int pairing, int32_t pos,
                                              const float *inv_freq)
{
	const bool first = pairing ? e < half : (e & 1) == 0;
	const int i = pairing ? (first ? e : e - half) : e >> 1;
	const int other = pairing ? (first ? e + half : e - half) : (first ? e + 1 : e - 1);
	const float ang = (float)pos * inv_freq[i];
	float sn, co;
	sincosf(ang, &sn, &co);
	const float u0 = first ? src[e] : src[other], u1 = first ? src[other] : src[e];
	return first ? u0 * co - u1 * sn : u0 * sn + u1 * co;
}

__device__ __forceinline__ const uint8_t *mm_key_row(const mm_args &a, int64_t row, int j)
{
	const int64_t p = a.sel ? (int64_t)a.sel[row * a.ld_sel + j] : (int64_t)j;
	const int64_t lim = a.ld_blocks * a.bt;
	if (p < 0 || p >= lim)
		return NULL;
	/* block and slot: 32-bit division wherever the table's span allows (every real context) */
	int64_t bi, bo;
	if (lim <= 0x7fffffff) {
		const uint32_t u = (uint32_t)p, b = (uint32_t)a.bt, q = u / b;
		bi = q, bo = u - q * b;
	} else {
		bi = p / a.bt, bo = p % a.bt;
	}
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	const int64_t blk = a.blocks[(int64_t)tbl * a.ld_blocks + bi];
	if (blk < 0 || blk >= a.n_blocks)
		return NULL;
	return a.base + (size_t)blk * a.block_bytes + a.offset + (size_t)bo * (size_t)a.dim * (size_t)a.elt;
}

/* shared row stride in values: a 16-byte multiple whose word stride is 4 mod 32 for bf16 (dim + 8)
 * and 4 mod 32 floats for fp32 (dim + 4): conflict-free fragment loads (dim a multiple of 16) */
static __host__ __device__ int mm_rs(int dim, bool f32)
{
	return f32 ? dim + 4 : dim + 8;
}
static size_t mm_smem(int dim, bool f32)
{
	return MM_TK * (size_t)mm_rs(dim, f32) * (f32 ? 4 : 2) /* kv tile */ +
	       MM_WARPS * MM_HG * MM_TK * 4 /* partial scores */ + 2 * MM_HG * MM_PS * 2 /* p hi, lo */ +
	       MM_HG * 4 /* corr */ + 2 * MM_HG * 4 /* m, l */ +
	       2 * MM_TK * sizeof(void *) /* row addresses */;
}

/* STK (at most 8 heads: GLM-5 at TP=8): the 16 rows of every A operand are the 8 heads' hi
 * parts (rows 0-7) stacked on their lo parts (rows 8-15) instead of 16 heads' hi and, in a second mma,
 * their lo parts, of which rows 8-15 would be padding: one mma per step instead of two. A lane holds
 * rows g and g + 8 of every C fragment, so head g's sum is c0 + c2, c1 + c3 in the lane's own
 * registers (scores after QK^T, the output at the end; the online softmax rescales both rows alike).
 * The softmax runs 16 threads a head (katt_tile_softmax with TPH 16) and writes p's hi part to P rows
 * 0-7, its lo part to rows 8-15. TANDEM_MLA_STACK=0: the unstacked kernel (mm_stack_enabled). */
/* F32: the pool holds fp32 values; they are split into bf16 hi + lo as the fragments are read and
 * multiplied as hi*hi + lo*hi + hi*lo (the lo*lo term is below 2^-16 of the result). With STK too, a
 * step is two mma: the stacked A (hi rows on lo rows) times the hi part of B, then times its lo part
 * (all four terms, lo*lo included), instead of three.
 * One key tile in shared memory (~48 KB bf16, ~86 KB fp32), not two: more blocks share an SM (3
 * with bf16, 2 with fp32; with two tiles 2 and 1) and one block's copy overlaps another's products.
 * H200 (session 14): GLM-5 8k prefill bf16 2.07 -> 1.92 s, fp32 3.77 -> 2.98 s. The next tile's row
 * addresses are still looked up while the current one is used (two address stages). */
/* Blocks an SM the registers must allow. Hopper and sm_100 (228 KB of shared memory: 2 blocks with fp32
 * tiles, 4 with bf16): the stacked bf16 kernel fits 128 registers without spills, so 4 (H200 session
 * 14, GLM-5 8k prefill 1.91 -> 1.81 s); the others what their registers give unbounded (216 fp32, 168
 * bf16 unstacked; asking for 4 there spills). sm_120 (99 KB: 1 block with fp32 tiles, 2 with bf16):
 * what its shared memory allows, so no register limit below that (128 spilled there). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define MM_MINB(F32, ROPE, STK) ((F32) ? 1 : 2)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 /* the unstacked kernel at 3 spills on sm_100 */
#define MM_MINB(F32, ROPE, STK) ((F32) ? 2 : ((STK) && !(ROPE)) ? 4 : 2)
#else
#define MM_MINB(F32, ROPE, STK) ((F32) ? 2 : ((STK) && !(ROPE)) ? 4 : 3)
#endif
template <bool F32, bool ROPE, bool STK>
__global__ void __launch_bounds__(MM_THREADS, MM_MINB(F32, ROPE, STK)) mla_mma_kernel(mm_args a)
{
	KDEP_ENTRY();
	typedef typename std::conditional<F32, float, uint16_t>::type val_t;
	extern __shared__ __align__(16) uint8_t mm_sm[];
	const int dim = a.dim, RS = mm_rs(dim, F32), C = a.C;
	val_t *kv_s = (val_t *)mm_sm; /* [TK][RS] */
	float *sred = (float *)(kv_s + MM_TK * RS); /* [WARPS][HG][TK] */
	uint16_t *phi = (uint16_t *)(sred + MM_WARPS * MM_HG * MM_TK); /* [HG][PS] */
	uint16_t *plo = phi + MM_HG * MM_PS;
	float *corr_s = (float *)(plo + MM_HG * MM_PS); /* [HG] */
	float *ml_s = corr_s + MM_HG; /* [HG][2] */
	const uint8_t **addr_s = (const uint8_t **)(ml_s + 2 * MM_HG); /* [2][TK] */

	const int64_t row = blockIdx.x;
	const int split = blockIdx.y, h0 = blockIdx.z * MM_HG;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3; /* mma fragment coordinates */

	int64_t nk64 = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	if (nk64 < 0 || nk64 > a.max_keys) {
		if (tid == 0 && split == 0 && blockIdx.z == 0)
			atomicAdd(a.err, 1u);
		nk64 = nk64 < 0 ? 0 : a.max_keys;
	}
	const int nk = (int)nk64;
	/* this split's keys: the row's OWN tiles spread evenly over the splits (a.even), so a row with
	 * fewer keys than the plan's max_keys (a context bucket: decode graphs are captured per power of
	 * two, so a 4k row meets an 8192 plan; a batch of mixed lengths) keeps every split busy; or
	 * fixed chunks of the plan (the last splits of a short row then have nothing to do) */
	const int chunk = a.even ? ((nk + MM_TK - 1) / MM_TK + a.nsplit - 1) / a.nsplit * MM_TK : a.chunk;
	const int k0 = split * chunk, k1 = min(nk, k0 + chunk);
	const int ntiles = k1 > k0 ? (k1 - k0 + MM_TK - 1) / MM_TK : 0;

	/* q fragments (A of QK^T: rows = heads, k = dims) for this warp's dim steps ks = warp + 4 i.
	 * Loaded first: the 16:40 H200 run had this kernel ~30% slower with them loaded after the
	 * first tile's copy and the rope code inlined in the default kernel (not isolated which) */
	const int nks = dim / 16;
	uint32_t qh[MM_KSW][4], ql[MM_KSW][4];
#pragma unroll
	for (int i = 0; i < MM_KSW; i++) {
		const int ks = warp + MM_WARPS * i;
#pragma unroll
		for (int r = 0; r < 4; r++) {
			if (STK && (r & 1)) /* the lo part of register r - 1's pair (below) */
				continue;
			const int h = h0 + g + ((!STK && (r & 1)) ? 8 : 0);
			const int col = ks * 16 + 2 * t + ((r & 2) ? 8 : 0);
			float2 v = make_float2(0.0f, 0.0f);
			if (ks < nks && h < a.H) {
				if (ROPE && col >= C) { /* the rotary part, roped here (col even) */
					const float *src = a.qr + row * a.ldqr + h * a.qrhs;
					const int half = (dim - C) / 2;
					const int32_t ps = a.pos[row];
					v.x = mm_rope_elem(src, col - C, half, a.pairing, ps, a.inv_freq);
					v.y = mm_rope_elem(src, col - C + 1, half, a.pairing, ps, a.inv_freq);
				} else {
					v = *(const float2 *)(a.q + (row * a.H + h) * (int64_t)dim + col);
				}
			}
			if (STK)
				katt_split2(v.x, v.y, &qh[i][r], &qh[i][r + 1]);
			else
				katt_split2(v.x, v.y, &qh[i][r], &ql[i][r]);
		}
	}

	/* the addresses of tile n's rows (one warp), then their copy (all threads, one commit group) */
	auto fill_addr = [&](int n, int st) {
		if (warp == 0) {
			const int j = k0 + n * MM_TK + lane;
			const uint8_t *p = NULL;
			if (j < k1) {
				p = mm_key_row(a, row, j);
				if (!p)
					atomicAdd(a.err, 1u);
			}
			addr_s[st * MM_TK + lane] = p;
		}
	};
	const int nchunk = dim * (int)sizeof(val_t) / 16; /* 16-byte pieces per row */
	/* The rows of address stage st into the key tile: warp w copies rows w, w + 4, ..., lane l a
	 * row's pieces l, l + 32, ... A row's address is one shared-memory broadcast, the same in every
	 * lane, so its null test is one uniform branch a row. The first form (a loop over the pieces with the
	 * null test inside) compiled to ~93 instructions a row, 46% of the kernel's instructions (ncu, H200,
	 * 2026-12-04: 50.4 M at GLM-5's batch 128); this one measured ~46 a row (the kernel at its
	 * 128-register bound recomputes the addresses a row), 31% of 36.4 M. A bulk copy a row (cp.async.bulk
	 * on an mbarrier) cut the instructions to 27.2 M but spilled inside the QK loop and ran slower
	 * (docs/PERFORMANCE.md, session 30). */
	constexpr int CPL = (MM_DMAX * (int)sizeof(val_t) / 16 + 31) / 32; /* pieces a lane, at most */
	auto issue = [&](int st) {
		const unsigned kv_sa = (unsigned)__cvta_generic_to_shared(kv_s) + 16u * (unsigned)lane;
#pragma unroll 1
		for (int r = warp; r < MM_TK; r += MM_WARPS) {
			const uint8_t *p = addr_s[st * MM_TK + r];
			const unsigned d = kv_sa + (unsigned)(r * RS * (int)sizeof(val_t));
			if (p && a.cp3 &&
			    nchunk == 72) { /* bf16, dim 576: pieces l, l + 32, l + 64 (l < 8) */
				katt_cp16s_x3(d, p + 16 * lane, lane < 8);
			} else if (p) {
				p += 16 * lane;
#pragma unroll
				for (int i = 0; i < CPL; i++)
					if (lane + 32 * i < nchunk)
						katt_cp16s(d + 512u * i, p + 512 * i);
			} else {
				uint8_t *z = (uint8_t *)(kv_s + r * RS) + 16 * lane;
#pragma unroll
				for (int i = 0; i < CPL; i++)
					if (lane + 32 * i < nchunk)
						*(uint4 *)(z + 512 * i) = make_uint4(0, 0, 0, 0);
			}
		}
		katt_cp_commit();
	};

	const int cw = C / MM_WARPS, ntw = cw / 8; /* PV channels and n-tiles of this warp */
	float oacc[MM_NTW][4];
#pragma unroll
	for (int j = 0; j < MM_NTW; j++)
		oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.0f;
	/* softmax role: 8 threads per head, 4 keys each (STK: 16 threads, 2 keys); running max / sum
	 * kept by all of them */
	const int sh = STK ? tid >> 4 : tid >> 3, sk = STK ? (tid & 15) * 2 : (tid & 7) * 4;
	float m_run = -INFINITY, l_run = 0.0f;

	if (ntiles > 0) {
		fill_addr(0, 0);
		__syncthreads();
		issue(0);
	}
	for (int n = 0; n < ntiles; n++) {
		const int st = n & 1; /* address stage */
		if (n + 1 < ntiles)
			fill_addr(n + 1, st ^ 1);
		katt_cp_wait<0>();
		__syncthreads();
		const val_t *kt = kv_s;

		/* S = Q K^T, this warp's dim steps, 4 n-tiles of 8 keys */
		float sacc[4][4];
#pragma unroll
		for (int j = 0; j < 4; j++)
			sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
#pragma unroll
		for (int i = 0; i < MM_KSW; i++) {
			const int ks = warp + MM_WARPS * i;
			if (ks < nks) {
				if (F32) {
#pragma unroll
					for (int j = 0; j < 4; j++) {
						const val_t *kr = kt + (8 * j + g) * RS + ks * 16 + 2 * t;
						const float2 x = *(const float2 *)kr,
						             y = *(const float2 *)(kr + 8);
						uint32_t bh0, bl0, bh1, bl1;
						katt_split2(x.x, x.y, &bh0, &bl0);
						katt_split2(y.x, y.y, &bh1, &bl1);
						katt_mma(sacc[j], qh[i], bh0, bh1);
						if (!STK)
							katt_mma(sacc[j], ql[i], bh0, bh1);
						katt_mma(sacc[j], qh[i], bl0, bl1);
					}
				} else {
					/* ldmatrix, two n-tiles a load */
#pragma unroll
					for (int j = 0; j < 4; j += 2) {
						uint32_t b[4];
						katt_ldm_keys2(b, (const uint16_t *)kt, RS, 8 * j, ks * 16,
						               lane);
						katt_mma(sacc[j], qh[i], b[0], b[1]);
						if (!STK)
							katt_mma(sacc[j], ql[i], b[0], b[1]);
						katt_mma(sacc[j + 1], qh[i], b[2], b[3]);
						if (!STK)
							katt_mma(sacc[j + 1], ql[i], b[2], b[3]);
					}
				}
			}
		}
		float *sw = sred + warp * MM_HG * MM_TK;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			if (STK) { /* head g: its hi row plus its lo row */
				*(float2 *)(sw + g * MM_TK + 8 * j + 2 * t) =
				    make_float2(sacc[j][0] + sacc[j][2], sacc[j][1] + sacc[j][3]);
			} else {
				*(float2 *)(sw + g * MM_TK + 8 * j + 2 * t) =
				    make_float2(sacc[j][0], sacc[j][1]);
				*(float2 *)(sw + (g + 8) * MM_TK + 8 * j + 2 * t) =
				    make_float2(sacc[j][2], sacc[j][3]);
			}
		}
		__syncthreads();

		/* online softmax of head sh over keys sk .. sk + 3 of the tile */
		if (STK)
			katt_tile_softmax<MM_TK, MM_WARPS, MM_HG, 16>(sred, addr_s + st * MM_TK, a.scale, sh,
			                                              sk, (tid & 15) == 0, &m_run, &l_run,
			                                              phi, phi + 8 * MM_PS, MM_PS, corr_s);
		else
			katt_tile_softmax<MM_TK, MM_WARPS, MM_HG>(sred, addr_s + st * MM_TK, a.scale, sh, sk,
			                                          (tid & 7) == 0, &m_run, &l_run, phi, plo,
			                                          MM_PS, corr_s);
		__syncthreads();

		/* O = O * corr + P V over this warp's channels */
		{
			/* a factor of exactly 1 (no head of the warp's rows found a new max in this tile,
			 * most tiles past the first few) changes no bit: the 64 products are skipped */
			const float c0 = corr_s[g], c8 = STK ? c0 : corr_s[g + 8];
			if (__any_sync(0xffffffffu, c0 != 1.0f || c8 != 1.0f)) {
#pragma unroll
				for (int j = 0; j < MM_NTW; j++) {
					oacc[j][0] *= c0;
					oacc[j][1] *= c0;
					oacc[j][2] *= c8;
					oacc[j][3] *= c8;
				}
			}
#pragma unroll
			for (int kk = 0; kk < MM_TK / 16; kk++) {
				uint32_t ah[4], al[4];
				const int pc = kk * 16 + 2 * t;
				if (STK) { /* P rows g (hi) and g + 8 (lo) of one 16-row matrix */
					ah[0] = *(const uint32_t *)(phi + g * MM_PS + pc);
					ah[1] = *(const uint32_t *)(phi + (g + 8) * MM_PS + pc);
					ah[2] = *(const uint32_t *)(phi + g * MM_PS + pc + 8);
					ah[3] = *(const uint32_t *)(phi + (g + 8) * MM_PS + pc + 8);
				} else {
					katt_p_frags(phi, plo, MM_PS, g, t, kk, ah, al);
				}
				/* B = V rows pc, pc + 1 (b0) and pc + 8, pc + 9 (b1), column = channel */
				if (F32) {
					const val_t *vr = kt + pc * RS + warp * cw + g;
#pragma unroll
					for (int j = 0; j < MM_NTW; j++) {
						if (j < ntw) {
							const val_t *v = vr + 8 * j;
							uint32_t bh0, bl0, bh1, bl1;
							katt_split2((float)v[0], (float)v[RS], &bh0, &bl0);
							katt_split2((float)v[8 * RS], (float)v[9 * RS], &bh1,
							            &bl1);
							katt_mma(oacc[j], ah, bh0, bh1);
							if (!STK)
								katt_mma(oacc[j], al, bh0, bh1);
							katt_mma(oacc[j], ah, bl0, bl1);
						}
					}
				} else {
					/* ldmatrix.trans, two n-tiles a load: keys kk 16 + 0-7 / 8-15 x
					 * channels c, then c + 8. With an odd count (C 96: 3 a warp) the last
					 * load's second pair is unused; it lies inside the shared row (stride
					 * dim + 8). */
					const val_t *vb =
					    kt + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RS +
					    warp * cw + (lane >> 4) * 8;
#pragma unroll
					for (int j = 0; j < MM_NTW; j += 2) {
						if (j < ntw)
							katt_pv_ldm2<!STK>(oacc[j], oacc[j + 1], ah, al,
							                   vb + 8 * j, j + 1 < ntw);
					}
				}
			}
		}
		__syncthreads(); /* the tile, the scores and p are free again */
		if (n + 1 < ntiles)
			issue(st ^ 1);
	}

	if ((tid & (STK ? 15 : 7)) == 0) {
		ml_s[2 * sh] = m_run;
		ml_s[2 * sh + 1] = l_run;
	}
	__syncthreads();
#pragma unroll
	for (int j = 0; j < MM_NTW; j++) {
		if (j >= ntw)
			break;
		const int cc = warp * cw + 8 * j + 2 * t;
#pragma unroll
		for (int half = 0; half < (STK ? 1 : 2); half++) {
			const int hl = g + 8 * half;
			if (h0 + hl >= a.H)
				continue;
			const int64_t rh = row * a.H + h0 + hl;
			const float l = ml_s[2 * hl + 1];
			const float v0 = STK ? oacc[j][0] + oacc[j][2] : oacc[j][2 * half],
			            v1 = STK ? oacc[j][1] + oacc[j][3] : oacc[j][2 * half + 1];
			if (a.nsplit == 1) {
				const float inv = l > 0.0f ? 1.0f / l : 0.0f;
				*(float2 *)(a.out + rh * C + cc) = make_float2(v0 * inv, v1 * inv);
			} else if (l > 0.0f) {
				const int64_t ps = rh * a.nsplit + split;
				*(float2 *)(a.pacc + ps * C + cc) = make_float2(v0, v1);
			}
		}
	}
	if (a.nsplit > 1 && tid < MM_HG && h0 + tid < a.H) {
		const int64_t ps = (row * a.H + h0 + tid) * a.nsplit + split;
		a.pm[ps] = ml_s[2 * tid];
		a.pl[ps] = ml_s[2 * tid + 1];
	}
}

__device__ __forceinline__ float mm_block_reduce(float v, float *red, bool is_max)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float u = __shfl_xor_sync(0xffffffffu, v, o);
		v = is_max ? fmaxf(v, u) : v + u;
	}
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	v = red[0];
	for (int w = 1; w < (int)(blockDim.x >> 5); w++)
		v = is_max ? fmaxf(v, red[w]) : v + red[w];
	__syncthreads(); /* red is reused by the next call */
	return v;
}

/* out[row][h] = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). Block (row x head, 32 channels),
 * 4 warps: the split weights are computed once per block into shared memory, then warp w sums
 * splits w, w + 4, ... of its 32 channels (coalesced rows, 4 loads in flight per thread) and the 4
 * partial sums meet in shared memory. Enough independent loads for the partials (up to ~4 MB at
 * 32k keys, in L2) to stream rather than wait on one L2 latency per split. */
__global__ void __launch_bounds__(128)
    mla_mma_combine(const float *pacc, const float *pm, const float *pl, int nsplit, int C, float *out)
{
	KDEP_ENTRY();
	/* the partials come from the kernel before: no load of them above the wait (kdep_after) */
	pacc = kdep_after(pacc);
	pm = kdep_after(pm);
	pl = kdep_after(pl);
	extern __shared__ float w_s[]; /* [nsplit] */
	__shared__ float red[4];
	__shared__ float part[4][32];
	const int64_t rh = blockIdx.x;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const float *m = pm + rh * nsplit, *l = pl + rh * nsplit;
	float M = -INFINITY;
	for (int s = tid; s < nsplit; s += blockDim.x)
		if (l[s] > 0.0f)
			M = fmaxf(M, m[s]);
	M = mm_block_reduce(M, red, true);
	float L = 0.0f;
	for (int s = tid; s < nsplit; s += blockDim.x)
		if (l[s] > 0.0f)
			L += l[s] * expf(m[s] - M);
	L = mm_block_reduce(L, red, false);
	const float inv = L > 0.0f ? 1.0f / L : 0.0f;
	for (int s = tid; s < nsplit; s += blockDim.x)
		w_s[s] = l[s] > 0.0f ? expf(m[s] - M) * inv : 0.0f;
	__syncthreads();
	const int cc = blockIdx.y * 32 + lane;
	const bool in = cc < C;
	/* splits without keys left their acc unwritten (stale workspace, maybe NaN): their weight is 0
	 * and the value is not used (select, not multiply) */
	const float *pa = pacc + rh * (int64_t)nsplit * C + (in ? cc : 0);
	float v = 0.0f;
	int s = warp;
	for (; s + 12 < nsplit; s += 16) {
		float x[4], w[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			x[u] = pa[(int64_t)(s + 4 * u) * C];
			w[u] = w_s[s + 4 * u];
		}
#pragma unroll
		for (int u = 0; u < 4; u++)
			v = w[u] != 0.0f ? fmaf(w[u], x[u], v) : v;
	}
	for (; s < nsplit; s += 4) {
		const float x = pa[(int64_t)s * C], w = w_s[s];
		v = w != 0.0f ? fmaf(w, x, v) : v;
	}
	part[warp][lane] = v;
	__syncthreads();
	if (warp == 0 && in)
		out[rh * C + cc] = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
}

/* Does the tensor-core kernel take this call? Every check of the first kernel's argument
 * validation in positive form (a bad call goes to it and is reported there) plus this kernel's own
 * shape and alignment needs. */
static bool mm_fits(const struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                    const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C, int64_t R,
                    const float *out)
{
	if (!c || !kv || !rows || !q || !out || !kv->base || !rows->blocks || H < 1 || C < 1 || R < 0 ||
	    C > 512 || kv->dim != C + R || kv->block_tokens < 1 || kv->n_blocks < 0 || rows->n_q < 1 ||
	    rows->ld_blocks < 1 || rows->max_keys < 0 || (rows->sel && rows->ld_sel < 1))
		return false;
	if (rows->n_q > INT32_MAX || rows->max_keys > INT32_MAX / 2 || (H + MM_HG - 1) / MM_HG > 65535)
		return false;
	if (kv->dim % 16 || kv->dim > MM_DMAX || C % (8 * MM_WARPS))
		return false;
	if (((uintptr_t)kv->base | kv->block_bytes | kv->offset) % 16 || (uintptr_t)q % 8 ||
	    (uintptr_t)out % 8)
		return false;
	return mm_smem((int)kv->dim, !kv->bf16) <= (size_t)kcuda_smem_optin(c->device);
}

typedef void (*mm_kern_t)(mm_args);
template <bool F32, bool ROPE, bool STK> static mm_kern_t mm_kern3(void)
{
	return mla_mma_kernel<F32, ROPE, STK>;
}
/* the split kernel instance for a pool dtype (f32), with q's rope on its loads or without (rope
 * false: the default, no rope code in it) and stacked hi / lo rows or not */
static mm_kern_t mm_kern(bool f32, bool rope, bool stk)
{
	if (f32)
		return rope ? (stk ? mm_kern3<true, true, true>() : mm_kern3<true, true, false>())
		            : (stk ? mm_kern3<true, false, true>() : mm_kern3<true, false, false>());
	return rope ? (stk ? mm_kern3<false, true, true>() : mm_kern3<false, true, false>())
	            : (stk ? mm_kern3<false, false, true>() : mm_kern3<false, false, false>());
}

/* resident blocks an SM of instance kern at smem bytes (at least 1; 2 where the query fails), asked once
 * per device, instance and size: the split count reads it on every call (eager prefill: every layer) */
static int mm_occupancy(const struct kcuda_ctx *c, mm_kern_t kern, bool f32, bool rope, bool stk, size_t smem)
{
	static struct {
		size_t smem;
		int n;
	} cache[64][8];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
	auto &e = cache[dev][(f32 ? 4 : 0) | (rope ? 2 : 0) | (stk ? 1 : 0)];
	if (e.n == 0 || e.smem != smem) {
		int n = 0;
		if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, MM_THREADS, smem) !=
		    cudaSuccess) {
			(void)cudaGetLastError();
			n = 2;
		}
		e.smem = smem;
		e.n = n < 1 ? 1 : n;
	}
	return e.n;
}

/* TANDEM_MLA_SPLIT_BPS=N (1..8): size the split count for N resident blocks an SM, as before
 * session 15 with N = 2; unset or 0: the kernel instance's own occupancy (read once a call) */
static int mm_split_bps_env(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("TANDEM_MLA_SPLIT_BPS");
		const int x = e && *e ? atoi(e) : 0;
		v = x < 0 ? 0 : (x > 8 ? 8 : x);
	}
	return v;
}

/* TANDEM_MLA_WAVE=0: the split count that covers the resident slots (ceil, before session 28)
 * instead of the one that fits them (floor); read once */
static bool mm_wave_floor(void)
{
	static const bool on = kcuda_env_long("TANDEM_MLA_WAVE", 0, LONG_MAX, 1) != 0;
	return on;
}

/* TANDEM_MLA_EVEN=0: each split takes a fixed chunk of the plan's max_keys (before session 28) instead
 * of an even share of its row's own keys (read once) */
static bool mm_even_enabled(void)
{
	static const bool on = kcuda_env_long("TANDEM_MLA_EVEN", 0, LONG_MAX, 1) != 0;
	return on;
}

/* TANDEM_MLA_CP3=1: the key tile's bf16 576-wide rows copied with one asm of three cp.async at immediate
 * offsets a lane (no address arithmetic a piece) instead of the piece loop; not yet measured, so off
 * (read once) */
static bool mm_cp3_enabled(void)
{
	static const bool on = kcuda_env_long("TANDEM_MLA_CP3", 0, 1, 0) != 0;
	return on;
}

/* TANDEM_MLA_STACK=0: the unstacked kernel at <= 8 heads too (read on every call) */
static bool mm_stack_enabled(void)
{
	const char *e = getenv("TANDEM_MLA_STACK");
	return !(e && strcmp(e, "0") == 0);
}

/* the tensor-core kernel (+ combine) for a call mm_fits() accepted; rq: q's rotary part roped in the
 * kernel (NULL: q holds it) */
static int mm_run(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                  const float *q, int64_t H, int64_t C, float scale, float *out, const float *qr,
                  int64_t ldqr, int64_t qrhs, const struct kfuse_rope *rq)
{
	mm_args a;
	a.qr = qr;
	a.ldqr = ldqr;
	a.qrhs = qrhs;
	a.inv_freq = rq ? rq->inv_freq : NULL;
	a.pos = rq ? rq->pos : NULL;
	a.pairing = rq ? rq->pairing : 0;
	a.base = (const uint8_t *)kv->base;
	a.n_blocks = kv->n_blocks;
	a.block_bytes = kv->block_bytes;
	a.offset = kv->offset;
	a.bt = kv->block_tokens;
	a.dim = (int)kv->dim;
	a.elt = kv->bf16 ? 2 : 4;
	a.qseq = rows->qseq;
	a.blocks = rows->blocks;
	a.n_keys = rows->n_keys;
	a.sel = rows->sel;
	a.ld_blocks = rows->ld_blocks;
	a.pos0 = rows->pos0;
	a.ld_sel = rows->ld_sel;
	a.max_keys = rows->max_keys;
	a.q = q;
	a.H = (int)H;
	a.C = (int)C;
	a.scale = scale;
	a.out = out;
	a.err = c->err_dev;
	a.cp3 = mm_cp3_enabled();

	const size_t smem = mm_smem(a.dim, !kv->bf16);
	const bool stk = H <= 8 && mm_stack_enabled();
	const mm_kern_t kern = mm_kern(!kv->bf16, qr != NULL, stk);
	KCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	/* splits: about one wave of resident blocks (the instance's occupancy: on the H200 fp32 2, bf16
	 * 3, stacked bf16 4 an SM; TANDEM_MLA_SPLIT_BPS overrides), each split a whole number of 32-key
	 * tiles; partials must fit the workspace; at most MM_MAX_SPLIT (the combine's weights) */
	int bps = mm_split_bps_env();
	if (bps == 0)
		bps = mm_occupancy(c, kern, !kv->bf16, qr != NULL, stk, smem);
	const int n_hg = (int)((H + MM_HG - 1) / MM_HG);
	const int64_t max_tiles = (rows->max_keys + MM_TK - 1) / MM_TK;
	const int64_t blocks = rows->n_q * n_hg;
	/* as many splits as keep the grid within ONE wave of resident blocks (floor), not the fewest that
	 * cover it (ceil, TANDEM_MLA_WAVE=0): the ceil overshot by up to a wave's worth, so the last
	 * blocks ran as a second, mostly empty wave of full-length blocks (H200, session 28: batch 128
	 * of GLM-5's rank at 4k, 640 blocks on 528 slots, 188.8 us a call; 512 blocks 141.8; DeepSeek-V3's
	 * dense 4k 444 -> 325 us) */
	const int64_t slots = (int64_t)bps * c->n_sm;
	int64_t want = mm_wave_floor() ? slots / blocks : (slots + blocks - 1) / blocks;
	if (want < 1)
		want = 1;
	if (want > max_tiles)
		want = max_tiles;
	if (want > MM_MAX_SPLIT)
		want = MM_MAX_SPLIT;
	const size_t per_split = (size_t)rows->n_q * (size_t)H * ((size_t)C + 2) * sizeof(float);
	if (want > 1 && (size_t)want * per_split > c->ws_bytes)
		want = (int64_t)(c->ws_bytes / per_split);
	if (want < 1)
		want = 1;
	int64_t tiles_per = max_tiles > 0 ? (max_tiles + want - 1) / want : 1;
	/* one-tile splits only while they leave SMs without a block (batch 2: 128 blocks): with more
	 * blocks than SMs, each block's fixed cost (q, the partials and their combine) outweighs the
	 * parallelism (H200, GLM-5 rank 0: batch 8 went 16.03 -> 16.19 ms with one-tile splits at the
	 * occupancy's 4 blocks an SM, while batch 32 went 40.07 -> 39.04 with 4-tile ones; session 15) */
	if (tiles_per < 2 && max_tiles >= 2 && blocks * ((max_tiles + 1) / 2) >= c->n_sm)
		tiles_per = 2;
	a.chunk = (int)(tiles_per * MM_TK);
	a.even = mm_even_enabled();
	a.nsplit = max_tiles > 0 ? (int)((max_tiles + tiles_per - 1) / tiles_per) : 1;
	float *ws = (float *)c->ws;
	const size_t n_ps = (size_t)rows->n_q * (size_t)H * (size_t)a.nsplit;
	a.pacc = ws;
	a.pm = ws + n_ps * (size_t)C;
	a.pl = a.pm + n_ps;

	dim3 grid((unsigned)rows->n_q, (unsigned)a.nsplit, (unsigned)n_hg);
	const int rc = klaunch("mla_mma", kern, grid, dim3(MM_THREADS), smem, c->stream, a);
	if (rc || a.nsplit == 1)
		return rc;
	dim3 cgrid((unsigned)(rows->n_q * H), (unsigned)((C + 31) / 32));
	return klaunch("mla_mma_combine", mla_mma_combine, cgrid, dim3(128), sizeof(float) * (size_t)a.nsplit,
	               c->stream, a.pacc, a.pm, a.pl, a.nsplit, a.C, out);
}

extern "C" int kcuda_mla_attn(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                              const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C,
                              int64_t R, float scale, float *out)
{
	if (kattn_use_ref() || !mm_fits(c, kv, rows, q, H, C, R, out))
		return kcuda_mla_attn_ref(c, kv, rows, q, H, C, R, scale, out);
	int rc = kmla_dec7_launch(c, kv, rows, q, H, C, scale, out); /* TANDEM_MLA_DEC_V=7 only */
	if (rc != ERR_UNSUPPORTED)
		return rc;
	rc = kmla_dec6_launch(c, kv, rows, q, H, C, scale, out); /* TANDEM_MLA_DEC_V=6 only */
	if (rc != ERR_UNSUPPORTED)
		return rc;
	rc = kmla_dec_launch(c, kv, rows, q, H, C, scale, out); /* one launch: see md_rows_limit */
	if (rc != ERR_UNSUPPORTED)
		return rc;
	return mm_run(c, kv, rows, q, H, C, scale, out, NULL, 0, 0, NULL);
}

/* kfuse_mla_attn_rope declines unless TANDEM_MLA_ROPE=1 (the caller then ropes q and calls
 * kcuda_mla_attn): off by default since the 16:40 H200 run, where the in-kernel rope made the batch-1
 * decode step 0.58 ms slower (15.99 vs 15.41 ms), though the op is right (test_ops_mla) */
static int mm_rope_enabled(void)
{
	const char *e = getenv("TANDEM_MLA_ROPE");
	return e && strcmp(e, "1") == 0;
}

extern "C" int kfuse_mla_attn_rope(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                                   const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C,
                                   int64_t R, float scale, float *out, const float *qr, int64_t ldqr,
                                   int64_t qrhs, const struct kfuse_rope *rp)
{
	if (!qr || !rp || !rp->inv_freq || !rp->pos || (rp->pairing != 0 && rp->pairing != 1) || R < 2 ||
	    R % 2 || H < 1 || (H > 1 && qrhs < R) || (rows && rows->n_q > 1 && ldqr < (H - 1) * qrhs + R))
		return kcuda_bad_arg("mla_attn_rope", "R %lld H %lld ldqr %lld qrhs %lld%s", (long long)R,
		                     (long long)H, (long long)ldqr, (long long)qrhs,
		                     ", or a null pointer / bad rope description");
	if (!mm_rope_enabled() || kattn_use_ref() || !mm_fits(c, kv, rows, q, H, C, R, out))
		return ERR_UNSUPPORTED;
	return mm_run(c, kv, rows, q, H, C, scale, out, qr, ldqr, qrhs, rp);
}
