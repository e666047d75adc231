/* The CPU backend of the forward's op interface (backend.h): each op is the kcpu_* kernel on the
 * rank's kpool, with the parallelisation the forward had before it was made backend-neutral:
 * attention one (token, head) per task, indexer one token per task or, for few tokens (decode),
 * each token's keys in 1024-key chunks across threads, MoE one expert per thread when experts have
 * few tokens each. Numbers are bit-identical to that forward (tests/model compare with the
 * references). Scratch of its own (absorbed queries, key pointer lists, MoE staging) grows with
 * the batch; the forward's workspace is the rank's buffer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/backend.h"
#include "common/model/model_internal.h"

struct be_cpu {
	struct model *m;
	struct model_rank *rk;
	const struct model_batch *b;
	struct model_kv *kv;
	struct mbe_step st;
	struct rank_buf own; /* internal scratch */
	struct mbe_weights w;
	float *qabs, *obar, *tsc, *isc, *inv;
	const void **tkeys;
	/* MoE staging */
	float *rl, *rscr, *ewt, *ybuf, *tscr, *xs, *ys, *t1, *t2;
	int32_t *etok, *eoff, *ppos, *elist;
	int64_t mrows;
};

/* carve aligned pieces out of one block (two passes: size, then carve) */
struct carve {
	char *p;
	size_t off;
};
static void *take(struct carve *c, size_t bytes)
{
	void *r = c->p ? c->p + c->off : NULL;
	c->off += (bytes + 63) & ~(size_t)63;
	return r;
}

static void *grow(struct rank_buf *rb, size_t bytes)
{
	if (bytes > rb->bytes) {
		free(rb->p);
		rb->p = malloc(bytes);
		rb->bytes = rb->p ? bytes : 0;
	}
	return rb->p;
}

#define INDEX_CHUNK 1024
#define MOE_SMALL_ROWS 64

static bool index_chunked(const struct be_cpu *c)
{
	return c->m->hp.has_indexer && c->st.n < kpool_n_threads(c->rk->pool) && c->st.max_keys > INDEX_CHUNK;
}

static int cpu_begin(void *ctx, const struct model_batch *b, struct model_kv *kv, const struct mbe_step *st)
{
	struct be_cpu *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	struct model_rank *rk = c->rk;
	c->b = b;
	c->kv = kv;
	c->st = *st;
	int64_t n = st->n, D = hp->D, C = hp->C, R = hp->R, Hl = rk->Hl, E = hp->n_expert,
	        k = hp->n_expert_used;
	int nthr = kpool_n_threads(rk->pool);
	int64_t E1 = E > 0 ? E : 1, k1 = k > 0 ? k : 1;
	int64_t fw = rk->fel > rk->fsl ? rk->fel : rk->fsl;
	c->mrows = n < MOE_SMALL_ROWS ? n : MOE_SMALL_ROWS; /* an expert has at most n tokens */
	struct carve cv = {0};
	for (int pass = 0; pass < 2; pass++) {
		c->qabs = take(&cv, (size_t)(n * Hl * (C + R)) * 4);
		c->inv = take(&cv, (size_t)R * 4);
		c->obar = take(&cv, (size_t)(n * Hl * C) * 4);
		c->tkeys = take(&cv, (size_t)nthr * (size_t)st->max_keys * sizeof(void *));
		c->tsc = take(&cv, (size_t)nthr * (size_t)st->max_keys * 4);
		c->isc = index_chunked(c) ? take(&cv, (size_t)n * (size_t)st->max_keys * 4) : NULL;
		c->rl = take(&cv, (size_t)(n * E1) * 4);
		c->rscr = take(&cv, (size_t)(2 * E1) * 4);
		c->etok = take(&cv, (size_t)(n * k1) * 4);
		c->ewt = take(&cv, (size_t)(n * k1) * 4);
		c->eoff = take(&cv, (size_t)(E + 2) * 4);
		c->ppos = take(&cv, (size_t)(n * k1) * 4);
		c->elist = take(&cv, (size_t)(E + 1) * 4);
		c->ybuf = take(&cv, E > 0 ? (size_t)(n * k1 * D) * 4 : 0);
		c->tscr = take(&cv, E > 0 ? (size_t)nthr * (size_t)(c->mrows * (D + 2 * rk->fel)) * 4 : 0);
		c->xs = take(&cv, E > 0 ? (size_t)(n * D) * 4 : 0);
		c->ys = take(&cv, E > 0 ? (size_t)(n * D) * 4 : 0);
		c->t1 = take(&cv, E > 0 ? (size_t)(n * fw) * 4 : 0);
		c->t2 = take(&cv, E > 0 ? (size_t)(n * fw) * 4 : 0);
		if (pass == 0) {
			cv.p = grow(&c->own, cv.off);
			cv.off = 0;
			if (!cv.p)
				return -ENOMEM;
		}
	}
	return 0;
}

