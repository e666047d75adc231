/* tandem-prefill's loop side: configuration, the control session with the router, admission and
 * validation of prefill requests, cancellation, results back to the router, metrics, drain. */
#ifndef TANDEM_PREFILL_WORKER_H
#define TANDEM_PREFILL_WORKER_H

#include <stdbool.h>

struct pf_config {
	char name[65];
	char router[256];
	char auth_token[257];
	char auth_token_file[1024];
	char metrics[256];
	char model[1024];
	char engine[16]; /* "model" | "trivial" */
	char kv_dtype[8]; /* "f32" | "bf16" */
	char ucx_tls[128];
	char ucx_net_devices[128];
	char ready_file[1024];
	char log_level[8];
	bool ucx_want_rdma;
	bool ucx_peer_failure;
	int threads;
	int tp;
	int local_blocks;
	int max_tokens_per_step;
	int max_batch;
	int max_queued_tokens;
	int heartbeat_ms;
	int flush_timeout_ms;
	int drain_timeout_ms;
	int trivial_step_us;
	/* compute backend (docs/workers.md, "GPUs") */
	char backend[8]; /* "cpu" | "cuda" */
	int device; /* CUDA device */
	double mem_fraction; /* CUDA: share of free device memory the workspaces may take (0: 0.9) */
	int max_seq_len; /* longest prompt taken (0: the model's context; cuda: 4096) */
	bool kv_staged; /* CPU: compute into a pool apart from the UCX-registered one (tests the CUDA path) */
};

void pf_config_default(struct pf_config *c);
/* Runs until drained or a fatal error; returns the process exit code. */
int pf_worker_run(const struct pf_config *c);

#endif
