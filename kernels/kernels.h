/* The op interface the model calls. The only kernel header other folders include.
 *
 * Conventions: activations are fp32, row-major, one row per token. A weight matrix is a GGUF
 * tensor with ne = {n_in, n_out}: row r (one output feature) holds n_in values in the tensor's
 * type and starts at data + r * row_bytes. `y = W x` means y[r] = dot(row r, x).
 *
 * CPU ops (kcpu_*) live one per file in kernels/cpu/, CUDA ops (kcuda_*) one per file in
 * kernels/cuda/ with the same arguments plus a stream context. The CPU ops are the reference
 * every other backend is tested against. */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids, as stored in GGUF tensor infos (MODEL-SPEC.md §4.1). */
enum ktype {
	KT_F32 = 0,
	KT_F16 = 1,
	KT_Q4_0 = 2,
	KT_Q4_1 = 3,
	KT_Q5_0 = 6,
	KT_Q5_1 = 7,
	KT_Q8_0 = 8,
	KT_Q8_1 = 9,
	KT_Q2_K = 10,
	KT_Q3_K = 11,
	KT_Q4_K = 12,
	KT_Q5_K = 13,
	KT_Q6_K = 14,
	KT_Q8_K = 15,
	KT_IQ2_XXS = 16,
	KT_IQ2_XS = 17,
	KT_IQ3_XXS = 18,
	KT_IQ1_S = 19,
	KT_IQ4_NL = 20,
	KT_IQ3_S = 21,
	KT_IQ2_S = 22,
	KT_IQ4_XS = 23,
	KT_I8 = 24,
	KT_I16 = 25,
	KT_I32 = 26,
	KT_I64 = 27,
	KT_F64 = 28,
	KT_IQ1_M = 29,
	KT_BF16 = 30,
	KT_TQ1_0 = 34,
	KT_TQ2_0 = 35,
	KT_MXFP4 = 39,
	KT_COUNT = 40
};

struct ktype_info {
	const char *name; /* "Q4_K"; NULL for ids that are not ggml types */
	int32_t blck; /* elements per block */
	int32_t bytes; /* bytes per block */
	bool compute; /* tandem can dequantize / multiply with it */
};

/* Info for a type id, or NULL if the id is unknown (out of range or unassigned). Knowing a type's
 * size (so a file can be validated) does not mean tandem computes with it: check `compute`. */
const struct ktype_info *ktype_get(int type);
const char *ktype_name(int type); /* "type 77" style string for unknown ids (static buffer per id) */
/* Bytes of n elements of `type`; returns false if n is not a multiple of the block size, the type
 * is unknown, or the result overflows. */
bool ktype_row_bytes(int type, int64_t n, size_t *out);

/* ---- quantized rows (kernels/cpu/quant_*.c) -----------------------------------------------------
 * n must be a multiple of the type's block size. All types with compute = true support all three.
 * dequant is bit-exact with ggml's dequantize_row_*; dot accumulates in fp32 on fp32 activations
 * (scalar reference plus AVX2 path; both agree within fp32 reassociation). quantize is used by the
 * writer (mkmodel) and tests; it need not match ggml's quantizer bit for bit but must round-trip
 * within the type's usual error. */
void kcpu_dequant_row(int type, const void *src, float *dst, int64_t n);
float kcpu_dot_row(int type, const void *row, const float *x, int64_t n);
void kcpu_quantize_row(int type, const float *src, void *dst, int64_t n);
/* Scalar reference versions (tests compare the SIMD paths against these). */
void kcpu_dequant_row_ref(int type, const void *src, float *dst, int64_t n);
float kcpu_dot_row_ref(int type, const void *row, const float *x, int64_t n);

/* fp16 / bf16 conversions (exact, round-to-nearest-even on the way down). */
float kfp16_to_f32(uint16_t h);
uint16_t kf32_to_fp16(float f);
float kbf16_to_f32(uint16_t h);
uint16_t kf32_to_bf16(float f);

/* ---- thread pool (kernels/cpu/pool.c) -----------------------------------------------------------
 * A fixed set of worker threads that run one parallel-for at a time. The calling thread takes
 * part. Several pools may exist (one per TP rank on the CPU backend). */
struct kpool;
struct kpool *kpool_create(int n_threads); /* n_threads >= 1 (1 = run inline) */
void kpool_destroy(struct kpool *p);
int kpool_n_threads(const struct kpool *p);
/* Runs fn(user, i0, i1, thread_index) over [0, n) split into contiguous chunks of at least
 * `grain` items; returns when all are done. */
