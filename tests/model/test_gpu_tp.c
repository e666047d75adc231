/* CUDA tensor parallelism over GPUs (NCCL, one thread per GPU) against CUDA TP=1 on one GPU, on
 * every tests/data model whose dims allow the split, for T = 2 and (when that many GPUs are
 * visible) 4 and 8. SKIPs (exit 77) without CUDA or with fewer than 2 GPUs.
 *
 * Tolerance, from the arithmetic: both sides take the fp32 GEMV path (at most 8 tokens per forward:
 * fp32 dequantize, fp32 accumulate) and fp32 attention / norms. Column-parallel products (q_b, k_b,
 * v_b, gate/up, lm_head) compute each output row with the same dot on both sides. Row-parallel ones
 * (o_proj, down, the experts' down, the shared expert) are the only change: TP=1 sums K inputs in
 * one dot, TP=T sums T dots of K/T inputs and NCCL adds the T partial vectors in fp32: a different
 * summation order, ~1e-7 relative per output (as CUDA against the CPU in test_gpu_model), growing
 * through the 2-3 layers to ~1e-5 on logits of magnitude ~10. TOL = 2e-4 leaves an order of
 * magnitude; it is test_gpu_model's TOL_F32 for the same reason. A router near-tie could still pick
 * another expert; then the logits would differ by far more and the test says so.
 *
 * Checks, per model and T: rand64 logits at every position (chunks of 8); greedy continuations of
 * 3 prompts, 16 steps, identical (up to a step whose top-1/top-2 margin is below TOL, as in
 * test_gpu_model), with decode graphs off and on (graphs on: every decode step is replayed from a
 * graph that holds the NCCL all-reduces); a batch of 3 sequences decoded 8 steps from graphs
 * (bucket 4, padded rows) within TOL of TP=1's graphs; model_kv_replicate (KV set from outside in
 * rank 0's copy reaches the other GPUs). */
#include "tests/model/refs.h"

