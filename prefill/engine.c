/* Prefill engine thread (see engine.h): chunked prefill across requests with a per-step token
 * budget, over a local paged KV pool, glued to the model core (common/model/model.h) or to the
 * trivial engine. Each step:
 *   1. take new jobs from the inbox; drop cancelled / expired ones (their local blocks return);
 *   2. admit pending jobs while local blocks and batch slots last (FIFO: no job overtakes an
 *      older one that is waiting for blocks, so long prompts cannot starve);
 *   3. fill the step with up to max_tokens_per_step prompt tokens, oldest job first;
 *   4. run the forward (the model writes the chunk's KV into the local blocks);
 *   5. push every block that became complete; finished jobs sample their first token, push their
 *      last partial block, flush (remote completion) and go to the outbox.
 * Blocks are pushed while later chunks are still being computed, so the transfer of a long
 * prompt overlaps its prefill. */
#include "prefill/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/log.h"
#include "common/model/model.h"
#include "common/net/trivial.h"

struct pf_engine {
	struct pf_engine_opts o;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct pf_job *inbox, *inbox_tail; /* mu */
	struct pf_job *outbox, *outbox_tail; /* mu */
	bool stop; /* mu */
	uv_async_t async;
	_Atomic uint64_t alive_ns;

	/* engine thread only */
	struct pf_job *pending, *pending_tail;
	struct pf_job *active[256];
	uint32_t n_active;
	int32_t *free_blocks;
	uint32_t n_free;
	struct model_kv kv; /* model engine */
	uint8_t *staging; /* staged KV: pinned host copy of kv that UCX puts from (owned) */
	size_t staging_bytes;
	bool staging_pinned;
	int attach_rc; /* model_thread_attach of the engine thread (its forwards fail if not 0) */
	uint8_t *pool; /* trivial engine */
	size_t block_bytes;
	uint32_t block_tokens;
	struct kvx_region *local_region;
	struct pf_push_ctx push;
	struct msg_kv_layout layout;
	uint32_t vocab;
	uint32_t max_seq_len;
	struct sample_work sw;
	/* batch scratch */
	int32_t *b_tokens, *b_seq, *b_pos;
	uint8_t *b_logits;
	struct model_seq *b_seqs;
	float *logits;
	uint32_t n_logit_rows_max;
};

void pf_job_free(struct pf_job *j)
{
	if (!j)
		return;
	free(j->tokens);
	free(j->ucx_addr);
	free(j->rkey);
	free(j->block_ids);
	free(j->local_blocks);
	free(j->checksums);
	free(j);
}

static uint64_t now_ms(void)
{
	return uv_hrtime() / 1000000u;
}

/* ---- queues ---------------------------------------------------------------------------------- */

static void push_tail(struct pf_job **h, struct pf_job **t, struct pf_job *j)
{
	j->next = NULL;
	if (*t)
		(*t)->next = j;
	else
		*h = j;
	*t = j;
}