typedef void (*kpool_fn)(void *user, int64_t i0, int64_t i1, int thread);
void kpool_for(struct kpool *p, int64_t n, int64_t grain, kpool_fn fn, void *user);
/* Notes on kpool_for: p may be NULL (runs inline as thread 0); `thread` is in [0, n_threads) and
 * no two concurrent calls of fn get the same one, so per-thread scratch can be indexed by it; fn
 * must not call kpool_for on the same pool; one caller thread per pool at a time. */
/* Per-thread scratch memory of at least `bytes` (64-byte aligned), owned by the pool and kept
 * between calls (grown on demand, so steady state allocates nothing); NULL if allocation fails
 * or thread is out of range. thread in [0, n_threads) inside a kpool_for callback; thread ==
 * n_threads is one more buffer for the pool's caller outside callbacks. With p == NULL: buffers
 * of the calling thread (n_threads = 1). Valid until the next call with the same (p, thread) or
 * kpool_destroy. */
void *kpool_scratch(struct kpool *p, int thread, size_t bytes);

/* ---- matrix products (kernels/cpu/matmul.c) ------------------------------------------------------ */
struct kweight {
	int type;
	int64_t n_in; /* ne0 */
	int64_t n_out; /* ne1 (rows) */
	size_t row_bytes; /* bytes from one row to the next (>= the bytes of n_in elements: a TP
	                   * slice of the input dimension keeps the full row as stride) */
	const void *data; /* row r at (const char *)data + r * row_bytes */
};

/* Y[t][r] = dot(W row r, X[t]) for t < n_tok, r < n_out. X is n_tok x n_in (row stride ldx
 * floats), Y is n_tok x n_out (row stride ldy floats). Threaded over rows. */
void kcpu_matmul(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                 float *y, int64_t ldy);
/* Approximate fast path, same arguments (opt-in; the reference path never uses it): activations
 * are quantized to int8 per 256 elements (scale max|x|/127, like ggml's Q8_K) and multiplied
 * with integer dots (AVX2 maddubs) for Q8_0, Q4_K, Q5_K and Q6_K weights; about 0.5% of
 * sum|w*x| error per dot (test_matmul prints it). Other types, n_in not a multiple of 256, 4 or
 * more tokens (where the exact tiled path is faster) and builds without AVX2 use kcpu_matmul.
 * Uses the pool's caller scratch (kpool_scratch(p, kpool_n_threads(p), ...)). */
void kcpu_matmul_fast(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                      float *y, int64_t ldy);
bool kcpu_matmul_fast_supported(int type); /* true if kcpu_matmul_fast has integer dots for it */

/* ---- model ops (kernels/cpu, one per file; branch `model`) ---------------------------------------
 * Row ops take row strides in floats; y may alias x where noted in the op's file. */
/* y = w * x / sqrt(mean(x^2) + eps) per row (rmsnorm.c) */
void kcpu_rmsnorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t n,
                  int64_t n_rows, float eps);
/* y = (x - mean) / sqrt(var + eps) * w + b per row (layernorm.c) */
void kcpu_layernorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, const float *b,
                    int64_t n, int64_t n_rows, float eps);
/* RoPE (rope.c). inv_freq[R/2] from theta (YaRN blend if yarn_factor > 1); cs[R] = cos[R/2] then
 * sin[R/2] of one position; kcpu_rope rotates x[R] in place, pairing 0 = interleaved, 1 = half-split. */
void kcpu_rope_freqs(float *inv_freq, int64_t R, float theta, float yarn_factor, int64_t yarn_orig_ctx,
                     float beta_fast, float beta_slow);
void kcpu_rope_cs(const float *inv_freq, int64_t half, int64_t pos, float *cs);
void kcpu_rope(float *x, int64_t R, const float *cs, int pairing);
/* y = SiLU(gate) * up (swiglu.c) */
void kcpu_swiglu(float *y, const float *gate, const float *up, int64_t n);
/* dot of fp32 a with a KV-cache row (fp32 or bf16); out += p * row (kv_row.c) */
float kcpu_kv_dot(const float *a, const void *row, int bf16, int64_t n);
void kcpu_kv_axpy(float *out, float p, const void *row, int bf16, int64_t n);
/* one MLA head, absorbed form: q[C+R], keys[t] -> C+R cache values; out[C] = softmax-weighted
 * sum of the keys' c parts; scores: n_keys scratch (mla_attn.c) */
void kcpu_mla_attn_head(const float *q, int64_t C, int64_t R, const void *const *keys, int n_keys,
                        int key_bf16, float scale, float *scores, float *out);
/* DSA indexer scores of one query: scores[t] = sum_h w[h] * ReLU(scale * q_h . k_t) (indexer.c) */
void kcpu_indexer_scores(const float *q, const float *w, int64_t HI, int64_t DI, const void *const *keys,
                         int n_keys, int key_bf16, float scale, float *scores);
