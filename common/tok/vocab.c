/* Builds a struct tok from GGUF metadata (MODEL-SPEC.md §4.2): token strings and types, merges
 * (either "left right" strings or 2-element string arrays), special ids and add_bos, then the
 * lookup tables encode needs (string -> id, merge pair -> rank, special-token trie, the decoded
 * bytes of every token). Everything read from the file is validated here, once, so that encode
 * and decode can trust the tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"
#include "common/tok/tok_internal.h"

static uint32_t pow2_at_least(uint64_t n)
{
	uint64_t p = 16;
	while (p < n)
		p <<= 1;
	return (uint32_t)p;
}

/* Token-string lookup of the concatenation a + b (b may be empty). */
static int32_t find2(const struct tok *t, const char *a, size_t na, const char *b, size_t nb)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < na; i++) {
		h ^= (uint8_t)a[i];
		h *= 16777619u;
	}
	for (size_t i = 0; i < nb; i++) {
		h ^= (uint8_t)b[i];
		h *= 16777619u;
	}
	for (uint32_t i = h & t->str_mask;; i = (i + 1) & t->str_mask) {
		int32_t id = t->str_tab[i];
		if (id < 0)
			return -1;
		const char *s = t->text_blob + t->text_off[id];
		if (t->text_len[id] == na + nb && memcmp(s, a, na) == 0 && memcmp(s + na, b, nb) == 0)
			return id;
	}
}

int32_t tok_find(const struct tok *t, const char *text, size_t len)
{
	return find2(t, text, len, "", 0);
}

static int load_tokens(struct tok *t, const struct gguf_ctx *g, struct errbuf *e)
{
	struct gguf_arr a;
	int rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &a, e);
	if (rc == ERR_NOTFOUND)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.tokens: key missing");
	if (rc)
		return rc;
	if (a.type != GGUF_VT_STRING)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.tokens: expected an array of strings");
	if (a.count == 0 || a.count > TOK_MAX_VOCAB)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens (allowed 1..%d)",
		                  (unsigned long long)a.count, TOK_MAX_VOCAB);
	int32_t n = (int32_t)a.count;
	t->n_vocab = n;
	uint64_t total = 0;
	for (int32_t i = 0; i < n; i++) {
		size_t len;
		if (!gguf_arr_str(&a, (uint64_t)i, &len))
			return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.tokens[%d]: unreadable", i);
		if (len > TOK_MAX_TOKEN_LEN)
			return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.tokens[%d]: %zu bytes (max %d)", i,
			                  len, TOK_MAX_TOKEN_LEN);
		total += len;
	}
	if (total >= UINT32_MAX)
		return errbuf_set(e, ERR_FORMAT,
		                  "tokenizer.ggml.tokens: %llu bytes of token text (max 4 GiB)",
		                  (unsigned long long)total);
	t->text_off = malloc(sizeof(uint32_t) * (size_t)n);
	t->text_len = malloc(sizeof(uint32_t) * (size_t)n);
	t->text_blob = malloc(total + 1);
	t->types = malloc((size_t)n);
	if (!t->text_off || !t->text_len || !t->text_blob || !t->types)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory for %d tokens", n);
	uint64_t off = 0;
	for (int32_t i = 0; i < n; i++) {
		size_t len;
		const char *s = gguf_arr_str(&a, (uint64_t)i, &len);
		memcpy(t->text_blob + off, s, len);
		t->text_off[i] = (uint32_t)off;
		t->text_len[i] = (uint32_t)len;
		off += len;
	}

	/* token types: absent means all normal (llama.cpp does the same) */
	memset(t->types, TOK_TYPE_NORMAL, (size_t)n);
	rc = gguf_get_arr(g, "tokenizer.ggml.token_type", &a, e);
	if (rc && rc != ERR_NOTFOUND)
		return rc;
	if (rc == 0) {
		if (a.count != (uint64_t)n)
			return errbuf_set(e, ERR_FORMAT,
			                  "tokenizer.ggml.token_type: %llu entries for %d tokens",
			                  (unsigned long long)a.count, n);
		if (a.type == GGUF_VT_STRING || a.type == GGUF_VT_ARRAY || a.type == GGUF_VT_F32 ||
		    a.type == GGUF_VT_F64)
			return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.token_type: expected integers");
		for (int32_t i = 0; i < n; i++) {
			int64_t ty = gguf_arr_int(&a, (uint64_t)i);
			if (ty < TOK_TYPE_NORMAL || ty > TOK_TYPE_BYTE)
				return errbuf_set(e, ERR_FORMAT,
				                  "tokenizer.ggml.token_type[%d] = %lld: expected 1..6", i,
				                  (long long)ty);
			t->types[i] = (uint8_t)ty;
		}
	}

	/* string -> id; a duplicated string keeps its first id */
	t->str_mask = pow2_at_least((uint64_t)n * 2) - 1;
	t->str_tab = malloc(sizeof(int32_t) * ((size_t)t->str_mask + 1));
	if (!t->str_tab)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory");
	memset(t->str_tab, 0xff, sizeof(int32_t) * ((size_t)t->str_mask + 1));
	for (int32_t id = 0; id < n; id++) {
		const char *s = t->text_blob + t->text_off[id];
		uint32_t len = t->text_len[id];
		for (uint32_t i = tok_hash_bytes(s, len) & t->str_mask;; i = (i + 1) & t->str_mask) {
			int32_t o = t->str_tab[i];
			if (o < 0) {
				t->str_tab[i] = id;
				break;
			}
			if (t->text_len[o] == len && memcmp(t->text_blob + t->text_off[o], s, len) == 0)
				break;
		}
	}
	return 0;
}

