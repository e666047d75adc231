/* Host <-> device KV block staging (see kv_stage.h): cudaHostRegister of the worker's UCX-visible
 * host region, asynchronous block copies on the context's stream, thread binding to the device. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_stage.h"

extern "C" int kstage_host_register(struct kcuda_ctx *c, void *p, size_t bytes)
{
	if (!p || !bytes)
		return -EINVAL;
	if (cudaSetDevice(c->device) != cudaSuccess)
		return kcuda_launch_status("cudaSetDevice");
	cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		(void)cudaGetLastError(); /* a refused registration is not sticky: clear it */
		fprintf(stderr, "kstage: cudaHostRegister of %zu bytes failed: %s\n", bytes,
		        cudaGetErrorString(e));
		return ERR_CUDA;
	}
	return 0;
}

extern "C" void kstage_host_unregister(void *p)
{
	if (p && cudaHostUnregister(p) != cudaSuccess)
		(void)cudaGetLastError();
}

extern "C" int kstage_copy(struct kcuda_ctx *c, void *dst, const void *src, size_t bytes, int to_device)
{
	if (!bytes)
		return 0;
	cudaMemcpyKind k = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
	if (cudaMemcpyAsync(dst, src, bytes, k, c->stream) != cudaSuccess)
		return kcuda_launch_status(to_device ? "KV block upload" : "KV block download");
	return 0;
}

extern "C" int kstage_bind_thread(struct kcuda_ctx *c)
{
	if (cudaSetDevice(c->device) != cudaSuccess)
		return kcuda_launch_status("cudaSetDevice");
	return 0;
}