static void *cpu_ws(void *ctx, size_t bytes)
{
	struct be_cpu *c = ctx;
	return grow(&c->rk->buf, bytes);
}

static void cpu_embed(void *ctx, float *h, int64_t D)
{
	struct be_cpu *c = ctx;
	const struct kweight *te = &c->m->tok_embd;
	for (int64_t i = 0; i < c->st.n; i++)
		kcpu_dequant_row(te->type, (const char *)te->data + (size_t)c->b->tokens[i] * te->row_bytes,
		                 h + i * D, D);
}

/* Every weight product of the CPU backend goes through here: exact kcpu_matmul, or the opt-in
 * approximate int8-activation path (model_opts.fast_matmul). */
static void mm(const struct be_cpu *c, struct kpool *pool, const struct kweight *w, const float *x,
               int64_t ldx, int64_t n_tok, float *y, int64_t ldy)
{
	if (c->m->opts.fast_matmul)
		kcpu_matmul_fast(pool, w, x, ldx, n_tok, y, ldy);
	else
		kcpu_matmul(pool, w, x, ldx, n_tok, y, ldy);
}

static void cpu_rope_tables(void *ctx, float *cs, int64_t R)
{
	struct be_cpu *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	float *inv = c->inv;
	kcpu_rope_freqs(inv, R, hp->rope_theta, hp->yarn ? hp->yarn_factor : 1.0f, hp->yarn_orig_ctx,
	                hp->yarn_beta_fast, hp->yarn_beta_slow);
	for (int64_t i = 0; i < c->st.n; i++)
		kcpu_rope_cs(inv, R / 2, c->b->pos[i], cs + i * R);
}

static void cpu_rmsnorm(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                        int64_t n, int64_t n_rows, float eps)
{
	(void)ctx;
	kcpu_rmsnorm(y, ldy, x, ldx, w, n, n_rows, eps);
}

static void cpu_layernorm(void *ctx, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                          const float *bias, int64_t n, int64_t n_rows, float eps)
{
	(void)ctx;
	kcpu_layernorm(y, ldy, x, ldx, w, bias, n, n_rows, eps);
}

static void cpu_matmul(void *ctx, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok,
                       float *y, int64_t n_out)
{
	struct be_cpu *c = ctx;
	mm(c, c->rk->pool, w, x, ldx, n_tok, y, n_out);
}

/* several products of one x: the same matmul calls in order (identical results) */
static void cpu_matmul_n(void *ctx, int n_w, const struct kweight *const *w, const float *x, int64_t ldx,
                         int64_t n_tok, float *const *y, const int64_t *n_out)
{
	for (int i = 0; i < n_w; i++)
		cpu_matmul(ctx, w[i], x, ldx, n_tok, y[i], n_out[i]);
}

static void cpu_rope(void *ctx, float *x, int64_t ldx, int64_t n_rows, int64_t n_heads, int64_t head_stride,
                     int64_t R, const float *cs, int pairing)
{
	(void)ctx;
	for (int64_t i = 0; i < n_rows; i++)
		for (int64_t hh = 0; hh < n_heads; hh++)
			kcpu_rope(x + i * ldx + hh * head_stride, R, cs + i * R, pairing);
}

