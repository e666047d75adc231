/* JSON request decoder for /v1/completions and /v1/chat/completions (see api.h). One function per
 * field kind (number in range, integer in range, bool, string or array of strings) so each field's
 * rule reads as one line in decode(); the messages name the field and the accepted range. */
#include "router/api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages may quote client input (the JSON parser's "near '...'"): replace every byte that is not
 * part of a valid UTF-8 sequence with '?' so the error body is always valid JSON. */
static void scrub_utf8(char *s)
{
	unsigned char *u = (unsigned char *)s;
	while (*u) {
		size_t need = u[0] < 0x80             ? 1
		              : (u[0] & 0xE0) == 0xC0 ? 2
		              : (u[0] & 0xF0) == 0xE0 ? 3
		              : (u[0] & 0xF8) == 0xF0 ? 4
		                                      : 0;
		bool ok = need > 0;
		uint32_t cp = need == 1   ? u[0]
		              : need == 2 ? (u[0] & 0x1Fu)
		              : need == 3 ? (u[0] & 0x0Fu)
		                          : (u[0] & 0x07u);
		for (size_t k = 1; ok && k < need; k++) {
			ok = (u[k] & 0xC0) == 0x80; /* also stops at the NUL */
			cp = (cp << 6) | (u[k] & 0x3Fu);
		}
		static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
		if (ok && need > 1)
			ok = cp >= min_cp[need] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
		if (!ok) {
			*u++ = '?';
			continue;
		}
		u += need;
	}
}

int api_error_set(struct api_error *err, int status, const char *type, const char *code, const char *param,
                  const char *fmt, ...)
{
	if (!err)
		return status;
	err->status = status;
	err->type = type;
	err->code = code;
	snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	scrub_utf8(err->message);
	scrub_utf8(err->param);
	return status;
}

char *api_error_json(const struct api_error *err, size_t *len_out)
{
	json_t *e = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", err->message, "type",
	                      err->type ? err->type : "invalid_request_error", "param",
	                      err->param[0] ? json_string(err->param) : json_null(), "code",
	                      err->code ? json_string(err->code) : json_null());
	if (!e)
		return NULL;
	char *s = json_dumps(e, JSON_COMPACT);
	json_decref(e);
	if (s && len_out)
		*len_out = strlen(s);
	return s;
}

void api_request_fini(struct api_request *req)
{
	free(req->model);
	free(req->prompt);
	free(req->prompt_ids);
	for (size_t i = 0; i < req->n_messages; i++) {
		free(req->messages[i].role);
		free(req->messages[i].content);
	}
	free(req->messages);
	if (req->messages_json)
		json_decref((json_t *)req->messages_json);
	for (int i = 0; i < req->n_stop; i++)
		free(req->stop[i]);
	memset(req, 0, sizeof(*req));
}

static int bad(struct api_error *err, const char *param, const char *fmt, ...) TD_PRINTF(3, 4);
static int bad(struct api_error *err, const char *param, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	api_error_set(err, 400, "invalid_request_error", NULL, param, "%s", msg);
	return -EINVAL;
}

/* A field present as JSON null counts as absent, as in the OpenAI API. */
static json_t *field(json_t *root, const char *key)
{
	json_t *v = json_object_get(root, key);
	return json_is_null(v) ? NULL : v;
}

static int get_number(json_t *root, const char *key, double lo, double hi, double *out, struct api_error *err)
{
	json_t *v = field(root, key);
	if (!v)
		return 0;
	if (!json_is_number(v))
		return bad(err, key, "'%s' must be a number", key);
	double d = json_number_value(v);
	if (!isfinite(d) || d < lo || d > hi)
		return bad(err, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
	*out = d;
	return 0;
}

static int get_int(json_t *root, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *present,
                   struct api_error *err)
{
	json_t *v = field(root, key);
	if (!v)
		return 0;
	int64_t x;
	if (json_is_integer(v)) {
		x = json_integer_value(v);
	} else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
	           fabs(json_real_value(v)) < 9e15) {
		x = (int64_t)json_real_value(v); /* 16.0 is accepted as 16, like JSON Schema integers */
	} else {
		return bad(err, key, "'%s' must be an integer", key);
	}
	if (x < lo || x > hi)
		return bad(err, key, "'%s' must be between %lld and %lld, got %lld", key, (long long)lo,
		           (long long)hi, (long long)x);
	*out = x;
	if (present)
		*present = true;
	return 0;
}

