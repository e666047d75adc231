/* The decode worker's paged KV pool: the memory (allocated once at start-up, registered with
 * UCX so prefill workers can write into it) and the block allocator behind reservations.
 * Loop thread only, except that the engine thread reads/writes the blocks of running sequences.
 *
 * Freed blocks are reused in FIFO order (oldest freed first): a late write from a prefill whose
 * request was cancelled mid-transfer then lands in a block that is, with high probability, still
 * free. Every block's state is tracked: freeing a block that is not allocated is a broken
 * invariant and aborts with file:line (release happens exactly once).
 *
 * After the blocks, in the same registered region, lies one 8-byte transfer-fence slot per block
 * (tandem.proto KvRegion.fence_addr): a prefill puts a request's rid into the slot of the
 * request's first block once it has stopped writing the request's blocks for good. */
#ifndef TANDEM_DECODE_POOL_H
#define TANDEM_DECODE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "common/net/kvx.h"

struct kv_pool {
	uint8_t *base; /* n_blocks * block_bytes, page aligned, owned (by UCX when ucx_owned) */
	int ucx_owned;
	size_t block_bytes;
	uint32_t n_blocks;
	uint32_t *fifo; /* ring of free block ids */
	uint32_t head, n_free;
	uint8_t *allocated; /* per block: 1 while reserved (or quarantined) */
	size_t fence_off; /* byte offset of the fence slots from base */
	struct kvx_region *region;
};

int kv_pool_init(struct kv_pool *p, uint32_t n_blocks, size_t block_bytes, struct kvx *x,
                 struct errbuf *e) TD_MUST_CHECK;
void kv_pool_fini(struct kv_pool *p, struct kvx *x);
/* Takes n blocks (ERR_LIMIT when fewer are free; nothing taken then). */
int kv_pool_alloc(struct kv_pool *p, uint32_t n, uint32_t *ids) TD_MUST_CHECK;
void kv_pool_free(struct kv_pool *p, const uint32_t *ids, uint32_t n);
static inline uint8_t *kv_pool_block(const struct kv_pool *p, uint32_t id)
{
	return p->base + (size_t)id * p->block_bytes;
}

/* Fence slot of block id, written remotely: read through a volatile pointer. */
static inline volatile uint64_t *kv_pool_fence(const struct kv_pool *p, uint32_t id)
{
	return (volatile uint64_t *)(p->base + p->fence_off) + id;
}

#endif
