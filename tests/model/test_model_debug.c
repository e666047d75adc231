/* Layer-by-layer comparison with the BF16 files' debug arrays (tests/data/README.md §4) on the
 * 64-token prompt rand64: token embeddings, the residual stream after every layer and the final
 * norm output (p64_hidden), MoE expert choices and weights, and (glm-dsa) the indexer scores and
 * top-k sets of every layer. Reports the FIRST layer whose output differs, by name. For glm-dsa,
 * rows from the first exact indexer tie on (npref first_tie_position) are excluded except for
 * layer 0's scores, which do not depend on ties: there transformers' top-k is arbitrary (§5). */
#include "tests/model/refs.h"

#define P 64

struct cap {
	int64_t D;
	int n_layers;
	float *hidden; /* (n_layers + 2) x P x D */
	int32_t *moe_ids; /* n_layers x P x k */
	float *moe_w;
	int k;
	float *scores; /* n_layers x P x P (-inf above diagonal) */
	int32_t *sel; /* n_layers x P x K (-1 padded) */
	int K;
};

static void hidden_cb(void *u, int layer, int n, int64_t D, const float *h)
{
	struct cap *c = u;
	memcpy(c->hidden + (size_t)(layer + 1) * P * (size_t)D, h, sizeof(float) * (size_t)(n * D));
}

static void moe_cb(void *u, int layer, int n, int k, const int32_t *ids, const float *w)
{
	struct cap *c = u;
	memcpy(c->moe_ids + (size_t)layer * P * (size_t)k, ids, sizeof(int32_t) * (size_t)(n * k));
	memcpy(c->moe_w + (size_t)layer * P * (size_t)k, w, sizeof(float) * (size_t)(n * k));
}

static void idx_cb(void *u, int layer, int tok, int32_t pos, int n_keys, const float *sc, int n_sel,
                   const int32_t *sel)
{
	struct cap *c = u;
	(void)pos;
	float *row = c->scores + ((size_t)layer * P + (size_t)tok) * P;
	for (int t = 0; t < P; t++)
		row[t] = t < n_keys ? sc[t] : -INFINITY;
	int32_t *sr = c->sel + ((size_t)layer * P + (size_t)tok) * (size_t)c->K;
	for (int i = 0; i < c->K; i++)
		sr[i] = i < n_sel ? sel[i] : -1;
}

static int first_bad = -1;
static char first_what[200];
static void note(int layer, bool ok, const char *what, const char *stem, double d)
{
	if (!ok && first_bad < 0) {
		first_bad = layer;
		snprintf(first_what, sizeof(first_what), "%s: layer %d: %s (%g)", stem, layer, what, d);
	}
}

