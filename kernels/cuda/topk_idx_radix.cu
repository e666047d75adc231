/* Exact top-k of each row of indexer scores, multi-block: the fast path behind kcuda_topk_idx for
 * decode-sized batches (the first kernel, topk_idx.cu, one 1024-thread block per row, stays for many
 * rows and under TANDEM_CUDA_ATTN=ref). Same result as kcpu_topk: score descending, ties to the
 * LOWER position, NaN as -inf, min(k, n) positions in ascending order.
 *
 * Why: one block per row reads a 32k row five times with one SM (~50 us at 32k, ~200 us at 100k).
 * Here every row is cut into slices of 2048 scores, a block each (grid slices x rows), and the
 * radix select runs on the order-preserving uint32 key of the score with 11-, 11- and 10-bit digits:
 *   hist(0)  every block adds its slice's histogram of bits 31..21 to the row's global histogram;
 *   hist(1)  every block finds the digit d1 holding the k-th best from histogram 0 (a block scan of
 *            2048 bins, redundantly per block: cheaper than a launch) and histograms bits 20..10 of
 *            the keys whose top digit is d1; hist(2) likewise for bits 9..0;
 *   count    every block derives the k-th key T and `need` (how many keys == T belong to the result:
 *            the lowest-positioned ones) and counts its keys > T and == T;
 *   write    every block sums the counts of the blocks before it (its output offset and how many
 *            equal keys lie before it) and writes its taken positions in order (block scans).
 * Five launches and one memset of the histograms, each a read of the row from L2. Scratch (the
 * histograms and counts) lives in the caller's area: the context workspace. */
#include <cub/block/block_scan.cuh>
#include <errno.h>

#include "kernels/cuda/fused.h"
#include "kernels/cuda/grid_barrier.cuh"
#include "kernels/cuda/mla_attn_mode.cuh"
#include "kernels/cuda/topk_fast.cuh"

#define TR_THREADS 256
#define TR_PER 8 /* scores per thread */
#define TR_SLICE (TR_THREADS * TR_PER)
#define TR_MAX_ROWS 64 /* more rows: the one-block-per-row kernel already fills the GPU */
#define TR_H0 2048
#define TR_H1 2048
#define TR_H2 1024
#define TR_HIST (TR_H0 + TR_H1 + TR_H2)

typedef cub::BlockScan<unsigned, TR_THREADS> tr_scan_t;

