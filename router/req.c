/* The request state machine (DESIGN.md §4). The scheduler (sched.c) drives it; this file owns the
 * legal transitions, the per-stage deadline timer and the request's memory.
 *
 *   RECEIVED --sched_submit()--> ADMITTED --(decode ops->reserve ... sched_on_reserved(ok))--> KV_RESERVED
 *      |                            |  (waits in the bounded admission queue until a decode worker
 *      |                            |   has the blocks; sched_pump() places it)
 *      |                            v
 *      |   KV_RESERVED --sched_pump(): prefill ops->prefill()--> PREFILLING
 *      |   PREFILLING --sched_on_prefill_done()--> KV_TRANSFERRING
 *      |   PREFILLING --sched_on_worker_lost(prefill)--> KV_RESERVED (re-prefill elsewhere, bounded tries)
 *      |   KV_TRANSFERRING --sched_on_decode_started(first token)--> DECODING
 *      |   KV_RESERVED / PREFILLING / KV_TRANSFERRING --sched_on_worker_lost_req(decode)--> ADMITTED
 *      |        (the decode worker died before any token reached the client: cancel the prefill,
 *      |         place the request again at the head of the queue; bounded by n_prefill_tries_max)
 *      |   PREFILLING / KV_TRANSFERRING --sched_on_kv_transfer_failed()--> ADMITTED
 *      |        (the prefill worker's KV push to the decode worker failed: the same, and placement
 *      |         avoids that decode worker for SCHED_SUSPECT_MS)
 *      |   DECODING --sched_on_token()* ... sched_on_finished()/sched_finish()--> DONE
 *      |
 *      +--any non-final state--> FAILED     sched_fail(): deadline expired (stage_timeout_cb),
 *      |                                    worker lost mid-decode, worker refused, queue timeout
 *      +--any non-final state--> CANCELLED  sched_cancel(): client went away, stop string matched
 *                                           early, server shutting down
 *
 * Invariants: a request is in the admission queue iff it is ADMITTED; r->decode is set iff the
 * decode worker holds blocks for it (KV_RESERVED..DECODING); r->prefill is set iff a prefill
 * worker holds work for it (PREFILLING, KV_TRANSFERRING); entering a final state releases both
 * exactly once (sched.c: release_all) and the sink's end callback runs exactly once. */
#include "router/req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"

static const char *const state_names[REQ_STATE_COUNT] = {
    "RECEIVED", "ADMITTED", "KV_RESERVED", "PREFILLING", "KV_TRANSFERRING",
    "DECODING", "DONE",     "FAILED",      "CANCELLED",
};

const char *req_state_name(enum req_state s)
{
	return (unsigned)s < REQ_STATE_COUNT ? state_names[s] : "?";
}

bool req_state_is_final(enum req_state s)
{
	return s == REQ_STATE_DONE || s == REQ_STATE_FAILED || s == REQ_STATE_CANCELLED;
}

/* allowed[from] is the bit set of states reachable in one step */
#define B(s) (1u << (s))
static const unsigned allowed[REQ_STATE_COUNT] = {
    [REQ_STATE_RECEIVED] = B(REQ_STATE_ADMITTED),
    [REQ_STATE_ADMITTED] = B(REQ_STATE_KV_RESERVED),
    [REQ_STATE_KV_RESERVED] = B(REQ_STATE_PREFILLING) | B(REQ_STATE_ADMITTED),
    [REQ_STATE_PREFILLING] = B(REQ_STATE_KV_TRANSFERRING) | B(REQ_STATE_KV_RESERVED) | B(REQ_STATE_ADMITTED),
    [REQ_STATE_KV_TRANSFERRING] = B(REQ_STATE_DECODING) | B(REQ_STATE_ADMITTED),
    [REQ_STATE_DECODING] = B(REQ_STATE_DONE),
};
#undef B

struct req *req_create(uv_loop_t *loop, uint64_t id, int32_t *prompt, uint32_t n_prompt, uint32_t n_max_new,
                       uint32_t n_ctx, const struct req_sampling *s, const struct req_sink *sink,
                       void *sink_ud)
{
	struct req *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->id = id;
	/* decimal, as the workers print the protocol rid: one grep finds a request in every log */
	snprintf(r->rid, sizeof(r->rid), "%llu", (unsigned long long)id);
	r->state = REQ_STATE_RECEIVED;
	r->prompt = prompt;
	r->n_prompt = n_prompt;
	r->n_max_new = n_max_new;
	r->n_ctx = n_ctx;
	r->sampling = *s;
	r->sink = sink;
	r->sink_ud = sink_ud;
	r->t_received = uv_hrtime();
	uv_timer_init(loop, &r->deadline);
	r->deadline.data = r;
	r->timer_open = true;
	return r;
}

static void timer_closed_cb(uv_handle_t *h)
{
	struct req *r = h->data;
	free(r->block_ids);
	free(r->prompt);
	free(r);
}

void req_destroy(struct req *r)
{
	if (!r)
		return;
	TD_ASSERT(r->state == REQ_STATE_RECEIVED || req_state_is_final(r->state));
	TD_ASSERT(!r->queued && !r->prefill && !r->decode && !r->in_rid_map);
	if (r->destroy_pending)
		return;
	r->destroy_pending = true;
	uv_timer_stop(&r->deadline);
	uv_close((uv_handle_t *)&r->deadline, timer_closed_cb);
}

void req_transition(struct req *r, enum req_state to, uint64_t deadline_ms, uv_timer_cb on_expire)
{
	enum req_state from = r->state;
	bool ok = req_state_is_final(to) ? !req_state_is_final(from) : (allowed[from] & (1u << to)) != 0;
	if (!ok) {
		LOG_ERROR("req", "rid=%s illegal transition %s -> %s", r->rid, req_state_name(from),
		          req_state_name(to));
		TD_ASSERT(!"illegal request state transition");
	}
	r->state = to;
	LOG_DEBUG("req", "rid=%s %s -> %s", r->rid, req_state_name(from), req_state_name(to));
	uv_timer_stop(&r->deadline);
	if (deadline_ms > 0 && on_expire && !req_state_is_final(to))
		uv_timer_start(&r->deadline, on_expire, deadline_ms, 0);
}
