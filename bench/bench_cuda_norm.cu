/* add + RMSNorm (kfuse_add_rmsnorm_as) by each of its kernels, in CUDA graphs with PDL, as the decode
 * step chains it: a product-sized kernel (a 13.4 MB weight stream, prefetched into L2 before its
 * griddepcontrol.wait as gemv does, reading the norm's output and writing `part`) and the norm
 * (h += part, a = rms(h) * w) after it, 100 pairs per graph. Printed per kernel and batch (1, 8):
 *   norm chain   us per norm in a chain of 200 norms, each adding the previous one's output;
 *   pair         us per (product + norm) pair;
 *   marginal     pair minus the product alone (a chain of 100 products): what the norm adds to the
 *                step, the number that counts (session 4: a faster norm that the next kernel's
 *                weight stream absorbed did not move the step).
 *   bench_cuda_norm          (a few seconds) */
#include <stdio.h>
#include <vector>

#include "bench/bench_cuda_time.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused.h"

/* stands for a weight product: prefetch its slice of the weights into L2 before the wait, stream
 * them after it, read the activations `a` (written by the kernel before), write `part` */
__global__ void prod_kernel(const uint4 *w, size_t per, int pf, const float *a, int64_t na, float *part)
{
	const uint4 *p = w + (size_t)blockIdx.x * per;
	if (pf && threadIdx.x == 0)
		kdep_prefetch_l2(p, per * 16);
	KDEP_ENTRY();
	a = kdep_after(a);
	unsigned s = 0;
	for (size_t i = threadIdx.x; i < per; i += blockDim.x) {
		const uint4 q = __ldcs(p + i);
		s ^= q.x ^ q.y ^ q.z ^ q.w;
	}
	const float av = a[((int64_t)blockIdx.x * 37 + threadIdx.x) % na];
	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < na;
	     e += (int64_t)gridDim.x * blockDim.x)
		part[e] = 1e-3f * av + (s == 0x12345678u ? 1.0f : 0.0f);
}

