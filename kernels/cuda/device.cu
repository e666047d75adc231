/* Device selection and bounded waits for tensor parallelism across the GPUs of one process
 * (common/model/tp_nccl.c, backend_cuda.c). The CUDA runtime keeps the current device per host
 * thread, and every rank of a TP group runs on its own thread with its own GPU, so each rank binds
 * its device before it touches memory or launches anything. A stream that holds NCCL collectives
 * may never finish when a peer rank stopped issuing them; kcuda_ctx_wait waits with a deadline
 * (an event polled from the host) instead of blocking in cudaStreamSynchronize forever. */
#include <errno.h>
#include <sched.h>
#include <time.h>

#include "kernels/cuda/cuda_common.cuh"

extern "C" int kcuda_device_set(int device)
{
	cudaError_t e = cudaSetDevice(device);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		fprintf(stderr, "kcuda: cannot select device %d: %s\n", device, cudaGetErrorString(e));
		return ERR_CUDA;
	}
	return 0;
}

extern "C" int kcuda_ctx_device(const struct kcuda_ctx *c)
{
	return c->device;
}

static double mono_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

extern "C" int kcuda_ctx_wait(struct kcuda_ctx *c, double timeout_s)
{
	cudaEvent_t ev;
	if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
		return kcuda_launch_status("event create");
	int rc = 0;
	if (cudaEventRecord(ev, c->stream) != cudaSuccess) {
		rc = kcuda_launch_status("event record");
		goto out;
	}
	{
		double t0 = mono_s();
		unsigned spins = 0;
		for (;;) {
			cudaError_t e = cudaEventQuery(ev);
			if (e == cudaSuccess)
				break;
			if (e != cudaErrorNotReady) {
				fprintf(stderr, "kcuda: stream error: %s\n", cudaGetErrorString(e));
				rc = ERR_CUDA;
				break;
			}
			/* a decode step is ~1 ms: spin on yield first, then back off to 50 us naps */
			if (++spins < 20000) {
				sched_yield();
			} else {
				struct timespec nap = {0, 50000};
				nanosleep(&nap, NULL);
			}
			if ((spins & 255) == 0 && mono_s() - t0 > timeout_s) {
				rc = -ETIMEDOUT;
				break;
			}
		}
	}
out:
	cudaEventDestroy(ev);
	return rc;
}

extern "C" int kcuda_copy_peer(struct kcuda_ctx *dst_ctx, void *dst, const void *src, int src_device,
                               size_t bytes)
{
	if (cudaMemcpyPeerAsync(dst, dst_ctx->device, src, src_device, bytes, dst_ctx->stream) != cudaSuccess)
		return kcuda_launch_status("peer copy");
	return 0;
}
