/* Prefill MoE expert FFN on tensor cores, without a host sync and without allocating:
 *   out[i] = sum_j w[i][j] * down_e(SiLU(gate_e x_i) * up_e x_i),  e = ids[i][j].
 * It replaces the per-expert path of moe_ffn.cu for prompts (ids downloaded, a cudaMalloc, then
 * per expert a gather, three dequantize-to-bf16 + cuBLAS products and a scatter: ~8 launches and
 * 4 small GEMMs per active expert, 256 experts per layer).
 *   1. sort (one block): the (token, slot) pairs counted per expert (shared atomics), each
 *      expert's pairs listed contiguously, and a tile table: one entry per 64 pairs of an expert.
 *   2. gate_up (grid: F / 64 row blocks x tiles): a block multiplies its tile's 64 gathered token
 *      rows (x rounded to bf16) by 64 gate and 64 up rows of the tile's expert, dequantized piece
 *      by piece (quant_piece.cuh) into shared memory as bf16, with mma.sync m16n8k16 (fp32
 *      accumulate; sm_80+, so sm_90/100/120); writes h = SiLU(g) * u as bf16 in sorted order.
 *   3. down (grid: D / 64 x tiles): h rows by 64 down rows of the expert, the same way; writes
 *      y[pair] in fp32.
 *   4. combine: out[i] = sum_j w[i][j] y[i k + j] in slot order (deterministic; NaN for a pair
 *      whose expert id was out of range, which the sort also counts in the context's error count).
 * The rounding is that of the old path (x and h rounded to bf16, weights exact in bf16 for the
 * <= 8-bit quants, fp32 sums), so the result matches the CPU to bf16 level.
 * Workspace (the context's): [meta][h: pairs x F bf16][y: pairs x D fp32]; prompts whose pairs do
 * not fit run in token chunks. Each weight row is read once per 64 pairs of its expert. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/moe_prefill.h"
#include "kernels/cuda/prof.h"
#include "kernels/cuda/quant_piece.cuh"

#define MP_BM 64 /* pairs per tile (rows of A) */
#define MP_BN 64 /* weight rows per block */
#define MP_BK 64 /* K per shared-memory stage */
#define MP_LDS (MP_BK + 8) /* row stride in bf16: the fragment loads hit 32 distinct banks */
#define MP_THREADS 128
#define MP_MAX_E 4096 /* the sort block keeps 2 E counters in shared memory */
#define MP_MIN_CHUNK 32 /* tokens; below this the workspace is too small to be worth it */

__device__ __forceinline__ void mp_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
	             "{%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t mp_pack(float lo, float hi)
{
	__nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
	return *(uint32_t *)&b;
}

/* meta = [n_tiles][off: E + 1][list: np][tile_e: max_tiles][tile_r0: max_tiles] */
struct mp_view {
	const int32_t *off, *list, *te, *tr;
};
__device__ __forceinline__ mp_view mp_meta(const int32_t *meta, int E, int np, int max_tiles)
{
	mp_view v;
	v.off = meta + 1;
	v.list = v.off + E + 1;
	v.te = v.list + np;
	v.tr = v.te + max_tiles;
	return v;
}

/* One launch's table of tiles (the routed experts', or the shared expert's: E 1, k 1); the gate / up
 * and down kernels take two, the blocks past the first's max_tiles running the second's tiles */
struct mp_tab {
	const uint8_t *wg, *wu; /* gate / up rows (down: wg = the down rows) */
	size_t row_bytes;
	int F; /* rows an expert of gate / up; down: its n_in */
	int k; /* pairs a token (token = pair / k) */
	const int32_t *meta; /* NULL: no table */
	int E, np, max_tiles;
	uint16_t *h; /* gate / up: out; down: in */
	float *y; /* down: out, rows ldy floats apart */
	int64_t ldy;
};

__global__ void mp_sort_kernel(const int32_t *__restrict__ ids, int np, int E, int max_tiles,
                               int32_t *__restrict__ meta, unsigned *err, int n_s, int max_tiles_s,
                               int32_t *__restrict__ meta_s)
{
	KDEP_ENTRY();
	if (meta_s) { /* the shared expert's table (E 1, k 1): token i is pair i, tiles of 64 in order */
		const int nt = (n_s + MP_BM - 1) / MP_BM;
		int32_t *off = meta_s + 1, *list = off + 2, *te = list + n_s, *tr = te + max_tiles_s;
		if (threadIdx.x == 0)
			meta_s[0] = nt, off[0] = 0, off[1] = n_s;
		for (int i = threadIdx.x; i < n_s; i += blockDim.x)
			list[i] = i;
		for (int t = threadIdx.x; t < nt; t += blockDim.x)
			te[t] = 0, tr[t] = t * MP_BM;
	}
	extern __shared__ int mp_s[]; /* [E] counts, then [E] cursors */
	int *cnt = mp_s, *cur = mp_s + E;
	int32_t *off = meta + 1, *list = off + E + 1, *te = list + np, *tr = te + max_tiles;
	for (int e = threadIdx.x; e < E; e += blockDim.x)
		cnt[e] = 0;
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = ids[i];
		if (e >= 0 && e < E)
			atomicAdd(&cnt[e], 1);
		else
			atomicAdd(err, 1u);
	}
	__syncthreads();
	if (threadIdx.x == 0) { /* serial: E + np / 64 steps, a few microseconds */
		int s = 0, nt = 0;
		for (int e = 0; e < E; e++) {
			off[e] = s;
			cur[e] = s;
			for (int r = 0; r < cnt[e]; r += MP_BM) { /* nt <= np / 64 + E = max_tiles */
				te[nt] = e;
				tr[nt] = s + r;
				nt++;
			}
			s += cnt[e];
		}
		off[E] = s;
		meta[0] = nt;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < np; i += blockDim.x) {
		const int e = ids[i];
		if (e >= 0 && e < E)
			list[atomicAdd(&cur[e], 1)] = i;
	}
}

