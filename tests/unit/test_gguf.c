/* GGUF reader/writer tests:
 *  - every reference GGUF in tests/data opens, and its tensor table (names, types, shapes) matches
 *    tests/data/models/tensors.txt, which gguf-py wrote independently;
 *  - known metadata of the tiny models and of the real DeepSeek-V3 vocab GGUF (129280 tokens,
 *    127741 merges; string-array access must be O(1));
 *  - writer round trip of every value type, nested arrays, three tensor data sources, alignments;
 *  - split sets opened from any shard. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "kernels/kernels.h"

static int n_fail, n_check;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		n_check++;                                                                                   \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
			fprintf(stderr, __VA_ARGS__);                                                        \
			fputc('\n', stderr);                                                                 \
		}                                                                                            \
	} while (0)

#define DATA "tests/data/"

static char tmpdir[256];

static void tmp_path(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", tmpdir, name);
}

/* ---- reference files vs tensors.txt ------------------------------------------------------------ */

static int type_by_name(const char *s)
{
	for (int t = 0; t < KT_COUNT; t++) {
		const struct ktype_info *k = ktype_get(t);
		if (k && strcmp(k->name, s) == 0)
			return t;
	}
	return -1;
}

static void test_reference_files(void)
{
	FILE *f = fopen(DATA "models/tensors.txt", "r");
	CHECK(f, "cannot open tensors.txt");
	if (!f)
		return;
	char line[512];
	struct gguf_ctx *g = NULL;
	int64_t seen = 0, expect_n = 0;
	char cur[128] = "";
	int n_files = 0;
	while (fgets(line, sizeof(line), f)) {
		char fname[128];
		long long fsize, nt;
		if (sscanf(line, "== %127s (%lld bytes, %lld tensors)", fname, &fsize, &nt) == 3) {
			if (g)
				CHECK(seen == expect_n, "%s: listed %" PRId64 " tensors, expected %" PRId64,
				      cur, seen, expect_n);
			gguf_close(g);
			g = NULL;
			char path[256];
			snprintf(path, sizeof(path), DATA "models/%s", fname);
			snprintf(cur, sizeof(cur), "%s", fname);
			struct errbuf e = {0};
			int rc = gguf_open(&g, path, &e);
			CHECK(rc == 0, "%s: %s", path, e.msg);
			if (rc)
				continue;
			n_files++;
			CHECK(gguf_n_tensors(g) == nt, "%s: %" PRId64 " tensors, tensors.txt says %lld",
			      fname, gguf_n_tensors(g), nt);
			CHECK(gguf_shard_size(g, 0) == (uint64_t)fsize, "%s: size", fname);
			CHECK(gguf_version(g) == 3, "version");
			CHECK(gguf_n_shards(g) == 1, "shards");
			expect_n = nt;
			seen = 0;
			continue;
		}
		char name[128], tname[32], shape[128];
		if (!g || sscanf(line, " %127s %31s ne=[%127[^]]]", name, tname, shape) != 3)
			continue;
		seen++;
		const struct gguf_tensor *t = gguf_find_tensor(g, name);
		CHECK(t, "%s: tensor %s missing", cur, name);
		if (!t)
			continue;
		CHECK(strcmp(t->name, name) == 0, "name");
		CHECK(t->type == type_by_name(tname), "%s %s: type %d vs %s", cur, name, t->type, tname);
		int64_t ne[4] = {1, 1, 1, 1};
		int nd = 0;
		for (char *p = shape; *p && nd < 4;) {
			ne[nd++] = strtoll(p, &p, 10);
			while (*p == ',' || *p == ' ')
				p++;
		}
		CHECK(t->n_dims == nd, "%s %s: n_dims %d vs %d", cur, name, t->n_dims, nd);
		for (int d = 0; d < 4; d++)
			CHECK(t->ne[d] == ne[d], "%s %s: ne[%d] %" PRId64 " vs %" PRId64, cur, name, d,
			      t->ne[d], ne[d]);
		size_t row;
		CHECK(ktype_row_bytes(t->type, t->ne[0], &row) &&
		          t->nbytes == row * (size_t)(ne[1] * ne[2] * ne[3]),
		      "%s %s: nbytes", cur, name);
		CHECK(t->file_offset % gguf_alignment(g) == 0, "aligned");
		CHECK(t->file_offset + t->nbytes <= gguf_shard_size(g, 0), "inside file");
	}
	if (g)
		CHECK(seen == expect_n, "%s: listed %" PRId64 " tensors, expected %" PRId64, cur, seen,
		      expect_n);
	gguf_close(g);
	fclose(f);
	CHECK(n_files == 6, "opened %d of 6 reference models", n_files);
}

