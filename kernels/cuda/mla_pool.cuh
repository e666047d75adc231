/* The paged-KV addressing the MLA decode kernels of mla_attn_dec6.cu and mla_attn_dec7.cu share:
 * a layer's rows in the pool and a sequence's block table (kernels.h's kcuda_kv_view /
 * kcuda_attn_rows, with the row size and the block-size shift precomputed), the row of a position,
 * a table into shared memory. No CUDA header of its own, so tests/unit/mla_dec6_sim.cc (which
 * defines KMLA_SIM and the device keywords) can build the kernel on the CPU. Internal to
 * kernels/cuda. */
#ifndef TANDEM_KERNELS_CUDA_MLA_POOL_CUH
#define TANDEM_KERNELS_CUDA_MLA_POOL_CUH

#include <stddef.h>
#include <stdint.h>

struct kmla_pool {
	const uint8_t *base;
	int64_t n_blocks;
	size_t block_bytes, offset;
	int bt, bt_shift, row_bytes; /* bt_shift: log2(bt) when a power of two, else -1 */
	const int32_t *qseq, *blocks;
	int64_t ld_blocks;
	int tbl_n; /* table entries kept in shared memory (0: looked up in global memory) */
};
#ifndef KMLA_SIM
#include "kernels/kernels.h"

static inline kmla_pool kmla_pool_of(const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows,
                                     int tbl_n)
{
	kmla_pool p;
	p.base = (const uint8_t *)kv->base;
	p.n_blocks = kv->n_blocks;
	p.block_bytes = kv->block_bytes;
	p.offset = kv->offset;
	p.bt = kv->block_tokens;
	p.bt_shift = -1;
	for (int sh = 0; sh < 31; sh++)
		if (kv->block_tokens == 1 << sh)
			p.bt_shift = sh;
	p.row_bytes = (int)kv->dim * (kv->bf16 ? 2 : 4);
	p.qseq = rows->qseq;
	p.blocks = rows->blocks;
	p.ld_blocks = rows->ld_blocks;
	p.tbl_n = tbl_n;
	return p;
}
#endif

/* the pool row of position pos in table tbl (its first tbl_n entries in tbl_s), or NULL for a
 * position outside the table or a block id outside the pool */
__device__ __forceinline__ const uint8_t *kmla_pool_row(const kmla_pool &a, const int32_t *tbl_s, int32_t tbl,
                                                        int32_t pos)
{
	if (pos < 0 || (int64_t)pos >= a.ld_blocks * a.bt)
		return NULL;
	const int bi = a.bt_shift >= 0 ? pos >> a.bt_shift : pos / a.bt;
	const int64_t blk =
	    bi < a.tbl_n ? (int64_t)tbl_s[bi] : (int64_t)a.blocks[(int64_t)tbl * a.ld_blocks + bi];
	if (blk < 0 || blk >= a.n_blocks)
		return NULL;
	return a.base + (size_t)blk * a.block_bytes + a.offset +
	       (size_t)(pos - bi * a.bt) * (size_t)a.row_bytes;
}
/* qseq[row] (table 0 without qseq) and the first tbl_n entries of that table into shared memory
 * by the block's nthreads threads (published by a barrier before use) */
__device__ __forceinline__ int32_t kmla_pool_table(const kmla_pool &a, int32_t *tbl_s, int64_t row,
                                                   int nthreads)
{
	const int32_t tbl = a.qseq ? a.qseq[row] : 0;
	const int32_t *tr = a.blocks + (int64_t)tbl * a.ld_blocks;
	for (int i = (int)threadIdx.x; i < a.tbl_n; i += nthreads)
		tbl_s[i] = tr[i];
	return tbl;
}

#endif
