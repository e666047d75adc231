/* Experiment bench: the tensor-core decode GEMV (kernels/cuda/gemv_mma.cuh) for Q4_K, Q5_K, Q6_K, Q8_0,
 * first checked against the CPU reference, then timed against kcuda_matmul's GEMV in the same run.
 *
 * Check (seeded, seed printed; replay with TANDEM_SEED=...): random weights (ops_fill_weight: every
 * bit pattern of the packed fields) and activations uniform in [-1, 1), shapes 6144x32768,
 * 6144x2048, 2048x6144, 16384x6144 (n_in x n_out) and odd n_out (1000, 37, 17), n_tok 1, 2, 3, 4,
 * 5, 8. Per output, with mag = sum_k |w_k x_k| (w = kcpu_dequant_row, in double):
 *   |gpu - kcpu_dot_row| <= 2e-6 sqrt(n_in) mag   (the GEMV tolerance of test_ops_matmul: fp32
 *                                                  summation order, the CPU dot's own error);
 *   |gpu - exact| <= 2^-16 mag, exact = the double dot of the dequantized weights. What the fp16
 *     split costs: hi + lo/2048 misses x by <= 2^-22 |x| (+ 2^-36 near fp16 underflow), the
 *     products are exact, HMMA accumulates in fp32 (alignment/truncation: a few ulp per 16-step
 *     chain) and the scale/min terms may cancel (Q4_K/Q5_K: d sc q - dmin m), so the bound is
 *     taken relative to mag with room for that: 2^-16 = 1.5e-5.
 * Non-finite outputs fail, token rows past n_tok and the guard after Y must keep their fill.
 * The bench also checks kcuda_matmul at n_tok 8 with the first tolerance (harness sanity).
 *
 * Timing: CUDA events around batches of launches, warm-up, median of 9 batches, every launch reads
 * another copy of the weight (copies totalling >= 4x L2), random data; GB/s counts weight bytes;
 * the read ceiling is a streaming uint4 read of 2 GiB measured in the same run.
 *   bench_cuda_gemv_mma [check|time|emu]   (default: check and time; exit 1 if any check fails,
 *                                           77 = no GPU; emu: host emulation of the kernel's
 *                                           unit code, no GPU needed, see gm_emulate)
 *   bench_cuda_gemv_mma profile: 3 launches per type at 6144x32768, n_tok 1 and 2 (for ncu)
 *   TANDEM_GM_R=1|2 forces the row tiles per warp (default: chosen from n_out).
 *   bench_cuda_gemv_mma q6: one token's Q6_K products (output heads) per TANDEM_GEMV_Q6K variant (time_q6).
 *   bench_cuda_gemv_mma glm: only the GLM-5 per-rank decode table (also printed after `time`):
 *     kcuda_matmul and kfwd_head_gemv on the Q8_0 attention / indexer products, the F32 indexer
 *     projection and router (fp32 path), the per-head k_b / v_b and Q4_K q_a, n_tok 1/2/4/8/16,
 *     eager and in CUDA graphs, the default dispatch against TANDEM_GEMV3=0 (the one before
 *     gemv3), same run (time_glm).
 * The "base" columns of the main table are kcuda_matmul with TANDEM_GEMV_MMA=0 and TANDEM_GEMV3=0
 * (the fp32 GEMV). */
#include <algorithm>
#include <stdarg.h>
#include <vector>

#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/moe_mma_units.cuh" /* the MoE's lane type (row table) for the emulation */
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

__global__ void fill_random(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t z = (uint32_t)i * 2654435761u ^ seed;
		z ^= z >> 15;
		z *= 0x2c1b3c6du;
		z ^= z >> 12;
		p[i] = z | 0x01000100u; /* never an all-zero word */
	}
}

struct shape {
	int64_t n_in, n_out;
	const char *what;
};

static const int types[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_Q8_0};
static const shape shapes[] = {{6144, 32768, "6144x32768"},
                               {6144, 2048, "6144x2048 glm expert"},
                               {2048, 6144, "2048x6144 glm o/8"},
                               {16384, 6144, "16384x6144 glm attn_out"},
                               {6144, 1000, "6144x1000 odd"},
                               {2048, 37, "2048x37 odd"},
                               {512, 17, "512x17 odd"}};
#define MAX_TOK 8
#define GUARD 4096 /* floats after Y that must keep the fill */

static int n_fail;
static int g_r_tiles; /* TANDEM_GM_R=1|2 forces the row tiles per warp (A/B runs); 0 = auto */

static float rand_x(void)
{
	float v = ops_rng_unif();
	return v == 0.f ? 0.5f : v;
}

/* Runs the mma GEMV (or the baseline when base) for n_tok tokens and checks every output;
 * returns the number of bad outputs. ref/exact/mag: [MAX_TOK][n_out]. */