static int get_bool(json_t *root, const char *key, bool *out, struct api_error *err)
{
	json_t *v = field(root, key);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return bad(err, key, "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return 0;
}

static int dup_string(json_t *v, char **out, struct api_error *err, const char *param)
{
	size_t n = json_string_length(v);
	if (memchr(json_string_value(v), '\0', n))
		return bad(err, param, "'%s' must not contain NUL characters", param);
	*out = strdup(json_string_value(v));
	if (!*out)
		return api_error_set(err, 503, "server_error", NULL, NULL, "out of memory"), -ENOMEM;
	return 0;
}

static int decode_stop(json_t *root, struct api_request *req, struct api_error *err)
{
	json_t *v = field(root, "stop");
	if (!v)
		return 0;
	if (json_is_string(v)) {
		if (json_string_length(v) == 0)
			return bad(err, "stop", "'stop' strings must not be empty");
		req->n_stop = 1;
		return dup_string(v, &req->stop[0], err, "stop");
	}
	if (!json_is_array(v))
		return bad(err, "stop", "'stop' must be a string or an array of strings");
	if (json_array_size(v) > API_MAX_STOP)
		return bad(err, "stop", "'stop' accepts at most %d strings, got %zu", API_MAX_STOP,
		           json_array_size(v));
	size_t i;
	json_t *s;
	json_array_foreach(v, i, s)
	{
		if (!json_is_string(s) || json_string_length(s) == 0)
			return bad(err, "stop", "'stop[%zu]' must be a non-empty string", i);
		int rc = dup_string(s, &req->stop[req->n_stop], err, "stop");
		if (rc)
			return rc;
		req->n_stop++;
	}
	return 0;
}

static int decode_prompt(json_t *root, struct api_request *req, struct api_error *err)
{
	json_t *v = json_object_get(root, "prompt");
	if (!v || json_is_null(v))
		return bad(err, "prompt", "'prompt' is required");
	if (json_is_string(v))
		return dup_string(v, &req->prompt, err, "prompt");
	if (!json_is_array(v))
		return bad(err, "prompt",
		           "'prompt' must be a string, an array of token ids, or an array of one string");
	size_t n = json_array_size(v);
	if (n == 0)
		return bad(err, "prompt", "'prompt' must not be empty");
	json_t *first = json_array_get(v, 0);
	if (json_is_string(first) || json_is_array(first)) {
		/* batched prompts: we serve one prompt per request (use n for several choices) */
		if (n != 1)
			return bad(
			    err, "prompt",
			    "'prompt' with several prompts is not supported; send one request per prompt");
		if (json_is_string(first))
			return dup_string(first, &req->prompt, err, "prompt");
		v = first;
		n = json_array_size(v);
		if (n == 0)
			return bad(err, "prompt", "'prompt' must not be empty");
	}
	if (n > API_MAX_PROMPT_IDS)
		return bad(err, "prompt", "'prompt' has %zu token ids, more than the maximum %d", n,
		           API_MAX_PROMPT_IDS);
	req->prompt_ids = malloc(n * sizeof(int32_t));
	if (!req->prompt_ids)
		return api_error_set(err, 503, "server_error", NULL, NULL, "out of memory"), -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(v, i);
		if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
			return bad(err, "prompt", "'prompt[%zu]' must be a non-negative token id", i);
		req->prompt_ids[i] = (int32_t)json_integer_value(t);
	}
	req->n_prompt_ids = n;
	return 0;
}

