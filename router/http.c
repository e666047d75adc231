/* HTTP/1.1 connection core (see http.h): llhttp callbacks fill one bounded header area and one
 * bounded body buffer; a complete request pauses the parser and is handed to the router; the
 * response functions format status line, headers and (chunked) bodies and hand the bytes to the
 * transport. Every limit violation is answered with an OpenAI-shaped JSON error and a close,
 * because after a framing error the byte stream cannot be trusted for a next request. */
#include "router/http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "common/base/log.h"

enum span { SPAN_NONE, SPAN_URL, SPAN_FIELD, SPAN_VALUE };

struct http_conn {
	llhttp_t parser;
	struct http_limits lim;
	const struct http_io *io;
	void *io_ud;
	http_request_cb on_request;
	void *ud;
	http_abort_cb on_abort;
	void *abort_ud;

	/* header area: url and header names/values, NUL-separated, at most lim.n_header_bytes_max */
	char *hbuf;
	size_t hlen, hcap;
	enum span span;
	size_t url_off;
	size_t field_off[HTTP_MAX_HEADERS], value_off[HTTP_MAX_HEADERS];
	int n_headers;
	bool too_many_headers;

	char *body;
	size_t body_len, body_cap;

	/* received bytes not yet parsed (pipelined requests wait here) */
	char *pend;
	size_t pend_len, pend_cap;
	bool reading_off;

	struct http_request req;
	int err_status; /* set by a callback that rejects the request (413/431) */
	uint64_t n_requests;
	bool in_message; /* between message-begin and message-complete */
	bool complete; /* a full request was parsed and waits for dispatch */
	bool keep_alive;
	bool busy; /* dispatched, response not finished */
	bool streaming;
	bool stream_chunked;
	bool closing;
	bool draining;
	bool pumping;
	bool is_head;
};

static const llhttp_settings_t *settings_get(void);

const char *http_status_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 204: return "No Content";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 411: return "Length Required";
	case 413: return "Payload Too Large";
	case 415: return "Unsupported Media Type";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default: return "Unknown";
	}
}

struct http_conn *http_conn_create(const struct http_limits *lim, const struct http_io *io, void *io_ud,
                                   http_request_cb on_request, void *ud)
{
	struct http_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->lim = *lim;
	if (c->lim.n_header_bytes_max < 256)
		c->lim.n_header_bytes_max = 256;
	if (c->lim.n_pending_bytes_max < 4096)
		c->lim.n_pending_bytes_max = 4096;
	c->io = io;
	c->io_ud = io_ud;
	c->on_request = on_request;
	c->ud = ud;
	/* +2*HTTP_MAX_HEADERS+2 leaves room for the NUL terminators of every span */
	c->hcap = c->lim.n_header_bytes_max + 2 * HTTP_MAX_HEADERS + 2;
	c->hbuf = malloc(c->hcap);
	if (!c->hbuf) {
		free(c);
		return NULL;
	}
	llhttp_init(&c->parser, HTTP_REQUEST, settings_get());
	c->parser.data = c;
	return c;
}

static void fire_abort(struct http_conn *c)
{
	http_abort_cb cb = c->on_abort;
	c->on_abort = NULL;
	if (cb && c->busy)
		cb(c, c->abort_ud);
	c->busy = false;
}

void http_conn_destroy(struct http_conn *c)
{
	if (!c)
		return;
	c->closing = true;
	fire_abort(c);
	free(c->hbuf);
	free(c->body);
	free(c->pend);
	free(c);
}

bool http_conn_is_busy(const struct http_conn *c)
{
	return c->busy;
}
bool http_conn_is_closing(const struct http_conn *c)
{
	return c->closing;
}
bool http_conn_is_idle(const struct http_conn *c)
{
	return !c->busy && !c->in_message && !c->complete && c->pend_len == 0;
}

void http_conn_set_abort_cb(struct http_conn *c, http_abort_cb cb, void *ud)
{
	c->on_abort = cb;
	c->abort_ud = ud;
}