/* 16 values -> 16 bf16 at dst (two 16-byte stores) */
__device__ __forceinline__ void mp_store16(const float *v, uint16_t *dst)
{
	uint4 *d = (uint4 *)dst;
	d[0] = make_uint4(mp_pack(v[0], v[1]), mp_pack(v[2], v[3]), mp_pack(v[4], v[5]), mp_pack(v[6], v[7]));
	d[1] = make_uint4(mp_pack(v[8], v[9]), mp_pack(v[10], v[11]), mp_pack(v[12], v[13]),
	                  mp_pack(v[14], v[15]));
}

/* 16 dequantized values of piece p of `row` (zeros outside the matrix) -> 16 bf16 at dst */
template <int T>
__device__ __forceinline__ void mp_piece_to_smem(const uint8_t *row, int64_t p, bool in, uint16_t *dst)
{
	float v[16];
	if (in)
		kq_values<T>(row, p, v);
	else
#pragma unroll
		for (int i = 0; i < 16; i++)
			v[i] = 0.0f;
	mp_store16(v, dst);
}

/* A fragments of the 64-row tile at column kk, B fragments and the products (one warp) */
__device__ __forceinline__ void mp_load_a(const uint16_t *sA, int kk, int g, int t, uint32_t a[4][4])
{
#pragma unroll
	for (int mi = 0; mi < 4; mi++) {
		const uint16_t *p = sA + (mi * 16 + g) * MP_LDS + kk + 2 * t;
		a[mi][0] = *(const uint32_t *)p;
		a[mi][1] = *(const uint32_t *)(p + 8 * MP_LDS);
		a[mi][2] = *(const uint32_t *)(p + 8);
		a[mi][3] = *(const uint32_t *)(p + 8 * MP_LDS + 8);
	}
}

/* A gate / up warp's outputs: h[r0 + row][c0 + col] = SiLU(g) * u (kcpu_swiglu's formula) as bf16
 * pairs, for the tile's rows < rows and columns c0 .. c0 + 15 (c0: the warp's first) below F */
__device__ __forceinline__ void mp_gu_store(const float (&acc)[2][4][2][4], int c0, int F, int rows, int r0,
                                            int g, int t, uint16_t *__restrict__ h)
{
#pragma unroll
	for (int mi = 0; mi < 4; mi++)
#pragma unroll
		for (int nj = 0; nj < 2; nj++) {
			const int col = c0 + nj * 8 + 2 * t; /* F % 16 == 0: col + 1 < F too */
			if (col >= F)
				continue;
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int row = mi * 16 + g + 8 * hf;
				if (row >= rows)
					continue;
				const float g0 = acc[0][mi][nj][2 * hf], g1 = acc[0][mi][nj][2 * hf + 1];
				const float u0 = acc[1][mi][nj][2 * hf], u1 = acc[1][mi][nj][2 * hf + 1];
				const float h0 = g0 / (1.0f + expf(-g0)) * u0,
				            h1 = g1 / (1.0f + expf(-g1)) * u1;
				*(uint32_t *)(h + (int64_t)(r0 + row) * F + col) = mp_pack(h0, h1);
			}
		}
}

/* x rounded to bf16 once per chunk (xb: [n][D], row stride D): the gate / up blocks then gather 2
 * bytes a value instead of 4, and the rounding (RN, as mp_pack) is the same, so their A tiles are the
 * same bits as the fp32-gathering kernel's. Grid (ceil(D / 2048), n), 256 threads, 8 values each. */
__global__ void mp_xcvt_kernel(const float *__restrict__ x, int64_t ldx, bool x_vec, int D,
                               uint16_t *__restrict__ xb)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
	if (c >= D) /* D % 16 == 0: a thread's 8 values are all in or all out */
		return;
	const float *xr = x + i * ldx + c;
	float v[8];
	if (x_vec) {
		const float4 a = *(const float4 *)xr, b = *(const float4 *)(xr + 4);
		v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
		v[7] = b.w;
	} else {
#pragma unroll
		for (int j = 0; j < 8; j++)
			v[j] = xr[j];
	}
	*(uint4 *)(xb + i * D + c) =
	    make_uint4(mp_pack(v[0], v[1]), mp_pack(v[2], v[3]), mp_pack(v[4], v[5]), mp_pack(v[6], v[7]));
}

