/* One token's Q6_K product on the integer dot units (dp4a): y[r] = dot(W row r, x) for n_tok = 1.
 *
 * Why: the output head of the GGUF mixes people run (GLM-5 / DeepSeek-V3 "Q4_K_M" and the
 * `mkmodel --preset glm5` anchor file) is Q6_K, and at one token it went to the fp32 GEMV
 * (matmul_gemv.cu): every weight decoded to a float and multiplied in fp32, ~4-5 instructions a
 * weight. The GLM-5 rank slice (19360 x 6144, 97.6 MB) took 47-48 us a step there (H200, 46% of the
 * read rate). Here a weight costs ~3 instructions: the 6-bit value is assembled in place (four at a
 * time), multiplied with x's int8 parts by dp4a, and the scales are applied once per 16 weights in
 * fp32. Measured (H200, 2026-12-04, bench_cuda_gemv_mma q6, graphs): 38.2 us (57.5% of the read rate)
 * for that slice, 43.3 against 47.8 for DeepSeek-V3's, 265 against 333 us for a whole GLM-5 head.
 *
 * x is held as three int8 parts per group (k45_i8.cuh's scheme: x = xs (a + b / 254 + c / 254^2),
 * within ~6e-8 of the group's largest |x|): taken from the norm before where it left them
 * (kcuda_xparts_for: 32-element sub-blocks), else quantized here per 16-element group by each lane
 * (mi8_quant<16, 1>). The integer dots are exact; (q - 32) enters as q with -32 sum(part) folded into
 * the dp4a chain's start, so sum((q - 32) x) = xs (A + (254 B + C) / 254^2), with |254 B + C| <
 * 2^24 exact in fp32.
 *
 * Layout: a warp covers Q6BPW = 4 Q6_K blocks of K (1024 elements), a block ceil(n_in / 1024) warps, so
 * a block holds one whole row at a time. Lane l of a warp: Q6_K block 4 warp + l / 8, and in it half
 * n = (l >> 2) & 1 (elements 128 n ..), the 16 positions l0 = 16 ((l >> 1) & 1) .. + 15 and the quad pair
 * P = l & 1: its two groups are quads P and P + 2, elements 128 n + 32 P + l0 + (0..15) and
 * 128 n + 32 (P + 2) + l0 + (0..15), which share their ql bytes (low / high nibbles) and qh bytes (bits
 * 2P / 2P + 4). Per row a lane reads 16 ql and 16 qh bytes (2-byte aligned: kc_ldw_a2), two scales and d.
 * The block runs row groups (RB rows) blockIdx.x + i gridDim.x (grid: the groups, at most the resident
 * blocks, so each lane's x stays in registers across its rows). Whole rows stream into a ring of S
 * stages of RB rows in shared memory by cp.async (16-byte pieces, or 8 where rows are only 8-byte
 * aligned), S - 1 groups ahead of the math; the first S groups are issued before the PDL wait (weights
 * only: cuda_common.cuh). Per group: a butterfly leaves each row's warp sum in 32 / RB lanes, shared
 * memory takes the warps' sums, and thread j < RB adds them in warp order: the result does not depend
 * on the grid, RB or S (deterministic; tests/unit/q6k1_sim.cc runs the source on the CPU).
 * TANDEM_GEMV_Q6K picks the ring shape or turns the kernel off (below). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/k45_i8.cuh"
#include "kernels/cuda/matmul_impl.cuh"

/* cp.async of CP (8 or 16) bytes (8: .ca, which 8-byte copies need), commit, wait (outside the simulated
 * part: tests/unit/q6k1_sim.cc maps them onto sim_block.h's deferred copies) */
template <int CP> __device__ __forceinline__ void q6_cp(void *dst, const void *src)
{
	if constexpr (CP == 16)
		g3_cp16(dst, src);
	else
		asm volatile(
		    "cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
		    "l"(src)
		    : "memory");
}
#define q6_commit g3_commit
#define q6_wait g3_wait

