/* Paged KV pool of the decode worker (see pool.h). */
#include "decode/pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"

int kv_pool_init(struct kv_pool *p, uint32_t n_blocks, size_t block_bytes, struct kvx *x, struct errbuf *e)
{
	memset(p, 0, sizeof(*p));
	if (!n_blocks || !block_bytes || block_bytes > SIZE_MAX / n_blocks)
		return errbuf_set(e, -EINVAL, "KV pool: %u blocks of %zu bytes is not a valid size", n_blocks,
		                  block_bytes);
	/* the blocks, then one 8-byte transfer-fence slot per block (see pool.h), in one region */
	size_t blocks_bytes = (size_t)n_blocks * block_bytes;
	size_t fence_off = (blocks_bytes + 63) & ~(size_t)63;
	if (fence_off < blocks_bytes || fence_off > SIZE_MAX - (size_t)n_blocks * 8)
		return errbuf_set(e, -EINVAL, "KV pool: %u blocks of %zu bytes is too large", n_blocks,
		                  block_bytes);
	size_t bytes = fence_off + (size_t)n_blocks * 8;
	p->fifo = malloc(n_blocks * sizeof(uint32_t));
	p->allocated = calloc(n_blocks, 1);
	if (!p->fifo || !p->allocated) {
		free(p->fifo);
		free(p->allocated);
		memset(p, 0, sizeof(*p));
		return errbuf_set(e, -ENOMEM, "KV pool: out of memory for the block table (%u blocks)",
		                  n_blocks);
	}
	p->block_bytes = block_bytes;
	p->n_blocks = n_blocks;
	p->fence_off = fence_off;
	for (uint32_t i = 0; i < n_blocks; i++)
		p->fifo[i] = i;
	p->n_free = n_blocks;
	/* Memory from UCX first: on one host it is a shared segment prefill writes with plain memcpy
	 * (about 10x faster than emulated puts into private memory). Where UCX cannot provide it
	 * (e.g. a small /dev/shm), private memory registered with UCX still works, more slowly. */
	void *base = NULL;
	int rc = kvx_region_alloc(x, bytes, &base, &p->region, e);
	if (rc == 0) {
		p->base = base;
		p->ucx_owned = 1;
		return 0;
	}
	LOG_WARN("pool",
	         "KV pool: UCX could not allocate %zu bytes (%s); using private memory: KV transfers on this "
	         "host will be slower",
	         bytes, e ? e->msg : "");
	size_t rounded = (bytes + 4095) & ~(size_t)4095;
	p->base = aligned_alloc(4096, rounded);
	if (!p->base) {
		kv_pool_fini(p, x);
		return errbuf_set(e, -ENOMEM, "KV pool: cannot allocate %zu bytes (%u blocks)", bytes,
		                  n_blocks);
	}
	memset(p->base, 0, rounded); /* touch every page now, not while serving */
	rc = kvx_region_map(x, p->base, bytes, &p->region, e);
	if (rc) {
		kv_pool_fini(p, x);
		return rc;
	}
	return 0;
}

void kv_pool_fini(struct kv_pool *p, struct kvx *x)
{
	if (p->region)
		kvx_region_unmap(x, p->region); /* frees UCX-allocated memory too */
	if (!p->ucx_owned)
		free(p->base);
	free(p->fifo);
	free(p->allocated);
	memset(p, 0, sizeof(*p));
}

int kv_pool_alloc(struct kv_pool *p, uint32_t n, uint32_t *ids)
{
	if (n > p->n_free)
		return ERR_LIMIT;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t id = p->fifo[p->head];
		p->head = (p->head + 1) % p->n_blocks;
		TD_ASSERT(!p->allocated[id]);
		p->allocated[id] = 1;
		ids[i] = id;
	}
	p->n_free -= n;
	return 0;
}

void kv_pool_free(struct kv_pool *p, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t id = ids[i];
		TD_ASSERT(id < p->n_blocks && p->allocated[id]); /* freed exactly once */
		p->allocated[id] = 0;
		p->fifo[(p->head + p->n_free) % p->n_blocks] = id;
		p->n_free++;
	}
}
