/* libuv TCP transport for the HTTP connection core (http.h): listens, accepts up to a maximum
 * number of connections, reads into the core, writes its output, and runs one timer per
 * connection for the header timeout (a request must arrive whole within it) and the keep-alive
 * idle timeout. Drain mode stops accepting and closes connections as their requests finish. */
#ifndef TANDEM_ROUTER_HTTP_SERVER_H
#define TANDEM_ROUTER_HTTP_SERVER_H

#include <uv.h>

#include "router/http.h"

struct http_server_config {
	const char *host;
	int port; /* 0: pick a free port (see http_server_port) */
	int n_conns_max;
	uint64_t header_timeout_ms;
	uint64_t idle_timeout_ms;
	size_t n_write_queue_bytes_max; /* a client that lets more pile up is not reading: abort (0: 8 MiB) */
	struct http_limits limits;
};

struct http_server;

int http_server_create(struct http_server **out, uv_loop_t *loop, const struct http_server_config *cfg,
                       http_request_cb on_request, void *ud, struct errbuf *e) TD_MUST_CHECK;
int http_server_port(const struct http_server *s);
int http_server_n_conns(const struct http_server *s);
/* Stops accepting; idle connections close now, busy ones after their response. */
void http_server_drain(struct http_server *s);
/* Closes the listener and every connection (aborting in-flight requests). The server is freed
 * once libuv has closed every handle; run the loop after calling it. Accepts NULL. */
void http_server_destroy(struct http_server *s);

#endif