static void cpu_scale(void *ctx, float *x, int64_t n, float s)
{
	(void)ctx;
	for (int64_t i = 0; i < n; i++)
		x[i] *= s;
}

static void cpu_swiglu(void *ctx, float *y, const float *gate, const float *up, int64_t n)
{
	(void)ctx;
	kcpu_swiglu(y, gate, up, n);
}

static void cpu_add(void *ctx, float *y, const float *x, int64_t n)
{
	(void)ctx;
	for (int64_t i = 0; i < n; i++)
		y[i] += x[i];
}

static inline char *lat_row(const struct model_kv *kv, const struct model_seq *s, int layer, int32_t pos)
{
	const struct model_kv_layout *L = &kv->layout;
	int32_t blk = s->blocks[pos / L->block_tokens];
	return (char *)kv->base + (size_t)blk * L->block_bytes + (size_t)layer * L->lat_layer_bytes +
	       (size_t)(pos % L->block_tokens) * (size_t)L->lat_dim * L->elt_bytes;
}

static inline char *idx_row(const struct model_kv *kv, const struct model_seq *s, int slot, int32_t pos)
{
	const struct model_kv_layout *L = &kv->layout;
	int32_t blk = s->blocks[pos / L->block_tokens];
	return (char *)kv->base + (size_t)blk * L->block_bytes + L->idx_offset +
	       (size_t)slot * L->idx_layer_bytes +
	       (size_t)(pos % L->block_tokens) * (size_t)L->idx_dim * L->elt_bytes;
}

static void cpu_kv_write(void *ctx, enum mbe_kv_part part, int index, const float *x, int64_t width)
{
	struct be_cpu *c = ctx;
	const struct model_batch *b = c->b;
	bool bf16 = c->kv->layout.dtype == MODEL_KV_BF16;
	for (int64_t i = 0; i < c->st.n; i++) {
		const struct model_seq *s = &b->seqs[b->seq[i]];
		char *dst = part == MBE_KV_LATENT ? lat_row(c->kv, s, index, b->pos[i])
		                                  : idx_row(c->kv, s, index, b->pos[i]);
		const float *src = x + i * width;
		if (bf16) {
			uint16_t *d = (uint16_t *)dst;
			for (int64_t j = 0; j < width; j++)
				d[j] = kf32_to_bf16(src[j]);
		} else {
			memcpy(dst, src, (size_t)width * sizeof(float));
		}
	}
}

/* ---- attention and indexer tasks ------------------------------------------------------------- */
struct fwd {
	struct be_cpu *c;
	const struct layer_w *L;
	int layer;
	const float *q, *cs;
	float *o;
	const float *qI, *wI;
	int32_t *sel;
	const int32_t *csel, *cnsel;
	int32_t *nsel;
	float *isc; /* n x max_keys score rows, or NULL */
	int64_t chunks_per_tok;
};