#define Q6BPW 4 /* Q6_K blocks a warp */
#define Q6_MAX_W 8 /* warps a block: n_in <= 8192 */
#define Q6_T 256 /* threads a block at most (3 blocks an SM: <= 85 registers) */
#define Q6_SMEM 49152 /* the ring's bytes at most (no opt-in: sm_90, sm_100 and sm_120 alike) */

/* a lane's share of x: groups g = 0 (quad P), 1 (quad P + 2) */
struct q6_x {
	uint32_t a[2][MI8_P][4]; /* parts, 4 elements a word */
	int c[2][MI8_P]; /* -32 sum of the part's 16 values */
	float xs[2]; /* x = xs (a + b / 254 + c / 254^2) */
};

/* a lane's bytes of one row */
struct q6_raw {
	uint32_t ql[4], qh[4];
	int sc0, sc1;
	uint16_t d;
};

/* where the lane's bytes lie in its Q6_K block of a row (kq<KT_Q6_K> of quant_piece.cuh: ql[128], qh[64],
 * scales[16], d) */
struct q6_off {
	int ql, qh, sc, d;
};

__device__ __forceinline__ void q6_load(q6_raw &r, const uint8_t *row, const q6_off &o)
{
	kc_ldw_a2<4>(row + o.ql, r.ql);
	kc_ldw_a2<4>(row + o.qh, r.qh);
	r.sc0 = (int8_t)row[o.sc];
	r.sc1 = (int8_t)row[o.sc + 4]; /* quad P + 2: two scales on */
	r.d = kc_ld16(row + o.d);
}

/* the lane's part of dot(row, x); shq = 2P (the qh bits of quad P) */
__device__ __forceinline__ float q6_dot(const q6_raw &r, const q6_x &X, int shq)
{
	int acc[2][MI8_P];
#pragma unroll
	for (int g = 0; g < 2; g++)
#pragma unroll
		for (int pt = 0; pt < MI8_P; pt++)
			acc[g][pt] = X.c[g][pt];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const uint32_t h = r.qh[i] >> shq;
		const uint32_t q0 = (r.ql[i] & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u); /* quad P: 0..63 */
		const uint32_t q1 = ((r.ql[i] >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u); /* quad P + 2 */
#pragma unroll
		for (int pt = 0; pt < MI8_P; pt++) {
			acc[0][pt] = __dp4a((int)q0, (int)X.a[0][pt][i], acc[0][pt]);
			acc[1][pt] = __dp4a((int)q1, (int)X.a[1][pt][i], acc[1][pt]);
		}
	}
	const float v0 = fmaf((float)(254 * acc[0][1] + acc[0][2]), 1.f / 64516.f, (float)acc[0][0]);
	const float v1 = fmaf((float)(254 * acc[1][1] + acc[1][2]), 1.f / 64516.f, (float)acc[1][0]);
	return kc_h2f(r.d) * fmaf(v0 * X.xs[0], (float)r.sc0, v1 * X.xs[1] * (float)r.sc1);
}

/* the corrections of a group's parts: -32 times the sum of each part's values */
__device__ __forceinline__ void q6_corr(q6_x &X, int g)
{
#pragma unroll
	for (int pt = 0; pt < MI8_P; pt++) {
		int s = 0;
#pragma unroll
		for (int i = 0; i < 4; i++)
			s = __dp4a((int)X.a[g][pt][i], 0x01010101, s);
		X.c[g][pt] = -32 * s;
	}
}

/* The lane's groups from x (16 floats each at xg + 64 g: quantized here) or from the parts of
 * the norm before (xq: the unit of the lane's Q6_K block; sub-blocks j0 and j0 + 2, words w0 .. w0 + 3) */
