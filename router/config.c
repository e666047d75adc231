/* Router configuration (see config.h). One table lists every key with its type, field and help,
 * so the JSON reader, the flag parser and --help cannot drift apart. Unknown keys are errors:
 * a typo in a config file must not silently fall back to a default. */
#include "router/config.h"

#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum ktype { K_STR, K_INT, K_U32, K_U64, K_SIZE, K_DBL };

struct key {
	const char *name;
	enum ktype type;
	size_t off;
	size_t size; /* for strings */
	const char *help;
};

#define S(f, h)                                                                                              \
	{                                                                                                    \
#f, K_STR, offsetof(struct router_config, f), sizeof(((struct router_config *)0)->f), h      \
	}
#define I(f, t, h)                                                                                           \
	{                                                                                                    \
#f, t, offsetof(struct router_config, f), 0, h                                               \
	}
#define SC(f, t, n, h)                                                                                       \
	{                                                                                                    \
		n, t, offsetof(struct router_config, sched) + offsetof(struct sched_config, f), 0, h         \
	}

static const struct key keys[] = {
    S(host, "listen address"),
    I(port, K_INT, "listen port"),
    S(model_path, "GGUF model file (only its metadata is read: tokenizer, chat template, context length)"),
    S(model_name, "model id served in the API (default: GGUF file name without .gguf, or 'sim')"),
    S(chat_format,
      "chat format (glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1); empty: detect from the GGUF"),
    S(api_keys_file, "file with one API key per line; empty: no authentication"),
    S(engine, "'workers' (prefill/decode processes) or 'sim' (built-in simulator for tests and benchmarks)"),
    S(control_addr, "control-plane listen address workers dial (host:port or unix:/path)"),
    S(control_token_file, "file whose first line is the shared token workers must present; empty: none"),
    I(heartbeat_ms, K_U32, "heartbeat interval; a worker silent for 3 intervals is dropped"),
    I(n_ctx, K_U32, "context length in tokens (0: from the model)"),
    I(n_max_tokens_default, K_U32,
      "max_tokens for chat requests that give none (0: up to the context); "
      "blocks are reserved for all of them"),
    I(n_conns_max, K_INT, "maximum open HTTP connections (beyond: 503)"),
    I(header_timeout_ms, K_U64, "time allowed to receive a whole request (408 after)"),
    I(idle_timeout_ms, K_U64, "keep-alive idle timeout"),
    I(n_body_bytes_max, K_SIZE, "request body limit in bytes (413 beyond)"),
    I(n_write_queue_bytes_max, K_SIZE,
      "response bytes queued for a client that does not read, before it is cut off"),
    I(n_header_bytes_max, K_SIZE, "request line + headers limit in bytes (431 beyond)"),
    SC(n_queue_max, K_U32, "n_queue_max", "admission queue bound (429 with Retry-After beyond)"),
    SC(queue_timeout_ms, K_U64, "queue_timeout_ms", "deadline for a queued request to get KV blocks"),
    SC(reserve_timeout_ms, K_U64, "reserve_timeout_ms", "deadline for a decode worker's reservation answer"),
    SC(prefill_timeout_ms, K_U64, "prefill_timeout_ms",
       "deadline for a prefill of any prompt (the base; see prefill_us_per_token)"),
    SC(prefill_us_per_token, K_U64, "prefill_us_per_token",
       "prefill time allowed per prompt token, on top of prefill_timeout_ms: a prompt of n tokens "
       "gets prefill_timeout_ms + n * this / 1000 ms (the workers' write windows, the decode "
       "reservation and its quarantine follow; at most 6 h)"),
    SC(transfer_timeout_ms, K_U64, "transfer_timeout_ms",
       "deadline for the KV transfer to the decode worker"),
    SC(token_timeout_ms, K_U64, "token_timeout_ms", "longest allowed gap between two generated tokens"),
    SC(n_prefill_tries_max, K_INT, "n_prefill_tries_max",
       "prefill attempts per request (re-prefill after a lost worker)"),
    SC(retry_after_s, K_U32, "retry_after_s", "Retry-After seconds sent with 429/503"),
    I(drain_timeout_ms, K_U64, "on SIGTERM: time to finish in-flight requests before exiting"),
    I(sse_keepalive_ms, K_U64,
      "a streaming response silent this long (a long prefill) gets an SSE comment ': keep-alive' "
      "so proxies keep the connection; 0: never"),
    S(log_level, "error, warn, info or debug"),
    I(sim_prefill, K_INT, "sim engine: prefill workers"),
    I(sim_decode, K_INT, "sim engine: decode workers"),
    I(sim_blocks, K_U32, "sim engine: KV blocks per decode worker"),
    I(sim_block_size, K_U32, "sim engine: tokens per KV block"),
    I(sim_step_ms, K_DBL, "sim engine: decode step time in ms"),
    I(sim_prefill_us_per_token, K_DBL, "sim engine: prefill time per prompt token in us"),
    I(sim_transfer_ms, K_DBL, "sim engine: KV transfer time in ms"),
};
#undef S
#undef I
#undef SC

