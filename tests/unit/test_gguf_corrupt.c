/* GGUF corruption test: starting from a real reference model and from small writer-made files,
 * build broken files on purpose (truncations at every header byte, huge counts and lengths, bad
 * value/array types, misaligned/overlapping/out-of-file tensor data, duplicate names and keys,
 * wrong sizes, unknown type ids, bad n_dims and alignment, broken split sets, random byte flips)
 * and check each returns the right error code with a message naming the problem, without crashing.
 * Every mutated image is opened from an exactly-sized heap copy so ASan (make SAN=1) sees any
 * read past the end. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static char tmpdir[256];

/* ---- an independent walker that records where each field of a valid file lives --------------- */

#define MAXK 64
#define MAXT 128

struct layout {
	size_t n_kv, n_t;
	size_t kv_off[MAXK], kv_type_off[MAXK], kv_val_off[MAXK];
	char kv_key[MAXK][128];
	size_t ti_off[MAXT], ti_ndims_off[MAXT], ti_ne_off[MAXT], ti_type_off[MAXT], ti_offset_off[MAXT];
	size_t info_end;
};

static uint64_t ld64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static uint32_t ld32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static void st64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

static void st32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static size_t skip_value(const uint8_t *b, size_t p, uint32_t t)
{
	static const size_t sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
	if (t == 8)
		return p + 8 + ld64(b + p);
	if (t == 9) {
		uint32_t et = ld32(b + p);
		uint64_t n = ld64(b + p + 4);
		p += 12;
		if (et != 8 && et != 9)
			return p + n * sz[et];
		for (uint64_t i = 0; i < n; i++)
			p = skip_value(b, p, et);
		return p;
	}
	return p + sz[t];
}

static void walk(const uint8_t *b, struct layout *L)
{
	memset(L, 0, sizeof(*L));
	L->n_t = ld64(b + 8);
	L->n_kv = ld64(b + 16);
	size_t p = 24;
	for (size_t i = 0; i < L->n_kv && i < MAXK; i++) {
		L->kv_off[i] = p;
		uint64_t kl = ld64(b + p);
		snprintf(L->kv_key[i], sizeof(L->kv_key[i]), "%.*s", (int)kl, (const char *)b + p + 8);
		p += 8 + kl;
		L->kv_type_off[i] = p;
		uint32_t t = ld32(b + p);
		p += 4;
		L->kv_val_off[i] = p;
		p = skip_value(b, p, t);
	}
	for (size_t i = 0; i < L->n_t && i < MAXT; i++) {
		L->ti_off[i] = p;
		p += 8 + ld64(b + p);
		L->ti_ndims_off[i] = p;
		uint32_t nd = ld32(b + p);
		p += 4;
		L->ti_ne_off[i] = p;
		p += 8 * nd;
		L->ti_type_off[i] = p;
		p += 4;
		L->ti_offset_off[i] = p;
		p += 8;
	}
	L->info_end = p;
}

static int kv_index(const struct layout *L, const char *key)
{
	for (size_t i = 0; i < L->n_kv && i < MAXK; i++)
		if (strcmp(L->kv_key[i], key) == 0)
			return (int)i;
	return -1;
}

/* ---- helpers ----------------------------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)n);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	*size = (size_t)n;
	return b;
}

/* Opens an exact-size copy of img[0..n); returns the code, message in e. */
static int try_open(const uint8_t *img, size_t n, struct errbuf *e)
{
	uint8_t *copy = malloc(n ? n : 1);
	memcpy(copy, img, n);
	struct gguf_ctx *g = NULL;
	memset(e, 0, sizeof(*e));
	int rc = gguf_open_mem(&g, copy, n, "corrupt.gguf", e);
	if (rc == 0) {
		/* a file that opens must be fully usable: touch every tensor's first and last byte */
		volatile uint8_t sink = 0;
		for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
			const struct gguf_tensor *t = gguf_tensor(g, i);
			sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
		}
		for (int64_t i = 0; i < gguf_n_kv(g); i++) {
			struct gguf_arr a;
			if (gguf_get_arr(g, gguf_kv_key(g, i), &a, NULL) == 0 && a.type == GGUF_VT_STRING &&
			    a.count)
				sink ^= (uint8_t)gguf_arr_str(&a, a.count - 1, NULL)[0];
		}
		(void)sink;
		gguf_close(g);
	}
	free(copy);
	return rc;
}