static void attn_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	struct be_cpu *c = f->c;
	const struct model_hparams *hp = &c->m->hp;
	const struct layer_w *L = f->L;
	const struct model_batch *b = c->b;
	int64_t Hl = c->rk->Hl, C = hp->C, R = hp->R, N = hp->N, NR = N + R, V = hp->V;
	bool bf16 = c->kv->layout.dtype == MODEL_KV_BF16;
	int max_keys = c->st.max_keys;
	const void **keys = c->tkeys + (size_t)thread * (size_t)max_keys;
	float *sc = c->tsc + (size_t)thread * (size_t)max_keys;
	for (int64_t task = i0; task < i1; task++) {
		int64_t i = task / Hl, hh = task % Hl;
		const struct model_seq *s = &b->seqs[b->seq[i]];
		int32_t pos = b->pos[i];
		const float *qn = f->q + i * Hl * NR + hh * NR;
		float *qa = c->qabs + (i * Hl + hh) * (C + R);
		/* absorbed query: q_abs[c] = sum_n W_UK[n][c] q_n[n] (attn_k_b row c of this head) */
		struct kweight kb = kweight3_at(&L->k_b, hh);
		for (int64_t cc = 0; cc < C; cc++)
			qa[cc] =
			    kcpu_dot_row(kb.type, (const char *)kb.data + (size_t)cc * kb.row_bytes, qn, N);
		memcpy(qa + C, qn + N, (size_t)R * sizeof(float));
		kcpu_rope(qa + C, R, f->cs + i * R, hp->rope_main);
		int nk;
		if (f->csel) {
			nk = f->cnsel[i];
			const int32_t *sl = f->csel + i * c->st.K;
			for (int t = 0; t < nk; t++)
				keys[t] = lat_row(c->kv, s, f->layer, sl[t]);
		} else {
			nk = pos + 1;
			for (int t = 0; t < nk; t++)
				keys[t] = lat_row(c->kv, s, f->layer, t);
		}
		float *ob = c->obar + (i * Hl + hh) * C;
		kcpu_mla_attn_head(qa, C, R, keys, nk, bf16, hp->attn_scale, sc, ob);
		struct kweight vb = kweight3_at(&L->v_b, hh);
		float *oo = f->o + i * Hl * V + hh * V;
		for (int64_t v = 0; v < V; v++)
			oo[v] =
			    kcpu_dot_row(vb.type, (const char *)vb.data + (size_t)v * vb.row_bytes, ob, C);
	}
}

static void cpu_mla_attn(void *ctx, int layer, const struct layer_w *L, const float *q, const float *cs,
                         const int32_t *sel, const int32_t *nsel, float *o)
{
	struct be_cpu *c = ctx;
	struct fwd f = {.c = c, .L = L, .layer = layer, .q = q, .cs = cs, .o = o, .csel = sel, .cnsel = nsel};
	kpool_for(c->rk->pool, c->st.n * c->rk->Hl, 1, attn_task, &f);
}

/* Indexer scores of token i's keys [t0, t1) into sc (the row of all its keys). */
static void index_scores(struct fwd *f, int64_t i, int t0, int t1, float *sc, const void **keys)
{
	struct be_cpu *c = f->c;
	const struct model_hparams *hp = &c->m->hp;
	const struct model_seq *s = &c->b->seqs[c->b->seq[i]];
	int slot = hp->idx_slot[f->layer];
	for (int t = t0; t < t1; t++)
		keys[t - t0] = idx_row(c->kv, s, slot, t);
	kcpu_indexer_scores(f->qI + i * hp->idx_H * hp->idx_D, f->wI + i * hp->idx_H, hp->idx_H, hp->idx_D,
	                    keys, t1 - t0, c->kv->layout.dtype == MODEL_KV_BF16,
	                    1.0f / sqrtf((float)hp->idx_D), sc + t0);
}

/* many tokens: one task per token (scores into thread scratch or isc, then its top-k) */
static void index_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	struct be_cpu *c = f->c;
	int max_keys = c->st.max_keys;
	const void **keys = c->tkeys + (size_t)thread * (size_t)max_keys;
	for (int64_t i = i0; i < i1; i++) {
		int nk = c->b->pos[i] + 1;
		float *sc = f->isc ? f->isc + i * max_keys : c->tsc + (size_t)thread * (size_t)max_keys;
		index_scores(f, i, 0, nk, sc, keys);
		f->nsel[i] = kcpu_topk(sc, nk, (int)c->st.K, f->sel + i * c->st.K);
	}
}

/* few tokens (decode): the keys of each token are cut into chunks scored in parallel into the
 * token's row of isc; index_topk_task then selects per token */
static void index_chunk_task(void *user, int64_t c0, int64_t c1, int thread)
{
	struct fwd *f = user;
	struct be_cpu *c = f->c;
	const void **keys = c->tkeys + (size_t)thread * (size_t)c->st.max_keys;
	for (int64_t ci = c0; ci < c1; ci++) {
		int64_t i = ci / f->chunks_per_tok, ch = ci % f->chunks_per_tok;
		int nk = c->b->pos[i] + 1, t0 = (int)(ch * INDEX_CHUNK);
		if (t0 < nk)
			index_scores(f, i, t0, t0 + INDEX_CHUNK < nk ? t0 + INDEX_CHUNK : nk,
			             f->isc + i * c->st.max_keys, keys);
	}
}

