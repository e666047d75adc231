/* Chat formats (chat.h): recognising the template, checking the vocab has the format's special
 * tokens, validating OpenAI `messages`, rendering each family's layout (MODEL-SPEC.md §6) and
 * tokenizing the result with special tokens allowed only where the format wrote them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"
#include "common/tok/chat.h"

/* DeepSeek's special tokens use U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE EIGHTH BLOCK. */
#define DS_BOS                                                                                               \
	"<\xef\xbd\x9c"                                                                                      \
	"begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_EOS                                                                                               \
	"<\xef\xbd\x9c"                                                                                      \
	"end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT                                                                                         \
	"<\xef\xbd\x9c"                                                                                      \
	"Assistant\xef\xbd\x9c>"
#define DS_CALLS_BEGIN                                                                                       \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"calls\xe2\x96\x81"                                                                                  \
	"begin\xef\xbd\x9c>"
#define DS_CALLS_END                                                                                         \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"calls\xe2\x96\x81"                                                                                  \
	"end\xef\xbd\x9c>"
#define DS_CALL_BEGIN                                                                                        \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"call\xe2\x96\x81"                                                                                   \
	"begin\xef\xbd\x9c>"
#define DS_CALL_END                                                                                          \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"call\xe2\x96\x81"                                                                                   \
	"end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"
#define DS_OUTPUTS_BEGIN                                                                                     \
	"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"                                                   \
	"begin\xef\xbd\x9c>"
#define DS_OUTPUTS_END                                                                                       \
	"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"                                                   \
	"end\xef\xbd\x9c>"
#define DS_OUTPUT_BEGIN                                                                                      \
	"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                                    \
	"begin\xef\xbd\x9c>"
#define DS_OUTPUT_END                                                                                        \
	"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                                    \
	"end\xef\xbd\x9c>"

static const char *const fmt_names[CHAT_FMT_COUNT] = {
    [CHAT_FMT_GLM5] = "glm5",
    [CHAT_FMT_GLM52] = "glm5.2",
    [CHAT_FMT_GLM4] = "glm4",
    [CHAT_FMT_DEEPSEEK_V3] = "deepseek-v3",
    [CHAT_FMT_DEEPSEEK_V31] = "deepseek-v3.1",
};

const char *chat_format_name(enum chat_format f)
{
	return f < CHAT_FMT_COUNT ? fmt_names[f] : "?";
}

int chat_format_from_name(const char *name, enum chat_format *out)
{
	for (int f = 0; f < CHAT_FMT_COUNT; f++) {
		if (strcmp(name, fmt_names[f]) == 0) {
			*out = (enum chat_format)f;
			return 0;
		}
	}
	return ERR_NOTFOUND;
}

static bool has(const char *s, size_t len, const char *needle)
{
	return memmem(s, len, needle, strlen(needle)) != NULL;
}

int chat_format_detect(const char *tmpl, size_t len, enum chat_format *out, struct errbuf *e)
{
	bool glm =
	    has(tmpl, len, "[gMASK]<sop>") || (has(tmpl, len, "<|assistant|>") && has(tmpl, len, "<|user|>"));
	if (glm) {
		if (has(tmpl, len, "Reasoning Effort"))
			*out = CHAT_FMT_GLM52;
		else if (has(tmpl, len, "<|{{") && has(tmpl, len, "|>\n"))
			*out = CHAT_FMT_GLM4; /* role interpolated into the tag, newline after it */
		else
			*out = CHAT_FMT_GLM5;
		return 0;
	}
	if (has(tmpl, len, DS_ASSISTANT)) {
		*out = has(tmpl, len, "</think>") || has(tmpl, len, "thinking") ? CHAT_FMT_DEEPSEEK_V31
		                                                                : CHAT_FMT_DEEPSEEK_V3;
		return 0;
	}
	char head[61];
	size_t n = 0;
	for (size_t i = 0; i < len && n < 60; i++)
		head[n++] = tmpl[i] == '\n' ? ' ' : tmpl[i];
	head[n] = '\0';
	return errbuf_set(e, ERR_UNSUPPORTED,
	                  "chat template not recognised (starts '%s'); configure the chat format "
	                  "(glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1)",
	                  head);
}

