/* Validation of OpenAI-style `messages` (a jansson array) into struct chat_msg: roles, string or
 * text-part content, reasoning_content, tool_calls. Every error names the message index and field
 * ("messages[2].content[0]: part type 'image_url' is not supported"). */
#include <stdlib.h>
#include <string.h>

#include "common/tok/chat_internal.h"

void chat_msg_free(struct chat_msg *m, size_t n)
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

static int parse_content(const json_t *jc, size_t i, struct chat_msg *m, struct errbuf *e)
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

static int parse_calls(const json_t *jt, size_t i, struct chat_msg *m, struct errbuf *e)
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
		struct chat_msg_call *c = &m->calls[m->n_calls++];
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

int chat_msg_parse(const json_t *jm, struct chat_msg **out, size_t *n_out, struct errbuf *e)
{
	*out = NULL;
	*n_out = 0;
	if (!json_is_array(jm) || json_array_size(jm) == 0)
		return errbuf_set(e, -EINVAL, "messages: expected a non-empty array");
	size_t n = json_array_size(jm);
	struct chat_msg *m = calloc(n, sizeof(*m));
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
		chat_msg_free(m, n);
		return rc;
	}
	*out = m;
	*n_out = n;
	return 0;
}
