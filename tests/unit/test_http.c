/* HTTP connection core (router/http.c), driven without sockets: bytes are fed as a client would
 * send them (whole, byte by byte, pipelined) and the bytes written back are checked against
 * expectations derived from RFC 9112 framing rules and the limits configured. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/http.h"

static int n_fail;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                               \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

struct sink {
	char out[1 << 16];
	size_t len;
	bool closed;
	bool reading;
	int n_closes;
};

static void io_write(void *ud, const char *d, size_t n)
{
	struct sink *s = ud;
	if (s->len + n < sizeof(s->out)) {
		memcpy(s->out + s->len, d, n);
		s->len += n;
		s->out[s->len] = '\0';
	}
}
static void io_close(void *ud)
{
	struct sink *s = ud;
	s->closed = true;
	s->n_closes++;
}
static void io_set_reading(void *ud, bool on)
{
	((struct sink *)ud)->reading = on;
}
static const struct http_io io = {io_write, io_close, io_set_reading};

/* handler modes */
enum mode { ECHO, DEFER, STREAM };
struct handler {
	enum mode mode;
	int n_requests;
	int n_aborts;
	char last_path[256];
	char last_body[70000];
	size_t last_body_len;
	char last_auth[128];
	struct http_conn *pending;
};

static void on_abort(struct http_conn *c, void *ud)
{
	(void)c;
	((struct handler *)ud)->n_aborts++;
}

static void on_request(struct http_conn *c, struct http_request *r, void *ud)
{
	struct handler *h = ud;
	h->n_requests++;
	snprintf(h->last_path, sizeof(h->last_path), "%s", r->path);
	memcpy(h->last_body, r->body, r->body_len);
	h->last_body_len = r->body_len;
	const char *a = http_request_header(r, "authorization");
	snprintf(h->last_auth, sizeof(h->last_auth), "%s", a ? a : "");
	if (h->mode == DEFER) {
		h->pending = c;
		http_conn_set_abort_cb(c, on_abort, h);
		return;
	}
	if (h->mode == STREAM) {
		http_stream_begin(c, 200, "text/event-stream", "");
		http_stream_write(c, "data: 1\n\n", 9);
		http_stream_write(c, "data: 22\n\n", 10);
		http_stream_end(c);
		return;
	}
	char body[512];
	int n = snprintf(body, sizeof(body), "%s %s %zu", r->method_name, r->path, r->body_len);
	http_respond(c, 200, "text/plain", "", body, (size_t)n);
}

static const struct http_limits lim = {
    .n_header_bytes_max = 1024, .n_body_bytes_max = 100, .n_pending_bytes_max = 4096};

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

struct fixture {
	struct sink s;
	struct handler h;
	struct http_conn *c;
};

static void setup(struct fixture *f, enum mode m)
{
	memset(f, 0, sizeof(*f));
	f->h.mode = m;
	f->c = http_conn_create(&lim, &io, &f->s, on_request, &f->h);
}

static void feed_str(struct fixture *f, const char *s)
{
	http_conn_feed(f->c, s, strlen(s));
}

/* Table: one request text in, expected status line, close expected, handler count. */
struct case_ {
	const char *name;
	const char *in;
	const char *status; /* expected first status line prefix */
	bool closes;
	int n_requests;
};

static const struct case_ cases[] = {
    {"simple get", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK", false, 1},
    {"query stripped", "GET /v1/models?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200", false, 1},
    {"post with body", "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", "HTTP/1.1 200",
     false, 1},
    {"chunked body", "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
     "HTTP/1.1 200", false, 1},
    {"http/1.0 closes", "GET /a HTTP/1.0\r\n\r\n", "HTTP/1.1 200", true, 1},
    {"connection close", "GET /a HTTP/1.1\r\nConnection: close\r\n\r\n", "HTTP/1.1 200", true, 1},
    {"body over limit (content-length)", "POST /a HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "HTTP/1.1 413",
     true, 0},
    {"body over limit (chunked)",
     "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n"
     "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n0\r\n\r\n",
     "HTTP/1.1 413", true, 0},
    {"garbage", "\x01\x02 nonsense\r\n\r\n", "HTTP/1.1 400", true, 0},
    {"bad version", "GET / HTTP/9.9\r\n\r\n", "HTTP/1.1 505", true, 0},
    {"both content-length and chunked",
     "POST /a HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 400", true, 0},
    {"negative content-length", "POST /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400", true, 0},
    {"header without colon", "GET / HTTP/1.1\r\nBroken\r\n\r\n", "HTTP/1.1 400", true, 0},
    {"expect continue", "POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
     "HTTP/1.1 100 Continue", false, 1},
};

static void test_table(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct case_ *k = &cases[i];
		for (int bytewise = 0; bytewise < 2; bytewise++) {
			struct fixture f;
			setup(&f, ECHO);
			if (bytewise)
				for (const char *p = k->in; *p && !f.s.closed; p++)
					http_conn_feed(f.c, p, 1);
			else
				feed_str(&f, k->in);
			CHECK(strncmp(f.s.out, k->status, strlen(k->status)) == 0,
			      "%s (bytewise=%d): got '%.60s'", k->name, bytewise, f.s.out);
			CHECK(f.s.closed == k->closes, "%s (bytewise=%d): closed=%d", k->name, bytewise,
			      f.s.closed);
			CHECK(f.h.n_requests == k->n_requests, "%s: %d requests", k->name, f.h.n_requests);
			if (strstr(k->status, "4") || strstr(k->status, "505"))
				if (k->n_requests == 0)
					CHECK(strstr(f.s.out, "\"error\":{\"message\"") != NULL,
					      "%s: OpenAI-shaped error body", k->name);
			http_conn_destroy(f.c);
		}
	}
}

