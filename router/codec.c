/* Codecs (see codec.h). The GGUF codec wraps common/tok (byte-level BPE + chat formats); it keeps
 * only what it copied out of the file, so the GGUF is closed after loading. The byte codec maps
 * ids 0..255 to bytes and 256 to end-of-sequence; it stands in for the model tokenizer when the
 * router serves the simulated engine. */
#include "router/codec.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"
#include "common/tok/chat.h"
#include "common/tok/tok.h"

#define BYTES_EOS 256

struct codec {
	bool is_bytes;
	char bytes[256];
	struct tok *tok;
	struct chat chat;
};

struct codec *codec_create_bytes(void)
{
	struct codec *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->is_bytes = true;
	for (int i = 0; i < 256; i++)
		c->bytes[i] = (char)i;
	return c;
}

static void read_info(const struct gguf_ctx *g, const char *path, struct codec_model_info *info)
{
	memset(info, 0, sizeof(*info));
	const char *s;
	size_t n;
	if (gguf_get_str(g, "general.architecture", &s, &n, NULL) == 0)
		snprintf(info->arch, sizeof(info->arch), "%.*s", (int)n, s);
	/* the served id is the file name: predictable for operators, unlike general.name */
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	snprintf(info->name, sizeof(info->name), "%s", base);
	char *dot = strstr(info->name, ".gguf");
	if (dot)
		*dot = '\0';
	char key[96];
	snprintf(key, sizeof(key), "%s.context_length", info->arch);
	uint32_t ctx = 0;
	if (gguf_get_u32(g, key, &ctx, NULL) == 0)
		info->n_ctx = ctx;
}

int codec_create_gguf(struct codec **out, const char *path, const char *chat_format,
                      struct codec_model_info *info, struct errbuf *e)
{
	*out = NULL;
	struct gguf_ctx *g = NULL;
	int rc = gguf_open(&g, path, e);
	if (rc)
		return rc;
	struct codec *c = calloc(1, sizeof(*c));
	if (!c) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto close_gguf;
	}
	if ((rc = tok_load(&c->tok, g, e)))
		goto free_codec;
	if ((rc = chat_init_gguf(&c->chat, c->tok, g, chat_format, e)))
		goto free_tok;
	read_info(g, path, info);
	gguf_close(g);
	*out = c;
	return 0;
free_tok:
	tok_destroy(c->tok);
free_codec:
	free(c);
close_gguf:
	errbuf_prefix(e, "model %s", path);
	gguf_close(g);
	return rc;
}

void codec_destroy(struct codec *c)
{
	if (!c)
		return;
	tok_destroy(c->tok);
	free(c);
}

uint32_t codec_n_vocab(const struct codec *c)
{
	return c->is_bytes ? BYTES_EOS + 1 : (uint32_t)tok_n_vocab(c->tok);
}

bool codec_is_eog(const struct codec *c, int32_t id)
{
	if (c->is_bytes)
		return id == BYTES_EOS;
	return tok_is_eog(c->tok, id) || chat_is_stop(&c->chat, id);
}

int codec_encode(const struct codec *c, const char *text, size_t len, int32_t **ids, uint32_t *n_ids,
                 struct errbuf *e)
{
	if (len > UINT32_MAX - 2)
		return errbuf_set(e, ERR_LIMIT, "prompt of %zu bytes is too long", len);
	size_t cap = c->is_bytes ? len + 1 : tok_encode_max(len);
	int32_t *v = malloc((cap ? cap : 1) * sizeof(int32_t));
	if (!v)
		return errbuf_set(e, -ENOMEM, "out of memory encoding the prompt");
	if (c->is_bytes) {
		for (size_t i = 0; i < len; i++)
			v[i] = (unsigned char)text[i];
		*ids = v;
		*n_ids = (uint32_t)len;
		return 0;
	}
	size_t n = 0;
	/* special-token text in a completions prompt is honoured (as llama.cpp and vLLM do); invalid
	 * UTF-8 is refused by the tokenizer with the byte offset */
	int rc = tok_encode(c->tok, text, len, TOK_ENCODE_ADD_BOS, v, cap, &n, NULL, e);
	if (rc) {
		free(v);
		return rc;
	}
	*ids = v;
	*n_ids = (uint32_t)n;
	return 0;
}

static int bytes_chat(const struct api_request *req, char **out, struct errbuf *e)
{
	const struct api_message *m = req->messages;
	size_t total = 32;
	for (size_t i = 0; i < req->n_messages; i++) {
		size_t add = strlen(m[i].role) + strlen(m[i].content) + 8;
		if (total > SIZE_MAX / 2 - add)
			return errbuf_set(e, ERR_LIMIT, "conversation is too long");
		total += add;
	}
	char *s = malloc(total);
	if (!s)
		return errbuf_set(e, -ENOMEM, "out of memory rendering the conversation");
	size_t off = 0;
	for (size_t i = 0; i < req->n_messages; i++)
		off += (size_t)snprintf(s + off, total - off, "<|%s|>%s\n", m[i].role, m[i].content);
	snprintf(s + off, total - off, "<|assistant|>");
	*out = s;
	return 0;
}

int codec_chat(const struct codec *c, const struct api_request *req, int32_t **ids, uint32_t *n_ids,
               struct errbuf *e)
{
	if (c->is_bytes) {
		char *text = NULL;
		int rc = bytes_chat(req, &text, e);
		if (rc == 0)
			rc = codec_encode(c, text, strlen(text), ids, n_ids, e);
		free(text);
		return rc;
	}
	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	struct chat_prompt p = {0};
	int rc = chat_render(&c->chat, (const json_t *)req->messages_json, &o, &p, e);
	if (rc)
		return rc;
	size_t cap = tok_encode_max(p.len);
	int32_t *v = malloc(cap * sizeof(int32_t));
	if (!v) {
		chat_prompt_fini(&p);
		return errbuf_set(e, -ENOMEM, "out of memory encoding the conversation");
	}
	size_t n = 0;
	rc = chat_encode(&c->chat, &p, v, cap, &n, e);
	chat_prompt_fini(&p);
	if (rc) {
		free(v);
		return rc;
	}
	*ids = v;
	*n_ids = (uint32_t)n;
	return 0;
}

int codec_token_bytes(const struct codec *c, int32_t id, const char **bytes, size_t *len)
{
	if (c->is_bytes) {
		if (id == BYTES_EOS) {
			*bytes = "";
			*len = 0;
			return 0;
		}
		if (id < 0 || id > 255)
			return ERR_FORMAT;
		*bytes = &c->bytes[id];
		*len = 1;
		return 0;
	}
	const char *b = tok_bytes(c->tok, id, len);
	if (!b)
		return ERR_FORMAT;
	int type = tok_type(c->tok, id);
	if (type == TOK_TYPE_CONTROL) {
		*bytes = "";
		*len = 0;
		return 0;
	}
	*bytes = b;
	return 0;
}
