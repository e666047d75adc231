/* Tokenizer tests (common/tok): all 360 strings of tests/data/tokenizer/test_strings.json must
 * give exactly the ids HF tokenizers gives for the three reference tokenizers, decode back to the
 * input, and stream-decode to the same bytes without ever emitting half a character; a 1 MB input
 * must cost work linear in its size (checked on operation counts); loader validation and encode
 * errors are checked on small GGUF files built here byte by byte. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "common/tok/tok.h"

static int n_fail;
#define CHECK(c, ...)                                                                                        \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			n_fail++;                                                                            \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                         \
			fprintf(stderr, __VA_ARGS__);                                                        \
			fputc('\n', stderr);                                                                 \
		}                                                                                            \
	} while (0)

static const char *data_dir(void)
{
	const char *d = getenv("TANDEM_TESTDATA");
	return d ? d : "tests/data";
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *load_json(const char *rel)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", data_dir(), rel);
	json_error_t je;
	json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
	if (!j) {
		fprintf(stderr, "cannot read %s: %s (line %d)\n", path, je.text, je.line);
		exit(1);
	}
	return j;
}

static struct tok *load_tok(const char *rel, double *secs)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", data_dir(), rel);
	struct errbuf e = {0};
	struct gguf_ctx *g;
	if (gguf_open(&g, path, &e)) {
		fprintf(stderr, "gguf_open %s: %s\n", path, e.msg);
		exit(1);
	}
	struct tok *t;
	double t0 = now_s();
	int rc = tok_load(&t, g, &e);
	*secs = now_s() - t0;
	gguf_close(g);
	if (rc) {
		fprintf(stderr, "tok_load %s: %s\n", path, e.msg);
		exit(1);
	}
	return t;
}

static size_t hex_decode(const char *hex, char *out)
{
	size_t n = strlen(hex) / 2;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		sscanf(hex + 2 * i, "%2x", &v);
		out[i] = (char)v;
	}
	return n;
}

/* Encodes, decodes and stream-decodes every test string against one expected-ids file. */
static void check_reference(const char *name, const char *gguf_rel, const char *expected_rel, json_t *strings)
{
	double load_s;
	struct tok *t = load_tok(gguf_rel, &load_s);
	json_t *exp = load_json(expected_rel);
	json_t *cases = json_object_get(exp, "cases");
	size_t n_cases = json_array_size(cases), n_ids_ok = 0, n_rt_ok = 0, n_stream_ok = 0;
	CHECK(n_cases == 360, "%s: %zu cases", name, n_cases);
	double enc_s = 0;
	size_t enc_bytes = 0;

	for (size_t c = 0; c < n_cases; c++) {
		json_t *jc = json_array_get(cases, c);
		size_t sid = (size_t)json_integer_value(json_object_get(jc, "id"));
		json_t *js = json_array_get(strings, sid);
		const char *hex = json_string_value(json_object_get(js, "utf8_hex"));
		char *text = malloc(strlen(hex) / 2 + 1);
		size_t len = hex_decode(hex, text);
		json_t *jids = json_object_get(jc, "ids");

		size_t cap = tok_encode_max(len), n = 0;
		int32_t *ids = malloc(sizeof(int32_t) * (cap + 1));
		struct errbuf e = {0};
		double t0 = now_s();
		int rc = tok_encode(t, text, len, 0, ids, cap, &n, NULL, &e);
		enc_s += now_s() - t0;
		enc_bytes += len;
		CHECK(rc == 0, "%s case %zu: encode: %s", name, sid, e.msg);
		bool same = rc == 0 && n == json_array_size(jids);
		for (size_t i = 0; same && i < n; i++)
			same = ids[i] == (int32_t)json_integer_value(json_array_get(jids, i));
		if (same) {
			n_ids_ok++;
		} else {
			fprintf(stderr, "%s case %zu (%s): ids differ\n  got     ", name, sid,
			        json_string_value(json_object_get(js, "category")));
			for (size_t i = 0; i < n && i < 40; i++)
				fprintf(stderr, " %d", ids[i]);
			fprintf(stderr, "\n  expected");
			for (size_t i = 0; i < json_array_size(jids) && i < 40; i++)
				fprintf(stderr, " %lld",
				        (long long)json_integer_value(json_array_get(jids, i)));
			fprintf(stderr, "\n");
		}

		/* decode(encode(s)) == s */
		char *dec = malloc(len * 4 + 64);
		size_t dlen = 0;
		rc = tok_decode(t, ids, n, 0, dec, len * 4 + 64, &dlen, &e);
		if (rc == 0 && dlen == len && memcmp(dec, text, len) == 0)
			n_rt_ok++;
		else
			fprintf(stderr, "%s case %zu: decode differs (rc %d, %zu vs %zu bytes)\n", name, sid,
			        rc, dlen, len);

		/* streaming: same bytes, and every emission is whole characters */
		struct tok_stream st;
		tok_stream_init(&st, t, 0);
		size_t scap = tok_stream_max_out(t), so = 0;
		char *piece = malloc(scap);
		bool ok = true;
		for (size_t i = 0; i <= n && ok; i++) {
			size_t k = 0;
			rc = i < n ? tok_stream_feed(&st, ids[i], piece, scap, &k, &e)
			           : tok_stream_flush(&st, piece, scap, &k, &e);
			ok = rc == 0 && tok_utf8_check(piece, k) == k && so + k <= len &&
			     memcmp(dec + so, piece, k) == 0;
			so += k;
		}
		if (ok && so == len)
			n_stream_ok++;
		else
			fprintf(stderr, "%s case %zu: stream decode differs\n", name, sid);
		free(piece);
		free(dec);
		free(ids);
		free(text);
	}
	printf("tokenizer %-12s vocab %6d  load %.3f s  ids %zu/%zu  roundtrip %zu/%zu  stream %zu/%zu"
	       "  encode %.1f MB/s\n",
	       name, tok_n_vocab(t), load_s, n_ids_ok, n_cases, n_rt_ok, n_cases, n_stream_ok, n_cases,
	       enc_bytes / 1e6 / (enc_s > 0 ? enc_s : 1e-9));
	CHECK(n_ids_ok == n_cases, "%s: %zu/%zu id lists match", name, n_ids_ok, n_cases);
	CHECK(n_rt_ok == n_cases, "%s: %zu/%zu round trips", name, n_rt_ok, n_cases);
	CHECK(n_stream_ok == n_cases, "%s: %zu/%zu streams", name, n_stream_ok, n_cases);
	json_decref(exp);
	tok_destroy(t);
}

