/* Embedding lookup: y[t] = dequantized row ids[t] of the token table (MODEL-SPEC.md §2.1), any
 * weight type the GEMV takes. ids live on the device (they may come from the sampler inside a CUDA
 * graph), so they are checked in the kernel: an id outside [0, n_out) produces a row of NaN (never
 * an out-of-bounds read) and bumps the context's error counter, which kcuda_ctx_take_errors reports.
 * Grid: x over 16-element pieces of a row (quant_piece.cuh), y over tokens. */
#include <errno.h>

#include "kernels/cuda/quant_piece.cuh"

template <int T>
__global__ void embed_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows, int64_t n_in,
                             const int32_t *__restrict__ ids, float *y, int64_t ldy, unsigned *err, bool vec)
{
	KDEP_ENTRY();
	const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	const int64_t t = blockIdx.y;
	const int32_t id = ids[t];
	float *yr = y + t * ldy;
	const int64_t n_items = vec ? n_in / 16 : n_in;
	if (p >= n_items)
		return;
	if (id < 0 || id >= n_rows) {
		if (p == 0)
			atomicAdd(err, 1u);
		for (int64_t k = vec ? 16 * p : p; k < (vec ? 16 * p + 16 : p + 1); k++)
			yr[k] = __int_as_float(0x7fc00000);
		return;
	}
	const uint8_t *row = w + (size_t)id * row_bytes;
	if (vec) {
		float v[16];
		kq_values<T>(row, p, v);
#pragma unroll
		for (int k = 0; k < 16; k++)
			yr[16 * p + k] = v[k];
	} else if (T == KT_F32) { /* float tables of any width: element-wise */
		yr[p] = ((const float *)row)[p];
	} else if (T == KT_F16) {
		yr[p] = kc_h2f(((const uint16_t *)row)[p]);
	} else {
		yr[p] = kc_bf2f(((const uint16_t *)row)[p]);
	}
}

template <int T>
static int embed_type(struct kcuda_ctx *c, const struct kweight *w, const int32_t *ids, int64_t n_tok,
                      float *y, int64_t ldy)
{
	const bool vec = (T != KT_F32 && T != KT_F16 && T != KT_BF16) ||
	                 (w->n_in % 16 == 0 && w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0);
	const int64_t n_items = vec ? w->n_in / 16 : w->n_in;
	dim3 grid((unsigned)((n_items + 127) / 128), (unsigned)n_tok);
	return klaunch("embed", embed_kernel<T>, dim3(grid), dim3(128), 0, c->stream,
	               (const uint8_t *)w->data, w->row_bytes, w->n_out, w->n_in, ids, y, ldy, c->err_dev,
	               vec);
}

extern "C" int kcuda_embed(struct kcuda_ctx *c, const struct kweight *w, const int32_t *ids, int64_t n_tok,
                           float *y, int64_t ldy)
{
	size_t rb = 0;
	if (!c || !w || !w->data || !ids || !y || n_tok < 0 || n_tok > 65535 || ldy < w->n_in ||
	    !ktype_row_bytes(w->type, w->n_in, &rb) || rb != w->row_bytes)
		return kcuda_bad_arg(
		    "embed",
		    "n_tok %lld (max 65535), ldy %lld, %s table n_in %lld row_bytes %zu (want %zu)%s",
		    (long long)n_tok, (long long)ldy, w ? ktype_name(w->type) : "-",
		    w ? (long long)w->n_in : 0LL, w ? w->row_bytes : 0, rb,
		    !c || !w || !w->data || !ids || !y ? ", or a null pointer" : "");
	if (n_tok == 0)
		return 0;
	switch (w->type) {
#define X(T)                                                                                                 \
	case T: return embed_type<T>(c, w, ids, n_tok, y, ldy);
		KCUDA_FOR_EACH_TYPE(X)
#undef X
	default: return ERR_UNSUPPORTED;
	}
}
