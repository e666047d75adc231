/* Streaming parser of generated tokens into content / reasoning / tool calls (chat_out.h).
 * A small state machine driven by marker token ids:
 *
 *   CONTENT --<think>--> REASONING --</think>--> CONTENT
 *   CONTENT --<tool_call> (GLM) / <｜tool▁call▁begin｜> (DeepSeek)--> TOOL --call end--> CONTENT
 *   CONTENT --<｜tool▁calls▁begin｜>--> TOOL_SECTION --call begin--> TOOL --call end--> TOOL_SECTION
 *   TOOL_SECTION --<｜tool▁calls▁end｜>--> CONTENT
 *
 * Text of CONTENT and REASONING goes through one tok_stream each, so every delta is whole UTF-8
 * characters; tool-call text is collected raw and made valid UTF-8 when the call closes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/tok/chat_internal.h"
#include "common/tok/chat_out.h"

enum { PART_NAME, PART_KEY, PART_VAL, PART_BETWEEN };

static bool is_glm(const struct chat *c)
{
	return c->fmt == CHAT_FMT_GLM5 || c->fmt == CHAT_FMT_GLM52 || c->fmt == CHAT_FMT_GLM4;
}

static int32_t marker(const struct tok *t, const char *s)
{
	int32_t id = tok_find(t, s, strlen(s));
	int ty = tok_type(t, id);
	return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED ? id : -1;
}

static int buf_put(struct chat_out_buf *b, const char *s, size_t n, size_t max, struct errbuf *e)
{
	if (n > max || b->len > max - n)
		return errbuf_set(e, ERR_LIMIT, "generated tool call longer than %zu bytes", max);
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *np = realloc(b->p, cap);
		if (!np)
			return errbuf_set(e, -ENOMEM, "chat output: out of memory");
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

/* Copy of s[0..n) stripped of surrounding ASCII whitespace, invalid UTF-8 replaced by U+FFFD. */
static char *clean_dup(const char *s, size_t n)
{
	while (n && strchr(" \t\r\n", s[0]))
		s++, n--;
	while (n && strchr(" \t\r\n", s[n - 1]))
		n--;
	char *o = malloc(3 * n + 1);
	if (!o)
		return NULL;
	size_t i = 0, k = 0;
	while (i < n) {
		int q = tok_utf8_seq((const uint8_t *)s + i, n - i);
		if (q > 0) {
			memcpy(o + k, s + i, (size_t)q);
			k += (size_t)q;
			i += (size_t)q;
		} else {
			memcpy(o + k, "\xEF\xBF\xBD", 3);
			k += 3;
			i += q == 0 ? n - i : (size_t)-q;
		}
	}
	o[k] = '\0';
	return o;
}

static void call_reset(struct chat_out *o)
{
	o->name.len = o->key.len = o->val.len = o->ds.len = o->raw.len = 0;
	o->glm_part = PART_NAME;
	o->ds_sep = SIZE_MAX;
	json_decref(o->args);
	o->args = NULL;
}

static void done_free(struct chat_out *o)
{
	free(o->done.name);
	free(o->done.arguments);
	o->done.name = o->done.arguments = NULL;
}

int chat_out_init(struct chat_out *o, const struct chat *c, const struct chat_opts *opts, struct errbuf *e)
{
	memset(o, 0, sizeof(*o));
	o->c = c;
	const struct tok *t = c->t;
	o->id_think = marker(t, "<think>");
	o->id_think_end = marker(t, "</think>");
	o->id_call = o->id_call_end = o->id_key = o->id_key_end = o->id_val = o->id_val_end = -1;
	o->id_calls_begin = o->id_calls_end = o->id_sep = -1;
	if (is_glm(c)) {
		o->id_call = marker(t, "<tool_call>");
		o->id_call_end = marker(t, "</tool_call>");
		o->id_key = marker(t, "<arg_key>");
		o->id_key_end = marker(t, "</arg_key>");
		o->id_val = marker(t, "<arg_value>");
		o->id_val_end = marker(t, "</arg_value>");
	} else {
		o->id_call = marker(t, DS_CALL_BEGIN);
		o->id_call_end = marker(t, DS_CALL_END);
		o->id_calls_begin = marker(t, DS_CALLS_BEGIN);
		o->id_calls_end = marker(t, DS_CALLS_END);
		o->id_sep = marker(t, DS_SEP);
	}
	tok_stream_init(&o->s_content, t, TOK_DECODE_SKIP_SPECIAL);
	tok_stream_init(&o->s_reasoning, t, TOK_DECODE_SKIP_SPECIAL);
	o->cap_out = tok_stream_max_out(t) + 16;
	o->out_content = malloc(o->cap_out);
	o->out_reasoning = malloc(o->cap_out);
	if (!o->out_content || !o->out_reasoning) {
		chat_out_fini(o);
		return errbuf_set(e, -ENOMEM, "chat output: out of memory");
	}
	call_reset(o);
	o->tools = opts->tools;
	/* the prompt ended with <think> exactly when thinking is on for a thinking format */
	bool think = opts->enable_thinking < 0 ? (c->fmt == CHAT_FMT_GLM5 || c->fmt == CHAT_FMT_GLM52)
	                                       : opts->enable_thinking == 1;
	if (opts->add_generation_prompt &&
	    ((think && c->fmt != CHAT_FMT_DEEPSEEK_V3) || c->fmt == CHAT_FMT_DEEPSEEK_R1))
		o->mode = CHAT_OUT_REASONING; /* R1's prompt always ends with <think>\n */
	return 0;
}

