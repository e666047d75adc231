/* Bench: the resident-weights GEMV (matmul_gemv_res.cu, TANDEM_GEMV_RES=1) against gemv_kernel /
 * gemv3 (old: TANDEM_MULTI_WIDE=0) and matmul_multi.cu's kernel as a table of one (TANDEM_MULTI_WIDE=1,
 * main's default since 2026-11-30 00:40),
 * through kcuda_matmul, on the GLM-5 / DeepSeek-V3 TP=8 per-rank products of a batch-1 decode layer
 * (o, idx_q_b, q_b, the F32 router; v_b's stacked heads through kfwd_head_gemv, where the old path is
 * gemv3), n_tok 1 and 2. Each call uses another copy of the weights
 * (copies over >= 4x L2: in a decode step the other layers evict a layer's weights). All columns
 * are us per call inside CUDA graphs of 20 calls (PDL as the process has it: TANDEM_PDL=0 /
 * TANDEM_PREFETCH=0, read once per process, run again to compare):
 *   b2b:    the products back to back;
 *   spin:   each after a ~5 us ONE-block kernel (the decode step's situation for the product after
 *           a short kernel), that kernel's time subtracted;
 *   wide:   each after a ~5 us kernel of one 128-thread block per SM holding 80 KB of shared
 *           memory and ~200 registers per thread (mla_dec's footprint before v_b / o), its time
 *           subtracted: shows whether the product's blocks become resident beside a full-width kernel;
 *   chain:  the wide kernel, then v_b (8 heads) and o as in a decode layer, for gemv3 + gemv_kernel,
 *           multi1, and gemv_res with each TANDEM_GEMV_RES_EARLY setting.
 * GB/s counts weight bytes; the read ceiling is a streaming uint4 read of 1 GiB in the same run.
 * Before timing, each product's outputs are compared with the default dispatch's (|d| <= 1e-4 of
 * the largest |y|: a harness check; tests/ops/test_ops_gemv_res.c is the real one).
 *   bench_cuda_gemv_res        (exit 1 on a failed check, 77 without a GPU; ~10 s on an H200) */
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemv_res.h"
#include "kernels/cuda/model_fwd.h"
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
	const char *what;
	int type;
	int64_t n_in, n_out;
	int H; /* > 1: H stacked matrices through kfwd_head_gemv (v_b) */
};

static const prod prods[] = {
    {"glm o", KT_Q8_0, 2048, 6144, 1},         {"glm idx_q_b", KT_Q8_0, 2048, 4096, 1},
    {"glm q_b", KT_Q8_0, 2048, 2048, 1},       {"glm router F32", KT_F32, 6144, 256, 1},
    {"glm v_b 8 heads", KT_Q8_0, 512, 256, 8}, {"ds o", KT_Q8_0, 2048, 7168, 1},
    {"ds q_b", KT_Q8_0, 1536, 3072, 1},        {"ds v_b 16 heads", KT_Q8_0, 512, 128, 16},
};

/* the predecessor kernels: a one-block spin, or one block per SM that also holds shared memory and
 * registers like mla_dec (the volatile array keeps ~200 registers live across the spin) */
__global__ void spin_kernel(float *out, long long cycles)
{
	KDEP_ENTRY();
	const long long t0 = clock64();
	while (clock64() - t0 < cycles) {
	}
	if (threadIdx.x == 0)
		out[0] = 1.0f;
}
__global__ void __launch_bounds__(128, 1) wide_kernel(float *out, long long cycles)
{
	KDEP_ENTRY();
	extern __shared__ float wide_sm[];
	float r[192];
#pragma unroll
	for (int i = 0; i < 192; i++)
		r[i] = (float)(threadIdx.x + i);
	const long long t0 = clock64();
	int it = 0;
	while (clock64() - t0 < cycles) {
#pragma unroll
		for (int i = 0; i < 192; i++)
			r[i] = r[i] * 0.999f + 1.0f;
		it++;
	}
	float s = 0.0f;
#pragma unroll
	for (int i = 0; i < 192; i++)
		s += r[i];
	wide_sm[threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.x == 0 && blockIdx.x == 0)
		out[0] = wide_sm[it & 127];
}
#define WIDE_SMEM (80 * 1024)

static float *g_spin_out;
static long long g_cycles;
static int g_pre; /* 0 none, 1 one-block spin, 2 wide */
static int g_n_sm;