static int64_t check_run(struct kcuda_ctx *c, int n_sm, const struct kweight &wd, const float *xd, int n_tok,
                         bool base, const std::vector<float> &ref, const std::vector<double> &exact,
                         const std::vector<double> &mag, float *yd, std::vector<float> &yh, const char *what)
{
	const int64_t n_out = wd.n_out, n_in = wd.n_in;
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t ny = (size_t)MAX_TOK * n_out + GUARD;
	CK(cudaMemsetAsync(yd, 0xA5, ny * sizeof(float), s));
	int rc = base ? kcuda_matmul(c, &wd, xd, n_in, n_tok, yd, n_out)
	              : gemv_mma(wd.type, wd.data, wd.row_bytes, n_in, n_out, xd, n_in, n_tok, yd, n_out, s,
	                         n_sm, g_r_tiles);
	CK(cudaStreamSynchronize(s));
	CK(cudaGetLastError());
	if (rc) {
		printf("FAIL %s %s n_tok %d: rc %d\n", ktype_name(wd.type), what, n_tok, rc);
		n_fail++;
		return 1;
	}
	CK(cudaMemcpy(yh.data(), yd, ny * sizeof(float), cudaMemcpyDeviceToHost));
	int64_t n_bad = 0, n_fill_bad = 0;
	double worst_cpu = 0, worst_exact = 0;
	const double tol_cpu = 2e-6 * sqrt((double)n_in), tol_exact = ldexp(1.0, -16);
	for (int t = 0; t < MAX_TOK; t++)
		for (int64_t r = 0; r < n_out; r++) {
			const float g = yh[(size_t)t * n_out + r];
			if (t >= n_tok) {
				n_fill_bad += !ops_is_fill_f32(g);
				continue;
			}
			const size_t i = (size_t)t * n_out + r;
			const double m = mag[i] + 1e-30, e_cpu = fabs((double)g - ref[i]),
			             e_ex = fabs((double)g - exact[i]);
			const bool ok =
			    isfinite(g) && e_cpu <= tol_cpu * m && (base || e_ex <= tol_exact * m);
			if (!ok && n_bad++ < 3)
				printf("  %s %s n_tok %d row %lld tok %d: gpu %.9g cpu %.9g exact %.9g (|d| "
				       "%.3g / %.3g, "
				       "mag %.3g)\n",
				       ktype_name(wd.type), what, n_tok, (long long)r, t, g, ref[i], exact[i],
				       e_cpu, e_ex, m);
			worst_cpu = std::max(worst_cpu, e_cpu / m);
			worst_exact = std::max(worst_exact, e_ex / m);
		}
	for (size_t i = (size_t)MAX_TOK * n_out; i < ny; i++)
		n_fill_bad += !ops_is_fill_f32(yh[i]);
	const bool pass = n_bad == 0 && n_fill_bad == 0;
	printf("check %-5s %-4s %-24s n_tok %d: max err/mag vs cpu %.2e (tol %.2e), vs exact %.2e (tol "
	       "%.2e)%s%s\n",
	       ktype_name(wd.type), base ? "base" : "mma", what, n_tok, worst_cpu, tol_cpu, worst_exact,
	       base ? 0.0 : tol_exact, n_fill_bad ? " WRITES PAST n_tok/guard" : "", pass ? " ok" : " FAIL");
	if (!pass)
		n_fail++;
	return n_bad + n_fill_bad;
}

