/* MLA attention in the absorbed form over the paged KV cache, batched: the CUDA twin of running
 * kcpu_mla_attn_head for every (query row, head) as common/model/forward.c does (dense causal or
 * restricted to the indexer's top-k positions). One kernel serves decode and prefill.
 *
 * Grid: (query row, key split, head group). A block holds HG (8 or 16) heads of one row, so each
 * cached row it reads is used by HG heads (MQA: all heads share the latent keys). It walks its key
 * range in tiles of 32 rows: the tile is copied to shared memory as fp32 (row stride dim + 1 so that
 * lane = key column reads hit distinct banks); warp w scores its HG/8 heads against the 32 keys
 * (lane = key), keeps the running max / sum of the online softmax in registers and writes the
 * tile's probabilities to shared memory; then every thread owns channels c = tid + 256 j (C <= 512)
 * of all HG heads and accumulates p * c_t. Plain fp32 CUDA-core code (runs on sm_90/100/120).
 *
 * Split-K (flash-decoding): when rows * head groups give fewer blocks than ~4 per SM, the keys are
 * split (at least 128 keys per split); each split writes (max, sum, unnormalised acc) to the
 * context workspace and a combine kernel merges them (a block per row, head and 128 channels).
 * With one split the kernel normalises and writes out directly (prefill).
 *
 * Speed (docs/PERFORMANCE.md, H200): correct but far from the KV-read limit; the tile copy
 * serialises global-load latency and the score loop is shared-memory bound (fixes listed there).
 *
 * Numerics: fp32 dot (q_c . c + q_r . k_r, then * scale as the CPU op), expf, fp32 sums; agrees with
 * the CPU to ~1e-5 relative. Rows with no keys give 0 (as the CPU op). Bad positions or block ids
 * are skipped (score -inf) and counted in the context's error counter. */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/mla_attn_mode.cuh"

#define MLA_THREADS 256
#define MLA_TILE 32
#define MLA_CMAX 512 /* channels per thread: 2 */
#define MLA_MIN_TILES 4

struct mla_args {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt;
	int dim, bf16;
	const int32_t *qseq, *blocks, *n_keys, *sel;
	int64_t ld_blocks, pos0, ld_sel, max_keys;
	const float *q;
	int H, C, R;
	float scale;
	int chunk, nsplit;
	float *out; /* direct output (nsplit == 1) */
	float *pacc, *pm, *pl; /* partials: [row][h][split][C], [row][h][split] */
	unsigned *err;
};

__device__ __forceinline__ int mla_row_keys(const mla_args &a, int64_t row)
{
	int64_t n = a.n_keys ? (int64_t)a.n_keys[row] : a.pos0 + row + 1;
	if (n < 0 || n > a.max_keys) {
		if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
			atomicAdd(a.err, 1u);
		n = n < 0 ? 0 : a.max_keys;
	}
	return (int)n;
}

/* address of the row of position j of query row `row`, or NULL (bad position / block) */
__device__ __forceinline__ const uint8_t *mla_key_row(const mla_args &a, int64_t row, int j)
{
	int64_t p = a.sel ? (int64_t)a.sel[row * a.ld_sel + j] : (int64_t)j;
	if (p < 0 || p >= a.ld_blocks * a.bt)
		return NULL;
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	const int64_t blk = a.blocks[(int64_t)tbl * a.ld_blocks + p / a.bt];
	if (blk < 0 || blk >= a.n_blocks)
		return NULL;
	return a.base + (size_t)blk * a.block_bytes + a.offset +
	       (size_t)(p % a.bt) * (size_t)a.dim * (a.bf16 ? 2u : 4u);
}

