/* Decode engine thread (see engine.h). One step:
 *   1. take new sequences (up to max_batch running; the rest wait in arrival order);
 *   2. hand back cancelled sequences (FINISH CANCELLED);
 *   3. forward one token per running sequence: its last token at position n_prompt + n_gen - 1
 *      (the model writes that position's KV into the sequence's blocks and returns logits);
 *   4. sample the next token per sequence (seeded RNG per request: seed + 1, prefill used seed for
 *      the first token), emit it, and finish the sequence when a stop condition holds.
 * Events are flushed to the loop thread once per step, so a step's tokens travel together. */
#include "decode/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/log.h"
#include "common/model/model.h"
#include "common/net/trivial.h"
#include "common/tok/tok.h"

#define BATCH_MAX 1024
/* Events waiting for the loop thread at most: beyond this the engine waits (a stalled loop thread
 * must not let the outbox grow without bound). */
#define OUTBOX_MAX 65536

struct dc_engine {
	struct dc_engine_opts o;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct dc_seq *inbox, *inbox_tail; /* mu */
	struct dc_event *out; /* mu: events waiting for the loop thread */
	uint32_t n_out, cap_out; /* mu */
	bool stop; /* mu */
	bool poked; /* mu */
	uv_async_t async;
	_Atomic uint64_t alive_ns;

	/* engine thread only */
	struct dc_seq *waiting, *waiting_tail;
	struct dc_seq *staging, *staging_tail; /* staged KV: prompt blocks still to upload */
	uint32_t n_staging;
	struct dc_seq *run[BATCH_MAX];
	uint32_t n_run;
	struct dc_event *ev; /* this step's events */
	uint32_t n_ev, cap_ev;
	struct model_kv kv;
	bool staged; /* kv is the model's own pool: prompt blocks are uploaded at join */
	bool tp_copies; /* staged into a pool with a copy per GPU (TP over GPUs): replicate uploads */
	int attach_rc; /* model_thread_attach of the engine thread (its forwards fail if not 0) */
	uint64_t staged_blocks; /* blocks uploaded so far (logs) */
	uint32_t vocab;
	struct sample_work sw;
	int32_t *b_tokens, *b_seq, *b_pos;
	struct model_seq *b_seqs;
	float *logits;
};

void dc_seq_free(struct dc_seq *s)
{
	if (!s)
		return;
	free(s->blocks);
	for (uint32_t i = 0; i < s->n_stop; i++)
		free(s->stop[i]);
	free(s->stop);
	free(s->stop_ids);
	free(s->history);
	stop_fini(&s->sm);
	free(s);
}

static void emit(struct dc_engine *g, const struct dc_event *ev)
{
	if (g->n_ev == g->cap_ev) {
		uint32_t cap = g->cap_ev ? g->cap_ev * 2 : 256;
		struct dc_event *n = realloc(g->ev, cap * sizeof(*n));
		TD_ASSERT(n != NULL); /* bounded by 2 events per running sequence per step */
		g->ev = n;
		g->cap_ev = cap;
	}
	g->ev[g->n_ev++] = *ev;
}

static void finish(struct dc_engine *g, struct dc_seq *s, int reason, int error_code, int32_t stop_index)
{
	struct dc_event ev = {.type = DC_EV_FINISH,
	                      .rid = s->rid,
	                      .reason = reason,
	                      .error_code = error_code,
	                      .stop_index = stop_index,
	                      .completion_tokens = s->n_gen,
	                      .seq = s};
	emit(g, &ev);
}

/* publishes this step's events to the loop thread */
static void flush_events(struct dc_engine *g)
{
	if (!g->n_ev)
		return;
	pthread_mutex_lock(&g->mu);
	if (g->n_out + g->n_ev > g->cap_out) {
		uint32_t cap = g->cap_out ? g->cap_out : 256;
		while (cap < g->n_out + g->n_ev)
			cap *= 2;
		struct dc_event *n = realloc(g->out, cap * sizeof(*n));
		TD_ASSERT(n != NULL);
		g->out = n;
		g->cap_out = cap;
	}
	memcpy(g->out + g->n_out, g->ev, g->n_ev * sizeof(*g->ev));
	g->n_out += g->n_ev;
	g->n_ev = 0;
	uv_async_send(&g->async);
	while (g->n_out > OUTBOX_MAX && !g->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000000L;
		if (ts.tv_nsec >= 1000000000L)
			ts.tv_sec++, ts.tv_nsec -= 1000000000L;
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		atomic_store(&g->alive_ns, uv_hrtime());
	}
	pthread_mutex_unlock(&g->mu);
}