__device__ __forceinline__ uint32_t tr_key(float v)
{
	const uint32_t u = __float_as_uint(v);
	if (v == 0.0f) /* -0 ties with +0 as in the CPU's float comparison (position decides) */
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu; /* NaN ranks as -inf (the key of -inf) */
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct tr_args {
	const float *s;
	int64_t ld;
	const int32_t *n_dev;
	int64_t n0;
	int k;
	int32_t *out;
	int64_t ldo;
	int32_t *n_out;
	unsigned *scratch; /* per row: TR_HIST bins, then nb (gt, eq) pairs */
	int nb;
	unsigned *err;
};

__device__ __forceinline__ unsigned *tr_row_scratch(const tr_args &a, int64_t row)
{
	return a.scratch + row * (int64_t)(TR_HIST + 2 * a.nb);
}

/* the row's length, clamped to [0, ld] (a longer one is counted as an error by slice 0) */
__device__ __forceinline__ int tr_row_n(const tr_args &a, int64_t row)
{
	int64_t n = a.n_dev ? (int64_t)a.n_dev[row] : a.n0 + row + 1;
	if (n < 0)
		n = 0;
	if (n > a.ld) {
		if (blockIdx.x == 0 && threadIdx.x == 0)
			atomicAdd(a.err, 1u);
		n = a.ld;
	}
	return (int)n;
}

struct tr_shared {
	typename tr_scan_t::TempStorage scan;
	unsigned hist[TR_H0];
	unsigned bin, need;
	unsigned cnt[2];
};

/* In hist[0 .. NB) (global), counted from the highest bin down: the bin holding the need-th
 * largest entry and how many of that bin's entries are still needed. Block-wide. */
template <int NB, bool L2 = true>
__device__ void tr_find(tr_shared &sh, const unsigned *hist, unsigned need, unsigned *bin_out,
                        unsigned *need_out)
{
	constexpr int PER = NB / TR_THREADS;
	const int tid = threadIdx.x;
	unsigned c[PER], tot = 0;
#pragma unroll
	for (int q = 0; q < PER; q++) {
		const int i = NB - 1 - PER * tid - q;
		c[q] = L2 ? __ldcg(hist + i) : hist[i]; /* L2: other blocks' atomics (global) */
		tot += c[q];
	}
	if (tid == 0) {
		sh.bin = 0; /* not found (cannot happen with consistent histograms): lowest bin */
		sh.need = need;
	}
	unsigned excl;
	tr_scan_t(sh.scan).ExclusiveSum(tot, excl);
	__syncthreads();
	if (excl < need && excl + tot >= need) {
		unsigned cum = excl;
#pragma unroll
		for (int q = 0; q < PER; q++) {
			if (cum + c[q] >= need) {
				sh.bin = (unsigned)(NB - 1 - PER * tid - q);
				sh.need = need - cum;
				break;
			}
			cum += c[q];
		}
	}
	__syncthreads();
	*bin_out = sh.bin;
	*need_out = sh.need;
	__syncthreads();
}

/* prefix (the selected high bits, right-aligned to `bits` of the key) after `pass` digits */
__device__ void tr_select(tr_shared &sh, const unsigned *hs, int pass, int kk, uint32_t *prefix,
                          unsigned *need)
{
	unsigned b, nd = (unsigned)kk;
	uint32_t p = 0;
	if (pass >= 1) {
		tr_find<TR_H0>(sh, hs, nd, &b, &nd);
		p = b;
	}
	if (pass >= 2) {
		tr_find<TR_H1>(sh, hs + TR_H0, nd, &b, &nd);
		p = (p << 11) | b;
	}
	if (pass >= 3) {
		tr_find<TR_H2>(sh, hs + TR_H0 + TR_H1, nd, &b, &nd);
		p = (p << 10) | b;
	}
	*prefix = p;
	*need = nd;
}

/* pass 0, 1, 2: the slice's histogram of digit `pass` among the keys matching the digits so far */
__global__ void __launch_bounds__(TR_THREADS) tr_hist_kernel(tr_args a, int pass)
{
	KDEP_ENTRY();
	__shared__ tr_shared sh;
	const int64_t row = blockIdx.y;
	const int n = tr_row_n(a, row);
	const int kk = a.k < n ? a.k : n;
	const int i0 = blockIdx.x * TR_SLICE;
	if (kk <= 0 || kk >= n || i0 >= n)
		return; /* nothing to select (all or nothing taken), or an empty slice */
	unsigned *hs = tr_row_scratch(a, row);
	uint32_t prefix;
	unsigned need;
	tr_select(sh, hs, pass, kk, &prefix, &need);
	const int nbins = pass == 2 ? TR_H2 : TR_H0;
	const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
	const int hshift = pass == 0 ? 32 : (pass == 1 ? 21 : 10); /* bits above the digit */
	for (int i = threadIdx.x; i < nbins; i += TR_THREADS)
		sh.hist[i] = 0;
	__syncthreads();
	const float *p = a.s + row * a.ld;
	const int i1 = min(n, i0 + TR_SLICE);
	for (int i = i0 + threadIdx.x; i < i1; i += TR_THREADS) {
		const uint32_t key = tr_key(p[i]);
		if (pass == 0 || (key >> hshift) == prefix)
			atomicAdd(&sh.hist[(key >> shift) & (uint32_t)(nbins - 1)], 1u);
	}
	__syncthreads();
	unsigned *gh = hs + (pass == 0 ? 0 : (pass == 1 ? TR_H0 : TR_H0 + TR_H1));
	for (int i = threadIdx.x; i < nbins; i += TR_THREADS)
		if (sh.hist[i])
			atomicAdd(&gh[i], sh.hist[i]);
}

/* The ordered write of a slice (thread t holds keys[] of positions j0 .. j0 + TR_PER - 1, valid below
 * i1): keys > T, and the `need` lowest-positioned keys == T over the row; eq: this thread's keys == T;
 * gt_before / eq_before: the row's keys > T / == T in the slices before this one. Block-wide. */
__device__ __forceinline__ void tr_write(tr_shared &sh, const uint32_t (&keys)[TR_PER], int j0, int i1,
                                         uint32_t T, unsigned need, unsigned eq, unsigned gt_before,
                                         unsigned eq_before, int kk, int32_t *o)
{
	unsigned eq_rank;
	tr_scan_t(sh.scan).ExclusiveSum(eq, eq_rank);
	__syncthreads();
	eq_rank += eq_before;
	unsigned take = 0;
	unsigned takeu[TR_PER];
#pragma unroll
	for (int u = 0; u < TR_PER; u++) {
		const bool in = j0 + u < i1;
		const bool isgt = in && keys[u] > T, iseq = in && keys[u] == T;
		takeu[u] = isgt || (iseq && eq_rank < need);
		eq_rank += iseq;
		take += takeu[u];
	}
	unsigned pos;
	tr_scan_t(sh.scan).ExclusiveSum(take, pos);
	pos += gt_before + min(eq_before, need);
#pragma unroll
	for (int u = 0; u < TR_PER; u++)
		if (takeu[u]) {
			if (pos < (unsigned)kk) /* cannot fail with consistent counts; never write past kk */
				o[pos] = j0 + u;
			pos++;
		}
}

/* count (write = 0) or write (write = 1) */
__global__ void __launch_bounds__(TR_THREADS) tr_out_kernel(tr_args a, int write)
{
	KDEP_ENTRY();
	__shared__ tr_shared sh;
	const int64_t row = blockIdx.y;
	const int tid = threadIdx.x;
	const int n = tr_row_n(a, row);
	const int kk = a.k < n ? a.k : n;
	const int i0 = blockIdx.x * TR_SLICE, i1 = min(n, i0 + TR_SLICE);
	unsigned *hs = tr_row_scratch(a, row);
	unsigned *cnt = hs + TR_HIST;
	int32_t *o = a.out + row * a.ldo;
	if (write && blockIdx.x == 0 && tid == 0 && a.n_out)
		a.n_out[row] = kk > 0 ? kk : 0;
	if (kk <= 0)
		return;
	if (kk >= n) { /* every position, in order */
		if (write)
			for (int i = i0 + tid; i < i1; i += TR_THREADS)
				o[i] = i;
		return;
	}
	uint32_t T;
	unsigned need;
	tr_select(sh, hs, 3, kk, &T, &need);
	const float *p = a.s + row * a.ld;
	/* this thread's TR_PER consecutive scores */
	const int j0 = i0 + tid * TR_PER;
	unsigned gt = 0, eq = 0;
	uint32_t keys[TR_PER];
#pragma unroll
	for (int u = 0; u < TR_PER; u++) {
		keys[u] = j0 + u < i1 ? tr_key(p[j0 + u]) : 0u;
		gt += j0 + u < i1 && keys[u] > T;
		eq += j0 + u < i1 && keys[u] == T;
	}
	if (!write) {
		if (tid == 0)
			sh.cnt[0] = sh.cnt[1] = 0;
		__syncthreads();
		if (gt)
			atomicAdd(&sh.cnt[0], gt);
		if (eq)
			atomicAdd(&sh.cnt[1], eq);
		__syncthreads();
		if (tid == 0) {
			cnt[2 * blockIdx.x] = sh.cnt[0];
			cnt[2 * blockIdx.x + 1] = sh.cnt[1];
		}
		return;
	}
	/* counts of the slices before this one (at most a few dozen pairs) */
	if (tid == 0) {
		unsigned g = 0, e = 0;
		for (unsigned b = 0; b < blockIdx.x; b++) {
			g += cnt[2 * b];
			e += cnt[2 * b + 1];
		}
		sh.cnt[0] = g;
		sh.cnt[1] = e;
	}
	__syncthreads();
	const unsigned gt_before = sh.cnt[0], eq_before = sh.cnt[1];
	__syncthreads();
	tr_write(sh, keys, j0, i1, T, need, eq, gt_before, eq_before, kk, o);
}

/* ---- the same select in ONE launch: the row's blocks meet at grid barriers ------------------------
 * The five launches and the memset above are each a dependent graph node, and each reads the row
 * again. Here the row's blocks (one per slice of TR_SLICE scores, all resident together: the host
 * checks the occupancy) keep their slice's keys in registers through every phase and meet at grid
 * barriers (grid_barrier.cuh's arrival half; the departures are counted once, at the end):
 *   digit 0, 1   the slice's histogram of the digit (shared memory, one atomic per distinct bin of a
 *                warp: similar scores share a bin) into the row's global one; barrier; every block
 *                finds the digit holding the k-th best (tr_find, redundantly per block);
 *   candidates   the keys sharing the 22-bit prefix found (the global histogram says how many: at
 *                most TR1_CAND) go to a list in the caller's scratch, with each slice's count of
 *                keys above the prefix; barrier; every block ranks the list's last 10 bits in
 *                shared memory (T and how many keys == T are taken) and has, from the list and the
 *                counts, every slice's keys > T and == T before its own: the write follows;
 *   otherwise    (more candidates: heavy ties) digit 2 as digits 0 and 1, the slices' (> T, == T)
 *                counts, one more barrier, then the write.
 * Three barriers (four with heavy ties) instead of five launches. The histograms, the arrival words
 * and the list's counter live in the context's zeroed area (ctx->zs); every block zeroes its share of
 * the histograms once nobody reads them and the last block to leave zeroes the words, so graph
 * replays need no memset node. */
#define TR1_WORDS 6 /* arrivals of barriers 0..3, the candidate counter, the departures */
#define TR1_ROW_WORDS (TR_HIST + TR1_WORDS)
#define TR1_CAND 2048 /* candidates ranked in shared memory (pairs in the caller's scratch) */
static_assert(2 * TR1_CAND <= TR_HIST, "the list takes the histograms' place in the caller's scratch");

struct tr1_shared {
	uint2 cand[TR1_CAND]; /* (position, key) */
	unsigned cnt[2];
};

/* one key of each lane (valid or not) into the shared histogram: lanes with the same bin add
 * once (the top digit of a row's similar scores is nearly always one bin) */
__device__ __forceinline__ void tr1_count(unsigned *h, bool valid, unsigned bin)
{
	const unsigned d = valid ? bin : 0xffffffffu;
	const unsigned peers = __match_any_sync(0xffffffffu, d);
	if (valid && __ffs(peers) - 1 == (int)(threadIdx.x & 31))
		atomicAdd(&h[bin], (unsigned)__popc(peers));
}

/* v summed over the block into *dst (shared, zeroed by the caller before a barrier) */
__device__ __forceinline__ void tr1_block_add(unsigned *dst, unsigned v)
{
	v = __reduce_add_sync(0xffffffffu, v);
	if ((threadIdx.x & 31) == 0 && v)
		atomicAdd(dst, v);
}

/* (a, b) summed over the block through the two shared counters c2[0..1]; every thread gets the sums */
__device__ __forceinline__ uint2 tr1_block_sum2(unsigned *c2, unsigned a, unsigned b)
{
	if (threadIdx.x == 0)
		c2[0] = c2[1] = 0;
	__syncthreads();
	tr1_block_add(&c2[0], a);
	tr1_block_add(&c2[1], b);
	__syncthreads();
	return make_uint2(c2[0], c2[1]);
}

/* the slice's histogram of one digit (keys whose bits above it equal prefix) into gh */
template <int NB>
__device__ __forceinline__ void tr1_hist(tr_shared &sh, const uint32_t (&keys)[TR_PER], int j0, int i1,
                                         int shift, int hshift, uint32_t prefix, unsigned *gh)
{
	for (int i = threadIdx.x; i < NB; i += TR_THREADS)
		sh.hist[i] = 0;
	__syncthreads();
#pragma unroll
	for (int u = 0; u < TR_PER; u++) {
		const bool in = j0 + u < i1 && (hshift >= 32 || (keys[u] >> hshift) == prefix);
		tr1_count(sh.hist, in, (keys[u] >> shift) & (uint32_t)(NB - 1));
	}
	__syncthreads();
	for (int i = threadIdx.x; i < NB; i += TR_THREADS)
		if (sh.hist[i])
			atomicAdd(&gh[i], sh.hist[i]);
}

__global__ void __launch_bounds__(TR_THREADS) tr_one_kernel(tr_args a, unsigned *zs)
{
	KDEP_ENTRY();
	__shared__ tr_shared sh;
	__shared__ tr1_shared s1;
	const int64_t row = blockIdx.y;
	const int tid = threadIdx.x;
	const int n = tr_row_n(a, row);
	const int kk = a.k < n ? a.k : n;
	const int i0 = blockIdx.x * TR_SLICE, i1 = min(n, i0 + TR_SLICE);
	int32_t *o = a.out + row * a.ldo;
	if (blockIdx.x == 0 && tid == 0 && a.n_out)
		a.n_out[row] = kk > 0 ? kk : 0;
	if (kk <= 0 || i0 >= n)
		return; /* nothing to select, or a slice past the row's end (not counted at the barriers) */
	if (kk >= n) { /* every position, in order */
		for (int i = i0 + tid; i < i1; i += TR_THREADS)
			o[i] = i;
		return;
	}
	const unsigned G = (unsigned)((n + TR_SLICE - 1) / TR_SLICE); /* the row's blocks */
	unsigned *hs = zs + row * (int64_t)TR1_ROW_WORDS, *bar = hs + TR_HIST;
	unsigned *scr = tr_row_scratch(a, row); /* the caller's: the candidate list, then the counts */
	unsigned *cnt = scr + TR_HIST;
	const float *p = a.s + row * a.ld;
	/* this thread's TR_PER consecutive scores, all loads in flight together */
	const int j0 = i0 + tid * TR_PER;
	uint32_t keys[TR_PER];
#pragma unroll
	for (int u = 0; u < TR_PER; u++)
		keys[u] = j0 + u < i1 ? tr_key(p[j0 + u]) : 0u;
	unsigned need = (unsigned)kk, b0, b1;
	tr1_hist<TR_H0>(sh, keys, j0, i1, 21, 32, 0, hs);
	kgrid_arrive_wait(bar + 0, G, a.err);
	tr_find<TR_H0>(sh, hs, need, &b0, &need);
	tr1_hist<TR_H1>(sh, keys, j0, i1, 10, 21, b0, hs + TR_H0);
	kgrid_arrive_wait(bar + 1, G, a.err);
	tr_find<TR_H1>(sh, hs + TR_H0, need, &b1, &need);
	const uint32_t p22 = (b0 << 11) | b1; /* the k-th key's top 22 bits */
	const unsigned n_cand = __ldcg(hs + TR_H0 + b1); /* keys with those bits, over the row */
	uint32_t T;
	unsigned gt = 0, eq = 0, gt_before, eq_before;
	if (n_cand <= TR1_CAND) {
		/* this slice's candidates into the list; its keys above the prefix into cnt */
		unsigned above = 0, mine = 0;
#pragma unroll
		for (int u = 0; u < TR_PER; u++) {
			above += j0 + u < i1 && (keys[u] >> 10) > p22;
			mine += j0 + u < i1 && (keys[u] >> 10) == p22;
		}
		if (tid == 0)
			s1.cnt[0] = s1.cnt[1] = 0;
		__syncthreads();
		tr1_block_add(&s1.cnt[0], above);
		unsigned at = 0;
		if (mine)
			at = atomicAdd(&s1.cnt[1], mine); /* the thread's slots within the block's */
		__syncthreads();
		if (tid == 0) {
			cnt[2 * blockIdx.x] = s1.cnt[0];
			sh.bin = s1.cnt[1] ? atomicAdd(bar + 4, s1.cnt[1]) : 0; /* the block's slots */
		}
		__syncthreads();
		at += sh.bin;
#pragma unroll
		for (int u = 0; u < TR_PER; u++)
			if (j0 + u < i1 && (keys[u] >> 10) == p22 && at < TR1_CAND) {
				scr[2 * at] = (unsigned)(j0 + u);
				scr[2 * at + 1] = keys[u];
				at++;
			}
		kgrid_arrive_wait(bar + 2, G, a.err);
		kgrid_done(bar, 5, bar + 5, G);
		/* the histograms are read no more: this block's share back to zero */
		for (int i = (int)blockIdx.x * TR_THREADS + tid; i < TR_H0 + TR_H1; i += (int)G * TR_THREADS)
			hs[i] = 0;
		/* the list (n_cand pairs, in no order) into shared memory, its last 10 bits ranked */
		for (int i = tid; i < TR_H2; i += TR_THREADS)
			sh.hist[i] = 0;
		__syncthreads();
		for (unsigned i = tid; i < n_cand; i += TR_THREADS) {
			const uint2 c = __ldcg((const uint2 *)scr + i);
			s1.cand[i] = c;
			atomicAdd(&sh.hist[c.y & (TR_H2 - 1)], 1u);
		}
		__syncthreads();
		unsigned b2;
		tr_find<TR_H2, false>(sh, sh.hist, need, &b2, &need);
		T = (p22 << 10) | b2;
		/* before this slice: the slices' keys above the prefix, and the list's entries > T / == T */
		unsigned g = 0, e = 0;
		for (unsigned b = (unsigned)tid; b < blockIdx.x; b += TR_THREADS)
			g += __ldcg(cnt + 2 * b);
		for (unsigned i = tid; i < n_cand; i += TR_THREADS)
			if (s1.cand[i].x < (unsigned)i0) {
				g += s1.cand[i].y > T;
				e += s1.cand[i].y == T;
			}
		const uint2 before = tr1_block_sum2(s1.cnt, g, e);
		gt_before = before.x;
		eq_before = before.y;
#pragma unroll
		for (int u = 0; u < TR_PER; u++)
			eq += j0 + u < i1 && keys[u] == T;
	} else {
		/* heavy ties: digit 2 over the row, then the slices' counts at one more barrier */
		tr1_hist<TR_H2>(sh, keys, j0, i1, 0, 10, p22, hs + TR_H0 + TR_H1);
		kgrid_arrive_wait(bar + 2, G, a.err);
		unsigned b2;
		tr_find<TR_H2>(sh, hs + TR_H0 + TR_H1, need, &b2, &need);
		T = (p22 << 10) | b2;
#pragma unroll
		for (int u = 0; u < TR_PER; u++) {
			gt += j0 + u < i1 && keys[u] > T;
			eq += j0 + u < i1 && keys[u] == T;
		}
		const uint2 mine = tr1_block_sum2(sh.cnt, gt, eq);
		if (tid == 0) {
			cnt[2 * blockIdx.x] = mine.x;
			cnt[2 * blockIdx.x + 1] = mine.y;
		}
		kgrid_arrive_wait(bar + 3, G, a.err);
		kgrid_done(bar, 5, bar + 5, G);
		for (int i = (int)blockIdx.x * TR_THREADS + tid; i < TR_HIST; i += (int)G * TR_THREADS)
			hs[i] = 0;
		unsigned g = 0, e = 0;
		for (unsigned b = (unsigned)tid; b < blockIdx.x; b += TR_THREADS) {
			g += __ldcg(cnt + 2 * b);
			e += __ldcg(cnt + 2 * b + 1);
		}
		const uint2 before = tr1_block_sum2(sh.cnt, g, e);
		gt_before = before.x;
		eq_before = before.y;
	}
	/* the write: keys > T, and the lowest-positioned `need` keys == T, in position order */
	tr_write(sh, keys, j0, i1, T, need, eq, gt_before, eq_before, kk, o);
}

/* TANDEM_TOPK_RADIX1=0: the five launches even where the one-launch kernel fits */
static bool tr1_enabled(void)
{
	const char *e = getenv("TANDEM_TOPK_RADIX1");
	return !(e && strcmp(e, "0") == 0);
}

/* the one-launch kernel for grid (nb, n_rows): its zeroed area fits and every block of the grid can
 * be resident at once (its blocks of a row wait for each other) */
static bool tr1_fits(struct kcuda_ctx *c, int64_t nb, int64_t n_rows)
{
	if (!tr1_enabled() || !c->zs || (size_t)n_rows * TR1_ROW_WORDS * sizeof(unsigned) > KCUDA_ZS_BYTES)
		return false;
	static int occ[64];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : -1;
	int per_sm = dev >= 0 ? occ[dev] : 0;
	if (per_sm <= 0) {
		if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tr_one_kernel, TR_THREADS, 0) !=
		    cudaSuccess) {
			(void)cudaGetLastError();
			return false;
		}
		if (dev >= 0)
			occ[dev] = per_sm;
	}
	return nb * n_rows <= (int64_t)per_sm * c->n_sm;
}

