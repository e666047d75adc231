/* The op interface the per-rank forward pass (forward.c) is written against (DESIGN.md §3, §7).
 * forward.c is ONE sequence of these ops per rank; a backend (CPU: backend_cpu.c, CUDA:
 * backend_cuda.c) implements them on its own memory. Every float / int32 pointer passed to an op is
 * backend memory (host for CPU, device for CUDA) taken from the workspace (ws) the backend hands
 * out, except where a parameter is marked _host. Weights (struct kweight, layer_w vectors) are the
 * rank's bound weights as the backend sees them (CPU: views into the GGUF mapping).
 *
 * A forward call: begin (the batch's per-step inputs: token ids, positions, sequence indices and
 * block tables go to backend memory, limits checked) -> ops in layer order -> logits_out.
 * Ops are asynchronous on backends that can be (CUDA stream order); host_view and logits_out
 * synchronise. All ops of one rank are called from that rank's thread. */
#ifndef TANDEM_MODEL_BACKEND_H
#define TANDEM_MODEL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "kernels/kernels.h"

struct model;
struct model_rank;
struct model_batch;
struct model_kv;
struct layer_w;

/* The forward's view of one batch (host side, known before any op runs). */
struct mbe_step {
	int64_t n; /* rows computed (>= n_real when the backend pads to a graph bucket) */
	int64_t n_real; /* tokens of the batch (rows 0 .. n_real-1) */
	int max_keys; /* largest pos + 1 of the batch (or the backend's context bucket) */
	int64_t K; /* indexer top-k clamped to max_keys */
	int64_t n_out; /* tokens with logits (rows copied out) */
	int64_t n_out_pad; /* logits rows computed (>= n_out) */
	const int32_t *out_rows_host; /* n_out token indices with logits, ascending */
	bool debug; /* debug hooks read intermediate values: no padding, no graphs */
};

enum mbe_kv_part {
	MBE_KV_LATENT = 0, /* [c | k_r] of main layer `index` */
	MBE_KV_INDEXER = 1, /* indexer key of full-indexer slot `index` */
};

/* The rank's weights as a backend sees them (CPU: the bound views; CUDA: device copies). */
struct mbe_weights {
	const struct layer_w *layers; /* n_layers */
	const struct kweight *lm_head; /* this rank's vocab slice */
	const float *out_norm; /* D */
};