void pf_engine_submit(struct pf_engine *g, struct pf_job *j)
{
	j->t_submit_ns = uv_hrtime();
	pthread_mutex_lock(&g->mu);
	push_tail(&g->inbox, &g->inbox_tail, j);
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* engine thread: hand a finished job to the loop thread */
static void complete(struct pf_engine *g, struct pf_job *j)
{
	if (j->local_blocks) {
		for (uint32_t i = 0; i < j->n_local; i++)
			g->free_blocks[g->n_free++] = j->local_blocks[i];
		free(j->local_blocks);
		j->local_blocks = NULL;
		j->n_local = 0;
	}
	/* a job that leaves with blocks in flight must not leave puts behind that land later */
	if (j->status && j->peer_id) {
		struct pf_job tmp = *j;
		(void)pf_push_finish(&g->push, &tmp);
	}
	/* every put of the job has reached the decode worker (or its endpoint is closed): fence */
	pf_push_fence(&g->push, j);
	pthread_mutex_lock(&g->mu);
	push_tail(&g->outbox, &g->outbox_tail, j);
	pthread_mutex_unlock(&g->mu);
	uv_async_send(&g->async);
}

static void fail_job(struct pf_engine *g, struct pf_job *j, int status, int code, const char *msg)
{
	j->status = status;
	j->err_code = code;
	snprintf(j->err_msg, sizeof(j->err_msg), "%.200s", msg);
	complete(g, j);
}

static void async_cb(uv_async_t *a)
{
	struct pf_engine *g = a->data;
	pthread_mutex_lock(&g->mu);
	struct pf_job *list = g->outbox;
	g->outbox = g->outbox_tail = NULL;
	pthread_mutex_unlock(&g->mu);
	while (list) {
		struct pf_job *n = list->next;
		g->o.done_cb(list, g->o.ud);
		list = n;
	}
}

/* ---- one step ------------------------------------------------------------------------------- */

static bool should_drop(struct pf_engine *g, struct pf_job *j, uint64_t now)
{
	if (atomic_load(&j->cancelled)) {
		fail_job(g, j, ERR_CANCELLED, MSG_ERR_CANCELLED, "cancelled");
		return true;
	}
	if (j->deadline_ms && now > j->deadline_ms) {
		fail_job(g, j, ERR_TIMEOUT, MSG_ERR_TIMEOUT, "prefill deadline passed");
		return true;
	}
	return false;
}

static void admit(struct pf_engine *g)
{
	uint64_t now = now_ms();
	/* drop cancelled/expired from pending and active */
	for (struct pf_job **pp = &g->pending; *pp;) {
		struct pf_job *j = *pp;
		if (atomic_load(&j->cancelled) || (j->deadline_ms && now > j->deadline_ms)) {
			*pp = j->next;
			if (g->pending_tail == j) {
				g->pending_tail = NULL;
				for (struct pf_job *k = g->pending; k; k = k->next)
					g->pending_tail = k;
			}
			should_drop(g, j, now);
			continue;
		}
		pp = &j->next;
	}
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->n_active; i++)
		if (!should_drop(g, g->active[i], now))
			g->active[k++] = g->active[i];
	g->n_active = k;
	/* admit in order while blocks last */
	while (g->pending && g->n_active < g->o.max_batch && g->n_active < 256) {
		struct pf_job *j = g->pending;
		uint32_t need = (j->n_tokens + g->block_tokens - 1) / g->block_tokens;
		if (need > g->n_free) {
			if (need > g->o.n_local_blocks) {
				g->pending = j->next;
				if (!g->pending)
					g->pending_tail = NULL;
				fail_job(g, j, ERR_LIMIT, MSG_ERR_INVALID_REQUEST,
				         "prompt needs more KV blocks than this prefill worker has");
				continue;
			}
			break;
		}
		g->pending = j->next;
		if (!g->pending)
			g->pending_tail = NULL;
		j->local_blocks = malloc(need * sizeof(int32_t));
		if (!j->local_blocks) {
			fail_job(g, j, -ENOMEM, MSG_ERR_INTERNAL, "out of memory");
			continue;
		}
		for (uint32_t i = 0; i < need; i++)
			j->local_blocks[i] = g->free_blocks[--g->n_free];
		j->n_local = need;
		j->t_start_ns = uv_hrtime();
		g->active[g->n_active++] = j;
	}
}

static void sample_first(struct pf_engine *g, struct pf_job *j, const float *row)
{
	if (!g->o.model) {
		j->first.id = trivial_first_token(j->tokens, j->n_tokens);
		j->first.logprob = 0;
		return;
	}
	struct sample_params sp;
	sample_params_default(&sp);
	sp.greedy = j->sampling.temperature <= 0;
	sp.temperature = j->sampling.temperature > 0 ? j->sampling.temperature : 1;
	sp.top_k = (int)j->sampling.top_k;
	sp.top_p = j->sampling.top_p > 0 ? j->sampling.top_p : 1;
	sp.min_p = j->sampling.min_p;
	sp.presence_penalty = j->sampling.presence_penalty;
	sp.frequency_penalty = j->sampling.frequency_penalty;
	sp.n_logprobs = j->sampling.logprobs ? (int)j->sampling.n_logprobs : 0;
	struct sample_rng rng;
	sample_rng_seed(&rng, j->sampling.seed);
	struct sample_result r;
	struct errbuf e = {0};
	if (sample_token(&sp, &rng, &g->sw, row, g->vocab, NULL, 0, &r, &e)) {
		j->status = -EINVAL;
		j->err_code = MSG_ERR_INVALID_REQUEST;
		snprintf(j->err_msg, sizeof(j->err_msg), "sampling: %.200s", e.msg);
		return;
	}
	j->first.id = (uint32_t)r.token;
	j->first.logprob = r.logprob > 0 ? 0 : r.logprob;
	if (j->sampling.logprobs) {
		j->first.n_top = (uint32_t)r.n_top;
		for (int i = 0; i < r.n_top && i < MSG_TOP_LOGPROBS_MAX; i++) {
			j->first.top_ids[i] = (uint32_t)r.top_ids[i];
			j->first.top_logprobs[i] = r.top_logprobs[i] > 0 ? 0 : r.top_logprobs[i];
		}
	}
}

