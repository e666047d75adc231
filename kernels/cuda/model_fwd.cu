/* Small CUDA ops and runtime helpers of the model's CUDA backend (declared in model_fwd.h): see
 * there. Element-wise kernels use grid-stride loops over lengths fixed at launch (the same for
 * every replay of a captured graph). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/model_fwd.h"

static unsigned grid_for(int64_t n)
{
	int64_t g = (n + 255) / 256;
	if (g < 1)
		g = 1;
	if (g > 65535)
		g = 65535;
	return (unsigned)g;
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
	KDEP_ENTRY();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

__global__ void scale_kernel(float *x, int64_t n, float s)
{
	KDEP_ENTRY();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] *= s;
}

__global__ void copy2d_kernel(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t width,
                              int64_t rows)
{
	KDEP_ENTRY();
	int64_t n = width * rows;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / width, j = i % width;
		dst[r * ldd + j] = src[r * lds + j];
	}
}

__global__ void gather_kernel(float *dst, const float *src, int64_t width, const int32_t *rows, int64_t n)
{
	KDEP_ENTRY();
	int64_t tot = width * n;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tot;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / width, j = i % width;
		dst[i] = src[(int64_t)rows[r] * width + j];
	}
}

__device__ __forceinline__ uint16_t f32_to_bf16_rne(float f)
{
	uint32_t x = __float_as_uint(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

__global__ void kv_write_kernel(char *base, size_t block_bytes, size_t offset, int block_tokens,
                                int64_t width, int bf16, const float *x, int64_t n, const int32_t *seq,
                                const int32_t *pos, const int32_t *blocks, int64_t ld_blocks)
{
	KDEP_ENTRY();
	int64_t tot = width * n;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tot;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / width, j = i % width;
		int32_t p = pos[r];
		int32_t blk = blocks[(int64_t)seq[r] * ld_blocks + p / block_tokens];
		if (p < 0 || blk < 0)
			continue;
		char *row = base + (size_t)blk * block_bytes + offset +
		            (size_t)(p % block_tokens) * (size_t)width * (bf16 ? 2 : 4);
		if (bf16)
			((uint16_t *)row)[j] = f32_to_bf16_rne(x[i]);
		else
			((float *)row)[j] = x[i];
	}
}

__global__ void fill_kernel(uint16_t *p, size_t n_words, uint64_t seed)
{
	KDEP_ENTRY();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		p[i] = (uint16_t)(z & 0xbfffu);
	}
}

/* one block of 256 threads per row; statistics in double like kcpu_layernorm (b may be NULL) */
__global__ void layernorm_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                                 const float *b, int64_t n, float eps)
{
	KDEP_ENTRY();
	__shared__ double red[256];
	const float *xr = x + blockIdx.x * ldx;
	float *yr = y + blockIdx.x * ldy;
	double s = 0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		s += xr[i];
	red[threadIdx.x] = s;
	__syncthreads();
	for (int o = 128; o > 0; o >>= 1) {
		if ((int)threadIdx.x < o)
			red[threadIdx.x] += red[threadIdx.x + o];
		__syncthreads();
	}
	double mean = red[0] / (double)n;
	__syncthreads();
	double v = 0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
	red[threadIdx.x] = v;
	__syncthreads();
	for (int o = 128; o > 0; o >>= 1) {
		if ((int)threadIdx.x < o)
			red[threadIdx.x] += red[threadIdx.x + o];
		__syncthreads();
	}
	double inv = 1.0 / sqrt(red[0] / (double)n + (double)eps);
	__syncthreads(); /* every thread has read red[0] before y (which may alias x) is written */
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = (float)(((double)xr[i] - mean) * inv) * w[i] + (b ? b[i] : 0.0f);
}

#define STREAM(c) ((c)->stream)

extern "C" int kfwd_layernorm(struct kcuda_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx,
                              const float *w, const float *b, int64_t n, int64_t n_rows, float eps)
{
	if (n <= 0 || n_rows <= 0)
		return 0;
	return klaunch("kfwd_layernorm", layernorm_kernel, dim3((unsigned)n_rows), dim3(256), 0, STREAM(c), y,
	               ldy, x, ldx, w, b, n, eps);
}

extern "C" int kfwd_add(struct kcuda_ctx *c, float *y, const float *x, int64_t n)
{
	if (n <= 0)
		return 0;
	return klaunch("kfwd_add", add_kernel, dim3(grid_for(n)), dim3(256), 0, STREAM(c), y, x, n);
}

extern "C" int kfwd_scale(struct kcuda_ctx *c, float *x, int64_t n, float s)
{
	if (n <= 0)
		return 0;
	return klaunch("kfwd_scale", scale_kernel, dim3(grid_for(n)), dim3(256), 0, STREAM(c), x, n, s);
}