const char *http_request_header(const struct http_request *r, const char *name)
{
	for (int i = 0; i < r->n_headers; i++)
		if (strcmp(r->headers[i].name, name) == 0)
			return r->headers[i].value;
	return NULL;
}

/* ---- output ---------------------------------------------------------------------------------- */

static void do_close(struct http_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	c->io->close(c->io_ud);
}

static void emit(struct http_conn *c, const char *data, size_t len)
{
	if (!c->closing && len)
		c->io->write(c->io_ud, data, len);
}

/* Writes the status line and common headers into buf; returns the length or 0 if it did not fit. */
static size_t format_head(struct http_conn *c, char *buf, size_t cap, int status, const char *content_type,
                          const char *extra, bool close_after)
{
	int n = snprintf(buf, cap, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s", status,
	                 http_status_reason(status), content_type ? content_type : "application/json",
	                 extra ? extra : "", close_after ? "Connection: close\r\n" : "");
	if (n < 0 || (size_t)n >= cap)
		return 0;
	return (size_t)n;
}

static void reset_request(struct http_conn *c)
{
	c->hlen = 0;
	c->span = SPAN_NONE;
	c->n_headers = 0;
	c->too_many_headers = false;
	c->body_len = 0;
	c->err_status = 0;
	c->complete = false;
	c->streaming = false;
	c->stream_chunked = false;
	c->is_head = false;
	memset(&c->req, 0, sizeof(c->req));
	if (c->body_cap > 65536) { /* do not keep a large body buffer on an idle keep-alive connection */
		free(c->body);
		c->body = NULL;
		c->body_cap = 0;
	}
}

static void pump(struct http_conn *c);

static void finish_response(struct http_conn *c)
{
	bool close_after = !c->keep_alive || c->draining;
	c->busy = false;
	c->on_abort = NULL;
	reset_request(c);
	if (close_after) {
		do_close(c);
		return;
	}
	pump(c);
}

void http_respond(struct http_conn *c, int status, const char *content_type, const char *extra_headers,
                  const char *body, size_t body_len)
{
	if (c->closing || !c->busy || c->streaming)
		return;
	bool close_after = !c->keep_alive || c->draining;
	char head[1024];
	size_t hn = format_head(c, head, sizeof(head) - 48, status, content_type, extra_headers, close_after);
	if (hn == 0) {
		static const char fallback[] = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
		                               "Connection: close\r\n\r\n";
		emit(c, fallback, sizeof(fallback) - 1);
		c->keep_alive = false;
		finish_response(c);
		return;
	}
	hn += (size_t)snprintf(head + hn, sizeof(head) - hn, "Content-Length: %zu\r\n\r\n", body_len);
	size_t send_body = c->is_head ? 0 : body_len;
	/* one write per response keeps small responses in one TCP segment */
	if (hn + send_body <= 16384) {
		char out[16384];
		memcpy(out, head, hn);
		if (send_body)
			memcpy(out + hn, body, send_body);
		emit(c, out, hn + send_body);
	} else {
		emit(c, head, hn);
		emit(c, body, send_body);
	}
	finish_response(c);
}

void http_stream_begin(struct http_conn *c, int status, const char *content_type, const char *extra_headers)
{
	if (c->closing || !c->busy || c->streaming)
		return;
	/* HTTP/1.0 has no chunked encoding: stream raw and mark the end by closing */
	c->stream_chunked = !(c->parser.http_major == 1 && c->parser.http_minor == 0);
	if (!c->stream_chunked)
		c->keep_alive = false;
	bool close_after = !c->keep_alive || c->draining;
	char head[1024];
	size_t hn = format_head(c, head, sizeof(head) - 80, status, content_type, extra_headers, close_after);
	if (hn == 0) {
		http_respond(c, 500, NULL, NULL, NULL, 0);
		return;
	}
	hn += (size_t)snprintf(head + hn, sizeof(head) - hn, "Cache-Control: no-cache\r\n%s\r\n",
	                       c->stream_chunked ? "Transfer-Encoding: chunked\r\n" : "");
	c->streaming = true;
	emit(c, head, hn);
}

