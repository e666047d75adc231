/* `tandem mkmodel` test: runs the real binary (build/tandem) for the tiny preset in every mix and
 * checks the files against the reference glm-dsa-tiny-BF16.gguf of tests/data: same tensor names
 * and shapes, the types each mix promises, the same architecture metadata values and the same
 * tokenizer. Then: the same seed gives identical bytes whatever the thread count, another seed
 * gives other weights; each file loads with the model and a forward pass gives finite logits that
 * agree between F32, BF16, Q8_0 and the Q4_K mix (same random model, quantized differently);
 * bad command lines exit 2. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "common/model/model.h"
#include "common/tok/tok.h"
#include "kernels/kernels.h"
#include "tests/tandem_bin.h"

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

#define REF "tests/data/models/glm-dsa-tiny-BF16.gguf"
/* --type with per-role overrides: gate and up of different codebook types (the split path of the
 * CUDA MoE), down a third */
#define SPLIT_MIX "q4_k,exps=iq2_xxs,up_exps=iq3_s,down_exps=iq3_xxs"

static char tandem[PATH_MAX], tmpdir[256];

static void find_tandem(void)
{
	tandem_bin_find(tandem, sizeof(tandem));
}

static int run_tandem(const char *const *args)
{
	return tandem_bin_run(tandem, args);
}

static void mk(const char *type, const char *seed, const char *threads, const char *out)
{
	const char *args[] = {"mkmodel", "--preset",  "tiny",  "--type", type, "--seed",
	                      seed,      "--threads", threads, "-o",     out,  NULL};
	int rc = run_tandem(args);
	CHECK(rc == 0, "tandem mkmodel --type %s -o %s exited %d", type, out, rc);
}

static bool is_attn(const char *name)
{
	return strstr(name, ".attn_q_a.") || strstr(name, ".attn_q_b.") || strstr(name, ".attn_kv_a_mqa.") ||
	       strstr(name, ".attn_k_b.") || strstr(name, ".attn_v_b.") || strstr(name, ".attn_output.") ||
	       strstr(name, ".indexer.attn_");
}

/* The type the mix promises for a tensor the reference BF16 file stores as ref_type. */
static int expected_type(const char *mix, const char *name, int ref_type, int64_t ne0)
{
	if (ref_type == KT_F32 || strcmp(mix, "f32") == 0)
		return KT_F32;
	if (strcmp(mix, "iq3_s") == 0) /* one type where the rows hold whole 256-blocks, else Q8_0 */
		return ne0 % 256 == 0 ? KT_IQ3_S : KT_Q8_0;
	if (strcmp(mix, "iq2_xxs") == 0)
		return ne0 % 256 == 0 ? KT_IQ2_XXS : KT_Q8_0;
	if (strcmp(mix, SPLIT_MIX) == 0) { /* the q4_k mix with its routed experts overridden */
		if (strstr(name, "ffn_gate_exps."))
			return KT_IQ2_XXS;
		if (strstr(name, "ffn_up_exps."))
			return KT_IQ3_S;
		if (strstr(name, "ffn_down_exps."))
			return KT_IQ3_XXS;
	}
	if (strcmp(mix, "bf16") == 0)
		return KT_BF16;
	if (strcmp(mix, "q8_0") == 0)
		return KT_Q8_0;
	/* q4_k mix */
	if (is_attn(name))
		return KT_Q8_0;
	if (strcmp(name, "output.weight") == 0)
		return KT_Q6_K;
	return KT_Q4_K;
}

