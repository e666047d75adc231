/* Control connections over libuv streams (see conn.h). A conn owns two handles: the stream and
 * a timer (idle / connect / flush deadline). Closing follows libuv's rule that handle memory is
 * freed only in close callbacks: both handles are closed, and the conn is freed when the second
 * close callback has run.
 *
 *   CONNECTING --connect_cb ok--> OPEN --conn_close / error / EOF / idle--> CLOSING --> (freed)
 *        \--connect error or timeout------------------------------------------^
 *
 * In CLOSING nothing more is read or delivered; queued writes get flush_timeout_ms to drain
 * (uv_shutdown waits for them), then the handles close and on_close_cb runs once. */
#include "common/net/conn.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/net/frame.h"

enum conn_state { CONN_CONNECTING, CONN_OPEN, CONN_CLOSING };

struct conn {
	uv_loop_t *loop;
	union {
		uv_handle_t handle;
		uv_stream_t stream;
		uv_tcp_t tcp;
		uv_pipe_t pipe;
	} h;
	uv_timer_t timer;
	uv_connect_t connect_req;
	uv_shutdown_t shutdown_req;
	struct conn_opts o;
	enum conn_state state;
	bool is_unix;
	int n_open_handles;
	int close_err;
	char close_why[256];
	struct frame_reader reader;
	size_t queued_bytes;
	uint64_t bytes_in, bytes_out;
	uint64_t last_rx_ms;
	char peer[80];
	char rdbuf[64 * 1024];
	bool reading_buf_busy;
};

struct conn_listener {
	uv_loop_t *loop;
	union {
		uv_handle_t handle;
		uv_stream_t stream;
		uv_tcp_t tcp;
		uv_pipe_t pipe;
	} h;
	bool is_unix;
	char path[256];
	struct conn_opts o;
	conn_accept_cb cb;
	void *ud;
};

struct write_req {
	uv_write_t req;
	struct conn *c;
	uint8_t *frame;
	size_t len;
};

static void apply_defaults(struct conn_opts *o)
{
	if (!o->max_frame)
		o->max_frame = FRAME_MAX_DEFAULT;
	if (o->max_frame > FRAME_MAX_LIMIT)
		o->max_frame = FRAME_MAX_LIMIT;
	if (!o->max_queued_bytes)
		o->max_queued_bytes = 64u << 20;
	if (!o->connect_timeout_ms)
		o->connect_timeout_ms = 5000;
	if (!o->flush_timeout_ms)
		o->flush_timeout_ms = 1000;
}

int conn_parse_addr(const char *addr, char *host, size_t host_cap, int *port, bool *is_unix, struct errbuf *e)
{
	*port = 0;
	*is_unix = false;
	if (!addr || !*addr)
		return errbuf_set(e, -EINVAL, "empty address");
	if (strncmp(addr, "unix:", 5) == 0) {
		const char *p = addr + 5;
		if (!*p || strlen(p) >= host_cap || strlen(p) >= 100)
			return errbuf_set(e, -EINVAL,
			                  "address '%s': Unix socket path empty or longer than 100 bytes",
			                  addr);
		snprintf(host, host_cap, "%s", p);
		*is_unix = true;
		return 0;
	}
	const char *colon = strrchr(addr, ':');
	if (!colon)
		return errbuf_set(e, -EINVAL, "address '%s': expected host:port or unix:/path", addr);
	const char *h0 = addr, *h1 = colon;
	if (*addr == '[') {
		const char *rb = strchr(addr, ']');
		if (!rb || rb + 1 != colon)
			return errbuf_set(e, -EINVAL, "address '%s': bad [IPv6]:port", addr);
		h0 = addr + 1, h1 = rb;
	}
	size_t hl = (size_t)(h1 - h0);
	if (hl == 0 || hl >= host_cap)
		return errbuf_set(e, -EINVAL, "address '%s': empty or over-long host", addr);
	memcpy(host, h0, hl);
	host[hl] = 0;
	char *end = NULL;
	long p = strtol(colon + 1, &end, 10);
	if (!colon[1] || *end || p < 0 || p > 65535)
		return errbuf_set(e, -EINVAL, "address '%s': port must be 0..65535", addr);
	*port = (int)p;
	return 0;
}