/* Applies `mut` to a copy of the image, opens it, checks code and that the message has `needle`. */
static void expect(const char *what, const uint8_t *img, size_t n, int code, const char *needle)
{
	struct errbuf e;
	int rc = try_open(img, n, &e);
	CHECK(rc == code, "%s: rc %d (%s), expected %d; msg: %s", what, rc, err_name(rc), code, e.msg);
	if (rc != 0)
		CHECK(strstr(e.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, needle);
}

/* ---- cases on the real file -------------------------------------------------------------------- */

static void test_real_file(void)
{
	size_t n;
	uint8_t *orig = read_file("tests/data/models/glm-dsa-tiny-Q8_0.gguf", &n);
	CHECK(orig, "cannot read reference model");
	if (!orig)
		return;
	struct layout L;
	walk(orig, &L);
	struct errbuf e;
	CHECK(try_open(orig, n, &e) == 0, "unmodified file opens: %s", e.msg);
	uint8_t *b = malloc(n);

	/* data section start and the end of the last tensor */
	size_t ds = (L.info_end + 31) / 32 * 32, max_end = 0;
	for (size_t i = 0; i < L.n_t; i++) {
		uint32_t t = ld32(orig + L.ti_type_off[i]);
		uint32_t nd = ld32(orig + L.ti_ndims_off[i]);
		size_t bytes;
		uint64_t rows = 1;
		for (uint32_t d = 1; d < nd; d++)
			rows *= ld64(orig + L.ti_ne_off[i] + 8 * d);
		CHECK(ktype_row_bytes((int)t, (int64_t)ld64(orig + L.ti_ne_off[i]), &bytes), "row bytes");
		size_t end = ds + ld64(orig + L.ti_offset_off[i]) + bytes * rows;
		if (end > max_end)
			max_end = end;
	}
	printf("reference file: %zu bytes, %zu kvs, %zu tensors, header %zu bytes, data ends at %zu\n", n,
	       L.n_kv, L.n_t, L.info_end, max_end);

	/* truncation at every byte of the header region, and every 4093rd byte of the data */
	int bad = 0;
	for (size_t cut = 0; cut <= ds; cut++) {
		int rc = try_open(orig, cut, &e);
		if (rc != ERR_FORMAT || (!strstr(e.msg, "offset") && !strstr(e.msg, "too small"))) {
			if (bad++ < 5)
				CHECK(0, "cut at %zu: rc %d msg %s", cut, rc, e.msg);
		}
	}
	CHECK(bad == 0, "%d header cut points misbehaved", bad);
	bad = 0;
	for (size_t cut = ds; cut < n; cut += 4093) {
		int rc = try_open(orig, cut, &e);
		bool ok = cut < max_end
		              ? rc == ERR_FORMAT && strstr(e.msg, "past the end") && strstr(e.msg, "tensor '")
		              : rc == 0;
		if (!ok && bad++ < 5)
			CHECK(0, "data cut at %zu: rc %d msg %s", cut, rc, e.msg);
	}
	CHECK(bad == 0, "%d data cut points misbehaved", bad);

#define FRESH() memcpy(b, orig, n)
	FRESH(), st64(b + 8, 1ull << 60);
	expect("tensor count 2^60", b, n, ERR_FORMAT, "tensor count");
	FRESH(), st64(b + 16, 1ull << 60);
	expect("kv count 2^60", b, n, ERR_FORMAT, "metadata count");
	FRESH(), st64(b + 16, UINT64_MAX);
	expect("kv count 2^64-1", b, n, ERR_FORMAT, "metadata count");
	FRESH(), st64(b + 24, 1ull << 62);
	expect("key length 2^62", b, n, ERR_FORMAT, "string length");
	FRESH(), st64(b + 24, 0);
	expect("key length 0", b, n, ERR_FORMAT, "name length 0");
	FRESH(), st64(b + 24, 300);
	expect("key length 300", b, n, ERR_FORMAT, "name length 300");
	FRESH(), b[24 + 8 + 3] = 0;
	expect("NUL in key", b, n, ERR_FORMAT, "control byte 0x00 at 3");
	FRESH(), b[24 + 8 + 5] = 0x1b;
	expect("ESC in key", b, n, ERR_FORMAT, "control byte 0x1b at 5");

	int k_tok = kv_index(&L, "tokenizer.ggml.tokens");
	int k_arch = kv_index(&L, "general.architecture");
	int k_types = kv_index(&L, "glm-dsa.attention.indexer.types");
	int k_u32 = kv_index(&L, "glm-dsa.block_count");
	CHECK(k_tok >= 0 && k_arch >= 0 && k_types >= 0 && k_u32 >= 0, "keys found by walker");
	if (k_tok < 0 || k_arch < 0 || k_types < 0 || k_u32 < 0)
		goto out;
	FRESH(), st32(b + L.kv_type_off[k_arch], 13);
	expect("value type 13", b, n, ERR_FORMAT, "invalid value type 13");
	FRESH(), st32(b + L.kv_type_off[k_arch], 0xffffffffu);
	expect("value type 2^32-1", b, n, ERR_FORMAT, "invalid value type");
	FRESH(), st64(b + L.kv_val_off[k_arch], 1ull << 40);
	expect("string value length 2^40", b, n, ERR_FORMAT, "general.architecture");
	FRESH(), st32(b + L.kv_val_off[k_tok], 99);
	expect("array element type 99", b, n, ERR_FORMAT, "invalid array element type 99");
	FRESH(), st32(b + L.kv_val_off[k_tok], GGUF_VT_ARRAY);
	expect("strings read as nested arrays", b, n, ERR_FORMAT, "tokenizer.ggml.tokens");
	FRESH(), st64(b + L.kv_val_off[k_tok] + 4, 1ull << 60);
	expect("string array count 2^60", b, n, ERR_FORMAT, "array of 1152921504606846976");
	FRESH(), st64(b + L.kv_val_off[k_tok] + 12, 1ull << 33);
	expect("first token length 2^33", b, n, ERR_FORMAT, "tokenizer.ggml.tokens");
	FRESH(), st64(b + L.kv_val_off[k_types] + 4, 1ull << 61);
	expect("bool array count 2^61", b, n, ERR_FORMAT, "indexer.types");
	FRESH(), b[L.kv_val_off[k_types] + 12] = 7;
	expect("bool array element 7", b, n, ERR_FORMAT, "bool array element 0 has value 7");
	FRESH(), st32(b + L.kv_type_off[k_u32], GGUF_VT_STRING);
	expect("u32 read as string", b, n, ERR_FORMAT, "glm-dsa.block_count");
	/* duplicate key: copy a key onto another key of the same length */
	{
		int a = -1, c = -1;
		for (size_t i = 0; i < L.n_kv && a < 0; i++)
			for (size_t j = i + 1; j < L.n_kv; j++)
				if (strlen(L.kv_key[i]) == strlen(L.kv_key[j])) {
					a = (int)i, c = (int)j;
					break;
				}
		CHECK(a >= 0, "two keys of the same length exist");
		if (a >= 0) {
			FRESH(), memcpy(b + L.kv_off[c] + 8, L.kv_key[a], strlen(L.kv_key[a]));
			expect("duplicate key", b, n, ERR_FORMAT, "duplicate key");
		}
	}

	/* tensor infos */
	size_t t0 = 0, t1 = 1;
	FRESH(), st32(b + L.ti_ndims_off[t0], 0);
	expect("n_dims 0", b, n, ERR_FORMAT, "n_dims 0");
	FRESH(), st32(b + L.ti_ndims_off[t0], 5);
	expect("n_dims 5", b, n, ERR_FORMAT, "n_dims 5");
	FRESH(), st64(b + L.ti_ne_off[t0] + 8, 0);
	expect("ne1 = 0", b, n, ERR_FORMAT, "ne[1] = 0");
	FRESH(), st64(b + L.ti_ne_off[t0], 1ull << 63);
	expect("ne0 = 2^63", b, n, ERR_FORMAT, "ne[0]");
	FRESH(), st64(b + L.ti_ne_off[t0] + 8, 1ull << 40);
	expect("ne1 = 2^40 (data past EOF)", b, n, ERR_FORMAT, "past the end");
	{
		/* the first tensor is a 2-D matrix in this file; give it huge dims whose product overflows */
		FRESH(), st64(b + L.ti_ne_off[t0] + 8, 1ull << 62);
		st32(b + L.ti_ndims_off[t0], 2);
		expect("huge ne1", b, n, ERR_FORMAT, "tensor '");
	}
	for (size_t i = 0; i < L.n_t; i++) {
		if (ld32(orig + L.ti_type_off[i]) == KT_Q8_0 && ld64(orig + L.ti_ne_off[i]) == 256) {
			FRESH(), st64(b + L.ti_ne_off[i], 255);
			expect("Q8_0 ne0 = 255", b, n, ERR_FORMAT,
			       "not a multiple of the Q8_0 block size 32");
			FRESH(), st64(b + L.ti_ne_off[i], 288);
			expect("Q8_0 ne0 = 288 (bigger than stored)", b, n, ERR_FORMAT, "");
			break;
		}
	}
	const uint32_t bad_types[] = {4, 5, 31, 36, 40, 77, 1u << 31, 0xffffffffu};
	for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "type id %u", bad_types[i]);
		FRESH(), st32(b + L.ti_type_off[t0], bad_types[i]);
		expect(what, b, n, ERR_UNSUPPORTED, "unknown ggml type id");
	}
	FRESH(), st64(b + L.ti_offset_off[t1], ld64(orig + L.ti_offset_off[t1]) + 1);
	expect("misaligned offset", b, n, ERR_FORMAT, "not a multiple of the alignment 32");
	FRESH(), st64(b + L.ti_offset_off[t1], ld64(orig + L.ti_offset_off[t0]));
	expect("overlapping tensors", b, n, ERR_FORMAT, "overlaps");
	FRESH(), st64(b + L.ti_offset_off[t1], ld64(orig + L.ti_offset_off[t0]) + 32);
	expect("partly overlapping tensors", b, n, ERR_FORMAT, "overlaps");
	FRESH(), st64(b + L.ti_offset_off[t1], (uint64_t)n / 32 * 32);
	expect("data past EOF", b, n, ERR_FORMAT, "past the end");
	FRESH(), st64(b + L.ti_offset_off[t1], UINT64_MAX - 31);
	expect("offset near 2^64", b, n, ERR_FORMAT, "past the end");
	FRESH(), st64(b + L.ti_off[t0], 0);
	expect("empty tensor name", b, n, ERR_FORMAT, "name length 0");
	FRESH(), b[L.ti_off[t0] + 8 + 1] = '\n';
	expect("newline in tensor name", b, n, ERR_FORMAT, "control byte 0x0a");
	FRESH(), st64(b + L.ti_off[t0], 1ull << 50);
	expect("tensor name length 2^50", b, n, ERR_FORMAT, "tensor name");
	{
		/* duplicate tensor names: find two names of equal length, copy one onto the other */
		int a = -1, c = -1;
		for (size_t i = 0; i < L.n_t && a < 0; i++)
			for (size_t j = i + 1; j < L.n_t; j++)
				if (ld64(orig + L.ti_off[i]) == ld64(orig + L.ti_off[j])) {
					a = (int)i, c = (int)j;
					break;
				}
		CHECK(a >= 0, "two tensor names of equal length");
		if (a >= 0) {
			FRESH(),
			    memcpy(b + L.ti_off[c] + 8, orig + L.ti_off[a] + 8, ld64(orig + L.ti_off[a]));
			expect("duplicate tensor name", b, n, ERR_FORMAT, "duplicate tensor name");
		}
	}
	FRESH(), st32(b + 4, 2);
	expect("version 2", b, n, ERR_UNSUPPORTED, "version 2");
	FRESH(), st32(b + 4, 0x03000000u);
	expect("big-endian", b, n, ERR_UNSUPPORTED, "big-endian");
	FRESH(), b[0] = 'X';
	expect("bad magic", b, n, ERR_FORMAT, "not a GGUF file");