static void test_model(const char *stem)
{
	struct model *m = load_model(stem, 1, 2);
	CHECK(m, "%s: load failed", stem);
	if (!m)
		return;
	const struct model_hparams *hp = model_hparams(m);
	json_t *man = ref_manifest(stem);
	int n;
	const char *name;
	int32_t *ids = NULL;
	for (size_t i = 0; (ids = ref_prompt(man, i, &n, &name)); i++) {
		if (strcmp(name, "rand64") == 0)
			break;
		free(ids);
	}
	int rows = P;
	json_t *ft = json_object_get(
	    json_object_get(json_object_get(json_object_get(man, "npref"), "prompts"), "rand64"),
	    "first_tie_position");
	if (ft && json_is_integer(ft))
		rows = (int)json_integer_value(ft);
	struct cap c = {.D = hp->D, .n_layers = hp->n_layers, .k = hp->n_expert_used, .K = (int)hp->idx_topk};
	c.hidden = calloc((size_t)(hp->n_layers + 2) * P * (size_t)hp->D, sizeof(float));
	c.moe_ids = calloc((size_t)hp->n_layers * P * (size_t)(c.k + 1), sizeof(int32_t));
	c.moe_w = calloc((size_t)hp->n_layers * P * (size_t)(c.k + 1), sizeof(float));
	c.scores = calloc((size_t)hp->n_layers * P * P, sizeof(float));
	c.sel = calloc((size_t)hp->n_layers * P * (size_t)(c.K + 1), sizeof(int32_t));
	struct model_debug dbg = {.user = &c, .hidden_cb = hidden_cb, .moe_cb = moe_cb, .indexer_cb = idx_cb};
	struct model_kv kv;
	struct errbuf e = {0};
	CHECK(model_kv_init(&kv, m, 1, NULL, 0, &e) == 0, "kv: %s", e.msg);
	int32_t seq[P] = {0}, pos[P], blk = 0;
	for (int i = 0; i < P; i++)
		pos[i] = i;
	struct model_seq s = {.blocks = &blk, .n_blocks = 1};
	struct model_batch b = {
	    .n_tokens = P, .tokens = ids, .seq = seq, .pos = pos, .n_seqs = 1, .seqs = &s};
	float *lg = malloc(sizeof(float) * (size_t)hp->vocab);
	CHECK(model_forward(m, &kv, &b, lg, &dbg, &e) == 0, "forward: %s", e.msg);
	size_t nb;
	float *rh = ref_array(stem, "p64_hidden.f32.bin", &nb);
	int32_t *rids = ref_array(stem, "p64_moe_experts.i32.bin", &nb);
	float *rw = ref_array(stem, "p64_moe_weights.f32.bin", &nb);
	first_bad = -1;
	printf("%-20s comparing rows 0..%d of rand64\n", stem, rows - 1);
	size_t HD = (size_t)P * (size_t)hp->D;
	double d = max_abs_diff(c.hidden, rh, (size_t)rows * (size_t)hp->D);
	printf("%-20s embeddings: max|d| = %.3g\n", stem, d);
	note(-1, d <= 1e-6, "differ", stem, d);
	int moe_i = 0, full_i = 0;
	int32_t *rsel = NULL;
	float *rsc = NULL;
	if (hp->has_indexer) {
		rsel = ref_array(stem, "p64_indexer_topk.i32.bin", &nb);
		rsc = ref_array(stem, "p64_indexer_scores.f32.bin", &nb);
	}
	for (int l = 0; l < hp->n_layers; l++) {
		if (hp->has_indexer) {
			int src = hp->idx_src[l];
			int sets_ok = 0;
			for (int r = 0; r < rows; r++)
				sets_ok += memcmp(c.sel + ((size_t)src * P + (size_t)r) * (size_t)c.K,
				                  rsel + ((size_t)l * P + (size_t)r) * (size_t)c.K,
				                  sizeof(int32_t) * (size_t)c.K) == 0;
			printf("%-20s layer %d indexer (%s, from layer %d): top-k sets equal in %d/%d rows\n",
			       stem, l, hp->idx_full[l] ? "full" : "shared", src, sets_ok, rows);
			note(l, sets_ok == rows, "indexer top-k sets differ", stem, sets_ok);
			if (hp->idx_full[l]) {
				double sd = 0;
				int srows = full_i == 0 ? P : rows;
				for (int r = 0; r < srows; r++)
					for (int t = 0; t <= r; t++) {
						double x = fabs(
						    (double)c
						        .scores[((size_t)l * P + (size_t)r) * P + (size_t)t] -
						    (double)rsc[((size_t)full_i * P + (size_t)r) * P +
						                (size_t)t]);
						sd = x > sd ? x : sd;
					}
				printf("%-20s layer %d indexer scores (%d rows): max|d| = %.3g\n", stem, l,
				       srows, sd);
				note(l, sd <= 1e-4, "indexer scores differ", stem, sd);
				full_i++;
			}
		}
		if (l >= hp->n_dense_lead) {
			int k = c.k, ids_ok = 0;
			double wd = 0;
			for (int r = 0; r < rows; r++) {
				const int32_t *mine = c.moe_ids + ((size_t)l * P + (size_t)r) * (size_t)k;
				const int32_t *theirs = rids + ((size_t)moe_i * P + (size_t)r) * (size_t)k;
				int match = 0;
				for (int a = 0; a < k; a++)
					for (int bb = 0; bb < k; bb++)
						if (mine[a] == theirs[bb]) {
							match++;
							double x =
							    fabs((double)c.moe_w[((size_t)l * P + (size_t)r) *
							                             (size_t)k +
							                         (size_t)a] -
							         (double)rw[((size_t)moe_i * P + (size_t)r) *
							                        (size_t)k +
							                    (size_t)bb]);
							wd = x > wd ? x : wd;
						}
				ids_ok += match == k;
			}
			printf("%-20s layer %d MoE: expert sets equal in %d/%d rows, weights max|d| = %.3g\n",
			       stem, l, ids_ok, rows, wd);
			note(l, ids_ok == rows, "MoE expert choice differs", stem, ids_ok);
			note(l, wd <= 1e-5, "MoE weights differ", stem, wd);
			moe_i++;
		}
		d = max_abs_diff(c.hidden + (size_t)(l + 1) * HD, rh + (size_t)(l + 1) * HD,
		                 (size_t)rows * (size_t)hp->D);
		printf("%-20s layer %d output (residual stream): max|d| = %.3g\n", stem, l, d);
		note(l, d <= 1e-4, "output differs", stem, d);
	}
	d = max_abs_diff(c.hidden + (size_t)(hp->n_layers + 1) * HD, rh + (size_t)(hp->n_layers + 1) * HD,
	                 (size_t)rows * (size_t)hp->D);
	printf("%-20s final norm: max|d| = %.3g\n", stem, d);
	note(hp->n_layers, d <= 1e-4, "differs", stem, d);
	CHECK(first_bad < 0, "first difference: %s", first_what);
	free(rsel);
	free(rsc);
	free(rh);
	free(rids);
	free(rw);
	free(lg);
	free(ids);
	free(c.hidden);
	free(c.moe_ids);
	free(c.moe_w);
	free(c.scores);
	free(c.sel);
	json_decref(man);
	model_kv_fini(&kv);
	model_destroy(m);
}

int main(void)
{
	test_model("glm-dsa-tiny-BF16");
	test_model("deepseek2-tiny-BF16");
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
