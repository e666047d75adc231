/* kcuda_matmul: the op the model calls for every weight product. Checks the arguments (they come
 * from loaded files, so shapes are validated, not trusted), then picks the decode GEMV for
 * n_tok <= 8 or the prefill GEMM (matmul_gemm.cu) for larger batches: the bf16 tensor-core one, or
 * the fp32 one for F32 weights and for KCUDA_MM_F32 (outputs that feed a top-k selection: a bf16
 * rounding there flips router / indexer choices against the CPU, MODEL-SPEC.md §2.6/§2.7). */
#include <errno.h>

#include "kernels/cuda/matmul_impl.cuh"

#define GEMV_MAX_TOK 8
/* Crossover tile product (matmul_tile.cu) -> dequantize to bf16 + cuBLAS. MEASURED on the H200
 * (2026-11-29 14:32, bench_cuda_gemv_mma glm, GLM-5 per-rank products): the tile kernel's time grows
 * with n_tok far faster than the estimate below: q_a 6144 -> 2048 Q4_K at 32 / 128 tokens 35.6 / 98.2
 * us against 24.6 / 30.1 us for dequantize + cuBLAS (q_b, kv_a, o alike: 0.27-0.85x), while at 8
 * tokens the mma GEMV wins 2x. The crossover lies between 8 and 32 tokens (not measured in
 * between): the tile kernel keeps 9..16, cuBLAS takes the rest. The estimate that chose 128 was: */
/* by counting. The tile
 * kernel reads W about once (~1 byte per weight at Q8_0) and per token spends, per 16 x 16 x 8
 * MACs of one warp, 2 mma (x as fp16 hi and lo) plus ~8-12 fp32 instructions of per-piece
 * epilogue: issue-bound at roughly 100-150 TFLOP/s on an H200. The cuBLAS path moves ~5 bytes per
 * weight (read the quants, write bf16, read bf16: ~12 us for the 12.6 M weights of q_a) and then
 * runs at ~100 TFLOP/s at 64 tokens, ~450 at 512 (docs/PERFORMANCE.md). q_a (6144 -> 2048) at 128
 * tokens: tile ~25 us, cuBLAS ~12 + 11 us (measured 34 us for both launches at batch 128); at 256
 * tokens: ~50 vs ~33 us. So the tile kernel takes n_tok 9..128, cuBLAS above. The fp32 path
 * (KCUDA_MM_F32: products that feed a selection) would otherwise be cuBLAS SGEMM without TF32
 * (<= 67 TFLOP/s peak on an H200); the tile kernel is as exact and faster at every n_tok, so it
 * takes all of them for quantized weights. Measurements should replace these estimates. */
#define MM_TILE_MAX_TOK 16
/* TANDEM_TILE_MAX_TOK (read once; 8..4096): the most tokens a quantized product takes the tile kernel
 * for, default MM_TILE_MAX_TOK (cuBLAS above) */
static int64_t mm_tile_max_tok(void)
{
	static int64_t v = 0;
	if (!v)
		v = kcuda_env_long("TANDEM_TILE_MAX_TOK", 8, 4096, MM_TILE_MAX_TOK);
	return v;
}

