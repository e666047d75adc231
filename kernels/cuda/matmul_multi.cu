/* kcuda_matmul_multi: several decode products that read the same activations x in ONE launch
 * (GLM-5 per layer: q_a, kv_a, idx_k, idx_proj read the normed hidden state; q_b and idx_q_b read
 * the normed latent c_q). At batch 1 each separate launch costs a fixed ~2.5-3 us of launch,
 * ramp-up and drain on top of ~1-3 us of reading (docs/PERFORMANCE.md); one launch pays that once
 * and spreads all the products' bytes over the whole GPU.
 *
 * Grid: one block per RB consecutive rows of one product ("segment"); the segments' blocks follow
 * each other in blockIdx.x (a prefix of their block counts, seg[i].blk0, in the kernel arguments).
 * A block is MM_NW warps. Per K chunk (all of K for n_in <= 7168) it copies its RB rows' raw bytes
 * into shared memory with cp.async, ALL of them at once (16-byte copies, up to ~30 KB per block in
 * flight: the memory-level parallelism one launch needs to approach the read rate), loads its
 * lanes' x while the copies fly, then decodes from shared memory: warp w takes slabs w, w + MM_NW,
 * ... of the chunk, lane l the EPL elements EPL l .. of each slab (g3_decode, matmul_impl.cuh),
 * and reuses its x registers for the RB rows. All n_tok tokens in one pass (1, 2, 4 or 8 token
 * slots): each weight is decoded once for all of them and W read from HBM once. x is loaded slab
 * by slab (the first slab's before the wait on the copies); TANDEM_MULTI_HOIST=1 loads every
 * slab's x before the wait at 1-2 tokens (multi_hoist).
 * Rows per block RB: Q8_0 4, F16 / BF16 2, F32 1 (~26-30 KB of weights per block at n_in 6144).
 * Q8_0 at one token with n_in <= 2048 takes 8 (Q8RB; ~17 KB a block) where the 4-row grid would not
 * fit the GPU in one wave and the 8-row grid does (mm_q8_rows): GLM-5's o, 6144 rows = 1536 blocks
 * against 10 resident blocks an SM (1320 on an H200), whose last blocks started only when the first
 * ended, their weight loads after the wait. Measured (H200, session 11): o's marginal cost 6.7 ->
 * 6.2 us a layer; taking 8 rows for idx_q_b too (1024 blocks, one wave at 4) was 0.3 ms a step
 * SLOWER, so the rule is the wave, not the shape. 8 rows for every one-token product (the q_a
 * group's 52 KB blocks included) also measured slower (PERFORMANCE.md, session 10).
 * PDL: the block's first chunk is copied BEFORE KDEP_ENTRY() (weights only, cuda_common.cuh), so
 * the weight stream overlaps the kernel before; x is read and y written only after it.
 * Sums: per lane over its slabs in order, then the warp (shuffle tree), then the warps in order:
 * fixed order, so reruns are bit-identical; fp32 throughout (exact weights, fp32 x), as exact as
 * the single-product GEMVs, but not summed in their order (|difference| within fp32 summation
 * error, tests/ops/test_ops_multi.c).
 * Assumes (else that segment goes through kcuda_matmul on its own): Q8_0 / F16 / BF16 with
 * n_in % 256 == 0, F32 with n_in % 128 == 0, W 16-byte aligned; x 16-byte aligned, ldx % 4 == 0
 * (else ERR_UNSUPPORTED for the whole call). TANDEM_MULTI=0 (read on every call) turns it off;
 * TANDEM_MULTI_TOK=n takes only n_tok <= n (default 8).
 * One token whose int8 parts the norm before left (kfuse_add_rmsnorm_parts: the attention norm's
 * output for the q_a group) takes the XQ instantiation: its Q8_0 rows are multiplied with those
 * parts in dp4a (mm_q8_parts: exact integer dots, no conversion of each weight to fp32) instead of
 * against x; ~6e-8 of each 32-element block's largest |x| of error; the products of other types in
 * the launch read x as before. TANDEM_MULTI_XPARTS=0 reads x. */
#include <cooperative_groups.h>
#include <errno.h>
#include <string.h>

#include "kernels/cuda/cluster_bar.cuh"
#include "kernels/cuda/k45_i8.cuh"
#include "kernels/cuda/matmul_impl.cuh"

#define MM_NW 4 /* warps per block */
#define MM_MAX_NTP 8 /* tokens per pass */

/* rows per block per type (about the same bytes per block for every type) */
#define MM_PART 32 /* the largest RB x NTP of any instantiation (part[][] in shared memory) */
template <int T, int Q8RB = 4> struct mmx {
	enum { RB = Q8RB };
};
template <int Q8RB> struct mmx<KT_F16, Q8RB> {
	enum { RB = 2 };
};
template <int Q8RB> struct mmx<KT_BF16, Q8RB> {
	enum { RB = 2 };
};
template <int Q8RB> struct mmx<KT_F32, Q8RB> {
	enum { RB = 1 };
};
/* K chunk (elements) held in shared memory at once: 2048 for n_in <= 2048 (fewer x registers),
 * else 7168 (all of K for GLM-5's 6144 and DeepSeek-V3's 7168) */
#define MM_CHUNK(SMALL) ((SMALL) ? 2048 : 7168)

struct mm_seg_dev {
	const uint8_t *w;
	float *y;
	int64_t ldy;
	size_t row_bytes;
	int n_out;
	int type;
	int blk0; /* first block of this segment */
};
struct mm_multi_args {
	struct mm_seg_dev seg[KCUDA_MM_MULTI_MAX];
	int n_seg;
	const float *x;
	int64_t ldx;
	int n_tok;
	int n_in;
	int pf; /* copy the first weight chunk before KDEP_ENTRY (kcuda_prefetch_enabled) */
	const mi8_x *xq; /* one token: x's int8 parts (one unit per 256-element slab), or NULL */
	int mq_cs; /* mm_multi_mq_kernel: slabs a chunk of its Q8_0 tiles (mq_body) */
	int mq_pf; /* mq_body: prefetch the warp's parts into L1 (TANDEM_MULTI_MQ_PF, default on) */
	int mq_ks; /* mm_multi_mqc_kernel: blocks a cluster (mq_cs: slabs a block) */
};

/* ROWS rows' chunk of nsl slabs (SB bytes each) from slab s0 (rp(r): row r's bytes) into the tile,
 * rows stride bytes apart: 16-byte cp.async pieces spread over NTHR threads, one commit group.
 * mm_body's and mq_body's chunk copy (the row loop unrolled: mm_body's PTX as before the helper, up
 * to the order of a few parameter loads). */
template <int ROWS, int NTHR, int SB, class RP>
__device__ __forceinline__ void mm_copy_chunk(uint8_t *tile, int stride, RP rp, int s0, int nsl)
{
	const int tid = threadIdx.x, upr = nsl * (SB / 16);
#pragma unroll
	for (int r = 0; r < ROWS; r++)
		for (int u = tid; u < upr; u += NTHR)
			g3_cp16(tile + r * stride + 16 * u, rp(r) + (size_t)s0 * SB + 16 * (size_t)u);
	g3_commit();
}

/* A block's first chunk of weights copied (load(0)), before KDEP_ENTRY when pf (weights only:
 * cuda_common.cuh), with the rest of its ROWS rows past chunk_bytes prefetched into L2 when there is
 * more than one chunk; then KDEP_ENTRY. */
template <int ROWS, class RP, class LOAD>
__device__ __forceinline__ void mm_first_chunk_then_wait(int pf, int n_chunk, RP rp, size_t chunk_bytes,
                                                         size_t row_bytes, LOAD load)
{
	if (!pf)
		KDEP_ENTRY();
	load(0); /* weights: may start before KDEP_ENTRY */
	if (pf) {
		if (n_chunk > 1 && (int)threadIdx.x < ROWS) /* the rest of the rows into L2 */
			kdep_prefetch_l2(rp((int)threadIdx.x) + chunk_bytes, row_bytes - chunk_bytes);
		KDEP_ENTRY();
	}
}

/* One token's Q8_0 slab (tile: row 0's slab, rows `stride` bytes apart) against x's int8 parts (U:
 * the slab's unit, kfuse_add_rmsnorm_parts): lane l's 8 weights (block l / 4, quarter l % 4) times
 * the same 8 elements' three parts in dp4a (exact integer dots), then acc[r][0] += d s (q1 + (254
 * q2 + q3) / 254^2) p in fp32. The parts carry <= 6.1e-8 of the block's largest |x| (k45_i8.cuh);
 * 254 q2 + q3 is below 2^25 (8 x 127 x 127 x 255), so its float is within 2^-24 of it. */
template <int RB>
__device__ __forceinline__ void mm_q8_parts(float (&acc)[RB][1], const uint8_t *tile, int stride,
                                            const mi8_x *U, int lane)
{
	const int bi = lane >> 2, jq = lane & 3;
	/* plain loads: the parts are written by the kernel before (never __ldg: cuda_common.cuh) */
	const uint2 x1 = *(const uint2 *)&U->q[bi][0][2 * jq], x2 = *(const uint2 *)&U->q[bi][1][2 * jq],
	            x3 = *(const uint2 *)&U->q[bi][2][2 * jq];
	const float xs = U->s[bi], xp = U->p[bi];
#pragma unroll
	for (int r = 0; r < RB; r++) {
		uint32_t q0, q1;
		float d;
		g3_q8_raw(tile + r * stride, lane, q0, q1, d);
		const int i1 = __dp4a((int)q0, (int)x1.x, __dp4a((int)q1, (int)x1.y, 0));
		const int i2 = __dp4a((int)q0, (int)x2.x, __dp4a((int)q1, (int)x2.y, 0));
		const int i3 = __dp4a((int)q0, (int)x3.x, __dp4a((int)q1, (int)x3.y, 0));
		const float f = fmaf((float)(254 * i2 + i3), 1.f / 64516.f, (float)i1);
		acc[r][0] = fmaf(d * f * xs, xp, acc[r][0]); /* (d f s) p: stays normal, p exact */
	}
}