static int need_special(const struct tok *t, enum chat_format f, const char *text, int32_t *id,
                        struct errbuf *e)
{
	int32_t i = tok_find(t, text, strlen(text));
	int ty = tok_type(t, i);
	if (i < 0 || (ty != TOK_TYPE_CONTROL && ty != TOK_TYPE_USER_DEFINED))
		return errbuf_set(e, ERR_MISMATCH,
		                  "chat format %s needs the special token '%s', which the "
		                  "vocabulary %s",
		                  chat_format_name(f), text,
		                  i < 0 ? "does not have" : "has only as a normal token");
	if (id)
		*id = i;
	return 0;
}

int chat_init(struct chat *c, const struct tok *t, enum chat_format fmt, struct errbuf *e)
{
	memset(c, 0, sizeof(*c));
	c->fmt = fmt;
	c->t = t;
	c->bos_id = -1;
	int rc = 0;
	switch (fmt) {
	case CHAT_FMT_GLM5:
	case CHAT_FMT_GLM52:
	case CHAT_FMT_GLM4: {
		static const char *const core[] = {"[gMASK]", "<sop>", "<|system|>", "<|assistant|>"};
		static const char *const stops[] = {"<|endoftext|>", "<|user|>", "<|observation|>"};
		for (size_t i = 0; i < 4 && !rc; i++)
			rc = need_special(t, fmt, core[i], NULL, e);
		if (fmt != CHAT_FMT_GLM4) {
			rc = rc ? rc : need_special(t, fmt, "<think>", NULL, e);
			rc = rc ? rc : need_special(t, fmt, "</think>", NULL, e);
		}
		for (size_t i = 0; i < 3 && !rc; i++)
			rc = need_special(t, fmt, stops[i], &c->stop_ids[c->n_stop++], e);
		break;
	}
	case CHAT_FMT_DEEPSEEK_V3:
	case CHAT_FMT_DEEPSEEK_V31:
		rc = need_special(t, fmt, DS_BOS, &c->bos_id, e);
		rc = rc ? rc : need_special(t, fmt, DS_USER, NULL, e);
		rc = rc ? rc : need_special(t, fmt, DS_ASSISTANT, NULL, e);
		rc = rc ? rc : need_special(t, fmt, DS_EOS, &c->stop_ids[c->n_stop++], e);
		if (!rc && fmt == CHAT_FMT_DEEPSEEK_V31) {
			/* <think> / </think> are added tokens in V3.1; plain text elsewhere is fine */
		}
		if (!rc && tok_eos(t) >= 0 && tok_eos(t) != c->stop_ids[0])
			c->stop_ids[c->n_stop++] = tok_eos(t);
		break;
	default: rc = errbuf_set(e, -EINVAL, "chat format %d unknown", (int)fmt);
	}
	return rc;
}

int chat_init_gguf(struct chat *c, const struct tok *t, const struct gguf_ctx *g, const char *configured,
                   struct errbuf *e)
{
	enum chat_format f;
	if (configured && configured[0]) {
		if (chat_format_from_name(configured, &f))
			return errbuf_set(e, -EINVAL,
			                  "chat format '%s' unknown (known: glm5, glm5.2, glm4, "
			                  "deepseek-v3, deepseek-v3.1)",
			                  configured);
		return chat_init(c, t, f, e);
	}
	const char *s;
	size_t len;
	int rc = gguf_get_str(g, "tokenizer.chat_template", &s, &len, e);
	if (rc == ERR_NOTFOUND)
		return errbuf_set(e, ERR_UNSUPPORTED,
		                  "the model has no tokenizer.chat_template; configure "
		                  "the chat format (glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1)");
	if (rc)
		return rc;
	rc = chat_format_detect(s, len, &f, e);
	return rc ? rc : chat_init(c, t, f, e);
}

bool chat_is_stop(const struct chat *c, int32_t id)
{
	for (int i = 0; i < c->n_stop; i++)
		if (c->stop_ids[i] == id)
			return true;
	return false;
}

/* ---- prompt buffer ------------------------------------------------------------------------- */

void chat_prompt_fini(struct chat_prompt *p)
{
	free(p->text);
	free(p->spans);
	memset(p, 0, sizeof(*p));
}

