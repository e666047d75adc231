/* The CUDA backend of the forward's op interface (backend.h), one rank per process (T = 1 or
 * rank-shard mode). At creation: every weight of the rank is copied from the GGUF file to the
 * device by several copy threads (upload.c: each reads its batches into its own two pinned staging
 * buffers and copies them on its own stream; TANDEM_UPLOAD_THREADS=0: one thread copying from the
 * mapping through two pinned buffers, the first way), compacted (a TP column
 * slice keeps only its columns, an expert slice becomes E x F_rank contiguous rows), with a
 * progress line (GB done, GB/s, ETA); the forward's workspace, the step inputs and the scratch are
 * allocated once from the opts limits (max_tokens / max_seqs / max_ctx). Ops are the kcuda_*
 * kernels (kernels.h) plus kernels/cuda/model_fwd.cu on the context's stream.
 *
 * Decode graphs (opts.graphs): a batch of one token per sequence, every token with logits, no
 * debug hooks, is padded to a batch bucket (1, 2, 4, ... 128, the last one capped at max_tokens,
 * and at the MoE's sync-free limit: kcuda_moe_ffn_sync_free_max) and a context bucket (powers of
 * two from 256 up to max_ctx); the first step of a (batch, context) bucket is captured as it runs
 * (lazily; not when less than GRAPH_MIN_FREE bytes of device memory are free), later steps only refresh the
 * static input buffers (token ids, positions, sequence indices, key counts, block tables) and
 * replay. Padded rows carry position -1 (the KV write skips them) and see one key of table 0.
 *
 * TP over GPUs (T > 1, all ranks in this process): rank r runs on its own thread (run.c) and GPU
 * opts.device + r, binding that device at the start of every step and call from another thread.
 * Each GPU keeps its own copy of the KV pool (rank 0's kv_alloc makes the others; begin maps the
 * pool to this rank's copy) and writes it, so no barrier is needed. all_reduce / all_gather are
 * NCCL collectives (tp_nccl.c) enqueued on the rank's stream and captured into the graphs. Every
 * rank must issue the same collectives in the same order, so a failing op does not cut the step
 * short: errors are held until the step ends (step_finish), where the ranks also agree (host-side,
 * through the CPU group) on whether every capture succeeded before any graph is launched, and the
 * host waits for the stream against the NCCL deadline. */
#ifdef TANDEM_CUDA
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/log.h"
#include "common/model/backend.h"
#include "common/model/model_internal.h"
#include "common/model/upload.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/kv_stage.h"
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/prof.h"
#include "kernels/cuda/upload_lane.h"

#define GRAPH_MAX_BATCH 128
#define N_KV_REP 8 /* KV pools one model may have at once with TP over GPUs */
#define N_BBUCKETS 8 /* 1 2 4 ... 128 */
#define GRAPH_MIN_FREE ((size_t)512 << 20) /* a capture needs room for the graph's own memory */
#define N_CBUCKETS 24

#define MD_SEGS 32 /* dense prompt runs a step (more: the rest take the absorbed kernels) */

struct be_cuda {
	struct model *m;
	struct model_rank *rk;
	struct kcuda_ctx *kc; /* where ops launch: kc_main, or kc_side inside a branch */
	struct kcuda_ctx *kc_main, *kc_side; /* kc_side: the side branch's stream and workspace (NULL: no
	                                      * branches, TANDEM_PAR=0) */
	int branch; /* 0 none, 1 ops go to the side stream, 2 side branch not joined yet */
	int q_layer; /* mla_q ran for this layer: its mla_attn starts from c->qabs (-1: none) */
	bool mla_fold; /* TANDEM_MLA_ROPE=1 with fused ops: q roped inside the attention kernel */
	int device;
	/* TP over GPUs: this GPU's copies of the KV pools (keyed by rank 0's base), the pool of the
	 * current step, the rank's NCCL communicator (NULL: T = 1 or rank-shard mode) */
	struct {
		const void *of;
		void *p;
	} rep[N_KV_REP];
	void *kvb;
	struct tp_comm *nccl;
	bool agree_pending; /* this step was planned as a capture: the ranks agree at its end */
	bool void_step; /* capture refused on this rank: ops skipped, the agreement fails the step */
	bool capture_open; /* kfwd_graph_begin without its end yet */
	bool waited; /* step_finish waited for the stream */
	bool graph_skip; /* the graphs were captured with the collectives skipped (bench) */
	struct layer_w *dl; /* device copies (kweight data / vectors in device memory) */
	struct kweight tok_embd, lm_head;
	float *out_norm;
	struct mbe_weights w;
	void **allocs;
	int n_allocs, cap_allocs;
	/* limits and step inputs: [tok | pos | seq | nk | rows] (max_tok each) then block tables
	 * [max_seqs][max_blk] */
	int64_t max_tok, max_seqs, max_ctx, max_blk;
	int32_t *d_in, *h_in;
	int32_t *d_tok, *d_pos, *d_seq, *d_nk, *d_rows, *d_blk;
	float *d_inv;
	void *ws;
	size_t ws_bytes;
	float *qabs, *obar, *rl, *ys;
	/* current step */
	const struct model_batch *b;
	struct model_kv *kv;
	struct mbe_step st;
	int err;
	void *hv;
	size_t hv_bytes;
	/* graphs */
	void *graph[N_BBUCKETS][N_CBUCKETS];
	bool broken[N_BBUCKETS][N_CBUCKETS]; /* capture failed once: this bucket runs eagerly */
	const void *graph_kv; /* the KV pool the graphs were captured with (its address is baked in) */
	int64_t graph_kv_blocks; /* and its block count (the kernels' bound): a new pool of another size
	                          * may come back at the same address */
	int mode; /* 0 eager, 1 capturing, 2 replaying */
	/* TANDEM_BENCH_KNOCKOUT: ops left out of captured graphs (timing studies only, see prof_on) */
	const char *knockout;
	bool ko_skip; /* the last PROF statement was skipped (knocked out): its caller takes no fallback */
	int gb, gc;
	/* upload progress */
	double up_total, up_done, up_t0, up_last;
	/* TANDEM_CUDA_PROFILE=1: eager decode steps with events around every op (prof.h) */
	struct kprof *prof_all;
	struct kprof *prof_pf; /* prompt (prefill) steps: their own tables (TANDEM_CUDA_PROFILE=1) */
	struct kprof *prof; /* prof_all while a profiled step runs, else NULL */
	bool prof_step;
	bool prof_prefill; /* the profiled step is a prompt chunk (its own table) */
	bool errs_checked; /* this step's kernel error counter was read (to_host) */
	/* TANDEM_CUDA_PROFILE=graph: captures record event nodes (prof.h segments), replays are timed */
	bool prof_graph, prof_capturing, seg_pending;
	struct kprof_seg *gseg[N_BBUCKETS][N_CBUCKETS];
	bool head_gemv; /* k_b / v_b of all heads in one launch (TANDEM_HEAD_GEMV=0: per head) */
	bool multi_qb; /* q_b + idx_q_b as one launch before the query branch (TANDEM_MULTI_QB=1; off) */
	/* products of one x one by one (past the multi kernel's tokens): up to par_n tokens the last
	 * n_w - par_main of them on the side stream beside the first par_main (TANDEM_PAR_N, 0 off;
	 * TANDEM_PAR_MAIN; 0: half of them, rounded up) */
	int64_t par_n;
	int par_main;
	bool fuse; /* fused small ops (kernels/cuda/fused.h; TANDEM_FUSE=0: the parts one by one) */
	/* idx_prep folded away (TANDEM_IDX_FOLD=0: off): the outputs of the last products (cu_matmul),
	 * where mla_latent finds k_I and w_I; the layer whose k_I / w_I it did (fold_layer, checked by
	 * idx_prep) and the layer whose q_I the indexer ropes on its loads (foldq_layer) */
	const struct kweight *mm_w[4];
	float *mm_y[4];
	int mm_at;
	int fold_layer, foldq_layer;
	const float *fold_kI, *fold_wI, *fold_qI;
	/* ops begun on the main path (SKIP_REPLAY outside the side branch, and the ops without it that
	 * write device memory; branch control does not count); parts_seq: the op that left the int8
	 * parts of parts_y (cu_add_rmsnorm_q: its y; cu_mla_latent: c_q) in kc_main's buffer. The
	 * products and the MoE use them only when they are the very next main-path op and read that
	 * buffer (parts_check), and forget them when done; side-branch ops never use them and drop them
	 * if they write parts_y (forward.c's query branch writes q and the absorbed q only) */
	unsigned long long op_seq, parts_seq;
	const float *parts_y;
	/* the dense prompt path (kcuda_mla_dense): its workspace (NULL: off, TANDEM_MLA_DENSE=0 or
	 * max_tokens below md_min), the fewest rows a call takes it (TANDEM_MLA_DENSE_MIN), the GEMMs'
	 * math (TANDEM_MLA_DENSE_MATH: KCUDA_MD_*; unset: by the pool's dtype, bf16 for bf16, fp32 for fp32);
	 * md_seg: this step's runs of rows that take it (cu_begin: rows r0 .. r0 + n - 1 are sequence seq
	 * at positions pos0 .. pos0 + n - 1, n >= md_min) */
	void *md_ws;
	size_t md_bytes;
	int64_t md_min;
	int md_math;
	int md_flash; /* TANDEM_MLA_DENSE_FLASH: the bf16 math's fused kernel (kcuda_mla_dense_args.flash) */
	struct md_seg {
		int64_t r0, n, pos0;
		int seq;
	} md_seg[MD_SEGS];
	int md_n;
};

#define CK(x)                                                                                                \
	do {                                                                                                 \
		int rc_ = (x);                                                                               \
		if (rc_ && !c->err)                                                                          \
			c->err = rc_;                                                                        \
	} while (0)
/* ops record into the graph while capturing and do nothing while replaying */
#define SKIP_REPLAY(c)                                                                                       \
	do {                                                                                                 \
		if ((c)->branch != 1) /* an op of the main path (parts_check) */                             \
			(c)->op_seq++;                                                                       \
		if ((c)->mode == 2)                                                                          \
			return;                                                                              \
	} while (0)

/* whether op `name` is in TANDEM_BENCH_KNOCKOUT's comma-separated list of op names (the names of the
 * profile tables: "attn.mla", "moe.experts", "indexer(scores+topk)", ...) */
static bool knocked_out(const char *list, const char *name)
{
	const size_t nl = strlen(name);
	for (const char *p = list; (p = strstr(p, name)); p += nl)
		if ((p == list || p[-1] == ',') && (p[nl] == ',' || !p[nl]))
			return true;
	return false;
}

/* Returns 0 (the op's statement is skipped) only for a knocked-out op while a decode graph is being
 * captured: the graph then lacks that op's launches, and its replays measure the step without it.
 * The eager steps before the capture (tandem bench runs them first) still run every op, so the
 * buffers a left-out op would have written hold plausible values from them; the replays' outputs are
 * wrong by design. Where an op's caller would take another path when the op's statement did not run
 * (the single products after mm.multi, the shared expert apart after moe.experts, absorb and rope
 * apart after attn.q_absorb+rope, ...), the caller sees c->ko_skip and takes none. Knocking out
 * add+rmsnorm also drops the int8 parts it leaves, so its readers take their fp32-x kernels. A timing
 * study of the critical path (docs/PERFORMANCE.md, session 26): what the step loses when one op costs
 * nothing, which a kernel's marginal in a trace can overstate (the norms: ~4 us a call there, ~0 here). */
static int prof_on(struct be_cuda *c, const char *name, const char *sub, double bytes)
{
	c->ko_skip = c->knockout && c->mode == 1 && knocked_out(c->knockout, name);
	if (c->ko_skip)
		return 0;
	if (c->prof)
		kprof_push(c->prof, name, sub, bytes);
	return 1;
}

static int prof_off(struct be_cuda *c)
{
	if (c->prof)
		kprof_pop(c->prof);
	return 0;
}

/* PROF(c, name, sub, bytes) STATEMENT runs the statement once, bracketed by profile events when
 * this step is profiled (a pointer test otherwise); bytes: what the op reads */
#define PROF(c, name, sub, bytes)                                                                            \
	for (int p_once_ = prof_on(c, name, sub, bytes); p_once_; p_once_ = prof_off(c))