extern "C" int kfwd_copy2d(struct kcuda_ctx *c, float *dst, int64_t ldd, const float *src, int64_t lds,
                           int64_t width, int64_t rows)
{
	if (width <= 0 || rows <= 0)
		return 0;
	return klaunch("kfwd_copy2d", copy2d_kernel, dim3(grid_for(width * rows)), dim3(256), 0, STREAM(c),
	               dst, ldd, src, lds, width, rows);
}

extern "C" int kfwd_gather_rows(struct kcuda_ctx *c, float *dst, const float *src, int64_t width,
                                const int32_t *rows_dev, int64_t n)
{
	if (width <= 0 || n <= 0)
		return 0;
	return klaunch("kfwd_gather_rows", gather_kernel, dim3(grid_for(width * n)), dim3(256), 0, STREAM(c),
	               dst, src, width, rows_dev, n);
}

extern "C" int kfwd_kv_write(struct kcuda_ctx *c, void *base, size_t block_bytes, size_t offset,
                             int block_tokens, int64_t width, int bf16, const float *x, int64_t n,
                             const int32_t *seq, const int32_t *pos, const int32_t *blocks, int64_t ld_blocks)
{
	if (width <= 0 || n <= 0)
		return 0;
	return klaunch("kfwd_kv_write", kv_write_kernel, dim3(grid_for(width * n)), dim3(256), 0, STREAM(c),
	               (char *)base, block_bytes, offset, block_tokens, width, bf16, x, n, seq, pos, blocks,
	               ld_blocks);
}

extern "C" int kfwd_fill_random(struct kcuda_ctx *c, void *dst, size_t bytes, uint64_t seed)
{
	size_t n = bytes / 2;
	if (n == 0)
		return 0;
	return klaunch("kfwd_fill_random", fill_kernel,
	               dim3(grid_for((int64_t)(n < ((size_t)1 << 40) ? n : ((size_t)1 << 40)))), dim3(256), 0,
	               STREAM(c), (uint16_t *)dst, n, seed);
}

extern "C" int kfwd_mem_info(size_t *free_bytes, size_t *total_bytes)
{
	return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : ERR_CUDA;
}

/* ---- staging ----------------------------------------------------------------------------------- */
struct seg {
	char *dst;
	size_t off, bytes;
	unsigned gen; /* destination allocation (kfwd_stage_new_dst) */
};

struct kfwd_stager {
	cudaStream_t st;
	char *buf[2];
	cudaEvent_t done[2];
	bool busy[2];
	size_t cap, fill;
	int cur;
	struct seg *segs;
	int n_segs, cap_segs;
	unsigned gen;
};

extern "C" void kfwd_stage_new_dst(struct kfwd_stager *s)
{
	s->gen++;
}

extern "C" int kfwd_stager_create(size_t buf_bytes, struct kfwd_stager **out)
{
	*out = NULL;
	struct kfwd_stager *s = (struct kfwd_stager *)calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cap = buf_bytes;
	s->cap_segs = 1024;
	s->segs = (struct seg *)malloc(sizeof(struct seg) * (size_t)s->cap_segs);
	if (!s->segs || cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking) != cudaSuccess) {
		free(s->segs);
		free(s);
		return ERR_CUDA;
	}
	for (int i = 0; i < 2; i++)
		if (cudaHostAlloc((void **)&s->buf[i], buf_bytes, cudaHostAllocDefault) != cudaSuccess ||
		    cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming) != cudaSuccess) {
			kfwd_stager_destroy(s);
			return ERR_CUDA;
		}
	*out = s;
	return 0;
}

static int flush(struct kfwd_stager *s)
{
	if (s->fill == 0)
		return 0;
	cudaError_t e;
	for (int i = 0; i < s->n_segs; i++)
		if ((e = cudaMemcpyAsync(s->segs[i].dst, s->buf[s->cur] + s->segs[i].off, s->segs[i].bytes,
		                         cudaMemcpyHostToDevice, s->st)) != cudaSuccess) {
			fprintf(stderr, "kfwd: staged copy of %zu bytes failed: %s\n", s->segs[i].bytes,
			        cudaGetErrorString(e));
			return ERR_CUDA;
		}
	if ((e = cudaEventRecord(s->done[s->cur], s->st)) != cudaSuccess) {
		fprintf(stderr, "kfwd: staging event: %s\n", cudaGetErrorString(e));
		return ERR_CUDA;
	}
	s->busy[s->cur] = true;
	s->cur ^= 1;
	s->fill = 0;
	s->n_segs = 0;
	if (s->busy[s->cur]) { /* the other buffer's copy must be done before it is refilled */
		if ((e = cudaEventSynchronize(s->done[s->cur])) != cudaSuccess) {
			fprintf(stderr, "kfwd: staged copy failed: %s\n", cudaGetErrorString(e));
			return ERR_CUDA;
		}
		s->busy[s->cur] = false;
	}
	return 0;
}

