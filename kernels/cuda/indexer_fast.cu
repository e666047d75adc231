/* DSA indexer scores on tensor cores: the fast path behind kcuda_indexer_scores / _topk (indexer.cu
 * keeps the first kernel for other shapes and TANDEM_CUDA_ATTN=ref). Result as kcpu_indexer_scores: scores[t]
 * = sum over h = 0..HI-1, in order, of w_h * d_h where d_h = scale * (q_h . k_t) > 0 (separate multiply and
 * add, no FMA), -inf for an invalid key (counted as an error).
 *
 * Why tensor cores: a key (DI 128 bf16 = 256 B) meets HI = 32 heads: 4096 multiply-adds, 16 per
 * byte: 64 T/s at 4 TB/s, twice what the fp32 cores give. mma.sync m16n8k16 (bf16, fp32
 * accumulate; sm_80+, so sm_90/100/120). q is split into three bf16 parts (hi + mid + lo = the
 * fp32 value: 3 x 8 mantissa bits) multiplied one after the other into the same accumulator; bf16
 * keys need nothing more (every product exact), fp32 keys are split the same way and the six part
 * products above fp32's rounding are summed. Only the fp32 accumulation order differs from the
 * CPU's: on integer test data the scores are bit-equal, on float data ~1e-7 relative.
 *
 * Grid (key range of a.tiles x 64 positions, query row); 4 warps. At decode batch sizes the range is
 * one tile (enough blocks to cover the SMs: at batch 1, ctx 4096 two tiles a block left 100 of 132
 * SMs idle); with many rows or long contexts two (the q fragments, 16 KB from L2 per block, are
 * loaded half as often). The range is walked in tiles of 64 keys:
 * the 64 row addresses are looked up first, the rows copied to shared memory with 16-byte
 * cp.async. bf16 keys: two tiles, the next in flight while the current one is scored (the
 * registers allow 3 blocks an SM either way). fp32 keys: one tile a block (~51 KB instead of ~85:
 * 3 blocks an SM, not 2; the copy overlaps other blocks' products; the next tile's addresses are
 * looked up while the current one is scored); H200 session 14: fp32 indexer 238 -> 187 ms a
 * 2048-token step, bf16 with one tile 93 -> 98 (not taken). K fragments of bf16 keys come by
 * ldmatrix.
 * Warp w takes heads [16 mw, 16 mw + 16)
 * and a share of the keys (with HI <= 16 each warp takes 16 keys, <= 32 32 keys, <= 64 all 64);
 * its q fragments sit in registers for the whole kernel. d_h goes to shared memory as
 * [key][head]; then one thread per key sums over the heads in order, as the CPU. */
#include <errno.h>
#include <limits.h>

#include <type_traits>

#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/mla_attn_tile.cuh"
#include "kernels/cuda/topk_sel.cuh"

#define IF_WARPS 4
#define IF_THREADS (32 * IF_WARPS)
#define IF_TK 64 /* keys per tile (the kernels without the fused top-k) */
#define IF_DMAX 128
#define IF_HMAX 64
#define IF_SP (IF_HMAX + 1) /* d row stride (floats) */

__device__ __forceinline__ void if_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
	             "{%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* x, y (x at the lower index) -> three bf16x2 whose sum is exactly (x, y) (normal range) */
__device__ __forceinline__ void if_split3(float x, float y, uint32_t *p0, uint32_t *p1, uint32_t *p2)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
	const float2 hf = __bfloat1622float2(h);
	const float rx = x - hf.x, ry = y - hf.y;
	const __nv_bfloat162 m = __floats2bfloat162_rn(rx, ry);
	const float2 mf = __bfloat1622float2(m);
	const __nv_bfloat162 l = __floats2bfloat162_rn(rx - mf.x, ry - mf.y);
	*p0 = *(const uint32_t *)&h;
	*p1 = *(const uint32_t *)&m;
	*p2 = *(const uint32_t *)&l;
}

/* element e (< 2 * half) of a head's rotary part after RoPE (src unroped): fused.cu's fu_rot on the
 * pair holding e, with cs[pair] = (cos, sin) of pos * inv_freq[pair] (precise sincosf), computed
 * once per block (a sincosf per element made the kernel slow: a stack frame for its slow path) */
__device__ __forceinline__ float if_rope_elem(const float *src, int e, int half, int pairing,
                                              const float2 *cs)
{
	const bool first = pairing ? e < half : (e & 1) == 0;
	const int i = pairing ? (first ? e : e - half) : e >> 1;
	const int other = pairing ? (first ? e + half : e - half) : (first ? e + 1 : e - 1);
	const float co = cs[i].x, sn = cs[i].y;
	const float u0 = first ? src[e] : src[other], u1 = first ? src[other] : src[e];
	return first ? u0 * co - u1 * sn : u0 * sn + u1 * co;
}

/* v[i] without indexing the array at run time (it stays in registers, not local memory) */
template <int R, typename T> __device__ __forceinline__ T if_pick(const T (&v)[R], int i)
{
	T x = v[0];
#pragma unroll
	for (int r = 1; r < R; r++)
		x = i == r ? v[r] : x;
	return x;
}