/* Blocks a gate / up kernel of NW warps may have resident an SM. 4 warps: 3 (168 registers) where a
 * piece's raw bytes are at most 32 (Q4_K: no spills), 2 for the wider raw pieces (Q3_K, Q5_K, Q6_K, F32
 * spilled at 3); 8 warps: 2 and 1 */
template <int T, int NW> constexpr int mp_gu2_min_blocks()
{
	return sizeof(typename kq<T>::raw) <= 32 ? (NW == 4 ? 3 : 2) : (NW == 4 ? 2 : 1);
}

/* gate / up from xb (bf16 x, mp_xcvt_kernel) with NW warps: a block owns BN = 16 NW gate rows and the
 * same up rows of its tile's expert (NW 8: 128 + 128, so each gathered x row serves twice the weight
 * rows of the 4-warp kernel and is read half as often). Warp w computes columns 16 w .. 16 w + 15 of
 * gate and of up for the tile's 64 pairs, with the same fragments, products and K order for either NW:
 * h is bit-identical (test_ops_prefill_moe checks). A thread loads 2 (NW 8)
 * or 4 (NW 4) 16-byte pieces of the A tile and 4 weight pieces a 64-wide K step, one step ahead. */
template <int T, int NW>
__global__ void __launch_bounds__(32 * NW, (mp_gu2_min_blocks<T, NW>()))
    mp_gate_up2_kernel(const mp_tab ta, const mp_tab tb, int D, const uint16_t *__restrict__ xb)
{
	constexpr int NT = 32 * NW, BN = 16 * NW, AP = MP_BM * MP_BK / 8 / NT; /* 16-byte A pieces a thread */
	static_assert(AP * NT * 8 == MP_BM * MP_BK, "the A tile splits evenly over the threads");
	KDEP_ENTRY();
	__shared__ __align__(16) uint16_t sA[MP_BM * MP_LDS];
	__shared__ __align__(16) uint16_t sB[2 * BN * MP_LDS]; /* gate rows, then up rows */
	__shared__ int s_tok[MP_BM];
	const bool second = (int)blockIdx.y >= ta.max_tiles;
	const int tile = second ? (int)blockIdx.y - ta.max_tiles : (int)blockIdx.y;
	const uint8_t *__restrict__ wg = second ? tb.wg : ta.wg, *__restrict__ wu = second ? tb.wu : ta.wu;
	const size_t row_bytes = second ? tb.row_bytes : ta.row_bytes;
	const int F = second ? tb.F : ta.F, k = second ? tb.k : ta.k;
	const int32_t *__restrict__ meta = second ? tb.meta : ta.meta;
	uint16_t *__restrict__ h = second ? tb.h : ta.h;
	const int f0 = blockIdx.x * BN;
	if (f0 >= F || tile >= meta[0]) /* (the grid covers the wider table's rows) */
		return;
	const mp_view m =
	    second ? mp_meta(meta, tb.E, tb.np, tb.max_tiles) : mp_meta(meta, ta.E, ta.np, ta.max_tiles);
	const int e = m.te[tile], r0 = m.tr[tile], rows = min(MP_BM, m.off[e + 1] - r0);
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	if (tid < MP_BM)
		s_tok[tid] = tid < rows ? m.list[r0 + tid] / k : -1;
	const size_t ebase = (size_t)e * (size_t)F;
	const int np16 = D / 16;
	float acc[2][4][2][4];
#pragma unroll
	for (int a = 0; a < 2; a++)
#pragma unroll
		for (int b = 0; b < 4; b++)
#pragma unroll
			for (int c = 0; c < 2; c++)
#pragma unroll
				for (int d = 0; d < 4; d++)
					acc[a][b][c][d] = 0.0f;
	__syncthreads(); /* s_tok */

	uint4 xa[AP];
	typename kq<T>::raw rw[4];
	bool rin[4];
	auto load_step = [&](int k0) {
#pragma unroll
		for (int i = 0; i < AP; i++) {
			const int q = tid + NT * i, row = q >> 3, col = k0 + (q & 7) * 8;
			const int tok = s_tok[row];
			xa[i] = tok >= 0 && col < D ? *(const uint4 *)(xb + (int64_t)tok * D + col)
			                            : make_uint4(0u, 0u, 0u, 0u);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int q = tid + NT * i, row = q >> 2, pp = q & 3;
			const int f = f0 + (row & (BN - 1));
			const int64_t p = k0 / 16 + pp;
			rin[i] = f < F && p < np16;
			if (rin[i])
				kq<T>::load((row < BN ? wg : wu) + (ebase + (size_t)f) * row_bytes, p, rw[i]);
		}
	};
	auto store_step = [&](int k0) {
#pragma unroll
		for (int i = 0; i < AP; i++) {
			const int q = tid + NT * i;
			*(uint4 *)(sA + (q >> 3) * MP_LDS + (q & 7) * 8) = xa[i];
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int q = tid + NT * i, row = q >> 2, pp = q & 3;
			float v[16];
			if (rin[i])
				kq_values_raw<T>(rw[i], k0 / 16 + pp, v);
			else
#pragma unroll
				for (int j = 0; j < 16; j++)
					v[j] = 0.0f;
			mp_store16(v, sB + row * MP_LDS + pp * 16);
		}
	};

	load_step(0);
	for (int k0 = 0; k0 < D; k0 += MP_BK) {
		store_step(k0);
		__syncthreads();
		if (k0 + MP_BK < D)
			load_step(k0 + MP_BK);
#pragma unroll
		for (int kk = 0; kk < MP_BK; kk += 16) {
			uint32_t a[4][4];
			mp_load_a(sA, kk, g, t, a);
#pragma unroll
			for (int gu = 0; gu < 2; gu++)
#pragma unroll
				for (int nj = 0; nj < 2; nj++) {
					const uint16_t *qb =
					    sB + (gu * BN + warp * 16 + nj * 8 + g) * MP_LDS + kk + 2 * t;
					const uint32_t b0 = *(const uint32_t *)qb,
					               b1 = *(const uint32_t *)(qb + 8);
#pragma unroll
					for (int mi = 0; mi < 4; mi++)
						mp_mma(acc[gu][mi][nj], a[mi], b0, b1);
				}
		}
		__syncthreads();
	}
	mp_gu_store(acc, f0 + warp * 16, F, rows, r0, g, t, h);
}

