/* MLA attention of a prompt chunk whose rows see every key before them, in the naive (not absorbed)
 * form, on cuBLAS: kcuda_mla_dense (kernels.h).
 *
 * Why: the absorbed kernels (mla_attn_mma.cu) give each query row its own pass over its keys, at
 * 576 + 512 multiply-adds per (row, key, head) with q and p split into bf16 hi + lo parts. A dense
 * causal prompt is the case where every row of a chunk sees the same keys, so the keys can be
 * decompressed once per chunk and shared by all rows as matrices:
 *     K_h = c W_UK(h)   (keys x N),  V_h = c W_UV(h)^T   (keys x V),  c = the keys' latent rows,
 *     S_h = scale (q_nope,h K_h^T + q_rope,h k_r^T),  O_h = softmax(S_h) V_h.
 * That is N + R + V multiply-adds per (row, key, head) instead of 2 (C + R) + 2 C (DeepSeek-V3: 320
 * against 2176 with the split), as GEMMs that cuBLAS runs near the tensor cores' rate, and the
 * output is already in the value space (no v_b product after it). H200, session 17 (DeepSeek-V3
 * rank of TP=8, 8k prompt): the attention was 62% of a 2048-token step.
 *
 * The keys go in blocks of kb (default 2048): the block's latent rows are gathered from the paged
 * pool (bf16 or fp32) into fp32, K and V decompressed for all heads (two strided-batched GEMMs),
 * then for each block of qb query rows: S by two GEMMs (the nope part per head, the shared rotary key
 * part with a zero stride), one warp per (row, head) does the causal mask and an online softmax step
 * in registers (the row of S at most kb = 2048 values: 64 a lane), writes p in place, rescales the
 * row's output by e^(m_old - m_new) and keeps (m, l); then O += P V (one GEMM, beta 1). Rows whose
 * position is before the key block are skipped; the last step divides by l.
 *
 * Numerics, chosen by the caller: fp32 throughout with the GEMMs either plain fp32
 * (CUBLAS_COMPUTE_32F_PEDANTIC: the CPU's arithmetic up to the order of the sums) or TF32 tensor cores
 * (inputs rounded to 10 mantissa bits, 2^-11 relative: finer than a bf16 KV pool's own rounding, 2^-9);
 * or bf16 tensor cores (twice TF32's rate, half the bytes of K, V and p): q, the latent rows, the
 * dequantized weights, K, V and p rounded to bf16 (2^-9 each), S, the softmax and O in fp32 (the
 * rounding of a bf16 flash-attention kernel; the absorbed kernels keep ~16 bits by their hi + lo
 * split). Invalid
 * keys (a block id out of range or -1) are masked (score -inf) and counted in the context's error
 * counter, as in the other MLA kernels; a row with no valid key gives zeros. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/mla_attn_tile.cuh"

#define MD_KB 2048 /* keys a block by default; the softmax holds a row of S in registers */
#define MD_PER (MD_KB / 32) /* values a lane */
#define MD_S_BUDGET ((size_t)256 << 20) /* the scores of one (row block, key block), all heads */
#define MD_QB_MIN 64
#define MD_WARPS 8