#undef FRESH

	/* seeded random byte flips in the header region: anything may happen except a crash, and a
	 * failure must carry a message */
	uint64_t x = 0x9e3779b97f4a7c15ull;
	int opened = 0, failed = 0, nomsg = 0;
	for (int it = 0; it < 3000; it++) {
		memcpy(b, orig, n);
		int flips = 1 + it % 4;
		for (int k = 0; k < flips; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			size_t pos = (size_t)(x % ds);
			b[pos] = (uint8_t)(x >> 40);
		}
		int rc = try_open(b, n, &e);
		if (rc == 0)
			opened++;
		else {
			failed++;
			nomsg += e.msg[0] == '\0';
		}
	}
	CHECK(nomsg == 0, "%d failures without a message", nomsg);
	printf("random header mutations: %d opened, %d rejected\n", opened, failed);
out:
	free(b);
	free(orig);
}

/* ---- small writer-made files ------------------------------------------------------------------- */

static uint8_t *small_file(size_t *n, size_t alignment)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/small.gguf", tmpdir);
	struct gguf_writer *w = gguf_writer_create(alignment);
	gguf_writer_set_str(w, "general.architecture", "x");
	gguf_writer_set_u32(w, "k.aaaa", 1);
	gguf_writer_set_u32(w, "k.bbbb", 2);
	float v[64] = {0};
	int64_t ne[2] = {32, 2};
	gguf_writer_add_tensor(w, "t.one", KT_F32, 2, ne, v);
	gguf_writer_add_tensor(w, "t.two", KT_Q8_0, 2, ne, v);
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	CHECK(rc == 0, "%s", e.msg);
	gguf_writer_destroy(w);
	uint8_t *b = read_file(path, n);
	unlink(path);
	return b;
}

