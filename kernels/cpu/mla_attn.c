/* MLA attention of one query head over a list of cached keys, in the absorbed ("MQA") form
 * (MODEL-SPEC.md §2.4 steps 8-10): q = [q_abs (C) | q_rope (R)], key t = [c_t (C) | k_r,t (R)],
 * s_t = scale * (q_abs . c_t + q_rope . k_r,t), P = softmax(s) in fp32, out = sum_t P_t c_t (C).
 * The caller applies W_UV to `out`. Keys are given as row pointers into the paged cache (fp32 or
 * bf16 rows of C + R values), so the kernel does not know about blocks. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

static float dot_f32(const float *a, const float *b, int64_t n)
{
	/* 8 partial sums: vectorizable without -ffast-math, and less rounding than one chain */
	float s[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += a[i + j] * b[i + j];
	float r = 0;
	for (; i < n; i++)
		r += a[i] * b[i];
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + r;
}

static float dot_bf16(const float *a, const uint16_t *b, int64_t n)
{
	float s[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += a[i + j] * kbf16_to_f32(b[i + j]);
	float r = 0;
	for (; i < n; i++)
		r += a[i] * kbf16_to_f32(b[i]);
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + r;
}

float kcpu_kv_dot(const float *a, const void *row, int bf16, int64_t n)
{
	return bf16 ? dot_bf16(a, row, n) : dot_f32(a, row, n);
}

void kcpu_mla_attn_head(const float *q, int64_t C, int64_t R, const void *const *keys, int n_keys, int key_bf16,
			float scale, float *scores, float *out)
{
	float mx = -INFINITY;
	for (int t = 0; t < n_keys; t++) {
		float s;
		if (key_bf16) {
			const uint16_t *k = keys[t];
			s = dot_bf16(q, k, C) + dot_bf16(q + C, k + C, R);
		} else {
			const float *k = keys[t];
			s = dot_f32(q, k, C) + dot_f32(q + C, k + C, R);
		}
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
		if (key_bf16) {
			const uint16_t *k = keys[t];
			for (int64_t i = 0; i < C; i++)
				out[i] += p * kbf16_to_f32(k[i]);
		} else {
			const float *k = keys[t];
			for (int64_t i = 0; i < C; i++)
				out[i] += p * k[i];
		}
	}
}
