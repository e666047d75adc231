/* SSE keep-alive comments. A streaming response that has written nothing for `interval_ms`
 * (typically: its prompt is still being prefilled, which may take minutes for a long prompt)
 * gets a comment line ": keep-alive\n\n", which SSE clients ignore and which keeps proxies and
 * load balancers from cutting a connection they think is idle. One timer for all streams; the
 * entries are embedded in the streaming calls (complete.c), which touch them on every write. */
#ifndef TANDEM_ROUTER_KEEPALIVE_H
#define TANDEM_ROUTER_KEEPALIVE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

struct http_conn;
struct keepalive;

struct keepalive_entry {
	struct keepalive *ka; /* NULL: not in a list */
	struct http_conn *conn; /* borrowed; the owner removes the entry before the conn goes away */
	uint64_t t_last_ns; /* last write on the stream (uv_hrtime) */
	struct keepalive_entry *prev, *next;
};

struct keepalive {
	uv_timer_t timer;
	uint64_t interval_ms; /* 0: off */
	struct keepalive_entry *head;
	uint32_t n_entries;
	uint64_t n_sent; /* comments written, for tests and logs */
	bool timer_on;
};

/* interval_ms 0 turns keep-alives off (add/touch/remove still work and do nothing). */
void keepalive_init(struct keepalive *ka, uv_loop_t *loop, uint64_t interval_ms);
void keepalive_fini(struct keepalive *ka); /* closes the timer; entries must be gone */
/* Starts watching a stream that has just sent its headers. */
void keepalive_add(struct keepalive *ka, struct keepalive_entry *en, struct http_conn *c);
/* The stream wrote something: the next comment is due interval_ms from now. */
void keepalive_touch(struct keepalive_entry *en);
/* Stops watching (the response ended or the client went away). Idempotent. */
void keepalive_remove(struct keepalive_entry *en);

#endif