static double wbytes(const struct kweight *w)
{
	return (double)w->row_bytes * (double)w->n_out;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *dalloc(struct be_cuda *c, size_t bytes)
{
	void *p = NULL;
	if (c->n_allocs == c->cap_allocs) {
		int cap = c->cap_allocs ? 2 * c->cap_allocs : 256;
		void **na = realloc(c->allocs, sizeof(void *) * (size_t)cap);
		if (!na)
			return NULL;
		c->allocs = na;
		c->cap_allocs = cap;
	}
	if (kcuda_alloc(bytes ? bytes : 16, &p))
		return NULL;
	c->allocs[c->n_allocs++] = p;
	return p;
}

/* ---- weight upload ----------------------------------------------------------------------------- */
struct upl {
	struct be_cuda *c;
	struct kfwd_stager *sg;
	struct upload_plan *plan; /* the threaded copier's plan: pass 2 only records the pieces */
	bool count; /* pass 1: only add up the bytes */
	bool verify; /* model_backend_cuda_verify_weights: compare the device bytes with the host's */
	uint64_t v_bytes; /* compared so far */
	char *v_buf;
	size_t v_cap;
	bool synthetic;
	uint64_t seed;
	struct errbuf *e;
};

static void progress(struct be_cuda *c, bool last)
{
	double t = now_s();
	if (!last && t - c->up_last < 2.0)
		return;
	c->up_last = t;
	double el = t - c->up_t0, rate = el > 0 ? c->up_done / el : 0;
	double eta = rate > 0 ? (c->up_total - c->up_done) / rate : 0;
	fprintf(stderr, "\rcuda: weights %.2f / %.2f GB, %.2f GB/s, ETA %.0f s%s", c->up_done / 1e9,
	        c->up_total / 1e9, rate / 1e9, eta, last ? "\n" : "");
}

static int up_bytes(struct upl *u, void *dst, const void *src, size_t bytes)
{
	struct be_cuda *c = u->c;
	if (u->count) {
		c->up_total += (double)bytes;
		return 0;
	}
	int rc;
	if (u->synthetic)
		rc = kfwd_fill_random(c->kc, dst, bytes, u->seed++ * 0x9e3779b97f4a7c15ull);
	else
		rc = kfwd_stage(u->sg, dst, src, bytes);
	c->up_done += (double)bytes;
	if (!c->m->opts.quiet)
		progress(c, false);
	return rc;
}

static const char *up_name_cb(void *user, const void *src, size_t *off);

/* verify: n_rows rows of rb bytes at device address dev (contiguous) against the host rows src,
 * stride apart; ERR_MISMATCH naming the tensor and the first differing byte */
static int verify_rows(struct upl *u, const char *dev, const char *src, size_t stride, size_t rb,
                       size_t n_rows)
{
	size_t bytes = rb * n_rows;
	if (bytes > u->v_cap) {
		char *nb = realloc(u->v_buf, bytes);
		if (!nb)
			return errbuf_set(u->e, -ENOMEM, "out of memory");
		u->v_buf = nb;
		u->v_cap = bytes;
	}
	int rc = kcuda_download(u->c->kc, u->v_buf, dev, bytes);
	if (rc)
		return errbuf_set(u->e, rc, "cuda: cannot read the uploaded weights back");
	for (size_t r = 0; r < n_rows; r++) {
		const char *a = u->v_buf + r * rb, *b = src + r * stride;
		if (memcmp(a, b, rb) == 0)
			continue;
		size_t j = 0, off = 0;
		while (a[j] == b[j])
			j++;
		const char *nm = up_name_cb(u->c, b + j, &off);
		return errbuf_set(
		    u->e, ERR_MISMATCH,
		    "cuda: uploaded weights differ from the file: tensor %s, its byte %zu (device "
		    "0x%02x, file 0x%02x)",
		    nm ? nm : "(a host vector)", off, (unsigned char)a[j], (unsigned char)b[j]);
	}
	u->v_bytes += bytes;
	return 0;
}

/* n_mat matrices (stride mat_bytes on the host) of h's shape -> contiguous compact rows */
static int up_mats(struct upl *u, const struct kweight *h, size_t mat_bytes, int64_t n_mat, struct kweight *d,
                   size_t *d_mat_bytes)
{
	size_t rb;
	if (!h->data || !ktype_row_bytes(h->type, h->n_in, &rb))
		return errbuf_set(u->e, ERR_UNSUPPORTED, "cuda: weight of type %s cannot be uploaded",
		                  ktype_name(h->type));
	size_t per = rb * (size_t)h->n_out, total = per * (size_t)n_mat;
	if (u->verify) { /* d holds the device copy */
		int rc = d->row_bytes == rb && d->n_out == h->n_out
		             ? 0
		             : errbuf_set(u->e, ERR_MISMATCH,
		                          "cuda: a device weight's shape differs from the file's");
		for (int64_t i = 0; i < n_mat && !rc; i++)
			rc = verify_rows(u, (const char *)d->data + (size_t)i * per,
			                 (const char *)h->data + (size_t)i * mat_bytes, h->row_bytes, rb,
			                 (size_t)h->n_out);
		return rc;
	}
	*d = *h;
	d->row_bytes = rb;
	if (d_mat_bytes)
		*d_mat_bytes = per;
	if (u->count) {
		u->c->up_total += (double)total;
		return 0;
	}
	char *p = dalloc(u->c, total + 16);
	if (!p || kcuda_memset(u->c->kc, p + total, 0, 16))
		return errbuf_set(u->e, -ENOMEM, "cuda: cannot allocate %zu bytes of weights", total);
	d->data = p;
	int rc = 0;
	if (u->plan && !u->synthetic) { /* every matrix as n_out rows of rb, h->row_bytes apart */
		upload_plan_new_dst(u->plan);
		for (int64_t i = 0; i < n_mat && !rc; i++)
			rc = upload_plan_add(u->plan, p + (size_t)i * per,
			                     (const char *)h->data + (size_t)i * mat_bytes, h->row_bytes, rb,
			                     (size_t)h->n_out);
		return rc ? errbuf_set(u->e, rc, "cuda: cannot plan the weight upload") : 0;
	}
	if (!u->synthetic)
		kfwd_stage_new_dst(u->sg);
	for (int64_t i = 0; i < n_mat && !rc; i++) {
		const char *src = (const char *)h->data + (size_t)i * mat_bytes;
		if (h->row_bytes == rb || u->synthetic)
			rc = up_bytes(u, p + (size_t)i * per, src, per);
		else
			for (int64_t r = 0; r < h->n_out && !rc; r++)
				rc = up_bytes(u, p + (size_t)i * per + (size_t)r * rb,
				              src + (size_t)r * h->row_bytes, rb);
	}
	return rc ? errbuf_set(u->e, rc, "cuda: weight upload failed") : 0;
}

static int up_w(struct upl *u, const struct kweight *h, struct kweight *d)
{
	return up_mats(u, h, 0, 1, d, NULL);
}

static int up_w3(struct upl *u, const struct kweight3 *h, struct kweight3 *d)
{
	d->n_mat = h->n_mat;
	return up_mats(u, &h->w, h->mat_bytes, h->n_mat, &d->w, &d->mat_bytes);
}

static int up_vec(struct upl *u, const float *h, int64_t n, float **d)
{
	if (u->verify)
		return h ? verify_rows(u, (const char *)*d, (const char *)h, 0, (size_t)n * sizeof(float), 1)
		         : 0;
	*d = NULL;
	if (!h)
		return 0;
	size_t bytes = (size_t)n * sizeof(float);
	if (u->count) {
		u->c->up_total += (double)bytes;
		return 0;
	}
	if (!(*d = dalloc(u->c, bytes)))
		return errbuf_set(u->e, -ENOMEM, "cuda: out of device memory");
	/* norm vectors stay real even in synthetic mode (random norms would blow up activations) */
	if (u->plan) {
		upload_plan_new_dst(u->plan);
		int rc = upload_plan_add(u->plan, *d, h, bytes, bytes, 1);
		return rc ? errbuf_set(u->e, rc, "cuda: cannot plan the weight upload") : 0;
	}
	kfwd_stage_new_dst(u->sg);
	int rc = kfwd_stage(u->sg, *d, h, bytes);
	u->c->up_done += (double)bytes;
	return rc ? errbuf_set(u->e, rc, "cuda: upload failed") : 0;
}

static int upload_all(struct upl *u)
{
	struct be_cuda *c = u->c;
	struct model *m = c->m;
	const struct model_hparams *hp = &m->hp;
	struct model_rank *rk = c->rk;
	int64_t D = hp->D;
	int rc;
	if ((rc = up_w(u, &m->tok_embd, &c->tok_embd)) || (rc = up_w(u, &rk->lm_head, &c->lm_head)) ||
	    (rc = up_vec(u, m->out_norm, D, &c->out_norm)))
		return rc;
	for (int l = 0; l < hp->n_layers; l++) {
		const struct layer_w *H = &rk->layers[l];
		struct layer_w *L = &c->dl[l];
		if (!u->verify) /* the device copy starts as the host's, then every weight is replaced */
			*L = *H;
		if ((rc = up_vec(u, H->attn_norm, D, &L->attn_norm)) ||
		    (rc = up_vec(u, H->ffn_norm, D, &L->ffn_norm)) ||
		    (rc = up_vec(u, H->q_a_norm, hp->Cq, &L->q_a_norm)) ||
		    (rc = up_vec(u, H->kv_a_norm, hp->C, &L->kv_a_norm)) ||
		    (rc = up_w(u, &H->q_a, &L->q_a)) || (rc = up_w(u, &H->kv_a, &L->kv_a)) ||
		    (rc = up_w(u, &H->q_b, &L->q_b)) || (rc = up_w3(u, &H->k_b, &L->k_b)) ||
		    (rc = up_w3(u, &H->v_b, &L->v_b)) || (rc = up_w(u, &H->o, &L->o)))
			return rc;
		if (H->has_idx &&
		    ((rc = up_w(u, &H->idx_q_b, &L->idx_q_b)) || (rc = up_w(u, &H->idx_k, &L->idx_k)) ||
		     (rc = up_w(u, &H->idx_proj, &L->idx_proj)) ||
		     (rc = up_vec(u, H->idx_knorm_w, hp->idx_D, &L->idx_knorm_w)) ||
		     (rc = up_vec(u, H->idx_knorm_b, hp->idx_D, &L->idx_knorm_b))))
			return rc;
		if (!H->moe) {
			if ((rc = up_w(u, &H->ffn_gate, &L->ffn_gate)) ||
			    (rc = up_w(u, &H->ffn_up, &L->ffn_up)) ||
			    (rc = up_w(u, &H->ffn_down, &L->ffn_down)))
				return rc;
		} else {
			if ((rc = up_w(u, &H->gate_inp, &L->gate_inp)) ||
			    (rc = up_vec(u, H->exp_bias, hp->n_expert, &L->exp_bias)) ||
			    (rc = up_w3(u, &H->gate_exps, &L->gate_exps)) ||
			    (rc = up_w3(u, &H->up_exps, &L->up_exps)) ||
			    (rc = up_w3(u, &H->down_exps, &L->down_exps)))
				return rc;
			if (H->has_shexp && ((rc = up_w(u, &H->sh_gate, &L->sh_gate)) ||
			                     (rc = up_w(u, &H->sh_up, &L->sh_up)) ||
			                     (rc = up_w(u, &H->sh_down, &L->sh_down))))
				return rc;
		}
	}
	return 0;
}

/* ---- threaded upload (common/model/upload.c; TANDEM_UPLOAD_THREADS=0: the single stager above) -- */
static int env_int(const char *name, int dflt, int lo, int hi)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return dflt;
	char *end;
	long v = strtol(s, &end, 10);
	if (*end || v < lo || v > hi) {
		LOG_WARN("cuda", "%s=%s is not in %d..%d; using %d", name, s, lo, hi, dflt);
		return dflt;
	}
	return (int)v;
}

/* copy threads of this rank: in rank-shard mode every GPU of the machine is assumed to have its own
 * process uploading at the same time; ranks of one process upload one after the other */
static int upload_threads(const struct model *m)
{
	int sharing = m->opts.rank >= 0 ? kcuda_device_count() : 1;
	return upload_default_threads(sharing > 0 ? sharing : 1);
}

static void up_progress_cb(void *user, uint64_t done, uint64_t total, bool last)
{
	struct be_cuda *c = user;
	c->up_done = (double)done;
	c->up_total = (double)total;
	if (!last && !c->m->opts.quiet) /* the final line is printed once the upload is checked */
		progress(c, false);
}

/* the GGUF tensor holding src, for error messages */
static const char *up_name_cb(void *user, const void *src, size_t *off)
{
	struct be_cuda *c = user;
	const struct gguf_ctx *g = c->m->g;
	const char *s = src;
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		const char *b = t->data;
		if (s >= b && s < b + t->nbytes) {
			*off = (size_t)(s - b);
			return t->name;
		}
	}
	return NULL;
}

static int upload_threaded(struct upl *u, int n_threads)
{
	struct be_cuda *c = u->c;
	const struct gguf_ctx *g = c->m->g;
	size_t buf = (size_t)env_int("TANDEM_UPLOAD_BUF_MB", 8, 1, 1024) << 20;
	struct upload_file *files = NULL;
	int n_files = gguf_n_shards(g), rc;
	if ((rc = upload_plan_create(buf, &u->plan)))
		return errbuf_set(u->e, rc, "backend cuda: cannot create the upload plan");
	if ((rc = upload_all(u)))
		goto destroy_plan;
	/* each shard's mapping, from any tensor in it: contiguous pieces are read from the file */
	if (n_files > 0 && !(files = calloc((size_t)n_files, sizeof(*files)))) {
		rc = errbuf_set(u->e, -ENOMEM, "out of memory");
		goto destroy_plan;
	}
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		if (t->shard >= 0 && t->shard < n_files && !files[t->shard].base) {
			files[t->shard].base = (const char *)t->data - t->file_offset;
			files[t->shard].size = (size_t)gguf_shard_size(g, t->shard);
			files[t->shard].path = gguf_shard_path(g, t->shard);
		}
	}
	struct upload_sink sink = {
	    .lane_create = kupl_lane_create,
	    .lane_buf = kupl_lane_buf,
	    .lane_copy = kupl_lane_copy,
	    .lane_commit = kupl_lane_commit,
	    .lane_wait = kupl_lane_wait,
	    .lane_finish = kupl_lane_finish,
	    .lane_destroy = kupl_lane_destroy,
	    .ctx = &c->device,
	};
	struct upload_opts uo = {
	    .n_threads = n_threads,
	    .n_bufs = 2,
	    .sink = &sink,
	    .files = files,
	    .n_files = n_files,
	    .no_pread = env_int("TANDEM_UPLOAD_PREAD", 1, 0, 1) == 0,
	    .readahead = env_int("TANDEM_UPLOAD_READAHEAD", 0, 0, 1) == 1,
	    .progress_cb = up_progress_cb,
	    .progress_every_s = 0.5,
	    .name_cb = up_name_cb,
	    .user = c,
	};
	struct upload_stats st;
	if ((rc = upload_run(u->plan, &uo, &st, u->e)))
		goto free_files;
	if (!c->m->opts.quiet)
		LOG_INFO(
		    "cuda",
		    "weights: %.2f GB in %.2f s = %.2f GB/s, %d copy threads, %lld batches of <= %zu MB, "
		    "%lld copies, %s",
		    (double)st.bytes / 1e9, st.seconds,
		    st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0.0, st.n_threads,
		    (long long)st.batches, buf >> 20, (long long)st.copies,
		    uo.no_pread ? "read from the mapping" : "read with pread");
free_files:
	free(files);
destroy_plan:
	upload_plan_destroy(u->plan);
	u->plan = NULL;
	return rc;
}

/* ---- ops --------------------------------------------------------------------------------------- */
static const struct mbe_weights *cu_weights(void *ctx)
{
	struct be_cuda *c = ctx;
	return &c->w;
}

static void *dev_zeroed(struct be_cuda *c, size_t bytes)
{
	void *p = NULL;
	if (kcuda_device_set(c->device) || kcuda_alloc(bytes, &p))
		return NULL;
	if (kcuda_memset(c->kc, p, 0, bytes) || kcuda_sync(c->kc)) {
		kcuda_free(p);
		return NULL;
	}
	return p;
}

static void cu_kv_free(void *ctx, void *p)
{
	struct be_cuda *c = ctx;
	struct model *m = c->m;
	for (int r = 1; r < m->n_ranks_local && c->rk == &m->ranks[0]; r++) {
		struct be_cuda *o = m->ranks[r].be.ctx;
		for (int i = 0; o && i < N_KV_REP; i++)
			if (o->rep[i].of == p) {
				(void)kcuda_device_set(o->device);
				kcuda_free(o->rep[i].p);
				o->rep[i].of = o->rep[i].p = NULL;
			}
	}
	(void)kcuda_device_set(c->device);
	kcuda_free(p);
}