static void test_tiny_metadata(void)
{
	struct gguf_ctx *g;
	struct errbuf e = {0};
	int rc = gguf_open(&g, DATA "models/glm-dsa-tiny-Q8_0.gguf", &e);
	CHECK(rc == 0, "%s", e.msg);
	if (rc)
		return;
	char *arch = gguf_get_str_dup(g, "general.architecture", &e);
	CHECK(arch && strcmp(arch, "glm-dsa") == 0, "arch %s", arch ? arch : e.msg);
	free(arch);
	uint32_t u;
	CHECK(gguf_get_u32(g, "glm-dsa.embedding_length", &u, &e) == 0 && u == 256, "embedding_length");
	CHECK(gguf_get_u32(g, "glm-dsa.attention.head_count", &u, &e) == 0 && u == 2, "head_count");
	CHECK(gguf_get_u32(g, "glm-dsa.expert_count", &u, &e) == 0 && u == 4, "expert_count");
	CHECK(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u, &e) == 0 && u == 990, "bos");
	CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u, &e) == 0 && u == 988, "eos");
	float fv;
	CHECK(gguf_get_f32(g, "glm-dsa.attention.layer_norm_rms_epsilon", &fv, &e) == 0 &&
	          fabsf(fv - 1e-5f) < 1e-9f,
	      "eps");
	struct gguf_arr a;
	rc = gguf_get_arr(g, "glm-dsa.attention.indexer.types", &a, &e);
	CHECK(rc == 0 && a.count == 3, "indexer.types: %s", e.msg);
	if (rc == 0 && a.count == 3)
		CHECK(gguf_arr_int(&a, 0) == 1 && gguf_arr_int(&a, 1) == 0 && gguf_arr_int(&a, 2) == 1,
		      "types values");
	rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &e);
	CHECK(rc == 0 && a.type == GGUF_VT_STRING && a.count == 1024, "tokens");
	size_t len;
	const char *s = gguf_arr_str(&a, 988, &len);
	CHECK(s && len == 13 && memcmp(s, "<|endoftext|>", 13) == 0, "token 988");
	s = gguf_arr_str(&a, 1023, &len);
	CHECK(s && len == 9 && memcmp(s, "[PAD1023]", 9) == 0, "token 1023 = [PAD1023]");
	CHECK(gguf_arr_str(&a, 1024, &len) == NULL, "out of range string element");
	/* wrong-type getters name the key and its type */
	rc = gguf_get_u32(g, "general.architecture", &u, &e);
	CHECK(rc == ERR_FORMAT && strstr(e.msg, "general.architecture") && strstr(e.msg, "str"), "%s", e.msg);
	rc = gguf_get_u32(g, "no.such.key", &u, &e);
	CHECK(rc == ERR_NOTFOUND, "absent key");
	CHECK(gguf_find_key(g, "no.such.key") == -1, "find absent");
	CHECK(gguf_find_tensor(g, "blk.0.attn_k") == NULL, "exact names only");
	CHECK(gguf_find_tensor(g, "blk.0.attn_k_b.weight") != NULL, "exact name");
	gguf_close(g);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_deepseek_vocab(void)
{
	struct gguf_ctx *g;
	struct errbuf e = {0};
	double t0 = now_s();
	int rc = gguf_open(&g, DATA "tokenizer/deepseek-v3-vocab.gguf", &e);
	double t_open = now_s() - t0;
	CHECK(rc == 0, "%s", e.msg);
	if (rc)
		return;
	CHECK(gguf_n_tensors(g) == 0, "vocab-only file has no tensors");
	struct gguf_arr tok, mer;
	CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &tok, &e) == 0 && tok.count == 129280, "tokens count");
	CHECK(gguf_get_arr(g, "tokenizer.ggml.merges", &mer, &e) == 0 && mer.count == 127741, "merges count");
	size_t len;
	const char *s = gguf_arr_str(&tok, 0, &len);
	const char *bos = "<\xef\xbd\x9c"
	                  "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
	CHECK(s && len == strlen(bos) && memcmp(s, bos, len) == 0, "token 0 is BOS");
	s = gguf_arr_str(&tok, 3, &len);
	CHECK(s && len == 1 && s[0] == '!', "token 3 is '!'");
	/* random access over the whole array must be O(1): 10^6 accesses well under a second */
	t0 = now_s();
	uint64_t sum = 0, x = 12345;
	for (int i = 0; i < 1000000; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t k = (x >> 33) % tok.count;
		s = gguf_arr_str(&tok, k, &len);
		sum += len + (s != NULL);
		s = gguf_arr_str(&mer, k % mer.count, &len);
		sum += len;
	}
	double t_acc = now_s() - t0;
	CHECK(sum > 2000000, "sum");
	CHECK(t_acc < 5.0, "2e6 string-array accesses took %.3f s (an O(n) lookup would take hours)", t_acc);
	CHECK(t_open < 10.0, "open took %.3f s", t_open);
	printf("deepseek-v3 vocab: open %.1f ms, 2e6 random element accesses %.1f ms\n", t_open * 1e3,
	       t_acc * 1e3);
	uint32_t u;
	CHECK(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u, &e) == 0 && u == 0, "bos 0");
	CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u, &e) == 0 && u == 1, "eos 1");
	bool b;
	CHECK(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &e) == 0 && b, "add_bos");
	gguf_close(g);
}