/* down with NW warps: a block owns BN = 16 NW rows of the expert's down matrix (NW 8: 128, so each h
 * tile is read half as often as with 4 warps); warp w computes columns 16 w .. 16 w + 15 with the
 * same fragments, products and K order for any NW (the same bits) */
template <int T, int NW>
__global__ void __launch_bounds__(32 * NW) mp_down_kernel(const mp_tab ta, const mp_tab tb, int D)
{
	constexpr int NT = 32 * NW, BN = 16 * NW, AP = MP_BM * MP_BK / 8 / NT; /* 16-byte A pieces a thread */
	constexpr int BP = BN * (MP_BK / 16) / NT; /* weight pieces a thread: 2 */
	static_assert(AP * NT * 8 == MP_BM * MP_BK && BP * NT * 16 == BN * MP_BK, "even split");
	KDEP_ENTRY();
	__shared__ __align__(16) uint16_t sA[MP_BM * MP_LDS];
	__shared__ __align__(16) uint16_t sB[BN * MP_LDS];
	const bool second = (int)blockIdx.y >= ta.max_tiles;
	const int tile = second ? (int)blockIdx.y - ta.max_tiles : (int)blockIdx.y;
	const uint8_t *__restrict__ wd = second ? tb.wg : ta.wg;
	const size_t row_bytes = second ? tb.row_bytes : ta.row_bytes;
	const int F = second ? tb.F : ta.F;
	const int32_t *__restrict__ meta = second ? tb.meta : ta.meta;
	const uint16_t *__restrict__ h = second ? tb.h : ta.h;
	float *__restrict__ y = second ? tb.y : ta.y;
	const int64_t ldy = second ? tb.ldy : ta.ldy;
	if (tile >= meta[0])
		return;
	const mp_view m =
	    second ? mp_meta(meta, tb.E, tb.np, tb.max_tiles) : mp_meta(meta, ta.E, ta.np, ta.max_tiles);
	const int e = m.te[tile], r0 = m.tr[tile], rows = min(MP_BM, m.off[e + 1] - r0);
	const int d0 = blockIdx.x * BN;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	const size_t ebase = (size_t)e * (size_t)D;
	const int np16 = F / 16;
	float acc[4][2][4];
#pragma unroll
	for (int b = 0; b < 4; b++)
#pragma unroll
		for (int c = 0; c < 2; c++)
#pragma unroll
			for (int d = 0; d < 4; d++)
				acc[b][c][d] = 0.0f;

	for (int k0 = 0; k0 < F; k0 += MP_BK) {
		/* A: 16-byte pieces of h rows (rows are F * 2 bytes, F % 16 == 0: 16-byte aligned) */
#pragma unroll
		for (int i = 0; i < AP; i++) {
			const int q = tid + NT * i, row = q >> 3, col = k0 + (q & 7) * 8;
			*(uint4 *)(sA + row * MP_LDS + (q & 7) * 8) =
			    row < rows && col < F ? *(const uint4 *)(h + (int64_t)(r0 + row) * F + col)
			                          : make_uint4(0u, 0u, 0u, 0u);
		}
		/* B: BN rows x 4 pieces */
#pragma unroll
		for (int i = 0; i < BP; i++) {
			const int q = tid + NT * i, row = q >> 2, pp = q & 3;
			const int d = d0 + row;
			const int64_t p = k0 / 16 + pp;
			const bool in = d < D && p < np16;
			mp_piece_to_smem<T>(wd + (ebase + (size_t)(in ? d : 0)) * row_bytes, p, in,
			                    sB + row * MP_LDS + pp * 16);
		}
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < MP_BK; kk += 16) {
			uint32_t a[4][4];
			mp_load_a(sA, kk, g, t, a);
#pragma unroll
			for (int nj = 0; nj < 2; nj++) {
				const uint16_t *qb = sB + (warp * 16 + nj * 8 + g) * MP_LDS + kk + 2 * t;
				const uint32_t b0 = *(const uint32_t *)qb, b1 = *(const uint32_t *)(qb + 8);
#pragma unroll
				for (int mi = 0; mi < 4; mi++)
					mp_mma(acc[mi][nj], a[mi], b0, b1);
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int mi = 0; mi < 4; mi++)
#pragma unroll
		for (int nj = 0; nj < 2; nj++) {
			const int col = d0 + warp * 16 + nj * 8 + 2 * t; /* D % 16 == 0 */
			if (col >= D)
				continue;
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int row = mi * 16 + g + 8 * hf;
				if (row >= rows)
					continue;
				const int64_t pair = m.list[r0 + row];
				float *yp = y + pair * ldy + col;
				if (((uintptr_t)yp & 7) == 0) {
					*(float2 *)yp =
					    make_float2(acc[mi][nj][2 * hf], acc[mi][nj][2 * hf + 1]);
				} else { /* out with an odd row stride (the shared expert's y) */
					yp[0] = acc[mi][nj][2 * hf];
					yp[1] = acc[mi][nj][2 * hf + 1];
				}
			}
		}
}