/* shared key row stride in values (16-byte multiple, conflict-free fragment loads) */
static __host__ __device__ int if_rs(int DI, bool f32)
{
	return f32 ? DI + 4 : DI + 8;
}
static size_t if_smem(int DI, bool f32, int TK = IF_TK, int R = 1)
{
	return (f32 ? 1 : 2) * (size_t)TK * (size_t)if_rs(DI, f32) * (f32 ? 4 : 2) /* key tiles */ +
	       (size_t)R * TK * IF_SP * 4 /* d */ + (size_t)R * IF_HMAX * 4 /* w */ +
	       2 * TK * sizeof(void *) /* addresses */;
}

/* TK: keys per tile (64; 32 for the fused top-k at small batch: twice the blocks). MW: head tiles
 * of 16 (warps per key group; 4 / MW key groups); NT: n-tiles (8 keys) per warp.
 * F32: fp32 keys, split into three bf16 parts as the fragments are read; the six products whose
 * parts' weights add up to at most 2^-16 are summed (the rest lie below fp32's rounding).
 * SEL: the top-k is finished here (topk_sel.cuh): rows with n <= sel_k are written as 0..n-1 by
 * block 0 (nothing scored); otherwise every block counts its keys' top digit into the row's
 * histogram and the last block of the row (ticket) selects.
 * R > 1 (prompts; not SEL or ROPE; R = IF_WARPS / MW): the block scores R consecutive query rows
 * against each key tile it copies, warp w taking row w / MW's head tile w % MW over all TK keys, so
 * a tile read from L2 serves R rows instead of one. Rows of one table (one sequence: a prompt
 * chunk) share the tiles; where the block's rows use different tables it runs one pass a row. */
/* keys a block of the row (nk keys) takes: with a.even (one-row blocks, no fused top-k) the row's own
 * TK-key tiles spread evenly over the grid's key ranges, so a row shorter than the plan's max_keys (a
 * decode graph's context bucket is the next power of two; a batch of mixed lengths) keeps every range
 * busy; else a.tiles tiles (the last ranges of a short row are then empty). Never more than the
 * plan's TK x a.tiles (nk <= max_keys <= ranges x TK x a.tiles). */
template <int TK, int R, bool SEL> __device__ __forceinline__ int64_t if_span(const idx_args &a, int64_t nk)
{
	if (R == 1 && !SEL && a.even) {
		const int64_t G = gridDim.x, nt = (nk + TK - 1) / TK;
		return (int64_t)TK * ((nt + G - 1) / G);
	}
	return (int64_t)TK * a.tiles;
}

