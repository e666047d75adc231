/* Minimal HTTP responder (see httpd.h). Each connection reads into a fixed 8 KiB buffer until the
 * blank line that ends the request head, answers once and closes. Anything else (head too large,
 * malformed request line, slow client) gets an error status or is dropped; nothing is trusted. */
#include "common/net/httpd.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/conn.h"

#define HEAD_MAX 8192
#define HEAD_TIMEOUT_MS 5000

struct httpd {
	uv_loop_t *loop;
	uv_tcp_t tcp;
	httpd_handler_cb cb;
	void *ud;
};

struct hconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t wreq;
	struct httpd *h;
	char buf[HEAD_MAX + 1];
	size_t n;
	char *out;
	int answered;
	int n_open;
};

static void hconn_closed_cb(uv_handle_t *hd)
{
	struct hconn *c = hd->data;
	if (--c->n_open == 0) {
		free(c->out);
		free(c);
	}
}

static void hconn_close(struct hconn *c)
{
	if (!uv_is_closing((uv_handle_t *)&c->tcp))
		uv_close((uv_handle_t *)&c->tcp, hconn_closed_cb);
	if (!uv_is_closing((uv_handle_t *)&c->timer))
		uv_close((uv_handle_t *)&c->timer, hconn_closed_cb);
}

static void written_cb(uv_write_t *w, int status)
{
	hconn_close(w->data);
}

static const char *reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	default: return "Status";
	}
}

static void respond(struct hconn *c, struct httpd_response *r, int head_only)
{
	c->answered = 1;
	uv_read_stop((uv_stream_t *)&c->tcp);
	int status = r->status ? r->status : 200;
	const char *ct = r->content_type ? r->content_type : "text/plain; charset=utf-8";
	size_t blen = r->body ? r->len : 0;
	size_t cap = 256 + strlen(ct) + blen;
	c->out = malloc(cap);
	if (!c->out) {
		free(r->body);
		hconn_close(c);
		return;
	}
	int n =
	    snprintf(c->out, cap,
	             "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
	             status, reason(status), ct, blen);
	if (blen && !head_only)
		memcpy(c->out + n, r->body, blen);
	free(r->body);
	uv_buf_t b = uv_buf_init(c->out, (unsigned)(n + (head_only ? 0 : blen)));
	c->wreq.data = c;
	if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, written_cb))
		hconn_close(c);
}

void httpd_set_text(struct httpd_response *r, int status, const char *text)
{
	r->status = status;
	r->body = strdup(text);
	r->len = r->body ? strlen(text) : 0;
}

static void handle_head(struct hconn *c)
{
	struct httpd_response r = {0};
	char method[16], target[1024], version[16];
	char *eol = strstr(c->buf, "\r\n");
	if (!eol || eol - c->buf >= 1100 ||
	    sscanf(c->buf, "%15[A-Z] %1023[^ \r\n] %15[^\r\n]", method, target, version) != 3 ||
	    strncmp(version, "HTTP/1.", 7) != 0) {
		httpd_set_text(&r, 400, "malformed request line\n");
		respond(c, &r, 0);
		return;
	}
	char *q = strchr(target, '?');
	if (q)
		*q = 0;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		httpd_set_text(&r, 405, "only GET and HEAD\n");
		respond(c, &r, 0);
		return;
	}
	c->h->cb(c->h->ud, method, target, &r);
	respond(c, &r, strcmp(method, "HEAD") == 0);
}

static void alloc_cb(uv_handle_t *hd, size_t s, uv_buf_t *b)
{
	struct hconn *c = hd->data;
	b->base = c->buf + c->n;
	b->len = HEAD_MAX - c->n;
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	struct hconn *c = s->data;
	if (c->answered)
		return;
	if (n < 0) {
		hconn_close(c);
		return;
	}
	c->n += (size_t)n;
	c->buf[c->n] = 0;
	if (memmem(c->buf, c->n, "\r\n\r\n", 4)) {
		handle_head(c);
		return;
	}
	if (c->n >= HEAD_MAX) {
		struct httpd_response r = {0};
		httpd_set_text(&r, 431, "request head larger than 8 KiB\n");
		respond(c, &r, 0);
	}
}

static void timeout_cb(uv_timer_t *t)
{
	hconn_close(t->data);
}

static void connection_cb(uv_stream_t *server, int status)
{
	struct httpd *h = server->data;
	if (status < 0)
		return;
	struct hconn *c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->h = h;
	uv_tcp_init(h->loop, &c->tcp);
	uv_timer_init(h->loop, &c->timer);
	c->tcp.data = c;
	c->timer.data = c;
	c->n_open = 2;
	if (uv_accept(server, (uv_stream_t *)&c->tcp) ||
	    uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb)) {
		hconn_close(c);
		return;
	}
	uv_timer_start(&c->timer, timeout_cb, HEAD_TIMEOUT_MS, 0);
}

int httpd_start(uv_loop_t *loop, const char *addr, httpd_handler_cb cb, void *ud, struct httpd **out,
                struct errbuf *e)
{
	char host[256];
	int port;
	bool is_unix;
	int rc = conn_parse_addr(addr, host, sizeof(host), &port, &is_unix, e);
	if (rc)
		return rc;
	if (is_unix)
		return errbuf_set(e, -EINVAL, "metrics address '%s': TCP host:port expected", addr);
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) &&
	    uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss))
		return errbuf_set(e, -EINVAL, "metrics address '%s': numeric IPv4/IPv6 host expected", addr);
	struct httpd *h = calloc(1, sizeof(*h));
	if (!h)
		return errbuf_set(e, -ENOMEM, "out of memory");
	h->loop = loop;
	h->cb = cb;
	h->ud = ud;
	uv_tcp_init(loop, &h->tcp);
	h->tcp.data = h;
	rc = uv_tcp_bind(&h->tcp, (struct sockaddr *)&ss, 0);
	if (!rc)
		rc = uv_listen((uv_stream_t *)&h->tcp, 64, connection_cb);
	if (rc) {
		httpd_stop(h);
		return errbuf_set(e, -EADDRINUSE, "cannot serve HTTP on %s: %s", addr, uv_strerror(rc));
	}
	*out = h;
	return 0;
}

int httpd_port(const struct httpd *h)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	if (uv_tcp_getsockname(&h->tcp, (struct sockaddr *)&ss, &len))
		return 0;
	return ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
	                               : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void server_closed_cb(uv_handle_t *hd)
{
	free(hd->data);
}

void httpd_stop(struct httpd *h)
{
	if (h && !uv_is_closing((uv_handle_t *)&h->tcp))
		uv_close((uv_handle_t *)&h->tcp, server_closed_cb);
}
