/* Remote prefill/decode workers over the control protocol (see workers.h, proto/tandem.proto).
 *
 * Each connection starts unregistered; the only message accepted then is Hello. A registered
 * worker becomes a struct worker in the scheduler. Requests a decode worker holds are found by rid
 * through one hash map (rid -> struct req): an entry exists from KvReserve until the decode
 * reservation is released (release(), Finish, or the worker's loss), so a late message for an
 * ended request finds nothing and is dropped.
 *
 * Mapping of protocol events onto the scheduler (sched.h):
 *   KvReserved            -> sched_on_reserved(ok)
 *   Error(NO_CAPACITY)    -> sched_on_reserved(refused): the request is queued again
 *   PrefillDone           -> sched_on_prefill_done, KvReady to decode, sched_on_decode_started
 *   Tokens                -> sched_on_token (each)
 *   Finish                -> sched_on_finished / sched_on_failed
 *   Error(rid)            -> sched_on_failed
 *   connection closed     -> sched_worker_lost + sched_on_worker_lost_req for each request held */
#include "router/workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/conn.h"
#include "common/net/ctcmp.h"
#include "common/net/metrics.h"
#include "common/net/msg.h"

struct rworker {
	struct worker w;
	struct workers *ws;
	struct conn *c;
	bool registered;
	uint8_t *ucx_address;
	size_t ucx_address_len;
	struct msg_kv_region region; /* rkey owned (copied) */
	bool fence_attempts; /* decode: tells prefill attempts apart (tandem.proto Hello) */
	struct rworker *prev, *next;
};

struct workers {
	uv_loop_t *loop;
	struct sched *sched;
	struct workers_config cfg;
	char listen_addr[256];
	char auth_token[MSG_TOKEN_MAX + 1];
	struct conn_listener *listener;
	struct rworker *list;
	uint32_t next_worker_id;
	uv_timer_t hb_timer;
	/* rid -> req, open addressing with linear probing; keys 0 = empty (rids start at 1) */
	uint64_t *keys;
	struct req **vals;
	size_t cap, n;
	struct metric *kv_bytes, *registrations_refused;
	bool destroying;
};

/* ---- rid map --------------------------------------------------------------------------------- */

static size_t slot_of(uint64_t k, size_t cap)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return (size_t)k & (cap - 1);
}

static int map_grow(struct workers *ws)
{
	size_t cap = ws->cap ? ws->cap * 2 : 1024;
	uint64_t *keys = calloc(cap, sizeof(*keys));
	struct req **vals = calloc(cap, sizeof(*vals));
	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ws->cap; i++) {
		if (!ws->keys[i])
			continue;
		size_t j = slot_of(ws->keys[i], cap);
		while (keys[j])
			j = (j + 1) & (cap - 1);
		keys[j] = ws->keys[i];
		vals[j] = ws->vals[i];
	}
	free(ws->keys);
	free(ws->vals);
	ws->keys = keys;
	ws->vals = vals;
	ws->cap = cap;
	return 0;
}

static int map_put(struct workers *ws, struct req *r)
{
	if ((ws->n + 1) * 2 > ws->cap && map_grow(ws) != 0)
		return -ENOMEM;
	size_t j = slot_of(r->id, ws->cap);
	while (ws->keys[j] && ws->keys[j] != r->id)
		j = (j + 1) & (ws->cap - 1);
	if (!ws->keys[j])
		ws->n++;
	ws->keys[j] = r->id;
	ws->vals[j] = r;
	r->in_rid_map = true;
	return 0;
}