static void index_topk_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	struct be_cpu *c = f->c;
	(void)thread;
	for (int64_t i = i0; i < i1; i++)
		f->nsel[i] = kcpu_topk(f->isc + i * c->st.max_keys, c->b->pos[i] + 1, (int)c->st.K,
		                       f->sel + i * c->st.K);
}

static void cpu_indexer(void *ctx, int layer, const float *qI, const float *wI, int32_t *sel, int32_t *nsel,
                        float *scores)
{
	struct be_cpu *c = ctx;
	struct fwd f = {.c = c, .layer = layer, .qI = qI, .wI = wI, .sel = sel, .nsel = nsel};
	int64_t n = c->st.n;
	if (!scores && c->isc) { /* few tokens: parallel over key chunks */
		f.isc = c->isc;
		f.chunks_per_tok = (c->st.max_keys + INDEX_CHUNK - 1) / INDEX_CHUNK;
		kpool_for(c->rk->pool, n * f.chunks_per_tok, 1, index_chunk_task, &f);
		kpool_for(c->rk->pool, n, 1, index_topk_task, &f);
	} else {
		f.isc = scores;
		kpool_for(c->rk->pool, n, 1, index_task, &f);
	}
}

/* ---- MoE ---------------------------------------------------------------------------------------
 * Experts with few tokens each run one per thread (single-thread matmuls on the thread's own
 * scratch); experts with many tokens run one after another with row-threaded matmuls. Either way
 * expert e's outputs land in ybuf rows eoff[e] .. eoff[e+1]-1, so the sum is order-independent. */
struct moe {
	struct be_cpu *c;
	const struct layer_w *L;
	const float *a;
	int64_t D;
};

static void expert_chain(struct kpool *pool, const struct moe *mo, int64_t e, float *xs, float *t1, float *t2)
{
	struct be_cpu *c = mo->c;
	int64_t D = mo->D, fel = c->rk->fel, mt = c->eoff[e + 1] - c->eoff[e];
	const int32_t *et = c->etok + c->eoff[e];
	for (int64_t j = 0; j < mt; j++)
		memcpy(xs + j * D, mo->a + (int64_t)et[j] * D, (size_t)D * sizeof(float));
	struct kweight wg = kweight3_at(&mo->L->gate_exps, e), wu = kweight3_at(&mo->L->up_exps, e),
	               wd = kweight3_at(&mo->L->down_exps, e);
	mm(c, pool, &wg, xs, D, mt, t1, fel);
	mm(c, pool, &wu, xs, D, mt, t2, fel);
	kcpu_swiglu(t1, t1, t2, mt * fel);
	mm(c, pool, &wd, t1, fel, mt, c->ybuf + (int64_t)c->eoff[e] * D, D);
}

static void expert_task(void *user, int64_t i0, int64_t i1, int thread)
{
	const struct moe *mo = user;
	struct be_cpu *c = mo->c;
	int64_t D = mo->D, fel = c->rk->fel;
	float *xs = c->tscr + (size_t)thread * (size_t)(c->mrows * (D + 2 * fel));
	float *t1 = xs + c->mrows * D, *t2 = t1 + c->mrows * fel;
	for (int64_t i = i0; i < i1; i++)
		expert_chain(c->rk->inl[thread], mo, c->elist[i], xs, t1, t2);
}