/* indices of the k best scores (score desc, index asc), returned ascending; returns min(k, n) (topk.c) */
int kcpu_topk(const float *scores, int n, int k, int32_t *out);
/* MoE routing of one token; scratch 2*E floats (moe_route.c) */
void kcpu_moe_route(const float *logits, const float *bias, int E, int k, int n_group, int n_group_used,
                    int gating, bool norm, float scale, int32_t *ids, float *weights, float *scratch);

/* ---- CUDA ops (kernels/cuda/, one per file; branch `cuda`) -------------------------------------
 * Declared only where CUDA is built (TANDEM_CUDA=1 from the Makefile, or nvcc itself), so the C code
 * compiles without it. Same arguments as the CPU op plus a context (stream, cuBLAS handle,
 * workspace); every pointer named *_dev or passed to an op is device memory. Ops are asynchronous on
 * the context's stream; kcuda_sync waits and reports errors. Return 0 or a negative code
 * (ERR_CUDA, -EINVAL, ERR_UNSUPPORTED, ERR_LIMIT). Invariant violations inside CUDA calls abort with
 * file:line (sticky CUDA errors leave the context unusable). */
#if defined(TANDEM_CUDA) || defined(__CUDACC__)
struct kcuda_ctx;
int kcuda_device_count(void); /* 0 when there is no usable GPU (no driver, no device) */
/* the most shared memory a block of device dev may have (TANDEM_CUDA_SMEM_CAP lowers it; 0: unknown) */
int kcuda_smem_optin(int dev);
/* ws_bytes: workspace for the prefill GEMM's dequantized weight tiles (0 = 256 MiB). */
int kcuda_ctx_create(int device, size_t ws_bytes, struct kcuda_ctx **out);
#define KCUDA_WS_DEFAULT ((size_t)256 << 20)
/* The workspace the prefill MoE (moe_prefill.cu) needs to take n tokens (k experts each, E experts of F rows,
 * hidden D, a shared expert of Fs rows or Fs = 0) in one pass: its per-pair outputs are fp32 (n k D floats);
 * with less it runs in token chunks of half the size, each re-reading every expert's weights for
 * half-filled 64-pair tiles. 0 for empty shapes. */
size_t kcuda_moe_prefill_ws(int64_t n, int k, int64_t E, int64_t F, int64_t D, int64_t Fs);
void kcuda_ctx_destroy(struct kcuda_ctx *c);
void *kcuda_ctx_stream(struct kcuda_ctx *c); /* the cudaStream_t */
/* The context no longer holds the int8 parts of any activation (kfuse_add_rmsnorm_parts, fused.h):
 * call before the rows they were made from are written by anything else. */
void kcuda_xparts_forget(struct kcuda_ctx *c);
/* the rows whose int8 parts the context holds now (NULL: none) */
const float *kcuda_xparts_of(struct kcuda_ctx *c);
/* Work enqueued on `to` after this call waits for all work enqueued on `from` before it (an event
 * recorded on from's stream, waited on by to's). Inside a stream capture this is a graph edge, and
 * `to` joins the capture. 0 or ERR_CUDA. */
int kcuda_stream_after(struct kcuda_ctx *to, struct kcuda_ctx *from);
int kcuda_sync(struct kcuda_ctx *c);
int kcuda_alloc(size_t bytes, void **out);
void kcuda_free(void *p);
int kcuda_upload(struct kcuda_ctx *c, void *dst_dev, const void *src, size_t bytes); /* synchronous */
int kcuda_download(struct kcuda_ctx *c, void *dst, const void *src_dev, size_t bytes); /* synchronous */
/* rows x width bytes from src_dev (rows spitch apart) to dst (dpitch apart), one copy; synchronous */
int kcuda_download_2d(struct kcuda_ctx *c, void *dst, size_t dpitch, const void *src_dev, size_t spitch,
                      size_t width, size_t rows);
int kcuda_memset(struct kcuda_ctx *c, void *dst_dev, int byte, size_t bytes);
/* Copies a host weight (GGUF block layout) to the device. The device copy keeps the GGUF layout
 * (row r at data + r * row_bytes) and is padded by 16 bytes so the kernels' word loads of
 * 2-byte-aligned blocks stay inside the allocation. dev->data is owned by dev: kcuda_weight_free. */
int kcuda_weight_upload(struct kcuda_ctx *c, const struct kweight *host, struct kweight *dev);
void kcuda_weight_free(struct kweight *dev);

