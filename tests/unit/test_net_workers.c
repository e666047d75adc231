/* The prefill and decode workers as real processes (build/tandem-prefill, build/tandem-decode,
 * trivial engine, UCX over tcp on lo and over shared memory), driven by this test acting as the
 * router on a loopback port, message by message:
 *  - registration: both Hellos carry the same KV layout; decode publishes address + region;
 *  - a request end to end: KvReserve -> KvReserved -> PrefillRequest (checksums on) ->
 *    PrefillDone (first token, one CRC per block) -> KvReady -> Tokens... -> Finish(LENGTH); the
 *    tokens are exactly the trivial engine's chain and decode verified every prompt KV slot;
 *  - stop token id; cancel mid-decode (blocks back to 0 in heartbeats and on /metrics); pool full
 *    (NO_CAPACITY) and release; reservation deadline (TIMEOUT, blocks freed); a corrupted checksum
 *    (Finish ERROR CHECKSUM); invalid prompt tokens (INVALID_REQUEST);
 *  - router connection lost mid-request: decode frees the blocks and registers again;
 *  - SIGTERM: both drain and exit 0; a request still decoding at the drain deadline comes back as
 *    Finish(ERROR, DRAINING); no ERROR line in their logs;
 *  - the real model (glm-dsa-tiny Q8_0): six prompts of 1..150 tokens prefilled together in
 *    64-token chunks, pushed over UCX, decoded in one continuous batch: every greedy continuation
 *    equals `tandem generate` of the same prompt in one process.
 * Every wait has a deadline. */
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/gguf/gguf.h"
#include "common/net/conn.h"
#include "common/tok/tok.h"
#include "common/net/trivial.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

#define QMAX 4096

struct peer {
	struct conn *c;
	int role;
	int closed;
	struct msg hello; /* kept (owns its buffers) */
	int have_hello;
	struct msg q[QMAX];
	int n_q;
	struct msg_heartbeat last_hb;
	int n_hb;
};

static uv_loop_t *loop;
static struct peer peers[8];
static int n_peers;
static const char *build_dir = "build";
static char tmpdir[256];

static int on_msg_cb(struct conn *c, struct msg *m, void *ud)
{
	struct peer *p = ud;
	if (m->type == MSG_HELLO) {
		p->hello = *m;
		m->owned_pb = NULL; /* keep the buffers */
		p->have_hello = 1;
		p->role = m->u.hello.role;
		struct msg a;
		msg_init(&a, MSG_HELLO_ACK);
		a.u.hello_ack.protocol_version = PROTOCOL_VERSION;
		a.u.hello_ack.worker_id = (uint32_t)(p - peers) + 1;
		a.u.hello_ack.heartbeat_ms = 100;
		struct errbuf e;
		CHECK(conn_send(c, &a, &e) == 0);
		return 0;
	}
	if (m->type == MSG_HEARTBEAT) {
		p->last_hb = m->u.heartbeat;
		p->n_hb++;
		return 0;
	}
	if (p->n_q < QMAX) {
		p->q[p->n_q++] = *m;
		m->owned_pb = NULL;
		m->owned_extra = NULL;
	}
	return 0;
}

static void on_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	struct peer *p = ud;
	p->closed = 1;
	p->c = NULL;
}

static int accept_cb(struct conn_listener *l, struct conn *c, void *ud)
{
	struct peer *p = &peers[n_peers++];
	memset(p, 0, sizeof(*p));
	p->c = c;
	conn_set_ud(c, p);
	return 0;
}

static void timeout_cb(uv_timer_t *t)
{
	*(int *)t->data = 1;
}

/* the router's side of liveness: a heartbeat to every worker every 100 ms */
static void heartbeat_cb(uv_timer_t *t)
{
	for (int i = 0; i < n_peers; i++)
		if (peers[i].c && peers[i].have_hello) {
			struct msg m;
			msg_init(&m, MSG_HEARTBEAT);
			struct errbuf e;
			if (!conn_is_closing(peers[i].c) && conn_send(peers[i].c, &m, &e))
				fprintf(stderr, "heartbeat not sent: %s\n", e.msg);
		}
}

/* runs the loop until pred() or ms pass */
static int run_until(int (*pred)(void *), void *arg, unsigned ms)
{
	int expired = 0;
	uv_timer_t t;
	uv_timer_init(loop, &t);
	t.data = &expired;
	uv_timer_start(&t, timeout_cb, ms, 0);
	int ok;
	/* pred may consume what it finds (find_msg): call it exactly once per round, keep its answer */
	while (!(ok = pred(arg)) && !expired)
		uv_run(loop, UV_RUN_ONCE);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(loop, UV_RUN_NOWAIT);
	return ok;
}

struct want {
	struct peer *p;
	int type;
	uint64_t rid;
	struct msg got;
	int found;
};

static int find_msg(void *arg)
{
	struct want *w = arg;
	for (int i = 0; i < w->p->n_q; i++) {
		struct msg *m = &w->p->q[i];
		uint64_t rid = 0;
		switch (m->type) {
		case MSG_KV_RESERVED: rid = m->u.kv_reserved.rid; break;
		case MSG_PREFILL_DONE: rid = m->u.prefill_done.rid; break;
		case MSG_TOKENS: rid = m->u.tokens.rid; break;
		case MSG_FINISH: rid = m->u.finish.rid; break;
		case MSG_ERROR: rid = m->u.error.rid; break;
		default: break;
		}
		if ((w->type == 0 || m->type == w->type) && (w->rid == 0 || rid == w->rid)) {
			w->got = *m;
			memmove(&w->p->q[i], &w->p->q[i + 1],
			        (size_t)(w->p->n_q - i - 1) * sizeof(struct msg));
			w->p->n_q--;
			w->found = 1;
			return 1;
		}
	}
	return 0;
}

/* next message from p for rid (any type if type 0); the caller msg_clear()s it */
static int wait_msg(struct peer *p, int type, uint64_t rid, struct msg *out, unsigned ms)
{
	struct want w = {.p = p, .type = type, .rid = rid};
	run_until(find_msg, &w, ms);
	if (!w.found) {
		if (ms > 50)
			fprintf(stderr, "timed out waiting for %s rid=%llu from %s\n",
			        type ? msg_type_name(type) : "any message", (unsigned long long)rid,
			        msg_role_name(p->role));
		msg_init(out, MSG_ERROR);
		return -1;
	}
	*out = w.got;
	return 0;
}

static void send_to(struct peer *p, struct msg *m)
{
	struct errbuf e = {0};
	if (!p->c || conn_send(p->c, m, &e))
		fprintf(stderr, "send %s failed: %s\n", msg_type_name(m->type), e.msg);
}