static void cpu_moe(void *ctx, const struct layer_w *L, const float *a, float *part, int32_t *ids, float *wts)
{
	struct be_cpu *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	struct model_rank *rk = c->rk;
	int64_t n = c->st.n, D = hp->D, E = hp->n_expert, k = hp->n_expert_used;
	int nthr = kpool_n_threads(rk->pool);
	int32_t *eoff = c->eoff;
	kcpu_matmul(rk->pool, &L->gate_inp, a, D, n, c->rl, E); /* router: always exact fp32 */
	for (int64_t i = 0; i < n; i++)
		kcpu_moe_route(c->rl + i * E, L->exp_bias, (int)E, (int)k, hp->n_group, hp->n_group_used,
		               hp->gating_func, hp->expert_weights_norm, hp->expert_weights_scale,
		               ids + i * k, wts + i * k, c->rscr);
	memset(part, 0, (size_t)(n * D) * sizeof(float));
	/* group the (token, weight) pairs by expert (counting sort) */
	memset(eoff, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (int64_t i = 0; i < n * k; i++)
		eoff[ids[i] + 1]++;
	for (int64_t e = 0; e < E; e++)
		eoff[e + 1] += eoff[e];
	for (int64_t i = 0; i < n * k; i++) {
		int32_t at = eoff[ids[i]]++;
		c->etok[at] = (int32_t)(i / k);
		c->ewt[at] = wts[i];
		c->ppos[i] = at;
	}
	for (int64_t e = E; e > 0; e--) /* eoff[e] was advanced to the end of e: shift back */
		eoff[e] = eoff[e - 1];
	eoff[0] = 0;
	struct moe mo = {.c = c, .L = L, .a = a, .D = D};
	int64_t n_small = 0;
	for (int64_t e = 0; e < E; e++) {
		int64_t mt = eoff[e + 1] - eoff[e];
		if (mt > 0 && mt <= MOE_SMALL_ROWS)
			c->elist[n_small++] = (int32_t)e;
	}
	if (n_small >= nthr && nthr > 1) /* enough experts to give every thread one */
		kpool_for(rk->pool, n_small, 1, expert_task, &mo);
	for (int64_t e = 0; e < E; e++) {
		int64_t mt = eoff[e + 1] - eoff[e];
		if (mt > 0 && (mt > MOE_SMALL_ROWS || n_small < nthr || nthr == 1))
			expert_chain(rk->pool, &mo, e, c->xs, c->t1, c->t2);
	}
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < k; j++) {
			int32_t at = c->ppos[i * k + j];
			const float *y = c->ybuf + (int64_t)at * D;
			float w = c->ewt[at];
			for (int64_t d = 0; d < D; d++)
				part[i * D + d] += w * y[d];
		}
	if (L->has_shexp) {
		mm(c, rk->pool, &L->sh_gate, a, D, n, c->t1, rk->fsl);
		mm(c, rk->pool, &L->sh_up, a, D, n, c->t2, rk->fsl);
		kcpu_swiglu(c->t1, c->t1, c->t2, n * rk->fsl);
		mm(c, rk->pool, &L->sh_down, c->t1, rk->fsl, n, c->ys, D);
		for (int64_t i = 0; i < n * D; i++)
			part[i] += c->ys[i];
	}
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, int64_t width, const int32_t *rows_host,
                            int64_t n)
{
	(void)ctx;
	for (int64_t j = 0; j < n; j++)
		memcpy(dst + j * width, src + (int64_t)rows_host[j] * width, (size_t)width * sizeof(float));
}

static int cpu_all_reduce(void *ctx, float *buf, size_t n)
{
	struct be_cpu *c = ctx;
	const size_t chunk = MODEL_TP_CHUNK_FLOATS; /* the CPU group's scratch size */
	for (size_t o = 0; o < n; o += chunk) {
		int rc = tp_all_reduce_sum(&c->rk->comm, buf + o, n - o < chunk ? n - o : chunk);
		if (rc)
			return rc;
	}
	return 0;
}

static int cpu_all_gather(void *ctx, const float *send, size_t n, float *recv)
{
	struct be_cpu *c = ctx;
	return tp_all_gather(&c->rk->comm, send, n, recv);
}

static int cpu_barrier(void *ctx)
{
	struct be_cpu *c = ctx;
	return tp_barrier(&c->rk->comm);
}

static const void *cpu_host_view(void *ctx, const void *p, size_t bytes)
{
	(void)ctx;
	(void)bytes;
	return p;
}

static int cpu_to_host(void *ctx, void *dst_host, const void *src, size_t bytes)
{
	(void)ctx;
	memcpy(dst_host, src, bytes);
	return 0;
}

