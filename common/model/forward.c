/* The forward pass of one tensor-parallel rank (MODEL-SPEC.md §2), batched over tokens of any
 * sequences, reading and writing the paged KV cache. Per layer:
 *   a = RMSNorm(h); c_q = RMSNorm(W_qa a); q = W_qb c_q (this rank's heads); [c | k_r] = W_kva a,
 *   c normed, k_r roped -> cache; indexer (full layers): q_I, k_I (LayerNorm, RoPE) -> cache,
 *   scores over keys 0..p, top-k (shared layers reuse the last full layer's); attention per
 *   (token, head) in the absorbed form over the selected keys; o_proj partial -> all-reduce;
 *   FFN (dense MLP or routed + shared experts, this rank's slice of F) -> all-reduce.
 * All activations and accumulations are fp32; weights are dequantized on the fly by the kernels.
 * The cache is replicated: one rank (writes_kv) writes it, a barrier publishes it to the others. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model_internal.h"

static void *scratch(struct model_rank *rk, size_t bytes)
{
	if (bytes > rk->buf.bytes) {
		free(rk->buf.p);
		rk->buf.p = malloc(bytes);
		rk->buf.bytes = rk->buf.p ? bytes : 0;
	}
	return rk->buf.p;
}

/* carve aligned pieces out of one scratch block */
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

static int reduce(struct model_rank *rk, float *buf, size_t n)
{
	const size_t chunk = MODEL_TP_CHUNK_FLOATS;
	for (size_t o = 0; o < n; o += chunk) {
		int rc = tp_all_reduce_sum(&rk->comm, buf + o, n - o < chunk ? n - o : chunk);
		if (rc)
			return rc;
	}
	return 0;
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

static void store(void *dst, const float *src, int64_t n, bool bf16)
{
	if (bf16) {
		uint16_t *d = dst;
		for (int64_t i = 0; i < n; i++)
			d[i] = kf32_to_bf16(src[i]);
	} else {
		memcpy(dst, src, (size_t)n * sizeof(float));
	}
}

/* ---- parallel tasks -------------------------------------------------------------------------- */
struct fwd {
	struct model *m;
	struct model_rank *rk;
	const struct model_batch *b;
	struct model_kv *kv;
	const struct layer_w *L;
	int layer;
	const float *q; /* n x Hl*(N+R) (rope part not yet rotated) */
	const float *cs; /* n x R cos/sin */
	float *qabs; /* n x Hl x (C+R) */
	float *obar; /* n x Hl x C */
	float *o; /* n x Hl*V */
	const float *qI; /* n x HI*DI (roped) */
	const float *wI; /* n x HI */
	int32_t *sel; /* n x K (K clamped to the longest key list of the batch) */
	int64_t K;
	int32_t *nsel; /* n */
	bool sparse; /* attention uses sel */
	float *isc; /* n x max_keys score rows (debug hooks or chunked scoring), or NULL */
	int64_t chunks_per_tok;
	int max_keys;
	/* per thread scratch */
	const void **tkeys; /* n_threads x max_keys */
	float *tsc; /* n_threads x max_keys */
};

static void attn_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	const struct model_hparams *hp = &f->m->hp;
	const struct layer_w *L = f->L;
	int64_t Hl = f->rk->Hl, C = hp->C, R = hp->R, N = hp->N, NR = N + R, V = hp->V;
	bool bf16 = f->kv->layout.dtype == MODEL_KV_BF16;
	const void **keys = f->tkeys + (size_t)thread * (size_t)f->max_keys;
	float *sc = f->tsc + (size_t)thread * (size_t)f->max_keys;
	for (int64_t task = i0; task < i1; task++) {
		int64_t i = task / Hl, hh = task % Hl;
		const struct model_seq *s = &f->b->seqs[f->b->seq[i]];
		int32_t pos = f->b->pos[i];
		const float *qn = f->q + i * Hl * NR + hh * NR;
		float *qa = f->qabs + (i * Hl + hh) * (C + R);
		/* absorbed query: q_abs[c] = sum_n W_UK[n][c] q_n[n] (attn_k_b row c of this head) */
		struct kweight kb = kweight3_at(&L->k_b, hh);
		for (int64_t c = 0; c < C; c++)
			qa[c] =
			    kcpu_dot_row(kb.type, (const char *)kb.data + (size_t)c * kb.row_bytes, qn, N);
		memcpy(qa + C, qn + N, (size_t)R * sizeof(float));
		kcpu_rope(qa + C, R, f->cs + i * R, hp->rope_main);
		int nk;
		if (f->sparse) {
			nk = f->nsel[i];
			const int32_t *sl = f->sel + i * f->K;
			for (int t = 0; t < nk; t++)
				keys[t] = lat_row(f->kv, s, f->layer, sl[t]);
		} else {
			nk = pos + 1;
			for (int t = 0; t < nk; t++)
				keys[t] = lat_row(f->kv, s, f->layer, t);
		}
		float *ob = f->obar + (i * Hl + hh) * C;
		kcpu_mla_attn_head(qa, C, R, keys, nk, bf16, hp->attn_scale, sc, ob);
		struct kweight vb = kweight3_at(&L->v_b, hh);
		float *oo = f->o + i * Hl * V + hh * V;
		for (int64_t v = 0; v < V; v++)
			oo[v] =
			    kcpu_dot_row(vb.type, (const char *)vb.data + (size_t)v * vb.row_bytes, ob, C);
	}
}

