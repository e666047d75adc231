/* tandem-router: wires configuration, metrics, scheduler, codec, workers and the HTTP server onto
 * one libuv loop, tells systemd when it is ready (and pets its watchdog), and drains on SIGTERM:
 * stop accepting, let in-flight requests finish within drain_timeout_ms, exit 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <uv.h>

#include "common/base/log.h"
#include "common/net/metrics.h"
#include "router/auth.h"
#include "router/codec.h"
#include "router/config.h"
#include "router/engine_sim.h"
#include "router/router.h"
#include "router/workers.h"

struct app {
	struct router rt;
	uv_signal_t sigterm, sigint;
	uv_timer_t drain_timer, watchdog;
	uint64_t drain_started;
	bool watchdog_on;
	int exit_code;
};

static void close_walk_cb(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void drain_check_cb(uv_timer_t *t)
{
	struct app *a = t->data;
	struct router *rt = &a->rt;
	bool idle = rt->n_calls == 0 && sched_n_active(rt->sched) == 0;
	uint64_t waited_ms = (uv_now(rt->loop) - a->drain_started);
	if (!idle && waited_ms < rt->cfg.drain_timeout_ms)
		return;
	if (!idle)
		LOG_WARN("main", "drain timeout after %llu ms: %u request(s) still in flight are cut off",
		         (unsigned long long)waited_ms, sched_n_active(rt->sched));
	else
		LOG_INFO("main", "drained; exiting");
	uv_timer_stop(t);
	uv_stop(rt->loop);
}

static void signal_cb(uv_signal_t *s, int signum)
{
	struct app *a = s->data;
	struct router *rt = &a->rt;
	if (rt->draining) {
		LOG_WARN("main", "second signal %d: exiting now", signum);
		uv_stop(rt->loop);
		return;
	}
	LOG_INFO("main", "signal %d: draining (%u request(s) in flight, up to %llu ms)", signum,
	         sched_n_active(rt->sched), (unsigned long long)rt->cfg.drain_timeout_ms);
	sd_notify(0, "STOPPING=1");
	rt->draining = true;
	sched_set_draining(rt->sched);
	http_server_drain(rt->http);
	a->drain_started = uv_now(rt->loop);
	uv_timer_start(&a->drain_timer, drain_check_cb, 0, 50);
}

static void watchdog_cb(uv_timer_t *t)
{
	(void)t;
	sd_notify(0, "WATCHDOG=1");
}

static int read_token(const char *path, char *out, size_t cap, struct errbuf *e)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return errbuf_set(e, -errno, "control token file %s: %s", path, strerror(errno));
	if (!fgets(out, (int)cap, f))
		out[0] = '\0';
	fclose(f);
	out[strcspn(out, "\r\n")] = '\0';
	if (!out[0])
		return errbuf_set(e, ERR_FORMAT, "control token file %s is empty", path);
	return 0;
}

static int setup_model(struct router *rt, struct errbuf *e)
{
	if (strcmp(rt->cfg.engine, "sim") == 0 && rt->cfg.model_path[0] == '\0') {
		rt->codec = codec_create_bytes();
		if (!rt->codec)
			return errbuf_set(e, -ENOMEM, "out of memory");
		if (!rt->cfg.model_name[0])
			snprintf(rt->cfg.model_name, sizeof(rt->cfg.model_name), "sim");
		if (rt->cfg.n_ctx == 0)
			rt->cfg.n_ctx = 4096;
		return 0;
	}
	if (rt->cfg.model_path[0] == '\0')
		return errbuf_set(e, -EINVAL,
		                  "--model-path is required (the GGUF whose tokenizer and chat template "
		                  "the router uses), unless --engine sim");
	struct codec_model_info info;
	int rc = codec_create_gguf(&rt->codec, rt->cfg.model_path, rt->cfg.chat_format, &info, e);
	if (rc)
		return rc;
	if (!rt->cfg.model_name[0])
		snprintf(rt->cfg.model_name, sizeof(rt->cfg.model_name), "%s", info.name);
	if (rt->cfg.n_ctx == 0)
		rt->cfg.n_ctx = info.n_ctx ? info.n_ctx : 4096;
	LOG_INFO("main", "model %s: arch %s, context %u, vocabulary %u", rt->cfg.model_path, info.arch,
	         rt->cfg.n_ctx, codec_n_vocab(rt->codec));
	return 0;
}

int main(int argc, char **argv)
{
	static struct app a;
	struct router *rt = &a.rt;
	struct errbuf e = {0};
	log_init("router", -1);
	router_config_defaults(&rt->cfg);
	int rc = router_config_load(&rt->cfg, argc, argv, &e);
	if (rc == 1)
		return 0;
	if (rc) {
		fprintf(stderr, "tandem-router: %s\n", e.msg);
		return 2;
	}
	if (log_parse_level(rt->cfg.log_level) < 0) {
		fprintf(stderr, "tandem-router: log_level '%s' is not error, warn, info or debug\n",
		        rt->cfg.log_level);
		return 2;
	}
	if (!getenv("TANDEM_LOG"))
		log_level_max = log_parse_level(rt->cfg.log_level);
	signal(SIGPIPE, SIG_IGN);

	rt->loop = uv_default_loop();
	rt->created = (uint64_t)time(NULL);
	rt->metrics = metrics_create(NULL);
	if (!rt->metrics) {
		fprintf(stderr, "tandem-router: out of memory\n");
		return 1;
	}
	router_metrics_register(rt);
	if ((rc = setup_model(rt, &e)))
		goto fail;
	if (rt->cfg.api_keys_file[0] && (rc = auth_load(&rt->auth, rt->cfg.api_keys_file, &e)))
		goto fail;
	if ((rc = sched_create(&rt->sched, rt->loop, &rt->cfg.sched, rt->metrics, &e)))
		goto fail;
	keepalive_init(&rt->keepalive, rt->loop, rt->cfg.sse_keepalive_ms);
	if (strcmp(rt->cfg.engine, "sim") == 0) {
		struct sim_config sc = {
		    .n_prefill = rt->cfg.sim_prefill,
		    .n_decode = rt->cfg.sim_decode,
		    .n_blocks = rt->cfg.sim_blocks,
		    .block_size = rt->cfg.sim_block_size,
		    .prefill_us_per_token = rt->cfg.sim_prefill_us_per_token,
		    .transfer_ms = rt->cfg.sim_transfer_ms,
		    .step_ms = rt->cfg.sim_step_ms,
		    .model_id = "sim",
		};
		if ((rc = engine_sim_create(&rt->sim, rt->loop, rt->sched, &sc, &e)))
			goto fail;
	} else if (strcmp(rt->cfg.engine, "workers") == 0) {
		char token[260] = "";
		if (rt->cfg.control_token_file[0] &&
		    (rc = read_token(rt->cfg.control_token_file, token, sizeof(token), &e)))
			goto fail;
		struct workers_config wc = {
		    .listen_addr = rt->cfg.control_addr,
		    .auth_token = token,
		    .heartbeat_ms = rt->cfg.heartbeat_ms,
		    .reserve_deadline_ms = rt->cfg.sched.queue_timeout_ms + rt->cfg.sched.prefill_timeout_ms,
		    .prefill_deadline_ms = rt->cfg.sched.prefill_timeout_ms,
		    .prefill_us_per_token = rt->cfg.sched.prefill_us_per_token,
		};
		if ((rc = workers_create(&rt->workers, rt->loop, rt->sched, &wc, rt->metrics, &e)))
			goto fail;
		LOG_INFO("main", "control plane listening on %s (port %d)%s", rt->cfg.control_addr,
		         workers_port(rt->workers), token[0] ? ", token required" : "");
	} else {
		rc = errbuf_set(&e, -EINVAL, "engine '%s' is not 'workers' or 'sim'", rt->cfg.engine);
		goto fail;
	}
	struct http_server_config hc = {
	    .host = rt->cfg.host,
	    .port = rt->cfg.port,
	    .n_conns_max = rt->cfg.n_conns_max,
	    .header_timeout_ms = rt->cfg.header_timeout_ms,
	    .idle_timeout_ms = rt->cfg.idle_timeout_ms,
	    .n_write_queue_bytes_max = rt->cfg.n_write_queue_bytes_max,
	    .limits = {.n_header_bytes_max = rt->cfg.n_header_bytes_max,
	               .n_body_bytes_max = rt->cfg.n_body_bytes_max,
	               .n_pending_bytes_max = 65536},
	};
	if ((rc = http_server_create(&rt->http, rt->loop, &hc, router_on_request, rt, &e)))
		goto fail;

	uv_signal_init(rt->loop, &a.sigterm);
	uv_signal_init(rt->loop, &a.sigint);
	a.sigterm.data = a.sigint.data = &a;
	uv_signal_start(&a.sigterm, signal_cb, SIGTERM);
	uv_signal_start(&a.sigint, signal_cb, SIGINT);
	uv_timer_init(rt->loop, &a.drain_timer);
	a.drain_timer.data = &a;
	uv_timer_init(rt->loop, &a.watchdog);
	uint64_t wd_usec = 0;
	if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
		uv_timer_start(&a.watchdog, watchdog_cb, wd_usec / 2000, wd_usec / 2000 ? wd_usec / 2000 : 1);
		a.watchdog_on = true;
	}
	LOG_INFO("main", "listening on http://%s:%d (model %s, engine %s, context %u, %s)", rt->cfg.host,
	         http_server_port(rt->http), rt->cfg.model_name, rt->cfg.engine, rt->cfg.n_ctx,
	         rt->auth ? "API keys required" : "no API keys");
	sd_notify(0, "READY=1\nSTATUS=serving");

	uv_run(rt->loop, UV_RUN_DEFAULT);
	/* we are exiting: a late SIGTERM (systemd or a script repeating it) must not turn a clean
	 * drain into death by signal while the handles close. Stopping the watchers first: libuv
	 * restores the default disposition when the last watcher of a signal stops. */
	uv_signal_stop(&a.sigterm);
	uv_signal_stop(&a.sigint);
	signal(SIGTERM, SIG_IGN);
	signal(SIGINT, SIG_IGN);

	/* shut down: close everything still open and let the close callbacks run */
	http_server_destroy(rt->http);
	engine_sim_destroy(rt->sim);
	workers_destroy(rt->workers);
	sched_destroy(rt->sched);
	keepalive_fini(&rt->keepalive);
	uv_walk(rt->loop, close_walk_cb, NULL);
	uv_run(rt->loop, UV_RUN_DEFAULT);
	uv_loop_close(rt->loop);
	codec_destroy(rt->codec);
	auth_destroy(rt->auth);
	metrics_destroy(rt->metrics);
	return 0;

fail:
	LOG_ERROR("main", "%s", e.msg);
	fprintf(stderr, "tandem-router: %s\n", e.msg);
	return 1;
}