static bool same_kv(const struct gguf_ctx *a, const struct gguf_ctx *b, const char *key)
{
	int64_t ka = gguf_find_key(a, key), kb = gguf_find_key(b, key);
	if (ka < 0 || kb < 0 || gguf_kv_type(a, ka) != gguf_kv_type(b, kb))
		return false;
	enum gguf_vtype t = gguf_kv_type(a, ka);
	if (t == GGUF_VT_STRING) {
		const char *pa, *pb;
		size_t la, lb;
		return gguf_get_str(a, key, &pa, &la, NULL) == 0 &&
		       gguf_get_str(b, key, &pb, &lb, NULL) == 0 && la == lb && memcmp(pa, pb, la) == 0;
	}
	if (t == GGUF_VT_F32 || t == GGUF_VT_F64) {
		float fa, fb;
		return gguf_get_f32(a, key, &fa, NULL) == 0 && gguf_get_f32(b, key, &fb, NULL) == 0 &&
		       fa == fb;
	}
	if (t == GGUF_VT_ARRAY) {
		struct gguf_arr x, y;
		if (gguf_get_arr(a, key, &x, NULL) || gguf_get_arr(b, key, &y, NULL) || x.type != y.type ||
		    x.count != y.count)
			return false;
		for (uint64_t i = 0; i < x.count; i++) {
			if (x.type == GGUF_VT_STRING) {
				size_t la, lb;
				const char *pa = gguf_arr_str(&x, i, &la), *pb = gguf_arr_str(&y, i, &lb);
				if (!pa || !pb || la != lb || memcmp(pa, pb, la))
					return false;
			} else if (gguf_arr_float(&x, i) != gguf_arr_float(&y, i)) {
				return false;
			}
		}
		return true;
	}
	if (t == GGUF_VT_BOOL) {
		bool va, vb;
		return gguf_get_bool(a, key, &va, NULL) == 0 && gguf_get_bool(b, key, &vb, NULL) == 0 &&
		       va == vb;
	}
	int64_t ia, ib;
	return gguf_get_i64(a, key, &ia, NULL) == 0 && gguf_get_i64(b, key, &ib, NULL) == 0 && ia == ib;
}

static void check_against_reference(const char *mix, const char *path)
{
	struct gguf_ctx *g, *r;
	struct errbuf e = {0};
	int rc = gguf_open(&g, path, &e);
	CHECK(rc == 0, "%s: %s", path, e.msg);
	if (rc)
		return;
	rc = gguf_open(&r, REF, &e);
	CHECK(rc == 0, "%s", e.msg);
	if (rc) {
		gguf_close(g);
		return;
	}
	CHECK(gguf_n_tensors(g) == gguf_n_tensors(r), "%s: %" PRId64 " tensors, reference %" PRId64, mix,
	      gguf_n_tensors(g), gguf_n_tensors(r));
	for (int64_t i = 0; i < gguf_n_tensors(r); i++) {
		const struct gguf_tensor *rt = gguf_tensor(r, i), *t = gguf_find_tensor(g, rt->name);
		CHECK(t, "%s: tensor %s missing", mix, rt->name);
		if (!t)
			continue;
		CHECK(t->n_dims == rt->n_dims && memcmp(t->ne, rt->ne, sizeof(t->ne)) == 0, "%s: %s shape",
		      mix, t->name);
		int want = expected_type(mix, t->name, rt->type, t->ne[0]);
		CHECK(t->type == want, "%s: %s has type %s, expected %s", mix, t->name, ktype_name(t->type),
		      ktype_name(want));
	}
	/* every architecture and tokenizer key of the reference, with the same value */
	int n_cmp = 0;
	for (int64_t i = 0; i < gguf_n_kv(r); i++) {
		const char *k = gguf_kv_key(r, i);
		if (strncmp(k, "general.", 8) == 0)
			continue;
		n_cmp++;
		CHECK(same_kv(g, r, k), "%s: key %s differs from the reference", mix, k);
	}
	CHECK(n_cmp >= 40, "compared %d keys", n_cmp);
	char *arch = gguf_get_str_dup(g, "general.architecture", NULL);
	CHECK(arch && strcmp(arch, "glm-dsa") == 0, "architecture");
	free(arch);
	CHECK(model_arch_check(g, NULL) == 0, "%s: model_arch_check reports problems", mix);
	gguf_close(r);
	gguf_close(g);
}

static bool same_file(const char *a, const char *b)
{
	FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
	bool same = fa && fb;
	while (same) {
		int x = fgetc(fa), y = fgetc(fb);
		same = x == y;
		if (x == EOF)
			break;
	}
	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	return same;
}

#define N_TOK 40
#define N_MIX 7
/* The codebook mixes put every matrix in IQ3_S (3.4 bits a weight) or IQ2_XXS (2.06): the random
 * tiny model amplifies their error layer by layer. Seeds 1..7 measured median max|d| 6.8-8.3 and
 * 11.1-12.0, median cosine 0.75-0.81 and 0.40-0.44 (q4_k: 0.92-0.96), so these bounds check that
 * the logits still follow the f32 model's, not closeness; test_quant checks the decoders bit for
 * bit against ggml. */
