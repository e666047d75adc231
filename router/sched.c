/* Scheduler (see sched.h): owns the admission queue and the placement decisions, drives the
 * request state machine of req.c, and updates the serving metrics at each transition. All of it
 * runs on the router's single libuv loop, so there is no locking. */
#include "router/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/metrics.h"

struct sched_metrics {
	struct metric *queue_s, *prefill_s, *transfer_s, *ttft_s, *itl_s, *e2e_s;
	struct metric *prompt_tokens, *gen_tokens;
	struct metric *req_done, *req_failed, *req_cancelled, *req_rejected;
	struct metric *queue_depth, *running, *blocks_used, *blocks_free, *workers_prefill, *workers_decode;
	struct metric *prefill_retries;
};

struct sched {
	uv_loop_t *loop;
	struct sched_config cfg;
	struct worker *workers;
	struct req *qhead, *qtail;
	uint32_t n_queued;
	uint32_t n_active;
	uint32_t n_decoding;
	bool draining;
	bool pumping;
	struct sched_metrics m;
};

static void pump(struct sched *s);
static void stage_timeout_cb(uv_timer_t *t);

static double secs(uint64_t a_ns, uint64_t b_ns)
{
	return b_ns > a_ns ? (double)(b_ns - a_ns) / 1e9 : 0;
}