static void check_all(struct kcuda_ctx *c, int n_sm)
{
	float *xd, *yd;
	const int64_t max_in = 16384, max_out = 32768;
	CK(cudaMalloc(&xd, sizeof(float) * MAX_TOK * max_in));
	CK(cudaMalloc(&yd, sizeof(float) * ((size_t)MAX_TOK * max_out + GUARD)));
	std::vector<float> yh((size_t)MAX_TOK * max_out + GUARD);
	for (int type : types)
		for (const shape &sh : shapes) {
			const int64_t n_in = sh.n_in, n_out = sh.n_out;
			size_t rb;
			if (!ktype_row_bytes(type, n_in, &rb))
				abort();
			std::vector<uint8_t> wh(rb * n_out);
			ops_fill_weight(type, n_in, n_out, rb, wh.data());
			std::vector<float> xh((size_t)MAX_TOK * n_in), row(n_in);
			for (auto &v : xh)
				v = rand_x();
			struct kweight w = {type, n_in, n_out, rb, wh.data()}, wd = {};
			if (kcuda_weight_upload(c, &w, &wd))
				abort();
			CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
			const size_t n = (size_t)MAX_TOK * n_out;
			std::vector<float> ref(n);
			std::vector<double> exact(n), mag(n);
			for (int64_t r = 0; r < n_out; r++) {
				const uint8_t *wr = wh.data() + (size_t)r * rb;
				kcpu_dequant_row(type, wr, row.data(), n_in);
				for (int t = 0; t < MAX_TOK; t++) {
					const float *x = xh.data() + (size_t)t * n_in;
					double e = 0, m = 0;
					for (int64_t k = 0; k < n_in; k++) {
						const double p = (double)row[k] * x[k];
						e += p;
						m += fabs(p);
					}
					const size_t i = (size_t)t * n_out + r;
					ref[i] = kcpu_dot_row(type, wr, x, n_in);
					exact[i] = e;
					mag[i] = m;
				}
			}
			for (int nt : {1, 2, 3, 4, 5, 8})
				check_run(c, n_sm, wd, xd, nt, false, ref, exact, mag, yd, yh, sh.what);
			check_run(c, n_sm, wd, xd, 8, true, ref, exact, mag, yd, yh, sh.what);
			/* small and large activations (fp16 hi/lo range) on the small shapes: X scaled by
			 * 2^-10 and 2^8, references scaled exactly (powers of two) except kcpu_dot_row,
			 * recomputed */
			for (const float xs : {0x1p-10f, 0x1p8f}) {
				if (n_out > 100)
					break;
				std::vector<float> xs_h(xh);
				for (auto &v : xs_h)
					v *= xs;
				CK(cudaMemcpy(xd, xs_h.data(), xs_h.size() * sizeof(float),
				              cudaMemcpyHostToDevice));
				std::vector<float> ref_s(n);
				std::vector<double> exact_s(n), mag_s(n);
				for (int64_t r = 0; r < n_out; r++)
					for (int t = 0; t < MAX_TOK; t++) {
						const size_t i = (size_t)t * n_out + r;
						ref_s[i] = kcpu_dot_row(type, wh.data() + (size_t)r * rb,
						                        xs_h.data() + (size_t)t * n_in, n_in);
						exact_s[i] = exact[i] * xs;
						mag_s[i] = mag[i] * xs;
					}
				char what[64];
				snprintf(what, sizeof(what), "%s x*%g", sh.what, xs);
				for (int nt : {1, 8})
					check_run(c, n_sm, wd, xd, nt, false, ref_s, exact_s, mag_s, yd, yh,
					          what);
			}
			kcuda_weight_free(&wd);
		}
	/* arguments outside the kernel's assumptions are refused, not run */
	int bad = 0;
	bad += gemv_mma(KT_Q4_K, xd, 144, 256, 1, xd, 256, 9, yd, 1, 0, n_sm, 0) != -EINVAL;
	bad += gemv_mma(KT_Q4_K, xd, 144, 256, 1, xd, 256, 0, yd, 1, 0, n_sm, 0) != -EINVAL;
	bad += gemv_mma(KT_Q8_0, xd, 34 * 4, 128, 1, xd, 128, 1, yd, 1, 0, n_sm, 0) != -EINVAL;
	bad += gemv_mma(KT_Q6_K, xd, 210, 256, 1, xd, 256, 1, yd, 1, 0, n_sm, 0) !=
	       -EINVAL; /* rows 2-byte aligned */
	bad += gemv_mma(KT_Q4_K, xd, 144, 256, 1, xd + 1, 256, 1, yd, 1, 0, n_sm, 0) != -EINVAL;
	bad += gemv_mma(KT_BF16, xd, 512, 256, 1, xd, 256, 1, yd, 1, 0, n_sm, 0) != ERR_UNSUPPORTED;
	printf("check bad arguments: %s\n", bad ? "FAIL" : "ok");
	n_fail += bad;
	CK(cudaFree(xd));
	CK(cudaFree(yd));
}

/* registers, local memory and occupancy of the instantiations that run */
template <int T, int R, int NG> static void kernel_info(void)
{
	cudaFuncAttributes a;
	CK(cudaFuncGetAttributes(&a, gemv_mma_kernel<T, R, NG>));
	int blocks = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemv_mma_kernel<T, R, NG>, GM_WARPS * 32,
	                                                 0));
	printf("kernel %-5s R %d NG %d: %d regs, %zu B local, %zu B shared, %d blocks (%d warps) per SM\n",
	       ktype_name(T), R, NG, a.numRegs, a.localSizeBytes, a.sharedSizeBytes, blocks,
	       blocks * GM_WARPS);
}
template <int T> static void kernel_info_t(void)
{
	kernel_info<T, 1, 1>();
	kernel_info<T, 2, 1>();
	kernel_info<T, 1, 2>();
	kernel_info<T, 2, 2>();
}

/* GLM-5 per-rank decode products, new dispatch (gemv3 and everything after it) against
 * TANDEM_GEMV3=0 (the dispatch before it), alternating in one run, at n_tok 1/2/4/8/16:
 *   eager: CUDA events around batches of launches, every launch on another weight copy (copies
 *     over >= 4x L2: in a decode step the other layers evict a layer's weights);
 *   graph: the same launches captured 20 per CUDA graph (the decode step is a graph of small
 *     kernels back to back), graphs replayed over all copies; run once with TANDEM_PDL=0 and once
 *     without to see what programmatic dependent launch gives (the switch is read once per
 *     process).
 * GB/s counts weight bytes. */
struct gshape {
	int type;
	int64_t n_in, n_out;
	int H; /* > 0: kfwd_head_gemv with H heads, x head stride xhs */
	int64_t xhs;
	enum kcuda_mm_path path;
	const char *what;
};

