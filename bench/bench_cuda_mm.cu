/* CUDA matmul benchmark: measures the ceilings first (device-to-device copy, a read-only streaming
 * kernel, cuBLAS bf16 GEMM on random data), then times kcuda_matmul's decode GEMV (n_tok 1..8) and
 * prefill GEMM per weight type and reports GB/s of weight bytes (and TFLOP/s) as a fraction of the
 * measured ceilings. Timing: CUDA events around batches of launches, warm-up first, median of
 * batches; weights rotate over copies totalling >= 4x L2 so every launch reads HBM, on random data.
 *   bench_cuda_mm [quick|profile]  (quick: fewer types/shapes; profile: the five GLM-5 types' GEMV
 *                                   of one big shape at n_tok 1 and 2, for ncu and A/B runs)
 *   bench_cuda_mm tiletrace         the tile product (matmul_tile.cu) at the decode shapes that take it,
 *                                   timed, then one launch traced phase by phase (tile_trace) */
#include <algorithm>
#include <stdarg.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
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

__global__ void fill_random(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t z = (uint32_t)i * 2654435761u ^ seed;
		z ^= z >> 15;
		z *= 0x2c1b3c6du;
		z ^= z >> 12;
		p[i] = (z & 0x3fff3fffu) |
		       0x30003000u; /* bf16 pairs of moderate magnitude, also fine as bytes */
	}
}

struct result {
	char line[200];
};
static std::vector<result> table;

static void add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void add(const char *fmt, ...)
{
	result r;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r.line, sizeof(r.line), fmt, ap);
	va_end(ap);
	printf("%s\n", r.line);
	fflush(stdout);
	table.push_back(r);
}

/* `bench_cuda_mm tiletrace`: each case's product timed (eager, weights rotating over >= 4x L2), then
 * one launch with the tile kernel's trace on (kcuda_mm_tile_trace: per block, clock64() at its entry,
 * after KDEP_ENTRY, and for each of its first 8 K chunks after staging, after the first barrier, after
 * the mma and after the second barrier). Prints the medians over blocks of each phase, in SM cycles and
 * in us at clk_mhz, the first chunk apart from the later ones: what a chunk's ~1.5-2 us is made of. */
static int tile_trace(struct kcuda_ctx *c, cudaStream_t s, int clk_mhz, size_t l2)
{
	struct tcase {
		int type;
		int64_t n_in, n_out;
		int n_tok;
		enum kcuda_mm_path path;
		const char *what;
	};
	const tcase cases[] = {
	    {KT_Q8_0, 2048, 4096, 32, KCUDA_MM_F32, "GLM-5 idx_q_b, 32 tokens (fp32 path)"},
	    {KT_Q8_0, 6144, 128, 32, KCUDA_MM_F32, "GLM-5 idx_k, 32 tokens (fp32 path)"},
	    {KT_Q8_0, 6144, 2048, 16, KCUDA_MM_AUTO, "GLM-5 q_a, 16 tokens"},
	    {KT_Q4_K, 6144, 2048, 16, KCUDA_MM_AUTO, "Q4_K 6144 x 2048, 16 tokens"},
	};
	const size_t NB = 65536, SL = MT_TR_SLOTS;
	auto med = [](const std::vector<float> &v) { return v.empty() ? 0.f : bench_median(v); };
	unsigned long long *tb;
	CK(cudaMalloc(&tb, NB * SL * 8));
	float *xd, *yd;
	CK(cudaMalloc(&xd, (size_t)64 * 8192 * 4));
	CK(cudaMalloc(&yd, (size_t)64 * 8192 * 4));
	fill_random<<<256, 256, 0, s>>>((uint32_t *)xd, (size_t)64 * 8192, 5);
	printf("tile trace: medians over blocks; cycles (us at %d MHz)\n", clk_mhz);
	for (const tcase &tc : cases) {
		size_t rb;
		if (!ktype_row_bytes(tc.type, tc.n_in, &rb))
			continue;
		const size_t wb = rb * (size_t)tc.n_out, stride = (wb + 255) & ~(size_t)255;
		const int ncopy = (int)std::max<size_t>(2, std::min<size_t>(64, 4 * l2 / stride + 1));
		void *W;
		CK(cudaMalloc(&W, (size_t)ncopy * stride));
		std::vector<uint8_t> hw(wb);
		ops_fill_weight(tc.type, tc.n_in, tc.n_out, rb, hw.data());
		for (int k = 0; k < ncopy; k++)
			CK(cudaMemcpy((char *)W + k * stride, hw.data(), wb, cudaMemcpyHostToDevice));
		auto run = [&](int i) {
			struct kweight w = {tc.type, tc.n_in, tc.n_out, rb, (char *)W + (i % ncopy) * stride};
			if (kcuda_matmul_path(c, tc.path, &w, xd, tc.n_in, tc.n_tok, yd, tc.n_out))
				abort();
		};
		const float ms = bench_time_ms(s, 3, 9, ncopy, run);
		CK(cudaMemsetAsync(tb, 0, NB * SL * 8, s));
		CK(cudaStreamSynchronize(s));
		if (kcuda_mm_tile_trace(tb))
			abort();
		run(1);
		CK(cudaStreamSynchronize(s));
		if (kcuda_mm_tile_trace(NULL))
			abort();
		std::vector<unsigned long long> h(NB * SL);
		CK(cudaMemcpy(h.data(), tb, h.size() * 8, cudaMemcpyDeviceToHost));
		std::vector<float> pro, tot, st0, st, b1, mm, b2;
		int blocks = 0, chunks = 0;
		for (size_t b = 0; b < NB; b++) {
			const unsigned long long *r = &h[b * SL];
			const int nc = (int)r[3 + 4 * MT_TR_CH];
			if (!r[0] || nc <= 0)
				continue;
			blocks++;
			chunks = std::max(chunks, nc);
			pro.push_back((float)(r[1] - r[0]));
			tot.push_back((float)(r[2 + 4 * MT_TR_CH] - r[0]));
			unsigned long long prev = r[1];
			for (int i = 0; i < std::min(nc, MT_TR_CH); i++) {
				const unsigned long long *q = r + 2 + 4 * i;
				(i == 0 ? st0 : st).push_back((float)(q[0] - prev));
				b1.push_back((float)(q[1] - q[0]));
				mm.push_back((float)(q[2] - q[1]));
				b2.push_back((float)(q[3] - q[2]));
				prev = q[3];
			}
		}
		const double us = 1.0 / clk_mhz;
		const double m_pro = med(pro), m_tot = med(tot), m_st0 = med(st0), m_st = med(st),
		             m_b1 = med(b1), m_mm = med(mm), m_b2 = med(b2);
		printf("  %-44s %7.2f us a call (%5.0f GB/s), %d blocks, <= %d chunks a block\n", tc.what,
		       ms * 1e3, wb / (ms * 1e-3) / 1e9, blocks, chunks);
		printf("    block %6.0f (%5.2f)  wait %5.0f (%4.2f)  stage first %5.0f (%4.2f)  stage later "
		       "%5.0f "
		       "(%4.2f)  barrier1 %4.0f  mma %4.0f  barrier2 %4.0f (%4.2f us the three)\n",
		       m_tot, m_tot * us, m_pro, m_pro * us, m_st0, m_st0 * us, m_st, m_st * us, m_b1, m_mm,
		       m_b2, (m_b1 + m_mm + m_b2) * us);
		CK(cudaFree(W));
	}
	CK(cudaFree(tb));
	CK(cudaFree(xd));
	CK(cudaFree(yd));
	return 0;
}