static size_t put_nested(uint8_t *p, int depth)
{
	uint32_t ta = GGUF_VT_ARRAY, tu = GGUF_VT_U8;
	uint64_t one = 1;
	size_t o = 0;
	for (int d = 0; d < depth - 1; d++) {
		memcpy(p + o, &ta, 4), memcpy(p + o + 4, &one, 8);
		o += 12;
	}
	memcpy(p + o, &tu, 4), memcpy(p + o + 4, &one, 8);
	p[o + 12] = 5;
	return o + 13;
}

static void test_small_files(void)
{
	size_t n;
	uint8_t *orig = small_file(&n, 0);
	if (!orig)
		return;
	struct layout L;
	walk(orig, &L);
	uint8_t *b = malloc(n);
	struct errbuf e;
	CHECK(try_open(orig, n, &e) == 0, "small file opens: %s", e.msg);
	int bad = 0;
	for (size_t cut = 0; cut < n; cut++) {
		int rc = try_open(orig, cut, &e);
		if ((rc != ERR_FORMAT || !e.msg[0]) && bad++ < 5)
			CHECK(0, "small cut at %zu: rc %d %s", cut, rc, e.msg);
	}
	CHECK(bad == 0, "%d small-file cut points misbehaved", bad);
	memcpy(b, orig, n);
	memcpy(b + L.kv_off[2] + 8, "k.aaaa", 6);
	expect("duplicate key (small)", b, n, ERR_FORMAT, "duplicate key 'k.aaaa'");
	memcpy(b, orig, n);
	memcpy(b + L.ti_off[1] + 8, "t.one", 5);
	expect("duplicate tensor (small)", b, n, ERR_FORMAT, "duplicate tensor name 't.one'");
	free(b);
	free(orig);

	/* alignment values: written as a u32 key by the writer for 64; patch it */
	orig = small_file(&n, 64);
	walk(orig, &L);
	b = malloc(n);
	int ka = kv_index(&L, "general.alignment");
	CHECK(ka >= 0, "alignment key written");
	CHECK(try_open(orig, n, &e) == 0, "aligned 64 opens: %s", e.msg);
	const uint32_t bad_align[] = {0, 3, 48, 100, 0x80000001u};
	for (size_t i = 0; ka >= 0 && i < sizeof(bad_align) / sizeof(bad_align[0]); i++) {
		memcpy(b, orig, n);
		st32(b + L.kv_val_off[ka], bad_align[i]);
		char what[64];
		snprintf(what, sizeof(what), "alignment %u", bad_align[i]);
		expect(what, b, n, ERR_FORMAT, "general.alignment");
	}
	if (ka >= 0) {
		memcpy(b, orig, n);
		st32(b + L.kv_type_off[ka], GGUF_VT_I32);
		expect("alignment of type i32", b, n, ERR_FORMAT, "general.alignment' has type i32");
		memcpy(b, orig, n);
		st32(b + L.kv_val_off[ka], 1u << 30);
		expect("alignment 2^30", b, n, ERR_FORMAT, "");
		memcpy(b, orig, n);
		st32(b + L.kv_val_off[ka], 32); /* offsets stay multiples of 32, but the data start moves */
		struct errbuf e2;
		int rc = try_open(b, n, &e2);
		CHECK(rc == 0 || rc == ERR_FORMAT, "alignment 32 in a 64-aligned file: %d %s", rc, e2.msg);
	}
	free(b);
	free(orig);

	/* nesting depth and bool values, built directly */
	uint8_t img[1024];
	for (int depth = 1; depth <= 12; depth++) {
		size_t o = 0;
		uint32_t magic = 0x46554747u, ver = 3, ta = GGUF_VT_ARRAY;
		uint64_t nt = 0, nkv = 1, kl = 1;
		memcpy(img + o, &magic, 4), o += 4;
		memcpy(img + o, &ver, 4), o += 4;
		memcpy(img + o, &nt, 8), o += 8;
		memcpy(img + o, &nkv, 8), o += 8;
		memcpy(img + o, &kl, 8), o += 8;
		img[o++] = 'k';
		memcpy(img + o, &ta, 4), o += 4;
		o += put_nested(img + o, depth);
		struct errbuf e3;
		int rc = try_open(img, o, &e3);
		if (depth <= 8)
			CHECK(rc == 0, "nesting depth %d: %s", depth, e3.msg);
		else
			CHECK(rc == ERR_FORMAT && strstr(e3.msg, "nested deeper"), "nesting depth %d: %d %s",
			      depth, rc, e3.msg);
	}
	{
		size_t o = 0;
		uint32_t magic = 0x46554747u, ver = 3, tb = GGUF_VT_BOOL;
		uint64_t nt = 0, nkv = 1, kl = 1;
		memcpy(img + o, &magic, 4), o += 4;
		memcpy(img + o, &ver, 4), o += 4;
		memcpy(img + o, &nt, 8), o += 8;
		memcpy(img + o, &nkv, 8), o += 8;
		memcpy(img + o, &kl, 8), o += 8;
		img[o++] = 'b';
		memcpy(img + o, &tb, 4), o += 4;
		img[o++] = 2;
		expect("bool value 2", img, o, ERR_FORMAT, "bool value 2");
		/* an array of arrays whose count promises more than the file holds */
		o -= 5;
		uint32_t ta = GGUF_VT_ARRAY;
		uint64_t cnt = 1ull << 59;
		memcpy(img + o, &ta, 4), o += 4;
		memcpy(img + o, &ta, 4), o += 4;
		memcpy(img + o, &cnt, 8), o += 8;
		expect("array of 2^59 arrays", img, o, ERR_FORMAT, "array of");
	}
}