/* Y[t][r] = dot(W row r, X[t]) as kcpu_matmul, W on the device (kcuda_weight_upload). n_tok <= 8
 * runs the weight-streaming GEMV (fp32 dequantize + fp32 accumulate, up to 2 tokens per pass over
 * W); larger n_tok dequantizes W to bf16 tiles in the workspace and multiplies with X rounded to
 * bf16 through cuBLAS on tensor cores (fp32 accumulate), except F32 weights, which are never
 * rounded: they take the fp32 GEMM (KCUDA_MM_F32: W dequantized to fp32 tiles, cuBLAS fp32 without
 * TF32). kcuda_matmul_path forces one path (tests, benchmarks; KCUDA_MM_F32 for the products whose
 * outputs feed a selection, MODEL-SPEC.md §2.6/§2.7: GEMV for n_tok <= 8, the fp32 GEMM above). Uses the
 * context workspace (not reentrant across threads on one context). Tensor-core paths (kernels/cuda/
 * matmul_mma.cu, matmul_tile.cu; TANDEM_GEMV_MMA=0 turns them off): K-quant / Q8_0 GEMV for n_tok
 * <= 8 where measured faster, and for quantized weights a tile product as exact as the fp32 GEMV
 * for n_tok 9..16 (measured crossover, matmul.cu) and for the fp32 path at any n_tok > 8 (instead of bf16 /
 * fp32 cuBLAS). */
enum kcuda_mm_path { KCUDA_MM_AUTO = 0, KCUDA_MM_GEMV = 1, KCUDA_MM_GEMM = 2, KCUDA_MM_F32 = 3 };
int kcuda_matmul(struct kcuda_ctx *c, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                 float *y, int64_t ldy);
int kcuda_matmul_path(struct kcuda_ctx *c, enum kcuda_mm_path path, const struct kweight *w, const float *x,
                      int64_t ldx, int64_t n_tok, float *y, int64_t ldy);
/* The fp32 path at prefill sizes (matmul_gemm.cu, kcuda_gemm_split_launch): W and X split into fp16 hi + lo
 * parts after a power-of-two scale, one fp16 tensor-core GEMM over 3K (fp32 accumulation); as accurate as
 * the tile product. Taken for n_tok >= KCUDA_SPLIT_MIN_TOK and n_out >= KCUDA_SPLIT_MIN_OUT (n_in % 16 == 0;
 * float weights 16-byte aligned) unless TANDEM_F32_SPLIT=0; TANDEM_F32_SPLIT=all: at every n_tok > 8.
 * kcuda_f32_split_mode: 0 off, 1 default, 2 all (read on every call). */
/* Trace mode of the tile product (matmul_tile.cu; bench_cuda_mm tiletrace, test_ops_matmul): buf (device
 * memory, MT_TR_SLOTS words a block, blockIdx x fastest) receives, from thread 0 of each block of every
 * later tile launch, clock64() at its entry, after the PDL wait, four stamps a chunk for its first
 * MT_TR_CH K chunks (staged, first barrier, mma part done, second barrier), its exit and its chunk count.
 * NULL turns it off (the default). Results do not change either way. */
#define MT_TR_CH 8
#define MT_TR_SLOTS (4 + 4 * MT_TR_CH)
int kcuda_mm_tile_trace(unsigned long long *buf);
/* 128 since session 27 (H200, GLM-5 batch 128: idx_q_b 98 -> 66 us a call eager, the graph step 71.4-72.2 ->
 * 71.4-71.6 ms in three passes; at 32 tokens the split is slower: 29.5 -> 33.8 ms); 256 before.
 * TANDEM_F32_SPLIT_MIN_TOK=n (read once, 9..) overrides it */
#define KCUDA_SPLIT_MIN_TOK 128
#define KCUDA_SPLIT_MIN_OUT 1024
int kcuda_f32_split_mode(void);
/* Several products of the same x (same n_in) at decode sizes: y_i[t][r] = dot(W_i row r, x[t]) for
 * t < n_tok, rows ldy_i apart, in ONE launch for the weights it takes (matmul_multi.cu: Q8_0 / F16 /
 * BF16 with n_in % 256 == 0, F32 with n_in % 128 == 0, fp32 throughout, as exact as the GEMV); the
 * others go through kcuda_matmul one by one. ERR_UNSUPPORTED (nothing launched: call kcuda_matmul
 * per weight) for n_tok > 8 (or > TANDEM_MULTI_TOK), x not 16-byte aligned or ldx % 4, or
 * TANDEM_MULTI=0; -EINVAL for bad arguments. y_i must not overlap x or each other. */
#define KCUDA_MM_MULTI_MAX 6
struct kcuda_mm_seg {
	const struct kweight *w; /* borrowed */
	float *y;
	int64_t ldy;
};
int kcuda_matmul_multi(struct kcuda_ctx *c, int n_seg, const struct kcuda_mm_seg *seg, const float *x,
                       int64_t ldx, int64_t n_tok);