template <int T, int NTP, bool SMALL, bool HX, bool XQ, int Q8RB>
__device__ __forceinline__ void mm_body(const struct mm_seg_dev &sg, int blk, const struct mm_multi_args &a,
                                        uint8_t *tile, float (*part)[MM_PART])
{
	constexpr int SE = g3t<T>::SE, SB = g3t<T>::SB, EPL = g3t<T>::EPL, RB = mmx<T, Q8RB>::RB;
	static_assert(RB * NTP <= MM_PART, "part[][] holds RB x NTP values per warp");
	constexpr int CS = MM_CHUNK(SMALL) / SE; /* slabs per chunk */
	constexpr int KP = CS / MM_NW; /* slabs per warp per chunk */
	constexpr bool HOIST = HX && NTP <= 2; /* all of the chunk's x in registers before the wait */
	/* the slab loop at 4-8 token slots: rolled. Unrolled, the 8-token kernel was 191 KB of
	 * straight-line code that every warp fetched once per block: half of its issue stalls were
	 * instruction fetch (ncu, H200, session 12: the q_a group at 8 tokens 44.3 -> 30.9 us, 168 -> 128
	 * registers). At 1-2 slots it stays unrolled: rolled, the one-token kernels lost the loads the
	 * compiler hoists across slabs (q_a group 11.8 -> 12.2 us) */
	constexpr int KUNR = NTP >= 4 ? 1 : KP;
	static_assert(CS % MM_NW == 0, "chunks split evenly over the warps");
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int n_slab = a.n_in / SE;
	const int n_chunk = (n_slab + CS - 1) / CS;
	const int stride = (n_slab < CS ? n_slab : CS) * SB; /* tile bytes per row */
	const int row0 = blk * RB;
	/* row r's bytes (rows past n_out read the last row; their sums are not stored): computed where
	 * used, not held in RB 64-bit registers */
	auto rp = [&](int r) { return sg.w + (size_t)min(row0 + r, sg.n_out - 1) * sg.row_bytes; };

	/* chunk ch of the block's rows into the tile (every thread: 16-byte pieces tid, tid + 128, ...) */
	auto load_chunk = [&](int ch) {
		mm_copy_chunk<RB, MM_NW * 32, SB>(tile, stride, rp, ch * CS, min(CS, n_slab - ch * CS));
	};
	mm_first_chunk_then_wait<RB>(a.pf, n_chunk, rp, (size_t)CS * SB, sg.row_bytes, load_chunk);
	const float *const xb = kdep_after(a.x); /* x only from here on */

	for (int t0 = 0; t0 < a.n_tok; t0 += NTP) {
		float acc[RB][NTP];
#pragma unroll
		for (int r = 0; r < RB; r++)
#pragma unroll
			for (int t = 0; t < NTP; t++)
				acc[r][t] = 0.0f;
		for (int ch = 0; ch < n_chunk; ch++) {
			const int s0 = ch * CS, nsl = min(CS, n_slab - s0);
			if (n_chunk > 1 && (ch > 0 || t0 > 0)) {
				__syncthreads(); /* every warp is done with the previous chunk */
				load_chunk(ch);
			}
			/* this lane's x of slab s of the chunk for the pass's tokens (zeros past n_tok) */
			auto load_x = [&](int s, float(&xs)[NTP][EPL]) {
#pragma unroll
				for (int t = 0; t < NTP; t++) {
					if (s < nsl && t0 + t < a.n_tok) {
						const float4 *q =
						    (const float4 *)(xb + (int64_t)(t0 + t) * a.ldx +
						                     (size_t)(s0 + s) * SE + EPL * lane);
#pragma unroll
						for (int e = 0; e < EPL / 4; e++) {
							const float4 f = q[e]; /* plain (coherent) load */
							xs[t][4 * e] = f.x, xs[t][4 * e + 1] = f.y;
							xs[t][4 * e + 2] = f.z, xs[t][4 * e + 3] = f.w;
						}
					} else {
#pragma unroll
						for (int e = 0; e < EPL; e++)
							xs[t][e] = 0.0f;
					}
				}
			};
			/* HOIST (1-2 tokens, TANDEM_MULTI_HOIST=1): every slab's x now, while the copies
			 * fly (x: L1 / L2); else the first slab's now, the others slab by slab below */
			float xv[HOIST ? KP : 1][NTP][EPL];
			if constexpr (HOIST) {
#pragma unroll
				for (int k = 0; k < KP; k++)
					load_x(warp + MM_NW * k, xv[k]);
			} else {
				if constexpr (!(XQ && T == KT_Q8_0 && NTP == 1))
					load_x(warp, xv[0]); /* the first slab's */
			}
			g3_wait<0>();
			__syncthreads(); /* every thread's copies are visible */
#pragma unroll(KUNR)
			for (int k = 0; k < KP; k++) {
				const int s = warp + MM_NW * k;
				if (s >= nsl)
					break;
				const int kx = HOIST ? k : 0;
				if constexpr (XQ && T == KT_Q8_0 && NTP == 1) {
					/* x's int8 parts: the slab's unit, this lane's 8 elements */
					mm_q8_parts<RB>(acc, tile + s * SB, stride, a.xq + s0 + s, lane);
					continue;
				}
				if (!HOIST && k > 0)
					load_x(s, xv[0]);
#pragma unroll
				for (int r = 0; r < RB; r++) {
					g3_row<T> wr;
					g3_decode<T>(tile + r * stride + s * SB, lane, wr);
#pragma unroll
					for (int t = 0; t < NTP; t++) {
						float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
						for (int e = 0; e < EPL; e += 2) {
							p0 = fmaf(wr.v[e], xv[kx][t][e], p0);
							p1 = fmaf(wr.v[e + 1], xv[kx][t][e + 1], p1);
						}
						acc[r][t] = fmaf(wr.d, p0 + p1, acc[r][t]);
					}
				}
			}
		}
#pragma unroll
		for (int r = 0; r < RB; r++)
#pragma unroll
			for (int t = 0; t < NTP; t++) {
				const float v = kc_warp_sum(acc[r][t]);
				if (lane == 0)
					part[warp][r * NTP + t] = v;
			}
		__syncthreads();
		if (tid < RB * NTP) {
			const int r = tid / NTP, t = tid % NTP;
			float v = 0.0f;
#pragma unroll
			for (int w = 0; w < MM_NW; w++) /* warp order: deterministic */
				v += part[w][r * NTP + t];
			if (t0 + t < a.n_tok && row0 + r < sg.n_out)
				sg.y[(int64_t)(t0 + t) * sg.ldy + row0 + r] = v;
		}
		__syncthreads(); /* part is rewritten by a next pass */
	}
	g3_wait<0>(); /* no copy outlives the block (none is pending here; kept for clarity) */
}

/* a block of the launch (the kernels below) */
template <int NTP, bool SMALL, bool HX, bool XQ, int Q8RB>
__device__ __forceinline__ void mm_multi_block(const struct mm_multi_args &a)
{
	extern __shared__ __align__(16) uint8_t mm_tile[];
	__shared__ float part[MM_NW][MM_PART];
	int s = 0; /* the segment of this block: kernel arguments only, nothing written by others */
	for (int i = 1; i < a.n_seg; i++)
		if ((int)blockIdx.x >= a.seg[i].blk0)
			s = i;
	const struct mm_seg_dev &sg = a.seg[s];
	const int blk = (int)blockIdx.x - sg.blk0;
	switch (sg.type) {
	case KT_Q8_0: mm_body<KT_Q8_0, NTP, SMALL, HX, XQ, Q8RB>(sg, blk, a, mm_tile, part); break;
	case KT_F16: mm_body<KT_F16, NTP, SMALL, HX, XQ, Q8RB>(sg, blk, a, mm_tile, part); break;
	case KT_BF16: mm_body<KT_BF16, NTP, SMALL, HX, XQ, Q8RB>(sg, blk, a, mm_tile, part); break;
	default: mm_body<KT_F32, NTP, SMALL, HX, XQ, Q8RB>(sg, blk, a, mm_tile, part); break;
	}
}

template <int NTP, bool SMALL, bool HX, int Q8RB = 4>
__global__ void __launch_bounds__(MM_NW * 32) mm_multi_kernel(const __grid_constant__ struct mm_multi_args a)
{
	mm_multi_block<NTP, SMALL, HX, false, Q8RB>(a);
}

/* one token against x's int8 parts: held to at most 64 registers (8 blocks an SM; CUDA 13.0, sm_90:
 * 60 / 53 at 4 rows, 64 at 8). Its own kernel: a minimum-blocks bound on the others (even 1) lets
 * ptxas take more registers for them (90 instead of 64 for the one-token fp32 kernel, found in the
 * final review of session 10). Register counts of the others since the row pointers are computed
 * where used instead of held in an array (session 11): 1 token 56 / 48 (large / small chunk; 64 /
 * 62 before), 2 tokens 64 (72), 4 tokens 93 (105), 8 tokens 168 (188); measured on the H200 as
 * batch 2 9.0-9.1 -> 8.6-8.7 ms and batch 8 19.2-19.4 -> 18.7-18.8 ms (GLM-5 rank 0 of TP=8). With the
 * slab loop rolled at 4-8 token slots (session 12): 4 tokens 80, 8 tokens 128. */
template <bool SMALL, int Q8RB = 4>
__global__ void __launch_bounds__(MM_NW * 32, 8)
    mm_multi_xq_kernel(const __grid_constant__ struct mm_multi_args a)
{
	mm_multi_block<1, SMALL, false, true, Q8RB>(a);
}

extern "C" bool kcuda_matmul_multi_enabled(void)
{
	const char *e = getenv("TANDEM_MULTI");
	return !(e && strcmp(e, "0") == 0);
}

static int multi_max_tok(void)
{
	const char *e = getenv("TANDEM_MULTI_TOK");
	const int v = e ? atoi(e) : 8;
	return v < 0 ? 0 : (v > 8 ? 8 : v);
}

/* whether the environment variable name is set to exactly v (the string switches below) */
static bool env_is(const char *name, const char *v)
{
	const char *e = getenv(name);
	return e && strcmp(e, v) == 0;
}

/* x at 1-2 tokens: by default slab by slab as for 3-8 tokens (n_in 6144, 1 token: 56 registers, 8
 * blocks by shared memory = ~210 KB of weight copies in flight per SM, all of GLM-5's q_a + kv_a + idx_k +
 * idx_proj on 132 SMs, most of it issued under PDL before the kernel before has finished; x then comes from
 * L1 after the SM's first block). TANDEM_MULTI_HOIST=1 (read on every call) loads all of a chunk's x before
 * the wait instead (124 registers, 4 blocks per SM; the first version): measured slower (H200, 2026-12-01
 * 19:52, synthetic GLM-5 rank 0 of TP=8, ctx 4096: batch 1 7.48 / 7.51 ms against 6.70 / 6.82 by default;
 * batch 8 the same within noise). */
static bool multi_hoist(void)
{
	return env_is("TANDEM_MULTI_HOIST", "1");
}

/* TANDEM_MULTI_XPARTS=0 (read on every call): the Q8_0 products of one token read x even where
 * the norm before left its int8 parts */
static bool multi_xparts(void)
{
	return !env_is("TANDEM_MULTI_XPARTS", "0");
}

