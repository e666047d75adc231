/* model_forward: checks a batch against the model and the KV pool (every token id, position,
 * sequence index and block id, since batches come from peers and requests), then runs every local
 * rank's forward: rank 0 on the calling thread, ranks 1..T-1 on their own threads (CPU TP, and
 * CUDA TP over GPUs, where each rank thread drives its own GPU and NCCL joins them). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/model/model_internal.h"

static int check_batch(const struct model *m, const struct model_kv *kv, const struct model_batch *b,
                       struct errbuf *e)
{
	if (b->n_tokens < 1)
		return errbuf_set(e, -EINVAL, "batch: no tokens");
	if (!b->tokens || !b->seq || !b->pos || !b->seqs || b->n_seqs < 1)
		return errbuf_set(e, -EINVAL, "batch: missing arrays");
	if (kv->layout.block_bytes == 0 || !kv->base)
		return errbuf_set(e, -EINVAL, "batch: KV pool not initialised");
	struct model_kv_layout L;
	model_kv_layout_get(m, &L);
	const struct model_kv_layout *K = &kv->layout; /* field by field: padding bytes may differ */
	if (L.dtype != K->dtype || L.elt_bytes != K->elt_bytes || L.block_tokens != K->block_tokens ||
	    L.n_layers != K->n_layers || L.n_idx != K->n_idx || L.lat_dim != K->lat_dim ||
	    L.idx_dim != K->idx_dim || L.lat_layer_bytes != K->lat_layer_bytes ||
	    L.idx_layer_bytes != K->idx_layer_bytes || L.idx_offset != K->idx_offset ||
	    L.block_bytes != K->block_bytes)
		return errbuf_set(e, ERR_MISMATCH, "batch: KV pool was made for a different model layout");
	for (int s = 0; s < b->n_seqs; s++) {
		const struct model_seq *sq = &b->seqs[s];
		if (sq->n_blocks < 0 || (sq->n_blocks > 0 && !sq->blocks))
			return errbuf_set(e, -EINVAL, "batch: sequence %d has a bad block table", s);
		for (int i = 0; i < sq->n_blocks; i++)
			if (sq->blocks[i] < 0 || sq->blocks[i] >= kv->n_blocks)
				return errbuf_set(
				    e, -EINVAL,
				    "batch: sequence %d block %d = %d outside the pool (%lld blocks)", s, i,
				    sq->blocks[i], (long long)kv->n_blocks);
	}
	for (int i = 0; i < b->n_tokens; i++) {
		if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.vocab)
			return errbuf_set(e, -EINVAL,
			                  "batch: token %d has id %d outside the vocabulary (%lld)", i,
			                  b->tokens[i], (long long)m->hp.vocab);
		if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
			return errbuf_set(e, -EINVAL, "batch: token %d names sequence %d of %d", i, b->seq[i],
			                  b->n_seqs);
		int64_t cap = (int64_t)b->seqs[b->seq[i]].n_blocks * MODEL_KV_BLOCK_TOKENS;
		if (b->pos[i] < 0 || b->pos[i] >= cap || b->pos[i] >= INT32_MAX - 1)
			return errbuf_set(
			    e, -EINVAL,
			    "batch: token %d position %d outside its block table (%lld positions)", i,
			    b->pos[i], (long long)cap);
	}
	const struct model_opts *o = &m->opts;
	if (o->max_tokens > 0 && b->n_tokens > o->max_tokens)
		return errbuf_set(e, ERR_LIMIT, "batch: %d tokens, more than the configured max_tokens %d",
		                  b->n_tokens, o->max_tokens);
	if (o->max_seqs > 0 && b->n_seqs > o->max_seqs)
		return errbuf_set(e, ERR_LIMIT, "batch: %d sequences, more than the configured max_seqs %d",
		                  b->n_seqs, o->max_seqs);
	if (o->max_ctx > 0)
		for (int i = 0; i < b->n_tokens; i++)
			if (b->pos[i] >= o->max_ctx)
				return errbuf_set(
				    e, ERR_LIMIT,
				    "batch: token %d at position %d, beyond the configured max_ctx %d", i,
				    b->pos[i], o->max_ctx);
	if (kv->on_device != (m->opts.backend == MODEL_BACKEND_CUDA))
		return errbuf_set(e, ERR_MISMATCH, "batch: KV pool is %s memory, the backend is %s",
		                  kv->on_device ? "device" : "host",
		                  m->opts.backend == MODEL_BACKEND_CUDA ? "cuda" : "cpu");
	if (b->n_seqs > (1 << 24))
		return errbuf_set(e, ERR_LIMIT, "batch: %d sequences is more than 16777216", b->n_seqs);
	int32_t *last = malloc(sizeof(int32_t) * (size_t)b->n_seqs);
	if (!last)
		return errbuf_set(e, -ENOMEM, "out of memory");
	for (int s = 0; s < b->n_seqs; s++)
		last[s] = -1;
	int rc = 0;
	for (int i = 0; i < b->n_tokens && !rc; i++) {
		if (b->pos[i] <= last[b->seq[i]])
			rc = errbuf_set(
			    e, -EINVAL,
			    "batch: token %d of sequence %d at position %d does not follow position %d "
			    "(positions of a sequence must increase)",
			    i, b->seq[i], b->pos[i], last[b->seq[i]]);
		last[b->seq[i]] = b->pos[i];
	}
	free(last);
	if (rc)
		return rc;
	return 0;
}