static struct req *map_get(const struct workers *ws, uint64_t rid)
{
	if (!ws->cap || rid == 0)
		return NULL;
	size_t j = slot_of(rid, ws->cap);
	while (ws->keys[j]) {
		if (ws->keys[j] == rid)
			return ws->vals[j];
		j = (j + 1) & (ws->cap - 1);
	}
	return NULL;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void map_del(struct workers *ws, struct req *r)
{
	if (!r->in_rid_map)
		return;
	r->in_rid_map = false;
	size_t j = slot_of(r->id, ws->cap);
	while (ws->keys[j] && ws->keys[j] != r->id)
		j = (j + 1) & (ws->cap - 1);
	if (!ws->keys[j])
		return;
	ws->keys[j] = 0;
	ws->vals[j] = NULL;
	ws->n--;
	size_t i = j;
	for (;;) {
		i = (i + 1) & (ws->cap - 1);
		if (!ws->keys[i])
			break;
		size_t home = slot_of(ws->keys[i], ws->cap);
		/* move entry i to the hole j if its home is not in (j, i] (cyclically) */
		bool between = j <= i ? (home > j && home <= i) : (home > j || home <= i);
		if (!between) {
			ws->keys[j] = ws->keys[i];
			ws->vals[j] = ws->vals[i];
			ws->keys[i] = 0;
			ws->vals[i] = NULL;
			j = i;
		}
	}
}

/* ---- sending --------------------------------------------------------------------------------- */

static int send_msg(struct rworker *rw, const struct msg *m)
{
	struct errbuf e = {0};
	if (!rw->c)
		return -EPIPE;
	int rc = conn_send(rw->c, m, &e);
	if (rc)
		LOG_WARN("workers", "send %s to %s failed: %s", msg_type_name(m->type), rw->w.name, e.msg);
	return rc;
}

static void fill_sampling(const struct req *r, struct msg_sampling *s)
{
	const struct req_sampling *q = &r->sampling;
	s->temperature = q->temperature;
	s->top_p = q->top_p;
	s->top_k = q->top_k > 0 ? (uint32_t)q->top_k : 0;
	s->min_p = q->min_p;
	s->presence_penalty = q->presence_penalty;
	s->frequency_penalty = q->frequency_penalty;
	/* without a seed each request still needs one: make it differ per request and run */
	s->seed = q->has_seed ? q->seed : (uv_hrtime() ^ (r->id * 0x9e3779b97f4a7c15ull));
	s->logprobs = q->want_logprobs;
	s->n_logprobs =
	    (uint32_t)(q->n_top_logprobs > MSG_TOP_LOGPROBS_MAX ? MSG_TOP_LOGPROBS_MAX : q->n_top_logprobs);
}

/* the prefill deadline of r, which is also its prefill's hard write window (tandem.proto) */
static uint32_t prefill_window_ms(const struct workers *ws, const struct req *r)
{
	return (uint32_t)sched_prefill_timeout_ms(ws->cfg.prefill_deadline_ms, ws->cfg.prefill_us_per_token,
	                                          r->n_prompt);
}

/* KvReserve for r; attempt: the prefill attempt whose fence counts (tandem.proto KvReserve) */
static void fill_reserve(const struct workers *ws, const struct req *r, uint32_t attempt, struct msg *m)
{
	msg_init(m, MSG_KV_RESERVE);
	m->u.kv_reserve.rid = r->id;
	m->u.kv_reserve.n_prompt_tokens = r->n_prompt;
	m->u.kv_reserve.max_tokens = r->n_max_new;
	fill_sampling(r, &m->u.kv_reserve.sampling);
	m->u.kv_reserve.deadline_ms = (uint32_t)sched_prefill_timeout_ms(
	    ws->cfg.reserve_deadline_ms, ws->cfg.prefill_us_per_token, r->n_prompt);
	m->u.kv_reserve.prefill_window_ms = prefill_window_ms(ws, r);
	m->u.kv_reserve.ignore_eos = r->sampling.ignore_eos;
	m->u.kv_reserve.n_prompt = r->n_prompt;
	m->u.kv_reserve.prompt = (const uint32_t *)r->prompt; /* ids are non-negative */
	m->u.kv_reserve.attempt = attempt;
}

static int op_reserve(struct worker *w, struct req *r, uint32_t n_blocks)
{
	struct rworker *rw = w->impl;
	struct workers *ws = rw->ws;
	(void)n_blocks; /* decode computes the same count from prompt + max_tokens and its block size */
	if (map_put(ws, r) != 0)
		return -ENOMEM;
	free(r->block_ids);
	r->block_ids = NULL;
	r->n_block_ids = 0;
	r->kv_ready_sent = false;
	r->decode_finished = false;
	struct msg m;
	/* the next prefill attempt is the first one into this reservation */
	r->fence_attempt = rw->fence_attempts ? (uint32_t)r->n_prefill_tries : 0;
	fill_reserve(ws, r, r->fence_attempt, &m);
	int rc = send_msg(rw, &m);
	if (rc)
		map_del(ws, r);
	return rc;
}

static int op_prefill(struct worker *w, struct req *r)
{
	struct rworker *rw = w->impl;
	struct rworker *dw = r->decode ? r->decode->impl : NULL;
	if (!dw || !r->block_ids)
		return -EINVAL;
	struct msg m;
	/* sched counted this attempt already: attempt numbers start at 0 */
	uint32_t attempt = r->n_prefill_tries > 0 ? (uint32_t)r->n_prefill_tries - 1 : 0;
	if (dw->fence_attempts && attempt > r->fence_attempt) {
		/* a re-prefill into the same blocks: decode must stop trusting the earlier attempt's
		 * fence before this attempt can write (tandem.proto KvReserve.attempt). A reservation
		 * made for this attempt (placed again after a lost decode worker) needs no notice. */
		fill_reserve(rw->ws, r, attempt, &m);
		if (send_msg(dw, &m))
			return -EPIPE;
		r->fence_attempt = attempt;
		LOG_INFO("workers", "rid=%s prefill attempt %u announced to %s", r->rid, attempt, dw->w.name);
	}
	msg_init(&m, MSG_PREFILL_REQUEST);
	struct msg_prefill_request *p = &m.u.prefill_request;
	p->has_attempt = dw->fence_attempts;
	p->attempt = dw->fence_attempts ? attempt : 0;
	p->rid = r->id;
	p->n_tokens = r->n_prompt;
	p->tokens = (const uint32_t *)r->prompt;
	fill_sampling(r, &p->sampling);
	snprintf(p->target_name, sizeof(p->target_name), "%.64s", dw->w.name);
	p->target_ucx_address = dw->ucx_address;
	p->target_ucx_address_len = dw->ucx_address_len;
	p->target_region = dw->region;
	p->n_block_ids = r->n_block_ids;
	p->block_ids = r->block_ids;
	p->deadline_ms = prefill_window_ms(rw->ws, r);
	return send_msg(rw, &m);
}

static void op_release(struct worker *w, struct req *r)
{
	struct rworker *rw = w->impl;
	struct msg m;
	if (w->role == WORKER_ROLE_PREFILL) {
		msg_init(&m, MSG_CANCEL);
		m.u.cancel.rid = r->id;
		m.u.cancel.reason = MSG_ERR_CANCELLED;
		(void)send_msg(rw, &m);
		return;
	}
	map_del(rw->ws, r);
	if (r->decode_finished)
		return;
	if (r->kv_ready_sent) {
		msg_init(&m, MSG_CANCEL);
		m.u.cancel.rid = r->id;
		m.u.cancel.reason = MSG_ERR_CANCELLED;
	} else {
		msg_init(&m, MSG_KV_RELEASE);
		m.u.kv_release.rid = r->id;
		/* no PrefillRequest out, or PrefillDone in: nothing can be writing the blocks */
		m.u.kv_release.no_writer = r->state == REQ_STATE_ADMITTED ||
		                           r->state == REQ_STATE_KV_RESERVED ||
		                           r->state == REQ_STATE_KV_TRANSFERRING;
	}
	(void)send_msg(rw, &m);
}

static const struct worker_ops remote_ops = {op_reserve, op_prefill, op_release};

/* ---- receiving ------------------------------------------------------------------------------- */

static void to_req_token(const struct msg_token *t, struct req_token *o)
{
	memset(o, 0, sizeof(*o));
	o->id = (int32_t)t->id;
	o->logprob = t->logprob;
	o->n_top = (int)(t->n_top > REQ_MAX_TOP_LOGPROBS ? REQ_MAX_TOP_LOGPROBS : t->n_top);
	for (int i = 0; i < o->n_top; i++) {
		o->top_ids[i] = (int32_t)t->top_ids[i];
		o->top_logprobs[i] = t->top_logprobs[i];
	}
}

static int status_of(int code)
{
	switch (code) {
	case MSG_ERR_NO_CAPACITY:
	case MSG_ERR_DRAINING: return 503;
	case MSG_ERR_INVALID_REQUEST: return 400;
	case MSG_ERR_TIMEOUT: return 504;
	default: return 502;
	}
}

static void kv_layout_from_msg(const struct msg_kv_layout *a, struct kv_layout *o)
{
	static const char *dt[] = {"none", "f32", "bf16", "f16", "fp8_e4m3"};
	memset(o, 0, sizeof(*o));
	snprintf(o->arch, sizeof(o->arch), "%s", a->arch);
	o->n_layers = a->n_layers;
	o->block_size = a->block_size;
	o->kv_lora_rank = a->latent_dim;
	o->rope_dim = a->rope_dim;
	o->indexer_dim = a->indexer_dim;
	o->n_indexer_layers = a->n_indexer_layers;
	snprintf(o->dtype, sizeof(o->dtype), "%s", a->dtype >= 0 && a->dtype <= 4 ? dt[a->dtype] : "?");
	if (a->indexer_dtype != a->dtype && a->indexer_dtype >= 0 && a->indexer_dtype <= 4)
		snprintf(o->dtype + strlen(o->dtype), sizeof(o->dtype) - strlen(o->dtype), "/%s",
		         dt[a->indexer_dtype]);
}

static int on_hello(struct rworker *rw, const struct msg_hello *h)
{
	struct workers *ws = rw->ws;
	struct errbuf e = {0};
	if (h->protocol_version != PROTOCOL_VERSION) {
		conn_close_error(rw->c, MSG_ERR_VERSION,
		                 "protocol version %u not supported (router speaks %u)", h->protocol_version,
		                 PROTOCOL_VERSION);
		return -EPROTO;
	}
	if (ws->auth_token[0] && !ct_str_equal(ws->auth_token, h->auth_token)) {
		LOG_WARN("workers", "worker at %s refused: wrong or missing control token", conn_peer(rw->c));
		conn_close_error(rw->c, MSG_ERR_AUTH, "wrong or missing control token");
		return -EACCES;
	}
	if (h->role != MSG_ROLE_PREFILL && h->role != MSG_ROLE_DECODE) {
		conn_close_error(rw->c, MSG_ERR_PROTOCOL, "role %s cannot register", msg_role_name(h->role));
		return -EPROTO;
	}
	if (h->role == MSG_ROLE_DECODE &&
	    (!h->has_kv_region || h->ucx_address_len == 0 || h->n_blocks_total == 0)) {
		conn_close_error(rw->c, MSG_ERR_PROTOCOL,
		                 "decode worker must send its UCX address, KV region and pool size");
		return -EPROTO;
	}
	for (struct rworker *o = ws->list; o; o = o->next)
		if (o != rw && o->registered && strcmp(o->w.name, h->name) == 0) {
			conn_close_error(rw->c, MSG_ERR_DUPLICATE,
			                 "a worker named '%s' is already registered", h->name);
			return -EEXIST;
		}
	struct worker *w = &rw->w;
	w->id = (int)++ws->next_worker_id;
	w->role = h->role == MSG_ROLE_PREFILL ? WORKER_ROLE_PREFILL : WORKER_ROLE_DECODE;
	snprintf(w->name, sizeof(w->name), "%s", h->name[0] ? h->name : conn_peer(rw->c));
	size_t n = h->model_id_len < 32 ? h->model_id_len : 32;
	for (size_t i = 0; i < n; i++)
		snprintf(w->model_id + 2 * i, sizeof(w->model_id) - 2 * i, "%02x", h->model_id[i]);
	if (n == 0)
		snprintf(w->model_id, sizeof(w->model_id), "%s", h->model_name);
	kv_layout_from_msg(&h->kv_layout, &w->layout);
	w->tp = h->tp_degree;
	w->ops = &remote_ops;
	w->impl = rw;
	w->n_blocks_total = h->n_blocks_total;
	w->n_blocks_free = h->n_blocks_total;
	w->n_running_max = h->max_batch;
	if (h->role == MSG_ROLE_DECODE) {
		rw->ucx_address = malloc(h->ucx_address_len);
		uint8_t *rkey = h->kv_region.rkey_len ? malloc(h->kv_region.rkey_len) : NULL;
		if (!rw->ucx_address || (h->kv_region.rkey_len && !rkey)) {
			free(rkey);
			conn_close_error(rw->c, MSG_ERR_INTERNAL, "router out of memory");
			return -ENOMEM;
		}
		memcpy(rw->ucx_address, h->ucx_address, h->ucx_address_len);
		rw->ucx_address_len = h->ucx_address_len;
		rw->region = h->kv_region;
		rw->fence_attempts = h->fence_attempts;
		if (rkey)
			memcpy(rkey, h->kv_region.rkey, h->kv_region.rkey_len);
		rw->region.rkey = rkey;
	}
	int rc = sched_worker_add(ws->sched, w, &e);
	if (rc) {
		LOG_WARN("workers", "%s", e.msg);
		metrics_add(ws->registrations_refused, 1);
		int code = strstr(e.msg, "model identity") ? MSG_ERR_MODEL_MISMATCH : MSG_ERR_LAYOUT_MISMATCH;
		conn_close_error(rw->c, code, "%s", e.msg);
		return rc;
	}
	rw->registered = true;
	LOG_INFO("workers", "%s worker '%s' registered from %s (pid %u, tp %u, model %s, ucx %s)",
	         msg_role_name(h->role), w->name, conn_peer(rw->c), h->pid, h->tp_degree, h->model_name,
	         h->ucx_transports[0] ? h->ucx_transports : "-");
	struct msg ack;
	msg_init(&ack, MSG_HELLO_ACK);
	ack.u.hello_ack.protocol_version = PROTOCOL_VERSION;
	ack.u.hello_ack.worker_id = (uint32_t)w->id;
	ack.u.hello_ack.heartbeat_ms = ws->cfg.heartbeat_ms;
	return send_msg(rw, &ack);
}

/* The request rid, if this worker is the one holding it in the role the message implies. */
static struct req *lookup(struct rworker *rw, uint64_t rid, enum worker_role role)
{
	struct req *r = map_get(rw->ws, rid);
	if (!r || r->ended)
		return NULL;
	if (role == WORKER_ROLE_DECODE && r->decode != &rw->w)
		return NULL;
	if (role == WORKER_ROLE_PREFILL && r->prefill != &rw->w)
		return NULL;
	return r;
}

static int on_msg_cb(struct conn *c, struct msg *m, void *ud)
{
	struct rworker *rw = ud;
	struct workers *ws = rw->ws;
	(void)c;
	if (!rw->registered) {
		if (m->type != MSG_HELLO) {
			conn_close_error(rw->c, MSG_ERR_PROTOCOL, "expected Hello, got %s",
			                 msg_type_name(m->type));
			return -EPROTO;
		}
		return on_hello(rw, &m->u.hello) < 0 ? -EPROTO : 0;
	}
	struct req *r;
	switch (m->type) {
	case MSG_HEARTBEAT: {
		const struct msg_heartbeat *h = &m->u.heartbeat;
		if (rw->w.role == WORKER_ROLE_DECODE) {
			rw->w.n_blocks_free =
			    h->free_blocks <= rw->w.n_blocks_total ? h->free_blocks : rw->w.n_blocks_total;
			rw->w.n_running = h->running_seqs;
		} else {
			rw->w.n_queued_tokens = h->queued_tokens;
		}
		if (h->draining && !rw->w.draining) {
			rw->w.draining = true;
			LOG_INFO("workers", "worker '%s' is draining: no new work goes to it", rw->w.name);
		}
		sched_worker_load_changed(ws->sched, &rw->w);
		return 0;
	}
	case MSG_DRAIN:
		rw->w.draining = true;
		LOG_INFO("workers", "worker '%s' is draining: no new work goes to it", rw->w.name);
		sched_worker_load_changed(ws->sched, &rw->w);
		return 0;
	case MSG_KV_RESERVED:
		if (!(r = lookup(rw, m->u.kv_reserved.rid, WORKER_ROLE_DECODE)) ||
		    r->state != REQ_STATE_ADMITTED)
			return 0;
		free(r->block_ids);
		r->block_ids = malloc((m->u.kv_reserved.n_block_ids + 1) * sizeof(uint32_t));
		if (!r->block_ids) {
			sched_on_failed(r, 503, "router out of memory");
			return 0;
		}
		memcpy(r->block_ids, m->u.kv_reserved.block_ids,
		       m->u.kv_reserved.n_block_ids * sizeof(uint32_t));
		r->n_block_ids = (uint32_t)m->u.kv_reserved.n_block_ids;
		sched_on_reserved(r, 0, NULL);
		return 0;
	case MSG_PREFILL_DONE: {
		const struct msg_prefill_done *d = &m->u.prefill_done;
		if (!(r = lookup(rw, d->rid, WORKER_ROLE_PREFILL)))
			return 0;
		metrics_add(ws->kv_bytes, (double)d->kv_bytes);
		sched_on_prefill_done(r);
		if (r->ended || !r->decode)
			return 0;
		struct msg k;
		msg_init(&k, MSG_KV_READY);
		k.u.kv_ready.rid = r->id;
		k.u.kv_ready.first = d->first;
		k.u.kv_ready.n_prompt_tokens = r->n_prompt;
		k.u.kv_ready.n_checksums = d->n_checksums;
		k.u.kv_ready.checksums = d->checksums;
		if (send_msg(r->decode->impl, &k) != 0) {
			sched_on_failed(r, 502, "could not reach the decode worker");
			return 0;
		}
		r->kv_ready_sent = true;
		struct req_token t;
		to_req_token(&d->first, &t);
		sched_on_decode_started(r, &t);
		return 0;
	}
	case MSG_TOKENS: {
		if (!(r = lookup(rw, m->u.tokens.rid, WORKER_ROLE_DECODE)))
			return 0;
		uint64_t rid = r->id;
		for (size_t i = 0; i < m->u.tokens.n_tokens; i++) {
			/* a token may end the request (stop string, EOS): look it up again each time */
			if (!(r = lookup(rw, rid, WORKER_ROLE_DECODE)))
				break;
			struct req_token t;
			to_req_token(&m->u.tokens.tokens[i], &t);
			sched_on_token(r, &t);
		}
		return 0;
	}
	case MSG_FINISH: {
		const struct msg_finish_m *f = &m->u.finish;
		if (!(r = lookup(rw, f->rid, WORKER_ROLE_DECODE)))
			return 0;
		r->decode_finished = true;
		if (f->reason == MSG_FINISH_STOP)
			sched_on_finished(r, f->stop_index >= 0 ? REQ_FINISH_STOP : REQ_FINISH_EOS);
		else if (f->reason == MSG_FINISH_LENGTH)
			sched_on_finished(r, REQ_FINISH_LENGTH);
		else if (f->reason == MSG_FINISH_ERROR)
			sched_on_failed(r, status_of(f->error_code),
			                f->error_message[0] ? f->error_message : "decode failed");
		else
			sched_on_failed(r, 502, "decode worker cancelled the request");
		return 0;
	}
	case MSG_ERROR: {
		const struct msg_error_m *er = &m->u.error;
		if (!er->has_rid) {
			LOG_WARN("workers", "worker '%s' reports %s: %s", rw->w.name,
			         msg_error_name(er->code), er->message);
			return 0;
		}
		r = map_get(ws, er->rid);
		if (!r || r->ended || (r->decode != &rw->w && r->prefill != &rw->w))
			return 0;
		if (r->decode == &rw->w && r->state == REQ_STATE_ADMITTED &&
		    er->code == MSG_ERR_NO_CAPACITY) {
			map_del(ws, r);
			r->decode_finished = true; /* nothing reserved there: no KvRelease */
			sched_on_reserved(r, -EAGAIN, er->message);
			r->decode_finished = false;
			/* believe the worker until its next heartbeat, or we would re-ask at once */
			rw->w.n_blocks_free = 0;
			return 0;
		}
		if (r->decode == &rw->w)
			r->decode_finished = true; /* the worker dropped it already */
		char msg[700];
		snprintf(msg, sizeof(msg), "%s worker '%s': %s",
		         rw->w.role == WORKER_ROLE_PREFILL ? "prefill" : "decode", rw->w.name,
		         er->message[0] ? er->message : msg_error_name(er->code));
		if (rw->w.role == WORKER_ROLE_PREFILL && er->code == MSG_ERR_TRANSFER && r->prefill == &rw->w)
			sched_on_kv_transfer_failed(r, msg); /* the decode side broke: place it again */
		else
			sched_on_failed(r, status_of(er->code), msg);
		return 0;
	}
	default:
		conn_close_error(rw->c, MSG_ERR_PROTOCOL, "%s is not a message a worker sends",
		                 msg_type_name(m->type));
		return -EPROTO;
	}
}

static void rworker_free(struct rworker *rw)
{
	free(rw->ucx_address);
	free((void *)rw->region.rkey);
	free(rw);
}

static void on_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	struct rworker *rw = ud;
	struct workers *ws = rw->ws;
	(void)c;
	rw->c = NULL;
	if (rw->prev)
		rw->prev->next = rw->next;
	else if (ws)
		ws->list = rw->next;
	if (rw->next)
		rw->next->prev = rw->prev;
	if (rw->registered && ws) {
		char reason[300];
		snprintf(reason, sizeof(reason), "control connection closed (%s)",
		         why && why[0] ? why : err_name(err));
		sched_worker_lost(ws->sched, &rw->w, reason);
		/* collect first: the lost-request handling changes the map */
		size_t n = 0;
		struct req **held = malloc((ws->n + 1) * sizeof(*held));
		for (size_t i = 0; held && i < ws->cap; i++) {
			struct req *r = ws->vals[i];
			if (ws->keys[i] && (r->decode == &rw->w || r->prefill == &rw->w))
				held[n++] = r;
		}
		for (size_t i = 0; i < n; i++) {
			if (held[i]->decode == &rw->w)
				map_del(ws, held[i]);
			sched_on_worker_lost_req(held[i], &rw->w);
		}
		free(held);
	}
	rworker_free(rw);
}