/* Puts local blocks up to `upto`. Staged KV: the blocks not yet put are first copied from the
 * model's pool into the host staging copy (a block is put only once it is complete, so it does not
 * change after the copy). Returns j->status. */
static int push_upto(struct pf_engine *g, struct pf_job *j, uint32_t upto)
{
	if (g->staging && upto > j->n_pushed && upto <= j->n_local) {
		struct errbuf e = {0};
		uint64_t t0 = uv_hrtime();
		int rc = model_kv_download(&g->kv, g->staging, j->local_blocks + j->n_pushed,
		                           (int)(upto - j->n_pushed), &e);
		metrics_observe(g->o.metrics.stage_seconds, (double)(uv_hrtime() - t0) / 1e9);
		if (rc) {
			LOG_ERROR("engine", "rid=%llu KV download to the staging copy failed: %s",
			          (unsigned long long)j->rid, e.msg);
			j->status = rc;
			j->err_code = MSG_ERR_INTERNAL;
			snprintf(j->err_msg, sizeof(j->err_msg), "KV staging: %.200s", e.msg);
			return rc;
		}
	}
	return pf_push_blocks(&g->push, j, upto);
}

static void finish_job(struct pf_engine *g, struct pf_job *j, const float *row)
{
	sample_first(g, j, row);
	if (!j->status)
		push_upto(g, j, j->n_local);
	if (!j->status)
		pf_push_finish(&g->push, j);
	j->prefill_us = (uint32_t)((uv_hrtime() - j->t_start_ns) / 1000u);
	if (!j->status) {
		metrics_add(g->o.metrics.kv_bytes, (double)j->kv_bytes);
		metrics_observe(g->o.metrics.transfer_seconds, j->transfer_us / 1e6);
	}
	complete(g, j);
}

static int step(struct pf_engine *g)
{
	uint32_t budget = g->o.max_tokens_per_step;
	uint32_t n = 0, n_rows = 0;
	uint32_t take[256] = {0};
	int32_t row_of[256];
	/* 3. fill the step. Every active job's block table goes into the batch, also of jobs that get
	 * no tokens this step (the model checks every table it is given). */
	for (uint32_t s = 0; s < g->n_active; s++) {
		g->b_seqs[s].blocks = g->active[s]->local_blocks;
		g->b_seqs[s].n_blocks = (int)g->active[s]->n_local;
		row_of[s] = -1;
	}
	for (uint32_t s = 0; s < g->n_active && budget > 0; s++) {
		struct pf_job *j = g->active[s];
		uint32_t left = j->n_tokens - j->n_done;
		uint32_t t = left < budget ? left : budget;
		take[s] = t;
		budget -= t;
		for (uint32_t i = 0; i < t; i++) {
			g->b_tokens[n] = (int32_t)j->tokens[j->n_done + i];
			g->b_seq[n] = (int32_t)s;
			g->b_pos[n] = (int32_t)(j->n_done + i);
			g->b_logits[n] = 0;
			n++;
		}
		if (t > 0 && j->n_done + t == j->n_tokens) {
			g->b_logits[n - 1] = 1;
			row_of[s] = (int32_t)n_rows++;
		}
	}
	if (n == 0)
		return 0;
	uint64_t t0 = uv_hrtime();
	/* 4. forward */
	if (g->o.model) {
		struct model_batch b = {.n_tokens = (int)n,
		                        .tokens = g->b_tokens,
		                        .seq = g->b_seq,
		                        .pos = g->b_pos,
		                        .logits = g->b_logits,
		                        .n_seqs = (int)g->n_active,
		                        .seqs = g->b_seqs};
		struct errbuf e = {0};
		int rc = g->attach_rc
		             ? errbuf_set(&e, g->attach_rc, "engine thread cannot run the model")
		             : model_forward(g->o.model, &g->kv, &b, n_rows ? g->logits : NULL, NULL, &e);
		if (rc) {
			/* inputs were validated when the request arrived: a failure here fails the step's
			 * jobs */
			LOG_ERROR("engine", "prefill forward failed: %s", e.msg);
			for (uint32_t s = 0; s < g->n_active; s++)
				if (take[s])
					fail_job(g, g->active[s], rc, MSG_ERR_INTERNAL, e.msg);
			uint32_t k = 0;
			for (uint32_t s = 0; s < g->n_active; s++)
				if (!take[s])
					g->active[k++] = g->active[s];
			g->n_active = k;
			return 0;
		}
	} else {
		for (uint32_t s = 0; s < g->n_active; s++) {
			struct pf_job *j = g->active[s];
			if (!take[s])
				continue;
			uint8_t *blocks[4096];
			uint32_t nb = j->n_local < 4096 ? j->n_local : 4096;
			for (uint32_t i = 0; i < nb; i++)
				blocks[i] = g->pool + (size_t)j->local_blocks[i] * g->block_bytes;
			j->hash =
			    trivial_write_kv(blocks, j->tokens + j->n_done, take[s], j->n_done, j->hash);
		}
		if (g->o.trivial_step_us) {
			struct timespec ts = {.tv_sec = g->o.trivial_step_us / 1000000u,
			                      .tv_nsec = (long)(g->o.trivial_step_us % 1000000u) * 1000};
			nanosleep(&ts, NULL);
		}
	}
	metrics_observe(g->o.metrics.step_seconds, (double)(uv_hrtime() - t0) / 1e9);
	metrics_add(g->o.metrics.tokens, n);
	/* 5. push completed blocks, finish completed jobs */
	uint32_t k = 0;
	for (uint32_t s = 0; s < g->n_active; s++) {
		struct pf_job *j = g->active[s];
		j->n_done += take[s];
		if (j->n_done == j->n_tokens) {
			finish_job(g, j, row_of[s] >= 0 ? g->logits + (size_t)row_of[s] * g->vocab : NULL);
			continue;
		}
		if (take[s] && push_upto(g, j, j->n_done / g->block_tokens)) {
			complete(g, j);
			continue;
		}
		g->active[k++] = j;
	}
	g->n_active = k;
	return 1;
}

