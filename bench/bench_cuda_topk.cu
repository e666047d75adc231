/* The indexer's top-k alone at decode shapes, as the decode graph runs it: 78 calls (one per GLM-5
 * layer) captured in one CUDA graph with PDL, replayed; microseconds per call (median of replays)
 * for the paths behind kcuda_topk_idx_short / kcuda_indexer_topk:
 *   old     what the indexer took before topk_fast.cu: the one-block shared-memory radix kernel
 *           (topk_short_kernel) for strides up to 8192, the 5-launch multi-block radix path above;
 *   short   topk_short_kernel at every stride that fits (TANDEM_TOPK=old, TANDEM_TOPK_SHORT_MAX);
 *   new     topk_fast.cu, default block shape, and each TANDEM_TOPK_THREADS shape (256 / 512 / 1024);
 *   sample-flip  topk_fast.cu with TANDEM_TOPK_SAMPLE flipped (on at <= 8192, off above).
 * Shapes: batch 1 and 8; n 4096 (stride 4096), n 4100 at the strides the synthetic bench's graphs
 * use (4112 = the context bucket capped at max_ctx with --matrix-ctx 4096; 8192 with 4096,32768),
 * n 32768; score data: weighted sums of 32 ReLU terms (narrow, as the indexer's) and all equal
 * (the synthetic model's constant pools). The empty-kernel line is the graph-node floor. Every
 * selection is checked against kcpu_topk ("ok" / "WRONG"). Usage: bench_cuda_topk (about 5 s). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_cuda_time.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/topk_fast.cuh"
#include "tests/ops/ops_util.h"

#define L 78
#define K 2048

static struct kcuda_ctx *ctx;

__global__ void empty_kernel(int *sink)
{
	KDEP_ENTRY();
	if (sink && threadIdx.x == 1024) /* never: keeps the argument */
		*sink = 0;
}

/* us per call of fn() in a graph of L calls; 0 when the capture or a call failed */
template <class F> static double graph_us(F fn)
{
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	cudaGraph_t g = NULL;
	cudaGraphExec_t ge = NULL;
	int rc = 0;
	if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
		return 0;
	for (int l = 0; l < L; l++)
		rc |= fn();
	if (cudaStreamEndCapture(st, &g) != cudaSuccess || rc ||
	    cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
		(void)cudaGetLastError();
		if (g)
			cudaGraphDestroy(g);
		return 0;
	}
	const float ms = bench_time_ms(st, 3, 15, 4, [&](int) { KCUDA_CHECK(cudaGraphLaunch(ge, st)); });
	cudaGraphExecDestroy(ge);
	cudaGraphDestroy(g);
	return kcuda_sync(ctx) ? 0 : (double)ms * 1000.0 / L;
}

static float score(int data)
{
	if (data == 1)
		return 0.5f;
	float v = 0.0f;
	for (int h = 0; h < 32; h++) {
		const float x = ops_rng_unif();
		v += (float)(h % 7 + 1) / 16.0f * (x > 0.0f ? x : 0.0f);
	}
	return v;
}

