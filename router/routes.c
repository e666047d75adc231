/* HTTP routing for the router: health, readiness, metrics, model list and the two generation
 * endpoints (complete.c), with API-key checks on /v1/ and OpenAI-shaped errors for everything
 * that is refused (404 unknown route, 405 wrong method with Allow, 401 bad key). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/metrics.h"
#include "router/api.h"
#include "router/auth.h"
#include "router/router.h"

static const char *const endpoint_names[EP_COUNT] = {"completions", "chat_completions", "models", "health",
                                                     "ready",       "metrics",          "other"};

void router_metrics_register(struct router *rt)
{
	for (int i = 0; i < EP_COUNT; i++) {
		char labels[64];
		snprintf(labels, sizeof(labels), "endpoint=\"%s\"", endpoint_names[i]);
		rt->rm.http_requests[i] = metrics_counter(rt->metrics, "tandem_router_http_requests_total",
		                                          labels, "HTTP requests by endpoint");
	}
	rt->rm.http_errors_4xx = metrics_counter(rt->metrics, "tandem_router_http_errors_total",
	                                         "class=\"4xx\"", "HTTP error responses by status class");
	rt->rm.http_errors_5xx = metrics_counter(rt->metrics, "tandem_router_http_errors_total",
	                                         "class=\"5xx\"", "HTTP error responses by status class");
	rt->rm.http_rejected_429 =
	    metrics_counter(rt->metrics, "tandem_router_rejected_queue_full_total", NULL,
	                    "Requests refused with 429 because the admission queue was full");
	rt->rm.streams_active =
	    metrics_gauge(rt->metrics, "tandem_router_streams_active", NULL, "SSE streams open");
	rt->rm.conns_open =
	    metrics_gauge(rt->metrics, "tandem_router_http_connections", NULL, "Open HTTP connections");
}

void router_send_error(struct router *rt, struct http_conn *c, int status, const char *type, const char *code,
                       const char *param, const char *message)
{
	struct api_error err;
	api_error_set(&err, status, type, code, param, "%s", message);
	size_t n = 0;
	char *body = api_error_json(&err, &n);
	char extra[96] = "";
	if (status == 429 || status == 503)
		snprintf(extra, sizeof(extra), "Retry-After: %u\r\n", sched_retry_after(rt->sched));
	else if (status == 401)
		snprintf(extra, sizeof(extra), "WWW-Authenticate: Bearer\r\n");
	metrics_add(status >= 500 ? rt->rm.http_errors_5xx : rt->rm.http_errors_4xx, 1);
	if (body)
		http_respond(c, status, "application/json", extra, body, n);
	else
		http_respond(c, 500, "application/json", "", "{}", 2);
	free(body);
}

static void respond_json(struct router *rt, struct http_conn *c, int status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s) {
		router_send_error(rt, c, 500, "server_error", NULL, NULL, "could not render the response");
		return;
	}
	http_respond(c, status, "application/json", "", s, strlen(s));
	free(s);
}

static json_t *model_json(const struct router *rt)
{
	return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", rt->cfg.model_name, "object", "model", "created",
	                 (json_int_t)rt->created, "owned_by", "tandem", "max_model_len",
	                 (json_int_t)rt->cfg.n_ctx);
}

static void method_not_allowed(struct router *rt, struct http_conn *c, const char *allow)
{
	struct api_error err;
	api_error_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL,
	              "this endpoint only accepts %s", allow);
	char *body = api_error_json(&err, NULL);
	char extra[64];
	snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
	metrics_add(rt->rm.http_errors_4xx, 1);
	http_respond(c, 405, "application/json", extra, body ? body : "{}", body ? strlen(body) : 2);
	free(body);
}

static bool is_get(const struct http_request *r)
{
	return r->method == HTTP_METHOD_GET || r->method == HTTP_METHOD_HEAD;
}

void router_on_request(struct http_conn *c, struct http_request *r, void *ud)
{
	struct router *rt = ud;
	const char *p = r->path;
	LOG_DEBUG("http", "%s %s", r->method_name, p);

	if (strcmp(p, "/health") == 0) {
		metrics_add(rt->rm.http_requests[EP_HEALTH], 1);
		if (!is_get(r))
			return method_not_allowed(rt, c, "GET");
		static const char ok[] = "{\"status\":\"ok\"}";
		return http_respond(c, 200, "application/json", "", ok, sizeof(ok) - 1);
	}
	if (strcmp(p, "/ready") == 0) {
		metrics_add(rt->rm.http_requests[EP_READY], 1);
		if (!is_get(r))
			return method_not_allowed(rt, c, "GET");
		if (rt->draining)
			return router_send_error(rt, c, 503, "server_error", "draining", NULL,
			                         "server is shutting down");
		if (!sched_is_ready(rt->sched))
			return router_send_error(rt, c, 503, "server_error", "not_ready", NULL,
			                         "waiting for at least one prefill and one decode worker");
		static const char ok[] = "{\"status\":\"ready\"}";
		return http_respond(c, 200, "application/json", "", ok, sizeof(ok) - 1);
	}
	if (strcmp(p, "/metrics") == 0) {
		metrics_add(rt->rm.http_requests[EP_METRICS], 1);
		if (!is_get(r))
			return method_not_allowed(rt, c, "GET");
		metrics_set(rt->rm.conns_open, http_server_n_conns(rt->http));
		size_t n = 0;
		char *text = NULL;
		if (metrics_render(rt->metrics, &text, &n) != 0 || !text)
			return router_send_error(rt, c, 500, "server_error", NULL, NULL,
			                         "could not render metrics");
		http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", "", text, n);
		free(text);
		return;
	}
	if (strncmp(p, "/v1/", 4) == 0) {
		bool known = strcmp(p, "/v1/completions") == 0 || strcmp(p, "/v1/chat/completions") == 0 ||
		             strcmp(p, "/v1/models") == 0 || strncmp(p, "/v1/models/", 11) == 0;
		if (known && !auth_is_allowed(rt->auth, http_request_header(r, "authorization"))) {
			metrics_add(rt->rm.http_requests[EP_OTHER], 1);
			return router_send_error(
			    rt, c, 401, "invalid_request_error", "invalid_api_key", NULL,
			    "Incorrect or missing API key: send 'Authorization: Bearer <key>'");
		}
		if (strcmp(p, "/v1/completions") == 0 || strcmp(p, "/v1/chat/completions") == 0) {
			bool chat = p[4] == 'c' && p[5] == 'h';
			metrics_add(rt->rm.http_requests[chat ? EP_CHAT : EP_COMPLETIONS], 1);
			if (r->method != HTTP_METHOD_POST)
				return method_not_allowed(rt, c, "POST");
			return complete_handle(rt, c, r, chat ? API_KIND_CHAT : API_KIND_COMPLETIONS);
		}
		if (strcmp(p, "/v1/models") == 0) {
			metrics_add(rt->rm.http_requests[EP_MODELS], 1);
			if (!is_get(r))
				return method_not_allowed(rt, c, "GET");
			return respond_json(
			    rt, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(rt)));
		}
		if (strncmp(p, "/v1/models/", 11) == 0) {
			metrics_add(rt->rm.http_requests[EP_MODELS], 1);
			if (!is_get(r))
				return method_not_allowed(rt, c, "GET");
			if (strcmp(p + 11, rt->cfg.model_name) != 0)
				return router_send_error(rt, c, 404, "invalid_request_error",
				                         "model_not_found", "model",
				                         "The model does not exist");
			return respond_json(rt, c, 200, model_json(rt));
		}
	}
	metrics_add(rt->rm.http_requests[EP_OTHER], 1);
	router_send_error(rt, c, 404, "invalid_request_error", "not_found", NULL, "no such route");
}