/* kv.c allocates the pool through rank 0; with TP over GPUs every other rank gets its own copy */
static void *cu_kv_alloc(void *ctx, size_t bytes)
{
	struct be_cuda *c = ctx;
	struct model *m = c->m;
	void *p = dev_zeroed(c, bytes);
	if (!p)
		return NULL;
	for (int r = 1; r < m->n_ranks_local && c->rk == &m->ranks[0]; r++) {
		struct be_cuda *o = m->ranks[r].be.ctx;
		int slot = -1;
		for (int i = 0; i < N_KV_REP && slot < 0; i++)
			if (!o->rep[i].of)
				slot = i;
		void *q = slot >= 0 ? dev_zeroed(o, bytes) : NULL;
		if (!q) {
			LOG_ERROR("model",
			          "cuda: cannot allocate rank %d's copy of the KV pool (%zu bytes%s)", r,
			          bytes, slot < 0 ? "; more than 8 pools" : "");
			cu_kv_free(c, p);
			return NULL;
		}
		o->rep[slot].of = p;
		o->rep[slot].p = q;
	}
	(void)kcuda_device_set(c->device);
	return p;
}

static int bucket_of(int64_t v, int64_t lo)
{
	int i = 0;
	for (int64_t b = lo; b < v; b *= 2)
		i++;
	return i;
}

static void cu_plan(void *ctx, const struct model_batch *b, struct mbe_step *st)
{
	struct be_cuda *c = ctx;
	(void)kcuda_device_set(c->device); /* the first call of a step on the rank's thread */
	c->nccl = c->rk->dcomm.ops ? &c->rk->dcomm : NULL;
	c->mode = 0;
	c->prof_step = false;
	/* TANDEM_CUDA_PROFILE=1: eager steps profiled, decode and prompt (prefill) steps alike */
	const bool prof = c->prof_all && !c->prof_graph && kprof_is_enabled() && !c->nccl && !st->debug;
	c->prof_prefill = prof;
	if (st->debug || st->n_out != st->n_real || b->n_seqs > c->max_seqs) {
		c->prof_step = prof && c->prof_pf;
		return;
	}
	for (int64_t i = 0; i < st->n_real; i++) /* decode: one token per sequence */
		for (int64_t j = 0; j < i; j++)
			if (b->seq[i] == b->seq[j]) {
				c->prof_step = prof && c->prof_pf;
				return;
			}
	c->prof_prefill = false;
	if (prof) { /* eager, own shapes */
		c->prof_step = true;
		return;
	}
	int64_t cap = GRAPH_MAX_BATCH; /* largest padded batch */
	if (c->m->hp.n_expert > 0 && kcuda_moe_ffn_sync_free_max() < cap)
		cap = kcuda_moe_ffn_sync_free_max();
	if (cap > c->max_tok)
		cap = c->max_tok;
	if (!c->m->opts.graphs || st->n_real > cap)
		return;
	int gb = bucket_of(st->n_real, 1);
	int64_t bn = (int64_t)1 << gb;
	if (bn > cap)
		bn = cap; /* the last bucket (fixed for the backend's life: cap does not change) */
	int gc = bucket_of(st->max_keys, 256);
	int64_t ck = (int64_t)256 << gc;
	if (ck > c->max_ctx)
		ck = c->max_ctx;
	if (gb >= N_BBUCKETS || gc >= N_CBUCKETS || bn > c->max_tok || st->max_keys > ck || c->broken[gb][gc])
		return;
	st->n = bn;
	st->n_out_pad = bn;
	st->max_keys = (int)ck;
	st->K = c->m->hp.idx_topk < ck ? c->m->hp.idx_topk : ck;
	c->gb = gb;
	c->gc = gc;
	c->mode = c->m->opts.graphs == 2 ? 0 : c->graph[gb][gc] ? 2 : 1;
}

static void cu_branch_begin(void *ctx);
static void cu_branch_end(void *ctx);
static void cu_branch_join(void *ctx);

/* The step's rows that the dense prompt path (kcuda_mla_dense) may take: maximal runs of one sequence at
 * consecutive positions, at least md_min rows, every row seeing all keys before it (with an indexer: no
 * position past the top-k, so each row's selection is all of its keys, MODEL-SPEC's tie rule) and within
 * max_ctx (the workspace's keys). Steps with padding rows (graph buckets) take none. */
static void md_segments(struct be_cuda *c, const struct model_batch *b, const struct mbe_step *st)
{
	const struct model_hparams *hp = &c->m->hp;
	const int64_t n = st->n;
	c->md_n = 0;
	if (!c->md_ws || st->n != st->n_real || n < c->md_min || b->n_tokens < n)
		return;
	for (int64_t r0 = 0, r1; r0 < n; r0 = r1) {
		const int32_t sq = b->seq[r0], p0 = b->pos[r0];
		for (r1 = r0 + 1; r1 < n && b->seq[r1] == sq && b->pos[r1] == p0 + (int32_t)(r1 - r0); r1++)
			;
		const int64_t len = r1 - r0, end = (int64_t)p0 + len;
		if (len < c->md_min || sq < 0 || sq >= b->n_seqs || p0 < 0 || end > c->max_ctx ||
		    (hp->has_indexer && end > hp->idx_topk) || c->md_n == MD_SEGS)
			continue;
		c->md_seg[c->md_n++] = (struct md_seg){.r0 = r0, .n = len, .pos0 = p0, .seq = sq};
	}
}

static int cu_begin(void *ctx, const struct model_batch *b, struct model_kv *kv, const struct mbe_step *st)
{
	struct be_cuda *c = ctx;
	c->op_seq++; /* writes device memory (cu_moe's parts check) */
	(void)kcuda_device_set(c->device);
	if (c->capture_open) { /* the last step failed on another rank after this one began capturing */
		void *ex = NULL;
		kfwd_graph_end(c->kc, &ex);
		kfwd_graph_destroy(ex);
		c->capture_open = false;
	}
	/* a step without output left collectives on the stream, and the upload below syncs it: first a
	 * wait with the deadline */
	if (c->nccl && !c->waited) {
		int rc = tp_nccl_wait(c->nccl);
		if (rc)
			return rc;
	}
	if (c->prof) { /* the last profiled step had no output (no to_host): it ends here */
		(void)kprof_step_end(c->prof);
		c->prof = NULL;
		kprof_active = NULL;
	}
	if (c->branch) /* a step that stopped inside a branch: the side's work is done before this one */
		cu_branch_join(c);
	c->q_layer = -1;
	c->b = b;
	c->kv = kv;
	c->st = *st;
	md_segments(c, b, st);
	c->err = 0;
	c->errs_checked = false;
	c->agree_pending = c->void_step = c->waited = false;
	c->kvb = kv->base;
	if (c->m->n_ranks_local > 1 && c->rk != &c->m->ranks[0]) {
		c->kvb = NULL;
		for (int i = 0; i < N_KV_REP && !c->kvb; i++)
			if (c->rep[i].of == kv->base)
				c->kvb = c->rep[i].p;
		if (!c->kvb) {
			LOG_ERROR("model",
			          "cuda: rank %d has no copy of this KV pool (it was not made by "
			          "model_kv_init of this model)",
			          c->rk->rank);
			return ERR_MISMATCH;
		}
	}
	if (st->n > c->max_tok || b->n_seqs > c->max_seqs || st->max_keys > c->max_ctx)
		return ERR_LIMIT;
	/* table entries beyond max_blk are never used: positions are < max_ctx (checked) */
	int32_t *h = c->h_in;
	int64_t T = c->max_tok;
	for (int64_t i = 0; i < st->n; i++) {
		bool real = i < st->n_real;
		h[i] = real ? b->tokens[i] : 0;
		h[T + i] = real ? b->pos[i] : -1;
		h[2 * T + i] = real ? b->seq[i] : 0;
		h[3 * T + i] = real ? b->pos[i] + 1 : 1;
	}
	for (int64_t j = 0; j < st->n_out_pad; j++)
		h[4 * T + j] = j < st->n_out ? st->out_rows_host[j] : (int32_t)j;
	int32_t *blk = h + 5 * T;
	for (int s = 0; s < b->n_seqs; s++) {
		int nb = b->seqs[s].n_blocks < c->max_blk ? b->seqs[s].n_blocks : (int)c->max_blk;
		memcpy(blk + (int64_t)s * c->max_blk, b->seqs[s].blocks, sizeof(int32_t) * (size_t)nb);
		for (int64_t j = nb; j < c->max_blk; j++)
			blk[(int64_t)s * c->max_blk + j] = -1;
	}
	size_t bytes = sizeof(int32_t) * (size_t)(5 * T + (int64_t)b->n_seqs * c->max_blk);
	int rc = kcuda_upload(c->kc, c->d_in, h, bytes);
	if (rc)
		return rc;
	/* another pool (or one of another size at the same address), or the collectives switched
	 * on/off (bench): the graphs hold the old ones */
	if (c->mode != 0 && (c->graph_kv != c->kvb || c->graph_kv_blocks != kv->n_blocks ||
	                     c->graph_skip != c->m->skip_collectives)) {
		for (int i = 0; i < N_BBUCKETS; i++)
			for (int j = 0; j < N_CBUCKETS; j++) {
				kfwd_graph_destroy(c->graph[i][j]);
				c->graph[i][j] = NULL;
				kprof_seg_destroy(c->gseg[i][j]);
				c->gseg[i][j] = NULL;
			}
		c->graph_kv = c->kvb;
		c->graph_kv_blocks = kv->n_blocks;
		c->graph_skip = c->m->skip_collectives;
		c->mode = 1;
	}
	if (c->mode == 1) {
		size_t fr = 0, tot = 0;
		bool room = kfwd_mem_info(&fr, &tot) == 0 && fr >= GRAPH_MIN_FREE;
		if (!room)
			LOG_WARN(
			    "model",
			    "cuda: %.0f MB of device memory free, not capturing the decode graph of batch "
			    "bucket %lld, context bucket %d; that bucket runs eagerly",
			    (double)fr / 1e6, (long long)st->n, st->max_keys);
		bool prof = room && c->prof_graph && !c->nccl && kprof_is_enabled();
		if (prof) {
			char shape[96];
			snprintf(shape, sizeof(shape),
			         "graph replay: decode batch %lld (bucket %lld), context bucket %d",
			         (long long)st->n_real, (long long)st->n, st->max_keys);
			prof = kprof_capture_prepare(c->prof_all, shape) == 0;
		}
		if (room && kfwd_graph_begin(c->kc) == 0) {
			c->capture_open = true;
			if (prof) {
				kprof_capture_begin(c->prof_all);
				c->prof_capturing = true;
				c->prof = c->prof_all;
				kprof_active = c->prof;
			}
		} else if (c->nccl) {
			/* the other ranks capture: run nothing, fail the step at the agreement */
			c->mode = 2, c->void_step = true;
		} else {
			c->broken[c->gb][c->gc] = !room;
			c->mode = 0; /* capture refused: run eagerly */
		}
	}
	c->agree_pending = c->nccl && (c->mode == 1 || c->void_step);
	if (c->prof_step) {
		char shape[64];
		int ctx_lo = 256;
		while (ctx_lo * 2 <= st->max_keys)
			ctx_lo *= 2;
		if (c->prof_prefill) /* one table for all chunks of a prompt (contexts averaged) */
			snprintf(shape, sizeof(shape), "prefill %lld tokens per step", (long long)st->n_real);
		else
			snprintf(shape, sizeof(shape), "decode batch %lld, context %d+",
			         (long long)st->n_real, st->max_keys < 256 ? 1 : ctx_lo);
		c->prof = c->prof_prefill ? c->prof_pf : c->prof_all;
		kprof_step_begin(c->prof, shape);
		kprof_active = c->prof;
	}
	return 0;
}

static void *cu_ws(void *ctx, size_t bytes)
{
	struct be_cuda *c = ctx;
	return bytes <= c->ws_bytes ? c->ws : NULL;
}

static void cu_embed(void *ctx, float *h, int64_t D)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "embed", ktype_name(c->tok_embd.type), (double)c->st.n * (double)c->tok_embd.row_bytes)
	CK(kcuda_embed(c->kc, &c->tok_embd, c->d_tok, c->st.n, h, D));
}

static void cu_rope_tables(void *ctx, float *cs, int64_t R)
{
	(void)ctx; /* kcuda_rope computes cos/sin from the device positions and inv_freq */
	(void)cs;
	(void)R;
}

static void cu_rmsnorm(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                       int64_t n, int64_t n_rows, float eps)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "rmsnorm", NULL, 4.0 * (double)(n * n_rows))
	CK(kcuda_rmsnorm(c->kc, y, ldy, x, ldx, w, n, n_rows, eps));
}

static void cu_layernorm(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                         const float *bias, int64_t n, int64_t n_rows, float eps)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "layernorm", NULL, 4.0 * (double)(n * n_rows))
	CK(kfwd_layernorm(c->kc, y, ldy, x, ldx, w, bias, n, n_rows, eps));
}

/* The indexer's projections feed its top-k (MODEL-SPEC.md §2.6: weights and scores in fp32); a
 * bf16 rounding of their inputs flips selections against the CPU, so they never take the bf16 GEMM.
 * forward.c passes &layers[l].idx_*, i.e. pointers into c->dl. */
static bool fp32_product(const struct be_cuda *c, const struct kweight *w)
{
	uintptr_t p = (uintptr_t)w, b = (uintptr_t)c->dl;
	size_t n = (size_t)c->m->hp.n_layers;
	if (!c->dl || p < b || p >= b + n * sizeof(*c->dl))
		return false;
	const struct layer_w *L = &c->dl[(p - b) / sizeof(*c->dl)];
	return w == &L->idx_q_b || w == &L->idx_k || w == &L->idx_proj;
}

/* the profile's row name of a weight product (which field of which layer_w, or the lm_head) */
static const char *mm_name(const struct be_cuda *c, const struct kweight *w)
{
	uintptr_t p = (uintptr_t)w, b = (uintptr_t)c->dl;
	if (w == &c->lm_head)
		return "mm.lm_head";
	if (!c->dl || p < b || p >= b + (size_t)c->m->hp.n_layers * sizeof(*c->dl))
		return "mm.other";
	const struct layer_w *L = &c->dl[(p - b) / sizeof(*c->dl)];
	return w == &L->q_a        ? "mm.q_a"
	       : w == &L->q_b      ? "mm.q_b"
	       : w == &L->kv_a     ? "mm.kv_a"
	       : w == &L->o        ? "mm.o"
	       : w == &L->idx_q_b  ? "mm.idx_q_b"
	       : w == &L->idx_k    ? "mm.idx_k"
	       : w == &L->idx_proj ? "mm.idx_proj"
	       : w == &L->ffn_gate ? "mm.ffn_gate(dense)"
	       : w == &L->ffn_up   ? "mm.ffn_up(dense)"
	       : w == &L->ffn_down ? "mm.ffn_down(dense)"
	                           : "mm.other";
}