static void register_metrics(struct sched *s, struct metrics *m)
{
	struct sched_metrics *x = &s->m;
	/* inter-token gaps are much shorter than whole stages: finer buckets at the low end */
	static const double fast[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	                              0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
	const double *lb = metrics_latency_bounds;
	int nl = metrics_n_latency_bounds;
	x->queue_s = metrics_histogram(m, "tandem_router_queue_seconds", NULL,
	                               "Time from admission to KV reservation", lb, nl);
	x->prefill_s = metrics_histogram(m, "tandem_router_prefill_seconds", NULL,
	                                 "Time from prefill start to prefill done", lb, nl);
	x->transfer_s = metrics_histogram(
	    m, "tandem_router_kv_transfer_seconds", NULL,
	    "Time from prefill done to the decode worker's first token (KV transfer)", lb, nl);
	x->ttft_s = metrics_histogram(m, "tandem_router_ttft_seconds", NULL,
	                              "Time to first token, from request receipt", lb, nl);
	x->itl_s =
	    metrics_histogram(m, "tandem_router_inter_token_seconds", NULL, "Time between consecutive tokens",
	                      fast, (int)(sizeof(fast) / sizeof(fast[0])));
	x->e2e_s =
	    metrics_histogram(m, "tandem_router_e2e_seconds", NULL, "End-to-end request latency", lb, nl);
	x->prompt_tokens =
	    metrics_counter(m, "tandem_router_prompt_tokens_total", NULL, "Prompt tokens admitted");
	x->gen_tokens = metrics_counter(m, "tandem_router_generated_tokens_total", NULL, "Tokens generated");
	const char *h = "Sequences by outcome";
	x->req_done = metrics_counter(m, "tandem_router_requests_total", "outcome=\"done\"", h);
	x->req_failed = metrics_counter(m, "tandem_router_requests_total", "outcome=\"failed\"", h);
	x->req_cancelled = metrics_counter(m, "tandem_router_requests_total", "outcome=\"cancelled\"", h);
	x->req_rejected = metrics_counter(m, "tandem_router_requests_total", "outcome=\"rejected\"", h);
	x->queue_depth =
	    metrics_gauge(m, "tandem_router_queue_depth", NULL, "Requests waiting in the admission queue");
	x->running = metrics_gauge(m, "tandem_router_running_sequences", NULL, "Sequences decoding");
	x->blocks_used = metrics_gauge(m, "tandem_router_kv_blocks_used", NULL,
	                               "KV blocks in use over all decode workers");
	x->blocks_free =
	    metrics_gauge(m, "tandem_router_kv_blocks_free", NULL, "KV blocks free over all decode workers");
	x->workers_prefill =
	    metrics_gauge(m, "tandem_router_workers", "role=\"prefill\"", "Live workers by role");
	x->workers_decode =
	    metrics_gauge(m, "tandem_router_workers", "role=\"decode\"", "Live workers by role");
	x->prefill_retries = metrics_counter(m, "tandem_router_prefill_retries_total", NULL,
	                                     "Prefills re-placed after their worker was lost");
}

static void update_gauges(struct sched *s)
{
	uint64_t used = 0, freeb = 0;
	int np = 0, nd = 0;
	for (struct worker *w = s->workers; w; w = w->next) {
		if (!w->alive)
			continue;
		if (w->role == WORKER_ROLE_DECODE) {
			nd++;
			used += w->n_blocks_total - w->n_blocks_free;
			freeb += w->n_blocks_free;
		} else {
			np++;
		}
	}
	metrics_set(s->m.queue_depth, s->n_queued);
	metrics_set(s->m.running, s->n_decoding);
	metrics_set(s->m.blocks_used, (double)used);
	metrics_set(s->m.blocks_free, (double)freeb);
	metrics_set(s->m.workers_prefill, np);
	metrics_set(s->m.workers_decode, nd);
}

int sched_create(struct sched **out, uv_loop_t *loop, const struct sched_config *cfg, struct metrics *m,
                 struct errbuf *e)
{
	struct sched *s = calloc(1, sizeof(*s));
	if (!s)
		return errbuf_set(e, -ENOMEM, "sched: out of memory");
	s->loop = loop;
	s->cfg = *cfg;
	if (s->cfg.n_prefill_tries_max < 1)
		s->cfg.n_prefill_tries_max = 1;
	if (m)
		register_metrics(s, m);
	*out = s;
	return 0;
}

struct worker *sched_workers(struct sched *s)
{
	return s->workers;
}
uint32_t sched_n_queued(const struct sched *s)
{
	return s->n_queued;
}
uint32_t sched_n_active(const struct sched *s)
{
	return s->n_active;
}
uint32_t sched_retry_after(const struct sched *s)
{
	return s->cfg.retry_after_s ? s->cfg.retry_after_s : 1;
}
void sched_set_draining(struct sched *s)
{
	s->draining = true;
}

bool sched_is_ready(const struct sched *s)
{
	bool p = false, d = false;
	for (struct worker *w = s->workers; w; w = w->next) {
		if (!w->alive || w->draining)
			continue;
		p |= w->role == WORKER_ROLE_PREFILL;
		d |= w->role == WORKER_ROLE_DECODE;
	}
	return p && d;
}

/* ---- queue ----------------------------------------------------------------------------------- */

static void queue_push(struct sched *s, struct req *r)
{
	r->qprev = s->qtail;
	r->qnext = NULL;
	if (s->qtail)
		s->qtail->qnext = r;
	else
		s->qhead = r;
	s->qtail = r;
	r->queued = true;
	s->n_queued++;
}

static void queue_push_front(struct sched *s, struct req *r)
{
	r->qprev = NULL;
	r->qnext = s->qhead;
	if (s->qhead)
		s->qhead->qprev = r;
	else
		s->qtail = r;
	s->qhead = r;
	r->queued = true;
	s->n_queued++;
}

static void queue_remove(struct sched *s, struct req *r)
{
	if (!r->queued)
		return;
	if (r->qprev)
		r->qprev->qnext = r->qnext;
	else
		s->qhead = r->qnext;
	if (r->qnext)
		r->qnext->qprev = r->qprev;
	else
		s->qtail = r->qprev;
	r->qnext = r->qprev = NULL;
	r->queued = false;
	s->n_queued--;
}

/* ---- ending ---------------------------------------------------------------------------------- */

/* Frees what the workers hold for r, exactly once: the pointers are cleared as they are released. */
static void release_all(struct sched *s, struct req *r)
{
	queue_remove(s, r);
	if (r->prefill) {
		struct worker *w = r->prefill;
		r->prefill = NULL;
		if (w->n_queued_tokens >= r->n_prompt)
			w->n_queued_tokens -= r->n_prompt;
		if (w->alive)
			w->ops->release(w, r);
	}
	if (r->decode) {
		struct worker *w = r->decode;
		r->decode = NULL;
		if (r->state == REQ_STATE_DECODING && s->n_decoding > 0)
			s->n_decoding--;
		w->n_blocks_free += r->n_blocks;
		if (w->n_blocks_free > w->n_blocks_total)
			w->n_blocks_free = w->n_blocks_total;
		if (w->n_running > 0 && r->state == REQ_STATE_DECODING)
			w->n_running--;
		if (w->alive)
			w->ops->release(w, r);
	}
}

static void end_req(struct req *r, enum req_state to, enum req_finish finish, int status, const char *msg)
{
	struct sched *s = r->sched;
	if (r->ended)
		return;
	release_all(s, r);
	req_transition(r, to, 0, NULL);
	r->ended = true;
	if (s->n_active > 0)
		s->n_active--;
	uint64_t now = uv_hrtime();
	if (to == REQ_STATE_DONE) {
		metrics_add(s->m.req_done, 1);
		metrics_observe(s->m.e2e_s, secs(r->t_received, now));
		LOG_DEBUG("sched", "rid=%s done: %u tokens in %.3f s", r->rid, r->n_generated,
		          secs(r->t_received, now));
	} else if (to == REQ_STATE_FAILED) {
		metrics_add(s->m.req_failed, 1);
		LOG_WARN("sched", "rid=%s failed: %s", r->rid, msg ? msg : "");
	} else {
		metrics_add(s->m.req_cancelled, 1);
		LOG_INFO("sched", "rid=%s cancelled%s%s", r->rid, msg ? ": " : "", msg ? msg : "");
	}
	update_gauges(s);
	r->sink->end(r->sink_ud, r, to, finish, status, msg);
	pump(s); /* freed blocks may let queued requests in */
}

static void fail(struct req *r, int status, const char *msg)
{
	end_req(r, REQ_STATE_FAILED, REQ_FINISH_NONE, status, msg);
}

void sched_cancel(struct req *r)
{
	if (!r->ended && r->sched)
		end_req(r, REQ_STATE_CANCELLED, REQ_FINISH_NONE, 499, "cancelled");
}

void sched_finish(struct req *r, enum req_finish finish)
{
	if (r->ended || !r->sched)
		return;
	if (r->state != REQ_STATE_DECODING) {
		end_req(r, REQ_STATE_CANCELLED, finish, 499, "finished early");
		return;
	}
	end_req(r, REQ_STATE_DONE, finish, 200, NULL);
}

static void stage_timeout_cb(uv_timer_t *t)
{
	struct req *r = t->data;
	char msg[160];
	snprintf(msg, sizeof(msg), "request timed out in state %s", req_state_name(r->state));
	fail(r, r->state == REQ_STATE_ADMITTED ? 503 : 504, msg);
}

/* ---- placement ------------------------------------------------------------------------------- */

static uint32_t blocks_needed(const struct req *r, uint32_t block_size)
{
	uint64_t tokens = (uint64_t)r->n_prompt + r->n_max_new;
	if (block_size == 0)
		block_size = 64;
	return (uint32_t)((tokens + block_size - 1) / block_size);
}

/* A worker not under suspicion wins over one that is (a recent KV push to it failed); then most
 * free blocks; ties go to fewer running sequences. */
static struct worker *pick_decode(struct sched *s, const struct req *r, bool *fits_anywhere)
{
	struct worker *best = NULL;
	bool best_suspect = false;
	const uint64_t now = uv_hrtime();
	*fits_anywhere = false;
	for (struct worker *w = s->workers; w; w = w->next) {
		if (!w->alive || w->draining || w->role != WORKER_ROLE_DECODE)
			continue;
		uint32_t need = blocks_needed(r, w->layout.block_size);
		if (need <= w->n_blocks_total)
			*fits_anywhere = true;
		if (need > w->n_blocks_free)
			continue;
		if (w->n_running_max && w->n_running >= w->n_running_max)
			continue;
		const bool suspect = w->suspect_until_ns > now;
		if (!best || (best_suspect && !suspect) ||
		    (suspect == best_suspect &&
		     (w->n_blocks_free > best->n_blocks_free ||
		      (w->n_blocks_free == best->n_blocks_free && w->n_running < best->n_running))))
			best = w, best_suspect = suspect;
	}
	return best;
}

static struct worker *pick_prefill(struct sched *s)
{
	struct worker *best = NULL;
	for (struct worker *w = s->workers; w; w = w->next)
		if (w->alive && !w->draining && w->role == WORKER_ROLE_PREFILL &&
		    (!best || w->n_queued_tokens < best->n_queued_tokens))
			best = w;
	return best;
}

uint64_t sched_prefill_timeout_ms(uint64_t base_ms, uint64_t us_per_token, uint32_t n_prompt)
{
	uint64_t max = SCHED_PREFILL_TIMEOUT_MAX_MS;
	if (base_ms >= max)
		return max;
	/* checked by division first, so the product below cannot wrap */
	uint64_t room_us = (max - base_ms) * 1000;
	if (n_prompt && us_per_token > room_us / n_prompt)
		return max;
	return base_ms + (uint64_t)n_prompt * us_per_token / 1000;
}

static void start_prefill(struct sched *s, struct req *r)
{
	struct worker *p = pick_prefill(s);
	if (!p) {
		fail(r, 503, "no prefill worker is available");
		return;
	}
	r->prefill = p;
	r->n_prefill_tries++;
	p->n_queued_tokens += r->n_prompt;
	r->t_prefill = uv_hrtime();
	req_transition(
	    r, REQ_STATE_PREFILLING,
	    sched_prefill_timeout_ms(s->cfg.prefill_timeout_ms, s->cfg.prefill_us_per_token, r->n_prompt),
	    stage_timeout_cb);
	LOG_DEBUG("sched", "rid=%s prefill on %s (try %d)", r->rid, p->name, r->n_prefill_tries);
	int rc = p->ops->prefill(p, r);
	if (rc != 0 && !r->ended) {
		r->prefill = NULL;
		if (p->n_queued_tokens >= r->n_prompt)
			p->n_queued_tokens -= r->n_prompt;
		fail(r, 503, "prefill worker refused the request");
	}
}

/* Places queued requests in FIFO order while decode workers have room. A request that does not
 * fit blocks the ones behind it (no overtaking, so large prompts are not starved). */
static void pump(struct sched *s)
{
	if (s->pumping)
		return;
	s->pumping = true;
	while (s->qhead) {
		struct req *r = s->qhead;
		bool fits_anywhere;
		struct worker *d = pick_decode(s, r, &fits_anywhere);
		if (!d) {
			if (!fits_anywhere && sched_is_ready(s)) {
				queue_remove(s, r);
				fail(r, 400, "the request needs more KV blocks than any decode worker has");
				continue;
			}
			break;
		}
		queue_remove(s, r);
		uint32_t need = blocks_needed(r, d->layout.block_size);
		r->decode = d;
		r->n_blocks = need;
		d->n_blocks_free -= need;
		/* still ADMITTED while the reservation is in flight; the reserve timeout guards it */
		uv_timer_stop(&r->deadline);
		uv_timer_start(&r->deadline, stage_timeout_cb, s->cfg.reserve_timeout_ms, 0);
		int rc = d->ops->reserve(d, r, need);
		if (rc != 0 && !r->ended)
			fail(r, 503, "decode worker refused the reservation");
	}
	update_gauges(s);
	s->pumping = false;
}

int sched_submit(struct sched *s, struct req *r)
{
	r->sched = s;
	if (s->draining || !sched_is_ready(s)) {
		metrics_add(s->m.req_rejected, 1);
		return -EAGAIN;
	}
	if (s->n_queued >= s->cfg.n_queue_max) {
		metrics_add(s->m.req_rejected, 1);
		return ERR_LIMIT;
	}
	r->t_admitted = uv_hrtime();
	s->n_active++;
	metrics_add(s->m.prompt_tokens, r->n_prompt);
	req_transition(r, REQ_STATE_ADMITTED, s->cfg.queue_timeout_ms, stage_timeout_cb);
	queue_push(s, r);
	pump(s);
	return 0;
}

/* ---- backend events -------------------------------------------------------------------------- */

void sched_on_reserved(struct req *r, int status, const char *message)
{
	if (r->ended || r->state != REQ_STATE_ADMITTED || !r->decode)
		return;
	struct sched *s = r->sched;
	if (status != 0) {
		/* the worker's view of its pool was tighter than ours: give the blocks back, re-queue */
		struct worker *d = r->decode;
		r->decode = NULL;
		d->n_blocks_free += r->n_blocks;
		if (d->n_blocks_free > d->n_blocks_total)
			d->n_blocks_free = d->n_blocks_total;
		LOG_INFO("sched", "rid=%s reservation refused by %s: %s; re-queued", r->rid, d->name,
		         message ? message : "");
		queue_push(s, r);
		return;
	}
	r->t_reserved = uv_hrtime();
	metrics_observe(s->m.queue_s, secs(r->t_admitted, r->t_reserved));
	req_transition(r, REQ_STATE_KV_RESERVED, 0, NULL);
	start_prefill(s, r);
}

void sched_on_prefill_done(struct req *r)
{
	if (r->ended || r->state != REQ_STATE_PREFILLING)
		return;
	struct sched *s = r->sched;
	r->t_transfer = uv_hrtime();
	metrics_observe(s->m.prefill_s, secs(r->t_prefill, r->t_transfer));
	if (r->prefill && r->prefill->n_queued_tokens >= r->n_prompt)
		r->prefill->n_queued_tokens -= r->n_prompt;
	/* the prefill worker's part ends with the push; it holds nothing afterwards */
	r->prefill = NULL;
	req_transition(r, REQ_STATE_KV_TRANSFERRING, s->cfg.transfer_timeout_ms, stage_timeout_cb);
}

static void deliver(struct sched *s, struct req *r, const struct req_token *t)
{
	uint64_t now = uv_hrtime();
	if (r->n_generated > 0)
		metrics_observe(s->m.itl_s, secs(r->t_last, now));
	r->t_last = now;
	r->n_generated++;
	metrics_add(s->m.gen_tokens, 1);
	uv_timer_stop(&r->deadline);
	uv_timer_start(&r->deadline, stage_timeout_cb, s->cfg.token_timeout_ms, 0);
	r->sink->token(r->sink_ud, r, t);
}

void sched_on_decode_started(struct req *r, const struct req_token *first)
{
	if (r->ended || r->state != REQ_STATE_KV_TRANSFERRING)
		return;
	struct sched *s = r->sched;
	r->t_first = uv_hrtime();
	metrics_observe(s->m.transfer_s, secs(r->t_transfer, r->t_first));
	metrics_observe(s->m.ttft_s, secs(r->t_received, r->t_first));
	req_transition(r, REQ_STATE_DECODING, s->cfg.token_timeout_ms, stage_timeout_cb);
	s->n_decoding++;
	if (r->decode)
		r->decode->n_running++;
	update_gauges(s);
	if (first)
		deliver(s, r, first);
}

void sched_on_token(struct req *r, const struct req_token *t)
{
	if (r->ended || r->state != REQ_STATE_DECODING)
		return;
	deliver(r->sched, r, t);
}

void sched_on_finished(struct req *r, enum req_finish finish)
{
	if (r->ended)
		return;
	if (r->state != REQ_STATE_DECODING) {
		fail(r, 502, "worker reported completion before decoding started");
		return;
	}
	end_req(r, REQ_STATE_DONE, finish, 200, NULL);
}

void sched_on_failed(struct req *r, int http_status, const char *message)
{
	if (!r->ended)
		fail(r, http_status, message);
}

void sched_on_kv_transfer_failed(struct req *r, const char *message)
{
	if (r->ended)
		return;
	struct sched *s = r->sched;
	struct worker *d = r->decode;
	if ((r->state != REQ_STATE_PREFILLING && r->state != REQ_STATE_KV_TRANSFERRING) || !d ||
	    r->n_prefill_tries >= s->cfg.n_prefill_tries_max) {
		fail(r, 502, message);
		return;
	}
	d->suspect_until_ns = uv_hrtime() + (uint64_t)SCHED_SUSPECT_MS * 1000000u;
	LOG_WARN("sched", "rid=%s: %s; placing the request again (decode worker %s avoided for %d ms)",
	         r->rid, message, d->name, SCHED_SUSPECT_MS);
	/* both workers let go (the decode worker gets KvRelease if it is still there), then the
	 * request starts over under a new rid, exactly as for a decode worker lost before decoding */
	release_all(s, r);
	metrics_add(s->m.prefill_retries, 1);
	r->id += (uint64_t)1 << 48;
	snprintf(r->rid, sizeof(r->rid), "%llu", (unsigned long long)r->id);
	req_transition(r, REQ_STATE_ADMITTED, s->cfg.queue_timeout_ms, stage_timeout_cb);
	queue_push_front(s, r);
	pump(s);
}

/* ---- workers --------------------------------------------------------------------------------- */

int sched_worker_add(struct sched *s, struct worker *w, struct errbuf *e)
{
	for (struct worker *o = s->workers; o; o = o->next) {
		if (!o->alive)
			continue;
		if (strcmp(o->model_id, w->model_id) != 0)
			return errbuf_set(e, ERR_MISMATCH,
			                  "worker %s refused: model identity %s differs from %s's %s",
			                  w->name, w->model_id, o->name, o->model_id);
		int rc = kv_layout_compare(&w->layout, w->name, &o->layout, o->name, e);
		if (rc)
			return errbuf_prefix(e, "worker %s refused", w->name);
	}
	w->alive = true;
	w->next = s->workers;
	s->workers = w;
	LOG_INFO("sched", "registered %s worker %s (%u blocks of %u tokens, model %s)",
	         w->role == WORKER_ROLE_PREFILL ? "prefill" : "decode", w->name, w->n_blocks_total,
	         w->layout.block_size, w->model_id);
	update_gauges(s);
	pump(s);
	return 0;
}

void sched_worker_load_changed(struct sched *s, struct worker *w)
{
	(void)w;
	update_gauges(s);
	pump(s);
}

void sched_worker_lost(struct sched *s, struct worker *w, const char *why)
{
	if (!w->alive)
		return;
	w->alive = false;
	LOG_WARN("sched", "worker %s lost: %s", w->name, why ? why : "");
	update_gauges(s);
	/* unlink from the placement list */
	for (struct worker **pp = &s->workers; *pp; pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	}
	w->next = NULL;
}

void sched_on_worker_lost_req(struct req *r, struct worker *w)
{
	if (r->ended)
		return;
	struct sched *s = r->sched;
	if (r->prefill == w && r->state == REQ_STATE_PREFILLING) {
		r->prefill = NULL;
		if (r->n_prefill_tries >= s->cfg.n_prefill_tries_max) {
			fail(r, 503, "prefill worker lost and no retries left");
			return;
		}
		metrics_add(s->m.prefill_retries, 1);
		LOG_INFO("sched", "rid=%s prefill worker %s lost; re-prefilling elsewhere", r->rid, w->name);
		/* the decode reservation stays: back to KV_RESERVED and place the prefill again */
		req_transition(r, REQ_STATE_KV_RESERVED, 0, NULL);
		start_prefill(s, r);
		return;
	}
	if (r->decode == w) {
		/* blocks died with the worker: nothing to give back */
		r->decode = NULL;
		if (r->state == REQ_STATE_DECODING && s->n_decoding > 0)
			s->n_decoding--;
		if (r->state == REQ_STATE_ADMITTED) {
			/* reservation was in flight: place again */
			queue_push(s, r);
			pump(s);
			return;
		}
		if (r->state != REQ_STATE_DECODING && r->n_prefill_tries < s->cfg.n_prefill_tries_max) {
			/* nothing was sent to the client yet: drop the prefill (its KV target is gone) and
			 * place the whole request again, at the head of the queue */
			if (r->prefill) {
				struct worker *p = r->prefill;
				r->prefill = NULL;
				if (p->n_queued_tokens >= r->n_prompt)
					p->n_queued_tokens -= r->n_prompt;
				if (p->alive)
					p->ops->release(p, r);
			}
			LOG_INFO("sched",
			         "rid=%s decode worker %s lost before decoding; placing the request again",
			         r->rid, w->name);
			metrics_add(s->m.prefill_retries, 1);
			/* a new rid for the new attempt: a late PrefillDone of the cancelled attempt (the
			 * prefill worker may already have been writing) can then never be mistaken for the
			 * new one. The attempt number lives in the top bits; the old rid is logged above. */
			r->id += (uint64_t)1 << 48;
			snprintf(r->rid, sizeof(r->rid), "%llu", (unsigned long long)r->id);
			req_transition(r, REQ_STATE_ADMITTED, s->cfg.queue_timeout_ms, stage_timeout_cb);
			queue_push_front(s, r);
			pump(s);
			return;
		}
		fail(r, 502, "decode worker lost while serving the request");
	}
}

void sched_destroy(struct sched *s)
{
	if (!s)
		return;
	while (s->qhead)
		fail(s->qhead, 503, "server shutting down");
	free(s);
}
