/* The cost of a kernel boundary in a decode graph, and what the weight prefetch before
 * griddepcontrol.wait buys (cuda_common.cuh). A batch-1 decode step is ~1700 small kernels in
 * one CUDA graph, so the per-node floor times the node count bounds the step from below, however
 * fast each kernel's body is. Measured, each as a graph of N nodes replayed (median of replays):
 *   1. empty kernels (KDEP_ENTRY only), 1 block and 132 x 4 blocks, PDL on and off;
 *   2. a chain where each kernel reads what the previous one wrote (one dependent round trip);
 *   3. a 5 us one-block kernel followed by a 13.4 MB weight read (the shape of q_a at one token),
 *      with and without the L2 prefetch of the weights before KDEP_ENTRY, against the read time
 *      of the same bytes alone.
 *   4. the same pair with the read's bytes brought into L2 by a "prefetch lane": a second stream,
 *      forked before the small kernel, whose kernel only issues L2 prefetches (bulk pieces or
 *      128-byte lines, several piece sizes and grids), with a 5 and a 10 us small kernel. This is
 *      the experiment behind trying the lane in the decode step (2026-11-29, H200): an L2-resident
 *      13.4 MB read took 3.8 us against 5.1 us from HBM here, but the step did not get faster with
 *      o / v_b / router / shared expert / the next layer's products prefetched that way, because
 *      the products already prefetch their own weights before griddepcontrol.wait;
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

/* the prefetch lane's kernel: one L2 prefetch of `piece` bytes per thread (bulk on sm_90+, else
 * 128-byte lines; `line` forces lines) over [p, p + bytes) */
__global__ void lane_kernel(const char *p, size_t bytes, size_t piece, int line)
{
	const size_t n = (bytes + piece - 1) / piece;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		const size_t off = i * piece, nb = bytes - off < piece ? bytes - off : piece;
		if (line) {
			for (size_t o = 0; o < nb; o += 128)
				asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + o));
		} else {
			kdep_prefetch_l2(p + off, nb);
		}
	}
}

struct lane_cfg {
	size_t piece;
	int tpb, max_blocks, line;
};

static void lane_launch(cudaStream_t st, const void *p, size_t bytes, const lane_cfg &cf)
{
	const size_t n = (bytes + cf.piece - 1) / cf.piece;
	size_t blocks = (n + cf.tpb - 1) / cf.tpb;
	if (blocks > (size_t)cf.max_blocks)
		blocks = (size_t)cf.max_blocks;
	lane_kernel<<<(unsigned)blocks, cf.tpb, 0, st>>>((const char *)p, bytes, cf.piece, cf.line);
	CK(cudaGetLastError());
}

template <class F, class G> static float graph_us(cudaStream_t st, int nodes, F add, G fin)
{
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
	for (int i = 0; i < nodes; i++)
		add();
	fin();
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

template <class F> static float graph_us(cudaStream_t st, int nodes, F add)
{
	return graph_us(st, nodes, add, [] {});
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

	/* the prefetch lane: the read's bytes asked for on a second stream forked before the spin */
	cudaStream_t st2;
	cudaEvent_t evf, evj;
	CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&evf, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&evj, cudaEventDisableTiming));
	const long long spins[2] = {5000LL, 10000LL};
	for (int si = 0; si < 2; si++) {
		const float t_sp =
		    graph_us(st, M,
		             [&] { klaunch("spin", spin_kernel, dim3(1), dim3(32), 0, st, spins[si], v); }) /
		    M;
		const float t_no =
		    graph_us(st, M,
		             [&] {
			             klaunch("spin", spin_kernel, dim3(1), dim3(32), 0, st, spins[si], v);
			             klaunch("read", read_kernel, dim3(nb), dim3(256), 0, st,
			                     (const uint4 *)(w + (k++ % copies) * per * nb), per, 0, out);
		             }) /
		    M;
		printf("spin %5.2f us + read: no prefetch %6.2f us per pair (read part %5.2f)", t_sp, t_no,
		       t_no - t_sp);
		printf("\n");
		/* piece KB, threads per block, max blocks, line prefetches */
		const lane_cfg cfgs[] = {{16 << 10, 128, 264, 0}, {16 << 10, 32, 132, 0},
		                         {4 << 10, 32, 132, 0},   {8 << 10, 32, 264, 0},
		                         {2 << 10, 32, 264, 0},   {4 << 10, 32, 132, 1},
		                         {1 << 10, 64, 264, 1}};
		for (const lane_cfg &cf : cfgs) {
			const float t_ln =
			    graph_us(
			        st, M,
			        [&] {
				        const uint4 *wr = w + (k++ % copies) * per * nb;
				        CK(cudaEventRecord(evf, st));
				        CK(cudaStreamWaitEvent(st2, evf, 0));
				        lane_launch(st2, wr, per * 16 * nb, cf);
				        klaunch("spin", spin_kernel, dim3(1), dim3(32), 0, st, spins[si], v);
				        klaunch("read", read_kernel, dim3(nb), dim3(256), 0, st, wr, per, 0,
				                out);
			        },
			        [&] {
				        CK(cudaEventRecord(evj, st2));
				        CK(cudaStreamWaitEvent(st, evj, 0));
			        }) /
			    M;
			printf("  lane piece %2zu KB, %4d threads x <= %3d blocks, %s: %6.2f us per pair "
			       "(read part %5.2f)\n",
			       cf.piece >> 10, cf.tpb, cf.max_blocks, cf.line ? "lines" : "bulk ", t_ln,
			       t_ln - t_sp);
		}
		/* the lane alone (no read after it): how long its kernel keeps the lane stream busy */
		const float t_lo =
		    graph_us(st, M,
		             [&] {
			             const uint4 *wr = w + (k++ % copies) * per * nb;
			             lane_launch(st, wr, per * 16 * nb, lane_cfg{16 << 10, 32, 132, 0});
		             }) /
		    M;
		printf("  lane kernel alone (16 KB, 32 x 132, bulk): %.2f us\n", t_lo);
	}
	CK(cudaEventDestroy(evf));
	CK(cudaEventDestroy(evj));
	CK(cudaStreamDestroy(st2));
	CK(cudaFree(w));
	CK(cudaFree(out));
	CK(cudaFree(v));
	CK(cudaStreamDestroy(st));
	return 0;
}
