/* The router's control-plane backend (router/workers.c) against scripted workers that speak the
 * real protocol over loopback TCP (common/net conn + msg): registration (accepted, refused for a
 * KV-layout difference with the field named, refused for a wrong token), a request's full life
 * (KvReserve -> KvReserved -> PrefillRequest -> PrefillDone -> KvReady -> Tokens -> Finish) with
 * the decode target and block ids forwarded, a cancel that sends Cancel to decode, and a decode
 * connection dropping mid-stream failing only its request. Then per-attempt fences and long
 * prompts: a decode worker that announces fence_attempts gets the prompt-length deadlines
 * (reservation, prefill window) in KvReserve; its prefill gets attempt 0 and the same window as
 * its deadline; when that prefill worker is lost, the router announces attempt 1 to decode (a
 * KvReserve for the held rid) and re-prefills on the other worker with attempt 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/conn.h"
#include "common/net/metrics.h"
#include "common/net/msg.h"
#include "router/sched.h"
#include "router/workers.h"

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

static uv_loop_t loop;

/* ---- scripted worker ------------------------------------------------------------------------- */

struct fake {
	const char *name;
	int role;
	uint32_t block_size;
	const char *token;
	struct conn *c;
	bool acked;
	bool closed;
	int error_code;
	char error_msg[512];
	int n_reserve, n_release, n_cancel, n_prefill, n_ready;
	uint32_t last_blocks[64];
	size_t n_last_blocks;
	char last_target[80];
	uint64_t last_rid;
	uint32_t n_gen; /* decode: tokens to send after KvReady (Tokens + Finish) */
	bool hold; /* decode: send nothing after KvReady (so the test can cancel or drop) */
	int n_refuse; /* decode: answer this many KvReserves with Error(NO_CAPACITY) */
	bool fence_attempts; /* decode: announce per-attempt fences in Hello */
	bool hold_prefill; /* prefill: never answer a PrefillRequest */
	int n_fail_transfer; /* prefill: answer this many PrefillRequests with Error(TRANSFER) */
	int n_announce; /* decode: KvReserves for an rid it holds (attempt > 0): not answered */
	uint32_t last_attempt, last_deadline_ms, last_window_ms;
	bool last_has_attempt;
};