/* out[i] = sum_j w[i][j] y[i k + j] in slot order; NaN where the expert id was out of range. sh: out
 * holds the shared expert's output on entry, added last (forward.c's order: routed, then + shared) */
__global__ void mp_combine_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                  const int32_t *__restrict__ ids, int E, int k, int64_t D,
                                  float *__restrict__ out, int64_t ldo, bool sh)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (d >= D)
		return;
	float s = 0.0f;
	for (int j = 0; j < k; j++) {
		const int32_t e = ids[i * k + j];
		s = e >= 0 && e < E ? fmaf(w[i * k + j], y[(i * k + j) * D + d], s) : NAN;
	}
	out[i * ldo + d] = sh ? s + out[i * ldo + d] : s;
}

/* mp_combine_kernel four columns a thread (float4: D % 4 == 0, out rows 16-byte aligned), the same
 * arithmetic per value; a token's slots read 8 at a time before they are summed, so 128 bytes of y a
 * thread are in flight (the scalar kernel moved ~2 TB/s: H200, session 16) */
__global__ void mp_combine4_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                   const int32_t *__restrict__ ids, int E, int k, int64_t D,
                                   float *__restrict__ out, int64_t ldo, bool sh)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.y;
	const int64_t d = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
	if (d >= D)
		return;
	float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
	for (int j0 = 0; j0 < k; j0 += 8) {
		float4 v[8];
#pragma unroll
		for (int j = 0; j < 8; j++)
			if (j0 + j < k)
				v[j] = *(const float4 *)(y + (i * k + j0 + j) * D + d);
#pragma unroll
		for (int j = 0; j < 8; j++) {
			if (j0 + j >= k)
				break;
			const int32_t e = ids[i * k + j0 + j];
			const float wj = w[i * k + j0 + j];
			if (e >= 0 && e < E) {
				s.x = fmaf(wj, v[j].x, s.x);
				s.y = fmaf(wj, v[j].y, s.y);
				s.z = fmaf(wj, v[j].z, s.z);
				s.w = fmaf(wj, v[j].w, s.w);
			} else {
				s = make_float4(NAN, NAN, NAN, NAN);
			}
		}
	}
	float4 *o = (float4 *)(out + i * ldo + d);
	if (sh) {
		const float4 a = *o;
		s = make_float4(s.x + a.x, s.y + a.y, s.z + a.z, s.w + a.w);
	}
	*o = s;
}

template <int T, int NW>
static int mp_gate_up2_t(struct kcuda_ctx *c, dim3 grid, const mp_tab &ta, const mp_tab &tb, int D,
                         const uint16_t *xb)
{
	return klaunch("moe_prefill_gate_up2", mp_gate_up2_kernel<T, NW>, dim3(grid), dim3(32 * NW), 0,
	               c->stream, ta, tb, D, xb);
}

template <int T, int NW>
static int mp_down_t(struct kcuda_ctx *c, dim3 grid, const mp_tab &ta, const mp_tab &tb, int D)
{
	return klaunch("moe_prefill_down", mp_down_kernel<T, NW>, dim3(grid), dim3(32 * NW), 0, c->stream, ta,
	               tb, D);
}

static size_t mp_align(size_t b)
{
	return (b + 255) & ~(size_t)255;
}

static int64_t mp_max_tiles(int64_t np, int64_t E)
{
	return np / MP_BM + E;
}

/* The shared expert riding in the prefill launches (NULL gate: none): F rows of gate / up, D rows of
 * down with n_in F */
struct mp_shared {
	const struct kweight *gate, *up, *down;
	int64_t F;
};

