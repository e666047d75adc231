/* DSA lightning-indexer scores of one query over a list of cached indexer keys (MODEL-SPEC.md
 * §2.6 step 7): score_t = sum_h w_h * ReLU(scale * q_h . k_t), with w already multiplied by
 * HI^-0.5 and scale = DI^-0.5, all in fp32 (the order of the reference). Keys are row pointers into
 * the paged cache (fp32 or bf16 rows of DI values). */
#include "kernels/kernels.h"

void kcpu_indexer_scores(const float *q, const float *w, int64_t HI, int64_t DI, const void *const *keys,
                         int n_keys, int key_bf16, float scale, float *scores)
{
	for (int t = 0; t < n_keys; t++) {
		float s = 0;
		for (int64_t h = 0; h < HI; h++) {
			float d = kcpu_kv_dot(q + h * DI, keys[t], key_bf16, DI) * scale;
			if (d > 0)
				s += w[h] * d;
		}
		scores[t] = s;
	}
}