/* a kernel table's entry for product s, its blocks (or tiles) from blk0 on */
static void mm_seg_fill(struct mm_seg_dev *d, const struct kcuda_mm_seg *s, int64_t blk0)
{
	d->w = (const uint8_t *)s->w->data;
	d->y = s->y;
	d->ldy = s->ldy;
	d->row_bytes = s->w->row_bytes;
	d->n_out = (int)s->w->n_out;
	d->type = s->w->type;
	d->blk0 = (int)blk0;
}

extern "C" bool kcuda_matmul_multi_takes(int64_t n_tok)
{
	return kcuda_matmul_multi_enabled() && n_tok >= 1 && n_tok <= 8 && n_tok <= multi_max_tok();
}

/* ---- one token's Q8_0 products on the int8 tensor cores (mm_multi_mq_kernel; TANDEM_MULTI_MQ) ----
 * Why: the one-token kernel above is issue-bound once its weights have landed (H200, Nsight Compute
 * source counters, session 23: GLM-5's q_a group 3.07M warp instructions a call, ~1000 a warp, of which
 * the dp4a are 13%; idx_q_b 2.33M). Every lane spends ~25 instructions on 8 weights of a row: the 2-byte
 * misaligned words of the 34-byte block, six dp4a for the three parts of x, the block's epilogue.
 * Here a block owns 16 rows (one m16n8k32 A tile) and an mma does 16 rows x 32 weights: lane (g, t)
 * puts 8 weights of ITS block 2t + e (e: the pass) of rows g and g + 8 on its k slots, and B column
 * 2t' / 2t' + 1 holds parts 1 / 2 of lane t''s block on lane t''s slots only (a second product: part 3
 * in column 2t'), the fragment trick of k45_i8.cuh. So the C entries a lane gets back are exactly its
 * own block's three integer dots for its two rows: no shuffle before the epilogue. A pass (one block
 * per lane, four of them a 256-element slab, two passes a slab) is 18 aligned shared loads and 16
 * funnel shifts for two rows' 32 weights, 8 mma and one epilogue a row: ~4x fewer instructions a
 * weight. The per-block value d s (q1 + (254 q2 + q3) / 254^2) p is formed as mm_q8_parts forms it
 * (the same bits a block); only the order of the fp32 sums differs (the lanes' blocks, then the 4
 * lanes of a row, then the warps in order: fixed, so reruns are bit-identical).
 * Layout: the block's 16 rows of a chunk of mq_cs slabs in shared memory, rows 16 bytes apart more
 * than the chunk (so the 8 rows g of a load fall in 8 different banks), copied by cp.async before
 * KDEP_ENTRY (weights); warp w takes slabs w, w + 4, ... of the chunk. x's parts are read from global
 * memory (the norm before wrote them: plain loads). Rows past n_out read the last row (not stored).
 * The other types of the same call (GLM-5's idx_proj in F32) run mm_body in the same launch.
 * MEASURED (H200, session 23, GLM-5 rank 0 of TP=8, batch 1): faster eager (-0.16 to -0.26 ms a step),
 * not in the graph (q_a group only, 8 warps: 6.42-6.45 against 6.40-6.49 ms; both calls, 4 warps:
 * +0.5 ms): after the PDL wait each warp runs its slabs' passes one after another on 8-16 warps an SM,
 * where the dp4a kernel has ~22. So off by default (TANDEM_MULTI_MQ). */
#define MQ_RB 16 /* rows a Q8_0 block: one A tile */
#define MQ_PAD 16 /* bytes between a row's chunk and the next row's */

/* shared-memory bytes of a chunk of cs slabs of the 16 rows */
__host__ __device__ constexpr size_t mq_tile_bytes(int cs)
{
	return (size_t)MQ_RB * ((size_t)cs * 272 + MQ_PAD);
}

/* words 0..7 of the qs of Q8_0 block j (of a slab at sl, 16-byte aligned) and its d: blocks of even j
 * start 4-byte aligned (qs 2 bytes in), odd ones 2 bytes past (qs aligned, d in the word before) */
template <int E>
__device__ __forceinline__ void mq_block_words(const uint8_t *sl, int j, uint32_t (&w)[8], float &d)
{
	if constexpr (E == 0) {
		const uint32_t *p = (const uint32_t *)(sl + 34 * j);
		uint32_t v[9];
#pragma unroll
		for (int i = 0; i < 9; i++)
			v[i] = p[i];
#pragma unroll
		for (int i = 0; i < 8; i++)
			w[i] = __funnelshift_r(v[i], v[i + 1], 16);
		d = __half2float(__ushort_as_half((unsigned short)(v[0] & 0xffffu)));
	} else {
		const uint32_t *p = (const uint32_t *)(sl + 34 * j - 2);
		const uint32_t v0 = p[0];
#pragma unroll
		for (int i = 0; i < 8; i++)
			w[i] = p[1 + i];
		d = __half2float(__ushort_as_half((unsigned short)(v0 >> 16)));
	}
}