/* Bytes each token decodes to. Normal tokens: every character maps back through the byte-level
 * alphabet; if any character is outside it the token's own UTF-8 is used (the HF ByteLevel
 * decoder does the same). Control/user-defined/unknown: their text. Unused: nothing. */
static int build_decoded(struct tok *t, struct errbuf *e)
{
	int16_t cp2b[256 + 68];
	for (int i = 0; i < 256 + 68; i++)
		cp2b[i] = -1;
	for (int b = 0; b < 256; b++)
		cp2b[tok_byte_to_cp((uint8_t)b)] = (int16_t)b;

	size_t n = (size_t)t->n_vocab;
	size_t total = t->text_off[n - 1] + (size_t)t->text_len[n - 1];
	t->dec_blob = malloc(total + 1);
	t->dec_off = malloc(sizeof(uint32_t) * n);
	t->dec_len = malloc(sizeof(uint32_t) * n);
	if (!t->dec_blob || !t->dec_off || !t->dec_len)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory");
	size_t off = 0;
	for (size_t id = 0; id < n; id++) {
		const uint8_t *s = (const uint8_t *)t->text_blob + t->text_off[id];
		size_t len = t->text_len[id], out = off;
		t->dec_off[id] = (uint32_t)off;
		int ty = t->types[id];
		bool raw = ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN;
		if (ty == TOK_TYPE_UNUSED) {
			t->dec_len[id] = 0;
			continue;
		}
		if (!raw) {
			for (size_t i = 0; i < len;) {
				int k = tok_utf8_seq(s + i, len - i);
				uint32_t cp;
				if (k == 1) {
					cp = s[i];
				} else if (k == 2) {
					cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
				} else {
					raw = true; /* 3-4 byte characters are never in the alphabet */
					break;
				}
				if (cp >= 256 + 68 || cp2b[cp] < 0) {
					raw = true;
					break;
				}
				t->dec_blob[out++] = (char)cp2b[cp];
				i += (size_t)k;
			}
		}
		if (raw) {
			memcpy(t->dec_blob + off, s, len);
			out = off + len;
		}
		t->dec_len[id] = (uint32_t)(out - off);
		if (out - off > t->max_dec_len)
			t->max_dec_len = out - off;
		off = out;
	}
	return 0;
}

