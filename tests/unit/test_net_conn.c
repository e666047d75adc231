/* Control connections on loopback, in one libuv loop: many frames in order over TCP and a Unix
 * socket, a peer sending garbage gets Error(PROTOCOL) and is disconnected, an idle peer is
 * closed by the idle timeout, a peer that does not read makes conn_send fail with ERR_LIMIT
 * instead of growing memory, and connecting to a closed port reports an error. Every wait has a
 * deadline (a watchdog timer fails the test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/conn.h"
#include "common/net/frame.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

#define N_MSGS 2000

struct ctx {
	uv_loop_t *loop;
	struct conn_listener *l;
	struct conn *client, *server;
	int n_server_msgs, n_client_msgs;
	uint64_t next_rid;
	int server_closed, client_closed;
	int client_close_err, server_close_err;
	char server_close_why[256];
	int connected;
	int got_error_code;
	char got_error_msg[512];
	int done;
};

static void stop_loop(struct ctx *x)
{
	x->done = 1;
	uv_stop(x->loop);
}

static int server_msg_cb(struct conn *c, struct msg *m, void *ud)
{
	struct ctx *x = ud;
	if (m->type != MSG_TOKENS || m->u.tokens.rid != x->next_rid || m->u.tokens.n_tokens != 3 ||
	    m->u.tokens.tokens[2].id != (uint32_t)m->u.tokens.rid * 3 + 2) {
		CHECK(!"server got an unexpected message");
		return -1;
	}
	x->next_rid++;
	x->n_server_msgs++;
	/* echo a heartbeat back so both directions are exercised */
	struct msg hb;
	msg_init(&hb, MSG_HEARTBEAT);
	hb.u.heartbeat.queued_tokens = m->u.tokens.rid;
	struct errbuf e;
	CHECK(conn_send(c, &hb, &e) == 0);
	return 0;
}

static void server_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	struct ctx *x = ud;
	x->server_closed++;
	x->server_close_err = err;
	snprintf(x->server_close_why, sizeof(x->server_close_why), "%s", why);
	x->server = NULL;
}

static int accept_cb(struct conn_listener *l, struct conn *c, void *ud)
{
	struct ctx *x = ud;
	x->server = c;
	return 0;
}

static int client_msg_cb(struct conn *c, struct msg *m, void *ud)
{
	struct ctx *x = ud;
	if (m->type == MSG_ERROR) {
		x->got_error_code = m->u.error.code;
		snprintf(x->got_error_msg, sizeof(x->got_error_msg), "%s", m->u.error.message);
		return 0;
	}
	CHECK(m->type == MSG_HEARTBEAT);
	CHECK(m->u.heartbeat.queued_tokens == (uint64_t)x->n_client_msgs + 1);
	x->n_client_msgs++;
	if (x->n_client_msgs == N_MSGS)
		conn_close(c, "test done");
	return 0;
}

static void client_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	struct ctx *x = ud;
	x->client_closed++;
	x->client_close_err = err;
	x->client = NULL;
	stop_loop(x);
}

static void client_connect_cb(struct conn *c, int status, void *ud)
{
	struct ctx *x = ud;
	x->connected = status == 0 ? 1 : -1;
	if (status)
		return;
	/* send everything at once: the server sees many frames per read */
	for (int i = 0; i < N_MSGS; i++) {
		struct msg_token t[3] = {{.id = (uint32_t)(i + 1) * 3},
		                         {.id = (uint32_t)(i + 1) * 3 + 1},
		                         {.id = (uint32_t)(i + 1) * 3 + 2}};
		struct msg m;
		msg_init(&m, MSG_TOKENS);
		m.u.tokens.rid = (uint64_t)i + 1;
		m.u.tokens.n_tokens = 3;
		m.u.tokens.tokens = t;
		struct errbuf e;
		CHECK(conn_send(c, &m, &e) == 0);
	}
}

static void watchdog_cb(uv_timer_t *t)
{
	fprintf(stderr, "watchdog: test step did not finish in time\n");
	n_fail++;
	uv_stop(t->loop);
}

