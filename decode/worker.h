/* tandem-decode's loop side: configuration, the control session with the router, KV
 * reservations (reserve before prefill, release exactly once), KvReady checks, token streaming,
 * Finish, cancellation, deadlines, UCX progress for incoming puts, metrics, drain. */
#ifndef TANDEM_DECODE_WORKER_H
#define TANDEM_DECODE_WORKER_H

#include <stdbool.h>

struct dc_config {
	char name[65];
	char router[256];
	char auth_token[257];
	char auth_token_file[1024];
	char metrics[256];
	char model[1024];
	char engine[16];
	char kv_dtype[8];
	char ucx_tls[128];
	char ucx_net_devices[128];
	char ready_file[1024];
	char log_level[8];
	bool ucx_want_rdma;
	bool verify_checksums;
	int threads;
	int tp;
	int kv_blocks;
	int max_batch;
	int max_seq_len; /* 0: the model's context length */
	int default_max_tokens;
	int reserve_timeout_ms;
	int quarantine_ms; /* released-before-KvReady blocks without a prefill fence: reused after this */
	int heartbeat_ms;
	int drain_timeout_ms;
	int trivial_step_us;
	/* compute backend (docs/workers.md, "GPUs") */
	char backend[8]; /* "cpu" | "cuda" */
	int device; /* CUDA device */
	int graphs; /* CUDA decode graphs: 0 off, 1 on, 2 padded eager (tests) */
	double mem_fraction; /* CUDA: share of free device memory the workspaces may take (0: 0.9) */
	bool kv_staged; /* CPU: keep the model's KV pool apart from the UCX pool (tests the CUDA path) */
	int kv_upload_step_kb; /* staged KV: prompt KV uploaded per decode step at most (0: no limit) */
};

void dc_config_default(struct dc_config *c);
int dc_worker_run(const struct dc_config *c);

#endif