/* one pass (E) over a slab: acc[hr] += the dots of rows g + 8 hr with x over block 2t + E */
template <int E>
__device__ __forceinline__ void mq_pass(float (&acc)[2], const uint8_t *sl, int stride, const mi8_x *U, int g,
                                        int t)
{
	const int j = 2 * t + E;
	const bool own = (g >> 1) == t, own3 = g == 2 * t;
	/* B: parts 1 / 2 of lane t''s block on lane (2t' + part, t'); part 3 on lane (2t', t') (plain
	 * loads: the parts are written by the kernel before) */
	const uint4 *bp = (const uint4 *)(own ? U->q[j][g & 1] : U->zero);
	const uint4 *rp = (const uint4 *)(own3 ? U->q[j][2] : U->zero);
	const uint4 p0 = bp[0], p1 = bp[1], r0 = rp[0], r1 = rp[1];
	const uint32_t b[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
	const uint32_t b3[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
	const float xs = U->s[j], xp = U->p[j];
	uint32_t w[2][8];
	float d[2];
	mq_block_words<E>(sl + g * stride, j, w[0], d[0]);
	mq_block_words<E>(sl + (g + 8) * stride, j, w[1], d[1]);
	int c[4] = {0, 0, 0, 0}, c3[4] = {0, 0, 0, 0};
#pragma unroll
	for (int m = 0; m < 4; m++) {
		mi8_mma(c, w[0][2 * m], w[1][2 * m], w[0][2 * m + 1], w[1][2 * m + 1], b[2 * m],
		        b[2 * m + 1]);
		mi8_mma(c3, w[0][2 * m], w[1][2 * m], w[0][2 * m + 1], w[1][2 * m + 1], b3[2 * m],
		        b3[2 * m + 1]);
	}
#pragma unroll
	for (int hr = 0; hr < 2; hr++) { /* mm_q8_parts' formula: the same value a block */
		const float f =
		    fmaf((float)(254 * c[2 * hr + 1] + c3[2 * hr]), 1.f / 64516.f, (float)c[2 * hr]);
		acc[hr] = fmaf(d[hr] * f * xs, xp, acc[hr]);
	}
}

/* The tiles' epilogue a warp: acc[hr] (rows g + 8 hr, this lane's blocks) summed over the row's 4 lanes
 * t, and the warp's 16 row sums into part[warp] */
__device__ __forceinline__ void mq_warp_rows(float (&acc)[2], float (*part)[MM_PART], int warp, int g, int t)
{
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		acc[hr] += __shfl_xor_sync(0xffffffffu, acc[hr], 1);
		acc[hr] += __shfl_xor_sync(0xffffffffu, acc[hr], 2);
	}
	if (t == 0) {
		part[warp][g] = acc[0];
		part[warp][g + 8] = acc[1];
	}
}

/* A block of NW warps: its MQ_RB rows over all of K, chunk by chunk (warp w: slabs w, w + NW, ...) */
template <int NW>
__device__ __forceinline__ void mq_body(const struct mm_seg_dev &sg, int blk, const struct mm_multi_args &a,
                                        uint8_t *tile, float (*part)[MM_PART])
{
	constexpr int SB = 272;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	const int n_slab = a.n_in / 256, cs = a.mq_cs;
	const int n_chunk = (n_slab + cs - 1) / cs;
	const int stride = (n_slab < cs ? n_slab : cs) * SB + MQ_PAD; /* tile bytes a row */
	const int row0 = blk * MQ_RB;
	auto rp = [&](int r) { return sg.w + (size_t)min(row0 + r, sg.n_out - 1) * sg.row_bytes; };
	auto load_chunk = [&](int ch) {
		mm_copy_chunk<MQ_RB, NW * 32, SB>(tile, stride, rp, ch * cs, min(cs, n_slab - ch * cs));
	};
	mm_first_chunk_then_wait<MQ_RB>(a.pf, n_chunk, rp, (size_t)cs * SB, sg.row_bytes, load_chunk);
	const mi8_x *const xq = kdep_after(a.xq); /* x's parts only from here on */
	float acc[2] = {0.f, 0.f};
	for (int ch = 0; ch < n_chunk; ch++) {
		const int s0 = ch * cs, nsl = min(cs, n_slab - s0);
		if (ch > 0) {
			__syncthreads(); /* every warp is done with the previous chunk */
			load_chunk(ch);
		}
		if (a.mq_pf) { /* this warp's slabs' parts into L1 at once: one L2 round trip, not one a slab
			        */
			constexpr int LN = (int)((sizeof(mi8_x) + 127) / 128);
			const int ns = (nsl - warp + NW - 1) / NW;
			for (int i = lane; i < ns * LN; i += 32) {
				const uint8_t *p =
				    (const uint8_t *)(xq + s0 + warp + NW * (i / LN)) + 128 * (i % LN);
				asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
			}
		}
		g3_wait<0>();
		__syncthreads(); /* every thread's copies are visible */
#pragma unroll 2
		for (int s = warp; s < nsl; s += NW) {
			const mi8_x *U = xq + s0 + s;
			mq_pass<0>(acc, tile + s * SB, stride, U, g, t);
			mq_pass<1>(acc, tile + s * SB, stride, U, g, t);
		}
	}
	mq_warp_rows(acc, part, warp, g, t);
	__syncthreads();
	if (tid < MQ_RB) {
		float v = 0.0f;
#pragma unroll
		for (int w = 0; w < NW; w++) /* warp order: deterministic */
			v += part[w][tid];
		if (row0 + tid < sg.n_out)
			sg.y[row0 + tid] = v;
	}
}

/* one token with x's parts: Q8_0 products on mq_body (16 rows a block), the others on mm_body */
template <bool SMALL>
__global__ void __launch_bounds__(MM_NW * 32)
    mm_multi_mq_kernel(const __grid_constant__ struct mm_multi_args a)
{
	extern __shared__ __align__(16) uint8_t mm_tile[];
	__shared__ float part[MM_NW][MM_PART];
	int s = 0; /* the segment of this block: kernel arguments only */
	for (int i = 1; i < a.n_seg; i++)
		if ((int)blockIdx.x >= a.seg[i].blk0)
			s = i;
	const struct mm_seg_dev &sg = a.seg[s];
	const int blk = (int)blockIdx.x - sg.blk0;
	switch (sg.type) {
	case KT_Q8_0: mq_body<MM_NW>(sg, blk, a, mm_tile, part); break;
	case KT_F16: mm_body<KT_F16, 1, SMALL, false, false, 4>(sg, blk, a, mm_tile, part); break;
	case KT_BF16: mm_body<KT_BF16, 1, SMALL, false, false, 4>(sg, blk, a, mm_tile, part); break;
	default: mm_body<KT_F32, 1, SMALL, false, false, 4>(sg, blk, a, mm_tile, part); break;
	}
}

/* The float4 dots of F32 row `row` and x over float4s [k4, k4 + n4), by a block of NW warps: that piece
 * of the row prefetched into L2 before KDEP_ENTRY (weights), each warp's sum (the lanes' shuffle tree)
 * into part[warp][0]. mq_f32_row: one row a block (the q_a group's idx_proj beside mq_body's tiles in
 * the 8-warp kernel), the warps then summed in order. */
template <int NW>
__device__ __forceinline__ void mq_f32_dot(const struct mm_seg_dev &sg, int row,
                                           const struct mm_multi_args &a, int k4, int n4,
                                           float (*part)[MM_PART])
{
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const float4 *w = (const float4 *)(sg.w + (size_t)min(row, sg.n_out - 1) * sg.row_bytes) + k4;
	if (a.pf && tid == 0 && n4 > 0)
		kdep_prefetch_l2(w, (size_t)n4 * 16);
	KDEP_ENTRY();
	const float4 *x = (const float4 *)kdep_after(a.x) + k4;
	float acc = 0.0f;
	for (int i = tid; i < n4; i += NW * 32) {
		const float4 wv = __ldg(w + i), xv = x[i];
		acc = fmaf(wv.x, xv.x, fmaf(wv.y, xv.y, fmaf(wv.z, xv.z, fmaf(wv.w, xv.w, acc))));
	}
	acc = kc_warp_sum(acc);
	if (lane == 0)
		part[warp][0] = acc;
}

template <int NW>
__device__ __forceinline__ void mq_f32_row(const struct mm_seg_dev &sg, int blk,
                                           const struct mm_multi_args &a, float (*part)[MM_PART])
{
	const int tid = threadIdx.x;
	mq_f32_dot<NW>(sg, blk, a, 0, a.n_in / 4, part);
	__syncthreads();
	if (tid == 0 && blk < sg.n_out) {
		float v = 0.0f;
#pragma unroll
		for (int q = 0; q < NW; q++) /* warp order: deterministic */
			v += part[q][0];
		sg.y[blk] = v;
	}
}

/* mm_multi_mq_kernel with 8 warps a block (each warp half the slabs: a shorter chain of dependent
 * passes); Q8_0 and F32 products only (the host declines other types for it) */
__global__ void __launch_bounds__(8 * 32) mm_multi_mq8_kernel(const __grid_constant__ struct mm_multi_args a)
{
	extern __shared__ __align__(16) uint8_t mm_tile[];
	__shared__ float part[8][MM_PART];
	int s = 0; /* the segment of this block: kernel arguments only */
	for (int i = 1; i < a.n_seg; i++)
		if ((int)blockIdx.x >= a.seg[i].blk0)
			s = i;
	const struct mm_seg_dev &sg = a.seg[s];
	const int blk = (int)blockIdx.x - sg.blk0;
	if (sg.type == KT_Q8_0)
		mq_body<8>(sg, blk, a, mm_tile, part);
	else
		mq_f32_row<8>(sg, blk, a, part);
}

/* ---- the same tiles with K split over a thread-block cluster (mm_multi_mqc_kernel; TANDEM_MULTI_MQ_KS) ----
 * Why: mm_multi_mq8_kernel's blocks hold 16 rows x all of K (104 KB at GLM-5's 6144), so the q_a group's
 * 172 tiles land one or two on each of the H200's 132 SMs: the SMs with two carry twice the bytes of the
 * others, and each warp runs its three slabs' passes in series after the wait. Here a cluster of ks blocks
 * shares a tile: block rank r copies slabs [r spr, (r + 1) spr) of the tile's rows (spr = the slabs a
 * rank) into its own shared memory before KDEP_ENTRY, its warps take slabs w, w + NW, ... of them, and
 * the block's sums go into rank 0's shared memory (distributed shared memory), which adds them in rank
 * order after one cluster barrier (cluster_bar.cuh's split phases: the first is passed long before it is
 * needed). GLM-5's q_a group at 8 warps and ks 3: 516 blocks of 35 KB, one slab a warp; at most 64
 * registers (launch bounds), so 4 blocks an SM and the 516 in one wave on 132 SMs.
 * F32 rows (the group's idx_proj) take one row a tile under the same split (mq_f32_row's dots).
 * The sums: the lanes' blocks, the 4 lanes of a row, the warps in order, the ranks in order: fixed, so
 * reruns are bit-identical (not the bits of mm_multi_mq8_kernel, which sums a row's slabs in another
 * order).
 * MEASURED SLOWER (H200, session 24, GLM-5 rank 0 of TP=8, batch 1, ms a step against 6.41-6.52 with
 * the default dp4a kernel): the q_a group at ks 2 6.47, ks 3 6.82-6.83, ks 4 6.78, ks 6 / 4 warps 6.77;
 * o (TANDEM_MULTI_MQ=x) 6.61-6.66. Clusters cap residency below the blocks' own limit (ks 3: 163
 * clusters resident for 204 tiles, so two waves; ks 2: 264, one wave), and even in one wave the q_a
 * group took 8.45 us on the critical path against 6.66 (nsys). So off unless TANDEM_MULTI_MQ_KS. */
#define MQC_KS_MAX 8 /* blocks a cluster: the portable limit */

template <int NW>
__global__ void __launch_bounds__(NW * 32, 32 / NW)
    mm_multi_mqc_kernel(const __grid_constant__ struct mm_multi_args a)
{
	extern __shared__ __align__(16) uint8_t mm_tile[];
	__shared__ float part[NW][MM_PART]; /* MQ_RB of each warp's row used */
	__shared__ float rsum[MQC_KS_MAX][MQ_RB]; /* rank 0's: every rank's block sums */
	kcl_arrive_relaxed(); /* phase 1: this block has started */
	constexpr int SB = 272;
	const int ks = a.mq_ks, tile = (int)blockIdx.x / ks, rank = (int)blockIdx.x % ks;
	int si = 0; /* the segment of this tile: kernel arguments only */
	for (int i = 1; i < a.n_seg; i++)
		if (tile >= a.seg[i].blk0)
			si = i;
	const struct mm_seg_dev &sg = a.seg[si];
	const int blk = tile - sg.blk0;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	const int n_slab = a.n_in / 256, spr = a.mq_cs;
	const int s0 = rank * spr, nsl = max(0, min(spr, n_slab - s0));
	const bool q8 = sg.type == KT_Q8_0;
	const int row0 = q8 ? blk * MQ_RB : blk, nrow = q8 ? MQ_RB : 1;
	if (q8) {
		const int stride = spr * SB + MQ_PAD; /* tile bytes a row */
		auto rp = [&](int r) { return sg.w + (size_t)min(row0 + r, sg.n_out - 1) * sg.row_bytes; };
		auto load = [&](int) { mm_copy_chunk<MQ_RB, NW * 32, SB>(mm_tile, stride, rp, s0, nsl); };
		mm_first_chunk_then_wait<MQ_RB>(a.pf, 1, rp, 0, 0, load);
		/* x's parts only from here on: the op before left them, or (xq NULL) each warp makes its
		 * slab's parts in its own unit after the tile (mi8_stage: the bits kfuse_add_rmsnorm_parts
		 * would have written) */
		const mi8_x *const xq = a.xq ? kdep_after(a.xq) + s0 : NULL;
		const float *const xf = a.xq ? NULL : kdep_after(a.x) + (size_t)s0 * 256;
		mi8_x *const xw = (mi8_x *)(mm_tile + mq_tile_bytes(spr)) + warp;
		float acc[2] = {0.f, 0.f};
		g3_wait<0>();
		__syncthreads(); /* every thread's copies are visible */
#pragma unroll 1
		for (int s = warp; s < nsl; s += NW) {
			const mi8_x *U = xq + s;
			if (!xq) {
				__syncwarp(); /* the previous slab's reads of the unit are done */
				mi8_stage(*xw, xf + (size_t)s * 256, lane);
				U = xw;
			}
			mq_pass<0>(acc, mm_tile + s * SB, stride, U, g, t);
			mq_pass<1>(acc, mm_tile + s * SB, stride, U, g, t);
		}
		mq_warp_rows(acc, part, warp, g, t);
	} else { /* one F32 row: elements [256 s0, 256 (s0 + nsl)) */
		mq_f32_dot<NW>(sg, row0, a, 64 * s0, 64 * nsl, part);
	}
	__syncthreads();
	float v = 0.0f;
	if (tid < nrow)
#pragma unroll
		for (int w = 0; w < NW; w++) /* warp order */
			v += part[w][tid];
	kcl_wait(); /* phase 1 done: rank 0's shared memory exists */
	if (tid < nrow)
		kcl_put<float>(&rsum[rank][tid], 0, v);
	kcl_arrive_release();
	kcl_wait(); /* phase 2: every rank's sums are in rank 0's rsum */
	if (rank == 0 && tid < nrow && row0 + tid < sg.n_out) {
		float y = 0.0f;
		for (int r = 0; r < ks; r++) /* rank order */
			y += rsum[r][tid];
		sg.y[row0 + tid] = y;
	}
}

static unsigned long long mq_calls; /* kcuda_matmul_mq_calls */

extern "C" unsigned long long kcuda_matmul_mq_calls(void)
{
	return __atomic_load_n(&mq_calls, __ATOMIC_RELAXED);
}

/* TANDEM_MULTI_MQ (read on every call): whether a one-token call of n_in inputs with (parts) or
 * without x's int8 parts goes to the int8 tensor-core tiles. 1: every call with parts; big / small:
 * those with n_in above / up to 2048 (GLM-5: the q_a group / idx_q_b); x: only the calls without
 * parts (with TANDEM_MULTI_MQ_X=1 and TANDEM_MULTI_MQ_KS, which the calls without parts also need
 * under 1 / big / small); unset or 0: none (the dp4a kernel, mm_multi_xq_kernel: measured faster in
 * the step, see docs/PERFORMANCE.md, sessions 23 and 24) */
static bool multi_mq(int64_t n_in, bool parts)
{
	const char *e = getenv("TANDEM_MULTI_MQ");
	if (!e)
		return false;
	if (strcmp(e, "x") == 0) /* only the calls without parts (TANDEM_MULTI_MQ_X's, GLM-5's o) */
		return !parts;
	if (strcmp(e, "big") == 0)
		return n_in > 2048;
	if (strcmp(e, "small") == 0)
		return n_in <= 2048;
	return strcmp(e, "1") == 0;
}

/* TANDEM_MULTI_MQ_CS=n (read on every call): at most n slabs of 256 a chunk of the Q8_0 tiles (less
 * shared memory a block, more blocks an SM); unset: as many as fit */
static int multi_mq_cs(void)
{
	const char *e = getenv("TANDEM_MULTI_MQ_CS");
	const int v = e ? atoi(e) : 0;
	return v > 0 ? v : 1 << 20;
}

/* ---- 5..8 tokens on the int8 tensor cores (mm_xm_kernel; TANDEM_MULTI_XM=1, off: see multi_xm) ----
 * Why: at 5-8 tokens the kernel above is issue-bound (fp32 FMAs, ~2.85 instructions a multiply-add:
 * PERFORMANCE.md, session 12): GLM-5's idx_q_b took 16.7 us and o 23 us at 8 tokens (ncu) for 8.9 and
 * 13.4 MB. Session 11's first int8 version (commit 3f3c6d2) had 16 rows x all of K a block of 4 warps
 * (~5 warps an SM, 48 dependent k-steps a warp, its x parts loaded in the loop) and measured slower.
 * Here:
 *  - the mma's roles are swapped: A (16 x 32) = x's int8 parts, rows 0..7 part 1 and 8..15 part 2 of
 *    tokens 0..7, B (32 x 8) = 8 weight rows; a second mma takes part 3 (A rows 8..15 zero). So a tile
 *    is 8 weight rows, and each lane's four C entries are parts 1 and 2 of (its token g, its rows 2j,
 *    2j + 1): the epilogue d s (q1 + (254 q2 + q3) / 254^2) p is lane-local, no shuffles;
 *  - the k order inside a 32-element block is permuted alike on both sides: lane (g, j) gives bytes
 *    8j..8j+3 as k slots 4j..4j+3 and 8j+4..8j+7 as 16+4j..16+4j+3, which are the 8 bytes g3_q8_bytes
 *    reads of its weight row and the parts' words 2j, 2j + 1 of its token (mi8_x);
 *  - a warp owns ONE 256-element slab of K for the block's R8 tiles (8 R8 rows): it copies its own
 *    rows' slab into its own shared memory (cp.async, before the PDL wait: weights), gets its tokens'
 *    parts of the slab while they fly (the parts the op before left, kfuse_mla_latent_parts /
 *    kfuse_add_rmsnorm_parts, or else its own: mi8_stage of each token's slab of x into the warp's
 *    shared memory), then runs 8 blocks x R8 tiles x 2 mma. No block barrier before the sums;
 *  - a block is 8 warps = 2048 of K; a thread-block cluster of ks = ceil(slabs / 8) blocks (<= 8:
 *    n_in <= 16384) covers K: per-warp sums into shared memory, the warps added in order, then the
 *    block rank 0 adds the other ranks' sums (distributed shared memory) in rank order and stores y:
 *    a fixed order, so reruns are bit-identical.
 * Exactness: the integer dots are exact; the parts carry <= 6.1e-8 of each 32-element block's largest
 * |x| (k45_i8.cuh), as the one-token parts path (mm_q8_parts). */
#define XM_NW 8 /* warps a block: one slab of K each */
#define XM_SB 272 /* bytes of a Q8_0 slab (8 blocks of 34) */
#define XM_KS_MAX 8 /* blocks a cluster (the portable limit) */
#define XM_R8 2 /* 8-row tiles a block: 16 rows (32 measured slower: fewer resident clusters) */

struct xm_args {
	struct mm_seg_dev seg[KCUDA_MM_MULTI_MAX]; /* blk0: the segment's first tile */
	int n_seg;
	const float *x; /* quantized in the kernel where xq is NULL */
	int64_t ldx;
	const mi8_x *xq; /* x's parts: token t's slab s at xq[t * n_slab + s], or NULL */
	int n_tok, n_in, n_slab, ks, pf;
};

/* One warp's products over its slab (tests/unit/xm_sim.cc runs this on the CPU): wsm holds the
 * slab (XM_SB bytes) of 8 R8 weight rows, XM_SB apart; U the parts of this lane's token g = lane / 4
 * (tok false: a token past n_tok, zeros). acc[i][e] += the slab's dot of rows 8i + 2j + e (j = lane %
 * 4) with token g: two mma a 32-element block and 8-row tile (parts 1 and 2 as A's row halves, part
 * 3 with zero rows), then d s (q1 + (254 q2 + q3) / 254^2) p in fp32. The parts are loaded first, then wait()
 * (the weights' copies), so the two round trips overlap. */
template <int R8, class W>
__device__ __forceinline__ void xm_warp(const uint8_t *wsm, const mi8_x *U, bool tok, int lane,
                                        float (&acc)[R8][2], W wait)
{
	const int g = lane >> 2, j = lane & 3;
	uint2 p1[8], p2[8], p3[8];
	float xs[8], xp[8];
#pragma unroll
	for (int bi = 0; bi < 8; bi++) {
		p1[bi] = tok ? *(const uint2 *)&U->q[bi][0][2 * j] : make_uint2(0u, 0u);
		p2[bi] = tok ? *(const uint2 *)&U->q[bi][1][2 * j] : make_uint2(0u, 0u);
		p3[bi] = tok ? *(const uint2 *)&U->q[bi][2][2 * j] : make_uint2(0u, 0u);
		xs[bi] = tok ? U->s[bi] : 0.0f;
		xp[bi] = tok ? U->p[bi] : 0.0f;
	}
	wait();
#pragma unroll
	for (int bi = 0; bi < 8; bi++)
#pragma unroll
		for (int i = 0; i < R8; i++) {
			uint32_t b0, b1;
			g3_q8_bytes(wsm + (8 * i + g) * XM_SB, 4 * bi + j, b0, b1);
			int c1[4] = {0, 0, 0, 0}, c3[4] = {0, 0, 0, 0};
			mi8_mma(c1, p1[bi].x, p2[bi].x, p1[bi].y, p2[bi].y, b0, b1);
			mi8_mma(c3, p3[bi].x, 0u, p3[bi].y, 0u, b0, b1);
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const float d = __half2float(
				    *(const __half *)(wsm + (8 * i + 2 * j + e) * XM_SB + 34 * bi));
				const float f =
				    fmaf((float)(254 * c1[2 + e] + c3[e]), 1.f / 64516.f, (float)c1[e]);
				acc[i][e] = fmaf(d * f * xs[bi], xp[bi], acc[i][e]); /* (d f s) p */
			}
		}
}