/* at the start of an op that reads x: on the main path, kc_main keeps the int8 parts of parts_y only
 * when this op is the very next main-path op and x is parts_y; a side-branch op leaves them alone
 * unless it writes parts_y (y) */
static void parts_check(struct be_cuda *c, const float *x, const float *y)
{
	if (c->branch == 1) {
		if (y && y == c->parts_y) {
			kcuda_xparts_forget(c->kc_main);
			c->parts_y = NULL;
		}
		return;
	}
	if (!(c->parts_y && c->parts_y == x && c->parts_seq + 1 == c->op_seq))
		kcuda_xparts_forget(c->kc);
	c->parts_y = NULL;
}

/* after an op that may have used the parts: forgotten (main path only) */
static void parts_done(struct be_cuda *c)
{
	if (c->branch != 1)
		kcuda_xparts_forget(c->kc);
}

static void cu_matmul(void *ctx, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                      float *y, int64_t n_out)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	parts_check(c, x, y); /* idx_q_b after cu_mla_latent's parts of c_q */
	c->mm_w[c->mm_at] = w; /* for cu_mla_latent's fold of the indexer inputs */
	c->mm_y[c->mm_at] = y;
	c->mm_at = (c->mm_at + 1) % 4;
	PROF(c, mm_name(c, w), ktype_name(w->type), wbytes(w))
	CK(kcuda_matmul_path(c->kc, fp32_product(c, w) ? KCUDA_MM_F32 : KCUDA_MM_AUTO, w, x, ldx, n_tok, y,
	                     n_out));
	parts_done(c);
}

/* products of one x in one launch (kcuda_matmul_multi, decode sizes; TANDEM_MULTI=0: off), else
 * cu_matmul per weight. The outputs are recorded for cu_mla_latent's fold as cu_matmul does. */
static void cu_matmul_n_run(struct be_cuda *c, int n_w, const struct kweight *const *w, const float *x,
                            int64_t ldx, int64_t n_tok, float *const *y, const int64_t *n_out);

static void cu_matmul_n(void *ctx, int n_w, const struct kweight *const *w, const float *x, int64_t ldx,
                        int64_t n_tok, float *const *y, const int64_t *n_out)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	parts_check(c, x, NULL);
	cu_matmul_n_run(c, n_w, w, x, ldx, n_tok, y, n_out);
	parts_done(c);
}

static void cu_matmul_n_run(struct be_cuda *c, int n_w, const struct kweight *const *w, const float *x,
                            int64_t ldx, int64_t n_tok, float *const *y, const int64_t *n_out)
{
	void *ctx = c;
	int rc = ERR_UNSUPPORTED;
	if (n_w >= 2 && n_w <= KCUDA_MM_MULTI_MAX && n_tok <= 8) {
		struct kcuda_mm_seg seg[KCUDA_MM_MULTI_MAX];
		double bytes = 0;
		for (int i = 0; i < n_w; i++) {
			seg[i] = (struct kcuda_mm_seg){.w = w[i], .y = y[i], .ldy = n_out[i]};
			bytes += wbytes(w[i]);
		}
		const char *first = mm_name(c, w[0]);
		PROF(c,
		     !strcmp(first, "mm.q_a")               ? "mm.multi(q_a,kv_a,idx_k,idx_proj)"
		     : !strcmp(first, "mm.q_b")             ? "mm.multi(q_b,idx_q_b)"
		     : !strcmp(first, "mm.ffn_gate(dense)") ? "mm.multi(ffn_gate,ffn_up)(dense)"
		                                            : "mm.multi",
		     ktype_name(w[0]->type), bytes)
		rc = kcuda_matmul_multi(c->kc, n_w, seg, x, ldx, n_tok);
		if (c->ko_skip)
			rc = 0;
	}
	if (rc == ERR_UNSUPPORTED) {
		/* one by one. At decode sizes the later half runs on the side stream beside the first:
		 * they share only x, and the narrow ones (GLM-5's kv_a, idx_k, idx_proj at 9-128 tokens)
		 * keep few SMs busy each (H200, session 21: GLM-5 batch 32 31.6-32.1 -> 29.5-29.7 ms with
		 * q_a + kv_a | idx_k + idx_proj, 30.2-30.7 with q_a | the other three; DeepSeek-V3's
		 * q_a | kv_a at batch 16 18.8 -> 18.2, 128 63.2 -> 61.1). cu_branch_begin declines while
		 * profiling or inside a branch, and then they run in this order on the main stream */
		const int m = c->par_main <= 0 ? (n_w + 1) / 2 : c->par_main < n_w ? c->par_main : n_w;
		if (n_w >= 2 && m < n_w && n_tok <= c->par_n && c->branch == 0) {
			cu_branch_begin(c);
			for (int i = m; i < n_w; i++)
				cu_matmul(ctx, w[i], x, ldx, n_tok, y[i], n_out[i]);
			cu_branch_end(c);
			for (int i = 0; i < m; i++)
				cu_matmul(ctx, w[i], x, ldx, n_tok, y[i], n_out[i]);
			cu_branch_join(c);
			return;
		}
		for (int i = 0; i < n_w; i++)
			cu_matmul(ctx, w[i], x, ldx, n_tok, y[i], n_out[i]);
		return;
	}
	for (int i = 0; i < n_w; i++) {
		c->mm_w[c->mm_at] = w[i];
		c->mm_y[c->mm_at] = y[i];
		c->mm_at = (c->mm_at + 1) % 4;
	}
	CK(rc);
}

/* whether cu_matmul_n runs its products as one launch at n_tok tokens: only with TANDEM_MULTI_QB=1
 * (then forward.c fuses q_b with idx_q_b before the query side branch); by default no, so q_b stays
 * in the branch beside idx_q_b (measured faster at batch 1 and 8, docs/PERFORMANCE.md) */
static bool cu_matmul_n_fused(void *ctx, int64_t n_tok)
{
	struct be_cuda *c = ctx;
	return c->multi_qb && kcuda_matmul_multi_takes(n_tok);
}

static void cu_rope(void *ctx, float *x, int64_t ldx, int64_t n_rows, int64_t n_heads, int64_t head_stride,
                    int64_t R, const float *cs, int pairing)
{
	struct be_cuda *c = ctx;
	(void)cs;
	SKIP_REPLAY(c);
	PROF(c, "rope", NULL, 4.0 * (double)(n_rows * n_heads * R))
	CK(kcuda_rope(c->kc, x, ldx, n_rows, n_heads, head_stride, R, c->d_inv, c->d_pos, pairing, 1.0f));
}

static void cu_scale(void *ctx, float *x, int64_t n, float s)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "scale", NULL, 4.0 * (double)n)
	CK(kfwd_scale(c->kc, x, n, s));
}

static void cu_swiglu(void *ctx, float *y, const float *gate, const float *up, int64_t n)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "swiglu", NULL, 8.0 * (double)n)
	CK(kcuda_swiglu(c->kc, y, n, gate, n, up, n, n, 1));
}

static void cu_add(void *ctx, float *y, const float *x, int64_t n)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	PROF(c, "add", NULL, 8.0 * (double)n)
	CK(kfwd_add(c->kc, y, x, n));
}

static void cu_kv_write(void *ctx, enum mbe_kv_part part, int index, const float *x, int64_t width)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	const struct model_kv_layout *L = &c->kv->layout;
	size_t off = part == MBE_KV_LATENT ? (size_t)index * L->lat_layer_bytes
	                                   : L->idx_offset + (size_t)index * L->idx_layer_bytes;
	PROF(c, "kv_write", NULL, 4.0 * (double)(width * c->st.n))
	CK(kfwd_kv_write(c->kc, c->kvb, L->block_bytes, off, L->block_tokens, width,
	                 L->dtype == MODEL_KV_BF16, x, c->st.n, c->d_seq, c->d_pos, c->d_blk, c->max_blk));
}

static struct kcuda_kv_view kv_view(struct be_cuda *c, size_t off, int64_t dim)
{
	const struct model_kv_layout *L = &c->kv->layout;
	return (struct kcuda_kv_view){.base = c->kvb,
	                              .n_blocks = c->kv->n_blocks,
	                              .block_bytes = L->block_bytes,
	                              .offset = off,
	                              .block_tokens = L->block_tokens,
	                              .dim = dim,
	                              .bf16 = L->dtype == MODEL_KV_BF16};
}

static void cu_indexer(void *ctx, int layer, const float *qI, const float *wI, int32_t *sel, int32_t *nsel,
                       float *scores)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	const struct model_hparams *hp = &c->m->hp;
	const struct model_kv_layout *L = &c->kv->layout;
	struct kcuda_kv_view v =
	    kv_view(c, L->idx_offset + (size_t)hp->idx_slot[layer] * L->idx_layer_bytes, hp->idx_D);
	struct kcuda_attn_rows rows = {.n_q = c->st.n,
	                               .qseq = c->d_seq,
	                               .blocks = c->d_blk,
	                               .ld_blocks = c->max_blk,
	                               .n_keys = c->d_nk,
	                               .max_keys = c->st.max_keys};
	float sc = 1.0f / sqrtf((float)hp->idx_D);
	const double kbytes = (double)c->st.n * (double)c->st.max_keys * (double)hp->idx_D *
	                      (L->dtype == MODEL_KV_BF16 ? 2 : 4);
	if (c->foldq_layer == layer) { /* idx_prep left q_I unroped (cu_idx_prep) */
		c->foldq_layer = -1;
		int rc = ERR_UNSUPPORTED;
		struct kfuse_rope rq = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_idx};
		if (!scores && qI == c->fold_qI) {
			PROF(c, "indexer(scores+topk)", NULL, kbytes)
			rc = kfuse_indexer_topk_rope(c->kc, &v, &rows, qI, wI, hp->idx_H, hp->idx_D, sc,
			                             (int)c->st.K, sel, c->st.K, nsel, &rq, hp->R);
			if (c->ko_skip)
				rc = 0;
		}
		if (rc != ERR_UNSUPPORTED) {
			CK(rc);
			return;
		}
		/* declined: idx_prep's q_I rope here (the workspace row is writable; the op takes it
		 * const because it only reads it otherwise), then the plain path */
		PROF(c, "idx_prep(q rope)", NULL, 8.0 * (double)(c->st.n * hp->idx_H * hp->R))
		CK(kcuda_rope(c->kc, (float *)(uintptr_t)qI, hp->idx_H * hp->idx_D, c->st.n, hp->idx_H,
		              hp->idx_D, hp->R, c->d_inv, c->d_pos, hp->rope_idx, 1.0f));
	}
	PROF(c, "indexer(scores+topk)", NULL, kbytes)
	if (scores) {
		CK(kcuda_indexer_scores(c->kc, &v, &rows, qI, wI, hp->idx_H, hp->idx_D, sc, scores,
		                        c->st.max_keys));
		CK(kcuda_topk_idx(c->kc, scores, c->st.max_keys, c->st.n, c->d_nk, 0, (int)c->st.K, sel,
		                  c->st.K, nsel));
	} else {
		CK(kcuda_indexer_topk(c->kc, &v, &rows, qI, wI, hp->idx_H, hp->idx_D, sc, (int)c->st.K, sel,
		                      c->st.K, nsel));
	}
}

/* the per-head k_b / v_b products as one launch (head_gemv.cu) for decode-sized batches; prefill
 * chunks keep one tensor-core GEMM per head; TANDEM_HEAD_GEMV=0 keeps one GEMV per head too */
#define HEAD_GEMV_MAX_TOK 256
static bool head_gemv(const struct be_cuda *c, const struct kweight3 *w, int64_t n)
{
	return c->head_gemv && n <= HEAD_GEMV_MAX_TOK && kfwd_head_gemv_ok(&w->w, w->mat_bytes);
}

/* ---- side branches (backend.h): the side ops go to kc_side's stream (its own workspace, so
 * nothing the two streams run at once shares scratch memory); inside a capture the fork and the
 * join are graph edges. Declined (plain order) while profiling with events (they time one stream)
 * and without kc_side. */
static void cu_branch_begin(void *ctx)
{
	struct be_cuda *c = ctx;
	if (c->mode == 2) /* control only: not counted as an op (parts_check) */
		return;
	if (!c->kc_side || c->prof || c->branch)
		return;
	CK(kcuda_stream_after(c->kc_side, c->kc_main)); /* the side sees everything before the fork */
	c->kc = c->kc_side;
	c->branch = 1;
}

static void cu_branch_end(void *ctx)
{
	struct be_cuda *c = ctx;
	if (c->branch != 1)
		return;
	c->kc = c->kc_main;
	c->branch = 2;
}

static void cu_branch_join(void *ctx)
{
	struct be_cuda *c = ctx;
	if (c->branch == 1) /* an unended branch: end it first */
		cu_branch_end(ctx);
	if (c->branch != 2)
		return;
	CK(kcuda_stream_after(c->kc_main, c->kc_side));
	c->branch = 0;
}

/* q's rotary part copied into c->qabs and roped (the unfused path: two launches) */
static void mla_q_rope(struct be_cuda *c, const float *q)
{
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, Hl = c->rk->Hl, C = hp->C, R = hp->R, NR = hp->N + R;
	struct kfuse_rope rp = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_main};
	PROF(c, "attn.q_rope(copy+rope)", NULL, 8.0 * (double)(n * Hl * R))
	if (c->fuse) {
		CK(kfuse_rope_copy(c->kc, c->qabs + C, Hl * (C + R), C + R, q + hp->N, Hl * NR, NR, n, Hl, R,
		                   &rp));
	} else {
		CK(kfwd_copy2d(c->kc, c->qabs + C, C + R, q + hp->N, NR, R, n * Hl));
		CK(kcuda_rope(c->kc, c->qabs + C, Hl * (C + R), n, Hl, C + R, R, c->d_inv, c->d_pos,
		              hp->rope_main, 1.0f));
	}
}

