/* MLA attention of one query head over a list of cached keys, in the absorbed ("MQA") form
 * (MODEL-SPEC.md §2.4 steps 8-10): q = [q_abs (C) | q_rope (R)], key t = [c_t (C) | k_r,t (R)],
 * s_t = scale * (q_abs . c_t + q_rope . k_r,t), P = softmax(s) in fp32, out = sum_t P_t c_t (C).
 * The caller applies W_UV to `out`. Keys are given as row pointers into the paged cache (fp32 or
 * bf16 rows of C + R values), so the kernel does not know about blocks. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

void kcpu_mla_attn_head(const float *q, int64_t C, int64_t R, const void *const *keys, int n_keys,
                        int key_bf16, float scale, float *scores, float *out)
{
	float mx = -INFINITY;
	for (int t = 0; t < n_keys; t++) {
		float s;
		size_t eb = key_bf16 ? 2 : 4;
		s = kcpu_kv_dot(q, keys[t], key_bf16, C) +
		    kcpu_kv_dot(q + C, (const char *)keys[t] + (size_t)C * eb, key_bf16, R);
		s *= scale;
		scores[t] = s;
		if (s > mx)
			mx = s;
	}
	double sum = 0;
	for (int t = 0; t < n_keys; t++) {
		scores[t] = expf(scores[t] - mx);
		sum += scores[t];
	}
	float inv = (float)(1.0 / sum);
	memset(out, 0, (size_t)C * sizeof(float));
	for (int t = 0; t < n_keys; t++) {
		float p = scores[t] * inv;
		kcpu_kv_axpy(out, p, keys[t], key_bf16, C);
	}
}