static size_t mp_meta_bytes(int64_t np, int64_t E)
{
	return mp_align((size_t)(1 + E + 1 + np + 2 * mp_max_tiles(np, E)) * 4);
}

/* workspace of n tokens: [meta][xb: n x D bf16][h: pairs x F bf16][y: pairs x D fp32], and with the
 * shared expert (Fs > 0) [meta_s][h_s: n x Fs bf16] before y; its y goes straight to out */
static size_t mp_ws_bytes(int64_t n, int k, int64_t E, int64_t F, int64_t D, int64_t Fs)
{
	const int64_t np = n * k;
	return mp_meta_bytes(np, E) + mp_align((size_t)n * (size_t)D * 2) +
	       mp_align((size_t)np * (size_t)F * 2) +
	       (Fs > 0 ? mp_meta_bytes(n, 1) + mp_align((size_t)n * (size_t)Fs * 2) : 0) +
	       (size_t)np * (size_t)D * sizeof(float);
}

extern "C" size_t kcuda_moe_prefill_ws(int64_t n, int k, int64_t E, int64_t F, int64_t D, int64_t Fs)
{
	if (n <= 0 || k <= 0 || E <= 0 || F <= 0 || D <= 0 || Fs < 0)
		return 0;
	return mp_ws_bytes(n, k, E, F, D, Fs);
}

static void mp_stage_begin(const char *name, const struct kweight *w, double rows)
{
	if (kprof_active)
		kprof_push(kprof_active, name, w ? ktype_name(w->type) : NULL,
		           w ? rows * (double)w->row_bytes : 0.0);
}
static void mp_stage_end(void)
{
	if (kprof_active)
		kprof_pop(kprof_active);
}

static bool mp_type_ok(int type)
{
	switch (type) {
#define X(T) case T:
		KCUDA_FOR_EACH_TYPE(X)
#undef X
		return true;
	default: return false;
	}
}

extern "C" int kcuda_moe_prefill_on(void)
{
	const char *a = getenv("TANDEM_PREFILL_FAST"), *b = getenv("TANDEM_MOE_PREFILL");
	return !(a && strcmp(a, "0") == 0) && !(b && strcmp(b, "0") == 0);
}

extern "C" int kcuda_moe_prefill_min(void)
{
	if (!kcuda_moe_prefill_on())
		return INT32_MAX;
	const char *v = getenv("TANDEM_MOE_MMA_MIN");
	const long n = v && *v ? strtol(v, NULL, 10) : 257;
	return n < 1 ? 1 : n > 257 ? 257 : (int)n;
}

/* TANDEM_MOE_PREFILL_GU (read on every call: once a layer at prefill): the gate / up kernel. 4
 * (default): 4 warps, 64 + 64 rows a block; 8: 8 warps, 128 + 128 rows (x read half as often, but 128
 * registers with spills at 2 blocks an SM). The same bits. H200, 2026-12-02, GLM-5 rank 0 of TP=8, 8k
 * prefill: the kernel before (fp32 x gathered by every block, removed) 1.80 s, 8 1.81 s, 4 1.69 s
 * (docs/PERFORMANCE.md, session 16). */
static int mp_gu_variant(void)
{
	const char *e = getenv("TANDEM_MOE_PREFILL_GU");
	return e && strcmp(e, "8") == 0 ? 8 : 4;
}

/* TANDEM_MOE_PREFILL_DOWN=4 (read on every call): the down kernel with 4 warps and 64 rows a block
 * (before 2026-12-02); default 8 warps, 128 rows. The same bits. */
static int mp_down_warps(void)
{
	const char *e = getenv("TANDEM_MOE_PREFILL_DOWN");
	return e && strcmp(e, "4") == 0 ? 4 : 8;
}

/* gate / up of table ta (and tb's tiles in the same launch when tb.meta; both tables of this type)
 * into their h, from xb (bf16 x) */
