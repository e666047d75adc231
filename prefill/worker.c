/* tandem-prefill, loop thread (see worker.h). Requests arrive from the router as PrefillRequest;
 * each is checked against what this worker can do (prompt length, token ids, reserved blocks,
 * queue budget) before it reaches the engine, so a bad request fails alone with a clear Error
 * and never reaches the model. Results go back as PrefillDone (KV written, first token) or
 * Error(rid, code). Every request-related log line carries rid=. */
#include "prefill/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/model/model.h"
#include "common/net/kvx.h"
#include "common/net/metrics.h"
#include "common/net/runtime.h"
#include "common/net/session.h"
#include "common/net/wlife.h"
#include "prefill/engine.h"

#define MAP_BUCKETS 1024
/* Longest write window of a job whose decode target sizes its quarantine for 120 s only (no
 * per-attempt fences: an older decode worker): its default quarantine (180 s) is longer by a
 * margin. A target that announces per-attempt fences quarantines for the request's own window
 * (tandem.proto KvReserve.prefill_window_ms), so there the router's deadline holds, up to the
 * router's own maximum (6 h). */
#define PF_WRITE_WINDOW_MAX_MS 120000u
#define PF_WRITE_WINDOW_MAX_MS_FENCED (6u * 3600u * 1000u)

struct pf_worker {
	const struct pf_config *c;
	uv_loop_t *loop;
	struct model *model;
	struct kvx *kvx;
	struct pf_engine *eng;
	struct runtime *rt;
	struct metrics *reg;
	struct msg_kv_layout layout;
	uint8_t model_id[8];
	char model_name[MSG_NAME_MAX + 1];
	struct pf_job *map[MAP_BUCKETS];
	uint64_t queued_tokens;
	uint32_t n_inflight;
	struct wlife life; /* registration, readiness, drain, stop (common/net/wlife.h) */
	uv_timer_t idle_check;
	struct metric *m_req_ok, *m_req_failed, *m_req_cancelled, *m_req_refused;
	struct metric *m_queue_tokens, *m_inflight;
	int exit_code;
};

void pf_config_default(struct pf_config *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "prefill-%d", (int)getpid());
	snprintf(c->router, sizeof(c->router), "127.0.0.1:9100"); /* the router's default control_addr */
	snprintf(c->metrics, sizeof(c->metrics), "127.0.0.1:0");
	snprintf(c->engine, sizeof(c->engine), "model");
	snprintf(c->kv_dtype, sizeof(c->kv_dtype), "f32");
	snprintf(c->log_level, sizeof(c->log_level), "info");
	snprintf(c->backend, sizeof(c->backend), "cpu");
	c->threads = 1;
	c->tp = 1;
	c->local_blocks = 256;
	c->max_tokens_per_step = 2048;
	c->max_batch = 16;
	c->max_queued_tokens = 1 << 20;
	c->heartbeat_ms = 1000;
	c->flush_timeout_ms = 10000;
	c->drain_timeout_ms = 30000;
}

/* ---- rid map ---------------------------------------------------------------------------------- */

static struct pf_job **map_slot(struct pf_worker *w, uint64_t rid)
{
	struct pf_job **pp = &w->map[rid % MAP_BUCKETS];
	while (*pp && (*pp)->rid != rid)
		pp = &(*pp)->map_next;
	return pp;
}

/* ---- sending ----------------------------------------------------------------------------------- */

static void send_error(struct pf_worker *w, uint64_t rid, int code, const char *text)
{
	struct msg m;
	msg_init(&m, MSG_ERROR);
	m.u.error.has_rid = rid != 0;
	m.u.error.rid = rid;
	m.u.error.code = code;
	snprintf(m.u.error.message, sizeof(m.u.error.message), "%s: %s", w->c->name, text);
	struct errbuf e;
	if (session_send(w->life.sess, &m, &e))
		LOG_WARN("prefill", "rid=%llu error not sent to the router: %s", (unsigned long long)rid,
		         e.msg);
}

static void update_gauges(struct pf_worker *w)
{
	metrics_set(w->m_queue_tokens, (double)w->queued_tokens);
	metrics_set(w->m_inflight, w->n_inflight);
}