/* ---- split sets -------------------------------------------------------------------------------- */

struct shard_spec {
	int no_key; /* value written as split.no (-1: omit) */
	int count_key; /* split.count (-1: omit) */
	int total; /* split.tensors.count (-1: omit) */
	const char *tensor;
};

static void write_set(const char *stem, int count, const struct shard_spec *s, int n_write)
{
	for (int i = 0; i < n_write; i++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s-%05d-of-%05d.gguf", tmpdir, stem, i + 1, count);
		struct gguf_writer *w = gguf_writer_create(0);
		if (s[i].no_key >= 0)
			gguf_writer_set_u16(w, "split.no", (uint16_t)s[i].no_key);
		if (s[i].count_key >= 0)
			gguf_writer_set_u16(w, "split.count", (uint16_t)s[i].count_key);
		if (s[i].total >= 0)
			gguf_writer_set_i32(w, "split.tensors.count", s[i].total);
		float v[8] = {0};
		int64_t ne[1] = {8};
		gguf_writer_add_tensor(w, s[i].tensor, KT_F32, 1, ne, v);
		struct errbuf e = {0};
		int rc = gguf_writer_write(w, path, &e);
		CHECK(rc == 0, "%s", e.msg);
		gguf_writer_destroy(w);
	}
}

static void expect_file(const char *what, const char *stem, int from, int count, int code, const char *needle)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s-%05d-of-%05d.gguf", tmpdir, stem, from, count);
	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	int rc = gguf_open(&g, path, &e);
	CHECK(rc == code, "%s: rc %d (%s), expected %d; msg: %s", what, rc, err_name(rc), code, e.msg);
	if (rc)
		CHECK(strstr(e.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, needle);
	gguf_close(g);
}

