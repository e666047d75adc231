/* The model core: load a glm-dsa / deepseek2 / deepseek32 GGUF, bind and shard its weights, run
 * the batched forward pass (MODEL-SPEC.md §2) per tensor-parallel rank over a paged KV cache.
 *
 * Typical use (CPU backend):
 *
 *   struct model *m;  struct model_opts o;  model_opts_default(&o);
 *   model_load(&m, "x.gguf", &o, &e);
 *   struct model_kv kv;  model_kv_init(&kv, m, n_blocks, NULL, 0, &e);   // or caller memory
 *   // caller assigns blocks to sequences (block ids 0..n_blocks-1)
 *   struct model_seq s = {.blocks = tbl, .n_blocks = nb};
 *   struct model_batch b = {.n_tokens = n, .tokens = ids, .seq = seq_idx, .pos = pos,
 *                           .logits = want, .n_seqs = 1, .seqs = &s};
 *   model_forward(m, &kv, &b, logits_out, NULL, &e);
 *
 * Threading: a struct model is used by one caller thread at a time (model_forward runs its own
 * workers: with TP=T as threads, ranks 1..T-1 are persistent threads started by the first forward,
 * and every rank has its own kpool). The batch is validated before anything runs; errors name
 * the bad token / position / block. See docs/MODEL.md for the decisions behind the numerics. Weights are used
 * straight from the GGUF mapping (no copy); the struct gguf_ctx stays open until model_destroy().
 */
#ifndef TANDEM_MODEL_MODEL_H
#define TANDEM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/base/err.h"
#include "common/model/sample.h"
#include "common/model/tp.h"

struct gguf_ctx;
struct model_backend_ops;

#define MODEL_MAX_LAYERS 512
#define MODEL_KV_BLOCK_TOKENS 64

enum model_arch {
	MODEL_ARCH_GLM_DSA = 0, /* "glm-dsa" */
	MODEL_ARCH_DEEPSEEK2 = 1, /* "deepseek2" (no indexer) */
	MODEL_ARCH_DEEPSEEK32 = 2, /* "deepseek32" (indexer on every layer) */
};
const char *model_arch_name(enum model_arch a);

enum model_rope_pairing {
	MODEL_ROPE_INTERLEAVED = 0, /* pairs (2i, 2i+1) */
	MODEL_ROPE_HALF = 1, /* pairs (i, i + R/2), NeoX */
};

enum model_kv_dtype {
	MODEL_KV_F32 = 0, /* default: exact against the references */
	MODEL_KV_BF16 = 1,
};

/* Architecture parameters, all read from the GGUF metadata (MODEL-SPEC.md §4.2). Names follow
 * MODEL-SPEC.md §0.2. */
struct model_hparams {
	enum model_arch arch;
	int n_layers; /* main layers = block_count - nextn_predict_layers */
	int n_layers_file; /* block_count */
	int n_nextn; /* nextn_predict_layers (skipped) */
	int64_t D; /* embedding_length */
	int64_t H; /* attention.head_count */
	int64_t Cq; /* attention.q_lora_rank */
	int64_t C; /* attention.kv_lora_rank */
	int64_t R; /* rope.dimension_count */
	int64_t N; /* key_length_mla - R */
	int64_t V; /* value_length_mla */
	int64_t vocab; /* rows of token_embd */
	int64_t n_ctx_train; /* context_length */
	int64_t n_ff; /* feed_forward_length (dense MLP) */
	int64_t n_ff_exp; /* F: expert_feed_forward_length */
	int n_dense_lead; /* leading_dense_block_count */
	int n_expert; /* E */
	int n_expert_used; /* k */
	int n_expert_shared;
	int n_group; /* expert_group_count (1 = no group limit) */
	int n_group_used; /* expert_group_used_count */
	int gating_func; /* 1 softmax, 2 sigmoid */
	bool expert_weights_norm;
	float expert_weights_scale;
	float rms_eps; /* attention.layer_norm_rms_epsilon: block and final norms */
	float latent_eps; /* q_a_norm / kv_a_norm eps (option; reference = 1e-6, see model_opts) */
	float idx_norm_eps; /* indexer k_norm LayerNorm eps, 1e-6 */
	/* RoPE */
	float rope_theta;
	enum model_rope_pairing rope_main, rope_idx;
	bool yarn;
	float yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale_all_dim;
	int64_t yarn_orig_ctx;
	float attn_scale; /* sigma = (N+R)^-0.5 * mscale^2 */
	/* DSA indexer (has_indexer false for deepseek2) */
	bool has_indexer;
	int64_t idx_H; /* HI */
	int64_t idx_D; /* DI */
	int64_t idx_topk; /* K */
	int n_idx_full; /* number of layers with a full indexer (and an indexer key cache) */
	bool idx_full[MODEL_MAX_LAYERS]; /* layer l computes its own top-k */
	int idx_src[MODEL_MAX_LAYERS]; /* layer whose top-k layer l uses (l itself if full; -1 = dense) */
	int idx_slot[MODEL_MAX_LAYERS]; /* index among full layers (KV slot), -1 if not full */
	bool lm_head_tied; /* output.weight absent: lm_head = token_embd */
};

