/* Deterministic top-k selection for the DSA indexer: the k best entries under the total order
 * "score descending, then index ascending" (ties go to the LOWER position, the rule of the
 * reference outputs, testdata README §5). NaN scores rank below everything. Output: the chosen
 * indices in ascending order. O(n log k) with a heap holding the current worst at the root. */
#include <math.h>

#include "kernels/kernels.h"

/* true if (a) ranks worse than (b) */
static int worse(const float *s, int32_t a, int32_t b)
{
	float sa = s[a], sb = s[b];
	if (isnan(sa))
		sa = -INFINITY;
	if (isnan(sb))
		sb = -INFINITY;
	if (sa != sb)
		return sa < sb;
	return a > b;
}

static void sift_down(const float *s, int32_t *h, int n, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && worse(s, h[l], h[m]))
			m = l;
		if (r < n && worse(s, h[r], h[m]))
			m = r;
		if (m == i)
			return;
		int32_t t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void sort_asc(int32_t *v, int n)
{
	/* insertion sort for short lists, heap sort otherwise */
	if (n <= 32) {
		for (int i = 1; i < n; i++) {
			int32_t x = v[i];
			int j = i - 1;
			for (; j >= 0 && v[j] > x; j--)
				v[j + 1] = v[j];
			v[j + 1] = x;
		}
		return;
	}
	for (int i = n / 2 - 1; i >= 0; i--)
		for (int p = i;;) {
			int l = 2 * p + 1, r = l + 1, m = p;
			if (l < n && v[l] > v[m])
				m = l;
			if (r < n && v[r] > v[m])
				m = r;
			if (m == p)
				break;
			int32_t t = v[p];
			v[p] = v[m];
			v[m] = t;
			p = m;
		}
	for (int end = n - 1; end > 0; end--) {
		int32_t t = v[0];
		v[0] = v[end];
		v[end] = t;
		for (int p = 0;;) {
			int l = 2 * p + 1, r = l + 1, m = p;
			if (l < end && v[l] > v[m])
				m = l;
			if (r < end && v[r] > v[m])
				m = r;
			if (m == p)
				break;
			int32_t u = v[p];
			v[p] = v[m];
			v[m] = u;
			p = m;
		}
	}
}

int kcpu_topk(const float *scores, int n, int k, int32_t *out)
{
	if (k > n)
		k = n;
	if (k <= 0)
		return 0;
	for (int i = 0; i < k; i++)
		out[i] = i;
	for (int i = k / 2 - 1; i >= 0; i--)
		sift_down(scores, out, k, i);
	for (int i = k; i < n; i++) {
		if (worse(scores, out[0], i)) {
			out[0] = i;
			sift_down(scores, out, k, 0);
		}
	}
	sort_asc(out, k);
	return k;
}
