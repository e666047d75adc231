/* Helpers of the KV staging tests (test_model_kv_stage.c on the CPU, test_gpu_workers.c on the
 * CUDA backend): a prompt prefilled into one pool, its blocks moved to another pool through a host
 * mirror (model_kv_download / model_kv_upload, what the workers do around the UCX put), then the
 * same decode steps on both sides. */
#ifndef TANDEM_TESTS_MODEL_KV_STAGE_H
#define TANDEM_TESTS_MODEL_KV_STAGE_H

#include "tests/model/refs.h"

#define KS_PROMPT 100 /* two blocks: a full one and a partial one */
#define KS_STEPS 6

static inline void ks_prompt(int32_t *ids, int n, int64_t vocab)
{
	uint32_t x = 12345;
	for (int i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		ids[i] = (int32_t)(3 + (x >> 8) % (uint32_t)(vocab - 3));
	}
}

/* KS_STEPS decode steps of sequence s, feeding feed[t] (NULL: the argmax of the previous step's
 * logits, starting from first); logits of step t into lg + t * V. Returns 0 or the forward error. */
static inline int ks_decode(struct model *m, struct model_kv *kv, struct tseq *s, int32_t first,
                            const int32_t *feed, float *lg)
{
	int64_t V = model_hparams(m)->vocab;
	int32_t tok = first;
	for (int t = 0; t < KS_STEPS; t++) {
		int rc = run_seq(m, kv, s, &tok, 1, 1, false, lg + (size_t)t * (size_t)V);
		if (rc)
			return rc;
		tok = feed ? feed[t] : (int32_t)argmax(lg + (size_t)t * (size_t)V, V);
	}
	return 0;
}

/* largest |a - b| over the blocks ids of two host mirrors of f32 KV */
static inline double ks_block_diff(const void *a, const void *b, const int32_t *ids, int n,
                                   size_t block_bytes)
{
	double d = 0;
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)ids[i] * block_bytes;
		double x = max_abs_diff((const float *)((const char *)a + off),
		                        (const float *)((const char *)b + off), block_bytes / sizeof(float));
		d = x > d ? x : d;
	}
	return d;
}

#endif
