/* KV staging on the CPU backend (model_kv_upload / model_kv_download / model_kv_wait, model.h): the
 * calls the workers use around the UCX put when the model's pool is its own (the CUDA path; on the
 * CPU forced with kv_staged). Checks: ids outside the pool are refused naming the entry and copy
 * nothing; runs and single blocks land at the same ids in the mirror and nowhere else; a prompt
 * prefilled in place (the mirror is the pool) and moved into a second pool by upload decodes
 * bit-identically to decoding in place; a prompt prefilled in a pool of its own and downloaded
 * gives the mirror bit-identical blocks. */
#include "tests/model/kv_stage.h"

int main(void)
{
	struct model *m = load_model("glm-dsa-tiny-Q8_0", 1, 2);
	if (!m)
		return 1;
	CHECK(!model_kv_on_device(m), "cpu pool reported on the device");
	struct errbuf e = {0};
	CHECK(model_host_pin(m, &e, sizeof(e), &e) == 0, "cpu pin is a no-op");
	CHECK(model_thread_attach(m, &e) == 0, "cpu attach is a no-op");
	struct model_kv_layout L;
	model_kv_layout_get(m, &L);
	const int NB = 8;
	size_t bb = L.block_bytes, bytes = (size_t)NB * bb;
	unsigned char *mirror = malloc(bytes), *back = calloc(1, bytes), *inplace = calloc(1, bytes);
	struct model_kv own, mir;
	if (!mirror || !back || !inplace || model_kv_init(&own, m, NB, NULL, 0, &e) ||
	    model_kv_init(&mir, m, NB, inplace, bytes, &e)) {
		printf("setup: %s\n", e.msg);
		return 1;
	}
	/* bounds */
	for (size_t i = 0; i < bytes; i++)
		mirror[i] = (unsigned char)(i * 7 + i / 4096);
	int32_t bad[3] = {1, NB, 2}, neg[1] = {-1};
	int rc = model_kv_upload(&own, mirror, bad, 3, &e);
	printf("upload of block %d of %d -> %s\n", NB, NB, e.msg);
	CHECK(rc == ERR_FORMAT && strstr(e.msg, "entry 1") && strstr(e.msg, "block 8"), "bad id not refused");
	rc = model_kv_download(&own, back, neg, 1, &e);
	CHECK(rc == ERR_FORMAT, "negative id not refused");
	CHECK(model_kv_upload(&own, mirror, bad, -1, &e) == -EINVAL, "negative count not refused");
	bool untouched = true;
	for (size_t i = 0; i < bytes; i++)
		untouched &= ((unsigned char *)own.base)[i] == 0;
	CHECK(untouched, "a refused upload copied something");
	/* runs (5 6 7), a single block (2) and block 0: the same ids on both sides, nothing else */
	int32_t ids[5] = {5, 6, 7, 2, 0};
	CHECK(model_kv_upload(&own, mirror, ids, 5, &e) == 0 && model_kv_wait(&own, &e) == 0, "upload: %s",
	      e.msg);
	CHECK(model_kv_download(&own, back, ids, 5, &e) == 0, "download: %s", e.msg);
	int n_same = 0, n_zero = 0;
	for (int b = 0; b < NB; b++) {
		bool staged = b == 0 || b == 2 || b >= 5;
		if (staged)
			n_same += memcmp(back + (size_t)b * bb, mirror + (size_t)b * bb, bb) == 0;
		else {
			bool z = true;
			for (size_t i = 0; i < bb; i++)
				z &= back[(size_t)b * bb + i] == 0 &&
				     ((unsigned char *)own.base)[(size_t)b * bb + i] == 0;
			n_zero += z;
		}
	}
	printf("round trip: %d of 5 staged blocks equal, %d of 3 others untouched\n", n_same, n_zero);
	CHECK(n_same == 5 && n_zero == 3, "round trip");

	/* disaggregation through upload: prefill in place (blocks 1, 3), move to the own pool, decode
	 * on both */
	int64_t V = model_hparams(m)->vocab;
	int32_t prompt[KS_PROMPT];
	ks_prompt(prompt, KS_PROMPT, V);
	float *lp = malloc(sizeof(float) * (size_t)V), *la = malloc(sizeof(float) * (size_t)V * KS_STEPS),
	      *lb = malloc(sizeof(float) * (size_t)V * KS_STEPS);
	struct tseq s1, s2;
	tseq_init(&s1, 1, 3, 2);
	CHECK(run_seq(m, &mir, &s1, prompt, KS_PROMPT, 64, false, lp) == 0, "prefill in place");
	int32_t first = (int32_t)argmax(lp, V);
	memset(own.base, 0, bytes);
	CHECK(model_kv_upload(&own, inplace, s1.blocks, 2, &e) == 0, "upload: %s", e.msg);
	s2 = s1;
	CHECK(ks_decode(m, &mir, &s1, first, NULL, la) == 0 && ks_decode(m, &own, &s2, first, NULL, lb) == 0,
	      "decode");
	CHECK(memcmp(la, lb, sizeof(float) * (size_t)V * KS_STEPS) == 0,
	      "decode after upload differs from decode in place");
	printf("prefill in place + upload: %d decode steps bit-identical to decoding in place\n", KS_STEPS);

	/* download: prefill in the own pool, download into a zeroed mirror, compare with in place */
	memset(own.base, 0, bytes);
	memset(inplace, 0, bytes);
	memset(back, 0, bytes);
	tseq_init(&s1, 4, 2, -3); /* blocks 4, 1 */
	s2 = s1;
	CHECK(run_seq(m, &own, &s1, prompt, KS_PROMPT, 64, false, lp) == 0 &&
	          run_seq(m, &mir, &s2, prompt, KS_PROMPT, 64, false, lp) == 0,
	      "prefill");
	CHECK(model_kv_download(&own, back, s1.blocks, 2, &e) == 0, "download: %s", e.msg);
	CHECK(memcmp(back, inplace, bytes) == 0, "downloaded blocks differ from in-place prefill");
	printf("prefill in own pool + download: mirror bit-identical to prefill in place\n");
	model_kv_fini(&own);
	model_kv_fini(&mir);
	free(mirror);
	free(back);
	free(inplace);
	free(lp);
	free(la);
	free(lb);
	model_destroy(m);
	printf("%s\n", n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