static void test_headers_and_body(void)
{
	struct fixture f;
	setup(&f, ECHO);
	feed_str(&f, "POST /v1/x?y HTTP/1.1\r\nAuthorization:   Bearer  k1 \r\nX-Empty:\r\nContent-Length: "
	             "4\r\n\r\nab\0d");
	/* the feed above stops at the NUL in the C literal: send the rest explicitly */
	http_conn_feed(f.c, "\0d", 2);
	CHECK(f.h.n_requests == 1, "one request");
	CHECK(strcmp(f.h.last_path, "/v1/x") == 0, "path '%s'", f.h.last_path);
	CHECK(strcmp(f.h.last_auth, "Bearer  k1") == 0, "auth trimmed: '%s'", f.h.last_auth);
	CHECK(f.h.last_body_len == 4 && memcmp(f.h.last_body, "ab\0d", 4) == 0, "body with NUL kept");
	CHECK(strstr(f.s.out, "Content-Length: 12\r\n") != NULL, "content length of echo: %s", f.s.out);
	http_conn_destroy(f.c);
}

static void test_header_limits(void)
{
	struct fixture f;
	setup(&f, ECHO);
	char big[2048];
	memset(big, 'a', sizeof(big));
	big[sizeof(big) - 1] = '\0';
	feed_str(&f, "GET / HTTP/1.1\r\nX-Big: ");
	feed_str(&f, big);
	feed_str(&f, "\r\n\r\n");
	CHECK(strncmp(f.s.out, "HTTP/1.1 431", 12) == 0, "oversized header: %.40s", f.s.out);
	CHECK(f.s.closed, "closed after 431");
	http_conn_destroy(f.c);

	setup(&f, ECHO);
	feed_str(&f, "GET / HTTP/1.1\r\n");
	for (int i = 0; i < HTTP_MAX_HEADERS + 2 && !f.s.closed; i++)
		feed_str(&f, "A: b\r\n");
	feed_str(&f, "\r\n");
	CHECK(strncmp(f.s.out, "HTTP/1.1 431", 12) == 0, "too many headers: %.40s", f.s.out);
	http_conn_destroy(f.c);
}

static void test_keepalive_and_pipelining(void)
{
	struct fixture f;
	setup(&f, ECHO);
	feed_str(
	    &f,
	    "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\nPOST /3 HTTP/1.1\r\nContent-Length: 2\r\n\r\nxy");
	CHECK(f.h.n_requests == 3, "three pipelined requests: %d", f.h.n_requests);
	const char *a = strstr(f.s.out, "GET /1"), *b = strstr(f.s.out, "GET /2"),
	           *c = strstr(f.s.out, "POST /3 2");
	CHECK(a && b && c && a < b && b < c, "responses in request order: %s", f.s.out);
	CHECK(!f.s.closed, "keep-alive");
	CHECK(http_conn_is_idle(f.c), "idle after all answered");
	http_conn_destroy(f.c);

	/* deferred handler: the second request waits until the first response is finished */
	setup(&f, DEFER);
	feed_str(&f, "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n");
	CHECK(f.h.n_requests == 1, "second request held back while first in flight: %d", f.h.n_requests);
	CHECK(http_conn_is_busy(f.c), "busy");
	struct http_conn *c1 = f.h.pending;
	http_respond(c1, 200, "text/plain", "", "one", 3);
	CHECK(f.h.n_requests == 2, "second request dispatched after first response: %d", f.h.n_requests);
	CHECK(strcmp(f.h.last_path, "/2") == 0, "second path");
	http_respond(f.h.pending, 200, "text/plain", "", "two", 3);
	CHECK(count(f.s.out, "HTTP/1.1 200") == 2, "two responses");
	CHECK(strstr(f.s.out, "one") < strstr(f.s.out, "two"), "in order");
	http_conn_destroy(f.c);
}