static int put(struct chat_prompt *p, const char *s, size_t n, bool special, struct errbuf *e)
{
	if (n == 0)
		return 0;
	if (n > p->max || p->len > p->max - n)
		return errbuf_set(e, ERR_LIMIT, "chat prompt longer than %zu bytes", p->max);
	if (p->len + n + 1 > p->cap) {
		size_t cap = p->cap ? p->cap : 1024;
		while (cap < p->len + n + 1)
			cap *= 2;
		char *nt = realloc(p->text, cap);
		if (!nt)
			return errbuf_set(e, -ENOMEM, "chat prompt: out of memory");
		p->text = nt;
		p->cap = cap;
	}
	if (special) {
		if (p->n_spans && p->spans[p->n_spans - 1].off + p->spans[p->n_spans - 1].len == p->len) {
			p->spans[p->n_spans - 1].len += n;
		} else {
			if (p->n_spans == p->cap_spans) {
				size_t cap = p->cap_spans ? p->cap_spans * 2 : 32;
				struct tok_span *ns = realloc(p->spans, cap * sizeof(*ns));
				if (!ns)
					return errbuf_set(e, -ENOMEM, "chat prompt: out of memory");
				p->spans = ns;
				p->cap_spans = cap;
			}
			p->spans[p->n_spans++] = (struct tok_span){p->len, n};
		}
	}
	memcpy(p->text + p->len, s, n);
	p->len += n;
	p->text[p->len] = '\0';
	return 0;
}

/* template text (special tokens may match) and content (never special) */
static int tpl(struct chat_prompt *p, const char *s, struct errbuf *e)
{
	return put(p, s, strlen(s), true, e);
}
static int txt(struct chat_prompt *p, const char *s, size_t n, struct errbuf *e)
{
	return put(p, s, n, false, e);
}

/* ---- messages ------------------------------------------------------------------------------ */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

struct tool_call {
	const char *name;
	char *args; /* JSON text of the arguments object (owned) */
	json_t *args_obj; /* parsed arguments (owned), NULL if not an object */
};

struct msg {
	enum role role;
	char *content; /* owned, NUL-terminated (parts joined); "" when null */
	size_t content_len;
	bool content_null;
	const char *reasoning; /* borrowed; NULL when absent */
	struct tool_call *calls;
	size_t n_calls;
};

static void msgs_free(struct msg *m, size_t n)
{
	for (size_t i = 0; m && i < n; i++) {
		free(m[i].content);
		for (size_t k = 0; k < m[i].n_calls; k++) {
			free(m[i].calls[k].args);
			json_decref(m[i].calls[k].args_obj);
		}
		free(m[i].calls);
	}
	free(m);
}

static int parse_content(const json_t *jc, size_t i, struct msg *m, struct errbuf *e)
{
	if (!jc || json_is_null(jc)) {
		m->content = strdup("");
		m->content_null = true;
		return m->content ? 0 : -ENOMEM;
	}
	if (json_is_string(jc)) {
		m->content_len = json_string_length(jc);
		m->content = malloc(m->content_len + 1);
		if (!m->content)
			return -ENOMEM;
		memcpy(m->content, json_string_value(jc), m->content_len + 1);
		return 0;
	}
	if (!json_is_array(jc))
		return errbuf_set(e, -EINVAL,
		                  "messages[%zu].content: expected a string or an array of text "
		                  "parts, got %s",
		                  i, json_is_object(jc) ? "an object" : "a number or boolean");
	size_t total = 0, k;
	json_t *part;
	json_array_foreach(jc, k, part)
	{
		json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
		if (!json_is_object(part) || !json_is_string(ty))
			return errbuf_set(e, -EINVAL,
			                  "messages[%zu].content[%zu]: expected an object with a "
			                  "\"type\"",
			                  i, k);
		if (strcmp(json_string_value(ty), "text") != 0)
			return errbuf_set(e, ERR_UNSUPPORTED,
			                  "messages[%zu].content[%zu]: part type '%.40s' is "
			                  "not supported (only \"text\")",
			                  i, k, json_string_value(ty));
		if (!json_is_string(tx))
			return errbuf_set(e, -EINVAL, "messages[%zu].content[%zu].text: expected a string", i,
			                  k);
		total += json_string_length(tx);
	}
	m->content = malloc(total + 1);
	if (!m->content)
		return -ENOMEM;
	json_array_foreach(jc, k, part)
	{
		json_t *tx = json_object_get(part, "text");
		memcpy(m->content + m->content_len, json_string_value(tx), json_string_length(tx));
		m->content_len += json_string_length(tx);
	}
	m->content[m->content_len] = '\0';
	return 0;
}

