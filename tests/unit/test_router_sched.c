/* Scheduler + request state machine (router/sched.c, req.c) against the simulated workers
 * (router/engine_sim.c) on a real libuv loop: registration refusals name the difference, greedy
 * tokens arrive in order and match the simulator's independent formula, blocks are returned
 * exactly once on completion, cancel, worker loss and deadline expiry, the admission queue is
 * bounded, a lost prefill worker's request is re-prefilled elsewhere and a lost decode worker
 * fails only its own requests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/metrics.h"
#include "router/engine_sim.h"
#include "router/sched.h"

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

struct rec {
	int32_t tokens[4096];
	int n_tokens;
	int n_ends;
	enum req_state end;
	enum req_finish finish;
	int status;
	char msg[256];
	int cancel_after; /* cancel from inside the token callback after this many tokens (0: never) */
	struct engine_sim *kill_es; /* kill this engine's decode 0 after kill_after tokens */
	int kill_after;
};

static void on_token(void *ud, struct req *r, const struct req_token *t)
{
	struct rec *x = ud;
	if (x->n_tokens < 4096)
		x->tokens[x->n_tokens++] = t->id;
	if (x->cancel_after && x->n_tokens == x->cancel_after)
		sched_cancel(r);
	if (x->kill_es && x->n_tokens == x->kill_after) {
		int rc = engine_sim_kill(x->kill_es, WORKER_ROLE_DECODE, 0);
		CHECK(rc == 0, "kill decode 0");
	}
}

static void on_end(void *ud, struct req *r, enum req_state st, enum req_finish fin, int status,
                   const char *msg)
{
	struct rec *x = ud;
	(void)r;
	x->n_ends++;
	x->end = st;
	x->finish = fin;
	x->status = status;
	snprintf(x->msg, sizeof(x->msg), "%s", msg ? msg : "");
}

static const struct req_sink sink = {on_token, on_end};

static struct sched_config sched_cfg(void)
{
	struct sched_config c = {
	    .n_queue_max = 8,
	    .queue_timeout_ms = 5000,
	    .reserve_timeout_ms = 5000,
	    .prefill_timeout_ms = 5000,
	    .transfer_timeout_ms = 5000,
	    .token_timeout_ms = 5000,
	    .n_prefill_tries_max = 3,
	    .retry_after_s = 2,
	};
	return c;
}

static struct req *mkreq(uv_loop_t *loop, uint64_t id, uint32_t n_prompt, uint32_t n_new, struct rec *x)
{
	int32_t *p = malloc(n_prompt * sizeof(int32_t));
	for (uint32_t i = 0; i < n_prompt; i++)
		p[i] = (int32_t)('a' + (i * 7 + id) % 26);
	struct req_sampling s = {0};
	return req_create(loop, id, p, n_prompt, n_new, 4096, &s, &sink, x);
}

static void run_until(uv_loop_t *loop, struct rec **recs, int n)
{
	uint64_t t0 = uv_hrtime();
	for (;;) {
		bool all = true;
		for (int i = 0; i < n; i++)
			all &= recs[i]->n_ends > 0;
		if (all || uv_hrtime() - t0 > 10ull * 1000000000ull)
			break;
		uv_run(loop, UV_RUN_ONCE);
	}
}

static void spin(uv_loop_t *loop, int ms)
{
	uint64_t t0 = uv_hrtime();
	while (uv_hrtime() - t0 < (uint64_t)ms * 1000000ull)
		uv_run(loop, UV_RUN_NOWAIT);
}

static uint32_t blocks_free(struct sched *s)
{
	uint32_t n = 0;
	for (struct worker *w = sched_workers(s); w; w = w->next)
		if (w->role == WORKER_ROLE_DECODE)
			n += w->n_blocks_free;
	return n;
}

static void teardown(uv_loop_t *loop, struct engine_sim *es, struct sched *s, struct metrics *m)
{
	engine_sim_destroy(es);
	sched_destroy(s);
	uv_run(loop, UV_RUN_DEFAULT);
	metrics_destroy(m);
}