template <class F> static float graph_us(cudaStream_t st, int nodes, F add)
{
	cudaGraph_t g;
	cudaGraphExec_t ge;
	KCUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
	for (int i = 0; i < nodes; i++)
		add(i);
	KCUDA_CHECK(cudaStreamEndCapture(st, &g));
	KCUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
	const float ms = bench_time_ms(st, 2, 10, 1, [&](int) { KCUDA_CHECK(cudaGraphLaunch(ge, st)); });
	KCUDA_CHECK(cudaGraphExecDestroy(ge));
	KCUDA_CHECK(cudaGraphDestroy(g));
	return ms * 1000.0f;
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 0;
	}
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 1u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	cudaDeviceProp prop;
	KCUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
	const cudaStream_t st = c->stream;
	const int64_t D = 6144;
	const size_t bytes = (size_t)6144 * 2048 * 34 / 32; /* q_a Q8_0 at one token: 13.4 MB */
	const int nbk = 1536; /* the o product's grid at one token (gemv_kernel 1536 x 128) */
	const size_t per = bytes / 16 / nbk;
	const int copies = 8; /* rotate: 8 x 13.4 MB > L2, every product reads HBM */
	uint4 *w;
	KCUDA_CHECK(cudaMalloc(&w, per * 16 * nbk * copies));
	KCUDA_CHECK(cudaMemset(w, 1, per * 16 * nbk * copies));
	float *h, *y[2], *part, *nw;
	KCUDA_CHECK(cudaMalloc(&h, sizeof(float) * D * 8));
	KCUDA_CHECK(cudaMalloc(&y[0], sizeof(float) * D * 8));
	KCUDA_CHECK(cudaMalloc(&y[1], sizeof(float) * D * 8));
	KCUDA_CHECK(cudaMalloc(&part, sizeof(float) * D * 8));
	KCUDA_CHECK(cudaMalloc(&nw, sizeof(float) * D));
	std::vector<float> ones(D * 8, 1.0f);
	for (int i = 0; i < 2; i++)
		KCUDA_CHECK(cudaMemcpy(y[i], ones.data(), sizeof(float) * D * 8, cudaMemcpyHostToDevice));
	KCUDA_CHECK(cudaMemcpy(h, ones.data(), sizeof(float) * D * 8, cudaMemcpyHostToDevice));
	KCUDA_CHECK(cudaMemcpy(part, ones.data(), sizeof(float) * D * 8, cudaMemcpyHostToDevice));
	KCUDA_CHECK(cudaMemcpy(nw, ones.data(), sizeof(float) * D, cudaMemcpyHostToDevice));

	printf("%s, %d SMs; add_rmsnorm of %lld-float rows in CUDA graphs with PDL %s; us (median of 10 "
	       "replays)\n",
	       prop.name, prop.multiProcessorCount, (long long)D, kcuda_pdl_enabled() ? "on" : "OFF");
	printf("%-22s %5s %11s %9s %9s %9s\n", "kernel", "rows", "norm chain", "product", "pair", "marginal");
	static const int kinds[] = {KFUSE_AN_OLD, KFUSE_AN_V4, KFUSE_AN_V4 | KFUSE_AN_EARLY, KFUSE_AN_CL,
	                            KFUSE_AN_CL | KFUSE_AN_EARLY};
	static const char *const names[] = {"old (1024 threads)", "v4 (256 threads)", "v4 + early trigger",
	                                    "cl (cluster)", "cl + early trigger"};
	const int N = 200, M = 100;
	for (int rows = 1; rows <= 8; rows += 7) {
		int k = 0;
		bool pok = true;
		const float t_prod =
		    graph_us(st, M,
		             [&](int i) {
			             pok = pok &&
			                   klaunch("prod", prod_kernel, dim3(nbk), dim3(128), 0, st,
			                           (const uint4 *)(w + (k++ % copies) * per * nbk), per, 1,
			                           (const float *)y[i & 1], D * rows, y[(i + 1) & 1]) == 0;
		             }) /
		    M;
		if (!pok) {
			printf("product launch failed\n");
			return 1;
		}
		for (int ki = 0; ki < 5; ki++) {
			const int kind = kinds[ki];
			bool ok = true;
			const float t_norm =
			    graph_us(st, N,
			             [&](int i) {
				             ok = ok &&
				                  kfuse_add_rmsnorm_as(c, kind, h, y[i & 1], y[(i + 1) & 1],
				                                       nw, D, rows, 1e-5f) == 0;
			             }) /
			    N;
			const float t_pair =
			    graph_us(st, M,
			             [&](int) {
				             ok = ok &&
				                  klaunch("prod", prod_kernel, dim3(nbk), dim3(128), 0, st,
				                          (const uint4 *)(w + (k++ % copies) * per * nbk),
				                          per, 1, (const float *)y[0], D * rows, part) == 0;
				             ok = ok && kfuse_add_rmsnorm_as(c, kind, h, part, y[0], nw, D,
				                                             rows, 1e-5f) == 0;
			             }) /
			    M;
			if (!ok) {
				printf("%-22s %5d  declined or failed\n", names[ki], rows);
				(void)cudaGetLastError();
				continue;
			}
			printf("%-22s %5d %11.2f %9.2f %9.2f %9.2f\n", names[ki], rows, t_norm, t_prod,
			       t_pair, t_pair - t_prod);
		}
	}
	KCUDA_CHECK(cudaStreamSynchronize(st));
	KCUDA_CHECK(cudaFree(w));
	KCUDA_CHECK(cudaFree(h));
	KCUDA_CHECK(cudaFree(y[0]));
	KCUDA_CHECK(cudaFree(y[1]));
	KCUDA_CHECK(cudaFree(part));
	KCUDA_CHECK(cudaFree(nw));
	kcuda_ctx_destroy(c);
	return 0;
}