extern "C" int kfwd_stage(struct kfwd_stager *s, void *dst_dev, const void *src, size_t bytes)
{
	const char *p = (const char *)src;
	char *d = (char *)dst_dev;
	while (bytes > 0) {
		if (s->fill == s->cap || s->n_segs == s->cap_segs) {
			int rc = flush(s);
			if (rc)
				return rc;
		}
		size_t take = s->cap - s->fill < bytes ? s->cap - s->fill : bytes;
		memcpy(s->buf[s->cur] + s->fill, p, take);
		struct seg *last = s->n_segs ? &s->segs[s->n_segs - 1] : NULL;
		/* one copy per run of consecutive bytes of ONE allocation: two cudaMalloc blocks may be
		 * adjacent, but a copy must not span them */
		if (last && last->gen == s->gen && last->dst + last->bytes == d &&
		    last->off + last->bytes == s->fill)
			last->bytes += take;
		else
			s->segs[s->n_segs++] = (struct seg){d, s->fill, take, s->gen};
		s->fill += take;
		p += take;
		d += take;
		bytes -= take;
	}
	return 0;
}

extern "C" int kfwd_stager_finish(struct kfwd_stager *s)
{
	int rc = flush(s);
	if (rc)
		return rc;
	cudaError_t e = cudaStreamSynchronize(s->st);
	if (e != cudaSuccess) {
		fprintf(stderr, "kfwd: staged copies failed: %s\n", cudaGetErrorString(e));
		return ERR_CUDA;
	}
	return 0;
}

extern "C" void kfwd_stager_destroy(struct kfwd_stager *s)
{
	if (!s)
		return;
	if (s->st)
		cudaStreamSynchronize(s->st);
	for (int i = 0; i < 2; i++) {
		if (s->buf[i])
			cudaFreeHost(s->buf[i]);
		if (s->done[i])
			cudaEventDestroy(s->done[i]);
	}
	if (s->st)
		cudaStreamDestroy(s->st);
	free(s->segs);
	free(s);
}

/* ---- graphs ------------------------------------------------------------------------------------ */
extern "C" int kfwd_graph_begin(struct kcuda_ctx *c)
{
	return cudaStreamBeginCapture(STREAM(c), cudaStreamCaptureModeThreadLocal) == cudaSuccess ? 0
	                                                                                          : ERR_CUDA;
}

extern "C" {
size_t kfwd_graph_nodes_last = 0;
}

extern "C" int kfwd_graph_end(struct kcuda_ctx *c, void **exec_out)
{
	cudaGraph_t g = NULL;
	cudaGraphExec_t ex = NULL;
	*exec_out = NULL;
	cudaError_t e = cudaStreamEndCapture(STREAM(c), &g);
	if (e != cudaSuccess) {
		fprintf(stderr, "kfwd: graph capture failed: %s\n", cudaGetErrorString(e));
		cudaGetLastError();
		return ERR_CUDA;
	}
	size_t n_nodes = 0;
	kfwd_graph_nodes_last = cudaGraphGetNodes(g, NULL, &n_nodes) == cudaSuccess ? n_nodes : 0;
	e = cudaGraphInstantiate(&ex, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess) {
		fprintf(stderr, "kfwd: graph instantiate failed: %s\n", cudaGetErrorString(e));
		return ERR_CUDA;
	}
	*exec_out = (void *)ex;
	return 0;
}

extern "C" int kfwd_graph_launch(struct kcuda_ctx *c, void *exec)
{
	return cudaGraphLaunch((cudaGraphExec_t)exec, STREAM(c)) == cudaSuccess ? 0 : ERR_CUDA;
}

extern "C" void kfwd_graph_destroy(void *exec)
{
	if (exec)
		cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

extern "C" int kfwd_d2d_gbps(struct kcuda_ctx *c, size_t bytes, int reps, double *gbps)
{
	void *a = NULL, *b = NULL;
	cudaEvent_t e0, e1;
	*gbps = 0;
	if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
		cudaFree(a);
		return ERR_CUDA;
	}
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, STREAM(c)); /* warm-up */
	cudaEventRecord(e0, STREAM(c));
	for (int i = 0; i < reps; i++)
		cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, STREAM(c));
	cudaEventRecord(e1, STREAM(c));
	cudaEventSynchronize(e1);
	float ms = 0;
	cudaEventElapsedTime(&ms, e0, e1);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	if (ms <= 0)
		return ERR_CUDA;
	/* a copy reads and writes `bytes`: report the read (= weight-streaming) rate of bytes moved */
	*gbps = (double)bytes * reps / (ms * 1e-3) / 1e9;
	return 0;
}