static int mp_gate_up_launch(struct kcuda_ctx *c, int gu, int type, const mp_tab &ta, const mp_tab &tb,
                             int64_t D, const uint16_t *xb)
{
	int rc = ERR_UNSUPPORTED;
	const int bn = gu == 8 ? 128 : MP_BN, F = tb.meta && tb.F > ta.F ? tb.F : ta.F;
	dim3 grid((unsigned)((F + bn - 1) / bn), (unsigned)(ta.max_tiles + (tb.meta ? tb.max_tiles : 0)));
	switch (type) {
#define X(T)                                                                                                 \
	case T:                                                                                              \
		rc = gu == 8 ? mp_gate_up2_t<T, 8>(c, grid, ta, tb, (int)D, xb)                              \
		             : mp_gate_up2_t<T, 4>(c, grid, ta, tb, (int)D, xb);                             \
		break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	return rc;
}

/* down of table ta (and tb's tiles in the same launch when tb.meta; both tables of this type):
 * y[pair] (rows ldy apart) = h[pair] times the expert's down rows */
static int mp_down_launch(struct kcuda_ctx *c, int type, const mp_tab &ta, const mp_tab &tb, int64_t D)
{
	int rc = ERR_UNSUPPORTED;
	const int dn = mp_down_warps(), bn = 16 * dn;
	dim3 grid((unsigned)((D + bn - 1) / bn), (unsigned)(ta.max_tiles + (tb.meta ? tb.max_tiles : 0)));
	switch (type) {
#define X(T)                                                                                                 \
	case T:                                                                                              \
		rc = dn == 8 ? mp_down_t<T, 8>(c, grid, ta, tb, (int)D)                                      \
		             : mp_down_t<T, 4>(c, grid, ta, tb, (int)D);                                     \
		break;
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: break;
	}
	return rc;
}

static int mp_chunk(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                    const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                    const struct kweight *down, int64_t E, int64_t F, const struct mp_shared *sh, float *out,
                    int64_t ldo)
{
	const int64_t D = gate->n_in, np = n * k, max_tiles = mp_max_tiles(np, E);
	const int64_t Fs = sh ? sh->F : 0, max_tiles_s = sh ? mp_max_tiles(n, 1) : 0;
	char *p = (char *)c->ws;
	int32_t *meta = (int32_t *)p;
	p += mp_meta_bytes(np, E);
	uint16_t *xb = (uint16_t *)p;
	p += mp_align((size_t)n * (size_t)D * 2);
	uint16_t *h = (uint16_t *)p;
	p += mp_align((size_t)np * (size_t)F * 2);
	int32_t *meta_s = sh ? (int32_t *)p : NULL;
	p += sh ? mp_meta_bytes(n, 1) : 0;
	uint16_t *h_s = (uint16_t *)p;
	p += sh ? mp_align((size_t)n * (size_t)Fs * 2) : 0;
	float *y = (float *)p;
	const int gu = mp_gu_variant();
	const bool x_vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
	int rc;

	/* expert rows that tiles can touch: at most min(E, pairs) experts */
	const double ex = (double)(np < E ? np : E);
	mp_stage_begin("moe.experts/sort(prefill)", NULL, 0);
	rc = klaunch("moe_prefill_sort", mp_sort_kernel, dim3(1), dim3(1024), 2 * (size_t)E * sizeof(int),
	             c->stream, ids, (int)np, (int)E, (int)max_tiles, meta, c->err_dev, (int)n,
	             (int)max_tiles_s, meta_s);
	mp_stage_end();
	if (rc)
		return rc;

	{
		mp_stage_begin("moe.experts/x_bf16(prefill)", NULL, 0);
		rc = klaunch("moe_prefill_xcvt", mp_xcvt_kernel,
		             dim3((unsigned)((D + 2047) / 2048), (unsigned)n), dim3(256), 0, c->stream, x,
		             ldx, x_vec, (int)D, xb);
		mp_stage_end();
		if (rc)
			return rc;
	}

	/* the tables: the routed experts' and (with a shared expert) its own; the shared expert's tiles
	 * ride in the routed launches where the types agree, so
	 * its n / 64 tiles fill the GPU beside the routed ones instead of running as a small grid after
	 * them; its y goes straight to out, which the combine then adds the routed sum to */
	const mp_tab none = {};
	const mp_tab ta = {(const uint8_t *)gate->data,
	                   (const uint8_t *)up->data,
	                   gate->row_bytes,
	                   (int)F,
	                   k,
	                   meta,
	                   (int)E,
	                   (int)np,
	                   (int)max_tiles,
	                   h,
	                   NULL,
	                   0};
	const mp_tab tad = {(const uint8_t *)down->data,
	                    NULL,
	                    down->row_bytes,
	                    (int)F,
	                    k,
	                    meta,
	                    (int)E,
	                    (int)np,
	                    (int)max_tiles,
	                    h,
	                    y,
	                    D};
	mp_tab tb = none, tbd = none;
	if (sh) {
		tb = {(const uint8_t *)sh->gate->data,
		      (const uint8_t *)sh->up->data,
		      sh->gate->row_bytes,
		      (int)Fs,
		      1,
		      meta_s,
		      1,
		      (int)n,
		      (int)max_tiles_s,
		      h_s,
		      NULL,
		      0};
		tbd = {(const uint8_t *)sh->down->data,
		       NULL,
		       sh->down->row_bytes,
		       (int)Fs,
		       1,
		       meta_s,
		       1,
		       (int)n,
		       (int)max_tiles_s,
		       h_s,
		       out,
		       ldo};
	}
	const bool gu_one = sh && sh->gate->type == gate->type, dn_one = sh && sh->down->type == down->type;

	mp_stage_begin("moe.experts/gate_up(prefill mma)", gate, 2.0 * (ex + (gu_one ? 1 : 0)) * (double)F);
	rc = mp_gate_up_launch(c, gu, gate->type, ta, gu_one ? tb : none, D, xb);
	mp_stage_end();
	if (rc)
		return rc;
	if (sh && !gu_one) {
		mp_stage_begin("moe.experts/shared gate_up(prefill mma)", sh->gate, 2.0 * (double)Fs);
		rc = mp_gate_up_launch(c, gu, sh->gate->type, tb, none, D, xb);
		mp_stage_end();
		if (rc)
			return rc;
	}

	mp_stage_begin("moe.experts/down(prefill mma)", down, (ex + (dn_one ? 1 : 0)) * (double)D);
	rc = mp_down_launch(c, down->type, tad, dn_one ? tbd : none, D);
	mp_stage_end();
	if (rc)
		return rc;
	if (sh && !dn_one) {
		mp_stage_begin("moe.experts/shared down(prefill mma)", sh->down, (double)D);
		rc = mp_down_launch(c, sh->down->type, tbd, none, D);
		mp_stage_end();
		if (rc)
			return rc;
	}

	mp_stage_begin("moe.experts/combine(prefill)", NULL, 0);
	const char *cv = getenv("TANDEM_MOE_PREFILL_COMBINE"); /* 1: the scalar kernel */
	if (D % 4 == 0 && ldo % 4 == 0 && (uintptr_t)out % 16 == 0 && !(cv && strcmp(cv, "1") == 0)) {
		dim3 g3((unsigned)((D / 4 + 127) / 128), (unsigned)n);
		rc = klaunch("moe_prefill_combine4", mp_combine4_kernel, dim3(g3), dim3(128), 0, c->stream, y,
		             weights, ids, (int)E, k, D, out, ldo, sh != NULL);
	} else {
		dim3 g3((unsigned)((D + 255) / 256), (unsigned)n);
		rc = klaunch("moe_prefill_combine", mp_combine_kernel, dim3(g3), dim3(256), 0, c->stream, y,
		             weights, ids, (int)E, k, D, out, ldo, sh != NULL);
	}
	mp_stage_end();
	return rc;
}

/* the piece decoders need n_in % 16; float rows also 16-byte rows and bases */
static bool mp_weight_ok(const struct kweight *w)
{
	const bool is_float = w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16;
	return mp_type_ok(w->type) && w->n_in % 16 == 0 &&
	       (!is_float || (w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0));
}

/* the shared expert's shapes as this path takes them (else the caller runs it apart) */
static bool mp_shared_ok(const struct kweight *sg, const struct kweight *su, const struct kweight *sd,
                         int64_t D)
{
	size_t rb;
	if (!sg || !su || !sd || !sg->data || !su->data || !sd->data)
		return false;
	const int64_t Fs = sg->n_out;
	return sg->type == su->type && sg->n_in == D && su->n_in == D && su->n_out == Fs && sd->n_in == Fs &&
	       sd->n_out == D && Fs > 0 && Fs % 16 == 0 && Fs <= INT32_MAX / 2 &&
	       ktype_row_bytes(sg->type, D, &rb) && rb == sg->row_bytes && rb == su->row_bytes &&
	       ktype_row_bytes(sd->type, Fs, &rb) && rb == sd->row_bytes && mp_weight_ok(sg) &&
	       mp_weight_ok(su) && mp_weight_ok(sd);
}

extern "C" int kcuda_moe_prefill(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n,
                                 const int32_t *ids, const float *weights, int k, const struct kweight *gate,
                                 const struct kweight *up, const struct kweight *down, int64_t E, int64_t F,
                                 const struct kweight *sh_gate, const struct kweight *sh_up,
                                 const struct kweight *sh_down, float *out, int64_t ldo)
{
	const int64_t D = gate->n_in;
	if (n <= 0)
		return n == 0 ? 0 : ERR_UNSUPPORTED;
	if (!mp_weight_ok(gate) || !mp_weight_ok(up) || !mp_weight_ok(down) || D % 16 || F % 16 ||
	    E > MP_MAX_E || D > INT32_MAX / 2 || F > INT32_MAX / 2 || k > 64)
		return ERR_UNSUPPORTED;
	struct mp_shared shs = {sh_gate, sh_up, sh_down, sh_gate ? sh_gate->n_out : 0};
	const struct mp_shared *sh = NULL;
	if (sh_gate || sh_up || sh_down) {
		if (!mp_shared_ok(sh_gate, sh_up, sh_down, D))
			return ERR_UNSUPPORTED;
		sh = &shs;
	}
	/* tokens per chunk: the workspace holds the chunk's pairs; the grid's y holds its tiles */
	int64_t nc = n;
	while (nc >= MP_MIN_CHUNK &&
	       (mp_ws_bytes(nc, k, E, F, D, shs.F * (sh != NULL)) > c->ws_bytes ||
	        mp_max_tiles(nc * k, E) + (sh ? mp_max_tiles(nc, 1) : 0) > 65535 || nc * k > INT32_MAX / 2))
		nc /= 2;
	if (nc < MP_MIN_CHUNK && nc < n)
		return ERR_UNSUPPORTED;
	for (int64_t t0 = 0; t0 < n; t0 += nc) {
		const int64_t nt = n - t0 < nc ? n - t0 : nc;
		int rc = mp_chunk(c, x + t0 * ldx, ldx, nt, ids + t0 * k, weights + t0 * k, k, gate, up, down,
		                  E, F, sh, out + t0 * ldo, ldo);
		if (rc)
			return rc;
	}
	return 0;
}