/* whether kcuda_matmul_multi launches for n_tok tokens (TANDEM_MULTI, TANDEM_MULTI_TOK; read on every
 * call); it still runs alone what its kernel does not take (type, shape, alignment) */
bool kcuda_matmul_multi_takes(int64_t n_tok);
/* how many launches took the int8 tensor-core kernel (matmul_multi.cu's mm_xm_kernel: TANDEM_MULTI_XM=1,
 * off by default; 5..8 tokens or from TANDEM_MULTI_XM_MIN, every product Q8_0) in this process (tests:
 * that the path ran) */
unsigned long long kcuda_matmul_xm_calls(void);
/* launches of the one-token int8 tensor-core kernel of kcuda_matmul_multi (mm_multi_mq_kernel, x's parts) */
unsigned long long kcuda_matmul_mq_calls(void);
/* Dequantizes rows [r0, r0 + n_rows) of W to bf16 (row-major, n_in per row) (prefill GEMM, tests). */
int kcuda_dequant_bf16(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                       uint16_t *dst_dev);
/* The same to fp32 (every type the backend loads; mla_dense.cu's per-head weights). */
int kcuda_dequant_f32(struct kcuda_ctx *c, const struct kweight *w, int64_t r0, int64_t n_rows,
                      float *dst_dev);

/* Row ops, twins of the kcpu_ row ops (strides in floats; y may alias x). */
int kcuda_rmsnorm(struct kcuda_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                  int64_t n, int64_t n_rows, float eps);
int kcuda_swiglu(struct kcuda_ctx *c, float *y, int64_t ldy, const float *gate, int64_t ldg, const float *up,
                 int64_t ldu, int64_t n, int64_t n_rows);
/* Rotates x[t * ldx + h * head_stride + 0 .. R) in place for t < n_tok, h < n_heads by pos[t] *
 * inv_freq[i] (inv_freq: R/2 values from kcpu_rope_freqs, uploaded; pos: n_tok ids on the device);
 * pairing 0 = interleaved, 1 = half-split; cos/sin are multiplied by mscale (YaRN magnitude, else 1). */
int kcuda_rope(struct kcuda_ctx *c, float *x, int64_t ldx, int64_t n_tok, int64_t n_heads,
               int64_t head_stride, int64_t R, const float *inv_freq, const int32_t *pos, int pairing,
               float mscale);
/* y[t] = dequantized row ids[t] of the table (ids on the device). Ids out of range give a NaN row
 * and count as errors: kcuda_ctx_take_errors returns (and clears) the count. */
int kcuda_embed(struct kcuda_ctx *c, const struct kweight *table, const int32_t *ids, int64_t n_tok, float *y,
                int64_t ldy);
int kcuda_ctx_take_errors(struct kcuda_ctx *c, unsigned *n_bad);
/* kcpu_topk per row: out[r][0 .. min(k, n)) = indices of the k best (score desc, index asc),
 * ascending; NaN ranks as -inf. */
int kcuda_topk(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n, int64_t n_rows, int k,
               int32_t *out, int64_t ldo);
/* One token id per row: greedy when temperature <= 0 or k == 1 (argmax, ties to the lower id);
 * otherwise softmax(logit / temperature) over the top k (k <= 1024) and inverse CDF at u[row]. */
int kcuda_sample(struct kcuda_ctx *c, const float *logits, int64_t ld, int64_t n_vocab, int64_t n_rows, int k,
                 float temperature, const float *u, int32_t *out_ids);

/* ---- CUDA attention, DSA indexer and MoE (mla_*.cu, indexer*.cu, topk_idx*.cu, moe*.cu; branch
 * `cattn`). Batched twins of kcpu_mla_attn_head, kcpu_indexer_scores + kcpu_topk and
 * kcpu_moe_route + the expert FFN of common/model/forward.c. Bad positions / block ids met inside
 * a kernel are skipped and counted (kcuda_ctx_take_errors). Default: the tensor-core / multi-block
 * kernels (branch `attn`); TANDEM_CUDA_ATTN=ref selects the first ones (read on every call). */
/* One layer's part of the paged KV pool on the device (common/model/model.h layout): the row of
 * position p of a sequence with block table tbl is at
 * base + tbl[p / block_tokens] * block_bytes + offset + (p % block_tokens) * dim * (bf16 ? 2 : 4). */