/* runs the loop until stop_loop() or the watchdog */
static void run_until(uv_loop_t *loop, unsigned ms)
{
	uv_timer_t wd;
	uv_timer_init(loop, &wd);
	uv_timer_start(&wd, watchdog_cb, ms, 0);
	uv_run(loop, UV_RUN_DEFAULT);
	uv_timer_stop(&wd);
	uv_close((uv_handle_t *)&wd, NULL);
	/* let close callbacks run */
	for (int i = 0; i < 10; i++)
		uv_run(loop, UV_RUN_NOWAIT);
}

static void test_many_frames(uv_loop_t *loop, const char *addr_fmt)
{
	struct ctx x = {.loop = loop, .next_rid = 1};
	struct errbuf e = {0};
	struct conn_opts so = {
	    .on_msg_cb = server_msg_cb, .on_close_cb = server_close_cb, .ud = &x, .idle_timeout_ms = 5000};
	CHECK(conn_listen(loop, addr_fmt, &so, accept_cb, &x, &x.l, &e) == 0);
	char addr[256];
	if (strncmp(addr_fmt, "unix:", 5) == 0)
		snprintf(addr, sizeof(addr), "%s", addr_fmt);
	else
		snprintf(addr, sizeof(addr), "127.0.0.1:%d", conn_listener_port(x.l));
	struct conn_opts co = {.on_msg_cb = client_msg_cb,
	                       .on_close_cb = client_close_cb,
	                       .on_connect_cb = client_connect_cb,
	                       .ud = &x};
	CHECK(conn_connect(loop, addr, &co, &x.client, &e) == 0);
	run_until(loop, 20000);
	CHECK(x.connected == 1);
	CHECK(x.n_server_msgs == N_MSGS);
	CHECK(x.n_client_msgs == N_MSGS);
	CHECK(x.client_closed == 1 && x.client_close_err == 0);
	/* the server notices the client's close */
	for (int i = 0; i < 100 && !x.server_closed; i++)
		uv_run(loop, UV_RUN_ONCE);
	CHECK(x.server_closed == 1);
	conn_listener_close(x.l);
	uv_run(loop, UV_RUN_NOWAIT);
	printf("many frames over %s: %d each way\n", addr_fmt, x.n_server_msgs);
}

/* ---- garbage and idle peers, using raw libuv TCP clients ---- */

struct raw {
	uv_tcp_t tcp;
	uv_connect_t creq;
	uv_write_t wreq;
	struct ctx *x;
	const char *send;
	size_t send_len;
	uint8_t got[4096];
	size_t n_got;
	int eof;
};

static void raw_alloc_cb(uv_handle_t *h, size_t s, uv_buf_t *b)
{
	struct raw *r = h->data;
	b->base = (char *)r->got + r->n_got;
	b->len = sizeof(r->got) - r->n_got;
}

static void raw_read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	struct raw *r = s->data;
	if (n > 0)
		r->n_got += (size_t)n;
	if (n < 0) {
		r->eof = 1;
		uv_close((uv_handle_t *)&r->tcp, NULL);
		stop_loop(r->x);
	}
}

static void raw_connect_cb(uv_connect_t *req, int status)
{
	struct raw *r = req->data;
	CHECK(status == 0);
	uv_read_start((uv_stream_t *)&r->tcp, raw_alloc_cb, raw_read_cb);
	if (r->send) {
		uv_buf_t b = uv_buf_init((char *)r->send, (unsigned)r->send_len);
		uv_write(&r->wreq, (uv_stream_t *)&r->tcp, &b, 1, NULL);
	}
}

static int frame_to_msg_cb(void *ctx, uint16_t type, const uint8_t *p, size_t len)
{
	struct ctx *x = ctx;
	struct msg m;
	struct errbuf e;
	CHECK(msg_decode(type, p, len, &m, &e) == 0);
	if (m.type == MSG_ERROR) {
		x->got_error_code = m.u.error.code;
		snprintf(x->got_error_msg, sizeof(x->got_error_msg), "%s", m.u.error.message);
	}
	msg_clear(&m);
	return 0;
}