template <int HG> __global__ void __launch_bounds__(MLA_THREADS) mla_split_kernel(mla_args a)
{
	KDEP_ENTRY();
	extern __shared__ float sm[];
	const int dim = a.dim, DP = dim + 1, C = a.C;
	float *q_s = sm; /* [HG][dim] */
	float *kv_s = q_s + HG * dim; /* [TILE][DP] */
	float *p_s = kv_s + MLA_TILE * DP; /* [HG][TILE] */
	float *corr_s = p_s + HG * MLA_TILE; /* [HG] */
	int *ok_s = (int *)(corr_s + HG); /* [TILE] */

	const int64_t row = blockIdx.x;
	const int split = blockIdx.y, h0 = blockIdx.z * HG;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	constexpr int HPW = HG / 8; /* heads per warp */
	const int nk = mla_row_keys(a, row);
	const int k0 = split * a.chunk, k1 = min(nk, k0 + a.chunk);

	for (int i = tid; i < HG * dim; i += MLA_THREADS) {
		const int h = h0 + i / dim;
		q_s[i] = h < a.H ? a.q[(row * a.H + h) * (int64_t)dim + i % dim] : 0.0f;
	}
	float m[HPW], l[HPW];
#pragma unroll
	for (int j = 0; j < HPW; j++) {
		m[j] = -INFINITY;
		l[j] = 0.0f;
	}
	float acc[HG][MLA_CMAX / MLA_THREADS];
#pragma unroll
	for (int h = 0; h < HG; h++)
#pragma unroll
		for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++)
			acc[h][j] = 0.0f;
	__syncthreads();

	for (int t0 = k0; t0 < k1; t0 += MLA_TILE) {
		/* tile -> shared memory (warp per row, coalesced) */
		for (int t = warp; t < MLA_TILE; t += MLA_THREADS / 32) {
			const uint8_t *rp = t0 + t < k1 ? mla_key_row(a, row, t0 + t) : NULL;
			if (lane == 0) {
				ok_s[t] = rp != NULL;
				if (!rp && t0 + t < k1)
					atomicAdd(a.err, 1u);
			}
			float *dst = kv_s + t * DP;
			if (!rp) {
				for (int i = lane; i < dim; i += 32)
					dst[i] = 0.0f;
			} else if (a.bf16) {
				const uint16_t *r = (const uint16_t *)rp;
				for (int i = lane; i < dim; i += 32)
					dst[i] = kc_bf2f(r[i]);
			} else {
				const float *r = (const float *)rp;
				for (int i = lane; i < dim; i += 32)
					dst[i] = __ldg(r + i);
			}
		}
		__syncthreads();
		/* scores: warp -> HPW heads, lane -> key */
		{
			const float *kr = kv_s + lane * DP;
			float sc[HPW], sr[HPW];
#pragma unroll
			for (int j = 0; j < HPW; j++)
				sc[j] = sr[j] = 0.0f;
			for (int i = 0; i < C; i++) {
				const float kv = kr[i];
#pragma unroll
				for (int j = 0; j < HPW; j++)
					sc[j] = fmaf(q_s[(warp * HPW + j) * dim + i], kv, sc[j]);
			}
			for (int i = C; i < dim; i++) {
				const float kv = kr[i];
#pragma unroll
				for (int j = 0; j < HPW; j++)
					sr[j] = fmaf(q_s[(warp * HPW + j) * dim + i], kv, sr[j]);
			}
			const bool valid = ok_s[lane] && t0 + lane < k1;
#pragma unroll
			for (int j = 0; j < HPW; j++) {
				const float s = valid ? (sc[j] + sr[j]) * a.scale : -INFINITY;
				const float mt = kc_warp_max(s);
				const float mn = fmaxf(m[j], mt);
				/* all keys so far invalid: keep everything at 0 */
				const float corr = mn == -INFINITY ? 1.0f : expf(m[j] - mn);
				const float p = mn == -INFINITY ? 0.0f : expf(s - mn);
				l[j] = l[j] * corr + kc_warp_sum(p);
				m[j] = mn;
				p_s[(warp * HPW + j) * MLA_TILE + lane] = p;
				if (lane == 0)
					corr_s[warp * HPW + j] = corr;
			}
		}
		__syncthreads();
		/* accumulate: thread -> channels, all HG heads */
#pragma unroll
		for (int h = 0; h < HG; h++) {
			const float cr = corr_s[h];
#pragma unroll
			for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++)
				acc[h][j] *= cr;
		}
		const int tn = min(MLA_TILE, k1 - t0);
		for (int t = 0; t < tn; t++) {
			float kv[MLA_CMAX / MLA_THREADS];
#pragma unroll
			for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++) {
				const int cc = tid + j * MLA_THREADS;
				kv[j] = cc < C ? kv_s[t * DP + cc] : 0.0f;
			}
#pragma unroll
			for (int h = 0; h < HG; h++) {
				const float p = p_s[h * MLA_TILE + t];
#pragma unroll
				for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++)
					acc[h][j] = fmaf(p, kv[j], acc[h][j]);
			}
		}
		__syncthreads();
	}

	/* running (m, l) of each head to shared memory for the writers */
	float *ml_s = p_s; /* reuse: [HG][2] */
	if (lane == 0)
