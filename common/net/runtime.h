/* What every worker process does besides its work: serve /metrics, /health and /ready on a
 * small HTTP port; tell systemd READY=1 once registered and WATCHDOG=1 while healthy (libsystemd,
 * a no-op outside systemd); turn SIGTERM/SIGINT into a drain request (a second signal exits at
 * once) and ignore SIGPIPE. All on the caller's libuv loop. */
#ifndef TANDEM_NET_RUNTIME_H
#define TANDEM_NET_RUNTIME_H

#include <stdbool.h>
#include <uv.h>

#include "common/base/err.h"
#include "common/net/metrics.h"

struct runtime;

struct runtime_opts {
	const char *metrics_addr; /* "host:port" ("" = no HTTP port); port 0 = any free port */
	struct metrics *metrics; /* borrowed */
	bool (*is_ready_cb)(void *ud); /* /ready: registered and taking work */
	bool (*is_healthy_cb)(void *ud); /* /health and the watchdog: engine thread alive */
	void (*on_signal_cb)(void *ud, int signum); /* first SIGTERM/SIGINT: start draining */
	void *ud;
};

int runtime_start(uv_loop_t *loop, const struct runtime_opts *o, struct runtime **out,
                  struct errbuf *e) TD_MUST_CHECK;
/* The bound metrics port (0 if none). */
int runtime_metrics_port(const struct runtime *r);
void runtime_notify_ready(struct runtime *r);
void runtime_notify_stopping(struct runtime *r);
void runtime_stop(struct runtime *r); /* closes handles; frees once closed; NULL is fine */

#endif