static int merge_insert(struct tok *t, int32_t l, int32_t r, uint32_t rank, int32_t merged)
{
	uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
	for (uint32_t i = tok_hash_u64(key) & t->mg_mask;; i = (i + 1) & t->mg_mask) {
		if (t->mg[i].key == key)
			return 0; /* a repeated pair keeps its first (lowest) rank */
		if (t->mg[i].key == UINT64_MAX) {
			t->mg[i] = (struct tok_merge_slot){key, rank, merged};
			return 0;
		}
	}
}

static int load_merges(struct tok *t, const struct gguf_ctx *g, struct errbuf *e)
{
	struct gguf_arr a;
	int rc = gguf_get_arr(g, "tokenizer.ggml.merges", &a, e);
	if (rc == ERR_NOTFOUND)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.merges: key missing (BPE needs merges)");
	if (rc)
		return rc;
	if (a.type != GGUF_VT_STRING && a.type != GGUF_VT_ARRAY)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.merges: expected strings or string pairs");
	if (a.count >= UINT32_MAX / 4)
		return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.merges: %llu merges is too many",
		                  (unsigned long long)a.count);
	t->n_merges = (uint32_t)a.count;
	t->mg_mask = pow2_at_least((uint64_t)a.count * 3 / 2 + 1) - 1; /* load <= 2/3 */
	size_t cap = (size_t)t->mg_mask + 1;
	t->mg = malloc(sizeof(*t->mg) * cap);
	if (!t->mg)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory for merges");
	for (size_t i = 0; i < cap; i++)
		t->mg[i].key = UINT64_MAX;

	for (uint32_t m = 0; m < t->n_merges; m++) {
		const char *ls, *rs;
		size_t ll, rl;
		if (a.type == GGUF_VT_STRING) {
			size_t len;
			const char *s = gguf_arr_str(&a, m, &len);
			/* split at the first space after the first byte (a token may itself start
			 * with a space in non-byte-level vocabularies) */
			const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
			if (!s || !sp)
				return errbuf_set(e, ERR_FORMAT,
				                  "tokenizer.ggml.merges[%u]: '%.*s' is not 'left right'", m,
				                  (int)(len > 64 ? 64 : len), s ? s : "");
			ls = s;
			ll = (size_t)(sp - s);
			rs = sp + 1;
			rl = len - ll - 1;
		} else {
			struct gguf_arr p;
			if (gguf_arr_sub(&a, m, &p) || p.type != GGUF_VT_STRING || p.count != 2)
				return errbuf_set(e, ERR_FORMAT,
				                  "tokenizer.ggml.merges[%u]: expected a pair of strings", m);
			ls = gguf_arr_str(&p, 0, &ll);
			rs = gguf_arr_str(&p, 1, &rl);
			if (!ls || !rs)
				return errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.merges[%u]: unreadable", m);
		}
		int32_t l = find2(t, ls, ll, "", 0), r = find2(t, rs, rl, "", 0);
		int32_t mid = find2(t, ls, ll, rs, rl);
		if (l < 0 || r < 0 || mid < 0) {
			const char *what = l < 0 ? "left part" : r < 0 ? "right part" : "merged token";
			return errbuf_set(e, ERR_FORMAT,
			                  "tokenizer.ggml.merges[%u] '%.*s' + '%.*s': %s is not in the vocab",
			                  m, (int)(ll > 64 ? 64 : ll), ls, (int)(rl > 64 ? 64 : rl), rs,
			                  what);
		}
		rc = merge_insert(t, l, r, m, mid);
		if (rc)
			return rc;
	}
	return 0;
}

