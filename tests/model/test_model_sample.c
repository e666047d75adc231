/* Sampling (common/model/sample.c) against independently computed expectations: greedy and its
 * tie rule, reproducibility per seed, empirical frequencies vs softmax(l / T) (20000 draws,
 * +-0.015), top-k / top-p / min-p supports and ratios, the three penalties (checked through the
 * reported log-probabilities), logprobs normalisation and ordering, and parameter errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/model/sample.h"

static int n_fail;
#define CHECK(c, ...)                                                                                        \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			printf("FAIL line %d: ", __LINE__);                                                  \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

#define V 6
static const float L[V] = {2.0f, 1.5f, 0.5f, -1.0f, 2.0f, -3.0f};

static void freqs(const struct sample_params *p, uint64_t seed, int n, double *f)
{
	struct sample_rng r;
	struct sample_work w;
	struct sample_result res;
	sample_rng_seed(&r, seed);
	if (sample_work_init(&w, V))
		return;
	memset(f, 0, sizeof(double) * V);
	for (int i = 0; i < n; i++) {
		if (sample_token(p, &r, &w, L, V, NULL, 0, &res, NULL))
			break;
		f[res.token] += 1.0 / n;
	}
	sample_work_fini(&w);
}

static void softmax(const float *l, double T, const int *keep, double *out)
{
	double s = 0;
	for (int i = 0; i < V; i++)
		s += keep[i] ? exp(l[i] / T) : 0;
	for (int i = 0; i < V; i++)
		out[i] = keep[i] ? exp(l[i] / T) / s : 0;
}

static void check_dist(const char *what, const double *f, const double *want)
{
	double worst = 0;
	for (int i = 0; i < V; i++)
		worst = fabs(f[i] - want[i]) > worst ? fabs(f[i] - want[i]) : worst;
	printf("%-34s max |freq - expected| = %.4f\n", what, worst);
	CHECK(worst < 0.015, "%s: frequencies off by %g", what, worst);
}

int main(void)
{
	struct sample_params p;
	struct sample_work w;
	struct sample_rng r;
	struct sample_result res;
	double f[V], want[V];
	int all[V] = {1, 1, 1, 1, 1, 1};
	if (sample_work_init(&w, V))
		return 1;

	/* greedy: ties (ids 0 and 4 both 2.0) go to the lower id */
	sample_params_default(&p);
	p.greedy = true;
	sample_rng_seed(&r, 1);
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, NULL) == 0 && res.token == 0, "greedy picked %d",
	      res.token);
	p.greedy = false;
	p.temperature = 0;
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, NULL) == 0 && res.token == 0,
	      "temperature 0 picked %d", res.token);

	/* a NaN or +inf logit is an error that says so; -inf (a mask) is not */
	{
		float bad[V];
		struct errbuf eb = {0};
		memcpy(bad, L, sizeof(bad));
		bad[3] = NAN;
		sample_params_default(&p);
		p.greedy = true;
		CHECK(sample_token(&p, &r, &w, bad, V, NULL, 0, &res, &eb) == ERR_FORMAT &&
		          strstr(eb.msg, "token 3 is NaN"),
		      "NaN logit: %s", eb.msg);
		bad[3] = INFINITY;
		p.greedy = false;
		CHECK(sample_token(&p, &r, &w, bad, V, NULL, 0, &res, &eb) == ERR_FORMAT &&
		          strstr(eb.msg, "token 3 is +inf"),
		      "+inf logit: %s", eb.msg);
		bad[3] = -INFINITY;
		p.greedy = true;
		CHECK(sample_token(&p, &r, &w, bad, V, NULL, 0, &res, NULL) == 0 && res.token == 0,
		      "-inf logit (a mask) refused or wrong pick %d", res.token);
	}

	/* reproducible per seed, different across seeds */
	sample_params_default(&p);
	int seq1[64], seq2[64], seq3[64];
	for (int s = 0; s < 3; s++) {
		sample_rng_seed(&r, s == 2 ? 43 : 42);
		for (int i = 0; i < 64; i++) {
			CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, NULL) == 0, "sample failed");
			(s == 0 ? seq1 : s == 1 ? seq2 : seq3)[i] = res.token;
		}
	}
	CHECK(memcmp(seq1, seq2, sizeof(seq1)) == 0, "same seed gave different tokens");
	CHECK(memcmp(seq1, seq3, sizeof(seq1)) != 0, "different seeds gave identical 64 tokens");

	/* temperature */
	sample_params_default(&p);
	freqs(&p, 7, 20000, f);
	softmax(L, 1.0, all, want);
	check_dist("T=1", f, want);
	p.temperature = 0.5f;
	freqs(&p, 8, 20000, f);
	softmax(L, 0.5, all, want);
	check_dist("T=0.5", f, want);
	/* top-k 3: ids 0, 4 (2.0) and 1 (1.5) */
	sample_params_default(&p);
	p.top_k = 3;
	freqs(&p, 9, 20000, f);
	int k3[V] = {1, 1, 0, 0, 1, 0};
	softmax(L, 1.0, k3, want);
	check_dist("top_k=3", f, want);
	/* top-p: probs (T=1) .346 .346 .210 .077 .017 .002 (sorted); 0.6 -> ids 0 and 4 */
	sample_params_default(&p);
	p.top_p = 0.6f;
	freqs(&p, 10, 20000, f);
	int kp[V] = {1, 0, 0, 0, 1, 0};
	softmax(L, 1.0, kp, want);
	check_dist("top_p=0.6", f, want);
	/* min-p 0.5: keep p >= 0.5 * p_max -> logit >= 2 - ln 2 = 1.307: ids 0, 4, 1 */
	sample_params_default(&p);
	p.min_p = 0.5f;
	freqs(&p, 11, 20000, f);
	softmax(L, 1.0, k3, want);
	check_dist("min_p=0.5", f, want);

	/* penalties, seen through logprobs: history 0,0,3 */
	int32_t hist[3] = {0, 0, 3};
	float pl[V];
	memcpy(pl, L, sizeof(pl));
	pl[0] =
	    2.0f / 2.0f - 2 * 0.25f - 0.5f; /* repetition 2 (positive: divide), freq 0.25 x2, presence 0.5 */
	pl[3] = -1.0f * 2.0f - 0.25f - 0.5f; /* negative: multiply */
	sample_params_default(&p);
	p.greedy = true;
	p.repetition_penalty = 2.0f;
	p.frequency_penalty = 0.25f;
	p.presence_penalty = 0.5f;
	p.n_logprobs = V;
	CHECK(sample_token(&p, &r, &w, L, V, hist, 3, &res, NULL) == 0, "penalised sample failed");
	double lse = 0;
	for (int i = 0; i < V; i++)
		lse += exp(pl[i]);
	lse = log(lse);
	double worst = 0, tot = 0;
	for (int i = 0; i < res.n_top; i++) {
		worst = fmax(worst, fabs(res.top_logprobs[i] - (pl[res.top_ids[i]] - lse)));
		tot += exp(res.top_logprobs[i]);
		if (i)
			CHECK(res.top_logprobs[i] <= res.top_logprobs[i - 1], "logprobs not descending");
	}
	printf("%-34s max |logprob - expected| = %.2g, sum p = %.6f, token %d\n", "penalties + logprobs",
	       worst, tot, res.token);
	CHECK(res.n_top == V && worst < 1e-5 && fabs(tot - 1) < 1e-5, "penalised logprobs wrong");
	CHECK(res.token == 4, "with id 0 penalised, greedy should pick 4, got %d", res.token);
	CHECK(fabs(res.logprob - (pl[4] - lse)) < 1e-5, "chosen logprob wrong");

	/* a wide nucleus (more than the first 256 candidates the sampler sorts): 5000 tokens with
	 * slowly decreasing logits, top_p 0.5. Expected set from a full sort here. */
	{
		enum { BV = 5000 };
		float *bl = malloc(sizeof(float) * BV);
		int *seen = calloc(BV, sizeof(int));
		double *pp = malloc(sizeof(double) * BV);
		struct sample_work bw;
		for (int i = 0; i < BV; i++)
			bl[(i * 7919) % BV] = -0.0005f * (float)i; /* permuted so id order != score order */
		double z = 0;
		for (int i = 0; i < BV; i++)
			z += exp(bl[i]);
		/* nucleus: sort ids by logit desc (id asc on ties) */
		int *ord = malloc(sizeof(int) * BV);
		for (int i = 0; i < BV; i++)
			ord[i] = (i * 7919) % BV; /* by construction ord[i] has the i-th best logit */
		int nuc = 0;
		for (double c = 0; nuc < BV && c < 0.5; nuc++)
			c += exp(bl[ord[nuc]]) / z;
		int in_nuc_ok = 1, distinct = 0;
		int *rank = malloc(sizeof(int) * BV);
		for (int i = 0; i < BV; i++)
			rank[ord[i]] = i;
		if (sample_work_init(&bw, BV) == 0) {
			sample_params_default(&p);
			p.top_p = 0.5f;
			sample_rng_seed(&r, 5);
			for (int it = 0; it < 20000; it++) {
				if (sample_token(&p, &r, &bw, bl, BV, NULL, 0, &res, NULL))
					break;
				in_nuc_ok &= rank[res.token] < nuc;
				distinct += !seen[res.token]++;
			}
			sample_work_fini(&bw);
		}
		printf("%-34s nucleus %d of %d tokens, %d distinct sampled, all inside: %s\n",
		       "top_p=0.5 over 5000", nuc, BV, distinct, in_nuc_ok ? "yes" : "NO");
		CHECK(in_nuc_ok && nuc > 1000 && distinct > nuc * 3 / 4, "wide top-p wrong");
		free(bl);
		free(seen);
		free(pp);
		free(ord);
		free(rank);
	}
	/* speed at a real vocabulary (154880): printed, not asserted */
	{
		enum { RV = 154880 };
		float *rl = malloc(sizeof(float) * RV);
		struct sample_work rw;
		for (int i = 0; i < RV; i++)
			rl[i] = 14.0f * (float)sin(i * 12.9898) * (float)cos(i * 0.7);
		if (sample_work_init(&rw, RV) == 0) {
			const char *names[4] = {"T=0.8", "T=0.8 top_p=0.95", "T=0.8 top_k=50",
			                        "greedy + 5 logprobs"};
			for (int c = 0; c < 4; c++) {
				sample_params_default(&p);
				p.temperature = 0.8f;
				p.top_p = c == 1 ? 0.95f : 1.0f;
				p.top_k = c == 2 ? 50 : 0;
				p.greedy = c == 3;
				p.n_logprobs = c == 3 ? 5 : 0;
				p.no_logprob = c != 3;
				struct timespec t0, t1;
				clock_gettime(CLOCK_MONOTONIC, &t0);
				for (int it = 0; it < 20; it++)
					CHECK(sample_token(&p, &r, &rw, rl, RV, NULL, 0, &res, NULL) == 0,
					      "sample at vocab 154880");
				clock_gettime(CLOCK_MONOTONIC, &t1);
				printf("vocab 154880, %-22s %.2f ms per token\n", names[c],
				       ((double)(t1.tv_sec - t0.tv_sec) * 1e3 +
				        (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) /
				           20);
			}
			sample_work_fini(&rw);
		}
		free(rl);
	}

	/* no_logprob: the same token, logprob not computed */
	sample_params_default(&p);
	p.greedy = true;
	p.no_logprob = true;
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, NULL) == 0 && res.token == 0 &&
	          isnan(res.logprob),
	      "no_logprob: token %d logprob %g", res.token, res.logprob);
	p.no_logprob = false;
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, NULL) == 0 &&
	          fabs(res.logprob -
	               (2.0 - log(2 * exp(2.0) + exp(1.5) + exp(0.5) + exp(-1.0) + exp(-3.0)))) < 1e-5,
	      "default computes the logprob: %g", res.logprob);

	/* bad parameters */
	sample_params_default(&p);
	p.top_p = 0;
	struct errbuf e = {0};
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, &e) == -EINVAL && strstr(e.msg, "top_p"),
	      "top_p 0 accepted");
	sample_params_default(&p);
	p.temperature = -1;
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, &e) == -EINVAL, "negative temperature accepted");
	sample_params_default(&p);
	p.n_logprobs = 21;
	CHECK(sample_token(&p, &r, &w, L, V, NULL, 0, &res, &e) == -EINVAL, "21 logprobs accepted");
	sample_work_fini(&w);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