static int glm_call(struct kcuda_ctx *c, const gshape &g, void *wdata, size_t rb, size_t mat, const float *xd,
                    int nt, float *yd)
{
	struct kweight w = {g.type, g.n_in, g.n_out, rb, wdata};
	if (g.H)
		return kfwd_head_gemv(c, &w, mat, g.H, xd, g.H * g.xhs, g.xhs, nt, yd, (int64_t)g.H * g.n_out,
		                      g.n_out);
	return kcuda_matmul_path(c, g.path, &w, xd, g.n_in, nt, yd, g.n_out);
}

/* ms per launch: graphs of 20 launches each over all ncopy copies, median of 5 replays of all */
static float time_graph(struct kcuda_ctx *c, const gshape &g, void *A, size_t stride, int ncopy, size_t rb,
                        size_t mat, const float *xd, int nt, float *yd)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const int per = 20, ng = (ncopy + per - 1) / per;
	std::vector<cudaGraphExec_t> ex(ng);
	for (int gi = 0; gi < ng; gi++) {
		cudaGraph_t gr;
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < per; i++)
			if (glm_call(c, g, (char *)A + ((gi * per + i) % ncopy) * stride, rb, mat, xd, nt,
			             yd))
				abort();
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

static void time_glm(struct kcuda_ctx *c, size_t l2)
{
	static const gshape gs[] = {
	    {KT_Q8_0, 6144, 2048, 0, 0, KCUDA_MM_AUTO, "q_a 6144->2048"},
	    {KT_Q8_0, 2048, 2048, 0, 0, KCUDA_MM_AUTO, "q_b 2048->8x256"},
	    {KT_Q8_0, 2048, 4096, 0, 0, KCUDA_MM_AUTO, "idx_q_b 2048->4096"},
	    {KT_Q8_0, 6144, 576, 0, 0, KCUDA_MM_AUTO, "kv_a 6144->576"},
	    {KT_Q8_0, 6144, 128, 0, 0, KCUDA_MM_AUTO, "idx_k 6144->128"},
	    {KT_Q8_0, 2048, 6144, 0, 0, KCUDA_MM_AUTO, "o 8x256->6144"},
	    {KT_F32, 6144, 32, 0, 0, KCUDA_MM_F32, "idx_proj F32 ->32"},
	    {KT_F32, 6144, 256, 0, 0, KCUDA_MM_F32, "router F32 ->256"},
	    {KT_Q8_0, 192, 512, 8, 256, KCUDA_MM_AUTO, "k_b 8 x 192->512"},
	    {KT_Q8_0, 512, 256, 8, 512, KCUDA_MM_AUTO, "v_b 8 x 512->256"},
	    {KT_Q4_K, 6144, 2048, 0, 0, KCUDA_MM_AUTO, "q_a Q4_K"},
	};
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t big = (size_t)1 << 30;
	const int max_tok = 16;
	void *A;
	float *xd, *yd;
	CK(cudaMalloc(&A, big));
	CK(cudaMalloc(&xd, sizeof(float) * max_tok * 8192));
	CK(cudaMalloc(&yd, sizeof(float) * max_tok * 8192));
	{
		std::vector<float> xh((size_t)max_tok * 8192);
		for (auto &v : xh)
			v = rand_x();
		CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
	}
	setenv("TANDEM_GEMV_MMA", "1", 1); /* the real dispatch; main's baseline turns it off */
	const char *pdl = getenv("TANDEM_PDL");
	printf("\nGLM-5 per-rank decode products (TP=8), weights rotating over >= 4x L2; new = default, "
	       "old = TANDEM_GEMV3=0; graph: 20 launches per CUDA graph, PDL %s\n"
	       "%-5s %-20s %5s | %8s %6s | %8s %6s | %6s | %8s %6s | %8s %6s | %6s\n",
	       pdl && !strcmp(pdl, "0") ? "off" : "on", "type", "product", "n_tok", "new us", "GB/s",
	       "old us", "GB/s", "speedup", "graph new", "GB/s", "graph old", "GB/s", "speedup");
	for (const gshape &g : gs) {
		size_t rb;
		if (!ktype_row_bytes(g.type, g.n_in, &rb))
			continue;
		const int H = g.H ? g.H : 1;
		const size_t mat = rb * (size_t)g.n_out, wbytes = mat * (size_t)H,
		             stride = (wbytes + 255) & ~(size_t)255;
		const int ncopy =
		    (int)std::min<size_t>(big / stride, std::max<size_t>(4 * l2 / wbytes + 1, 20));
		std::vector<uint8_t> hw(wbytes);
		ops_fill_weight(g.type, g.n_in, g.n_out * H, rb, hw.data());
		for (int k = 0; k < ncopy; k++)
			CK(cudaMemcpy((char *)A + k * stride, hw.data(), wbytes, cudaMemcpyHostToDevice));
		for (int nt : {1, 2, 4, 8, 16}) {
			float ms[2], gms[2];
			for (int off = 0; off < 2; off++) {
				setenv("TANDEM_GEMV3", off ? "0" : "1", 1);
				ms[off] = bench_time_ms(s, 2, 5, ncopy, [&](int i) {
					if (glm_call(c, g, (char *)A + (i % ncopy) * stride, rb, mat, xd, nt,
					             yd))
						abort();
				});
				gms[off] = time_graph(c, g, A, stride, ncopy, rb, mat, xd, nt, yd);
			}
			printf("%-5s %-20s %5d | %8.2f %6.0f | %8.2f %6.0f | %5.2fx | %8.2f %6.0f | %8.2f "
			       "%6.0f | "
			       "%5.2fx\n",
			       ktype_name(g.type), g.what, nt, ms[0] * 1e3, wbytes / (ms[0] * 1e-3) / 1e9,
			       ms[1] * 1e3, wbytes / (ms[1] * 1e-3) / 1e9, ms[1] / ms[0], gms[0] * 1e3,
			       wbytes / (gms[0] * 1e-3) / 1e9, gms[1] * 1e3, wbytes / (gms[1] * 1e-3) / 1e9,
			       gms[1] / gms[0]);
			fflush(stdout);
		}
	}
	setenv("TANDEM_GEMV3", "0", 1); /* back to main's baseline */
	setenv("TANDEM_GEMV_MMA", "0", 1);
	CK(cudaFree(A));
	CK(cudaFree(xd));
	CK(cudaFree(yd));
}