static pid_t spawn(const char *bin, char *const argv[], const char *log)
{
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		FILE *f = freopen(log, "w", stderr);
		FILE *g = freopen("/dev/null", "w", stdout);
		(void)g;
		(void)f;
		setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

static int n_registered(void *arg)
{
	int want = *(int *)arg, n = 0;
	for (int i = 0; i < n_peers; i++)
		n += peers[i].have_hello && !peers[i].closed;
	return n >= want;
}

static struct peer *find_role(int role)
{
	struct peer *r = NULL;
	for (int i = 0; i < n_peers; i++)
		if (peers[i].have_hello && !peers[i].closed && peers[i].role == role)
			r = &peers[i];
	return r;
}

static int new_decode(void *old)
{
	struct peer *d = find_role(MSG_ROLE_DECODE);
	return d && d != old;
}

/* ---- one request through both workers ---- */

struct req_result {
	uint32_t tokens[2048];
	uint32_t n;
	struct msg finish;
	int ok;
};

static bool reserve_ignore_eos;
static uint32_t reserve_attempt; /* KvReserve.attempt (F: an announcement on a held rid) */
static uint32_t reserve_window_ms; /* KvReserve.prefill_window_ms (C: a long prompt's window) */
static int prefill_attempt = -1; /* >= 0: PrefillRequest.attempt (per-attempt fences) */

static void reserve(struct peer *d, uint64_t rid, const uint32_t *prompt, uint32_t n_prompt,
                    uint32_t max_tokens, const uint32_t *stop_ids, uint32_t n_stop_ids, uint32_t deadline_ms)
{
	struct msg m;
	msg_init(&m, MSG_KV_RESERVE);
	m.u.kv_reserve.ignore_eos = reserve_ignore_eos;
	m.u.kv_reserve.rid = rid;
	m.u.kv_reserve.n_prompt_tokens = n_prompt;
	m.u.kv_reserve.max_tokens = max_tokens;
	m.u.kv_reserve.n_prompt = n_prompt;
	m.u.kv_reserve.prompt = prompt;
	m.u.kv_reserve.n_stop_token_ids = n_stop_ids;
	m.u.kv_reserve.stop_token_ids = stop_ids;
	m.u.kv_reserve.deadline_ms = deadline_ms;
	m.u.kv_reserve.attempt = reserve_attempt;
	m.u.kv_reserve.prefill_window_ms = reserve_window_ms;
	send_to(d, &m);
}

static void prefill(struct peer *p, struct peer *d, uint64_t rid, const uint32_t *prompt, uint32_t n_prompt,
                    const struct msg_kv_reserved *kr)
{
	struct msg m;
	msg_init(&m, MSG_PREFILL_REQUEST);
	struct msg_prefill_request *r = &m.u.prefill_request;
	r->rid = rid;
	r->n_tokens = n_prompt;
	r->tokens = prompt;
	snprintf(r->target_name, sizeof(r->target_name), "%s", d->hello.u.hello.name);
	r->target_ucx_address = d->hello.u.hello.ucx_address;
	r->target_ucx_address_len = d->hello.u.hello.ucx_address_len;
	r->target_region = d->hello.u.hello.kv_region;
	r->n_block_ids = kr->n_block_ids;
	r->block_ids = kr->block_ids;
	r->checksums = true;
	r->deadline_ms = 10000;
	r->has_attempt = prefill_attempt >= 0;
	r->attempt = prefill_attempt >= 0 ? (uint32_t)prefill_attempt : 0;
	send_to(p, &m);
}

/* reserve + prefill + ready + collect the stream; returns the Finish in res */
static void run_request(struct peer *p, struct peer *d, uint64_t rid, const uint32_t *prompt,
                        uint32_t n_prompt, uint32_t max_tokens, const uint32_t *stop_ids, uint32_t n_stop_ids,
                        int corrupt, struct req_result *res)
{
	memset(res, 0, sizeof(*res));
	struct msg m, kr, pd;
	reserve(d, rid, prompt, n_prompt, max_tokens, stop_ids, n_stop_ids, 0);
	if (wait_msg(d, MSG_KV_RESERVED, rid, &kr, 5000))
		return;
	uint32_t need = (n_prompt + max_tokens + 63) / 64;
	CHECK(kr.u.kv_reserved.n_block_ids == need);
	prefill(p, d, rid, prompt, n_prompt, &kr.u.kv_reserved);
	if (wait_msg(p, 0, rid, &pd, 10000) || pd.type != MSG_PREFILL_DONE) {
		fprintf(stderr, "rid %llu: prefill answered %s: %s\n", (unsigned long long)rid,
		        msg_type_name(pd.type), pd.type == MSG_ERROR ? pd.u.error.message : "");
		CHECK(!"prefill failed");
		msg_clear(&pd);
		msg_clear(&kr);
		return;
	}
	uint32_t nb = (n_prompt + 63) / 64;
	CHECK(pd.u.prefill_done.first.id == trivial_first_token(prompt, n_prompt));
	CHECK(pd.u.prefill_done.n_checksums == nb);
	CHECK(pd.u.prefill_done.kv_bytes == (uint64_t)nb * TRIVIAL_BLOCK_BYTES);
	CHECK(pd.u.prefill_done.n_prompt_tokens == n_prompt);
	msg_init(&m, MSG_KV_READY);
	m.u.kv_ready.rid = rid;
	m.u.kv_ready.first = pd.u.prefill_done.first;
	m.u.kv_ready.n_prompt_tokens = n_prompt;
	uint32_t sums[4096];
	memcpy(sums, pd.u.prefill_done.checksums, nb * sizeof(uint32_t));
	if (corrupt)
		sums[nb - 1] ^= 1;
	m.u.kv_ready.n_checksums = nb;
	m.u.kv_ready.checksums = sums;
	send_to(d, &m);
	res->tokens[res->n++] = pd.u.prefill_done.first.id;
	msg_clear(&pd);
	msg_clear(&kr);
	for (;;) {
		struct msg t;
		if (wait_msg(d, 0, rid, &t, 20000))
			return;
		if (getenv("TW_DEBUG"))
			fprintf(stderr, "rid %llu: %s n=%zu\n", (unsigned long long)rid,
			        msg_type_name(t.type), t.type == MSG_TOKENS ? t.u.tokens.n_tokens : 0);
		if (t.type == MSG_TOKENS) {
			for (size_t i = 0; i < t.u.tokens.n_tokens && res->n < 2048; i++)
				res->tokens[res->n++] = t.u.tokens.tokens[i].id;
			msg_clear(&t);
			continue;
		}
		res->finish = t;
		res->ok = t.type == MSG_FINISH;
		return;
	}
}

static void check_chain(const struct req_result *r, uint32_t n_prompt)
{
	for (uint32_t k = 1; k < r->n; k++)
		if (r->tokens[k] != trivial_next_token(r->tokens[k - 1], n_prompt + k - 1)) {
			fprintf(stderr, "token %u is %u, expected %u\n", k, r->tokens[k],
			        trivial_next_token(r->tokens[k - 1], n_prompt + k - 1));
			CHECK(!"token chain differs");
			return;
		}
}

struct hb_want {
	struct peer *p;
	uint32_t used;
	int n_hb_after;
};

static int hb_used_is(void *arg)
{
	struct hb_want *w = arg;
	return w->p->n_hb > w->n_hb_after && w->p->last_hb.used_blocks == w->used;
}

static int wait_used_blocks(struct peer *d, uint32_t used, unsigned ms)
{
	struct hb_want w = {.p = d, .used = used, .n_hb_after = d->n_hb};
	return run_until(hb_used_is, &w, ms) ? 0 : -1;
}

/* GET /metrics from a worker (blocking; the worker serves it on its own loop) */
static int scrape(int port, char *buf, size_t cap)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "curl -s --max-time 5 http://127.0.0.1:%d/metrics", port);
	FILE *f = popen(cmd, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = 0;
	return pclose(f) == 0 && n > 0 ? 0 : -1;
}

static int metric_is(int port, const char *line);