/* Indexer scores of token i's keys [t0, t1) into sc (the row of all its keys). */
static void index_scores(struct fwd *f, int64_t i, int t0, int t1, float *sc, const void **keys)
{
	const struct model_hparams *hp = &f->m->hp;
	const struct model_seq *s = &f->b->seqs[f->b->seq[i]];
	int slot = hp->idx_slot[f->layer];
	for (int t = t0; t < t1; t++)
		keys[t - t0] = idx_row(f->kv, s, slot, t);
	kcpu_indexer_scores(f->qI + i * hp->idx_H * hp->idx_D, f->wI + i * hp->idx_H, hp->idx_H, hp->idx_D,
	                    keys, t1 - t0, f->kv->layout.dtype == MODEL_KV_BF16,
	                    1.0f / sqrtf((float)hp->idx_D), sc + t0);
}

/* many tokens: one task per token (scores into thread scratch, then its top-k) */
static void index_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	const void **keys = f->tkeys + (size_t)thread * (size_t)f->max_keys;
	for (int64_t i = i0; i < i1; i++) {
		int nk = f->b->pos[i] + 1;
		float *sc = f->isc ? f->isc + i * f->max_keys : f->tsc + (size_t)thread * (size_t)f->max_keys;
		index_scores(f, i, 0, nk, sc, keys);
		f->nsel[i] = kcpu_topk(sc, nk, (int)f->K, f->sel + i * f->K);
	}
}

/* few tokens (decode): the keys of each token are cut into chunks scored in parallel into the
 * token's row of isc; index_topk_task then selects per token */
#define INDEX_CHUNK 1024
static void index_chunk_task(void *user, int64_t c0, int64_t c1, int thread)
{
	struct fwd *f = user;
	const void **keys = f->tkeys + (size_t)thread * (size_t)f->max_keys;
	for (int64_t c = c0; c < c1; c++) {
		int64_t i = c / f->chunks_per_tok, ch = c % f->chunks_per_tok;
		int nk = f->b->pos[i] + 1, t0 = (int)(ch * INDEX_CHUNK);
		if (t0 < nk)
			index_scores(f, i, t0, t0 + INDEX_CHUNK < nk ? t0 + INDEX_CHUNK : nk,
			             f->isc + i * f->max_keys, keys);
	}
}

static void index_topk_task(void *user, int64_t i0, int64_t i1, int thread)
{
	struct fwd *f = user;
	(void)thread;
	for (int64_t i = i0; i < i1; i++)
		f->nsel[i] =
		    kcpu_topk(f->isc + i * f->max_keys, f->b->pos[i] + 1, (int)f->K, f->sel + i * f->K);
}

/* Experts with few tokens each run one per thread (single-thread matmuls on the thread's own
 * scratch); experts with many tokens run one after another with row-threaded matmuls. Either way
 * expert e's outputs land in ybuf rows eoff[e] .. eoff[e+1]-1, so the sum is order-independent. */
#define MOE_SMALL_ROWS 64

struct moe {
	struct model_rank *rk;
	const struct layer_w *L;
	const float *a;
	int64_t D;
	const int32_t *etok, *eoff, *list;
	float *ybuf;
	float *tscr; /* per thread: rows x (D + 2 fel) */
	int64_t rows; /* min(MOE_SMALL_ROWS, tokens in the batch) */
};