static int trie_add(struct tok *t, int32_t id, struct errbuf *e)
{
	const uint8_t *s = (const uint8_t *)t->text_blob + t->text_off[id];
	uint32_t len = t->text_len[id];
	int32_t node = 0;
	for (uint32_t k = 0; k < len; k++) {
		uint64_t key = ((uint64_t)(uint32_t)node << 8) | s[k];
		uint32_t i = tok_hash_u64(key) & t->tr_mask;
		while (t->tr_key[i] != UINT64_MAX && t->tr_key[i] != key)
			i = (i + 1) & t->tr_mask;
		if (t->tr_key[i] == UINT64_MAX) {
			t->tr_key[i] = key;
			t->tr_child[i] = t->n_trie_nodes;
			t->trie_tok[t->n_trie_nodes++] = -1;
		}
		node = t->tr_child[i];
	}
	if (t->trie_tok[node] < 0)
		t->trie_tok[node] = id; /* the same text twice: the first id wins */
	(void)e;
	return 0;
}

static bool is_special_type(int ty)
{
	return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED;
}

static int build_trie(struct tok *t, struct errbuf *e)
{
	uint64_t n_edges = 0;
	for (int32_t id = 0; id < t->n_vocab; id++)
		if (is_special_type(t->types[id]))
			n_edges += t->text_len[id];
	if (n_edges == 0)
		return 0;
	t->tr_mask = pow2_at_least(n_edges * 2) - 1;
	size_t cap = (size_t)t->tr_mask + 1;
	t->tr_key = malloc(sizeof(uint64_t) * cap);
	t->tr_child = malloc(sizeof(int32_t) * cap);
	t->trie_tok = malloc(sizeof(int32_t) * (n_edges + 1));
	if (!t->tr_key || !t->tr_child || !t->trie_tok)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory for the special-token trie");
	memset(t->tr_key, 0xff, sizeof(uint64_t) * cap);
	t->trie_tok[0] = -1;
	t->n_trie_nodes = 1;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		if (!is_special_type(t->types[id]) || t->text_len[id] == 0)
			continue;
		t->special_first[(uint8_t)t->text_blob[t->text_off[id]]] = true;
		int rc = trie_add(t, id, e);
		if (rc)
			return rc;
	}
	return 0;
}

static int load_id(const struct tok *t, const struct gguf_ctx *g, const char *key, int32_t *out,
                   struct errbuf *e)
{
	uint32_t v;
	*out = -1;
	int rc = gguf_get_u32(g, key, &v, e);
	if (rc == ERR_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if (v >= (uint32_t)t->n_vocab)
		return errbuf_set(e, ERR_FORMAT, "%s = %u: out of range (vocab has %d tokens)", key, v,
		                  t->n_vocab);
	*out = (int32_t)v;
	return 0;
}

int tok_load(struct tok **out, const struct gguf_ctx *g, struct errbuf *e)
{
	*out = NULL;
	struct tok *t = calloc(1, sizeof(*t));
	if (!t)
		return errbuf_set(e, -ENOMEM, "tokenizer: out of memory");
	int rc;
	const char *s;
	size_t len;

	rc = gguf_get_str(g, "tokenizer.ggml.model", &s, &len, e);
	if (rc == ERR_NOTFOUND) {
		rc =
		    errbuf_set(e, ERR_FORMAT, "tokenizer.ggml.model: key missing (no tokenizer in the file)");
		goto fail;
	}
	if (rc)
		goto fail;
	if (len != 4 || memcmp(s, "gpt2", 4) != 0) {
		rc = errbuf_set(e, ERR_UNSUPPORTED,
		                "tokenizer.ggml.model '%.*s' is not supported (only 'gpt2', byte-level BPE)",
		                (int)(len > 64 ? 64 : len), s);
		goto fail;
	}

	rc = gguf_get_str(g, "tokenizer.ggml.pre", &s, &len, e);
	if (rc == ERR_NOTFOUND) {
		s = "gpt2";
		len = 4;
	} else if (rc) {
		goto fail;
	}
	t->pre_name = strndup(s, len > 64 ? 64 : len);
	if (!t->pre_name) {
		rc = errbuf_set(e, -ENOMEM, "tokenizer: out of memory");
		goto fail;
	}
	if (strlen(t->pre_name) != len || tok_pre_from_name(t->pre_name, &t->pre)) {
		rc = errbuf_set(e, ERR_UNSUPPORTED,
		                "tokenizer.ggml.pre '%s' is not supported (known: gpt2, llama-bpe, llama3, "
		                "glm4, chatglm-bpe, deepseek-v3, deepseek-llm, qwen2)",
		                t->pre_name);
		goto fail;
	}

	if ((rc = load_tokens(t, g, e)) || (rc = build_decoded(t, e)) || (rc = load_merges(t, g, e)) ||
	    (rc = build_trie(t, e)))
		goto fail;

	for (int b = 0; b < 256; b++) {
		uint32_t cp = tok_byte_to_cp((uint8_t)b);
		char u[2];
		size_t n = 1;
		if (cp < 0x80) {
			u[0] = (char)cp;
		} else {
			u[0] = (char)(0xC0 | (cp >> 6));
			u[1] = (char)(0x80 | (cp & 0x3F));
			n = 2;
		}
		t->byte_sym[b] = tok_find(t, u, n);
	}

	if ((rc = load_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos, e)) ||
	    (rc = load_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos, e)) ||
	    (rc = load_id(t, g, "tokenizer.ggml.eot_token_id", &t->eot, e)) ||
	    (rc = load_id(t, g, "tokenizer.ggml.eom_token_id", &t->eom, e)) ||
	    (rc = load_id(t, g, "tokenizer.ggml.unknown_token_id", &t->unk, e)) ||
	    (rc = load_id(t, g, "tokenizer.ggml.padding_token_id", &t->pad, e)))
		goto fail;
	rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, e);
	if (rc == ERR_NOTFOUND)
		t->add_bos = false;
	else if (rc)
		goto fail;
	if (t->add_bos && t->bos < 0) {
		rc = errbuf_set(e, ERR_FORMAT,
		                "tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
		goto fail;
	}

	rc = tok_pretok_compile(&t->pt, t->pre, e);
	if (rc)
		goto fail;
	*out = t;
	return 0;
fail:
	tok_destroy(t);
	return rc;
}