static void test_registration(void)
{
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct sched *s;
	struct errbuf e = {0};
	struct sched_config c = sched_cfg();
	CHECK(sched_create(&s, &loop, &c, NULL, &e) == 0, "create");
	struct worker a = {.role = WORKER_ROLE_DECODE,
	                   .name = "decode-a",
	                   .model_id = "m1",
	                   .layout = {.arch = "glm-dsa",
	                              .n_layers = 4,
	                              .block_size = 64,
	                              .kv_lora_rank = 512,
	                              .rope_dim = 64,
	                              .indexer_dim = 128,
	                              .n_indexer_layers = 4,
	                              .dtype = "bf16"}};
	struct worker b = a, c2 = a, d = a, f = a;
	snprintf(b.name, sizeof(b.name), "prefill-b");
	b.role = WORKER_ROLE_PREFILL;
	b.layout.block_size = 32;
	snprintf(c2.name, sizeof(c2.name), "prefill-c");
	c2.role = WORKER_ROLE_PREFILL;
	snprintf(c2.model_id, sizeof(c2.model_id), "m2");
	snprintf(d.name, sizeof(d.name), "prefill-d");
	d.role = WORKER_ROLE_PREFILL;
	snprintf(d.layout.dtype, sizeof(d.layout.dtype), "f32");
	snprintf(f.name, sizeof(f.name), "prefill-f");
	f.role = WORKER_ROLE_PREFILL;
	CHECK(sched_worker_add(s, &a, &e) == 0, "first worker: %s", e.msg);
	CHECK(!sched_is_ready(s), "not ready with decode only");
	CHECK(sched_worker_add(s, &b, &e) == ERR_MISMATCH, "block size mismatch refused");
	CHECK(strstr(e.msg, "block_size is 32 on prefill-b but 64 on decode-a") != NULL, "message: %s",
	      e.msg);
	CHECK(sched_worker_add(s, &c2, &e) == ERR_MISMATCH, "model mismatch refused");
	CHECK(strstr(e.msg, "model identity m2 differs from decode-a's m1") != NULL, "message: %s", e.msg);
	CHECK(sched_worker_add(s, &d, &e) == ERR_MISMATCH, "dtype mismatch refused");
	CHECK(strstr(e.msg, "dtype is f32 on prefill-d but bf16 on decode-a") != NULL, "message: %s", e.msg);
	CHECK(sched_worker_add(s, &f, &e) == 0, "matching worker accepted: %s", e.msg);
	CHECK(sched_is_ready(s), "ready");
	sched_destroy(s);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
}

static void test_greedy_and_blocks(void)
{
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct metrics *m = metrics_create(NULL);
	struct sched *s;
	struct engine_sim *es;
	struct errbuf e = {0};
	struct sched_config c = sched_cfg();
	struct sim_config sc = {.n_prefill = 1,
	                        .n_decode = 1,
	                        .n_blocks = 10,
	                        .block_size = 16,
	                        .step_ms = 1,
	                        .prefill_us_per_token = 10,
	                        .transfer_ms = 1,
	                        .model_id = "sim"};
	CHECK(sched_create(&s, &loop, &c, m, &e) == 0 && engine_sim_create(&es, &loop, s, &sc, &e) == 0,
	      "setup");
	struct rec *x = calloc(1, sizeof(*x));
	struct req *r = mkreq(&loop, 1, 20, 12, x);
	CHECK(sched_submit(s, r) == 0, "submit");
	CHECK(blocks_free(s) == 8, "2 blocks reserved for 32 tokens at submit: %u free", blocks_free(s));
	run_until(&loop, &x, 1);
	CHECK(x->n_ends == 1 && x->end == REQ_STATE_DONE && x->finish == REQ_FINISH_LENGTH,
	      "done: ends=%d state=%s", x->n_ends, req_state_name(x->end));
	CHECK(x->n_tokens == 12, "12 tokens: %d", x->n_tokens);
	uint64_t h = engine_sim_prompt_hash(r->prompt, r->n_prompt);
	for (int i = 0; i < x->n_tokens; i++)
		CHECK(x->tokens[i] == engine_sim_greedy_token(h, (uint32_t)i), "token %d", i);
	CHECK(blocks_free(s) == 10, "blocks returned: %u", blocks_free(s));
	CHECK(engine_sim_n_held(es) == 0, "workers hold nothing: %u", engine_sim_n_held(es));
	CHECK(sched_n_active(s) == 0, "no active requests");
	char *text = NULL;
	size_t text_len = 0;
	CHECK(metrics_render(m, &text, &text_len) == 0, "render");
	CHECK(text && strstr(text, "tandem_router_requests_total{outcome=\"done\"} 1\n"), "done counter");
	CHECK(text && strstr(text, "tandem_router_generated_tokens_total 12\n"), "generated tokens counter");
	CHECK(text && strstr(text, "tandem_router_prompt_tokens_total 20\n"), "prompt tokens counter");
	CHECK(text && strstr(text, "tandem_router_ttft_seconds_count 1\n"), "ttft observed once");
	CHECK(text && strstr(text, "tandem_router_inter_token_seconds_count 11\n"), "11 inter-token gaps");
	CHECK(text && strstr(text, "tandem_router_kv_blocks_used 0\n"), "blocks used gauge back to 0");
	free(text);
	req_destroy(r);
	free(x);
	teardown(&loop, es, s, m);
	uv_loop_close(&loop);
}