/* ---- long inputs: work must grow linearly with the input ----------------------------------- */

struct enc_result {
	size_t n_ids;
	struct tok_stats st;
	double secs;
	bool roundtrip;
};

static struct enc_result encode_big(const struct tok *t, const char *text, size_t len)
{
	struct enc_result r = {0};
	size_t cap = tok_encode_max(len);
	int32_t *ids = malloc(sizeof(int32_t) * cap);
	char *dec = malloc(len + 64);
	struct errbuf e = {0};
	double t0 = now_s();
	int rc = tok_encode(t, text, len, 0, ids, cap, &r.n_ids, &r.st, &e);
	r.secs = now_s() - t0;
	CHECK(rc == 0, "encode of %zu bytes: %s", len, e.msg);
	size_t dlen = 0;
	rc = tok_decode(t, ids, r.n_ids, 0, dec, len + 64, &dlen, &e);
	r.roundtrip = rc == 0 && dlen == len && memcmp(dec, text, len) == 0;
	free(dec);
	free(ids);
	return r;
}

/* Fills len bytes by repeating unit (cut at a character boundary is not needed: units are
 * repeated whole and the buffer is trimmed to a whole number of units). */
static char *repeat(const char *unit, size_t unit_len, size_t len, size_t *out_len)
{
	size_t n = len / unit_len;
	char *s = malloc(n * unit_len + 1);
	for (size_t i = 0; i < n; i++)
		memcpy(s + i * unit_len, unit, unit_len);
	*out_len = n * unit_len;
	return s;
}

static void check_long(const struct tok *t, const char *name, json_t *strings)
{
	/* a mixed text: all test strings, separated by newlines, repeated up to 1 MB */
	size_t mix_len = 0, cap = 1 << 16;
	char *mix = malloc(cap);
	for (size_t i = 0; i < json_array_size(strings); i++) {
		const char *hex = json_string_value(json_object_get(json_array_get(strings, i), "utf8_hex"));
		if (mix_len + strlen(hex) / 2 + 1 > cap)
			mix = realloc(mix, cap *= 2);
		mix_len += hex_decode(hex, mix + mix_len);
		mix[mix_len++] = '\n';
	}
	struct {
		const char *what;
		char *unit;
		size_t unit_len;
	} cases[] = {
	    {"mixed text", mix, mix_len},
	    {"one letter", "a", 1},
	    {"spaces", " ", 1},
	    {"digits", "7", 1},
	    {"special-token prefixes", "<|user", 6},
	    {"CJK", "\xe4\xbd\xa0\xe5\xa5\xbd", 6},
	    {"emoji ZWJ", "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb", 11},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		size_t l1, l4;
		char *s1 = repeat(cases[c].unit, cases[c].unit_len, 256 * 1024, &l1);
		char *s4 = repeat(cases[c].unit, cases[c].unit_len, 1024 * 1024, &l4);
		struct enc_result r1 = encode_big(t, s1, l1), r4 = encode_big(t, s4, l4);
		const struct tok_stats *a = &r1.st, *b = &r4.st;
		uint64_t w1 = a->n_regex_calls + a->n_heap_ops + a->n_merges + a->n_trie_steps + a->n_pieces;
		uint64_t w4 = b->n_regex_calls + b->n_heap_ops + b->n_merges + b->n_trie_steps + b->n_pieces;
		double ratio = (double)w4 / (double)(w1 ? w1 : 1), bytes_ratio = (double)l4 / (double)l1;
		printf("long %-12s %-22s %7zu B: %7zu ids, ops/byte %.2f, 4x input -> %.2fx ops, %.3f s "
		       "(%.1f MB/s)\n",
		       name, cases[c].what, l4, r4.n_ids, (double)w4 / (double)l4, ratio, r4.secs,
		       l4 / 1e6 / (r4.secs > 0 ? r4.secs : 1e-9));
		CHECK(r1.roundtrip && r4.roundtrip, "%s %s: decode(encode(s)) != s", name, cases[c].what);
		/* linear: quadrupling the input quadruples the work (within 5%) */
		CHECK(ratio <= bytes_ratio * 1.05, "%s %s: work ratio %.2f for input ratio %.2f", name,
		      cases[c].what, ratio, bytes_ratio);
		/* and the structural bounds: every heap entry is pushed and popped once, at most
		 * 3 entries per byte; regexes are called at most once per byte per level + 1 */
		CHECK(b->n_heap_ops <= 6 * b->n_bytes, "%s: %llu heap ops for %llu bytes", cases[c].what,
		      (unsigned long long)b->n_heap_ops, (unsigned long long)b->n_bytes);
		CHECK(b->n_merges < b->n_bytes, "%s: merges", cases[c].what);
		CHECK(b->n_regex_calls <= 3 * (b->n_bytes + 1) * 3, "%s: %llu regex calls", cases[c].what,
		      (unsigned long long)b->n_regex_calls);
		CHECK(b->n_trie_steps <= 64 * b->n_bytes, "%s: %llu trie steps", cases[c].what,
		      (unsigned long long)b->n_trie_steps);
		free(s1);
		free(s4);
	}
	free(mix);
}