struct kcuda_kv_view {
	const void *base;
	int64_t n_blocks; /* blocks in the pool; other block ids are errors */
	size_t block_bytes;
	size_t offset; /* this layer's latent (or indexer) part inside a block */
	int block_tokens; /* MODEL_KV_BLOCK_TOKENS (64) */
	int64_t dim; /* values per row: C + R (latent) or DI (indexer key) */
	int bf16; /* rows are bf16, else fp32 */
};
/* Which keys each of n_q query rows sees (all arrays on the device).
 * Decode: one row per sequence, qseq[i] its block table, n_keys[i] = its length (or top-k count).
 * Prefill of one sequence: qseq = NULL (table 0), n_keys = NULL (row i sees pos0 + i + 1 keys). */
struct kcuda_attn_rows {
	int64_t n_q;
	const int32_t *qseq; /* n_q block-table indices, or NULL: all rows use table 0 */
	const int32_t *blocks; /* block tables, [n_tables][ld_blocks] */
	int64_t ld_blocks; /* capacity of one table (positions < ld_blocks * block_tokens) */
	const int32_t *n_keys; /* n_q key counts, or NULL: pos0 + i + 1 (causal) */
	int64_t pos0;
	const int32_t *sel; /* NULL: keys are positions 0..n_keys-1; else positions sel[i * ld_sel + j] */
	int64_t ld_sel;
	int64_t max_keys; /* host bound of every n_keys (grid sizing); larger counts are clamped + counted */
};
/* MLA attention, absorbed form, H heads per query row: q[i][h][C + R] (fp32), out[i][h][C] the
 * softmax(scale * q . key)-weighted sum of the keys' c parts (the caller applies W_UV). Split over
 * the keys (flash-decoding, partials in the context workspace) when rows * heads alone do not fill
 * the GPU. Serves decode (one row per sequence) and prefill (rows = tokens, causal or top-k). */
int kcuda_mla_attn(struct kcuda_ctx *c, const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                   const float *q, int64_t H, int64_t C, int64_t R, float scale, float *out);
/* MLA attention of prompt rows that see every key before them (one sequence, positions pos0 .. pos0 +
 * n - 1, row i sees keys 0 .. pos0 + i), in the naive form (kernels/cuda/mla_dense.cu): the keys' latent
 * rows are decompressed by the heads' k_b / v_b and the products run as cuBLAS GEMMs shared by all rows.
 * out[i * ldo + h * V + 0 .. V) = sum_j softmax_j(scale (q_nope . W_UK(h)^T c_j + q_rope . k_r,j)) W_UV(h)
 * c_j, i.e. kcuda_mla_attn followed by v_b, with the same masking of invalid keys (counted, skipped). q_nope
 * of row i, head h at q + i ldq + h q_hs (N values); its ROPED rotary part at qr + i ldqr + h qr_hs (R
 * values); k_b head h: a C x N matrix (n_out C, n_in N) at k_b->data + h k_b_stride; v_b head h: V x C. math:
 * the GEMMs in plain fp32 (KCUDA_MD_F32), on TF32 tensor cores (KCUDA_MD_TF32: inputs rounded to 10 mantissa
 * bits) or on bf16 ones (KCUDA_MD_BF16: q, the latent rows, the weights, K, V and p rounded to bf16; S and
 * the output accumulate in fp32). kb / qb: keys / rows a block (0: the defaults
 * kcuda_mla_dense_ws sized the workspace for; tests force smaller ones). ERR_LIMIT when ws_bytes is short;
 * -EINVAL for bad arguments (nothing launched). */
struct kcuda_mla_dense_args {
	const struct kcuda_kv_view *kv; /* latent rows [c | k_r], dim C + R */
	const int32_t *blocks; /* the sequence's block table (device), ld_blocks entries */
	int64_t ld_blocks;
	int64_t pos0, n;
	const float *q;
	int64_t ldq, q_hs;
	const float *qr;
	int64_t ldqr, qr_hs;
	const struct kweight *k_b, *v_b;
	size_t k_b_stride, v_b_stride;
	int64_t H, C, R, N, V;
	float scale;
	float *out;
	int64_t ldo;
	int math; /* KCUDA_MD_* */
	int flash; /* bf16 math: the fused kernel where it applies (N + R a multiple of 16, V 32, 64, 128 or
	            * 256, its shared memory within the GPU's) with 64 query rows a block (1) or 128 (2: where
	            * the shared memory allows), else the GEMMs; 0: the GEMMs */
	int64_t kb, qb;
};
#define KCUDA_MD_F32 0
#define KCUDA_MD_TF32 1
#define KCUDA_MD_BF16 2
/* workspace bytes for calls of up to max_rows rows and max_keys keys with the given math and flash (as
 * in kcuda_mla_dense_args) on c's device: without the GEMM path's score buffer (up to 256 MB) where the
 * fused kernel takes those calls. 0 for bad arguments. */
size_t kcuda_mla_dense_ws(struct kcuda_ctx *c, int64_t H, int64_t C, int64_t R, int64_t N, int64_t V,
                          int64_t max_rows, int64_t max_keys, int math, int flash);