static int run_suite(const char *tls, const char *dev, int full)
{
	int fails0 = n_fail;
	struct conn_opts so = {.on_msg_cb = on_msg_cb, .on_close_cb = on_close_cb, .idle_timeout_ms = 10000};
	struct conn_listener *l;
	struct errbuf e = {0};
	n_peers = 0;
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, accept_cb, NULL, &l, &e) == 0);
	char router[64], plog[300], dlog[300], bin_p[300], bin_d[300];
	snprintf(router, sizeof(router), "127.0.0.1:%d", conn_listener_port(l));
	snprintf(plog, sizeof(plog), "%s/prefill-%s.log", tmpdir, tls);
	snprintf(dlog, sizeof(dlog), "%s/decode-%s.log", tmpdir, tls);
	snprintf(bin_p, sizeof(bin_p), "%s/tandem-prefill", build_dir);
	snprintf(bin_d, sizeof(bin_d), "%s/tandem-decode", build_dir);
	char *pargv[] = {bin_p,       "--engine",
	                 "trivial",   "--router",
	                 router,      "--name",
	                 "p0",        "--ucx-tls",
	                 (char *)tls, "--ucx-net-devices",
	                 (char *)dev, "--heartbeat-ms",
	                 "100",       "--max-tokens-per-step",
	                 "100",       "--log-level",
	                 "debug",     "--auth-token",
	                 "s3cret",    NULL};
	char *dargv[] = {
	    bin_d, "--engine",           "trivial",   "--router",          router,      "--name",
	    "d0",  "--ucx-tls",          (char *)tls, "--ucx-net-devices", (char *)dev, "--heartbeat-ms",
	    "100", "--kv-blocks",        "40",        "--trivial-step-us", "2000",      "--drain-timeout-ms",
	    "300", "--kv-quarantine-ms", "1000",      "--log-level",       "debug",     NULL};
	pid_t pp = spawn(bin_p, pargv, plog);
	pid_t dp = spawn(bin_d, dargv, dlog);
	int two = 2;
	CHECK(run_until(n_registered, &two, 15000));
	struct peer *p = find_role(MSG_ROLE_PREFILL), *d = find_role(MSG_ROLE_DECODE);
	if (!p || !d) {
		fprintf(stderr, "workers did not register (logs: %s %s)\n", plog, dlog);
		kill(pp, SIGKILL);
		kill(dp, SIGKILL);
		return 1;
	}
	CHECK(msg_kv_layout_compare(&p->hello.u.hello.kv_layout, "prefill", &d->hello.u.hello.kv_layout,
	                            "decode", &e) == 0);
	CHECK(d->hello.u.hello.has_kv_region && d->hello.u.hello.kv_region.n_blocks == 40);
	CHECK(d->hello.u.hello.n_blocks_total == 40 && d->hello.u.hello.metrics_port > 0);
	CHECK(strcmp(p->hello.u.hello.auth_token, "s3cret") == 0 && d->hello.u.hello.auth_token[0] == 0);
	CHECK(p->hello.u.hello.protocol_version == PROTOCOL_VERSION && p->hello.u.hello.pid == (uint32_t)pp);
	printf("[%s] registered: prefill %s, decode %s (UCX: %s)\n", tls, p->hello.u.hello.name,
	       d->hello.u.hello.name, d->hello.u.hello.ucx_transports);

	/* 1. end to end, 150-token prompt spanning 3 blocks, 20 tokens */
	uint32_t prompt[1000];
	for (int i = 0; i < 1000; i++)
		prompt[i] = (uint32_t)(i * 7919 % TRIVIAL_VOCAB);
	static struct req_result r;
	run_request(p, d, 1, prompt, 150, 20, NULL, 0, 0, &r);
	CHECK(r.ok && r.finish.u.finish.reason == MSG_FINISH_LENGTH);
	CHECK(r.n == 20 && r.finish.u.finish.completion_tokens == 20 &&
	      r.finish.u.finish.prompt_tokens == 150);
	if (r.n != 20)
		for (uint32_t k = 0; k < r.n; k++)
			fprintf(stderr, "token %u: %u (chain: %u)\n", k, r.tokens[k],
			        k ? trivial_next_token(r.tokens[k - 1], 150 + k - 1) : 0);
	check_chain(&r, 150);
	msg_clear(&r.finish);
	printf("[%s] request 1: %u tokens, finish %s\n", tls, r.n, msg_finish_name(MSG_FINISH_LENGTH));

	/* a batch of requests at once (continuous batching, many sequences in one step) */
	for (uint64_t rid = 100; rid < 104; rid++)
		reserve(d, rid, prompt + rid, 70, 10, NULL, 0, 0);
	int n_ok = 0;
	for (uint64_t rid = 100; rid < 104; rid++) {
		struct msg kr;
		if (wait_msg(d, MSG_KV_RESERVED, rid, &kr, 5000) == 0) {
			prefill(p, d, rid, prompt + rid, 70, &kr.u.kv_reserved);
			msg_clear(&kr);
		}
	}
	for (uint64_t rid = 100; rid < 104; rid++) {
		struct msg pd, m;
		if (wait_msg(p, MSG_PREFILL_DONE, rid, &pd, 10000))
			continue;
		msg_init(&m, MSG_KV_READY);
		m.u.kv_ready.rid = rid;
		m.u.kv_ready.first = pd.u.prefill_done.first;
		m.u.kv_ready.n_prompt_tokens = 70;
		send_to(d, &m);
		msg_clear(&pd);
	}
	for (uint64_t rid = 100; rid < 104; rid++) {
		struct msg f;
		if (wait_msg(d, MSG_FINISH, rid, &f, 10000) == 0) {
			n_ok += f.u.finish.reason == MSG_FINISH_LENGTH && f.u.finish.completion_tokens == 10;
			msg_clear(&f);
		}
		for (struct msg t; wait_msg(d, MSG_TOKENS, rid, &t, 1) == 0;)
			msg_clear(&t);
	}
	CHECK(n_ok == 4);
	CHECK(wait_used_blocks(d, 0, 3000) == 0);

	if (full) {
		/* 2. stop token id: stop at the 5th token */
		uint32_t t = trivial_first_token(prompt, 80);
		for (uint32_t k = 1; k < 5; k++)
			t = trivial_next_token(t, 80 + k - 1);
		run_request(p, d, 2, prompt, 80, 50, &t, 1, 0, &r);
		CHECK(r.ok && r.finish.u.finish.reason == MSG_FINISH_STOP && r.n == 5 && r.tokens[4] == t);
		msg_clear(&r.finish);

		/* 3. corrupted checksum: decode refuses the KV */
		run_request(p, d, 3, prompt, 100, 10, NULL, 0, 1, &r);
		CHECK(r.ok && r.finish.u.finish.reason == MSG_FINISH_ERROR &&
		      r.finish.u.finish.error_code == MSG_ERR_CHECKSUM);
		printf("[%s] corrupted KV: %s\n", tls, r.finish.u.finish.error_message);
		msg_clear(&r.finish);
		CHECK(wait_used_blocks(d, 0, 3000) == 0);

		/* 4. cancel mid-decode: 1000 tokens at 2 ms/step would take 2 s */
		struct msg kr, pd, m, f;
		reserve(d, 4, prompt, 64, 1000, NULL, 0, 0);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 4, &kr, 5000) == 0);
		prefill(p, d, 4, prompt, 64, &kr.u.kv_reserved);
		msg_clear(&kr);
		CHECK(wait_msg(p, MSG_PREFILL_DONE, 4, &pd, 5000) == 0);
		msg_init(&m, MSG_KV_READY);
		m.u.kv_ready.rid = 4;
		m.u.kv_ready.first = pd.u.prefill_done.first;
		m.u.kv_ready.n_prompt_tokens = 64;
		send_to(d, &m);
		msg_clear(&pd);
		struct msg tk;
		CHECK(wait_msg(d, MSG_TOKENS, 4, &tk, 5000) == 0);
		msg_clear(&tk);
		CHECK(wait_used_blocks(d, 17, 3000) == 0); /* (64 + 1000) / 64 rounded up */
		msg_init(&m, MSG_CANCEL);
		m.u.cancel.rid = 4;
		m.u.cancel.reason = MSG_ERR_CANCELLED;
		send_to(d, &m);
		CHECK(wait_msg(d, MSG_FINISH, 4, &f, 5000) == 0 && f.u.finish.reason == MSG_FINISH_CANCELLED);
		CHECK(f.u.finish.completion_tokens < 1000);
		msg_clear(&f);
		CHECK(wait_used_blocks(d, 0, 3000) == 0);
		char text[65536];
		CHECK(scrape((int)d->hello.u.hello.metrics_port, text, sizeof(text)) == 0);
		CHECK(strstr(text, "tandem_kv_blocks_used{role=\"decode\",worker=\"d0\"} 0\n") != NULL);
		CHECK(strstr(text, "tandem_decode_requests_total{role=\"decode\",worker=\"d0\",outcome="
		                   "\"cancelled\"} 1\n") != NULL);
		CHECK(strstr(text, "tandem_kv_check_failures_total{role=\"decode\",worker=\"d0\"} 1\n") !=
		      NULL);
		while (wait_msg(d, MSG_TOKENS, 4, &tk, 1) == 0)
			msg_clear(&tk);

		/* 5. pool full: 40 blocks; a request for 41 is invalid, 2 x 20 fit, the next is NO_CAPACITY
		 */
		reserve(d, 5, prompt, 64, 64 * 40, NULL, 0, 0);
		CHECK(wait_msg(d, MSG_ERROR, 5, &f, 5000) == 0 && f.u.error.code == MSG_ERR_INVALID_REQUEST);
		msg_clear(&f);
		reserve(d, 6, prompt, 64, 64 * 19, NULL, 0, 0);
		reserve(d, 7, prompt, 64, 64 * 19, NULL, 0, 0);
		reserve(d, 8, prompt, 10, 10, NULL, 0, 0);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 6, &f, 5000) == 0);
		msg_clear(&f);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 7, &f, 5000) == 0);
		msg_clear(&f);
		CHECK(wait_msg(d, MSG_ERROR, 8, &f, 5000) == 0 && f.u.error.code == MSG_ERR_NO_CAPACITY);
		printf("[%s] pool full: %s\n", tls, f.u.error.message);
		msg_clear(&f);
		CHECK(wait_used_blocks(d, 40, 3000) == 0);
		msg_init(&m, MSG_KV_RELEASE);
		m.u.kv_release.rid = 6;
		m.u.kv_release.no_writer = true; /* no PrefillRequest was sent: freed at once */
		send_to(d, &m);
		send_to(d, &m); /* twice: idempotent */
		m.u.kv_release.rid = 7;
		send_to(d, &m);
		CHECK(wait_used_blocks(d, 0, 3000) == 0);

		/* 6. reservation deadline */
		reserve(d, 9, prompt, 10, 10, NULL, 0, 300);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 9, &f, 5000) == 0);
		msg_clear(&f);
		CHECK(wait_msg(d, MSG_ERROR, 9, &f, 5000) == 0 && f.u.error.code == MSG_ERR_TIMEOUT);
		msg_clear(&f);
		/* a prefill might still write the expired reservation: quarantined (1 s in this suite) */
		CHECK(wait_used_blocks(d, 1, 500) == 0);
		CHECK(wait_used_blocks(d, 0, 3000) == 0);

		/* 7. invalid prompt token for prefill */
		uint32_t bad[3] = {1, 2, 5000};
		reserve(d, 10, prompt, 3, 5, NULL, 0, 0);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 10, &kr, 5000) == 0);
		prefill(p, d, 10, bad, 3, &kr.u.kv_reserved);
		msg_clear(&kr);
		CHECK(wait_msg(p, MSG_ERROR, 10, &f, 5000) == 0 && f.u.error.code == MSG_ERR_INVALID_REQUEST);
		printf("[%s] bad prompt: %s\n", tls, f.u.error.message);
		msg_clear(&f);
		msg_init(&m, MSG_KV_RELEASE);
		m.u.kv_release.rid = 10;
		m.u.kv_release.no_writer = false; /* as the router sends it: the prefill may be writing */
		send_to(d, &m);
		/* the refusing prefill fenced the reservation before its Error: freed at once, not after
		 * the quarantine deadline */
		CHECK(wait_used_blocks(d, 0, 3000) == 0);
		CHECK(metric_is((int)d->hello.u.hello.metrics_port,
		                "tandem_kv_quarantine_fenced_total{role=\"decode\",worker=\"d0\"} 1\n"));
		CHECK(metric_is((int)d->hello.u.hello.metrics_port,
		                "tandem_kv_quarantine_expired_total{role=\"decode\",worker=\"d0\"} 1\n"));

		/* 8. router connection lost mid-request: decode frees and registers again */
		reserve(d, 11, prompt, 64, 1000, NULL, 0, 0);
		CHECK(wait_msg(d, MSG_KV_RESERVED, 11, &kr, 5000) == 0);
		msg_clear(&kr);
		struct peer *old = d;
		conn_close(d->c, "test: router drops decode");
		CHECK(run_until(new_decode, old, 10000));
		d = find_role(MSG_ROLE_DECODE);
		CHECK(d != NULL && d != old && d->c != NULL);
		if (d)
			CHECK(wait_used_blocks(d, 0, 3000) == 0);
	}

	/* SIGTERM with a request still decoding (2 s of work, drain deadline 300 ms): decode announces
	 * the drain, hands the request back as Finish(ERROR, DRAINING) when the deadline passes, exits 0 */
	struct peer *dd = find_role(MSG_ROLE_DECODE);
	int drained_req = 0;
	if (full && dd) {
		struct msg kr, pd, m, f;
		reserve(dd, 12, prompt, 64, 1000, NULL, 0, 0);
		if (wait_msg(dd, MSG_KV_RESERVED, 12, &kr, 5000) == 0) {
			prefill(p, dd, 12, prompt, 64, &kr.u.kv_reserved);
			msg_clear(&kr);
			if (wait_msg(p, MSG_PREFILL_DONE, 12, &pd, 5000) == 0) {
				msg_init(&m, MSG_KV_READY);
				m.u.kv_ready.rid = 12;
				m.u.kv_ready.first = pd.u.prefill_done.first;
				m.u.kv_ready.n_prompt_tokens = 64;
				send_to(dd, &m);
				msg_clear(&pd);
				CHECK(wait_msg(dd, MSG_TOKENS, 12, &f, 5000) == 0);
				msg_clear(&f);
				kill(dp, SIGTERM);
				CHECK(wait_msg(dd, MSG_DRAIN, 0, &f, 3000) == 0);
				msg_clear(&f);
				CHECK(wait_msg(dd, MSG_FINISH, 12, &f, 5000) == 0 &&
				      f.u.finish.reason == MSG_FINISH_ERROR &&
				      f.u.finish.error_code == MSG_ERR_DRAINING);
				drained_req = f.type == MSG_FINISH;
				msg_clear(&f);
			}
		}
		CHECK(drained_req);
	}

	/* SIGTERM: drain, Drain messages, exit 0 (decode got its signal above in the full suite: a second
	 * one would mean "exit now") */
	kill(pp, SIGTERM);
	if (!drained_req)
		kill(dp, SIGTERM);
	int sp = -1, sd = -1;
	for (int i = 0; i < 100 && (sp == -1 || sd == -1); i++) {
		int st;
		if (sp == -1 && waitpid(pp, &st, WNOHANG) == pp)
			sp = st;
		if (sd == -1 && waitpid(dp, &st, WNOHANG) == dp)
			sd = st;
		uv_run(loop, UV_RUN_NOWAIT);
		usleep(50000);
	}
	CHECK(sp == 0 && sd == 0);
	if (sp == -1)
		kill(pp, SIGKILL), waitpid(pp, NULL, 0);
	if (sd == -1)
		kill(dp, SIGKILL), waitpid(dp, NULL, 0);
	/* both drained (not killed): they say so in their logs */
	char cmd[700];
	snprintf(cmd, sizeof(cmd),
	         "grep -q 'drained' %s && grep -q -e 'drained' -e 'drain deadline passed' %s", plog, dlog);
	CHECK(system(cmd) == 0);
	snprintf(cmd, sizeof(cmd), "grep -h ' ERROR ' %s %s", plog, dlog);
	int has_error = system(cmd) == 0;
	CHECK(!has_error);
	for (int i = 0; i < n_peers; i++) {
		if (peers[i].c)
			conn_close(peers[i].c, "done");
		if (peers[i].have_hello)
			msg_clear(&peers[i].hello);
		for (int k = 0; k < peers[i].n_q; k++)
			msg_clear(&peers[i].q[k]);
	}
	conn_listener_close(l);
	for (int i = 0; i < 20; i++)
		uv_run(loop, UV_RUN_NOWAIT);
	printf("[%s] %s\n", tls, n_fail == fails0 ? "ok" : "FAILED");
	return n_fail != fails0;
}

