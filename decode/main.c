/* build/tandem-decode: reads the configuration (JSON file + flags) and runs the decode worker
 * (decode/worker.c). */
#include <stdio.h>

#include "common/base/log.h"
#include "common/net/opts.h"
#include "decode/worker.h"

int main(int argc, char **argv)
{
	struct dc_config c;
	dc_config_default(&c);
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
	     "KV cache element type: f32 or bf16 (must match prefill)"},
	    {"threads", OPT_INT, &c.threads, 0, 1, 1024, "CPU threads for the forward pass"},
	    {"tp", OPT_INT, &c.tp, 0, 1, 64, "tensor-parallel degree"},
	    {"kv_blocks", OPT_INT, &c.kv_blocks, 0, 1, 1 << 24, "KV pool size in blocks (64 tokens each)"},
	    {"max_batch", OPT_INT, &c.max_batch, 0, 1, 1024, "sequences decoded together at most"},
	    {"max_seq_len", OPT_INT, &c.max_seq_len, 0, 0, 1 << 30,
	     "context limit (0: the model's; with backend cuda at most 4096 unless set: the device "
	     "workspaces are sized for it)"},
	    {"default_max_tokens", OPT_INT, &c.default_max_tokens, 0, 1, 1 << 30,
	     "max_tokens when a request gives none"},
	    {"reserve_timeout_ms", OPT_INT, &c.reserve_timeout_ms, 0, 10, 3600000,
	     "free a reservation whose KV is not ready by then"},
	    {"kv_quarantine_ms", OPT_INT, &c.quarantine_ms, 0, 10, 86400000,
	     "reuse blocks of a reservation released before KvReady after this even without the prefill's "
	     "fence (must exceed the prefill's write window)"},
	    {"verify_checksums", OPT_BOOL, &c.verify_checksums, 0, 0, 0,
	     "check per-block checksums when prefill sends them"},
	    {"ucx_tls", OPT_STR, c.ucx_tls, sizeof(c.ucx_tls), 0, 0,
	     "UCX transports (UCX_TLS), \"\" = UCX default"},
	    {"ucx_net_devices", OPT_STR, c.ucx_net_devices, sizeof(c.ucx_net_devices), 0, 0,
	     "UCX devices (UCX_NET_DEVICES), \"\" = default"},
	    {"ucx_want_rdma", OPT_BOOL, &c.ucx_want_rdma, 0, 0, 0,
	     "warn loudly when KV transfers do not use RDMA"},
	    {"heartbeat_ms", OPT_INT, &c.heartbeat_ms, 0, 10, 60000, "heartbeat interval to the router"},
	    {"drain_timeout_ms", OPT_INT, &c.drain_timeout_ms, 0, 0, 3600000,
	     "SIGTERM: time to finish running requests"},
	    {"trivial_step_us", OPT_INT, &c.trivial_step_us, 0, 0, 10000000,
	     "trivial engine: simulated compute per step"},
	    {"backend", OPT_STR, c.backend, sizeof(c.backend), 0, 0, "compute backend: cpu or cuda"},
	    {"device", OPT_INT, &c.device, 0, 0, 1023, "CUDA device (backend cuda)"},
	    {"graphs", OPT_INT, &c.graphs, 0, 0, 2,
	     "CUDA decode graphs: 1 capture and replay, 0 off (eager), 2 padded eager (tests)"},
	    {"mem_fraction", OPT_DOUBLE, &c.mem_fraction, 0, 0, 0,
	     "CUDA: share of the free device memory the workspaces may use (0: 0.9)"},
	    {"kv_staged", OPT_BOOL, &c.kv_staged, 0, 0, 0,
	     "keep the model's KV pool apart from the UCX pool and copy prompt blocks at join (always on "
	     "with cuda; on the CPU it tests that path)"},
	    {"kv_upload_step_kb", OPT_INT, &c.kv_upload_step_kb, 0, 0, 1 << 30,
	     "staged KV: KiB of prompt KV copied into the model's pool per decode step at most (bounds the "
	     "delay a long prompt's upload adds to the running batch; 0: no limit)"},
	    {"ready_file", OPT_STR, c.ready_file, sizeof(c.ready_file), 0, 0,
	     "write {pid, metrics_port} here once registered (tests)"},
	    {"log_level", OPT_STR, c.log_level, sizeof(c.log_level), 0, 0, "error, warn, info or debug"},
	};
	struct errbuf e = {0};
	int rc = opts_parse(table, (int)(sizeof(table) / sizeof(table[0])), argc, argv,
	                    "tandem-decode [--config decode.json] [--key value ...]", &e);
	int code;
	if (opts_worker_start("tandem-decode", "decode", rc, &e, c.log_level, c.auth_token_file, c.auth_token,
	                      sizeof(c.auth_token), &code))
		return code;
	return dc_worker_run(&c);
}