void tok_destroy(struct tok *t)
{
	if (!t)
		return;
	tok_pretok_free(&t->pt);
	free(t->text_blob);
	free(t->text_off);
	free(t->text_len);
	free(t->dec_blob);
	free(t->dec_off);
	free(t->dec_len);
	free(t->types);
	free(t->str_tab);
	free(t->mg);
	free(t->tr_key);
	free(t->tr_child);
	free(t->trie_tok);
	free(t->pre_name);
	free(t);
}

int32_t tok_n_vocab(const struct tok *t)
{
	return t->n_vocab;
}
enum tok_pre tok_pre_type(const struct tok *t)
{
	return t->pre;
}
const char *tok_pre_name(const struct tok *t)
{
	return t->pre_name;
}
const char *tok_text(const struct tok *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	*len = t->text_len[id];
	return t->text_blob + t->text_off[id];
}
const char *tok_bytes(const struct tok *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	*len = t->dec_len[id];
	return t->dec_blob + t->dec_off[id];
}
int tok_type(const struct tok *t, int32_t id)
{
	return id < 0 || id >= t->n_vocab ? -1 : t->types[id];
}
int32_t tok_bos(const struct tok *t)
{
	return t->bos;
}
int32_t tok_eos(const struct tok *t)
{
	return t->eos;
}
int32_t tok_eot(const struct tok *t)
{
	return t->eot;
}
int32_t tok_eom(const struct tok *t)
{
	return t->eom;
}
int32_t tok_unk(const struct tok *t)
{
	return t->unk;
}
int32_t tok_pad(const struct tok *t)
{
	return t->pad;
}
bool tok_add_bos(const struct tok *t)
{
	return t->add_bos;
}
bool tok_is_eog(const struct tok *t, int32_t id)
{
	return id >= 0 && (id == t->eos || id == t->eot || id == t->eom);
}
size_t tok_max_token_bytes(const struct tok *t)
{
	return t->max_dec_len;
}
