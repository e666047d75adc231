/* Token sampling from a logits row: greedy, temperature, top-k, top-p, min-p, repetition /
 * frequency / presence penalties, a seeded per-request RNG (state owned by the caller, so a
 * request is reproducible no matter how it is batched), and log-probabilities of the chosen token
 * and the top-n alternatives (OpenAI `logprobs`).
 *
 * Order of operations (as in the common serving engines): penalties on the raw logits ->
 * greedy (if temperature == 0 or greedy) | temperature -> top-k -> top-p -> min-p -> draw.
 * Reported log-probabilities are log_softmax of the logits after penalties and before
 * temperature/truncation (the model's distribution as the request shaped it). */
#ifndef TANDEM_MODEL_SAMPLE_H
#define TANDEM_MODEL_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define SAMPLE_MAX_LOGPROBS 20

struct sample_params {
	bool greedy; /* argmax (ties -> lowest id); also when temperature == 0 */
	float temperature; /* > 0 */
	int top_k; /* <= 0: off */
	float top_p; /* >= 1: off */
	float min_p; /* <= 0: off */
	float repetition_penalty; /* 1: off; logit > 0 divided, < 0 multiplied (CTRL rule) */
	float frequency_penalty; /* 0: off; minus count * f */
	float presence_penalty; /* 0: off; minus p if count > 0 */
	bool no_logprob; /* skip the chosen token's logprob (a pass over the vocabulary: set
	                  * it when the request did not ask for logprobs); n_logprobs > 0 wins */
	int n_logprobs; /* top alternatives to report, 0..SAMPLE_MAX_LOGPROBS */
};
void sample_params_default(struct sample_params *p); /* greedy off, temperature 1, all filters off */

/* xoshiro256** state, seeded with splitmix64. */
struct sample_rng {
	uint64_t s[4];
};
void sample_rng_seed(struct sample_rng *r, uint64_t seed);
uint64_t sample_rng_next(struct sample_rng *r);
double sample_rng_uniform(struct sample_rng *r); /* [0, 1) with 53 bits */

struct sample_result {
	int32_t token;
	float logprob; /* of token; NAN when no_logprob (and n_logprobs == 0) */
	int n_top;
	int32_t top_ids[SAMPLE_MAX_LOGPROBS]; /* descending by logprob */
	float top_logprobs[SAMPLE_MAX_LOGPROBS];
};

/* Scratch for one call (reusable): sized for a vocabulary. */
struct sample_work {
	int64_t n_vocab;
	float *logits; /* n_vocab */
	float *probs; /* n_vocab */
	int32_t *idx; /* n_vocab */
	int32_t *counts; /* n_vocab */
};
int sample_work_init(struct sample_work *w, int64_t n_vocab) TD_MUST_CHECK;
void sample_work_fini(struct sample_work *w);

/* Samples one token from logits[0..n_vocab). history[0..n_history) are the token ids the
 * penalties count (the caller decides whether the prompt is included). Ids outside the vocab in
 * history are ignored. Returns 0, or -EINVAL for bad parameters (message in e). */
int sample_token(const struct sample_params *p, struct sample_rng *rng, struct sample_work *w,
                 const float *logits, int64_t n_vocab, const int32_t *history, int64_t n_history,
                 struct sample_result *out, struct errbuf *e) TD_MUST_CHECK;

#endif