/* dynamic shared memory: per warp RT rows of its slab, then (xq NULL) 8 tokens' parts of it */
template <int R8> __host__ __device__ constexpr size_t xm_warp_bytes(bool quant)
{
	return (size_t)8 * R8 * XM_SB + (quant ? 8 * sizeof(mi8_x) : 0);
}

template <int R8>
__global__ void __launch_bounds__(XM_NW * 32, 2) mm_xm_kernel(const __grid_constant__ struct xm_args a)
{
	constexpr int RT = 8 * R8; /* rows a tile */
	extern __shared__ __align__(16) uint8_t xm_sm[];
	__shared__ float part[XM_NW][RT * 8]; /* per warp: [row][token] */
	__shared__ float bsum[RT * 8]; /* the block's sums */
	namespace cg = cooperative_groups;
	cg::cluster_group cl = cg::this_cluster();
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, j = lane & 3;
	const int rank = (int)cl.block_rank();
	const int tile = (int)blockIdx.x / a.ks;
	int si = 0; /* the segment: kernel arguments only */
	for (int i = 1; i < a.n_seg; i++)
		if (tile >= a.seg[i].blk0)
			si = i;
	const struct mm_seg_dev &sg = a.seg[si];
	const int row0 = (tile - sg.blk0) * RT;
	const int slab = rank * XM_NW + warp; /* the warp's 256 elements of K */
	const bool has = slab < a.n_slab;
	uint8_t *wsm = xm_sm + (size_t)warp * xm_warp_bytes<R8>(a.xq == NULL); /* this warp's rows */
	/* rows past n_out read the last row; their sums are not stored */
	auto issue = [&]() {
		if (has)
			for (int u = lane; u < RT * (XM_SB / 16); u += 32) {
				const int r = u / (XM_SB / 16), c = u % (XM_SB / 16);
				g3_cp16(wsm + r * XM_SB + 16 * c,
				        sg.w + (size_t)min(row0 + r, sg.n_out - 1) * sg.row_bytes +
				            (size_t)slab * XM_SB + 16 * c);
			}
		g3_commit();
	};
	if (a.pf)
		issue(); /* weights: before the wait */
	KDEP_ENTRY();
	if (!a.pf)
		issue();
	float acc[R8][2]; /* (token g, rows 8i + 2j + e) */
#pragma unroll
	for (int i = 0; i < R8; i++)
		acc[i][0] = acc[i][1] = 0.0f;
	if (has) {
		const bool tok = g < a.n_tok;
		const mi8_x *U;
		if (a.xq) { /* the op before left them: plain loads (never __ldg: cuda_common.cuh) */
			U = kdep_after(a.xq) + (size_t)(tok ? g : 0) * a.n_slab + slab;
		} else { /* each token's slab of x into the warp's own parts */
			mi8_x *xw = (mi8_x *)(wsm + (size_t)RT * XM_SB);
			const float *xb = kdep_after(a.x);
			for (int t = 0; t < a.n_tok; t++)
				mi8_stage(xw[t], xb + (int64_t)t * a.ldx + (size_t)slab * 256, lane);
			U = xw + (tok ? g : 0);
		}
		xm_warp<R8>(wsm, U, tok, lane, acc, []() {
			g3_wait<0>();
			__syncwarp(); /* every lane's copies of the warp's rows are visible */
		});
	}
#pragma unroll
	for (int i = 0; i < R8; i++)
#pragma unroll
		for (int e = 0; e < 2; e++)
			part[warp][(8 * i + 2 * j + e) * 8 + g] = acc[i][e];
	__syncthreads();
	for (int q = tid; q < RT * 8; q += XM_NW * 32) {
		float v = 0.0f;
#pragma unroll
		for (int w = 0; w < XM_NW; w++) /* warp (slab) order */
			v += part[w][q];
		bsum[q] = v;
	}
	cl.sync(); /* every block's bsum is complete */
	if (rank == 0)
		for (int q = tid; q < RT * 8; q += XM_NW * 32) {
			float v = bsum[q];
			for (int r = 1; r < a.ks; r++) /* rank order */
				v += cl.map_shared_rank(bsum, r)[q];
			const int row = q / 8, t = q % 8;
			if (t < a.n_tok && row0 + row < sg.n_out)
				sg.y[(int64_t)t * sg.ldy + row0 + row] = v;
		}
	cl.sync(); /* rank 0 has read every bsum before any block leaves */
}