/* Resolves host:port synchronously (names like "localhost" are resolved once at start-up). */
static int resolve(uv_loop_t *loop, const char *host, int port, struct sockaddr_storage *ss, struct errbuf *e)
{
	memset(ss, 0, sizeof(*ss));
	if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
		return 0;
	if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
		return 0;
	uv_getaddrinfo_t req;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	int rc = uv_getaddrinfo(loop, &req, NULL, host, NULL, &hints);
	if (rc)
		return errbuf_set(e, -EINVAL, "cannot resolve host '%s': %s", host, uv_strerror(rc));
	memcpy(ss, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen);
	uv_freeaddrinfo(req.addrinfo);
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
	return 0;
}

static void describe_peer(struct conn *c)
{
	if (c->is_unix) {
		snprintf(c->peer, sizeof(c->peer), "unix");
		return;
	}
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	char ip[64] = "?";
	int port = 0;
	if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET) {
			uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
			port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		} else {
			uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
			port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		}
	}
	snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
}

/* ---- closing ------------------------------------------------------------------------------------ */

static void handle_closed_cb(uv_handle_t *h)
{
	struct conn *c = h->data;
	if (--c->n_open_handles > 0)
		return;
	if (c->o.on_close_cb)
		c->o.on_close_cb(c, c->close_err, c->close_why, c->o.ud);
	frame_reader_fini(&c->reader);
	free(c);
}

static void close_handles(struct conn *c)
{
	if (!uv_is_closing(&c->h.handle))
		uv_close(&c->h.handle, handle_closed_cb);
	if (!uv_is_closing((uv_handle_t *)&c->timer))
		uv_close((uv_handle_t *)&c->timer, handle_closed_cb);
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
	close_handles(req->data);
}

static void flush_timeout_cb(uv_timer_t *t)
{
	close_handles(t->data);
}

static void begin_close(struct conn *c, int err, const char *why)
{
	if (c->state == CONN_CLOSING)
		return;
	bool was_open = c->state == CONN_OPEN;
	c->state = CONN_CLOSING;
	c->close_err = err;
	snprintf(c->close_why, sizeof(c->close_why), "%s", why ? why : "");
	uv_timer_stop(&c->timer);
	if (was_open) {
		uv_read_stop(&c->h.stream);
		if (c->queued_bytes > 0 && !err) {
			/* let queued frames (an Error, a last Finish) reach the peer, within a deadline */
			c->shutdown_req.data = c;
			if (uv_shutdown(&c->shutdown_req, &c->h.stream, shutdown_cb) == 0) {
				uv_timer_start(&c->timer, flush_timeout_cb, c->o.flush_timeout_ms, 0);
				return;
			}
		}
	}
	close_handles(c);
}

void conn_close(struct conn *c, const char *why)
{
	if (c)
		begin_close(c, 0, why ? why : "closed");
}

void conn_close_error(struct conn *c, int code, const char *fmt, ...)
{
	if (!c || c->state == CONN_CLOSING)
		return;
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (c->state == CONN_OPEN) {
		struct msg m;
		msg_init(&m, MSG_ERROR);
		m.u.error.code = code;
		snprintf(m.u.error.message, sizeof(m.u.error.message), "%s", text);
		struct errbuf eb;
		if (conn_send(c, &m, &eb) != 0)
			LOG_DEBUG("conn", "peer %s: could not queue Error before closing: %s", c->peer,
			          eb.msg);
	}
	/* the close is ours and orderly: flush the Error we just queued */
	begin_close(c, 0, text);
	c->close_err = code ? ERR_PROTO : 0;
}

/* ---- reading ------------------------------------------------------------------------------------ */