static int parse_calls(const json_t *jt, size_t i, struct msg *m, struct errbuf *e)
{
	if (!jt || json_is_null(jt))
		return 0;
	if (!json_is_array(jt))
		return errbuf_set(e, -EINVAL, "messages[%zu].tool_calls: expected an array", i);
	m->calls = calloc(json_array_size(jt) + 1, sizeof(*m->calls));
	if (!m->calls)
		return -ENOMEM;
	size_t k;
	json_t *call;
	json_array_foreach(jt, k, call)
	{
		json_t *fn = json_object_get(call, "function");
		json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
		if (!json_is_object(fn) || !json_is_string(name))
			return errbuf_set(e, -EINVAL,
			                  "messages[%zu].tool_calls[%zu]: expected "
			                  "{\"function\": {\"name\": ..., \"arguments\": ...}}",
			                  i, k);
		struct tool_call *c = &m->calls[m->n_calls++];
		c->name = json_string_value(name);
		if (json_is_string(args)) {
			c->args = strdup(json_string_value(args));
			json_error_t je;
			c->args_obj = json_loads(json_string_value(args), JSON_DECODE_ANY, &je);
		} else if (json_is_object(args)) {
			c->args = json_dumps(args, 0);
			c->args_obj = json_incref((json_t *)args);
		} else if (!args || json_is_null(args)) {
			c->args = strdup("{}");
			c->args_obj = json_object();
		} else {
			return errbuf_set(e, -EINVAL,
			                  "messages[%zu].tool_calls[%zu].function.arguments: "
			                  "expected a JSON string or an object",
			                  i, k);
		}
		if (!c->args)
			return -ENOMEM;
		if (c->args_obj && !json_is_object(c->args_obj)) {
			json_decref(c->args_obj);
			c->args_obj = NULL;
		}
	}
	return 0;
}

static int parse_messages(const json_t *jm, struct msg **out, size_t *n_out, struct errbuf *e)
{
	*out = NULL;
	*n_out = 0;
	if (!json_is_array(jm) || json_array_size(jm) == 0)
		return errbuf_set(e, -EINVAL, "messages: expected a non-empty array");
	size_t n = json_array_size(jm);
	struct msg *m = calloc(n, sizeof(*m));
	if (!m)
		return errbuf_set(e, -ENOMEM, "messages: out of memory");
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		json_t *o = json_array_get(jm, i);
		if (!json_is_object(o)) {
			rc = errbuf_set(e, -EINVAL, "messages[%zu]: expected an object", i);
			break;
		}
		json_t *role = json_object_get(o, "role");
		if (!json_is_string(role)) {
			rc = errbuf_set(e, -EINVAL, "messages[%zu]: missing \"role\" (a string)", i);
			break;
		}
		const char *r = json_string_value(role);
		if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0) {
			m[i].role = ROLE_SYSTEM;
		} else if (strcmp(r, "user") == 0) {
			m[i].role = ROLE_USER;
		} else if (strcmp(r, "assistant") == 0) {
			m[i].role = ROLE_ASSISTANT;
		} else if (strcmp(r, "tool") == 0) {
			m[i].role = ROLE_TOOL;
		} else {
			rc = errbuf_set(e, -EINVAL,
			                "messages[%zu].role: '%.40s' is not one of system, developer, "
			                "user, assistant, tool",
			                i, r);
			break;
		}
		rc = parse_content(json_object_get(o, "content"), i, &m[i], e);
		if (rc == -ENOMEM)
			rc = errbuf_set(e, -ENOMEM, "messages: out of memory");
		if (rc)
			break;
		if (m[i].content_null && m[i].role != ROLE_ASSISTANT) {
			rc = errbuf_set(e, -EINVAL,
			                "messages[%zu].content: missing (only assistant messages may "
			                "omit it)",
			                i);
			break;
		}
		if (m[i].role == ROLE_ASSISTANT) {
			json_t *rs = json_object_get(o, "reasoning_content");
			if (rs && !json_is_null(rs) && !json_is_string(rs)) {
				rc = errbuf_set(e, -EINVAL,
				                "messages[%zu].reasoning_content: expected a string", i);
				break;
			}
			m[i].reasoning = json_is_string(rs) ? json_string_value(rs) : NULL;
			rc = parse_calls(json_object_get(o, "tool_calls"), i, &m[i], e);
			if (rc == -ENOMEM)
				rc = errbuf_set(e, -ENOMEM, "messages: out of memory");
		}
	}
	if (rc) {
		msgs_free(m, n);
		return rc;
	}
	*out = m;
	*n_out = n;
	return 0;
}