static void test_cancel_queue_and_fit(void)
{
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct metrics *m = metrics_create(NULL);
	struct sched *s;
	struct engine_sim *es;
	struct errbuf e = {0};
	struct sched_config c = sched_cfg();
	c.n_queue_max = 2;
	struct sim_config sc = {.n_prefill = 1,
	                        .n_decode = 1,
	                        .n_blocks = 4,
	                        .block_size = 16,
	                        .step_ms = 2,
	                        .prefill_us_per_token = 10,
	                        .transfer_ms = 1,
	                        .model_id = "sim"};
	CHECK(sched_create(&s, &loop, &c, m, &e) == 0 && engine_sim_create(&es, &loop, s, &sc, &e) == 0,
	      "setup");

	/* r1 takes all 4 blocks (64 tokens); r2, r3 wait in the queue; r4 is refused */
	struct rec *x[5];
	struct req *r[5];
	for (int i = 0; i < 5; i++) {
		x[i] = calloc(1, sizeof(struct rec));
		r[i] = mkreq(&loop, (uint64_t)i + 10, 16, 48, x[i]);
	}
	x[0]->cancel_after = 5;
	CHECK(sched_submit(s, r[0]) == 0, "r1");
	CHECK(sched_submit(s, r[1]) == 0, "r2");
	CHECK(sched_submit(s, r[2]) == 0, "r3");
	CHECK(sched_n_queued(s) == 2, "two queued: %u", sched_n_queued(s));
	CHECK(sched_submit(s, r[3]) == ERR_LIMIT, "queue full -> ERR_LIMIT (429)");
	CHECK(sched_retry_after(s) == 2, "retry after");
	run_until(&loop, x, 3);
	CHECK(x[0]->end == REQ_STATE_CANCELLED && x[0]->n_ends == 1 && x[0]->n_tokens == 5,
	      "r1 cancelled once after 5 tokens");
	CHECK(x[1]->end == REQ_STATE_DONE && x[1]->n_tokens == 48, "r2 done after r1 freed its blocks");
	CHECK(x[2]->end == REQ_STATE_DONE && x[2]->n_tokens == 48, "r3 done");
	CHECK(blocks_free(s) == 4 && engine_sim_n_held(es) == 0, "all blocks back: %u, held %u",
	      blocks_free(s), engine_sim_n_held(es));

	/* a request larger than any decode worker's pool fails with 400 instead of waiting forever */
	struct rec *big = calloc(1, sizeof(*big));
	struct req *rb = mkreq(&loop, 99, 100, 100, big);
	CHECK(sched_submit(s, rb) == 0, "big submit");
	run_until(&loop, &big, 1);
	CHECK(big->end == REQ_STATE_FAILED && big->status == 400, "too big: %s %d %s",
	      req_state_name(big->end), big->status, big->msg);
	req_destroy(rb);
	free(big);

	/* cancel while queued and while the prefill runs */
	sc.prefill_us_per_token = 0;
	struct rec *q = calloc(1, sizeof(*q));
	struct req *rq = mkreq(&loop, 50, 16, 8, q);
	CHECK(sched_submit(s, rq) == 0, "submit");
	sched_cancel(rq);
	sched_cancel(rq);
	CHECK(q->n_ends == 1 && q->end == REQ_STATE_CANCELLED, "cancel right after submit, once");
	spin(&loop, 20);
	CHECK(blocks_free(s) == 4 && engine_sim_n_held(es) == 0, "nothing held after early cancel");
	req_destroy(rq);
	free(q);

	for (int i = 0; i < 5; i++) {
		req_destroy(r[i]);
		free(x[i]);
	}
	teardown(&loop, es, s, m);
	uv_loop_close(&loop);
}