struct model_backend_ops {
	const char *name;
	const struct mbe_weights *(*weights)(void *ctx);
	/* KV pool memory of this backend (NULL: host calloc/free) */
	void *(*kv_alloc)(void *ctx, size_t bytes);
	void (*kv_free)(void *ctx, void *p);
	/* Optional: may raise st->n, max_keys (then K = min(top-k, max_keys)) and n_out_pad to fixed
	 * bucket shapes before anything is sized (NULL: the batch's own shapes). */
	void (*plan)(void *ctx, const struct model_batch *b, struct mbe_step *st);
	/* Per forward: makes the batch and KV pool current; returns 0 or an error (limits). */
	int (*begin)(void *ctx, const struct model_batch *b, struct model_kv *kv, const struct mbe_step *st);
	/* A workspace of at least `bytes` (valid until the next ws call; NULL when it cannot be had). */
	void *(*ws)(void *ctx, size_t bytes);
	/* h[i] = token_embd row of token i (dequantized) */
	void (*embed)(void *ctx, float *h, int64_t D);
	/* cs[i] = cos/sin table of token i's position (R values, kcpu_rope_cs layout) */
	void (*rope_tables)(void *ctx, float *cs, int64_t R);
	void (*rmsnorm)(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
	                int64_t n, int64_t n_rows, float eps);
	void (*layernorm)(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
	                  const float *bias, int64_t n, int64_t n_rows, float eps);
	/* y[t][r] = dot(W row r, x[t]) for t < n_tok, r < n_out (y rows are n_out wide) */
	void (*matmul)(void *ctx, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
	               float *y, int64_t n_out);
	/* rotates x[t * ldx + h * head_stride + 0 .. R) by token t's cs row, t < n_rows, h < n_heads */
	void (*rope)(void *ctx, float *x, int64_t ldx, int64_t n_rows, int64_t n_heads, int64_t head_stride,
	             int64_t R, const float *cs, int pairing);
	void (*scale)(void *ctx, float *x, int64_t n, float s); /* x *= s */
	void (*swiglu)(void *ctx, float *y, const float *gate, const float *up, int64_t n);
	void (*add)(void *ctx, float *y, const float *x, int64_t n); /* y += x */
	/* writes row i of x (width values) for every token i into the pool at its (sequence, position) */
	void (*kv_write)(void *ctx, enum mbe_kv_part part, int index, const float *x, int64_t width);
	/* indexer of full layer `layer`: scores of each token's keys 0..pos (its own key already
	 * written), top-k (score desc, position asc) -> sel (n x K, ascending), nsel. scores (n x
	 * max_keys, or NULL) receives every score row (debug hooks). */
	void (*indexer)(void *ctx, int layer, const float *qI, const float *wI, int32_t *sel, int32_t *nsel,
	                float *scores);
	/* absorbed MLA of this rank's heads: q (n x Hl*(N+R), rope part not rotated), cs, over the keys
	 * sel/nsel (NULL: all keys 0..pos) -> o (n x Hl*V) */
	void (*mla_attn)(void *ctx, int layer, const struct layer_w *L, const float *q, const float *cs,
	                 const int32_t *sel, const int32_t *nsel, float *o);
	/* routed (this rank's F slice) + shared experts of a MoE layer: part (n x D) = sum of the
	 * weighted expert outputs; ids / wts (n x k) receive the routing (debug hooks). */
	void (*moe)(void *ctx, const struct layer_w *L, const float *a, float *part, int32_t *ids,
	            float *wts);
	/* dst row j = src row rows_host[j] (width values), j < n */
	void (*gather_rows)(void *ctx, float *dst, const float *src, int64_t width, const int32_t *rows_host,
	                    int64_t n);
	/* collectives through the rank's TP communicator (0 or an error) */
	int (*all_reduce)(void *ctx, float *buf, size_t n);
	int (*all_gather)(void *ctx, const float *send, size_t n, float *recv);
	int (*barrier)(void *ctx);
	/* host-readable view of bytes at p (CPU: p itself; CUDA: a synchronous download into a host
	 * staging buffer valid until the next host_view) */
	const void *(*host_view)(void *ctx, const void *p, size_t bytes);
	/* copies bytes from backend memory to host memory dst (synchronises) */
	int (*to_host)(void *ctx, void *dst_host, const void *src, size_t bytes);
	void (*destroy)(void *ctx);
	/* KV staging for the workers (model_kv_upload / download, model_host_pin, model_thread_attach;
	 * NULL where the pool is host memory: kv.c copies with memcpy). kv_copy starts a copy of bytes
	 * between the pool (dev) and host memory, to the pool when upload, in stream order with the
	 * forward; kv_wait waits for every copy started; host_pin page-locks a host region for fast
	 * copies; bind_thread makes the calling thread able to run this backend's ops. */
	int (*kv_copy)(void *ctx, void *dev, void *host, size_t bytes, bool upload);
	int (*kv_wait)(void *ctx);
	int (*host_pin)(void *ctx, void *p, size_t bytes);
	void (*host_unpin)(void *ctx, void *p);
	int (*bind_thread)(void *ctx);
	/* Fused ops (issue #4): each equals the sequence of the ops above that it names, run in that
	 * order on the same values (the CPU backend runs exactly that sequence, so its numbers do not
	 * change); a backend may do it in fewer launches. forward.c calls them where it had the
	 * sequence. */
	/* add then rmsnorm: h += x (n_rows x n, contiguous), then y = rmsnorm(h) with w (y not h) */
	void (*add_rmsnorm)(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
	                    int64_t n_rows, float eps);
	/* add_rmsnorm whose y is the input of the very next op (be->moe, or be->matmul_n: the products
	 * of the attention norm's output): the same values; a backend may also keep a form of y that
	 * that op's kernels read (the CUDA backend: y's int8 parts, fused.h's kfuse_add_rmsnorm_parts).
	 * Optional: NULL means add_rmsnorm. */
	void (*add_rmsnorm_q)(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
	                      int64_t n_rows, float eps);
	/* the MLA latents of main layer `layer` (rows st.n): rmsnorm(cq, L->q_a_norm, Cq wide, in
	 * place); rmsnorm of kvl's first C (L->kv_a_norm, in place; rows C + R wide); rope of kvl's last
	 * R (rope_main, cs); then kv_write(MBE_KV_LATENT, layer, kvl, C + R) when write */
	void (*mla_latent)(void *ctx, int layer, const struct layer_w *L, float *cq, float *kvl,
	                   const float *cs, bool write);
	/* the indexer's inputs of full layer `layer`: layernorm(kI, idx_knorm); rope(qI, HI heads of
	 * DI, rope_idx); scale(wI, 1 / sqrt(HI)); rope(kI); kv_write(MBE_KV_INDEXER, idx_slot) when
	 * write */
	void (*idx_prep)(void *ctx, int layer, const struct layer_w *L, float *qI, float *kI, float *wI,
	                 const float *cs, bool write);
	/* Optional concurrency (NULL: one op after another). The ops called between branch_begin and
	 * branch_end form a side branch: they may run concurrently with the ops called after
	 * branch_end, until branch_join, after which everything of the branch is done. The side ops
	 * must not touch what the concurrent ops read or write (forward.c's contract); a backend may
	 * also run them in order (branch_begin may decline: then the calls are plain order). */
	void (*branch_begin)(void *ctx);
	void (*branch_end)(void *ctx);
	void (*branch_join)(void *ctx);
	/* Optional: the absorbed queries of layer `layer` from q (mla_attn's first part: per head
	 * W_UK(h) q_nope, and the roped q_rope), kept by the backend for that layer's mla_attn, which
	 * then starts from them. NULL: mla_attn does it. */
	void (*mla_q)(void *ctx, int layer, const struct layer_w *L, const float *q, const float *cs);
	/* Optional: to_host of `rows` pieces of `width` bytes, spitch apart in backend memory, dpitch
	 * apart in host memory, as one copy (the TP logits gather: one per rank instead of one per row;
	 * NULL: forward.c calls to_host per row). */
	int (*to_host_2d)(void *ctx, void *dst_host, size_t dpitch, const void *src, size_t spitch,
	                  size_t width, size_t rows);
	/* Optional: matmul of n_w weights (same n_in) with the same x, in that order: y[i] rows are
	 * n_out[i] wide (as matmul). Equals n_w matmul calls (the CPU backend makes them); a backend
	 * may run them as one launch (CUDA: kcuda_matmul_multi). NULL: forward.c calls matmul per
	 * weight. n_w <= KCUDA_MM_MULTI_MAX. */
	void (*matmul_n)(void *ctx, int n_w, const struct kweight *const *w, const float *x, int64_t ldx,
	                 int64_t n_tok, float *const *y, const int64_t *n_out);
	/* Optional: whether matmul_n of n_tok tokens runs as one launch (forward.c then groups q_b
	 * with idx_q_b before the query side branch instead of opening the branch with q_b). NULL:
	 * no. */
	bool (*matmul_n_fused)(void *ctx, int64_t n_tok);
};