struct model_opts {
	int n_threads; /* total CPU threads, shared among the ranks (>= 1); default 1 */
	int tp; /* TP degree T (>= 1); default 1 */
	int rank; /* -1 (default): run all T ranks as threads; r >= 0: rank-shard mode
	           * (only rank r of T, collectives skipped; outputs are that rank's partials) */
	enum model_kv_dtype kv_dtype; /* default MODEL_KV_F32 */
	/* eps of q_a_norm/kv_a_norm. The references (transformers) use 1e-6 regardless of
	 * rms_norm_eps; llama.cpp/vLLM use rms_norm_eps (MODEL-SPEC.md §2.2 vs testdata §6.2).
	 * <= 0 (default) means 1e-6. */
	float latent_eps;
	bool strict; /* unknown tensor names are an error (default: warning) */
	bool quiet; /* no INFO lines while loading */
	/* Backend of the forward (backend.h): MODEL_BACKEND_CPU (default) or MODEL_BACKEND_CUDA
	 * (builds with TANDEM_CUDA; one rank per process: T = 1 or rank-shard mode). */
	enum model_backend_kind {
		MODEL_BACKEND_CPU = 0,
		MODEL_BACKEND_CUDA = 1,
	} backend;
	int device; /* CUDA device id (default 0) */
	/* Largest batch a forward may get: tokens per forward, sequences per batch, context (positions
	 * per sequence). The CUDA backend sizes its workspaces from them at load (0 = 512 tokens, 256
	 * sequences, 4096 positions) and refuses larger batches; on the CPU 0 means "grow scratch as
	 * needed" and a positive value is enforced the same way. */
	int max_tokens, max_seqs, max_ctx;
	float mem_fraction; /* CUDA: fraction of free device memory the workspaces may use (0 = 0.9) */
	/* CUDA decode graphs: 0 off, 1 capture per (batch, context) bucket and replay, 2 pad to the
	 * same buckets but run eagerly (tests compare 1 and 2 bit for bit) */
	int graphs;
	bool synthetic; /* CUDA bench: weights are random device memory, not uploaded (bench only) */
	/* CPU: approximate matmuls (kcpu_matmul_fast: activations quantized to int8 per block, integer
	 * dots) for Q8_0/Q4_K/Q5_K/Q6_K weights; other types stay exact. Off by default: the reference
	 * path never quantizes activations. Indexer/router selections may flip near ties. */
	bool fast_matmul;
};
void model_opts_default(struct model_opts *o);

struct model; /* opaque */

/* Loads and checks the model. On error *out is NULL and e names the problem (missing/extra/
 * mis-shaped tensor, bad key, unsupported arch, TP split not possible for a tensor's block size). */
int model_load(struct model **out, const char *path, const struct model_opts *o,
               struct errbuf *e) TD_MUST_CHECK;
/* What a worker (tandem-prefill / tandem-decode) loads its model with, from its config: backend "cpu" or
 * "cuda", kv_dtype "bf16" (anything else: f32); with cuda every device buffer is sized at load from the
 * limits (max_tokens per step, max_seqs, max_ctx; 0: 4096), never per request. */
struct model_worker_opts {
	const char *backend, *kv_dtype;
	int threads, tp, device, graphs;
	double mem_fraction;
	int max_tokens, max_seqs, max_ctx;
};
/* model_load with those options; a bad backend name or a failed load is an error in e naming it. */
int model_load_worker(struct model **out, const char *path, const struct model_worker_opts *w,
                      struct errbuf *e) TD_MUST_CHECK;
/* Same from an already open GGUF; the model borrows g (caller closes it after model_destroy). */
int model_load_gguf(struct model **out, struct gguf_ctx *g, const struct model_opts *o,
                    struct errbuf *e) TD_MUST_CHECK;
void model_destroy(struct model *m); /* accepts NULL */