/* engine -> loop: a job is done (or failed, or was cancelled) */
static void job_done_cb(struct pf_job *j, void *ud)
{
	struct pf_worker *w = ud;
	if (j->fence_only) {
		send_error(w, j->rid, j->err_code, j->err_msg);
		pf_job_free(j);
		return;
	}
	struct pf_job **pp = map_slot(w, j->rid);
	if (*pp == j)
		*pp = j->map_next;
	w->queued_tokens -= j->n_tokens;
	w->n_inflight--;
	update_gauges(w);
	if (j->cancelled_by_router) {
		LOG_INFO("prefill", "rid=%llu cancelled by the router", (unsigned long long)j->rid);
		metrics_add(w->m_req_cancelled, 1);
	} else if (j->status == 0) {
		struct msg m;
		msg_init(&m, MSG_PREFILL_DONE);
		struct msg_prefill_done *d = &m.u.prefill_done;
		d->rid = j->rid;
		d->first = j->first;
		d->n_prompt_tokens = j->n_tokens;
		d->kv_bytes = j->kv_bytes;
		d->n_checksums = j->n_checksums;
		d->checksums = j->checksums;
		d->prefill_us = j->prefill_us;
		d->transfer_us = j->transfer_us;
		struct errbuf e;
		if (session_send(w->life.sess, &m, &e))
			LOG_WARN("prefill", "rid=%llu PrefillDone not sent: %s", (unsigned long long)j->rid,
			         e.msg);
		LOG_INFO("prefill",
		         "rid=%llu done: %u prompt tokens, first token %u, %llu KV bytes to %s, prefill %u "
		         "us, transfer %u us",
		         (unsigned long long)j->rid, j->n_tokens, j->first.id,
		         (unsigned long long)j->kv_bytes, j->target_name, j->prefill_us, j->transfer_us);
		metrics_add(w->m_req_ok, 1);
	} else {
		LOG_WARN("prefill", "rid=%llu failed (%s): %s", (unsigned long long)j->rid,
		         msg_error_name(j->err_code), j->err_msg);
		send_error(w, j->rid, j->err_code, j->err_msg);
		metrics_add(w->m_req_failed, 1);
	}
	pf_job_free(j);
	wlife_maybe_finish_drain(&w->life);
}

/* ---- requests ----------------------------------------------------------------------------------- */

static void *dup_bytes(const void *p, size_t n)
{
	void *q = malloc(n ? n : 1);
	if (q && n)
		memcpy(q, p, n);
	return q;
}

/* A refused request still fences its target, so that decode can free the reservation at once
 * (it cannot tell "never written" from "maybe still being written"): the engine thread, which
 * owns the UCX endpoints, writes the fence, then job_done_cb sends the Error. Returns false when
 * that is not possible (no fences on the target, no engine, out of memory): Error at once. */
static bool fence_refused(struct pf_worker *w, const struct msg_prefill_request *r, int code, const char *why)
{
	if (!w->eng || w->life.stopping || !r->target_region.fence_addr || !r->n_block_ids ||
	    !r->target_ucx_address_len || !r->target_region.rkey_len)
		return false;
	struct pf_job *j = calloc(1, sizeof(*j));
	if (!j)
		return false;
	j->rid = r->rid;
	j->fence_attempt = r->attempt;
	j->has_attempt = r->has_attempt;
	j->fence_only = true;
	j->status = -EINVAL;
	j->err_code = code;
	snprintf(j->err_msg, sizeof(j->err_msg), "%s", why);
	j->ucx_addr = dup_bytes(r->target_ucx_address, r->target_ucx_address_len);
	j->ucx_addr_len = r->target_ucx_address_len;
	j->rkey = dup_bytes(r->target_region.rkey, r->target_region.rkey_len);
	j->rkey_len = r->target_region.rkey_len;
	j->region = r->target_region;
	j->region.rkey = NULL;
	j->n_block_ids = 1;
	j->block_ids = dup_bytes(r->block_ids, sizeof(uint32_t));
	if (!j->ucx_addr || !j->rkey || !j->block_ids) {
		pf_job_free(j);
		return false;
	}
	pf_engine_submit(w->eng, j);
	return true;
}