void chat_out_fini(struct chat_out *o)
{
	free(o->out_content);
	free(o->out_reasoning);
	free(o->name.p);
	free(o->key.p);
	free(o->val.p);
	free(o->ds.p);
	free(o->raw.p);
	free(o->fin.p);
	json_decref(o->args);
	done_free(o);
	memset(o, 0, sizeof(*o));
}

/* True when the request's tools declare parameter `key` of function `name` as a string (then a
 * value like 42 stays the string "42"). */
static bool param_is_string(const json_t *tools, const char *name, size_t name_len, const char *key)
{
	size_t i;
	json_t *tool;
	json_array_foreach(tools, i, tool)
	{
		const json_t *fn = json_object_get(tool, "function");
		fn = json_is_object(fn) ? fn : tool;
		const json_t *jn = json_object_get(fn, "name");
		if (!json_is_string(jn) || json_string_length(jn) != name_len ||
		    memcmp(json_string_value(jn), name, name_len) != 0)
			continue;
		const json_t *ty = json_object_get(
		    json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key),
		    "type");
		return json_is_string(ty) && strcmp(json_string_value(ty), "string") == 0;
	}
	return false;
}

/* GLM: </arg_value> closes one argument. */
static int glm_arg(struct chat_out *o, struct errbuf *e)
{
	char *k = clean_dup(o->key.p ? o->key.p : "", o->key.len);
	char *v = clean_dup(o->val.p ? o->val.p : "", o->val.len);
	if (!k || !v || (!o->args && !(o->args = json_object()))) {
		free(k);
		free(v);
		return errbuf_set(e, -ENOMEM, "chat output: out of memory");
	}
	/* keep JSON-typed values (numbers, booleans, null, objects, arrays) typed, unless the tool
	 * declares the parameter a string */
	json_error_t je;
	const char *nm = o->name.p ? o->name.p : "";
	size_t nl = o->name.len;
	while (nl && strchr(" \t\r\n", nm[0]))
		nm++, nl--;
	while (nl && strchr(" \t\r\n", nm[nl - 1]))
		nl--;
	json_t *jv =
	    o->tools && param_is_string(o->tools, nm, nl, k) ? NULL : json_loads(v, JSON_DECODE_ANY, &je);
	if (!jv || json_is_string(jv)) {
		json_decref(jv);
		jv = json_string(v);
	}
	int rc = jv && json_object_set_new(o->args, k, jv) == 0
	             ? 0
	             : errbuf_set(e, -ENOMEM, "chat output: out of memory");
	free(k);
	free(v);
	o->key.len = o->val.len = 0;
	return rc;
}

/* The call is complete: fill o->done. */
static int call_close(struct chat_out *o, struct errbuf *e)
{
	done_free(o);
	if (is_glm(o->c)) {
		o->done.name = clean_dup(o->name.p ? o->name.p : "", o->name.len);
		if (!o->args)
			o->args = json_object();
		o->done.arguments = o->args ? json_dumps(o->args, 0) : NULL;
	} else {
		const char *s = o->ds.p ? o->ds.p : "";
		size_t n = o->ds.len, sep = o->ds_sep < n ? o->ds_sep : n;
		const char *args = s + (sep < n ? sep : n);
		size_t args_len = n - (size_t)(args - s);
		const char *name = s;
		size_t name_len = sep;
		if (o->c->fmt == CHAT_FMT_DEEPSEEK_V3) {
			/* function<sep>NAME\n```json\nARGS\n``` */
			name = args;
			const char *nl = memchr(args, '\n', args_len);
			name_len = nl ? (size_t)(nl - args) : args_len;
			args = nl ? nl + 1 : args + args_len;
			args_len = n - (size_t)(args - s);
			if (args_len >= 8 && memcmp(args, "```json\n", 8) == 0)
				args += 8, args_len -= 8;
			if (args_len >= 4 && memcmp(args + args_len - 4, "\n```", 4) == 0)
				args_len -= 4;
		}
		o->done.name = clean_dup(name, name_len);
		o->done.arguments = clean_dup(args, args_len);
	}
	call_reset(o);
	if (!o->done.name || !o->done.arguments)
		return errbuf_set(e, -ENOMEM, "chat output: out of memory");
	return 0;
}

static int stream_to(struct tok_stream *s, int32_t id, char *out, size_t cap, const char **p, size_t *len,
                     struct errbuf *e)
{
	*p = out;
	return tok_stream_feed(s, id, out, cap, len, e);
}