template <int TK, int MW, bool F32, bool ROPE, bool SEL, int R = 1>
__global__ void __launch_bounds__(IF_THREADS) indexer_fast_kernel(idx_args a)
{
	static_assert(R == 1 || (!SEL && !ROPE && MW * R == IF_WARPS),
	              "several rows: 4 warps, no fused top-k");
	/* a.pf: bring this block's key rows into L2 while the kernel before still runs. The rows are
	 * older positions (the newest one, written just before, is at most re-fetched: L2 is coherent and
	 * a prefetch returns no data), found through qseq and the block table, which the host uploads
	 * before the step's first kernel (plain stream order): read early, they are this step's values,
	 * and they only direct a hint. Nothing else is touched before KDEP_ENTRY. */
	if (R == 1 && a.pf && threadIdx.x == 0) {
		int64_t nk0 =
		    a.n_keys ? (int64_t)a.n_keys[blockIdx.y] : a.pos0 + blockIdx.y + 1; /* a step input */
		nk0 = nk0 < 0 ? 0 : nk0 > a.max_keys ? a.max_keys : nk0;
		const int64_t sp = if_span<TK, R, SEL>(a, nk0);
		const int64_t p0 = (int64_t)blockIdx.x * sp;
		const int64_t p1 = min(min(p0 + sp, a.max_keys), a.ld_blocks * (int64_t)a.bt);
		const int32_t tb = a.qseq ? a.qseq[blockIdx.y] : 0;
		const size_t rb = (size_t)a.DI * (F32 ? 4 : 2);
		for (int64_t p = p0; p < p1;) {
			const int64_t pe = min(p1, (p / a.bt + 1) * a.bt); /* the rest of p's KV block */
			const int64_t blk = a.blocks[(int64_t)tb * a.ld_blocks + p / a.bt];
			if (blk >= 0 && blk < a.n_blocks)
				kdep_prefetch_l2(a.base + (size_t)blk * a.block_bytes + a.offset +
				                     (size_t)(p % a.bt) * rb,
				                 (size_t)(pe - p) * rb);
			p = pe;
		}
	}
	/* early (a.early_new > 0, no fused top-k): the block's old key rows (positions below n_keys -
	 * early_new: written by earlier steps) are looked up and copied into shared memory before
	 * KDEP_ENTRY; n_keys, qseq and the block table are step inputs the host uploads (synchronously)
	 * before the step's first kernel, so reading them early is safe. The new rows, q and w follow
	 * the wait. */
	const bool pre = !SEL && R == 1 && a.early_new > 0;
	if (!pre)
		KDEP_ENTRY();
	typedef typename std::conditional<F32, float, uint16_t>::type val_t;
	constexpr int KG = R == 1 ? IF_WARPS / MW : 1; /* key groups */
	constexpr int NT = TK / 8 / KG; /* n-tiles per warp */
	static_assert(NT >= 1 && NT * 8 * KG == TK && TK % 32 == 0, "tile shape");
	extern __shared__ __align__(16) uint8_t if_sm[];
	const int DI = a.DI, HI = a.HI, RS = if_rs(DI, F32);
	constexpr int NST = F32 ? 1 : 2; /* key tiles (above) */
	val_t *k_s = (val_t *)if_sm; /* [NST][TK][RS] */
	float *d_s = (float *)(k_s + NST * TK * RS); /* [TK][SP] */
	float *w_s = d_s + R * TK * IF_SP; /* [R][HMAX] */
	const uint8_t **addr_s = (const uint8_t **)(w_s + R * IF_HMAX); /* [2][TK] */

	const int64_t row = (int64_t)blockIdx.y * R; /* the block's first row */
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3;
	int64_t nkr[R]; /* each row's key count (0 past n_rows) and table */
	int32_t tblr[R];
#pragma unroll
	for (int r = 0; r < R; r++) {
		const bool in = R == 1 || row + r < a.n_rows;
		nkr[r] = !in ? 0 : a.n_keys ? (int64_t)a.n_keys[row + r] : a.pos0 + row + r + 1;
		tblr[r] = in && a.qseq ? a.qseq[row + r] : 0; /* beside n_keys: one round trip for both */
		if (nkr[r] < 0 || nkr[r] > a.max_keys) {
			if (tid == 0 && blockIdx.x == 0)
				atomicAdd(a.err, 1u);
			nkr[r] = nkr[r] < 0 ? 0 : a.max_keys;
		}
		if (!SEL && a.skip_le > 0 && nkr[r] <= a.skip_le)
			nkr[r] = 0; /* every key is selected: the scores are not read */
	}
	/* the tiles' table: the first row with keys to score (a skipped row's table does not count) */
	int64_t nk = nkr[0];
	int32_t tbl = tblr[0];
	bool one_table = true, have = nkr[0] > 0;
#pragma unroll
	for (int r = 1; r < R; r++) {
		nk = max(nk, nkr[r]);
		if (nkr[r] > 0) {
			one_table = one_table && (!have || tblr[r] == tbl);
			tbl = have ? tbl : tblr[r];
			have = true;
		}
	}
	if (SEL) {
		if (nk <= a.sel_k) { /* every key is selected, in order: block 0 writes it, no scores */
			if (blockIdx.x == 0) {
				int32_t *o = a.sel + row * a.ld_sel;
				for (int i = tid; i < (int)nk; i += IF_THREADS)
					o[i] = i;
				if (tid == 0 && a.nsel)
					a.nsel[row] = (int32_t)nk;
			}
			return;
		}
	} else if (nk == 0) {
		return; /* no row to score (skip_le: every key is selected, the scores are not read) */
	}
	const int64_t span = if_span<TK, R, SEL>(a, nk);
	const int64_t k0 = (int64_t)blockIdx.x * span;
	if (k0 >= nk)
		return; /* (SEL: such blocks take no ticket: the row counts ceil(nk / (TK tiles)) blocks) */
	int64_t k1 = min(nk, k0 + span);
	int ntiles = (int)((k1 - k0 + TK - 1) / TK);
	unsigned *gh = SEL ? a.zs + row * KSEL_ROW_WORDS : NULL; /* the row's digit-0 histogram */
	const int64_t old_end = pre ? nk - a.early_new : 0; /* keys below it: written by earlier steps */

	auto fill_addr = [&](int n, int st) {
		if (tid < TK) {
			const int64_t p = k0 + (int64_t)n * TK + tid;
			const uint8_t *rp = NULL;
			if (p < k1) {
				if (p < a.ld_blocks * a.bt) {
					const int64_t blk = a.blocks[(int64_t)tbl * a.ld_blocks + p / a.bt];
					if (blk >= 0 && blk < a.n_blocks)
						rp = a.base + (size_t)blk * a.block_bytes + a.offset +
						     (size_t)(p % a.bt) * (size_t)DI * sizeof(val_t);
				}
				if (!rp)
					atomicAdd(a.err, 1u);
			}
			addr_s[st * TK + tid] = rp;
		}
	};
	const int nch = DI * (int)sizeof(val_t) / 16; /* 16-byte pieces per row */
	/* the copies of stage st's rows (tile n); part 1: only rows below old_end, 2: only the others,
	 * 0: all. One cp.async group per call. A thread's pieces tid, tid + IF_THREADS, ... walk (row,
	 * piece) by a fixed step instead of a division each (nch is a kernel argument: the division
	 * by it was ~36 of the ~40 instructions a piece, a third of the kernel's, ncu H200 2026-12-04) */
	const int st_r = IF_THREADS / nch, st_c = IF_THREADS - st_r * nch;
	const int r_first = tid / nch, c_first = tid - r_first * nch;
	auto issue = [&](int n, int st, int part) {
		int r = r_first, cc = c_first;
		for (int i = tid; i < TK * nch; i += IF_THREADS, r += st_r, cc += st_c) {
			if (cc >= nch)
				cc -= nch, r++;
			if (part) {
				const bool old = k0 + (int64_t)n * TK + r < old_end;
				if (old != (part == 1))
					continue;
			}
			const uint8_t *p = addr_s[st * TK + r];
			uint8_t *dst = (uint8_t *)(k_s + ((NST == 2 ? st : 0) * TK + r) * RS) + 16 * cc;
			if (p)
				katt_cp16(dst, p + 16 * cc);
			else
				*(uint4 *)dst = make_uint4(0, 0, 0, 0);
		}
		katt_cp_commit();
	};
	if (pre) {
		fill_addr(0, 0);
		__syncthreads();
		issue(0, 0, 1);
		KDEP_ENTRY();
		issue(0, 0, 2);
	}
	/* written by the kernels before (idx_prep): read only from here on */
	const float *qg = kdep_after(a.q), *wg = kdep_after(a.w);

	for (int i = tid; i < R * IF_HMAX; i += IF_THREADS) {
		const int r = i / IF_HMAX, h = i - r * IF_HMAX;
		w_s[i] = h < HI && if_pick(nkr, r) > 0 ? wg[(row + r) * (int64_t)HI + h] : 0.0f;
	}
	__shared__ float2 rcs_s[IF_DMAX / 2]; /* ROPE: (cos, sin) of the row's angles */
	if (ROPE) {
		if (tid < a.qr_R / 2) {
			float sn, co;
			sincosf((float)a.qr_pos[row] * a.qr_inv[tid], &sn, &co);
			rcs_s[tid] = make_float2(co, sn);
		}
		__syncthreads();
	}
	/* q fragments: heads 16 mw + (g, g + 8), dims ks 16 + 2t (+ 8); loaded first (as before
	 * 16:00: see mla_attn_mma.cu on the 16:40 H200 run) */
	const int mw = warp % MW, kg = R == 1 ? warp / MW : 0, wr = R == 1 ? 0 : warp / MW; /* wr: the row */
	const int nks = DI / 16;
	uint32_t qf[IF_DMAX / 16][3][4];
#pragma unroll
	for (int ks = 0; ks < IF_DMAX / 16; ks++)
#pragma unroll
		for (int r = 0; r < 4; r++) {
			const int h = 16 * mw + g + ((r & 1) ? 8 : 0);
			const int col = ks * 16 + 2 * t + ((r & 2) ? 8 : 0);
			float2 v = make_float2(0.0f, 0.0f);
			if (ks < nks && h < HI && if_pick(nkr, wr) > 0) {
				const float *qh = qg + ((row + wr) * HI + h) * (int64_t)DI;
				if (ROPE && col < a.qr_R) { /* the rotary part, roped here (col even) */
					v.x = if_rope_elem(qh, col, a.qr_R / 2, a.qr_pairing, rcs_s);
					v.y = if_rope_elem(qh, col + 1, a.qr_R / 2, a.qr_pairing, rcs_s);
				} else {
					v = *(const float2 *)(qh + col);
				}
			}
			if_split3(v.x, v.y, &qf[ks][0][r], &qf[ks][1][r], &qf[ks][2][r]);
		}
	/* one pass, or (R > 1, rows of different tables) one pass a row: the tiles follow row ps's
	 * table and only its warps score them */
	const int npass = R == 1 || one_table ? 1 : R;
	for (int ps = 0; ps < npass; ps++) {
		if (npass > 1) {
			if (k0 >= if_pick(nkr, ps))
				continue; /* block-uniform */
			tbl = if_pick(tblr, ps);
			k1 = min(if_pick(nkr, ps), k0 + TK * a.tiles);
			ntiles = (int)((k1 - k0 + TK - 1) / TK);
		}
		if (!pre) {
			fill_addr(0, 0);
			__syncthreads();
			issue(0, 0, 0);
		}
		const bool active =
		    16 * mw < HI && (R == 1 || (if_pick(nkr, wr) > k0 && (npass == 1 || wr == ps)));

		for (int n = 0; n < ntiles; n++) {
			const int st = n & 1; /* address stage (and key stage with two) */
			if (n + 1 < ntiles)
				fill_addr(n + 1, st ^ 1);
			if (NST == 2) {
				__syncthreads();
				if (n + 1 < ntiles) {
					issue(n + 1, st ^ 1, 0);
					katt_cp_wait<1>();
				} else {
					katt_cp_wait<0>();
				}
			} else {
				katt_cp_wait<0>();
			}
			__syncthreads();
			const val_t *kt = k_s + (NST == 2 ? st : 0) * TK * RS;
			if (active) {
				float acc[NT][4];
#pragma unroll
				for (int j = 0; j < NT; j++)
					acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
				for (int ks = 0; ks < IF_DMAX / 16; ks++) {
					if (ks < nks) {
						if (!F32 && NT % 2 == 0) {
							/* ldmatrix, two n-tiles a load: keys 8j + 0-7 x dims
							 * +0, +8, then keys 8j + 8-15 (RS 4 mod 32 words:
							 * conflict-free) */
#pragma unroll
							for (int j = 0; j < NT; j += 2) {
								uint32_t b[4];
								katt_ldm4(
								    b, kt +
								           (kg * NT * 8 + 8 * j +
								            (lane >> 4) * 8 + (lane & 7)) *
								               RS +
								           ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
								for (int p = 0; p < 3; p++) {
									if_mma(acc[j], qf[ks][p], b[0], b[1]);
									if_mma(acc[j + 1], qf[ks][p], b[2],
									       b[3]);
								}
							}
						} else {
#pragma unroll
							for (int j = 0; j < NT; j++) {
								const val_t *kr =
								    kt + (kg * NT * 8 + 8 * j + g) * RS +
								    ks * 16 + 2 * t;
								if (F32) {
									const float2 x = *(const float2 *)kr,
									             y = *(
									                 const float2 *)(kr +
									                                 8);
									uint32_t b0[3], b1[3];
									if_split3(x.x, x.y, &b0[0], &b0[1],
									          &b0[2]);
									if_split3(y.x, y.y, &b1[0], &b1[1],
									          &b1[2]);
									if_mma(acc[j], qf[ks][0], b0[0],
									       b1[0]);
									if_mma(acc[j], qf[ks][1], b0[0],
									       b1[0]);
									if_mma(acc[j], qf[ks][0], b0[1],
									       b1[1]);
									if_mma(acc[j], qf[ks][2], b0[0],
									       b1[0]);
									if_mma(acc[j], qf[ks][1], b0[1],
									       b1[1]);
									if_mma(acc[j], qf[ks][0], b0[2],
									       b1[2]);
								} else {
									const uint32_t
									    b0 = *(const uint32_t *)kr,
									    b1 = *(const uint32_t *)(kr + 8);
									if_mma(acc[j], qf[ks][0], b0, b1);
									if_mma(acc[j], qf[ks][1], b0, b1);
									if_mma(acc[j], qf[ks][2], b0, b1);
								}
							}
						}
					}
				}
#pragma unroll
				for (int j = 0; j < NT; j++) {
					const int key = wr * TK + kg * NT * 8 + 8 * j + 2 * t,
					          h = 16 * mw + g;
					d_s[key * IF_SP + h] = __fmul_rn(acc[j][0], a.scale);
					d_s[(key + 1) * IF_SP + h] = __fmul_rn(acc[j][1], a.scale);
					d_s[key * IF_SP + h + 8] = __fmul_rn(acc[j][2], a.scale);
					d_s[(key + 1) * IF_SP + h + 8] = __fmul_rn(acc[j][3], a.scale);
				}
			}
			__syncthreads();
			if (R >
			    1) { /* thread i: row i / TK's key i % TK, the heads summed in order as below */
				for (int i = tid; i < R * TK; i += IF_THREADS) {
					const int r = i / TK, kk = i - r * TK;
					const int64_t p = k0 + (int64_t)n * TK + kk;
					if ((npass > 1 && r != ps) || p >= if_pick(nkr, r))
						continue;
					float s = 0.0f;
					for (int h = 0; h < HI; h++) {
						const float d = d_s[i * IF_SP + h];
						if (d > 0.0f)
							s = __fadd_rn(s, __fmul_rn(w_s[r * IF_HMAX + h], d));
					}
					a.scores[(row + r) * a.ld + p] = addr_s[st * TK + kk] ? s : -INFINITY;
				}
			} else if (tid < TK) { /* whole warps (TK % 32 == 0) */
				const int64_t p = k0 + (int64_t)n * TK + tid;
				float v = -INFINITY;
				if (p < k1) {
					float s = 0.0f;
					for (int h = 0; h < HI; h++) {
						const float d = d_s[tid * IF_SP + h];
						if (d > 0.0f)
							s = __fadd_rn(s, __fmul_rn(w_s[h], d));
					}
					v = addr_s[st * TK + tid] ? s : -INFINITY;
					a.scores[row * a.ld + p] = v;
				}
				if (SEL)
					ksel_count(gh, p < k1, ksel_key(v));
			}
			__syncthreads(); /* the key tile (one tile) and d are free again */
			if (NST == 1 && n + 1 < ntiles)
				issue(n + 1, st ^ 1, 0);
		}
	}
	if (SEL) { /* the last block of the row to get here selects */
		__shared__ unsigned last_s;
		__threadfence(); /* this thread's scores and counts, before the ticket */
		__syncthreads();
		if (tid == 0) {
			const int64_t per = (int64_t)TK * a.tiles;
			const unsigned nblk = (unsigned)((nk + per - 1) / per);
			last_s = atomicAdd(&gh[KSEL_BINS0], 1u) == nblk - 1;
		}
		__syncthreads();
		if (!last_s)
			return;
		__threadfence(); /* the other blocks' scores and counts, after their tickets */
		ksel_tail<IF_THREADS>(a.scores + row * a.ld, (int)nk, a.sel_k, gh, a.sel + row * a.ld_sel,
		                      if_sm, (size_t)a.sel_smem);
		if (tid == 0 && a.nsel)
			a.nsel[row] = a.sel_k;
	}
}

template <int TK, int MW, bool F32, bool ROPE, bool SEL, int R = 1>
static int if_launch_r(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem)
{
	KCUDA_CHECK(cudaFuncSetAttribute(indexer_fast_kernel<TK, MW, F32, ROPE, SEL, R>,
	                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	return klaunch(SEL ? "indexer_sel" : "indexer_fast", indexer_fast_kernel<TK, MW, F32, ROPE, SEL, R>,
	               dim3(grid), dim3(IF_THREADS), smem, c->stream, b);
}
/* several rows a block (64-key tiles, no rope on the loads): 4 rows at HI <= 16, 2 at <= 32 */
static int if_rows_launch(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem, int MW, bool f32)
{
	if (MW == 1)
		return f32 ? if_launch_r<IF_TK, 1, true, false, false, 4>(c, b, grid, smem)
		           : if_launch_r<IF_TK, 1, false, false, false, 4>(c, b, grid, smem);
	return f32 ? if_launch_r<IF_TK, 2, true, false, false, 2>(c, b, grid, smem)
	           : if_launch_r<IF_TK, 2, false, false, false, 2>(c, b, grid, smem);
}

/* TANDEM_IDX_ROWS (read on every call): 1 = one query row a block at prompt sizes too (before
 * 2026-12-02); force = several rows a block wherever the kernel can (any tile count: tests);
 * else several rows at prompt sizes. Returns 0, 1 (prompt sizes) or 2 (force). */
static int if_rows_mode(void)
{
	const char *e = getenv("TANDEM_IDX_ROWS");
	return e && strcmp(e, "1") == 0 ? 0 : e && strcmp(e, "force") == 0 ? 2 : 1;
}
/* the kernel without q's rope (the default: no rope code in it) or with it on the loads */
template <int TK, int MW, bool F32>
static int if_launch(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem)
{
	return b.qr_R ? if_launch_r<TK, MW, F32, true, false>(c, b, grid, smem)
	              : if_launch_r<TK, MW, F32, false, false>(c, b, grid, smem);
}
template <int TK>
static int if_dispatch(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem, int MW, bool f32)
{
	if (MW == 1)
		return f32 ? if_launch<TK, 1, true>(c, b, grid, smem)
		           : if_launch<TK, 1, false>(c, b, grid, smem);
	if (MW == 2)
		return f32 ? if_launch<TK, 2, true>(c, b, grid, smem)
		           : if_launch<TK, 2, false>(c, b, grid, smem);
	return f32 ? if_launch<TK, 4, true>(c, b, grid, smem) : if_launch<TK, 4, false>(c, b, grid, smem);
}

/* blocks of the one-row kernel instance (64-key tiles, no fused top-k) an SM can hold, per device and
 * variant (MW 1 / 2 / 4, fp32 keys, q's rope on the loads); 0: the query failed */
static int if_occupancy(const struct kcuda_ctx *c, int MW, bool f32, bool rope, size_t smem)
{
	typedef void (*kern_t)(idx_args);
	static const kern_t kern[3][2][2] = {{{indexer_fast_kernel<IF_TK, 1, false, false, false>,
	                                       indexer_fast_kernel<IF_TK, 1, false, true, false>},
	                                      {indexer_fast_kernel<IF_TK, 1, true, false, false>,
	                                       indexer_fast_kernel<IF_TK, 1, true, true, false>}},
	                                     {{indexer_fast_kernel<IF_TK, 2, false, false, false>,
	                                       indexer_fast_kernel<IF_TK, 2, false, true, false>},
	                                      {indexer_fast_kernel<IF_TK, 2, true, false, false>,
	                                       indexer_fast_kernel<IF_TK, 2, true, true, false>}},
	                                     {{indexer_fast_kernel<IF_TK, 4, false, false, false>,
	                                       indexer_fast_kernel<IF_TK, 4, false, true, false>},
	                                      {indexer_fast_kernel<IF_TK, 4, true, false, false>,
	                                       indexer_fast_kernel<IF_TK, 4, true, true, false>}}};
	static struct {
		size_t smem;
		int n;
	} cache[64][3][2][2];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : 0;
	const int mi = MW == 1 ? 0 : MW == 2 ? 1 : 2;
	auto &e = cache[dev][mi][f32][rope];
	if (e.n == 0 || e.smem != smem) {
		const kern_t k = kern[mi][f32][rope];
		int n = 0;
		if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		        cudaSuccess ||
		    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, IF_THREADS, smem) != cudaSuccess) {
			(void)cudaGetLastError();
			n = 0;
		}
		e.smem = smem;
		e.n = n;
	}
	return e.n;
}

/* TANDEM_IDX_WAVE=0: the tile counts before session 28 (read once) */
static bool if_wave_on(void)
{
	static const bool on = kcuda_env_long("TANDEM_IDX_WAVE", 0, LONG_MAX, 1) != 0;
	return on;
}
/* 64-key tiles a block between decode and prompt sizes (over 2 tiles an SM in all; slots: the
 * kernel's resident blocks on the device): the fewest that keep the grid (n_q rows x ranges of the
 * row's t64 tiles) within ONE wave of resident blocks, at least 2 (the count before session 28).
 * Why: each block pays a fixed cost (q, 16 KB at GLM-5, split into bf16 parts; the tile pipeline's
 * fill) that more tiles a block amortize, and a grid a little over a whole number of waves ends in
 * a mostly empty one (H200, session 28, bench_cuda_attn, batch 128 at 4k: 2 tiles 115 us, 4 tiles
 * 99, 16 tiles (1.3 waves) 106, 22 tiles (one wave) 76). More rows than slots, or an occupancy
 * query that failed: 2. TANDEM_IDX_WAVE=0 (if_wave_on): 2 everywhere, and the prompt sizes by the
 * tile count alone. */
static int if_wave_tiles(int64_t n_q, int64_t t64, int64_t slots)
{
	const bool on = if_wave_on();
	if (!on || slots < n_q || n_q < 1 || t64 <= 2)
		return 2;
	const int64_t ranges = slots / n_q;
	const int64_t tiles = (t64 + ranges - 1) / ranges;
	return tiles < 2 ? 2 : tiles > INT32_MAX ? INT32_MAX : (int)tiles;
}

/* TANDEM_IDX_EVEN=0: a block's keys by the plan's tile count (before session 28), not an even share
 * of its row's keys (if_span); read once */
static bool if_even_enabled(void)
{
	static const bool on = kcuda_env_long("TANDEM_IDX_EVEN", 0, LONG_MAX, 1) != 0;
	return on;
}

/* TANDEM_IDX_EARLY=0: no key-row work before KDEP_ENTRY (idx_args.early_new) */
static bool if_early_enabled(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("TANDEM_IDX_EARLY");
		v = !(e && strcmp(e, "0") == 0);
	}
	return v != 0;
}

