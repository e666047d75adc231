/* The host sink of the weight copier (upload.h): staging buffers in ordinary memory and copies
 * that are a memcpy to a host address, complete when lane_copy returns. The unit test checks the
 * copier's bookkeeping with it (where every byte lands, failure injection), and bench_upload
 * measures the host side of an upload (file -> staging) without a GPU. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model/upload.h"

struct host_lane {
	struct upload_host_sink *h;
	int n_bufs;
	char *buf[8];
};

static void host_destroy(void *lane)
{
	struct host_lane *l = lane;
	if (!l)
		return;
	for (int i = 0; i < l->n_bufs; i++)
		free(l->buf[i]);
	free(l);
}

static int host_create(void *ctx, int thread, size_t buf_bytes, int n_bufs, void **out)
{
	*out = NULL;
	if (n_bufs < 1 || n_bufs > 8)
		return -EINVAL;
	struct host_lane *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->h = ctx;
	l->n_bufs = n_bufs;
	size_t sz = (buf_bytes + 4095) & ~(size_t)4095;
	for (int i = 0; i < n_bufs; i++)
		if (!(l->buf[i] = aligned_alloc(4096, sz))) {
			host_destroy(l);
			return -ENOMEM;
		}
	*out = l;
	return 0;
}

static void *host_buf(void *lane, int k)
{
	return ((struct host_lane *)lane)->buf[k];
}

static int host_copy(void *lane, int k, void *dst, size_t off, size_t bytes)
{
	struct host_lane *l = lane;
	char *d = dst, *f = l->h->fail_dst;
	if (f && f >= d && f < d + bytes)
		return -EIO;
	if (l->h->delay_us)
		usleep(l->h->delay_us);
	if (!l->h->discard)
		memcpy(dst, l->buf[k] + off, bytes);
	atomic_fetch_add(&l->h->n_copies, 1);
	return 0;
}

static int host_nop(void *lane, int k)
{
	return 0;
}

static int host_finish(void *lane)
{
	return 0;
}

void upload_host_sink_init(struct upload_host_sink *h, struct upload_sink *out)
{
	*out = (struct upload_sink){
	    .lane_create = host_create,
	    .lane_buf = host_buf,
	    .lane_copy = host_copy,
	    .lane_commit = host_nop,
	    .lane_wait = host_nop,
	    .lane_finish = host_finish,
	    .lane_destroy = host_destroy,
	    .ctx = h,
	};
}