/* bench_cuda_gemv_mma q6: one token's Q6_K products through kcuda_matmul (the output heads of the GLM-5 /
 * DeepSeek-V3 TP=8 rank slices, a full GLM-5 head, a narrow 6144 -> 2048), each TANDEM_GEMV_Q6K variant
 * (matmul_q6k1.cu; 0 = the fp32 GEMV) eager and in graphs, weights rotating over >= 4x L2; GB/s against
 * a streaming read of 2 GiB in the same run */
static void time_q6(struct kcuda_ctx *c, int n_sm, size_t l2)
{
	static const struct {
		int64_t n_in, n_out;
		const char *what;
	} qs[] = {{6144, 19360, "GLM-5 head / 8"},
	          {7168, 16160, "DS-V3 head / 8"},
	          {6144, 154880, "GLM-5 head"},
	          {6144, 2048, "6144->2048"}};
	static const char *vars[] = {"0", "1", "2", "3", "4"};
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t big = (size_t)2 << 30;
	void *A;
	float *xd, *yd;
	uint32_t *sink;
	CK(cudaMalloc(&A, big));
	CK(cudaMalloc(&sink, 4));
	CK(cudaMalloc(&xd, sizeof(float) * 8192));
	CK(cudaMalloc(&yd, sizeof(float) * 160000));
	fill_random<<<4096, 256, 0, s>>>((uint32_t *)A, big / 4, 7);
	const float rms = bench_time_ms(s, 2, 7, 1, [&](int) {
		read_kernel<<<n_sm * 16, 256, 0, s>>>((const uint4 *)A, big / 16, sink);
	});
	const double read_gbs = big / (rms * 1e-3) / 1e9;
	{
		std::vector<float> xh(8192);
		for (auto &v : xh)
			v = rand_x();
		CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
	}
	printf("\nQ6_K, one token (kcuda_matmul), weights rotating over >= 4x L2; read ceiling %.0f GB/s\n"
	       "%-16s %-12s %7s | %8s %6s %6s | %8s %6s %6s\n",
	       read_gbs, "product", "shape", "Q6K", "us", "GB/s", "%read", "graph us", "GB/s", "%read");
	for (const auto &q : qs) {
		size_t rb;
		if (!ktype_row_bytes(KT_Q6_K, q.n_in, &rb))
			continue;
		const size_t wbytes = rb * (size_t)q.n_out, stride = (wbytes + 255) & ~(size_t)255;
		const int ncopy =
		    (int)std::min<size_t>(big / stride, std::max<size_t>(4 * l2 / wbytes + 1, 20));
		if (ncopy < 2)
			continue;
		std::vector<uint8_t> hw(wbytes);
		ops_fill_weight(KT_Q6_K, q.n_in, q.n_out, rb, hw.data());
		for (int k = 0; k < ncopy; k++)
			CK(cudaMemcpy((char *)A + k * stride, hw.data(), wbytes, cudaMemcpyHostToDevice));
		const gshape g = {KT_Q6_K, q.n_in, q.n_out, 0, 0, KCUDA_MM_AUTO, q.what};
		char shape[32];
		snprintf(shape, sizeof shape, "%lldx%lld", (long long)q.n_in, (long long)q.n_out);
		for (const char *v : vars) {
			setenv("TANDEM_GEMV_Q6K", v, 1);
			const float ms = bench_time_ms(s, 2, 5, ncopy, [&](int i) {
				if (glm_call(c, g, (char *)A + (i % ncopy) * stride, rb, wbytes, xd, 1, yd))
					abort();
			});
			const float gms = time_graph(c, g, A, stride, ncopy, rb, wbytes, xd, 1, yd);
			const double gb = wbytes / (ms * 1e-3) / 1e9, ggb = wbytes / (gms * 1e-3) / 1e9;
			printf("%-16s %-12s %7s | %8.2f %6.0f %5.1f%% | %8.2f %6.0f %5.1f%%\n", q.what, shape,
			       v, ms * 1e3, gb, 100 * gb / read_gbs, gms * 1e3, ggb, 100 * ggb / read_gbs);
			fflush(stdout);
		}
	}
	unsetenv("TANDEM_GEMV_Q6K");
	CK(cudaFree(A));
	CK(cudaFree(sink));
	CK(cudaFree(xd));
	CK(cudaFree(yd));
}