const struct model_hparams *model_hparams(const struct model *m);
/* CUDA backend: switches decode graphs (model_opts.graphs) between forwards; no-op on the CPU. */
void model_set_graphs(struct model *m, int graphs);
/* CUDA TP over GPUs, benchmarks only: off skips the NCCL collectives (the output is then wrong) so
 * a step's time without them can be measured; on (the default) runs them. */
void model_set_collectives(struct model *m, bool on);
const struct model_opts *model_get_opts(const struct model *m);
struct gguf_ctx *model_gguf(const struct model *m);

/* Lists every problem of the file against its architecture (unknown arch, missing keys, missing /
 * extra / mis-shaped / wrong-type tensors), one line each, to `report` (may be NULL). Returns the
 * number of problems (0 = loadable), or a negative error if the file cannot be examined at all.
 * Used by `tandem inspect`. */
int model_arch_check(const struct gguf_ctx *g, FILE *report);

/* ---- identity --------------------------------------------------------------------------------- */
/* Hash of the GGUF metadata (every key, type and value) and the tensor table (name, type, shape):
 * two files with the same identity hold the same model layout and metadata (the tensor DATA is
 * not hashed: that would read the whole file). hex = 16 lowercase hex digits + NUL. */
uint64_t model_identity_hash(const struct model *m);
void model_identity_hex(const struct model *m, char hex[17]);

/* KV-layout fingerprint: "arch=glm-dsa layers=78 block=64 C=512 R=64 DI=128 dtype=f32
 * idx=1,1,0,..." (which layers have indexer keys), and its 64-bit hash. Prefill and decode must
 * have equal fingerprints to exchange blocks. Returns the string length (snprintf semantics). */
int model_kv_fingerprint(const struct model *m, char *buf, size_t size);
uint64_t model_kv_fingerprint_hash(const struct model *m);

/* ---- paged KV pool ----------------------------------------------------------------------------
 * A block holds MODEL_KV_BLOCK_TOKENS tokens. Layout of one block (elements of kv_dtype):
 *   for each main layer l:          [64 tokens][C + R]   latent c (post-norm) then k_r (post-RoPE)
 *   for each full indexer slot s:   [64 tokens][DI]      indexer key (post-LayerNorm, post-RoPE)
 * Block b lives at base + b * block_bytes. The caller owns block allocation (which ids belong to
 * which sequence); the model only reads/writes the blocks named in a batch's block tables. */
struct model_kv_layout {
	enum model_kv_dtype dtype;
	size_t elt_bytes; /* 4 (f32) or 2 (bf16) */
	int block_tokens; /* 64 */
	int n_layers;
	int n_idx; /* full indexer layers */
	int64_t lat_dim; /* C + R */
	int64_t idx_dim; /* DI (0 if no indexer) */
	size_t lat_layer_bytes; /* bytes of one layer's latent part of a block */
	size_t idx_layer_bytes;
	size_t idx_offset; /* where the indexer part starts in a block */
	size_t block_bytes;
};
void model_kv_layout_get(const struct model *m, struct model_kv_layout *out);