void http_stream_write(struct http_conn *c, const char *data, size_t len)
{
	if (c->closing || !c->streaming || len == 0 || c->is_head)
		return;
	if (!c->stream_chunked) {
		emit(c, data, len);
		return;
	}
	char small[4096];
	int hn = snprintf(small, 32, "%zx\r\n", len);
	if ((size_t)hn + len + 2 <= sizeof(small)) {
		memcpy(small + hn, data, len);
		memcpy(small + hn + len, "\r\n", 2);
		emit(c, small, (size_t)hn + len + 2);
	} else {
		emit(c, small, (size_t)hn);
		emit(c, data, len);
		emit(c, "\r\n", 2);
	}
}

void http_stream_end(struct http_conn *c)
{
	if (c->closing || !c->streaming)
		return;
	if (c->stream_chunked && !c->is_head)
		emit(c, "0\r\n\r\n", 5);
	else
		c->keep_alive = false;
	finish_response(c);
}

/* Answers a request that failed to parse or broke a limit, then closes. */
static void reject(struct http_conn *c, int status, const char *message)
{
	char body[512];
	int bn = snprintf(body, sizeof(body),
	                  "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
	                  "\"code\":null}}",
	                  message);
	char out[1024];
	int n = snprintf(out, sizeof(out),
	                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
	                 "Connection: close\r\n\r\n%s",
	                 status, http_status_reason(status), bn, body);
	if (n > 0 && (size_t)n < sizeof(out))
		emit(c, out, (size_t)n);
	LOG_DEBUG("http", "rejected request: %d %s", status, message);
	do_close(c);
}

/* ---- input ----------------------------------------------------------------------------------- */

static int span_append(struct http_conn *c, enum span kind, const char *at, size_t len)
{
	if (c->span != kind) {
		/* a new span starts: terminate the previous one */
		if (c->span != SPAN_NONE)
			c->hbuf[c->hlen++] = '\0';
		if (kind == SPAN_FIELD) {
			if (c->n_headers >= HTTP_MAX_HEADERS) {
				c->too_many_headers = true;
				c->err_status = 431;
				return HPE_USER;
			}
			c->field_off[c->n_headers] = c->hlen;
			c->value_off[c->n_headers] = c->hlen; /* a header with no value has an empty one */
		} else if (kind == SPAN_VALUE) {
			c->value_off[c->n_headers] = c->hlen;
		} else if (kind == SPAN_URL) {
			c->url_off = c->hlen;
		}
		c->span = kind;
	}
	/* reserve one byte per possible terminator still to come */
	size_t room = c->lim.n_header_bytes_max -
	              (c->hlen < c->lim.n_header_bytes_max ? c->hlen : c->lim.n_header_bytes_max);
	if (len > room || c->hlen + len + 2 * HTTP_MAX_HEADERS + 2 > c->hcap) {
		c->err_status = 431;
		return HPE_USER;
	}
	memcpy(c->hbuf + c->hlen, at, len);
	c->hlen += len;
	return 0;
}

static int on_message_begin(llhttp_t *p)
{
	struct http_conn *c = p->data;
	c->in_message = true;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	return span_append(p->data, SPAN_URL, at, len);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct http_conn *c = p->data;
	if (c->span == SPAN_VALUE || c->span == SPAN_URL) {
		/* the previous header is complete */
		if (c->span == SPAN_VALUE)
			c->n_headers++;
	} else if (c->span == SPAN_FIELD) {
		return span_append(c, SPAN_FIELD, at, len);
	}
	return span_append(c, SPAN_FIELD, at, len);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	return span_append(p->data, SPAN_VALUE, at, len);
}

static int on_header_field_complete(llhttp_t *p)
{
	struct http_conn *c = p->data;
	/* the value callback may never come for "Name:" with nothing after it */
	(void)c;
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = '\0';
	return s;
}