int chat_out_feed(struct chat_out *o, int32_t id, struct chat_delta *d, struct errbuf *e)
{
	const struct tok *t = o->c->t;
	memset(d, 0, sizeof(*d));
	d->content = d->reasoning = ""; /* never NULL, even when empty */
	done_free(o);
	if (tok_type(t, id) < 0)
		return errbuf_set(e, ERR_FORMAT, "generated token id %d is out of range", id);
	if (chat_is_stop(o->c, id) || tok_is_eog(t, id)) {
		d->stop = true;
		return 0;
	}
	size_t blen;
	const char *bytes = tok_bytes(t, id, &blen);
	int rc = 0;

	if (o->mode == CHAT_OUT_TOOL) {
		rc = buf_put(&o->raw, bytes, blen, CHAT_OUT_MAX_CALL_BYTES, e);
		if (rc)
			return rc;
		if (id == o->id_call_end) {
			o->mode = o->in_section ? CHAT_OUT_TOOL_SECTION : CHAT_OUT_CONTENT;
			rc = call_close(o, e);
			if (rc == 0) {
				d->calls = &o->done;
				d->n_calls = 1;
			}
			return rc;
		}
		if (is_glm(o->c)) {
			if (id == o->id_key)
				o->glm_part = PART_KEY;
			else if (id == o->id_key_end || id == o->id_val_end)
				o->glm_part = PART_BETWEEN;
			else if (id == o->id_val)
				o->glm_part = PART_VAL;
			if (id == o->id_val_end)
				return glm_arg(o, e);
			if (id == o->id_key || id == o->id_key_end || id == o->id_val)
				return 0;
			struct chat_out_buf *b = o->glm_part == PART_NAME  ? &o->name
			                         : o->glm_part == PART_KEY ? &o->key
			                         : o->glm_part == PART_VAL ? &o->val
			                                                   : NULL;
			return b ? buf_put(b, bytes, blen, CHAT_OUT_MAX_CALL_BYTES, e) : 0;
		}
		if (id == o->id_sep && o->ds_sep == SIZE_MAX) {
			o->ds_sep = o->ds.len;
			return 0;
		}
		return buf_put(&o->ds, bytes, blen, CHAT_OUT_MAX_CALL_BYTES, e);
	}

	if (o->mode == CHAT_OUT_TOOL_SECTION) {
		if (id == o->id_call) {
			o->mode = CHAT_OUT_TOOL;
			call_reset(o);
			return buf_put(&o->raw, bytes, blen, CHAT_OUT_MAX_CALL_BYTES, e);
		}
		if (id == o->id_calls_end) {
			o->in_section = false;
			o->mode = CHAT_OUT_CONTENT;
		}
		return 0; /* text between calls is layout */
	}

	/* CONTENT or REASONING */
	if (id == o->id_think) {
		o->mode = CHAT_OUT_REASONING;
		return 0;
	}
	if (id == o->id_think_end) {
		o->mode = CHAT_OUT_CONTENT;
		d->reasoning = o->out_reasoning; /* whatever the reasoning held back */
		return tok_stream_flush(&o->s_reasoning, o->out_reasoning, o->cap_out, &d->reasoning_len, e);
	}
	if (id == o->id_calls_begin) {
		o->in_section = true;
		o->mode = CHAT_OUT_TOOL_SECTION;
		return 0;
	}
	if (id == o->id_call) {
		o->in_section = false;
		o->mode = CHAT_OUT_TOOL;
		call_reset(o);
		return buf_put(&o->raw, bytes, blen, CHAT_OUT_MAX_CALL_BYTES, e);
	}
	if (o->mode == CHAT_OUT_REASONING)
		rc = stream_to(&o->s_reasoning, id, o->out_reasoning, o->cap_out, &d->reasoning,
		               &d->reasoning_len, e);
	else
		rc =
		    stream_to(&o->s_content, id, o->out_content, o->cap_out, &d->content, &d->content_len, e);
	return rc;
}

int chat_out_finish(struct chat_out *o, struct chat_delta *d, struct errbuf *e)
{
	memset(d, 0, sizeof(*d));
	d->content = d->reasoning = "";
	done_free(o);
	size_t n = 0;
	int rc = tok_stream_flush(&o->s_reasoning, o->out_reasoning, o->cap_out, &d->reasoning_len, e);
	d->reasoning = o->out_reasoning;
	rc = rc ? rc : tok_stream_flush(&o->s_content, o->out_content, o->cap_out, &n, e);
	o->fin.len = 0;
	rc = rc ? rc : buf_put(&o->fin, o->out_content, n, SIZE_MAX / 2, e);
	if (!rc && o->mode == CHAT_OUT_TOOL && o->raw.len > 0) {
		/* an unfinished call was not a call: give its text back as content */
		char *txt = clean_dup(o->raw.p, o->raw.len);
		rc = txt ? buf_put(&o->fin, txt, strlen(txt), SIZE_MAX / 2, e)
		         : errbuf_set(e, -ENOMEM, "chat output: out of memory");
		free(txt);
		call_reset(o);
	}
	o->mode = CHAT_OUT_CONTENT;
	d->content = o->fin.p ? o->fin.p : "";
	d->content_len = o->fin.len;
	return rc;
}
