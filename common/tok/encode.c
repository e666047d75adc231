/* Text -> token ids. Order of work (HF tokenizers semantics):
 *   1. the input is checked once for valid UTF-8 (or invalid bytes replaced by U+FFFD when the
 *      caller asks), so PCRE2 can then match with PCRE2_NO_UTF_CHECK: checking on every call
 *      would make matching quadratic in the input length;
 *   2. special tokens (control / user-defined) written in the text are found with a byte trie,
 *      leftmost first and longest at that position; they become one id each;
 *   3. each stretch of text between them goes through the pre-tokenizer regexes (pretok.c) and
 *      every resulting piece through BPE (bpe.c).
 * Scratch (PCRE2 match data, JIT stack, BPE arrays) is per call, so a tok is shareable. */
#include <stdlib.h>
#include <string.h>

#include "common/tok/tok_internal.h"

struct enc {
	const struct tok *t;
	pcre2_match_data *md;
	pcre2_match_context *mc;
	pcre2_jit_stack *js;
	struct tok_bpe_work bw;
	int32_t *ids;
	size_t n_ids_max, n_ids;
	struct tok_stats *st;
	struct errbuf *e;
};

static int split(struct enc *x, const uint8_t *s, size_t n, int level)
{
	if (n == 0)
		return 0;
	if (level == x->t->pt.n_re) {
		x->st->n_pieces++;
		return tok_bpe_piece(x->t, &x->bw, s, n, x->ids, x->n_ids_max, &x->n_ids, x->st, x->e);
	}
	const pcre2_code *re = x->t->pt.re[level];
	size_t pos = 0, last = 0;
	int rc;
	while (pos < n) {
		x->st->n_regex_calls++;
		int m = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, x->md, x->mc);
		if (m == PCRE2_ERROR_JIT_STACKLIMIT && !x->js) {
			/* the 32 KiB default JIT stack sufficed so far; give this input a larger one */
			x->mc = pcre2_match_context_create(NULL);
			x->js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
			if (!x->mc || !x->js)
				return errbuf_set(x->e, -ENOMEM,
				                  "tokenizer: out of memory for regex matching");
			pcre2_jit_stack_assign(x->mc, NULL, x->js);
			x->st->n_regex_calls++;
			m = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, x->md, x->mc);
		}
		if (m == PCRE2_ERROR_NOMATCH)
			break;
		if (m < 0) {
			PCRE2_UCHAR msg[160];
			pcre2_get_error_message(m, msg, sizeof(msg));
			return errbuf_set(x->e, m == PCRE2_ERROR_NOMEMORY ? -ENOMEM : ERR_LIMIT,
			                  "pre-tokenizer: regex %d failed at byte %zu: %s", level, pos,
			                  (const char *)msg);
		}
		const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(x->md);
		size_t ms = ov[0], me = ov[1];
		if (me <= ms) {
			/* empty match (none of our patterns has one): step over one character */
			if (ms >= n)
				break;
			int k = tok_utf8_seq(s + ms, n - ms);
			pos = ms + (size_t)(k > 0 ? k : 1);
			continue;
		}
		if (ms > last && (rc = split(x, s + last, ms - last, level + 1)))
			return rc;
		if ((rc = split(x, s + ms, me - ms, level + 1)))
			return rc;
		last = pos = me;
	}
	if (last < n)
		return split(x, s + last, n - last, level + 1);
	return 0;
}

static int push_id(struct enc *x, int32_t id)
{
	if (x->n_ids >= x->n_ids_max)
		return errbuf_set(x->e, ERR_LIMIT, "tokenizer: more than %zu tokens", x->n_ids_max);
	x->ids[x->n_ids++] = id;
	return 0;
}

/* Copy of s with each maximal invalid subsequence replaced by U+FFFD. */
static char *replace_invalid(const char *s, size_t len, size_t *out_len)
{
	if (len > (SIZE_MAX - 1) / 3)
		return NULL;
	char *o = malloc(len * 3 + 1);
	if (!o)
		return NULL;
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0, n = 0;
	while (i < len) {
		int k = tok_utf8_seq(u + i, len - i);
		if (k > 0) {
			memcpy(o + n, u + i, (size_t)k);
			n += (size_t)k;
			i += (size_t)k;
			continue;
		}
		memcpy(o + n, "\xEF\xBF\xBD", 3);
		n += 3;
		i += k == 0 ? len - i : (size_t)-k;
	}
	*out_len = n;
	return o;
}

