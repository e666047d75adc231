/* One sequence's life in the router: the state machine of DESIGN.md §4 (drawn in req.c). A
 * struct req is one generated sequence; an HTTP call with n choices owns n of them. The owner (the
 * sink) gets tokens and exactly one end event; after the end event the scheduler and the workers
 * hold nothing for the request, and the owner destroys it with req_destroy(). */
#ifndef TANDEM_ROUTER_REQ_H
#define TANDEM_ROUTER_REQ_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/err.h"

#define REQ_MAX_TOP_LOGPROBS 20

enum req_state {
	REQ_STATE_RECEIVED = 0,
	REQ_STATE_ADMITTED,
	REQ_STATE_KV_RESERVED,
	REQ_STATE_PREFILLING,
	REQ_STATE_KV_TRANSFERRING,
	REQ_STATE_DECODING,
	REQ_STATE_DONE,
	REQ_STATE_FAILED,
	REQ_STATE_CANCELLED,
	REQ_STATE_COUNT
};

enum req_finish {
	REQ_FINISH_NONE = 0,
	REQ_FINISH_LENGTH, /* max_tokens or the context length reached */
	REQ_FINISH_EOS, /* the model ended the sequence */
	REQ_FINISH_STOP, /* a stop string matched (decided by the caller) */
};

struct req_sampling {
	float temperature;
	float top_p;
	int32_t top_k;
	float min_p;
	uint64_t seed;
	bool has_seed;
	float frequency_penalty;
	float presence_penalty;
	int n_top_logprobs; /* 0: none; with want_logprobs, the chosen token's logprob is always sent */
	bool want_logprobs;
	bool ignore_eos;
};

struct req_token {
	int32_t id;
	float logprob;
	int n_top;
	int32_t top_ids[REQ_MAX_TOP_LOGPROBS];
	float top_logprobs[REQ_MAX_TOP_LOGPROBS];
};

struct req;

struct req_sink {
	void (*token)(void *ud, struct req *r, const struct req_token *t);
	/* state is DONE (finish says why), FAILED (status/message say why) or CANCELLED. */
	void (*end)(void *ud, struct req *r, enum req_state state, enum req_finish finish, int http_status,
	            const char *message);
};

struct worker;
struct sched;

struct req {
	uint64_t id;
	char rid[24]; /* printable id for logs: rid=... */
	enum req_state state;
	struct sched *sched;
	int32_t *prompt; /* owned */
	uint32_t n_prompt;
	uint32_t n_max_new; /* tokens to generate at most (already clipped to the context) */
	uint32_t n_ctx;
	struct req_sampling sampling;
	const struct req_sink *sink;
	void *sink_ud;
	int choice; /* index among the call's choices */

	struct worker *prefill; /* borrowed; set while the prefill worker holds something for us */
	struct worker *decode; /* borrowed; set while the decode worker holds blocks for us */
	uint32_t n_blocks;
	int n_prefill_tries;
	uint32_t n_generated;
	bool queued; /* in the admission queue */
	struct req *qnext, *qprev;

	/* backend state for remote workers (workers.c): the decode reservation's block ids */
	uint32_t *block_ids; /* owned */
	uint32_t n_block_ids;
	bool kv_ready_sent; /* decode runs the sequence: release with Cancel, not KvRelease */
	uint32_t fence_attempt; /* the prefill attempt the decode reservation trusts the fence of */
	bool decode_finished; /* decode sent Finish: it holds nothing any more */
	bool in_rid_map;

	/* stage timestamps (ns, uv_hrtime) for metrics */
	uint64_t t_received, t_admitted, t_reserved, t_prefill, t_transfer, t_first, t_last;

	uv_timer_t deadline;
	bool timer_open;
	bool ended;
	bool destroy_pending;
};

/* Creates a request in RECEIVED; takes ownership of prompt (malloc'd). */
struct req *req_create(uv_loop_t *loop, uint64_t id, int32_t *prompt, uint32_t n_prompt, uint32_t n_max_new,
                       uint32_t n_ctx, const struct req_sampling *s, const struct req_sink *sink,
                       void *sink_ud);
/* Frees the request once libuv has closed its timer. The request must have ended (or never been
 * submitted). Accepts NULL. */
void req_destroy(struct req *r);

const char *req_state_name(enum req_state s);
bool req_state_is_final(enum req_state s);
/* Moves r to state `to` if the transition is in the diagram; a transition that is not is a broken
 * invariant and aborts. Arms the deadline for the new state (0 ms: none). */
void req_transition(struct req *r, enum req_state to, uint64_t deadline_ms, uv_timer_cb on_expire);

#endif