static int accept_cb(struct conn_listener *l, struct conn *c, void *ud)
{
	struct workers *ws = ud;
	(void)l;
	if (ws->destroying)
		return -1;
	struct rworker *rw = calloc(1, sizeof(*rw));
	if (!rw)
		return -1;
	rw->ws = ws;
	rw->c = c;
	rw->next = ws->list;
	if (ws->list)
		ws->list->prev = rw;
	ws->list = rw;
	conn_set_ud(c, rw);
	return 0;
}

static void hb_cb(uv_timer_t *t)
{
	struct workers *ws = t->data;
	struct msg m;
	msg_init(&m, MSG_HEARTBEAT);
	for (struct rworker *rw = ws->list; rw; rw = rw->next)
		if (rw->registered && rw->c)
			(void)send_msg(rw, &m);
}

int workers_create(struct workers **out, uv_loop_t *loop, struct sched *s, const struct workers_config *cfg,
                   struct metrics *m, struct errbuf *e)
{
	struct workers *ws = calloc(1, sizeof(*ws));
	if (!ws)
		return errbuf_set(e, -ENOMEM, "workers: out of memory");
	ws->loop = loop;
	ws->sched = s;
	ws->cfg = *cfg;
	if (!ws->cfg.heartbeat_ms)
		ws->cfg.heartbeat_ms = 1000;
	snprintf(ws->listen_addr, sizeof(ws->listen_addr), "%s", cfg->listen_addr ? cfg->listen_addr : "");
	snprintf(ws->auth_token, sizeof(ws->auth_token), "%s", cfg->auth_token ? cfg->auth_token : "");
	ws->cfg.listen_addr = ws->listen_addr;
	ws->cfg.auth_token = ws->auth_token;
	if (m) {
		ws->kv_bytes =
		    metrics_counter(m, "tandem_router_kv_transferred_bytes_total", NULL,
		                    "KV-cache bytes prefill workers reported writing to decode workers");
		ws->registrations_refused =
		    metrics_counter(m, "tandem_router_worker_registrations_refused_total", NULL,
		                    "Workers refused at registration (model or KV layout mismatch)");
	}
	struct conn_opts o = {
	    .idle_timeout_ms = 3 * ws->cfg.heartbeat_ms + 500,
	    .on_msg_cb = on_msg_cb,
	    .on_close_cb = on_close_cb,
	    .ud = NULL,
	};
	int rc = conn_listen(loop, ws->listen_addr, &o, accept_cb, ws, &ws->listener, e);
	if (rc) {
		free(ws);
		return errbuf_prefix(e, "control listener");
	}
	uv_timer_init(loop, &ws->hb_timer);
	ws->hb_timer.data = ws;
	uv_timer_start(&ws->hb_timer, hb_cb, ws->cfg.heartbeat_ms, ws->cfg.heartbeat_ms);
	*out = ws;
	return 0;
}