size_t kcuda_topk_idx_radix_scratch(int64_t n_rows, int64_t max_n)
{
	const int64_t nb = (max_n + TR_SLICE - 1) / TR_SLICE;
	return (size_t)n_rows * (size_t)(TR_HIST + 2 * (nb > 0 ? nb : 1)) * sizeof(unsigned);
}

int kcuda_topk_idx_radix(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows,
                         const int32_t *n, int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out,
                         void *scratch, size_t scratch_bytes)
{
	if (!c || !scores || !out || n_rows < 0 || k < 0 || ldo < k || ld < 1)
		return kcuda_bad_arg("topk_idx", "rows %lld k %d ldo %lld ld %lld%s", (long long)n_rows, k,
		                     (long long)ldo, (long long)ld,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	if (n_rows == 0)
		return 0;
	const int64_t nb = (ld + TR_SLICE - 1) / TR_SLICE;
	const size_t need = kcuda_topk_idx_radix_scratch(n_rows, ld);
	if (n_rows > TR_MAX_ROWS || nb > 65535 || !scratch || (uintptr_t)scratch % 4 || scratch_bytes < need)
		return ERR_UNSUPPORTED;
	tr_args a;
	a.s = scores;
	a.ld = ld;
	a.n_dev = n;
	a.n0 = n0;
	a.k = k;
	a.out = out;
	a.ldo = ldo;
	a.n_out = n_out;
	a.scratch = (unsigned *)scratch;
	a.nb = (int)nb;
	a.err = c->err_dev;
	dim3 grid((unsigned)nb, (unsigned)n_rows);
	if (tr1_fits(c, nb, n_rows))
		return klaunch("topk_radix one", tr_one_kernel, dim3(grid), dim3(TR_THREADS), 0, c->stream, a,
		               c->zs);
	if (cudaMemsetAsync(scratch, 0, need, c->stream) != cudaSuccess)
		return kcuda_launch_status("topk_radix memset");
	int rc = 0;
	for (int pass = 0; pass < 3 && !rc; pass++) {
		rc = klaunch("topk_radix hist", tr_hist_kernel, dim3(grid), dim3(TR_THREADS), 0, c->stream, a,
		             pass);
	}
	for (int w = 0; w < 2 && !rc; w++) {
		rc = klaunch("topk_radix out", tr_out_kernel, dim3(grid), dim3(TR_THREADS), 0, c->stream, a,
		             w);
	}
	return rc;
}

extern "C" int kcuda_topk_idx(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows,
                              const int32_t *n, int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out)
{
	/* decode-sized batches: one launch (topk_sel.cu) */
	int rc0 = kcuda_topk_sel(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out);
	if (rc0 != ERR_UNSUPPORTED)
		return rc0;
	/* decode-sized batches of rows up to KTOPK_FAST_MAX: one block per row, one launch */
	if (!kattn_use_ref() && n_rows <= TR_MAX_ROWS && kcuda_topk_fast_takes(c, ld)) {
		int rc = kcuda_topk_fast(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out);
		if (rc != ERR_UNSUPPORTED)
			return rc;
	}
	/* the workspace is the scratch, unless the scores themselves live there */
	if (!kattn_use_ref() && c && scores && c->ws) {
		const uint8_t *s = (const uint8_t *)scores, *w = (const uint8_t *)c->ws;
		if (s + (size_t)(ld > 0 ? ld : 0) * (size_t)(n_rows > 0 ? n_rows : 0) * sizeof(float) <= w ||
		    s >= w + c->ws_bytes) {
			int rc = kcuda_topk_idx_radix(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, c->ws,
			                              c->ws_bytes);
			if (rc != ERR_UNSUPPORTED)
				return rc;
		}
	}
	return kcuda_topk_idx_ref(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out);
}

/* ---- short rows: one block per row, the row's keys in shared memory ------------------------------
 * For rows of at most KFUSE_TOPK_SHORT scores (decode up to a 32k context) the five launches and
 * the memset above cost more than the work (each a dependent graph node of a few microseconds;
 * the radix path measured 25 us for one row of 32768 on the H200, 13:56 run).
 * One block of TS_THREADS per row loads the row's keys into shared memory once, runs the radix
 * select of topk_idx.cu on them (four 8-bit digits; same-bin increments of a warp are combined
 * with __match_any_sync first, since the top digit of similar scores is nearly always one bin),
 * then each thread takes a contiguous run of positions for the ordered compaction, so two block
 * scans place every kept position in ascending order. */
#define TS_THREADS 1024
static_assert(KTOPK_FAST_MAX <= KFUSE_TOPK_SHORT, "kcuda_topk_idx_short's limit covers topk_fast.cu's");

typedef cub::BlockScan<int, TS_THREADS> ts_scan_t;

__global__ void __launch_bounds__(TS_THREADS)
    topk_short_kernel(const float *__restrict__ s, int64_t ld, const int32_t *__restrict__ n_dev, int64_t n0,
                      int k, int32_t *__restrict__ out, int64_t ldo, int32_t *__restrict__ n_out,
                      unsigned *err)
{
	KDEP_ENTRY();
	__shared__ typename ts_scan_t::TempStorage scan_tmp;
	extern __shared__ uint32_t keys[]; /* [ld]: dynamic, up to 128 KB at KFUSE_TOPK_SHORT */
	__shared__ unsigned hist[256];
	/* one histogram per warp: the leaders' atomics of different warps never meet on a bin (with
	 * one shared histogram the top digit of similar scores is one or two bins, and every warp's
	 * atomic queued on them: the H200 run of 16:15 measured ~80 us for a 32k row) */
	__shared__ unsigned whist[TS_THREADS / 32][256];
	__shared__ uint32_t sh_prefix;
	__shared__ int sh_need;
	const int64_t row = blockIdx.x;
	const float *p = s + row * ld;
	int32_t *o = out + row * ldo;
	const int tid = threadIdx.x, lane = tid & 31;
	int64_t n64 = n_dev ? (int64_t)n_dev[row] : n0 + row + 1;
	if (n64 > ld) { /* longer than the row: counted, clamped (as the radix path) */
		if (tid == 0)
			atomicAdd(err, 1u);
		n64 = ld;
	}
	const int n = n64 < 0 ? 0 : (int)n64;
	const int kk = k < n ? k : n;
	if (n_out && tid == 0)
		n_out[row] = kk;
	if (kk <= 0)
		return;
	if (kk == n) { /* every position is kept, in order: the scores are not read (nor computed:
		        * kcuda_indexer_topk skips those rows) */
		for (int i = tid; i < n; i += TS_THREADS)
			o[i] = i;
		return;
	}
#pragma unroll 4 /* the loads of a thread's keys in flight together */
	for (int i = tid; i < n; i += TS_THREADS)
		keys[i] = tr_key(p[i]);
	__syncthreads();

	uint32_t prefix = 0, mask = 0;
	int need = kk;
	if (kk < n) {
		for (int b = 3; b >= 0; b--) {
			for (int j = tid; j < (TS_THREADS / 32) * 256; j += TS_THREADS)
				(&whist[0][0])[j] = 0;
			__syncthreads();
			unsigned *wh = whist[tid >> 5];
			for (int base = 0; base < n; base += TS_THREADS) { /* uniform trip count */
				const int i = base + tid;
				const uint32_t key = i < n ? keys[i] : 0u;
				const bool valid = i < n && (key & mask) == prefix;
				/* after the first digit few keys still match the prefix: a warp without
				 * one skips the (slow) match and the atomics (the vote is warp-uniform) */
				if (!__any_sync(0xffffffffu, valid))
					continue;
				const unsigned d = valid ? (key >> (8 * b)) & 255u : 256u;
				const unsigned peers = __match_any_sync(0xffffffffu, d);
				if (valid && __ffs(peers) - 1 == lane)
					atomicAdd(&wh[d], (unsigned)__popc(peers));
			}
			__syncthreads();
			if (tid < 256) { /* the warps' histograms summed per bin */
				unsigned t = 0;
#pragma unroll 8
				for (int w = 0; w < TS_THREADS / 32; w++)
					t += whist[w][tid];
				hist[tid] = t;
			}
			__syncthreads();
			if (tid < 32) { /* warp 0 scans the bins from the top (as topk_idx.cu) */
				unsigned c8[8], tot = 0;
#pragma unroll
				for (int q = 0; q < 8; q++) {
					c8[q] = hist[255 - 8 * tid - q];
					tot += c8[q];
				}
				unsigned incl = tot;
#pragma unroll
				for (int o2 = 1; o2 < 32; o2 <<= 1) {
					const unsigned v = __shfl_up_sync(0xffffffffu, incl, o2);
					if (tid >= o2)
						incl += v;
				}
				const unsigned excl = incl - tot;
				if (excl < (unsigned)need && incl >= (unsigned)need) {
					unsigned cum = excl;
					int bin = 0;
#pragma unroll
					for (int q = 0; q < 8; q++) {
						if (cum + c8[q] >= (unsigned)need) {
							bin = 255 - 8 * tid - q;
							break;
						}
						cum += c8[q];
					}
					sh_prefix = prefix | ((uint32_t)bin << (8 * b));
					sh_need = need - (int)cum;
				}
			}
			__syncthreads();
			prefix = sh_prefix;
			need = sh_need;
			mask |= 255u << (8 * b);
		}
	} else {
		need = n; /* everything is kept */
	}
	/* ordered compaction over contiguous runs: keys > prefix, then the first `need` == prefix */
	const bool all = kk == n;
	const int per = (n + TS_THREADS - 1) / TS_THREADS;
	const int i0 = tid * per < n ? tid * per : n, i1 = i0 + per < n ? i0 + per : n;
	int n_eq = 0;
	for (int i = i0; i < i1; i++)
		n_eq += !all && keys[i] == prefix;
	int eq_before;
	ts_scan_t(scan_tmp).ExclusiveSum(n_eq, eq_before);
	__syncthreads();
	int n_take = 0;
	for (int i = i0, e = eq_before; i < i1; i++) {
		const uint32_t key = keys[i];
		const bool eq = !all && key == prefix;
		n_take += all || key > prefix || (eq && e < need);
		e += eq;
	}
	int at;
	ts_scan_t(scan_tmp).ExclusiveSum(n_take, at);
	for (int i = i0, e = eq_before; i < i1; i++) {
		const uint32_t key = keys[i];
		const bool eq = !all && key == prefix;
		if (all || key > prefix || (eq && e < need))
			o[at++] = i;
		e += eq;
	}
}

extern "C" int kcuda_topk_idx_short(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows,
                                    const int32_t *n, int64_t n0, int k, int32_t *out, int64_t ldo,
                                    int32_t *n_out)
{
	if (!c || !scores || !out || n_rows < 0 || k < 0 || ldo < k || ld < 1)
		return kcuda_bad_arg("topk_idx_short", "rows %lld k %d ldo %lld ld %lld%s", (long long)n_rows,
		                     k, (long long)ldo, (long long)ld,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	/* the keys-in-registers kernel (topk_fast.cu) unless TANDEM_TOPK=old */
	if (kcuda_topk_fast_takes(c, ld))
		return kcuda_topk_fast(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out);
	if (!kcuda_topk_idx_short_fits(c, ld))
		return ERR_UNSUPPORTED;
	if (n_rows == 0)
		return 0;
	if (n_rows > INT32_MAX)
		return ERR_LIMIT;
	const size_t smem = (size_t)ld * sizeof(uint32_t);
	KCUDA_CHECK(
	    cudaFuncSetAttribute(topk_short_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	return klaunch("topk_idx_short", topk_short_kernel, dim3((unsigned)n_rows), dim3(TS_THREADS), smem,
	               c->stream, scores, ld, n, n0, k, out, ldo, n_out, c->err_dev);
}

extern "C" int kcuda_topk_idx_short_fits(struct kcuda_ctx *c, int64_t ld)
{
	if (!c || ld < 1 || ld > KFUSE_TOPK_SHORT)
		return 0;
	if (kcuda_topk_fast_takes(c, ld)) /* registers, no shared memory for the keys */
		return 1;
	/* the keys go to dynamic shared memory next to the kernel's static part (scan storage,
	 * histogram): Hopper / sm_100 take 32768 keys, sm_120 (99 KB) ~24k. The limit per device is
	 * asked once (a racing first call stores the same value). */
	static int64_t max_ld[64];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : -1;
	if (dev >= 0 && max_ld[dev] > 0)
		return ld <= max_ld[dev];
	const int max_smem = kcuda_smem_optin(c->device);
	cudaFuncAttributes fa;
	if (cudaFuncGetAttributes(&fa, topk_short_kernel) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	const int64_t lim = (int64_t)((size_t)max_smem > fa.sharedSizeBytes
	                                  ? ((size_t)max_smem - fa.sharedSizeBytes) / sizeof(uint32_t)
	                                  : 0);
	if (dev >= 0 && lim > 0)
		max_ld[dev] = lim;
	return ld <= lim;
}