/* Content is a string or an array of parts; only text parts are accepted (no images here). */
static int decode_content(json_t *c, size_t idx, char **out, struct api_error *err)
{
	if (!c || json_is_null(c)) {
		*out = strdup("");
		return *out ? 0 : -ENOMEM;
	}
	if (json_is_string(c))
		return dup_string(c, out, err, "messages");
	if (!json_is_array(c))
		return bad(err, "messages",
		           "'messages[%zu].content' must be a string or an array of text parts", idx);
	size_t total = 0, i;
	json_t *part;
	json_array_foreach(c, i, part)
	{
		json_t *type = json_object_get(part, "type");
		json_t *text = json_object_get(part, "text");
		if (!json_is_object(part) || !json_is_string(type) ||
		    strcmp(json_string_value(type), "text") != 0 || !json_is_string(text))
			return bad(err, "messages",
			           "'messages[%zu].content[%zu]' must be {\"type\":\"text\",\"text\":...}",
			           idx, i);
		total += json_string_length(text);
	}
	char *s = malloc(total + 1);
	if (!s)
		return -ENOMEM;
	size_t off = 0;
	json_array_foreach(c, i, part)
	{
		json_t *text = json_object_get(part, "text");
		memcpy(s + off, json_string_value(text), json_string_length(text));
		off += json_string_length(text);
	}
	s[off] = '\0';
	if (strlen(s) != off) {
		free(s);
		return bad(err, "messages", "'messages[%zu].content' must not contain NUL characters", idx);
	}
	*out = s;
	return 0;
}

static int decode_messages(json_t *root, struct api_request *req, struct api_error *err)
{
	static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
	json_t *v = json_object_get(root, "messages");
	if (!v || json_is_null(v))
		return bad(err, "messages", "'messages' is required");
	if (!json_is_array(v))
		return bad(err, "messages", "'messages' must be an array");
	size_t n = json_array_size(v);
	if (n == 0)
		return bad(err, "messages", "'messages' must contain at least one message");
	if (n > API_MAX_MESSAGES)
		return bad(err, "messages", "'messages' has %zu entries, more than the maximum %d", n,
		           API_MAX_MESSAGES);
	req->messages = calloc(n, sizeof(*req->messages));
	if (!req->messages)
		return -ENOMEM;
	req->messages_json = json_incref(v);
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(v, i);
		if (!json_is_object(m))
			return bad(err, "messages", "'messages[%zu]' must be an object", i);
		json_t *role = json_object_get(m, "role");
		if (!json_is_string(role))
			return bad(err, "messages", "'messages[%zu].role' must be a string", i);
		bool known = false;
		for (size_t r = 0; r < sizeof(roles) / sizeof(roles[0]); r++)
			if (strcmp(json_string_value(role), roles[r]) == 0)
				known = true;
		if (!known)
			return bad(
			    err, "messages",
			    "'messages[%zu].role' must be one of system, user, assistant, tool, developer",
			    i);
		req->n_messages = i + 1;
		int rc = dup_string(role, &req->messages[i].role, err, "messages");
		if (rc)
			return rc;
		rc = decode_content(json_object_get(m, "content"), i, &req->messages[i].content, err);
		if (rc)
			return rc;
	}
	return 0;
}

