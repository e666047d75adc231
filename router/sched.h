/* Admission and placement (DESIGN.md §4): a bounded admission queue; KV blocks reserved on a
 * decode worker before any prefill is scheduled; prefill placed on the worker with the fewest
 * queued tokens, decode on the one with the most free blocks (then fewest running sequences);
 * a deadline on every stage; dead workers dropped from placement (prefill lost: re-prefill
 * elsewhere; decode lost: the request fails, others continue). Backends call the sched_on_*
 * functions; the HTTP side calls submit/cancel/finish. */
#ifndef TANDEM_ROUTER_SCHED_H
#define TANDEM_ROUTER_SCHED_H

#include <uv.h>

#include "router/req.h"
#include "router/worker.h"

struct metrics;

struct sched_config {
	uint32_t n_queue_max; /* admission queue bound: beyond, 429 */
	uint64_t queue_timeout_ms; /* ADMITTED -> KV_RESERVED */
	uint64_t reserve_timeout_ms; /* waiting for the decode worker's reservation answer */
	uint64_t prefill_timeout_ms; /* PREFILLING -> KV_TRANSFERRING: the base, for any prompt */
	uint64_t prefill_us_per_token; /* ... plus this per prompt token (sched_prefill_timeout_ms) */
	uint64_t transfer_timeout_ms; /* KV_TRANSFERRING -> DECODING */
	uint64_t token_timeout_ms; /* DECODING: longest gap between tokens */
	int n_prefill_tries_max; /* re-prefills after a lost prefill worker */
	uint32_t retry_after_s; /* Retry-After for 429 */
};

struct sched;

/* Longest prefill deadline whatever the prompt: bounds the workers' write windows and decode's
 * quarantine (tandem.proto KvReserve.prefill_window_ms), and keeps the value in a u32 of ms. */
#define SCHED_PREFILL_TIMEOUT_MAX_MS (6ull * 3600 * 1000)

/* The prefill deadline of a prompt of n_prompt tokens: base_ms + n_prompt * us_per_token / 1000,
 * at most SCHED_PREFILL_TIMEOUT_MAX_MS. One setting (the per-token budget) lets long prompts
 * prefill for longer; the router's stage deadline, the reservation deadline, the prefill's write
 * window and decode's quarantine all follow from it. */
uint64_t sched_prefill_timeout_ms(uint64_t base_ms, uint64_t us_per_token, uint32_t n_prompt);

int sched_create(struct sched **out, uv_loop_t *loop, const struct sched_config *cfg, struct metrics *m,
                 struct errbuf *e) TD_MUST_CHECK;
void sched_destroy(struct sched *s); /* accepts NULL; fails whatever is still in flight */

/* Adds a worker (registration). Refuses one whose model identity or KV layout differs from the
 * workers already registered, with a message naming the difference (ERR_MISMATCH). The sched
 * borrows w; the backend keeps it alive until sched_worker_remove. */
int sched_worker_add(struct sched *s, struct worker *w, struct errbuf *e) TD_MUST_CHECK;
/* The worker died or stopped answering: drop it from placement. The backend (which knows which
 * requests the worker held) then calls sched_on_worker_lost_req() for each of them: a lost
 * prefill is placed again elsewhere, a lost decode fails its requests. */
void sched_worker_lost(struct sched *s, struct worker *w, const char *why);
void sched_on_worker_lost_req(struct req *r, struct worker *w);
/* A heartbeat updated w's load: queued requests may now fit. */
void sched_worker_load_changed(struct sched *s, struct worker *w);
struct worker *sched_workers(struct sched *s);

/* RECEIVED -> ADMITTED. ERR_LIMIT: queue full (429); -EAGAIN: draining or no workers (503). */
int sched_submit(struct sched *s, struct req *r) TD_MUST_CHECK;
/* Client gone, stop string matched, shutdown: -> CANCELLED, resources freed, end event sent. */
void sched_cancel(struct req *r);
/* The caller decided the sequence is complete (stop string): -> DONE with `finish`. */
void sched_finish(struct req *r, enum req_finish finish);

/* Backend events. Each is ignored if r has already ended (late answers after a cancel). */
void sched_on_reserved(struct req *r, int status, const char *message);
void sched_on_prefill_done(struct req *r);
void sched_on_decode_started(struct req *r, const struct req_token *first);
void sched_on_token(struct req *r, const struct req_token *t);
void sched_on_finished(struct req *r, enum req_finish finish);
void sched_on_failed(struct req *r, int http_status, const char *message);
/* r's prefill worker could not push its KV to r's decode worker (MSG_ERR_TRANSFER). Before any
 * token reached the client the whole request is placed again at the head of the queue (bounded by
 * n_prefill_tries_max, as for a decode worker lost before decoding), and placement avoids that
 * decode worker for SCHED_SUSPECT_MS (it is usually dying, its control connection not yet closed);
 * otherwise r fails with `message`. */
void sched_on_kv_transfer_failed(struct req *r, const char *message);
#define SCHED_SUSPECT_MS 2000

uint32_t sched_n_queued(const struct sched *s);
uint32_t sched_n_active(const struct sched *s); /* requests not yet ended */
uint32_t sched_retry_after(const struct sched *s);
bool sched_is_ready(const struct sched *s); /* at least one live prefill and one live decode */
void sched_set_draining(struct sched *s);

#endif
