/* libFuzzer target for the router's HTTP request path: bytes from a client -> the connection core
 * (router/http.c) fed in pieces whose sizes come from the input, with a handler that answers some
 * requests at once, streams some, and leaves some pending until more bytes arrive, so pipelining,
 * limits, aborts and timeouts are all reached. Invariants checked: every response written starts
 * with "HTTP/1.1 ", a closed connection writes nothing more, the handler never sees a request
 * whose body exceeds the limit.
 * Not part of `make all`. Build and run (clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -I/usr/share/include/llhttp \
 *     tests/fuzz/fuzz_http.c router/http.c /usr/share/llhttp/{api,http,llhttp}.c common/base/err.c
 * common/base/log.c \ -o build/fuzz_http build/fuzz_http -max_total_time=60 Without clang: add -DFUZZ_MAIN
 * and use gcc: it runs each file given on the command line. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct state {
	bool closed;
	size_t n_out;
	bool expect_status;
	struct http_conn *pending;
	int n_requests;
};

static void fz_write(void *ud, const char *d, size_t n)
{
	struct state *s = ud;
	if (s->closed)
		abort(); /* nothing may be written after close */
	if (s->expect_status && (n < 9 || memcmp(d, "HTTP/1.1 ", 9) != 0))
		abort();
	s->expect_status = false;
	s->n_out += n;
}

static void fz_close(void *ud)
{
	((struct state *)ud)->closed = true;
}
static void fz_reading(void *ud, bool on)
{
	(void)ud;
	(void)on;
}
static const struct http_io io = {fz_write, fz_close, fz_reading};
static const struct http_limits lim = {
    .n_header_bytes_max = 2048, .n_body_bytes_max = 4096, .n_pending_bytes_max = 8192};

static void on_abort(struct http_conn *c, void *ud)
{
	(void)c;
	((struct state *)ud)->pending = NULL;
}

static void on_request(struct http_conn *c, struct http_request *r, void *ud)
{
	struct state *s = ud;
	if (r->body_len > lim.n_body_bytes_max)
		abort();
	s->n_requests++;
	(void)http_request_header(r, "authorization");
	switch (r->body_len % 3) {
	case 0:
		s->expect_status = true;
		http_respond(c, 200, "text/plain", "", r->path, strlen(r->path));
		break;
	case 1:
		s->expect_status = true;
		http_stream_begin(c, 200, "text/event-stream", "");
		http_stream_write(c, r->body, r->body_len);
		http_stream_end(c);
		break;
	default:
		s->pending = c; /* answered when the next piece arrives */
		http_conn_set_abort_cb(c, on_abort, s);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct state s = {0};
	struct http_conn *c = http_conn_create(&lim, &io, &s, on_request, &s);
	if (!c)
		return 0;
	size_t off = 0;
	while (off < size && !s.closed) {
		size_t piece = 1 + (data[off] % 64);
		off++;
		if (piece > size - off)
			piece = size - off;
		if (s.pending) {
			struct http_conn *p = s.pending;
			s.pending = NULL;
			s.expect_status = true;
			http_respond(p, 204, NULL, "", "", 0);
		}
		if (s.closed)
			break;
		http_conn_feed(c, (const char *)data + off, piece);
		off += piece;
		if (off < size && data[off - 1] == 0xff)
			http_conn_timeout(c);
	}
	if (!s.closed && (size & 1))
		http_conn_eof(c);
	http_conn_destroy(c);
	return 0;
}

#ifdef FUZZ_MAIN
int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f)
			continue;
		static uint8_t buf[1 << 20];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
	}
	return 0;
}
#endif