/* ---- writer round trip ------------------------------------------------------------------------- */

struct fill_ctx {
	int calls;
	uint64_t next_off;
	bool order_ok;
};

static uint8_t pattern(const char *name, uint64_t i)
{
	return (uint8_t)(i * 131 + (uint8_t)name[strlen(name) - 1] * 7 + (i >> 9));
}

static int fill_whole(void *user, const char *name, void *dst, size_t n)
{
	struct fill_ctx *c = user;
	c->calls++;
	for (size_t i = 0; i < n; i++)
		((uint8_t *)dst)[i] = pattern(name, i);
	return 0;
}

static int fill_chunk(void *user, const char *name, uint64_t off, void *dst, size_t n)
{
	struct fill_ctx *c = user;
	c->calls++;
	if (off != c->next_off)
		c->order_ok = false;
	c->next_off = off + n;
	for (size_t i = 0; i < n; i++)
		((uint8_t *)dst)[i] = pattern(name, off + i);
	return 0;
}

/* Serializes a nested array value: [[ "a", "bc" ], [], [ "" ]] of strings, as raw bytes. */
static size_t nested_str_arrays(uint8_t *p)
{
	uint8_t *q = p;
	uint32_t t = GGUF_VT_ARRAY, ts = GGUF_VT_STRING;
	uint64_t n = 3;
	memcpy(q, &t, 4), q += 4;
	memcpy(q, &n, 8), q += 8;
	const char *groups[3][2] = {{"a", "bc"}, {0}, {"", 0}};
	uint64_t counts[3] = {2, 0, 1};
	for (int i = 0; i < 3; i++) {
		memcpy(q, &ts, 4), q += 4;
		memcpy(q, &counts[i], 8), q += 8;
		for (uint64_t j = 0; j < counts[i]; j++) {
			uint64_t l = strlen(groups[i][j]);
			memcpy(q, &l, 8), q += 8;
			memcpy(q, groups[i][j], l), q += l;
		}
	}
	return (size_t)(q - p);
}

/* [[[1, 2], [3]], [[4, 5, 6]]] of i16: three levels. */
static size_t nested_i16(uint8_t *p)
{
	uint8_t *q = p;
	uint32_t ta = GGUF_VT_ARRAY, ti = GGUF_VT_I16;
	uint64_t n;
#define PUT(x, sz) (memcpy(q, (x), (sz)), q += (sz))
	n = 2, PUT(&ta, 4), PUT(&n, 8);
	n = 2, PUT(&ta, 4), PUT(&n, 8);
	int16_t v[6] = {1, 2, 3, 4, 5, -6};
	n = 2, PUT(&ti, 4), PUT(&n, 8), PUT(&v[0], 4);
	n = 1, PUT(&ti, 4), PUT(&n, 8), PUT(&v[2], 2);
	n = 1, PUT(&ta, 4), PUT(&n, 8);
	n = 3, PUT(&ti, 4), PUT(&n, 8), PUT(&v[3], 6);
#undef PUT
	return (size_t)(q - p);
}

