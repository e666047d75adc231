/* CPU tensor-parallel communicator: T ranks as threads of one process (tp.h). Collectives meet at
 * a pthread barrier; each rank publishes a pointer to its buffer, then reads the others'. The sum
 * is done in rank order 0..T-1 for every element, so all ranks (and repeated runs) get identical
 * bits. Also the rank-shard backend, whose collectives do nothing. */
#include <stdlib.h>
#include <string.h>

#include "common/model/tp.h"

#include <pthread.h>

struct tp_cpu_group {
	int size;
	size_t max_floats;
	pthread_barrier_t bar;
	const void **ptr; /* per rank: published buffer */
	float *scratch; /* max_floats: reduction result */
};

static int cpu_barrier(struct tp_comm *c)
{
	struct tp_cpu_group *g = c->impl;
	pthread_barrier_wait(&g->bar);
	return 0;
}

static int cpu_all_reduce(struct tp_comm *c, float *buf, size_t n)
{
	struct tp_cpu_group *g = c->impl;
	if (n > g->max_floats)
		return ERR_LIMIT; /* same decision on every rank: sizes are equal by contract */
	g->ptr[c->rank] = buf;
	pthread_barrier_wait(&g->bar);
	/* each rank reduces its slice into scratch */
	size_t lo = n * (size_t)c->rank / (size_t)g->size, hi = n * (size_t)(c->rank + 1) / (size_t)g->size;
	for (size_t i = lo; i < hi; i++) {
		float s = ((const float *)g->ptr[0])[i];
		for (int r = 1; r < g->size; r++)
			s += ((const float *)g->ptr[r])[i];
		g->scratch[i] = s;
	}
	pthread_barrier_wait(&g->bar);
	memcpy(buf, g->scratch, n * sizeof(float));
	pthread_barrier_wait(&g->bar); /* scratch and ptr free for the next collective */
	return 0;
}

static int cpu_all_gather(struct tp_comm *c, const float *send, size_t n, float *recv)
{
	struct tp_cpu_group *g = c->impl;
	g->ptr[c->rank] = send;
	pthread_barrier_wait(&g->bar);
	for (int r = 0; r < g->size; r++)
		memcpy(recv + (size_t)r * n, g->ptr[r], n * sizeof(float));
	pthread_barrier_wait(&g->bar);
	return 0;
}

static int cpu_broadcast(struct tp_comm *c, void *buf, size_t bytes, int root)
{
	struct tp_cpu_group *g = c->impl;
	if (c->rank == root)
		g->ptr[root] = buf;
	pthread_barrier_wait(&g->bar);
	if (c->rank != root)
		memcpy(buf, g->ptr[root], bytes);
	pthread_barrier_wait(&g->bar);
	return 0;
}

static const struct tp_ops cpu_ops = {
    .all_reduce_sum = cpu_all_reduce,
    .all_gather = cpu_all_gather,
    .barrier = cpu_barrier,
    .broadcast = cpu_broadcast,
};

int tp_cpu_group_create(struct tp_cpu_group **out, int size, size_t max_floats, struct tp_comm *comms,
                        struct errbuf *e)
{
	*out = NULL;
	if (size < 1 || size > 1024)
		return errbuf_set(e, -EINVAL, "TP degree %d out of range", size);
	struct tp_cpu_group *g = calloc(1, sizeof(*g));
	if (!g)
		goto fail_alloc;
	g->size = size;
	g->max_floats = max_floats;
	g->ptr = calloc((size_t)size, sizeof(*g->ptr));
	g->scratch = malloc((max_floats ? max_floats : 1) * sizeof(float));
	if (!g->ptr || !g->scratch)
		goto fail_bufs;
	if (pthread_barrier_init(&g->bar, NULL, (unsigned)size))
		goto fail_bufs;
	for (int r = 0; r < size; r++)
		comms[r] = (struct tp_comm){.rank = r, .size = size, .ops = &cpu_ops, .impl = g};
	*out = g;
	return 0;
fail_bufs:
	free(g->scratch);
	free(g->ptr);
	free(g);
fail_alloc:
	return errbuf_set(e, -ENOMEM, "out of memory for the TP group");
}

void tp_cpu_group_destroy(struct tp_cpu_group *g)
{
	if (!g)
		return;
	pthread_barrier_destroy(&g->bar);
	free(g->scratch);
	free(g->ptr);
	free(g);
}

/* ---- rank-shard: collectives are no-ops ------------------------------------------------------- */
static int shard_nop(struct tp_comm *c)
{
	(void)c;
	return 0;
}
static int shard_reduce(struct tp_comm *c, float *buf, size_t n)
{
	(void)c, (void)buf, (void)n;
	return 0;
}
static int shard_gather(struct tp_comm *c, const float *send, size_t n, float *recv)
{
	memset(recv, 0, (size_t)c->size * n * sizeof(float));
	memcpy(recv + (size_t)c->rank * n, send, n * sizeof(float));
	return 0;
}
static int shard_bcast(struct tp_comm *c, void *buf, size_t bytes, int root)
{
	(void)c, (void)buf, (void)bytes, (void)root;
	return 0;
}
static const struct tp_ops shard_ops = {
    .all_reduce_sum = shard_reduce,
    .all_gather = shard_gather,
    .barrier = shard_nop,
    .broadcast = shard_bcast,
};

void tp_shard_comm_init(struct tp_comm *c, int rank, int size)
{
	*c = (struct tp_comm){.rank = rank, .size = size, .ops = &shard_ops, .impl = NULL};
}
