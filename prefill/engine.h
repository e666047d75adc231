/* The prefill engine: a thread that batches prompts across requests with a token budget per
 * step (chunked prefill), computes their KV cache with the model core (or the trivial engine),
 * samples each prompt's first token, and pushes the KV blocks to the decode worker over UCX
 * (push.c). The loop thread (worker.c) submits jobs and gets them back, finished or failed,
 * through done_cb on the loop thread.
 *
 * Job life cycle (one owner at a time):
 *   worker.c allocates -> pf_engine_submit (engine owns) -> PENDING (waits for local KV blocks)
 *   -> ACTIVE (chunks computed; full blocks pushed as soon as they are complete)
 *   -> DONE (last block pushed, flush = remote completion) -> done_cb (worker owns, frees)
 * A job whose `cancelled` flag is set or whose deadline passes leaves at the next step with
 * status ERR_CANCELLED / ERR_TIMEOUT; its local blocks are freed by the engine. */
#ifndef TANDEM_PREFILL_ENGINE_H
#define TANDEM_PREFILL_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/err.h"
#include "common/net/kvx.h"
#include "common/net/metrics.h"
#include "common/net/msg.h"

struct model;

struct pf_job {
	uint64_t rid;
	uint32_t *tokens; /* owned by the job */
	uint32_t n_tokens;
	struct msg_sampling sampling;
	char target_name[MSG_NAME_MAX + 1];
	uint8_t *ucx_addr; /* owned copies of the decode target */
	size_t ucx_addr_len;
	uint8_t *rkey;
	size_t rkey_len;
	struct msg_kv_region region; /* region.rkey is NULL: use rkey above */
	uint32_t *block_ids; /* owned */
	uint32_t n_block_ids;
	bool want_checksums;
	uint64_t deadline_ms; /* uv_hrtime()/1e6 clock */
	uint64_t t_submit_ns;
	_Atomic int cancelled; /* set by the loop thread; read by the engine */
	_Atomic int no_fence; /* set by the loop thread (router lost): leave without a fence */
	/* PrefillRequest.attempt: the fence carries kvfence_word(rid, fence_attempt); has_attempt
	 * says the decode target tells attempts apart (tandem.proto KvRegion, PER-ATTEMPT FENCES) */
	uint32_t fence_attempt;
	bool has_attempt;

	/* engine-private progress */
	uint32_t n_done; /* prompt tokens computed */
	int32_t *local_blocks;
	uint32_t n_local;
	uint32_t n_pushed; /* blocks already put */
	uint64_t peer_id; /* kvx peer the blocks went to (0: none yet) */
	uint64_t hash; /* trivial engine: running KV hash */
	uint64_t t_start_ns, t_first_put_ns;
	uint64_t fence_word; /* source of the fence put (must live until its flush) */

	/* results, valid in done_cb */
	int status; /* 0 or a negative error */
	int err_code; /* enum msg_error when status != 0 */
	char err_msg[256];
	struct msg_token first;
	uint32_t *checksums; /* owned; n_checksums = blocks pushed, when asked for */
	uint32_t n_checksums;
	uint64_t kv_bytes;
	uint32_t prefill_us, transfer_us;
	struct pf_job *next; /* engine queues */
	struct pf_job *map_next; /* loop thread: worker.c's rid map */
	bool cancelled_by_router; /* loop thread */
	/* A request refused before it reached the engine: the engine only writes its transfer fence
	 * (the decode worker then frees the reservation at once instead of at its quarantine
	 * deadline) and hands it back; status/err_code/err_msg hold the refusal. */
	bool fence_only;
};

void pf_job_free(struct pf_job *j); /* NULL is fine */

struct pf_metrics {
	struct metric *tokens; /* counter: prompt tokens computed */
	struct metric *kv_bytes; /* counter: KV bytes written over UCX */
	struct metric *step_seconds; /* histogram */
	struct metric *transfer_seconds; /* histogram: first put to flush done, per request */
	struct metric *stage_seconds; /* histogram: staged KV, one device -> host block copy (NULL: none) */
};

struct pf_engine_opts {
	struct model *model; /* NULL: trivial engine */
	uint32_t n_local_blocks; /* local KV pool (blocks of the model's layout) */
	uint32_t max_tokens_per_step;
	uint32_t max_batch; /* jobs in one step */
	uint32_t trivial_step_us; /* trivial engine: simulated compute per step */
	uint32_t flush_timeout_ms;
	/* The model computes into its own pool (device memory on the CUDA backend; host memory when
	 * forced on the CPU backend for tests) and each block is copied into a pinned, UCX-registered
	 * host staging copy (same local block ids) just before it is put. Forced on when the model's
	 * pool lives on the device. */
	bool kv_staged;
	uint32_t max_seq_len; /* longest prompt (0: the model's context length) */
	struct kvx *kvx; /* borrowed; used only by the engine thread from now on */
	struct pf_metrics metrics;
	uv_loop_t *loop;
	void (*done_cb)(struct pf_job *j, void *ud); /* on the loop thread */
	void *ud;
};

struct pf_engine;

int pf_engine_create(const struct pf_engine_opts *o, struct pf_engine **out, struct errbuf *e) TD_MUST_CHECK;
/* Stops the thread (jobs still inside come back cancelled through done_cb first). NULL is fine. */
void pf_engine_destroy(struct pf_engine *g);
void pf_engine_submit(struct pf_engine *g, struct pf_job *j);
/* Layout of the KV blocks this engine produces (compared with the decode worker's). */
void pf_engine_layout(const struct pf_engine *g, struct msg_kv_layout *l);
uint32_t pf_engine_vocab(const struct pf_engine *g);
uint32_t pf_engine_max_seq_len(const struct pf_engine *g);
/* Seconds since the engine thread last went round its loop (the watchdog's health check). */
double pf_engine_stall_seconds(const struct pf_engine *g);

/* push.c: KV push of a job's completed blocks (engine thread). */
struct pf_push_ctx {
	struct kvx *kvx;
	struct kvx_region *local_region; /* the local pool's registration (NULL: unregistered) */
	const uint8_t *local_base;
	size_t block_bytes;
	uint32_t flush_timeout_ms;
	/* test-only (TANDEM_TEST_PUSH_DELAY="us:min_tokens"): sleep us before each block put of jobs
	 * with at least min_tokens prompt tokens, to make a transfer slow enough to cancel mid-way */
	uint32_t test_delay_us, test_delay_min_tokens;
};
/* Puts local blocks [j->n_pushed, upto) to the job's decode blocks; computes checksums when
 * asked for. Errors set j->status/err_code/err_msg and return it. */
int pf_push_blocks(const struct pf_push_ctx *c, struct pf_job *j, uint32_t upto);
/* Waits for remote completion of everything pushed for j (deadline: flush_timeout_ms, or less
 * when the job's deadline is nearer). */
int pf_push_finish(const struct pf_push_ctx *c, struct pf_job *j);
/* The job will never write its target again (it is leaving the engine and every put it issued
 * has been flushed, or its endpoint was force-closed): tell the decode worker so through the
 * transfer fence (tandem.proto KvRegion.fence_addr), after which decode may reuse the blocks of
 * a reservation released before KvReady. Best effort: without a fence decode waits for its
 * quarantine deadline. */
void pf_push_fence(const struct pf_push_ctx *c, struct pf_job *j);

#endif
