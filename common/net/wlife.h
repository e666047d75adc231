/* The life of a worker process as the router sees it, shared by tandem-prefill and tandem-decode:
 * registered or not (the tandem_worker_registered gauge, readiness for systemd and /ready, the
 * ready file tests and scripts wait for), and draining then stopping:
 *
 *   running ──SIGTERM / Drain from the router──▶ draining ──idle, or drain deadline──▶ stopping
 *   (wlife_start_drain: tell the router, no new work)   (wlife_stop: role's stop_cb, then the
 *                                                         session and the runtime; once)
 *
 * The role keeps its requests and its engine; it says through callbacks whether it is idle, how to
 * describe what is in flight (for the log lines) and how to stop its own part. Loop thread only. */
#ifndef TANDEM_NET_WLIFE_H
#define TANDEM_NET_WLIFE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/err.h"
#include "common/net/session.h"

struct metric;
struct metrics;
struct runtime;

struct wlife_cbs {
	bool (*is_idle_cb)(void *ud); /* nothing in flight: a draining worker may stop */
	bool (*is_healthy_cb)(void *ud); /* the engine makes progress (runtime /health, watchdog) */
	/* what is in flight, for log lines ("3 requests in flight") */
	void (*describe_cb)(void *ud, char *buf, size_t n);
	/* the role's part of stopping (engine, requests); between readiness off and session stop */
	void (*stop_cb)(void *ud);
	/* extra members of the ready file's JSON object, each starting with ", " (NULL: none) */
	void (*ready_extra_cb)(void *ud, char *buf, size_t n);
	void *ud;
};

struct wlife {
	const char *role; /* "prefill", "decode": the log module */
	const char *name; /* borrowed from the config */
	const char *ready_file; /* borrowed; "" or NULL: none */
	const char *on_drain_deadline; /* what happens to the rest, for the log line */
	uint32_t drain_timeout_ms;
	struct wlife_cbs cbs;
	struct session_cbs role_session_cbs; /* the role's session callbacks (wlife_start_session) */
	struct session *sess; /* owned from wlife_start_session until wlife_stop */
	struct runtime *rt; /* borrowed: set by the role once its runtime started */
	struct metric *m_registered;
	uv_timer_t drain_timer;
	bool timer_on; /* drain_timer initialised (wlife_start) */
	bool draining;
	bool stopping;
};

/* Embedded init; registers tandem_worker_registered in reg. Strings are borrowed. */
void wlife_init(struct wlife *l, const char *role, const char *name, const char *ready_file,
                uint32_t drain_timeout_ms, const char *on_drain_deadline, struct metrics *reg,
                const struct wlife_cbs *cbs);
/* After the runtime started (before the session): sets rt and readies the drain timer. */
void wlife_start(struct wlife *l, uv_loop_t *loop, struct runtime *rt);
/* Exiting: removes the ready file. */
void wlife_fini(struct wlife *l);

/* Dials the router (common/net/session.h) with the role's callbacks wrapped: registration sets
 * the gauge, readiness (systemd) and the ready file before the role's on_registered_cb (may be
 * NULL); Drain from the router starts the drain here and never reaches the role's on_msg_cb;
 * every heartbeat says whether we drain; a lost router clears the gauge before the role's
 * on_lost_cb (which must cancel what it holds). The session is in l->sess. */
int wlife_start_session(struct wlife *l, uv_loop_t *loop, const struct session_opts *o,
                        const struct session_cbs *role_cbs, struct errbuf *e) TD_MUST_CHECK;
/* Registered and not draining. */
bool wlife_is_ready(const struct wlife *l);

/* The runtime's callbacks (common/net/runtime.h) for a worker: pass them with ud = the struct
 * wlife. Ready = wlife_is_ready; healthy = the role's is_healthy_cb; SIGTERM/SIGINT = drain. */
bool wlife_is_ready_cb(void *ud);
bool wlife_is_healthy_cb(void *ud);
void wlife_on_signal_cb(void *ud, int signum);

/* Stop taking work, tell the router (Drain + a heartbeat saying so), stop when idle or after
 * min(deadline_ms, drain_timeout_ms) (deadline_ms 0: drain_timeout_ms). Idempotent. */
void wlife_start_drain(struct wlife *l, uint32_t deadline_ms);
/* Call whenever the role may have become idle: a draining idle worker stops. */
void wlife_maybe_finish_drain(struct wlife *l);
/* Stops once: readiness off, the drain timer closed, stop_cb, then the session and the runtime. */
void wlife_stop(struct wlife *l);

#endif
