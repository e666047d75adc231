/* The CUDA backend against the CPU backend on every tests/data model and on mkmodel files in the weight
 * types those lack (SKIPs without CUDA or a GPU).
 *
 * Tolerances, from the arithmetic:
 *  - up to 8 tokens per forward every matmul is the fp32 GEMV (fp32 dequantize, fp32 accumulate)
 *    and attention / norms are fp32 (statistics in double like the CPU): only the summation order
 *    differs, ~1e-7 relative per dot, growing through 2-3 layers to ~1e-5 on logits of magnitude
 *    ~10; TOL_F32 = 2e-4 leaves an order of magnitude.
 *  - more tokens use the bf16 tensor-core GEMM for the big products (activations and weights
 *    rounded to bf16: relative error up to 2^-9 each, so ~2^-9 * sqrt(2) per product output as a
 *    random walk over K terms); the router and the indexer projections stay fp32 (their outputs
 *    are ranked: MODEL-SPEC.md §2.6/§2.7). The tiny models chain ~16 such products from the
 *    embedding to the logits (3 layers x q_a, q_b, k_b, v_b, o, gate/up, down, + lm_head), and
 *    the errors add as a random walk: sqrt(16) * 2^-9 * sqrt(2) ~ 1.1e-2 of the logit scale.
 *    TOL_BF16_REL = 2e-2 times max|logit| of the CPU reference leaves a factor 2. A router or
 *    indexer top-k fed by bf16-rounded activations can still choose differently from the CPU on a
 *    near-tie, and then that token and the later ones (through the KV cache) differ by whole logits.
 *    The 64-token forward therefore records every choice (model_debug hooks, sel_diff.h) on both
 *    backends and holds to the bound every token before the first differing choice; the number of
 *    differing choices is printed. (A CPU forward with only the dense products' inputs rounded to
 *    bf16 reproduces the glm-dsa differences of the 2026-11-29 H200 run to 3 digits, from indexer
 *    flips: docs/PERFORMANCE.md.)
 * Checks: rand64 logits at every position (prefill in chunks of 8: fp32 path; in one 64-token batch:
 * bf16 path); 16-token greedy continuations of the first prompts (prefill in chunks of 8, then
 * decode) identical to the CPU's up to the first step whose CPU top-1/top-2 margin is below
 * TOL_F32; decode of 3 sequences replayed from CUDA graphs equal bit for bit to the same padded
 * shapes run eagerly (graphs = 2), and within TOL_F32 of the CPU. The dense prompt path (kcuda_mla_dense,
 * by default from 128 rows) made to take small chunks: the rand64 logits again with it from chunks of 8
 * (fp32 GEMMs, TOL_F32) and for the 64-token batch with bf16 GEMMs (the bf16 bound above); and steps of
 * three sequences' chunks, up to 8 rows, where runs of rows take it and a row between them the absorbed
 * kernels (TOL_F32). */
#include "tests/model/sel_diff.h"