static void expert_chain(struct kpool *pool, const struct moe *mo, int64_t e, float *xs, float *t1, float *t2)
{
	int64_t D = mo->D, fel = mo->rk->fel, mt = mo->eoff[e + 1] - mo->eoff[e];
	const int32_t *et = mo->etok + mo->eoff[e];
	for (int64_t j = 0; j < mt; j++)
		memcpy(xs + j * D, mo->a + (int64_t)et[j] * D, (size_t)D * sizeof(float));
	struct kweight wg = kweight3_at(&mo->L->gate_exps, e), wu = kweight3_at(&mo->L->up_exps, e),
	               wd = kweight3_at(&mo->L->down_exps, e);
	kcpu_matmul(pool, &wg, xs, D, mt, t1, fel);
	kcpu_matmul(pool, &wu, xs, D, mt, t2, fel);
	kcpu_swiglu(t1, t1, t2, mt * fel);
	kcpu_matmul(pool, &wd, t1, fel, mt, mo->ybuf + (int64_t)mo->eoff[e] * D, D);
}

static void expert_task(void *user, int64_t i0, int64_t i1, int thread)
{
	const struct moe *mo = user;
	int64_t D = mo->D, fel = mo->rk->fel;
	float *xs = mo->tscr + (size_t)thread * (size_t)(mo->rows * (D + 2 * fel));
	float *t1 = xs + mo->rows * D, *t2 = t1 + mo->rows * fel;
	for (int64_t i = i0; i < i1; i++)
		expert_chain(mo->rk->inl[thread], mo, mo->list[i], xs, t1, t2);
}

