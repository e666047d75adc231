/* Logits against the reference outputs (tests/data/README.md §4-§6): for every model, the last
 * position of every prompt (one prefill) and every position of rand64 (prefill in one batch and in
 * chunks of 7), within 1e-4 absolute. glm-dsa is compared with the deterministic-tie arrays
 * (det_*), deepseek2 with the transformers arrays. Prints max |delta| per model/prompt. */
#include "tests/model/refs.h"

/* npref.prompts.<name>.first_tie_position, -1 when the prompt has no indexer tie */
static int first_tie(json_t *man, const char *name)
{
	json_t *p = json_object_get(json_object_get(json_object_get(man, "npref"), "prompts"), name);
	json_t *ft = json_object_get(p, "first_tie_position");
	return ft && json_is_integer(ft) ? (int)json_integer_value(ft) : -1;
}

static void test_model(const char *stem)
{
	struct model *m = load_model(stem, 1, 2);
	CHECK(m, "%s: load failed", stem);
	if (!m)
		return;
	int64_t V = model_hparams(m)->vocab;
	json_t *man = ref_manifest(stem);
	size_t nb;
	float *last = ref_array(stem, is_glm(stem) ? "det_last_logits.f32.bin" : "last_logits.f32.bin", &nb);
	float *p64 = ref_array(stem, is_glm(stem) ? "det_p64_logits.f32.bin" : "p64_logits.f32.bin", &nb);
	/* glm-dsa: also transformers' own arrays where they do not depend on indexer ties */
	float *hf_last = is_glm(stem) ? ref_array(stem, "last_logits.f32.bin", &nb) : NULL;
	float *hf_p64 = is_glm(stem) ? ref_array(stem, "p64_logits.f32.bin", &nb) : NULL;
	struct model_kv kv;
	struct errbuf e = {0};
	if (model_kv_init(&kv, m, 16, NULL, 0, &e)) {
		CHECK(0, "%s: kv: %s", stem, e.msg);
		return;
	}
	float *out = malloc(sizeof(float) * (size_t)V * 320);
	const char *name;
	int n;
	int32_t *ids;
	double worst = 0;
	for (size_t pi = 0; (ids = ref_prompt(man, pi, &n, &name)); pi++) {
		struct tseq s;
		tseq_init(&s, 0, (n + 63) / 64, 1);
		if (run_seq(m, &kv, &s, ids, n, n, false, out)) {
			CHECK(0, "%s %s: forward failed", stem, name);
			free(ids);
			continue;
		}
		double d = max_abs_diff(out, last + pi * (size_t)V, (size_t)V);
		printf("%-22s %-14s len %3d  last-position max|d| = %.3g\n", stem, name, n, d);
		CHECK(d <= 1e-4, "%s %s: last logits differ by %g", stem, name, d);
		worst = d > worst ? d : worst;
		if (hf_last && first_tie(man, name) < 0) { /* tie-free: transformers' own numbers apply */
			double dh = max_abs_diff(out, hf_last + pi * (size_t)V, (size_t)V);
			printf("%-22s %-14s           vs transformers last_logits (no indexer tie): max|d| = "
			       "%.3g\n",
			       stem, name, dh);
			CHECK(dh <= 1e-4, "%s %s: differs from transformers by %g", stem, name, dh);
		}
		if (strcmp(name, "rand64") == 0) {
			for (int chunk = 64; chunk >= 7; chunk -= 57) {
				tseq_init(&s, 15, 1, 1); /* a different block than the run above */
				if (run_seq(m, &kv, &s, ids, n, chunk, true, out)) {
					CHECK(0, "%s rand64 chunk %d: forward failed", stem, chunk);
					continue;
				}
				double dd = 0;
				int worst_row = -1;
				for (int r = 0; r < 64; r++) {
					double x =
					    max_abs_diff(out + (size_t)r * V, p64 + (size_t)r * V, (size_t)V);
					if (x > dd) {
						dd = x;
						worst_row = r;
					}
				}
				printf("%-22s rand64 all positions, chunks of %2d: max|d| = %.3g (row %d)\n",
				       stem, chunk, dd, worst_row);
				CHECK(dd <= 1e-4, "%s rand64 chunk %d: logits differ by %g at row %d", stem,
				      chunk, dd, worst_row);
				if (hf_p64) { /* transformers' rows before the first indexer tie */
					int ft = first_tie(man, "rand64");
					double dh = 0;
					for (int r = 0; r < ft; r++)
						dh =
						    fmax(dh, max_abs_diff(out + (size_t)r * V,
						                          hf_p64 + (size_t)r * V, (size_t)V));
					printf("%-22s rand64 rows 0..%d vs transformers p64_logits: max|d| = "
					       "%.3g\n",
					       stem, ft - 1, dh);
					CHECK(dh <= 1e-4,
					      "%s: rows before the first tie differ from transformers by %g",
					      stem, dh);
				}
			}
		}
		free(ids);
	}
	printf("%-22s worst last-position max|d| = %.3g\n", stem, worst);
	free(hf_last);
	free(hf_p64);
	free(out);
	free(last);
	free(p64);
	json_decref(man);
	model_kv_fini(&kv);
	model_destroy(m);
}

int main(int argc, char **argv)
{
	for (int i = 0; ref_models[i]; i++)
		if (argc < 2 || strcmp(argv[1], ref_models[i]) == 0)
			test_model(ref_models[i]);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