/* absorbed queries of rows [r0, r1): q_abs[i][h][0..C) = W_UK(h) q_nope[i][h] */
static void mla_q_absorb_rows(struct be_cuda *c, const struct layer_w *L, const float *q, int64_t r0,
                              int64_t r1)
{
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = r1 - r0, Hl = c->rk->Hl, C = hp->C, R = hp->R, NR = hp->N + R;
	if (n <= 0)
		return;
	const float *qr = q + r0 * Hl * NR;
	float *qa = c->qabs + r0 * Hl * (C + R);
	PROF(c, "attn.q_absorb(k_b/head)", ktype_name(L->k_b.w.type), (double)Hl * wbytes(&L->k_b.w))
	if (head_gemv(c, &L->k_b, n))
		CK(kfwd_head_gemv(c->kc, &L->k_b.w, L->k_b.mat_bytes, (int)Hl, qr, Hl * NR, NR, n, qa,
		                  Hl * (C + R), C + R));
	else
		for (int64_t hh = 0; hh < Hl; hh++) {
			struct kweight kb = kweight3_at(&L->k_b, hh);
			CK(kcuda_matmul(c->kc, &kb, qr + hh * NR, Hl * NR, n, qa + hh * (C + R),
			                Hl * (C + R)));
		}
}

static void mla_q_absorb(struct be_cuda *c, const struct layer_w *L, const float *q)
{
	mla_q_absorb_rows(c, L, q, 0, c->st.n);
}

/* a step with dense runs (md_segments): q's rotary part roped for every row (the dense path reads it
 * too), q absorbed only for the rows between the runs (the absorbed kernels' rows) */
static void mla_q_dense_step(struct be_cuda *c, const struct layer_w *L, const float *q)
{
	mla_q_rope(c, q);
	int64_t r = 0;
	for (int i = 0; i < c->md_n; i++) {
		mla_q_absorb_rows(c, L, q, r, c->md_seg[i].r0);
		r = c->md_seg[i].r0 + c->md_seg[i].n;
	}
	mla_q_absorb_rows(c, L, q, r, c->st.n);
}

/* absorb and rope in one launch (kfuse_absorb_rope: k_b Q8_0 at 1..8 tokens, the fused ops on,
 * not TANDEM_MLA_ROPE=1, not TANDEM_ABSORB_ROPE=0); false when it declined (nothing launched) */
static bool mla_q_fused(struct be_cuda *c, const struct layer_w *L, const float *q)
{
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, Hl = c->rk->Hl, C = hp->C, R = hp->R, NR = hp->N + R;
	if (!c->fuse || c->mla_fold || !head_gemv(c, &L->k_b, n))
		return false;
	struct kfuse_rope rp = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_main};
	int rc = ERR_UNSUPPORTED;
	PROF(c, "attn.q_absorb+rope(k_b/head)", ktype_name(L->k_b.w.type), (double)Hl * wbytes(&L->k_b.w))
	rc = kfuse_absorb_rope(c->kc, &L->k_b.w, L->k_b.mat_bytes, (int)Hl, q, Hl * NR, NR, n, c->qabs,
	                       Hl * (C + R), C + R, R, &rp);
	if (c->ko_skip)
		rc = 0;
	if (rc == ERR_UNSUPPORTED)
		return false;
	CK(rc);
	return true;
}

/* Whether this layer's attention takes the dense prompt path (kcuda_mla_dense) for some rows: an eager
 * step (a graph would keep this step's positions) with runs of rows md_segments found, and k_b / v_b in
 * the shapes the path multiplies. */
static bool dense_ok(const struct be_cuda *c, const struct layer_w *L)
{
	const struct model_hparams *hp = &c->m->hp;
	if (c->md_n == 0 || c->mode != 0)
		return false;
	const struct kweight *kb = &L->k_b.w, *vb = &L->v_b.w;
	return kb->n_out == hp->C && kb->n_in == hp->N && vb->n_out == hp->V && vb->n_in == hp->C;
}

/* the dense prompt path for the run sg (q's rotary part already roped into c->qabs): the naive-form
 * attention straight into its rows of o (no v_b product after it) */
static void mla_dense(struct be_cuda *c, int layer, const struct layer_w *L, const float *q,
                      const struct md_seg *sg, float *o)
{
	const struct model_hparams *hp = &c->m->hp;
	int64_t Hl = c->rk->Hl, C = hp->C, R = hp->R, N = hp->N, NR = N + R, V = hp->V;
	struct kcuda_kv_view v = kv_view(c, (size_t)layer * c->kv->layout.lat_layer_bytes, C + R);
	const int64_t nk = sg->pos0 + sg->n;
	const double kv_bytes = (double)nk * (double)(C + R) * (c->kv->layout.dtype == MODEL_KV_BF16 ? 2 : 4);
	struct kcuda_mla_dense_args a = {
	    .kv = &v,
	    .blocks = c->d_blk + (int64_t)sg->seq * c->max_blk,
	    .ld_blocks = c->max_blk,
	    .pos0 = sg->pos0,
	    .n = sg->n,
	    .q = q + sg->r0 * Hl * NR,
	    .ldq = Hl * NR,
	    .q_hs = NR,
	    .qr = c->qabs + sg->r0 * Hl * (C + R) + C,
	    .ldqr = Hl * (C + R),
	    .qr_hs = C + R,
	    .k_b = &L->k_b.w,
	    .v_b = &L->v_b.w,
	    .k_b_stride = L->k_b.mat_bytes,
	    .v_b_stride = L->v_b.mat_bytes,
	    .H = Hl,
	    .C = C,
	    .R = R,
	    .N = N,
	    .V = V,
	    .scale = hp->attn_scale,
	    .out = o + sg->r0 * Hl * V,
	    .ldo = Hl * V,
	    .math = c->md_math, /* resolved at load (cu_init), as the workspace was sized */
	    .flash = c->md_flash,
	};
	PROF(c, "attn.mla_dense", NULL, kv_bytes)
	CK(kcuda_mla_dense(c->kc, &a, c->md_ws, c->md_bytes));
}

/* mla_attn's query part ahead of it (backend.h), on the side branch when one is open: absorb and
 * rope (the in-kernel rope of TANDEM_MLA_ROPE=1 stays in mla_attn); in a step with dense prompt runs
 * the rope of every row and the absorb of the rows between the runs only */
static void cu_mla_q(void *ctx, int layer, const struct layer_w *L, const float *q, const float *cs)
{
	struct be_cuda *c = ctx;
	(void)cs;
	SKIP_REPLAY(c);
	if (dense_ok(c, L)) {
		mla_q_dense_step(c, L, q);
		c->q_layer = layer;
		return;
	}
	if (!mla_q_fused(c, L, q)) {
		mla_q_absorb(c, L, q);
		if (!(c->mla_fold))
			mla_q_rope(c, q);
	}
	c->q_layer = layer;
}

/* the absorbed kernels (kcuda_mla_attn, or the rope-folding one) and v_b for rows [r0, r1) */
static void mla_absorbed(struct be_cuda *c, int layer, const struct layer_w *L, const float *q,
                         const int32_t *sel, const int32_t *nsel, bool rope_done, int64_t r0, int64_t r1,
                         float *o)
{
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = r1 - r0, Hl = c->rk->Hl, C = hp->C, R = hp->R, N = hp->N, NR = N + R, V = hp->V;
	struct kfuse_rope rp = {.inv_freq = c->d_inv, .pos = c->d_pos + r0, .pairing = hp->rope_main};
	struct kcuda_kv_view v = kv_view(c, (size_t)layer * c->kv->layout.lat_layer_bytes, C + R);
	struct kcuda_attn_rows rows = {.n_q = n,
	                               .qseq = c->d_seq + r0,
	                               .blocks = c->d_blk,
	                               .ld_blocks = c->max_blk,
	                               .n_keys = (sel ? nsel : c->d_nk) + r0,
	                               .sel = sel ? sel + r0 * c->st.K : NULL,
	                               .ld_sel = c->st.K,
	                               .max_keys = sel ? c->st.K : c->st.max_keys};
	const double kv_bytes = (double)n * (double)rows.max_keys * (double)(C + R) *
	                        (c->kv->layout.dtype == MODEL_KV_BF16 ? 2 : 4);
	float *qa = c->qabs + r0 * Hl * (C + R), *ob = c->obar + r0 * Hl * C;
	/* TANDEM_MLA_ROPE=1: q's rotary part roped inside the attention kernel (one launch less per layer;
	 * off by default: slower on the H200, see mla_attn_mma.cu); kfuse_mla_attn_rope declines with
	 * ERR_UNSUPPORTED otherwise, and under the ref kernels */
	int rc = ERR_UNSUPPORTED;
	if (c->mla_fold) {
		PROF(c, "attn.mla", NULL, kv_bytes)
		rc = kfuse_mla_attn_rope(c->kc, &v, &rows, qa, Hl, C, R, hp->attn_scale, ob,
		                         q + r0 * Hl * NR + N, Hl * NR, NR, &rp);
		if (c->ko_skip)
			rc = 0;
	}
	if (rc != ERR_UNSUPPORTED) {
		CK(rc);
	} else {
		if (!rope_done) /* not done, or mla_q left the rope to the fold */
			mla_q_rope(c, q);
		PROF(c, "attn.mla", NULL, kv_bytes)
		CK(kcuda_mla_attn(c->kc, &v, &rows, qa, Hl, C, R, hp->attn_scale, ob));
	}
	PROF(c, "attn.v_up(v_b/head)", ktype_name(L->v_b.w.type), (double)Hl * wbytes(&L->v_b.w))
	if (head_gemv(c, &L->v_b, n))
		CK(kfwd_head_gemv(c->kc, &L->v_b.w, L->v_b.mat_bytes, (int)Hl, ob, Hl * C, C, n,
		                  o + r0 * Hl * V, Hl * V, V));
	else
		for (int64_t hh = 0; hh < Hl; hh++) {
			struct kweight vb = kweight3_at(&L->v_b, hh);
			CK(kcuda_matmul(c->kc, &vb, ob + hh * C, Hl * C, n, o + r0 * Hl * V + hh * V,
			                Hl * V));
		}
}

static void cu_mla_attn(void *ctx, int layer, const struct layer_w *L, const float *q, const float *cs,
                        const int32_t *sel, const int32_t *nsel, float *o)
{
	struct be_cuda *c = ctx;
	(void)cs;
	SKIP_REPLAY(c);
	const int64_t n = c->st.n;
	const bool q_done = c->q_layer == layer;
	c->q_layer = -1;
	if (!dense_ok(c, L)) {
		/* the rotary part of q_abs is filled: by mla_q (unless the fold leaves it to the kernel),
		 * or here by the one-launch absorb + rope */
		bool rope_done = q_done && !c->mla_fold;
		if (!q_done) {
			rope_done = mla_q_fused(c, L, q);
			if (!rope_done)
				mla_q_absorb(c, L, q);
		}
		mla_absorbed(c, layer, L, q, sel, nsel, rope_done, 0, n, o);
		return;
	}
	/* dense runs, the rows between them (if any) absorbed; cu_mla_q, when it ran, did
	 * mla_q_dense_step */
	if (!q_done)
		mla_q_dense_step(c, L, q);
	int64_t r = 0;
	for (int i = 0; i < c->md_n; i++) {
		const struct md_seg *sg = &c->md_seg[i];
		if (sg->r0 > r)
			mla_absorbed(c, layer, L, q, sel, nsel, true, r, sg->r0, o);
		mla_dense(c, layer, L, q, sg, o);
		r = sg->r0 + sg->n;
	}
	if (r < n)
		mla_absorbed(c, layer, L, q, sel, nsel, true, r, n, o);
}

static void cu_moe_run(struct be_cuda *c, const struct layer_w *L, const float *a, float *part, int32_t *ids,
                       float *wts);

static void cu_moe(void *ctx, const struct layer_w *L, const float *a, float *part, int32_t *ids, float *wts)
{
	struct be_cuda *c = ctx;
	SKIP_REPLAY(c);
	parts_check(c, a, NULL); /* a's int8 parts from the norm just before (cu_add_rmsnorm_q), else none */
	cu_moe_run(c, L, a, part, ids, wts);
	parts_done(c);
}