/* ---- renderers ----------------------------------------------------------------------------- */

static void strip(const char **s, size_t *n)
{
	while (*n && strchr(" \t\n\r\v\f", (*s)[0]))
		(*s)++, (*n)--;
	while (*n && strchr(" \t\n\r\v\f", (*s)[*n - 1]))
		(*n)--;
}

static int txt_stripped(struct chat_prompt *p, const char *s, size_t n, struct errbuf *e)
{
	strip(&s, &n);
	return txt(p, s, n, e);
}

/* GLM tool call: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>;
 * string values raw, other values as JSON. */
static int glm_call(struct chat_prompt *p, const struct tool_call *c, struct errbuf *e)
{
	int rc = tpl(p, "<tool_call>", e);
	rc = rc ? rc : txt(p, c->name, strlen(c->name), e);
	if (!rc && c->args_obj) {
		const char *k;
		json_t *v;
		json_object_foreach(c->args_obj, k, v)
		{
			rc = rc ? rc : tpl(p, "<arg_key>", e);
			rc = rc ? rc : txt(p, k, strlen(k), e);
			rc = rc ? rc : tpl(p, "</arg_key><arg_value>", e);
			if (!rc && json_is_string(v)) {
				rc = txt(p, json_string_value(v), json_string_length(v), e);
			} else if (!rc) {
				char *d = json_dumps(v, JSON_ENCODE_ANY);
				rc = d ? txt(p, d, strlen(d), e) : errbuf_set(e, -ENOMEM, "out of memory");
				free(d);
			}
			rc = rc ? rc : tpl(p, "</arg_value>", e);
		}
	} else if (!rc) {
		rc = txt(p, c->args, strlen(c->args), e); /* arguments that are not an object */
	}
	return rc ? rc : tpl(p, "</tool_call>", e);
}

/* One tool definition as GLM-5.2's template prints it: the "function" object (or the tool itself
 * when it has none), keys in order, `"key": <JSON value>` joined by ", ", without the
 * defer_loading / strict keys. */
static int glm52_tool_json(struct chat_prompt *p, const json_t *tool, struct errbuf *e)
{
	const json_t *fn = json_object_get(tool, "function");
	if (json_is_object(fn))
		tool = fn;
	int rc = txt(p, "{", 1, e);
	bool first = true;
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)tool, k, v)
	{
		if (strcmp(k, "defer_loading") == 0 || strcmp(k, "strict") == 0)
			continue;
		char *d = json_dumps(v, JSON_ENCODE_ANY);
		if (!d)
			return errbuf_set(e, -ENOMEM, "tools: out of memory");
		rc = rc ? rc : first ? 0 : txt(p, ", ", 2, e);
		rc = rc ? rc : txt(p, "\"", 1, e);
		rc = rc ? rc : txt(p, k, strlen(k), e);
		rc = rc ? rc : txt(p, "\": ", 3, e);
		rc = rc ? rc : txt(p, d, strlen(d), e);
		free(d);
		first = false;
	}
	return rc ? rc : txt(p, "}", 1, e);
}

/* The tools system turn of the GLM-4.7 / GLM-5 templates (as rendered by HF with trim_blocks):
 * GLM-4.7/5 print each OpenAI tool object whole, GLM-5.2 its function object. */
