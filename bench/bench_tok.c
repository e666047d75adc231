/* Tokenizer benchmark: GGUF vocab load time, encode throughput on a text file (default: the 360
 * test strings repeated to ~1 MB), per-call cost of a short prompt, and stream decode. CPU time of
 * this process, best of 5, so a busy shared machine disturbs it less than wall time.
 *   build/bench/bench_tok [VOCAB.gguf] [TEXT]   (defaults: tests/data/tokenizer/deepseek-v3-vocab.gguf) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf/gguf.h"
#include "common/tok/tok.h"

static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The test strings of tests/data, newline-separated, repeated to at least 1 MiB. */
static char *default_text(size_t *len)
{
	json_error_t je;
	json_t *j = json_load_file("tests/data/tokenizer/test_strings.json", JSON_ALLOW_NUL, &je);
	if (!j)
		return NULL;
	size_t one = 0, i;
	json_t *x;
	json_array_foreach(j, i, x) one += strlen(json_string_value(json_object_get(x, "utf8_hex"))) / 2 + 1;
	size_t reps = ((1u << 20) + one - 1) / one, n = 0;
	char *s = malloc(one * reps);
	for (size_t r = 0; s && r < reps; r++) {
		json_array_foreach(j, i, x)
		{
			const char *h = json_string_value(json_object_get(x, "utf8_hex"));
			for (size_t k = 0; h[2 * k]; k++) {
				unsigned v;
				sscanf(h + 2 * k, "%2x", &v);
				s[n++] = (char)v;
			}
			s[n++] = '\n';
		}
	}
	json_decref(j);
	*len = n;
	return s;
}

int main(int argc, char **argv)
{
	const char *vocab = argc > 1 ? argv[1] : "tests/data/tokenizer/deepseek-v3-vocab.gguf";
	struct errbuf e = {0};
	struct gguf_ctx *g;
	struct tok *t = NULL;
	if (gguf_open(&g, vocab, &e)) {
		fprintf(stderr, "bench_tok: %s\n", e.msg);
		return 2;
	}
	double best = 1e9;
	for (int r = 0; r < 5; r++) {
		tok_destroy(t);
		double t0 = cpu_s();
		if (tok_load(&t, g, &e)) {
			fprintf(stderr, "bench_tok: %s\n", e.msg);
			return 2;
		}
		double d = cpu_s() - t0;
		best = d < best ? d : best;
	}
	printf("vocab %s: %d tokens, load %.1f ms\n", vocab, tok_n_vocab(t), best * 1e3);

	size_t len = 0;
	char *text = NULL;
	if (argc > 2) {
		FILE *f = fopen(argv[2], "rb");
		if (!f || fseek(f, 0, SEEK_END) || (len = (size_t)ftell(f), fseek(f, 0, SEEK_SET)) ||
		    !(text = malloc(len + 1)) || fread(text, 1, len, f) != len) {
			fprintf(stderr, "bench_tok: cannot read %s\n", argv[2]);
			return 2;
		}
		fclose(f);
	} else if (!(text = default_text(&len))) {
		fprintf(stderr, "bench_tok: cannot read tests/data/tokenizer/test_strings.json\n");
		return 2;
	}
	size_t cap = tok_encode_max(3 * len), n = 0;
	int32_t *ids = malloc(sizeof(int32_t) * cap);
	best = 1e9;
	for (int r = 0; r < 5; r++) {
		double t0 = cpu_s();
		if (tok_encode(t, text, len, TOK_ENCODE_REPLACE_INVALID, ids, cap, &n, NULL, &e)) {
			fprintf(stderr, "bench_tok: %s\n", e.msg);
			return 1;
		}
		double d = cpu_s() - t0;
		best = d < best ? d : best;
	}
	printf("encode: %zu bytes -> %zu ids in %.1f ms: %.1f MB/s, %.0f ns/token\n", len, n, best * 1e3,
	       len / best / 1e6, best / (double)n * 1e9);

	const char *shortp = "Hello world, this is a short prompt.";
	size_t n_short = 0;
	int32_t short_ids[64];
	best = 1e9;
	for (int r = 0; r < 5; r++) {
		double t0 = cpu_s();
		for (int i = 0; i < 20000; i++)
			if (tok_encode(t, shortp, strlen(shortp), 0, short_ids, 64, &n_short, NULL, &e))
				return 1;
		double d = (cpu_s() - t0) / 20000;
		best = d < best ? d : best;
	}
	printf("short prompt (%zu bytes, %zu ids): %.2f us per encode\n", strlen(shortp), n_short,
	       best * 1e6);

	size_t scap = tok_stream_max_out(t), k, out = 0;
	char *piece = malloc(scap);
	struct tok_stream st;
	tok_stream_init(&st, t, 0);
	double t0 = cpu_s();
	for (size_t i = 0; i < n; i++) {
		if (tok_stream_feed(&st, ids[i], piece, scap, &k, &e))
			return 1;
		out += k;
	}
	double d = cpu_s() - t0;
	printf("stream decode: %zu ids -> %zu bytes, %.0f ns/token\n", n, out, d / (double)n * 1e9);
	free(piece);
	free(ids);
	free(text);
	tok_destroy(t);
	gguf_close(g);
	return 0;
}