static void async_cb(uv_async_t *a)
{
	struct dc_engine *g = a->data;
	for (;;) {
		pthread_mutex_lock(&g->mu);
		struct dc_event *ev = g->out;
		uint32_t n = g->n_out;
		g->out = NULL;
		g->n_out = g->cap_out = 0;
		pthread_cond_signal(&g->cv); /* an engine waiting for the outbox to drain */
		pthread_mutex_unlock(&g->mu);
		if (!n) {
			free(ev);
			return;
		}
		g->o.events_cb(ev, n, g->o.ud);
		free(ev);
	}
}

void dc_engine_submit(struct dc_engine *g, struct dc_seq *s)
{
	s->next = NULL;
	pthread_mutex_lock(&g->mu);
	if (g->inbox_tail)
		g->inbox_tail->next = s;
	else
		g->inbox = s;
	g->inbox_tail = s;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

void dc_engine_poke(struct dc_engine *g)
{
	pthread_mutex_lock(&g->mu);
	g->poked = true;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* ---- finish conditions ------------------------------------------------------------------------- */

static bool is_stop_id(const struct dc_seq *s, int32_t t)
{
	for (uint32_t i = 0; i < s->n_stop_ids; i++)
		if ((int32_t)s->stop_ids[i] == t)
			return true;
	return false;
}

/* After token t became the sequence's n_gen-th token: finished? (emits FINISH and returns true) */
static bool check_finish(struct dc_engine *g, struct dc_seq *s, int32_t t)
{
	if (!s->ignore_eos && g->o.tok && tok_is_eog(g->o.tok, t)) {
		finish(g, s, MSG_FINISH_STOP, 0, -1);
		return true;
	}
	if (is_stop_id(s, t)) {
		finish(g, s, MSG_FINISH_STOP, 0, -1);
		return true;
	}
	int si = stop_feed(&s->sm, t);
	if (si >= 0) {
		finish(g, s, MSG_FINISH_STOP, 0, si);
		return true;
	}
	if (s->n_gen >= s->max_tokens) {
		finish(g, s, MSG_FINISH_LENGTH, 0, -1);
		return true;
	}
	/* the next step feeds t at position n_prompt + n_gen - 1: it must fit the blocks and context */
	uint64_t next_pos = (uint64_t)s->n_prompt + s->n_gen - 1;
	if (next_pos >= (uint64_t)s->n_blocks * MODEL_KV_BLOCK_TOKENS || next_pos >= g->o.max_seq_len) {
		finish(g, s, MSG_FINISH_LENGTH, 0, -1);
		return true;
	}
	return false;
}

static uint32_t prompt_blocks(const struct dc_seq *s)
{
	return (uint32_t)(((uint64_t)s->n_prompt + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS);
}

/* staged KV: up to max more of the prompt's blocks go from the UCX pool (host) to the model's pool,
 * ordered before this step's forward (the UCX pool's blocks stay reserved until the sequence is
 * handed back). Returns the number uploaded, or -1 after handing the sequence back (error). */
static int64_t stage_in(struct dc_engine *g, struct dc_seq *s, uint32_t max)
{
	uint32_t nb = prompt_blocks(s), k = nb - s->n_up < max ? nb - s->n_up : max;
	struct errbuf e = {0};
	int rc = nb > s->n_blocks ? errbuf_set(&e, -EINVAL, "%u prompt blocks, %u reserved", nb, s->n_blocks)
	                          : model_kv_upload(&g->kv, g->o.pool->base, s->blocks + s->n_up, (int)k, &e);
	if (rc) {
		LOG_ERROR("engine", "rid=%llu KV upload to the model's pool failed: %s",
		          (unsigned long long)s->rid, e.msg);
		finish(g, s, MSG_FINISH_ERROR, MSG_ERR_INTERNAL, -1);
		return -1;
	}
	if (!rc && g->tp_copies && k > 0) {
		/* TP over GPUs: the upload reached rank 0's copy; the other GPUs' copies take it by peer
		 * copies on their own streams, so it must have landed first */
		rc = model_kv_wait(&g->kv, &e);
		if (!rc)
			rc = model_kv_replicate(g->o.model, &g->kv, s->blocks + s->n_up, (int)k, &e);
	}
	if (rc) {
		LOG_ERROR("engine", "rid=%llu KV copy to the other GPUs failed: %s",
		          (unsigned long long)s->rid, e.msg);
		finish(g, s, MSG_FINISH_ERROR, MSG_ERR_INTERNAL, -1);
		return -1;
	}
	s->n_up += k;
	g->staged_blocks += k;
	metrics_add(g->o.metrics.staged_bytes, (double)k * (double)g->kv.layout.block_bytes);
	if (s->n_up == nb)
		LOG_DEBUG("engine", "rid=%llu %u prompt blocks uploaded to the model's KV pool",
		          (unsigned long long)s->rid, nb);
	return k;
}

/* staged KV, once per step: uploads the STAGING sequences' blocks in arrival order within the
 * step's byte budget (the first in line gets at least one block: progress); a sequence whose
 * blocks are all on their way joins the batch (the forward runs after the copies, same stream). */
static void stage_step(struct dc_engine *g)
{
	size_t bb = g->kv.layout.block_bytes;
	if (!g->staging || !bb) /* bb is 0 without a model (trivial engine: never staged) */
		return;
	uint64_t budget = g->o.upload_step_bytes ? g->o.upload_step_bytes / bb : UINT64_MAX;
	bool first = true;
	while (g->staging) {
		struct dc_seq *s = g->staging;
		if (atomic_load(&s->cancelled)) {
			finish(g, s,
			       s->cancel_code == MSG_ERR_CANCELLED ? MSG_FINISH_CANCELLED : MSG_FINISH_ERROR,
			       s->cancel_code, -1);
		} else {
			uint64_t max = budget == 0 && first ? 1 : budget;
			if (max == 0)
				break;
			int64_t k = stage_in(g, s, max > UINT32_MAX ? UINT32_MAX : (uint32_t)max);
			first = false;
			if (k >= 0) {
				budget -= budget == UINT64_MAX   ? 0
				          : (uint64_t)k > budget ? budget
				                                 : (uint64_t)k;
				if (s->n_up < prompt_blocks(s)) {
					LOG_DEBUG("engine",
					          "rid=%llu staging: %u of %u prompt blocks uploaded",
					          (unsigned long long)s->rid, s->n_up, prompt_blocks(s));
					break; /* budget spent: the rest next step */
				}
				g->run[g->n_run++] = s;
			}
		}
		g->staging = s->next; /* finished (handed back) or running */
		if (!g->staging)
			g->staging_tail = NULL;
		s->next = NULL;
		g->n_staging--;
	}
}

/* a new sequence: its first token came from prefill; it may already end the request */
static bool start_seq(struct dc_engine *g, struct dc_seq *s)
{
	s->n_gen = 1;
	s->last = (int32_t)s->first.id;
	s->history = malloc((size_t)(s->max_tokens ? s->max_tokens : 1) * sizeof(int32_t));
	if (!s->history || stop_init(&s->sm, g->o.tok, s->stop, s->n_stop)) {
		finish(g, s, MSG_FINISH_ERROR, MSG_ERR_INTERNAL, -1);
		return false;
	}
	s->history[0] = s->last;
	sample_rng_seed(&s->rng, s->sampling.seed + 1);
	return !check_finish(g, s, s->last);
}

static void sample_next(struct dc_engine *g, struct dc_seq *s, const float *row, struct msg_token *out)
{
	if (!g->o.model) {
		out->id = trivial_next_token((uint32_t)s->last, s->n_prompt + s->n_gen - 1);
		out->logprob = 0;
		return;
	}
	struct sample_params sp;
	sample_params_default(&sp);
	sp.greedy = s->sampling.temperature <= 0;
	sp.temperature = s->sampling.temperature > 0 ? s->sampling.temperature : 1;
	sp.top_k = (int)s->sampling.top_k;
	sp.top_p = s->sampling.top_p > 0 ? s->sampling.top_p : 1;
	sp.min_p = s->sampling.min_p;
	sp.presence_penalty = s->sampling.presence_penalty;
	sp.frequency_penalty = s->sampling.frequency_penalty;
	sp.n_logprobs = s->sampling.logprobs ? (int)s->sampling.n_logprobs : 0;
	struct sample_result r;
	struct errbuf e;
	if (sample_token(&sp, &s->rng, &g->sw, row, g->vocab, s->history, s->n_gen, &r, &e)) {
		/* parameters were validated at KvReserve: fall back to greedy rather than stall */
		sp.greedy = true;
		sp.n_logprobs = 0;
		if (sample_token(&sp, &s->rng, &g->sw, row, g->vocab, NULL, 0, &r, &e))
			r.token = 0, r.logprob = 0, r.n_top = 0;
	}
	memset(out, 0, sizeof(*out));
	out->id = (uint32_t)r.token;
	out->logprob = r.logprob > 0 ? 0 : r.logprob;
	if (s->sampling.logprobs) {
		out->n_top = (uint32_t)(r.n_top < MSG_TOP_LOGPROBS_MAX ? r.n_top : MSG_TOP_LOGPROBS_MAX);
		for (uint32_t i = 0; i < out->n_top; i++) {
			out->top_ids[i] = (uint32_t)r.top_ids[i];
			out->top_logprobs[i] = r.top_logprobs[i] > 0 ? 0 : r.top_logprobs[i];
		}
	}
}

/* ---- the step ---------------------------------------------------------------------------------- */

static void step(struct dc_engine *g)
{
	/* 2. cancelled sequences leave */
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->n_run; i++) {
		struct dc_seq *s = g->run[i];
		if (atomic_load(&s->cancelled))
			finish(g, s,
			       s->cancel_code == MSG_ERR_CANCELLED ? MSG_FINISH_CANCELLED : MSG_FINISH_ERROR,
			       s->cancel_code, -1);
		else
			g->run[k++] = s;
	}
	g->n_run = k;
	/* 1. join (staged KV: through STAGING, counted in the batch limit) */
	while (g->waiting && g->n_run + g->n_staging < g->o.max_batch) {
		struct dc_seq *s = g->waiting;
		g->waiting = s->next;
		if (!g->waiting)
			g->waiting_tail = NULL;
		if (atomic_load(&s->cancelled)) {
			finish(g, s,
			       s->cancel_code == MSG_ERR_CANCELLED ? MSG_FINISH_CANCELLED : MSG_FINISH_ERROR,
			       s->cancel_code, -1);
			continue;
		}
		if (!start_seq(g, s))
			continue;
		if (!g->staged) {
			g->run[g->n_run++] = s;
			continue;
		}
		s->next = NULL;
		if (g->staging_tail)
			g->staging_tail->next = s;
		else
			g->staging = s;
		g->staging_tail = s;
		g->n_staging++;
	}
	stage_step(g);
	metrics_set(g->o.metrics.running, g->n_run);
	if (g->n_run == 0)
		return;
	/* 3. forward */
	uint64_t t0 = uv_hrtime();
	uint32_t n = g->n_run;
	for (uint32_t i = 0; i < n; i++) {
		struct dc_seq *s = g->run[i];
		g->b_tokens[i] = s->last;
		g->b_seq[i] = (int32_t)i;
		g->b_pos[i] = (int32_t)(s->n_prompt + s->n_gen - 1);
		g->b_seqs[i].blocks = s->blocks;
		g->b_seqs[i].n_blocks = (int)s->n_blocks;
	}
	bool failed = false;
	if (g->o.model) {
		static const uint8_t all = 1;
		uint8_t *want = malloc(n);
		if (want)
			memset(want, all, n);
		struct model_batch b = {.n_tokens = (int)n,
		                        .tokens = g->b_tokens,
		                        .seq = g->b_seq,
		                        .pos = g->b_pos,
		                        .logits = want,
		                        .n_seqs = (int)n,
		                        .seqs = g->b_seqs};
		struct errbuf e = {0};
		int rc = !want          ? -ENOMEM
		         : g->attach_rc ? errbuf_set(&e, g->attach_rc, "engine thread cannot run the model")
		                        : model_forward(g->o.model, &g->kv, &b, g->logits, NULL, &e);
		free(want);
		if (rc && g->staged) { /* uploads of this step may still be in flight: let them land */
			struct errbuf e2 = {0};
			if (model_kv_wait(&g->kv, &e2))
				LOG_ERROR("engine", "after a failed step: %s", e2.msg);
		}
		if (rc) {
			LOG_ERROR("engine", "decode forward of %u sequences failed: %s", n, e.msg);
			failed = true;
		}
	} else {
		/* the trivial engine writes the fed token's KV slot like prefill did for the prompt */
		for (uint32_t i = 0; i < n; i++) {
			struct dc_seq *s = g->run[i];
			uint32_t pos = (uint32_t)g->b_pos[i];
			uint8_t *blocks[1] = {
			    kv_pool_block(g->o.pool, (uint32_t)s->blocks[pos / TRIVIAL_BLOCK_TOKENS])};
			uint32_t tok = (uint32_t)s->last;
			/* trivial_write_kv indexes blocks by pos / 64 from position 0: write the slot
			 * directly */
			uint8_t *slot = blocks[0] + (size_t)(pos % TRIVIAL_BLOCK_TOKENS) * TRIVIAL_SLOT_BYTES;
			memcpy(slot, &tok, 4);
			memcpy(slot + 4, &pos, 4);
		}
		if (g->o.trivial_step_us) {
			struct timespec ts = {.tv_sec = g->o.trivial_step_us / 1000000u,
			                      .tv_nsec = (long)(g->o.trivial_step_us % 1000000u) * 1000};
			nanosleep(&ts, NULL);
		}
	}
	/* 4. sample, emit, finish */
	k = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct dc_seq *s = g->run[i];
		if (failed) {
			finish(g, s, MSG_FINISH_ERROR, MSG_ERR_INTERNAL, -1);
			continue;
		}
		struct dc_event ev = {.type = DC_EV_TOKEN, .rid = s->rid};
		sample_next(g, s, g->o.model ? g->logits + (size_t)i * g->vocab : NULL, &ev.tok);
		emit(g, &ev);
		s->last = (int32_t)ev.tok.id;
		if (s->n_gen < s->max_tokens)
			s->history[s->n_gen] = s->last;
		s->n_gen++;
		if (!check_finish(g, s, s->last))
			g->run[k++] = s;
	}
	g->n_run = k;
	metrics_observe(g->o.metrics.step_seconds, (double)(uv_hrtime() - t0) / 1e9);
	metrics_observe(g->o.metrics.batch_size, n);
	metrics_add(g->o.metrics.tokens, failed ? 0 : n);
	metrics_set(g->o.metrics.running, g->n_run);
}

static void *engine_main(void *arg)
{
	struct dc_engine *g = arg;
	if (g->o.model) {
		struct errbuf e = {0};
		if ((g->attach_rc = model_thread_attach(g->o.model, &e)))
			LOG_ERROR("engine", "%s: every decode step will fail", e.msg);
	}
	for (;;) {
		atomic_store(&g->alive_ns, uv_hrtime());
		pthread_mutex_lock(&g->mu);
		while (!g->stop && !g->inbox && !g->poked && !g->waiting && !g->staging && g->n_run == 0) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200 * 1000000L;
			if (ts.tv_nsec >= 1000000000L)
				ts.tv_sec++, ts.tv_nsec -= 1000000000L;
			pthread_cond_timedwait(&g->cv, &g->mu, &ts);
			atomic_store(&g->alive_ns, uv_hrtime());
		}
		bool stop = g->stop;
		g->poked = false;
		struct dc_seq *in = g->inbox;
		g->inbox = g->inbox_tail = NULL;
		pthread_mutex_unlock(&g->mu);
		while (in) {
			struct dc_seq *nx = in->next;
			in->next = NULL;
			if (g->waiting_tail)
				g->waiting_tail->next = in;
			else
				g->waiting = in;
			g->waiting_tail = in;
			in = nx;
		}
		if (stop) {
			for (uint32_t i = 0; i < g->n_run; i++)
				finish(g, g->run[i], MSG_FINISH_ERROR, MSG_ERR_DRAINING, -1);
			g->n_run = 0;
			while (g->waiting) {
				struct dc_seq *s = g->waiting;
				g->waiting = s->next;
				finish(g, s, MSG_FINISH_ERROR, MSG_ERR_DRAINING, -1);
			}
			g->waiting_tail = NULL;
			while (g->staging) {
				struct dc_seq *s = g->staging;
				g->staging = s->next;
				finish(g, s, MSG_FINISH_ERROR, MSG_ERR_DRAINING, -1);
			}
			g->staging_tail = NULL;
			g->n_staging = 0;
			flush_events(g);
			return NULL;
		}
		step(g);
		flush_events(g);
	}
}

