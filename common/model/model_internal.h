/* Internal structures of common/model (not for other folders): bound weights, per-rank state. */
#ifndef TANDEM_MODEL_INTERNAL_H
#define TANDEM_MODEL_INTERNAL_H

#include <pthread.h>

#include "common/gguf/gguf.h"
#include "common/model/backend.h"
#include "common/model/model.h"
#include "kernels/kernels.h"

/* A 3-D tensor used as n_mat matrices (per head or per expert): matrix i at data + i * mat_bytes. */
struct kweight3 {
	struct kweight w; /* matrix 0 */
	size_t mat_bytes;
	int64_t n_mat;
};

static inline struct kweight kweight3_at(const struct kweight3 *t, int64_t i)
{
	struct kweight w = t->w;
	w.data = (const char *)t->w.data + (size_t)i * t->mat_bytes;
	return w;
}

/* Weights of one main layer as seen by one rank (sharded views into the mapping). */
struct layer_w {
	float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm; /* owned fp32 copies (D, D, Cq, C) */
	struct kweight q_a, kv_a; /* replicated */
	struct kweight q_b; /* this rank's heads: rows [h0*(N+R), (h0+Hl)*(N+R)) */
	struct kweight3 k_b, v_b; /* this rank's heads (matrix 0 = head h0) */
	struct kweight o; /* row-parallel: n_in = Hl*V, offset h0*V */
	/* indexer (full layers only) */
	bool has_idx;
	struct kweight idx_q_b, idx_k, idx_proj;
	float *idx_knorm_w, *idx_knorm_b; /* owned, DI */
	/* FFN */
	bool moe;
	struct kweight ffn_gate, ffn_up, ffn_down; /* dense: gate/up column shard, down row shard */
	struct kweight gate_inp; /* router, replicated */
	float *exp_bias; /* owned, E; NULL if absent */
	struct kweight3 gate_exps, up_exps, down_exps; /* each expert's F split */
	bool has_shexp;
	struct kweight sh_gate, sh_up, sh_down;
};

/* Growable scratch of one rank. */
struct rank_buf {
	void *p;
	size_t bytes;
};

struct model_rank {
	int rank;
	struct tp_comm comm; /* host-side collectives (CPU threads group, or rank-shard no-ops) */
	struct tp_comm dcomm; /* CUDA TP over GPUs: NCCL on device buffers (ops NULL otherwise) */
	struct kpool *pool;
	struct kpool **inl; /* one single-thread pool per thread of `pool` (expert-parallel MoE) */
	int n_inl;
	bool writes_kv; /* this rank writes the (replicated) KV pool */
	int64_t h0, Hl; /* first head and head count of this rank */
	int64_t ff0, ffl; /* dense MLP slice */
	int64_t fe0, fel; /* expert F slice */
	int64_t fs0, fsl; /* shared expert slice */
	int64_t v0, vl; /* vocab slice of lm_head */
	struct layer_w *layers; /* n_layers */
	struct kweight lm_head; /* vocab slice */
	struct rank_buf buf; /* the forward's workspace (CPU backend) */
	struct model_backend be; /* ops the forward runs on (backend.h) */
	/* per forward call (set by model_forward) */
	const struct model_batch *b;
	struct model_kv *kv;
	float *logits;
	const struct model_debug *dbg;
	int rc;
};

/* Persistent threads for ranks 1..T-1 (run.c): woken once per forward. */
struct rank_workers {
	pthread_t th[256];
	int n; /* threads started */
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	uint64_t gen; /* forward generation; a worker runs when it changes */
	int n_done;
	bool quit;
};

struct model {
	struct model_hparams hp;
	struct model_opts opts;
	struct gguf_ctx *g;
	bool owns_g;
	int T; /* TP degree */
	int n_ranks_local; /* T (threads) or 1 (rank-shard mode) */
	struct model_rank *ranks;
	struct tp_cpu_group *group;
	struct tp_nccl_group *nccl; /* CUDA backend, TP > 1, all ranks local (tp_nccl.c) */
	bool skip_collectives; /* bench only: the CUDA backend skips its NCCL collectives (wrong output) */
	struct rank_workers *workers; /* NULL until the first TP forward */
	struct kweight tok_embd; /* full */
	float *out_norm; /* owned, D */
	uint64_t identity;
};

/* arch.c */
int model_hparams_read(const struct gguf_ctx *g, const struct model_opts *o, struct model_hparams *hp,
                       struct errbuf *e);
/* Checks every tensor against the architecture; prints each problem to report (if non-NULL) and
 * returns the number of problems; first problem in e. strict: unknown tensors count as problems. */
int model_tensors_check(const struct gguf_ctx *g, const struct model_hparams *hp, bool strict, FILE *report,
                        struct errbuf *e);

/* run.c */
void model_workers_stop(struct model *m);

/* forward.c. All-reduces are issued in pieces of at most this many floats (the CPU group's
 * scratch size). */
#define MODEL_TP_CHUNK_FLOATS ((size_t)1 << 20)
int model_rank_forward(struct model *m, struct model_rank *rk);

#endif