static void idle_timer_cb(uv_timer_t *t)
{
	struct conn *c = t->data;
	uint64_t now = uv_now(c->loop);
	if (c->state != CONN_OPEN)
		return;
	if (now - c->last_rx_ms >= c->o.idle_timeout_ms) {
		char why[128];
		snprintf(why, sizeof(why), "peer %s sent nothing for %u ms (idle timeout)", c->peer,
		         c->o.idle_timeout_ms);
		begin_close(c, ERR_TIMEOUT, why);
		return;
	}
	uv_timer_start(&c->timer, idle_timer_cb, c->o.idle_timeout_ms - (now - c->last_rx_ms), 0);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct conn *c = h->data;
	/* one read at a time per stream: the buffer is reused for every read */
	buf->base = c->rdbuf;
	buf->len = sizeof(c->rdbuf);
}

static int frame_cb_deliver(void *ctx, uint16_t type, const uint8_t *payload, size_t len)
{
	struct conn *c = ctx;
	if (c->state != CONN_OPEN)
		return 1;
	struct msg m;
	struct errbuf eb = {0};
	int rc = msg_decode(type, payload, len, &m, &eb);
	if (rc) {
		msg_clear(&m);
		LOG_WARN("conn", "peer %s: %s; closing the connection", c->peer, eb.msg);
		conn_close_error(c, MSG_ERR_PROTOCOL, "%s", eb.msg);
		return 1;
	}
	rc = c->o.on_msg_cb ? c->o.on_msg_cb(c, &m, c->o.ud) : 0;
	msg_clear(&m);
	if (rc) {
		if (c->state != CONN_CLOSING)
			begin_close(c, rc, "message handler closed the connection");
		return 1;
	}
	return c->state == CONN_OPEN ? 0 : 1;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct conn *c = s->data;
	if (nread == 0)
		return;
	if (nread < 0) {
		char why[160];
		if (nread == UV_EOF)
			snprintf(why, sizeof(why), "peer %s closed the connection", c->peer);
		else
			snprintf(why, sizeof(why), "read from %s failed: %s", c->peer,
			         uv_strerror((int)nread));
		begin_close(c, nread == UV_EOF ? -EPIPE : -EIO, why);
		return;
	}
	c->bytes_in += (uint64_t)nread;
	c->last_rx_ms = uv_now(c->loop);
	struct errbuf eb = {0};
	int rc = frame_reader_feed(&c->reader, (const uint8_t *)buf->base, (size_t)nread, frame_cb_deliver, c,
	                           &eb);
	if (rc < 0) {
		LOG_WARN("conn", "peer %s: %s; closing the connection", c->peer, eb.msg);
		conn_close_error(c, MSG_ERR_PROTOCOL, "%s", eb.msg);
	}
}

static int start_open(struct conn *c)
{
	c->state = CONN_OPEN;
	describe_peer(c);
	c->last_rx_ms = uv_now(c->loop);
	if (!c->is_unix) {
		uv_tcp_nodelay(&c->h.tcp, 1);
		uv_tcp_keepalive(&c->h.tcp, 1, 30);
	}
	int rc = uv_read_start(&c->h.stream, alloc_cb, read_cb);
	if (rc)
		return rc;
	if (c->o.idle_timeout_ms)
		uv_timer_start(&c->timer, idle_timer_cb, c->o.idle_timeout_ms, 0);
	return 0;
}

static struct conn *conn_alloc(uv_loop_t *loop, const struct conn_opts *opts, bool is_unix)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->loop = loop;
	c->o = *opts;
	apply_defaults(&c->o);
	c->is_unix = is_unix;
	frame_reader_init(&c->reader, c->o.max_frame);
	if (is_unix)
		uv_pipe_init(loop, &c->h.pipe, 0);
	else
		uv_tcp_init(loop, &c->h.tcp);
	uv_timer_init(loop, &c->timer);
	c->h.handle.data = c;
	c->timer.data = c;
	c->n_open_handles = 2;
	snprintf(c->peer, sizeof(c->peer), "?");
	return c;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static void write_cb(uv_write_t *req, int status)
{
	struct write_req *w = (struct write_req *)req;
	struct conn *c = w->c;
	c->queued_bytes -= w->len;
	if (status == 0)
		c->bytes_out += w->len;
	free(w->frame);
	free(w);
	if (status < 0 && status != UV_ECANCELED && c->state != CONN_CLOSING) {
		char why[160];
		snprintf(why, sizeof(why), "write to %s failed: %s", c->peer, uv_strerror(status));
		begin_close(c, -EIO, why);
	}
}

