/* Byte-level codec (see codec.h): ids 0..255 are the bytes themselves and 256 ends a sequence.
 * It stands in for the model tokenizer when the router serves the simulated engine, which keeps
 * the HTTP/API tests independent of any vocabulary. The chat "template" marks each turn with its
 * role so that different conversations give different prompts. */
#include "router/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct codec {
	char bytes[256];
};

struct codec *codec_create_bytes(void)
{
	struct codec *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	for (int i = 0; i < 256; i++)
		c->bytes[i] = (char)i;
	return c;
}

void codec_destroy(struct codec *c) { free(c); }

uint32_t codec_n_vocab(const struct codec *c) { (void)c; return 257; }
int32_t codec_eos(const struct codec *c) { (void)c; return 256; }

int codec_encode(const struct codec *c, const char *text, size_t len, int32_t **ids, uint32_t *n_ids,
		 struct errbuf *e)
{
	(void)c;
	if (len > UINT32_MAX - 1)
		return errbuf_set(e, ERR_LIMIT, "prompt of %zu bytes is too long", len);
	int32_t *v = malloc((len + 1) * sizeof(int32_t));
	if (!v)
		return errbuf_set(e, -ENOMEM, "out of memory encoding the prompt");
	for (size_t i = 0; i < len; i++)
		v[i] = (unsigned char)text[i];
	*ids = v;
	*n_ids = (uint32_t)len;
	return 0;
}

int codec_chat(const struct codec *c, const struct api_message *m, size_t n, char **out, struct errbuf *e)
{
	(void)c;
	size_t total = 32;
	for (size_t i = 0; i < n; i++) {
		size_t add = strlen(m[i].role) + strlen(m[i].content) + 8;
		if (total > SIZE_MAX / 2 - add)
			return errbuf_set(e, ERR_LIMIT, "conversation is too long");
		total += add;
	}
	char *s = malloc(total);
	if (!s)
		return errbuf_set(e, -ENOMEM, "out of memory rendering the conversation");
	size_t off = 0;
	for (size_t i = 0; i < n; i++)
		off += (size_t)snprintf(s + off, total - off, "<|%s|>%s\n", m[i].role, m[i].content);
	snprintf(s + off, total - off, "<|assistant|>");
	*out = s;
	return 0;
}

int codec_token_bytes(const struct codec *c, int32_t id, const char **bytes, size_t *len)
{
	if (id == 256) {
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
