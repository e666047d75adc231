/* Pinned staging lanes of the threaded weight upload (upload_lane.h). The events block instead of
 * spinning (cudaEventBlockingSync): up to 16 copy threads wait on them, and a spinning wait would
 * take the core another copy thread needs for its memcpy / pread. */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/base/err.h"
#include "kernels/cuda/upload_lane.h"

#define MAX_BUFS 8

struct kupl_lane {
	int device;
	int n_bufs;
	cudaStream_t st;
	char *buf[MAX_BUFS];
	cudaEvent_t ev[MAX_BUFS];
	bool pending[MAX_BUFS];
};

static int fail(const char *what, cudaError_t e)
{
	fprintf(stderr, "upload lane: %s failed: %s\n", what, cudaGetErrorString(e));
	return ERR_CUDA;
}

extern "C" void kupl_lane_destroy(void *lane)
{
	struct kupl_lane *l = (struct kupl_lane *)lane;
	if (!l)
		return;
	cudaSetDevice(l->device);
	if (l->st)
		cudaStreamSynchronize(l->st);
	for (int i = 0; i < l->n_bufs; i++) {
		if (l->buf[i])
			cudaFreeHost(l->buf[i]);
		if (l->ev[i])
			cudaEventDestroy(l->ev[i]);
	}
	if (l->st)
		cudaStreamDestroy(l->st);
	free(l);
}

extern "C" int kupl_lane_create(void *ctx, int thread, size_t buf_bytes, int n_bufs, void **out)
{
	*out = NULL;
	if (!ctx || n_bufs < 1 || n_bufs > MAX_BUFS || buf_bytes == 0)
		return -EINVAL;
	struct kupl_lane *l = (struct kupl_lane *)calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->device = *(const int *)ctx;
	l->n_bufs = n_bufs;
	cudaError_t e;
	int rc = 0;
	if ((e = cudaSetDevice(l->device)) != cudaSuccess) {
		rc = fail("cudaSetDevice", e);
		goto fail_lane;
	}
	if ((e = cudaStreamCreateWithFlags(&l->st, cudaStreamNonBlocking)) != cudaSuccess) {
		l->st = NULL;
		rc = fail("cudaStreamCreateWithFlags", e);
		goto fail_lane;
	}
	for (int i = 0; i < n_bufs; i++) {
		if ((e = cudaHostAlloc((void **)&l->buf[i], buf_bytes, cudaHostAllocDefault)) !=
		    cudaSuccess) {
			l->buf[i] = NULL;
			rc = fail("cudaHostAlloc (staging buffer)", e);
			goto fail_lane;
		}
		if ((e = cudaEventCreateWithFlags(&l->ev[i], cudaEventDisableTiming |
		                                                 cudaEventBlockingSync)) != cudaSuccess) {
			l->ev[i] = NULL;
			rc = fail("cudaEventCreateWithFlags", e);
			goto fail_lane;
		}
	}
	*out = l;
	return 0;
fail_lane:
	kupl_lane_destroy(l);
	return rc;
}

extern "C" void *kupl_lane_buf(void *lane, int k)
{
	return ((struct kupl_lane *)lane)->buf[k];
}

extern "C" int kupl_lane_copy(void *lane, int k, void *dst, size_t off, size_t bytes)
{
	struct kupl_lane *l = (struct kupl_lane *)lane;
	cudaError_t e = cudaMemcpyAsync(dst, l->buf[k] + off, bytes, cudaMemcpyHostToDevice, l->st);
	return e == cudaSuccess ? 0 : fail("cudaMemcpyAsync (weights)", e);
}

extern "C" int kupl_lane_commit(void *lane, int k)
{
	struct kupl_lane *l = (struct kupl_lane *)lane;
	cudaError_t e = cudaEventRecord(l->ev[k], l->st);
	if (e != cudaSuccess)
		return fail("cudaEventRecord", e);
	l->pending[k] = true;
	return 0;
}

extern "C" int kupl_lane_wait(void *lane, int k)
{
	struct kupl_lane *l = (struct kupl_lane *)lane;
	if (!l->pending[k])
		return 0;
	cudaError_t e = cudaEventSynchronize(l->ev[k]);
	if (e != cudaSuccess)
		return fail("cudaEventSynchronize (weight copy)", e);
	l->pending[k] = false;
	return 0;
}

extern "C" int kupl_lane_finish(void *lane)
{
	struct kupl_lane *l = (struct kupl_lane *)lane;
	cudaError_t e = cudaStreamSynchronize(l->st);
	if (e != cudaSuccess)
		return fail("cudaStreamSynchronize (weight copies)", e);
	for (int i = 0; i < l->n_bufs; i++)
		l->pending[i] = false;
	return 0;
}
