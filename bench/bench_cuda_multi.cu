/* Bench: kcuda_matmul_multi (one launch for several products of the same x, matmul_multi.cu)
 * against the separate kcuda_matmul launches of the same products (the dispatch forward.c had
 * before), on the GLM-5 TP=8 per-rank decode groups {q_a, kv_a, idx_k, idx_proj F32} and {q_b,
 * idx_q_b} and DeepSeek-V3's {q_a, kv_a}, and single wide Q8_0 products (o, q_a) through the same
 * kernel (TANDEM_MULTI_WIDE=1) against the default dispatch, n_tok 1, 2, 4, 8:
 *   eager: CUDA events around batches of calls, every call on another copy of the group's weights
 *     (copies over >= 4x L2: in a decode step the other layers evict a layer's weights);
 *   graph: the same calls captured 20 per CUDA graph, the graphs replayed over all copies (the
 *     decode step is a graph of small kernels back to back, PDL as the process has it:
 *     TANDEM_PDL=0 and TANDEM_PREFETCH=0 are read once per process, run again to compare).
 * GB/s counts weight bytes; the read ceiling is a streaming uint4 read of 1 GiB in the same run.
 * Before timing, each group's outputs are compared with the separate launches' (|d| <= 1e-4 of
 * the largest |y|: a harness check; tests/ops/test_ops_multi.c is the real one).
 *   bench_cuda_multi        (exit 1 on a failed check, 77 without a GPU; ~10 s on an H200) */
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "bench/bench_cuda_time.cuh"
#include "tests/ops/ops_util.h"

#define CK KCUDA_CHECK

__global__ void read_kernel(const uint4 *p, size_t n, uint32_t *sink)
{
	uint32_t acc = 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint4 v = __ldg(p + i);
		acc ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (acc == 0x12345678u)
		*sink = acc; /* practically never: keeps the loads alive */
}

struct prod {
	int type;
	int64_t n_out;
	const char *name;
};
struct group {
	const char *what;
	int64_t n_in;
	int n;
	prod p[4];
};

static const group groups[] = {
    {"glm q_a+kv_a+idx_k+idx_proj",
     6144,
     4,
     {{KT_Q8_0, 2048, "q_a"}, {KT_Q8_0, 576, "kv_a"}, {KT_Q8_0, 128, "idx_k"}, {KT_F32, 32, "idx_proj"}}},
    {"glm q_b+idx_q_b", 2048, 2, {{KT_Q8_0, 2048, "q_b"}, {KT_Q8_0, 4096, "idx_q_b"}}},
    {"ds q_a+kv_a", 7168, 2, {{KT_Q8_0, 1536, "q_a"}, {KT_Q8_0, 576, "kv_a"}}},
    /* single wide products: default dispatch vs TANDEM_MULTI_WIDE=1 (the multi kernel, table of one) */
    {"glm o alone (MULTI_WIDE)", 2048, 1, {{KT_Q8_0, 6144, "o"}}},
    {"glm q_a alone (MULTI_WIDE)", 6144, 1, {{KT_Q8_0, 2048, "q_a"}}},
};

static int n_fail;

/* one group call on weight copy k: multi (one launch) or separate (kcuda_matmul per product) */
static int call(struct kcuda_ctx *c, const group &g, const std::vector<struct kweight> &w, size_t stride,
                int k, const float *xd, int nt, float *const *yd, bool multi)
{
	struct kweight wk[4];
	struct kcuda_mm_seg seg[4];
	for (int i = 0; i < g.n; i++) {
		wk[i] = w[i];
		wk[i].data = (char *)w[i].data + (size_t)k * stride;
		seg[i] = {&wk[i], yd[i], g.p[i].n_out};
	}
	if (g.n == 1) /* a single product: kcuda_matmul with or without TANDEM_MULTI_WIDE */
		setenv("TANDEM_MULTI_WIDE", multi ? "1" : "0", 1);
	else if (multi)
		return kcuda_matmul_multi(c, g.n, seg, xd, g.n_in, nt);
	for (int i = 0; i < g.n; i++) {
		const int rc = kcuda_matmul_path(c, g.p[i].type == KT_F32 ? KCUDA_MM_F32 : KCUDA_MM_AUTO,
		                                 &wk[i], xd, g.n_in, nt, yd[i], g.p[i].n_out);
		if (rc)
			return rc;
	}
	return 0;
}

/* A one-block kernel of ~4 us (the add_rmsnorm / mla_latent before the products in a decode step):
 * with PDL the products' blocks start beside it and their weight copies overlap it. */
__global__ void spin_kernel(float *out, long long cycles)
{
	KDEP_ENTRY();
	const long long t0 = clock64();
	while (clock64() - t0 < cycles) {
	}
	if (threadIdx.x == 0)
		out[0] = 1.0f;
}
static float *g_spin_out;
static long long g_spin_cycles; /* 0: no spin kernel */