#ifndef TANDEM_CUDA
int main(void)
{
	(void)n_fail;
	printf("SKIP: test_gpu_tp: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/kernels.h"

#define TOL 2e-4

/* NULL with *refused set when the model's dims do not allow TP=tp (not a failure) */
static struct model *load_cuda(const char *stem, int tp, int graphs, bool *refused)
{
	char p[512];
	snprintf(p, sizeof(p), DATA "/models/%s.gguf", stem);
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	o.backend = MODEL_BACKEND_CUDA;
	o.tp = tp;
	o.max_tokens = 64;
	o.max_seqs = 8;
	o.max_ctx = 512;
	o.graphs = graphs;
	struct errbuf e = {0};
	struct model *m;
	*refused = false;
	if (model_load(&m, p, &o, &e)) {
		if (e.code == ERR_UNSUPPORTED &&
		    (strstr(e.msg, "does not divide") || strstr(e.msg, "block size"))) {
			*refused = true;
			printf("%-22s TP=%d refused by the model's dims (expected): %s\n", stem, tp, e.msg);
		} else {
			printf("load %s (cuda, tp %d, graphs %d): %s\n", p, tp, graphs, e.msg);
		}
		return NULL;
	}
	return m;
}

static void test_logits(const char *stem, int T, struct model *m1, struct model *mt, json_t *man)
{
	int64_t V = model_hparams(m1)->vocab;
	int32_t *ids;
	int n;
	if (find_prompt(man, "rand64", &ids, &n)) {
		CHECK(0, "%s: no rand64 prompt", stem);
		return;
	}
	float *ref = malloc(sizeof(float) * (size_t)V * (size_t)n),
	      *got = malloc(sizeof(float) * (size_t)V * (size_t)n);
	struct model_kv k1, kt;
	struct errbuf e = {0};
	if (model_kv_init(&k1, m1, 4, NULL, 0, &e) || model_kv_init(&kt, mt, 4, NULL, 0, &e)) {
		CHECK(0, "%s: kv: %s", stem, e.msg);
		free(ref), free(got), free(ids);
		return;
	}
	struct tseq s1, st;
	tseq_init(&s1, 0, 2, 1);
	tseq_init(&st, 3, 2, -1); /* other, descending blocks on the TP side */
	int rc = run_seq(m1, &k1, &s1, ids, n, 8, true, ref);
	CHECK(rc == 0, "%s: TP=1 forward", stem);
	int rt = run_seq(mt, &kt, &st, ids, n, 8, true, got);
	CHECK(rt == 0, "%s: TP=%d forward", stem, T);
	if (!rc && !rt) {
		double d = max_abs_diff(ref, got, (size_t)V * (size_t)n);
		int n_over = 0;
		for (int p = 0; p < n; p++)
			n_over += max_abs_diff(ref + (size_t)p * V, got + (size_t)p * V, (size_t)V) > TOL;
		printf("%-22s TP=%d vs TP=1 (cuda, chunks of 8, fp32 GEMV): rand64 all %d positions max|d| = "
		       "%.3g, %d over %.1g\n",
		       stem, T, n, d, n_over, TOL);
		CHECK(d <= TOL, "%s: TP=%d logits differ from TP=1 by %g", stem, T, d);
	}
	model_kv_fini(&k1);
	model_kv_fini(&kt);
	free(ref);
	free(got);
	free(ids);
}

static void test_greedy(const char *stem, int T, struct model *m1, struct model *mt, int graphs, json_t *man)
{
	int64_t V = model_hparams(m1)->vocab;
	float *l1 = malloc(sizeof(float) * (size_t)V), *lt = malloc(sizeof(float) * (size_t)V);
	const char *name;
	int32_t *ids;
	int n;
	for (size_t pi = 0; pi < 3 && (ids = ref_prompt(man, pi, &n, &name)); pi++) {
		struct model_kv k1, kt;
		struct errbuf e = {0};
		if (model_kv_init(&k1, m1, 4, NULL, 0, &e) || model_kv_init(&kt, mt, 4, NULL, 0, &e)) {
			CHECK(0, "%s: kv: %s", stem, e.msg);
			free(ids);
			break;
		}
		struct tseq s1, st;
		tseq_init(&s1, 0, 4, 1);
		tseq_init(&st, 3, 4, -1);
		int rc = run_seq(m1, &k1, &s1, ids, n, 8, false, l1) ||
		         run_seq(mt, &kt, &st, ids, n, 8, false, lt);
		CHECK(rc == 0, "%s %s: prefill", stem, name);
		int same = 0, steps = 16;
		double worst = 0;
		for (int t = 0; t < steps && !rc; t++) {
			int a = argmax(l1, V), b = argmax(lt, V);
			double mg = margin12(l1, V), d = max_abs_diff(l1, lt, (size_t)V);
			worst = d > worst ? d : worst;
			if (a != b) {
				CHECK(mg < TOL,
				      "%s %s TP=%d graphs %d step %d: picks %d, TP=1 %d (margin %g)", stem,
				      name, T, graphs, t, b, a, mg);
				break;
			}
			same++;
			if (mg < TOL) /* beyond a near tie the continuations may rightly part */
				break;
			int32_t tok = a;
			rc = run_seq(m1, &k1, &s1, &tok, 1, 1, false, l1) ||
			     run_seq(mt, &kt, &st, &tok, 1, 1, false, lt);
			CHECK(rc == 0, "%s %s: decode step %d", stem, name, t);
		}
		printf("%-22s %-14s TP=%d graphs %s greedy: %d of %d steps identical to TP=1, max|d| %.3g\n",
		       stem, name, T, graphs ? "on " : "off", same, steps, worst);
		CHECK(worst <= TOL, "%s %s TP=%d graphs %d: logits differ from TP=1 by %g", stem, name, T,
		      graphs, worst);
		model_kv_fini(&k1);
		model_kv_fini(&kt);
		free(ids);
	}
	free(l1);
	free(lt);
}

/* 3 sequences prefilled, then 8 decode steps of all three at once (graph bucket 4) */
static void test_batch(const char *stem, int T, struct model *m1, struct model *mt, json_t *man)
{
	int64_t V = model_hparams(m1)->vocab;
	struct model *ms[2] = {m1, mt};
	struct model_kv kv[2];
	struct tseq sq[2][3];
	struct errbuf e = {0};
	float *lg[2] = {malloc(sizeof(float) * (size_t)V * 3), malloc(sizeof(float) * (size_t)V * 3)};
	int32_t next[3];
	int rc = 0;
	for (int k = 0; k < 2; k++)
		if (model_kv_init(&kv[k], ms[k], 16, NULL, 0, &e))
			rc = -1;
	for (int j = 0; j < 3 && !rc; j++) {
		const char *name;
		int n = 0;
		int32_t *ids = ref_prompt(man, (size_t)j, &n, &name);
		if (!ids) {
			rc = -1;
			break;
		}
		for (int k = 0; k < 2 && !rc; k++) {
			tseq_init(&sq[k][j], j * 4, 4, 1);
			rc = run_seq(ms[k], &kv[k], &sq[k][j], ids, n, 8, false, lg[k] + j * V);
		}
		next[j] = (int32_t)argmax(lg[0] + j * V, V);
		free(ids);
	}
	CHECK(rc == 0, "%s: batch test prefill", stem);
	double worst = 0;
	int steps = 0;
	for (int t = 0; t < 8 && !rc; t++) {
		for (int k = 0; k < 2 && !rc; k++) {
			struct model_seq s3[3];
			int32_t seqi[3] = {0, 1, 2}, pos[3];
			for (int j = 0; j < 3; j++) {
				s3[j] = (struct model_seq){.blocks = sq[k][j].blocks,
				                           .n_blocks = sq[k][j].n_blocks};
				pos[j] = sq[k][j].len;
			}
			uint8_t want[3] = {1, 1, 1};
			struct model_batch b = {.n_tokens = 3,
			                        .tokens = next,
			                        .seq = seqi,
			                        .pos = pos,
			                        .logits = want,
			                        .n_seqs = 3,
			                        .seqs = s3};
			rc = model_forward(ms[k], &kv[k], &b, lg[k], NULL, &e);
			CHECK(rc == 0, "%s: batch decode step %d (TP=%d): %s", stem, t, k ? T : 1, e.msg);
			for (int j = 0; j < 3; j++)
				sq[k][j].len++;
		}
		if (rc)
			break;
		double d = max_abs_diff(lg[0], lg[1], (size_t)V * 3);
		worst = d > worst ? d : worst;
		steps++;
		for (int j = 0; j < 3; j++)
			next[j] = (int32_t)argmax(lg[0] + j * V, V);
	}
	printf("%-22s TP=%d decode batch 3 (graph bucket 4), %d steps from graphs: vs TP=1 graphs max|d| = "
	       "%.3g\n",
	       stem, T, steps, worst);
	CHECK(steps == 8 && worst <= TOL, "%s: TP=%d batch graph decode differs from TP=1 by %g", stem, T,
	      worst);
	for (int k = 0; k < 2; k++) {
		if (kv[k].base)
			model_kv_fini(&kv[k]);
		free(lg[k]);
	}
}

/* KV received from outside lands in rank 0's copy only (the decode worker writes kv->base);
 * model_kv_replicate must bring the other GPUs' copies level: a pool filled that way decodes exactly
 * as the pool the forward filled itself, and the same pool without the call does not. */
static void test_replicate(const char *stem, int T, struct model *mt, json_t *man)
{
	int64_t V = model_hparams(mt)->vocab;
	const char *name;
	int n = 0;
	int32_t *ids = ref_prompt(man, 0, &n, &name);
	struct kcuda_ctx *kc = NULL;
	struct model_kv kv[3];
	struct errbuf e = {0};
	float *lg[3];
	int rc = ids && kcuda_ctx_create(0, (size_t)1 << 20, &kc) == 0 ? 0 : -1;
	for (int k = 0; k < 3; k++) {
		lg[k] = malloc(sizeof(float) * (size_t)V);
		if (model_kv_init(&kv[k], mt, 4, NULL, 0, &e))
			rc = -1;
	}
	size_t bytes = (size_t)4 * kv[0].layout.block_bytes;
	char *host = malloc(bytes);
	struct tseq sq[3];
	for (int k = 0; k < 3; k++)
		tseq_init(&sq[k], 0, 4, 1);
	/* pool 0: prefilled by the forward; pools 1 and 2: rank 0's copy set from its bytes */
	rc = rc ? rc : run_seq(mt, &kv[0], &sq[0], ids, n, 8, false, lg[0]);
	rc = rc ? rc : kcuda_download(kc, host, kv[0].base, bytes);
	rc = rc ? rc : kcuda_upload(kc, kv[1].base, host, bytes);
	rc = rc ? rc : kcuda_upload(kc, kv[2].base, host, bytes);
	int32_t blocks[4] = {0, 1, 2, 3};
	rc = rc ? rc : model_kv_replicate(mt, &kv[1], blocks, 4, &e);
	CHECK(rc == 0, "%s TP=%d: replicate setup: %s", stem, T, e.msg);
	int32_t tok = rc ? 0 : (int32_t)argmax(lg[0], V);
	for (int k = 0; k < 3 && !rc; k++) {
		sq[k].len = n;
		rc = run_seq(mt, &kv[k], &sq[k], &tok, 1, 1, false, lg[k]);
	}
	CHECK(rc == 0, "%s TP=%d: replicate decode", stem, T);
	if (!rc) {
		double d1 = max_abs_diff(lg[0], lg[1], (size_t)V), d2 = max_abs_diff(lg[0], lg[2], (size_t)V);
		printf("%-22s TP=%d KV set in rank 0's copy: with model_kv_replicate max|d| = %.3g, without "
		       "%.3g\n",
		       stem, T, d1, d2);
		CHECK(d1 <= TOL, "%s TP=%d: replicated pool decodes differently (%g)", stem, T, d1);
		CHECK(d2 > 10 * TOL, "%s TP=%d: the other GPUs' copies seem unused (%g without replicate)",
		      stem, T, d2);
	}
	for (int k = 0; k < 3; k++) {
		if (kv[k].base)
			model_kv_fini(&kv[k]);
		free(lg[k]);
	}
	free(host);
	free(ids);
	if (kc)
		kcuda_ctx_destroy(kc);
}

int main(void)
{
	int n_gpu = kcuda_device_count();
	if (n_gpu < 2) {
		printf("SKIP: test_gpu_tp needs at least 2 GPUs, %d visible *** not run ***\n", n_gpu);
		return 77;
	}
	struct errbuf e = {0};
	if (tp_nccl_available(&e)) {
		printf("SKIP: test_gpu_tp: %s *** not run ***\n", e.msg);
		return 77;
	}
	printf("%d GPUs visible; NCCL version code %d\n", n_gpu, tp_nccl_version());
	int n_run = 0;
	for (int T = 2; T <= 8 && T <= n_gpu; T *= 2) {
		for (int i = 0; ref_models[i]; i++) {
			const char *stem = ref_models[i];
			bool refused = false, r2;
			struct model *mt = load_cuda(stem, T, 0, &refused);
			if (refused)
				continue;
			struct model *m1 = load_cuda(stem, 1, 0, &r2);
			CHECK(mt && m1, "%s: load (TP=%d and TP=1)", stem, T);
			json_t *man = ref_manifest(stem);
			if (mt && m1 && man) {
				n_run++;
				test_logits(stem, T, m1, mt, man);
				test_greedy(stem, T, m1, mt, 0, man);
				test_replicate(stem, T, mt, man);
				model_set_graphs(m1, 1);
				model_set_graphs(mt, 1);
				test_greedy(stem, T, m1, mt, 1, man);
				test_batch(stem, T, m1, mt, man);
			}
			json_decref(man);
			model_destroy(mt);
			model_destroy(m1);
		}
	}
	CHECK(n_run > 0, "no model could be split for TP=2");
	printf("%d model x TP combinations run\n%s\n", n_run, n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
#endif
