/* libuv binding of the HTTP core (see http_server.h). Each connection owns a TCP handle and a
 * timer; both are closed through uv_close and the connection is freed in the last close callback,
 * as libuv requires. Writes copy the bytes (the core's buffers are transient) and free them in
 * the write callback. */
#include "router/http_server.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"

struct sconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	struct http_server *srv;
	struct http_conn *http;
	uv_shutdown_t shut;
	struct sconn *prev, *next;
	int n_open_handles;
	bool too_slow; /* the client stopped reading: abort at the next loop turn */
	bool closing; /* no more HTTP on this connection */
	bool handles_closing; /* uv_close called on both handles */
};

struct http_server {
	uv_loop_t *loop;
	uv_tcp_t listener;
	struct http_server_config cfg;
	http_request_cb on_request;
	void *ud;
	struct sconn *conns;
	int n_conns;
	bool draining;
	bool destroying;
	bool listener_closed;
};

struct wreq {
	uv_write_t w;
	char data[];
};

static void conn_free_maybe(struct sconn *sc)
{
	if (sc->n_open_handles > 0)
		return;
	struct http_server *s = sc->srv;
	http_conn_destroy(sc->http);
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->conns = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	s->n_conns--;
	free(sc);
	if (s->destroying && s->n_conns == 0 && s->listener_closed)
		free(s);
}

static void handle_closed_cb(uv_handle_t *h)
{
	struct sconn *sc = h->data;
	sc->n_open_handles--;
	conn_free_maybe(sc);
}

static void final_close(struct sconn *sc)
{
	if (sc->handles_closing)
		return;
	sc->handles_closing = true;
	uv_timer_stop(&sc->timer);
	uv_close((uv_handle_t *)&sc->timer, handle_closed_cb);
	uv_close((uv_handle_t *)&sc->tcp, handle_closed_cb);
}

static void linger_cb(uv_timer_t *t)
{
	final_close(t->data);
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
	struct sconn *sc = req->data;
	if (status != 0 || sc->srv->destroying) {
		final_close(sc);
		return;
	}
	/* Lingering close: keep reading (and discarding) for a moment, so that a client still sending
	 * a body we refused gets our response instead of a reset. */
	uv_timer_start(&sc->timer, linger_cb, 2000, 0);
}

/* graceful: flush queued writes (uv_shutdown) before closing, so a final response is not lost */
static void conn_close_mode(struct sconn *sc, bool graceful)
{
	if (!graceful) {
		sc->closing = true;
		final_close(sc);
		return;
	}
	if (sc->closing)
		return;
	sc->closing = true;
	uv_timer_stop(&sc->timer);
	sc->shut.data = sc;
	if (uv_shutdown(&sc->shut, (uv_stream_t *)&sc->tcp, shutdown_cb) != 0)
		final_close(sc);
}

static void conn_close(struct sconn *sc)
{
	conn_close_mode(sc, true);
}

static void write_cb(uv_write_t *w, int status)
{
	free(w);
	(void)status; /* a failed write shows up as a read error / EOF, which aborts the request */
}

/* A client that stops reading an SSE stream must not make us buffer without bound. */

static void slow_cb(uv_timer_t *t)
{
	struct sconn *sc = t->data;
	LOG_INFO("http", "client is not reading (over %zu bytes queued): closing the connection",
	         sc->srv->cfg.n_write_queue_bytes_max);
	if (sc->http)
		http_conn_eof(sc->http); /* aborts the request in flight, which frees its resources */
	conn_close_mode(sc, false);
}

static void io_write(void *ud, const char *data, size_t len)
{
	struct sconn *sc = ud;
	if (sc->closing || sc->too_slow)
		return;
	if (sc->tcp.write_queue_size + len > sc->srv->cfg.n_write_queue_bytes_max) {
		/* not from inside the core's call chain: the abort runs on the next loop turn */
		sc->too_slow = true;
		uv_timer_stop(&sc->timer);
		uv_timer_start(&sc->timer, slow_cb, 0, 0);
		return;
	}
	struct wreq *w = malloc(sizeof(*w) + len);
	if (!w) {
		conn_close(sc);
		return;
	}
	memcpy(w->data, data, len);
	uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
	if (uv_write(&w->w, (uv_stream_t *)&sc->tcp, &b, 1, write_cb) != 0) {
		free(w);
		conn_close(sc);
	}
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	static char slab[65536]; /* one loop thread: a static read slab is enough, the core copies */
	(void)h;
	(void)suggested;
	buf->base = slab;
	buf->len = sizeof(slab);
}

static void arm_timer(struct sconn *sc);

static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
	struct sconn *sc = st->data;
	if (n < 0) {
		if (sc->http && !sc->closing)
			http_conn_eof(sc->http);
		conn_close_mode(sc, false);
		return;
	}
	if (n == 0 || sc->closing)
		return; /* lingering: discard */
	http_conn_feed(sc->http, buf->base, (size_t)n);
	if (!sc->closing)
		arm_timer(sc);
}

static void io_close(void *ud)
{
	struct sconn *sc = ud;
	/* let queued writes go out first: shutdown flushes, then close */
	conn_close(sc);
}

static void io_set_reading(void *ud, bool on)
{
	struct sconn *sc = ud;
	if (sc->closing || sc->handles_closing)
		return;
	if (on)
		uv_read_start((uv_stream_t *)&sc->tcp, alloc_cb, read_cb);
	else
		uv_read_stop((uv_stream_t *)&sc->tcp);
	arm_timer(sc);
}

