/* Test helper: one forward of a whole prompt with the model_debug hooks recording, per token, the
 * MoE expert set of every MoE layer and the indexer's selected keys of every indexer layer, plus the
 * hidden state after every layer; and a comparison of two such records (CPU vs CUDA). A logits
 * difference far beyond rounding at token t is explained when some layer chose differently for a
 * token <= t (its output reaches t through the KV cache); sel_first_flip finds the first such token. */
#ifndef TANDEM_TESTS_MODEL_SEL_DIFF_H
#define TANDEM_TESTS_MODEL_SEL_DIFF_H

#include "tests/model/refs.h"

#define SEL_MAXK 64 /* indexer keys recorded per token: tokens with more keys are compared on these */

struct sel_rec {
	int n_layers, n_tok, k;
	int64_t D;
	int32_t *moe; /* [layer][tok][k], sorted; -1 where the layer has no MoE */
	int32_t *moe_raw; /* [layer][tok][k] in the router's order, with ... */
	float *moe_w; /* ... their weights (printed at a differing choice) */
	int32_t *isel; /* [layer][tok][SEL_MAXK], -1 padded; -2 where the layer has no indexer */
	float *hid; /* [layer + 1][tok][D]: after each layer (index layer + 1), embeddings at 0 */
};

static inline int sel_cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

static inline void sel_moe_cb(void *user, int layer, int n_tokens, int k, const int32_t *experts,
                              const float *w)
{
	struct sel_rec *r = user;
	if (layer < 0 || layer >= r->n_layers || n_tokens != r->n_tok || k != r->k)
		return;
	int32_t *d = r->moe + (size_t)layer * r->n_tok * r->k;
	memcpy(d, experts, sizeof(int32_t) * (size_t)n_tokens * (size_t)k);
	memcpy(r->moe_raw + (size_t)layer * r->n_tok * r->k, experts,
	       sizeof(int32_t) * (size_t)n_tokens * (size_t)k);
	if (w)
		memcpy(r->moe_w + (size_t)layer * r->n_tok * r->k, w,
		       sizeof(float) * (size_t)n_tokens * (size_t)k);
	for (int t = 0; t < n_tokens; t++)
		qsort(d + (size_t)t * k, (size_t)k, sizeof(int32_t), sel_cmp_i32);
}

static inline void sel_idx_cb(void *user, int layer, int token, int32_t pos, int n_keys, const float *scores,
                              int n_sel, const int32_t *sel)
{
	struct sel_rec *r = user;
	(void)pos;
	(void)n_keys;
	(void)scores;
	if (layer < 0 || layer >= r->n_layers || token < 0 || token >= r->n_tok)
		return;
	int32_t *d = r->isel + ((size_t)layer * r->n_tok + (size_t)token) * SEL_MAXK;
	for (int i = 0; i < SEL_MAXK; i++)
		d[i] = i < n_sel ? sel[i] : -1;
}

static inline void sel_hid_cb(void *user, int layer, int n_tokens, int64_t D, const float *h)
{
	struct sel_rec *r = user;
	if (layer < -1 || layer >= r->n_layers || n_tokens != r->n_tok || D != r->D || !h)
		return;
	memcpy(r->hid + (size_t)(layer + 1) * r->n_tok * D, h, sizeof(float) * (size_t)n_tokens * (size_t)D);
}

static inline void sel_rec_free(struct sel_rec *r)
{
	free(r->moe);
	free(r->moe_raw);
	free(r->moe_w);
	free(r->isel);
	free(r->hid);
	memset(r, 0, sizeof(*r));
}

/* One forward of tokens[0..n) (positions 0..n-1 of a fresh sequence s) with logits of every token into
 * out and the record into r. Returns the forward's status. */