static int on_headers_complete(llhttp_t *p)
{
	struct http_conn *c = p->data;
	if (c->span == SPAN_FIELD) {
		/* last header had an empty value: give it one */
		c->hbuf[c->hlen++] = '\0';
		c->value_off[c->n_headers] = c->hlen;
		c->span = SPAN_VALUE;
	}
	if (c->span == SPAN_VALUE)
		c->n_headers++;
	if (c->span != SPAN_NONE)
		c->hbuf[c->hlen++] = '\0';
	c->span = SPAN_NONE;
	if (c->req.path == NULL && c->hlen == 0) {
		c->err_status = 400;
		return -1;
	}
	for (int i = 0; i < c->n_headers; i++) {
		char *name = c->hbuf + c->field_off[i];
		for (char *q = name; *q; q++)
			*q = (char)tolower((unsigned char)*q);
		c->req.headers[i].name = name;
		c->req.headers[i].value = trim(c->hbuf + c->value_off[i]);
	}
	c->req.n_headers = c->n_headers;
	if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->lim.n_body_bytes_max) {
		c->err_status = 413;
		return -1;
	}
	c->is_head = p->method == HTTP_HEAD;
	const char *expect = http_request_header(&c->req, "expect");
	if (expect && strcasecmp(expect, "100-continue") == 0) {
		static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
		emit(c, cont, sizeof(cont) - 1);
	}
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct http_conn *c = p->data;
	if (len > c->lim.n_body_bytes_max || c->body_len > c->lim.n_body_bytes_max - len) {
		c->err_status = 413;
		return HPE_USER;
	}
	if (c->body_len + len + 1 > c->body_cap) {
		size_t cap = c->body_cap ? c->body_cap : 4096;
		while (cap < c->body_len + len + 1)
			cap *= 2;
		if (cap > c->lim.n_body_bytes_max + 1)
			cap = c->lim.n_body_bytes_max + 1;
		char *nb = realloc(c->body, cap);
		if (!nb) {
			c->err_status = 503;
			return HPE_USER;
		}
		c->body = nb;
		c->body_cap = cap;
	}
	memcpy(c->body + c->body_len, at, len);
	c->body_len += len;
	return 0;
}

static enum http_method map_method(uint8_t m)
{
	switch (m) {
	case HTTP_GET: return HTTP_METHOD_GET;
	case HTTP_HEAD: return HTTP_METHOD_HEAD;
	case HTTP_POST: return HTTP_METHOD_POST;
	case HTTP_OPTIONS: return HTTP_METHOD_OPTIONS;
	default: return HTTP_METHOD_OTHER;
	}
}

static int on_message_complete(llhttp_t *p)
{
	struct http_conn *c = p->data;
	c->in_message = false;
	c->complete = true;
	c->keep_alive = llhttp_should_keep_alive(p) != 0;
	c->req.method = map_method(p->method);
	c->req.method_name = llhttp_method_name((llhttp_method_t)p->method);
	char *url = c->hbuf + c->url_off;
	char *q = strchr(url, '?');
	c->req.query = "";
	if (q) {
		*q = '\0';
		c->req.query = q + 1;
	}
	c->req.path = url;
	if (!c->body) {
		c->body = malloc(1);
		if (!c->body) {
			c->err_status = 503;
			return HPE_USER;
		}
		c->body_cap = 1;
	}
	c->body[c->body_len] = '\0';
	c->req.body = c->body;
	c->req.body_len = c->body_len;
	c->req.keep_alive = c->keep_alive;
	c->req.id = ++c->n_requests;
	return HPE_PAUSED;
}