#pragma unroll
		for (int j = 0; j < HPW; j++) {
			ml_s[2 * (warp * HPW + j)] = m[j];
			ml_s[2 * (warp * HPW + j) + 1] = l[j];
		}
	__syncthreads();
#pragma unroll
	for (int h = 0; h < HG; h++) {
		if (h0 + h >= a.H)
			break;
		const int64_t rh = row * a.H + h0 + h;
		const float lh = ml_s[2 * h + 1];
		if (a.nsplit == 1) {
			const float inv = lh > 0.0f ? 1.0f / lh : 0.0f;
#pragma unroll
			for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++) {
				const int cc = tid + j * MLA_THREADS;
				if (cc < C)
					a.out[rh * C + cc] = acc[h][j] * inv;
			}
		} else {
			const int64_t ps = rh * a.nsplit + split;
			if (lh > 0.0f)
#pragma unroll
				for (int j = 0; j < MLA_CMAX / MLA_THREADS; j++) {
					const int cc = tid + j * MLA_THREADS;
					if (cc < C)
						a.pacc[ps * C + cc] = acc[h][j];
				}
			if (tid == 0) {
				a.pm[ps] = ml_s[2 * h];
				a.pl[ps] = lh;
			}
		}
	}
}

/* out[row][h] = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M); one block per (row, head) */
__global__ void mla_combine_kernel(const float *pacc, const float *pm, const float *pl, int nsplit, int C,
                                   float *out)
{
	KDEP_ENTRY();
	pacc = kdep_after(pacc); /* written by the kernel before: no load above the wait */
	pm = kdep_after(pm);
	pl = kdep_after(pl);
	const int64_t rh = blockIdx.x;
	const int c0 = blockIdx.y * blockDim.x; /* a block per (row, head, 128 channels) */
	const float *m = pm + rh * nsplit, *l = pl + rh * nsplit;
	float M = -INFINITY;
	for (int s = 0; s < nsplit; s++)
		if (l[s] > 0.0f)
			M = fmaxf(M, m[s]);
	float L = 0.0f;
	for (int s = 0; s < nsplit; s++)
		if (l[s] > 0.0f)
			L += l[s] * expf(m[s] - M);
	const float inv = L > 0.0f ? 1.0f / L : 0.0f;
	for (int cc = c0 + threadIdx.x; cc < C && cc < c0 + (int)blockDim.x; cc += blockDim.x) {
		float v = 0.0f;
		for (int s = 0; s < nsplit; s++)
			if (l[s] > 0.0f)
				v = fmaf(pacc[(rh * nsplit + s) * C + cc], expf(m[s] - M), v);
		out[rh * C + cc] = v * inv;
	}
}

static size_t mla_smem(int HG, int dim)
{
	return sizeof(float) *
	           ((size_t)HG * dim + (size_t)MLA_TILE * (dim + 1) + (size_t)HG * MLA_TILE + HG) +
	       sizeof(int) * MLA_TILE;
}