static unsigned long long xm_calls; /* kcuda_matmul_xm_calls */

/* TANDEM_MULTI_XM=1 (read on every call; off by default): 5..8 tokens of all-Q8_0 calls on mm_xm_kernel.
 * Measured SLOWER in the step (H200, session 15, GLM-5 rank 0 of TP=8, ctx 4096, two reps: batch 8
 * 16.68 / 16.57 ms against 15.87 / 15.92, batch 5 16.22 / 16.03 against 15.34 / 15.57), though faster
 * alone: ncu at 8 tokens, idx_q_b 11.7 us against the fp32 kernel's 16.7 (session 12). Not yet known
 * which product lost (o, 384 blocks in 1.45 waves with x quantized in every block, is the suspect); see
 * docs/PERFORMANCE.md, session 15. */
static bool multi_xm(void)
{
	return env_is("TANDEM_MULTI_XM", "1");
}

/* TANDEM_MULTI_XM_QUANT=0 (read on every call): mm_xm_kernel only where the op before left x's parts
 * (with TANDEM_XPARTS_ROWS=8: idx_q_b after the latent), not quantizing x itself: its blocks then need
 * 35 instead of 92 KB of shared memory (an A/B for the next session: does the larger block lose the PDL
 * overlap in the graph?) */
static bool multi_xm_quant(void)
{
	return !env_is("TANDEM_MULTI_XM_QUANT", "0");
}

/* the fewest tokens mm_xm_kernel takes: TANDEM_MULTI_XM_MIN (2..8, read on every call), default 5
 * (below, the fp32 kernel is not issue-bound: H200, session 15, its first version at batch 2 and 4
 * measured 1.4 and 0.7 ms a step slower) */
static int multi_xm_min(void)
{
	const char *e = getenv("TANDEM_MULTI_XM_MIN");
	const int v = e && *e ? atoi(e) : 5;
	return v < 2 ? 2 : (v > 9 ? 9 : v);
}

/* mm_run's products of n_tok tokens on mm_xm_kernel, arguments already checked: every product Q8_0,
 * n_in % 256 == 0 and <= 16384, and (clusters of more than one block) the grid's clusters resident at
 * once; else ERR_UNSUPPORTED with nothing launched */
static int mm_run_xm(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x,
                     int64_t ldx, int64_t n_tok, int64_t n_in)
{
	if (n_tok < multi_xm_min() || n_tok > 8 || n_in % 256 || n_in > (int64_t)XM_KS_MAX * XM_NW * 256 ||
	    !multi_xm() || kcuda_cc_major(c->device) < 9)
		return ERR_UNSUPPORTED;
	for (int i = 0; i < n_seg; i++) {
		const struct kweight *w = seg[i].w;
		if (w->type != KT_Q8_0 || (uintptr_t)w->data % 16 || w->row_bytes % 16 ||
		    w->n_out > INT32_MAX / 2)
			return ERR_UNSUPPORTED;
	}
	struct xm_args a;
	memset(&a, 0, sizeof(a));
	a.xq = kcuda_xparts_for(c, x, ldx, n_in, n_tok);
	if (!a.xq && !multi_xm_quant())
		return ERR_UNSUPPORTED;
	a.n_slab = (int)(n_in / 256);
	a.ks = (a.n_slab + XM_NW - 1) / XM_NW;
	const size_t smem = (size_t)XM_NW * xm_warp_bytes<XM_R8>(a.xq == NULL);
	const size_t smem_static = (size_t)(XM_NW + 1) * 8 * XM_R8 * 8 * sizeof(float); /* part, bsum */
	if (smem + smem_static > (size_t)kcuda_smem_optin(c->device))
		return ERR_UNSUPPORTED;
	int64_t n_tiles = 0;
	for (int i = 0; i < n_seg; i++) {
		mm_seg_fill(&a.seg[a.n_seg++], &seg[i], n_tiles);
		n_tiles += (seg[i].w->n_out + 8 * XM_R8 - 1) / (8 * XM_R8);
	}
	if (n_tiles * a.ks > INT32_MAX)
		return ERR_UNSUPPORTED;
	KCUDA_CHECK(cudaFuncSetAttribute(mm_xm_kernel<XM_R8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                                 (int)smem));
	if (a.ks > 1) { /* clusters that do not all fit at once ran two waves (H200: 87 of 79, 2x slower) */
		/* resident clusters per device, cluster size and shared-memory variant, asked once (-1: the
		 * query failed) */
		static int fit_cache[64][XM_KS_MAX + 1][2];
		const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
		int *fit = &fit_cache[dev][a.ks][a.xq == NULL];
		if (*fit == 0 &&
		    klaunch_max_clusters((const void *)mm_xm_kernel<XM_R8>, dim3((unsigned)a.ks, 1, 1),
		                         dim3(XM_NW * 32), smem, c->stream, fit) != cudaSuccess) {
			(void)cudaGetLastError();
			*fit = -1;
		}
		if (*fit < 1 || n_tiles > *fit)
			return ERR_UNSUPPORTED;
	}
	a.x = x;
	a.ldx = ldx;
	a.n_tok = (int)n_tok;
	a.n_in = (int)n_in;
	a.pf = kcuda_prefetch_enabled();
	const int rc = klaunch_cl("matmul_multi_xm", mm_xm_kernel<XM_R8>, dim3((unsigned)(n_tiles * a.ks)),
	                          dim3(XM_NW * 32), smem, c->stream, dim3((unsigned)a.ks, 1, 1), a);
	if (rc == 0)
		__atomic_fetch_add(&xm_calls, 1ull, __ATOMIC_RELAXED);
	return rc;
}

extern "C" unsigned long long kcuda_matmul_xm_calls(void)
{
	return __atomic_load_n(&xm_calls, __ATOMIC_RELAXED);
}

/* Blocks of the 4-row one-token kernel (parts or x, n_in <= 2048) one SM holds at once, at the most
 * shared memory such a launch asks for (4 Q8_0 rows x 8 slabs of 272 B: every type's small tile is at
 * most that); cached per device (0: not yet asked; a failed query reads as "fits": 4 rows) */
static int mm_small_occupancy(const struct kcuda_ctx *c, bool xq)
{
	static int occ[2][64];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
	int v = occ[xq][dev];
	if (v == 0) {
		const size_t smem = 4 * (size_t)g3t<KT_Q8_0>::SB * (MM_CHUNK(true) / g3t<KT_Q8_0>::SE);
		cudaError_t e = xq ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		                         &v, mm_multi_xq_kernel<true, 4>, MM_NW * 32, smem)
		                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		                         &v, mm_multi_kernel<1, true, false, 4>, MM_NW * 32, smem);
		if (e != cudaSuccess || v < 1) {
			(void)cudaGetLastError();
			v = INT32_MAX / 4096;
		}
		occ[xq][dev] = v;
	}
	return v;
}

/* Q8_0 rows per block of a launch (see the top). 8 only at one token with n_in <= 2048 (the <.., 8>
 * instantiations), when the 4-row grid of blk4 blocks exceeds one wave of resident blocks and the
 * 8-row grid of blk8 does not; TANDEM_MULTI_RB=4 or 8 (read on every call) forces it there. */
static int mm_q8_rows(const struct kcuda_ctx *c, int64_t n_tok, bool small, bool hx, bool xq, int64_t blk4,
                      int64_t blk8)
{
	if (n_tok != 1 || !small || hx)
		return 4;
	const char *e = getenv("TANDEM_MULTI_RB");
	if (e && (strcmp(e, "4") == 0 || strcmp(e, "8") == 0))
		return atoi(e);
	const int64_t wave = (int64_t)mm_small_occupancy(c, xq) * (c->n_sm > 0 ? c->n_sm : 1);
	return blk4 > wave && blk8 <= wave ? 8 : 4;
}

/* rows per block (Q8_0: q8rb), slab elements and slab bytes of a type the kernel takes; false otherwise */
static bool mm_geom(int type, int q8rb, int *rb, int *se, int *sb)
{
	switch (type) {
	case KT_Q8_0: *rb = q8rb, *se = g3t<KT_Q8_0>::SE, *sb = g3t<KT_Q8_0>::SB; return true;
	case KT_F16: *rb = mmx<KT_F16>::RB, *se = g3t<KT_F16>::SE, *sb = g3t<KT_F16>::SB; return true;
	case KT_BF16: *rb = mmx<KT_BF16>::RB, *se = g3t<KT_BF16>::SE, *sb = g3t<KT_BF16>::SB; return true;
	case KT_F32: *rb = mmx<KT_F32>::RB, *se = g3t<KT_F32>::SE, *sb = g3t<KT_F32>::SB; return true;
	default: return false;
	}
}

template <int NTP, bool SMALL, bool HX = false, bool XQ = false, int Q8RB = 4>
static int mm_launch(struct kcuda_ctx *c, const struct mm_multi_args &a, unsigned grid, size_t smem)
{
	if constexpr (XQ)
		return klaunch("matmul_multi", mm_multi_xq_kernel<SMALL, Q8RB>, dim3(grid), dim3(MM_NW * 32),
		               smem, c->stream, a);
	else
		return klaunch("matmul_multi", mm_multi_kernel<NTP, SMALL, HX, Q8RB>, dim3(grid),
		               dim3(MM_NW * 32), smem, c->stream, a);
}

static int mm_run(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x, int64_t ldx,
                  int64_t n_tok, int min_table);

int kcuda_matmul_multi(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x,
                       int64_t ldx, int64_t n_tok)
{
	return mm_run(c, n_seg, seg, x, ldx, n_tok, 2);
}