/* ---- small GGUF files built byte by byte: loader validation and features ------------------ */

struct gb {
	char *buf;
	size_t len, cap;
	uint64_t n_kv;
};

static void gb_put(struct gb *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->buf = realloc(b->buf, b->cap);
	}
	memcpy(b->buf + b->len, p, n);
	b->len += n;
}
static void gb_u32(struct gb *b, uint32_t v)
{
	gb_put(b, &v, 4);
}
static void gb_u64(struct gb *b, uint64_t v)
{
	gb_put(b, &v, 8);
}
static void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_put(b, s, strlen(s));
}
static void gb_key(struct gb *b, const char *k, uint32_t type)
{
	gb_str(b, k);
	gb_u32(b, type);
	b->n_kv++;
}
static void gb_kv_str(struct gb *b, const char *k, const char *v)
{
	gb_key(b, k, GGUF_VT_STRING);
	gb_str(b, v);
}
static void gb_kv_u32(struct gb *b, const char *k, uint32_t v)
{
	gb_key(b, k, GGUF_VT_U32);
	gb_u32(b, v);
}
static void gb_kv_strs(struct gb *b, const char *k, const char *const *v, size_t n)
{
	gb_key(b, k, GGUF_VT_ARRAY);
	gb_u32(b, GGUF_VT_STRING);
	gb_u64(b, n);
	for (size_t i = 0; i < n; i++)
		gb_str(b, v[i]);
}
static void gb_kv_i32s(struct gb *b, const char *k, const int32_t *v, size_t n)
{
	gb_key(b, k, GGUF_VT_ARRAY);
	gb_u32(b, GGUF_VT_I32);
	gb_u64(b, n);
	gb_put(b, v, 4 * n);
}
/* merges as an array of 2-element string arrays */
static void gb_kv_pairs(struct gb *b, const char *k, const char *const *v, size_t n_pairs)
{
	gb_key(b, k, GGUF_VT_ARRAY);
	gb_u32(b, GGUF_VT_ARRAY);
	gb_u64(b, n_pairs);
	for (size_t i = 0; i < n_pairs; i++) {
		gb_u32(b, GGUF_VT_STRING);
		gb_u64(b, 2);
		gb_str(b, v[2 * i]);
		gb_str(b, v[2 * i + 1]);
	}
}

/* Writes header + kvs to a temp file and loads it; returns tok_load's code. */
static int gb_load(struct gb *b, struct tok **out, struct errbuf *e)
{
	char path[] = "/tmp/test_tok_XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "wb");
	uint32_t ver = 3;
	uint64_t n_tensors = 0;
	fwrite("GGUF", 1, 4, f);
	fwrite(&ver, 4, 1, f);
	fwrite(&n_tensors, 8, 1, f);
	fwrite(&b->n_kv, 8, 1, f);
	fwrite(b->buf, 1, b->len, f);
	fclose(f);
	struct gguf_ctx *g;
	*out = NULL;
	int rc = gguf_open(&g, path, e);
	unlink(path);
	if (rc) {
		fprintf(stderr, "synthetic gguf: %s\n", e->msg);
		return rc;
	}
	rc = tok_load(out, g, e);
	gguf_close(g);
	free(b->buf);
	memset(b, 0, sizeof(*b));
	return rc;
}

/* The byte-level character of byte b, as UTF-8. */
static void byte_char(unsigned b, char out[3])
{
	unsigned cp = b;
	if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
		unsigned n = 0;
		for (unsigned c = 0; c < b; c++)
			if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
			      (c >= 0xAE && c <= 0xFF)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		out[2] = 0;
	}
}