void router_config_defaults(struct router_config *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->host, sizeof(c->host), "127.0.0.1");
	c->port = 8000;
	snprintf(c->engine, sizeof(c->engine), "workers");
	snprintf(c->control_addr, sizeof(c->control_addr), "127.0.0.1:9100");
	c->heartbeat_ms = 1000;
	c->n_conns_max = 4096;
	c->header_timeout_ms = 10000;
	c->idle_timeout_ms = 60000;
	c->n_body_bytes_max = 8u << 20;
	c->n_header_bytes_max = 16384;
	c->n_write_queue_bytes_max = 8u << 20;
	c->sched.n_queue_max = 1024;
	c->sched.queue_timeout_ms = 60000;
	c->sched.reserve_timeout_ms = 5000;
	c->sched.prefill_timeout_ms = 120000;
	c->sched.prefill_us_per_token = 1000;
	c->sched.transfer_timeout_ms = 30000;
	c->sched.token_timeout_ms = 30000;
	c->sched.n_prefill_tries_max = 2;
	c->sched.retry_after_s = 1;
	c->drain_timeout_ms = 30000;
	c->sse_keepalive_ms = 15000;
	snprintf(c->log_level, sizeof(c->log_level), "info");
	c->sim_prefill = 1;
	c->sim_decode = 1;
	c->sim_blocks = 4096;
	c->sim_block_size = 64;
	c->sim_step_ms = 2;
	c->sim_prefill_us_per_token = 5;
	c->sim_transfer_ms = 1;
}

void router_config_usage(FILE *f)
{
	struct router_config d;
	router_config_defaults(&d);
	fprintf(f, "usage: tandem-router [--config FILE.json] [--KEY VALUE ...]\n\n"
	           "Every key may be set in the JSON config file or as a flag (underscores or dashes).\n\n");
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const struct key *k = &keys[i];
		const char *p = (const char *)&d + k->off;
		char def[64];
		switch (k->type) {
		case K_STR: snprintf(def, sizeof(def), "\"%s\"", p); break;
		case K_INT: snprintf(def, sizeof(def), "%d", *(const int *)p); break;
		case K_U32: snprintf(def, sizeof(def), "%u", *(const uint32_t *)p); break;
		case K_U64:
			snprintf(def, sizeof(def), "%llu", (unsigned long long)*(const uint64_t *)p);
			break;
		case K_SIZE: snprintf(def, sizeof(def), "%zu", *(const size_t *)p); break;
		case K_DBL: snprintf(def, sizeof(def), "%g", *(const double *)p); break;
		}
		char flag[64];
		snprintf(flag, sizeof(flag), "--%s", k->name);
		for (char *q = flag + 2; *q; q++)
			if (*q == '_')
				*q = '-';
		fprintf(f, "  %-28s %s (default %s)\n", flag, k->help, def);
	}
}

static const struct key *find_key(const char *name)
{
	char norm[64];
	size_t n = strlen(name);
	if (n >= sizeof(norm))
		return NULL;
	for (size_t i = 0; i <= n; i++)
		norm[i] = name[i] == '-' ? '_' : name[i];
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(keys[i].name, norm) == 0)
			return &keys[i];
	return NULL;
}