static const llhttp_settings_t *settings_get(void)
{
	static llhttp_settings_t s;
	static bool init;
	if (!init) {
		llhttp_settings_init(&s);
		s.on_message_begin = on_message_begin;
		s.on_url = on_url;
		s.on_header_field = on_header_field;
		s.on_header_value = on_header_value;
		s.on_header_field_complete = on_header_field_complete;
		s.on_headers_complete = on_headers_complete;
		s.on_body = on_body;
		s.on_message_complete = on_message_complete;
		init = true;
	}
	return &s;
}

static int status_for_parse_error(struct http_conn *c, llhttp_errno_t err, const char **msg)
{
	if (c->err_status == 413) {
		*msg = "request body is larger than the configured limit";
		return 413;
	}
	if (c->err_status == 431) {
		*msg = c->too_many_headers ? "too many request headers"
		                           : "request line and headers are too large";
		return 431;
	}
	if (c->err_status == 503) {
		*msg = "out of memory";
		return 503;
	}
	if (err == HPE_INVALID_VERSION) {
		*msg = "only HTTP/1.0 and HTTP/1.1 are supported";
		return 505;
	}
	if (err == HPE_INVALID_METHOD) {
		*msg = "malformed or unsupported request method";
		return 400;
	}
	*msg = "malformed HTTP request";
	return 400;
}

/* Parses pending bytes and dispatches complete requests until a request is in flight, the buffer
 * is empty or the connection closes. Not re-entrant: a handler that answers synchronously returns
 * here through finish_response(), which only sets flags while we are pumping. */
static void pump(struct http_conn *c)
{
	if (c->pumping)
		return;
	c->pumping = true;
	while (!c->closing && !c->busy) {
		if (c->complete) {
			c->complete = false;
			c->busy = true;
			c->on_request(c, &c->req, c->ud);
			continue;
		}
		if (c->pend_len == 0)
			break;
		llhttp_errno_t err = llhttp_execute(&c->parser, c->pend, c->pend_len);
		size_t used = c->pend_len;
		if (err == HPE_PAUSED) {
			used = (size_t)(llhttp_get_error_pos(&c->parser) - c->pend);
			llhttp_resume(&c->parser);
		} else if (err != HPE_OK) {
			const char *msg;
			int status = status_for_parse_error(c, err, &msg);
			c->pend_len = 0;
			reject(c, status, msg);
			break;
		}
		memmove(c->pend, c->pend + used, c->pend_len - used);
		c->pend_len -= used;
	}
	if (!c->closing && c->reading_off && c->pend_len < c->lim.n_pending_bytes_max) {
		c->reading_off = false;
		if (c->io->set_reading)
			c->io->set_reading(c->io_ud, true);
	}
	c->pumping = false;
}

void http_conn_feed(struct http_conn *c, const char *data, size_t len)
{
	if (c->closing || len == 0)
		return;
	if (c->pend_len + len > c->pend_cap) {
		size_t cap = c->pend_cap ? c->pend_cap : 4096;
		while (cap < c->pend_len + len)
			cap *= 2;
		char *np = realloc(c->pend, cap);
		if (!np) {
			reject(c, 503, "out of memory");
			return;
		}
		c->pend = np;
		c->pend_cap = cap;
	}
	memcpy(c->pend + c->pend_len, data, len);
	c->pend_len += len;
	if (c->pend_len >= c->lim.n_pending_bytes_max && c->busy && !c->reading_off) {
		c->reading_off = true;
		if (c->io->set_reading)
			c->io->set_reading(c->io_ud, false);
	}
	pump(c);
}

void http_conn_eof(struct http_conn *c)
{
	if (c->closing)
		return;
	if (c->busy) {
		c->closing = true;
		fire_abort(c);
		c->io->close(c->io_ud);
		return;
	}
	do_close(c);
}

void http_conn_timeout(struct http_conn *c)
{
	if (c->closing || c->busy)
		return;
	if (c->in_message || c->pend_len > 0)
		reject(c, 408, "timed out waiting for the complete request");
	else
		do_close(c);
}

void http_conn_set_draining(struct http_conn *c)
{
	c->draining = true;
	if (!c->busy && http_conn_is_idle(c))
		do_close(c);
}
