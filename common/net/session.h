/* A worker's control session with the router: dial, Hello, wait for HelloAck (with a deadline),
 * heartbeat both ways, and redial with exponential backoff whenever the connection is lost.
 * Used by tandem-prefill and tandem-decode (the router is the listening side).
 *
 *   DIALING --connected--> HELLO_SENT --HelloAck--> REGISTERED --lost--> BACKOFF --timer--> DIALING
 *      \--refused/timeout-----------------------------------------------^        (until session_stop)
 *
 * on_lost_cb runs when a REGISTERED session drops: the router will treat all of this worker's
 * requests as failed, so the worker must cancel everything it holds for them. */
#ifndef TANDEM_NET_SESSION_H
#define TANDEM_NET_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/err.h"
#include "common/net/msg.h"

struct session;

struct session_opts {
	const char *router_addr; /* "host:port" or "unix:/path" (copied) */
	uint32_t heartbeat_ms; /* default 1000; the router's HelloAck may override */
	uint32_t hello_timeout_ms; /* default 5000 */
	uint32_t backoff_min_ms; /* default 100 */
	uint32_t backoff_max_ms; /* default 5000 */
	size_t max_frame; /* default FRAME_MAX_DEFAULT */
};

struct session_cbs {
	void (*fill_hello_cb)(void *ud, struct msg_hello *h); /* at every (re)connect */
	void (*fill_heartbeat_cb)(void *ud, struct msg_heartbeat *hb);
	void (*on_registered_cb)(void *ud, const struct msg_hello_ack *ack);
	/* every message after registration except Heartbeat (which the session consumes); return
	 * nonzero to drop the connection (protocol violation) */
	int (*on_msg_cb)(void *ud, struct msg *m);
	void (*on_lost_cb)(void *ud, const char *why);
	void *ud;
};

int session_start(uv_loop_t *loop, const struct session_opts *o, const struct session_cbs *cbs,
                  struct session **out, struct errbuf *e) TD_MUST_CHECK;
/* -ENOTCONN when not registered (the message is dropped: the router has already failed the
 * request or will when it sees the connection gone). ERR_LIMIT when the router is not reading
 * (write queue full): the session then drops the connection, as if the router were lost. */
int session_send(struct session *s, const struct msg *m, struct errbuf *e) TD_MUST_CHECK;
bool session_is_registered(const struct session *s);
uint32_t session_worker_id(const struct session *s);
/* Sends a heartbeat now (e.g. right after the load changed a lot, or with draining set). */
void session_heartbeat_now(struct session *s);
/* Closes (flushing what is queued) and stops redialing; frees the session once closed. */
void session_stop(struct session *s);

#endif
