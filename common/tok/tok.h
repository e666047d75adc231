/* Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.*), with the pre-tokenizer
 * regexes of the model families we serve, special-token matching, decoding and a streaming
 * decoder. The router links this without the model: it needs only common/base, common/gguf,
 * PCRE2 and libc.
 *
 * Semantics follow Hugging Face `tokenizers` (the expected ids in tests/data were produced with
 * it): special tokens (GGUF token types 3 control and 4 user-defined) written literally in the
 * text are matched first, leftmost then longest, and never merged; the text between them is split
 * by the pre-tokenizer regexes, mapped through the GPT-2 byte-to-unicode table and merged by rank
 * (lowest rank first, leftmost on ties).
 *
 * Invalid UTF-8 in the text to encode is an error (ERR_FORMAT naming the byte offset) unless
 * TOK_ENCODE_REPLACE_INVALID is given, in which case every maximal invalid subsequence is
 * replaced by U+FFFD before tokenizing.
 *
 * Ownership: struct tok copies everything it needs out of the GGUF (the file may be closed after
 * tok_load) and is immutable afterwards, so one tok may be used from several threads at once;
 * every encode allocates its own scratch. Strings returned by accessors are borrowed from the tok
 * and live until tok_destroy(). */
#ifndef TANDEM_TOK_H
#define TANDEM_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

struct gguf_ctx;
struct tok; /* opaque handle */

/* GGUF tokenizer.ggml.token_type values. */
enum tok_type {
	TOK_TYPE_NORMAL = 1,
	TOK_TYPE_UNKNOWN = 2,
	TOK_TYPE_CONTROL = 3,
	TOK_TYPE_USER_DEFINED = 4,
	TOK_TYPE_UNUSED = 5,
	TOK_TYPE_BYTE = 6,
};

/* Pre-tokenizer families (tokenizer.ggml.pre). */
enum tok_pre {
	TOK_PRE_GPT2 = 0, /* "gpt2" and the default when the key is absent */
	TOK_PRE_LLAMA3, /* "llama-bpe", "llama3" */
	TOK_PRE_GLM4, /* "glm4", "chatglm-bpe": the Llama-3 pattern */
	TOK_PRE_DEEPSEEK_V3, /* "deepseek-v3": three regexes in sequence */
	TOK_PRE_DEEPSEEK_LLM, /* "deepseek-llm" */
	TOK_PRE_QWEN2, /* "qwen2" */
};

/* Loads the tokenizer from the GGUF metadata. tokenizer.ggml.model must be "gpt2" (byte-level
 * BPE); anything else is ERR_UNSUPPORTED naming it. Malformed metadata (ids out of range, merges
 * naming tokens that do not exist, arrays of different lengths, ...) is ERR_FORMAT naming the key
 * and index. */
int tok_load(struct tok **out, const struct gguf_ctx *g, struct errbuf *e) TD_MUST_CHECK;
void tok_destroy(struct tok *t); /* accepts NULL */

int32_t tok_n_vocab(const struct tok *t);
enum tok_pre tok_pre_type(const struct tok *t);
const char *tok_pre_name(const struct tok *t); /* the tokenizer.ggml.pre string ("gpt2" if absent) */
/* The token's string as stored in the vocab (byte-level alphabet for normal tokens); NULL if the
 * id is out of range. Not NUL-terminated in general: use *len. */
const char *tok_text(const struct tok *t, int32_t id, size_t *len);
/* The bytes the token decodes to (what tok_decode emits for it); NULL if out of range. */
const char *tok_bytes(const struct tok *t, int32_t id, size_t *len);
int tok_type(const struct tok *t, int32_t id); /* enum tok_type, or -1 if out of range */
/* Exact vocab lookup of a token string; -1 if absent. */
int32_t tok_find(const struct tok *t, const char *text, size_t len);
/* Special ids from the metadata; -1 when the file has none. */
int32_t tok_bos(const struct tok *t);
int32_t tok_eos(const struct tok *t);
int32_t tok_eot(const struct tok *t);
int32_t tok_eom(const struct tok *t);
int32_t tok_unk(const struct tok *t);
int32_t tok_pad(const struct tok *t);
bool tok_add_bos(const struct tok *t); /* tokenizer.ggml.add_bos_token (false when absent) */
/* End of generation: eos, eot or eom. */
bool tok_is_eog(const struct tok *t, int32_t id);
/* Longest decoded token in bytes (sizes the streaming decoder's output). */
size_t tok_max_token_bytes(const struct tok *t);

