/* The forward pass of one tensor-parallel rank (MODEL-SPEC.md §2), batched over tokens of any
 * sequences, reading and writing the paged KV cache, written once against the backend op
 * interface (backend.h): the same sequence of ops runs on the CPU and the CUDA backend. Per layer:
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

/* carve aligned pieces out of one workspace block */
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

/* The forward's workspace, carved from one block (sizing pass with base NULL). */
struct fws {
	float *h, *a, *cq, *q, *kvl, *o, *part, *qI, *kI, *wI, *t1, *t2, *wts, *xs, *cs, *lg, *lgg, *dsc;
	int32_t *sel, *nsel, *ids;
};

static size_t ws_layout(const struct model *m, const struct model_rank *rk, int64_t n, int max_keys,
                        int64_t n_out, bool dbg_idx, void *base, struct fws *w)
{
	const struct model_hparams *hp = &m->hp;
	int64_t D = hp->D, C = hp->C, R = hp->R, NR = hp->N + hp->R, Hl = rk->Hl, V = hp->V;
	int64_t HI = hp->idx_H, DI = hp->idx_D, K = hp->idx_topk, k = hp->n_expert_used;
	if (K > max_keys)
		K = max_keys;
	int64_t fw = rk->ffl > rk->fsl ? rk->ffl : rk->fsl;
	struct carve cv = {.p = base};
	memset(w, 0, sizeof(*w));
	w->h = take(&cv, (size_t)(n * D) * 4);
	w->a = take(&cv, (size_t)(n * D) * 4);
	w->cq = take(&cv, (size_t)(n * hp->Cq) * 4);
	w->q = take(&cv, (size_t)(n * Hl * NR) * 4);
	w->kvl = take(&cv, (size_t)(n * (C + R)) * 4);
	w->o = take(&cv, (size_t)(n * Hl * V) * 4);
	w->part = take(&cv, (size_t)(n * D) * 4);
	if (hp->has_indexer) {
		w->qI = take(&cv, (size_t)(n * HI * DI) * 4);
		w->kI = take(&cv, (size_t)(n * DI) * 4);
		w->wI = take(&cv, (size_t)(n * HI) * 4);
		w->sel = take(&cv, (size_t)(n * K) * 4);
		w->nsel = take(&cv, (size_t)n * 4);
		if (dbg_idx)
			w->dsc = take(&cv, (size_t)n * (size_t)max_keys * 4);
	}
	w->t1 = take(&cv, (size_t)(n * fw) * 4);
	w->t2 = take(&cv, (size_t)(n * fw) * 4);
	if (hp->n_expert > 0) {
		w->ids = take(&cv, (size_t)(n * k) * 4);
		w->wts = take(&cv, (size_t)(n * k) * 4);
	}
	w->xs = take(&cv, (size_t)(n_out * D) * 4);
	w->cs = take(&cv, (size_t)(n * R) * 4);
	w->lg = take(&cv, (size_t)(n_out * rk->vl) * 4);
	w->lgg = take(&cv, (size_t)(n_out * rk->vl * m->T) * 4);
	return cv.off;
}

/* products of one x (same n_in): one backend call where the backend has matmul_n (CUDA: one
 * launch), else matmul per weight in order */
static void matmul_n(const struct model_backend_ops *be, void *bc, int n_w, const struct kweight *const *w,
                     const float *x, int64_t ldx, int64_t n_tok, float *const *y, const int64_t *n_out)
{
	if (be->matmul_n && n_w > 1) {
		be->matmul_n(bc, n_w, w, x, ldx, n_tok, y, n_out);
		return;
	}
	for (int i = 0; i < n_w; i++)
		be->matmul(bc, w[i], x, ldx, n_tok, y[i], n_out[i]);
}

size_t model_rank_ws_bytes(const struct model *m, const struct model_rank *rk, int64_t n, int max_keys,
                           int64_t n_out, bool dbg_idx)
{
	struct fws w;
	return ws_layout(m, rk, n, max_keys, n_out, dbg_idx, NULL, &w);
}