int workers_port(const struct workers *ws)
{
	return conn_listener_port(ws->listener);
}

void workers_drain(struct workers *ws)
{
	if (!ws)
		return;
	struct msg m;
	msg_init(&m, MSG_DRAIN);
	for (struct rworker *rw = ws->list; rw; rw = rw->next)
		if (rw->registered && rw->c)
			(void)send_msg(rw, &m);
}

static void hb_closed_cb(uv_handle_t *h)
{
	struct workers *ws = h->data;
	free(ws->keys);
	free(ws->vals);
	free(ws);
}

void workers_destroy(struct workers *ws)
{
	if (!ws)
		return;
	ws->destroying = true;
	conn_listener_close(ws->listener);
	/* connections close asynchronously; their close callbacks must not touch ws after it is freed,
	 * so detach them and hand their requests to the scheduler now */
	while (ws->list) {
		struct rworker *rw = ws->list;
		ws->list = rw->next;
		rw->prev = rw->next = NULL;
		if (rw->registered) {
			sched_worker_lost(ws->sched, &rw->w, "router shutting down");
			for (size_t i = 0; i < ws->cap; i++) {
				struct req *r = ws->vals[i];
				if (ws->keys[i] && (r->decode == &rw->w || r->prefill == &rw->w)) {
					if (r->decode == &rw->w)
						map_del(ws, r), i = (size_t)-1; /* the map shifted: rescan */
					sched_on_worker_lost_req(r, &rw->w);
				}
			}
			rw->registered = false;
		}
		rw->ws = NULL;
		if (rw->c)
			conn_close(rw->c, "router shutting down");
	}
	uv_timer_stop(&ws->hb_timer);
	uv_close((uv_handle_t *)&ws->hb_timer, hb_closed_cb);
}
