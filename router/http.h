/* HTTP/1.1 connection core of the router: parses requests with llhttp, enforces the limits
 * (header bytes, body bytes, one request at a time), and writes responses (whole bodies, or
 * chunked streams for SSE). It knows nothing about sockets: bytes come in through
 * http_conn_feed() and go out through the io callbacks, so the unit tests and the fuzzer drive the
 * exact code path the server uses. http_server.c binds it to libuv TCP.
 *
 * Pipelining: requests are answered strictly in order, one at a time. When a request is complete
 * the parser is paused; bytes that arrive meanwhile (the next pipelined request) are kept in a
 * bounded buffer and parsed when the response is finished. Beyond that buffer the transport stops
 * reading (backpressure), so a client cannot make us buffer without bound.
 *
 * Ownership: struct http_request and its strings are owned by the connection and valid until the
 * response is finished or the connection aborts (whichever is first). */
#ifndef TANDEM_ROUTER_HTTP_H
#define TANDEM_ROUTER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define HTTP_MAX_HEADERS 64

enum http_method {
	HTTP_METHOD_OTHER = 0,
	HTTP_METHOD_GET,
	HTTP_METHOD_HEAD,
	HTTP_METHOD_POST,
	HTTP_METHOD_OPTIONS,
};

struct http_limits {
	size_t n_header_bytes_max; /* request line + headers; over: 431 */
	size_t n_body_bytes_max; /* over: 413 */
	size_t n_pending_bytes_max; /* pipelined bytes buffered while a request is in flight */
};

struct http_header {
	const char *name; /* lower-cased, NUL-terminated */
	const char *value; /* NUL-terminated, surrounding blanks trimmed */
};

struct http_request {
	enum http_method method;
	const char *method_name;
	const char *path; /* NUL-terminated, query string removed */
	const char *query; /* NUL-terminated, "" if none */
	struct http_header headers[HTTP_MAX_HEADERS];
	int n_headers;
	const char *body; /* NUL-terminated for convenience; body_len excludes the NUL */
	size_t body_len;
	bool keep_alive;
	uint64_t id; /* per-connection sequence number, for logs */
};

struct http_conn;

/* Transport callbacks. write copies or takes nothing: the data is only valid during the call. */
struct http_io {
	void (*write)(void *io_ud, const char *data, size_t len);
	/* Called once when the connection must close (after the last response is written, on a
	 * protocol error, or on http_conn_close). The transport closes the socket and later calls
	 * http_conn_destroy. */
	void (*close)(void *io_ud);
	/* Backpressure: the transport should stop (false) or resume (true) reading. */
	void (*set_reading)(void *io_ud, bool on);
};

/* Called once per complete request. The handler must eventually finish the response with
 * http_respond() or http_stream_end(), or the connection stays busy. */
typedef void (*http_request_cb)(struct http_conn *c, struct http_request *r, void *ud);
/* Called at most once when the connection dies while a request is in flight (client went away).
 * After it returns, the connection must not be used by the handler again. */
typedef void (*http_abort_cb)(struct http_conn *c, void *ud);

struct http_conn *http_conn_create(const struct http_limits *lim, const struct http_io *io, void *io_ud,
                                   http_request_cb on_request, void *ud);
void http_conn_destroy(struct http_conn *c); /* accepts NULL; fires the abort cb if still busy */

/* Feeds received bytes. Protocol errors are answered (400/413/431/505) and the connection closed
 * through io->close; the function itself never fails. */
void http_conn_feed(struct http_conn *c, const char *data, size_t len);
/* The peer closed its side (EOF) or the socket failed. */
void http_conn_eof(struct http_conn *c);
/* The transport's idle/header timer fired: 408 if a request was half-received, else a quiet close. */
void http_conn_timeout(struct http_conn *c);

bool http_conn_is_busy(const struct http_conn *c); /* a request is being handled */
bool http_conn_is_idle(const struct http_conn *c); /* between requests with nothing buffered */
bool http_conn_is_closing(const struct http_conn *c);
/* Draining: finish the current response, then close instead of keeping alive. */
void http_conn_set_draining(struct http_conn *c);

void http_conn_set_abort_cb(struct http_conn *c, http_abort_cb cb, void *ud);

/* Looks up a request header by lower-case name; NULL if absent. */
const char *http_request_header(const struct http_request *r, const char *name);

/* A whole response. extra_headers is "" or lines each ending in "\r\n". */
void http_respond(struct http_conn *c, int status, const char *content_type, const char *extra_headers,
                  const char *body, size_t body_len);
/* Streaming (chunked transfer encoding), used for SSE. */
void http_stream_begin(struct http_conn *c, int status, const char *content_type, const char *extra_headers);
void http_stream_write(struct http_conn *c, const char *data, size_t len);
void http_stream_end(struct http_conn *c);

const char *http_status_reason(int status);

#endif