static void on_prefill_request(struct pf_worker *w, const struct msg_prefill_request *r)
{
	char why[256];
	int code = MSG_ERR_INVALID_REQUEST;
	uint32_t vocab = pf_engine_vocab(w->eng);
	uint32_t bs = w->layout.block_size;
	if (w->life.draining) {
		code = MSG_ERR_DRAINING;
		snprintf(why, sizeof(why), "worker is draining");
		goto refuse;
	}
	if (*map_slot(w, r->rid)) {
		code = MSG_ERR_DUPLICATE;
		snprintf(why, sizeof(why), "request id already in progress here");
		goto refuse;
	}
	if (r->n_tokens > pf_engine_max_seq_len(w->eng)) {
		snprintf(why, sizeof(why), "prompt of %zu tokens exceeds the context limit %u", r->n_tokens,
		         pf_engine_max_seq_len(w->eng));
		goto refuse;
	}
	for (size_t i = 0; i < r->n_tokens; i++)
		if (r->tokens[i] >= vocab) {
			snprintf(why, sizeof(why), "token %zu has id %u outside the vocabulary of %u", i,
			         r->tokens[i], vocab);
			goto refuse;
		}
	size_t need = (r->n_tokens + bs - 1) / bs;
	if (r->n_block_ids < need) {
		snprintf(why, sizeof(why), "prompt needs %zu KV blocks, decode reserved %zu", need,
		         r->n_block_ids);
		goto refuse;
	}
	if ((uint64_t)r->target_region.n_segments * r->target_region.segment_bytes != w->layout.block_bytes) {
		code = MSG_ERR_LAYOUT_MISMATCH;
		snprintf(why, sizeof(why), "decode %s has %llu-byte KV blocks, this worker %llu",
		         r->target_name,
		         (unsigned long long)r->target_region.n_segments * r->target_region.segment_bytes,
		         (unsigned long long)w->layout.block_bytes);
		goto refuse;
	}
	if (w->queued_tokens + r->n_tokens > (uint64_t)w->c->max_queued_tokens) {
		code = MSG_ERR_NO_CAPACITY;
		snprintf(why, sizeof(why), "queue full (%llu tokens queued, limit %d)",
		         (unsigned long long)w->queued_tokens, w->c->max_queued_tokens);
		goto refuse;
	}
	struct pf_job *j = calloc(1, sizeof(*j));
	if (!j) {
		code = MSG_ERR_INTERNAL;
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	j->rid = r->rid;
	j->fence_attempt = r->attempt;
	j->has_attempt = r->has_attempt;
	j->n_tokens = (uint32_t)r->n_tokens;
	j->tokens = dup_bytes(r->tokens, r->n_tokens * sizeof(uint32_t));
	j->sampling = r->sampling;
	snprintf(j->target_name, sizeof(j->target_name), "%s", r->target_name);
	j->ucx_addr = dup_bytes(r->target_ucx_address, r->target_ucx_address_len);
	j->ucx_addr_len = r->target_ucx_address_len;
	j->rkey = dup_bytes(r->target_region.rkey, r->target_region.rkey_len);
	j->rkey_len = r->target_region.rkey_len;
	j->region = r->target_region;
	j->region.rkey = NULL;
	j->n_block_ids = (uint32_t)need; /* only the prompt's blocks are written */
	j->block_ids = dup_bytes(r->block_ids, need * sizeof(uint32_t));
	j->want_checksums = r->checksums;
	/* the hard write window (tandem.proto PrefillRequest.deadline_ms): never unbounded, since the
	 * decode worker reuses quarantined blocks after a deadline that must exceed it */
	uint32_t cap = r->has_attempt ? PF_WRITE_WINDOW_MAX_MS_FENCED : PF_WRITE_WINDOW_MAX_MS;
	uint32_t window = r->deadline_ms && r->deadline_ms < cap ? r->deadline_ms : cap;
	j->deadline_ms = uv_hrtime() / 1000000u + window;
	if (!j->tokens || !j->ucx_addr || !j->rkey || !j->block_ids) {
		pf_job_free(j);
		code = MSG_ERR_INTERNAL;
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	*map_slot(w, j->rid) = j;
	w->queued_tokens += j->n_tokens;
	w->n_inflight++;
	update_gauges(w);
	LOG_DEBUG("prefill", "rid=%llu queued: %u tokens -> %s blocks %u..", (unsigned long long)j->rid,
	          j->n_tokens, j->target_name, j->block_ids[0]);
	pf_engine_submit(w->eng, j);
	return;
refuse:
	LOG_WARN("prefill", "rid=%llu refused (%s): %s", (unsigned long long)r->rid, msg_error_name(code),
	         why);
	metrics_add(w->m_req_refused, 1);
	if (code != MSG_ERR_DUPLICATE && fence_refused(w, r, code, why))
		return; /* the Error follows the fence */
	send_error(w, r->rid, code, why);
}

/* Router lost: stop every job. The router that placed them may retry a prefill on the same
 * decode reservation elsewhere (it does when a prefill worker is lost). Where the decode target
 * tells attempts apart (the job has an attempt), our fence names this attempt only and decode
 * ignores it once a newer attempt is announced, so we fence as usual and decode gets its blocks
 * back early if there is no newer attempt. Without attempts a fence from this stale attempt would
 * vouch for blocks the new attempt is still writing: leave without one, and decode waits for its
 * quarantine deadline instead. */
static void cancel_all(struct pf_worker *w)
{
	for (int b = 0; b < MAP_BUCKETS; b++)
		for (struct pf_job *j = w->map[b]; j; j = j->map_next) {
			j->cancelled_by_router = true;
			if (!j->has_attempt)
				atomic_store(&j->no_fence, 1);
			atomic_store(&j->cancelled, 1);
		}
}

static int on_msg(void *ud, struct msg *m)
{
	struct pf_worker *w = ud;
	switch (m->type) {
	case MSG_PREFILL_REQUEST: on_prefill_request(w, &m->u.prefill_request); return 0;
	case MSG_CANCEL: {
		struct pf_job *j = *map_slot(w, m->u.cancel.rid);
		if (j) {
			j->cancelled_by_router = true;
			atomic_store(&j->cancelled, 1);
		}
		return 0;
	}
	case MSG_ERROR:
		LOG_WARN("prefill", "router reports%s%llu: %s (%s)", m->u.error.has_rid ? " rid=" : " ",
		         (unsigned long long)m->u.error.rid, m->u.error.message,
		         msg_error_name(m->u.error.code));
		return 0;
	default:
		/* decode-side messages sent to a prefill worker: a router bug, not worth a disconnect */
		LOG_WARN("prefill", "ignoring %s: not a prefill message", msg_type_name(m->type));
		send_error(w, 0, MSG_ERR_PROTOCOL, "message type not handled by a prefill worker");
		return 0;
	}
}

/* ---- session callbacks -------------------------------------------------------------------------- */

static void fill_hello(void *ud, struct msg_hello *h)
{
	struct pf_worker *w = ud;
	h->role = MSG_ROLE_PREFILL;
	snprintf(h->name, sizeof(h->name), "%s", w->c->name);
	memcpy(h->model_id, w->model_id, 8);
	h->model_id_len = 8;
	snprintf(h->model_name, sizeof(h->model_name), "%s", w->model_name);
	h->kv_layout = w->layout;
	h->tp_degree = (uint32_t)w->c->tp;
	h->max_batch = (uint32_t)w->c->max_batch;
	h->max_seq_len = pf_engine_max_seq_len(w->eng);
	h->max_tokens_per_step = (uint32_t)w->c->max_tokens_per_step;
	snprintf(h->auth_token, sizeof(h->auth_token), "%s", w->c->auth_token);
	h->metrics_port = (uint32_t)runtime_metrics_port(w->rt);
	snprintf(h->ucx_transports, sizeof(h->ucx_transports), "%s", kvx_transports(w->kvx));
	h->pid = (uint32_t)getpid();
}

static void fill_heartbeat(void *ud, struct msg_heartbeat *hb)
{
	struct pf_worker *w = ud;
	hb->queued_tokens = w->queued_tokens;
	hb->running_seqs = w->n_inflight;
	hb->queued_requests = w->n_inflight;
}

static void on_lost(void *ud, const char *why)
{
	struct pf_worker *w = ud;
	/* the router has failed our requests already: stop working on them */
	cancel_all(w);
}

/* ---- drain / stop ------------------------------------------------------------------------------- */

/* wlife callbacks (common/net/wlife.h) */
static bool is_idle(void *ud)
{
	struct pf_worker *w = ud;
	return w->n_inflight == 0;
}

static void describe(void *ud, char *buf, size_t n)
{
	struct pf_worker *w = ud;
	snprintf(buf, n, "%u requests in flight", w->n_inflight);
}

/* the engine fails what is left with DRAINING: the router re-prefills elsewhere */
static void stop_engine(void *ud)
{
	struct pf_worker *w = ud;
	pf_engine_destroy(w->eng); /* returns in-flight jobs through job_done_cb */
	w->eng = NULL;
}

static bool is_healthy(void *ud)
{
	struct pf_worker *w = ud;
	return w->eng && pf_engine_stall_seconds(w->eng) < 60;
}

/* ---- run ------------------------------------------------------------------------------------- */

static void register_metrics(struct pf_worker *w)
{
	char labels[160];
	snprintf(labels, sizeof(labels), "role=\"prefill\",worker=\"%s\"", w->c->name);
	w->reg = metrics_create(labels);
	struct metrics *r = w->reg;
	w->m_req_ok = metrics_counter(r, "tandem_prefill_requests_total", "outcome=\"ok\"",
	                              "Prefill requests by outcome");
	w->m_req_failed = metrics_counter(r, "tandem_prefill_requests_total", "outcome=\"failed\"", NULL);
	w->m_req_cancelled =
	    metrics_counter(r, "tandem_prefill_requests_total", "outcome=\"cancelled\"", NULL);
	w->m_req_refused = metrics_counter(r, "tandem_prefill_requests_total", "outcome=\"refused\"", NULL);
	w->m_queue_tokens =
	    metrics_gauge(r, "tandem_prefill_queue_tokens", NULL, "Prompt tokens queued or in progress");
	w->m_inflight =
	    metrics_gauge(r, "tandem_prefill_requests_in_flight", NULL, "Prefill requests queued or running");
	struct wlife_cbs lc = {.is_idle_cb = is_idle,
	                       .is_healthy_cb = is_healthy,
	                       .describe_cb = describe,
	                       .stop_cb = stop_engine,
	                       .ud = w};
	wlife_init(&w->life, "prefill", w->c->name, w->c->ready_file, (uint32_t)w->c->drain_timeout_ms,
	           "handing them back to the router", r, &lc);
}

int pf_worker_run(const struct pf_config *c)
{
	struct pf_worker w = {.c = c, .exit_code = 1};
	struct errbuf e = {0};
	w.loop = uv_default_loop();
	register_metrics(&w);
	bool trivial = strcmp(c->engine, "trivial") == 0;
	if (!trivial && strcmp(c->engine, "model") != 0) {
		LOG_ERROR("prefill", "engine '%s': expected \"model\" or \"trivial\"", c->engine);
		w.exit_code = 2;
		goto out_model;
	}
	if (!trivial) {
		if (!c->model[0]) {
			LOG_ERROR("prefill", "no model given (--model PATH.gguf, or --engine trivial)");
			w.exit_code = 2;
			goto out_model;
		}
		/* every device buffer is sized from the limits, never per request: a step has at most
		 * max_tokens_per_step tokens of max_batch prompts of max_seq_len tokens */
		const struct model_worker_opts wo = {.backend = c->backend,
		                                     .kv_dtype = c->kv_dtype,
		                                     .threads = c->threads,
		                                     .tp = c->tp,
		                                     .device = c->device,
		                                     .mem_fraction = c->mem_fraction,
		                                     .max_tokens = c->max_tokens_per_step,
		                                     .max_seqs = c->max_batch,
		                                     .max_ctx = c->max_seq_len};
		if (model_load_worker(&w.model, c->model, &wo, &e)) {
			LOG_ERROR("prefill", "%s", e.msg);
			w.exit_code = 2;
			goto out_model;
		}
		uint64_t h = model_identity_hash(w.model);
		for (int i = 0; i < 8; i++)
			w.model_id[i] = (uint8_t)(h >> (56 - 8 * i));
		const char *base = strrchr(c->model, '/');
		snprintf(w.model_name, sizeof(w.model_name), "%.64s", base ? base + 1 : c->model);
	} else {
		snprintf(w.model_name, sizeof(w.model_name), "trivial");
		memcpy(w.model_id, "trivial", 8);
	}
	struct kvx_opts ko = {.tls = c->ucx_tls,
	                      .net_devices = c->ucx_net_devices,
	                      .want_rdma = c->ucx_want_rdma,
	                      .peer_failure = c->ucx_peer_failure};
	if (kvx_create(&w.kvx, &ko, &e)) {
		LOG_ERROR("prefill", "%s", e.msg);
		goto out_model;
	}
	LOG_INFO("prefill", "UCX transports available: %s", kvx_transports(w.kvx));
	struct pf_engine_opts eo = {.model = w.model,
	                            .n_local_blocks = (uint32_t)c->local_blocks,
	                            .max_tokens_per_step = (uint32_t)c->max_tokens_per_step,
	                            .max_batch = (uint32_t)c->max_batch,
	                            .trivial_step_us = (uint32_t)c->trivial_step_us,
	                            .flush_timeout_ms = (uint32_t)c->flush_timeout_ms,
	                            .kv_staged = c->kv_staged,
	                            .max_seq_len =
	                                w.model && model_get_opts(w.model)->backend == MODEL_BACKEND_CUDA
	                                    ? (uint32_t)model_get_opts(w.model)->max_ctx
	                                    : (uint32_t)c->max_seq_len,
	                            .kvx = w.kvx,
	                            .loop = w.loop,
	                            .done_cb = job_done_cb,
	                            .ud = &w};
	eo.metrics.tokens =
	    metrics_counter(w.reg, "tandem_prefill_tokens_total", NULL, "Prompt tokens prefilled");
	eo.metrics.kv_bytes = metrics_counter(w.reg, "tandem_kv_transfer_bytes_total", NULL,
	                                      "KV bytes written to decode workers over UCX");
	eo.metrics.step_seconds =
	    metrics_histogram(w.reg, "tandem_prefill_step_seconds", NULL, "Prefill step (forward) time",
	                      metrics_latency_bounds, metrics_n_latency_bounds);
	eo.metrics.transfer_seconds = metrics_histogram(w.reg, "tandem_kv_transfer_seconds", NULL,
	                                                "Per request: first KV put to remote completion",
	                                                metrics_latency_bounds, metrics_n_latency_bounds);
	if (w.model && (c->kv_staged || model_kv_on_device(w.model)))
		eo.metrics.stage_seconds =
		    metrics_histogram(w.reg, "tandem_prefill_kv_stage_seconds", NULL,
		                      "Staged KV: copy of a step's finished blocks from the model's pool to "
		                      "the UCX staging copy",
		                      metrics_latency_bounds, metrics_n_latency_bounds);
	if (pf_engine_create(&eo, &w.eng, &e)) {
		LOG_ERROR("prefill", "cannot start the engine: %s", e.msg);
		goto out_kvx;
	}
	pf_engine_layout(w.eng, &w.layout);
	struct runtime_opts ro = {.metrics_addr = c->metrics,
	                          .metrics = w.reg,
	                          .is_ready_cb = wlife_is_ready_cb,
	                          .is_healthy_cb = wlife_is_healthy_cb,
	                          .on_signal_cb = wlife_on_signal_cb,
	                          .ud = &w.life};
	if (runtime_start(w.loop, &ro, &w.rt, &e)) {
		LOG_ERROR("prefill", "%s", e.msg);
		pf_engine_destroy(w.eng);
		goto out_kvx;
	}
	wlife_start(&w.life, w.loop, w.rt);
	struct session_opts so = {.router_addr = c->router, .heartbeat_ms = (uint32_t)c->heartbeat_ms};
	struct session_cbs sc = {.fill_hello_cb = fill_hello,
	                         .fill_heartbeat_cb = fill_heartbeat,
	                         .on_msg_cb = on_msg,
	                         .on_lost_cb = on_lost,
	                         .ud = &w};
	if (wlife_start_session(&w.life, w.loop, &so, &sc, &e)) {
		LOG_ERROR("prefill", "%s", e.msg);
		runtime_stop(w.rt);
		pf_engine_destroy(w.eng);
		goto out_kvx;
	}
	LOG_INFO("prefill",
	         "%s: engine %s, KV layout %s fingerprint %016llx (%llu-byte blocks), metrics on port %d, "
	         "router %s",
	         c->name, c->engine, w.layout.arch, (unsigned long long)w.layout.fingerprint,
	         (unsigned long long)w.layout.block_bytes, runtime_metrics_port(w.rt), c->router);
	uv_run(w.loop, UV_RUN_DEFAULT);
	w.exit_code = 0;
out_kvx:
	uv_run(w.loop, UV_RUN_NOWAIT);
	kvx_destroy(w.kvx);
out_model:
	model_destroy(w.model);
	metrics_destroy(w.reg);
	wlife_fini(&w.life);
	return w.exit_code;
}