static void test_backpressure(void)
{
	struct fixture f;
	setup(&f, DEFER);
	f.s.reading = true;
	feed_str(&f, "GET /1 HTTP/1.1\r\n\r\n");
	char junk[5000];
	memset(junk, 'G', sizeof(junk));
	http_conn_feed(f.c, junk, sizeof(junk));
	CHECK(!f.s.reading, "reading paused while a request is in flight and >4096 bytes are buffered");
	http_respond(f.h.pending, 200, "text/plain", "", "x", 1);
	/* the junk is now parsed: a malformed request -> 400 + close */
	CHECK(strstr(f.s.out, "HTTP/1.1 400") != NULL, "junk rejected after resume");
	CHECK(f.s.closed, "closed");
	http_conn_destroy(f.c);
}

static void test_stream(void)
{
	struct fixture f;
	setup(&f, STREAM);
	feed_str(&f, "GET /s HTTP/1.1\r\n\r\n");
	CHECK(strstr(f.s.out, "Transfer-Encoding: chunked\r\n") != NULL, "chunked");
	CHECK(strstr(f.s.out, "\r\n\r\n9\r\ndata: 1\n\n\r\na\r\ndata: 22\n\n\r\n0\r\n\r\n") != NULL,
	      "chunk framing: %s", f.s.out);
	CHECK(!f.s.closed, "keep-alive after a chunked stream");
	http_conn_destroy(f.c);

	/* HTTP/1.0 client: no chunking, close marks the end */
	setup(&f, STREAM);
	feed_str(&f, "GET /s HTTP/1.0\r\n\r\n");
	CHECK(strstr(f.s.out, "chunked") == NULL, "no chunking for 1.0");
	CHECK(strstr(f.s.out, "\r\n\r\ndata: 1\n\ndata: 22\n\n") != NULL, "raw stream: %s", f.s.out);
	CHECK(f.s.closed, "closed after 1.0 stream");
	http_conn_destroy(f.c);
}

static void test_abort_and_timeout(void)
{
	struct fixture f;
	setup(&f, DEFER);
	feed_str(&f, "GET /1 HTTP/1.1\r\n\r\n");
	http_conn_eof(f.c);
	CHECK(f.h.n_aborts == 1, "abort fired once on EOF while busy: %d", f.h.n_aborts);
	CHECK(f.s.closed, "closed");
	http_conn_eof(f.c);
	http_conn_destroy(f.c);
	CHECK(f.h.n_aborts == 1, "abort not fired again: %d", f.h.n_aborts);

	/* destroy while busy (socket error) also aborts exactly once */
	setup(&f, DEFER);
	feed_str(&f, "GET /1 HTTP/1.1\r\n\r\n");
	http_conn_destroy(f.c);
	CHECK(f.h.n_aborts == 1, "abort on destroy");

	setup(&f, ECHO);
	feed_str(&f, "GET /1 HTTP/1.1\r\nHost:");
	http_conn_timeout(f.c);
	CHECK(strncmp(f.s.out, "HTTP/1.1 408", 12) == 0, "408 for a half request: %.30s", f.s.out);
	CHECK(f.s.closed, "closed");
	http_conn_destroy(f.c);

	setup(&f, ECHO);
	http_conn_timeout(f.c);
	CHECK(f.s.len == 0 && f.s.closed, "idle timeout closes quietly");
	http_conn_destroy(f.c);

	setup(&f, DEFER);
	feed_str(&f, "GET /1 HTTP/1.1\r\n\r\n");
	http_conn_set_draining(f.c);
	CHECK(!f.s.closed, "draining waits for the response");
	http_respond(f.h.pending, 200, "text/plain", "", "x", 1);
	CHECK(strstr(f.s.out, "Connection: close") != NULL, "draining response says close");
	CHECK(f.s.closed && f.s.n_closes == 1, "closed once after the response");
	http_conn_destroy(f.c);
}

int main(void)
{
	test_table();
	test_headers_and_body();
	test_header_limits();
	test_keepalive_and_pipelining();
	test_backpressure();
	test_stream();
	test_abort_and_timeout();
	printf("test_http: %s (%d failures)\n", n_fail ? "FAIL" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
