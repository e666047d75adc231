/* The router process's context: configuration, the HTTP server, the scheduler, the codec and the
 * metrics, passed to every handler (no globals). */
#ifndef TANDEM_ROUTER_ROUTER_H
#define TANDEM_ROUTER_ROUTER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "router/http_server.h"
#include "router/keepalive.h"
#include "router/sched.h"

struct codec;
struct metrics;
struct metric;
struct engine_sim;
struct workers;
struct auth;
struct router;

struct router_config {
	char host[64];
	int port;
	char model_path[512]; /* GGUF (metadata only) */
	char model_name[128]; /* served model id; default: the GGUF file name without .gguf */
	char chat_format[32]; /* "" = detect from tokenizer.chat_template */
	char api_keys_file[512];
	char engine[16]; /* "workers" (real prefill/decode) or "sim" */
	char control_addr[256]; /* where workers dial in: host:port or unix:/path */
	char control_token_file[512];
	uint32_t heartbeat_ms;
	uint32_t n_ctx; /* context length (0: from the model) */
	uint32_t n_max_tokens_default; /* when a chat request gives no max_tokens (0: up to the context) */
	int n_conns_max;
	uint64_t header_timeout_ms, idle_timeout_ms;
	size_t n_body_bytes_max;
	size_t n_header_bytes_max;
	size_t n_write_queue_bytes_max;
	struct sched_config sched;
	uint64_t drain_timeout_ms;
	uint64_t sse_keepalive_ms; /* streams silent this long get ": keep-alive" (0: never) */
	char log_level[16];
	/* simulator */
	int sim_prefill, sim_decode;
	uint32_t sim_blocks, sim_block_size;
	double sim_step_ms, sim_prefill_us_per_token, sim_transfer_ms;
};

enum router_endpoint {
	EP_COMPLETIONS,
	EP_CHAT,
	EP_MODELS,
	EP_HEALTH,
	EP_READY,
	EP_METRICS,
	EP_OTHER,
	EP_COUNT
};

struct router_metrics {
	struct metric *http_requests[EP_COUNT]; /* by endpoint */
	struct metric *http_errors_4xx, *http_errors_5xx;
	struct metric *http_rejected_429;
	struct metric *streams_active;
	struct metric *conns_open;
};

/* Registers the router's HTTP metrics (the scheduler registers its own). */
void router_metrics_register(struct router *rt);

struct router {
	uv_loop_t *loop;
	struct router_config cfg;
	struct http_server *http;
	struct sched *sched;
	struct codec *codec;
	struct metrics *metrics;
	struct router_metrics rm;
	struct engine_sim *sim;
	struct workers *workers;
	struct auth *auth;
	struct keepalive keepalive; /* SSE comments for silent streams (keepalive.h) */
	uint64_t next_req_id;
	uint64_t created; /* unix seconds at start, for /v1/models */
	uint32_t n_calls;
	bool draining;
};

/* HTTP entry point (routes.c). */
void router_on_request(struct http_conn *c, struct http_request *r, void *ud);

/* Writes an OpenAI-shaped error response. */
void router_send_error(struct router *rt, struct http_conn *c, int status, const char *type, const char *code,
                       const char *param, const char *message);

/* Completions and chat (complete.c): decodes, tokenizes, submits and streams or collects. */
void complete_handle(struct router *rt, struct http_conn *c, struct http_request *r, int kind);

#endif