enum { SYN_AB = 256, SYN_ABC, SYN_GA, SYN_S, SYN_X, SYN_XY, SYN_PAD, SYN_N };
enum syn_flaw {
	SYN_OK,
	SYN_MODEL,
	SYN_PRE,
	SYN_MERGE_UNKNOWN,
	SYN_BOS_RANGE,
	SYN_TYPES_SHORT,
	SYN_TYPE_VALUE,
	SYN_STRING_MERGES,
	SYN_BAD_MERGE_STRING
};

/* A 263-token vocab: 256 byte symbols, "ab", "abc", "Ġa", control "<s>", user-defined "<x>" and
 * "<x>y" (longest match), an unused "[PAD262]"; merges a+b, ab+c, Ġ+a. */
static int syn_load_pre(enum syn_flaw flaw, const char *pre, struct tok **t, struct errbuf *e)
{
	static char bytes[256][3];
	const char *toks[SYN_N];
	int32_t types[SYN_N];
	for (unsigned b = 0; b < 256; b++) {
		byte_char(b, bytes[b]);
		toks[b] = bytes[b];
		types[b] = 1;
	}
	toks[SYN_AB] = "ab";
	toks[SYN_ABC] = "abc";
	toks[SYN_GA] = "\xc4\xa0"
	               "a";
	toks[SYN_S] = "<s>";
	toks[SYN_X] = "<x>";
	toks[SYN_XY] = "<x>y";
	toks[SYN_PAD] = "[PAD262]";
	types[SYN_AB] = types[SYN_ABC] = types[SYN_GA] = 1;
	types[SYN_S] = 3;
	types[SYN_X] = types[SYN_XY] = 4;
	types[SYN_PAD] = 5;
	if (flaw == SYN_TYPE_VALUE)
		types[SYN_AB] = 9;
	const char *pairs[] = {"a", "b", "ab", "c", "\xc4\xa0", "a"};
	const char *strs[] = {"a b", "ab c", "\xc4\xa0 a"};
	if (flaw == SYN_MERGE_UNKNOWN)
		pairs[2] = "zz";
	if (flaw == SYN_BAD_MERGE_STRING)
		strs[1] = "abc";

	struct gb b = {0};
	gb_kv_str(&b, "general.architecture", "deepseek2");
	gb_kv_str(&b, "tokenizer.ggml.model", flaw == SYN_MODEL ? "llama" : "gpt2");
	gb_kv_str(&b, "tokenizer.ggml.pre", flaw == SYN_PRE ? "klingon" : pre);
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, SYN_N);
	gb_kv_i32s(&b, "tokenizer.ggml.token_type", types, flaw == SYN_TYPES_SHORT ? SYN_N - 1 : SYN_N);
	if (flaw == SYN_STRING_MERGES || flaw == SYN_BAD_MERGE_STRING)
		gb_kv_strs(&b, "tokenizer.ggml.merges", strs, 3);
	else
		gb_kv_pairs(&b, "tokenizer.ggml.merges", pairs, 3);
	gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", flaw == SYN_BOS_RANGE ? SYN_N : SYN_S);
	gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", SYN_S);
	gb_key(&b, "tokenizer.ggml.add_bos_token", GGUF_VT_BOOL);
	gb_put(&b, "\x01", 1);
	return gb_load(&b, t, e);
}

static int syn_load(enum syn_flaw flaw, struct tok **t, struct errbuf *e)
{
	return syn_load_pre(flaw, "gpt2", t, e);
}

/* Every pre-tokenizer name loads, and splits a probe text into the pieces its regexes define
 * (the synthetic vocab has no digit or punctuation merges, so the piece count is observable). */
static void check_pretokenizers(void)
{
	static const struct {
		const char *pre;
		const char *text;
		uint64_t n_pieces;
	} cases[] = {
	    /* Hello | ' world' | ' 12345' | !! */
	    {"gpt2", "Hello world 12345!!", 4},
	    /* Hello | ' world' | ' ' | 123 | 45 | !! */
	    {"llama-bpe", "Hello world 12345!!", 6},
	    {"llama3", "Hello world 12345!!", 6},
	    {"glm4", "Hello world 12345!!", 6},
	    {"chatglm-bpe", "Hello world 12345!!", 6},
	    /* digits one by one */
	    {"qwen2", "Hello world 12345!!", 9},
	    /* Hello | ' world' | ' ' | 123 | 45 | !! */
	    {"deepseek-v3", "Hello world 12345!!", 6},
	    /* Hello | ' world' | ' ' | 12345 | !! */
	    {"deepseek-llm", "Hello world 12345!!", 5},
	    /* CJK isolated by the second regex: ab | 你好 | cd */
	    {"deepseek-v3",
	     "ab\xe4\xbd\xa0\xe5\xa5\xbd"
	     "cd",
	     3},
	    /* contractions, case-insensitive: it | 'S | ' fine' */
	    {"llama3", "it'S fine", 3},
	    /* U+0085 is White_Space (as in Oniguruma): 'a' | NEL+space | 'b'?: \s+(?!\S) keeps the
	     * last space for ' b' */
	    {"llama3", "a\xc2\x85 b", 3},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct errbuf e = {0};
		struct tok *t;
		int rc = syn_load_pre(SYN_OK, cases[i].pre, &t, &e);
		CHECK(rc == 0, "pre %s: %s", cases[i].pre, e.msg);
		if (rc)
			continue;
		const char *text = cases[i].text;
		size_t len = strlen(text);
		int32_t ids[64];
		size_t n;
		struct tok_stats st;
		rc = tok_encode(t, text, len, 0, ids, 64, &n, &st, &e);
		CHECK(rc == 0 && st.n_pieces == cases[i].n_pieces, "pre %s '%s': %llu pieces, want %llu",
		      cases[i].pre, cases[i].text, (unsigned long long)st.n_pieces,
		      (unsigned long long)cases[i].n_pieces);
		tok_destroy(t);
	}
}