int kcuda_mla_dense(struct kcuda_ctx *c, const struct kcuda_mla_dense_args *a, void *ws, size_t ws_bytes);
/* DSA indexer scores (kcpu_indexer_scores order): scores[i * ld + t] = sum_h w[i][h] * ReLU(scale *
 * q[i][h] . key_t) for t < n_keys[i] (rows->sel must be NULL); other entries untouched. */
int kcuda_indexer_scores(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                         const struct kcuda_attn_rows *rows, const float *q, const float *w, int64_t HI,
                         int64_t DI, float scale, float *scores, int64_t ld);
/* kcpu_topk per row with a per-row length n[i] (or n0 + i + 1 when n is NULL): out[i][0..m) =
 * the m = min(k, n[i]) best (score desc, position asc, NaN as -inf) in ascending order;
 * n_out[i] = m (n_out may be NULL). Exact (radix select), any n. */
int kcuda_topk_idx(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                   int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out);
/* Indexer scores + top-k for every row, scores kept in the context workspace (rows in chunks that
 * fit); sel[i][0..nsel[i]) as kcuda_topk_idx. */
int kcuda_indexer_topk(struct kcuda_ctx *c, const struct kcuda_kv_view *kv,
                       const struct kcuda_attn_rows *rows, const float *q, const float *w, int64_t HI,
                       int64_t DI, float scale, int k, int32_t *sel, int64_t ld_sel, int32_t *nsel);
/* kcpu_moe_route for n tokens (logits[i * ld + e], bias may be NULL; E <= 1024, n_group <= 32):
 * ids[i][k], weights[i][k] in selection order. */
int kcuda_moe_route(struct kcuda_ctx *c, const float *logits, int64_t ld, const float *bias, int64_t n, int E,
                    int k, int n_group, int n_group_used, int gating, bool norm, float scale, int32_t *ids,
                    float *weights);
/* Addresses of a layer's expert weights for kcuda_moe_router_route's L2 prefetch (device pointers
 * in kcuda_moe_ffn's layout; one expert's gate (= up) and down bytes; the shared expert's may be NULL).
 * Only hints: results never depend on them. */
struct kcuda_moe_pf {
	const void *gate, *up, *down;
	size_t gate_bytes, down_bytes;
	const void *sh_gate, *sh_up, *sh_down;
	size_t sh_gate_bytes, sh_down_bytes;
};
/* The router product logits[i][e] = dot(router row e, x[i]) (F32 weight, E rows of n_in D) and
 * kcuda_moe_route on it in ONE launch (moe_route.cu); off by default (slower in the decode step on
 * the H200), TANDEM_MOE_ROUTER_FUSED=2: 1..2 tokens, =1: 1..8; pf (may be NULL): with TANDEM_MOE_PF's bit 1
 * the chosen experts' weights are prefetched into L2 as soon as they are known. ERR_UNSUPPORTED with nothing
 * enqueued where it does not apply (by default, other shapes and token counts): the caller then runs
 * kcuda_matmul_path(KCUDA_MM_F32) and kcuda_moe_route. Launches on one context's stream must not
 * overlap (a per-context ticket). */
int kcuda_moe_router_route(struct kcuda_ctx *c, const struct kweight *router, const float *x, int64_t ldx,
                           int64_t n, float *logits, const float *bias, int E, int k, int n_group,
                           int n_group_used, int gating, bool norm, float scale, int32_t *ids, float *weights,
                           const struct kcuda_moe_pf *pf);
/* Routed experts: out[i] = sum_j weights[i][j] * down_e(SiLU(gate_e x_i) * up_e x_i), e = ids[i][j].
 * gate/up: device weights of E*F rows of n_in = D (expert e = rows [e F, e F + F)); down: E*D rows
 * of n_in = F. Up to 256 tokens with Q4_K/Q5_K/Q6_K/Q8_0 weights and D, F multiples of 256: pairs
 * sorted by expert on the device, one tensor-core launch for gate+up and one for down, each expert
 * row read once per chunk of up to 8 of its pairs (moe_mma.cu; TANDEM_MOE_FAST=0 turns it off);
 * otherwise up to 16 tokens: all (token, expert) pairs in one launch per stage; 17..256: pairs
 * sorted by expert on the device, each expert row read once per 8 of its pairs (no host sync);
 * more (or TANDEM_MOE_SORTED=0): tokens grouped by expert (one id download) through kcuda_matmul.
 * out is overwritten. */