static inline int sel_run(struct model *m, struct model_kv *kv, struct tseq *s, const int32_t *tokens, int n,
                          float *out, struct sel_rec *r)
{
	const struct model_hparams *hp = model_hparams(m);
	memset(r, 0, sizeof(*r));
	r->n_layers = hp->n_layers;
	r->n_tok = n;
	r->k = hp->n_expert_used > 0 ? hp->n_expert_used : 1;
	r->D = hp->D;
	r->moe = malloc(sizeof(int32_t) * (size_t)r->n_layers * n * r->k);
	r->moe_raw = calloc((size_t)r->n_layers * n * r->k, sizeof(int32_t));
	r->moe_w = calloc((size_t)r->n_layers * n * r->k, sizeof(float));
	r->isel = malloc(sizeof(int32_t) * (size_t)r->n_layers * n * SEL_MAXK);
	r->hid = calloc((size_t)(r->n_layers + 1) * n * (size_t)r->D, sizeof(float));
	int32_t *seq = calloc((size_t)n, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * (size_t)n);
	uint8_t *want = malloc((size_t)n);
	int rc = -1;
	if (!r->moe || !r->moe_raw || !r->moe_w || !r->isel || !r->hid || !seq || !pos || !want)
		goto out;
	for (size_t i = 0; i < (size_t)r->n_layers * n * r->k; i++)
		r->moe[i] = -1;
	for (size_t i = 0; i < (size_t)r->n_layers * n * SEL_MAXK; i++)
		r->isel[i] = -2;
	for (int i = 0; i < n; i++)
		pos[i] = i, want[i] = 1;
	struct model_seq ms = {.blocks = s->blocks, .n_blocks = s->n_blocks};
	struct model_batch b = {.n_tokens = n,
	                        .tokens = tokens,
	                        .seq = seq,
	                        .pos = pos,
	                        .logits = want,
	                        .n_seqs = 1,
	                        .seqs = &ms};
	struct model_debug dbg = {
	    .user = r, .hidden_cb = sel_hid_cb, .moe_cb = sel_moe_cb, .indexer_cb = sel_idx_cb};
	struct errbuf e = {0};
	rc = model_forward(m, kv, &b, out, &dbg, &e);
	if (rc)
		fprintf(stderr, "forward (debug hooks): %s\n", e.msg);
out:
	free(seq);
	free(pos);
	free(want);
	return rc;
}

/* Does layer l choose differently for token t in a and b? (1 MoE, 2 indexer, 0 no) */
static inline int sel_differs(const struct sel_rec *a, const struct sel_rec *b, int l, int t)
{
	size_t om = ((size_t)l * a->n_tok + (size_t)t) * a->k,
	       oi = ((size_t)l * a->n_tok + (size_t)t) * SEL_MAXK;
	if (memcmp(a->moe + om, b->moe + om, sizeof(int32_t) * (size_t)a->k))
		return 1;
	if (memcmp(a->isel + oi, b->isel + oi, sizeof(int32_t) * SEL_MAXK))
		return 2;
	return 0;
}

/* First token (and its layer / kind) at which any layer chose differently; n_tok if none. Also
 * counts the (layer, token) pairs that differ, per kind. */
static inline int sel_first_flip(const struct sel_rec *a, const struct sel_rec *b, int *layer, int *kind,
                                 int *n_moe, int *n_idx)
{
	int first = a->n_tok;
	*layer = -1, *kind = 0, *n_moe = 0, *n_idx = 0;
	for (int t = 0; t < a->n_tok; t++)
		for (int l = 0; l < a->n_layers; l++) {
			int d = sel_differs(a, b, l, t);
			*n_moe += d == 1;
			*n_idx += d == 2;
			if (d && t < first)
				first = t, *layer = l, *kind = d;
		}
	return first;
}

/* Prints both records' router choice (ids and weights, router order) of layer l at token t, and how
 * far apart the layer's input hidden states are there: a near-tie fed by rounding shows a small
 * input difference; a large one points at an earlier layer. */
static inline void sel_print_moe(const char *what, const struct sel_rec *a, const struct sel_rec *b, int l,
                                 int t)
{
	size_t o = ((size_t)l * a->n_tok + (size_t)t) * a->k;
	const struct sel_rec *rs[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		printf("%-22s   layer %d token %d router (%s):", what, l, t, i ? "cuda" : "cpu");
		for (int j = 0; j < a->k; j++)
			printf(" %d:%.5f", rs[i]->moe_raw[o + j], rs[i]->moe_w[o + j]);
		printf("\n");
	}
	const float *ha = a->hid + ((size_t)l * a->n_tok + (size_t)t) * a->D;
	const float *hb = b->hid + ((size_t)l * a->n_tok + (size_t)t) * a->D;
	double d = 0, m = 0;
	for (int64_t i = 0; i < a->D; i++) {
		double x = fabs((double)ha[i] - hb[i]);
		d = x > d ? x : d;
		m = fabs(ha[i]) > m ? fabs(ha[i]) : m;
	}
	printf("%-22s   layer %d input at token %d: max|d| %.3g (max|h| %.3g)\n", what, l, t, d, m);
}

#endif
