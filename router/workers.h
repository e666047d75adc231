/* The router's side of the control plane (proto/tandem.proto): it listens for prefill and
 * decode workers, registers them with the scheduler (refusing a model or KV-layout mismatch with
 * a message naming the difference), keeps their load from heartbeats, and implements the
 * worker_ops (KvReserve, PrefillRequest, KvReady, Cancel/KvRelease) on top of common/net's framed
 * connections. A closed or silent connection is a lost worker. */
#ifndef TANDEM_ROUTER_WORKERS_H
#define TANDEM_ROUTER_WORKERS_H

#include <uv.h>

#include "router/sched.h"

struct metrics;

struct workers_config {
	const char *listen_addr; /* "host:port" or "unix:/path" */
	const char *auth_token; /* "" or NULL: none required */
	uint32_t heartbeat_ms;
	/* Both are bases: a prompt of n tokens adds n * prefill_us_per_token / 1000 ms to each
	 * (sched_prefill_timeout_ms), so a long prompt gets a longer prefill everywhere at once. */
	uint64_t reserve_deadline_ms; /* sent in KvReserve: decode frees blocks without KvReady by then */
	uint64_t prefill_deadline_ms; /* PrefillRequest.deadline_ms, KvReserve.prefill_window_ms */
	uint64_t prefill_us_per_token;
};

struct workers;

int workers_create(struct workers **out, uv_loop_t *loop, struct sched *s, const struct workers_config *cfg,
                   struct metrics *m, struct errbuf *e) TD_MUST_CHECK;
int workers_port(const struct workers *ws); /* bound TCP port (0 for Unix sockets) */
/* Asks every worker to drain (router shutting down). */
void workers_drain(struct workers *ws);
void workers_destroy(struct workers *ws); /* accepts NULL; closes every connection */

#endif