/* ---- the rank's forward ---------------------------------------------------------------------- */
int model_rank_forward(struct model *m, struct model_rank *rk)
{
	const struct model_hparams *hp = &m->hp;
	const struct model_batch *b = rk->b;
	struct model_kv *kv = rk->kv;
	const struct model_debug *dbg = rk->rank == (m->opts.rank >= 0 ? m->opts.rank : 0) ? rk->dbg : NULL;
	int64_t n = b->n_tokens, D = hp->D, C = hp->C, R = hp->R, NR = hp->N + hp->R, Hl = rk->Hl, V = hp->V;
	int64_t HI = hp->idx_H, DI = hp->idx_D, K = hp->idx_topk, E = hp->n_expert, k = hp->n_expert_used;
	bool bf16 = kv->layout.dtype == MODEL_KV_BF16;
	int nthr = kpool_n_threads(rk->pool), rc;
	int max_keys = 1;
	for (int64_t i = 0; i < n; i++)
		if (b->pos[i] + 1 > max_keys)
			max_keys = b->pos[i] + 1;
	if (K > max_keys) /* top-k = min(K, visible keys): no row selects more than max_keys */
		K = max_keys;
	int64_t n_out = 0;
	for (int64_t i = 0; i < n; i++)
		n_out += b->logits ? b->logits[i] != 0 : i == n - 1;
	int64_t fw = rk->ffl > rk->fel ? rk->ffl : rk->fel;
	fw = fw > rk->fsl ? fw : rk->fsl;
	bool dbg_idx = dbg && dbg->indexer_cb && hp->has_indexer;

	int64_t mrows = n < MOE_SMALL_ROWS ? n : MOE_SMALL_ROWS; /* an expert has at most n tokens */
	/* scratch layout (two passes: size, then carve) */
	struct carve cv = {0};
	float *h, *a, *cq, *q, *kvl, *qabs, *obar, *o, *part, *qI = NULL, *kI = NULL, *wI = NULL, *t1, *t2,
	                                                      *rl, *wts;
	float *xs, *ys, *cs, *inv, *lg, *lgg, *dsc = NULL, *tsc, *rscr;
	int32_t *sel = NULL, *nsel = NULL, *ids, *etok, *eoff, *ppos, *elist;
	float *ewt, *ybuf, *tscr;
	const void **tkeys;
	for (int pass = 0; pass < 2; pass++) {
		h = take(&cv, (size_t)(n * D) * 4);
		a = take(&cv, (size_t)(n * D) * 4);
		cq = take(&cv, (size_t)(n * hp->Cq) * 4);
		q = take(&cv, (size_t)(n * Hl * NR) * 4);
		kvl = take(&cv, (size_t)(n * (C + R)) * 4);
		qabs = take(&cv, (size_t)(n * Hl * (C + R)) * 4);
		obar = take(&cv, (size_t)(n * Hl * C) * 4);
		o = take(&cv, (size_t)(n * Hl * V) * 4);
		part = take(&cv, (size_t)(n * D) * 4);
		if (hp->has_indexer) {
			qI = take(&cv, (size_t)(n * HI * DI) * 4);
			kI = take(&cv, (size_t)(n * DI) * 4);
			wI = take(&cv, (size_t)(n * HI) * 4);
			sel = take(&cv, (size_t)(n * K) * 4);
			nsel = take(&cv, (size_t)n * 4);
			if (dbg_idx || (n < nthr && max_keys > INDEX_CHUNK))
				dsc = take(&cv, (size_t)n * (size_t)max_keys * 4);
		}
		t1 = take(&cv, (size_t)(n * fw) * 4);
		t2 = take(&cv, (size_t)(n * fw) * 4);
		rl = take(&cv, (size_t)(n * (E > 0 ? E : 1)) * 4);
		rscr = take(&cv, (size_t)(2 * (E > 0 ? E : 1)) * 4);
		ids = take(&cv, (size_t)(n * (k > 0 ? k : 1)) * 4);
		wts = take(&cv, (size_t)(n * (k > 0 ? k : 1)) * 4);
		etok = take(&cv, (size_t)(n * (k > 0 ? k : 1)) * 4);
		ewt = take(&cv, (size_t)(n * (k > 0 ? k : 1)) * 4);
		eoff = take(&cv, (size_t)(E + 2) * 4);
		ppos = take(&cv, (size_t)(n * (k > 0 ? k : 1)) * 4);
		elist = take(&cv, (size_t)(E + 1) * 4);
		ybuf = take(&cv, (size_t)(n * (k > 0 ? k : 1) * D) * 4);
		tscr = take(&cv, E > 0 ? (size_t)nthr * (size_t)(mrows * (D + 2 * rk->fel)) * 4 : 0);
		xs = take(&cv, (size_t)(n * D) * 4);
		ys = take(&cv, (size_t)(n * D) * 4);
		cs = take(&cv, (size_t)(n * R) * 4);
		inv = take(&cv, (size_t)R * 4);
		lg = take(&cv, (size_t)(n_out * rk->vl) * 4);
		lgg = take(&cv, (size_t)(n_out * rk->vl * m->T) * 4);
		tkeys = take(&cv, (size_t)nthr * (size_t)max_keys * sizeof(void *));
		tsc = take(&cv, (size_t)nthr * (size_t)max_keys * 4);
		if (pass == 0) {
			cv.p = scratch(rk, cv.off);
			cv.off = 0;
			/* every rank must take part in every collective: agree on failure first, so a rank
			 * that could not get memory does not leave the others waiting at a barrier */
			float fail = cv.p ? 0.0f : 1.0f;
			if ((rc = tp_all_reduce_sum(&rk->comm, &fail, 1)))
				return rc;
			if (fail != 0.0f)
				return -ENOMEM;
		}
	}

	/* embeddings and RoPE tables */
	for (int64_t i = 0; i < n; i++)
		kcpu_dequant_row(m->tok_embd.type,
		                 (const char *)m->tok_embd.data +
		                     (size_t)b->tokens[i] * m->tok_embd.row_bytes,
		                 h + i * D, D);
	if (dbg && dbg->hidden_cb)
		dbg->hidden_cb(dbg->user, -1, (int)n, D, h);
	kcpu_rope_freqs(inv, R, hp->rope_theta, hp->yarn ? hp->yarn_factor : 1.0f, hp->yarn_orig_ctx,
	                hp->yarn_beta_fast, hp->yarn_beta_slow);
	for (int64_t i = 0; i < n; i++)
		kcpu_rope_cs(inv, R / 2, b->pos[i], cs + i * R);

	struct fwd f = {.m = m,
	                .rk = rk,
	                .b = b,
	                .kv = kv,
	                .q = q,
	                .cs = cs,
	                .qabs = qabs,
	                .obar = obar,
	                .o = o,
	                .qI = qI,
	                .wI = wI,
	                .sel = sel,
	                .K = K,
	                .nsel = nsel,
	                .isc = dsc,
	                .max_keys = max_keys,
	                .tkeys = tkeys,
	                .tsc = tsc};
	for (int l = 0; l < hp->n_layers; l++) {
		const struct layer_w *L = &rk->layers[l];
		f.L = L;
		f.layer = l;
		/* --- attention --- */
		kcpu_rmsnorm(a, D, h, D, L->attn_norm, D, n, hp->rms_eps);
		kcpu_matmul(rk->pool, &L->q_a, a, D, n, cq, hp->Cq);
		kcpu_rmsnorm(cq, hp->Cq, cq, hp->Cq, L->q_a_norm, hp->Cq, n, hp->latent_eps);
		kcpu_matmul(rk->pool, &L->q_b, cq, hp->Cq, n, q, Hl * NR);
		kcpu_matmul(rk->pool, &L->kv_a, a, D, n, kvl, C + R);
		kcpu_rmsnorm(kvl, C + R, kvl, C + R, L->kv_a_norm, C, n, hp->latent_eps);
		for (int64_t i = 0; i < n; i++)
			kcpu_rope(kvl + i * (C + R) + C, R, cs + i * R, hp->rope_main);
		if (rk->writes_kv)
			for (int64_t i = 0; i < n; i++)
				store(lat_row(kv, &b->seqs[b->seq[i]], l, b->pos[i]), kvl + i * (C + R),
				      C + R, bf16);
		if (L->has_idx) {
			kcpu_matmul(rk->pool, &L->idx_q_b, cq, hp->Cq, n, qI, HI * DI);
			kcpu_matmul(rk->pool, &L->idx_k, a, D, n, kI, DI);
			kcpu_layernorm(kI, DI, kI, DI, L->idx_knorm_w, L->idx_knorm_b, DI, n,
			               hp->idx_norm_eps);
			kcpu_matmul(rk->pool, &L->idx_proj, a, D, n, wI, HI);
			float ws = 1.0f / sqrtf((float)HI);
			for (int64_t i = 0; i < n; i++) {
				for (int64_t hh = 0; hh < HI; hh++) {
					kcpu_rope(qI + (i * HI + hh) * DI, R, cs + i * R, hp->rope_idx);
					wI[i * HI + hh] *= ws;
				}
				kcpu_rope(kI + i * DI, R, cs + i * R, hp->rope_idx);
			}
			if (rk->writes_kv)
				for (int64_t i = 0; i < n; i++)
					store(idx_row(kv, &b->seqs[b->seq[i]], hp->idx_slot[l], b->pos[i]),
					      kI + i * DI, DI, bf16);
		}
		if ((rc = tp_barrier(&rk->comm)))
			return rc;
		if (L->has_idx) {
			if (dsc && !dbg_idx) { /* few tokens: parallel over key chunks */
				f.chunks_per_tok = (max_keys + INDEX_CHUNK - 1) / INDEX_CHUNK;
				kpool_for(rk->pool, n * f.chunks_per_tok, 1, index_chunk_task, &f);
				kpool_for(rk->pool, n, 1, index_topk_task, &f);
			} else {
				kpool_for(rk->pool, n, 1, index_task, &f);
			}
			if (dbg_idx)
				for (int64_t i = 0; i < n; i++)
					dbg->indexer_cb(dbg->user, l, (int)i, b->pos[i], b->pos[i] + 1,
					                dsc + i * max_keys, nsel[i], sel + i * K);
		}
		f.sparse = hp->has_indexer;
		kpool_for(rk->pool, n * Hl, 1, attn_task, &f);
		kcpu_matmul(rk->pool, &L->o, o, Hl * V, n, part, D);
		if ((rc = reduce(rk, part, (size_t)(n * D))))
			return rc;
		for (int64_t i = 0; i < n * D; i++)
			h[i] += part[i];
		/* --- FFN --- */
		kcpu_rmsnorm(a, D, h, D, L->ffn_norm, D, n, hp->rms_eps);
		if (!L->moe) {
			kcpu_matmul(rk->pool, &L->ffn_gate, a, D, n, t1, rk->ffl);
			kcpu_matmul(rk->pool, &L->ffn_up, a, D, n, t2, rk->ffl);
			kcpu_swiglu(t1, t1, t2, n * rk->ffl);
			kcpu_matmul(rk->pool, &L->ffn_down, t1, rk->ffl, n, part, D);
		} else {
			kcpu_matmul(rk->pool, &L->gate_inp, a, D, n, rl, E);
			for (int64_t i = 0; i < n; i++)
				kcpu_moe_route(rl + i * E, L->exp_bias, (int)E, (int)k, hp->n_group,
				               hp->n_group_used, hp->gating_func, hp->expert_weights_norm,
				               hp->expert_weights_scale, ids + i * k, wts + i * k, rscr);
			if (dbg && dbg->moe_cb)
				dbg->moe_cb(dbg->user, l, (int)n, (int)k, ids, wts);
			memset(part, 0, (size_t)(n * D) * sizeof(float));
			/* group the (token, weight) pairs by expert (counting sort) */
			memset(eoff, 0, sizeof(int32_t) * (size_t)(E + 1));
			for (int64_t i = 0; i < n * k; i++)
				eoff[ids[i] + 1]++;
			for (int64_t e = 0; e < E; e++)
				eoff[e + 1] += eoff[e];
			for (int64_t i = 0; i < n * k; i++) {
				int32_t at = eoff[ids[i]]++;
				etok[at] = (int32_t)(i / k);
				ewt[at] = wts[i];
				ppos[i] = at;
			}
			for (int64_t e = E; e > 0; e--) /* eoff[e] was advanced to the end of e: shift back */
				eoff[e] = eoff[e - 1];
			eoff[0] = 0;
			struct moe mo = {.rk = rk,
			                 .L = L,
			                 .a = a,
			                 .D = D,
			                 .etok = etok,
			                 .eoff = eoff,
			                 .list = elist,
			                 .ybuf = ybuf,
			                 .tscr = tscr,
			                 .rows = mrows};
			int64_t n_small = 0;
			for (int64_t e = 0; e < E; e++) {
				int64_t mt = eoff[e + 1] - eoff[e];
				if (mt > 0 && mt <= MOE_SMALL_ROWS)
					elist[n_small++] = (int32_t)e;
			}
			if (n_small >= nthr && nthr > 1) /* enough experts to give every thread one */
				kpool_for(rk->pool, n_small, 1, expert_task, &mo);
			for (int64_t e = 0; e < E; e++) {
				int64_t mt = eoff[e + 1] - eoff[e];
				if (mt > 0 && (mt > MOE_SMALL_ROWS || n_small < nthr || nthr == 1))
					expert_chain(rk->pool, &mo, e, xs, t1, t2);
			}
			for (int64_t i = 0; i < n; i++)
				for (int64_t j = 0; j < k; j++) {
					int32_t at = ppos[i * k + j];
					const float *y = ybuf + (int64_t)at * D;
					float w = ewt[at];
					for (int64_t d = 0; d < D; d++)
						part[i * D + d] += w * y[d];
				}
			if (L->has_shexp) {
				kcpu_matmul(rk->pool, &L->sh_gate, a, D, n, t1, rk->fsl);
				kcpu_matmul(rk->pool, &L->sh_up, a, D, n, t2, rk->fsl);
				kcpu_swiglu(t1, t1, t2, n * rk->fsl);
				kcpu_matmul(rk->pool, &L->sh_down, t1, rk->fsl, n, ys, D);
				for (int64_t i = 0; i < n * D; i++)
					part[i] += ys[i];
			}
		}
		if ((rc = reduce(rk, part, (size_t)(n * D))))
			return rc;
		for (int64_t i = 0; i < n * D; i++)
			h[i] += part[i];
		if (dbg && dbg->hidden_cb)
			dbg->hidden_cb(dbg->user, l, (int)n, D, h);
	}

	/* final norm + lm_head (vocab slice) + gather */
	if (dbg && dbg->hidden_cb) {
		kcpu_rmsnorm(a, D, h, D, m->out_norm, D, n, hp->rms_eps);
		dbg->hidden_cb(dbg->user, hp->n_layers, (int)n, D, a);
	}
	int64_t j = 0;
	for (int64_t i = 0; i < n; i++)
		if (b->logits ? b->logits[i] != 0 : i == n - 1)
			kcpu_rmsnorm(xs + (j++) * D, D, h + i * D, D, m->out_norm, D, 1, hp->rms_eps);
	if (n_out == 0)
		return 0;
	kcpu_matmul(rk->pool, &rk->lm_head, xs, D, n_out, lg, rk->vl);
	if (m->T == 1) {
		memcpy(rk->logits, lg, (size_t)(n_out * rk->vl) * sizeof(float));
		return 0;
	}
	if ((rc = tp_all_gather(&rk->comm, lg, (size_t)(n_out * rk->vl), lgg)))
		return rc;
	if (rk->logits) /* rank 0 (or the shard rank) owns the output */
		for (int r = 0; r < m->T; r++)
			for (int64_t jj = 0; jj < n_out; jj++)
				memcpy(rk->logits + jj * hp->vocab + r * rk->vl,
				       lgg + ((size_t)r * (size_t)n_out + (size_t)jj) * (size_t)rk->vl,
				       (size_t)rk->vl * sizeof(float));
	return 0;
}