int conn_send_take(struct conn *c, uint8_t *frame, size_t len, struct errbuf *e)
{
	if (c->state != CONN_OPEN) {
		free(frame);
		return errbuf_set(e, -EPIPE, "connection to %s is not open", c->peer);
	}
	if (c->queued_bytes + len > c->o.max_queued_bytes) {
		free(frame);
		return errbuf_set(e, ERR_LIMIT,
		                  "peer %s is not reading: %zu bytes already queued (limit %zu)", c->peer,
		                  c->queued_bytes, c->o.max_queued_bytes);
	}
	struct write_req *w = malloc(sizeof(*w));
	if (!w) {
		free(frame);
		return errbuf_set(e, -ENOMEM, "out of memory queueing a frame");
	}
	w->c = c;
	w->frame = frame;
	w->len = len;
	uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
	int rc = uv_write(&w->req, &c->h.stream, &b, 1, write_cb);
	if (rc) {
		free(frame);
		free(w);
		return errbuf_set(e, -EIO, "write to %s failed: %s", c->peer, uv_strerror(rc));
	}
	c->queued_bytes += len;
	return 0;
}

int conn_send(struct conn *c, const struct msg *m, struct errbuf *e)
{
	if (c->state != CONN_OPEN)
		return errbuf_set(e, -EPIPE, "connection to %s is not open", c->peer);
	uint8_t *frame;
	size_t len;
	int rc = msg_encode(m, c->o.max_frame, &frame, &len, e);
	if (rc)
		return rc;
	return conn_send_take(c, frame, len, e);
}

/* ---- listening ----------------------------------------------------------------------------------- */

static void listener_closed_cb(uv_handle_t *h)
{
	struct conn_listener *l = h->data;
	if (l->is_unix && l->path[0])
		unlink(l->path);
	free(l);
}

void conn_listener_close(struct conn_listener *l)
{
	if (l && !uv_is_closing(&l->h.handle))
		uv_close(&l->h.handle, listener_closed_cb);
}

int conn_listener_port(const struct conn_listener *l)
{
	if (l->is_unix)
		return 0;
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	if (uv_tcp_getsockname(&l->h.tcp, (struct sockaddr *)&ss, &len))
		return 0;
	return ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
	                               : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void connection_cb(uv_stream_t *server, int status)
{
	struct conn_listener *l = server->data;
	if (status < 0) {
		LOG_WARN("conn", "accept failed: %s", uv_strerror(status));
		return;
	}
	struct conn *c = conn_alloc(l->loop, &l->o, l->is_unix);
	if (!c) {
		LOG_ERROR("conn", "out of memory accepting a connection");
		return;
	}
	if (uv_accept(server, &c->h.stream) || start_open(c)) {
		begin_close(c, -EIO, "accept failed");
		return;
	}
	if (l->cb && l->cb(l, c, l->ud) != 0)
		conn_close(c, "refused by the listener");
}

int conn_listen(uv_loop_t *loop, const char *addr, const struct conn_opts *opts, conn_accept_cb cb, void *ud,
                struct conn_listener **out, struct errbuf *e)
{
	char host[256];
	int port;
	bool is_unix;
	int rc = conn_parse_addr(addr, host, sizeof(host), &port, &is_unix, e);
	if (rc)
		return rc;
	struct conn_listener *l = calloc(1, sizeof(*l));
	if (!l)
		return errbuf_set(e, -ENOMEM, "out of memory");
	l->loop = loop;
	l->o = *opts;
	l->cb = cb;
	l->ud = ud;
	l->is_unix = is_unix;
	if (is_unix) {
		uv_pipe_init(loop, &l->h.pipe, 0);
		unlink(host); /* a stale socket file from a previous run */
		rc = uv_pipe_bind(&l->h.pipe, host);
		if (!rc)
			snprintf(l->path, sizeof(l->path), "%s", host);
	} else {
		struct sockaddr_storage ss;
		uv_tcp_init(loop, &l->h.tcp);
		rc = resolve(loop, host, port, &ss, e);
		if (rc) {
			l->h.handle.data = l;
			conn_listener_close(l);
			return rc;
		}
		rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&ss, 0);
	}
	l->h.handle.data = l;
	if (!rc)
		rc = uv_listen(&l->h.stream, 128, connection_cb);
	if (rc) {
		conn_listener_close(l);
		return errbuf_set(e, -EADDRINUSE, "cannot listen on %s: %s", addr, uv_strerror(rc));
	}
	*out = l;
	return 0;
}

