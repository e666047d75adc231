/* Chat formats (chat.h): naming and recognising them, checking the vocab has each format's special
 * tokens and stop tokens, the prompt buffer with its special spans, and the entry points that
 * validate messages (chat_msg.c), render them (chat_fmt.c) and tokenize the result with special
 * tokens allowed only where the format wrote them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"
#include "common/tok/chat_internal.h"

static const char *const fmt_names[CHAT_FMT_COUNT] = {
    [CHAT_FMT_GLM5] = "glm5",
    [CHAT_FMT_GLM52] = "glm5.2",
    [CHAT_FMT_GLM4] = "glm4",
    [CHAT_FMT_DEEPSEEK_V3] = "deepseek-v3",
    [CHAT_FMT_DEEPSEEK_V31] = "deepseek-v3.1",
    [CHAT_FMT_DEEPSEEK_R1] = "deepseek-r1",
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
		if (has(tmpl, len, "thinking"))
			*out = CHAT_FMT_DEEPSEEK_V31; /* the V3.1 template switches on a `thinking` flag */
		else if (has(tmpl, len, "<think>") || has(tmpl, len, "</think>"))
			*out = CHAT_FMT_DEEPSEEK_R1;
		else
			*out = CHAT_FMT_DEEPSEEK_V3;
		return 0;
	}
	char head[61];
	size_t n = 0;
	for (size_t i = 0; i < len && n < 60; i++)
		head[n++] = tmpl[i] == '\n' ? ' ' : tmpl[i];
	head[n] = '\0';
	return errbuf_set(e, ERR_UNSUPPORTED,
	                  "chat template not recognised (starts '%s'); configure the chat format "
	                  "(glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1, deepseek-r1)",
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
	case CHAT_FMT_DEEPSEEK_R1:
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
			                  "deepseek-v3, deepseek-v3.1, deepseek-r1)",
			                  configured);
		return chat_init(c, t, f, e);
	}
	const char *s;
	size_t len;
	int rc = gguf_get_str(g, "tokenizer.chat_template", &s, &len, e);
	if (rc == ERR_NOTFOUND)
		return errbuf_set(
		    e, ERR_UNSUPPORTED,
		    "the model has no tokenizer.chat_template; configure "
		    "the chat format (glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1, deepseek-r1)");
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

int chat_prompt_put(struct chat_prompt *p, const char *s, size_t n, bool special, struct errbuf *e)
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
	struct chat_msg *m;
	size_t n;
	int rc = chat_msg_parse(messages, &m, &n, e);
	if (rc)
		return rc;
	struct chat_opts oo = *o;
	if (oo.enable_thinking < 0)
		oo.enable_thinking = c->fmt == CHAT_FMT_GLM5 || c->fmt == CHAT_FMT_GLM52;
	switch (c->fmt) {
	case CHAT_FMT_GLM5:
	case CHAT_FMT_GLM52: rc = chat_fmt_glm(c, m, n, &oo, out, e); break;
	case CHAT_FMT_GLM4: rc = chat_fmt_glm4(c, m, n, &oo, out, e); break;
	default: rc = chat_fmt_deepseek(c, m, n, &oo, out, e); break;
	}
	chat_msg_free(m, n);
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