static bool ids_eq(const int32_t *got, size_t n, const int32_t *want, size_t n_want)
{
	if (n != n_want)
		return false;
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			return false;
	return true;
}

static void check_synthetic(void)
{
	struct errbuf e = {0};
	struct tok *t;
	static const struct {
		enum syn_flaw flaw;
		int code;
		const char *in_msg;
	} bad[] = {
	    {SYN_MODEL, ERR_UNSUPPORTED, "'llama'"},         {SYN_PRE, ERR_UNSUPPORTED, "'klingon'"},
	    {SYN_MERGE_UNKNOWN, ERR_FORMAT, "merges[1]"},    {SYN_BOS_RANGE, ERR_FORMAT, "bos_token_id"},
	    {SYN_TYPES_SHORT, ERR_FORMAT, "token_type"},     {SYN_TYPE_VALUE, ERR_FORMAT, "token_type[256]"},
	    {SYN_BAD_MERGE_STRING, ERR_FORMAT, "merges[1]"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&e, 0, sizeof(e));
		int rc = syn_load(bad[i].flaw, &t, &e);
		CHECK(rc == bad[i].code && strstr(e.msg, bad[i].in_msg) && !t,
		      "flaw %d: rc %d msg '%s' (want %d, '%s')", bad[i].flaw, rc, e.msg, bad[i].code,
		      bad[i].in_msg);
	}

	for (int form = 0; form < 2; form++) {
		int rc = syn_load(form ? SYN_STRING_MERGES : SYN_OK, &t, &e);
		CHECK(rc == 0, "synthetic load (form %d): %s", form, e.msg);
		if (rc)
			continue;
		int32_t ids[64];
		size_t n;
		/* "abc abd": pieces "abc" and " abd"; in " abd" a+b (rank 0) wins over Ġ+a (rank 2),
		 * so it is Ġ ab d */
		const char *txt = "abc abd";
		rc = tok_encode(t, txt, strlen(txt), 0, ids, 64, &n, NULL, &e);
		int32_t want1[] = {SYN_ABC, ' ', SYN_AB, 'd'}; /* byte b is token b */
		CHECK(rc == 0 && ids_eq(ids, n, want1, 4), "form %d: 'abc abd' -> %zu ids (%d %d %d %d)",
		      form, n, ids[0], ids[1], ids[2], ids[3]);
		/* " ax": a+b not applicable, Ġ+a merges */
		rc = tok_encode(t, " ax", 3, 0, ids, 64, &n, NULL, &e);
		int32_t want2[] = {SYN_GA, 'x'};
		CHECK(rc == 0 && ids_eq(ids, n, want2, 2), "form %d: ' ax'", form);
		/* specials: leftmost, then longest; user-defined and control both match */
		rc = tok_encode(t, "<x>y<x><s>", 10, TOK_ENCODE_ADD_BOS, ids, 64, &n, NULL, &e);
		int32_t want3[] = {SYN_S, SYN_XY, SYN_X, SYN_S};
		CHECK(rc == 0 && ids_eq(ids, n, want3, 4), "form %d: specials + BOS (%zu ids)", form, n);
		/* a text that starts with BOS gets no second one */
		rc = tok_encode(t, "<s>ab", 5, TOK_ENCODE_ADD_BOS, ids, 64, &n, NULL, &e);
		int32_t want_bos[] = {SYN_S, SYN_AB};
		CHECK(rc == 0 && ids_eq(ids, n, want_bos, 2), "form %d: single BOS (%zu ids)", form, n);
		/* NO_SPECIAL: the same text is plain bytes */
		rc = tok_encode(t, "<s>", 3, TOK_ENCODE_NO_SPECIAL, ids, 64, &n, NULL, &e);
		int32_t want4[] = {'<', 's', '>'};
		CHECK(rc == 0 && ids_eq(ids, n, want4, 3), "form %d: NO_SPECIAL", form);
		/* spans: specials only where allowed */
		struct tok_span sp = {3, 3};
		rc = tok_encode_spans(t, "<s><s><s>", 9, 0, &sp, 1, ids, 64, &n, NULL, &e);
		int32_t want5[] = {'<', 's', '>', SYN_S, '<', 's', '>'};
		CHECK(rc == 0 && ids_eq(ids, n, want5, 7), "form %d: spans (%zu ids)", form, n);
		/* a span that cuts a special token does not match it */
		struct tok_span sp2 = {0, 2};
		rc = tok_encode_spans(t, "<s>", 3, 0, &sp2, 1, ids, 64, &n, NULL, &e);
		CHECK(rc == 0 && n == 3 && ids[0] == '<', "form %d: cut span", form);
		/* ERR_LIMIT when the output does not fit */
		rc = tok_encode(t, "abc abd", 7, 0, ids, 2, &n, NULL, &e);
		CHECK(rc == ERR_LIMIT && n == 0, "form %d: limit rc %d", form, rc);
		/* invalid UTF-8: error naming the offset, or U+FFFD on request */
		rc = tok_encode(t,
		                "ab\xff"
		                "c",
		                4, 0, ids, 64, &n, NULL, &e);
		CHECK(rc == ERR_FORMAT && strstr(e.msg, "offset 2"), "invalid utf-8: %d '%s'", rc, e.msg);
		rc = tok_encode(t,
		                "ab\xe4\xbd"
		                "c",
		                5, TOK_ENCODE_REPLACE_INVALID, ids, 64, &n, NULL, &e);
		char dec[64];
		size_t dl = 0;
		CHECK(rc == 0 && tok_decode(t, ids, n, 0, dec, sizeof(dec), &dl, &e) == 0 && dl == 6 &&
		          memcmp(dec,
		                 "ab\xef\xbf\xbd"
		                 "c",
		                 6) == 0,
		      "replace invalid: rc %d, %zu bytes", rc, dl);
		/* decode: unused tokens decode to nothing, special ones to their text, skip flag */
		int32_t d1[] = {SYN_S, SYN_PAD, SYN_ABC, SYN_XY};
		rc = tok_decode(t, d1, 4, 0, dec, sizeof(dec), &dl, &e);
		CHECK(rc == 0 && dl == 10 && memcmp(dec, "<s>abc<x>y", 10) == 0, "decode specials");
		rc = tok_decode(t, d1, 4, TOK_DECODE_SKIP_SPECIAL, dec, sizeof(dec), &dl, &e);
		CHECK(rc == 0 && dl == 7 && memcmp(dec, "abc<x>y", 7) == 0, "decode skip special");
		int32_t d2[] = {SYN_N};
		CHECK(tok_decode(t, d2, 1, 0, dec, sizeof(dec), &dl, &e) == ERR_FORMAT, "decode range");
		CHECK(tok_decode(t, d1, 4, 0, dec, 4, &dl, &e) == ERR_LIMIT && dl == 10, "decode cap");
		tok_destroy(t);
	}
	printf("synthetic vocab: %zu malformed files rejected with named errors, both merge forms, "
	       "specials/spans/limits/invalid UTF-8 checked\n",
	       sizeof(bad) / sizeof(bad[0]));
}