static const struct http_io sconn_io = {io_write, io_close, io_set_reading};

static void timer_cb(uv_timer_t *t)
{
	struct sconn *sc = t->data;
	if (sc->http)
		http_conn_timeout(sc->http);
}

/* Idle between requests: the idle timeout; a request partly received: the header timeout;
 * a request in flight: no transport timer (the request has its own deadlines). */
static void arm_timer(struct sconn *sc)
{
	struct http_server *s = sc->srv;
	if (sc->too_slow)
		return;
	if (http_conn_is_busy(sc->http)) {
		uv_timer_stop(&sc->timer);
		return;
	}
	uint64_t ms = http_conn_is_idle(sc->http) ? s->cfg.idle_timeout_ms : s->cfg.header_timeout_ms;
	uv_timer_start(&sc->timer, timer_cb, ms, 0);
}

static void on_request_cb(struct http_conn *c, struct http_request *r, void *ud)
{
	struct sconn *sc = ud;
	uv_timer_stop(&sc->timer);
	sc->srv->on_request(c, r, sc->srv->ud);
	/* answered synchronously or not: the timer is re-armed by the next read or by rearm below */
	if (!sc->closing && !http_conn_is_busy(c))
		arm_timer(sc);
}

static void connection_cb(uv_stream_t *ls, int status)
{
	struct http_server *s = ls->data;
	if (status < 0) {
		LOG_WARN("http", "accept failed: %s", uv_strerror(status));
		return;
	}
	struct sconn *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return;
	sc->srv = s;
	uv_tcp_init(s->loop, &sc->tcp);
	uv_timer_init(s->loop, &sc->timer);
	sc->tcp.data = sc;
	sc->timer.data = sc;
	sc->n_open_handles = 2;
	sc->next = s->conns;
	if (s->conns)
		s->conns->prev = sc;
	s->conns = sc;
	s->n_conns++;
	/* calloc'd http may fail below; conn_free_maybe handles a NULL http */
	if (uv_accept(ls, (uv_stream_t *)&sc->tcp) != 0) {
		conn_close(sc);
		return;
	}
	if (s->n_conns > s->cfg.n_conns_max || s->draining) {
		static const char body[] = "{\"error\":{\"message\":\"too many open connections\",\"type\":"
		                           "\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";
		char busy[512];
		int n = snprintf(busy, sizeof(busy),
		                 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
		                 "Retry-After: 1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
		                 sizeof(body) - 1, body);
		io_write(sc, busy, (size_t)n);
		conn_close(sc);
		return;
	}
	uv_tcp_nodelay(&sc->tcp, 1);
	sc->http = http_conn_create(&s->cfg.limits, &sconn_io, sc, on_request_cb, sc);
	if (!sc->http) {
		conn_close(sc);
		return;
	}
	uv_read_start((uv_stream_t *)&sc->tcp, alloc_cb, read_cb);
	arm_timer(sc);
}

int http_server_create(struct http_server **out, uv_loop_t *loop, const struct http_server_config *cfg,
                       http_request_cb on_request, void *ud, struct errbuf *e)
{
	struct http_server *s = calloc(1, sizeof(*s));
	if (!s)
		return errbuf_set(e, -ENOMEM, "http: out of memory");
	s->loop = loop;
	s->cfg = *cfg;
	if (!s->cfg.n_write_queue_bytes_max)
		s->cfg.n_write_queue_bytes_max = 8u << 20;
	s->on_request = on_request;
	s->ud = ud;
	struct sockaddr_storage addr;
	int rc = uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr);
	if (rc != 0)
		rc = uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr);
	if (rc != 0) {
		free(s);
		return errbuf_set(e, -EINVAL, "http: listen address '%s' is not an IPv4 or IPv6 address",
		                  cfg->host);
	}
	uv_tcp_init(loop, &s->listener);
	s->listener.data = s;
	rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&s->listener, 1024, connection_cb);
	if (rc != 0) {
		errbuf_set(e, rc, "http: cannot listen on %s:%d: %s", cfg->host, cfg->port, uv_strerror(rc));
		s->destroying = true;
		http_server_destroy(s);
		*out = NULL;
		return rc;
	}
	*out = s;
	return 0;
}

int http_server_port(const struct http_server *s)
{
	struct sockaddr_storage a;
	int len = sizeof(a);
	if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&a, &len) != 0)
		return -1;
	if (a.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&a)->sin_port);
	return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
}

int http_server_n_conns(const struct http_server *s)
{
	return s->n_conns;
}

static void listener_closed_cb(uv_handle_t *h)
{
	struct http_server *s = h->data;
	s->listener_closed = true;
	if (s->destroying && s->n_conns == 0)
		free(s);
}

void http_server_drain(struct http_server *s)
{
	if (s->draining)
		return;
	s->draining = true;
	uv_close((uv_handle_t *)&s->listener, listener_closed_cb);
	for (struct sconn *sc = s->conns; sc; sc = sc->next)
		if (sc->http)
			http_conn_set_draining(sc->http);
}

void http_server_destroy(struct http_server *s)
{
	if (!s)
		return;
	s->destroying = true;
	if (!s->draining) {
		s->draining = true;
		uv_close((uv_handle_t *)&s->listener, listener_closed_cb);
	}
	for (struct sconn *sc = s->conns; sc; sc = sc->next) {
		if (sc->http && http_conn_is_busy(sc->http))
			http_conn_eof(sc->http);
		conn_close_mode(sc, false);
	}
}
