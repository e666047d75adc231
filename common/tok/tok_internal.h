/* Internals of the tokenizer shared by its files (vocab.c builds struct tok; pretok.c, bpe.c,
 * encode.c and decode.c read it). Not for use outside common/tok. */
#ifndef TANDEM_TOK_INTERNAL_H
#define TANDEM_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/tok/tok.h"

#define TOK_MAX_REGEX 8
#define TOK_MAX_VOCAB (1 << 24) /* far above any real vocab; keeps ids and offsets in 32 bits */
#define TOK_MAX_TOKEN_LEN 4096 /* bytes of one token string */

/* The compiled pre-tokenizer: regexes applied in sequence, each splitting the pieces of the
 * previous one and keeping matches and the text between them ("Isolated" in HF terms). */
struct tok_pretok {
	pcre2_code *re[TOK_MAX_REGEX];
	int n_re;
};

struct tok_merge_slot {
	uint64_t key; /* UINT64_MAX: empty */
	uint32_t rank;
	int32_t merged;
};

struct tok {
	int32_t n_vocab;
	/* token strings as stored in the vocab, and the bytes each decodes to */
	char *text_blob;
	uint32_t *text_off, *text_len;
	char *dec_blob;
	uint32_t *dec_off, *dec_len;
	uint8_t *types;
	size_t max_dec_len;

	/* token string -> id: open addressing over ids, -1 empty */
	int32_t *str_tab;
	uint32_t str_mask;

	/* merge pair (left << 32 | right) -> rank and merged id, one 16-byte slot per entry so a
	 * lookup touches one cache line */
	struct tok_merge_slot *mg;
	uint32_t mg_mask;
	uint32_t n_merges;

	int32_t byte_sym[256]; /* initial BPE symbol of each byte, -1 if the vocab lacks it */

	/* special-token trie: node 0 is the root; edge (node << 8 | byte) -> child in a hash;
	 * trie_tok[node] is the token ending there or -1 */
	uint64_t *tr_key; /* UINT64_MAX empty */
	int32_t *tr_child;
	uint32_t tr_mask;
	int32_t *trie_tok;
	int32_t n_trie_nodes;
	bool special_first[256];

	int32_t bos, eos, eot, eom, unk, pad;
	bool add_bos;
	enum tok_pre pre;
	char *pre_name;
	struct tok_pretok pt;
};

/* FNV-1a over bytes: hash for the token-string table. */
static inline uint32_t tok_hash_bytes(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 16777619u;
	}
	return h;
}

/* 64-bit mix (splitmix64 finaliser) for the pair and trie tables. */
static inline uint32_t tok_hash_u64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (uint32_t)x;
}

/* Merge lookup: returns true and fills rank/merged id if (left, right) is a merge. */
static inline bool tok_merge_find(const struct tok *t, int32_t left, int32_t right, uint32_t *rank,
                                  int32_t *merged)
{
	if (!t->mg)
		return false;
	uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
	for (uint32_t i = tok_hash_u64(key) & t->mg_mask;; i = (i + 1) & t->mg_mask) {
		const struct tok_merge_slot *m = &t->mg[i];
		if (m->key == key) {
			*rank = m->rank;
			*merged = m->merged;
			return true;
		}
		if (m->key == UINT64_MAX)
			return false;
	}
}

/* Trie step: child of node for byte b, or -1. */
static inline int32_t tok_trie_next(const struct tok *t, int32_t node, uint8_t b)
{
	if (!t->tr_key)
		return -1;
	uint64_t key = ((uint64_t)(uint32_t)node << 8) | b;
	for (uint32_t i = tok_hash_u64(key) & t->tr_mask;; i = (i + 1) & t->tr_mask) {
		if (t->tr_key[i] == UINT64_MAX)
			return -1;
		if (t->tr_key[i] == key)
			return t->tr_child[i];
	}
}

/* pretok.c */
int tok_pretok_compile(struct tok_pretok *pt, enum tok_pre pre, struct errbuf *e);
void tok_pretok_free(struct tok_pretok *pt);
int tok_pre_from_name(const char *name, enum tok_pre *out);

/* bpe.c: scratch reused across the pieces of one encode */
struct tok_bpe_work {
	struct tok_bpe_sym *sym;
	struct tok_bpe_ent *heap;
	size_t cap_sym, cap_heap, n_heap;
};
void tok_bpe_work_free(struct tok_bpe_work *w);
/* BPE over one pre-token piece; appends ids to out (bounded by n_out_max). */
int tok_bpe_piece(const struct tok *t, struct tok_bpe_work *w, const uint8_t *piece, size_t len, int32_t *out,
                  size_t n_out_max, size_t *n_out, struct tok_stats *st, struct errbuf *e);

/* Byte <-> code point maps of the GPT-2 byte-level alphabet. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

#endif
