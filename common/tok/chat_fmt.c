/* The prompt layout of each chat format (MODEL-SPEC.md §6; chat.h lists the formats). Text the
 * format writes goes through tpl() (special tokens may match there), message content through
 * txt() (never special). */
#include <stdlib.h>
#include <string.h>

#include "common/tok/chat_internal.h"

/* template text (special tokens may match) and content (never special) */
static int tpl(struct chat_prompt *p, const char *s, struct errbuf *e)
{
	return chat_prompt_put(p, s, strlen(s), true, e);
}
static int txt(struct chat_prompt *p, const char *s, size_t n, struct errbuf *e)
{
	return chat_prompt_put(p, s, n, false, e);
}

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
static int glm_call(struct chat_prompt *p, const struct chat_msg_call *c, struct errbuf *e)
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

int chat_fmt_glm(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
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
			if (!rc && (o->keep_past_reasoning || i > last_user) && rl > 0) {
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
int chat_fmt_glm4(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
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

/* Content of a past DeepSeek-V3.1 / R1 assistant turn: what follows the last </think> (the
 * templates' content.split('</think>')[-1]). */
static void ds_visible(const struct chat_msg *m, const char **s, size_t *n)
{
	*s = m->content;
	*n = m->content_len;
	const char *end;
	while ((end = memmem(*s, *n, "</think>", 8))) {
		*n -= (size_t)(end + 8 - *s);
		*s = end + 8;
	}
}

int chat_fmt_deepseek(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
                      struct chat_prompt *p, struct errbuf *e)
{
	bool v31 = c->fmt == CHAT_FMT_DEEPSEEK_V31, r1 = c->fmt == CHAT_FMT_DEEPSEEK_R1;
	size_t bl;
	const char *bos = tok_text(c->t, c->bos_id, &bl);
	int rc = chat_prompt_put(p, bos, bl, true, e);
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
		const struct chat_msg *mi = &m[i];
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
			if (v31 || r1)
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
				const struct chat_msg_call *tc = &mi->calls[k];
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
		if (!rc && r1)
			rc = tpl(p, "<think>\n", e); /* R1 always reasons */
	}
	return rc;
}