bool kcuda_indexer_fast_ok(struct kcuda_ctx *c, const idx_args &a)
{
	if (a.HI < 1 || a.HI > IF_HMAX || a.DI % 16 || a.DI > IF_DMAX ||
	    ((uintptr_t)a.base | a.block_bytes | a.offset) % 16 || (uintptr_t)a.q % 8)
		return false;
	if (a.qr_R && (a.qr_R < 0 || a.qr_R % 2 || a.qr_R > a.DI || !a.qr_inv || !a.qr_pos ||
	               (a.qr_pairing != 0 && a.qr_pairing != 1)))
		return false;
	return if_smem(a.DI, !a.bf16) <= (size_t)kcuda_smem_optin(c->device);
}

int kcuda_indexer_fast_launch(struct kcuda_ctx *c, const idx_args &a, int64_t n_q)
{
	if (!kcuda_indexer_fast_ok(c, a))
		return ERR_UNSUPPORTED;
	const bool f32 = !a.bf16;
	/* 32-key tiles while the rows' tiles of 32 fit two per SM (batch 1 at 4k: 128 blocks on the
	 * H200's 132 SMs: each block's chain is half as long as with 64), else 64-key tiles; one tile
	 * per block while the tiles of all rows fit two per SM, else two. TANDEM_IDX_TK=32 / 64 forces
	 * the tile (64 everywhere before 2026-11-29 session 5). */
	const int64_t t32 = (a.max_keys + 31) / 32, t64 = (a.max_keys + IF_TK - 1) / IF_TK;
	int TK = n_q * t32 <= 2 * (int64_t)c->n_sm ? 32 : IF_TK;
	const char *tk_env = getenv("TANDEM_IDX_TK");
	if (tk_env && (strcmp(tk_env, "32") == 0 || strcmp(tk_env, "64") == 0))
		TK = atoi(tk_env);
	const size_t smem = if_smem(a.DI, f32, TK);
	/* prefill sizes (more than 64 tiles an SM): 8 tiles a block, so each block's q (HI x DI fp32,
	 * 16 KB at GLM-5, split into three bf16 parts) is loaded once per 512 keys instead of per 128
	 * (H200, GLM-5 8k prefill, session 13: indexer 135 ms a 2048-token step at 2 tiles, 111 at 4;
	 * the prefill 2.32 / 2.23 / 2.18 s at 2 / 4 / 8) */
	const int MW = a.HI <= 16 ? 1 : (a.HI <= 32 ? 2 : 4);
	/* prompt sizes: more than 64 tiles an SM in all and more rows than one wave of blocks holds.
	 * Decode batches stay below that row count even at long contexts (batch 32 at 32k: 16384
	 * tiles), and there the rows are of different sequences, which the several-rows blocks below
	 * serve one pass a row (H200, session 28: batch 32 at 32k 226 us that way, 165 with one row a
	 * block and 16 tiles) */
	const bool band = TK == IF_TK && n_q * t64 > 2 * (int64_t)c->n_sm; /* above decode sizes */
	const int64_t slots = band ? (int64_t)if_occupancy(c, MW, f32, a.qr_R != 0, smem) * c->n_sm : 0;
	const bool prompt = n_q * t64 > 64 * (int64_t)c->n_sm && (n_q > slots || !if_wave_on());
	int tiles = a.tiles > 0 ? a.tiles : !band ? 1 : prompt ? 8 : if_wave_tiles(n_q, t64, slots);
	const char *te = getenv("TANDEM_IDX_TILES"); /* 1..64 forces it (bench: the old 2 everywhere) */
	if (te && atoi(te) >= 1 && atoi(te) <= 64)
		tiles = atoi(te);
	const int64_t ranges = (a.max_keys + (int64_t)TK * tiles - 1) / ((int64_t)TK * tiles);
	if (ranges == 0 || n_q == 0)
		return 0;
	if (ranges > INT32_MAX)
		return ERR_LIMIT;
	/* prompt sizes: R = 4 / MW rows a block share each key tile, so the keys come from L2 R times
	 * less often, where two such blocks still fit an SM (decode rows are of different sequences:
	 * no sharing, and the rows' passes one after another measured slower) */
	const int rows_mode = if_rows_mode();
	const int R =
	    TK == IF_TK && (prompt || rows_mode == 2) && rows_mode && MW <= 2 && !a.qr_R &&
	            2 * if_smem(a.DI, f32, IF_TK, IF_WARPS / MW) <= (size_t)kcuda_smem_optin(c->device)
	        ? IF_WARPS / MW
	        : 1;
	const size_t smem_r = R > 1 ? if_smem(a.DI, f32, IF_TK, R) : smem;
	for (int64_t r0 = 0; r0 < n_q; r0 += 65535) {
		const int64_t nr = n_q - r0 < 65535 ? n_q - r0 : 65535;
		idx_args b = a;
		b.q = a.q + r0 * a.HI * a.DI;
		b.w = a.w + r0 * a.HI;
		b.qseq = a.qseq ? a.qseq + r0 : NULL;
		b.n_keys = a.n_keys ? a.n_keys + r0 : NULL;
		b.pos0 = a.pos0 + r0;
		b.scores = a.scores + r0 * a.ld;
		b.qr_pos = a.qr_pos ? a.qr_pos + r0 : NULL;
		b.tiles = tiles;
		b.even = R == 1 && if_even_enabled();
		b.early_new = if_early_enabled() && R == 1 ? n_q : 0;
		b.n_rows = nr;
		if (R > 1) {
			b.pf = 0;
			const int rc = if_rows_launch(
			    c, b, dim3((unsigned)ranges, (unsigned)((nr + R - 1) / R)), smem_r, MW, f32);
			if (rc)
				return rc;
			continue;
		}
		const dim3 grid((unsigned)ranges, (unsigned)nr);
		const int rc = TK == 32 ? if_dispatch<32>(c, b, grid, smem, MW, f32)
		                        : if_dispatch<IF_TK>(c, b, grid, smem, MW, f32);
		if (rc)
			return rc;
	}
	return 0;
}

