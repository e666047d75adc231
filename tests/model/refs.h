/* Helpers shared by the tests in tests/model: reading the reference manifests and arrays of
 * tests/data/refs (format: tests/data/README.md §4) and running a prompt through the model with a
 * paged KV cache. Header-only (each test is one binary). */
#ifndef TANDEM_TESTS_MODEL_REFS_H
#define TANDEM_TESTS_MODEL_REFS_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model.h"

#define DATA "tests/data"

static const char *const ref_models[] = {"glm-dsa-tiny-BF16",
                                         "glm-dsa-tiny-Q8_0",
                                         "glm-dsa-tiny-Q6_K",
                                         "glm-dsa-tiny-Q4_K_M",
                                         "deepseek2-tiny-BF16",
                                         "deepseek2-tiny-Q8_0",
                                         NULL};

static int n_fail;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

static inline json_t *ref_manifest(const char *stem)
{
	char p[512];
	snprintf(p, sizeof(p), DATA "/refs/%s/manifest.json", stem);
	json_error_t je;
	json_t *j = json_load_file(p, 0, &je);
	if (!j) {
		fprintf(stderr, "cannot read %s: %s\n", p, je.text);
		exit(1);
	}
	return j;
}

/* reads refs/<stem>/<file>; n_elems out */
static inline void *ref_array(const char *stem, const char *file, size_t *n_bytes)
{
	char p[512];
	snprintf(p, sizeof(p), DATA "/refs/%s/%s", stem, file);
	FILE *f = fopen(p, "rb");
	if (!f) {
		fprintf(stderr, "cannot open %s\n", p);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	void *buf = malloc((size_t)sz + 1);
	if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
		fprintf(stderr, "cannot read %s\n", p);
		exit(1);
	}
	fclose(f);
	*n_bytes = (size_t)sz;
	return buf;
}

static inline bool is_glm(const char *stem)
{
	return strncmp(stem, "glm", 3) == 0;
}

/* ids of a prompt in the manifest (malloc'd), length in *n */
static inline int32_t *ref_prompt(json_t *man, size_t idx, int *n, const char **name)
{
	json_t *p = json_array_get(json_object_get(man, "prompts"), idx);
	if (!p)
		return NULL;
	json_t *ids = json_object_get(p, "ids");
	*n = (int)json_array_size(ids);
	*name = json_string_value(json_object_get(p, "name"));
	int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
	for (int i = 0; i < *n; i++)
		v[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
	return v;
}

static inline double max_abs_diff(const float *a, const float *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - (double)b[i]);
		if (!(d <= m)) /* NaN counts as infinite */
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}

static inline int argmax(const float *v, int64_t n)
{
	int64_t b = 0;
	for (int64_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int)b;
}

/* Top-1 minus top-2 of v[0..n): how far the greedy choice is from flipping. */
static inline double margin12(const float *v, int64_t n)
{
	int a = argmax(v, n);
	double best2 = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		if (i != a && v[i] > best2)
			best2 = v[i];
	return (double)v[a] - best2;
}

/* The manifest's prompt named want: its ids (caller frees) and count; -1 when there is none. */
static inline int find_prompt(json_t *man, const char *want, int32_t **ids, int *n)
{
	const char *name;
	for (size_t i = 0; (*ids = ref_prompt(man, i, n, &name)); i++) {
		if (strcmp(name, want) == 0)
			return 0;
		free(*ids);
	}
	return -1;
}

/* One sequence in a private KV pool: blocks 0..n_blocks-1 in order (or a scattered table). */
struct tseq {
	int32_t blocks[64];
	int n_blocks;
	int len; /* positions cached */
};

/* Runs tokens[0..n) of sequence s at positions s->len.. in chunks of `chunk` tokens; logits of
 * every token (all=true) or only of the last one into out (rows). */
static inline int run_seq(struct model *m, struct model_kv *kv, struct tseq *s, const int32_t *tokens, int n,
                          int chunk, bool all, float *out)
{
	int64_t V = model_hparams(m)->vocab;
	if (n < 1 || n > 1 << 20)
		return -1;
	struct model_seq ms = {.blocks = s->blocks, .n_blocks = s->n_blocks};
	size_t nn = (size_t)(unsigned)n;
	int32_t *seq = calloc(nn, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * nn);
	uint8_t *want = calloc(nn, 1);
	int rc = 0;
	for (int c0 = 0; c0 < n; c0 += chunk) {
		int cn = n - c0 < chunk ? n - c0 : chunk;
		int n_out = 0;
		for (int i = 0; i < cn; i++) {
			pos[i] = s->len + i;
			want[i] = all || c0 + i == n - 1;
			n_out += want[i];
		}
		struct model_batch b = {.n_tokens = cn,
		                        .tokens = tokens + c0,
		                        .seq = seq,
		                        .pos = pos,
		                        .logits = want,
		                        .n_seqs = 1,
		                        .seqs = &ms};
		struct errbuf e = {0};
		float *dst = all ? out + (size_t)c0 * (size_t)V : out;
		rc = model_forward(m, kv, &b, n_out ? dst : NULL, NULL, &e);
		if (rc) {
			fprintf(stderr, "forward: %s\n", e.msg);
			break;
		}
		s->len += cn;
	}
	free(seq);
	free(pos);
	free(want);
	return rc;
}

static inline void tseq_init(struct tseq *s, int first_block, int n_blocks, int stride)
{
	memset(s, 0, sizeof(*s));
	s->n_blocks = n_blocks;
	for (int i = 0; i < n_blocks; i++)
		s->blocks[i] = first_block + i * stride;
}

/* DATA/models/<stem>.gguf, or stem itself where it is a path (holds a '/') */
static inline void model_path(char *p, size_t size, const char *stem)
{
	if (strchr(stem, '/'))
		snprintf(p, size, "%s", stem);
	else
		snprintf(p, size, DATA "/models/%s.gguf", stem);
}

static inline struct model *load_model(const char *stem, int tp, int threads)
{
	char p[512];
	model_path(p, sizeof(p), stem);
	struct model_opts o;
	model_opts_default(&o);
	o.tp = tp;
	o.n_threads = threads;
	o.quiet = true;
	struct errbuf e = {0};
	struct model *m;
	if (model_load(&m, p, &o, &e)) {
		fprintf(stderr, "load %s (tp %d): %s\n", p, tp, e.msg);
		return NULL;
	}
	return m;
}

#endif