int tok_encode_spans(const struct tok *t, const char *text, size_t len, unsigned flags,
                     const struct tok_span *spans, size_t n_spans, int32_t *ids, size_t n_ids_max,
                     size_t *n_ids, struct tok_stats *stats, struct errbuf *e)
{
	struct tok_stats local;
	struct enc x = {.t = t, .ids = ids, .n_ids_max = n_ids_max, .st = stats ? stats : &local, .e = e};
	char *fixed = NULL;
	int rc = 0;
	*n_ids = 0;
	memset(x.st, 0, sizeof(*x.st));

	size_t bad = tok_utf8_check(text, len);
	if (bad < len) {
		if (!(flags & TOK_ENCODE_REPLACE_INVALID) || spans)
			return errbuf_set(e, ERR_FORMAT,
			                  "text is not valid UTF-8 (byte 0x%02x at offset %zu)",
			                  (uint8_t)text[bad], bad);
		fixed = replace_invalid(text, len, &len);
		if (!fixed)
			return errbuf_set(e, -ENOMEM, "tokenizer: out of memory");
		text = fixed;
	}
	x.st->n_bytes = len;

	x.md = pcre2_match_data_create(1, NULL);
	if (!x.md) {
		rc = errbuf_set(e, -ENOMEM, "tokenizer: out of memory for regex matching");
		goto cleanup;
	}

	if ((flags & TOK_ENCODE_ADD_BOS) && t->add_bos && (rc = push_id(&x, t->bos)))
		goto cleanup;

	const uint8_t *s = (const uint8_t *)text;
	bool specials = !(flags & TOK_ENCODE_NO_SPECIAL) && t->tr_key;
	size_t seg = 0, i = 0, si = 0;
	while (i < len) {
		if (!specials || !t->special_first[s[i]]) {
			i++;
			continue;
		}
		size_t lim = len;
		if (spans) {
			while (si < n_spans && spans[si].off + spans[si].len <= i)
				si++;
			if (si >= n_spans || spans[si].off > i) {
				i++;
				continue;
			}
			lim = spans[si].off + spans[si].len;
		}
		int32_t node = 0, best = -1;
		size_t best_end = 0;
		for (size_t k = i; k < lim; k++) {
			x.st->n_trie_steps++;
			node = tok_trie_next(t, node, s[k]);
			if (node < 0)
				break;
			if (t->trie_tok[node] >= 0) {
				best = t->trie_tok[node];
				best_end = k + 1;
			}
		}
		if (best < 0) {
			i++;
			continue;
		}
		if ((rc = split(&x, s + seg, i - seg, 0)) || (rc = push_id(&x, best)))
			goto cleanup;
		x.st->n_specials++;
		i = seg = best_end;
	}
	rc = split(&x, s + seg, len - seg, 0);
	/* a text that starts with the BOS token itself gets no second one (MODEL-SPEC §7.15) */
	if (!rc && (flags & TOK_ENCODE_ADD_BOS) && t->add_bos && x.n_ids >= 2 && ids[1] == t->bos) {
		memmove(ids, ids + 1, (x.n_ids - 1) * sizeof(*ids));
		x.n_ids--;
	}

cleanup:
	*n_ids = rc ? 0 : x.n_ids;
	tok_bpe_work_free(&x.bw);
	pcre2_jit_stack_free(x.js);
	pcre2_match_context_free(x.mc);
	pcre2_match_data_free(x.md);
	free(fixed);
	return rc;
}

int tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags, int32_t *ids,
               size_t n_ids_max, size_t *n_ids, struct tok_stats *stats, struct errbuf *e)
{
	return tok_encode_spans(t, text, len, flags, NULL, 0, ids, n_ids_max, n_ids, stats, e);
}