struct model_backend {
	const struct model_backend_ops *ops;
	void *ctx;
};

/* forward.c: workspace bytes the forward takes through ws() for a batch of n tokens, max_keys
 * keys, n_out logits rows (dbg_idx: indexer score rows for the debug hook). */
size_t model_rank_ws_bytes(const struct model *m, const struct model_rank *rk, int64_t n, int max_keys,
                           int64_t n_out, bool dbg_idx);

/* backend_cpu.c: the CPU backend of rank rk (kcpu_* ops on the rank's kpool). */
int model_backend_cpu_create(struct model *m, struct model_rank *rk, struct model_backend *out);

#ifdef TANDEM_CUDA
/* backend_cuda.c: the CUDA backend of rank rk on device m->opts.device (weights uploaded or, with
 * opts.synthetic, filled with random values; workspaces sized from the opts limits). */
int model_backend_cuda_create(struct model *m, struct model_rank *rk, struct model_backend *out,
                              struct errbuf *e);
/* the rank's CUDA context (device, stream): what its NCCL collectives are enqueued on */
struct kcuda_ctx *model_backend_cuda_kctx(struct model_rank *rk);
/* test hook: every weight byte on rank rk's device compared with the host bytes it was uploaded
 * from (a TP slice in its compacted layout); 0, or ERR_MISMATCH naming the tensor and the byte.
 * *n_bytes: bytes compared. */
int model_backend_cuda_verify_weights(struct model_rank *rk, uint64_t *n_bytes, struct errbuf *e);
/* model_kv_replicate for TP over GPUs: blocks of rank 0's pool copied to every other GPU's copy */
int model_backend_cuda_kv_replicate(struct model *m, const struct model_kv *kv, const int32_t *blocks,
                                    int n_blocks, struct errbuf *e);
#endif

#endif