/* Streaming over byte tokens: split characters are held back, invalid bytes become U+FFFD. */
static void check_stream_bytes(void)
{
	struct errbuf e = {0};
	struct tok *t;
	if (syn_load(SYN_OK, &t, &e)) {
		CHECK(0, "synthetic load: %s", e.msg);
		return;
	}
	/* byte b has token id = index of its byte-level char; find it by text */
	static const struct {
		const char *in;
		size_t len;
		const char *out;
		size_t out_len;
		size_t max_emits_before_flush; /* bytes emitted before the last byte arrives */
	} cases[] = {
	    {"\xe4\xbd\xa0", 3, "\xe4\xbd\xa0", 3, 0}, /* held back until complete */
	    {"a\xf0\x9f\x98\x80"
	     "b",
	     6,
	     "a\xf0\x9f\x98\x80"
	     "b",
	     6, 5},
	    {"\xff"
	     "a",
	     2,
	     "\xef\xbf\xbd"
	     "a",
	     4, 3}, /* invalid byte */
	    {"\xe4\xbd"
	     "a",
	     3,
	     "\xef\xbf\xbd"
	     "a",
	     4, 0}, /* truncated then ASCII */
	    {"a\xe4\xbd", 3, "a\xef\xbf\xbd", 4, 1}, /* truncated at the end */
	    {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9, 6}, /* surrogate */
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct tok_stream s;
		tok_stream_init(&s, t, 0);
		char out[64], piece[256];
		size_t o = 0, k;
		bool ok = tok_stream_max_out(t) <= sizeof(piece);
		for (size_t i = 0; i < cases[c].len && ok; i++) {
			char ch[3];
			byte_char((uint8_t)cases[c].in[i], ch);
			int32_t id = tok_find(t, ch, strlen(ch));
			ok = id >= 0 && tok_stream_feed(&s, id, piece, sizeof(piece), &k, &e) == 0 &&
			     tok_utf8_check(piece, k) == k;
			memcpy(out + o, piece, k);
			o += k;
			if (i + 2 == cases[c].len)
				ok = ok && o <= cases[c].max_emits_before_flush;
		}
		ok = ok && tok_stream_flush(&s, piece, sizeof(piece), &k, &e) == 0;
		memcpy(out + o, piece, k);
		o += k;
		CHECK(ok && o == cases[c].out_len && memcmp(out, cases[c].out, o) == 0,
		      "stream case %zu: %zu bytes", c, o);
	}
	tok_destroy(t);
}

