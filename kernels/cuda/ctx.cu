/* CUDA context (stream, cuBLAS handle, workspace) and device memory helpers: the plumbing every
 * kcuda_* op uses. Allocation happens here at start-up (weights, workspace), never while serving. */
#include <cublas_v2.h>
#include <errno.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

extern "C" int kcuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		(void)cudaGetLastError(); /* no driver / no device is not sticky: clear it */
		return 0;
	}
	return n;
}

/* TANDEM_PDL=0: launch every kernel in plain stream order (cuda_common.cuh, klaunch). Read once. */
extern "C" int kcuda_pdl_enabled(void)
{
	static int on = -1;
	if (on < 0) {
		const char *e = getenv("TANDEM_PDL");
		on = !(e && strcmp(e, "0") == 0);
	}
	return on;
}

extern "C" int kcuda_cc_major(int dev)
{
	static int cc[64]; /* a racing first call stores the same value */
	if (dev < 0 || dev >= 64)
		return 0;
	if (!cc[dev]) {
		int v = 0;
		if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
			(void)cudaGetLastError();
			return 0;
		}
		cc[dev] = v;
	}
	return cc[dev];
}

extern "C" int kcuda_smem_optin(int dev)
{
	static int cap = -1, v[64]; /* racing first calls store the same values */
	if (cap < 0) {
		const char *e = getenv("TANDEM_CUDA_SMEM_CAP");
		const long x = e && *e ? strtol(e, NULL, 10) : 0;
		cap = x > 0 && x < (1L << 30) ? (int)x : 0;
	}
	if (dev < 0 || dev >= 64)
		return 0;
	if (!v[dev]) {
		int m = 0;
		if (cudaDeviceGetAttribute(&m, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
			(void)cudaGetLastError();
			return 0;
		}
		v[dev] = m;
	}
	return cap && cap < v[dev] ? cap : v[dev];
}

extern "C" int kcuda_prefetch_enabled(void)
{
	static int on = -1;
	if (on < 0) {
		const char *e = getenv("TANDEM_PREFETCH");
		on = !(e && strcmp(e, "0") == 0);
	}
	return on;
}

extern "C" int kcuda_ctx_create(int device, size_t ws_bytes, struct kcuda_ctx **out)
{
	*out = NULL;
	if (device < 0 || device >= kcuda_device_count())
		return -ENODEV;
	struct kcuda_ctx *c = (struct kcuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->device = device;
	c->ws_bytes = ws_bytes ? ws_bytes : KCUDA_WS_DEFAULT;
	cublasHandle_t h = NULL;
	if (cudaSetDevice(device) != cudaSuccess)
		goto fail_free;
	if (cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
		goto fail_free;
	if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess)
		goto fail_free;
	if (cudaEventCreateWithFlags(&c->dep_ev, cudaEventDisableTiming) != cudaSuccess)
		goto fail_stream;
	if (cudaMalloc(&c->ws, c->ws_bytes) != cudaSuccess)
		goto fail_event;
	/* word 0: the bad-input count; word 1: moe_route.cu's ticket (fused router + route) */
	if (cudaMalloc((void **)&c->err_dev, 4 * sizeof(unsigned)) != cudaSuccess)
		goto fail_ws;
	if (cudaMemsetAsync(c->err_dev, 0, 4 * sizeof(unsigned), c->stream) != cudaSuccess)
		goto fail_err;
	if (cudaMalloc((void **)&c->tickets, sizeof(unsigned) * KCUDA_N_TICKETS) != cudaSuccess)
		goto fail_err;
	if (cudaMemsetAsync(c->tickets, 0, sizeof(unsigned) * KCUDA_N_TICKETS, c->stream) != cudaSuccess)
		goto fail_err;
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
		goto fail_err;
	if (cublasSetStream(h, c->stream) != CUBLAS_STATUS_SUCCESS)
		goto fail_cublas;
	c->cublas = h;
	if (cudaMalloc((void **)&c->zs, KCUDA_ZS_BYTES) != cudaSuccess ||
	    cudaMemsetAsync(c->zs, 0, KCUDA_ZS_BYTES, c->stream) != cudaSuccess)
		goto fail_zs;
	if (cudaMalloc(&c->xp, KCUDA_XP_BYTES) != cudaSuccess)
		goto fail_xp;
	*out = c;
	return 0;

fail_xp:
	cudaFree(c->xp);
fail_zs:
	cudaFree(c->zs);
fail_cublas:
	cublasDestroy(h);
fail_err:
	cudaFree(c->tickets);
	cudaFree(c->err_dev);
fail_ws:
	cudaFree(c->ws);
fail_event:
	cudaEventDestroy(c->dep_ev);
fail_stream:
	cudaStreamDestroy(c->stream);
fail_free:
	fprintf(stderr, "kcuda: context on device %d: %s\n", device, cudaGetErrorString(cudaGetLastError()));
	free(c);
	return ERR_CUDA;
}

extern "C" int kcuda_stream_after(struct kcuda_ctx *to, struct kcuda_ctx *from)
{
	/* from's own event, recorded again each time (the side-branch fork and join run twice per
	 * layer: an event created and destroyed per call cost host time in eager steps) */
	cudaError_t e = cudaEventRecord(from->dep_ev, from->stream);
	if (e == cudaSuccess)
		e = cudaStreamWaitEvent(to->stream, from->dep_ev, 0);
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "kcuda: stream dependency: %s\n", cudaGetErrorString(e));
	return ERR_CUDA;
}

extern "C" void kcuda_ctx_destroy(struct kcuda_ctx *c)
{
	if (!c)
		return;
	cudaStreamSynchronize(c->stream);
	if (c->cublas)
		cublasDestroy((cublasHandle_t)c->cublas);
	cudaFree(c->xp);
	cudaFree(c->zs);
	cudaFree(c->tickets);
	cudaFree(c->err_dev);
	cudaFree(c->ws);
	cudaEventDestroy(c->dep_ev);
	cudaStreamDestroy(c->stream);
	free(c);
}

extern "C" int kcuda_ctx_take_errors(struct kcuda_ctx *c, unsigned *n_bad)
{
	*n_bad = 0;
	int rc = kcuda_download(c, n_bad, c->err_dev, sizeof(unsigned));
	if (rc)
		return rc;
	if (*n_bad && cudaMemsetAsync(c->err_dev, 0, sizeof(unsigned), c->stream) != cudaSuccess)
		return kcuda_launch_status("error counter reset");
	return 0;
}

extern "C" void *kcuda_ctx_stream(struct kcuda_ctx *c)
{
	return (void *)c->stream;
}

extern "C" int kcuda_sync(struct kcuda_ctx *c)
{
	cudaError_t e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess) {
		fprintf(stderr, "kcuda: stream error: %s\n", cudaGetErrorString(e));
		return ERR_CUDA;
	}
	return 0;
}

