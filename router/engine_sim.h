/* Simulated prefill and decode workers inside the router process (`--engine sim`). They speak the
 * worker_ops interface with timers standing in for compute, generate deterministic byte tokens
 * (greedy: a fixed text from an offset that depends on the prompt; sampled: a seeded choice) and
 * keep a real block pool, so the HTTP/API layer, the scheduler, cancellation and metrics can be
 * tested and benchmarked without a model. Never used when real workers are configured. */
#ifndef TANDEM_ROUTER_ENGINE_SIM_H
#define TANDEM_ROUTER_ENGINE_SIM_H

#include <uv.h>

#include "router/sched.h"

struct sim_config {
	int n_prefill;
	int n_decode;
	uint32_t n_blocks; /* per decode worker */
	uint32_t block_size;
	uint32_t n_running_max; /* per decode worker; 0: no limit */
	double prefill_us_per_token;
	double transfer_ms;
	double step_ms; /* one decode step for all running sequences */
	const char *model_id;
};

struct engine_sim;

int engine_sim_create(struct engine_sim **out, uv_loop_t *loop, struct sched *s, const struct sim_config *cfg,
                      struct errbuf *e) TD_MUST_CHECK;
/* Simulates the death of a worker (by role and index): its requests are handed to the
 * scheduler's lost-worker path. */
int engine_sim_kill(struct engine_sim *es, enum worker_role role, int index) TD_MUST_CHECK;
/* Number of sequences the simulated workers still hold (reservations, prefills, decodes). */
uint32_t engine_sim_n_held(const struct engine_sim *es);
void engine_sim_destroy(struct engine_sim *es); /* accepts NULL; run the loop afterwards */

/* The token the simulator emits at step `pos` for a prompt hash, shared with tests that check
 * greedy output independently. */
int32_t engine_sim_greedy_token(uint64_t prompt_hash, uint32_t pos);
uint64_t engine_sim_prompt_hash(const int32_t *ids, uint32_t n);

#endif
