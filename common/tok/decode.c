/* Token ids -> bytes, whole or streamed. The bytes of every token were computed at load time
 * (vocab.c: inverse GPT-2 byte table for normal tokens, the text itself for special ones), so
 * decoding is concatenation. The streaming decoder holds back an incomplete UTF-8 character
 * until the token that completes it arrives, and replaces bytes that can never become a
 * character by U+FFFD, so what it emits is always valid UTF-8 (it goes into JSON / SSE). */
#include <string.h>

#include "common/tok/tok_internal.h"

static bool skipped(const struct tok *t, int32_t id, unsigned flags)
{
	return (flags & TOK_DECODE_SKIP_SPECIAL) && t->types[id] == TOK_TYPE_CONTROL;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags, char *buf, size_t cap,
               size_t *len, struct errbuf *e)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id < 0 || id >= t->n_vocab)
			return errbuf_set(e, ERR_FORMAT,
			                  "decode: token id %d at position %zu is out of range "
			                  "(vocab has %d tokens)",
			                  id, i, t->n_vocab);
		if (skipped(t, id, flags))
			continue;
		size_t k = t->dec_len[id];
		if (o + k <= cap)
			memcpy(buf + o, t->dec_blob + t->dec_off[id], k);
		o += k;
	}
	*len = o;
	if (o > cap)
		return errbuf_set(e, ERR_LIMIT, "decode: output needs %zu bytes, buffer has %zu", o, cap);
	return 0;
}

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags)
{
	memset(s, 0, sizeof(*s));
	s->t = t;
	s->flags = flags;
}

size_t tok_stream_max_out(const struct tok *t)
{
	/* held-back bytes + the token, every byte possibly becoming a 3-byte U+FFFD */
	return 3 * (t->max_dec_len + 4);
}

/* Emits the complete characters of pend + src; keeps an incomplete tail in pend unless final. */
static int emit(struct tok_stream *s, const uint8_t *src, size_t n, bool final, char *out, size_t cap,
                size_t *n_out, struct errbuf *e)
{
	size_t o = 0;
	size_t total = (size_t)s->n_pend + n, i = 0;
	uint8_t tmp[8];
	/* walk the concatenation without copying src: the first few bytes may come from pend */
	while (i < total) {
		size_t avail = total - i;
		size_t m = avail < 4 ? avail : 4;
		for (size_t j = 0; j < m; j++) {
			size_t p = i + j;
			tmp[j] = p < (size_t)s->n_pend ? s->pend[p] : src[p - (size_t)s->n_pend];
		}
		int k = tok_utf8_seq(tmp, m);
		if (k == 0 && !final) {
			/* incomplete character at the end: hold it back */
			for (size_t j = 0; j < m; j++)
				s->pend[j] = tmp[j];
			s->n_pend = (int)m;
			*n_out = o;
			return 0;
		}
		if (k > 0) {
			if (o + (size_t)k > cap)
				goto full;
			memcpy(out + o, tmp, (size_t)k);
			o += (size_t)k;
			i += (size_t)k;
		} else {
			if (o + 3 > cap)
				goto full;
			memcpy(out + o, "\xEF\xBF\xBD", 3);
			o += 3;
			i += k == 0 ? m : (size_t)-k;
		}
	}
	s->n_pend = 0;
	*n_out = o;
	return 0;
full:
	return errbuf_set(e, ERR_LIMIT, "stream decode: output buffer of %zu bytes is too small", cap);
}

int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out, struct errbuf *e)
{
	const struct tok *t = s->t;
	*n_out = 0;
	if (id < 0 || id >= t->n_vocab)
		return errbuf_set(e, ERR_FORMAT, "decode: token id %d is out of range (vocab has %d tokens)",
		                  id, t->n_vocab);
	if (skipped(t, id, s->flags))
		return 0;
	return emit(s, (const uint8_t *)t->dec_blob + t->dec_off[id], t->dec_len[id], false, out, cap, n_out,
	            e);
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out, struct errbuf *e)
{
	*n_out = 0;
	return emit(s, NULL, 0, true, out, cap, n_out, e);
}