extern "C" int kcuda_matmul_path(struct kcuda_ctx *c, enum kcuda_mm_path path, const struct kweight *w,
                                 const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy)
{
	size_t rb = 0;
	if (!c || !w || !w->data || !x || !y)
		return kcuda_bad_arg("matmul", "null context, weight, weight data, x or y");
	if (n_tok < 0 || w->n_in <= 0 || w->n_out <= 0)
		return kcuda_bad_arg("matmul", "n_tok %lld, weight %lld x %lld", (long long)n_tok,
		                     (long long)w->n_out, (long long)w->n_in);
	if (!ktype_row_bytes(w->type, w->n_in, &rb) || rb != w->row_bytes)
		return kcuda_bad_arg("matmul", "%s weight with n_in %lld has row_bytes %zu (want %zu)",
		                     ktype_name(w->type), (long long)w->n_in, w->row_bytes, rb);
	if (ldx < w->n_in || ldy < w->n_out)
		return kcuda_bad_arg("matmul", "ldx %lld < n_in %lld or ldy %lld < n_out %lld",
		                     (long long)ldx, (long long)w->n_in, (long long)ldy, (long long)w->n_out);
	if (path < KCUDA_MM_AUTO || path > KCUDA_MM_F32)
		return kcuda_bad_arg("matmul", "unknown path %d", (int)path);
	if (n_tok == 0)
		return 0;
	const enum kcuda_mm_path path_in = path;
	if (path == KCUDA_MM_AUTO)
		path = n_tok <= GEMV_MAX_TOK ? KCUDA_MM_GEMV
		       : w->type == KT_F32   ? KCUDA_MM_F32
		                             : KCUDA_MM_GEMM;
	if (path == KCUDA_MM_F32 && n_tok <= GEMV_MAX_TOK)
		path = KCUDA_MM_GEMV; /* the GEMV is fp32 throughout and reads W once per 2 tokens */
	/* prefill chunks of the fp32 path (idx_q_b): the split fp16 GEMM (matmul_gemm.cu) */
	if (path == KCUDA_MM_F32 && kcuda_f32_split_takes(w, n_tok)) {
		int rc = kcuda_gemm_split_launch(c, w, x, ldx, n_tok, y, ldy);
		if (rc != ERR_UNSUPPORTED && rc != ERR_LIMIT)
			return rc;
	}
	/* decode batches: the tensor-core tile product reads W once per 64 tokens and is as exact as
	 * the fp32 GEMV, so it serves the fp32 path at any n_tok too (crossover above). An explicit
	 * KCUDA_MM_GEMM stays on cuBLAS (tests, benchmarks). */
	if ((path == KCUDA_MM_F32 ||
	     (path == KCUDA_MM_GEMM && path_in == KCUDA_MM_AUTO && n_tok <= mm_tile_max_tok())) &&
	    n_tok <= INT32_MAX && kcuda_mm_mma_enabled()) {
		int rc = kcuda_mm_tile_launch(c, w, w->row_bytes * (size_t)w->n_out, 1, x, ldx, 0, (int)n_tok,
		                              y, ldy, 0, true);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	if (path == KCUDA_MM_GEMM)
		return kcuda_gemm_launch(c, w, x, ldx, n_tok, y, ldy);
	if (path == KCUDA_MM_F32)
		return kcuda_gemm_f32_launch(c, w, x, ldx, n_tok, y, ldy);

	/* the GEMV reads activations as float4: give it an aligned copy when they are not */
	const bool is_float = w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16;
	for (int64_t t0 = 0; t0 < n_tok; t0 += GEMV_MAX_TOK) {
		const int nt = (int)(n_tok - t0 < GEMV_MAX_TOK ? n_tok - t0 : GEMV_MAX_TOK);
		const float *xs = x + t0 * ldx;
		int64_t lds = ldx;
		if (!is_float && ((uintptr_t)xs % 16 || ldx % 4)) {
			if ((size_t)nt * (size_t)w->n_in * sizeof(float) > c->ws_bytes)
				return ERR_LIMIT;
			if (cudaMemcpy2DAsync(c->ws, (size_t)w->n_in * sizeof(float), xs,
			                      (size_t)ldx * sizeof(float), (size_t)w->n_in * sizeof(float),
			                      (size_t)nt, cudaMemcpyDeviceToDevice, c->stream) != cudaSuccess)
				return kcuda_launch_status("gemv x copy");
			xs = (const float *)c->ws;
			lds = w->n_in;
		}
		/* one token's Q6_K on dp4a (matmul_q6k1.cu: the output heads), gemv_res (Q8_0 / F32 at 1-2
		 * tokens with all rows in shared memory before the wait, matmul_gemv_res.cu: products up to 8
		 * MB by default, TANDEM_GEMV_RES), wide Q8_0 through matmul_multi.cu's kernel
		 * (TANDEM_MULTI_WIDE, default on), gemv3 (matmul_gemv3.cu: Q8_0 / F32 / F16 / BF16, unless
		 * TANDEM_GEMV3=0), then the tensor-core GEMV where its table says it wins, then the fp32 GEMV
		 */
		int rc = ERR_UNSUPPORTED;
		if (nt == 1 && w->type == KT_Q6_K)
			rc = kcuda_gemv_q6k1_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc == ERR_UNSUPPORTED && nt <= 2)
			rc = kcuda_gemv_res_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc == ERR_UNSUPPORTED && w->type == KT_Q8_0 && w->n_out > 1024 &&
		    kcuda_multi_wide_enabled())
			rc = kcuda_gemv_multi1_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc == ERR_UNSUPPORTED)
			rc = kcuda_gemv3_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc == ERR_UNSUPPORTED && !is_float)
			rc = kcuda_gemv_mma_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc == ERR_UNSUPPORTED)
			rc = kcuda_gemv_launch(c, w, xs, lds, nt, y + t0 * ldy, ldy);
		if (rc)
			return rc;
	}
	return 0;
}

extern "C" int kcuda_matmul(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx,
                            int64_t n_tok, float *y, int64_t ldy)
{
	return kcuda_matmul_path(c, KCUDA_MM_AUTO, w, x, ldx, n_tok, y, ldy);
}