static void run_raw_peer(uv_loop_t *loop, const char *send, size_t send_len, uint32_t idle_ms, struct ctx *x)
{
	struct errbuf e = {0};
	struct conn_opts so = {
	    .on_msg_cb = server_msg_cb, .on_close_cb = server_close_cb, .ud = x, .idle_timeout_ms = idle_ms};
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, accept_cb, x, &x->l, &e) == 0);
	struct sockaddr_in sa;
	uv_ip4_addr("127.0.0.1", conn_listener_port(x->l), &sa);
	static struct raw r;
	memset(&r, 0, sizeof(r));
	r.x = x;
	r.send = send;
	r.send_len = send_len;
	uv_tcp_init(loop, &r.tcp);
	r.tcp.data = &r;
	r.creq.data = &r;
	uv_tcp_connect(&r.creq, &r.tcp, (struct sockaddr *)&sa, raw_connect_cb);
	run_until(loop, 10000);
	CHECK(r.eof);
	struct frame_reader fr;
	frame_reader_init(&fr, 4096);
	CHECK(frame_reader_feed(&fr, r.got, r.n_got, frame_to_msg_cb, x, &e) == 0);
	frame_reader_fini(&fr);
	conn_listener_close(x->l);
	for (int i = 0; i < 10; i++)
		uv_run(loop, UV_RUN_NOWAIT);
}

static void test_garbage_peer(uv_loop_t *loop)
{
	struct ctx x = {.loop = loop, .next_rid = 1};
	const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
	run_raw_peer(loop, get, strlen(get), 5000, &x);
	CHECK(x.server_closed == 1);
	CHECK(x.got_error_code == MSG_ERR_PROTOCOL);
	CHECK(strstr(x.got_error_msg, "bad magic") != NULL);
	printf("garbage peer: got Error(%s) '%s'\n", msg_error_name(x.got_error_code), x.got_error_msg);

	/* a valid header announcing 100 MiB: refused from the header, before any allocation */
	struct ctx y = {.loop = loop, .next_rid = 1};
	static uint8_t big[8];
	frame_put_header(big, MSG_TOKENS, 100u << 20);
	run_raw_peer(loop, (const char *)big, sizeof(big), 5000, &y);
	CHECK(y.got_error_code == MSG_ERR_PROTOCOL && strstr(y.got_error_msg, "exceeds the maximum"));

	/* a valid frame of type 200 (unknown) */
	struct ctx z = {.loop = loop, .next_rid = 1};
	static uint8_t unk[10];
	frame_put_header(unk, 200, 2);
	run_raw_peer(loop, (const char *)unk, sizeof(unk), 5000, &z);
	CHECK(z.got_error_code == MSG_ERR_PROTOCOL && strstr(z.got_error_msg, "unknown message type 200"));
	printf("unknown type: got '%s'\n", z.got_error_msg);
	printf("oversize frame: got '%s'\n", y.got_error_msg);
}

static void test_idle_peer(uv_loop_t *loop)
{
	struct ctx x = {.loop = loop, .next_rid = 1};
	uint64_t t0 = uv_now(loop);
	run_raw_peer(loop, NULL, 0, 150, &x);
	uint64_t dt = uv_now(loop) - t0;
	CHECK(x.server_closed == 1);
	CHECK(x.server_close_err == ERR_TIMEOUT);
	CHECK(strstr(x.server_close_why, "idle timeout") != NULL);
	CHECK(dt >= 140 && dt < 5000);
	printf("idle peer closed after %llu ms: %s\n", (unsigned long long)dt, x.server_close_why);
}

/* ---- a peer that accepts but never reads ---- */

static uv_tcp_t sink_server, sink_conn;
static void sink_connection_cb(uv_stream_t *s, int status)
{
	uv_tcp_init(s->loop, &sink_conn);
	CHECK(uv_accept(s, (uv_stream_t *)&sink_conn) == 0);
	/* never uv_read_start: the kernel buffers fill, then our write queue */
}

