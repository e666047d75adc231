/* A control connection: one libuv stream (TCP or Unix socket) carrying framed control messages.
 * Used by every process (router, prefill, decode), on both ends.
 *
 *  - Reads: bytes go through a frame_reader (partial frames, many frames per read, size limit
 *    before allocation), each frame is decoded by msg_decode() and handed to on_msg_cb. A frame or
 *    message the peer should not have sent is answered with Error(PROTOCOL, reason) and the
 *    connection is closed; nothing crashes.
 *  - Writes: conn_send() encodes and queues. Queued bytes are bounded (max_queued_bytes); a send
 *    that would exceed the bound fails with ERR_LIMIT (the peer is not reading: the caller usually
 *    closes). Frames go out in the order of conn_send() calls.
 *  - Deadlines: an idle timeout (nothing received for idle_timeout_ms closes the connection) and a
 *    connect timeout. Heartbeats (sent by the owner) keep a healthy connection busy.
 *  - Lifetime: conn_close() stops reading, flushes queued writes (for at most flush_timeout_ms),
 *    closes the handles, calls on_close_cb exactly once and then frees the conn. After on_close_cb
 *    the pointer is gone. Every close path (peer EOF, error, timeout, our close) goes through it.
 *
 * Addresses: "host:port" (IPv4, [IPv6] or a resolvable name, port 0 = any free port when
 * listening) or "unix:/path/to/socket". */
#ifndef TANDEM_NET_CONN_H
#define TANDEM_NET_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/err.h"
#include "common/net/msg.h"

struct conn;

struct conn_opts {
	size_t max_frame; /* largest payload accepted and sent (default FRAME_MAX_DEFAULT) */
	size_t max_queued_bytes; /* write-queue bound (default 64 MiB) */
	uint32_t idle_timeout_ms; /* 0: none */
	uint32_t connect_timeout_ms; /* default 5000 */
	uint32_t flush_timeout_ms; /* default 1000 */
	/* Called for each decoded message; m is valid during the call only. Return 0 to go on, or a
	 * negative code to close the connection (the conn logs nothing: say why with conn_close_error
	 * before returning, or let the generic close happen). */
	int (*on_msg_cb)(struct conn *c, struct msg *m, void *ud);
	/* Called once when the connection is gone. err: 0 for an orderly close by us, else why. */
	void (*on_close_cb)(struct conn *c, int err, const char *why, void *ud);
	/* Client connections only: called once with 0 when connected, or an error (then on_close_cb
	 * follows). */
	void (*on_connect_cb)(struct conn *c, int status, void *ud);
	void *ud;
};

struct conn_listener;
/* Called for each accepted connection with default opts already copied from the listener's; the
 * callback may change c's user data via conn_set_ud(). Return nonzero to refuse (conn closed). */
typedef int (*conn_accept_cb)(struct conn_listener *l, struct conn *c, void *ud);

/* Listens on addr. opts are copied into each accepted connection (ud included). */
int conn_listen(uv_loop_t *loop, const char *addr, const struct conn_opts *opts, conn_accept_cb cb, void *ud,
                struct conn_listener **out, struct errbuf *e) TD_MUST_CHECK;
/* The bound TCP port (after listening on port 0), or 0 for Unix sockets. */
int conn_listener_port(const struct conn_listener *l);
/* Closes the listener (asynchronously; frees it; a Unix socket file is removed). NULL is fine. */
void conn_listener_close(struct conn_listener *l);

/* Starts connecting to addr; the result arrives in opts->on_connect_cb. */
int conn_connect(uv_loop_t *loop, const char *addr, const struct conn_opts *opts, struct conn **out,
                 struct errbuf *e) TD_MUST_CHECK;

/* Encodes and queues m. ERR_LIMIT when the write queue is full, -EPIPE when closing. */
int conn_send(struct conn *c, const struct msg *m, struct errbuf *e) TD_MUST_CHECK;
/* Queues an already encoded frame (takes ownership of frame, a malloc'd buffer, even on error). */
int conn_send_take(struct conn *c, uint8_t *frame, size_t len, struct errbuf *e) TD_MUST_CHECK;
/* Sends Error(code, message) (when the stream is still writable) and closes. */
void conn_close_error(struct conn *c, int code, const char *fmt, ...) TD_PRINTF(3, 4);
/* Orderly close (flushes what is queued). Idempotent. */
void conn_close(struct conn *c, const char *why);

void conn_set_ud(struct conn *c, void *ud);
/* Changes the idle timeout of an open connection (0: none), counting from the last byte received. */
void conn_set_idle_timeout(struct conn *c, uint32_t ms);
void *conn_ud(const struct conn *c);
bool conn_is_closing(const struct conn *c);
size_t conn_queued_bytes(const struct conn *c);
const char *conn_peer(const struct conn *c); /* "1.2.3.4:5678" / "unix" for logs */
uint64_t conn_bytes_in(const struct conn *c);
uint64_t conn_bytes_out(const struct conn *c);

/* Parses "host:port" / "[v6]:port" / "unix:path". host gets the host part (without brackets). */
int conn_parse_addr(const char *addr, char *host, size_t host_cap, int *port, bool *is_unix,
                    struct errbuf *e) TD_MUST_CHECK;

#endif