#define IQ3S_TOL 12.0
#define IQ3S_COS 0.6
#define IQ2XXS_TOL 18.0
#define IQ2XXS_COS 0.25
/* SPLIT_MIX (Q4_K / Q8_0 with the experts in IQ2_XXS / IQ3_S / IQ3_XXS), seeds 1..7: median max|d| 5.06-5.80,
 * median cosine 0.862-0.906 */
#define SPLIT_TOL 10.0
#define SPLIT_COS 0.75

/* Logits at every position of a fixed prompt, or NULL on failure. */
static float *forward(const char *path, int64_t *vocab)
{
	struct model *m;
	struct model_opts o;
	struct errbuf e = {0};
	model_opts_default(&o);
	o.quiet = true;
	o.n_threads = 2;
	int rc = model_load(&m, path, &o, &e);
	CHECK(rc == 0, "%s: load: %s", path, e.msg);
	if (rc)
		return NULL;
	int64_t V = model_hparams(m)->vocab;
	*vocab = V;
	struct model_kv kv;
	float *out = NULL;
	if (model_kv_init(&kv, m, 1, NULL, 0, &e)) {
		CHECK(0, "kv: %s", e.msg);
		goto destroy;
	}
	int32_t tok[N_TOK], seq[N_TOK], pos[N_TOK], block = 0;
	uint8_t want[N_TOK];
	for (int i = 0; i < N_TOK; i++) {
		tok[i] = (int32_t)((i * 7919 + 13) % 988);
		seq[i] = 0;
		pos[i] = i;
		want[i] = 1;
	}
	struct model_seq s = {.blocks = &block, .n_blocks = 1};
	struct model_batch b = {.n_tokens = N_TOK,
	                        .tokens = tok,
	                        .seq = seq,
	                        .pos = pos,
	                        .logits = want,
	                        .n_seqs = 1,
	                        .seqs = &s};
	out = malloc(sizeof(float) * (size_t)V * N_TOK);
	if (model_forward(m, &kv, &b, out, NULL, &e)) {
		CHECK(0, "%s: forward: %s", path, e.msg);
		free(out);
		out = NULL;
	}
	model_kv_fini(&kv);
destroy:
	model_destroy(m);
	return out;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void test_forward(const char *paths[N_MIX], const char *mixes[N_MIX])
{
	float *lg[N_MIX] = {0};
	int64_t V = 0;
	for (int i = 0; i < N_MIX; i++) {
		lg[i] = forward(paths[i], &V);
		if (!lg[i])
			continue;
		size_t n = (size_t)V * N_TOK;
		bool finite = true;
		double lo = INFINITY, hi = -INFINITY;
		for (size_t j = 0; j < n; j++) {
			finite &= isfinite(lg[i][j]) != 0;
			lo = lg[i][j] < lo ? lg[i][j] : lo;
			hi = lg[i][j] > hi ? lg[i][j] : hi;
		}
		CHECK(finite, "%s: non-finite logits", mixes[i]);
		CHECK(hi - lo > 1.0 && hi < 1e3 && lo > -1e3, "%s: logits span [%g, %g]", mixes[i], lo, hi);
		printf("%-5s logits in [%.2f, %.2f]\n", mixes[i], lo, hi);
	}
	/* mixes[0] is f32: the others quantize the same random values, so their logits must be close.
	 * A tiny change can flip a discrete choice (an MoE router's top-2 of 4 experts, an indexer
	 * top-k) at some positions, which changes that position's logits a lot; so the check is on
	 * the median position: its max |d| and its cosine. Measured over seeds 1..7: bf16 0.08-0.23,
	 * q8_0 0.28-0.46, q4_k 3.3-4.5; cosine >= 0.99986, 0.99916, 0.92. Bounds leave about 2x. */
	const double tol[N_MIX] = {0, 0.5, 1.0, 8.0, IQ3S_TOL, IQ2XXS_TOL, SPLIT_TOL};
	const double min_cos[N_MIX] = {0, 0.9995, 0.997, 0.85, IQ3S_COS, IQ2XXS_COS, SPLIT_COS};
	for (int i = 1; i < N_MIX && lg[0]; i++) {
		if (!lg[i])
			continue;
		double dmax[N_TOK], cosv[N_TOK], worst = 0;
		int argmax_same = 0;
		for (int t = 0; t < N_TOK; t++) {
			const float *a = lg[0] + (size_t)t * V, *b = lg[i] + (size_t)t * V;
			double d = 0, dot = 0, n0 = 0, n1 = 0;
			int64_t ia = 0, ib = 0;
			for (int64_t v = 0; v < V; v++) {
				d = fmax(d, fabs((double)a[v] - b[v]));
				dot += (double)a[v] * b[v];
				n0 += (double)a[v] * a[v];
				n1 += (double)b[v] * b[v];
				ia = a[v] > a[ia] ? v : ia;
				ib = b[v] > b[ib] ? v : ib;
			}
			argmax_same += ia == ib;
			dmax[t] = d;
			cosv[t] = dot / sqrt(n0 * n1);
			worst = fmax(worst, d);
		}
		qsort(dmax, N_TOK, sizeof(double), cmp_double);
		qsort(cosv, N_TOK, sizeof(double), cmp_double);
		double med_d = dmax[N_TOK / 2], med_cos = cosv[N_TOK / 2];
		printf("%-5s vs f32: median position max|d| = %.4f, median cosine %.6f, worst position "
		       "max|d| = %.3f, "
		       "argmax agrees at %d/%d\n",
		       mixes[i], med_d, med_cos, worst, argmax_same, N_TOK);
		CHECK(med_d < tol[i], "%s vs f32: median max|d| %g over %g", mixes[i], med_d, tol[i]);
		CHECK(med_cos > min_cos[i], "%s vs f32: median cosine %g below %g", mixes[i], med_cos,
		      min_cos[i]);
	}
	for (int i = 0; i < N_MIX; i++)
		free(lg[i]);
}

/* The synthesized vocabularies of glm5 and deepseek3 load in the tokenizer, have the real size
 * and special ids, merge common words into single tokens and round-trip text. */
static void test_vocab(const char *preset, const char *out, int32_t vocab, int32_t bos, int32_t eos,
                       const char *special, int32_t special_id)
{
	const char *args[] = {"mkmodel",      "--preset", preset, "--type", "q4_k",
	                      "--vocab-only", "-o",       out,    NULL};
	int rc = run_tandem(args);
	CHECK(rc == 0, "mkmodel --vocab-only %s exited %d", preset, rc);
	struct gguf_ctx *g;
	struct errbuf e = {0};
	if (gguf_open(&g, out, &e)) {
		CHECK(0, "%s: %s", out, e.msg);
		return;
	}
	struct tok *t;
	rc = tok_load(&t, g, &e);
	CHECK(rc == 0, "%s: tok_load: %s", preset, e.msg);
	if (rc == 0) {
		CHECK(tok_n_vocab(t) == vocab, "%s: vocab %d", preset, tok_n_vocab(t));
		CHECK(tok_bos(t) == bos && tok_eos(t) == eos, "%s: bos %d eos %d", preset, tok_bos(t),
		      tok_eos(t));
		CHECK(tok_find(t, special, strlen(special)) == special_id, "%s: %s is not %d", preset,
		      special, special_id);
		const char *text = "the people of the world will think about the time, and the question.";
		int32_t ids[128];
		size_t n = 0;
		rc = tok_encode(t, text, strlen(text), 0, ids, 128, &n, NULL, &e);
		CHECK(rc == 0, "%s: encode: %s", preset, e.msg);
		/* every word of the sentence is in the merge list: one token per word + 2 punctuation */
		CHECK(rc == 0 && n == 15, "%s: %zu tokens for 13 words and 2 punctuation marks", preset, n);
		char buf[256];
		size_t len = 0;
		rc = tok_decode(t, ids, n, 0, buf, sizeof(buf), &len, &e);
		CHECK(rc == 0 && len == strlen(text) && memcmp(buf, text, len) == 0, "%s: decode round trip",
		      preset);
		const char *odd = "\xe4\xb8\x96 x\x01"; /* 3 + 2 + 1 bytes, no merges apply */
		rc = tok_encode(t, odd, strlen(odd), 0, ids, 128, &n, NULL, &e);
		CHECK(rc == 0 && n == strlen(odd),
		      "%s: bytes not covered by merges encode to byte tokens (%zu)", preset, n);
		rc = tok_decode(t, ids, n, 0, buf, sizeof(buf), &len, &e);
		CHECK(rc == 0 && len == strlen(odd) && memcmp(buf, odd, len) == 0, "%s: byte round trip",
		      preset);
		tok_destroy(t);
	}
	gguf_close(g);
}

int main(void)
{
	find_tandem();
	if (access(tandem, X_OK) != 0) {
		fprintf(stderr, "FAIL: %s not found (build it with make)\n", tandem);
		return 1;
	}
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gguf_mkmodel.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	const char *mixes[N_MIX] = {"f32", "bf16", "q8_0", "q4_k", "iq3_s", "iq2_xxs", SPLIT_MIX};
	char paths[N_MIX][512];
	const char *pp[N_MIX];
	for (int i = 0; i < N_MIX; i++) {
		snprintf(paths[i], sizeof(paths[i]), "%s/tiny-%s.gguf", tmpdir, mixes[i]);
		pp[i] = paths[i];
		mk(mixes[i], "7", "2", paths[i]);
		check_against_reference(mixes[i], paths[i]);
	}
	/* reproducible: same seed, other thread count -> same bytes; other seed -> other bytes */
	char p1[512], p2[512];
	snprintf(p1, sizeof(p1), "%s/again.gguf", tmpdir);
	snprintf(p2, sizeof(p2), "%s/seed8.gguf", tmpdir);
	mk("q8_0", "7", "1", p1);
	mk("q8_0", "8", "2", p2);
	CHECK(same_file(paths[2], p1), "same seed with 1 and 2 threads gives different files");
	CHECK(!same_file(paths[2], p2), "seeds 7 and 8 give the same file");

	test_forward(pp, mixes);

	char pv[512];
	snprintf(pv, sizeof(pv), "%s/vocab.gguf", tmpdir);
	test_vocab("glm5", pv, 154880, 154822, 154820, "<|user|>", 154827);
	test_vocab("deepseek3", pv, 129280, 0, 1, "<\xef\xbd\x9cUser\xef\xbd\x9c>", 128803);

	/* bad command lines: one line, exit 2 */
	const char *bad1[] = {"mkmodel", "--preset", "tiny", "--type", "q9_9", "-o", p1, NULL};
	const char *bad2[] = {"mkmodel", "--preset", "huge", "--type", "f32", "-o", p1, NULL};
	const char *bad3[] = {"mkmodel", "--preset", "tiny", "--type", "f32", NULL};
	const char *bad4[] = {"mkmodel",  "--preset", "tiny", "--type", "f32",
	                      "--layers", "0",        "-o",   p1,       NULL};
	const char *bad5[] = {"mkmodel",     "--preset",          "tiny", "--type", "f32",
	                      "--tokenizer", "/nonexistent.gguf", "-o",   p1,       NULL};
	const char *bad6[] = {"inspect", "/nonexistent.gguf", NULL};
	CHECK(run_tandem(bad1) == 2, "unknown type");
	CHECK(run_tandem(bad2) == 2, "unknown preset");
	CHECK(run_tandem(bad3) == 2, "missing -o");
	CHECK(run_tandem(bad4) == 2, "zero layers");
	CHECK(run_tandem(bad5) == 2, "missing tokenizer source");
	CHECK(run_tandem(bad6) == 2, "inspect of a missing file");
	/* --type overrides: unknown role, unknown type, no '=', empty part */
	const char *bad_specs[] = {"q4_k,foo=q8_0", "q4_k,exps=q9_9", "q4_k,exps",
	                           "q4_k,",         "q4_k,=q8_0",     "q8_0,attn=q4_k,,ffn=q8_0"};
	for (size_t i = 0; i < sizeof(bad_specs) / sizeof(bad_specs[0]); i++) {
		const char *bad7[] = {"mkmodel", "--preset", "tiny", "--type", bad_specs[i], "-o", p1, NULL};
		CHECK(run_tandem(bad7) == 2, "--type %s", bad_specs[i]);
	}
	const char *ok1[] = {"inspect", paths[3], NULL};
	CHECK(run_tandem(ok1) == 0, "inspect of a mkmodel file finds no problems");

	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", tmpdir);
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
