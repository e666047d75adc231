/* The worker life cycle shared by tandem-prefill and tandem-decode (common/net/wlife.h), without
 * a router: a drain with work in flight waits, stops the role exactly once when it becomes idle,
 * or at the drain deadline (the shorter of the router's and the worker's); an idle worker stops at
 * once; a second drain or stop does nothing; a worker without a session is never ready; the
 * registered gauge is there from the start (0). The wiring with a real router (registration,
 * the ready file, Drain from the router, heartbeats saying draining) is in test_net_workers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/base/log.h"
#include "common/net/metrics.h"
#include "common/net/wlife.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

struct role {
	unsigned in_flight;
	int n_stops;
	uint64_t t_stop_ns;
	bool healthy;
};

static bool is_idle(void *ud)
{
	return ((struct role *)ud)->in_flight == 0;
}

static bool is_healthy(void *ud)
{
	return ((struct role *)ud)->healthy;
}

static void describe(void *ud, char *buf, size_t n)
{
	snprintf(buf, n, "%u test requests", ((struct role *)ud)->in_flight);
}

static void stop_cb(void *ud)
{
	struct role *r = ud;
	r->n_stops++;
	r->t_stop_ns = uv_hrtime();
}

static void run_ms(uv_loop_t *loop, unsigned ms)
{
	uint64_t t0 = uv_hrtime();
	while (uv_hrtime() - t0 < (uint64_t)ms * 1000000u)
		uv_run(loop, UV_RUN_NOWAIT);
}

static void setup(struct wlife *l, struct role *r, uv_loop_t *loop, struct metrics *reg, uint32_t drain_ms)
{
	memset(r, 0, sizeof(*r));
	struct wlife_cbs cbs = {.is_idle_cb = is_idle,
	                        .is_healthy_cb = is_healthy,
	                        .describe_cb = describe,
	                        .stop_cb = stop_cb,
	                        .ud = r};
	wlife_init(l, "test", "w0", "", drain_ms, "failing them", reg, &cbs);
	wlife_start(l, loop, NULL);
}

int main(void)
{
	log_init("test", -1);
	uv_loop_t loop;
	uv_loop_init(&loop);
	struct metrics *reg = metrics_create("role=\"test\"");
	struct wlife l;
	struct role r;

	/* the gauge exists from the start, at 0; no session: not ready; health is the role's */
	setup(&l, &r, &loop, reg, 10000);
	char *text = NULL;
	size_t len = 0;
	CHECK(metrics_render(reg, &text, &len) == 0 && text &&
	      strstr(text, "tandem_worker_registered{role=\"test\"} 0\n"));
	free(text);
	CHECK(!wlife_is_ready(&l) && !wlife_is_ready_cb(&l));
	r.healthy = true;
	CHECK(wlife_is_healthy_cb(&l));
	r.healthy = false;
	CHECK(!wlife_is_healthy_cb(&l));

	/* drain with work in flight: waits; becomes idle: stops once */
	r.in_flight = 2;
	wlife_start_drain(&l, 0);
	CHECK(l.draining && !l.stopping && r.n_stops == 0);
	run_ms(&loop, 50);
	CHECK(r.n_stops == 0);
	r.in_flight = 0;
	wlife_maybe_finish_drain(&l);
	CHECK(l.stopping && r.n_stops == 1);
	wlife_maybe_finish_drain(&l);
	wlife_start_drain(&l, 0);
	wlife_stop(&l);
	CHECK(r.n_stops == 1);
	run_ms(&loop, 20); /* the drain timer closes */

	/* the router's deadline (80 ms) is shorter than ours (10 s): stop after it, not before */
	setup(&l, &r, &loop, reg, 10000);
	r.in_flight = 1;
	uint64_t t0 = uv_hrtime();
	wlife_start_drain(&l, 80);
	run_ms(&loop, 40);
	CHECK(r.n_stops == 0);
	run_ms(&loop, 1100);
	double after_ms = (double)(r.t_stop_ns - t0) / 1e6;
	printf("router's drain deadline 80 ms: stopped after %.1f ms\n", after_ms);
	CHECK(r.n_stops == 1 && after_ms >= 60 && after_ms < 1000); /* loop time is cached: a little early */

	/* ours (60 ms) is shorter than the router's (10 s) */
	setup(&l, &r, &loop, reg, 60);
	r.in_flight = 1;
	t0 = uv_hrtime();
	wlife_start_drain(&l, 10000);
	run_ms(&loop, 1100);
	after_ms = (double)(r.t_stop_ns - t0) / 1e6;
	printf("worker's drain deadline 60 ms: stopped after %.1f ms\n", after_ms);
	CHECK(r.n_stops == 1 && after_ms >= 45 && after_ms < 1000);

	/* idle when the drain starts (SIGTERM through the runtime callback): stops at once */
	setup(&l, &r, &loop, reg, 10000);
	wlife_on_signal_cb(&l, 15);
	CHECK(l.draining && r.n_stops == 1);
	run_ms(&loop, 20);

	metrics_destroy(reg);
	uv_run(&loop, UV_RUN_DEFAULT);
	CHECK(uv_loop_close(&loop) == 0);
	if (n_fail) {
		fprintf(stderr, "test_net_wlife: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_wlife: all checks passed\n");
	return 0;
}