static void time_all(struct kcuda_ctx *c, int n_sm, size_t l2)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const size_t big = (size_t)2 << 30;
	void *A;
	uint32_t *sink;
	CK(cudaMalloc(&A, big));
	CK(cudaMalloc(&sink, 4));
	fill_random<<<4096, 256, 0, s>>>((uint32_t *)A, big / 4, 1);
	float ms = bench_time_ms(s, 2, 7, 1, [&](int) {
		read_kernel<<<n_sm * 16, 256, 0, s>>>((const uint4 *)A, big / 16, sink);
	});
	const double read_gbs = big / (ms * 1e-3) / 1e9;
	printf("ceiling: read-only stream 2 GiB: %.3f ms -> %.0f GB/s\n", ms, read_gbs);

	float *xd, *yd;
	CK(cudaMalloc(&xd, sizeof(float) * MAX_TOK * 16384));
	CK(cudaMalloc(&yd, sizeof(float) * MAX_TOK * 32768));
	{
		std::vector<float> xh((size_t)MAX_TOK * 16384);
		for (auto &v : xh)
			v = rand_x();
		CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
	}
	printf("\n%-5s %-24s %5s | %9s %7s %6s | %9s %7s %6s | %s\n", "type", "shape", "n_tok", "mma us",
	       "GB/s", "%read", "base us", "GB/s", "%read", "speedup");
	for (int type : types)
		for (int si = 0; si < 4; si++) {
			const shape &sh = shapes[si];
			size_t rb;
			ktype_row_bytes(type, sh.n_in, &rb);
			const size_t wbytes = rb * (size_t)sh.n_out, stride = (wbytes + 255) & ~(size_t)255;
			const int ncopy = (int)std::min<size_t>(big / stride, 64);
			if ((size_t)ncopy * wbytes < 4 * l2) {
				printf("%-5s %-24s: cannot rotate over 4x L2, skipped\n", ktype_name(type),
				       sh.what);
				continue;
			}
			std::vector<uint8_t> hw(wbytes);
			ops_fill_weight(type, sh.n_in, sh.n_out, rb, hw.data());
			for (int k = 0; k < ncopy; k++)
				CK(cudaMemcpy((char *)A + k * stride, hw.data(), wbytes,
				              cudaMemcpyHostToDevice));
			for (int nt : {1, 2, 4, 8}) {
				const float ms_mma = bench_time_ms(s, 3, 9, ncopy, [&](int i) {
					if (gemv_mma(type, (char *)A + (i % ncopy) * stride, rb, sh.n_in,
					             sh.n_out, xd, sh.n_in, nt, yd, sh.n_out, s, n_sm,
					             g_r_tiles))
						abort();
				});
				const float ms_base = bench_time_ms(s, 3, 9, ncopy, [&](int i) {
					struct kweight w = {type, sh.n_in, sh.n_out, rb,
					                    (char *)A + (i % ncopy) * stride};
					if (kcuda_matmul(c, &w, xd, sh.n_in, nt, yd, sh.n_out))
						abort();
				});
				const double g_mma = wbytes / (ms_mma * 1e-3) / 1e9,
				             g_base = wbytes / (ms_base * 1e-3) / 1e9;
				printf("%-5s %-24s %5d | %9.2f %7.0f %5.1f%% | %9.2f %7.0f %5.1f%% | %.2fx\n",
				       ktype_name(type), sh.what, nt, ms_mma * 1e3, g_mma,
				       100 * g_mma / read_gbs, ms_base * 1e3, g_base, 100 * g_base / read_gbs,
				       ms_base / ms_mma);
				fflush(stdout);
			}
		}
	CK(cudaFree(A));
	CK(cudaFree(sink));
	CK(cudaFree(xd));
	CK(cudaFree(yd));
}

/* ---- host emulation (runs without a GPU) ---------------------------------------------------
 * Runs the kernel's unit bodies (gm_unit, the same code the GPU runs) lane by lane on the CPU for
 * every block of rows, one "warp" doing all units, with mma.sync replayed from the 32 lanes'
 * recorded fragments in the PTX m16n8k16 layout; then sums hi + lo / 2048 as the kernel does.
 * Checks the fragment, bit and scale logic, not the hardware's own behaviour.
 * LN = mm_lane (moe_mma_units.cuh): the MoE kernels' lane type, token columns gathered through a
 * row table; here the table lists the tokens in reverse (column c = token n_tok - 1 - c), and
 * rows whose bytes are not a multiple of 4 (Q6_K at n_in 256) take the run-time alignment path. */
