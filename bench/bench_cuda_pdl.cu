/* The cost of a kernel boundary in a decode graph, and what the weight prefetch before
 * griddepcontrol.wait buys (cuda_common.cuh). A batch-1 decode step is ~1700 small kernels in
 * one CUDA graph, so the per-node floor times the node count bounds the step from below, however
 * fast each kernel's body is. Measured, each as a graph of N nodes replayed (median of replays):
 *   1. empty kernels (KDEP_ENTRY only), 1 block and 132 x 4 blocks, PDL on and off;
 *   2. a chain where each kernel reads what the previous one wrote (one dependent round trip);
 *   3. a 5 us one-block kernel followed by a 13.4 MB weight read (the shape of q_a at one token),
 *      with and without the L2 prefetch of the weights before KDEP_ENTRY, against the read time
 *      of the same bytes alone.
 *   bench_cuda_pdl          (about 5 s) */
#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

#define CK(x)                                                                                                \
	do {                                                                                                 \
		cudaError_t e_ = (x);                                                                        \
		if (e_ != cudaSuccess) {                                                                     \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));          \
			exit(1);                                                                             \
		}                                                                                            \
	} while (0)

__global__ void empty_kernel(int *sink)
{
	KDEP_ENTRY();
	if (sink && threadIdx.x == 1024) /* never: keeps the argument */
		*sink = 0;
}

/* one dependent round trip: read the previous kernel's value, write the next */
__global__ void chain_kernel(int *v)
{
	KDEP_ENTRY();
	if (threadIdx.x == 0)
		v[1] = v[0] + 1, v[0] = v[1];
}

/* about `ns` of one block's work (a clock spin), standing for a small latency-bound kernel */
__global__ void spin_kernel(long long ns, int *sink)
{
	KDEP_ENTRY();
	const long long t0 = clock64();
	while (clock64() - t0 < ns * 2) /* ~2 GHz: an estimate, the bench reports the measured time */
		;
	if (threadIdx.x == 0 && sink)
		sink[blockIdx.x] = 1;
}

/* a weight read: each block sums its contiguous slice (int4 loads, 4 in flight per thread) */
__global__ void read_kernel(const uint4 *w, size_t n16_per_block, int pf, unsigned *out)
{
	const uint4 *p = w + (size_t)blockIdx.x * n16_per_block;
	if (pf && threadIdx.x == 0)
		kdep_prefetch_l2(p, n16_per_block * 16);
	KDEP_ENTRY();
	unsigned s = 0;
	for (size_t i = threadIdx.x; i < n16_per_block; i += blockDim.x) {
		const uint4 q = __ldcs(p + i);
		s ^= q.x ^ q.y ^ q.z ^ q.w;
	}
	if (s == 0x12345678u)
		out[blockIdx.x] = s;
}

template <class F> static float graph_us(cudaStream_t st, int nodes, F add)
{
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
	for (int i = 0; i < nodes; i++)
		add();
	CK(cudaStreamEndCapture(st, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	std::vector<float> v;
	for (int r = 0; r < 12; r++) {
		CK(cudaEventRecord(a, st));
		CK(cudaGraphLaunch(ge, st));
		CK(cudaEventRecord(b, st));
		CK(cudaEventSynchronize(b));
		float ms;
		CK(cudaEventElapsedTime(&ms, a, b));
		if (r >= 2)
			v.push_back(ms * 1000.0f);
	}
	std::sort(v.begin(), v.end());
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	CK(cudaGraphExecDestroy(ge));
	CK(cudaGraphDestroy(g));
	return v[v.size() / 2];
}

int main(void)
{
	int n_dev = 0;
	if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
		printf("SKIP: no CUDA device\n");
		return 0;
	}
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	const int sms = prop.multiProcessorCount;
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	int *v;
	CK(cudaMalloc(&v, 4096));
	CK(cudaMemset(v, 0, 4096));
	const int N = 400;
	printf("%s, %d SMs; graphs of %d nodes, us per node (median of 10 replays); PDL %s\n", prop.name, sms,
	       N, kcuda_pdl_enabled() ? "on (TANDEM_PDL=0 turns it off)" : "off");
	printf("%-44s %8s\n", "node", "us/node");
	float t;
	t = graph_us(st, N, [&] { klaunch("empty", empty_kernel, dim3(1), dim3(32), 0, st, (int *)NULL); }) /
	    N;
	printf("%-44s %8.2f\n", "empty, 1 block", t);
	t = graph_us(st, N,
	             [&] { klaunch("empty", empty_kernel, dim3(4 * sms), dim3(128), 0, st, (int *)NULL); }) /
	    N;
	printf("%-44s %8.2f\n", "empty, 4 x SMs blocks of 128", t);
	t = graph_us(st, N, [&] { klaunch("chain", chain_kernel, dim3(1), dim3(32), 0, st, v); }) / N;
	printf("%-44s %8.2f\n", "dependent chain (read prev, write), 1 block", t);

	/* the weight stream behind a small kernel */
	const size_t bytes = (size_t)6144 * 2048 * 34 / 32; /* q_a Q8_0 at one token: 13.4 MB */
	const int nb = 512;
	const size_t per = bytes / 16 / nb;
	const int copies = 8; /* rotate so every read comes from HBM (8 x 13.4 MB > L2) */
	uint4 *w;
	unsigned *out;
	CK(cudaMalloc(&w, per * 16 * nb * copies));
	CK(cudaMemset(w, 1, per * 16 * nb * copies));
	CK(cudaMalloc(&out, nb * 4));
	int k = 0;
	const int M = 40; /* pairs per graph */
	t = graph_us(st, M, [&] {
		klaunch("read", read_kernel, dim3(nb), dim3(256), 0, st,
		        (const uint4 *)(w + (k++ % copies) * per * nb), per, 0, out);
	});
	const float t_read = t / M;
	t = graph_us(st, M, [&] { klaunch("spin", spin_kernel, dim3(1), dim3(32), 0, st, 5000LL, v); });
	const float t_spin = t / M;
	float t_pair[2];
	for (int pf = 0; pf < 2; pf++) {
		t = graph_us(st, M, [&] {
			klaunch("spin", spin_kernel, dim3(1), dim3(32), 0, st, 5000LL, v);
			klaunch("read", read_kernel, dim3(nb), dim3(256), 0, st,
			        (const uint4 *)(w + (k++ % copies) * per * nb), per, pf, out);
		});
		t_pair[pf] = t / M;
	}
	printf("%-44s %8.2f  (%.2f TB/s)\n", "13.4 MB weight read alone", t_read, bytes / t_read * 1e-6);
	printf("%-44s %8.2f\n", "small kernel alone (spin)", t_spin);
	printf("%-44s %8.2f\n", "spin + read, read starts after the wait", t_pair[0]);
	printf("%-44s %8.2f\n", "spin + read, L2 prefetch before the wait", t_pair[1]);
	printf("prefetch saves %.2f us of %.2f us read time per pair\n", t_pair[0] - t_pair[1], t_read);
	CK(cudaFree(w));
	CK(cudaFree(out));
	CK(cudaFree(v));
	CK(cudaStreamDestroy(st));
	return 0;
}