/* ---- late writes: a prefill still writing blocks that decode has released ---- */

static void kv_release(struct peer *d, uint64_t rid, bool no_writer)
{
	struct msg m;
	msg_init(&m, MSG_KV_RELEASE);
	m.u.kv_release.rid = rid;
	m.u.kv_release.no_writer = no_writer;
	send_to(d, &m);
}

static void sleep_loop(unsigned ms)
{
	struct want w = {.p = &peers[0], .type = -1}; /* matches nothing */
	run_until(find_msg, &w, ms);
}

/* reserves rid until decode says yes (NO_CAPACITY: retry every 50 ms) or ms pass; returns the
 * number of NO_CAPACITY refusals, or -1 on timeout / another refusal */
static int reserve_retry(struct peer *d, uint64_t rid, const uint32_t *prompt, uint32_t n_prompt,
                         uint32_t max_tokens, struct msg *kr, unsigned ms)
{
	int refusals = 0;
	for (unsigned t = 0; t < ms; t += 50) {
		reserve(d, rid, prompt, n_prompt, max_tokens, NULL, 0, 0);
		if (wait_msg(d, 0, rid, kr, 5000))
			return -1;
		if (kr->type == MSG_KV_RESERVED)
			return refusals;
		int code = kr->type == MSG_ERROR ? kr->u.error.code : -1;
		msg_clear(kr);
		if (code != MSG_ERR_NO_CAPACITY)
			return -1;
		refusals++;
		sleep_loop(50);
	}
	return -1;
}

/* KvReady for rid with the PrefillDone's checksums; collects the stream; 1 when it finished with
 * LENGTH after n_gen tokens that follow the trivial chain (decode checked every prompt KV slot) */
static int ready_and_decode(struct peer *d, uint64_t rid, const struct msg *pd, uint32_t n_prompt,
                            uint32_t n_gen)
{
	struct msg m;
	msg_init(&m, MSG_KV_READY);
	m.u.kv_ready.rid = rid;
	m.u.kv_ready.first = pd->u.prefill_done.first;
	m.u.kv_ready.n_prompt_tokens = n_prompt;
	m.u.kv_ready.n_checksums = pd->u.prefill_done.n_checksums;
	m.u.kv_ready.checksums = pd->u.prefill_done.checksums;
	send_to(d, &m);
	static struct req_result r;
	memset(&r, 0, sizeof(r));
	r.tokens[r.n++] = pd->u.prefill_done.first.id;
	for (;;) {
		struct msg t;
		if (wait_msg(d, 0, rid, &t, 20000))
			return 0;
		if (t.type == MSG_TOKENS) {
			for (size_t i = 0; i < t.u.tokens.n_tokens && r.n < 2048; i++)
				r.tokens[r.n++] = t.u.tokens.tokens[i].id;
			msg_clear(&t);
			continue;
		}
		int ok = t.type == MSG_FINISH && t.u.finish.reason == MSG_FINISH_LENGTH && r.n == n_gen;
		if (!ok)
			fprintf(stderr, "rid %llu: %s %s %s after %u tokens\n", (unsigned long long)rid,
			        msg_type_name(t.type),
			        t.type == MSG_FINISH ? msg_finish_name(t.u.finish.reason) : "",
			        t.type == MSG_FINISH ? t.u.finish.error_message : t.u.error.message, r.n);
		msg_clear(&t);
		int fails0 = n_fail;
		check_chain(&r, n_prompt);
		return ok && n_fail == fails0;
	}
}

static int metric_is(int port, const char *line)
{
	static char text[262144];
	int rc = scrape(port, text, sizeof(text));
	if (rc == 0 && strstr(text, line))
		return 1;
	fprintf(stderr, "metric line %s not found (scrape rc %d, %zu bytes):\n%s\n", line, rc, strlen(text),
	        rc ? "" : text);
	return 0;
}

/* Two prefill workers (p0 slowed to 200 ms per KV block for prompts of >= 600 tokens, p1 at full
 * speed) and a decode worker whose whole pool (30 blocks) one request fills:
 *  A. decode releases a reservation while p0 is still writing it (its Cancel has not reached p0);
 *     a new request asks for the blocks at once: it must get NO_CAPACITY until p0's fence, and
 *     once it runs, its KV (written by p1, checked by decode after p0 has finished) and tokens
 *     must be exact. Without the quarantine it got the same blocks and p0 overwrote its prompt KV.
 *  B. cancel in the middle of a slow transfer (Cancel to p0, KvRelease to decode): p0 stops at the
 *     next block and fences; the blocks come back long before the transfer would have ended.
 *  F. stale fence: attempt 0 of a request (p1) finishes and fences; the router "loses" p1 and
 *     re-prefills the same reservation on p0 (attempt 1, announced to decode first), then
 *     releases it while p0 still writes. p1's fence names only attempt 0: decode must ignore it
 *     (counted) and keep the blocks until p0's fence, so a new request gets NO_CAPACITY meanwhile
 *     and, once it runs, its KV is exact. With a fence that only named the rid, decode freed the
 *     blocks at once and p0's late puts overwrote the new request's prompt KV.
 *  C. p0 killed mid-transfer: no fence ever comes; the blocks come back at the quarantine
 *     deadline (counted), and a new request on them is exact. The reservation announced a
 *     prefill window of 122 s (a long prompt), 2 s over the 120 s the quarantine (4 s here) is
 *     sized for: the blocks stay quarantined for 6 s, not 4.
 *  D. a slow KV verification (test knob: 1 s) of one request does not stop another request's
 *     tokens from streaming: the check runs off decode's loop.
 *  E. decode killed while a slow prefill writes into it: the prefill answers within its flush
 *     deadline (no hang) and still drains and exits 0. */