int kcuda_moe_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, float *out, int64_t ldo);
/* the largest token count kcuda_moe_ffn runs without a host sync (CUDA graphs can hold it) */
int kcuda_moe_ffn_sync_free_max(void);
/* Which decode kernels kcuda_moe_ffn picks for routed experts of these types (shapes aside): the
 * tensor-core ones (gate / up and down each Q4_K, Q5_K, Q6_K, Q8_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S, IQ1_S or IQ1_M), the generic per-row kernels (any other type: IQ4_*, Q2_K / Q3_K, the legacy
 * ones, float), or the split path (gate and up of different types). For the load report of the
 * backend. */
enum kcuda_moe_path { KCUDA_MOE_TENSOR_CORE, KCUDA_MOE_GENERIC, KCUDA_MOE_SPLIT };
enum kcuda_moe_path kcuda_moe_decode_path(int gate_type, int up_type, int down_type);
/* kcuda_moe_ffn plus the shared expert (sh_gate / sh_up: Fs rows of n_in D; sh_down: D rows of n_in Fs)
 * added with weight 1 after the routed sum, in the same launches: at prompt sizes (kcuda_moe_ffn's
 * prefill path, moe_prefill.cu: any Fs % 16 == 0 and types it decodes), else (moe_mma.cu) when
 * TANDEM_MOE_FAST is not 0 and the shared expert has the routed experts' types and Fs == F; else
 * ERR_UNSUPPORTED with nothing enqueued, and the caller runs kcuda_moe_ffn and the shared expert
 * itself. */
int kcuda_moe_ffn_shexp(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                        const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                        const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                        const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo);
/* ONE token: kcuda_moe_route(logits, E, bias, 1, E, k, ...) then kcuda_moe_ffn_shexp(x, D, 1, ids,
 * weights, ...) with the route folded into the expert launches: every block (kernels/cuda/moe_one.cu)
 * or every warp (moe_persist.cu) routes the token itself from the logits with the route kernel's
 * device code (the same ids and weights, which are still stored); D = gate->n_in, out [D]. Where the
 * one-launch kernel applies (moe_persist.cu: Q4_K / Q5_K, F 256, E 129..256, D a multiple of 256;
 * off by default, TANDEM_MOE_PERSIST=1) it runs; else, for the shapes of the batch-1 expert kernels (k <= 8)
 * with both of them selected (TANDEM_MOE_SMALL_V=new), moe_one's two launches. TANDEM_MOE_ONE_ROUTE=0 turns
 * both off. Otherwise ERR_UNSUPPORTED with nothing enqueued: the caller makes the two calls. Must
 * follow the launch that writes the logits on the context's stream. */
int kcuda_moe_route_ffn1(struct kcuda_ctx *c, const float *logits, const float *bias, int E, int k,
                         int n_group, int n_group_used, int gating, bool norm, float scale, int32_t *ids,
                         float *weights, const float *x, const struct kweight *gate, const struct kweight *up,
                         const struct kweight *down, int64_t F, const struct kweight *sh_gate,
                         const struct kweight *sh_up, const struct kweight *sh_down, float *out);
/* Tensor parallelism over the GPUs of one process (kernels/cuda/device.cu): the calling thread's
 * current device (each TP rank thread binds its own); the context's device; a wait for everything
 * enqueued on the context's stream so far that gives up after timeout_s (-ETIMEDOUT; 0 done,
 * ERR_CUDA on a stream error); an asynchronous copy from another device's memory on the stream. */
int kcuda_device_set(int device);
int kcuda_ctx_device(const struct kcuda_ctx *c);
int kcuda_ctx_wait(struct kcuda_ctx *c, double timeout_s);
int kcuda_copy_peer(struct kcuda_ctx *dst_ctx, void *dst, const void *src, int src_device, size_t bytes);
/* One-shot all-reduce (kernels/cuda/allreduce.cu): `size` ranks (<= 8; ctxs[r] on any GPUs, the same
 * GPU too), sums of up to max_floats floats in fixed rank order (every rank gets the same bits), one
 * kernel per call on the rank's stream, graph-capturable; every wait in it has timeout_s (a timed-out
 * call leaves wrong output and is counted: kcuda_ar_errors). ERR_UNSUPPORTED (with why) when two GPUs
 * lack peer access. */
struct kcuda_ar;
int kcuda_ar_create(int size, struct kcuda_ctx *const *ctxs, size_t max_floats, double timeout_s,
                    struct kcuda_ar **out, char *why, size_t why_len);
void kcuda_ar_destroy(struct kcuda_ar *a);
size_t kcuda_ar_max_floats(const struct kcuda_ar *a);
int kcuda_ar_sum(struct kcuda_ar *a, int rank, float *buf, int64_t n);
unsigned kcuda_ar_errors(struct kcuda_ar *a, int rank);
#endif

#ifdef __cplusplus
}
#endif
#endif