/* TANDEM_MULTI_WIDE (read on every call; default on since the H200 step A/B of 2026-11-30 00:25:
 * synthetic GLM-5 rank 0 of TP=8, ctx 4096, batch 1 7.39 / 7.50 -> 7.31 / 7.41 ms, batch 8 20.02 /
 * 20.16 -> 19.54 / 19.68 ms): kcuda_matmul sends Q8_0 products wider than gemv3 takes (o, q_a, q_b,
 * idx_q_b when not grouped) at n_tok 1..8 through this kernel as a table of one, instead of
 * gemv_kernel / the tensor-core GEMV; TANDEM_MULTI_WIDE=0 restores those */
extern "C" bool kcuda_multi_wide_enabled(void)
{
	const char *e = getenv("TANDEM_MULTI_WIDE");
	return !(e && strcmp(e, "0") == 0);
}

int kcuda_gemv_multi1_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                             int n_tok, float *y, int64_t ldy)
{
	int rb, se, sb;
	if (!mm_geom(w->type, 4, &rb, &se, &sb) || w->n_in % se || (uintptr_t)w->data % 16 ||
	    w->n_out > INT32_MAX / 2 || (uintptr_t)x % 16 || ldx % 4 || n_tok < 1 || n_tok > 8)
		return ERR_UNSUPPORTED;
	const struct kcuda_mm_seg seg = {w, y, ldy};
	return mm_run(c, 1, &seg, x, ldx, n_tok, 1);
}

/* TANDEM_MULTI_MQ_KS (read on every call): n (1..8) the tiles of TANDEM_MULTI_MQ on
 * mm_multi_mqc_kernel, K split over clusters of n blocks; "auto" as many blocks as make one slab a warp
 * (GLM-5's q_a group at 8 warps: 3); unset or 0: mm_multi_mq_kernel / mm_multi_mq8_kernel. Returns
 * -1 for auto. */
static int multi_mq_ks(void)
{
	const char *e = getenv("TANDEM_MULTI_MQ_KS");
	if (!e)
		return 0;
	if (strcmp(e, "auto") == 0)
		return -1;
	const int v = atoi(e);
	return v < 0 ? 0 : v > MQC_KS_MAX ? MQC_KS_MAX : v;
}

/* TANDEM_MULTI_MQ_X=1 (read on every call): the cluster tiles (TANDEM_MULTI_MQ with
 * TANDEM_MULTI_MQ_KS) also take one-token calls whose x has no int8 parts (GLM-5's o), each warp
 * quantizing its slabs of x (mi8_stage) */
static bool multi_mq_x(void)
{
	return env_is("TANDEM_MULTI_MQ_X", "1");
}

/* TANDEM_MULTI_MQ_NW (read on every call): 8 or 4 warps a tile block, else the caller's default */
static bool multi_mq_nw8(bool dflt)
{
	return env_is("TANDEM_MULTI_MQ_NW", "8") || (dflt && !env_is("TANDEM_MULTI_MQ_NW", "4"));
}

/* the products of the table that a launch did not take (in_table[i] false), each on its own after it;
 * rc: the launch's status, returned as it is when not 0 */
static int mm_run_rest(struct kcuda_ctx *c, int rc, int n_seg, const struct kcuda_mm_seg *seg,
                       const bool *in_table, const float *x, int64_t ldx, int64_t n_tok)
{
	for (int i = 0; i < n_seg && !rc; i++)
		if (!in_table[i])
			rc = kcuda_matmul(c, seg[i].w, x, ldx, n_tok, seg[i].y, seg[i].ldy);
	return rc;
}

/* the one-token tile launches' common arguments */
static void mq_args_fill(struct mm_multi_args *a, const float *x, int64_t ldx, int64_t n_in, const mi8_x *xq)
{
	a->x = x;
	a->ldx = ldx;
	a->n_tok = 1;
	a->n_in = (int)n_in;
	a->pf = kcuda_prefetch_enabled();
	a->xq = xq;
}

/* mm_run_mq on mm_multi_mqc_kernel (ks_req blocks a cluster, -1: one slab a warp; xq NULL: x
 * quantized in the kernel): the Q8_0 and F32 products of the table in one launch, the others after it on
 * their own; ERR_UNSUPPORTED (nothing launched) without clusters (below sm_90), without a Q8_0 product, with
 * a table shorter than min_table, or where a block's slabs do not fit its shared memory */
