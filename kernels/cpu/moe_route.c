/* MoE router of one token (MODEL-SPEC.md §2.7): gate probabilities (sigmoid, or softmax for
 * gating 1) from the fp32 router logits, correction bias added for SELECTION only, group limit
 * (group score = sum of the group's two best biased scores; the best n_group_used groups stay),
 * top-k, weights from the unbiased probabilities, optionally normalised (sum + 1e-20), times the
 * routed scaling factor. Experts of dropped groups get a selection score of 0.0 (not -inf), as the
 * reference (transformers) does. Ties go to the lower expert id. ids/weights come out in selection
 * order (best first). scratch: 2*E floats. */
#include <math.h>

#include "kernels/kernels.h"

void kcpu_moe_route(const float *logits, const float *bias, int E, int k, int n_group, int n_group_used,
                    int gating, bool norm, float scale, int32_t *ids, float *weights, float *scratch)
{
	float *p = scratch, *sel = scratch + E;
	if (gating == 1) {
		float mx = -INFINITY;
		for (int e = 0; e < E; e++)
			mx = logits[e] > mx ? logits[e] : mx;
		double sum = 0;
		for (int e = 0; e < E; e++) {
			p[e] = expf(logits[e] - mx);
			sum += p[e];
		}
		for (int e = 0; e < E; e++)
			p[e] = (float)(p[e] / sum);
	} else {
		for (int e = 0; e < E; e++)
			p[e] = 1.0f / (1.0f + expf(-logits[e]));
	}
	for (int e = 0; e < E; e++)
		sel[e] = p[e] + (bias ? bias[e] : 0.0f);
	if (n_group > 1 && n_group_used < n_group) {
		int gs = E / n_group;
		float gscore[256];
		bool keep[256] = {0};
		for (int g = 0; g < n_group && g < 256; g++) {
			float b1 = -INFINITY, b2 = -INFINITY;
			for (int j = 0; j < gs; j++) {
				float v = sel[g * gs + j];
				if (v > b1) {
					b2 = b1;
					b1 = v;
				} else if (v > b2) {
					b2 = v;
				}
			}
			gscore[g] = b1 + b2;
		}
		for (int i = 0; i < n_group_used; i++) {
			int best = -1;
			for (int g = 0; g < n_group; g++)
				if (!keep[g] && (best < 0 || gscore[g] > gscore[best]))
					best = g;
			keep[best] = true;
		}
		for (int g = 0; g < n_group; g++)
			if (!keep[g])
				for (int j = 0; j < gs; j++)
					sel[g * gs + j] = 0.0f;
	}
	double sum = 0;
	for (int i = 0; i < k; i++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			bool taken = false;
			for (int j = 0; j < i && !taken; j++)
				taken = ids[j] == e;
			if (!taken && (best < 0 || sel[e] > sel[best]))
				best = e;
		}
		ids[i] = best;
		weights[i] = p[best];
		sum += p[best];
	}
	for (int i = 0; i < k; i++) {
		float w = weights[i];
		if (norm)
			w = (float)(w / (sum + 1e-20));
		weights[i] = w * scale;
	}
}