static void roundtrip(size_t alignment)
{
	char path[512];
	tmp_path(path, sizeof(path), "rt.gguf");
	struct gguf_writer *w = gguf_writer_create(alignment);
	CHECK(w, "writer_create(%zu)", alignment);
	if (!w)
		return;
	CHECK(gguf_writer_set_u32(w, "t.u32", 4000000000u) == 0, "u32");
	CHECK(gguf_writer_set_i32(w, "t.i32", -123456) == 0, "i32");
	CHECK(gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull) == 0, "u64");
	CHECK(gguf_writer_set_i64(w, "t.i64", -9000000000000ll) == 0, "i64");
	CHECK(gguf_writer_set_u16(w, "t.u16", 65535) == 0, "u16");
	CHECK(gguf_writer_set_f32(w, "t.f32", 0.1f) == 0, "f32");
	CHECK(gguf_writer_set_bool(w, "t.bool", true) == 0, "bool");
	CHECK(gguf_writer_set_str(w, "t.str", "hello \xe4\xb8\x96\xe7\x95\x8c") == 0, "str");
	CHECK(gguf_writer_set_str(w, "t.empty", "") == 0, "empty str");
	uint8_t u8 = 200, b0 = 0;
	int8_t i8 = -100;
	int16_t i16 = -30000;
	double f64 = 3.141592653589793;
	CHECK(gguf_writer_set_raw(w, "t.u8", GGUF_VT_U8, &u8, 1) == 0, "u8");
	CHECK(gguf_writer_set_raw(w, "t.i8", GGUF_VT_I8, &i8, 1) == 0, "i8");
	CHECK(gguf_writer_set_raw(w, "t.i16", GGUF_VT_I16, &i16, 2) == 0, "i16");
	CHECK(gguf_writer_set_raw(w, "t.f64", GGUF_VT_F64, &f64, 8) == 0, "f64");
	CHECK(gguf_writer_set_raw(w, "t.false", GGUF_VT_BOOL, &b0, 1) == 0, "bool false");
	uint8_t bad = 2;
	CHECK(gguf_writer_set_raw(w, "t.badbool", GGUF_VT_BOOL, &bad, 1) == -EINVAL, "bad bool rejected");
	int32_t ia[5] = {1, -2, 3, -4, 5};
	float fa[3] = {0.5f, -1.25f, 1e30f};
	double da[2] = {1e-300, -2.5};
	uint64_t ua[2] = {0, UINT64_MAX};
	uint8_t ba[4] = {1, 0, 1, 1};
	CHECK(gguf_writer_set_arr(w, "a.i32", GGUF_VT_I32, ia, 5) == 0, "arr i32");
	CHECK(gguf_writer_set_arr(w, "a.f32", GGUF_VT_F32, fa, 3) == 0, "arr f32");
	CHECK(gguf_writer_set_arr(w, "a.f64", GGUF_VT_F64, da, 2) == 0, "arr f64");
	CHECK(gguf_writer_set_arr(w, "a.u64", GGUF_VT_U64, ua, 2) == 0, "arr u64");
	CHECK(gguf_writer_set_arr(w, "a.bool", GGUF_VT_BOOL, ba, 4) == 0, "arr bool");
	CHECK(gguf_writer_set_arr(w, "a.empty", GGUF_VT_U32, NULL, 0) == 0, "empty arr");
	CHECK(gguf_writer_set_arr(w, "a.bad", GGUF_VT_STRING, ia, 1) == -EINVAL,
	      "string via set_arr rejected");
	const char *strs[4] = {"x", "", "hello world", "\xf0\x9f\x98\x80"};
	CHECK(gguf_writer_set_arr_str(w, "a.str", strs, 4) == 0, "arr str");
	uint8_t raw[256];
	size_t n1 = nested_str_arrays(raw);
	CHECK(gguf_writer_set_raw(w, "a.nested_str", GGUF_VT_ARRAY, raw, n1) == 0, "nested str");
	CHECK(gguf_writer_set_raw(w, "a.nested_trunc", GGUF_VT_ARRAY, raw, n1 - 1) == -EINVAL,
	      "truncated raw rejected");
	size_t n2 = nested_i16(raw);
	CHECK(gguf_writer_set_raw(w, "a.nested_i16", GGUF_VT_ARRAY, raw, n2) == 0, "nested i16");
	CHECK(gguf_writer_set_u32(w, "t.u32", 1) == -EEXIST, "duplicate key rejected");

	/* tensors: borrowed F32, whole-callback Q8_0, chunked BF16 with tiny chunks, 3-D and 4-D */
	float w0[3 * 5];
	for (int i = 0; i < 15; i++)
		w0[i] = (float)i * 0.25f - 1.0f;
	int64_t ne0[2] = {5, 3}, ne1[3] = {64, 7, 2}, ne2[4] = {16, 3, 2, 5};
	struct fill_ctx fc1 = {0}, fc2 = {.order_ok = true};
	CHECK(gguf_writer_add_tensor(w, "w.f32", KT_F32, 2, ne0, w0) == 0, "add f32");
	CHECK(gguf_writer_add_tensor_cb(w, "w.q8", KT_Q8_0, 3, ne1, fill_whole, &fc1) == 0, "add q8");
	gguf_writer_set_chunk_bytes(w, 100); /* 3 rows of 32 bytes per chunk */
	CHECK(gguf_writer_add_tensor_chunked(w, "w.bf16", KT_BF16, 4, ne2, fill_chunk, &fc2) == 0,
	      "add bf16");
	CHECK(gguf_writer_add_tensor(w, "w.f32", KT_F32, 2, ne0, w0) == -EEXIST, "duplicate tensor rejected");
	int64_t bad_ne[1] = {33};
	CHECK(gguf_writer_add_tensor(w, "w.bad", KT_Q8_0, 1, bad_ne, w0) == -EINVAL,
	      "ne0 not a block multiple");
	/* the rejected calls above were sticky errors: writing must fail and say so */
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	CHECK(rc != 0 && strstr(e.msg, "earlier"), "sticky error: rc %d %s", rc, e.msg);
	gguf_writer_destroy(w);

	/* again without the failing calls */
	w = gguf_writer_create(alignment);
	gguf_writer_set_u32(w, "t.u32", 4000000000u);
	gguf_writer_set_i32(w, "t.i32", -123456);
	gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull);
	gguf_writer_set_i64(w, "t.i64", -9000000000000ll);
	gguf_writer_set_u16(w, "t.u16", 65535);
	gguf_writer_set_f32(w, "t.f32", 0.1f);
	gguf_writer_set_bool(w, "t.bool", true);
	gguf_writer_set_str(w, "t.str", "hello \xe4\xb8\x96\xe7\x95\x8c");
	gguf_writer_set_str(w, "t.empty", "");
	gguf_writer_set_raw(w, "t.u8", GGUF_VT_U8, &u8, 1);
	gguf_writer_set_raw(w, "t.i8", GGUF_VT_I8, &i8, 1);
	gguf_writer_set_raw(w, "t.i16", GGUF_VT_I16, &i16, 2);
	gguf_writer_set_raw(w, "t.f64", GGUF_VT_F64, &f64, 8);
	gguf_writer_set_raw(w, "t.false", GGUF_VT_BOOL, &b0, 1);
	gguf_writer_set_arr(w, "a.i32", GGUF_VT_I32, ia, 5);
	gguf_writer_set_arr(w, "a.f32", GGUF_VT_F32, fa, 3);
	gguf_writer_set_arr(w, "a.f64", GGUF_VT_F64, da, 2);
	gguf_writer_set_arr(w, "a.u64", GGUF_VT_U64, ua, 2);
	gguf_writer_set_arr(w, "a.bool", GGUF_VT_BOOL, ba, 4);
	gguf_writer_set_arr(w, "a.empty", GGUF_VT_U32, NULL, 0);
	gguf_writer_set_arr_str(w, "a.str", strs, 4);
	n1 = nested_str_arrays(raw);
	gguf_writer_set_raw(w, "a.nested_str", GGUF_VT_ARRAY, raw, n1);
	n2 = nested_i16(raw);
	gguf_writer_set_raw(w, "a.nested_i16", GGUF_VT_ARRAY, raw, n2);
	gguf_writer_add_tensor(w, "w.f32", KT_F32, 2, ne0, w0);
	gguf_writer_add_tensor_cb(w, "w.q8", KT_Q8_0, 3, ne1, fill_whole, &fc1);
	gguf_writer_set_chunk_bytes(w, 100);
	gguf_writer_add_tensor_chunked(w, "w.bf16", KT_BF16, 4, ne2, fill_chunk, &fc2);
	rc = gguf_writer_write(w, path, &e);
	CHECK(rc == 0, "write: %s", e.msg);
	gguf_writer_destroy(w);
	CHECK(fc1.calls == 1, "whole callback called %d times", fc1.calls);
	/* 16*3*2*5 = 480 elements, 30 rows of 32 bytes, 3 rows per chunk -> 10 calls in order */
	CHECK(fc2.calls == 10 && fc2.order_ok, "chunk callback: %d calls, in order %d", fc2.calls,
	      fc2.order_ok);

	struct gguf_ctx *g;
	rc = gguf_open(&g, path, &e);
	CHECK(rc == 0, "reopen: %s", e.msg);
	if (rc)
		return;
	CHECK(gguf_alignment(g) == (alignment ? alignment : 32), "alignment %zu", gguf_alignment(g));
	uint32_t u;
	int64_t i64;
	float f;
	bool b;
	const char *s;
	size_t len;
	CHECK(gguf_get_u32(g, "t.u32", &u, &e) == 0 && u == 4000000000u, "u32");
	CHECK(gguf_get_i64(g, "t.i32", &i64, &e) == 0 && i64 == -123456, "i32");
	CHECK(gguf_get_u32(g, "t.i32", &u, &e) == ERR_FORMAT, "negative does not fit u32");
	CHECK(gguf_get_i64(g, "t.u64", &i64, &e) == ERR_FORMAT, "u64 > INT64_MAX does not fit i64");
	CHECK(gguf_get_i64(g, "t.i64", &i64, &e) == 0 && i64 == -9000000000000ll, "i64");
	CHECK(gguf_get_u32(g, "t.u16", &u, &e) == 0 && u == 65535, "u16");
	CHECK(gguf_get_u32(g, "t.u8", &u, &e) == 0 && u == 200, "u8");
	CHECK(gguf_get_i64(g, "t.i8", &i64, &e) == 0 && i64 == -100, "i8");
	CHECK(gguf_get_i64(g, "t.i16", &i64, &e) == 0 && i64 == -30000, "i16");
	CHECK(gguf_get_f32(g, "t.f32", &f, &e) == 0 && f == 0.1f, "f32");
	CHECK(gguf_get_f32(g, "t.f64", &f, &e) == 0 && f == (float)3.141592653589793, "f64 as f32");
	CHECK(gguf_get_bool(g, "t.bool", &b, &e) == 0 && b, "bool");
	CHECK(gguf_get_bool(g, "t.false", &b, &e) == 0 && !b, "false");
	CHECK(gguf_get_str(g, "t.str", &s, &len, &e) == 0 && len == 12 &&
	          memcmp(s, "hello \xe4\xb8\x96", 9) == 0,
	      "str");
	CHECK(gguf_get_str(g, "t.empty", &s, &len, &e) == 0 && len == 0, "empty str");
	CHECK(gguf_kv_type(g, gguf_find_key(g, "t.f64")) == GGUF_VT_F64, "kv type");
	CHECK(gguf_n_kv(g) == 23 + (alignment && alignment != 32), "n_kv %" PRId64, gguf_n_kv(g));

	struct gguf_arr a, sub, sub2;
	CHECK(gguf_get_arr(g, "a.i32", &a, &e) == 0 && a.type == GGUF_VT_I32 && a.count == 5, "a.i32");
	for (int i = 0; i < 5; i++)
		CHECK(gguf_arr_int(&a, (uint64_t)i) == ia[i], "a.i32[%d]", i);
	CHECK(gguf_arr_int(&a, 5) == 0, "out of range int element");
	CHECK(gguf_get_arr(g, "a.f32", &a, &e) == 0 && a.count == 3, "a.f32");
	for (int i = 0; i < 3; i++)
		CHECK(gguf_arr_float(&a, (uint64_t)i) == (double)fa[i], "a.f32[%d]", i);
	CHECK(gguf_get_arr(g, "a.f64", &a, &e) == 0 && gguf_arr_float(&a, 0) == 1e-300 &&
	          gguf_arr_float(&a, 1) == -2.5,
	      "a.f64");
	CHECK(gguf_get_arr(g, "a.u64", &a, &e) == 0 && memcmp(a.data, ua, 16) == 0, "a.u64");
	CHECK(gguf_get_arr(g, "a.bool", &a, &e) == 0 && a.type == GGUF_VT_BOOL && memcmp(a.data, ba, 4) == 0,
	      "a.bool");
	CHECK(gguf_get_arr(g, "a.empty", &a, &e) == 0 && a.count == 0 && a.type == GGUF_VT_U32, "a.empty");
	CHECK(gguf_get_arr(g, "a.str", &a, &e) == 0 && a.type == GGUF_VT_STRING && a.count == 4, "a.str");
	for (int i = 0; i < 4; i++) {
		s = gguf_arr_str(&a, (uint64_t)i, &len);
		CHECK(s && len == strlen(strs[i]) && memcmp(s, strs[i], len) == 0, "a.str[%d]", i);
	}
	CHECK(gguf_arr_sub(&a, 0, &sub) != 0, "arr_sub on a string array fails");
	CHECK(gguf_get_arr(g, "a.nested_str", &a, &e) == 0 && a.type == GGUF_VT_ARRAY && a.count == 3,
	      "nested_str");
	CHECK(gguf_arr_sub(&a, 0, &sub) == 0 && sub.type == GGUF_VT_STRING && sub.count == 2,
	      "nested_str[0]");
	s = gguf_arr_str(&sub, 1, &len);
	CHECK(s && len == 2 && memcmp(s, "bc", 2) == 0, "nested_str[0][1]");
	CHECK(gguf_arr_sub(&a, 1, &sub) == 0 && sub.count == 0, "nested_str[1] empty");
	CHECK(gguf_arr_sub(&a, 2, &sub) == 0 && sub.count == 1 && gguf_arr_str(&sub, 0, &len) && len == 0,
	      "nested_str[2][0] empty string");
	CHECK(gguf_arr_sub(&a, 3, &sub) != 0, "nested out of range");
	CHECK(gguf_get_arr(g, "a.nested_i16", &a, &e) == 0 && a.count == 2, "nested_i16");
	CHECK(gguf_arr_sub(&a, 0, &sub) == 0 && sub.type == GGUF_VT_ARRAY && sub.count == 2, "nested_i16[0]");
	CHECK(gguf_arr_sub(&sub, 1, &sub2) == 0 && sub2.type == GGUF_VT_I16 && sub2.count == 1 &&
	          gguf_arr_int(&sub2, 0) == 3,
	      "nested_i16[0][1] = [3]");
	CHECK(gguf_arr_sub(&a, 1, &sub) == 0 && gguf_arr_sub(&sub, 0, &sub2) == 0 && sub2.count == 3 &&
	          gguf_arr_int(&sub2, 2) == -6,
	      "nested_i16[1][0][2] = -6");

	CHECK(gguf_n_tensors(g) == 3, "3 tensors");
	const struct gguf_tensor *t = gguf_find_tensor(g, "w.f32");
	CHECK(t && t->type == KT_F32 && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 && t->nbytes == 60 &&
	          memcmp(t->data, w0, 60) == 0,
	      "w.f32");
	t = gguf_find_tensor(g, "w.q8");
	CHECK(t && t->type == KT_Q8_0 && t->n_dims == 3 && t->ne[2] == 2 && t->nbytes == 2 * 14 * 34, "w.q8");
	if (t) {
		bool ok = true;
		for (size_t i = 0; i < t->nbytes; i++)
			ok &= ((const uint8_t *)t->data)[i] == pattern("w.q8", i);
		CHECK(ok, "w.q8 data");
	}
	t = gguf_find_tensor(g, "w.bf16");
	CHECK(t && t->type == KT_BF16 && t->n_dims == 4 && t->ne[3] == 5 && t->nbytes == 960, "w.bf16");
	if (t) {
		bool ok = true;
		for (size_t i = 0; i < t->nbytes; i++)
			ok &= ((const uint8_t *)t->data)[i] == pattern("w.bf16", i);
		CHECK(ok, "w.bf16 data");
	}
	for (int64_t i = 0; i < gguf_n_tensors(g); i++)
		CHECK(gguf_tensor(g, i)->file_offset % gguf_alignment(g) == 0, "tensor %" PRId64 " aligned",
		      i);
	CHECK(gguf_tensor(g, 3) == NULL && gguf_tensor(g, -1) == NULL, "tensor index range");

	/* copy_kv: copy every key into a new file, read back identical bytes */
	char path2[512];
	tmp_path(path2, sizeof(path2), "rt2.gguf");
	w = gguf_writer_create(0);
	for (int64_t i = 0; i < gguf_n_kv(g); i++)
		if (strcmp(gguf_kv_key(g, i), "general.alignment") != 0)
			CHECK(gguf_writer_copy_kv(w, g, i) == 0, "copy kv %" PRId64, i);
	rc = gguf_writer_write(w, path2, &e);
	CHECK(rc == 0, "write copy: %s", e.msg);
	gguf_writer_destroy(w);
	struct gguf_ctx *g2;
	rc = gguf_open(&g2, path2, &e);
	CHECK(rc == 0, "open copy: %s", e.msg);
	if (rc == 0) {
		CHECK(gguf_get_arr(g2, "a.nested_i16", &a, &e) == 0 && gguf_arr_sub(&a, 1, &sub) == 0 &&
		          gguf_arr_sub(&sub, 0, &sub2) == 0 && gguf_arr_int(&sub2, 1) == 5,
		      "copied nested array");
		CHECK(gguf_get_str(g2, "t.str", &s, &len, &e) == 0 && len == 12, "copied str");
		gguf_close(g2);
	}
	gguf_close(g);
	unlink(path);
	unlink(path2);
}

