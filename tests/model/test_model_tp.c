/* Tensor parallelism on CPU threads: TP=2 and TP=4 must give the logits of TP=1 within 1e-5 (all
 * 64 positions of rand64, prefilled in chunks of 7 so the cache is used, and 8 decode steps of
 * rand17), or be refused with a message naming the reason where the model's dims do not allow the
 * split (the tiny models have 2 heads, so TP=4 is always refused; K-quant o_proj rows of 256 cannot
 * be cut in two). Also runs rank-shard mode (one rank of T alone) once. */
#include "tests/model/refs.h"

static int forward_all(struct model *m, const int32_t *ids, int n, float *out)
{
	struct model_kv kv;
	struct errbuf e = {0};
	if (model_kv_init(&kv, m, 4, NULL, 0, &e))
		return -1;
	struct tseq s;
	tseq_init(&s, 1, 2, 2); /* blocks 1, 3 */
	int rc = run_seq(m, &kv, &s, ids, n, 7, true, out);
	model_kv_fini(&kv);
	return rc;
}

static void test_model(const char *stem)
{
	json_t *man = ref_manifest(stem);
	const char *name;
	int n = 0;
	int32_t *ids = NULL;
	for (size_t i = 0; (ids = ref_prompt(man, i, &n, &name)); i++) {
		if (strcmp(name, "rand64") == 0)
			break;
		free(ids);
	}
	struct model *m1 = load_model(stem, 1, 2);
	CHECK(m1 && ids, "%s: load failed", stem);
	if (!m1 || !ids)
		return;
	int64_t V = model_hparams(m1)->vocab;
	float *ref = malloc(sizeof(float) * (size_t)(V * n)), *out = malloc(sizeof(float) * (size_t)(V * n));
	CHECK(forward_all(m1, ids, n, ref) == 0, "%s: TP=1 forward failed", stem);
	bool kquant = strstr(stem, "Q6_K") || strstr(stem, "Q4_K");
	for (int T = 2; T <= 4; T *= 2) {
		char p[256];
		snprintf(p, sizeof(p), DATA "/models/%s.gguf", stem);
		struct model_opts o;
		model_opts_default(&o);
		o.tp = T;
		o.n_threads = 2;
		o.quiet = true;
		struct errbuf e = {0};
		struct model *m;
		int rc = model_load(&m, p, &o, &e);
		bool expect_ok = T == 2 && !kquant;
		if (rc) {
			printf("%-22s TP=%d refused: %s\n", stem, T, e.msg);
			CHECK(!expect_ok, "%s TP=%d: unexpected refusal: %s", stem, T, e.msg);
			char tag[16];
			snprintf(tag, sizeof(tag), "TP=%d", T);
			CHECK(strstr(e.msg, tag) != NULL, "%s: refusal does not name %s: %s", stem, tag,
			      e.msg);
			continue;
		}
		CHECK(expect_ok, "%s TP=%d loaded but should have been refused", stem, T);
		CHECK(forward_all(m, ids, n, out) == 0, "%s TP=%d: forward failed", stem, T);
		double d = max_abs_diff(ref, out, (size_t)(V * n));
		printf("%-22s TP=%d vs TP=1, rand64 all positions (chunks of 7): max|d| = %.3g\n", stem, T,
		       d);
		CHECK(d <= 1e-5, "%s TP=%d: logits differ from TP=1 by %g", stem, T, d);
		/* greedy decode of 8 steps agrees too */
		struct model_kv kv1, kv2;
		if (model_kv_init(&kv1, m1, 2, NULL, 0, &e) || model_kv_init(&kv2, m, 2, NULL, 0, &e)) {
			CHECK(0, "kv: %s", e.msg);
		} else {
			struct tseq s1, s2;
			tseq_init(&s1, 0, 2, 1);
			tseq_init(&s2, 1, 1, 1);
			float *l1 = malloc(sizeof(float) * (size_t)V),
			      *l2 = malloc(sizeof(float) * (size_t)V);
			int32_t t1 = ids[0], t2 = ids[0];
			double dd = 0;
			for (int step = 0; step < 8; step++) {
				if (run_seq(m1, &kv1, &s1, &t1, 1, 1, false, l1) ||
				    run_seq(m, &kv2, &s2, &t2, 1, 1, false, l2)) {
					CHECK(0, "decode failed");
					break;
				}
				double x = max_abs_diff(l1, l2, (size_t)V);
				dd = x > dd ? x : dd;
				t1 = argmax(l1, V);
				t2 = argmax(l2, V);
				CHECK(t1 == t2, "%s TP=%d: decode step %d picks %d vs %d", stem, T, step, t2,
				      t1);
			}
			printf("%-22s TP=%d vs TP=1, 8 decode steps: max|d| = %.3g\n", stem, T, dd);
			CHECK(dd <= 1e-5, "%s TP=%d decode differs by %g", stem, T, dd);
			free(l1);
			free(l2);
			model_kv_fini(&kv1);
			model_kv_fini(&kv2);
		}
		model_destroy(m);
		if (T == 2 && strstr(stem, "BF16")) {
			/* rank-shard mode: rank 1 of 2 alone; its logits row holds only its vocab half */
			o.rank = 1;
			rc = model_load(&m, p, &o, &e);
			CHECK(rc == 0, "%s shard load: %s", stem, e.msg);
			if (rc == 0) {
				CHECK(forward_all(m, ids, 8, out) == 0, "%s: shard forward failed", stem);
				int zeros = 0, finite = 0;
				for (int64_t v = 0; v < V; v++) {
					zeros += v < V / 2 && out[v] == 0.0f;
					finite += v >= V / 2 && isfinite(out[v]) && out[v] != 0.0f;
				}
				printf("%-22s rank-shard 1/2: %d zero (other rank) + %d computed logits of "
				       "%lld\n",
				       stem, zeros, finite, (long long)V);
				CHECK(zeros == V / 2 && finite == V / 2, "%s: shard logits layout wrong",
				      stem);
				model_destroy(m);
			}
		}
	}
	free(ref);
	free(out);
	free(ids);
	json_decref(man);
	model_destroy(m1);
}

int main(int argc, char **argv)
{
	for (int i = 0; ref_models[i]; i++)
		if (argc < 2 || strcmp(argv[1], ref_models[i]) == 0)
			test_model(ref_models[i]);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