/* ---- connecting ---------------------------------------------------------------------------------- */

static void connect_timeout_cb(uv_timer_t *t)
{
	struct conn *c = t->data;
	if (c->state != CONN_CONNECTING)
		return;
	char why[128];
	snprintf(why, sizeof(why), "connect timed out after %u ms", c->o.connect_timeout_ms);
	if (c->o.on_connect_cb)
		c->o.on_connect_cb(c, ERR_TIMEOUT, c->o.ud);
	begin_close(c, ERR_TIMEOUT, why);
}

static void connect_cb(uv_connect_t *req, int status)
{
	struct conn *c = req->data;
	if (c->state != CONN_CONNECTING)
		return; /* timed out already; the close cancelled this request */
	uv_timer_stop(&c->timer);
	if (status == 0)
		status = start_open(c);
	if (status) {
		char why[160];
		snprintf(why, sizeof(why), "connect failed: %s", uv_strerror(status));
		if (c->o.on_connect_cb)
			c->o.on_connect_cb(c, -ECONNREFUSED, c->o.ud);
		begin_close(c, -ECONNREFUSED, why);
		return;
	}
	if (c->o.on_connect_cb)
		c->o.on_connect_cb(c, 0, c->o.ud);
}

int conn_connect(uv_loop_t *loop, const char *addr, const struct conn_opts *opts, struct conn **out,
                 struct errbuf *e)
{
	char host[256];
	int port;
	bool is_unix;
	int rc = conn_parse_addr(addr, host, sizeof(host), &port, &is_unix, e);
	if (rc)
		return rc;
	struct sockaddr_storage ss;
	if (!is_unix && (rc = resolve(loop, host, port, &ss, e)))
		return rc;
	struct conn *c = conn_alloc(loop, opts, is_unix);
	if (!c)
		return errbuf_set(e, -ENOMEM, "out of memory");
	c->state = CONN_CONNECTING;
	snprintf(c->peer, sizeof(c->peer), "%s", addr);
	c->connect_req.data = c;
	if (is_unix) {
		uv_pipe_connect(&c->connect_req, &c->h.pipe, host, connect_cb);
	} else {
		rc = uv_tcp_connect(&c->connect_req, &c->h.tcp, (struct sockaddr *)&ss, connect_cb);
		if (rc) {
			begin_close(c, -EIO, "connect failed");
			return errbuf_set(e, -ECONNREFUSED, "connect to %s failed: %s", addr,
			                  uv_strerror(rc));
		}
	}
	uv_timer_start(&c->timer, connect_timeout_cb, c->o.connect_timeout_ms, 0);
	*out = c;
	return 0;
}

/* ---- accessors ----------------------------------------------------------------------------------- */

void conn_set_ud(struct conn *c, void *ud)
{
	c->o.ud = ud;
}

void conn_set_idle_timeout(struct conn *c, uint32_t ms)
{
	c->o.idle_timeout_ms = ms;
	if (c->state != CONN_OPEN)
		return;
	uv_timer_stop(&c->timer);
	if (ms)
		uv_timer_start(&c->timer, idle_timer_cb, ms, 0);
}
void *conn_ud(const struct conn *c)
{
	return c->o.ud;
}
bool conn_is_closing(const struct conn *c)
{
	return c->state == CONN_CLOSING;
}
size_t conn_queued_bytes(const struct conn *c)
{
	return c->queued_bytes;
}
const char *conn_peer(const struct conn *c)
{
	return c->peer;
}
uint64_t conn_bytes_in(const struct conn *c)
{
	return c->bytes_in;
}
uint64_t conn_bytes_out(const struct conn *c)
{
	return c->bytes_out;
}
