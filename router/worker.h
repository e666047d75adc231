/* What the scheduler knows about a prefill or decode worker, and the operations it asks of one.
 * A worker is reached through a backend (ops): the control-protocol client for real processes,
 * or the in-process simulator (engine_sim.c) used by tests and the router-overhead benchmark.
 * Backends report back through the sched_on_* functions in sched.h. */
#ifndef TANDEM_ROUTER_WORKER_H
#define TANDEM_ROUTER_WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/base/err.h"

#define MSG_NAME_MAX_ROUTER 80

enum worker_role { WORKER_ROLE_PREFILL = 1, WORKER_ROLE_DECODE = 2 };

/* The KV-cache layout both sides of a transfer must agree on (DESIGN.md §5, §6). */
struct kv_layout {
	char arch[72];
	uint32_t n_layers;
	uint32_t block_size; /* tokens per block */
	uint32_t kv_lora_rank; /* latent dim C */
	uint32_t rope_dim; /* R */
	uint32_t indexer_dim; /* 0 if the model has no indexer */
	uint32_t n_indexer_layers;
	char dtype[16]; /* bf16, f32, fp8 ... */
};

struct req;
struct worker;

struct worker_ops {
	/* decode: reserve n_blocks for r; answer with sched_on_reserved(). */
	int (*reserve)(struct worker *w, struct req *r, uint32_t n_blocks);
	/* prefill: compute r's prompt KV and push it to r's decode worker; answer with
	 * sched_on_prefill_done() then (from the decode side) sched_on_decode_started(). */
	int (*prefill)(struct worker *w, struct req *r);
	/* free everything held for r (reservation, queued prefill, running sequence). No answer. */
	void (*release)(struct worker *w, struct req *r);
};

struct worker {
	int id;
	enum worker_role role;
	char name[MSG_NAME_MAX_ROUTER]; /* worker name (or address), for logs */
	char model_id[80];
	struct kv_layout layout;
	uint32_t tp;
	const struct worker_ops *ops;
	void *impl;
	bool alive;
	bool draining; /* alive but takes no new work (it sent Drain) */
	/* decode: a prefill worker's KV push to it failed; placement prefers other decode workers
	 * until this time (uv_hrtime ns), then trusts it again (sched_on_kv_transfer_failed) */
	uint64_t suspect_until_ns;
	/* load, from heartbeats and updated locally between them */
	uint64_t n_queued_tokens;
	uint32_t n_blocks_total;
	uint32_t n_blocks_free;
	uint32_t n_running;
	uint32_t n_running_max;
	struct worker *next;
};

/* Compares two layouts; on a difference writes a message naming the field and both values and
 * returns ERR_MISMATCH. */
int kv_layout_compare(const struct kv_layout *a, const char *a_name, const struct kv_layout *b,
                      const char *b_name, struct errbuf *e) TD_MUST_CHECK;

#endif