static int glm_tools(const struct chat *c, const json_t *tools, struct chat_prompt *p, struct errbuf *e)
{
	size_t i;
	json_t *tool;
	json_array_foreach(tools, i, tool)
	{
		if (!json_is_object(tool))
			return errbuf_set(e, -EINVAL, "tools[%zu]: expected an object", i);
	}
	int rc = tpl(p,
	             "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
	             "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
	             "<tools>\n",
	             e);
	json_array_foreach(tools, i, tool)
	{
		if (rc)
			break;
		if (c->fmt == CHAT_FMT_GLM52) {
			const json_t *fn = json_object_get(tool, "function");
			const json_t *defer =
			    json_object_get(json_is_object(fn) ? fn : tool, "defer_loading");
			if (json_is_true(defer))
				continue;
			rc = glm52_tool_json(p, tool, e);
		} else {
			char *d = json_dumps(tool, 0);
			rc = d ? txt(p, d, strlen(d), e) : errbuf_set(e, -ENOMEM, "tools: out of memory");
			free(d);
		}
		rc = rc ? rc : tpl(p, "\n", e);
	}
	return rc ? rc
	          : tpl(p,
	                "</tools>\n\nFor each function call, output the function name and arguments "
	                "within the following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}"
	                "</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
	                "<arg_value>{arg-value-2}</arg_value>...</tool_call>",
	                e);
}

static int render_glm(const struct chat *c, const struct msg *m, size_t n, const struct chat_opts *o,
                      struct chat_prompt *p, struct errbuf *e)
{
	bool v52 = c->fmt == CHAT_FMT_GLM52;
	bool think = o->enable_thinking != 0;
	size_t last_user = 0;
	int rc;
	for (size_t i = 0; i < n; i++)
		if (m[i].role == ROLE_USER)
			last_user = i;
	if ((rc = tpl(p, "[gMASK]<sop>", e)))
		return rc;
	if (v52) {
		const char *eff = "Max";
		if (o->reasoning_effort && strcmp(o->reasoning_effort, "low") == 0)
			eff = "Low";
		else if (o->reasoning_effort && strcmp(o->reasoning_effort, "high") == 0)
			eff = "High";
		rc = tpl(p, "<|system|>Reasoning Effort: ", e);
		rc = rc ? rc : tpl(p, eff, e);
	}
	if (!rc && o->tools && json_array_size(o->tools) > 0)
		rc = glm_tools(c, o->tools, p, e);
	for (size_t i = 0; i < n && !rc; i++) {
		switch (m[i].role) {
		case ROLE_SYSTEM:
			rc = tpl(p, "<|system|>", e);
			rc = rc ? rc : txt(p, m[i].content, m[i].content_len, e);
			break;
		case ROLE_USER:
			rc = tpl(p, "<|user|>", e);
			rc = rc ? rc : txt(p, m[i].content, m[i].content_len, e);
			break;
		case ROLE_ASSISTANT: {
			rc = tpl(p, "<|assistant|>", e);
			const char *r = m[i].reasoning;
			size_t rl = r ? strlen(r) : 0;
			strip(&r, &rl);
			if (!rc && i > last_user && rl > 0) {
				rc = tpl(p, "<think>", e);
				rc = rc ? rc : txt(p, r, rl, e);
				rc = rc ? rc : tpl(p, "</think>", e);
			} else if (!rc) {
				rc = tpl(p, v52 ? "<think></think>" : "</think>", e);
			}
			rc = rc ? rc : txt_stripped(p, m[i].content, m[i].content_len, e);
			for (size_t k = 0; k < m[i].n_calls && !rc; k++)
				rc = glm_call(p, &m[i].calls[k], e);
			break;
		}
		case ROLE_TOOL:
			if (i == 0 || m[i - 1].role != ROLE_TOOL)
				rc = tpl(p, "<|observation|>", e);
			rc = rc ? rc : tpl(p, "<tool_response>", e);
			rc = rc ? rc : txt(p, m[i].content, m[i].content_len, e);
			rc = rc ? rc : tpl(p, "</tool_response>", e);
			break;
		}
	}
	if (!rc && o->add_generation_prompt)
		rc = tpl(p,
		         think ? "<|assistant|><think>"
		         : v52 ? "<|assistant|><think></think>"
		               : "<|assistant|></think>",
		         e);
	return rc;
}