static void *engine_main(void *arg)
{
	struct pf_engine *g = arg;
	if (g->o.model) {
		struct errbuf e = {0};
		if ((g->attach_rc = model_thread_attach(g->o.model, &e)))
			LOG_ERROR("engine", "%s: every prefill step will fail", e.msg);
	}
	for (;;) {
		atomic_store(&g->alive_ns, uv_hrtime());
		pthread_mutex_lock(&g->mu);
		while (!g->stop && !g->inbox && !g->pending && g->n_active == 0) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200 * 1000000L; /* wake up now and then: liveness for the watchdog */
			if (ts.tv_nsec >= 1000000000L)
				ts.tv_sec++, ts.tv_nsec -= 1000000000L;
			pthread_cond_timedwait(&g->cv, &g->mu, &ts);
			atomic_store(&g->alive_ns, uv_hrtime());
		}
		bool stop = g->stop;
		struct pf_job *in = g->inbox;
		g->inbox = g->inbox_tail = NULL;
		pthread_mutex_unlock(&g->mu);
		while (in) {
			struct pf_job *nx = in->next;
			if (in->fence_only)
				complete(g, in); /* a refused request: only its fence (see engine.h) */
			else
				push_tail(&g->pending, &g->pending_tail, in);
			in = nx;
		}
		if (stop) {
			for (uint32_t s = 0; s < g->n_active; s++)
				fail_job(g, g->active[s], ERR_CANCELLED, MSG_ERR_DRAINING,
				         "prefill worker stopping");
			g->n_active = 0;
			while (g->pending) {
				struct pf_job *j = g->pending;
				g->pending = j->next;
				fail_job(g, j, ERR_CANCELLED, MSG_ERR_DRAINING, "prefill worker stopping");
			}
			g->pending_tail = NULL;
			return NULL;
		}
		admit(g);
		step(g);
	}
}

/* ---- set-up ---------------------------------------------------------------------------------- */