static int run_late_write_suite(const char *tls, const char *dev)
{
	int fails0 = n_fail;
	struct conn_opts so = {.on_msg_cb = on_msg_cb, .on_close_cb = on_close_cb, .idle_timeout_ms = 10000};
	struct conn_listener *l;
	struct errbuf e = {0};
	n_peers = 0;
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, accept_cb, NULL, &l, &e) == 0);
	char router[64], plog[300], plog1[300], dlog[300], bin_p[300], bin_d[300];
	snprintf(router, sizeof(router), "127.0.0.1:%d", conn_listener_port(l));
	snprintf(plog, sizeof(plog), "%s/late-prefill0-%s.log", tmpdir, tls);
	snprintf(plog1, sizeof(plog1), "%s/late-prefill1-%s.log", tmpdir, tls);
	snprintf(dlog, sizeof(dlog), "%s/late-decode-%s.log", tmpdir, tls);
	snprintf(bin_p, sizeof(bin_p), "%s/tandem-prefill", build_dir);
	snprintf(bin_d, sizeof(bin_d), "%s/tandem-decode", build_dir);
	char *p0argv[] = {bin_p,       "--engine",
	                  "trivial",   "--router",
	                  router,      "--name",
	                  "slow",      "--ucx-tls",
	                  (char *)tls, "--ucx-net-devices",
	                  (char *)dev, "--heartbeat-ms",
	                  "100",       "--max-tokens-per-step",
	                  "640",       "--log-level",
	                  "debug",     NULL};
	char *p1argv[] = {bin_p,       "--engine",
	                  "trivial",   "--router",
	                  router,      "--name",
	                  "fast",      "--ucx-tls",
	                  (char *)tls, "--ucx-net-devices",
	                  (char *)dev, "--heartbeat-ms",
	                  "100",       "--max-tokens-per-step",
	                  "640",       "--log-level",
	                  "debug",     NULL};
	char *dargv[] = {bin_d,       "--engine",
	                 "trivial",   "--router",
	                 router,      "--name",
	                 "dq",        "--ucx-tls",
	                 (char *)tls, "--ucx-net-devices",
	                 (char *)dev, "--heartbeat-ms",
	                 "100",       "--kv-blocks",
	                 "30",        "--kv-quarantine-ms",
	                 "4000",      "--trivial-step-us",
	                 "1000",      "--log-level",
	                 "debug",     NULL};
	setenv("TANDEM_TEST_PUSH_DELAY", "200000:600", 1);
	pid_t pp0 = spawn(bin_p, p0argv, plog);
	unsetenv("TANDEM_TEST_PUSH_DELAY");
	int three = 1;
	CHECK(run_until(n_registered, &three, 15000)); /* p0 first */
	pid_t pp1 = spawn(bin_p, p1argv, plog1);
	setenv("TANDEM_TEST_VERIFY_DELAY", "1000000:700", 1);
	pid_t dp = spawn(bin_d, dargv, dlog);
	unsetenv("TANDEM_TEST_VERIFY_DELAY");
	three = 3;
	CHECK(run_until(n_registered, &three, 15000));
	struct peer *slow = NULL, *fast = NULL, *d = find_role(MSG_ROLE_DECODE);
	for (int i = 0; i < n_peers; i++)
		if (peers[i].have_hello && peers[i].role == MSG_ROLE_PREFILL)
			*(strcmp(peers[i].hello.u.hello.name, "slow") == 0 ? &slow : &fast) = &peers[i];
	if (!slow || !fast || !d) {
		fprintf(stderr, "late-write workers did not register (logs: %s %s %s)\n", plog, plog1, dlog);
		kill(pp0, SIGKILL), kill(pp1, SIGKILL), kill(dp, SIGKILL);
		waitpid(pp0, NULL, 0), waitpid(pp1, NULL, 0), waitpid(dp, NULL, 0);
		return 1;
	}
	CHECK(d->hello.u.hello.kv_region.fence_addr != 0);
	CHECK(d->hello.u.hello.fence_attempts);
	int mport = (int)d->hello.u.hello.metrics_port;
	static uint32_t pa[640], pb[640];
	for (int i = 0; i < 640; i++) {
		pa[i] = (uint32_t)(i * 7919 % TRIVIAL_VOCAB);
		pb[i] = (uint32_t)((i * 104729 + 17) % TRIVIAL_VOCAB);
	}
	struct msg kr, pd, pd2, f;
	/* A: 640 prompt tokens = 10 blocks; 640 + 1280 tokens = the whole pool of 30 */
	CHECK(reserve_retry(d, 20, pa, 640, 1280, &kr, 3000) == 0);
	prefill(slow, d, 20, pa, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	sleep_loop(500); /* p0 is at block 1 or 2 of 10 */
	kv_release(d, 20, false);
	int refused = reserve_retry(d, 21, pb, 640, 1280, &kr, 8000);
	printf("[late %s] A: new reservation refused %d times while the slow prefill wrote\n", tls, refused);
	CHECK(refused > 0);
	if (refused >= 0) {
		prefill(fast, d, 21, pb, 640, &kr.u.kv_reserved);
		msg_clear(&kr);
		CHECK(wait_msg(fast, MSG_PREFILL_DONE, 21, &pd, 10000) == 0);
		/* the slow prefill has finished (or it was fenced already): every late put it had is in */
		CHECK(wait_msg(slow, 0, 20, &pd2, 10000) == 0 && pd2.type == MSG_PREFILL_DONE);
		msg_clear(&pd2);
		CHECK(ready_and_decode(d, 21, &pd, 640, 1280));
		msg_clear(&pd);
	}
	CHECK(wait_used_blocks(d, 0, 3000) == 0);
	CHECK(metric_is(mport, "tandem_kv_quarantine_fenced_total{role=\"decode\",worker=\"dq\"} 1\n"));

	/* B: cancel mid-transfer (2 s of pushing): blocks back after the fence, well before 3 s */
	CHECK(reserve_retry(d, 22, pa, 640, 1280, &kr, 3000) == 0);
	prefill(slow, d, 22, pa, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	sleep_loop(500);
	struct msg m;
	msg_init(&m, MSG_CANCEL);
	m.u.cancel.rid = 22;
	m.u.cancel.reason = MSG_ERR_CANCELLED;
	send_to(slow, &m);
	kv_release(d, 22, false);
	uint64_t t0 = uv_hrtime();
	CHECK(wait_used_blocks(d, 0, 2000) == 0);
	double freed_s = (double)(uv_hrtime() - t0) / 1e9;
	printf("[late %s] B: cancelled mid-transfer, blocks free after %.2f s\n", tls, freed_s);
	CHECK(freed_s < 1.5);
	CHECK(metric_is(mport, "tandem_kv_quarantine_fenced_total{role=\"decode\",worker=\"dq\"} 2\n"));
	CHECK(reserve_retry(d, 23, pb, 640, 1280, &kr, 3000) == 0);
	prefill(fast, d, 23, pb, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	CHECK(wait_msg(fast, MSG_PREFILL_DONE, 23, &pd, 10000) == 0);
	CHECK(ready_and_decode(d, 23, &pd, 640, 1280));
	msg_clear(&pd);
	CHECK(wait_used_blocks(d, 0, 3000) == 0);

	/* F: a stale attempt's fence must not free blocks the current attempt still writes */
	prefill_attempt = 0;
	CHECK(reserve_retry(d, 26, pa, 640, 1280, &kr, 3000) == 0);
	struct msg kr26 = kr;
	prefill(fast, d, 26, pa, 640, &kr26.u.kv_reserved); /* attempt 0: done and fenced quickly */
	CHECK(wait_msg(fast, MSG_PREFILL_DONE, 26, &pd2, 10000) == 0);
	msg_clear(&pd2);
	sleep_loop(100); /* the fence lands (it follows the PrefillDone's flush) */
	/* the router lost p1 (as far as it knows) and re-prefills into the same blocks on p0 */
	reserve_attempt = 1;
	reserve(d, 26, pa, 640, 1280, NULL, 0, 0); /* announcement: not answered */
	reserve_attempt = 0;
	prefill_attempt = 1;
	prefill(slow, d, 26, pa, 640, &kr26.u.kv_reserved);
	prefill_attempt = 0;
	msg_clear(&kr26);
	sleep_loop(500); /* p0 is at block 1 or 2 of 10 */
	kv_release(d, 26, false); /* client gone; the router's Cancel has not reached p0 */
	refused = reserve_retry(d, 27, pb, 640, 1280, &kr, 8000);
	printf("[late %s] F: new reservation refused %d times while attempt 1 wrote after attempt 0's "
	       "fence\n",
	       tls, refused);
	CHECK(refused > 0);
	if (refused >= 0) {
		prefill(fast, d, 27, pb, 640, &kr.u.kv_reserved);
		msg_clear(&kr);
		CHECK(wait_msg(fast, MSG_PREFILL_DONE, 27, &pd, 10000) == 0);
		CHECK(wait_msg(slow, 0, 26, &pd2, 10000) == 0 && pd2.type == MSG_PREFILL_DONE);
		msg_clear(&pd2);
		CHECK(ready_and_decode(d, 27, &pd, 640, 1280));
		msg_clear(&pd);
	}
	prefill_attempt = -1;
	CHECK(wait_used_blocks(d, 0, 3000) == 0);
	CHECK(metric_is(mport, "tandem_kv_stale_fences_total{role=\"decode\",worker=\"dq\"} 1\n"));
	CHECK(metric_is(mport, "tandem_kv_quarantine_fenced_total{role=\"decode\",worker=\"dq\"} 3\n"));
	CHECK(wait_msg(d, MSG_ERROR, 26, &f, 1) != 0); /* the announcement was not refused */

	/* C: the slow prefill dies mid-transfer: no fence; the quarantine deadline (4 s) frees */
	reserve_window_ms = 122000;
	CHECK(reserve_retry(d, 24, pa, 640, 1280, &kr, 3000) == 0);
	reserve_window_ms = 0;
	prefill(slow, d, 24, pa, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	sleep_loop(500);
	kill(pp0, SIGKILL);
	waitpid(pp0, NULL, 0);
	kv_release(d, 24, false);
	uint64_t tq = uv_hrtime();
	sleep_loop(4500);
	CHECK(d->last_hb.used_blocks == 30); /* still quarantined: 4 s + the window's extra 2 s */
	CHECK(wait_used_blocks(d, 0, 4000) == 0);
	double q_s = (double)(uv_hrtime() - tq) / 1e9;
	printf("[late %s] C: no fence; blocks back after %.2f s (quarantine 4 s + 2 s of longer window)\n",
	       tls, q_s);
	CHECK(q_s > 5.5 && q_s < 7.5);
	CHECK(metric_is(mport, "tandem_kv_quarantine_expired_total{role=\"decode\",worker=\"dq\"} 1\n"));
	CHECK(reserve_retry(d, 25, pb, 640, 1280, &kr, 3000) == 0);
	prefill(fast, d, 25, pb, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	CHECK(wait_msg(fast, MSG_PREFILL_DONE, 25, &pd, 10000) == 0);
	CHECK(ready_and_decode(d, 25, &pd, 640, 1280));
	msg_clear(&pd);
	CHECK(wait_used_blocks(d, 0, 3000) == 0);
	(void)f;

	/* D: a long prompt's KV verification (slowed to 1 s for prompts of >= 700 tokens in this
	 * decode worker) runs off the loop: another request keeps streaming tokens meanwhile */
	static uint32_t pc[700];
	for (int i = 0; i < 700; i++)
		pc[i] = (uint32_t)((i * 31 + 5) % TRIVIAL_VOCAB);
	CHECK(reserve_retry(d, 30, pa, 64, 1088, &kr, 3000) == 0); /* 18 blocks */
	prefill(fast, d, 30, pa, 64, &kr.u.kv_reserved);
	msg_clear(&kr);
	CHECK(wait_msg(fast, MSG_PREFILL_DONE, 30, &pd, 10000) == 0);
	msg_init(&m, MSG_KV_READY);
	m.u.kv_ready.rid = 30;
	m.u.kv_ready.first = pd.u.prefill_done.first;
	m.u.kv_ready.n_prompt_tokens = 64;
	send_to(d, &m);
	msg_clear(&pd);
	CHECK(wait_msg(d, MSG_TOKENS, 30, &f, 5000) == 0);
	msg_clear(&f);
	CHECK(reserve_retry(d, 31, pc, 700, 68, &kr, 3000) == 0); /* 12 blocks */
	prefill(fast, d, 31, pc, 700, &kr.u.kv_reserved);
	msg_clear(&kr);
	CHECK(wait_msg(fast, MSG_PREFILL_DONE, 31, &pd, 10000) == 0);
	while (wait_msg(d, MSG_TOKENS, 30, &f, 1) == 0) /* what came before the slow check */
		msg_clear(&f);
	msg_init(&m, MSG_KV_READY);
	m.u.kv_ready.rid = 31;
	m.u.kv_ready.first = pd.u.prefill_done.first;
	m.u.kv_ready.n_prompt_tokens = 700;
	m.u.kv_ready.n_checksums = pd.u.prefill_done.n_checksums;
	m.u.kv_ready.checksums = pd.u.prefill_done.checksums;
	send_to(d, &m);
	msg_clear(&pd);
	sleep_loop(600); /* inside the 1 s verification */
	uint32_t streamed = 0;
	int fin31 = 0;
	for (int i = 0; i < d->n_q; i++) {
		if (d->q[i].type == MSG_TOKENS && d->q[i].u.tokens.rid == 30)
			streamed += (uint32_t)d->q[i].u.tokens.n_tokens;
		if (d->q[i].type == MSG_FINISH && d->q[i].u.finish.rid == 31)
			fin31 = 1;
	}
	printf("[late %s] D: %u tokens of another request streamed during a 1 s KV verification\n", tls,
	       streamed);
	CHECK(streamed >= 50 && !fin31);
	/* then both finish normally: the long prompt's KV passed its checks */
	CHECK(wait_msg(d, MSG_FINISH, 31, &f, 10000) == 0 && f.u.finish.reason == MSG_FINISH_LENGTH &&
	      f.u.finish.completion_tokens == 68);
	msg_clear(&f);
	CHECK(wait_msg(d, MSG_FINISH, 30, &f, 20000) == 0 && f.u.finish.reason == MSG_FINISH_LENGTH);
	msg_clear(&f);
	while (wait_msg(d, MSG_TOKENS, 0, &f, 1) == 0)
		msg_clear(&f);
	CHECK(wait_used_blocks(d, 0, 3000) == 0);

	/* E: the decode worker dies while a slow prefill (a new one, 200 ms per block) writes into it:
	 * the prefill answers (Error, or PrefillDone where the shared segment outlives decode) within
	 * its flush deadline instead of hanging, and still drains and exits cleanly */
	char plog2[300];
	snprintf(plog2, sizeof(plog2), "%s/late-prefill2-%s.log", tmpdir, tls);
	char *p2argv[] = {bin_p,       "--engine",
	                  "trivial",   "--router",
	                  router,      "--name",
	                  "slow2",     "--ucx-tls",
	                  (char *)tls, "--ucx-net-devices",
	                  (char *)dev, "--heartbeat-ms",
	                  "100",       "--max-tokens-per-step",
	                  "640",       "--flush-timeout-ms",
	                  "2000",      "--log-level",
	                  "debug",     NULL};
	setenv("TANDEM_TEST_PUSH_DELAY", "200000:600", 1);
	pid_t pp2 = spawn(bin_p, p2argv, plog2);
	unsetenv("TANDEM_TEST_PUSH_DELAY");
	int four = 3; /* p0 is gone (C) */
	CHECK(run_until(n_registered, &four, 15000));
	struct peer *slow2 = NULL;
	for (int i = 0; i < n_peers; i++)
		if (peers[i].have_hello && !peers[i].closed &&
		    strcmp(peers[i].hello.u.hello.name, "slow2") == 0)
			slow2 = &peers[i];
	int sd = -1;
	CHECK(slow2 != NULL);
	if (slow2) {
		CHECK(reserve_retry(d, 40, pa, 640, 1280, &kr, 3000) == 0);
		prefill(slow2, d, 40, pa, 640, &kr.u.kv_reserved);
		msg_clear(&kr);
		sleep_loop(500);
		kill(dp, SIGKILL);
		waitpid(dp, &sd, 0);
		sd = 0;
		uint64_t t1 = uv_hrtime();
		CHECK(wait_msg(slow2, 0, 40, &f, 8000) == 0);
		double answered_s = (double)(uv_hrtime() - t1) / 1e9;
		printf("[late %s] E: decode killed mid-transfer: prefill answered %s (%s) after %.2f s\n",
		       tls, msg_type_name(f.type), f.type == MSG_ERROR ? f.u.error.message : "", answered_s);
		CHECK(answered_s < 5.0); /* 8 more blocks at 200 ms + a 2 s flush deadline at most */
		msg_clear(&f);
	} else {
		kill(dp, SIGTERM);
		waitpid(dp, &sd, 0);
	}
	kill(pp2, SIGTERM);
	kill(pp1, SIGTERM);
	int s1 = -1, s2 = -1;
	waitpid(pp1, &s1, 0);
	waitpid(pp2, &s2, 0);
	CHECK(s1 == 0 && s2 == 0 && sd == 0);
	for (int i = 0; i < n_peers; i++) {
		if (peers[i].c)
			conn_close(peers[i].c, "done");
		if (peers[i].have_hello)
			msg_clear(&peers[i].hello);
		for (int k = 0; k < peers[i].n_q; k++)
			msg_clear(&peers[i].q[k]);
	}
	conn_listener_close(l);
	for (int i = 0; i < 20; i++)
		uv_run(loop, UV_RUN_NOWAIT);
	printf("[late %s] %s\n", tls, n_fail == fails0 ? "ok" : "FAILED");
	return n_fail != fails0;
}

/* A UCX endpoint that outlives its peer entry: the decode worker is stopped (SIGSTOP) while the
 * prefill pushes to it, so the flush deadline passes and the prefill drops the peer while the
 * endpoint is still connected; then the decode worker is SIGKILLed and UCX reports the reset on
 * that endpoint later. UCX refuses to force-close an endpoint without peer error handling, so the
 * endpoint lived on, and its error handler wrote into the freed peer (heap corruption: later
 * batches of the prefill worker saw garbage block ids; ASan reports the write). The same prefill
 * worker must then serve requests to a second decode worker exactly and exit cleanly. */
static int run_stale_ep_suite(const char *tls, const char *dev)
{
	int fails0 = n_fail;
	struct conn_opts so = {.on_msg_cb = on_msg_cb, .on_close_cb = on_close_cb, .idle_timeout_ms = 10000};
	struct conn_listener *l;
	struct errbuf e = {0};
	n_peers = 0;
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, accept_cb, NULL, &l, &e) == 0);
	char router[64], plog[300], dlog[300], dlog2[300], bin_p[300], bin_d[300];
	snprintf(router, sizeof(router), "127.0.0.1:%d", conn_listener_port(l));
	snprintf(plog, sizeof(plog), "%s/stale-prefill-%s.log", tmpdir, tls);
	snprintf(dlog, sizeof(dlog), "%s/stale-decode1-%s.log", tmpdir, tls);
	snprintf(dlog2, sizeof(dlog2), "%s/stale-decode2-%s.log", tmpdir, tls);
	snprintf(bin_p, sizeof(bin_p), "%s/tandem-prefill", build_dir);
	snprintf(bin_d, sizeof(bin_d), "%s/tandem-decode", build_dir);
	char *pargv[] = {bin_p,       "--engine",
	                 "trivial",   "--router",
	                 router,      "--name",
	                 "sp",        "--ucx-tls",
	                 (char *)tls, "--ucx-net-devices",
	                 (char *)dev, "--heartbeat-ms",
	                 "100",       "--max-tokens-per-step",
	                 "64",        "--flush-timeout-ms",
	                 "1000",      "--log-level",
	                 "debug",     NULL};
	char *d1argv[] = {bin_d,       "--engine",
	                  "trivial",   "--router",
	                  router,      "--name",
	                  "sd1",       "--ucx-tls",
	                  (char *)tls, "--ucx-net-devices",
	                  (char *)dev, "--heartbeat-ms",
	                  "100",       "--log-level",
	                  "debug",     NULL};
	char *d2argv[] = {bin_d,       "--engine",
	                  "trivial",   "--router",
	                  router,      "--name",
	                  "sd2",       "--ucx-tls",
	                  (char *)tls, "--ucx-net-devices",
	                  (char *)dev, "--heartbeat-ms",
	                  "100",       "--log-level",
	                  "debug",     NULL};
	pid_t pp = spawn(bin_p, pargv, plog);
	pid_t dp = spawn(bin_d, d1argv, dlog);
	int two = 2;
	CHECK(run_until(n_registered, &two, 15000));
	struct peer *p = find_role(MSG_ROLE_PREFILL), *d = find_role(MSG_ROLE_DECODE);
	if (!p || !d) {
		fprintf(stderr, "stale-endpoint workers did not register (logs: %s %s)\n", plog, dlog);
		kill(pp, SIGKILL), kill(dp, SIGKILL);
		waitpid(pp, NULL, 0), waitpid(dp, NULL, 0);
		return 1;
	}
	static uint32_t pa[640];
	for (int i = 0; i < 640; i++)
		pa[i] = (uint32_t)((i * 31 + 5) % TRIVIAL_VOCAB);
	struct msg kr, f;
	/* the decode worker stops answering while the prefill writes 10 blocks into it */
	reserve(d, 60, pa, 640, 64, NULL, 0, 0);
	CHECK(wait_msg(d, MSG_KV_RESERVED, 60, &kr, 5000) == 0);
	kill(dp, SIGSTOP);
	prefill(p, d, 60, pa, 640, &kr.u.kv_reserved);
	msg_clear(&kr);
	uint64_t t0 = uv_hrtime();
	if (wait_msg(p, 0, 60, &f, 8000) == 0) {
		double s_answer = (double)(uv_hrtime() - t0) / 1e9;
		printf("[stale %s] prefill to a stopped decode worker answered %s (%s) after %.2f s\n", tls,
		       msg_type_name(f.type), f.type == MSG_ERROR ? f.u.error.message : "", s_answer);
		CHECK(f.type == MSG_ERROR);
		/* 1 s flush deadline + at most 1 s for the endpoint close; before the fix the flush
		 * ran until UCX's own endpoint timeout (8 s here) */
		CHECK(s_answer < 4.0);
		msg_clear(&f);
	} else {
		CHECK(!"prefill to a stopped decode worker did not answer within 8 s");
	}
	/* now the connection resets under the dropped endpoint; give UCX time to report it */
	kill(dp, SIGKILL);
	waitpid(dp, NULL, 0);
	sleep_loop(2500);
	pid_t dp2 = spawn(bin_d, d2argv, dlog2);
	CHECK(run_until(new_decode, d, 15000));
	struct peer *d2 = find_role(MSG_ROLE_DECODE);
	/* several requests at once through the same prefill worker: a batch of many block tables */
	int n_ok = 0;
	if (d2 && d2 != d) {
		static uint32_t pr[8][200];
		struct msg pd[8];
		for (int r = 0; r < 8; r++) {
			for (int i = 0; i < 200; i++)
				pr[r][i] = (uint32_t)((i * 13 + r * 101 + 1) % TRIVIAL_VOCAB);
			reserve(d2, 70 + (uint64_t)r, pr[r], 150 + 5 * (uint32_t)r, 8, NULL, 0, 0);
		}
		for (int r = 0; r < 8; r++) {
			CHECK(wait_msg(d2, MSG_KV_RESERVED, 70 + (uint64_t)r, &kr, 5000) == 0);
			prefill(p, d2, 70 + (uint64_t)r, pr[r], 150 + 5 * (uint32_t)r, &kr.u.kv_reserved);
			msg_clear(&kr);
		}
		for (int r = 0; r < 8; r++) {
			CHECK(wait_msg(p, 0, 70 + (uint64_t)r, &pd[r], 10000) == 0);
			if (pd[r].type == MSG_PREFILL_DONE &&
			    ready_and_decode(d2, 70 + (uint64_t)r, &pd[r], 150 + 5 * (uint32_t)r, 8))
				n_ok++;
			else if (pd[r].type == MSG_ERROR)
				fprintf(stderr, "rid %d: %s\n", 70 + r, pd[r].u.error.message);
			msg_clear(&pd[r]);
		}
	}
	printf("[stale %s] afterwards %d of 8 requests through the same prefill worker exact\n", tls, n_ok);
	CHECK(n_ok == 8);
	kill(pp, SIGTERM);
	kill(dp2, SIGTERM);
	int sp = -1, sd = -1;
	waitpid(pp, &sp, 0);
	waitpid(dp2, &sd, 0);
	CHECK(sp == 0 && sd == 0);
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "grep -h 'AddressSanitizer\\|outside the pool' %s", plog);
	CHECK(system(cmd) != 0);
	for (int i = 0; i < n_peers; i++) {
		if (peers[i].c)
			conn_close(peers[i].c, "done");
		if (peers[i].have_hello)
			msg_clear(&peers[i].hello);
		for (int k = 0; k < peers[i].n_q; k++)
			msg_clear(&peers[i].q[k]);
	}
	conn_listener_close(l);
	for (int i = 0; i < 20; i++)
		uv_run(loop, UV_RUN_NOWAIT);
	printf("[stale %s] %s\n", tls, n_fail == fails0 ? "ok" : "FAILED");
	return n_fail != fails0;
}

/* ---- the real model: greedy through prefill -> UCX -> decode equals `tandem generate` ---- */

#define N_MODEL_REQS 6

static int run_model_suite(const char *tls, const char *dev)
{
	int fails0 = n_fail;
	const char *model = "tests/data/models/glm-dsa-tiny-Q8_0.gguf";
	struct conn_opts so = {.on_msg_cb = on_msg_cb, .on_close_cb = on_close_cb, .idle_timeout_ms = 10000};
	struct conn_listener *l;
	struct errbuf e = {0};
	n_peers = 0;
	CHECK(conn_listen(loop, "127.0.0.1:0", &so, accept_cb, NULL, &l, &e) == 0);
	char router[64], plog[300], dlog[300], bin_p[300], bin_d[300];
	snprintf(router, sizeof(router), "127.0.0.1:%d", conn_listener_port(l));
	snprintf(plog, sizeof(plog), "%s/prefill-model-%s.log", tmpdir, tls);
	snprintf(dlog, sizeof(dlog), "%s/decode-model-%s.log", tmpdir, tls);
	snprintf(bin_p, sizeof(bin_p), "%s/tandem-prefill", build_dir);
	snprintf(bin_d, sizeof(bin_d), "%s/tandem-decode", build_dir);
	/* a 64-token step budget: the long prompt is prefilled in chunks, interleaved with the others */
	char *pargv[] = {bin_p,         "--model",
	                 (char *)model, "--router",
	                 router,        "--name",
	                 "pm",          "--ucx-tls",
	                 (char *)tls,   "--ucx-net-devices",
	                 (char *)dev,   "--heartbeat-ms",
	                 "100",         "--max-tokens-per-step",
	                 "64",          NULL};
	char *dargv[] = {bin_d,         "--model",
	                 (char *)model, "--router",
	                 router,        "--name",
	                 "dm",          "--ucx-tls",
	                 (char *)tls,   "--ucx-net-devices",
	                 (char *)dev,   "--heartbeat-ms",
	                 "100",         "--kv-blocks",
	                 "64",          NULL};
	pid_t pp = spawn(bin_p, pargv, plog);
	pid_t dp = spawn(bin_d, dargv, dlog);
	int two = 2;
	CHECK(run_until(n_registered, &two, 30000));
	struct peer *p = find_role(MSG_ROLE_PREFILL), *d = find_role(MSG_ROLE_DECODE);
	if (!p || !d) {
		fprintf(stderr, "model workers did not register (logs: %s %s)\n", plog, dlog);
		kill(pp, SIGKILL);
		kill(dp, SIGKILL);
		waitpid(pp, NULL, 0);
		waitpid(dp, NULL, 0);
		return 1;
	}
	CHECK(msg_kv_layout_compare(&p->hello.u.hello.kv_layout, "prefill", &d->hello.u.hello.kv_layout,
	                            "decode", &e) == 0);
	CHECK(strcmp(d->hello.u.hello.kv_layout.arch, "glm-dsa") == 0);
	CHECK(memcmp(p->hello.u.hello.model_id, d->hello.u.hello.model_id, 8) == 0);
	static uint32_t prompts[N_MODEL_REQS][200];
	uint32_t n_prompt[N_MODEL_REQS] = {1, 6, 33, 64, 65, 150};
	uint32_t n_gen[N_MODEL_REQS] = {12, 16, 9, 20, 7, 16};
	uint32_t seed = 1234;
	for (int r = 0; r < N_MODEL_REQS; r++)
		for (uint32_t i = 0; i < n_prompt[r]; i++) {
			seed = seed * 1103515245u + 12345u;
			prompts[r][i] = 3 + (seed >> 8) % 990;
		}
	reserve_ignore_eos = true;
	for (int r = 0; r < N_MODEL_REQS; r++)
		reserve(d, 500 + (uint64_t)r, prompts[r], n_prompt[r], n_gen[r], NULL, 0, 0);
	for (int r = 0; r < N_MODEL_REQS; r++) {
		struct msg kr;
		if (wait_msg(d, MSG_KV_RESERVED, 500 + (uint64_t)r, &kr, 5000) == 0) {
			prefill(p, d, 500 + (uint64_t)r, prompts[r], n_prompt[r], &kr.u.kv_reserved);
			msg_clear(&kr);
		}
	}
	static uint32_t got[N_MODEL_REQS][64];
	uint32_t n_got[N_MODEL_REQS] = {0};
	for (int r = 0; r < N_MODEL_REQS; r++) {
		struct msg pd, m;
		if (wait_msg(p, MSG_PREFILL_DONE, 500 + (uint64_t)r, &pd, 30000))
			continue;
		got[r][n_got[r]++] = pd.u.prefill_done.first.id;
		msg_init(&m, MSG_KV_READY);
		m.u.kv_ready.rid = 500 + (uint64_t)r;
		m.u.kv_ready.first = pd.u.prefill_done.first;
		m.u.kv_ready.n_prompt_tokens = n_prompt[r];
		m.u.kv_ready.n_checksums = pd.u.prefill_done.n_checksums;
		m.u.kv_ready.checksums = pd.u.prefill_done.checksums;
		send_to(d, &m);
		msg_clear(&pd);
	}
	for (int r = 0; r < N_MODEL_REQS; r++) {
		for (;;) {
			struct msg t;
			if (wait_msg(d, 0, 500 + (uint64_t)r, &t, 30000))
				break;
			if (t.type == MSG_TOKENS) {
				for (size_t i = 0; i < t.u.tokens.n_tokens && n_got[r] < 64; i++)
					got[r][n_got[r]++] = t.u.tokens.tokens[i].id;
				msg_clear(&t);
				continue;
			}
			CHECK(t.type == MSG_FINISH && t.u.finish.reason == MSG_FINISH_LENGTH);
			msg_clear(&t);
			break;
		}
		/* the reference: the model core in one process, no prefill/decode split */
		char cmd[4096];
		int n = snprintf(
		    cmd, sizeof(cmd),
		    "%s/tandem generate -m %s -n %u --greedy --ids --ignore-eos --threads 1 --tokens ",
		    build_dir, model, n_gen[r]);
		for (uint32_t i = 0; i < n_prompt[r]; i++)
			n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, "%s%u", i ? "," : "", prompts[r][i]);
		snprintf(cmd + n, sizeof(cmd) - (size_t)n, " 2>/dev/null | tail -n 1");
		FILE *f = popen(cmd, "r");
		uint32_t exp[64], n_exp = 0;
		while (f && n_exp < 64 && fscanf(f, "%u", &exp[n_exp]) == 1)
			n_exp++;
		if (f)
			pclose(f);
		int same = n_exp == n_gen[r] && n_got[r] == n_exp &&
		           memcmp(exp, got[r], n_exp * sizeof(uint32_t)) == 0;
		printf("[model %s] prompt of %3u tokens: %u tokens through the workers, %s tandem generate\n",
		       tls, n_prompt[r], n_got[r], same ? "equal to" : "DIFFERENT from");
		CHECK(same);
	}
	/* stop string: text that the greedy continuation of prompt 1 produces at its tokens 4..5;
	 * decode must finish (STOP, stop_index 0) at the first token whose text completes it */
	struct gguf_ctx *gg = NULL;
	struct tok *tk = NULL;
	CHECK(gguf_open(&gg, model, &e) == 0 && tok_load(&tk, gg, &e) == 0);
	if (tk && n_got[1] >= 8) {
		/* the text as decode sees it: the streaming decoder (valid UTF-8, specials skipped) */
		char text[8192], stop[256];
		size_t off[65] = {0}, len = 0;
		struct tok_stream ts;
		tok_stream_init(&ts, tk, TOK_DECODE_SKIP_SPECIAL);
		for (uint32_t i = 0; i < n_got[1] && i < 64; i++) {
			size_t n_out = 0;
			if (len + tok_stream_max_out(tk) < sizeof(text) &&
			    tok_stream_feed(&ts, (int32_t)got[1][i], text + len, sizeof(text) - len, &n_out,
			                    &e) == 0)
				len += n_out;
			off[i + 1] = len;
		}
		size_t a = off[3], b = off[6];
		if (b > a && b - a < sizeof(stop)) {
			memcpy(stop, text + a, b - a);
			stop[b - a] = 0;
			/* expected: the first k whose streamed prefix contains the stop text */
			uint32_t k_exp = 0;
			for (uint32_t k = 1; k <= n_got[1] && !k_exp; k++)
				if (memmem(text, off[k], stop, b - a))
					k_exp = k;
			CHECK(k_exp > 0);
			const char *stops[1] = {stop};
			struct msg m, kr, pd, f;
			msg_init(&m, MSG_KV_RESERVE);
			m.u.kv_reserve.rid = 600;
			m.u.kv_reserve.n_prompt_tokens = n_prompt[1];
			m.u.kv_reserve.max_tokens = n_gen[1];
			m.u.kv_reserve.ignore_eos = true;
			m.u.kv_reserve.n_stop = 1;
			m.u.kv_reserve.stop = stops;
			send_to(d, &m);
			uint32_t n_stream = 1;
			if (wait_msg(d, MSG_KV_RESERVED, 600, &kr, 5000) == 0) {
				prefill(p, d, 600, prompts[1], n_prompt[1], &kr.u.kv_reserved);
				msg_clear(&kr);
				if (wait_msg(p, MSG_PREFILL_DONE, 600, &pd, 10000) == 0) {
					msg_init(&m, MSG_KV_READY);
					m.u.kv_ready.rid = 600;
					m.u.kv_ready.first = pd.u.prefill_done.first;
					m.u.kv_ready.n_prompt_tokens = n_prompt[1];
					send_to(d, &m);
					msg_clear(&pd);
					for (;;) {
						if (wait_msg(d, 0, 600, &f, 10000))
							break;
						if (f.type == MSG_TOKENS) {
							n_stream += (uint32_t)f.u.tokens.n_tokens;
							msg_clear(&f);
							continue;
						}
						CHECK(f.type == MSG_FINISH &&
						      f.u.finish.reason == MSG_FINISH_STOP &&
						      f.u.finish.stop_index == 0 &&
						      f.u.finish.completion_tokens == k_exp);
						msg_clear(&f);
						break;
					}
				}
			}
			CHECK(n_stream == k_exp);
			printf("[model %s] stop string \"%s\": finished after %u tokens (expected %u)\n", tls,
			       stop, n_stream, k_exp);
		}
	}
	tok_destroy(tk);
	gguf_close(gg);
	CHECK(wait_used_blocks(d, 0, 3000) == 0);
	reserve_ignore_eos = false;
	kill(pp, SIGTERM);
	kill(dp, SIGTERM);
	int sp = -1, sd = -1;
	waitpid(pp, &sp, 0);
	waitpid(dp, &sd, 0);
	CHECK(sp == 0 && sd == 0);
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "grep -h ' ERROR ' %s %s", plog, dlog);
	CHECK(system(cmd) != 0);
	for (int i = 0; i < n_peers; i++) {
		if (peers[i].c)
			conn_close(peers[i].c, "done");
		if (peers[i].have_hello)
			msg_clear(&peers[i].hello);
		for (int k = 0; k < peers[i].n_q; k++)
			msg_clear(&peers[i].q[k]);
	}
	conn_listener_close(l);
	for (int i = 0; i < 20; i++)
		uv_run(loop, UV_RUN_NOWAIT);
	return n_fail != fails0;
}

int main(void)
{
	log_init("test", -1);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (getenv("BUILD"))
		build_dir = getenv("BUILD");
	snprintf(tmpdir, sizeof(tmpdir), "%s/test-logs", build_dir);
	mkdir(tmpdir, 0755);
	snprintf(tmpdir, sizeof(tmpdir), "%s/test-logs/net-workers", build_dir);
	mkdir(tmpdir, 0755);
	loop = uv_default_loop();
	uv_timer_t hb;
	uv_timer_init(loop, &hb);
	uv_timer_start(&hb, heartbeat_cb, 100, 100);
	uv_unref((uv_handle_t *)&hb);
	run_suite("tcp", "lo", 1);
	run_suite("sm,self", "", 0);
	run_late_write_suite("tcp", "lo");
	run_late_write_suite("sm,self", "");
	run_stale_ep_suite("tcp", "lo");
	run_model_suite("tcp", "lo");
	if (n_fail) {
		fprintf(stderr, "test_net_workers: %d checks failed (worker logs in %s)\n", n_fail, tmpdir);
		return 1;
	}
	printf("test_net_workers: all checks passed\n");
	return 0;
}
