/* Token sampling (sample.h): penalties, greedy, temperature, top-k, top-p, min-p, a seeded
 * xoshiro256** generator whose state the request owns, and log-probabilities for OpenAI logprobs.
 * Candidates are ordered by (logit descending, id ascending), so equal logits resolve the same way
 * on every run and every backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/sample.h"
#include "kernels/kernels.h"

void sample_params_default(struct sample_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temperature = 1.0f;
	p->top_p = 1.0f;
	p->repetition_penalty = 1.0f;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void sample_rng_seed(struct sample_rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t sample_rng_next(struct sample_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

double sample_rng_uniform(struct sample_rng *r)
{
	return (double)(sample_rng_next(r) >> 11) * 0x1.0p-53;
}

int sample_work_init(struct sample_work *w, int64_t n_vocab)
{
	memset(w, 0, sizeof(*w));
	if (n_vocab < 1 || n_vocab > (INT64_C(1) << 30))
		return -EINVAL;
	w->n_vocab = n_vocab;
	w->logits = malloc(sizeof(float) * (size_t)n_vocab);
	w->probs = malloc(sizeof(float) * (size_t)n_vocab);
	w->idx = malloc(sizeof(int32_t) * (size_t)n_vocab);
	w->counts = malloc(sizeof(int32_t) * (size_t)n_vocab);
	if (!w->logits || !w->probs || !w->idx || !w->counts) {
		sample_work_fini(w);
		return -ENOMEM;
	}
	return 0;
}

void sample_work_fini(struct sample_work *w)
{
	free(w->logits);
	free(w->probs);
	free(w->idx);
	free(w->counts);
	memset(w, 0, sizeof(*w));
}

static int cmp_desc(const void *a, const void *b, void *arg)
{
	const float *l = arg;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	if (l[x] != l[y])
		return l[x] > l[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* ids of the n best logits, best first */
static int best_n(const float *l, int64_t V, int n, int32_t *out)
{
	n = kcpu_topk(l, (int)V, n, out);
	qsort_r(out, (size_t)n, sizeof(int32_t), cmp_desc, (void *)l);
	return n;
}

/* (a) ranks before (b): logit descending, then id ascending */
static inline bool before(const float *l, int32_t a, int32_t b)
{
	return l[a] > l[b] || (l[a] == l[b] && a < b);
}

/* Weighted quickselect: reorders idx[0..V) so that idx[0..n) are the n best tokens for the
 * smallest n whose mass (pr by id) reaches `need`; returns n. Expected O(V); the set is exactly
 * the prefix a full sort would give. */
static int64_t nucleus(const float *l, const float *pr, int32_t *idx, int64_t V, double need)
{
	int64_t lo = 0, hi = V;
	double acc = 0;
	while (hi - lo > 1) {
		int64_t mid = lo + (hi - lo) / 2;
		int32_t a = idx[lo], b = idx[mid], c = idx[hi - 1], piv; /* median of three */
		if (before(l, a, b))
			piv = before(l, b, c) ? b : before(l, a, c) ? c : a;
		else
			piv = before(l, a, c) ? a : before(l, b, c) ? c : b;
		int64_t q = lo;
		for (int64_t i = lo; i < hi; i++) /* move the pivot to the end, then Lomuto */
			if (idx[i] == piv) {
				idx[i] = idx[hi - 1];
				idx[hi - 1] = piv;
				break;
			}
		double massl = 0;
		for (int64_t i = lo; i < hi - 1; i++)
			if (before(l, idx[i], piv)) {
				int32_t t = idx[i];
				idx[i] = idx[q];
				idx[q++] = t;
				massl += pr[t];
			}
		idx[hi - 1] = idx[q];
		idx[q] = piv;
		if (acc + massl >= need) {
			hi = q;
		} else if (acc + massl + pr[piv] >= need) {
			return q + 1;
		} else {
			acc += massl + pr[piv];
			lo = q + 1;
		}
	}
	return hi;
}

/* Temperature / top-k / top-p / min-p draw. Without top-k no sort is needed: top-p selects its
 * set with a weighted quickselect and the draw walks the set in that (deterministic) order. */
static int32_t draw(const struct sample_params *p, struct sample_rng *rng, struct sample_work *w,
                    const float *l, int64_t V, float mx)
{
	float inv_t = 1.0f / p->temperature;
	float *pr = w->probs;
	int32_t *idx = w->idx;
	int64_t k = p->top_k > 0 && p->top_k < V ? p->top_k : V, n;
	double tot = 0;
	if (k < V) {
		n = best_n(l, V, (int)k, idx); /* sorted, best first; pr by rank here */
		double z = 0;
		for (int64_t i = 0; i < n; i++)
			z += (pr[i] = expf((l[idx[i]] - l[idx[0]]) * inv_t));
		if (p->top_p < 1.0f) {
			double c = 0;
			for (int64_t i = 0; i < n; i++) {
				c += pr[i] / z;
				if (c >= (double)p->top_p) {
					n = i + 1;
					break;
				}
			}
		}
		int64_t keep = 1;
		while (keep < n && pr[keep] >= p->min_p * pr[0])
			keep++;
		n = keep;
		for (int64_t i = 0; i < n; i++)
			tot += pr[i];
		double u = sample_rng_uniform(rng) * tot, c = 0;
		for (int64_t i = 0; i < n; i++)
			if (u < (c += pr[i]))
				return idx[i];
		return idx[n - 1];
	}
	double z = 0; /* pr by id; the best token has pr = 1 */
	for (int64_t i = 0; i < V; i++) {
		z += (pr[i] = expf((l[i] - mx) * inv_t));
		idx[i] = (int32_t)i;
	}
	n = p->top_p < 1.0f ? nucleus(l, pr, idx, V, (double)p->top_p * z) : V;
	for (int64_t i = 0; i < n; i++)
		if (pr[idx[i]] >= p->min_p)
			tot += pr[idx[i]];
	double u = sample_rng_uniform(rng) * tot, c = 0;
	int32_t last = idx[0];
	for (int64_t i = 0; i < n; i++) {
		float q = pr[idx[i]];
		if (q < p->min_p)
			continue;
		last = idx[i];
		if (u < (c += q))
			return idx[i];
	}
	return last;
}

