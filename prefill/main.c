/* build/tandem-prefill: reads the configuration (JSON file + flags) and runs the prefill worker
 * (prefill/worker.c). */
#include <stdio.h>

#include "common/base/log.h"
#include "common/net/opts.h"
#include "prefill/worker.h"

int main(int argc, char **argv)
{
	struct pf_config c;
	pf_config_default(&c);
	const struct opt table[] = {
	    {"name", OPT_STR, c.name, sizeof(c.name), 0, 0,
	     "worker name (unique per router; in logs and metrics)"},
	    {"router", OPT_STR, c.router, sizeof(c.router), 0, 0,
	     "router control address: host:port or unix:/path"},
	    {"auth_token", OPT_STR, c.auth_token, sizeof(c.auth_token), 0, 0,
	     "shared token the router requires (or \"\")"},
	    {"auth_token_file", OPT_STR, c.auth_token_file, sizeof(c.auth_token_file), 0, 0,
	     "file whose first line is the shared token (overrides auth_token)"},
	    {"metrics", OPT_STR, c.metrics, sizeof(c.metrics), 0, 0,
	     "host:port for /metrics /health /ready (port 0: any; \"\": off)"},
	    {"model", OPT_STR, c.model, sizeof(c.model), 0, 0,
	     "GGUF model file (first shard of a split model)"},
	    {"engine", OPT_STR, c.engine, sizeof(c.engine), 0, 0,
	     "\"model\" or \"trivial\" (no model: serving-plane benchmarks)"},
	    {"kv_dtype", OPT_STR, c.kv_dtype, sizeof(c.kv_dtype), 0, 0,
	     "KV cache element type: f32 or bf16 (must match decode)"},
	    {"threads", OPT_INT, &c.threads, 0, 1, 1024, "CPU threads for the forward pass"},
	    {"tp", OPT_INT, &c.tp, 0, 1, 64, "tensor-parallel degree"},
	    {"local_blocks", OPT_INT, &c.local_blocks, 0, 1, 1 << 24,
	     "local KV blocks (64 tokens each) for prompts in progress"},
	    {"max_tokens_per_step", OPT_INT, &c.max_tokens_per_step, 0, 1, 1 << 20,
	     "token budget per prefill step (chunk size)"},
	    {"max_batch", OPT_INT, &c.max_batch, 0, 1, 256, "requests in one prefill step at most"},
	    {"max_queued_tokens", OPT_INT, &c.max_queued_tokens, 0, 1, 1 << 30,
	     "prompt tokens queued at most (then NO_CAPACITY)"},
	    {"ucx_tls", OPT_STR, c.ucx_tls, sizeof(c.ucx_tls), 0, 0,
	     "UCX transports (UCX_TLS), \"\" = UCX default"},
	    {"ucx_net_devices", OPT_STR, c.ucx_net_devices, sizeof(c.ucx_net_devices), 0, 0,
	     "UCX devices (UCX_NET_DEVICES), \"\" = default"},
	    {"ucx_want_rdma", OPT_BOOL, &c.ucx_want_rdma, 0, 0, 0,
	     "warn loudly when KV transfers do not use RDMA"},
	    {"ucx_peer_failure", OPT_BOOL, &c.ucx_peer_failure, 0, 0, 0,
	     "ask UCX for keepalive-based peer-failure detection on KV endpoints (tcp/rdma only; off by "
	     "default: it made UCX skip shared memory)"},
	    {"heartbeat_ms", OPT_INT, &c.heartbeat_ms, 0, 10, 60000, "heartbeat interval to the router"},
	    {"flush_timeout_ms", OPT_INT, &c.flush_timeout_ms, 0, 10, 600000,
	     "deadline for a KV transfer to complete"},
	    {"drain_timeout_ms", OPT_INT, &c.drain_timeout_ms, 0, 0, 3600000,
	     "SIGTERM: time to finish in-flight prompts"},
	    {"trivial_step_us", OPT_INT, &c.trivial_step_us, 0, 0, 10000000,
	     "trivial engine: simulated compute per step"},
	    {"backend", OPT_STR, c.backend, sizeof(c.backend), 0, 0, "compute backend: cpu or cuda"},
	    {"device", OPT_INT, &c.device, 0, 0, 1023, "CUDA device (backend cuda)"},
	    {"mem_fraction", OPT_DOUBLE, &c.mem_fraction, 0, 0, 0,
	     "CUDA: share of the free device memory the workspaces may use (0: 0.9)"},
	    {"max_seq_len", OPT_INT, &c.max_seq_len, 0, 0, 1 << 30,
	     "longest prompt taken (0: the model's context; with backend cuda 4096 unless set: the device "
	     "workspaces are sized for it)"},
	    {"kv_staged", OPT_BOOL, &c.kv_staged, 0, 0, 0,
	     "compute the KV into a pool apart from the UCX-registered staging copy (always on with cuda; "
	     "on the CPU it tests that path)"},
	    {"ready_file", OPT_STR, c.ready_file, sizeof(c.ready_file), 0, 0,
	     "write {pid, metrics_port} here once registered (tests)"},
	    {"log_level", OPT_STR, c.log_level, sizeof(c.log_level), 0, 0, "error, warn, info or debug"},
	};
	struct errbuf e = {0};
	int rc = opts_parse(table, (int)(sizeof(table) / sizeof(table[0])), argc, argv,
	                    "tandem-prefill [--config prefill.json] [--key value ...]", &e);
	int code;
	if (opts_worker_start("tandem-prefill", "prefill", rc, &e, c.log_level, c.auth_token_file,
	                      c.auth_token, sizeof(c.auth_token), &code))
		return code;
	return pf_worker_run(&c);
}
