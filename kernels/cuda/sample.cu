/* Token sampling from logits on the device: greedy (argmax, ties to the lower id, NaN ranks as
 * -inf as in kcpu_topk) or top-k with temperature: softmax over the k best logits
 * (kcuda_topk order: logit descending, ties to the lower id), scaled by 1/temperature, then the first
 * candidate whose cumulative probability exceeds u * total, with u in [0, 1) given per row on the
 * device (so a CUDA graph can replay it with fresh random numbers).
 * Grid: argmax: one block per row; top-k: kcuda_topk into the workspace, then one block per row
 * over its k candidates (k <= SAMPLE_MAX_K). */
#include <errno.h>

#include "kernels/cuda/cuda_common.cuh"

#define ARGMAX_THREADS 1024
#define SAMPLE_MAX_K 1024

/* packs (key, id) so that a larger value is a better candidate: higher key, then lower id */
__device__ __forceinline__ unsigned long long am_pack(float v, int id)
{
	const uint32_t u = __float_as_uint(v);
	/* NaN ranks as -inf; -0 ties with +0 (the CPU's float comparison: the lower id wins) */
	const uint32_t key = (v != v)      ? 0x007fffffu
	                     : (v == 0.0f) ? 0x80000000u
	                                   : ((u & 0x80000000u) ? ~u : (u | 0x80000000u));
	return ((unsigned long long)key << 32) | (0xffffffffu - (uint32_t)id);
}

__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const float *__restrict__ s, int64_t ld, int n, int32_t *__restrict__ out)
{
	KDEP_ENTRY();
	__shared__ unsigned long long red[ARGMAX_THREADS / 32];
	const float *p = s + blockIdx.x * ld;
	unsigned long long best = 0; /* below every packed (key, id): key >= 0x007fffff */
	for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
		const unsigned long long c = am_pack(p[i], i);
		best = c > best ? c : best;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const unsigned long long c = __shfl_xor_sync(0xffffffffu, best, o);
		best = c > best ? c : best;
	}
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = best;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int k = 1; k < ARGMAX_THREADS / 32; k++)
			best = red[k] > best ? red[k] : best;
		out[blockIdx.x] = (int32_t)(0xffffffffu - (uint32_t)best);
	}
}

__global__ void __launch_bounds__(SAMPLE_MAX_K)
    sample_topk_kernel(const float *__restrict__ s, int64_t ld, const int32_t *__restrict__ cand, int k,
                       float inv_temp, const float *__restrict__ u, int32_t *__restrict__ out)
{
	KDEP_ENTRY();
	__shared__ float prob[SAMPLE_MAX_K];
	__shared__ int32_t id_by_rank[SAMPLE_MAX_K];
	__shared__ float vmax;
	const float *p = s + blockIdx.x * ld;
	const int32_t *cr = cand + (int64_t)blockIdx.x * k;
	const int t = threadIdx.x;
	float v = 0.0f;
	int32_t id = 0;
	int rank = 0;
	if (t < k) {
		id = cr[t];
		v = p[id];
		const unsigned long long me = am_pack(v, id);
		for (int j = 0; j < k; j++) {
			const int32_t o = cr[j];
			rank += am_pack(p[o], o) > me;
		}
		if (rank == 0)
			vmax = v;
	}
	__syncthreads();
	if (t < k) {
		/* a NaN logit among the candidates gets zero probability */
		prob[rank] = (v == v) ? expf((v - vmax) * inv_temp) : 0.0f;
		id_by_rank[rank] = id;
	}
	__syncthreads();
	if (t == 0) {
		float tot = 0.0f;
		for (int j = 0; j < k; j++)
			tot += prob[j];
		const float target = u[blockIdx.x] * tot;
		float cum = 0.0f;
		int pick = 0;
		for (int j = 0; j < k; j++) {
			cum += prob[j];
			pick = j;
			if (cum > target)
				break;
		}
		out[blockIdx.x] = id_by_rank[pick];
	}
}

extern "C" int kcuda_sample(struct kcuda_ctx *c, const float *logits, int64_t ld, int64_t n_vocab,
                            int64_t n_rows, int k, float temperature, const float *u, int32_t *out_ids)
{
	if (!c || !logits || !out_ids || n_vocab <= 0 || n_vocab > INT32_MAX || n_rows < 0 ||
	    n_rows > INT32_MAX || ld < n_vocab || k < 0 || k > SAMPLE_MAX_K)
		return kcuda_bad_arg("sample", "n_vocab %lld rows %lld ld %lld k %d (max %d)%s",
		                     (long long)n_vocab, (long long)n_rows, (long long)ld, k,
		                     (int)SAMPLE_MAX_K,
		                     !c || !logits || !out_ids ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	if (temperature <= 0.0f || k == 1) {
		return klaunch("argmax", argmax_kernel, dim3((unsigned)n_rows), dim3(ARGMAX_THREADS), 0,
		               c->stream, logits, ld, (int)n_vocab, out_ids);
	}
	if (!u || k == 0)
		return kcuda_bad_arg("sample", "temperature %g needs k >= 1 (k %d) and uniforms (%s)",
		                     (double)temperature, k, u ? "given" : "null");
	const int kk = k < n_vocab ? k : (int)n_vocab;
	if ((size_t)n_rows * (size_t)kk * sizeof(int32_t) > c->ws_bytes)
		return ERR_LIMIT;
	int32_t *cand = (int32_t *)c->ws;
	int rc = kcuda_topk(c, logits, ld, n_vocab, n_rows, kk, cand, kk);
	if (rc)
		return rc;
	return klaunch("sample_topk", sample_topk_kernel, dim3((unsigned)n_rows), dim3(SAMPLE_MAX_K), 0,
	               c->stream, logits, ld, cand, kk, 1.0f / temperature, u, out_ids);
}