#ifndef TANDEM_CUDA
int main(void)
{
	(void)n_fail;
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/kernels.h"
#include "tests/tandem_bin.h"

#define TOL_F32 2e-4
#define TOL_BF16_REL 2e-2

static struct model *load_cuda(const char *stem, int graphs)
{
	char p[512];
	model_path(p, sizeof(p), stem);
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	o.backend = MODEL_BACKEND_CUDA;
	o.max_tokens = 64;
	o.max_seqs = 8;
	o.max_ctx = 512;
	o.graphs = graphs;
	struct errbuf e = {0};
	struct model *m;
	if (model_load(&m, p, &o, &e)) {
		fprintf(stderr, "load %s (cuda): %s\n", p, e.msg);
		return NULL;
	}
	return m;
}

static void test_logits(const char *stem, struct model *mc, struct model *mg, json_t *man)
{
	int64_t V = model_hparams(mc)->vocab;
	int32_t *ids;
	int n;
	if (find_prompt(man, "rand64", &ids, &n)) {
		CHECK(0, "%s: no rand64 prompt", stem);
		return;
	}
	float *ref = malloc(sizeof(float) * (size_t)V * (size_t)n),
	      *got = malloc(sizeof(float) * (size_t)V * (size_t)n);
	struct model_kv kc, kg;
	struct errbuf e = {0};
	if (model_kv_init(&kc, mc, 4, NULL, 0, &e) || model_kv_init(&kg, mg, 4, NULL, 0, &e)) {
		CHECK(0, "%s: kv: %s", stem, e.msg);
		return;
	}
	struct tseq s;
	struct sel_rec rc_cpu = {0}, rc_gpu = {0};
	tseq_init(&s, 0, 2, 1);
	/* the CPU reference: the whole prompt in one forward, recording choices and hidden states */
	CHECK(sel_run(mc, &kc, &s, ids, n, ref, &rc_cpu) == 0, "%s: cpu forward", stem);
	for (int chunk = 8; chunk <= 64; chunk += 56) {
		tseq_init(&s, 2, 2, 1); /* other blocks than the CPU run used: a pool is per backend anyway */
		int rc = chunk == n ? sel_run(mg, &kg, &s, ids, n, got, &rc_gpu)
		                    : run_seq(mg, &kg, &s, ids, n, chunk, true, got);
		CHECK(rc == 0, "%s: cuda forward (chunk %d)", stem, chunk);
		if (rc)
			continue;
		double d = max_abs_diff(ref, got, (size_t)V * (size_t)n), scale = 0;
		for (size_t i = 0; i < (size_t)V * (size_t)n; i++)
			if (fabs(ref[i]) > scale)
				scale = fabs(ref[i]);
		double tol = chunk <= 8 ? TOL_F32 : TOL_BF16_REL * scale;
		/* bf16 path: a token after a differing router / indexer choice is exempt (see the header) */
		int fl = -1, fk = 0, n_moe = 0, n_idx = 0;
		int flip = chunk == n ? sel_first_flip(&rc_cpu, &rc_gpu, &fl, &fk, &n_moe, &n_idx) : n;
		int worst = -1, n_over = 0;
		double d_before = 0;
		for (int p = 0; p < n; p++) {
			double dp = max_abs_diff(ref + (size_t)p * V, got + (size_t)p * V, (size_t)V);
			n_over += dp > tol;
			if (p < flip && !(dp <= d_before))
				d_before = dp, worst = p;
		}
		printf("%-22s rand64 all positions, cuda chunks of %2d (%s) vs cpu: max|d| = %.3g, %d of %d "
		       "positions "
		       "over tolerance %.2g (max|logit| %.3g)\n",
		       stem, chunk, chunk <= 8 ? "fp32 GEMV" : "bf16 GEMM", d, n_over, n, tol, scale);
		if (chunk == n)
			printf("%-22s   choices differing from cpu: router at %d (layer, token) pairs, "
			       "indexer at %d; first "
			       "at token %d (layer %d, %s); max|d| before it %.3g\n",
			       stem, n_moe, n_idx, flip, fl,
			       fk == 1   ? "router"
			       : fk == 2 ? "indexer"
			                 : "none",
			       d_before);
		if (chunk == n && fk == 1)
			sel_print_moe(stem, &rc_cpu, &rc_gpu, fl, flip);
		if (worst >= 0 && d_before > tol &&
		    chunk == n) { /* locate: hidden state per layer at that token */
			printf("%-22s   token %d, max|d| of the hidden state after layer:", stem, worst);
			for (int l = 0; l <= rc_cpu.n_layers; l++) {
				const float *hc = rc_cpu.hid + ((size_t)l * n + (size_t)worst) * rc_cpu.D;
				const float *hg = rc_gpu.hid + ((size_t)l * n + (size_t)worst) * rc_cpu.D;
				printf(" %s%d %.3g", l ? "" : "emb ", l - 1,
				       max_abs_diff(hc, hg, (size_t)rc_cpu.D));
			}
			printf("\n");
		}
		CHECK(d_before <= tol,
		      "%s chunk %d: cuda logits differ from cpu by %g at token %d, before any choice differs",
		      stem, chunk, d_before, worst);
	}
	sel_rec_free(&rc_cpu);
	sel_rec_free(&rc_gpu);
	model_kv_fini(&kc);
	model_kv_fini(&kg);
	free(ref);
	free(got);
	free(ids);
}

/* One step packing three sequences' prompt chunks, as the prefill engine does: rows [A: na rows at positions
 * 0.. | B: nb rows at 16.. | C: nc rows at 8..], B's first 16 and C's first 8 positions cached by earlier
 * steps; at most 8 rows, so every product is the fp32 GEMV. Run on mg (the absorbed kernels) and md
 * (TANDEM_MLA_DENSE_MIN=2, fp32 GEMMs: runs of 2 rows and more take the dense path, a single row between
 * them the absorbed kernels), the logits of every row against the CPU's same steps within TOL_F32. */
static void test_mixed(const char *stem, struct model *mc, struct model *mg, struct model *md, json_t *man,
                       int na, int nb, int nc)
{
	int64_t V = model_hparams(mc)->vocab;
	int32_t *ids = NULL;
	int n = 0;
	const int nt = na + nb + nc;
	if (find_prompt(man, "rand64", &ids, &n) || n < 64 || nt > 8 || na > 16 || nb > 16 || nc > 16) {
		CHECK(0, "%s: no rand64 prompt of 64 tokens, or more than 8 rows", stem);
		free(ids);
		return;
	}
	struct model *ms[3] = {mc, mg, md};
	float *lg[3];
	for (int k = 0; k < 3; k++)
		lg[k] = malloc(sizeof(float) * (size_t)V * (size_t)nt);
	float *tmp = malloc(sizeof(float) * (size_t)V);
	int rc = 0;
	for (int k = 0; k < 3 && !rc; k++) {
		struct model_kv kv;
		struct errbuf e = {0};
		if (model_kv_init(&kv, ms[k], 8, NULL, 0, &e)) {
			CHECK(0, "%s: kv: %s", stem, e.msg);
			rc = -1;
			break;
		}
		struct tseq sq[3];
		for (int j = 0; j < 3; j++)
			tseq_init(&sq[j], 2 * j, 2, 1);
		rc = run_seq(ms[k], &kv, &sq[1], ids + 10, 16, 8, false, tmp) ||
		     run_seq(ms[k], &kv, &sq[2], ids + 30, 8, 8, false, tmp);
		int32_t tok[8], seq[8], pos[8];
		uint8_t want[8];
		for (int i = 0; i < nt; i++) {
			const int j = i < na        ? 0
			              : i < na + nb ? 1
			                            : 2,
			          o = i - (j == 0   ? 0
			                   : j == 1 ? na
			                            : na + nb);
			seq[i] = j;
			pos[i] = sq[j].len + o;
			tok[i] = ids[(j == 0 ? 0 : j == 1 ? 26 : 38) + o];
			want[i] = 1;
		}
		struct model_seq mseq[3];
		for (int j = 0; j < 3; j++)
			mseq[j] = (struct model_seq){.blocks = sq[j].blocks, .n_blocks = sq[j].n_blocks};
		struct model_batch b = {.n_tokens = nt,
		                        .tokens = tok,
		                        .seq = seq,
		                        .pos = pos,
		                        .logits = want,
		                        .n_seqs = 3,
		                        .seqs = mseq};
		if (!rc)
			rc = model_forward(ms[k], &kv, &b, lg[k], NULL, &e);
		CHECK(rc == 0, "%s: mixed step on model %d: %s", stem, k, e.msg);
		model_kv_fini(&kv);
	}
	if (!rc) {
		double dg = max_abs_diff(lg[0], lg[1], (size_t)V * (size_t)nt),
		       dd = max_abs_diff(lg[0], lg[2], (size_t)V * (size_t)nt);
		printf("%-22s one step of 3 sequences (%d | %d | %d rows) vs cpu: absorbed max|d| = %.3g, "
		       "dense runs (min 2) %.3g (tolerance %.2g)\n",
		       stem, na, nb, nc, dg, dd, TOL_F32);
		CHECK(dg <= TOL_F32, "%s: the mixed step (absorbed) differs from cpu by %g", stem, dg);
		CHECK(dd <= TOL_F32, "%s: the mixed step (dense runs) differs from cpu by %g", stem, dd);
	}
	for (int k = 0; k < 3; k++)
		free(lg[k]);
	free(tmp);
	free(ids);
}

static void test_greedy(const char *stem, struct model *mc, struct model *mg, json_t *man)
{
	int64_t V = model_hparams(mc)->vocab;
	float *lc = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
	const char *name;
	int32_t *ids;
	int n;
	for (size_t pi = 0; pi < 3 && (ids = ref_prompt(man, pi, &n, &name)); pi++) {
		struct model_kv kc, kg;
		struct errbuf e = {0};
		if (model_kv_init(&kc, mc, 4, NULL, 0, &e) || model_kv_init(&kg, mg, 4, NULL, 0, &e)) {
			CHECK(0, "%s: kv: %s", stem, e.msg);
			free(ids);
			break;
		}
		struct tseq sc, sg;
		tseq_init(&sc, 0, 4, 1);
		tseq_init(&sg, 3, 4, -1); /* scattered, descending block ids */
		int rc = run_seq(mc, &kc, &sc, ids, n, 8, false, lc) ||
		         run_seq(mg, &kg, &sg, ids, n, 8, false, lg);
		CHECK(rc == 0, "%s %s: prefill", stem, name);
		int same = 0, steps = 16;
		bool stop = false;
		for (int t = 0; t < steps && !rc && !stop; t++) {
			int a = argmax(lc, V), b = argmax(lg, V);
			double mg12 = margin12(lc, V);
			if (a != b) {
				CHECK(mg12 < TOL_F32, "%s %s step %d: cuda picks %d, cpu %d (cpu margin %g)",
				      stem, name, t, b, a, mg12);
				stop = true;
				break;
			}
			same++;
			if (mg12 < TOL_F32) /* beyond a near tie the continuations may rightly part */
				break;
			int32_t tok = a;
			rc = run_seq(mc, &kc, &sc, &tok, 1, 1, false, lc) ||
			     run_seq(mg, &kg, &sg, &tok, 1, 1, false, lg);
			CHECK(rc == 0, "%s %s: decode step %d", stem, name, t);
		}
		printf("%-22s %-14s greedy: %d of %d steps identical to cpu\n", stem, name, same, steps);
		model_kv_fini(&kc);
		model_kv_fini(&kg);
		free(ids);
	}
	free(lc);
	free(lg);
}

/* 3 sequences (prompts 0..2) prefilled, then decode steps of all three: graphs (1) vs padded eager
 * (2) bit for bit, and vs the CPU within TOL_F32 */
static void test_graphs(const char *stem, struct model *mc, json_t *man)
{
	struct model *m1 = load_cuda(stem, 1), *m2 = load_cuda(stem, 2);
	CHECK(m1 && m2, "%s: load with graphs", stem);
	if (!m1 || !m2) {
		model_destroy(m1);
		model_destroy(m2);
		return;
	}
	int64_t V = model_hparams(mc)->vocab;
	struct model *ms[3] = {mc, m1, m2};
	struct model_kv kv[3];
	struct tseq sq[3][3];
	struct errbuf e = {0};
	float *lg[3];
	int32_t next[3];
	int rc = 0;
	for (int k = 0; k < 3; k++) {
		lg[k] = malloc(sizeof(float) * (size_t)V * 3);
		if (model_kv_init(&kv[k], ms[k], 16, NULL, 0, &e))
			rc = -1;
	}
	for (int j = 0; j < 3 && !rc; j++) {
		const char *name;
		int n = 0;
		int32_t *ids = ref_prompt(man, (size_t)j, &n, &name);
		if (!ids) {
			rc = -1;
			break;
		}
		for (int k = 0; k < 3 && !rc; k++) {
			tseq_init(&sq[k][j], j * 4, 4, 1);
			rc = run_seq(ms[k], &kv[k], &sq[k][j], ids, n, 8, false, lg[k] + j * V);
		}
		next[j] = (int32_t)argmax(lg[0] + j * V, V);
		free(ids);
	}
	CHECK(rc == 0, "%s: graph test prefill", stem);
	double worst = 0;
	int steps = 0;
	bool bit_equal = true;
	for (int t = 0; t < 12 && !rc; t++) {
		int32_t seqi[3] = {0, 1, 2}, pos[3];
		for (int k = 0; k < 3 && !rc; k++) {
			struct model_seq ms3[3];
			for (int j = 0; j < 3; j++) {
				ms3[j] = (struct model_seq){.blocks = sq[k][j].blocks,
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
			                        .seqs = ms3};
			rc = model_forward(ms[k], &kv[k], &b, lg[k], NULL, &e);
			CHECK(rc == 0, "%s: decode step %d on model %d: %s", stem, t, k, e.msg);
			for (int j = 0; j < 3; j++)
				sq[k][j].len++;
		}
		if (rc)
			break;
		if (memcmp(lg[1], lg[2], sizeof(float) * (size_t)V * 3) != 0)
			bit_equal = false;
		double d = max_abs_diff(lg[0], lg[1], (size_t)V * 3);
		worst = d > worst ? d : worst;
		steps++;
		for (int j = 0; j < 3; j++)
			next[j] = (int32_t)argmax(lg[0] + j * V, V);
	}
	printf(
	    "%-22s decode batch 3 (bucket 4), %d steps: graph replay %s padded eager; vs cpu max|d| = %.3g\n",
	    stem, steps, bit_equal ? "==" : "!=", worst);
	CHECK(bit_equal, "%s: graph replay differs from eager", stem);
	CHECK(worst <= TOL_F32, "%s: graph decode differs from cpu by %g", stem, worst);
	for (int k = 0; k < 3; k++) {
		model_kv_fini(&kv[k]);
		free(lg[k]);
	}
	model_destroy(m1);
	model_destroy(m2);
}

/* Weight types no tests/data model has: `tandem mkmodel --preset tiny` files (glm-dsa-tiny's shapes and
 * tokenizer, so its manifest's prompts apply) in the codebook types, and a mix whose experts' gate and
 * up differ in type (kcuda_moe_ffn's split path). Both backends decode the same blocks to the same
 * floats (tests/unit/test_quant_piece.cc), so the tolerances above hold unchanged. */
static void test_mkmodel_files(void)
{
	static const char *const types[] = {"iq2_xxs", "iq3_s", "iq1_m",
	                                    "q4_k,exps=iq2_xxs,up_exps=iq3_s,down_exps=iq3_xxs"};
	char tandem[PATH_MAX], dir[64] = "/tmp/test_gpu_model.XXXXXX";
	tandem_bin_find(tandem, sizeof(tandem));
	if (access(tandem, X_OK) != 0 || !mkdtemp(dir)) {
		CHECK(0, "mkmodel files: no tandem binary at %s (BUILD=...) or no temporary folder", tandem);
		return;
	}
	json_t *man = ref_manifest("glm-dsa-tiny-BF16");
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		char path[256];
		snprintf(path, sizeof(path), "%s/tiny-%zu.gguf", dir, i);
		const char *args[] = {"mkmodel", "--preset", "tiny", "--type", types[i],
		                      "--seed",  "7",        "-o",   path,     NULL};
		const int rc = tandem_bin_run(tandem, args);
		CHECK(rc == 0, "tandem mkmodel --type %s exited %d", types[i], rc);
		if (rc)
			continue;
		printf("mkmodel tiny --type %s (%s):\n", types[i], path);
		struct model *mc = load_model(path, 1, 2), *mg = load_cuda(path, 0);
		CHECK(mc && mg, "%s: load", path);
		if (mc && mg) {
			test_logits(path, mc, mg, man);
			test_greedy(path, mc, mg, man);
			test_graphs(path, mc, man);
		}
		model_destroy(mc);
		model_destroy(mg);
		unlink(path);
	}
	json_decref(man);
	rmdir(dir);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	for (int i = 0; ref_models[i]; i++) {
		const char *stem = ref_models[i];
		struct model *mc = load_model(stem, 1, 2), *mg = load_cuda(stem, 0);
		CHECK(mc && mg, "%s: load", stem);
		if (mc && mg) {
			json_t *man = ref_manifest(stem);
			test_logits(stem, mc, mg, man);
			test_greedy(stem, mc, mg, man);
			test_graphs(stem, mc, man);
			/* prompt rows through the naive-form dense MLA (kcuda_mla_dense) instead of the
			 * absorbed one (by default only runs of 128 rows and more take it): fp32 GEMMs (these
			 * models' fp32 pool) from runs of 2 rows, held to the fp32 tolerance (rand64 in
			 * chunks of 8, and steps of three sequences); bf16 math (a bf16 pool's default) for
			 * the 64-token chunk, held to the bf16 one, in the fused kernel (the default) and in
			 * the GEMMs (TANDEM_MLA_DENSE_FLASH=0) */
			for (int v = 0; v < 3; v++) {
				const char *min = v ? "64" : "2", *math = v ? "bf16" : "f32";
				setenv("TANDEM_MLA_DENSE_MIN", min, 1);
				setenv("TANDEM_MLA_DENSE_MATH", math, 1);
				if (v == 2)
					setenv("TANDEM_MLA_DENSE_FLASH", "0", 1);
				struct model *md = load_cuda(stem, 0);
				unsetenv("TANDEM_MLA_DENSE_MIN");
				unsetenv("TANDEM_MLA_DENSE_MATH");
				unsetenv("TANDEM_MLA_DENSE_FLASH");
				CHECK(md != NULL, "%s: load with TANDEM_MLA_DENSE_MIN=%s", stem, min);
				if (!md)
					continue;
				printf("%-22s with TANDEM_MLA_DENSE_MIN=%s TANDEM_MLA_DENSE_MATH=%s%s:\n",
				       stem, min, math, v == 2 ? " TANDEM_MLA_DENSE_FLASH=0" : "");
				test_logits(stem, mc, md, man);
				if (v == 0) {
					test_mixed(stem, mc, mg, md, man, 3, 1,
					           4); /* dense | absorbed | dense */
					test_mixed(stem, mc, mg, md, man, 3, 2, 3); /* three dense runs */
					test_mixed(stem, mc, mg, md, man, 1, 4,
					           3); /* absorbed | dense | dense */
				}
				model_destroy(md);
			}
			json_decref(man);
		}
		model_destroy(mc);
		model_destroy(mg);
	}
	test_mkmodel_files();
	printf("%s\n", n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
#endif