/* ms per group call: graphs of 20 calls each over all ncopy copies, median of 5 replays of all;
 * with g_spin_cycles each call follows a spin kernel. multi: 0 separate, 1 multi, 2 multi with
 * TANDEM_MULTI_HOIST=1, -1 the spin kernels alone */
static float time_graph(struct kcuda_ctx *c, const group &g, const std::vector<struct kweight> &w,
                        size_t stride, int ncopy, const float *xd, int nt, float *const *yd, int multi)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const int per = 20, ng = (ncopy + per - 1) / per;
	std::vector<cudaGraphExec_t> ex(ng);
	for (int gi = 0; gi < ng; gi++) {
		cudaGraph_t gr;
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < per; i++) {
			if (g_spin_cycles &&
			    klaunch("spin", spin_kernel, dim3(1), dim3(128), 0, s, g_spin_out, g_spin_cycles))
				abort();
			if (multi < 0)
				continue;
			setenv("TANDEM_MULTI_HOIST", multi == 2 ? "1" : "0", 1);
			if (call(c, g, w, stride, (gi * per + i) % ncopy, xd, nt, yd, multi > 0))
				abort();
		}
		CK(cudaStreamEndCapture(s, &gr));
		CK(cudaGraphInstantiate(&ex[gi], gr, 0));
		CK(cudaGraphDestroy(gr));
	}
	const float ms = bench_time_ms(s, 2, 5, 1, [&](int) {
		for (int gi = 0; gi < ng; gi++)
			CK(cudaGraphLaunch(ex[gi], s));
	});
	for (auto e : ex)
		CK(cudaGraphExecDestroy(e));
	return ms / (ng * per);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MiB\n", prop.name, prop.major, prop.minor,
	       prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t big = (size_t)1 << 30, l2 = (size_t)prop.l2CacheSize;
	char *A;
	float *xd, *yd[4], *ys[4];
	uint32_t *sink;
	CK(cudaMalloc((void **)&A, big));
	CK(cudaMalloc((void **)&sink, 4));
	CK(cudaMalloc((void **)&xd, sizeof(float) * 8 * 8192));
	for (int i = 0; i < 4; i++) {
		CK(cudaMalloc((void **)&yd[i], sizeof(float) * 8 * 8192));
		CK(cudaMalloc((void **)&ys[i], sizeof(float) * 8 * 8192));
	}
	{
		std::vector<float> xh(8 * 8192);
		for (auto &v : xh)
			v = ops_rng_unif();
		CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
	}
	CK(cudaMemset(A, 0x11, big));
	const float rd_ms = bench_time_ms(s, 1, 5, 1, [&](int) {
		read_kernel<<<4 * prop.multiProcessorCount, 512, 0, s>>>((const uint4 *)A, big / 16, sink);
	});
	const double ceil_gbs = big / (rd_ms * 1e-3) / 1e9;
	const char *pdl = getenv("TANDEM_PDL"), *pf = getenv("TANDEM_PREFETCH");
	printf("read ceiling %.0f GB/s (uint4 stream of 1 GiB)\n", ceil_gbs);
	/* the spin kernel: ~4 us at the SM clock */
	int khz = 0;
	if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess || khz <= 0)
		khz = 1980000; /* the H200's boost clock */
	const long long spin_cycles = (long long)khz * 4 / 1000;
	CK(cudaMalloc((void **)&g_spin_out, 4));
	printf(
	    "\nmulti (one launch) vs separate launches; weights rotating over >= 4x L2; graph: 20 calls per "
	    "CUDA graph, PDL %s, prefetch %s;\nafter spin: each call after a ~4 us one-block kernel, that "
	    "kernel's time subtracted; hoist: TANDEM_MULTI_HOIST=1; us per call\n"
	    "%-28s %5s %7s | %7s %7s %6s | %7s %5s %7s %5s %7s %6s | %7s %7s %7s %6s\n",
	    pdl && !strcmp(pdl, "0") ? "off" : "on", pf && !strcmp(pf, "0") ? "off" : "on", "group", "n_tok",
	    "MB", "sep", "multi", "speedup", "g.sep", "GB/s", "g.multi", "GB/s", "g.hoist", "speedup",
	    "spin sep", "multi", "hoist", "speedup");
	for (const group &g : groups) {
		std::vector<struct kweight> w(g.n);
		size_t bytes = 0;
		for (int i = 0; i < g.n; i++) {
			size_t rb = 0;
			if (!ktype_row_bytes(g.p[i].type, g.n_in, &rb))
				abort();
			w[i] = {g.p[i].type, g.n_in, g.p[i].n_out, rb, NULL};
			bytes += (rb * (size_t)g.p[i].n_out + 255) & ~(size_t)255;
		}
		const size_t stride = bytes;
		const int ncopy =
		    (int)std::min<size_t>(big / stride, std::max<size_t>(4 * l2 / stride + 1, 20));
		{ /* the group's weights at the start of each copy's slot, random content */
			size_t off = 0;
			for (int i = 0; i < g.n; i++) {
				const size_t mb = w[i].row_bytes * (size_t)g.p[i].n_out;
				std::vector<uint8_t> hw(mb);
				ops_fill_weight(g.p[i].type, g.n_in, g.p[i].n_out, w[i].row_bytes, hw.data());
				w[i].data = A + off;
				for (int k = 0; k < ncopy; k++)
					CK(cudaMemcpy(A + off + (size_t)k * stride, hw.data(), mb,
					              cudaMemcpyHostToDevice));
				off += (mb + 255) & ~(size_t)255;
			}
		}
		double wbytes = 0;
		for (int i = 0; i < g.n; i++)
			wbytes += (double)w[i].row_bytes * (double)g.p[i].n_out;
		for (int nt : {1, 2, 4, 8}) {
			/* harness check: multi against the separate launches */
			if (call(c, g, w, stride, 0, xd, nt, yd, true) ||
			    call(c, g, w, stride, 0, xd, nt, ys, false) || kcuda_sync(c))
				abort();
			for (int i = 0; i < g.n; i++) {
				const size_t ny = (size_t)nt * (size_t)g.p[i].n_out;
				std::vector<float> a(ny), b(ny);
				CK(cudaMemcpy(a.data(), yd[i], ny * 4, cudaMemcpyDeviceToHost));
				CK(cudaMemcpy(b.data(), ys[i], ny * 4, cudaMemcpyDeviceToHost));
				double mx = 0, d = 0;
				for (size_t j = 0; j < ny; j++) {
					mx = std::max(mx, (double)fabsf(b[j]));
					d = std::max(d, (double)fabsf(a[j] - b[j]));
				}
				if (!(d <= 1e-4 * mx)) {
					printf("FAIL %s %s n_tok %d: multi differs from separate by %.3g "
					       "(max |y| %.3g)\n",
					       g.what, g.p[i].name, nt, d, mx);
					n_fail++;
				}
			}
			/* graph columns: separate, multi, multi with TANDEM_MULTI_HOIST=1 (single products:
			 * the same as multi); then each after a ~4 us one-block kernel, minus that kernel */
			float ms[2], gms[3], sms[3];
			for (int m = 0; m < 2; m++)
				ms[m] = bench_time_ms(s, 2 * ncopy, 5, ncopy, [&](int i) {
					if (call(c, g, w, stride, i % ncopy, xd, nt, m ? yd : ys, m == 1))
						abort();
				});
			g_spin_cycles = 0;
			for (int m = 0; m < 3; m++)
				gms[m] = time_graph(c, g, w, stride, ncopy, xd, nt, m ? yd : ys, m);
			g_spin_cycles = spin_cycles;
			const float spin = time_graph(c, g, w, stride, ncopy, xd, nt, ys, -1);
			for (int m = 0; m < 3; m++)
				sms[m] = time_graph(c, g, w, stride, ncopy, xd, nt, m ? yd : ys, m) - spin;
			g_spin_cycles = 0;
			unsetenv("TANDEM_MULTI_HOIST");
			printf(
			    "%-28s %5d %7.2f | %7.2f %7.2f %5.2fx | %7.2f %5.0f %7.2f %5.0f %7.2f %5.2fx | "
			    "%7.2f %7.2f %7.2f %5.2fx\n",
			    g.what, nt, wbytes / 1e6, ms[0] * 1e3, ms[1] * 1e3, ms[0] / ms[1], gms[0] * 1e3,
			    wbytes / (gms[0] * 1e-3) / 1e9, gms[1] * 1e3, wbytes / (gms[1] * 1e-3) / 1e9,
			    gms[2] * 1e3, gms[0] / std::min(gms[1], gms[2]), sms[0] * 1e3, sms[1] * 1e3,
			    sms[2] * 1e3, sms[0] / std::min(sms[1], sms[2]));
			fflush(stdout);
		}
	}
	CK(cudaFree(A));
	CK(cudaFree(sink));
	CK(cudaFree(g_spin_out));
	CK(cudaFree(xd));
	for (int i = 0; i < 4; i++) {
		CK(cudaFree(yd[i]));
		CK(cudaFree(ys[i]));
	}
	kcuda_ctx_destroy(c);
	printf("\n%s: %d failed checks\n", n_fail ? "FAIL" : "PASS", n_fail);
	return n_fail ? 1 : 0;
}