/* ---- encode ------------------------------------------------------------------------------- */
#define TOK_ENCODE_ADD_BOS 1u /* prepend BOS if add_bos_token says so (not if the text starts with BOS) */
#define TOK_ENCODE_NO_SPECIAL 2u /* special-token text is tokenized as plain text */
#define TOK_ENCODE_REPLACE_INVALID 4u /* invalid UTF-8 -> U+FFFD instead of ERR_FORMAT */

/* A byte range of the text in which special tokens may be matched (see tok_encode_spans). */
struct tok_span {
	size_t off, len;
};

/* Work counters of one encode, for tests that check the cost is linear in the input. */
struct tok_stats {
	uint64_t n_bytes; /* bytes tokenized (after any U+FFFD replacement) */
	uint64_t n_specials; /* special tokens matched in the text */
	uint64_t n_pieces; /* pre-tokenizer pieces handed to BPE */
	uint64_t n_regex_calls; /* pcre2_match calls */
	uint64_t n_merges; /* BPE merges applied */
	uint64_t n_heap_ops; /* priority-queue pushes + pops */
	uint64_t n_trie_steps; /* bytes examined while looking for special tokens */
};

/* Upper bound on the ids an encode of len bytes can produce (each token covers at least one byte,
 * plus a BOS): size the ids array with this to never see ERR_LIMIT. With
 * TOK_ENCODE_REPLACE_INVALID each invalid byte may grow into the 3 bytes of U+FFFD: use
 * tok_encode_max(3 * len) then. */
static inline size_t tok_encode_max(size_t len)
{
	return len + 1;
}

/* Tokenizes text[0..len). Writes at most n_ids_max ids; more is ERR_LIMIT (nothing useful is
 * left in ids then). stats may be NULL. */
int tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags, int32_t *ids,
               size_t n_ids_max, size_t *n_ids, struct tok_stats *stats, struct errbuf *e) TD_MUST_CHECK;

/* Like tok_encode, but special tokens are matched only where they lie entirely inside one of the
 * n_spans spans (sorted, non-overlapping). The chat renderer uses this so that special-token text
 * inside user content stays plain text while the tokens the template emits are special. */
int tok_encode_spans(const struct tok *t, const char *text, size_t len, unsigned flags,
                     const struct tok_span *spans, size_t n_spans, int32_t *ids, size_t n_ids_max,
                     size_t *n_ids, struct tok_stats *stats, struct errbuf *e) TD_MUST_CHECK;

/* ---- decode ------------------------------------------------------------------------------- */
#define TOK_DECODE_SKIP_SPECIAL 1u /* control tokens decode to nothing */

/* ids -> bytes. Normal tokens go through the inverse GPT-2 byte table; control and user-defined
 * tokens decode to their text; unused tokens ([PAD<id>]) decode to nothing. The output is the raw
 * byte concatenation (it may be invalid UTF-8 if the ids split a character). Writes at most cap
 * bytes; *len gets the full length needed, and ERR_LIMIT if it did not fit. An id out of range is
 * ERR_FORMAT. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags, char *buf, size_t cap,
               size_t *len, struct errbuf *e) TD_MUST_CHECK;

/* Streaming decoder: fed one id at a time, emits only complete UTF-8 characters and holds back
 * the start of a character split across tokens (at most 3 bytes). Bytes that can never form a
 * valid character are emitted as U+FFFD (one per maximal invalid subsequence, the Unicode
 * "substitution of maximal subparts" practice), so the output is always valid UTF-8 and safe to
 * put into JSON; for ids whose full decode is valid UTF-8 the concatenated output equals
 * tok_decode's. tok_stream_flush emits what is held back (an incomplete character as U+FFFD). */
struct tok_stream {
	const struct tok *t;
	unsigned flags;
	uint8_t pend[4];
	int n_pend;
};

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags);
/* Bytes one tok_stream_feed may write at most; size out with this. */
size_t tok_stream_max_out(const struct tok *t);
int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out,
                    struct errbuf *e) TD_MUST_CHECK;
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out,
                     struct errbuf *e) TD_MUST_CHECK;

/* ---- UTF-8 helpers (shared by encode, the stream decoder and the chat renderer) ------------- */
/* Length of the valid UTF-8 sequence starting at s[0] (1..4), 0 if s[0..n) starts with a
 * truncated but so far valid sequence, or -k if the first k bytes (k >= 1) are a maximal
 * invalid subsequence. n must be >= 1. */
int tok_utf8_seq(const uint8_t *s, size_t n);
/* Offset of the first invalid byte, or len if all of s is valid UTF-8 (a truncated sequence at
 * the end is invalid). */
size_t tok_utf8_check(const char *s, size_t len);

#endif