static int layout_from_model(struct pf_engine *g, struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(g->o.model);
	struct model_kv_layout L;
	model_kv_layout_get(g->o.model, &L);
	struct msg_kv_layout *l = &g->layout;
	memset(l, 0, sizeof(*l));
	snprintf(l->arch, sizeof(l->arch), "%s", model_arch_name(hp->arch));
	l->n_layers = (uint32_t)L.n_layers;
	l->block_size = (uint32_t)L.block_tokens;
	l->latent_dim = (uint32_t)hp->C;
	l->rope_dim = (uint32_t)hp->R;
	l->n_indexer_layers = (uint32_t)L.n_idx;
	l->indexer_dim = (uint32_t)L.idx_dim;
	l->dtype = L.dtype == MODEL_KV_BF16 ? MSG_KV_BF16 : MSG_KV_F32;
	l->indexer_dtype = L.n_idx ? l->dtype : MSG_KV_NONE;
	l->block_bytes = L.block_bytes;
	l->fingerprint = model_kv_fingerprint_hash(g->o.model);
	g->block_bytes = L.block_bytes;
	g->block_tokens = (uint32_t)L.block_tokens;
	g->vocab = (uint32_t)hp->vocab;
	g->max_seq_len =
	    (uint32_t)(hp->n_ctx_train > 0 && hp->n_ctx_train < INT32_MAX ? hp->n_ctx_train : INT32_MAX);
	if (g->o.max_seq_len && g->o.max_seq_len < g->max_seq_len)
		g->max_seq_len = g->o.max_seq_len;
	int rc = model_kv_init(&g->kv, g->o.model, g->o.n_local_blocks, NULL, 0, e);
	if (rc)
		return rc;
	g->push.local_base = g->kv.base;
	if (g->o.kv_staged || g->kv.on_device) {
		/* UCX puts from host memory (Debian's UCX has no CUDA transports): a page-locked host copy
		 * of the local pool, the same block ids */
		g->staging_bytes = ((size_t)g->o.n_local_blocks * L.block_bytes + 4095) & ~(size_t)4095;
		g->staging = aligned_alloc(4096, g->staging_bytes);
		if (!g->staging)
			return errbuf_set(e, -ENOMEM, "out of memory for the %zu-byte KV staging copy",
			                  g->staging_bytes);
		memset(g->staging, 0, g->staging_bytes); /* touch every page now, not while serving */
		struct errbuf pe = {0};
		if (model_host_pin(g->o.model, g->staging, g->staging_bytes, &pe))
			LOG_WARN("prefill", "%s: KV downloads from the device will be slower", pe.msg);
		else
			g->staging_pinned = g->kv.on_device;
		g->push.local_base = g->staging;
		LOG_INFO("prefill",
		         "KV staged: model pool of %u blocks in %s memory, copied to a %.1f MiB %shost "
		         "staging copy before each put",
		         g->o.n_local_blocks, g->kv.on_device ? "device" : "host",
		         g->staging_bytes / 1048576.0, g->staging_pinned ? "pinned " : "");
	}
	return sample_work_init(&g->sw, hp->vocab) ? errbuf_set(e, -ENOMEM, "out of memory (sampling)") : 0;
}