namespace
{

struct md_carve {
	size_t wk, wv, lat, kn, vv, s, m, l, valid, qh, total;
};

size_t md_up(size_t x)
{
	return (x + 255) & ~(size_t)255;
}

/* with_s false: no score buffer (the fused kernel keeps S in registers) */
md_carve md_layout(int64_t H, int64_t C, int64_t R, int64_t N, int64_t V, int64_t rows, int64_t kb,
                   int64_t qb, bool with_s)
{
	md_carve k;
	size_t o = 0;
	const size_t f = sizeof(float);
	k.wk = o, o += md_up(f * (size_t)(H * C * N));
	k.wv = o, o += md_up(f * (size_t)(H * V * C));
	k.lat = o, o += md_up(f * (size_t)(kb * (C + R)));
	/* fp32 K (N a head), or bf16 K with the rotary part (N + R a head: the fused kernel's) */
	const size_t kn_f = f * (size_t)(kb * H * N), kn_b = sizeof(uint16_t) * (size_t)(kb * H * (N + R));
	k.kn = o, o += md_up(kn_f > kn_b ? kn_f : kn_b);
	k.vv = o, o += md_up(f * (size_t)(kb * H * V));
	k.s = o, o += with_s ? md_up(f * (size_t)(H * qb * kb)) : 0;
	k.m = o, o += md_up(f * (size_t)(rows * H));
	k.l = o, o += md_up(f * (size_t)(rows * H));
	k.valid = o, o += md_up(sizeof(int) * (size_t)kb);
	k.qh = o, o += md_up(sizeof(uint16_t) * (size_t)(rows * H * (N + R))); /* bf16 math: q rounded */
	k.total = o;
	return k;
}

/* the default block sizes for up to `rows` query rows and `keys` keys */
void md_blocks(int64_t H, int64_t rows, int64_t keys, int64_t *kb, int64_t *qb)
{
	*kb = keys < MD_KB ? (keys > 0 ? keys : 1) : MD_KB;
	int64_t q = (int64_t)(MD_S_BUDGET / ((size_t)H * (size_t)*kb * sizeof(float)));
	if (q < MD_QB_MIN)
		q = MD_QB_MIN;
	*qb = q < rows ? q : (rows > 0 ? rows : 1);
}

/* lat[j][0 .. dim) = the latent row of position k0 + j (fp32, or bf16 for the bf16 math), valid[j]
 * whether it exists */
__device__ __forceinline__ void md_put(float *d, float v)
{
	*d = v;
}
__device__ __forceinline__ void md_put(uint16_t *d, float v)
{
	*d = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T>
__global__ void md_gather_kernel(const uint8_t *base, int64_t n_blocks, size_t block_bytes, size_t offset,
                                 int bt, int bf16, const int32_t *tbl, int64_t ld_blocks, int64_t k0, int dim,
                                 T *lat, int *valid, unsigned *err)
{
	KDEP_ENTRY();
	const int j = blockIdx.x;
	const int64_t p = k0 + j;
	const uint8_t *row = NULL;
	if (p / bt < ld_blocks) {
		const int64_t b = tbl[p / bt];
		if (b >= 0 && b < n_blocks)
			row = base + (size_t)b * block_bytes + offset +
			      (size_t)(p % bt) * (size_t)dim * (bf16 ? 2 : 4);
	}
	if (threadIdx.x == 0) {
		valid[j] = row != NULL;
		if (!row)
			atomicAdd(err, 1u);
	}
	T *dst = lat + (int64_t)j * dim;
	for (int e = threadIdx.x; e < dim; e += blockDim.x)
		md_put(dst + e, !row   ? 0.0f
		                : bf16 ? kc_bf2f(((const uint16_t *)row)[e])
		                       : ((const float *)row)[e]);
}

/* One online-softmax step per (row, head) of a (row block, key block): s[h][i][0 .. kbe) holds the
 * scaled scores of row rs + i (position pos0 + rs + i) against keys k0 .. k0 + kbe. Keys after the
 * row's position and invalid keys get p = 0; p = e^(s - m_new) replaces s; the row's output
 * (out + (rs + i) ldo + h V, V values) is rescaled by e^(m_old - m_new) (zeroed on the first key
 * block) and (m, l) updated. One warp a (row, head). */
template <typename P>
__global__ void __launch_bounds__(32 * MD_WARPS)
    md_softmax_kernel(float *s, int qb, int kbe, int H, int64_t rs, int64_t pos0, int64_t k0, int first,
                      const int *valid, float *m_run, float *l_run, float *out, int64_t ldo, int V)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t w = (int64_t)blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
	if (w >= (int64_t)qb * H)
		return;
	const int h = (int)(w / qb), i = (int)(w % qb);
	float *sr = s + ((int64_t)h * qb + i) * kbe;
	const int64_t lim64 = pos0 + rs + i - k0 + 1; /* keys of this block the row sees */
	const int lim = lim64 < 0 ? 0 : lim64 > kbe ? kbe : (int)lim64;
	float v[MD_PER];
	float mx = -INFINITY;
#pragma unroll
	for (int t = 0; t < MD_PER; t++) {
		const int j = t * 32 + lane;
		v[t] = j < lim && valid[j] ? sr[j] : -INFINITY;
		mx = fmaxf(mx, v[t]);
	}
	mx = kc_warp_max(mx);
	const int64_t ml = (rs + i) * H + h;
	const float m_old = first ? -INFINITY : m_run[ml];
	const float m_new = fmaxf(m_old, mx);
	float sum = 0.0f;
#pragma unroll
	for (int t = 0; t < MD_PER; t++) {
		const int j = t * 32 + lane;
		const float p = v[t] == -INFINITY ? 0.0f : expf(v[t] - m_new);
		sum += p;
		if (j < kbe) /* bf16 p: the first half of the row's bytes (all read above, the warp synced) */
			md_put((P *)sr + j, p);
	}
	sum = kc_warp_sum(sum);
	/* e^(m_old - m_new): 0 when nothing was seen before (m_old -inf), 1 when nothing is seen yet */
	const float alpha = first ? 0.0f : m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
	float *o = out + (rs + i) * ldo + (int64_t)h * V;
	if (first) {
		for (int c = lane; c < V; c += 32)
			o[c] = 0.0f;
	} else if (alpha != 1.0f) {
		for (int c = lane; c < V; c += 32)
			o[c] *= alpha;
	}
	if (lane == 0) {
		m_run[ml] = m_new;
		l_run[ml] = (first ? 0.0f : l_run[ml] * alpha) + sum;
	}
}

/* out row (i, h) /= l (0 where no key was valid) */
__global__ void __launch_bounds__(32 * MD_WARPS)
    md_finish_kernel(int64_t n, int H, const float *l_run, float *out, int64_t ldo, int V)
{
	KDEP_ENTRY();
	const int lane = threadIdx.x & 31;
	const int64_t w = (int64_t)blockIdx.x * MD_WARPS + (threadIdx.x >> 5);
	if (w >= n * H)
		return;
	const int64_t i = w / H;
	const int h = (int)(w % H);
	const float l = l_run[w];
	const float inv = l > 0.0f ? 1.0f / l : 0.0f;
	float *o = out + i * ldo + (int64_t)h * V;
	for (int c = lane; c < V; c += 32)
		o[c] *= inv;
}

/* ---- the fused kernel of the bf16 math (md_flash_kernel) ----
 * One block of 4 warps takes 64 query rows of one head (16 a warp) against one key block: per tile of
 * 64 keys, K (keys x DK, DK = N + R: the decompressed nope part and the shared rotary part) and V (keys x
 * DV) go to shared memory, S = q K^T by m16n8k16 bf16 MMAs (q from shared memory, loaded once), the
 * causal / valid mask and an online softmax step on the S fragments in registers (log2 domain), p
 * rounded to bf16 as the A fragments of O += p V straight from the S accumulators (no S in memory).
 * At the end the block's (m, l, O) merge into the call's running (m_run, l_run, out) of the rows, as
 * md_softmax_kernel's rescale does. Rows whose position is before a tile's first key skip nothing:
 * their scores are masked (the tiles end at the block's last row). */
#define MDF_KEYS 64

/* q, then nbuf (K, V) tile buffers; rows padded by 8 elements (16 bytes: conflict-free ldmatrix), a K row's
 * padding holds its key's valid flag */
__host__ __device__ constexpr size_t mdf_smem(int dk, int dv, int nbuf, int rows)
{
	return sizeof(uint16_t) * (size_t)(rows * (dk + 8) + nbuf * MDF_KEYS * (dk + 8 + dv + 8));
}

/* rows [r0, r0 + nrows) of a [rows][H][D] bf16 array (head h) into sh (stride D + 8) by cp.async, zeros past
 * nrows */
__device__ __forceinline__ void mdf_load(uint16_t *sh, int rows, const uint16_t *g, int64_t r0, int nrows,
                                         int H, int h, int D)
{
	const int per = D / 8; /* 16-byte pieces a row */
	for (int e = threadIdx.x; e < rows * per; e += blockDim.x) {
		const int r = e / per, c = (e % per) * 8;
		if (r < nrows)
			katt_cp16(sh + r * (D + 8) + c, g + ((r0 + r) * H + h) * (int64_t)D + c);
		else
			*(uint4 *)(sh + r * (D + 8) + c) = make_uint4(0, 0, 0, 0);
	}
}

/* NBUF 2: the next tile's copies are in flight while this one is multiplied; ROWS / 16 warps */
template <int DV, int NBUF, int ROWS>
__global__ void __launch_bounds__(ROWS * 2)
    md_flash_kernel(const uint16_t *qh, const uint16_t *kb, const uint16_t *vb, const int *valid, int H,
                    int DK, int n, int64_t rs, int64_t pos0, int64_t k0, int kbn, float scale_log2, int first,
                    float *m_run, float *l_run, float *out, int64_t ldo)
{
	KDEP_ENTRY();
	extern __shared__ __align__(16) uint16_t mdf_sh[];
	const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
	          t = lane & 3;
	const int QS = DK + 8, VS = DV + 8;
	uint16_t *qs = mdf_sh, *kvs = qs + ROWS * QS;
	const int KVB = MDF_KEYS * (QS + VS); /* elements of one (K, V) buffer */
	const int64_t rb = rs + (int64_t)blockIdx.x * ROWS; /* the block's first row */
	const int nr = n - rb < ROWS ? (int)(n - rb) : ROWS;
	/* keys of this block the block's last row sees */
	const int64_t kl = pos0 + rb + nr - k0;
	const int kend = kl < kbn ? (int)kl : kbn;
	auto issue = [&](int buf, int t0) {
		const int nk = kend - t0 < MDF_KEYS ? kend - t0 : MDF_KEYS;
		uint16_t *ks = kvs + buf * KVB;
		mdf_load(ks, MDF_KEYS, kb, t0, nk, H, h, DK);
		mdf_load(ks + MDF_KEYS * QS, MDF_KEYS, vb, t0, nk, H, h, DV);
		if (threadIdx.x < MDF_KEYS)
			ks[threadIdx.x * QS + DK] = (int)threadIdx.x < nk && valid[t0 + threadIdx.x];
		katt_cp_commit();
	};
	mdf_load(qs, ROWS, qh, rb, nr, H, h, DK);
	if (kend > 0)
		issue(0, 0); /* q's copies ride in the first group */
	else
		katt_cp_commit();
	/* this lane's rows: g and g + 8 of the warp's 16; their positions */
	const int64_t pa = pos0 + rb + warp * 16 + g, pb = pa + 8;
	float o[DV / 8][4];
#pragma unroll
	for (int j = 0; j < DV / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
	for (int t0 = 0, buf = 0; t0 < kend; t0 += MDF_KEYS, buf = NBUF == 2 ? buf ^ 1 : 0) {
		if (NBUF == 2 && t0 + MDF_KEYS < kend) {
			issue(buf ^ 1, t0 + MDF_KEYS);
			katt_cp_wait<1>();
		} else {
			katt_cp_wait<0>();
		}
		__syncthreads(); /* this tile (and q) in place */
		const uint16_t *ks = kvs + buf * KVB, *vs = ks + MDF_KEYS * QS;
		float sc[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
			sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
		for (int d = 0; d < DK; d += 16) {
			uint32_t a[4];
			katt_ldm4(a, qs + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * QS + d +
			                 (lane >> 4) * 8);
#pragma unroll
			for (int j = 0; j < 8; j += 2) {
				uint32_t b[4];
				katt_ldm_keys2(b, ks, QS, j * 8, d, lane);
				katt_mma(sc[j], a, b[0], b[1]);
				katt_mma(sc[j + 1], a, b[2], b[3]);
			}
		}
		/* mask, scale, the rows' tile max */
		float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int kt = j * 8 + 2 * t + e,
				          kk = t0 + kt; /* key index in the tile, the block */
				const int64_t kp = k0 + kk;
				const bool ok = ks[kt * QS + DK] != 0;
				sc[j][e] = ok && kp <= pa ? sc[j][e] * scale_log2 : -INFINITY;
				sc[j][2 + e] = ok && kp <= pb ? sc[j][2 + e] * scale_log2 : -INFINITY;
				xa = fmaxf(xa, sc[j][e]);
				xb = fmaxf(xb, sc[j][2 + e]);
			}
		xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
		xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
		xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
		xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
		const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
		/* e^(m_old - m_new): 0 from nothing, 1 while nothing is seen */
		const float aa = na == -INFINITY ? 1.0f : exp2f(ma - na),
		            ab = nb == -INFINITY ? 1.0f : exp2f(mb - nb);
		ma = na, mb = nb;
		float sa = 0.0f, sb = 0.0f;
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				sc[j][e] = sc[j][e] == -INFINITY ? 0.0f : exp2f(sc[j][e] - na);
				sc[j][2 + e] = sc[j][2 + e] == -INFINITY ? 0.0f : exp2f(sc[j][2 + e] - nb);
				sa += sc[j][e];
				sb += sc[j][2 + e];
			}
		la = la * aa + sa; /* this lane's part; the quad's parts are summed at the end */
		lb = lb * ab + sb;
#pragma unroll
		for (int j = 0; j < DV / 8; j++) {
			o[j][0] *= aa, o[j][1] *= aa;
			o[j][2] *= ab, o[j][3] *= ab;
		}
		/* O += p V over the tile's 4 steps of 16 keys; p's A fragments are the S accumulators */
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			uint32_t a[4];
			const __nv_bfloat162 p0 = __floats2bfloat162_rn(sc[2 * kk][0], sc[2 * kk][1]),
			                     p1 = __floats2bfloat162_rn(sc[2 * kk][2], sc[2 * kk][3]),
			                     p2 = __floats2bfloat162_rn(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
			                     p3 = __floats2bfloat162_rn(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
			a[0] = *(const uint32_t *)&p0;
			a[1] = *(const uint32_t *)&p1;
			a[2] = *(const uint32_t *)&p2;
			a[3] = *(const uint32_t *)&p3;
			const uint16_t *vr =
			    vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * VS + (lane >> 4) * 8;
#pragma unroll
			for (int j = 0; j < DV / 8; j += 2)
				katt_pv_ldm2<false>(o[j], o[j + 1], a, a, vr + 8 * j, true);
		}
		__syncthreads(); /* the tile's buffer is free again */
		if (NBUF == 1 && t0 + MDF_KEYS < kend)
			issue(0, t0 + MDF_KEYS);
	}
	katt_cp_wait<0>(); /* nothing left in flight (no tile: q's copies) */
	la += __shfl_xor_sync(0xffffffffu, la, 1);
	la += __shfl_xor_sync(0xffffffffu, la, 2);
	lb += __shfl_xor_sync(0xffffffffu, lb, 1);
	lb += __shfl_xor_sync(0xffffffffu, lb, 2);
	/* merge into the running state of rows ra, rb2 (rows past n: none) */
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int64_t r = rb + warp * 16 + g + half * 8;
		if (r >= n)
			continue;
		const float mk = half ? mb : ma, lk = half ? lb : la;
		const int64_t ml = r * H + h;
		float cold = 0.0f, cnew = 1.0f, mn = mk;
		if (!first) {
			const float mo = m_run[ml];
			mn = fmaxf(mo, mk);
			cold = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
			cnew = mk == -INFINITY ? 0.0f : exp2f(mk - mn);
		}
		float *orow = out + r * ldo + (int64_t)h * DV;
#pragma unroll
		for (int j = 0; j < DV / 8; j++) {
			float2 *dst = (float2 *)(orow + j * 8 + 2 * t);
			const float2 v = make_float2(o[j][half * 2] * cnew, o[j][half * 2 + 1] * cnew);
			if (first) {
				*dst = v;
			} else {
				const float2 old = *dst;
				*dst = make_float2(old.x * cold + v.x, old.y * cold + v.y);
			}
		}
		if (t == 0) {
			m_run[ml] = mn;
			l_run[ml] = (first ? 0.0f : l_run[ml] * cold) + lk * cnew;
		}
	}
}

/* the bf16 math's q: qf[i][h][0 .. N + R) = q_nope then the roped rotary part, rounded to bf16 */
__global__ void md_qcat_kernel(const float *q, int64_t ldq, int64_t q_hs, const float *qr, int64_t ldqr,
                               int64_t qr_hs, int H, int N, int R, uint16_t *qf)
{
	KDEP_ENTRY();
	const int64_t i = blockIdx.x;
	const int DK = N + R;
	for (int e = threadIdx.x; e < H * DK; e += blockDim.x) {
		const int hh = e / DK, d = e % DK;
		md_put(qf + i * H * DK + e,
		       d < N ? q[i * ldq + hh * q_hs + d] : qr[i * ldqr + hh * qr_hs + d - N]);
	}
}

/* the shared rotary key part into every head's K row: kf[j][h][N .. N + R) = lat[j][C .. C + R) */
__global__ void md_krope_kernel(const uint16_t *lat, int dim, int C, int R, int H, int N, int kbn,
                                uint16_t *kf)
{
	KDEP_ENTRY();
	const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= (int64_t)kbn * H * R)
		return;
	const int64_t j = e / ((int64_t)H * R);
	const int hh = (int)(e / R % H), d = (int)(e % R);
	kf[(j * H + hh) * (N + R) + N + d] = lat[j * dim + C + d];
}