static void cu_moe_run(struct be_cuda *c, const struct layer_w *L, const float *a, float *part, int32_t *ids,
                       float *wts)
{
	const struct model_hparams *hp = &c->m->hp;
	struct model_rank *rk = c->rk;
	int64_t n = c->st.n, D = hp->D, E = hp->n_expert;
	int k = hp->n_expert_used;
	struct kweight g = L->gate_exps.w, u = L->up_exps.w, d = L->down_exps.w;
	/* router product + route in one launch at 1..2 tokens (moe_route.cu; TANDEM_MOE_PF=1 also
	 * prefetches the chosen experts' weights from there; ERR_UNSUPPORTED: the two launches below) */
	const struct kcuda_moe_pf pf = {
	    .gate = g.data,
	    .up = u.data,
	    .down = d.data,
	    .gate_bytes = (size_t)rk->fel * g.row_bytes,
	    .down_bytes = (size_t)D * d.row_bytes,
	    .sh_gate = L->has_shexp ? L->sh_gate.data : NULL,
	    .sh_up = L->has_shexp ? L->sh_up.data : NULL,
	    .sh_down = L->has_shexp ? L->sh_down.data : NULL,
	    .sh_gate_bytes = L->has_shexp ? (size_t)L->sh_gate.n_out * L->sh_gate.row_bytes : 0,
	    .sh_down_bytes = L->has_shexp ? (size_t)L->sh_down.n_out * L->sh_down.row_bytes : 0,
	};
	int rc_rr = ERR_UNSUPPORTED;
	PROF(c, "moe.router+route", ktype_name(L->gate_inp.type), wbytes(&L->gate_inp))
	rc_rr = kcuda_moe_router_route(c->kc, &L->gate_inp, a, D, n, c->rl, L->exp_bias, (int)E, k,
	                               hp->n_group, hp->n_group_used, hp->gating_func,
	                               hp->expert_weights_norm, hp->expert_weights_scale, ids, wts, &pf);
	if (c->ko_skip)
		rc_rr = 0;
	g.n_out *= E; /* compact upload: expert e = rows [e F, e F + F) */
	u.n_out *= E;
	d.n_out *= E;
	if (rc_rr != ERR_UNSUPPORTED) {
		CK(rc_rr);
	} else {
		/* router logits in fp32 whatever the weight type (MODEL-SPEC.md §2.7): never the bf16 GEMM */
		PROF(c, "moe.router", ktype_name(L->gate_inp.type), wbytes(&L->gate_inp))
		CK(kcuda_matmul_path(c->kc, KCUDA_MM_F32, &L->gate_inp, a, D, n, c->rl, E));
		/* one token: the route folded into the expert launches (moe_one.cu; TANDEM_MOE_ONE_ROUTE=0
		 * off; ERR_UNSUPPORTED with nothing enqueued where it does not apply) */
		if (n == 1 && L->has_shexp) {
			int rc1 = ERR_UNSUPPORTED;
			PROF(c, "moe.route+experts", ktype_name(g.type),
			     (double)(k + 1) * (wbytes(&g) + wbytes(&u) + wbytes(&d)) / (double)E)
			rc1 = kcuda_moe_route_ffn1(c->kc, c->rl, L->exp_bias, (int)E, k, hp->n_group,
			                           hp->n_group_used, hp->gating_func, hp->expert_weights_norm,
			                           hp->expert_weights_scale, ids, wts, a, &g, &u, &d, rk->fel,
			                           &L->sh_gate, &L->sh_up, &L->sh_down, part);
			if (c->ko_skip)
				rc1 = 0;
			if (rc1 != ERR_UNSUPPORTED) {
				CK(rc1);
				return;
			}
		}
		PROF(c, "moe.route", NULL, 4.0 * (double)(n * E))
		CK(kcuda_moe_route(c->kc, c->rl, E, L->exp_bias, n, (int)E, k, hp->n_group, hp->n_group_used,
		                   hp->gating_func, hp->expert_weights_norm, hp->expert_weights_scale, ids,
		                   wts));
	}
	/* bytes: the experts the pairs can touch at most (distinct ids are not known on the host) */
	double n_ex = (double)(n * k < E ? n * k : E);
	/* the shared expert rides in the routed experts' launches when the tensor-core path takes it
	 * (kcuda_moe_ffn_shexp; ERR_UNSUPPORTED: nothing enqueued, the two run apart as before) */
	int rc_sh = ERR_UNSUPPORTED;
	PROF(c, "moe.experts", ktype_name(g.type), n_ex * (wbytes(&g) + wbytes(&u) + wbytes(&d)) / (double)E)
	{
		if (L->has_shexp)
			rc_sh = kcuda_moe_ffn_shexp(c->kc, a, D, n, ids, wts, k, &g, &u, &d, E, rk->fel,
			                            &L->sh_gate, &L->sh_up, &L->sh_down, part, D);
		if (rc_sh == ERR_UNSUPPORTED)
			CK(kcuda_moe_ffn(c->kc, a, D, n, ids, wts, k, &g, &u, &d, E, rk->fel, part, D));
		else
			CK(rc_sh);
	}
	if (c->ko_skip) /* knocked out (prof_on): the shared expert goes with the experts */
		rc_sh = 0;
	if (L->has_shexp && rc_sh == ERR_UNSUPPORTED)
		PROF(c, "moe.shared", ktype_name(L->sh_gate.type),
		     wbytes(&L->sh_gate) + wbytes(&L->sh_up) + wbytes(&L->sh_down))
		{
			float *t1 = c->ys + n * D, *t2 = t1 + n * rk->fsl;
			CK(kcuda_matmul(c->kc, &L->sh_gate, a, D, n, t1, rk->fsl));
			CK(kcuda_matmul(c->kc, &L->sh_up, a, D, n, t2, rk->fsl));
			CK(kcuda_swiglu(c->kc, t1, rk->fsl * n, t1, rk->fsl * n, t2, rk->fsl * n, n * rk->fsl,
			                1));
			CK(kcuda_matmul(c->kc, &L->sh_down, t1, rk->fsl, n, c->ys, D));
			CK(kfwd_add(c->kc, part, c->ys, n * D));
		}
}

static void cu_gather_rows(void *ctx, float *dst, const float *src, int64_t width, const int32_t *rows_host,
                           int64_t n)
{
	struct be_cuda *c = ctx;
	(void)rows_host; /* the same rows are in device memory (begin) */
	SKIP_REPLAY(c);
	PROF(c, "gather_rows", NULL, 4.0 * (double)(width * n))
	CK(kfwd_gather_rows(c->kc, dst, src, width, c->d_rows, n));
}

/* An op failed while a graph was being captured: end the capture (the stream must leave capture
 * mode), mark the bucket eager and ask model_forward to run the step again (-EAGAIN). */
/* the graph profile's segment of the capture that is ending, or NULL (not profiling graphs) */
static struct kprof_seg *prof_capture_take(struct be_cuda *c)
{
	struct kprof_seg *g = c->prof_capturing ? kprof_capture_end(c->prof_all) : NULL;
	c->prof_capturing = false;
	c->prof = NULL;
	kprof_active = NULL;
	return g;
}

static int capture_failed(struct be_cuda *c)
{
	kprof_seg_destroy(prof_capture_take(c));
	void *ex = NULL;
	kfwd_graph_end(c->kc, &ex);
	kfwd_graph_destroy(ex);
	c->capture_open = false;
	c->mode = 0;
	c->broken[c->gb][c->gc] = true;
	LOG_WARN("model",
	         "cuda: decode graph capture failed for batch bucket %d, context bucket %d (%s); that bucket "
	         "runs eagerly",
	         1 << c->gb, 256 << c->gc, err_name(c->err));
	return -EAGAIN;
}

static int step_status(struct be_cuda *c)
{
	if (c->err && c->mode == 1)
		return capture_failed(c);
	return c->err;
}

static int step_finish(struct be_cuda *c);

static int cu_all_reduce(void *ctx, float *buf, size_t n)
{
	struct be_cuda *c = ctx;
	c->op_seq++; /* writes device memory (cu_moe's parts check) */
	if (c->nccl) { /* errors wait for step_finish: every rank issues every collective */
		if (c->mode != 2 && !c->m->skip_collectives)
			CK(tp_all_reduce_sum(c->nccl, buf, n));
		return 0;
	}
	(void)buf; /* T = 1 or rank-shard mode: nothing to reduce */
	(void)n;
	return step_status(c);
}

static int cu_all_gather(void *ctx, const float *send, size_t n, float *recv)
{
	struct be_cuda *c = ctx;
	c->op_seq++; /* writes device memory (cu_moe's parts check) */
	int r = c->rk->rank, T = c->m->T;
	if (c->nccl) {
		if (c->mode != 2 && !c->m->skip_collectives)
			CK(tp_all_gather(c->nccl, send, n, recv));
		else if (c->mode != 2) /* collectives skipped (bench): own slot only, as rank-shard mode */
			CK(kfwd_copy2d(c->kc, recv + (size_t)r * n, (int64_t)n, send, (int64_t)n, (int64_t)n,
			               1));
		/* the last op of a rank without output (forward.c): its step ends here */
		return c->rk->logits ? 0 : step_finish(c);
	}
	if (c->mode == 2) /* rank-shard mode: own slot, others zero */
		return 0;
	PROF(c, "all_gather(shard: own slot)", NULL, 4.0 * (double)n * T)
	{
		CK(kcuda_memset(c->kc, recv, 0, n * (size_t)T * sizeof(float)));
		CK(kfwd_copy2d(c->kc, recv + (size_t)r * n, (int64_t)n, send, (int64_t)n, (int64_t)n, 1));
	}
	return step_status(c);
}

static int cu_barrier(void *ctx)
{
	struct be_cuda *c = ctx; /* TP over GPUs: each rank reads only the pool copy it wrote */
	return c->nccl ? 0 : step_status(c);
}

static const void *cu_host_view(void *ctx, const void *p, size_t bytes)
{
	struct be_cuda *c = ctx;
	if (bytes > c->hv_bytes) {
		free(c->hv);
		c->hv = malloc(bytes);
		c->hv_bytes = c->hv ? bytes : 0;
	}
	if (!c->hv) { /* debug hooks only: the caller reads `bytes` from the result */
		fprintf(stderr, "cuda: out of host memory for a %zu-byte debug view\n", bytes);
		abort();
	}
	int rc = c->nccl ? tp_nccl_wait(c->nccl) : 0; /* collectives on the stream: a bounded wait */
	if (rc || kcuda_download(c->kc, c->hv, p, bytes)) {
		CK(ERR_CUDA);
		memset(c->hv, 0, bytes);
	}
	return c->hv;
}

/* The end of a step's enqueueing (the first to_host, or all_gather on a rank without output); the
 * later calls of the step only report. Ends a capture and launches the graph (with NCCL: after
 * every rank said its capture succeeded; -EAGAIN on all of them otherwise, nothing having run) and,
 * with NCCL, waits for the stream against the deadline. Returns 0, -EAGAIN or the step's error. */
static int step_finish(struct be_cuda *c)
{
	if (c->agree_pending) {
		c->agree_pending = false;
		void *ex = NULL;
		bool bad = c->void_step;
		if (c->mode == 1) {
			c->capture_open = false;
			bad = kfwd_graph_end(c->kc, &ex) || c->err || bad;
		}
		float f = bad ? 1.0f : 0.0f;
		if (tp_all_reduce_sum(&c->rk->comm, &f, 1)) /* host side: the CPU group of the ranks */
			f = 1.0f;
		if (f != 0.0f) {
			kfwd_graph_destroy(ex);
			c->mode = 0;
			c->void_step = false;
			c->broken[c->gb][c->gc] = true;
			if (c->rk->rank == 0)
				LOG_WARN("model",
				         "cuda: decode graph capture failed on a rank for batch bucket %d, "
				         "context "
				         "bucket %d; that bucket runs eagerly on every rank",
				         1 << c->gb, 256 << c->gc);
			c->err = 0;
			return -EAGAIN;
		}
		c->graph[c->gb][c->gc] = ex;
		if (c->rk->rank == (c->m->opts.rank >= 0 ? c->m->opts.rank : 0))
			LOG_INFO(
			    "model",
			    "cuda: decode graph captured for batch bucket %lld, context bucket %d: %zu nodes",
			    (long long)c->st.n, c->st.max_keys, kfwd_graph_nodes_last);
		c->mode = 2;
	}
	if (c->mode == 1) { /* end of the captured step: instantiate, then run it */
		void *ex = NULL;
		struct kprof_seg *seg = prof_capture_take(c); /* its last event node goes in first */
		c->capture_open = false;
		int rc = kfwd_graph_end(c->kc, &ex);
		if (rc || c->err) { /* nothing of the step ran: the forward runs it again eagerly */
			kprof_seg_destroy(seg);
			kfwd_graph_destroy(ex);
			c->mode = 0;
			c->broken[c->gb][c->gc] = true;
			LOG_WARN("model",
			         "cuda: decode graph capture failed for batch bucket %d, context bucket %d; "
			         "that bucket runs eagerly",
			         1 << c->gb, 256 << c->gc);
			c->err = 0;
			return -EAGAIN;
		}
		c->graph[c->gb][c->gc] = ex;
		if (c->rk->rank == (c->m->opts.rank >= 0 ? c->m->opts.rank : 0))
			LOG_INFO(
			    "model",
			    "cuda: decode graph captured for batch bucket %lld, context bucket %d: %zu nodes",
			    (long long)c->st.n, c->st.max_keys, kfwd_graph_nodes_last);
		kprof_seg_destroy(c->gseg[c->gb][c->gc]);
		c->gseg[c->gb][c->gc] = seg;
		c->mode = 2;
	}
	if (c->mode == 2) {
		CK(kfwd_graph_launch(c->kc, c->graph[c->gb][c->gc]));
		c->mode = 3; /* launched once for this step; further to_host calls only copy */
		c->seg_pending = c->prof_graph && c->gseg[c->gb][c->gc];
	}
	if (c->nccl && !c->waited && !c->err) {
		c->waited = true;
		CK(tp_nccl_wait(c->nccl));
	}
	return c->err;
}

/* to_host of rows x width bytes (rows = 1: one contiguous piece) */
static int cu_to_host_2d(void *ctx, void *dst_host, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t rows)
{
	struct be_cuda *c = ctx;
	int rc = step_finish(c);
	if (c->seg_pending) { /* a profiled graph replay: collect its event nodes' times */
		c->seg_pending = false;
		if (!rc)
			kprof_seg_collect(c->prof_all, c->gseg[c->gb][c->gc]);
	}
	if (c->prof) { /* end of a profiled step (the logits are complete) */
		int prc = kprof_step_end(c->prof);
		c->prof = NULL;
		kprof_active = NULL;
		if (!rc)
			rc = prc;
	}
	if (rc)
		return rc;
	rc = rows == 1 ? kcuda_download(c->kc, dst_host, src, width)
	               : kcuda_download_2d(c->kc, dst_host, dpitch, src, spitch, width, rows);
	/* the device's bad-input counter once per step: the first download waited for the whole step
	 * (rank-shard mode downloads T x rows pieces; a second sync for each cost ~10 us apiece) */
	if (!rc && !c->errs_checked) {
		unsigned bad = 0;
		c->errs_checked = true;
		if (!kcuda_ctx_take_errors(c->kc, &bad) && bad)
			rc = ERR_FORMAT;
		else if (c->kc_side && !kcuda_ctx_take_errors(c->kc_side, &bad) && bad)
			rc = ERR_FORMAT; /* a kernel met a bad id or block (the batch was checked) */
	}
	return rc;
}

static int cu_to_host(void *ctx, void *dst_host, const void *src, size_t bytes)
{
	return cu_to_host_2d(ctx, dst_host, bytes, src, bytes, bytes, 1);
}

static void cu_destroy(void *ctx)
{
	struct be_cuda *c = ctx;
	if (!c)
		return;
	(void)kcuda_device_set(c->device);
	if (c->capture_open) {
		void *ex = NULL;
		kprof_seg_destroy(prof_capture_take(c));
		kfwd_graph_end(c->kc, &ex);
		kfwd_graph_destroy(ex);
	}
	for (int i = 0; i < N_BBUCKETS; i++)
		for (int j = 0; j < N_CBUCKETS; j++) {
			kfwd_graph_destroy(c->graph[i][j]);
			kprof_seg_destroy(c->gseg[i][j]);
		}
	for (int i = 0; i < N_KV_REP; i++) /* pools still alive at model_destroy */
		kcuda_free(c->rep[i].p);
	if (kprof_active == c->prof_all || kprof_active == c->prof_pf)
		kprof_active = NULL;
	kprof_destroy(c->prof_all); /* prints the last table */
	kprof_destroy(c->prof_pf);
	for (int i = 0; i < c->n_allocs; i++)
		kcuda_free(c->allocs[i]);
	free(c->allocs);
	free(c->dl);
	free(c->h_in);
	free(c->hv);
	if (c->kc_side)
		kcuda_ctx_destroy(c->kc_side);
	if (c->kc_main)
		kcuda_ctx_destroy(c->kc_main);
	else if (c->kc)
		kcuda_ctx_destroy(c->kc);
	free(c);
}

/* ---- KV staging for the workers (model_kv_upload / download, kernels/cuda/kv_stage.cu) ---------- */
static int cu_kv_copy(void *ctx, void *dev, void *host, size_t bytes, bool upload)
{
	struct be_cuda *c = ctx;
	c->op_seq++; /* writes device memory (cu_moe's parts check) */
	return upload ? kstage_copy(c->kc, dev, host, bytes, 1) : kstage_copy(c->kc, host, dev, bytes, 0);
}