template <int R, int NG>
static void emu_lane_init(gm_lane<R, NG> &a, const float *x, int64_t ldx, const float *const *)
{
	a.x = x, a.ldx = ldx;
}
template <int R, int NG>
static void emu_lane_init(mm_lane<R, NG> &a, const float *, int64_t, const float *const *xr)
{
	a.xr = xr, a.split = 1, a.hp = NULL, a.hq = NULL, a.hnp = 0, a.hF = 0;
}
template <int T, int R, int NG, class LN = gm_lane<R, NG>>
static void gm_emulate(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, const float *x, int64_t ldx,
                       int n_tok, float *y, int64_t ldy)
{
	constexpr bool TABLE = !std::is_same<LN, gm_lane<R, NG>>::value;
	const float *xr[4 * NG];
	for (int c = 0; c < 4 * NG; c++) /* the MoE's table: tokens in reverse */
		xr[c] = x + (int64_t)(c < n_tok ? n_tok - 1 - c : 0) * ldx;
	gm_emulate_rows<T, R, NG, LN>(
	    w, rb, n_in, n_out, n_tok, rb % 4 == 0, [&](LN &a) { emu_lane_init(a, x, ldx, xr); },
	    [&](int64_t row, int col, float v) { y[(TABLE ? n_tok - 1 - col : col) * ldy + row] = v; });
}

template <int T>
static void gm_emulate_t(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, const float *x, int n_tok,
                         float *y, int r_tiles)
{
	if (r_tiles == 0) /* the MoE lane (row table), one tile as moe_small.cu's down kernel */
		n_tok <= 4 ? gm_emulate<T, 1, 1, mm_lane<1, 1>>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out)
		           : gm_emulate<T, 1, 2, mm_lane<1, 2>>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out);
	else if (r_tiles == 2)
		n_tok <= 4 ? gm_emulate<T, 2, 1>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out)
		           : gm_emulate<T, 2, 2>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out);
	else
		n_tok <= 4 ? gm_emulate<T, 1, 1>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out)
		           : gm_emulate<T, 1, 2>(w, rb, n_in, n_out, x, n_in, n_tok, y, n_out);
}

/* Emulated runs against kcpu_dot_row and the exact dot, same tolerances as on the GPU. */
static void emulate_all(void)
{
	static const shape eshapes[] = {
	    {256, 9, "256x9"}, {512, 17, "512x17"}, {2048, 40, "2048x40"}, {6144, 33, "6144x33"}};
	for (int type : types)
		for (const shape &sh : eshapes) {
			const int64_t n_in = sh.n_in, n_out = sh.n_out;
			size_t rb;
			if (!ktype_row_bytes(type, n_in, &rb))
				abort();
			std::vector<uint8_t> wh(rb * n_out + 16);
			ops_fill_weight(type, n_in, n_out, rb, wh.data());
			std::vector<float> xh((size_t)MAX_TOK * n_in), row(n_in), yh((size_t)MAX_TOK * n_out);
			/* also small and large activations; 1e6: past fp16's range (the per-unit scale);
			 * 2^15 and 6e4: units around the vote's threshold and values that round to inf;
			 * rt 0: the MoE lane (row table) */
			for (const float xs : {1.f, 0x1p-10f, 0x1p8f, 0x1p15f, 6e4f, 1e6f})
				for (int nt : {1, 4, 5, 8})
					for (int rt : {1, 2, 0}) {
						if (xs != 1.f && (rt == 2 || nt == 4))
							continue;
						if (n_in == 256 && rt != 0) /* the GEMV takes n_in >= 512 */
							continue;
						for (auto &v : xh)
							v = xs * rand_x();
						switch (type) {
						case KT_Q4_K:
							gm_emulate_t<KT_Q4_K>(wh.data(), rb, n_in, n_out,
							                      xh.data(), nt, yh.data(), rt);
							break;
						case KT_Q5_K:
							gm_emulate_t<KT_Q5_K>(wh.data(), rb, n_in, n_out,
							                      xh.data(), nt, yh.data(), rt);
							break;
						case KT_Q6_K:
							gm_emulate_t<KT_Q6_K>(wh.data(), rb, n_in, n_out,
							                      xh.data(), nt, yh.data(), rt);
							break;
						default:
							gm_emulate_t<KT_Q8_0>(wh.data(), rb, n_in, n_out,
							                      xh.data(), nt, yh.data(), rt);
							break;
						}
						double worst_cpu = 0, worst_exact = 0;
						int64_t n_bad = 0;
						const double tol_cpu = 2e-6 * sqrt((double)n_in),
						             tol_exact = ldexp(1.0, -16);
						for (int64_t r = 0; r < n_out; r++) {
							const uint8_t *wr = wh.data() + (size_t)r * rb;
							kcpu_dequant_row(type, wr, row.data(), n_in);
							for (int t = 0; t < nt; t++) {
								const float *x = xh.data() + (size_t)t * n_in;
								double e = 0, m = 1e-30;
								for (int64_t k = 0; k < n_in; k++) {
									e += (double)row[k] * x[k];
									m += fabs((double)row[k] * x[k]);
								}
								const float g = yh[(size_t)t * n_out + r];
								const double e_cpu =
								    fabs(g - (double)kcpu_dot_row(type, wr, x,
								                                  n_in)) /
								    m;
								const double e_ex = fabs(g - e) / m;
								if (!isfinite(g) || !(e_cpu <= tol_cpu) ||
								    !(e_ex <= tol_exact)) {
									if (n_bad++ < 3)
										printf(
										    "  row %lld tok %d: emu "
										    "%.9g exact %.9g\n",
										    (long long)r, t, g, e);
								}
								worst_cpu = std::max(worst_cpu, e_cpu);
								worst_exact = std::max(worst_exact, e_ex);
							}
						}
						printf("emu %-5s %-8s x*%-9g n_tok %d %s: max err/mag vs "
						       "cpu %.2e (tol %.2e), vs exact "
						       "%.2e (tol %.2e) %s\n",
						       ktype_name(type), sh.what, xs, nt,
						       rt == 0   ? "moe"
						       : rt == 1 ? "R 1"
						                 : "R 2",
						       worst_cpu, tol_cpu, worst_exact, tol_exact,
						       n_bad ? "FAIL" : "ok");
						n_fail += n_bad != 0;
					}
		}
}