static int slow_result;
static void slow_connect_cb(struct conn *c, int status, void *ud)
{
	struct ctx *x = ud;
	CHECK(status == 0);
	static struct msg_token toks[4096];
	struct msg m;
	msg_init(&m, MSG_TOKENS);
	m.u.tokens.rid = 1;
	m.u.tokens.n_tokens = 4096;
	m.u.tokens.tokens = toks;
	struct errbuf e = {0};
	int rc = 0, i;
	for (i = 0; i < 100000 && rc == 0; i++)
		rc = conn_send(c, &m, &e);
	slow_result = rc;
	CHECK(rc == ERR_LIMIT);
	CHECK(conn_queued_bytes(c) <= (4u << 20));
	printf("slow peer: send %d refused (%s)\n", i, e.msg);
	conn_close(c, "done");
	(void)x;
}

static void slow_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	stop_loop(ud);
}

static void test_slow_peer(uv_loop_t *loop)
{
	struct ctx x = {.loop = loop};
	struct sockaddr_in sa;
	uv_ip4_addr("127.0.0.1", 0, &sa);
	uv_tcp_init(loop, &sink_server);
	CHECK(uv_tcp_bind(&sink_server, (struct sockaddr *)&sa, 0) == 0);
	CHECK(uv_listen((uv_stream_t *)&sink_server, 4, sink_connection_cb) == 0);
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	uv_tcp_getsockname(&sink_server, (struct sockaddr *)&ss, &len);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(((struct sockaddr_in *)&ss)->sin_port));
	struct conn_opts co = {.on_close_cb = slow_close_cb,
	                       .on_connect_cb = slow_connect_cb,
	                       .ud = &x,
	                       .max_queued_bytes = 4u << 20,
	                       .flush_timeout_ms = 100};
	struct errbuf e;
	struct conn *c;
	CHECK(conn_connect(loop, addr, &co, &c, &e) == 0);
	run_until(loop, 20000);
	CHECK(slow_result == ERR_LIMIT);
	uv_close((uv_handle_t *)&sink_conn, NULL);
	uv_close((uv_handle_t *)&sink_server, NULL);
	uv_run(loop, UV_RUN_NOWAIT);
}

static int refused_status = 1;
static void refused_connect_cb(struct conn *c, int status, void *ud)
{
	refused_status = status;
}

static void test_refused(uv_loop_t *loop)
{
	struct ctx x = {.loop = loop};
	/* find a free port, then close it */
	struct conn_opts so = {0};
	struct conn_listener *l;
	struct errbuf e;
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, NULL, NULL, &l, &e) == 0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", conn_listener_port(l));
	conn_listener_close(l);
	uv_run(loop, UV_RUN_NOWAIT);
	struct conn_opts co = {.on_close_cb = slow_close_cb, .on_connect_cb = refused_connect_cb, .ud = &x};
	struct conn *c;
	CHECK(conn_connect(loop, addr, &co, &c, &e) == 0);
	run_until(loop, 10000);
	CHECK(refused_status == -ECONNREFUSED);
	/* bad addresses are refused with a message */
	CHECK(conn_connect(loop, "nohostport", &co, &c, &e) == -EINVAL && strstr(e.msg, "host:port"));
	CHECK(conn_connect(loop, "127.0.0.1:99999", &co, &c, &e) == -EINVAL);
}

int main(void)
{
	log_init("test", -1);
	uv_loop_t *loop = uv_default_loop();
	test_many_frames(loop, "127.0.0.1:0");
	char path[128];
	snprintf(path, sizeof(path), "unix:/tmp/tandem-test-conn-%d.sock", (int)getpid());
	test_many_frames(loop, path);
	test_garbage_peer(loop);
	test_idle_peer(loop);
	test_slow_peer(loop);
	test_refused(loop);
	if (n_fail) {
		fprintf(stderr, "test_net_conn: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_conn: all checks passed\n");
	return 0;
}