/* one shape: B rows of n scores at stride ld */
static void bench_shape(int B, int n, int64_t ld, int data, float *d_s, int32_t *d_n, int32_t *d_o)
{
	float *s = (float *)malloc(sizeof(float) * (size_t)(B * ld));
	int32_t *got = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * K)), ref[K], nk[8];
	for (int64_t i = 0; i < B * ld; i++)
		s[i] = score(data);
	for (int b = 0; b < B; b++)
		nk[b] = n;
	kcuda_upload(ctx, d_s, s, sizeof(float) * (size_t)(B * ld));
	kcuda_upload(ctx, d_n, nk, sizeof(int32_t) * (size_t)B);
	printf("B %d n %5d ld %5lld %s |", B, n, (long long)ld, data ? "equal" : "relu ");
	static const char *const names[] = {"old", "short", "new", "256", "512", "1024", "sample-flip"};
	for (int v = 0; v < 7; v++) {
		unsetenv("TANDEM_TOPK");
		unsetenv("TANDEM_TOPK_THREADS");
		unsetenv("TANDEM_TOPK_SAMPLE");
		if (v < 2)
			setenv("TANDEM_TOPK", "old", 1);
		if (v >= 3 && v < 6)
			setenv("TANDEM_TOPK_THREADS", names[v], 1);
		if (v == 6) /* the sampled range where it is off by default, and off where it is on */
			setenv("TANDEM_TOPK_SAMPLE", ld > 8192 ? "0" : "1", 1);
		auto call = [&]() -> int {
			if (v == 0 && ld > KFUSE_TOPK_SHORT_DEFAULT) /* the radix path (ctx workspace) */
				return kcuda_topk_idx(ctx, d_s, ld, B, d_n, 0, K, d_o, K, NULL);
			return kcuda_topk_idx_short(ctx, d_s, ld, B, d_n, 0, K, d_o, K, NULL);
		};
		if (call() != 0 || kcuda_sync(ctx) != 0) {
			printf(" %s -", names[v]);
			(void)cudaGetLastError();
			continue;
		}
		KCUDA_CHECK(cudaMemset(d_o, 0xff, sizeof(int32_t) * (size_t)(B * K)));
		const double us = graph_us(call);
		int ok = us > 0 && kcuda_download(ctx, got, d_o, sizeof(int32_t) * (size_t)(B * K)) == 0;
		for (int b = 0; b < B && ok; b++) {
			const int m = kcpu_topk(s + b * ld, n, K, ref);
			ok = memcmp(ref, got + b * K, sizeof(int32_t) * (size_t)m) == 0;
		}
		printf(" %s %5.2f%s", names[v], us, ok ? "" : " WRONG");
	}
	unsetenv("TANDEM_TOPK");
	unsetenv("TANDEM_TOPK_THREADS");
	unsetenv("TANDEM_TOPK_SAMPLE");
	printf("  us/call (graph of %d, PDL)\n", L);
	free(s);
	free(got);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	if (kcuda_ctx_create(0, (size_t)64 << 20, &ctx)) { /* the radix path's scratch */
		printf("no CUDA context\n");
		return 1;
	}
	void *d_s = NULL, *d_n = NULL, *d_o = NULL, *d_z = NULL;
	if (kcuda_alloc(sizeof(float) * 8 * 32832, &d_s) || kcuda_alloc(sizeof(int32_t) * 8, &d_n) ||
	    kcuda_alloc(sizeof(int32_t) * 8 * K, &d_o) || kcuda_alloc(64, &d_z)) {
		printf("allocation failed\n");
		return 1;
	}
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	const double e =
	    graph_us([&]() { return klaunch("empty", empty_kernel, dim3(1), dim3(32), 0, st, (int *)d_z); });
	printf("empty kernel (1 block): %.2f us/node\n", e);
	float *s = (float *)d_s;
	int32_t *n = (int32_t *)d_n, *o = (int32_t *)d_o;
	bench_shape(1, 4096, 4096, 0, s, n, o);
	bench_shape(1, 4100, 4112, 0, s, n, o);
	bench_shape(1, 4100, 8192, 0, s, n, o);
	bench_shape(1, 4100, 4112, 1, s, n, o);
	bench_shape(8, 4100, 4112, 0, s, n, o);
	bench_shape(8, 4100, 8192, 0, s, n, o);
	bench_shape(1, 32768, 32768, 0, s, n, o);
	bench_shape(8, 32768, 32768, 0, s, n, o);
	bench_shape(1, 32768, 32768, 1, s, n, o);
	bench_shape(1, 32775, 32832, 0, s, n, o); /* the 32k graph's stride: shared-memory keys */
	bench_shape(8, 32775, 32832, 0, s, n, o);
	kcuda_free(d_s);
	kcuda_free(d_n);
	kcuda_free(d_o);
	kcuda_free(d_z);
	kcuda_ctx_destroy(ctx);
	return 0;
}