static int decode(json_t *root, enum api_kind kind, struct api_request *req, struct api_error *err)
{
	int rc;
	json_t *model = json_object_get(root, "model");
	if (!model || json_is_null(model))
		return bad(err, "model", "'model' is required");
	if (!json_is_string(model))
		return bad(err, "model", "'model' must be a string");
	if ((rc = dup_string(model, &req->model, err, "model")))
		return rc;
	if (kind == API_KIND_COMPLETIONS)
		rc = decode_prompt(root, req, err);
	else
		rc = decode_messages(root, req, err);
	if (rc)
		return rc;

	int64_t i64 = -1;
	bool has_mct = false, has_mt = false;
	if ((rc = get_int(root, "max_completion_tokens", 1, INT32_MAX, &i64, &has_mct, err)))
		return rc;
	if (!has_mct && (rc = get_int(root, "max_tokens", kind == API_KIND_COMPLETIONS ? 0 : 1, INT32_MAX,
	                              &i64, &has_mt, err)))
		return rc;
	req->max_tokens = (has_mct || has_mt) ? i64 : -1;
	if (kind == API_KIND_COMPLETIONS && !has_mct && !has_mt)
		req->max_tokens = 16; /* the completions API's documented default */
	if (req->max_tokens == 0)
		return bad(err, "max_tokens", "'max_tokens' must be at least 1");

	if ((rc = decode_stop(root, req, err)))
		return rc;
	req->temperature = 1.0;
	req->top_p = 1.0;
	if ((rc = get_number(root, "temperature", 0, 2, &req->temperature, err)))
		return rc;
	if ((rc = get_number(root, "top_p", 0, 1, &req->top_p, err)))
		return rc;
	if (req->top_p == 0)
		return bad(err, "top_p", "'top_p' must be greater than 0");
	i64 = 0;
	if ((rc = get_int(root, "top_k", -1, 1 << 20, &i64, NULL, err)))
		return rc;
	req->top_k = i64 < 0 ? 0 : (int32_t)i64;
	if ((rc = get_number(root, "min_p", 0, 1, &req->min_p, err)))
		return rc;
	i64 = 0;
	if ((rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &i64, &req->has_seed, err)))
		return rc;
	req->seed = (uint64_t)i64;
	if ((rc = get_number(root, "frequency_penalty", -2, 2, &req->frequency_penalty, err)))
		return rc;
	if ((rc = get_number(root, "presence_penalty", -2, 2, &req->presence_penalty, err)))
		return rc;
	i64 = 1;
	if ((rc = get_int(root, "n", 1, API_MAX_N, &i64, NULL, err)))
		return rc;
	req->n = (int)i64;
	if ((rc = get_bool(root, "stream", &req->stream, err)))
		return rc;
	if ((rc = get_bool(root, "return_tokens_as_token_ids", &req->tokens_as_ids, err)))
		return rc;
	if ((rc = get_bool(root, "ignore_eos", &req->ignore_eos, err)))
		return rc;

	json_t *so = field(root, "stream_options");
	if (so) {
		if (!json_is_object(so))
			return bad(err, "stream_options", "'stream_options' must be an object");
		if (!req->stream)
			return bad(err, "stream_options",
			           "'stream_options' is only allowed when 'stream' is true");
		json_t *iu = field(so, "include_usage");
		if (iu && !json_is_boolean(iu))
			return bad(err, "stream_options.include_usage",
			           "'stream_options.include_usage' must be a boolean");
		req->include_usage = iu && json_is_true(iu);
	}

	if (kind == API_KIND_COMPLETIONS) {
		bool has_lp = false;
		i64 = 0;
		if ((rc = get_int(root, "logprobs", 0, API_MAX_LOGPROBS_COMPLETIONS, &i64, &has_lp, err)))
			return rc;
		req->logprobs = has_lp;
		req->top_logprobs = (int)i64;
		if ((rc = get_bool(root, "echo", &req->echo, err)))
			return rc;
		if (req->echo)
			return bad(err, "echo", "'echo' is not supported");
	} else {
		if ((rc = get_bool(root, "logprobs", &req->logprobs, err)))
			return rc;
		bool has_tl = false;
		i64 = 0;
		if ((rc = get_int(root, "top_logprobs", 0, API_MAX_TOP_LOGPROBS_CHAT, &i64, &has_tl, err)))
			return rc;
		if (has_tl && !req->logprobs)
			return bad(err, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
		req->top_logprobs = (int)i64;
	}
	return 0;
}

int api_request_decode(enum api_kind kind, const char *body, size_t len, struct api_request *req,
                       struct api_error *err)
{
	memset(req, 0, sizeof(*req));
	req->kind = kind;
	if (err)
		memset(err, 0, sizeof(*err));
	json_error_t jerr;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root) {
		bad(err, NULL, "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
		    jerr.line, jerr.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		bad(err, NULL, "request body must be a JSON object");
		return -EINVAL;
	}
	int rc = decode(root, kind, req, err);
	json_decref(root);
	if (rc) {
		if (err && err->status == 0)
			api_error_set(err, 503, "server_error", NULL, NULL, "out of memory");
		api_request_fini(req);
		req->kind = kind;
		return rc < 0 ? rc : -EINVAL;
	}
	return 0;
}