static int cu_kv_wait(void *ctx)
{
	struct be_cuda *c = ctx;
	return kcuda_sync(c->kc);
}

static int cu_host_pin(void *ctx, void *p, size_t bytes)
{
	struct be_cuda *c = ctx;
	return kstage_host_register(c->kc, p, bytes);
}

static void cu_host_unpin(void *ctx, void *p)
{
	(void)ctx;
	kstage_host_unregister(p);
}

static int cu_bind_thread(void *ctx)
{
	struct be_cuda *c = ctx;
	return kstage_bind_thread(c->kc);
}

/* ---- fused small ops (kernels/cuda/fused.h): one launch each; c->fuse off: the parts ---------- */
static struct kfuse_kv fuse_kv(const struct be_cuda *c, enum mbe_kv_part part, int index, bool write)
{
	const struct model_kv_layout *L = &c->kv->layout;
	struct kfuse_kv k = {0};
	if (!write)
		return k;
	k.base = c->kvb;
	k.block_bytes = L->block_bytes;
	k.offset = part == MBE_KV_LATENT ? (size_t)index * L->lat_layer_bytes
	                                 : L->idx_offset + (size_t)index * L->idx_layer_bytes;
	k.block_tokens = L->block_tokens;
	k.bf16 = L->dtype == MODEL_KV_BF16;
	k.seq = c->d_seq;
	k.blocks = c->d_blk;
	k.ld_blocks = c->max_blk;
	return k;
}

static void cu_add_rmsnorm(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
                           int64_t n_rows, float eps);

/* a switch that is on unless the environment sets it to "0", read once into *cache (-1: not yet) */
static bool env_on_once(const char *name, int *cache)
{
	if (*cache < 0) {
		const char *e = getenv(name);
		*cache = !(e && strcmp(e, "0") == 0);
	}
	return *cache != 0;
}

/* TANDEM_NORM_XPARTS=0: the norms before the MoE and the q_a group leave no int8 parts (their
 * consumers then read x) */
static bool norm_parts_on(void)
{
	static int on = -1;
	return env_on_once("TANDEM_NORM_XPARTS", &on);
}

/* the most rows the norms make parts for: TANDEM_XPARTS_ROWS=n (0..8), default 1 (H200, 2026-12-01
 * 23:31: 1 row was as fast as or faster than 8 at batch 1, 2, 4 and 8); read once */
static int norm_parts_rows(void)
{
	static int rows = -1;
	if (rows < 0) {
		const char *e = getenv("TANDEM_XPARTS_ROWS");
		const long v = e && *e ? strtol(e, NULL, 10) : 1;
		rows = v < 0 ? 0 : v > 8 ? 8 : (int)v;
	}
	return rows;
}

static void cu_add_rmsnorm_q(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
                             int64_t n_rows, float eps)
{
	struct be_cuda *c = ctx;
	if (!c->fuse) {
		cu_add_rmsnorm(ctx, h, x, y, w, n, n_rows, eps);
		return;
	}
	SKIP_REPLAY(c);
	kcuda_xparts_forget(c->kc); /* y is rewritten: whatever parts the context held are stale */
	c->parts_y = NULL;
	PROF(c, "add+rmsnorm", NULL, 12.0 * (double)(n * n_rows))
	/* parts at up to norm_parts_rows() rows: their readers are one-token products and the MoE's
	 * one-token chunks (formed at up to 8 tokens) */
	{
		const bool parts = norm_parts_on() && n_rows <= norm_parts_rows();
		CK((parts ? kfuse_add_rmsnorm_parts : kfuse_add_rmsnorm)(c->kc, h, x, y, w, n, n_rows, eps));
	}
	if (kcuda_xparts_of(c->kc) == y)
		c->parts_seq = c->op_seq, c->parts_y = y;
}

static void cu_add_rmsnorm(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
                           int64_t n_rows, float eps)
{
	struct be_cuda *c = ctx;
	if (!c->fuse) {
		cu_add(ctx, h, x, n * n_rows);
		cu_rmsnorm(ctx, y, n, h, n, w, n, n_rows, eps);
		return;
	}
	SKIP_REPLAY(c);
	PROF(c, "add+rmsnorm", NULL, 12.0 * (double)(n * n_rows))
	CK(kfuse_add_rmsnorm(c->kc, h, x, y, w, n, n_rows, eps));
}

/* TANDEM_IDX_FOLD=1 folds idx_prep into mla_latent + the indexer (read at capture / per eager step).
 * Off by default: the 16:40 H200 run measured the batch-1 decode step 0.86 ms slower with it (15.99
 * vs 15.13 ms); kept selectable, its ops are tested (test_ops_fused, test_ops_indexer) */
static bool idx_fold_on(void)
{
	const char *e = getenv("TANDEM_IDX_FOLD");
	return e && strcmp(e, "1") == 0;
}

/* TANDEM_LATENT_XPARTS=0: mla_latent leaves no int8 parts of c_q (idx_q_b then reads c_q) */
static bool latent_parts_on(void)
{
	static int on = -1;
	return env_on_once("TANDEM_LATENT_XPARTS", &on);
}

static void cu_mla_latent(void *ctx, int layer, const struct layer_w *L, float *cq, float *kvl,
                          const float *cs, bool write)
{
	struct be_cuda *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, C = hp->C, R = hp->R;
	c->fold_layer = -1;
	if (!c->fuse) {
		cu_rmsnorm(ctx, cq, hp->Cq, cq, hp->Cq, L->q_a_norm, hp->Cq, n, hp->latent_eps);
		cu_rmsnorm(ctx, kvl, C + R, kvl, C + R, L->kv_a_norm, C, n, hp->latent_eps);
		cu_rope(ctx, kvl + C, C + R, n, 1, 0, R, cs, hp->rope_main);
		if (write)
			cu_kv_write(ctx, MBE_KV_LATENT, layer, kvl, C + R);
		return;
	}
	SKIP_REPLAY(c);
	kcuda_xparts_forget(c->kc); /* cq is rewritten: whatever parts the context held are stale */
	c->parts_y = NULL;
	struct kfuse_rope rp = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_main};
	struct kfuse_kv kv = fuse_kv(c, MBE_KV_LATENT, layer, write);
	/* the indexer's k_I and w_I (the products of `a` just issued, found among the last four)
	 * join this launch; idx_prep then has only q_I's rope left, which the score kernel does */
	float *kI = NULL, *wI = NULL;
	if (L->has_idx && !c->st.debug && idx_fold_on())
		for (int i = 0; i < 4; i++) {
			if (c->mm_w[i] == &L->idx_k)
				kI = c->mm_y[i];
			if (c->mm_w[i] == &L->idx_proj)
				wI = c->mm_y[i];
		}
	for (int i = 0; i < 4; i++)
		c->mm_w[i] = NULL;
	if (kI && wI) {
		struct kfuse_idx_key ik = {
		    .kI = kI,
		    .DI = hp->idx_D,
		    .R = R,
		    .kw = L->idx_knorm_w,
		    .kb = L->idx_knorm_b,
		    .eps = hp->idx_norm_eps,
		    .wI = wI,
		    .HI = hp->idx_H,
		    .wscale = 1.0f / sqrtf((float)hp->idx_H),
		    .rp = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_idx},
		    .kv = fuse_kv(c, MBE_KV_INDEXER, hp->idx_slot[layer], write)};
		int rc = 0;
		PROF(c, "mla_latent+idx_k(norms+rope+kv_write)", NULL,
		     12.0 * (double)(n * (hp->Cq + C + R + hp->idx_D + hp->idx_H)))
		rc = kfuse_mla_latent_idx(c->kc, cq, hp->Cq, L->q_a_norm, hp->latent_eps, kvl, C, R,
		                          L->kv_a_norm, hp->latent_eps, n, &rp, &kv, &ik);
		CK(rc);
		if (rc == 0) {
			c->fold_layer = layer;
			c->fold_kI = kI;
			c->fold_wI = wI;
		}
		return;
	}
	PROF(c, "mla_latent(norms+rope+kv_write)", NULL, 12.0 * (double)(n * (hp->Cq + C + R)))
	{
		const bool parts = n <= norm_parts_rows() && c->branch != 1 && latent_parts_on();
		CK((parts ? kfuse_mla_latent_parts
		          : kfuse_mla_latent)(c->kc, cq, hp->Cq, L->q_a_norm, hp->latent_eps, kvl, C, R,
		                              L->kv_a_norm, hp->latent_eps, n, &rp, &kv));
	}
	/* up to norm_parts_rows() tokens: c_q's int8 parts for idx_q_b, the next main-path op (its query
	 * branch beside) */
	if (n <= norm_parts_rows() && c->branch != 1 && kcuda_xparts_of(c->kc) == cq)
		c->parts_seq = c->op_seq, c->parts_y = cq;
}

static void cu_idx_prep(void *ctx, int layer, const struct layer_w *L, float *qI, float *kI, float *wI,
                        const float *cs, bool write)
{
	struct be_cuda *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, HI = hp->idx_H, DI = hp->idx_D, R = hp->R;
	c->foldq_layer = -1;
	if (c->fold_layer == layer && c->mode != 2) { /* k_I, w_I done by cu_mla_latent */
		c->fold_layer = -1;
		if (kI != c->fold_kI || wI != c->fold_wI) { /* not the rows it did: never apply twice */
			CK(-EINVAL);
			return;
		}
		c->foldq_layer = layer; /* q_I: roped by the indexer's loads (cu_indexer) */
		c->fold_qI = qI;
		return;
	}
	if (!c->fuse) {
		cu_layernorm(ctx, kI, DI, kI, DI, L->idx_knorm_w, L->idx_knorm_b, DI, n, hp->idx_norm_eps);
		cu_rope(ctx, qI, HI * DI, n, HI, DI, R, cs, hp->rope_idx);
		cu_scale(ctx, wI, n * HI, 1.0f / sqrtf((float)HI));
		cu_rope(ctx, kI, DI, n, 1, 0, R, cs, hp->rope_idx);
		if (write)
			cu_kv_write(ctx, MBE_KV_INDEXER, hp->idx_slot[layer], kI, DI);
		return;
	}
	SKIP_REPLAY(c);
	struct kfuse_rope rp = {.inv_freq = c->d_inv, .pos = c->d_pos, .pairing = hp->rope_idx};
	struct kfuse_kv kv = fuse_kv(c, MBE_KV_INDEXER, hp->idx_slot[layer], write);
	PROF(c, "idx_prep(norm+rope+scale+kv_write)", NULL, 8.0 * (double)(n * (HI * DI + HI + DI)))
	CK(kfuse_idx_prep(c->kc, qI, wI, HI, 1.0f / sqrtf((float)HI), kI, DI, R, L->idx_knorm_w,
	                  L->idx_knorm_b, hp->idx_norm_eps, n, &rp, &kv));
}

static const struct model_backend_ops cuda_ops = {
    .name = "cuda",
    .weights = cu_weights,
    .kv_alloc = cu_kv_alloc,
    .kv_free = cu_kv_free,
    .plan = cu_plan,
    .begin = cu_begin,
    .ws = cu_ws,
    .embed = cu_embed,
    .rope_tables = cu_rope_tables,
    .rmsnorm = cu_rmsnorm,
    .layernorm = cu_layernorm,
    .matmul = cu_matmul,
    .rope = cu_rope,
    .scale = cu_scale,
    .swiglu = cu_swiglu,
    .add = cu_add,
    .kv_write = cu_kv_write,
    .indexer = cu_indexer,
    .mla_attn = cu_mla_attn,
    .moe = cu_moe,
    .gather_rows = cu_gather_rows,
    .all_reduce = cu_all_reduce,
    .all_gather = cu_all_gather,
    .barrier = cu_barrier,
    .host_view = cu_host_view,
    .to_host = cu_to_host,
    .destroy = cu_destroy,
    .kv_copy = cu_kv_copy,
    .kv_wait = cu_kv_wait,
    .host_pin = cu_host_pin,
    .host_unpin = cu_host_unpin,
    .bind_thread = cu_bind_thread,
    .add_rmsnorm = cu_add_rmsnorm,
    .add_rmsnorm_q = cu_add_rmsnorm_q,
    .mla_latent = cu_mla_latent,
    .idx_prep = cu_idx_prep,
    .to_host_2d = cu_to_host_2d,
    .branch_begin = cu_branch_begin,
    .branch_end = cu_branch_end,
    .branch_join = cu_branch_join,
    .mla_q = cu_mla_q,
    .matmul_n = cu_matmul_n,
    .matmul_n_fused = cu_matmul_n_fused,
};

/* One line per type mix of the routed experts that the tensor-core decode kernels do not take (the
 * generic per-row kernels, or the split path for gate and up of different types), so a slow file is
 * named at load rather than found in a profile. */
static void report_moe_paths(const struct be_cuda *c)
{
	struct mix {
		enum kcuda_moe_path path;
		int g, u, d, n, first;
	} mx[16];
	int n_mx = 0, n_tc = 0;
	for (int l = 0; l < c->m->hp.n_layers; l++) {
		const struct layer_w *L = &c->dl[l];
		if (!L->moe)
			continue;
		const int g = L->gate_exps.w.type, u = L->up_exps.w.type, d = L->down_exps.w.type;
		const enum kcuda_moe_path p = kcuda_moe_decode_path(g, u, d);
		if (p == KCUDA_MOE_TENSOR_CORE) {
			n_tc++;
			continue;
		}
		int i = 0;
		while (i < n_mx && !(mx[i].g == g && mx[i].u == u && mx[i].d == d))
			i++;
		if (i == n_mx && n_mx < 16)
			mx[n_mx++] = (struct mix){p, g, u, d, 0, l};
		if (i < n_mx)
			mx[i].n++;
	}
	for (int i = 0; i < n_mx; i++)
		LOG_INFO(
		    "model",
		    "cuda: routed experts of %d MoE layer(s) (the first: %d) are %s / %s / %s (gate / up / "
		    "down): %s",
		    mx[i].n, mx[i].first, ktype_name(mx[i].g), ktype_name(mx[i].u), ktype_name(mx[i].d),
		    mx[i].path == KCUDA_MOE_SPLIT
		        ? "gate and up differ in type, so decode takes the split path (gather, three "
		          "per-pair "
		          "products, SwiGLU, combine), slower than the fused kernels"
		        : "the tensor-core decode kernels take Q4_K, Q5_K, Q6_K, Q8_0 and IQ1_S ... IQ3_S, "
		          "so decode runs these on the generic per-row kernels");
	if (n_mx && n_tc)
		LOG_INFO("model", "cuda: the other %d MoE layer(s) decode on the tensor-core kernels", n_tc);
}