static void test_worker_loss(void)
{
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct metrics *m = metrics_create(NULL);
	struct sched *s;
	struct engine_sim *es;
	struct errbuf e = {0};
	struct sched_config c = sched_cfg();
	/* slow prefill (200 us/token x 100 tokens = 20 ms) so it can be killed mid-way */
	struct sim_config sc = {.n_prefill = 2,
	                        .n_decode = 2,
	                        .n_blocks = 64,
	                        .block_size = 16,
	                        .step_ms = 2,
	                        .prefill_us_per_token = 200,
	                        .transfer_ms = 1,
	                        .model_id = "sim"};
	CHECK(sched_create(&s, &loop, &c, m, &e) == 0 && engine_sim_create(&es, &loop, s, &sc, &e) == 0,
	      "setup");

	struct rec *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	struct req *ra = mkreq(&loop, 1, 100, 20, a);
	CHECK(sched_submit(s, ra) == 0, "submit a");
	spin(&loop, 5);
	CHECK(ra->state == REQ_STATE_PREFILLING && ra->prefill, "a prefilling");
	int victim = strcmp(ra->prefill->name, "sim-prefill-0") == 0 ? 0 : 1;
	CHECK(engine_sim_kill(es, WORKER_ROLE_PREFILL, victim) == 0, "kill prefill");
	CHECK(ra->state == REQ_STATE_PREFILLING && ra->prefill && ra->n_prefill_tries == 2,
	      "re-prefilled on the other worker: %s tries %d", req_state_name(ra->state),
	      ra->n_prefill_tries);
	run_until(&loop, &a, 1);
	CHECK(a->end == REQ_STATE_DONE && a->n_tokens == 20, "a completes after re-prefill: %s %d",
	      req_state_name(a->end), a->n_tokens);
	uint64_t h = engine_sim_prompt_hash(ra->prompt, ra->n_prompt);
	bool same = true;
	for (int i = 0; i < a->n_tokens; i++)
		same &= a->tokens[i] == engine_sim_greedy_token(h, (uint32_t)i);
	CHECK(same, "re-prefilled output is the greedy sequence");

	/* the decode worker dies while the prompt is still being prefilled: nothing reached the client,
	 * so the request is placed again (on the other decode worker) and completes */
	struct rec *pd = calloc(1, sizeof(*pd));
	struct req *rpd = mkreq(&loop, 4, 100, 10, pd);
	CHECK(sched_submit(s, rpd) == 0, "submit");
	spin(&loop, 5);
	CHECK(rpd->state == REQ_STATE_PREFILLING && rpd->decode, "prefilling: %s",
	      req_state_name(rpd->state));
	int dvictim = strcmp(rpd->decode->name, "sim-decode-0") == 0 ? 0 : 1;
	CHECK(engine_sim_kill(es, WORKER_ROLE_DECODE, dvictim) == 0, "kill decode");
	CHECK(rpd->state == REQ_STATE_ADMITTED && !rpd->prefill, "back to ADMITTED, prefill dropped: %s",
	      req_state_name(rpd->state));
	spin(&loop, 5);
	CHECK(rpd->state != REQ_STATE_ADMITTED && rpd->decode && rpd->n_prefill_tries == 2 &&
	          strcmp(rpd->decode->name, dvictim ? "sim-decode-0" : "sim-decode-1") == 0,
	      "placed again on the other decode worker: %s, tries %d", req_state_name(rpd->state),
	      rpd->n_prefill_tries);
	run_until(&loop, &pd, 1);
	CHECK(pd->end == REQ_STATE_DONE && pd->n_tokens == 10, "completes after the decode loss: %s %d",
	      req_state_name(pd->end), pd->n_tokens);
	CHECK(engine_sim_n_held(es) == 0, "nothing held");
	req_destroy(rpd);
	free(pd);
	/* a fresh pair of decode workers for the mid-stream case */
	teardown(&loop, es, s, m);
	m = metrics_create(NULL);
	CHECK(sched_create(&s, &loop, &c, m, &e) == 0 && engine_sim_create(&es, &loop, s, &sc, &e) == 0,
	      "setup 2");

	/* two requests on the two decode workers; decode 0 dies mid-stream */
	struct rec *c1 = calloc(1, sizeof(*c1)), *c2 = calloc(1, sizeof(*c2));
	sc.prefill_us_per_token = 1;
	struct req *r1 = mkreq(&loop, 2, 10, 200, c1);
	struct req *r2 = mkreq(&loop, 3, 10, 200, c2);
	CHECK(sched_submit(s, r1) == 0 && sched_submit(s, r2) == 0, "submit");
	CHECK(r1->decode && r2->decode && r1->decode != r2->decode, "spread over both decode workers");
	struct rec *on0 = strcmp(r1->decode->name, "sim-decode-0") == 0 ? c1 : c2;
	struct rec *on1 = on0 == c1 ? c2 : c1;
	on0->kill_es = es;
	on0->kill_after = 10;
	struct rec *both[2] = {c1, c2};
	run_until(&loop, both, 2);
	CHECK(on0->end == REQ_STATE_FAILED && on0->status == 502 && on0->n_tokens == 10,
	      "request on the dead decode worker fails: %s %d tokens=%d (%s)", req_state_name(on0->end),
	      on0->status, on0->n_tokens, on0->msg);
	CHECK(on1->end == REQ_STATE_DONE && on1->n_tokens == 200, "the other completes: %s %d",
	      req_state_name(on1->end), on1->n_tokens);
	CHECK(engine_sim_n_held(es) == 0, "nothing held");
	char *text = NULL;
	size_t text_len = 0;
	CHECK(metrics_render(m, &text, &text_len) == 0, "render");
	CHECK(text && strstr(text, "tandem_router_prefill_retries_total 0\n"),
	      "no re-placement in the mid-stream case");
	CHECK(text && strstr(text, "tandem_router_workers{role=\"decode\"} 1\n"), "one decode worker left");
	free(text);

	req_destroy(ra);
	req_destroy(r1);
	req_destroy(r2);
	free(a);
	free(b);
	free(c1);
	free(c2);
	teardown(&loop, es, s, m);
	uv_loop_close(&loop);
}

