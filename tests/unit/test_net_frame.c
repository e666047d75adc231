/* Frame codec: header round trip, streaming reassembly at every split point, many frames per
 * feed, oversize rejected from the header (no allocation), garbage and type 0 rejected with a
 * clear message, and a broken stream staying broken. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/frame.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

struct got {
	int n;
	uint16_t types[64];
	size_t lens[64];
	uint8_t data[64][300];
};

static int collect_cb(void *ctx, uint16_t type, const uint8_t *p, size_t len)
{
	struct got *g = ctx;
	if (g->n >= 64)
		return -1;
	g->types[g->n] = type;
	g->lens[g->n] = len;
	memcpy(g->data[g->n], p, len < 300 ? len : 300);
	g->n++;
	return 0;
}

/* builds a stream of n frames: frame i has type i+1 and i*7 payload bytes of value i */
static size_t build_stream(uint8_t *out, int n)
{
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		size_t len = (size_t)i * 7;
		frame_put_header(out + off, (uint16_t)(i + 1), (uint32_t)len);
		off += FRAME_HDR_BYTES;
		memset(out + off, i, len);
		off += len;
	}
	return off;
}

static void check_stream(const struct got *g, int n)
{
	CHECK(g->n == n);
	for (int i = 0; i < g->n && i < n; i++) {
		CHECK(g->types[i] == i + 1);
		CHECK(g->lens[i] == (size_t)i * 7);
		for (size_t k = 0; k < g->lens[i]; k++)
			if (g->data[i][k] != i) {
				CHECK(!"payload byte differs");
				break;
			}
	}
}

static void test_header(void)
{
	uint8_t h[8];
	uint16_t t;
	uint32_t len;
	struct errbuf e = {0};
	frame_put_header(h, 0x1234, 0xabcdef);
	CHECK(h[0] == 'T' && h[1] == 'D');
	CHECK(frame_parse_header(h, 1u << 30, &t, &len, &e) == 0);
	CHECK(t == 0x1234 && len == 0xabcdef);
	/* oversize: rejected from the header, message names the sizes */
	CHECK(frame_parse_header(h, 1000, &t, &len, &e) == ERR_LIMIT);
	CHECK(strstr(e.msg, "11259375") && strstr(e.msg, "1000"));
	/* garbage: an HTTP request on the control port */
	CHECK(frame_parse_header((const uint8_t *)"GET / HT", 1000, &t, &len, &e) == ERR_PROTO);
	CHECK(strstr(e.msg, "bad magic") != NULL);
	frame_put_header(h, 0, 4);
	CHECK(frame_parse_header(h, 1000, &t, &len, &e) == ERR_PROTO);
	CHECK(strstr(e.msg, "type 0") != NULL);
}

static void test_split_everywhere(void)
{
	static uint8_t stream[8192];
	size_t n = build_stream(stream, 20);
	/* one feed per split point: [0, k) and [k, n) */
	for (size_t k = 0; k <= n; k++) {
		struct frame_reader r;
		static struct got g;
		memset(&g, 0, sizeof(g));
		struct errbuf e = {0};
		frame_reader_init(&r, 4096);
		CHECK(frame_reader_feed(&r, stream, k, collect_cb, &g, &e) == 0);
		CHECK(frame_reader_feed(&r, stream + k, n - k, collect_cb, &g, &e) == 0);
		check_stream(&g, 20);
		frame_reader_fini(&r);
		if (n_fail)
			return;
	}
	/* byte by byte */
	struct frame_reader r;
	static struct got g;
	memset(&g, 0, sizeof(g));
	struct errbuf e = {0};
	frame_reader_init(&r, 4096);
	for (size_t i = 0; i < n; i++)
		CHECK(frame_reader_feed(&r, stream + i, 1, collect_cb, &g, &e) == 0);
	check_stream(&g, 20);
	CHECK(r.n_frames == 20);
	frame_reader_fini(&r);
}

static void test_errors(void)
{
	struct frame_reader r;
	static struct got g;
	struct errbuf e = {0};
	uint8_t buf[64];

	/* oversize frame: rejected before the payload arrives and nothing buffered */
	memset(&g, 0, sizeof(g));
	frame_reader_init(&r, 100);
	frame_put_header(buf, 3, 101);
	CHECK(frame_reader_feed(&r, buf, 8, collect_cb, &g, &e) == ERR_LIMIT);
	CHECK(r.buf == NULL && r.cap_buf == 0);
	CHECK(g.n == 0);
	/* the stream is out of sync for good */
	frame_put_header(buf, 3, 1);
	CHECK(frame_reader_feed(&r, buf, 9, collect_cb, &g, &e) == ERR_PROTO);
	CHECK(strstr(e.msg, "already failed") != NULL);
	frame_reader_fini(&r);

	/* a good frame then garbage: the good frame is delivered, then the error */
	memset(&g, 0, sizeof(g));
	frame_reader_init(&r, 100);
	frame_put_header(buf, 5, 2);
	buf[8] = 0xaa, buf[9] = 0xbb;
	memcpy(buf + 10, "\x00\x01garbage", 9);
	CHECK(frame_reader_feed(&r, buf, 19, collect_cb, &g, &e) == ERR_PROTO);
	CHECK(g.n == 1 && g.types[0] == 5 && g.lens[0] == 2 && g.data[0][1] == 0xbb);
	frame_reader_fini(&r);

	/* zero-length frames, several in one feed, and one ending exactly at the chunk end */
	memset(&g, 0, sizeof(g));
	frame_reader_init(&r, 100);
	frame_put_header(buf, 7, 0);
	frame_put_header(buf + 8, 8, 0);
	CHECK(frame_reader_feed(&r, buf, 16, collect_cb, &g, &e) == 0);
	CHECK(g.n == 2 && g.types[1] == 8 && g.lens[1] == 0);
	frame_reader_fini(&r);

	/* a callback's nonzero return stops the feed and is passed through */
	memset(&g, 0, sizeof(g));
	g.n = 64; /* collect_cb now returns -1 */
	frame_reader_init(&r, 100);
	CHECK(frame_reader_feed(&r, buf, 16, collect_cb, &g, &e) == -1);
	frame_reader_fini(&r);

	/* random garbage never crashes and always ends in an error or a clean state */
	srand(1234);
	for (int it = 0; it < 2000; it++) {
		uint8_t junk[256];
		size_t n = (size_t)(rand() % 256);
		for (size_t i = 0; i < n; i++)
			junk[i] = (uint8_t)rand();
		if (it % 2) /* half the time, a valid magic in front */
			junk[0] = 'T', junk[1] = 'D';
		memset(&g, 0, sizeof(g));
		frame_reader_init(&r, 200);
		int rc = frame_reader_feed(&r, junk, n, collect_cb, &g, &e);
		CHECK(rc == 0 || rc == ERR_PROTO || rc == ERR_LIMIT || rc == -1);
		CHECK(r.cap_buf <= 200);
		frame_reader_fini(&r);
	}
}

int main(void)
{
	test_header();
	test_split_everywhere();
	test_errors();
	if (n_fail) {
		fprintf(stderr, "test_net_frame: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_frame: all checks passed\n");
	return 0;
}