__device__ __forceinline__ void q6_x_load(q6_x &X, const float *xg, const mi8_x *xq, int j0, int w0)
{
#pragma unroll
	for (int g = 0; g < 2; g++) {
		if (xq) {
			const int j = j0 + 2 * g;
#pragma unroll
			for (int pt = 0; pt < MI8_P; pt++) {
				const uint4 u = *(const uint4 *)&xq->q[j][pt][w0];
				uint32_t *a = X.a[g][pt];
				a[0] = u.x, a[1] = u.y, a[2] = u.z, a[3] = u.w;
			}
			X.xs[g] = xq->s[j] * xq->p[j];
		} else {
			float v[16];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const float4 f = ((const float4 *)(xg + 64 * g))[i];
				v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
			}
			float s, p, sum;
			mi8_quant<16, 1>(v, X.a[g], s, p, sum);
			X.xs[g] = s * p;
		}
		q6_corr(X, g);
	}
}

/* RB values a lane -> in lanes whose (lane >> (5 - log2 RB)) & (RB - 1) is row j, the warp sum of v[j]
 * (fixed order) */
template <int RB> __device__ __forceinline__ float q6_wsum(float (&v)[RB], int lane)
{
	int o = 16;
#pragma unroll
	for (int h = RB / 2; h >= 1; h >>= 1, o >>= 1) {
		const bool up = (lane & o) != 0;
#pragma unroll
		for (int j = 0; j < h; j++) {
			const float send = up ? v[j] : v[j + h], keep = up ? v[j + h] : v[j];
			v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
		}
	}
	float s = v[0];
	for (; o >= 1; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	return s;
}

/* the copies of row group g (rows RB g .. RB g + RB - 1 < n_out) into stage st (RB rows, rbs bytes apart),
 * one commit group (empty past the last row) */
template <int RB, int CP>
__device__ __forceinline__ void q6_issue(uint8_t *st, size_t rbs, const uint8_t *w, size_t rb, int64_t g,
                                         int64_t n_out)
{
	const int nch = (int)(rb / CP);
#pragma unroll
	for (int j = 0; j < RB; j++) {
		const int64_t r = RB * g + j;
		if (r < n_out) {
			const uint8_t *src = w + (size_t)r * rb;
			for (int i = (int)threadIdx.x; i < nch; i += (int)blockDim.x)
				q6_cp<CP>(st + j * rbs + (size_t)i * CP, src + (size_t)i * CP);
		}
	}
	q6_commit();
}

/* grid: row groups of RB rows, at most the resident blocks (each lane's x stays in registers across its
 * rows); ceil(nb / 4) warps, nb = n_in / 256; a ring of S stages of RB rows (rbs bytes a row, rb % CP == 0)
 * in dynamic shared memory */
template <int RB, int S, int CP>
__global__ void __launch_bounds__(Q6_T, 3)
    q6k1_kernel(const uint8_t *__restrict__ w, size_t rb, size_t rbs, int64_t n_out, int nb, const float *x,
                const mi8_x *xq, float *__restrict__ y)
{
	extern __shared__ __align__(16) uint8_t q6_smem[];
	__shared__ float part[2][Q6_MAX_W][RB];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = (int)(blockDim.x >> 5);
	const int blk = Q6BPW * warp + (lane >> 3), n = (lane >> 2) & 1, l0 = 16 * ((lane >> 1) & 1),
	          P = lane & 1;
	const bool act = blk < nb;
	const int bo = 210 * blk;
	const q6_off o = {bo + 64 * n + 32 * P + l0, bo + 128 + 32 * n + l0,
	                  bo + 192 + 8 * n + 2 * P + (l0 >> 4), bo + 208};
	const int64_t G = gridDim.x;
	/* the first S row groups' weights: before the wait */
#pragma unroll 1
	for (int s = 0; s < S; s++)
		q6_issue<RB, CP>(q6_smem + (size_t)s * RB * rbs, rbs, w, rb, blockIdx.x + s * G, n_out);
	KDEP_ENTRY();
	x = kdep_after(x);
	xq = kdep_after(xq);
	q6_x X;
	if (act)
		q6_x_load(X, x + 256 * blk + 128 * n + 32 * P + l0, xq ? xq + blk : NULL, 4 * n + P, l0 >> 2);
	const int shq = 2 * P;
#pragma unroll 1
	for (int64_t it = 0;; it++) {
		const int64_t g = blockIdx.x + it * G, r0 = RB * g;
		if (r0 >= n_out)
			break;
		uint8_t *st = q6_smem + (size_t)(it % S) * RB * rbs;
		q6_wait<S - 1>(); /* this thread's copies of group `it` */
		__syncthreads(); /* everyone's */
		float v[RB];
#pragma unroll
		for (int j = 0; j < RB; j++) {
			v[j] = 0.f;
			if (act && r0 + j < n_out) {
				q6_raw r;
				q6_load(r, st + j * rbs, o);
				v[j] = q6_dot(r, X, shq);
			}
		}
		const float s = q6_wsum<RB>(v, lane);
		float(*pt)[RB] = part[it & 1];
		if ((lane & (32 / RB - 1)) == 0)
			pt[warp][(lane >> (RB == 1 ? 5 : RB == 2 ? 4 : 3)) & (RB - 1)] = s;
		__syncthreads(); /* the sums are in; the stage is read */
		if ((int)threadIdx.x < RB && r0 + threadIdx.x < n_out) {
			float t = 0.f;
			for (int w2 = 0; w2 < W; w2++)
				t += pt[w2][threadIdx.x];
			y[r0 + threadIdx.x] = t;
		}
		q6_issue<RB, CP>(st, rbs, w, rb, g + S * G, n_out);
	}
	q6_wait<0>(); /* (empty groups only by now) */
}

/* ---- host ------------------------------------------------------------------------------------- */

/* TANDEM_GEMV_Q6K (read on every call): 0 off (the fp32 GEMV); 1 one row a ring stage, 8 stages; 2 two
 * rows a stage, 4 stages; 3 (default) four rows a stage, 2 stages; 4 four rows a stage, 4 stages (past
 * 48 KB: the opt-in, where the device has it). A ring that does not fit takes fewer stages, then fewer
 * rows a stage. H200, bench_cuda_gemv_mma q6 (graphs, us; the fp32 GEMV 47.3 / 47.8 / 333):
 *   GLM-5 head / 8 (6144 x 19360): 1: 50.7, 2: 42.2, 3: 38.2, 4: 42.9
 *   DS-V3 head / 8 (7168 x 16160): 1: 56.7, 2: 47.7, 3: 43.3, 4: 43.8
 *   GLM-5 head (6144 x 154880):    1: 368,  2: 294,  3: 265,  4: 303
 * The bytes in flight are about the same in 1-3 (the ring holds 8 rows); what falls with more rows a
 * stage is the per-stage cost (two barriers, the warps' sums added by one thread a row); 4 has half the
 * resident blocks of 3 (80 KB a block). */
static int q6_variant(void)
{
	const char *e = getenv("TANDEM_GEMV_Q6K");
	if (!e || !*e)
		return 3;
	return e[0] >= '1' && e[0] <= '4' && !e[1] ? e[0] - '0' : 0;
}

/* the fewest rows a product needs to take this kernel: below, the fp32 GEMV's 4840-row-grid style wins
 * (H200, bench_cuda_gemv_mma q6: 6144 -> 2048 9.0 us there against 9.9 here, whose blocks run only two
 * row steps after quantizing x; 16160 and more rows were as fast or faster here) */
#define Q6_MIN_ROWS 8192

typedef void (*q6_fn)(const uint8_t *, size_t, size_t, int64_t, int, const float *, const mi8_x *, float *);

template <int RB, int S> static q6_fn q6_pick(int cp)
{
	return cp == 16 ? q6k1_kernel<RB, S, 16> : q6k1_kernel<RB, S, 8>;
}

/* resident blocks an SM of f with W warps and smem bytes of ring (0 when it cannot run) */
static int q6_occ(q6_fn f, int W, size_t smem)
{
	int b = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, f, W * 32, smem) != cudaSuccess || b < 1) {
		(void)cudaGetLastError();
		b = 0;
	}
	return b;
}