/* ---- split sets -------------------------------------------------------------------------------- */

static void write_shard(const char *dir, int no, int count, int total_tensors, const char *tensor)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/sp-%05d-of-%05d.gguf", dir, no + 1, count);
	struct gguf_writer *w = gguf_writer_create(0);
	gguf_writer_set_u16(w, "split.no", (uint16_t)no);
	gguf_writer_set_u16(w, "split.count", (uint16_t)count);
	gguf_writer_set_i32(w, "split.tensors.count", total_tensors);
	if (no == 0)
		gguf_writer_set_str(w, "general.architecture", "test");
	float v[4] = {(float)no, 1, 2, 3};
	int64_t ne[1] = {4};
	gguf_writer_add_tensor(w, tensor, KT_F32, 1, ne, v);
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	CHECK(rc == 0, "write shard: %s", e.msg);
	gguf_writer_destroy(w);
}

static void test_split(void)
{
	write_shard(tmpdir, 0, 3, 3, "t.a");
	write_shard(tmpdir, 1, 3, 3, "t.b");
	write_shard(tmpdir, 2, 3, 3, "t.c");
	for (int from = 1; from <= 3; from++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/sp-%05d-of-00003.gguf", tmpdir, from);
		struct gguf_ctx *g;
		struct errbuf e = {0};
		int rc = gguf_open(&g, path, &e);
		CHECK(rc == 0, "open split from shard %d: %s", from, e.msg);
		if (rc)
			continue;
		CHECK(gguf_n_shards(g) == 3 && gguf_n_tensors(g) == 3, "merged");
		const char *names[3] = {"t.a", "t.b", "t.c"};
		for (int i = 0; i < 3; i++) {
			const struct gguf_tensor *t = gguf_find_tensor(g, names[i]);
			CHECK(t && t->shard == i && ((const float *)t->data)[0] == (float)i,
			      "tensor %s in shard %d", names[i], i);
			CHECK(gguf_tensor(g, i) == t, "file order");
		}
		char *arch = gguf_get_str_dup(g, "general.architecture", &e);
		CHECK(arch && strcmp(arch, "test") == 0, "metadata from shard 1");
		free(arch);
		CHECK(strstr(gguf_shard_path(g, 0), "sp-00001-of-00003.gguf") != NULL, "shard 0 path");
		gguf_close(g);
	}
}