/* GLM-4 chat: the role tag, a newline, the content. */
static int render_glm4(const struct chat *c, const struct msg *m, size_t n, const struct chat_opts *o,
                       struct chat_prompt *p, struct errbuf *e)
{
	static const char *const tags[] = {
	    [ROLE_SYSTEM] = "<|system|>\n",
	    [ROLE_USER] = "<|user|>\n",
	    [ROLE_ASSISTANT] = "<|assistant|>\n",
	    [ROLE_TOOL] = "<|observation|>\n",
	};
	int rc = tpl(p, "[gMASK]<sop>", e);
	for (size_t i = 0; i < n && !rc; i++) {
		rc = tpl(p, tags[m[i].role], e);
		rc = rc ? rc : txt(p, m[i].content, m[i].content_len, e);
		for (size_t k = 0; k < m[i].n_calls && !rc; k++) {
			/* GLM-4 function call: the name on its own line, then the arguments */
			if (k > 0 || m[i].content_len > 0)
				rc = tpl(p, "<|assistant|>", e);
			rc = rc ? rc : txt(p, m[i].calls[k].name, strlen(m[i].calls[k].name), e);
			rc = rc ? rc : tpl(p, "\n", e);
			rc = rc ? rc : txt(p, m[i].calls[k].args, strlen(m[i].calls[k].args), e);
		}
	}
	if (!rc && o->add_generation_prompt) {
		rc = tpl(p, "<|assistant|>\n", e);
		if (!rc && o->enable_thinking == 1)
			rc = tpl(p, "<think>", e);
	}
	(void)c;
	return rc;
}

/* Content of a past DeepSeek-V3.1 assistant turn with any reasoning before </think> removed. */
static void ds_visible(const struct msg *m, const char **s, size_t *n)
{
	*s = m->content;
	*n = m->content_len;
	const char *end = memmem(*s, *n, "</think>", 8);
	if (end) {
		*n -= (size_t)(end + 8 - *s);
		*s = end + 8;
	}
}

static int render_deepseek(const struct chat *c, const struct msg *m, size_t n, const struct chat_opts *o,
                           struct chat_prompt *p, struct errbuf *e)
{
	bool v31 = c->fmt == CHAT_FMT_DEEPSEEK_V31;
	size_t bl;
	const char *bos = tok_text(c->t, c->bos_id, &bl);
	int rc = put(p, bos, bl, true, e);
	bool first_sys = true, is_tool = false, first_output = true;
	for (size_t i = 0; i < n && !rc; i++) {
		if (m[i].role != ROLE_SYSTEM)
			continue;
		if (!first_sys)
			rc = tpl(p, "\n\n", e);
		rc = rc ? rc : txt(p, m[i].content, m[i].content_len, e);
		first_sys = false;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		const struct msg *mi = &m[i];
		switch (mi->role) {
		case ROLE_SYSTEM: break;
		case ROLE_USER:
			is_tool = false;
			rc = tpl(p, DS_USER, e);
			rc = rc ? rc : txt(p, mi->content, mi->content_len, e);
			break;
		case ROLE_ASSISTANT: {
			const char *s = mi->content;
			size_t sl = mi->content_len;
			if (v31)
				ds_visible(mi, &s, &sl);
			if (is_tool && mi->n_calls == 0) {
				/* the answer after tool outputs continues the same assistant turn */
				rc = v31 ? 0 : tpl(p, DS_OUTPUTS_END, e);
			} else {
				rc = tpl(p, DS_ASSISTANT, e);
				rc = rc ? rc : v31 ? tpl(p, "</think>", e) : 0;
			}
			is_tool = false;
			first_output = true;
			rc = rc ? rc : txt(p, s, sl, e);
			if (mi->n_calls > 0)
				rc = rc ? rc : tpl(p, DS_CALLS_BEGIN, e);
			for (size_t k = 0; k < mi->n_calls && !rc; k++) {
				const struct tool_call *tc = &mi->calls[k];
				if (!v31 && k > 0)
					rc = tpl(p, "\n", e);
				rc = rc ? rc : tpl(p, DS_CALL_BEGIN, e);
				if (!v31)
					rc = rc ? rc : txt(p, "function", 8, e);
				if (!v31)
					rc = rc ? rc : tpl(p, DS_SEP, e);
				rc = rc ? rc : txt(p, tc->name, strlen(tc->name), e);
				rc = rc ? rc : v31 ? tpl(p, DS_SEP, e) : tpl(p, "\n```json\n", e);
				rc = rc ? rc : txt(p, tc->args, strlen(tc->args), e);
				rc = rc ? rc : v31 ? 0 : tpl(p, "\n```", e);
				rc = rc ? rc : tpl(p, DS_CALL_END, e);
			}
			if (mi->n_calls > 0)
				rc = rc ? rc : tpl(p, DS_CALLS_END, e);
			rc = rc ? rc : tpl(p, DS_EOS, e);
			break;
		}
		case ROLE_TOOL:
			is_tool = true;
			if (!v31 && first_output)
				rc = tpl(p, DS_OUTPUTS_BEGIN, e);
			else if (!v31)
				rc = tpl(p, "\n", e);
			first_output = false;
			rc = rc ? rc : tpl(p, DS_OUTPUT_BEGIN, e);
			rc = rc ? rc : txt(p, mi->content, mi->content_len, e);
			rc = rc ? rc : tpl(p, DS_OUTPUT_END, e);
			break;
		}
	}
	if (!rc && is_tool && !v31)
		rc = tpl(p, DS_OUTPUTS_END, e);
	if (!rc && o->add_generation_prompt && !is_tool) {
		rc = tpl(p, DS_ASSISTANT, e);
		if (!rc && v31)
			rc = tpl(p, o->enable_thinking == 1 ? "<think>" : "</think>", e);
	}
	return rc;
}