/* q's rope on the loads (the TANDEM_IDX_FOLD=1 path) only for HI 17..64 (GLM-5, DeepSeek-V3.2):
 * other shapes take the separate kernels */
template <int TK, int MW, bool F32>
static int if_sel_launch(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem)
{
	if (b.qr_R)
		return MW == 1 ? ERR_UNSUPPORTED : if_launch_r < TK, MW == 1 ? 2 : MW, F32, true,
		       true > (c, b, grid, smem);
	return if_launch_r<TK, MW, F32, false, true>(c, b, grid, smem);
}
template <int TK>
static int if_sel_dispatch(struct kcuda_ctx *c, const idx_args &b, dim3 grid, size_t smem, int MW, bool f32)
{
	if (MW == 1)
		return f32 ? if_sel_launch<TK, 1, true>(c, b, grid, smem)
		           : if_sel_launch<TK, 1, false>(c, b, grid, smem);
	if (MW == 2)
		return f32 ? if_sel_launch<TK, 2, true>(c, b, grid, smem)
		           : if_sel_launch<TK, 2, false>(c, b, grid, smem);
	return f32 ? if_sel_launch<TK, 4, true>(c, b, grid, smem)
	           : if_sel_launch<TK, 4, false>(c, b, grid, smem);
}

int kcuda_indexer_sel_launch(struct kcuda_ctx *c, const idx_args &a, int64_t n_q)
{
	if (n_q < 1 || n_q > KSEL_MAX_ROWS || a.sel_k < 1 || !a.sel || a.ld_sel < a.sel_k || !a.zs ||
	    (a.qr_R && a.HI <= 16) || a.max_keys < 1 || a.max_keys > KSEL_MAX_KEYS || !a.scores ||
	    a.ld < a.max_keys || a.ld % 4 || (uintptr_t)a.scores % 16 ||
	    (size_t)n_q * KSEL_ROW_WORDS * sizeof(unsigned) > KCUDA_ZS_BYTES || !kcuda_indexer_fast_ok(c, a))
		return ERR_UNSUPPORTED;
	const bool f32 = !a.bf16;
	/* 32-key tiles while the rows' tiles fit two per SM (batch 1..2 at 4k: ~128 blocks on 132 SMs),
	 * else 64-key tiles, two per block with many tiles (as kcuda_indexer_fast_launch) */
	const int64_t t32 = (a.max_keys + 31) / 32, t64 = (a.max_keys + 63) / 64;
	const int64_t fill = 2 * (int64_t)c->n_sm;
	int TK = n_q * t32 <= fill ? 32 : 64;
	const char *tk_env = getenv("TANDEM_IDX_TK"); /* 32 or 64 forces the tile */
	if (tk_env && (strcmp(tk_env, "32") == 0 || strcmp(tk_env, "64") == 0))
		TK = atoi(tk_env);
	int tiles = TK == 32 || n_q * t64 <= fill ? 1 : 2;
	const char *te = getenv("TANDEM_IDX_TILES");
	if (te && (strcmp(te, "1") == 0 || strcmp(te, "2") == 0))
		tiles = te[0] - '0';
	/* the score tiles' shared memory, or the tail's (bitmasks, candidates) if larger */
	size_t smem = if_smem(a.DI, f32, TK);
	const size_t tail = ksel_smem_base(a.max_keys) + (size_t)KSEL_CAND_MIN * sizeof(uint2);
	if (smem < tail)
		smem = tail;
	if (smem + 4096 >
	    (size_t)kcuda_smem_optin(c->device)) /* room for the static part (scan storage, ~1.4 KB) */
		return ERR_UNSUPPORTED;
	const int64_t per = (int64_t)TK * tiles;
	const int64_t ranges = (a.max_keys + per - 1) / per;
	idx_args b = a;
	b.tiles = tiles;
	b.sel_smem = (int)smem;
	b.skip_le = 0;
	b.pf = kcuda_prefetch_enabled();
	const dim3 grid((unsigned)ranges, (unsigned)n_q);
	const int MW = a.HI <= 16 ? 1 : (a.HI <= 32 ? 2 : 4);
	return TK == 32 ? if_sel_dispatch<32>(c, b, grid, smem, MW, f32)
	                : if_sel_dispatch<64>(c, b, grid, smem, MW, f32);
}