static int fill_fail(void *user, const char *name, uint64_t off, void *dst, size_t n)
{
	(void)user, (void)name, (void)dst, (void)n;
	return off > 0 ? -EIO : 0; /* fails on the second chunk */
}

/* Write failures: a clear error, and neither the file nor its .tmp left behind. */
static void test_write_errors(void)
{
	char path[512], tmp[530];
	tmp_path(path, sizeof(path), "fail.gguf");
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	struct gguf_writer *w = gguf_writer_create(0);
	int64_t ne[2] = {32, 100};
	gguf_writer_set_chunk_bytes(w, 1000);
	CHECK(gguf_writer_add_tensor_chunked(w, "t.bad", KT_F32, 2, ne, fill_fail, NULL) == 0, "add");
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	CHECK(rc == -EIO && strstr(e.msg, "t.bad"), "callback failure: %d %s", rc, e.msg);
	CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "no file left after a failed write");
	rc = gguf_writer_write(w, "/nonexistent-dir/x.gguf", &e);
	CHECK(rc == -ENOENT && strstr(e.msg, "/nonexistent-dir/x.gguf.tmp"), "unwritable path: %d %s", rc,
	      e.msg);
	gguf_writer_destroy(w);
	CHECK(gguf_writer_create(3) == NULL, "alignment 3 refused");
	w = gguf_writer_create(0);
	CHECK(gguf_writer_set_u32(w, "", 1) == -EINVAL, "empty key refused");
	char longkey[300];
	memset(longkey, 'k', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = 0;
	CHECK(gguf_writer_set_u32(w, longkey, 1) == -EINVAL, "key over GGUF_MAX_NAME refused");
	CHECK(gguf_writer_add_tensor(w, "t", 77, 1, ne, ne) == -EINVAL, "unknown type refused");
	CHECK(gguf_writer_add_tensor(w, "t", KT_F32, 5, ne, ne) == -EINVAL, "5 dims refused");
	gguf_writer_destroy(w);
}

static void test_print(void)
{
	struct gguf_ctx *g;
	struct errbuf e = {0};
	int rc = gguf_open(&g, DATA "models/glm-dsa-tiny-Q4_K_M.gguf", &e);
	CHECK(rc == 0, "%s", e.msg);
	if (rc)
		return;
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	gguf_print(g, f);
	fclose(f);
	CHECK(strstr(buf, "tokenizer.ggml.tokens") && strstr(buf, "more)"), "long arrays abbreviated");
	CHECK(strstr(buf, "blk.2.ffn_down_exps.weight") && strstr(buf, "Q6_K"), "tensor table");
	CHECK(strstr(buf, "totals per type") && strstr(buf, "Q5_0"), "totals");
	free(buf);
	gguf_close(g);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gguf.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_reference_files();
	test_tiny_metadata();
	test_deepseek_vocab();
	roundtrip(0);
	roundtrip(64);
	roundtrip(1);
	test_split();
	test_write_errors();
	test_print();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", tmpdir);
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
