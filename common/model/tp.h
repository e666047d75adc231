/* Tensor-parallel communicator: the collectives the per-rank forward pass calls (MODEL-SPEC.md
 * §3.2). The forward never talks to threads, NCCL or sockets directly; it calls these. Backends:
 *   - CPU threads (tp_cpu.c): T ranks in one process, one thread each, shared memory.
 *   - "shard" (rank-shard mode): one rank r of T runs alone and every collective is a no-op
 *     (all_gather only places the local part), for benchmarking one rank's real work.
 *   - NCCL (tp_nccl.c): T ranks as threads of one process, one GPU each; buffers are device
 *     memory and the ops are enqueued on the rank's stream (asynchronous, graph-capturable).
 * Every rank must call the same collectives in the same order with the same sizes. Sums are done
 * in a fixed rank order, so every rank gets bit-identical results. */
#ifndef TANDEM_MODEL_TP_H
#define TANDEM_MODEL_TP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/base/err.h"

struct tp_comm;

struct tp_ops {
	/* buf[0..n) <- sum over ranks of buf[0..n), in place, same result on every rank. */
	int (*all_reduce_sum)(struct tp_comm *c, float *buf, size_t n);
	/* recv[r*n .. r*n+n) <- rank r's send[0..n) for every r; recv holds size*n floats. */
	int (*all_gather)(struct tp_comm *c, const float *send, size_t n, float *recv);
	int (*barrier)(struct tp_comm *c);
	/* bytes of buf on rank `root` copied to buf on every rank. */
	int (*broadcast)(struct tp_comm *c, void *buf, size_t bytes, int root);
};

/* One rank's handle. Embedded per rank; `impl` belongs to the backend. */
struct tp_comm {
	int rank;
	int size;
	const struct tp_ops *ops;
	void *impl;
};

static inline int tp_all_reduce_sum(struct tp_comm *c, float *buf, size_t n)
{
	return c->size > 1 ? c->ops->all_reduce_sum(c, buf, n) : 0;
}
static inline int tp_all_gather(struct tp_comm *c, const float *send, size_t n, float *recv)
{
	return c->ops->all_gather(c, send, n, recv);
}
static inline int tp_barrier(struct tp_comm *c)
{
	return c->size > 1 ? c->ops->barrier(c) : 0;
}
static inline int tp_broadcast(struct tp_comm *c, void *buf, size_t bytes, int root)
{
	return c->size > 1 ? c->ops->broadcast(c, buf, bytes, root) : 0;
}

/* ---- CPU-thread backend (tp_cpu.c) -------------------------------------------------------------
 * A group of `size` ranks that run as threads of one process. tp_cpu_group_create() makes the
 * shared state; comms[r] (filled by it) is rank r's handle, to be used only by that rank's
 * thread. max_floats bounds the largest collective (ERR_LIMIT beyond it). */
struct tp_cpu_group;
int tp_cpu_group_create(struct tp_cpu_group **out, int size, size_t max_floats, struct tp_comm *comms,
                        struct errbuf *e) TD_MUST_CHECK;
void tp_cpu_group_destroy(struct tp_cpu_group *g);

/* ---- rank-shard backend (tp_cpu.c) -------------------------------------------------------------
 * Rank `rank` of `size` running alone: reduce/barrier/broadcast do nothing; all_gather copies the
 * local part to its slot and zero-fills the others. */
void tp_shard_comm_init(struct tp_comm *c, int rank, int size);

/* ---- NCCL backend (tp_nccl.c) ------------------------------------------------------------------
 * `size` ranks as threads of one process, rank r on the GPU of ctxs[r] (borrowed; its stream is
 * where rank r's collectives go). Every op takes device memory of the rank's GPU, is enqueued on
 * its stream and returns before it runs; all_reduce_sum sums fp32 and every rank receives the same
 * bits. tp_nccl_wait(c) waits for everything on rank c's stream with the deadline
 * (TANDEM_NCCL_TIMEOUT_S, default 120 s): past it the rank's communicator is aborted and
 * ERR_TIMEOUT returned; after any abort the group is broken and every op returns ERR_NCCL.
 * tp_nccl_available loads libnccl.so.2 ($TANDEM_NCCL_LIB overrides the name) and says why not;
 * tp_nccl_check_devices checks that devices first..first+size-1 exist among n_visible. */
struct tp_nccl_group;
struct kcuda_ctx;
int tp_nccl_available(struct errbuf *e) TD_MUST_CHECK;
int tp_nccl_version(void); /* NCCL_VERSION code of the loaded library, 0 before */
int tp_nccl_check_devices(int size, int first, int n_visible, struct errbuf *e) TD_MUST_CHECK;
double tp_nccl_timeout_s(void);
int tp_nccl_group_create(struct tp_nccl_group **out, int size, struct kcuda_ctx *const *ctxs,
                         struct tp_comm *comms, struct errbuf *e) TD_MUST_CHECK;
void tp_nccl_group_destroy(struct tp_nccl_group *g);
bool tp_is_nccl(const struct tp_comm *c);
bool tp_nccl_broken(const struct tp_comm *c);
int tp_nccl_wait(struct tp_comm *c) TD_MUST_CHECK;

#endif