static int cpu_to_host_2d(void *ctx, void *dst_host, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t rows)
{
	(void)ctx;
	for (size_t i = 0; i < rows; i++)
		memcpy((char *)dst_host + i * dpitch, (const char *)src + i * spitch, width);
	return 0;
}

static void cpu_destroy(void *ctx)
{
	struct be_cpu *c = ctx;
	if (!c)
		return;
	free(c->own.p);
	free(c);
}

static const struct mbe_weights *cpu_weights(void *ctx)
{
	struct be_cpu *c = ctx;
	return &c->w;
}

/* ---- fused ops: the sequences themselves (bit-identical to the unfused forward) ---------------- */
static void cpu_add_rmsnorm(void *ctx, float *h, const float *x, float *y, const float *w, int64_t n,
                            int64_t n_rows, float eps)
{
	cpu_add(ctx, h, x, n * n_rows);
	cpu_rmsnorm(ctx, y, n, h, n, w, n, n_rows, eps);
}

static void cpu_mla_latent(void *ctx, int layer, const struct layer_w *L, float *cq, float *kvl,
                           const float *cs, bool write)
{
	struct be_cpu *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, C = hp->C, R = hp->R;
	cpu_rmsnorm(ctx, cq, hp->Cq, cq, hp->Cq, L->q_a_norm, hp->Cq, n, hp->latent_eps);
	cpu_rmsnorm(ctx, kvl, C + R, kvl, C + R, L->kv_a_norm, C, n, hp->latent_eps);
	cpu_rope(ctx, kvl + C, C + R, n, 1, 0, R, cs, hp->rope_main);
	if (write)
		cpu_kv_write(ctx, MBE_KV_LATENT, layer, kvl, C + R);
}

static void cpu_idx_prep(void *ctx, int layer, const struct layer_w *L, float *qI, float *kI, float *wI,
                         const float *cs, bool write)
{
	struct be_cpu *c = ctx;
	const struct model_hparams *hp = &c->m->hp;
	int64_t n = c->st.n, HI = hp->idx_H, DI = hp->idx_D, R = hp->R;
	cpu_layernorm(ctx, kI, DI, kI, DI, L->idx_knorm_w, L->idx_knorm_b, DI, n, hp->idx_norm_eps);
	cpu_rope(ctx, qI, HI * DI, n, HI, DI, R, cs, hp->rope_idx);
	cpu_scale(ctx, wI, n * HI, 1.0f / sqrtf((float)HI));
	cpu_rope(ctx, kI, DI, n, 1, 0, R, cs, hp->rope_idx);
	if (write)
		cpu_kv_write(ctx, MBE_KV_INDEXER, hp->idx_slot[layer], kI, DI);
}

static const struct model_backend_ops cpu_ops = {
    .name = "cpu",
    .weights = cpu_weights,
    .begin = cpu_begin,
    .ws = cpu_ws,
    .embed = cpu_embed,
    .rope_tables = cpu_rope_tables,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .scale = cpu_scale,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .kv_write = cpu_kv_write,
    .indexer = cpu_indexer,
    .mla_attn = cpu_mla_attn,
    .moe = cpu_moe,
    .gather_rows = cpu_gather_rows,
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
    .barrier = cpu_barrier,
    .host_view = cpu_host_view,
    .to_host = cpu_to_host,
    .destroy = cpu_destroy,
    .add_rmsnorm = cpu_add_rmsnorm,
    .mla_latent = cpu_mla_latent,
    .idx_prep = cpu_idx_prep,
    .to_host_2d = cpu_to_host_2d,
    .matmul_n = cpu_matmul_n,
};

int model_backend_cpu_create(struct model *m, struct model_rank *rk, struct model_backend *out)
{
	struct be_cpu *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->m = m;
	c->rk = rk;
	c->w = (struct mbe_weights){.layers = rk->layers, .lm_head = &rk->lm_head, .out_norm = m->out_norm};
	out->ops = &cpu_ops;
	out->ctx = c;
	return 0;
}