int chat_render(const struct chat *c, const json_t *messages, const struct chat_opts *o,
                struct chat_prompt *out, struct errbuf *e)
{
	memset(out, 0, sizeof(*out));
	out->max = o->max_bytes ? o->max_bytes : CHAT_DEFAULT_MAX_BYTES;
	if (o->tools && !json_is_array(o->tools))
		return errbuf_set(e, -EINVAL, "tools: expected an array");
	if (o->tools && json_array_size(o->tools) > 0 && c->fmt != CHAT_FMT_GLM5 && c->fmt != CHAT_FMT_GLM52)
		return errbuf_set(e, ERR_UNSUPPORTED,
		                  "tools: function definitions are not supported by the "
		                  "%s renderer yet",
		                  chat_format_name(c->fmt));
	struct msg *m;
	size_t n;
	int rc = parse_messages(messages, &m, &n, e);
	if (rc)
		return rc;
	struct chat_opts oo = *o;
	if (oo.enable_thinking < 0)
		oo.enable_thinking = c->fmt == CHAT_FMT_GLM5 || c->fmt == CHAT_FMT_GLM52;
	switch (c->fmt) {
	case CHAT_FMT_GLM5:
	case CHAT_FMT_GLM52: rc = render_glm(c, m, n, &oo, out, e); break;
	case CHAT_FMT_GLM4: rc = render_glm4(c, m, n, &oo, out, e); break;
	default: rc = render_deepseek(c, m, n, &oo, out, e); break;
	}
	msgs_free(m, n);
	if (!rc && !out->text) {
		out->text = calloc(1, 1); /* an empty prompt is still a string */
		rc = out->text ? 0 : errbuf_set(e, -ENOMEM, "chat prompt: out of memory");
	}
	if (rc)
		chat_prompt_fini(out);
	return rc;
}

int chat_encode(const struct chat *c, const struct chat_prompt *p, int32_t *ids, size_t n_ids_max,
                size_t *n_ids, struct errbuf *e)
{
	int rc =
	    tok_encode_spans(c->t, p->text, p->len, 0, p->spans, p->n_spans, ids, n_ids_max, n_ids, NULL, e);
	if (rc)
		return rc;
	if (c->bos_id >= 0) {
		size_t n_bos = 0;
		for (size_t i = 0; i < *n_ids; i++)
			n_bos += ids[i] == c->bos_id;
		if (*n_ids == 0 || ids[0] != c->bos_id || n_bos != 1)
			return errbuf_set(e, ERR_FORMAT,
			                  "chat prompt must start with exactly one BOS, has %zu", n_bos);
	}
	return 0;
}