/* ---- random inputs: never crash, always valid UTF-8 out ------------------------------------ */

static uint64_t rng_state, test_seed;
static uint32_t rng(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

/* Random byte strings (biased towards UTF-8 lead/continuation bytes and specials' first bytes)
 * encoded with U+FFFD replacement must decode to valid UTF-8 that re-encodes to the same ids;
 * random id sequences must stream-decode to exactly the U+FFFD-replaced whole decode. */
static void check_random(const struct tok *t, const char *name)
{
	uint64_t seed = (uint64_t)time(NULL);
	const char *env = getenv("TANDEM_TEST_SEED");
	if (env)
		seed = strtoull(env, NULL, 10);
	rng_state = test_seed = seed;
	static const uint8_t alphabet[] = {'a',  'Z',  ' ',  '\n', '1',  '<',  '|',  '>',  '\'', '!',
	                                   0x80, 0xBF, 0xC3, 0xE4, 0xF0, 0x9F, 0xED, 0xA0, 0xFF, 0x00};
	int n_ok = 0, n_runs = 300;
	size_t scap = tok_stream_max_out(t);
	char *piece = malloc(scap);
	for (int r = 0; r < n_runs; r++) {
		size_t len = rng() % 200;
		char text[200];
		for (size_t i = 0; i < len; i++)
			text[i] = (char)(rng() % 4 == 0 ? rng() : alphabet[rng() % sizeof(alphabet)]);
		int32_t ids[3 * 200 + 1], ids2[3 * 200 + 1];
		size_t n = 0, n2 = 0, dl = 0, dl2 = 0;
		char dec[3 * 200 * 4 + 64], dec2[3 * 200 * 4 + 64];
		struct errbuf e = {0};
		bool ok = tok_encode(t, text, len, TOK_ENCODE_REPLACE_INVALID, ids, 3 * 200 + 1, &n, NULL,
		                     &e) == 0 &&
		          tok_decode(t, ids, n, 0, dec, sizeof(dec), &dl, &e) == 0 &&
		          tok_utf8_check(dec, dl) == dl &&
		          tok_encode(t, dec, dl, 0, ids2, 3 * 200 + 1, &n2, NULL, &e) == 0 &&
		          ids_eq(ids, n, ids2, n2);

		/* random ids: whole decode, then its replaced form via encode(REPLACE) -> decode */
		size_t m = rng() % 40;
		int32_t rid[40];
		for (size_t i = 0; i < m; i++)
			rid[i] = (int32_t)(rng() % (uint32_t)tok_n_vocab(t));
		ok = ok && tok_decode(t, rid, m, 0, dec, sizeof(dec), &dl, &e) == 0 &&
		     tok_encode(t, dec, dl, TOK_ENCODE_REPLACE_INVALID | TOK_ENCODE_NO_SPECIAL, ids,
		                3 * 200 + 1, &n, NULL, &e) == 0 &&
		     tok_decode(t, ids, n, 0, dec2, sizeof(dec2), &dl2, &e) == 0;
		struct tok_stream st;
		tok_stream_init(&st, t, 0);
		size_t so = 0, k;
		for (size_t i = 0; i <= m && ok; i++) {
			ok = (i < m ? tok_stream_feed(&st, rid[i], piece, scap, &k, &e)
			            : tok_stream_flush(&st, piece, scap, &k, &e)) == 0 &&
			     tok_utf8_check(piece, k) == k && so + k <= dl2 &&
			     memcmp(dec2 + so, piece, k) == 0;
			so += k;
		}
		ok = ok && so == dl2;
		n_ok += ok;
		if (!ok)
			fprintf(stderr, "%s random run %d (seed %llu) failed: %s\n", name, r,
			        (unsigned long long)seed, e.msg);
	}
	free(piece);
	printf("random %-12s seed %llu: %d/%d runs ok\n", name, (unsigned long long)seed, n_ok, n_runs);
	CHECK(n_ok == n_runs, "%s random: %d/%d (seed %llu, rerun with TANDEM_TEST_SEED)", name, n_ok, n_runs,
	      (unsigned long long)seed);
}

/* ---- mutated vocab files: the loader rejects or accepts, never crashes -------------------- */

/* Copies the tokenizer.* keys of a model into a small vocab-only GGUF, then flips random bytes of
 * it many times: every mutant must be rejected by gguf_open or tok_load with a message, or load
 * and then encode / decode a probe text without crashing (ASan builds check the memory side). */
static void check_mutations(const char *model_rel, int n_iter)
{
	char src[512];
	snprintf(src, sizeof(src), "%s/%s", data_dir(), model_rel);
	struct errbuf e = {0};
	struct gguf_ctx *g;
	if (gguf_open(&g, src, &e)) {
		CHECK(0, "%s", e.msg);
		return;
	}
	char base[] = "/tmp/test_tok_vocab_XXXXXX";
	int fd = mkstemp(base);
	close(fd);
	struct gguf_writer *w = gguf_writer_create(32);
	int rc = 0;
	for (int64_t i = 0; i < gguf_n_kv(g) && !rc; i++)
		if (strncmp(gguf_kv_key(g, i), "tokenizer.", 10) == 0 ||
		    strcmp(gguf_kv_key(g, i), "general.architecture") == 0)
			rc = gguf_writer_copy_kv(w, g, i);
	rc = rc ? rc : gguf_writer_write(w, base, &e);
	gguf_writer_destroy(w);
	gguf_close(g);
	CHECK(rc == 0, "vocab-only copy: %s", e.msg);
	FILE *f = fopen(base, "rb");
	size_t size = 0;
	char *orig = NULL;
	if (f && fseek(f, 0, SEEK_END) == 0 && (size = (size_t)ftell(f)) > 64 && fseek(f, 0, SEEK_SET) == 0 &&
	    (orig = malloc(size)) && fread(orig, 1, size, f) == size) {
		/* the unmutated copy loads and tokenizes like the original */
		struct tok *t;
		rc = gguf_open(&g, base, &e);
		rc = rc ? rc : tok_load(&t, g, &e);
		CHECK(rc == 0, "vocab-only copy loads: %s", e.msg);
		if (rc == 0) {
			gguf_close(g);
			tok_destroy(t);
		}
	} else {
		CHECK(0, "cannot read back %s", base);
	}
	if (f)
		fclose(f);
	uint64_t seed = test_seed; /* the mutations continue that seed's random stream */
	int n_gguf_err = 0, n_tok_err = 0, n_loaded = 0;
	char *buf = malloc(size);
	for (int it = 0; orig && it < n_iter; it++) {
		memcpy(buf, orig, size);
		int n_flips = 1 + (int)(rng() % 4);
		for (int k = 0; k < n_flips; k++) {
			size_t at = 8 + rng() % (size - 8); /* keep the magic and version */
			buf[at] = rng() % 3 == 0 ? (char)(buf[at] ^ (1 << (rng() % 8))) : (char)rng();
		}
		f = fopen(base, "wb");
		fwrite(buf, 1, size, f);
		fclose(f);
		memset(&e, 0, sizeof(e));
		if (gguf_open(&g, base, &e)) {
			n_gguf_err++;
			CHECK(e.msg[0], "gguf error without a message");
			continue;
		}
		struct tok *t;
		if (tok_load(&t, g, &e)) {
			n_tok_err++;
			CHECK(e.msg[0], "tok_load error without a message");
			gguf_close(g);
			continue;
		}
		gguf_close(g);
		n_loaded++;
		const char *probe = "Hello <|user|> world 12345 \xe4\xbd\xa0\xe5\xa5\xbd!\n";
		int32_t ids[256];
		size_t n = 0, dl;
		char dec[4096];
		if (tok_encode(t, probe, strlen(probe), TOK_ENCODE_ADD_BOS, ids, 256, &n, NULL, &e) == 0) {
			int drc = tok_decode(t, ids, n, 0, dec, sizeof(dec), &dl, &e);
			CHECK(drc == 0 || drc == ERR_LIMIT, "decode of a mutant's ids: %d", drc);
		}
		tok_destroy(t);
	}
	free(buf);
	free(orig);
	unlink(base);
	printf("mutations %-10s seed %llu: %d runs: %d rejected by the GGUF reader, %d by the tokenizer, %d "
	       "loaded; "
	       "no crash\n",
	       model_rel + 7, (unsigned long long)seed, n_iter, n_gguf_err, n_tok_err, n_loaded);
}

int main(void)
{
	json_t *strings = load_json("tokenizer/test_strings.json");
	CHECK(json_array_size(strings) == 360, "%zu strings", json_array_size(strings));
	check_reference("tiny-glm", "models/glm-dsa-tiny-BF16.gguf", "tokenizer/expected_ids_tiny-glm.json",
	                strings);
	check_reference("tiny-ds", "models/deepseek2-tiny-BF16.gguf", "tokenizer/expected_ids_tiny-ds.json",
	                strings);
	check_reference("deepseek-v3", "tokenizer/deepseek-v3-vocab.gguf",
	                "tokenizer/expected_ids_deepseek-v3.json", strings);
	double secs;
	struct tok *ds = load_tok("tokenizer/deepseek-v3-vocab.gguf", &secs);
	CHECK(secs < 1.0, "loading the DeepSeek-V3 vocab took %.2f s", secs);
	check_long(ds, "deepseek-v3", strings);
	check_random(ds, "deepseek-v3");
	tok_destroy(ds);
	struct tok *glm = load_tok("models/glm-dsa-tiny-BF16.gguf", &secs);
	check_long(glm, "tiny-glm", strings);
	check_random(glm, "tiny-glm");
	check_mutations("models/glm-dsa-tiny-BF16.gguf", 1000);
	tok_destroy(glm);
	json_decref(strings);
	check_synthetic();
	check_stream_bytes();
	check_pretokenizers();
	if (n_fail) {
		printf("%d checks failed\n", n_fail);
		return 1;
	}
	printf("all tokenizer checks passed\n");
	return 0;
}