int kcuda_mla_attn_ref(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                       const struct kcuda_attn_rows *rows, const float *q, int64_t H, int64_t C, int64_t R,
                       float scale, float *out)
{
	if (!c || !kv || !rows || !q || !out || !kv->base || !rows->blocks || H < 1 || C < 1 || R < 0 ||
	    C > MLA_CMAX || kv->dim != C + R || kv->block_tokens < 1 || kv->n_blocks < 0 || rows->n_q < 0 ||
	    rows->ld_blocks < 1 || rows->max_keys < 0 || (rows->sel && rows->ld_sel < 1))
		return kcuda_bad_arg(
		    "mla_attn",
		    "H %d C %d (max %d) R %d kv dim %lld block_tokens %d n_q %lld ld_blocks %lld max_keys "
		    "%lld ld_sel %lld%s",
		    (int)H, (int)C, (int)MLA_CMAX, (int)R, kv ? (long long)kv->dim : -1LL,
		    kv ? (int)kv->block_tokens : -1, rows ? (long long)rows->n_q : -1LL,
		    rows ? (long long)rows->ld_blocks : -1LL, rows ? (long long)rows->max_keys : -1LL,
		    rows ? (long long)rows->ld_sel : -1LL,
		    !c || !kv || !rows || !q || !out || !kv->base || !rows->blocks ? ", or a null pointer"
		                                                                   : "");
	if (rows->n_q == 0)
		return 0;
	if (rows->n_q > INT32_MAX || rows->max_keys > INT32_MAX / 2 || H > 65535 * 16)
		return ERR_LIMIT;
	/* 16 heads a block where more than 8 and the shared memory allows (GLM-5 at 16+ heads a rank:
	 * ~112 KB, over sm_120's 99 KB), else 8 */
	const size_t optin = (size_t)kcuda_smem_optin(c->device);
	const int HG = H > 8 && mla_smem(16, (int)kv->dim) <= optin ? 16 : 8;
	const int n_hg = (int)((H + HG - 1) / HG);
	const size_t smem = mla_smem(HG, (int)kv->dim);
	if (smem > optin) {
		fprintf(
		    stderr,
		    "kcuda: mla_attn: a %d-wide KV row needs %zu bytes of shared memory a block, device %d "
		    "allows %zu\n",
		    (int)kv->dim, smem, c->device, optin);
		return ERR_LIMIT;
	}

	mla_args a;
	a.base = (const uint8_t *)kv->base;
	a.n_blocks = kv->n_blocks;
	a.block_bytes = kv->block_bytes;
	a.offset = kv->offset;
	a.bt = kv->block_tokens;
	a.dim = (int)kv->dim;
	a.bf16 = kv->bf16 ? 1 : 0;
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
	a.R = (int)R;
	a.scale = scale;
	a.out = out;
	a.err = c->err_dev;

	/* splits: aim at >= 4 blocks per SM, each split a whole number of tiles */
	const int64_t max_tiles = (rows->max_keys + MLA_TILE - 1) / MLA_TILE;
	const int64_t blocks = rows->n_q * n_hg;
	int64_t want = (4 * (int64_t)c->n_sm + blocks - 1) / blocks;
	if (want > max_tiles / MLA_MIN_TILES) /* >= 128 keys per split: partials stay small */
		want = max_tiles / MLA_MIN_TILES;
	if (want < 1)
		want = 1;
	/* partials must fit the workspace */
	const size_t per_split = (size_t)rows->n_q * (size_t)H * ((size_t)C + 2) * sizeof(float);
	if (want > 1 && (size_t)want * per_split > c->ws_bytes)
		want = (int64_t)(c->ws_bytes / per_split);
	if (want < 1)
		want = 1;
	const int64_t tiles_per = (max_tiles + want - 1) / want;
	a.chunk = (int)(tiles_per * MLA_TILE);
	a.nsplit = tiles_per ? (int)((max_tiles + tiles_per - 1) / tiles_per) : 1;
	if (a.nsplit < 1)
		a.nsplit = 1;
	if (a.chunk < MLA_TILE)
		a.chunk = MLA_TILE;
	if (a.nsplit > 65535)
		return ERR_LIMIT;
	float *ws = (float *)c->ws;
	const size_t n_ps = (size_t)rows->n_q * (size_t)H * (size_t)a.nsplit;
	a.pacc = ws;
	a.pm = ws + n_ps * (size_t)C;
	a.pl = a.pm + n_ps;

	dim3 grid((unsigned)rows->n_q, (unsigned)a.nsplit, (unsigned)n_hg);
	cudaStream_t st = c->stream;
	int rc;
	if (HG == 8) {
		if (cudaFuncSetAttribute(mla_split_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                         (int)smem) != cudaSuccess)
			return kcuda_launch_status("mla_split attribute");
		rc = klaunch("mla_split", mla_split_kernel<8>, grid, dim3(MLA_THREADS), smem, st, a);
	} else {
		if (cudaFuncSetAttribute(mla_split_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                         (int)smem) != cudaSuccess)
			return kcuda_launch_status("mla_split attribute");
		rc = klaunch("mla_split", mla_split_kernel<16>, grid, dim3(MLA_THREADS), smem, st, a);
	}
	if (rc || a.nsplit == 1)
		return rc;
	dim3 cgrid((unsigned)(rows->n_q * H), (unsigned)((C + 127) / 128));
	return klaunch("mla_combine", mla_combine_kernel, cgrid, dim3(128), 0, st, a.pacc, a.pm, a.pl,
	               a.nsplit, a.C, out);
}
