/* A tiny HTTP/1.x responder for the workers' /metrics, /health and /ready: one request per
 * connection (Connection: close), request head at most 8 KiB, no bodies, 5 s to send the head.
 * The router has a full HTTP server; this is deliberately minimal. */
#ifndef TANDEM_NET_HTTPD_H
#define TANDEM_NET_HTTPD_H

#include <stddef.h>
#include <uv.h>

#include "common/base/err.h"

struct httpd;

struct httpd_response {
	int status; /* default 200 */
	const char *content_type; /* default text/plain; charset=utf-8 */
	char *body; /* malloc'd, taken by httpd (may be NULL) */
	size_t len;
};

/* Called on the loop thread for each well-formed request. path excludes the query string. */
typedef void (*httpd_handler_cb)(void *ud, const char *method, const char *path, struct httpd_response *resp);

/* addr: "host:port" (port 0 = any free port). */
int httpd_start(uv_loop_t *loop, const char *addr, httpd_handler_cb cb, void *ud, struct httpd **out,
                struct errbuf *e) TD_MUST_CHECK;
int httpd_port(const struct httpd *h);
void httpd_stop(struct httpd *h); /* closes the listener; open connections finish; NULL is fine */

/* Convenience for handlers: sets a malloc'd copy of text as the body. */
void httpd_set_text(struct httpd_response *r, int status, const char *text);

#endif