int model_backend_cuda_create(struct model *m, struct model_rank *rk, struct model_backend *out,
                              struct errbuf *e)
{
	const struct model_hparams *hp = &m->hp;
	const struct model_opts *o = &m->opts;
	int rc;
	/* TP over GPUs: rank r on device opts.device + r; rank-shard mode: opts.device */
	int dev = o->device + (o->rank >= 0 ? 0 : rk->rank);
	if (kcuda_device_count() <= dev || dev < 0)
		return errbuf_set(e, ERR_UNSUPPORTED, "backend cuda: no CUDA device %d (%d found)", dev,
		                  kcuda_device_count());
	struct be_cuda *c = calloc(1, sizeof(*c));
	if (!c)
		return errbuf_set(e, -ENOMEM, "out of memory");
	c->m = m;
	c->rk = rk;
	c->device = dev;
	c->max_tok = o->max_tokens;
	c->max_seqs = o->max_seqs;
	c->max_ctx = o->max_ctx;
	c->max_blk = (c->max_ctx + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS;
	/* the main context's workspace: the default, or what the prefill MoE needs to take a whole
	 * max_tokens step in one pass (GLM-5 rank of TP=8 at 2048 tokens: 411 MB, mostly the per-pair
	 * fp32 outputs; with 256 MiB it ran two 1024-token passes of half-filled tiles), at most 1 GiB */
	size_t kws = KCUDA_WS_DEFAULT;
	if (hp->n_expert > 0 && o->max_tokens >= 256) {
		const size_t need = kcuda_moe_prefill_ws(o->max_tokens, hp->n_expert_used, hp->n_expert,
		                                         rk->fel, hp->D, rk->fsl);
		const size_t cap = (size_t)1 << 30;
		if (need > kws)
			kws = need < cap ? need : cap;
	}
	if ((rc = kcuda_ctx_create(dev, kws, &c->kc))) {
		errbuf_set(e, rc,
		           "backend cuda: cannot create a context on device %d (workspace %.2f GB for "
		           "max_tokens %lld)",
		           dev, (double)kws / 1e9, (long long)o->max_tokens);
		goto fail;
	}
	c->kc_main = c->kc;
	c->q_layer = -1;
	if ((c->knockout = getenv("TANDEM_BENCH_KNOCKOUT")) && !*c->knockout)
		c->knockout = NULL;
	if (c->knockout)
		LOG_WARN("cuda",
		         "TANDEM_BENCH_KNOCKOUT=%s: these ops are left out of every captured decode graph; "
		         "graph replays give WRONG outputs (a timing study only)",
		         c->knockout);
	{
		const char *pn = getenv("TANDEM_PAR_N"), *pm = getenv("TANDEM_PAR_MAIN");
		c->par_n = pn && *pn ? strtoll(pn, NULL, 10) : GRAPH_MAX_BATCH;
		c->par_main = pm && *pm ? (int)strtol(pm, NULL, 10) : 0;
		if (c->par_main < 0)
			c->par_main = 0;
	}
	const char *pe0 = getenv("TANDEM_PAR");
	if (!(pe0 && strcmp(pe0, "0") == 0) && (rc = kcuda_ctx_create(dev, 0, &c->kc_side))) {
		errbuf_set(e, rc, "backend cuda: cannot create the side-branch context on device %d", dev);
		goto fail;
	}
	if (!(c->dl = calloc((size_t)hp->n_layers, sizeof(*c->dl)))) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto fail;
	}
	/* weights: count, then stage */
	struct upl u = {.c = c, .count = true, .synthetic = o->synthetic, .seed = 1, .e = e};
	if ((rc = upload_all(&u)))
		goto fail;
	u.count = false;
	c->up_t0 = now_s();
	/* synthetic weights are filled on the device: nothing to copy but the norm vectors */
	int up_thr = o->synthetic ? 0 : upload_threads(m);
	if (up_thr > 0) {
		rc = upload_threaded(&u, up_thr);
	} else {
		if ((rc = kfwd_stager_create((size_t)64 << 20, &u.sg))) {
			errbuf_set(e, rc, "backend cuda: cannot allocate pinned staging buffers");
			goto fail;
		}
		rc = upload_all(&u);
		if (!rc && (rc = kfwd_stager_finish(u.sg)))
			errbuf_set(e, rc, "backend cuda: weight upload failed");
		kfwd_stager_destroy(u.sg);
	}
	if (!rc)
		rc = kcuda_sync(c->kc);
	if (rc)
		goto fail;
	if (!o->quiet)
		progress(c, true);
	c->w = (struct mbe_weights){.layers = c->dl, .lm_head = &c->lm_head, .out_norm = c->out_norm};
	/* step inputs, inv_freq, scratch, workspace: from the limits, once */
	int64_t T = c->max_tok, n_in = 5 * T + c->max_seqs * c->max_blk;
	float inv[1024];
	if (hp->R / 2 > 1024) {
		rc =
		    errbuf_set(e, ERR_UNSUPPORTED, "backend cuda: RoPE dim %lld too large", (long long)hp->R);
		goto fail;
	}
	kcpu_rope_freqs(inv, hp->R, hp->rope_theta, hp->yarn ? hp->yarn_factor : 1.0f, hp->yarn_orig_ctx,
	                hp->yarn_beta_fast, hp->yarn_beta_slow);
	int64_t C = hp->C, R = hp->R, D = hp->D, Hl = rk->Hl, E = hp->n_expert > 0 ? hp->n_expert : 1;
	size_t ws = model_rank_ws_bytes(m, rk, T, (int)c->max_ctx, T, hp->has_indexer);
	size_t scratch =
	    sizeof(float) * (size_t)(T * Hl * (C + R) + T * Hl * C + T * E + T * D + 2 * T * rk->fsl);
	/* the dense prompt path's workspace (kcuda_mla_dense), for prompt-sized steps only */
	{
		const char *de = getenv("TANDEM_MLA_DENSE"), *dm = getenv("TANDEM_MLA_DENSE_MIN"),
		           *dh = getenv("TANDEM_MLA_DENSE_MATH");
		c->md_min = dm && *dm ? strtoll(dm, NULL, 10) : 128;
		if (c->md_min < 1)
			c->md_min = 1;
		c->md_math = !dh || !*dh               ? -1
		             : strcmp(dh, "f32") == 0  ? KCUDA_MD_F32
		             : strcmp(dh, "tf32") == 0 ? KCUDA_MD_TF32
		             : strcmp(dh, "bf16") == 0 ? KCUDA_MD_BF16
		                                       : -2;
		const char *df = getenv("TANDEM_MLA_DENSE_FLASH");
		c->md_flash = df && *df ? (int)strtol(df, NULL, 10) : 2;
		if (c->md_flash < 0 || c->md_flash > 2) {
			rc = errbuf_set(e, -EINVAL, "TANDEM_MLA_DENSE_FLASH=%s: want 0, 1 or 2", df);
			goto fail;
		}
		if (c->md_math == -2) {
			rc = errbuf_set(e, -EINVAL, "TANDEM_MLA_DENSE_MATH=%s: want f32, tf32 or bf16", dh);
			goto fail;
		}
		/* unset: the math of the pool's dtype (the pool's layout takes m->opts.kv_dtype) */
		if (c->md_math == -1)
			c->md_math = m->opts.kv_dtype == MODEL_KV_BF16 ? KCUDA_MD_BF16 : KCUDA_MD_F32;
		if (!(de && strcmp(de, "0") == 0) && T >= c->md_min)
			c->md_bytes = kcuda_mla_dense_ws(c->kc, Hl, C, R, hp->N, hp->V, T, c->max_ctx,
			                                 c->md_math, c->md_flash);
		scratch += c->md_bytes;
	}
	size_t fr = 0, tot = 0;
	float frac = o->mem_fraction > 0 ? o->mem_fraction : 0.9f;
	if (kfwd_mem_info(&fr, &tot) == 0 && (double)(ws + scratch) > frac * (double)fr) {
		rc = errbuf_set(
		    e, ERR_LIMIT,
		    "backend cuda: workspaces for max_tokens %lld / max_ctx %lld need %.2f GB, more than "
		    "%.0f%% of the %.2f GB free",
		    (long long)T, (long long)c->max_ctx, (double)(ws + scratch) / 1e9, frac * 100,
		    (double)fr / 1e9);
		goto fail;
	}
	c->h_in = malloc(sizeof(int32_t) * (size_t)n_in);
	c->d_in = dalloc(c, sizeof(int32_t) * (size_t)n_in);
	c->d_inv = dalloc(c, sizeof(float) * (size_t)(R / 2 > 0 ? R / 2 : 1));
	c->ws = dalloc(c, ws);
	c->ws_bytes = ws;
	c->qabs = dalloc(c, sizeof(float) * (size_t)(T * Hl * (C + R)));
	c->obar = dalloc(c, sizeof(float) * (size_t)(T * Hl * C));
	c->rl = dalloc(c, sizeof(float) * (size_t)(T * E));
	c->ys = dalloc(c, sizeof(float) * (size_t)(T * D + 2 * T * rk->fsl));
	c->md_ws = c->md_bytes ? dalloc(c, c->md_bytes) : NULL;
	if (!c->h_in || !c->d_in || !c->d_inv || !c->ws || !c->qabs || !c->obar || !c->rl || !c->ys ||
	    (c->md_bytes && !c->md_ws)) {
		rc = errbuf_set(e, -ENOMEM, "backend cuda: cannot allocate the workspaces");
		goto fail;
	}
	c->d_tok = c->d_in;
	c->d_pos = c->d_in + T;
	c->d_seq = c->d_in + 2 * T;
	c->d_nk = c->d_in + 3 * T;
	c->d_rows = c->d_in + 4 * T;
	c->d_blk = c->d_in + 5 * T;
	if ((rc = kcuda_upload(c->kc, c->d_inv, inv, sizeof(float) * (size_t)(R / 2)))) {
		errbuf_set(e, rc, "backend cuda: upload failed");
		goto fail;
	}
	const char *hg = getenv("TANDEM_HEAD_GEMV");
	c->head_gemv = !hg || strcmp(hg, "0") != 0;
	const char *mq =
	    getenv("TANDEM_MULTI_QB"); /* H200 19:30: 15.44 / 24.22 ms (b1 / b8) on, 15.21 / 23.06 off */
	c->multi_qb = mq && strcmp(mq, "1") == 0;
	c->fuse = kfuse_enabled();
	const char *mr = getenv("TANDEM_MLA_ROPE");
	c->mla_fold = c->fuse && mr && strcmp(mr, "1") == 0;
	const char *pe = getenv("TANDEM_CUDA_PROFILE");
	c->prof_graph = pe && strcmp(pe, "graph") == 0;
	if (pe && *pe && strcmp(pe, "0") != 0) {
		if ((rc = kprof_create(c->kc, &c->prof_all)) ||
		    (!c->prof_graph && (rc = kprof_create(c->kc, &c->prof_pf)))) {
			errbuf_set(e, rc, "backend cuda: cannot create the profiler");
			goto fail;
		}
		LOG_INFO("model", "cuda: TANDEM_CUDA_PROFILE=%s: %s (tables on stdout)", pe,
		         c->prof_graph
		             ? "captured decode graphs hold an event node around every op; replays are timed"
		             : "decode and prompt steps run eagerly with an event pair around every op");
	}
	if (!o->quiet && rk->rank == (o->rank >= 0 ? o->rank : 0)) /* once, not once a GPU */
		report_moe_paths(c);
	if (!o->quiet)
		LOG_INFO(
		    "model",
		    "cuda backend on device %d: workspace %.1f MB + %.1f MB for %lld tokens, %lld sequences, "
		    "%lld positions%s",
		    dev, ws / 1e6, scratch / 1e6, (long long)T, (long long)c->max_seqs, (long long)c->max_ctx,
		    o->graphs ? "; decode graphs on" : "");
	out->ops = &cuda_ops;
	out->ctx = c;
	return 0;
fail:
	cu_destroy(c);
	return rc;
}
int model_backend_cuda_kv_replicate(struct model *m, const struct model_kv *kv, const int32_t *blocks,
                                    int n_blocks, struct errbuf *e)
{
	struct be_cuda *c0 = m->ranks[0].be.ctx;
	size_t bb = kv->layout.block_bytes;
	for (int i = 0; i < n_blocks; i++)
		if (blocks[i] < 0 || blocks[i] >= kv->n_blocks)
			return errbuf_set(e, -EINVAL, "KV replicate: block %d outside the pool (%lld blocks)",
			                  blocks[i], (long long)kv->n_blocks);
	int rc = 0;
	for (int r = 1; r < m->n_ranks_local && !rc; r++) {
		struct be_cuda *o = m->ranks[r].be.ctx;
		char *dst = NULL;
		for (int i = 0; i < N_KV_REP && !dst; i++)
			if (o->rep[i].of == kv->base)
				dst = o->rep[i].p;
		if (!dst) {
			rc = errbuf_set(e, ERR_MISMATCH, "KV replicate: rank %d has no copy of this pool", r);
			break;
		}
		(void)kcuda_device_set(o->device);
		for (int i = 0; i < n_blocks && !rc; i++)
			rc = kcuda_copy_peer(o->kc, dst + (size_t)blocks[i] * bb,
			                     (const char *)kv->base + (size_t)blocks[i] * bb, c0->device, bb);
		if (!rc)
			rc = kcuda_ctx_wait(o->kc, tp_nccl_timeout_s());
		if (rc)
			errbuf_set(e, rc == -ETIMEDOUT ? ERR_TIMEOUT : rc,
			           "KV replicate: copy to GPU %d failed or timed out", o->device);
	}
	(void)kcuda_device_set(c0->device);
	return rc == -ETIMEDOUT ? ERR_TIMEOUT : rc;
}

struct kcuda_ctx *model_backend_cuda_kctx(struct model_rank *rk)
{
	struct be_cuda *c = rk->be.ctx;
	return c ? c->kc : NULL;
}

int model_backend_cuda_verify_weights(struct model_rank *rk, uint64_t *n_bytes, struct errbuf *e)
{
	struct be_cuda *c = rk->be.ctx;
	*n_bytes = 0;
	if (!c || c->m->opts.synthetic)
		return errbuf_set(e, -EINVAL,
		                  "cuda: no uploaded weights to verify (synthetic or no backend)");
	int rc = kstage_bind_thread(c->kc);
	if (rc)
		return errbuf_set(e, rc, "cuda: cannot bind device %d", c->device);
	struct upl u = {.c = c, .verify = true, .e = e};
	rc = upload_all(&u);
	free(u.v_buf);
	*n_bytes = u.v_bytes;
	return rc;
}
#endif