int model_rank_forward(struct model *m, struct model_rank *rk)
{
	const struct model_hparams *hp = &m->hp;
	const struct model_batch *b = rk->b;
	const struct model_backend_ops *be = rk->be.ops;
	void *bc = rk->be.ctx;
	const struct model_debug *dbg = rk->rank == (m->opts.rank >= 0 ? m->opts.rank : 0) ? rk->dbg : NULL;
	int64_t n = b->n_tokens, D = hp->D, C = hp->C, R = hp->R, NR = hp->N + hp->R, Hl = rk->Hl, V = hp->V;
	int64_t HI = hp->idx_H, DI = hp->idx_D, K = hp->idx_topk, k = hp->n_expert_used;
	int rc;
	int max_keys = 1;
	for (int64_t i = 0; i < n; i++)
		if (b->pos[i] + 1 > max_keys)
			max_keys = b->pos[i] + 1;
	if (K > max_keys) /* top-k = min(K, visible keys): no row selects more than max_keys */
		K = max_keys;
	int64_t n_out = 0;
	for (int64_t i = 0; i < n; i++)
		n_out += b->logits ? b->logits[i] != 0 : i == n - 1;
	int32_t *out_rows = malloc(sizeof(int32_t) * (size_t)(n_out > 0 ? n_out : 1));
	struct mbe_step st = {.n = n,
	                      .n_real = n,
	                      .max_keys = max_keys,
	                      .K = K,
	                      .n_out = n_out,
	                      .n_out_pad = n_out,
	                      .out_rows_host = out_rows,
	                      .debug = dbg != NULL};
	if (out_rows)
		for (int64_t i = 0, j = 0; i < n; i++)
			if (b->logits ? b->logits[i] != 0 : i == n - 1)
				out_rows[j++] = (int32_t)i;
	/* a backend may compute more rows / keys than the batch has (CUDA graphs: fixed shapes per
	 * bucket); the real rows come first and only they are copied out */
	if (be->plan)
		be->plan(bc, b, &st);
	n = st.n;
	max_keys = st.max_keys;
	K = st.K;
	int64_t n_out_c = st.n_out_pad;
	bool dbg_idx = dbg && dbg->indexer_cb && hp->has_indexer;

	/* workspace: size, agree that every rank has it, carve */
	struct fws w;
	size_t ws_bytes = ws_layout(m, rk, n, max_keys, n_out_c, dbg_idx, NULL, &w);
	void *wsp = be->ws(bc, ws_bytes);
	{
		/* every rank must take part in every collective: agree on failure first, so a rank
		 * that could not get memory does not leave the others waiting at a barrier */
		float fail = wsp && out_rows && be->begin(bc, b, rk->kv, &st) == 0 ? 0.0f : 1.0f;
		if ((rc = tp_all_reduce_sum(&rk->comm, &fail, 1))) {
			free(out_rows);
			return rc;
		}
		if (fail != 0.0f) {
			free(out_rows);
			return wsp && out_rows ? ERR_LIMIT : -ENOMEM;
		}
	}
	ws_layout(m, rk, n, max_keys, n_out_c, dbg_idx, wsp, &w);
	float *h = w.h, *a = w.a, *cq = w.cq, *q = w.q, *kvl = w.kvl, *o = w.o, *part = w.part, *qI = w.qI,
	      *kI = w.kI, *wI = w.wI, *t1 = w.t1, *t2 = w.t2, *wts = w.wts, *xs = w.xs, *cs = w.cs,
	      *lg = w.lg, *lgg = w.lgg, *dsc = w.dsc;
	int32_t *sel = w.sel, *nsel = w.nsel, *ids = w.ids;
	const struct mbe_weights *W = be->weights(bc);
	/* every row an output row (decode steps, graphs included): the last layer's add and the final
	 * norm in one op into xs, the lm_head's input, without the row gather. Only backends with the
	 * parts-making norm (add_rmsnorm_q: CUDA, whose one-token output head reads them), and not
	 * under the hidden-state hook, which reads h before the norm */
	const bool tail_fused =
	    be->add_rmsnorm_q && !(dbg && dbg->hidden_cb) && n_out > 0 && n_out == st.n_real && n_out_c == n;

	/* embeddings and RoPE tables */
	be->embed(bc, h, D);
	if (dbg && dbg->hidden_cb)
		dbg->hidden_cb(dbg->user, -1, (int)n, D, be->host_view(bc, h, (size_t)(n * D) * 4));
	be->rope_tables(bc, cs, R);

	for (int l = 0; l < hp->n_layers; l++) {
		const struct layer_w *L = &W->layers[l];
		/* --- attention --- (the products of `a` first, then the latents' norms, RoPE and KV
		 * write in one fused op, then the products of c_q and the indexer's inputs in one: the
		 * same values as norm-after-each-product, in fewer launches) */
		if (l == 0) /* later layers: fused into the previous layer's last add */
			be->rmsnorm(bc, a, D, h, D, L->attn_norm, D, n, hp->rms_eps);
		{ /* the products of `a`, then those of c_q: one backend call each (matmul_n) */
			const struct kweight *mw[4] = {&L->q_a, &L->kv_a, &L->idx_k, &L->idx_proj};
			float *const my[4] = {cq, kvl, kI, wI};
			const int64_t mo[4] = {hp->Cq, C + R, DI, HI};
			matmul_n(be, bc, L->has_idx ? 4 : 2, mw, a, D, n, my, mo);
		}
		be->mla_latent(bc, l, L, cq, kvl, cs, rk->writes_kv);
		/* the query path (q_b, absorb, rope: reads cq, writes q and the backend's absorbed q) is
		 * independent of the indexer's (reads cq, kI, wI; writes qI, sel, nsel): a side branch
		 * where the backend can overlap them, joined before the attention. q_b and idx_q_b
		 * (both read cq) go first as one call when the backend runs that as one launch
		 * (matmul_n_fused; the CPU backend has no branch: one call in order); else q_b opens the
		 * branch and idx_q_b stays on the main path. */
		const bool par =
		    L->has_idx && be->branch_begin && be->branch_end && be->branch_join && be->mla_q;
		const bool qb_n =
		    L->has_idx && be->matmul_n && (!par || (be->matmul_n_fused && be->matmul_n_fused(bc, n)));
		if (qb_n) {
			const struct kweight *mw[2] = {&L->q_b, &L->idx_q_b};
			float *const my[2] = {q, qI};
			const int64_t mo[2] = {Hl * NR, HI * DI};
			matmul_n(be, bc, 2, mw, cq, hp->Cq, n, my, mo);
		}
		if (par)
			be->branch_begin(bc);
		if (!qb_n)
			be->matmul(bc, &L->q_b, cq, hp->Cq, n, q, Hl * NR);
		if (par) {
			be->mla_q(bc, l, L, q, cs);
			be->branch_end(bc);
		}
		if (L->has_idx) {
			if (!qb_n)
				be->matmul(bc, &L->idx_q_b, cq, hp->Cq, n, qI, HI * DI);
			be->idx_prep(bc, l, L, qI, kI, wI, cs, rk->writes_kv);
		}
		if ((rc = be->barrier(bc)))
			goto out;
		if (L->has_idx) {
			be->indexer(bc, l, qI, wI, sel, nsel, dsc);
			if (dbg_idx) {
				const float *hs = be->host_view(bc, dsc, (size_t)n * (size_t)max_keys * 4);
				float *sc_h = malloc((size_t)n * (size_t)max_keys * 4);
				int32_t *sel_h = malloc((size_t)(n * K + n) * 4);
				if (!sc_h || !sel_h) {
					free(sc_h);
					free(sel_h);
					rc = -ENOMEM;
					goto out;
				}
				memcpy(sc_h, hs, (size_t)n * (size_t)max_keys * 4);
				memcpy(sel_h, be->host_view(bc, sel, (size_t)(n * K) * 4),
				       (size_t)(n * K) * 4);
				memcpy(sel_h + n * K, be->host_view(bc, nsel, (size_t)n * 4), (size_t)n * 4);
				for (int64_t i = 0; i < n; i++)
					dbg->indexer_cb(dbg->user, l, (int)i, b->pos[i], b->pos[i] + 1,
					                sc_h + i * max_keys, sel_h[n * K + i], sel_h + i * K);
				free(sc_h);
				free(sel_h);
			}
		}
		if (par)
			be->branch_join(bc);
		be->mla_attn(bc, l, L, q, cs, hp->has_indexer ? sel : NULL, hp->has_indexer ? nsel : NULL, o);
		be->matmul(bc, &L->o, o, Hl * V, n, part, D);
		if ((rc = be->all_reduce(bc, part, (size_t)(n * D))))
			goto out;
		/* --- FFN --- */
		if (L->moe && be->add_rmsnorm_q)
			be->add_rmsnorm_q(bc, h, part, a, L->ffn_norm, D, n, hp->rms_eps);
		else
			be->add_rmsnorm(bc, h, part, a, L->ffn_norm, D, n, hp->rms_eps);
		if (!L->moe) {
			const struct kweight *mw[2] = {&L->ffn_gate, &L->ffn_up};
			float *const my[2] = {t1, t2};
			const int64_t mo[2] = {rk->ffl, rk->ffl};
			matmul_n(be, bc, 2, mw, a, D, n, my, mo);
			be->swiglu(bc, t1, t1, t2, n * rk->ffl);
			be->matmul(bc, &L->ffn_down, t1, rk->ffl, n, part, D);
		} else {
			be->moe(bc, L, a, part, ids, wts);
			if (dbg && dbg->moe_cb) {
				int32_t *ids_h = malloc((size_t)(n * k) * 8);
				if (!ids_h) {
					rc = -ENOMEM;
					goto out;
				}
				memcpy(ids_h, be->host_view(bc, ids, (size_t)(n * k) * 4),
				       (size_t)(n * k) * 4);
				float *wts_h = (float *)(ids_h + n * k);
				memcpy(wts_h, be->host_view(bc, wts, (size_t)(n * k) * 4),
				       (size_t)(n * k) * 4);
				dbg->moe_cb(dbg->user, l, (int)n, (int)k, ids_h, wts_h);
				free(ids_h);
			}
		}
		if ((rc = be->all_reduce(bc, part, (size_t)(n * D))))
			goto out;
		if (l + 1 < hp->n_layers) /* with the next layer's attention norm (its products next) */
			(be->add_rmsnorm_q ? be->add_rmsnorm_q : be->add_rmsnorm)(
			    bc, h, part, a, W->layers[l + 1].attn_norm, D, n, hp->rms_eps);
		else if (tail_fused)
			be->add_rmsnorm_q(bc, h, part, xs, W->out_norm, D, n, hp->rms_eps);
		else
			be->add(bc, h, part, n * D);
		if (dbg && dbg->hidden_cb)
			dbg->hidden_cb(dbg->user, l, (int)n, D, be->host_view(bc, h, (size_t)(n * D) * 4));
	}

	/* final norm + lm_head (vocab slice) + gather */
	if (dbg && dbg->hidden_cb) {
		be->rmsnorm(bc, a, D, h, D, W->out_norm, D, n, hp->rms_eps);
		dbg->hidden_cb(dbg->user, hp->n_layers, (int)n, D, be->host_view(bc, a, (size_t)(n * D) * 4));
	}
	rc = 0;
	if (n_out == 0)
		goto out;
	if (!tail_fused) {
		be->gather_rows(bc, a, h, D, out_rows, n_out_c);
		be->rmsnorm(bc, xs, D, a, D, W->out_norm, D, n_out_c, hp->rms_eps);
	}
	be->matmul(bc, W->lm_head, xs, D, n_out_c, lg, rk->vl);
	if (m->T == 1) {
		rc = be->to_host(bc, rk->logits, lg, (size_t)(n_out * rk->vl) * sizeof(float));
		goto out;
	}
	if ((rc = be->all_gather(bc, lg, (size_t)(n_out_c * rk->vl), lgg)))
		goto out;
	if (rk->logits) /* rank 0 (or the shard rank) owns the output: rank r's rows go to column r * vl */
		for (int r = 0; r < m->T && !rc; r++) {
			const float *src = lgg + (size_t)r * (size_t)n_out_c * (size_t)rk->vl;
			float *dst = rk->logits + r * rk->vl;
			const size_t wb = (size_t)rk->vl * sizeof(float);
			if (be->to_host_2d) /* one copy per rank, not a synchronised copy (~10 us) per row */
				rc = be->to_host_2d(bc, dst, (size_t)hp->vocab * sizeof(float), src, wb, wb,
				                    (size_t)n_out);
			else
				for (int64_t jj = 0; jj < n_out && !rc; jj++)
					rc = be->to_host(bc, dst + jj * hp->vocab,
					                 src + (size_t)jj * (size_t)rk->vl, wb);
		}
out:
	free(out_rows);
	return rc;
}