static void test_deadline(void)
{
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct sched *s;
	struct engine_sim *es;
	struct errbuf e = {0};
	struct sched_config c = sched_cfg();
	c.token_timeout_ms = 30;
	struct sim_config sc = {.n_prefill = 1,
	                        .n_decode = 1,
	                        .n_blocks = 8,
	                        .block_size = 16,
	                        .step_ms = 200,
	                        .prefill_us_per_token = 1,
	                        .transfer_ms = 1,
	                        .model_id = "sim"};
	CHECK(sched_create(&s, &loop, &c, NULL, &e) == 0 && engine_sim_create(&es, &loop, s, &sc, &e) == 0,
	      "setup");
	struct rec *x = calloc(1, sizeof(*x));
	struct req *r = mkreq(&loop, 1, 10, 5, x);
	CHECK(sched_submit(s, r) == 0, "submit");
	run_until(&loop, &x, 1);
	CHECK(x->end == REQ_STATE_FAILED && x->status == 504 && strstr(x->msg, "DECODING"),
	      "stalled decode fails with 504 naming the state: %s %d %s", req_state_name(x->end), x->status,
	      x->msg);
	CHECK(blocks_free(s) == 8 && engine_sim_n_held(es) == 0, "blocks back after the deadline");
	req_destroy(r);
	free(x);
	teardown(&loop, es, s, NULL);
	uv_loop_close(&loop);
}