struct worker_arg {
	struct model *m;
	int rank;
};

/* Rank r's thread: waits for a new generation, runs the rank's forward, reports done. */
static void *worker_main(void *arg)
{
	struct worker_arg wa = *(struct worker_arg *)arg;
	free(arg);
	struct rank_workers *w = wa.m->workers;
	uint64_t seen = 0;
	for (;;) {
		pthread_mutex_lock(&w->mu);
		while (w->gen == seen && !w->quit)
			pthread_cond_wait(&w->go, &w->mu);
		if (w->quit) {
			pthread_mutex_unlock(&w->mu);
			return NULL;
		}
		seen = w->gen;
		pthread_mutex_unlock(&w->mu);
		struct model_rank *rk = &wa.m->ranks[wa.rank];
		rk->rc = model_rank_forward(wa.m, rk);
		pthread_mutex_lock(&w->mu);
		w->n_done++;
		pthread_cond_signal(&w->done);
		pthread_mutex_unlock(&w->mu);
	}
}

static int workers_start(struct model *m, struct errbuf *e)
{
	struct rank_workers *w = calloc(1, sizeof(*w));
	if (!w)
		return errbuf_set(e, -ENOMEM, "out of memory");
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->go, NULL);
	pthread_cond_init(&w->done, NULL);
	m->workers = w;
	for (int r = 1; r < m->n_ranks_local; r++) {
		struct worker_arg *a = malloc(sizeof(*a));
		if (a)
			*a = (struct worker_arg){m, r};
		if (!a || pthread_create(&w->th[w->n], NULL, worker_main, a) != 0) {
			free(a);
			model_workers_stop(m);
			return errbuf_set(e, -EAGAIN, "cannot start the thread of TP rank %d", r);
		}
		w->n++;
	}
	return 0;
}

void model_workers_stop(struct model *m)
{
	struct rank_workers *w = m->workers;
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->quit = true;
	pthread_cond_broadcast(&w->go);
	pthread_mutex_unlock(&w->mu);
	for (int i = 0; i < w->n; i++)
		pthread_join(w->th[i], NULL);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->go);
	pthread_cond_destroy(&w->done);
	free(w);
	m->workers = NULL;
}

int model_forward(struct model *m, struct model_kv *kv, const struct model_batch *b, float *logits,
                  const struct model_debug *dbg, struct errbuf *e)
{
	int rc = check_batch(m, kv, b, e);
	if (rc)
		return rc;
	for (int i = 0; i < m->n_ranks_local; i++) {
		struct model_rank *rk = &m->ranks[i];
		rk->b = b;
		rk->kv = kv;
		rk->logits = i == 0 ? logits : NULL;
		rk->dbg = dbg;
		rk->rc = 0;
	}
	if (m->n_ranks_local == 1) {
		rc = model_rank_forward(m, &m->ranks[0]);
		if (rc == -EAGAIN) /* a CUDA graph capture failed before anything ran: once more, eagerly */
			rc = model_rank_forward(m, &m->ranks[0]);
		if (rc)
			return errbuf_set(e, rc, "forward failed: %s", err_name(rc));
		return 0;
	}
	if (!m->workers && (rc = workers_start(m, e)))
		return rc;
	struct rank_workers *w = m->workers;
	/* a worker that could not start would leave the others waiting at the first collective */
	TD_ASSERT(w->n == m->n_ranks_local - 1);
	/* CUDA TP: when a decode graph capture fails on any rank, every rank agrees on it and returns
	 * -EAGAIN before anything of the step ran: the step runs once more, eagerly */
	for (int attempt = 0; attempt < 2; attempt++) {
		pthread_mutex_lock(&w->mu);
		w->n_done = 0;
		w->gen++;
		pthread_cond_broadcast(&w->go);
		pthread_mutex_unlock(&w->mu);
		m->ranks[0].rc = model_rank_forward(m, &m->ranks[0]);
		pthread_mutex_lock(&w->mu);
		while (w->n_done < w->n)
			pthread_cond_wait(&w->done, &w->mu);
		pthread_mutex_unlock(&w->mu);
		bool all_again = true;
		for (int i = 0; i < m->n_ranks_local; i++)
			all_again = all_again && m->ranks[i].rc == -EAGAIN;
		if (!all_again)
			break;
	}
	for (int i = 0; i < m->n_ranks_local; i++)
		if (m->ranks[i].rc)
			return errbuf_set(e, m->ranks[i].rc, "forward failed on rank %d: %s", i,
			                  err_name(m->ranks[i].rc));
	return 0;
}