static int mm_run_mqc(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x,
                      int64_t ldx, int64_t n_in, const mi8_x *xq, int min_table, int ks_req, bool nw8)
{
	const int nw = nw8 ? 8 : 4, n_slab = (int)(n_in / 256);
	const int optin = kcuda_smem_optin(c->device);
	if (n_in % 256 || n_slab < 1 || optin <= 0 || kcuda_cc_major(c->device) < 9)
		return ERR_UNSUPPORTED;
	int ks = ks_req > 0 ? ks_req : (n_slab + nw - 1) / nw;
	ks = ks < 1 ? 1 : ks > MQC_KS_MAX ? MQC_KS_MAX : ks > n_slab ? n_slab : ks;
	const size_t smem_static = sizeof(float) * ((size_t)nw * MM_PART + (size_t)MQC_KS_MAX * MQ_RB);
	/* more blocks a cluster where a block's slabs do not fit its shared memory (sm_120: 99 KB) */
	const size_t units = xq ? 0 : (size_t)nw * sizeof(mi8_x);
	while (ks < MQC_KS_MAX && ks < n_slab &&
	       mq_tile_bytes((n_slab + ks - 1) / ks) + units + smem_static > (size_t)optin)
		ks++;
	const int spr = (n_slab + ks - 1) / ks;
	ks = (n_slab + spr - 1) / spr; /* no rank without slabs */
	/* without x's parts each warp's unit follows the tile (16-byte aligned: the tile is) */
	const size_t smem = mq_tile_bytes(spr) + units;
	if (smem + smem_static > (size_t)optin)
		return ERR_UNSUPPORTED;
	struct mm_multi_args a;
	memset(&a, 0, sizeof(a));
	bool in_table[KCUDA_MM_MULTI_MAX] = {false};
	int n_q8 = 0;
	int64_t n_tiles = 0;
	for (int i = 0; i < n_seg; i++) {
		const struct kweight *w = seg[i].w;
		if ((w->type != KT_Q8_0 && w->type != KT_F32) || (uintptr_t)w->data % 16 ||
		    w->row_bytes % 16 || w->n_out > INT32_MAX / 2)
			continue;
		mm_seg_fill(&a.seg[a.n_seg++], &seg[i], n_tiles);
		n_tiles += w->type == KT_Q8_0 ? (w->n_out + MQ_RB - 1) / MQ_RB : w->n_out;
		n_q8 += w->type == KT_Q8_0;
		in_table[i] = true;
	}
	if (!n_q8 || a.n_seg < min_table || n_tiles * ks > INT32_MAX)
		return ERR_UNSUPPORTED;
	mq_args_fill(&a, x, ldx, n_in, xq);
	a.mq_cs = spr;
	a.mq_ks = ks;
	/* more than the default 48 KB of dynamic shared memory: set on every call (a per-device
	 * attribute; a process may drive several GPUs from several threads) */
	const void *kern = nw8 ? (const void *)mm_multi_mqc_kernel<8> : (const void *)mm_multi_mqc_kernel<4>;
	if (smem > 48 * 1024)
		KCUDA_CHECK(
		    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	const dim3 grid((unsigned)(n_tiles * ks)), cl((unsigned)ks, 1, 1);
	if (getenv("TANDEM_MULTI_MQ_DEBUG")) { /* the plan and how many clusters can be resident */
		int fit = -1;
		if (klaunch_max_clusters(kern, cl, dim3((unsigned)nw * 32), smem, c->stream, &fit) !=
		    cudaSuccess)
			(void)cudaGetLastError();
		fprintf(stderr,
		        "mqc: n_in %lld, %d warps, ks %d, %d slabs a block, %lld tiles, %zu B shared, %d "
		        "clusters resident\n",
		        (long long)n_in, nw, ks, spr, (long long)n_tiles, smem, fit);
	}
	int rc = nw8 ? klaunch_cl("matmul_multi_mqc", mm_multi_mqc_kernel<8>, grid, dim3(8 * 32), smem,
	                          c->stream, cl, a)
	             : klaunch_cl("matmul_multi_mqc", mm_multi_mqc_kernel<4>, grid, dim3(4 * 32), smem,
	                          c->stream, cl, a);
	if (rc == 0)
		__atomic_fetch_add(&mq_calls, 1ull, __ATOMIC_RELAXED);
	return mm_run_rest(c, rc, n_seg, seg, in_table, x, ldx, 1);
}

/* One token whose int8 parts xq the norm before left, on mm_multi_mq_kernel: its Q8_0 products 16 rows
 * a block, the other types of the call as mm_multi_kernel would run them, in the same launch; the
 * products it cannot take run after it on their own. ERR_UNSUPPORTED (nothing launched) where no Q8_0
 * product is in the table, the table is shorter than min_table, or the tile does not fit. */
static int mm_run_mq(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x,
                     int64_t ldx, int64_t n_in, const mi8_x *xq, int min_table)
{
	const bool small = n_in <= MM_CHUNK(true);
	const int n_slab = (int)(n_in / 256);
	const int ks = multi_mq_ks();
	if (ks) /* K split over clusters (mm_multi_mqc_kernel): 8 warps unless TANDEM_MULTI_MQ_NW=4 */
		return mm_run_mqc(c, n_seg, seg, x, ldx, n_in, xq, min_table, ks, multi_mq_nw8(true));
	/* TANDEM_MULTI_MQ_NW=8: 8 warps a block (Q8_0 and F32 products only), else 4 */
	const bool nw8 = multi_mq_nw8(false);
	const size_t smem_static = sizeof(float) * (nw8 ? 8 : MM_NW) * MM_PART;
	const int optin = kcuda_smem_optin(c->device);
	if (n_in % 256 || n_slab < 1 || optin <= 0)
		return ERR_UNSUPPORTED;
	/* the Q8_0 chunk: all of K where it fits, else the most slabs that do (sm_120: 99 KB a block) */
	int cs = n_slab < multi_mq_cs() ? n_slab : multi_mq_cs();
	while (cs > 1 && mq_tile_bytes(cs) + smem_static > (size_t)optin)
		cs--;
	if (mq_tile_bytes(cs) + smem_static > (size_t)optin)
		return ERR_UNSUPPORTED;
	const int n_chunk = (n_slab + cs - 1) / cs;
	cs = (n_slab + n_chunk - 1) /
	     n_chunk; /* chunks of even size: 24 slabs in 99 KB as 12 + 12, not 23 + 1 */
	struct mm_multi_args a;
	memset(&a, 0, sizeof(a));
	bool in_table[KCUDA_MM_MULTI_MAX] = {false};
	int n_q8 = 0;
	int64_t n_blk = 0;
	size_t smem = 0;
	for (int i = 0; i < n_seg; i++) {
		const struct kweight *w = seg[i].w;
		int rb, se, sb;
		if (!mm_geom(w->type, MQ_RB, &rb, &se, &sb) || n_in % se || (uintptr_t)w->data % 16 ||
		    w->n_out > INT32_MAX / 2 || (nw8 && w->type != KT_Q8_0 && w->type != KT_F32))
			continue;
		if (nw8 && w->type == KT_F32)
			rb = 1; /* mq_f32_row: one row a block, no tile */
		const int64_t mcs = MM_CHUNK(small) / se, nsl = n_in / se < mcs ? n_in / se : mcs;
		const size_t tb = w->type == KT_Q8_0 ? mq_tile_bytes(cs)
		                  : nw8              ? 0
		                                     : (size_t)rb * (size_t)sb * (size_t)nsl;
		if (tb + smem_static > (size_t)optin)
			continue;
		smem = tb > smem ? tb : smem;
		mm_seg_fill(&a.seg[a.n_seg++], &seg[i], n_blk);
		n_blk += (w->n_out + rb - 1) / rb;
		n_q8 += w->type == KT_Q8_0;
		in_table[i] = true;
	}
	if (!n_q8 || a.n_seg < min_table || n_blk > INT32_MAX)
		return ERR_UNSUPPORTED;
	mq_args_fill(&a, x, ldx, n_in, xq);
	a.mq_cs = cs;
	a.mq_pf = !env_is("TANDEM_MULTI_MQ_PF", "0");
	/* more than the default 48 KB of dynamic shared memory: asked once per instantiation and size */
	/* more than the default 48 KB of dynamic shared memory: set on every call (a per-device attribute;
	 * a process may drive several GPUs from several threads) */
	const void *kern = nw8     ? (const void *)mm_multi_mq8_kernel
	                   : small ? (const void *)mm_multi_mq_kernel<true>
	                           : (const void *)mm_multi_mq_kernel<false>;
	if (smem > 48 * 1024)
		KCUDA_CHECK(
		    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	int rc = nw8 ? klaunch("matmul_multi_mq8", mm_multi_mq8_kernel, dim3((unsigned)n_blk), dim3(8 * 32),
	                       smem, c->stream, a)
	         : small ? klaunch("matmul_multi_mq", mm_multi_mq_kernel<true>, dim3((unsigned)n_blk),
	                           dim3(MM_NW * 32), smem, c->stream, a)
	                 : klaunch("matmul_multi_mq", mm_multi_mq_kernel<false>, dim3((unsigned)n_blk),
	                           dim3(MM_NW * 32), smem, c->stream, a);
	if (rc == 0)
		__atomic_fetch_add(&mq_calls, 1ull, __ATOMIC_RELAXED);
	return mm_run_rest(c, rc, n_seg, seg, in_table, x, ldx, 1);
}

static int mm_run(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x, int64_t ldx,
                  int64_t n_tok, int min_table)
{
	if (!c || !seg || !x)
		return kcuda_bad_arg("matmul_multi", "null context, segment table or x");
	if (n_seg < 1 || n_seg > KCUDA_MM_MULTI_MAX)
		return kcuda_bad_arg("matmul_multi", "%d products (1..%d)", n_seg, KCUDA_MM_MULTI_MAX);
	if (n_tok < 0)
		return kcuda_bad_arg("matmul_multi", "n_tok %lld", (long long)n_tok);
	const int64_t n_in = seg[0].w ? seg[0].w->n_in : 0;
	for (int i = 0; i < n_seg; i++) {
		const struct kweight *w = seg[i].w;
		size_t rb = 0;
		if (!w || !w->data || !seg[i].y)
			return kcuda_bad_arg("matmul_multi", "product %d: null weight, weight data or y", i);
		if (w->n_in != n_in || n_in <= 0 || w->n_out <= 0)
			return kcuda_bad_arg("matmul_multi",
			                     "product %d: weight %lld x %lld (the first has n_in %lld)", i,
			                     (long long)w->n_out, (long long)w->n_in, (long long)n_in);
		if (!ktype_row_bytes(w->type, w->n_in, &rb) || rb != w->row_bytes)
			return kcuda_bad_arg(
			    "matmul_multi",
			    "product %d: %s weight with n_in %lld has row_bytes %zu (want %zu)", i,
			    ktype_name(w->type), (long long)w->n_in, w->row_bytes, rb);
		if (seg[i].ldy < w->n_out)
			return kcuda_bad_arg("matmul_multi", "product %d: ldy %lld < n_out %lld", i,
			                     (long long)seg[i].ldy, (long long)w->n_out);
	}
	if (ldx < n_in)
		return kcuda_bad_arg("matmul_multi", "ldx %lld < n_in %lld", (long long)ldx, (long long)n_in);
	if (n_tok == 0)
		return 0;
	if ((min_table > 1 && (!kcuda_matmul_multi_enabled() || n_tok > multi_max_tok())) || n_tok > 8 ||
	    (uintptr_t)x % 16 || ldx % 4 || n_in > (1 << 30) || ldx > ((int64_t)1 << 40))
		return ERR_UNSUPPORTED;

	if (n_tok >= 2 && !multi_hoist()) { /* TANDEM_MULTI_XM=1: 5..8 tokens of Q8_0 on the int8 mma */
		const int rc = mm_run_xm(c, n_seg, seg, x, ldx, n_tok, n_in);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	/* the products the kernel takes go into its table; the others run on their own after it */
	const bool small = n_in <= MM_CHUNK(true);
	struct mm_multi_args a;
	memset(&a, 0, sizeof(a));
	bool in_table[KCUDA_MM_MULTI_MAX] = {false};
	const bool hx = multi_hoist();
	/* one token whose int8 parts the norm before left (kfuse_add_rmsnorm_parts): its Q8_0 products
	 * read those instead of x (TANDEM_MULTI_XPARTS=0: x itself) */
	const mi8_x *xq = n_tok == 1 && !hx && multi_xparts() ? kcuda_xparts_for(c, x, ldx, n_in, 1) : NULL;
	if (xq && multi_mq(n_in, true)) { /* the int8 tensor-core tiles (mm_multi_mq_kernel) */
		const int rc = mm_run_mq(c, n_seg, seg, x, ldx, n_in, xq, min_table);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	} else if (!xq && n_tok == 1 && !hx && multi_mq(n_in, false) && multi_mq_ks() && multi_mq_x()) {
		/* one token without parts on the cluster tiles, x quantized in the kernel */
		const int rc = mm_run_mqc(c, n_seg, seg, x, ldx, n_in, NULL, min_table, multi_mq_ks(),
		                          multi_mq_nw8(true));
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	int64_t blk4 = 0, blk8 = 0; /* the grid at 4 and at 8 Q8_0 rows a block (where 8 may be taken) */
	for (int i = 0; i < n_seg && n_tok == 1 && small && !hx; i++) {
		int rb, se, sb;
		const struct kweight *w = seg[i].w;
		if (mm_geom(w->type, 4, &rb, &se, &sb) && n_in % se == 0 && (uintptr_t)w->data % 16 == 0 &&
		    w->n_out <= INT32_MAX / 2) {
			const int rb8 = w->type == KT_Q8_0 ? 8 : rb;
			blk4 += (w->n_out + rb - 1) / rb;
			blk8 += (w->n_out + rb8 - 1) / rb8;
		}
	}
	const int q8rb = mm_q8_rows(c, n_tok, small, hx, xq != NULL, blk4, blk8);
	int64_t n_blk = 0;
	size_t smem = 0;
	for (int i = 0; i < n_seg; i++) {
		const struct kweight *w = seg[i].w;
		int rb, se, sb;
		if (!mm_geom(w->type, q8rb, &rb, &se, &sb) || n_in % se || (uintptr_t)w->data % 16 ||
		    w->n_out > INT32_MAX / 2)
			continue;
		const int64_t cs = MM_CHUNK(small) / se, nsl = n_in / se < cs ? n_in / se : cs;
		const size_t tb = (size_t)rb * (size_t)sb * (size_t)nsl;
		if (tb > smem)
			smem = tb;
		mm_seg_fill(&a.seg[a.n_seg++], &seg[i], n_blk);
		n_blk += (w->n_out + rb - 1) / rb;
		in_table[i] = true;
	}
	if (a.n_seg < min_table || n_blk > INT32_MAX) { /* nothing to share: the usual dispatch */
		if (min_table < 2)
			return ERR_UNSUPPORTED;
		for (int i = 0; i < n_seg; i++) {
			const int rc = kcuda_matmul(c, seg[i].w, x, ldx, n_tok, seg[i].y, seg[i].ldy);
			if (rc)
				return rc;
		}
		return 0;
	}
	a.x = x;
	a.ldx = ldx;
	a.n_tok = (int)n_tok;
	a.n_in = (int)n_in;
	a.pf = kcuda_prefetch_enabled();
	a.xq = xq;
	int rc;
	const unsigned g = (unsigned)n_blk;
	if (n_tok == 1 && hx)
		rc = small ? mm_launch<1, true, true>(c, a, g, smem)
		           : mm_launch<1, false, true>(c, a, g, smem);
	else if (n_tok == 1 && a.xq && q8rb == 8) /* q8rb 8: small */
		rc = mm_launch<1, true, false, true, 8>(c, a, g, smem);
	else if (n_tok == 1 && a.xq)
		rc = small ? mm_launch<1, true, false, true>(c, a, g, smem)
		           : mm_launch<1, false, false, true>(c, a, g, smem);
	else if (n_tok == 1 && q8rb == 8)
		rc = mm_launch<1, true, false, false, 8>(c, a, g, smem);
	else if (n_tok == 1)
		rc = small ? mm_launch<1, true>(c, a, g, smem) : mm_launch<1, false>(c, a, g, smem);
	else if (n_tok == 2 && hx)
		rc = small ? mm_launch<2, true, true>(c, a, g, smem)
		           : mm_launch<2, false, true>(c, a, g, smem);
	else if (n_tok == 2)
		rc = small ? mm_launch<2, true>(c, a, g, smem) : mm_launch<2, false>(c, a, g, smem);
	else if (n_tok <= 4)
		rc = small ? mm_launch<4, true>(c, a, g, smem) : mm_launch<4, false>(c, a, g, smem);
	else
		rc = small ? mm_launch<8, true>(c, a, g, smem) : mm_launch<8, false>(c, a, g, smem);
	return mm_run_rest(c, rc, n_seg, seg, in_table, x, ldx, n_tok);
}