int sample_token(const struct sample_params *p, struct sample_rng *rng, struct sample_work *w,
                 const float *logits, int64_t V, const int32_t *history, int64_t n_history,
                 struct sample_result *out, struct errbuf *e)
{
	memset(out, 0, sizeof(*out));
	if (V < 1 || V > w->n_vocab)
		return errbuf_set(e, -EINVAL,
		                  "sampling: vocabulary %lld does not fit the work buffers (%lld)",
		                  (long long)V, (long long)w->n_vocab);
	if (!(p->temperature >= 0) || !isfinite(p->temperature))
		return errbuf_set(e, -EINVAL, "sampling: temperature must be >= 0");
	if (!(p->top_p > 0) || !isfinite(p->top_p))
		return errbuf_set(e, -EINVAL, "sampling: top_p must be in (0, 1]");
	if (!(p->min_p >= 0 && p->min_p <= 1))
		return errbuf_set(e, -EINVAL, "sampling: min_p must be in [0, 1]");
	if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
		return errbuf_set(e, -EINVAL, "sampling: repetition_penalty must be > 0");
	if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
		return errbuf_set(e, -EINVAL, "sampling: penalties must be finite");
	if (p->n_logprobs < 0 || p->n_logprobs > SAMPLE_MAX_LOGPROBS)
		return errbuf_set(e, -EINVAL, "sampling: logprobs must be 0..%d", SAMPLE_MAX_LOGPROBS);
	float *l = w->logits;
	memcpy(l, logits, sizeof(float) * (size_t)V);
	bool pen =
	    p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
	if (pen && n_history > 0) {
		for (int64_t i = 0; i < n_history; i++)
			if (history[i] >= 0 && history[i] < V)
				w->counts[history[i]] = 0;
		for (int64_t i = 0; i < n_history; i++)
			if (history[i] >= 0 && history[i] < V)
				w->counts[history[i]]++;
		for (int64_t i = 0; i < n_history; i++) {
			int32_t t = history[i];
			if (t < 0 || t >= V || w->counts[t] <= 0)
				continue; /* outside, or already applied */
			float x = l[t];
			if (p->repetition_penalty != 1.0f)
				x = x > 0 ? x / p->repetition_penalty : x * p->repetition_penalty;
			x -= (float)w->counts[t] * p->frequency_penalty + p->presence_penalty;
			l[t] = x;
			w->counts[t] = -1;
		}
	}
	/* log-softmax of the penalised logits */
	/* NaN or +inf never comes from a healthy forward pass (-inf may be a mask): say so instead of
	 * sampling from garbage (e.g. an activation outside a kernel's fp16 staging range) */
	float mx = -INFINITY;
	for (int64_t i = 0; i < V; i++) {
		if (!(l[i] < INFINITY))
			return errbuf_set(
			    e, ERR_FORMAT,
			    "sampling: the logit of token %lld is %s: the forward pass produced a "
			    "non-finite value (numeric overflow)",
			    (long long)i, isnan(l[i]) ? "NaN" : "+inf");
		mx = l[i] > mx ? l[i] : mx;
	}
	if (!isfinite(mx))
		return errbuf_set(e, -EINVAL, "sampling: no finite logit");
	double lse = 0;
	if (!p->no_logprob || p->n_logprobs > 0) {
		double se = 0;
		for (int64_t i = 0; i < V; i++)
			se += expf(l[i] - mx);
		lse = (double)mx + log(se);
	}

	int32_t tok;
	if (p->greedy || p->temperature == 0.0f || p->top_k == 1) {
		int64_t b = 0;
		for (int64_t i = 1; i < V; i++)
			if (l[i] > l[b])
				b = i;
		tok = (int32_t)b;
	} else {
		tok = draw(p, rng, w, l, V, mx);
	}
	out->token = tok;
	out->logprob = !p->no_logprob || p->n_logprobs > 0 ? (float)((double)l[tok] - lse) : NAN;
	if (p->n_logprobs > 0) {
		out->n_top = best_n(l, V, p->n_logprobs, out->top_ids);
		for (int i = 0; i < out->n_top; i++)
			out->top_logprobs[i] = (float)((double)l[out->top_ids[i]] - lse);
	}
	return 0;
}