/* mode: 0 default dispatch, 1 TANDEM_MULTI_WIDE=1, 2 TANDEM_GEMV_RES=1 */
static void set_mode(int mode)
{
	setenv("TANDEM_GEMV_RES", mode == 2 ? "1" : "0", 1);
	setenv("TANDEM_MULTI_WIDE", mode == 1 ? "1" : "0", 1);
}

static int call(struct kcuda_ctx *c, const prod &p, const struct kweight &w, size_t stride, int k,
                const float *xd, int nt, float *yd)
{
	struct kweight wk = w;
	wk.data = (char *)w.data + (size_t)k * stride;
	if (p.H > 1)
		return kfwd_head_gemv(c, &wk, w.row_bytes * (size_t)p.n_out, p.H, xd, p.H * p.n_in, p.n_in,
		                      nt, yd, p.H * p.n_out, p.n_out);
	return kcuda_matmul_path(c, p.type == KT_F32 ? KCUDA_MM_F32 : KCUDA_MM_AUTO, &wk, xd, p.n_in, nt, yd,
	                         p.n_out);
}

/* ms per call: graphs of 20 calls each over all ncopy copies, median of 5 replays; with g_pre each
 * call follows that predecessor; mode -1: the predecessors alone */
static float time_graph(struct kcuda_ctx *c, const prod &p, const struct kweight &w, size_t stride, int ncopy,
                        const float *xd, int nt, float *yd, int mode)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const int per = 20, ng = (ncopy + per - 1) / per;
	std::vector<cudaGraphExec_t> ex(ng);
	if (mode >= 0)
		set_mode(mode);
	for (int gi = 0; gi < ng; gi++) {
		cudaGraph_t gr;
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < per; i++) {
			if (g_pre == 1 &&
			    klaunch("spin", spin_kernel, dim3(1), dim3(128), 0, s, g_spin_out, g_cycles))
				abort();
			if (g_pre == 2 && klaunch("wide", wide_kernel, dim3(g_n_sm), dim3(128), WIDE_SMEM, s,
			                          g_spin_out, g_cycles))
				abort();
			if (mode < 0)
				continue;
			if (call(c, p, w, stride, (gi * per + i) % ncopy, xd, nt, yd))
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

/* The decode layer's chain mla_dec -> v_b -> o: the wide ~5 us kernel (mla_dec's footprint), then v_b
 * (8 stacked heads 512 -> 256 through kfwd_head_gemv) and o (2048 -> 6144 through kcuda_matmul) on
 * weight copy k; us per chain minus the wide kernel alone. mode as set_mode; early: the value of
 * TANDEM_GEMV_RES_EARLY ("" = default). */
static float time_chain(struct kcuda_ctx *c, const struct kweight &wv, const struct kweight &wo,
                        size_t stride, int ncopy, const float *xd, float *mid, float *yd, int mode,
                        const char *early)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const int per = 20, ng = (ncopy + per - 1) / per;
	std::vector<cudaGraphExec_t> ex(ng);
	if (mode >= 0)
		set_mode(mode);
	setenv("TANDEM_GEMV_RES_EARLY", early, 1);
	for (int gi = 0; gi < ng; gi++) {
		cudaGraph_t gr;
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < per; i++) {
			if (klaunch("wide", wide_kernel, dim3(g_n_sm), dim3(128), WIDE_SMEM, s, g_spin_out,
			            g_cycles))
				abort();
			if (mode < 0)
				continue;
			const size_t k = (size_t)((gi * per + i) % ncopy);
			struct kweight v = wv, o = wo;
			v.data = (char *)wv.data + k * stride;
			o.data = (char *)wo.data + k * stride;
			if (kfwd_head_gemv(c, &v, wv.row_bytes * (size_t)wv.n_out, 8, xd, 8 * wv.n_in,
			                   wv.n_in, 1, mid, 8 * wv.n_out, wv.n_out) ||
			    kcuda_matmul(c, &o, mid, wo.n_in, 1, yd, wo.n_out))
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
	unsetenv("TANDEM_GEMV_RES_EARLY");
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
	g_n_sm = prop.multiProcessorCount;
	printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MiB\n", prop.name, prop.major, prop.minor,
	       prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	CK(cudaFuncSetAttribute(wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WIDE_SMEM));
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t big = (size_t)1 << 30, l2 = (size_t)prop.l2CacheSize;
	char *A;
	float *xd, *yd, *ys;
	uint32_t *sink;
	CK(cudaMalloc((void **)&A, big));
	CK(cudaMalloc((void **)&sink, 4));
	CK(cudaMalloc((void **)&xd, sizeof(float) * 2 * 8192));
	CK(cudaMalloc((void **)&yd, sizeof(float) * 2 * 8192));
	CK(cudaMalloc((void **)&ys, sizeof(float) * 2 * 8192));
	CK(cudaMalloc((void **)&g_spin_out, 4));
	{
		std::vector<float> xh(2 * 8192);
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
	int khz = 0;
	if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess || khz <= 0)
		khz = 1980000; /* the H200's boost clock */
	g_cycles = (long long)khz * 5 / 1000; /* ~5 us */
	printf(
	    "\nus per call in CUDA graphs of 20 (PDL %s, prefetch %s); old = TANDEM_MULTI_WIDE=0, multi = "
	    "TANDEM_MULTI_WIDE=1 (default), res = TANDEM_GEMV_RES=1 (rb: its rows per block);\nb2b: back to "
	    "back; spin: after a ~5 us one-block kernel; wide: after a ~5 us kernel of one 80 KB block "
	    "per SM (predecessor time subtracted); GB/s of res vs the read ceiling\n"
	    "%-15s %5s %6s %4s | %6s %6s %6s %5s %6s | %6s %6s %6s %6s | %6s %6s %6s %6s\n",
	    pdl && !strcmp(pdl, "0") ? "off" : "on", pf && !strcmp(pf, "0") ? "off" : "on", "product",
	    "n_tok", "MB", "rb", "b.old", "b.mul", "b.res", "GB/s", "%ceil", "s.old", "s.mul", "s.res",
	    "GB/s", "w.old", "w.mul", "w.res", "GB/s");
	int n_fail = 0;
	for (const prod &p : prods) {
		size_t rb = 0;
		if (!ktype_row_bytes(p.type, p.n_in, &rb))
			abort();
		const size_t mb = rb * (size_t)p.n_out * (size_t)p.H, stride = (mb + 255) & ~(size_t)255;
		const int ncopy =
		    (int)std::min<size_t>(big / stride, std::max<size_t>(4 * l2 / stride + 1, 20));
		struct kweight w = {p.type, p.n_in, p.n_out, rb, A};
		{
			std::vector<uint8_t> hw(mb);
			ops_fill_weight(p.type, p.n_in, p.n_out * p.H, rb, hw.data());
			for (int k = 0; k < ncopy; k++)
				CK(cudaMemcpy(A + (size_t)k * stride, hw.data(), mb, cudaMemcpyHostToDevice));
		}
		struct kweight wr = w;
		wr.n_out = p.n_out; /* one head's rows (H > 1: the stacked matrices' rule) */
		const int rows = kcuda_gemv_res_rows(c, &wr, p.H);
		for (int nt : {1, 2}) {
			/* harness check: res against the default dispatch */
			set_mode(2);
			if (call(c, p, w, stride, 0, xd, nt, yd))
				abort();
			set_mode(0);
			if (call(c, p, w, stride, 0, xd, nt, ys) || kcuda_sync(c))
				abort();
			{
				const size_t ny = (size_t)nt * (size_t)p.n_out * (size_t)p.H;
				std::vector<float> a(ny), b(ny);
				CK(cudaMemcpy(a.data(), yd, ny * 4, cudaMemcpyDeviceToHost));
				CK(cudaMemcpy(b.data(), ys, ny * 4, cudaMemcpyDeviceToHost));
				double mx = 0, d = 0;
				for (size_t j = 0; j < ny; j++) {
					mx = std::max(mx, (double)fabsf(b[j]));
					d = std::max(d, (double)fabsf(a[j] - b[j]));
				}
				if (!(d <= 1e-4 * mx)) {
					printf("FAIL %s n_tok %d: res differs from the default by %.3g (max "
					       "|y| %.3g)\n",
					       p.what, nt, d, mx);
					n_fail++;
				}
			}
			float t[3][3]; /* [predecessor][mode] */
			for (int pre = 0; pre < 3; pre++) {
				g_pre = pre;
				const float base =
				    pre ? time_graph(c, p, w, stride, ncopy, xd, nt, ys, -1) : 0.0f;
				for (int m = 0; m < 3; m++)
					t[pre][m] =
					    time_graph(c, p, w, stride, ncopy, xd, nt, m == 2 ? yd : ys, m) -
					    base;
			}
			g_pre = 0;
			const double gbs[3] = {mb / (t[0][2] * 1e-3) / 1e9, mb / (t[1][2] * 1e-3) / 1e9,
			                       mb / (t[2][2] * 1e-3) / 1e9};
			printf("%-15s %5d %6.2f %4d | %6.2f %6.2f %6.2f %5.0f %5.0f%% | %6.2f %6.2f %6.2f "
			       "%6.0f | %6.2f "
			       "%6.2f %6.2f %6.0f\n",
			       p.what, nt, mb / 1e6, rows, t[0][0] * 1e3, t[0][1] * 1e3, t[0][2] * 1e3,
			       gbs[0], 100.0 * gbs[0] / ceil_gbs, t[1][0] * 1e3, t[1][1] * 1e3, t[1][2] * 1e3,
			       gbs[1], t[2][0] * 1e3, t[2][1] * 1e3, t[2][2] * 1e3, gbs[2]);
			fflush(stdout);
		}
	}
	{ /* the chain mla_dec -> v_b -> o (GLM-5 rank 0 of TP=8) */
		size_t rbv = 0, rbo = 0;
		if (!ktype_row_bytes(KT_Q8_0, 512, &rbv) || !ktype_row_bytes(KT_Q8_0, 2048, &rbo))
			abort();
		const size_t bv = rbv * 8 * 256, bo = rbo * 6144, stride = (bv + bo + 511) & ~(size_t)255;
		const int ncopy =
		    (int)std::min<size_t>(big / stride, std::max<size_t>(4 * l2 / stride + 1, 20));
		struct kweight wv = {KT_Q8_0, 512, 256, rbv, A},
		               wo = {KT_Q8_0, 2048, 6144, rbo, A + ((bv + 255) & ~(size_t)255)};
		{
			std::vector<uint8_t> hv(bv), ho(bo);
			ops_fill_weight(KT_Q8_0, 512, 8 * 256, rbv, hv.data());
			ops_fill_weight(KT_Q8_0, 2048, 6144, rbo, ho.data());
			for (int k = 0; k < ncopy; k++) {
				CK(cudaMemcpy((char *)wv.data + (size_t)k * stride, hv.data(), bv,
				              cudaMemcpyHostToDevice));
				CK(cudaMemcpy((char *)wo.data + (size_t)k * stride, ho.data(), bo,
				              cudaMemcpyHostToDevice));
			}
		}
		float *mid;
		CK(cudaMalloc((void **)&mid, sizeof(float) * 2048));
		const float base = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, -1, "");
		const float t_old = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, 0, "") - base;
		const float t_mul = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, 1, "") - base;
		const float t_res = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, 2, "") - base;
		const float t_r0 = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, 2, "0") - base;
		const float t_r1 = time_chain(c, wv, wo, stride, ncopy, xd, mid, ys, 2, "1") - base;
		printf("\nchain wide ~5 us kernel -> v_b (8 heads) -> o, 1 token, %.1f MB, us per chain "
		       "minus the wide "
		       "kernel:\n  old (gemv3 + gemv_kernel) %.2f | multi1 (default) %.2f | res %.2f (v_b "
		       "early) | res "
		       "EARLY=0 %.2f | res EARLY=1 %.2f\n",
		       (bv + bo) / 1e6, t_old * 1e3, t_mul * 1e3, t_res * 1e3, t_r0 * 1e3, t_r1 * 1e3);
		CK(cudaFree(mid));
	}
	unsetenv("TANDEM_GEMV_RES");
	unsetenv("TANDEM_MULTI_WIDE");
	CK(cudaFree(A));
	CK(cudaFree(sink));
	CK(cudaFree(g_spin_out));
	CK(cudaFree(xd));
	CK(cudaFree(yd));
	CK(cudaFree(ys));
	kcuda_ctx_destroy(c);
	printf("\n%s: %d failed checks\n", n_fail ? "FAIL" : "PASS", n_fail);
	return n_fail ? 1 : 0;
}