static void test_split_sets(void)
{
	struct shard_spec ok[3] = {{0, 3, 3, "a"}, {1, 3, 3, "b"}, {2, 3, 3, "c"}};
	write_set("ok", 3, ok, 3);
	expect_file("good set", "ok", 2, 3, 0, "");

	write_set("miss", 3, ok, 2); /* shard 3 absent */
	expect_file("missing last shard", "miss", 1, 3, -ENOENT, "miss-00003-of-00003.gguf");
	struct shard_spec m1[3] = {{0, 3, 3, "a"}, {1, 3, 3, "b"}, {2, 3, 3, "c"}};
	write_set("miss1", 3, m1, 3);
	char p[512];
	snprintf(p, sizeof(p), "%s/miss1-00001-of-00003.gguf", tmpdir);
	unlink(p);
	expect_file("missing first shard, opened from the second", "miss1", 2, 3, -ENOENT,
	            "miss1-00001-of-00003.gguf");

	struct shard_spec c1[3] = {{0, 3, 3, "a"}, {1, 4, 3, "b"}, {2, 3, 3, "c"}};
	write_set("cnt", 3, c1, 3);
	expect_file("inconsistent split.count", "cnt", 1, 3, ERR_MISMATCH, "split.count = 4");

	struct shard_spec n1[3] = {{0, 3, 3, "a"}, {2, 3, 3, "b"}, {2, 3, 3, "c"}};
	write_set("no", 3, n1, 3);
	expect_file("wrong split.no", "no", 3, 3, ERR_MISMATCH, "split.no");

	struct shard_spec n2[3] = {{0, 3, 3, "a"}, {-1, 3, 3, "b"}, {2, 3, 3, "c"}};
	write_set("nono", 3, n2, 3);
	expect_file("missing split.no", "nono", 1, 3, ERR_MISMATCH, "nono-00002-of-00003.gguf");

	struct shard_spec t1[3] = {{0, 3, 5, "a"}, {1, 3, 5, "b"}, {2, 3, 5, "c"}};
	write_set("tot", 3, t1, 3);
	expect_file("wrong split.tensors.count", "tot", 1, 3, ERR_MISMATCH, "split.tensors.count = 5");

	struct shard_spec d1[3] = {{0, 3, 3, "a"}, {1, 3, 3, "b"}, {2, 3, 3, "a"}};
	write_set("dup", 3, d1, 3);
	expect_file("tensor in two shards", "dup", 1, 3, ERR_FORMAT, "duplicate tensor name 'a'");

	struct shard_spec f1[2] = {{0, 2, 2, "a"}, {1, 2, 2, "b"}};
	write_set("nm", 2, f1, 2);
	char from[512], to[512];
	snprintf(from, sizeof(from), "%s/nm-00001-of-00002.gguf", tmpdir);
	snprintf(to, sizeof(to), "%s/plain.gguf", tmpdir);
	CHECK(rename(from, to) == 0, "rename");
	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	int rc = gguf_open(&g, to, &e);
	CHECK(rc == ERR_FORMAT && strstr(e.msg, "does not follow"), "split file with a plain name: %d %s", rc,
	      e.msg);
	gguf_close(g);
	/* a lone file named as part of a set but without split keys */
	write_set("lone", 2, (struct shard_spec[]){{-1, -1, -1, "a"}}, 1);
	expect_file("set name without split keys", "lone", 1, 2, ERR_MISMATCH, "file name says 2 shards");
	rc = gguf_open(&g, "/nonexistent/x.gguf", &e);
	CHECK(rc == -ENOENT && strstr(e.msg, "/nonexistent/x.gguf"), "absent file: %d %s", rc, e.msg);
	rc = gguf_open(&g, tmpdir, &e);
	CHECK(rc == ERR_FORMAT && strstr(e.msg, "not a regular file"), "directory: %d %s", rc, e.msg);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gguf_corrupt.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_real_file();
	test_small_files();
	test_split_sets();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", tmpdir);
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