int main(int argc, char **argv)
{
	const bool profile = argc > 1 && !strcmp(argv[1], "profile");
	const bool quick = profile || (argc > 1 && !strcmp(argv[1], "quick"));
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	int clk = 0, mclk = 0;
	cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
	cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, 0);
	add("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB, max SM clock %d MHz", prop.name, prop.major,
	    prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
	    prop.l2CacheSize / 1048576.0, clk / 1000);
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 512u << 20, &c)) {
		printf("no context\n");
		return 1;
	}
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	if (argc > 1 && !strcmp(argv[1], "tiletrace"))
		return tile_trace(c, s, clk / 1000, (size_t)prop.l2CacheSize);

	/* ---- ceilings ---- */
	const size_t big = (size_t)2 << 30; /* 2 GiB */
	void *A, *B;
	uint32_t *sink;
	CK(cudaMalloc(&A, big));
	CK(cudaMalloc(&B, big));
	CK(cudaMalloc(&sink, 4));
	fill_random<<<4096, 256, 0, s>>>((uint32_t *)A, big / 4, 1);
	fill_random<<<4096, 256, 0, s>>>((uint32_t *)B, big / 4, 2);
	float ms = bench_time_ms(s, 2, 7, 1,
	                         [&](int) { CK(cudaMemcpyAsync(B, A, big, cudaMemcpyDeviceToDevice, s)); });
	const double copy_gbs = 2.0 * big / (ms * 1e-3) / 1e9;
	add("ceiling: d2d copy 2 GiB: %.3f ms -> %.0f GB/s (read+write)", ms, copy_gbs);
	ms = bench_time_ms(s, 2, 7, 1, [&](int) {
		read_kernel<<<prop.multiProcessorCount * 16, 256, 0, s>>>((const uint4 *)A, big / 16, sink);
	});
	const double read_gbs = big / (ms * 1e-3) / 1e9;
	add("ceiling: read-only stream 2 GiB: %.3f ms -> %.0f GB/s", ms, read_gbs);
	{
		const int n = 8192;
		cublasHandle_t h;
		cublasCreate(&h);
		cublasSetStream(h, s);
		const float one = 1, zero = 0;
		float *C;
		CK(cudaMalloc(&C, (size_t)n * n * 4));
		ms = bench_time_ms(s, 3, 10, 1, [&](int) {
			cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B,
			             CUDA_R_16BF, n, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
			             CUBLAS_GEMM_DEFAULT);
		});
		add("ceiling: cuBLAS bf16 GEMM 8192^3 (fp32 out): %.3f ms -> %.0f TFLOP/s", ms,
		    2.0 * n * n * n / (ms * 1e-3) / 1e12);
		CK(cudaFree(C));
		cublasDestroy(h);
	}

	/* ---- GEMV ---- */
	const int types_all[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_Q8_0, KT_BF16, KT_F16,    KT_F32,   KT_Q4_0,
	                         KT_Q4_1, KT_Q5_0, KT_Q5_1, KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS};
	const int types_prof[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_Q8_0, KT_BF16};
	const int *types = profile ? types_prof : types_all;
	const int n_types = profile ? 5 : (quick ? 5 : (int)(sizeof(types_all) / sizeof(types_all[0])));
	struct shp {
		int64_t n_in, n_out;
		const char *what;
	};
	const shp shapes[] = {{6144, 32768, "6144x32768"},
	                      {6144, 2048, "glm expert 6144x2048"},
	                      {2048, 6144, "glm o_proj/8 2048x6144"},
	                      {7168, 18432, "ds dense 7168x18432"}};
	const int toks[] = {1, 2, 4, 8};
	float *xd, *yd;
	CK(cudaMalloc(&xd, (size_t)4096 * 16384 * 4));
	CK(cudaMalloc(&yd, (size_t)4096 * 32768 * 4));
	fill_random<<<1024, 256, 0, s>>>((uint32_t *)xd, (size_t)4096 * 16384, 3);
	for (int ti = 0; ti < n_types; ti++) {
		const int type = types[ti];
		for (const shp &sh : shapes) {
			if ((quick && sh.n_in == 7168) || (profile && sh.n_out != 32768))
				continue;
			size_t rb;
			if (!ktype_row_bytes(type, sh.n_in, &rb))
				continue;
			const size_t wbytes = rb * (size_t)sh.n_out;
			/* copies of the weight laid out in A (2 GiB) so rotating through them exceeds L2 */
			int ncopy = (int)std::min<size_t>(big / (wbytes + 256), 64);
			if ((size_t)ncopy * wbytes < 4 * (size_t)prop.l2CacheSize)
				continue; /* cannot defeat L2 */
			std::vector<uint8_t> hw(wbytes);
			ops_fill_weight(type, sh.n_in, sh.n_out, rb, hw.data());
			const size_t stride = (wbytes + 255) & ~(size_t)255;
			ncopy = (int)std::min<size_t>(ncopy, big / stride);
			for (int k = 0; k < ncopy; k++)
				CK(cudaMemcpy((char *)A + k * stride, hw.data(), wbytes,
				              cudaMemcpyHostToDevice));
			for (int nt : toks) {
				if (profile && nt > 2)
					continue;
				ms = bench_time_ms(s, 3, 9, ncopy, [&](int i) {
					struct kweight w = {type, sh.n_in, sh.n_out, rb,
					                    (char *)A + (i % ncopy) * stride};
					if (kcuda_matmul(c, &w, xd, sh.n_in, nt, yd, sh.n_out))
						abort();
				});
				const double gbs = wbytes / (ms * 1e-3) / 1e9;
				add("gemv %-7s %-24s n_tok %d: %8.2f us  %6.0f GB/s  %5.1f%% of read  "
				    "%5.1f%% of copy",
				    ktype_name(type), sh.what, nt, ms * 1e3, gbs, 100 * gbs / read_gbs,
				    100 * gbs / copy_gbs);
			}
		}
	}

	/* ---- prefill GEMM ---- */
	const int gtypes[] = {KT_Q4_K, KT_Q8_0, KT_Q6_K, KT_BF16};
	for (int type : gtypes) {
		if (profile)
			break;
		const int64_t n_in = 6144, n_out = 16384;
		size_t rb;
		ktype_row_bytes(type, n_in, &rb);
		std::vector<uint8_t> hw(rb * n_out);
		ops_fill_weight(type, n_in, n_out, rb, hw.data());
		CK(cudaMemcpy(A, hw.data(), hw.size(), cudaMemcpyHostToDevice));
		struct kweight w = {type, n_in, n_out, rb, A};
		for (int nt : {64, 512, 2048}) {
			if (quick && nt == 64)
				continue;
			ms = bench_time_ms(s, 2, 5, 1, [&](int) {
				if (kcuda_matmul(c, &w, xd, n_in, nt, yd, n_out))
					abort();
			});
			add("gemm %-7s %lldx%lld n_tok %4d: %8.3f ms  %6.1f TFLOP/s", ktype_name(type),
			    (long long)n_in, (long long)n_out, nt, ms,
			    2.0 * n_in * n_out * nt / (ms * 1e-3) / 1e12);
		}
	}
	CK(cudaStreamSynchronize(s));
	kcuda_ctx_destroy(c);
	printf("\n==== summary (%s) ====\n", prop.name);
	for (auto &r : table)
		printf("%s\n", r.line);
	return 0;
}