struct model_kv {
	struct model_kv_layout layout;
	int64_t n_blocks;
	void *base; /* n_blocks * block_bytes (device memory when on_device) */
	bool owned; /* base allocated by model_kv_init */
	bool on_device; /* the model's backend is CUDA: base is device memory */
	const struct model_backend_ops *be_ops; /* allocator of base when on_device */
	void *be_ctx;
};
/* Blocks needed for n_tokens positions; the address of block b of a pool. */
static inline int64_t model_kv_blocks_for(int64_t n_tokens)
{
	return (n_tokens + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS;
}
static inline void *model_kv_block_ptr(const struct model_kv *kv, int64_t b)
{
	return (char *)kv->base + (size_t)b * kv->layout.block_bytes;
}

/* mem == NULL: allocate (zeroed; on the device with the CUDA backend). Otherwise mem (mem_bytes >= n_blocks *
 * block_bytes, 64-byte alignment recommended) is borrowed. */
int model_kv_init(struct model_kv *kv, const struct model *m, int64_t n_blocks, void *mem, size_t mem_bytes,
                  struct errbuf *e) TD_MUST_CHECK;
void model_kv_fini(struct model_kv *kv);
/* CUDA TP over GPUs: every GPU holds a copy of the pool and the forward writes all of them, but
 * blocks written into base from outside (KV received over UCX) land only in rank 0's copy: this
 * copies those blocks to the other GPUs' copies (peer copies, waited for with the NCCL deadline).
 * A no-op for every other configuration. Call between forwards, from the thread that runs them. */
int model_kv_replicate(struct model *m, const struct model_kv *kv, const int32_t *blocks, int n_blocks,
                       struct errbuf *e) TD_MUST_CHECK;

/* ---- KV staging (the workers) ------------------------------------------------------------------
 * A worker exchanges blocks over UCX in host memory laid out like the pool: block b at host +
 * b * block_bytes (a host mirror of the pool; the same block ids on both sides). These copy whole
 * blocks between such a mirror and the pool; ids[i] must lie in [0, kv->n_blocks) (else ERR_FORMAT
 * naming the entry, nothing copied); runs of consecutive ids become one copy.
 *  - upload (host -> pool): on the CUDA backend asynchronous, in stream order before the next
 *    model_forward, which therefore sees the blocks; the host blocks must stay unchanged until that
 *    forward (or model_kv_wait) has returned. CPU pool: memcpy, done on return.
 *  - download (pool -> host): complete when it returns.
 * Called from the thread that runs the model's forwards. */
int model_kv_upload(struct model_kv *kv, const void *host, const int32_t *ids, int n,
                    struct errbuf *e) TD_MUST_CHECK;
int model_kv_download(const struct model_kv *kv, void *host, const int32_t *ids, int n,
                      struct errbuf *e) TD_MUST_CHECK;
int model_kv_wait(const struct model_kv *kv, struct errbuf *e) TD_MUST_CHECK;
/* true when model_kv_init(.., mem = NULL, ..) puts the pool in device memory (CUDA backend) */
bool model_kv_on_device(const struct model *m);
/* Page-locks a host region for fast copies to and from m's device (cudaHostRegister); 0 when done
 * or when there is nothing to do (CPU backend). On an error the region still works, unpinned
 * (slower copies). model_host_unpin undoes a successful pin. */
int model_host_pin(struct model *m, void *p, size_t bytes, struct errbuf *e) TD_MUST_CHECK;
void model_host_unpin(struct model *m, void *p);
/* The calling thread is going to run m's forwards (CUDA: makes m's device current on it). */
int model_thread_attach(struct model *m, struct errbuf *e) TD_MUST_CHECK;

/* ---- batched forward --------------------------------------------------------------------------- */
struct model_seq {
	const int32_t *blocks; /* block table: token at position p lives in blocks[p / 64], slot p % 64 */
	int n_blocks; /* entries in blocks (capacity n_blocks * 64 positions) */
};

/* A batch: n_tokens tokens, each of sequence seq[i] at position pos[i]. Positions of one sequence
 * in a batch must be increasing and contiguous with what is cached (a token at position p sees
 * positions 0..p of its sequence: those < the batch's first position must already be in the cache).
 * Prefill = many tokens of one or several sequences (a chunk may start at any position); decode =
 * one token of each of many sequences. */
struct model_batch {
	int n_tokens;
	const int32_t *tokens;
	const int32_t *seq; /* index into seqs */
	const int32_t *pos;
	const uint8_t *logits; /* 1 = output logits for this token; NULL = only the last token */
	int n_seqs; /* seqs may list sequences that have no token in this batch */
	const struct model_seq *seqs;
};

/* Debug hooks (tests/model). Every callback is optional; they are called from the rank-0 thread
 * during the forward, in layer order. Layer numbering for hidden: -1 = token embeddings,
 * 0..n_layers-1 = residual stream after that layer, n_layers = final RMSNorm output. */
struct model_debug {
	void *user;
	void (*hidden_cb)(void *user, int layer, int n_tokens, int64_t D, const float *h);
	/* per MoE layer: n_tokens x k expert ids (selection order) and final weights (normalised,
	 * times routed scaling) */
	void (*moe_cb)(void *user, int layer, int n_tokens, int k, const int32_t *experts,
	               const float *weights);
	/* per full indexer layer and token: scores of keys 0..pos (n_keys = pos + 1), and the
	 * selected key positions (ascending, n_sel = min(K, n_keys)) */
	void (*indexer_cb)(void *user, int layer, int token, int32_t pos, int n_keys, const float *scores,
	                   int n_sel, const int32_t *sel);
};

/* Runs the batch; writes logits (float32, vocab wide) for the marked tokens, in token order, to
 * `logits` (rows = number of marked tokens; may be NULL if none wanted). Writes the batch's KV into
 * the pool. In rank-shard mode the logits rows hold only this rank's vocab slice (others 0).
 * Errors: bad token id / position / block id / sequence index (ERR_FORMAT-class, nothing computed). */
int model_forward(struct model *m, struct model_kv *kv, const struct model_batch *b, float *logits,
                  const struct model_debug *dbg, struct errbuf *e) TD_MUST_CHECK;

#endif