extern "C" int kcuda_alloc(size_t bytes, void **out)
{
	*out = NULL;
	if (cudaMalloc(out, bytes ? bytes : 1) != cudaSuccess) {
		(void)cudaGetLastError();
		*out = NULL;
		return -ENOMEM;
	}
	return 0;
}

extern "C" void kcuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

extern "C" int kcuda_upload(struct kcuda_ctx *c, void *dst, const void *src, size_t bytes)
{
	if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream) != cudaSuccess)
		return kcuda_launch_status("upload");
	return kcuda_sync(c);
}

extern "C" int kcuda_download(struct kcuda_ctx *c, void *dst, const void *src, size_t bytes)
{
	if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream) != cudaSuccess)
		return kcuda_launch_status("download");
	return kcuda_sync(c);
}

extern "C" int kcuda_download_2d(struct kcuda_ctx *c, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t rows)
{
	if (rows == 0 || width == 0)
		return 0;
	if (cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToHost, c->stream) !=
	    cudaSuccess)
		return kcuda_launch_status("download_2d");
	return kcuda_sync(c);
}

extern "C" int kcuda_memset(struct kcuda_ctx *c, void *dst, int byte, size_t bytes)
{
	if (cudaMemsetAsync(dst, byte, bytes, c->stream) != cudaSuccess)
		return kcuda_launch_status("memset");
	return 0;
}

extern "C" int kcuda_weight_upload(struct kcuda_ctx *c, const struct kweight *h, struct kweight *d)
{
	memset(d, 0, sizeof(*d));
	size_t rb = 0;
	const struct ktype_info *ti = ktype_get(h->type);
	if (!ti || !ti->compute || h->n_in <= 0 || h->n_out <= 0 || !ktype_row_bytes(h->type, h->n_in, &rb) ||
	    rb != h->row_bytes)
		return kcuda_bad_arg("weight_upload", "%s weight %lld x %lld with row_bytes %zu (want %zu)",
		                     ktype_name(h->type), (long long)h->n_out, (long long)h->n_in,
		                     h->row_bytes, rb);
	if ((size_t)h->n_out > (SIZE_MAX - 16) / rb)
		return ERR_LIMIT;
	size_t bytes = rb * (size_t)h->n_out;
	void *p = NULL;
	int rc = kcuda_alloc(bytes + 16, &p);
	if (rc)
		return rc;
	if ((rc = kcuda_memset(c, (char *)p + bytes, 0, 16)) || (rc = kcuda_upload(c, p, h->data, bytes))) {
		kcuda_free(p);
		return rc;
	}
	*d = *h;
	d->data = p;
	return 0;
}

extern "C" void kcuda_weight_free(struct kweight *d)
{
	if (!d)
		return;
	kcuda_free((void *)d->data);
	d->data = NULL;
}