static int set_from_string(struct router_config *c, const struct key *k, const char *v, struct errbuf *e)
{
	char *p = (char *)c + k->off;
	char *end = NULL;
	errno = 0;
	switch (k->type) {
	case K_STR:
		if (strlen(v) >= k->size)
			return errbuf_set(e, -EINVAL, "config %s: value longer than %zu bytes", k->name,
			                  k->size - 1);
		memcpy(p, v, strlen(v) + 1);
		return 0;
	case K_DBL: {
		double d = strtod(v, &end);
		if (errno || end == v || *end || d < 0)
			return errbuf_set(e, -EINVAL, "config %s: '%s' is not a non-negative number", k->name,
			                  v);
		*(double *)p = d;
		return 0;
	}
	default: {
		if (*v == '-')
			return errbuf_set(e, -EINVAL, "config %s: '%s' must not be negative", k->name, v);
		unsigned long long x = strtoull(v, &end, 10);
		if (errno || end == v || *end)
			return errbuf_set(e, -EINVAL, "config %s: '%s' is not an integer", k->name, v);
		if ((k->type == K_INT && x > INT_MAX) || (k->type == K_U32 && x > UINT32_MAX))
			return errbuf_set(e, -EINVAL, "config %s: %llu is too large", k->name, x);
		if (k->type == K_INT)
			*(int *)p = (int)x;
		else if (k->type == K_U32)
			*(uint32_t *)p = (uint32_t)x;
		else if (k->type == K_U64)
			*(uint64_t *)p = x;
		else
			*(size_t *)p = (size_t)x;
		return 0;
	}
	}
}

static int load_file(struct router_config *c, const char *path, struct errbuf *e)
{
	json_error_t je;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return errbuf_set(e, ERR_FORMAT, "config %s:%d:%d: %s", path, je.line, je.column, je.text);
	int rc = 0;
	if (!json_is_object(root)) {
		rc = errbuf_set(e, ERR_FORMAT, "config %s: top level must be an object", path);
		goto out;
	}
	const char *name;
	json_t *v;
	json_object_foreach(root, name, v)
	{
		if (name[0] == '_' || strcmp(name, "comment") == 0)
			continue; /* room for comments in JSON */
		const struct key *k = find_key(name);
		if (!k) {
			rc =
			    errbuf_set(e, ERR_FORMAT, "config %s: unknown key '%s' (see --help)", path, name);
			goto out;
		}
		char buf[1100];
		if (json_is_string(v))
			snprintf(buf, sizeof(buf), "%s", json_string_value(v));
		else if (json_is_integer(v))
			snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
		else if (json_is_real(v))
			snprintf(buf, sizeof(buf), "%.17g", json_real_value(v));
		else {
			rc = errbuf_set(e, ERR_FORMAT, "config %s: key '%s' must be a string or a number",
			                path, name);
			goto out;
		}
		if ((rc = set_from_string(c, k, buf, e)))
			goto out;
	}
out:
	json_decref(root);
	return rc;
}

int router_config_load(struct router_config *c, int argc, char **argv, struct errbuf *e)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			router_config_usage(stdout);
			return 1;
		}
	}
	/* the file first, so flags override it wherever they appear */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--config") == 0) {
			if (i + 1 >= argc)
				return errbuf_set(e, -EINVAL, "--config needs a file name");
			int rc = load_file(c, argv[i + 1], e);
			if (rc)
				return rc;
		}
	}
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--config") == 0) {
			i++;
			continue;
		}
		if (strncmp(argv[i], "--", 2) != 0)
			return errbuf_set(e, -EINVAL, "unexpected argument '%s' (see --help)", argv[i]);
		const char *name = argv[i] + 2;
		const char *val = NULL;
		char namebuf[64];
		const char *eq = strchr(name, '=');
		if (eq) {
			snprintf(namebuf, sizeof(namebuf), "%.*s", (int)(eq - name), name);
			name = namebuf;
			val = eq + 1;
		}
		const struct key *k = find_key(name);
		if (!k)
			return errbuf_set(e, -EINVAL, "unknown flag '%s' (see --help)", argv[i]);
		if (!val) {
			if (i + 1 >= argc)
				return errbuf_set(e, -EINVAL, "flag '%s' needs a value", argv[i]);
			val = argv[++i];
		}
		int rc = set_from_string(c, k, val, e);
		if (rc)
			return rc;
	}
	return 0;
}