static const uint8_t fake_ucx_addr[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static const uint8_t fake_rkey[4] = {9, 9, 9, 9};

static void fake_send(struct fake *f, struct msg *m)
{
	struct errbuf e = {0};
	int rc = conn_send(f->c, m, &e);
	CHECK(rc == 0, "%s send: %s", f->name, e.msg);
}

static int fake_msg_cb(struct conn *c, struct msg *m, void *ud)
{
	struct fake *f = ud;
	(void)c;
	struct msg o;
	switch (m->type) {
	case MSG_HELLO_ACK: f->acked = true; break;
	case MSG_ERROR:
		f->error_code = m->u.error.code;
		snprintf(f->error_msg, sizeof(f->error_msg), "%s", m->u.error.message);
		break;
	case MSG_KV_RESERVE: {
		f->last_attempt = m->u.kv_reserve.attempt;
		f->last_deadline_ms = m->u.kv_reserve.deadline_ms;
		f->last_window_ms = m->u.kv_reserve.prefill_window_ms;
		if (m->u.kv_reserve.attempt > 0 && m->u.kv_reserve.rid == f->last_rid) {
			f->n_announce++; /* like tandem-decode: a new attempt, no answer */
			break;
		}
		f->n_reserve++;
		f->last_rid = m->u.kv_reserve.rid;
		if (f->n_refuse > 0) {
			f->n_refuse--;
			msg_init(&o, MSG_ERROR);
			o.u.error.has_rid = true;
			o.u.error.rid = m->u.kv_reserve.rid;
			o.u.error.code = MSG_ERR_NO_CAPACITY;
			snprintf(o.u.error.message, sizeof(o.u.error.message), "no free blocks");
			fake_send(f, &o);
			break;
		}
		uint32_t need =
		    (m->u.kv_reserve.n_prompt_tokens + m->u.kv_reserve.max_tokens + f->block_size - 1) /
		    f->block_size;
		uint32_t ids[64];
		for (uint32_t i = 0; i < need && i < 64; i++)
			ids[i] = 10 + i;
		msg_init(&o, MSG_KV_RESERVED);
		o.u.kv_reserved.rid = m->u.kv_reserve.rid;
		o.u.kv_reserved.n_block_ids = need;
		o.u.kv_reserved.block_ids = ids;
		fake_send(f, &o);
		break;
	}
	case MSG_KV_RELEASE: f->n_release++; break;
	case MSG_CANCEL:
		f->n_cancel++;
		if (f->role == MSG_ROLE_DECODE) {
			msg_init(&o, MSG_FINISH);
			o.u.finish.rid = m->u.cancel.rid;
			o.u.finish.reason = MSG_FINISH_CANCELLED;
			fake_send(f, &o);
		}
		break;
	case MSG_PREFILL_REQUEST: {
		const struct msg_prefill_request *p = &m->u.prefill_request;
		f->n_prefill++;
		f->n_last_blocks = p->n_block_ids < 64 ? p->n_block_ids : 64;
		memcpy(f->last_blocks, p->block_ids, f->n_last_blocks * sizeof(uint32_t));
		snprintf(f->last_target, sizeof(f->last_target), "%s", p->target_name);
		f->last_rid = p->rid;
		f->last_has_attempt = p->has_attempt;
		f->last_attempt = p->attempt;
		f->last_deadline_ms = p->deadline_ms;
		if (f->hold_prefill)
			break;
		if (f->n_fail_transfer > 0) { /* the push to the decode worker broke */
			f->n_fail_transfer--;
			msg_init(&o, MSG_ERROR);
			o.u.error.has_rid = true;
			o.u.error.rid = p->rid;
			o.u.error.code = MSG_ERR_TRANSFER;
			snprintf(o.u.error.message, sizeof(o.u.error.message),
			         "UCX: KV transfer failed: Connection reset by remote peer");
			fake_send(f, &o);
			break;
		}
		CHECK(p->target_ucx_address_len == sizeof(fake_ucx_addr) &&
		          memcmp(p->target_ucx_address, fake_ucx_addr, sizeof(fake_ucx_addr)) == 0,
		      "decode's UCX address forwarded to prefill");
		CHECK(p->target_region.rkey_len == sizeof(fake_rkey) && p->target_region.n_blocks == 64,
		      "decode's KV region forwarded");
		msg_init(&o, MSG_PREFILL_DONE);
		o.u.prefill_done.rid = p->rid;
		o.u.prefill_done.first.id = 1000;
		o.u.prefill_done.first.logprob = -0.5f;
		o.u.prefill_done.n_prompt_tokens = (uint32_t)p->n_tokens;
		o.u.prefill_done.kv_bytes = 4096;
		fake_send(f, &o);
		break;
	}
	case MSG_KV_READY: {
		f->n_ready++;
		CHECK(m->u.kv_ready.first.id == 1000, "first token forwarded in KvReady");
		if (f->hold)
			break;
		struct msg_token toks[16];
		memset(toks, 0, sizeof(toks));
		for (uint32_t i = 0; i + 1 < f->n_gen && i < 16; i++)
			toks[i].id = 1001 + i;
		msg_init(&o, MSG_TOKENS);
		o.u.tokens.rid = m->u.kv_ready.rid;
		o.u.tokens.n_tokens = f->n_gen - 1;
		o.u.tokens.tokens = toks;
		fake_send(f, &o);
		msg_init(&o, MSG_FINISH);
		o.u.finish.rid = m->u.kv_ready.rid;
		o.u.finish.reason = MSG_FINISH_LENGTH;
		o.u.finish.completion_tokens = f->n_gen;
		fake_send(f, &o);
		break;
	}
	default: break;
	}
	return 0;
}

static void fake_close_cb(struct conn *c, int err, const char *why, void *ud)
{
	struct fake *f = ud;
	(void)c;
	(void)err;
	(void)why;
	f->closed = true;
	f->c = NULL;
}

static void fake_connect_cb(struct conn *c, int status, void *ud)
{
	struct fake *f = ud;
	CHECK(status == 0, "%s connect", f->name);
	if (status)
		return;
	struct msg m;
	msg_init(&m, MSG_HELLO);
	struct msg_hello *h = &m.u.hello;
	h->protocol_version = PROTOCOL_VERSION;
	h->role = f->role;
	snprintf(h->name, sizeof(h->name), "%s", f->name);
	memcpy(h->model_id, "\xaa\xbb\xcc", 3);
	h->model_id_len = 3;
	snprintf(h->model_name, sizeof(h->model_name), "tiny");
	snprintf(h->kv_layout.arch, sizeof(h->kv_layout.arch), "glm-dsa");
	h->kv_layout.n_layers = 2;
	h->kv_layout.block_size = f->block_size;
	h->kv_layout.latent_dim = 512;
	h->kv_layout.rope_dim = 64;
	h->kv_layout.dtype = MSG_KV_BF16;
	h->kv_layout.indexer_dtype = MSG_KV_BF16;
	h->tp_degree = 1;
	h->pid = 1;
	h->fence_attempts = f->fence_attempts;
	if (f->token)
		snprintf(h->auth_token, sizeof(h->auth_token), "%s", f->token);
	if (f->role == MSG_ROLE_DECODE) {
		h->n_blocks_total = 64;
		h->max_batch = 8;
		h->ucx_address = fake_ucx_addr;
		h->ucx_address_len = sizeof(fake_ucx_addr);
		h->has_kv_region = true;
		h->kv_region.n_blocks = 64;
		h->kv_region.n_segments = 1;
		h->kv_region.segment_bytes = 4096;
		h->kv_region.block_stride = 4096;
		h->kv_region.rkey = fake_rkey;
		h->kv_region.rkey_len = sizeof(fake_rkey);
	}
	struct errbuf e = {0};
	CHECK(conn_send(c, &m, &e) == 0, "hello: %s", e.msg);
}

/* workers heartbeat like real ones (the router drops a silent worker after 3 intervals) */
#define MAX_FAKES 32
static struct fake *all_fakes[MAX_FAKES];
static int n_fakes;
static void hb_cb(uv_timer_t *t)
{
	(void)t;
	for (int i = 0; i < n_fakes; i++) {
		struct fake *f = all_fakes[i];
		if (!f->c || !f->acked)
			continue;
		struct msg m;
		msg_init(&m, MSG_HEARTBEAT);
		if (f->role == MSG_ROLE_DECODE)
			m.u.heartbeat.free_blocks =
			    64 - 4 * (uint32_t)(f->n_reserve - f->n_cancel - f->n_release);
		struct errbuf e = {0};
		if (conn_send(f->c, &m, &e) != 0)
			printf("heartbeat from %s: %s\n", f->name, e.msg);
	}
}

static void fake_start(struct fake *f, int port)
{
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	CHECK(n_fakes < MAX_FAKES, "more than %d fake workers", MAX_FAKES);
	if (n_fakes < MAX_FAKES)
		all_fakes[n_fakes++] = f;
	struct conn_opts o = {.on_msg_cb = fake_msg_cb,
	                      .on_close_cb = fake_close_cb,
	                      .on_connect_cb = fake_connect_cb,
	                      .ud = f};
	struct errbuf e = {0};
	CHECK(conn_connect(&loop, addr, &o, &f->c, &e) == 0, "connect: %s", e.msg);
}

/* ---- sink ------------------------------------------------------------------------------------ */

struct rec {
	int32_t tokens[64];
	int n_tokens, n_ends;
	enum req_state end;
	int status;
	char msg[256];
};

static void on_token(void *ud, struct req *r, const struct req_token *t)
{
	struct rec *x = ud;
	(void)r;
	if (x->n_tokens < 64)
		x->tokens[x->n_tokens++] = t->id;
}

static void on_end(void *ud, struct req *r, enum req_state st, enum req_finish fin, int status,
                   const char *msg)
{
	struct rec *x = ud;
	(void)r;
	(void)fin;
	x->n_ends++;
	x->end = st;
	x->status = status;
	snprintf(x->msg, sizeof(x->msg), "%s", msg ? msg : "");
}

static const struct req_sink sink = {on_token, on_end};

static void run_while(bool (*pending)(void *), void *arg, int ms)
{
	uint64_t t0 = uv_hrtime();
	while (pending(arg) && uv_hrtime() - t0 < (uint64_t)ms * 1000000ull)
		uv_run(&loop, UV_RUN_ONCE);
}

static bool not_acked(void *a)
{
	return !((struct fake *)a)->acked && !((struct fake *)a)->closed;
}
static bool not_errored(void *a)
{
	return ((struct fake *)a)->error_code == 0 && !((struct fake *)a)->closed;
}
static bool not_ended(void *a)
{
	return ((struct rec *)a)->n_ends == 0;
}
static bool not_ready(void *a)
{
	return ((struct fake *)a)->n_ready == 0;
}
static bool not_cancelled(void *a)
{
	return ((struct fake *)a)->n_cancel == 0;
}

static struct req *mkreq(uint64_t id, uint32_t n_prompt, uint32_t n_new, struct rec *x)
{
	int32_t *p = malloc(n_prompt * sizeof(int32_t));
	for (uint32_t i = 0; i < n_prompt; i++)
		p[i] = (int32_t)i + 5;
	struct req_sampling s = {.temperature = 0};
	return req_create(&loop, id, p, n_prompt, n_new, 4096, &s, &sink, x);
}

int main(void)
{
	uv_loop_init(&loop);
	struct metrics *m = metrics_create(NULL);
	struct sched *s;
	struct workers *ws;
	struct errbuf e = {0};
	struct sched_config sc = {.n_queue_max = 8,
	                          .queue_timeout_ms = 5000,
	                          .reserve_timeout_ms = 5000,
	                          .prefill_timeout_ms = 5000,
	                          .transfer_timeout_ms = 5000,
	                          .token_timeout_ms = 5000,
	                          .n_prefill_tries_max = 2,
	                          .retry_after_s = 1};
	CHECK(sched_create(&s, &loop, &sc, m, &e) == 0, "sched");
	struct workers_config wc = {.listen_addr = "127.0.0.1:0",
	                            .auth_token = "sesame",
	                            .heartbeat_ms = 200,
	                            .reserve_deadline_ms = 10000,
	                            .prefill_deadline_ms = 5000,
	                            .prefill_us_per_token = 250};
	CHECK(workers_create(&ws, &loop, s, &wc, m, &e) == 0, "workers: %s", e.msg);
	int port = workers_port(ws);
	uv_timer_t hb;
	uv_timer_init(&loop, &hb);
	uv_timer_start(&hb, hb_cb, 100, 100);

	struct fake dec = {
	    .name = "decode-0", .role = MSG_ROLE_DECODE, .block_size = 16, .token = "sesame", .n_gen = 5};
	struct fake pre = {
	    .name = "prefill-0", .role = MSG_ROLE_PREFILL, .block_size = 16, .token = "sesame"};
	struct fake bad = {
	    .name = "decode-bad", .role = MSG_ROLE_DECODE, .block_size = 32, .token = "sesame"};
	struct fake nokey = {
	    .name = "decode-nokey", .role = MSG_ROLE_DECODE, .block_size = 16, .token = "wrong"};
	fake_start(&dec, port);
	fake_start(&pre, port);
	run_while(not_acked, &dec, 3000);
	run_while(not_acked, &pre, 3000);
	CHECK(dec.acked && pre.acked, "both registered");
	CHECK(sched_is_ready(s), "ready with one prefill and one decode");

	fake_start(&bad, port);
	run_while(not_errored, &bad, 3000);
	CHECK(bad.error_code == MSG_ERR_LAYOUT_MISMATCH, "layout mismatch code: %d", bad.error_code);
	CHECK(strstr(bad.error_msg, "block_size is 32 on decode-bad but 16 on") != NULL,
	      "message names the field: %s", bad.error_msg);
	fake_start(&nokey, port);
	run_while(not_errored, &nokey, 3000);
	CHECK(nokey.error_code == MSG_ERR_AUTH, "wrong token refused: %d %s", nokey.error_code,
	      nokey.error_msg);

	/* a request's whole life over the protocol */
	struct rec *x = calloc(1, sizeof(*x));
	struct req *r = mkreq(7, 20, 5, x);
	CHECK(sched_submit(s, r) == 0, "submit");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_DONE, "done: %s %s", req_state_name(x->end), x->msg);
	CHECK(x->n_tokens == 5 && x->tokens[0] == 1000 && x->tokens[1] == 1001 && x->tokens[4] == 1004,
	      "first token from PrefillDone, the rest from Tokens: n=%d", x->n_tokens);
	CHECK(dec.n_reserve == 1 && pre.n_prefill == 1 && dec.n_ready == 1, "one reserve, prefill, ready");
	CHECK(pre.n_last_blocks == 2 && pre.last_blocks[0] == 10 && pre.last_blocks[1] == 11,
	      "decode's block ids handed to prefill: %zu", pre.n_last_blocks);
	CHECK(strcmp(pre.last_target, "decode-0") == 0, "target name");
	/* 20 prompt tokens at 250 us: 5 ms more for every deadline; an older decode (no per-attempt
	 * fences): the prefill request carries no attempt */
	CHECK(dec.last_deadline_ms == 10005 && dec.last_window_ms == 5005 && dec.last_attempt == 0,
	      "KvReserve deadlines from the prompt length: %u %u %u", dec.last_deadline_ms,
	      dec.last_window_ms, dec.last_attempt);
	CHECK(pre.last_deadline_ms == 5005 && !pre.last_has_attempt, "prefill deadline %u, attempt %d",
	      pre.last_deadline_ms, pre.last_has_attempt);
	CHECK(dec.n_cancel == 0 && dec.n_release == 0, "a finished request sends no Cancel/KvRelease");
	req_destroy(r);

	/* cancel while decoding: Cancel goes to decode */
	dec.hold = true;
	memset(x, 0, sizeof(*x));
	r = mkreq(8, 10, 50, x);
	CHECK(sched_submit(s, r) == 0, "submit 2");
	run_while(not_ready, &dec, 3000);
	run_while(not_ended, x, 50);
	sched_cancel(r);
	run_while(not_cancelled, &dec, 3000);
	CHECK(x->end == REQ_STATE_CANCELLED && dec.n_cancel == 1, "Cancel sent once: %d", dec.n_cancel);
	req_destroy(r);

	/* decode refuses the reservation (its pool is tighter than the router thought): the request
	 * waits in the queue until the next heartbeat and then gets its blocks */
	dec.hold = false;
	dec.n_refuse = 1;
	memset(x, 0, sizeof(*x));
	int reserves_before = dec.n_reserve;
	r = mkreq(10, 10, 5, x);
	CHECK(sched_submit(s, r) == 0, "submit refused-then-ok");
	run_while(not_ended, x, 5000);
	CHECK(x->end == REQ_STATE_DONE && x->n_tokens == 5, "done after a NO_CAPACITY refusal: %s %s",
	      req_state_name(x->end), x->msg);
	CHECK(dec.n_reserve == reserves_before + 2, "asked twice: %d", dec.n_reserve - reserves_before);
	CHECK(dec.n_release == 0, "no KvRelease for a refused reservation");
	req_destroy(r);
	dec.hold = true;

	/* decode connection drops mid-stream: the request fails with 502 */
	memset(x, 0, sizeof(*x));
	int ready_before = dec.n_ready;
	r = mkreq(9, 10, 50, x);
	CHECK(sched_submit(s, r) == 0, "submit 3");
	uint64_t t0 = uv_hrtime();
	while (dec.n_ready == ready_before && uv_hrtime() - t0 < 3000000000ull)
		uv_run(&loop, UV_RUN_ONCE);
	conn_close(dec.c, "test drops the decode worker");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_FAILED && x->status == 502, "failed with 502: %s %d %s",
	      req_state_name(x->end), x->status, x->msg);
	CHECK(!sched_is_ready(s), "no decode worker left");
	req_destroy(r);

	/* per-attempt fences: prefill-0 leaves; decode-f (fence_attempts) and prefill-h (holds every
	 * request) register; a request is reserved and sent to prefill-h with attempt 0; prefill-r
	 * registers and prefill-h is lost: decode-f gets attempt 1 announced, prefill-r attempt 1 */
	conn_close(pre.c, "test: prefill-0 leaves");
	struct fake decf = {.name = "decode-f",
	                    .role = MSG_ROLE_DECODE,
	                    .block_size = 16,
	                    .token = "sesame",
	                    .n_gen = 3,
	                    .fence_attempts = true};
	struct fake preh = {.name = "prefill-h",
	                    .role = MSG_ROLE_PREFILL,
	                    .block_size = 16,
	                    .token = "sesame",
	                    .hold_prefill = true};
	struct fake prer = {
	    .name = "prefill-r", .role = MSG_ROLE_PREFILL, .block_size = 16, .token = "sesame"};
	fake_start(&decf, port);
	fake_start(&preh, port);
	run_while(not_acked, &decf, 3000);
	run_while(not_acked, &preh, 3000);
	memset(x, 0, sizeof(*x));
	r = mkreq(11, 40, 3, x);
	CHECK(sched_submit(s, r) == 0, "submit 4");
	t0 = uv_hrtime();
	while (preh.n_prefill == 0 && uv_hrtime() - t0 < 3000000000ull)
		uv_run(&loop, UV_RUN_ONCE);
	CHECK(decf.n_reserve == 1 && decf.last_attempt == 0 && decf.last_window_ms == 5010,
	      "reservation for attempt 0 with a 5010 ms window: %d %u %u", decf.n_reserve, decf.last_attempt,
	      decf.last_window_ms);
	CHECK(preh.n_prefill == 1 && preh.last_has_attempt && preh.last_attempt == 0 &&
	          preh.last_deadline_ms == 5010,
	      "attempt 0 sent: %d %d %u %u", preh.n_prefill, preh.last_has_attempt, preh.last_attempt,
	      preh.last_deadline_ms);
	fake_start(&prer, port);
	run_while(not_acked, &prer, 3000);
	conn_close(preh.c, "test: prefill-h is lost");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_DONE && x->n_tokens == 3, "re-prefilled request done: %s %s",
	      req_state_name(x->end), x->msg);
	CHECK(decf.n_announce == 1 && decf.last_attempt == 1 && decf.n_reserve == 1,
	      "attempt 1 announced to decode once, no second reservation: %d %u %d", decf.n_announce,
	      decf.last_attempt, decf.n_reserve);
	CHECK(prer.n_prefill == 1 && prer.last_has_attempt && prer.last_attempt == 1 &&
	          prer.last_rid == preh.last_rid,
	      "attempt 1 of the same rid on the other prefill worker: %d %d %u", prer.n_prefill,
	      prer.last_has_attempt, prer.last_attempt);
	req_destroy(r);

	/* decode-f is lost before decoding (its prefill, prefill-h2, holds): the request is placed
	 * again on decode-f2 under a new rid whose reservation is made for attempt 1 already, so no
	 * announcement follows (an equal attempt would be a duplicate reservation), and prefill-h2
	 * gets attempt 1 */
	conn_close(prer.c, "test: prefill-r leaves");
	struct fake preh2 = {.name = "prefill-h2",
	                     .role = MSG_ROLE_PREFILL,
	                     .block_size = 16,
	                     .token = "sesame",
	                     .hold_prefill = true};
	struct fake decf2 = {.name = "decode-f2",
	                     .role = MSG_ROLE_DECODE,
	                     .block_size = 16,
	                     .token = "sesame",
	                     .n_gen = 3,
	                     .fence_attempts = true};
	fake_start(&preh2, port);
	run_while(not_acked, &preh2, 3000);
	memset(x, 0, sizeof(*x));
	r = mkreq(12, 40, 3, x);
	CHECK(sched_submit(s, r) == 0, "submit 5");
	t0 = uv_hrtime();
	while (preh2.n_prefill == 0 && uv_hrtime() - t0 < 3000000000ull)
		uv_run(&loop, UV_RUN_ONCE);
	CHECK(preh2.n_prefill == 1 && preh2.last_attempt == 0, "attempt 0 on prefill-h2");
	fake_start(&decf2, port);
	run_while(not_acked, &decf2, 3000);
	preh2.hold_prefill = false;
	conn_close(decf.c, "test: decode-f is lost before decoding");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_DONE && x->n_tokens == 3, "placed again and done: %s %s",
	      req_state_name(x->end), x->msg);
	CHECK(decf2.n_reserve == 1 && decf2.n_announce == 0 && decf2.last_attempt == 1,
	      "reservation made for attempt 1, nothing announced: %d %d %u", decf2.n_reserve,
	      decf2.n_announce, decf2.last_attempt);
	CHECK(decf2.error_code == 0, "decode-f2 got no error");
	CHECK(preh2.n_prefill == 2 && preh2.last_has_attempt && preh2.last_attempt == 1,
	      "attempt 1 on prefill-h2: %d %u", preh2.n_prefill, preh2.last_attempt);
	req_destroy(r);
	free(x);

	char *text = NULL;
	size_t text_len = 0;
	CHECK(metrics_render(m, &text, &text_len) == 0, "render");
	CHECK(text && strstr(text, "tandem_router_kv_transferred_bytes_total 24576\n"),
	      "kv bytes from PrefillDone (6 of 4096)");
	CHECK(text && strstr(text, "tandem_router_worker_registrations_refused_total 1\n"),
	      "one layout refusal");
	free(text);

	/* prefill-h2's KV push to the chosen decode worker fails (as when that worker is being killed
	 * and its control connection has not closed yet): nothing reached the client, so the request
	 * is placed again, on the OTHER decode worker (the failed one is avoided for a while), and
	 * completes; the first worker's reservation is released. Failing more often than
	 * n_prefill_tries_max allows ends the request with the transfer error. */
	struct fake decg = {
	    .name = "decode-g", .role = MSG_ROLE_DECODE, .block_size = 16, .token = "sesame", .n_gen = 3};
	fake_start(&decg, port);
	run_while(not_acked, &decg, 3000);
	x = calloc(1, sizeof(*x));
	CHECK(x != NULL, "alloc");
	int f2_res = decf2.n_reserve, f2_rel = decf2.n_release, g_res = decg.n_reserve;
	preh2.n_fail_transfer = 1;
	r = mkreq(13, 40, 3, x);
	CHECK(sched_submit(s, r) == 0, "submit 6");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_DONE && x->n_tokens == 3, "placed again after a failed KV push: %s %d %s",
	      req_state_name(x->end), x->status, x->msg);
	const int f2_new = decf2.n_reserve - f2_res, g_new = decg.n_reserve - g_res;
	CHECK(f2_new == 1 && g_new == 1, "one reservation on each decode worker: %d %d", f2_new, g_new);
	CHECK(decf2.n_release + decg.n_release - f2_rel == 1, "the broken attempt's reservation released");
	req_destroy(r);
	memset(x, 0, sizeof(*x));
	preh2.n_fail_transfer = 5;
	r = mkreq(14, 40, 3, x);
	CHECK(sched_submit(s, r) == 0, "submit 7");
	run_while(not_ended, x, 3000);
	CHECK(x->end == REQ_STATE_FAILED && x->status == 502 && strstr(x->msg, "KV transfer failed"),
	      "failed with the transfer error once the tries are spent: %s %d %s", req_state_name(x->end),
	      x->status, x->msg);
	preh2.n_fail_transfer = 0;
	req_destroy(r);
	free(x);
	if (decg.c)
		conn_close(decg.c, "test done");

	if (pre.c)
		conn_close(pre.c, "test done");
	if (decf2.c)
		conn_close(decf2.c, "test done");
	if (preh2.c)
		conn_close(preh2.c, "test done");
	uv_close((uv_handle_t *)&hb, NULL);
	workers_destroy(ws);
	sched_destroy(s);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
	metrics_destroy(m);
	printf("test_router_workers: %s (%d failures)\n", n_fail ? "FAIL" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
