/* KV pool and identity: the fingerprint string / hash and the model identity hash (equal for the
 * same file, different across files and KV dtypes); caller-supplied pool memory with block b at
 * base + b * block_bytes (only the blocks of the batch are written); the disaggregation path:
 * prefill in one model instance and pool, copy the raw blocks into other block ids of a second
 * instance's pool (what the UCX push does), decode there, and get the same logits as decoding in
 * place; and the bf16 KV option staying close to fp32 (its rounding is the only difference). */
#include "tests/model/refs.h"

int main(void)
{
	const char *stem = "glm-dsa-tiny-BF16";
	struct model *a = load_model(stem, 1, 2), *b = load_model(stem, 1, 1),
	             *q = load_model("glm-dsa-tiny-Q8_0", 1, 1);
	struct model *d = load_model("deepseek2-tiny-BF16", 1, 1);
	if (!a || !b || !q || !d)
		return 1;
	char fa[1200], fd[1200], ha[17], hb[17], hq[17];
	model_kv_fingerprint(a, fa, sizeof(fa));
	model_kv_fingerprint(d, fd, sizeof(fd));
	printf("fingerprint %s: %s (%016llx)\n", stem, fa, (unsigned long long)model_kv_fingerprint_hash(a));
	printf("fingerprint deepseek2-tiny-BF16: %s\n", fd);
	CHECK(strcmp(fa, "arch=glm-dsa layers=3 block=64 C=256 R=32 DI=64 dtype=f32 idx=1,0,1") == 0,
	      "glm fingerprint");
	CHECK(strcmp(fd, "arch=deepseek2 layers=2 block=64 C=128 R=32 DI=0 dtype=f32 idx=0,0") == 0,
	      "ds fingerprint");
	CHECK(model_kv_fingerprint_hash(a) == model_kv_fingerprint_hash(b),
	      "same model, different fingerprint hash");
	CHECK(model_kv_fingerprint_hash(a) != model_kv_fingerprint_hash(d),
	      "different models, same fingerprint hash");
	model_identity_hex(a, ha);
	model_identity_hex(b, hb);
	model_identity_hex(q, hq);
	printf("identity BF16 %s, again %s, Q8_0 %s\n", ha, hb, hq);
	CHECK(strcmp(ha, hb) == 0 && strcmp(ha, hq) != 0, "identity hashes");

	struct model_kv_layout L;
	model_kv_layout_get(a, &L);
	/* 3 layers x 64 x (256+32) x 4 + 2 indexer layers x 64 x 64 x 4 */
	CHECK(L.block_bytes == 3 * 64 * 288 * 4 + 2 * 64 * 64 * 4, "block bytes %zu", L.block_bytes);
	size_t nblk = 6;
	unsigned char *mem = calloc(nblk, L.block_bytes);
	struct model_kv kva, kvb, kvc;
	struct errbuf e = {0};
	CHECK(model_kv_init(&kva, a, (int64_t)nblk, mem, nblk * L.block_bytes - 1, &e) != 0,
	      "short memory accepted");
	printf("short pool memory -> %s\n", e.msg);
	if (model_kv_init(&kva, a, (int64_t)nblk, mem, nblk * L.block_bytes, &e) ||
	    model_kv_init(&kvb, b, 8, NULL, 0, &e) || model_kv_init(&kvc, a, 8, NULL, 0, &e)) {
		printf("kv: %s\n", e.msg);
		return 1;
	}
	json_t *man = ref_manifest(stem);
	int n = 0;
	const char *name = "";
	int32_t *ids = NULL;
	for (size_t i = 0; (ids = ref_prompt(man, i, &n, &name)); i++) {
		if (strcmp(name, "rand150") == 0)
			break;
		free(ids);
	}
	int64_t V = model_hparams(a)->vocab;
	float *l1 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
	/* prefill 150 tokens into blocks 4, 1, 2 of the caller's memory */
	struct tseq s;
	tseq_init(&s, 0, 3, 1);
	s.blocks[0] = 4;
	s.blocks[1] = 1;
	s.blocks[2] = 2;
	CHECK(run_seq(a, &kva, &s, ids, n, 40, false, l1) == 0, "prefill");
	int untouched = 1;
	for (size_t bb = 0; bb < nblk; bb++)
		if (bb == 0 || bb == 3 || bb == 5)
			for (size_t i = 0; i < L.block_bytes; i++)
				untouched &= mem[bb * L.block_bytes + i] == 0;
	CHECK(untouched, "blocks outside the table were written");
	/* push: copy the 3 raw blocks into blocks 7, 0, 5 of another instance's pool */
	struct tseq t;
	tseq_init(&t, 0, 3, 1);
	t.blocks[0] = 7;
	t.blocks[1] = 0;
	t.blocks[2] = 5;
	t.len = s.len;
	for (int i = 0; i < 3; i++)
		memcpy((char *)kvb.base + (size_t)t.blocks[i] * L.block_bytes,
		       mem + (size_t)s.blocks[i] * L.block_bytes, L.block_bytes);
	double worst = 0;
	int32_t ta = argmax(l1, V), tb = ta;
	for (int step = 0; step < 10; step++) {
		CHECK(run_seq(a, &kva, &s, &ta, 1, 1, false, l1) == 0, "decode a");
		CHECK(run_seq(b, &kvb, &t, &tb, 1, 1, false, l2) == 0, "decode b");
		double x = max_abs_diff(l1, l2, (size_t)V);
		worst = x > worst ? x : worst;
		ta = argmax(l1, V);
		tb = argmax(l2, V);
	}
	printf("decode after raw block transfer (10 steps): max|d| = %.3g\n", worst);
	CHECK(worst == 0.0, "transferred blocks decode differently (%g)", worst);

	/* bf16 KV */
	struct model_opts o;
	model_opts_default(&o);
	o.kv_dtype = MODEL_KV_BF16;
	o.quiet = true;
	struct model *h;
	if (model_load(&h, DATA "/models/glm-dsa-tiny-BF16.gguf", &o, &e) == 0) {
		char fh[1200];
		model_kv_fingerprint(h, fh, sizeof(fh));
		CHECK(strstr(fh, "dtype=bf16") &&
		          model_kv_fingerprint_hash(h) != model_kv_fingerprint_hash(a),
		      "bf16 fingerprint");
		struct model_kv kvh;
		if (model_kv_init(&kvh, h, 4, NULL, 0, &e) == 0) {
			struct tseq u, w;
			tseq_init(&u, 0, 1, 1);
			tseq_init(&w, 0, 1, 1);
			CHECK(run_seq(h, &kvh, &u, ids, 17, 17, false, l2) == 0, "bf16 forward");
			CHECK(run_seq(a, &kvc, &w, ids, 17, 17, false, l1) == 0, "f32 forward");
			double x = max_abs_diff(l1, l2, (size_t)V);
			printf("bf16 KV vs fp32 KV, 17 tokens: max|d| = %.3g (block %zu vs %zu bytes)\n", x,
			       kvh.layout.block_bytes, L.block_bytes);
			CHECK(x > 0 && x < 0.1, "bf16 KV logits differ by %g", x);
			CHECK(kvh.layout.block_bytes * 2 == L.block_bytes, "bf16 block size");
			model_kv_fini(&kvh);
		}
		model_destroy(h);
	}
	/* long context on 1 and 2 threads: with few tokens per batch the indexer scores are cut into
	 * 1024-key chunks across threads; the result must not depend on it */
	{
		struct model_kv k1, k2;
		if (model_kv_init(&k1, b, 32, NULL, 0, &e) == 0 &&
		    model_kv_init(&k2, a, 32, NULL, 0, &e) == 0) {
			enum { LONG = 1800 };
			int32_t *lt = malloc(sizeof(int32_t) * LONG);
			for (int i = 0; i < LONG; i++)
				lt[i] = (int32_t)((i * 7919) % 987);
			struct tseq s1, s2;
			tseq_init(&s1, 0, 32, 1);
			tseq_init(&s2, 31, 32, -1);
			int rc1 = run_seq(b, &k1, &s1, lt, LONG - 4, 512, false, l1);
			int rc2 = run_seq(a, &k2, &s2, lt, LONG - 4, 512, false, l2);
			double dl = 0;
			for (int i = LONG - 4; i < LONG && !rc1 && !rc2; i++) {
				rc1 = run_seq(b, &k1, &s1, lt + i, 1, 1, false, l1);
				rc2 = run_seq(a, &k2, &s2, lt + i, 1, 1, false, l2);
				dl = fmax(dl, max_abs_diff(l1, l2, (size_t)V));
			}
			printf(
			    "context %d, decode on 1 vs 2 threads (chunked indexer scoring): max|d| = %.3g\n",
			    LONG, dl);
			CHECK(rc1 == 0 && rc2 == 0 && dl == 0.0,
			      "long-context decode differs across threads (%g)", dl);
			free(lt);
			model_kv_fini(&k1);
			model_kv_fini(&k2);
		}
	}
	free(l1);
	free(l2);
	free(ids);
	json_decref(man);
	model_kv_fini(&kva);
	model_kv_fini(&kvb);
	model_kv_fini(&kvc);
	free(mem);
	model_destroy(a);
	model_destroy(b);
	model_destroy(q);
	model_destroy(d);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