/* The prefill deadline grows with the prompt: base + n * us_per_token / 1000, capped, never
 * wrapping; a 100-token prompt whose (simulated) prefill takes 200 ms fails a fixed 100 ms
 * deadline in PREFILLING and completes with a 2 ms-per-token budget (300 ms). */
static void test_prefill_deadline(void)
{
	CHECK(sched_prefill_timeout_ms(120000, 0, 100000) == 120000, "no per-token budget");
	CHECK(sched_prefill_timeout_ms(120000, 1000, 0) == 120000, "empty prompt");
	CHECK(sched_prefill_timeout_ms(120000, 1000, 100000) == 220000, "100k tokens at 1 ms");
	CHECK(sched_prefill_timeout_ms(500, 20000, 150) == 3500, "150 tokens at 20 ms");
	CHECK(sched_prefill_timeout_ms(0, 1, 999) == 0, "sub-ms total rounds down");
	CHECK(sched_prefill_timeout_ms(120000, UINT64_MAX, UINT32_MAX) == SCHED_PREFILL_TIMEOUT_MAX_MS,
	      "huge values are capped, not wrapped");
	CHECK(sched_prefill_timeout_ms(UINT64_MAX, 0, 1) == SCHED_PREFILL_TIMEOUT_MAX_MS, "huge base");
	CHECK(sched_prefill_timeout_ms(120000, 1000000, 1u << 20) == SCHED_PREFILL_TIMEOUT_MAX_MS,
	      "1 s per token for 1M tokens is over the cap");
	CHECK(SCHED_PREFILL_TIMEOUT_MAX_MS <= UINT32_MAX, "fits the protocol's u32 milliseconds");

	for (int budget = 0; budget < 2; budget++) {
		uv_loop_t loop;
		uv_loop_init(&loop);
		struct sched *s;
		struct engine_sim *es;
		struct errbuf e = {0};
		struct sched_config c = sched_cfg();
		c.prefill_timeout_ms = 100;
		c.prefill_us_per_token = budget ? 2000 : 0;
		struct sim_config sc = {.n_prefill = 1,
		                        .n_decode = 1,
		                        .n_blocks = 64,
		                        .block_size = 16,
		                        .step_ms = 1,
		                        .prefill_us_per_token = 2000,
		                        .transfer_ms = 1,
		                        .model_id = "sim"};
		CHECK(sched_create(&s, &loop, &c, NULL, &e) == 0 &&
		          engine_sim_create(&es, &loop, s, &sc, &e) == 0,
		      "setup");
		struct rec *x = calloc(1, sizeof(*x));
		struct req *r = mkreq(&loop, 1, 100, 4, x);
		CHECK(sched_submit(s, r) == 0, "submit");
		run_until(&loop, &x, 1);
		if (budget)
			CHECK(x->end == REQ_STATE_DONE && x->n_tokens == 4,
			      "200 ms prefill within 100 ms + 100 x 2 ms: %s %d %s", req_state_name(x->end),
			      x->status, x->msg);
		else
			CHECK(x->end == REQ_STATE_FAILED && x->status == 504 && strstr(x->msg, "PREFILLING"),
			      "200 ms prefill past a fixed 100 ms: %s %d %s", req_state_name(x->end),
			      x->status, x->msg);
		CHECK(blocks_free(s) == 64 && engine_sim_n_held(es) == 0, "blocks back");
		req_destroy(r);
		free(x);
		teardown(&loop, es, s, NULL);
		uv_loop_close(&loop);
	}
}

int main(void)
{
	test_registration();
	test_greedy_and_blocks();
	test_cancel_queue_and_fit();
	test_worker_loss();
	test_deadline();
	test_prefill_deadline();
	printf("test_router_sched: %s (%d failures)\n", n_fail ? "FAIL" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