bool md_fits(int64_t v)
{
	return v >= 0 && v <= INT32_MAX;
}

/* the GEMMs' element types and arithmetic: fp32 in and out (plain or TF32), or bf16 inputs with an
 * fp32 (S, O) or bf16 (K, V) output, fp32 accumulation */
struct md_math {
	int mode; /* KCUDA_MD_F32 / _TF32 / _BF16 */
	cudaDataType_t in() const
	{
		return mode == KCUDA_MD_BF16 ? CUDA_R_16BF : CUDA_R_32F;
	}
};

/* C_b = alpha op(A_b) op(B_b) + beta C_b for b < batch (column-major, cuBLAS's terms); A and B of
 * the math's input type, C of ct */
int md_gemm(struct kcuda_ctx *c, md_math mm, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
            int64_t k, float alpha, const void *A, int64_t lda, int64_t sa, const void *B, int64_t ldb,
            int64_t sb, float beta, void *C, cudaDataType_t ct, int64_t ldc, int64_t sc, int64_t batch)
{
	if (!md_fits(m) || !md_fits(n) || !md_fits(k) || !md_fits(lda) || !md_fits(ldb) || !md_fits(ldc) ||
	    !md_fits(batch))
		return ERR_LIMIT;
	if (m == 0 || n == 0 || batch == 0)
		return 0;
	cublasHandle_t h = (cublasHandle_t)c->cublas;
	const cudaDataType_t it = mm.in();
	const cublasComputeType_t ctp = mm.mode == KCUDA_MD_TF32  ? CUBLAS_COMPUTE_32F_FAST_TF32
	                                : mm.mode == KCUDA_MD_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC
	                                                          : CUBLAS_COMPUTE_32F;
	cublasStatus_t st = cublasGemmStridedBatchedEx(h, ta, tb, (int)m, (int)n, (int)k, &alpha, A, it,
	                                               (int)lda, sa, B, it, (int)ldb, sb, &beta, C, ct,
	                                               (int)ldc, sc, (int)batch, ctp, CUBLAS_GEMM_DEFAULT);
	if (st == CUBLAS_STATUS_NOT_SUPPORTED &&
	    mm.mode == KCUDA_MD_F32) /* plain fp32 (no TF32 by default) */
		st = cublasGemmStridedBatchedEx(h, ta, tb, (int)m, (int)n, (int)k, &alpha, A, it, (int)lda,
		                                sa, B, it, (int)ldb, sb, &beta, C, ct, (int)ldc, sc,
		                                (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS) {
		fprintf(
		    stderr,
		    "kcuda: mla_dense: cublasGemmStridedBatchedEx failed (%d) for %lldx%lldx%lld x %lld\n",
		    (int)st, (long long)m, (long long)n, (long long)k, (long long)batch);
		return ERR_CUDA;
	}
	return 0;
}

int md_dequant(struct kcuda_ctx *c, const struct kweight *w, bool bf16, void *dst)
{
	return bf16 ? kcuda_dequant_bf16(c, w, 0, w->n_out, (uint16_t *)dst)
	            : kcuda_dequant_f32(c, w, 0, w->n_out, (float *)dst);
}

/* the heads' matrices of a per-head weight (head h at data + h stride), dequantized to fp32 or bf16
 * [H][rows][cols]: one launch when the heads are packed back to back */
int md_dequant_heads(struct kcuda_ctx *c, const struct kweight *w, size_t stride, int64_t H, bool bf16,
                     void *dst)
{
	if (stride == (size_t)w->n_out * w->row_bytes) {
		struct kweight all = *w;
		all.n_out = w->n_out * H;
		return md_dequant(c, &all, bf16, dst);
	}
	const size_t esz = bf16 ? 2 : 4;
	for (int64_t h = 0; h < H; h++) {
		struct kweight one = *w;
		one.data = (const uint8_t *)w->data + (size_t)h * stride;
		int rc = md_dequant(c, &one, bf16, (uint8_t *)dst + (size_t)(h * w->n_out * w->n_in) * esz);
		if (rc)
			return rc;
	}
	return 0;
}

template <int DV, int NBUF, int ROWS>
int mdf_launch1(struct kcuda_ctx *c, size_t smem, const uint16_t *qf, const uint16_t *kf, const uint16_t *vv,
                const int *valid, int H, int DK, int n, int64_t rs, int64_t pos0, int64_t k0, int kbn,
                float sl2, int first, float *m_run, float *l_run, float *out, int64_t ldo)
{
	static int attr_dev[64]; /* per device: the shared memory size set (+1) */
	const int d = c->device;
	if (d < 0 || d >= 64 || attr_dev[d] != (int)smem + 1) {
		KCUDA_CHECK(cudaFuncSetAttribute(md_flash_kernel<DV, NBUF, ROWS>,
		                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
		if (d >= 0 && d < 64)
			attr_dev[d] = (int)smem + 1;
	}
	const dim3 grid((unsigned)((n - rs + ROWS - 1) / ROWS), (unsigned)H);
	return klaunch("mla_dense flash", md_flash_kernel<DV, NBUF, ROWS>, grid, dim3(ROWS * 2), smem,
	               c->stream, qf, kf, vv, valid, H, DK, n, rs, pos0, k0, kbn, sl2, first, m_run, l_run,
	               out, ldo);
}

/* the fused kernel's variant: shared memory for 2 tile buffers, else 1; rows 64 or 128 a block */
template <int DV>
int mdf_launch(struct kcuda_ctx *c, int nbuf, int rows, const uint16_t *qf, const uint16_t *kf,
               const uint16_t *vv, const int *valid, int H, int DK, int n, int64_t rs, int64_t pos0,
               int64_t k0, int kbn, float sl2, int first, float *m_run, float *l_run, float *out, int64_t ldo)
{
	const size_t smem = mdf_smem(DK, DV, nbuf, rows);
#define MDF_GO(NB, RW)                                                                                       \
	mdf_launch1<DV, NB, RW>(c, smem, qf, kf, vv, valid, H, DK, n, rs, pos0, k0, kbn, sl2, first, m_run,  \
	                        l_run, out, ldo)
	if (rows == 128)
		return nbuf == 2 ? MDF_GO(2, 128) : MDF_GO(1, 128);
	return nbuf == 2 ? MDF_GO(2, 64) : MDF_GO(1, 64);
#undef MDF_GO
}

typedef int (*mdf_launch_fn)(struct kcuda_ctx *, int, int, const uint16_t *, const uint16_t *,
                             const uint16_t *, const int *, int, int, int, int64_t, int64_t, int64_t, int,
                             float, int, float *, float *, float *, int64_t);

/* Whether a call takes the fused kernel (the bf16 math, flash on, N + R a multiple of 16, V one it is
 * built for, its shared memory within the device's): fl its launcher, rows / nbuf its query rows a
 * block and tile buffers; fl NULL: the GEMMs. kcuda_mla_dense_ws and kcuda_mla_dense decide by this
 * one function, so a workspace sized without the score buffer is never given to the GEMM path. */
struct mdf_plan {
	mdf_launch_fn fl;
	int rows, nbuf;
};

mdf_plan mdf_pick(int device, int math, int flash, int64_t N, int64_t R, int64_t V)
{
	mdf_plan p = {NULL, 0, 0};
	const int DK = (int)(N + R);
	if (math != KCUDA_MD_BF16 || !flash || DK % 16 != 0 || DK <= 0)
		return p;
	const mdf_launch_fn fl = V == 32    ? mdf_launch<32>
	                         : V == 64  ? mdf_launch<64>
	                         : V == 128 ? mdf_launch<128>
	                         : V == 256 ? mdf_launch<256>
	                                    : NULL;
	const size_t optin = (size_t)kcuda_smem_optin(device);
	int rows = flash == 2 ? 128 : 64;
	if (mdf_smem(DK, (int)V, 1, rows) > optin)
		rows = 64;
	const int nbuf = mdf_smem(DK, (int)V, 2, rows) <= optin   ? 2
	                 : mdf_smem(DK, (int)V, 1, rows) <= optin ? 1
	                                                          : 0;
	if (fl && nbuf)
		p = {fl, rows, nbuf};
	return p;
}

/* One key block [k0, k0 + kbn): its latent rows gathered (valid flags; bad table entries counted), K_h
 * decompressed at kn[j][h] (ldk a head: N, or N + R with the shared rotary part copied in for the fused
 * kernel) and V_h at vv[j][h] (V a head) */
int md_keys(struct kcuda_ctx *c, const struct kcuda_mla_dense_args *a, md_math mm, const md_carve &L,
            uint8_t *w8, int64_t k0, int64_t kbn, bool rope_in_k)
{
	const int64_t H = a->H, C = a->C, R = a->R, N = a->N, V = a->V, ldk = rope_in_k ? N + R : N;
	const struct kcuda_kv_view *kv = a->kv;
	void *wk = w8 + L.wk, *wv = w8 + L.wv, *lat = w8 + L.lat, *kn = w8 + L.kn, *vv = w8 + L.vv;
	int *valid = (int *)(w8 + L.valid);
	const int dim = (int)(C + R);
	const bool bf = mm.mode == KCUDA_MD_BF16;
	int rc = bf ? klaunch("mla_dense gather", md_gather_kernel<uint16_t>, dim3((unsigned)kbn), dim3(128),
	                      0, c->stream, (const uint8_t *)kv->base, kv->n_blocks, kv->block_bytes,
	                      kv->offset, kv->block_tokens, kv->bf16, a->blocks, a->ld_blocks, k0, dim,
	                      (uint16_t *)lat, valid, c->err_dev)
	            : klaunch("mla_dense gather", md_gather_kernel<float>, dim3((unsigned)kbn), dim3(128), 0,
	                      c->stream, (const uint8_t *)kv->base, kv->n_blocks, kv->block_bytes, kv->offset,
	                      kv->block_tokens, kv->bf16, a->blocks, a->ld_blocks, k0, dim, (float *)lat,
	                      valid, c->err_dev);
	if (rc)
		return rc;
	const cudaDataType_t kvt = mm.in(); /* K / V in the GEMM input type */
	/* K_h^T (N x kbn) = W_UK(h)^T c^T: W_UK(h) row-major C x N is column-major N x C */
	if ((rc = md_gemm(c, mm, CUBLAS_OP_N, CUBLAS_OP_N, N, kbn, C, 1.0f, wk, N, C * N, lat, C + R, 0, 0.0f,
	                  kn, kvt, H * ldk, ldk, H)))
		return rc;
	if (rope_in_k && R > 0) {
		const int64_t e = kbn * H * R;
		if ((rc = klaunch("mla_dense k rope", md_krope_kernel, dim3((unsigned)((e + 255) / 256)),
		                  dim3(256), 0, c->stream, (const uint16_t *)lat, dim, (int)C, (int)R, (int)H,
		                  (int)N, (int)kbn, (uint16_t *)kn)))
			return rc;
	}
	/* V_h^T (V x kbn) = W_UV(h) c^T: W_UV(h) row-major V x C is column-major C x V, transposed */
	return md_gemm(c, mm, CUBLAS_OP_T, CUBLAS_OP_N, V, kbn, C, 1.0f, wv, C, V * C, lat, C + R, 0, 0.0f,
	               vv, kvt, H * V, V, H);
}

} // namespace

extern "C" size_t kcuda_mla_dense_ws(struct kcuda_ctx *c, int64_t H, int64_t C, int64_t R, int64_t N,
                                     int64_t V, int64_t max_rows, int64_t max_keys, int math, int flash)
{
	if (!c || H <= 0 || C <= 0 || R < 0 || N <= 0 || V <= 0 || max_rows <= 0 || max_keys <= 0)
		return 0;
	int64_t kb, qb;
	md_blocks(H, max_rows, max_keys, &kb, &qb);
	const bool with_s = mdf_pick(c->device, math, flash, N, R, V).fl == NULL;
	return md_layout(H, C, R, N, V, max_rows, kb, qb, with_s).total;
}

extern "C" int kcuda_mla_dense(struct kcuda_ctx *c, const struct kcuda_mla_dense_args *a, void *ws,
                               size_t ws_bytes)
{
	const char *op = "mla_dense";
	if (!c || !a || !a->kv || !a->blocks || !a->q || !a->qr || !a->k_b || !a->v_b || !a->out || !ws)
		return kcuda_bad_arg(op, "NULL argument");
	const int64_t H = a->H, C = a->C, R = a->R, N = a->N, V = a->V, n = a->n;
	const struct kcuda_kv_view *kv = a->kv;
	if (H <= 0 || C <= 0 || R < 0 || N <= 0 || V <= 0 || n < 0 || a->pos0 < 0 || a->ld_blocks <= 0)
		return kcuda_bad_arg(op, "H %lld C %lld R %lld N %lld V %lld n %lld pos0 %lld ld_blocks %lld",
		                     (long long)H, (long long)C, (long long)R, (long long)N, (long long)V,
		                     (long long)n, (long long)a->pos0, (long long)a->ld_blocks);
	if (kv->dim != C + R || kv->block_tokens <= 0 || kv->n_blocks < 0 || !kv->base)
		return kcuda_bad_arg(op, "KV view of dim %lld (C + R = %lld), block_tokens %d",
		                     (long long)kv->dim, (long long)(C + R), kv->block_tokens);
	if (a->k_b->n_out != C || a->k_b->n_in != N || a->v_b->n_out != V || a->v_b->n_in != C)
		return kcuda_bad_arg(
		    op, "k_b %lld x %lld (want %lld x %lld), v_b %lld x %lld (want %lld x %lld)",
		    (long long)a->k_b->n_out, (long long)a->k_b->n_in, (long long)C, (long long)N,
		    (long long)a->v_b->n_out, (long long)a->v_b->n_in, (long long)V, (long long)C);
	if (a->ldq < H * a->q_hs || a->q_hs < N || a->ldqr < H * a->qr_hs || a->qr_hs < R || a->ldo < H * V)
		return kcuda_bad_arg(op, "strides: ldq %lld q_hs %lld ldqr %lld qr_hs %lld ldo %lld",
		                     (long long)a->ldq, (long long)a->q_hs, (long long)a->ldqr,
		                     (long long)a->qr_hs, (long long)a->ldo);
	if (a->math != KCUDA_MD_F32 && a->math != KCUDA_MD_TF32 && a->math != KCUDA_MD_BF16)
		return kcuda_bad_arg(op, "math %d", a->math);
	const int64_t nk = a->pos0 + n; /* keys 0 .. pos0 + n - 1 */
	if (nk > a->ld_blocks * kv->block_tokens)
		return kcuda_bad_arg(op, "positions up to %lld beyond the block table (%lld blocks of %d)",
		                     (long long)nk, (long long)a->ld_blocks, kv->block_tokens);
	if (n == 0)
		return 0;
	int64_t kb, qb;
	md_blocks(H, n, nk, &kb, &qb);
	if (a->kb > 0 && a->kb < kb)
		kb = a->kb;
	if (a->qb > 0 && a->qb < qb)
		qb = a->qb;
	if (kb > MD_KB)
		return kcuda_bad_arg(op, "key block %lld > %d", (long long)kb, MD_KB);
	/* the fused kernel where it applies (the bf16 math; no score buffer), else the GEMMs */
	const mdf_plan fp = mdf_pick(c->device, a->math, a->flash, N, R, V);
	const bool flash = fp.fl != NULL;
	const int DK = (int)(N + R), rows = fp.rows, nbuf = fp.nbuf;
	const mdf_launch_fn fl = fp.fl;
	const md_carve L = md_layout(H, C, R, N, V, n, kb, qb, !flash);
	if (L.total > ws_bytes)
		return ERR_LIMIT;
	if (!md_fits(H * N) || !md_fits(H * V) || !md_fits(C + R))
		return ERR_LIMIT;
	const md_math mm = {a->math};
	const bool bf = a->math == KCUDA_MD_BF16;
	const size_t esz = bf ? 2 : 4; /* bytes of a GEMM input element */
	uint8_t *w8 = (uint8_t *)ws;
	void *kn = w8 + L.kn, *vv = w8 + L.vv, *lat = w8 + L.lat;
	float *s = (float *)(w8 + L.s);
	float *m_run = (float *)(w8 + L.m), *l_run = (float *)(w8 + L.l);
	int *valid = (int *)(w8 + L.valid);
	uint16_t *qh = (uint16_t *)(w8 + L.qh);
	int rc;
	if ((rc = md_dequant_heads(c, a->k_b, a->k_b_stride, H, bf, w8 + L.wk)) ||
	    (rc = md_dequant_heads(c, a->v_b, a->v_b_stride, H, bf, w8 + L.wv)))
		return rc;
	/* the query parts the S products read: the caller's fp32 rows, or their bf16 copy qh[i][h][N + R] */
	const void *qn = a->q, *qrp = a->qr;
	int64_t ldqn = a->ldq, qn_hs = a->q_hs, ldqrp = a->ldqr, qrp_hs = a->qr_hs;
	if (bf) {
		if ((rc = klaunch("mla_dense q bf16", md_qcat_kernel, dim3((unsigned)n), dim3(256), 0,
		                  c->stream, a->q, a->ldq, a->q_hs, a->qr, a->ldqr, a->qr_hs, (int)H, (int)N,
		                  (int)R, qh)))
			return rc;
		qn = qh, ldqn = H * DK, qn_hs = DK;
		qrp = qh + N, ldqrp = H * DK, qrp_hs = DK;
	}
	const float sl2 = a->scale * 1.4426950408889634f; /* the fused kernel's scores in the log2 domain */
	/* element offsets into the S / P buffer: P (bf16) takes the first half of each row's bytes */
	const int64_t pe = bf ? 2 : 1;
	for (int64_t k0 = 0; k0 < nk; k0 += kb) {
		const int64_t kbn = nk - k0 < kb ? nk - k0 : kb;
		if ((rc = md_keys(c, a, mm, L, w8, k0, kbn, flash)))
			return rc;
		if (flash) { /* the rows that see the block, one launch */
			const int64_t rs = k0 - a->pos0 > 0 ? k0 - a->pos0 : 0;
			if (rs < n && (rc = fl(c, nbuf, rows, qh, (const uint16_t *)kn, (const uint16_t *)vv,
			                       valid, (int)H, DK, (int)n, rs, a->pos0, k0, (int)kbn, sl2,
			                       k0 == 0, m_run, l_run, a->out, a->ldo)))
				return rc;
			continue;
		}
		const bool first = k0 == 0;
		/* on the diagonal (rows that see only part of the block) smaller row blocks, so the GEMMs
		 * skip most of the masked triangle: each row block's keys end at its last row */
		const int64_t qd = kbn / 4 < MD_QB_MIN ? MD_QB_MIN : kbn / 4;
		for (int64_t r0 = 0, r1; r0 < n; r0 = r1) {
			const bool diag = k0 + kbn - 1 > a->pos0 + r0;
			const int64_t step = diag && qd < qb ? qd : qb;
			r1 = n - r0 < step ? n : r0 + step;
			/* rows before the block's first key see none of it */
			const int64_t rs = k0 - a->pos0 > r0 ? k0 - a->pos0 : r0;
			if (rs >= r1)
				continue;
			const int64_t nq = r1 - rs;
			/* keys up to the last row's position */
			const int64_t kl = a->pos0 + r1 - k0;
			const int64_t kbe = kl < kbn ? kl : kbn;
			/* S_h^T (kbe x nq) = K_h q_h^T (+ k_r q_r,h^T), column-major: S_h is row-major nq x
			 * kbe */
			if ((rc = md_gemm(c, mm, CUBLAS_OP_T, CUBLAS_OP_N, kbe, nq, N, a->scale, kn, H * N, N,
			                  (const uint8_t *)qn + (size_t)(rs * ldqn) * esz, ldqn, qn_hs, 0.0f,
			                  s, CUDA_R_32F, kbe, nq * kbe, H)))
				return rc;
			if (R > 0 && (rc = md_gemm(c, mm, CUBLAS_OP_T, CUBLAS_OP_N, kbe, nq, R, a->scale,
			                           (const uint8_t *)lat + (size_t)C * esz, C + R, 0,
			                           (const uint8_t *)qrp + (size_t)(rs * ldqrp) * esz, ldqrp,
			                           qrp_hs, 1.0f, s, CUDA_R_32F, kbe, nq * kbe, H)))
				return rc;
			const int64_t warps = nq * H;
			const dim3 g((unsigned)((warps + MD_WARPS - 1) / MD_WARPS)), t(32 * MD_WARPS);
			rc = bf ? klaunch("mla_dense softmax", md_softmax_kernel<uint16_t>, g, t, 0,
			                  c->stream, s, (int)nq, (int)kbe, (int)H, rs, a->pos0, k0,
			                  (int)first, valid, m_run, l_run, a->out, a->ldo, (int)V)
			        : klaunch("mla_dense softmax", md_softmax_kernel<float>, g, t, 0, c->stream,
			                  s, (int)nq, (int)kbe, (int)H, rs, a->pos0, k0, (int)first, valid,
			                  m_run, l_run, a->out, a->ldo, (int)V);
			if (rc)
				return rc;
			/* O_h^T (V x nq) += V_h^T P_h^T */
			if ((rc = md_gemm(c, mm, CUBLAS_OP_N, CUBLAS_OP_N, V, nq, kbe, 1.0f, vv, H * V, V, s,
			                  pe * kbe, pe * nq * kbe, 1.0f, a->out + rs * a->ldo, CUDA_R_32F,
			                  a->ldo, V, H)))
				return rc;
		}
	}
	const int64_t warps = n * H;
	return klaunch("mla_dense finish", md_finish_kernel,
	               dim3((unsigned)((warps + MD_WARPS - 1) / MD_WARPS)), dim3(32 * MD_WARPS), 0, c->stream,
	               n, (int)H, l_run, a->out, a->ldo, (int)V);
}