/* ---- set-up ------------------------------------------------------------------------------------- */

int dc_engine_create(const struct dc_engine_opts *o, struct dc_engine **out, struct errbuf *e)
{
	int rc;
	struct dc_engine *g = calloc(1, sizeof(*g));
	if (!g)
		return errbuf_set(e, -ENOMEM, "out of memory");
	g->o = *o;
	if (!g->o.max_batch || g->o.max_batch > BATCH_MAX)
		g->o.max_batch = BATCH_MAX;
	uint32_t nb = g->o.max_batch;
	if (o->model) {
		g->vocab = (uint32_t)model_hparams(o->model)->vocab;
		g->staged = o->kv_staged || model_kv_on_device(o->model);
		const struct model_opts *mo = model_get_opts(o->model);
		g->tp_copies = model_kv_on_device(o->model) && mo->tp > 1 && mo->rank < 0;
		if (g->staged) /* the model's own pool, the same block ids as the UCX pool */
			rc = model_kv_init(&g->kv, o->model, o->pool->n_blocks, NULL, 0, e);
		else
			rc = model_kv_init(&g->kv, o->model, o->pool->n_blocks, o->pool->base,
			                   (size_t)o->pool->n_blocks * o->pool->block_bytes, e);
		if (rc)
			goto fail;
		if (g->staged)
			LOG_INFO("engine",
			         "KV staged: model pool of %u blocks (%.1f MiB) in %s memory, filled from "
			         "the UCX pool when a sequence joins",
			         o->pool->n_blocks,
			         (double)o->pool->n_blocks * (double)o->pool->block_bytes / 1048576.0,
			         g->kv.on_device ? "device" : "host");
		if (sample_work_init(&g->sw, g->vocab)) {
			rc = errbuf_set(e, -ENOMEM, "out of memory (sampling)");
			goto fail;
		}
		g->logits = malloc((size_t)nb * g->vocab * sizeof(float));
	} else {
		g->vocab = TRIVIAL_VOCAB;
	}
	g->b_tokens = malloc(nb * sizeof(int32_t));
	g->b_seq = malloc(nb * sizeof(int32_t));
	g->b_pos = malloc(nb * sizeof(int32_t));
	g->b_seqs = calloc(nb, sizeof(struct model_seq));
	if (!g->b_tokens || !g->b_seq || !g->b_pos || !g->b_seqs || (o->model && !g->logits)) {
		rc = errbuf_set(e, -ENOMEM, "out of memory for a batch of %u", nb);
		goto fail;
	}
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
	if (o->model && g->kv.base)
		model_kv_fini(&g->kv);
	sample_work_fini(&g->sw);
	free(g->logits);
	free(g->b_tokens);
	free(g->b_seq);
	free(g->b_pos);
	free(g->b_seqs);
	free(g);
	return rc;
}

static void async_closed_cb(uv_handle_t *h)
{
	free(h->data);
}

void dc_engine_destroy(struct dc_engine *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	g->stop = true;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
	pthread_join(g->thread, NULL);
	async_cb(&g->async); /* hand back every sequence before the loop goes on */
	if (g->o.model)
		model_kv_fini(&g->kv);
	sample_work_fini(&g->sw);
	free(g->ev);
	free(g->logits);
	free(g->b_tokens);
	free(g->b_seq);
	free(g->b_pos);
	free(g->b_seqs);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	uv_close((uv_handle_t *)&g->async, async_closed_cb);
}

double dc_engine_stall_seconds(const struct dc_engine *g)
{
	return (double)(uv_hrtime() - atomic_load(&((struct dc_engine *)g)->alive_ns)) / 1e9;
}