/* A few launches per type of the big shape at n_tok 1 and 2, nothing else: for ncu
 * (ncu --kernel-name regex:gemv_mma ... bench_cuda_gemv_mma profile). */
static void profile_all(struct kcuda_ctx *c, int n_sm)
{
	cudaStream_t s = (cudaStream_t)kcuda_ctx_stream(c);
	const int64_t n_in = 6144, n_out = 32768;
	float *xd, *yd;
	CK(cudaMalloc(&xd, sizeof(float) * MAX_TOK * n_in));
	CK(cudaMalloc(&yd, sizeof(float) * MAX_TOK * n_out));
	std::vector<float> xh((size_t)MAX_TOK * n_in);
	for (auto &v : xh)
		v = rand_x();
	CK(cudaMemcpy(xd, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
	for (int type : types) {
		size_t rb;
		ktype_row_bytes(type, n_in, &rb);
		std::vector<uint8_t> wh(rb * n_out);
		ops_fill_weight(type, n_in, n_out, rb, wh.data());
		struct kweight w = {type, n_in, n_out, rb, wh.data()}, wd = {};
		if (kcuda_weight_upload(c, &w, &wd))
			abort();
		for (int nt : {1, 2})
			for (int i = 0; i < 3; i++)
				if (gemv_mma(type, wd.data, rb, n_in, n_out, xd, n_in, nt, yd, n_out, s, n_sm,
				             g_r_tiles))
					abort();
		CK(cudaStreamSynchronize(s));
		kcuda_weight_free(&wd);
	}
	CK(cudaFree(xd));
	CK(cudaFree(yd));
	printf("profile launches done\n");
}

int main(int argc, char **argv)
{
	/* any other argument (gpu-run.sh passes "quick") runs both */
	const bool do_check = argc < 2 || strcmp(argv[1], "time");
	const bool do_time = argc < 2 || strcmp(argv[1], "check");
	if (argc > 1 && !strcmp(argv[1], "emu")) { /* no GPU needed */
		ops_seed_init();
		emulate_all();
		printf("\n%s: %d failed emulated checks\n", n_fail ? "FAIL" : "PASS", n_fail);
		return n_fail ? 1 : 0;
	}
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	/* kcuda_matmul is the baseline here: the dispatch without the tensor-core paths */
	setenv("TANDEM_GEMV_MMA", "0", 1);
	setenv("TANDEM_GEMV3", "0", 1);
	if (getenv("TANDEM_GM_R"))
		g_r_tiles = atoi(getenv("TANDEM_GM_R"));
	printf("row tiles per warp: %s\n", g_r_tiles ? getenv("TANDEM_GM_R") : "auto");
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MiB\n", prop.name, prop.major, prop.minor,
	       prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
	struct kcuda_ctx *c = NULL;
	if (kcuda_ctx_create(0, 64u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	const int n_sm = prop.multiProcessorCount;
	kernel_info_t<KT_Q4_K>();
	kernel_info_t<KT_Q5_K>();
	kernel_info_t<KT_Q6_K>();
	kernel_info_t<KT_Q8_0>();
	if (argc > 1 && !strcmp(argv[1], "profile"))
		profile_all(c, n_sm);
	else if (argc > 1 && !strcmp(argv[1], "glm"))
		time_glm(c, prop.l2CacheSize);
	else if (argc > 1 && !strcmp(argv[1], "q6"))
		time_q6(c, n_sm, prop.l2CacheSize);
	else {
		if (do_check)
			check_all(c, n_sm);
		if (do_time) {
			time_glm(c, prop.l2CacheSize);
			time_all(c, n_sm, prop.l2CacheSize);
		}
	}
	kcuda_ctx_destroy(c);
	printf("\n%s: %d failed checks\n", n_fail ? "FAIL" : "PASS", n_fail);
	return n_fail ? 1 : 0;
}