int pf_engine_create(const struct pf_engine_opts *o, struct pf_engine **out, struct errbuf *e)
{
	int rc;
	struct pf_engine *g = calloc(1, sizeof(*g));
	if (!g)
		return errbuf_set(e, -ENOMEM, "out of memory");
	g->o = *o;
	if (!g->o.max_batch || g->o.max_batch > 256)
		g->o.max_batch = 256;
	if (!g->o.max_tokens_per_step)
		g->o.max_tokens_per_step = 2048;
	if (!g->o.flush_timeout_ms)
		g->o.flush_timeout_ms = 10000;
	if (!g->o.n_local_blocks)
		g->o.n_local_blocks = 256;
	if (o->model) {
		if ((rc = layout_from_model(g, e)))
			goto fail;
	} else {
		trivial_layout(&g->layout);
		g->block_bytes = TRIVIAL_BLOCK_BYTES;
		g->block_tokens = TRIVIAL_BLOCK_TOKENS;
		g->vocab = TRIVIAL_VOCAB;
		g->max_seq_len = 4096u * TRIVIAL_BLOCK_TOKENS; /* what one step's block list covers */
		g->pool = aligned_alloc(64, (size_t)g->o.n_local_blocks * g->block_bytes);
		if (!g->pool) {
			rc = errbuf_set(e, -ENOMEM, "out of memory for %u local KV blocks",
			                g->o.n_local_blocks);
			goto fail;
		}
		memset(g->pool, 0, (size_t)g->o.n_local_blocks * g->block_bytes);
		g->push.local_base = g->pool;
	}
	/* register the local pool so puts go out without an extra copy */
	rc = kvx_region_map(o->kvx, (void *)g->push.local_base, (size_t)g->o.n_local_blocks * g->block_bytes,
	                    &g->local_region, e);
	if (rc)
		goto fail;
	g->push.kvx = o->kvx;
	const char *td = getenv("TANDEM_TEST_PUSH_DELAY"); /* test-only, see engine.h */
	if (td && sscanf(td, "%u:%u", &g->push.test_delay_us, &g->push.test_delay_min_tokens) == 2)
		LOG_WARN("prefill",
		         "TEST: KV pushes of prompts of >= %u tokens are slowed by %u us per block",
		         g->push.test_delay_min_tokens, g->push.test_delay_us);
	else
		g->push.test_delay_us = 0;
	g->push.local_region = g->local_region;
	g->push.block_bytes = g->block_bytes;
	g->push.flush_timeout_ms = g->o.flush_timeout_ms;
	g->free_blocks = malloc(g->o.n_local_blocks * sizeof(int32_t));
	uint32_t nt = g->o.max_tokens_per_step;
	g->b_tokens = malloc(nt * sizeof(int32_t));
	g->b_seq = malloc(nt * sizeof(int32_t));
	g->b_pos = malloc(nt * sizeof(int32_t));
	g->b_logits = malloc(nt);
	g->b_seqs = calloc(256, sizeof(struct model_seq));
	g->logits = o->model ? malloc((size_t)g->o.max_batch * g->vocab * sizeof(float)) : NULL;
	if (!g->free_blocks || !g->b_tokens || !g->b_seq || !g->b_pos || !g->b_logits || !g->b_seqs ||
	    (o->model && !g->logits)) {
		rc = errbuf_set(e, -ENOMEM, "out of memory for the prefill batch");
		goto fail;
	}
	for (uint32_t i = 0; i < g->o.n_local_blocks; i++)
		g->free_blocks[g->n_free++] = (int32_t)(g->o.n_local_blocks - 1 - i);
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	uv_async_init(o->loop, &g->async, async_cb);
	g->async.data = g;
	atomic_store(&g->alive_ns, uv_hrtime());
	if (pthread_create(&g->thread, NULL, engine_main, g) != 0) {
		uv_close((uv_handle_t *)&g->async, NULL);
		rc = errbuf_set(e, -EAGAIN, "cannot start the engine thread");
		goto fail;
	}
	*out = g;
	return 0;
fail:
	if (g->local_region)
		kvx_region_unmap(o->kvx, g->local_region);
	if (o->model && g->kv.base)
		model_kv_fini(&g->kv);
	if (g->staging_pinned)
		model_host_unpin(o->model, g->staging);
	free(g->staging);
	sample_work_fini(&g->sw);
	free(g->pool);
	free(g->free_blocks);
	free(g->b_tokens);
	free(g->b_seq);
	free(g->b_pos);
	free(g->b_logits);
	free(g->b_seqs);
	free(g->logits);
	free(g);
	return rc;
}

static void async_closed_cb(uv_handle_t *h)
{
	free(h->data);
}

void pf_engine_destroy(struct pf_engine *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	g->stop = true;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
	pthread_join(g->thread, NULL);
	async_cb(&g->async); /* hand back what the thread returned */
	kvx_region_unmap(g->o.kvx, g->local_region);
	if (g->o.model)
		model_kv_fini(&g->kv);
	if (g->staging_pinned)
		model_host_unpin(g->o.model, g->staging);
	free(g->staging);
	sample_work_fini(&g->sw);
	free(g->pool);
	free(g->free_blocks);
	free(g->b_tokens);
	free(g->b_seq);
	free(g->b_pos);
	free(g->b_logits);
	free(g->b_seqs);
	free(g->logits);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	uv_close((uv_handle_t *)&g->async, async_closed_cb);
}

void pf_engine_layout(const struct pf_engine *g, struct msg_kv_layout *l)
{
	*l = g->layout;
}
uint32_t pf_engine_vocab(const struct pf_engine *g)
{
	return g->vocab;
}
uint32_t pf_engine_max_seq_len(const struct pf_engine *g)
{
	return g->max_seq_len;
}

double pf_engine_stall_seconds(const struct pf_engine *g)
{
	return (double)(uv_hrtime() - atomic_load(&((struct pf_engine *)g)->alive_ns)) / 1e9;
}