int kcuda_gemv_q6k1_launch(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                           int n_tok, float *y, int64_t ldy)
{
	(void)ldy; /* one token */
	const int v = q6_variant();
	if (w->type != KT_Q6_K || n_tok != 1 || w->n_in % 256 || w->n_out < Q6_MIN_ROWS || !v)
		return ERR_UNSUPPORTED;
	const int64_t nb = w->n_in / 256;
	const int W = (int)((nb + Q6BPW - 1) / Q6BPW);
	const size_t rb = w->row_bytes, rbs = (rb + 15) & ~(size_t)15;
	/* the copies: 16-byte pieces when every row starts 16-byte aligned, else 8 (n_in % 1024 == 0) */
	const int cp = rb % 16 == 0 && (uintptr_t)w->data % 16 == 0 ? 16
	               : rb % 8 == 0 && (uintptr_t)w->data % 8 == 0 ? 8
	                                                            : 0;
	if (W > Q6_MAX_W || !cp || (uintptr_t)x % 16 || rb != 210 * (size_t)nb)
		return ERR_UNSUPPORTED;
	int rbn = v == 1 ? 1 : v == 2 ? 2 : 4, S = v == 1 ? 8 : v == 2 || v == 4 ? 4 : 2;
	const size_t cap = v == 4 ? (size_t)kcuda_smem_optin(c->device) : (size_t)Q6_SMEM;
	/* too wide for the ring: fewer stages, then fewer rows a stage */
	while ((size_t)S * rbn * rbs > cap) {
		if (S > 2)
			S /= 2;
		else if (rbn > 1)
			rbn /= 2;
		else
			return ERR_UNSUPPORTED;
	}
	const size_t smem = (size_t)S * rbn * rbs;
	q6_fn f;
	switch (rbn * 16 + S) {
	case 16 + 8: f = q6_pick<1, 8>(cp); break;
	case 16 + 4: f = q6_pick<1, 4>(cp); break;
	case 16 + 2: f = q6_pick<1, 2>(cp); break;
	case 32 + 4: f = q6_pick<2, 4>(cp); break;
	case 32 + 2: f = q6_pick<2, 2>(cp); break;
	case 64 + 4: f = q6_pick<4, 4>(cp); break;
	default: f = q6_pick<4, 2>(cp); break;
	}
	/* past the default 48 KB (variant 4): set on every call, a per-device attribute (a process may drive
	 * several GPUs from several threads) */
	if (smem > 49152 &&
	    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
		(void)cudaGetLastError();
		return ERR_UNSUPPORTED;
	}
	/* resident blocks, per device, kernel and W */
	static int occ[64][3][3][2]
	              [Q6_MAX_W + 1]; /* device, log2 rbn, log2 S - 1, cp 16, W; -1: cannot run */
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
	int &oc = occ[dev][rbn == 1 ? 0 : rbn == 2 ? 1 : 2][S == 2 ? 0 : S == 4 ? 1 : 2][cp == 16][W];
	if (!oc) {
		const int b = q6_occ(f, W, smem);
		oc = b ? b : -1;
	}
	if (oc < 0)
		return ERR_UNSUPPORTED;
	const mi8_x *xq = kcuda_xparts_for(c, x, ldx, w->n_in, 1);
	const int64_t groups = (w->n_out + rbn - 1) / rbn, res = (int64_t)c->n_sm * oc;
	const unsigned grid = (unsigned)(groups < res ? groups : res);
	return klaunch("gemv_q6k1", f, dim3(grid), dim3(W * 32), smem, c->stream, (const uint8_t *)w->data,
	               rb, rbs, w->n_out, (int)nb, x, xq, y);
}
