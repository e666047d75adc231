/* Worker process runtime (see runtime.h). */
#include "common/net/runtime.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "common/base/log.h"
#include "common/net/httpd.h"

struct runtime {
	struct runtime_opts o;
	struct httpd *http;
	uv_signal_t sigterm, sigint;
	uv_timer_t watchdog;
	int n_signals;
	int n_handles;
	bool watchdog_on;
	bool ready_sent;
};

static void http_cb(void *ud, const char *method, const char *path, struct httpd_response *resp)
{
	struct runtime *r = ud;
	if (!strcmp(path, "/metrics")) {
		char *text;
		size_t len;
		if (metrics_render(r->o.metrics, &text, &len)) {
			httpd_set_text(resp, 503, "out of memory\n");
			return;
		}
		resp->status = 200;
		resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
		resp->body = text;
		resp->len = len;
	} else if (!strcmp(path, "/health")) {
		bool ok = !r->o.is_healthy_cb || r->o.is_healthy_cb(r->o.ud);
		httpd_set_text(resp, ok ? 200 : 503, ok ? "ok\n" : "engine not responding\n");
	} else if (!strcmp(path, "/ready")) {
		bool ok = r->o.is_ready_cb && r->o.is_ready_cb(r->o.ud);
		httpd_set_text(resp, ok ? 200 : 503, ok ? "ready\n" : "not ready\n");
	} else {
		httpd_set_text(resp, 404, "not found (try /metrics, /health, /ready)\n");
	}
}

static void signal_cb(uv_signal_t *h, int signum)
{
	struct runtime *r = h->data;
	if (++r->n_signals > 1) {
		LOG_WARN("runtime", "second signal %d: exiting now without draining", signum);
		_exit(1);
	}
	LOG_INFO("runtime", "signal %d: draining (stop taking work, finish what is in flight)", signum);
	if (r->o.on_signal_cb)
		r->o.on_signal_cb(r->o.ud, signum);
}

static void watchdog_cb(uv_timer_t *t)
{
	struct runtime *r = t->data;
	if (!r->o.is_healthy_cb || r->o.is_healthy_cb(r->o.ud))
		sd_notify(0, "WATCHDOG=1");
	else
		LOG_WARN("runtime", "engine not healthy: withholding the systemd watchdog ping");
}

int runtime_start(uv_loop_t *loop, const struct runtime_opts *o, struct runtime **out, struct errbuf *e)
{
	struct runtime *r = calloc(1, sizeof(*r));
	if (!r)
		return errbuf_set(e, -ENOMEM, "out of memory");
	r->o = *o;
	signal(SIGPIPE, SIG_IGN);
	if (o->metrics_addr && o->metrics_addr[0]) {
		int rc = httpd_start(loop, o->metrics_addr, http_cb, r, &r->http, e);
		if (rc) {
			free(r);
			return rc;
		}
	}
	uv_signal_init(loop, &r->sigterm);
	uv_signal_init(loop, &r->sigint);
	r->sigterm.data = r->sigint.data = r;
	uv_signal_start(&r->sigterm, signal_cb, SIGTERM);
	uv_signal_start(&r->sigint, signal_cb, SIGINT);
	uv_timer_init(loop, &r->watchdog);
	r->watchdog.data = r;
	r->n_handles = 3;
	uint64_t usec = 0;
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		uint64_t ms = usec / 2000; /* ping at half the interval */
		uv_timer_start(&r->watchdog, watchdog_cb, ms ? ms : 1, ms ? ms : 1);
		r->watchdog_on = true;
		LOG_INFO("runtime", "systemd watchdog every %llu ms", (unsigned long long)(ms ? ms : 1));
	}
	/* signals must not keep the loop alive on their own */
	uv_unref((uv_handle_t *)&r->sigterm);
	uv_unref((uv_handle_t *)&r->sigint);
	*out = r;
	return 0;
}

int runtime_metrics_port(const struct runtime *r)
{
	return r->http ? httpd_port(r->http) : 0;
}

void runtime_notify_ready(struct runtime *r)
{
	if (!r->ready_sent) {
		sd_notify(0, "READY=1");
		r->ready_sent = true;
	}
}

void runtime_notify_stopping(struct runtime *r)
{
	sd_notify(0, "STOPPING=1");
}

static void closed_cb(uv_handle_t *h)
{
	struct runtime *r = h->data;
	if (--r->n_handles == 0)
		free(r);
}

void runtime_stop(struct runtime *r)
{
	if (!r)
		return;
	httpd_stop(r->http);
	r->http = NULL;
	uv_close((uv_handle_t *)&r->sigterm, closed_cb);
	uv_close((uv_handle_t *)&r->sigint, closed_cb);
	uv_close((uv_handle_t *)&r->watchdog, closed_cb);
}
