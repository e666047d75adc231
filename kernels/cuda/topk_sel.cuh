/* The exact top-k of the indexer, finished inside the score kernel (indexer_fast.cu, SEL): device
 * code only, included there. Result as kcpu_topk: score descending, ties to the LOWER position,
 * +0 == -0, NaN as -inf, min(k, n) positions in ascending order.
 *
 * Why: a separate top-k kernel at decode (one 1024-thread block per row, topk_idx_radix.cu's
 * topk_short_kernel) measured 19.3 us per layer at 4096 keys on the H200 (run10), with a grid
 * drain and a launch in front of it. Here the radix select's first digit is counted by every score
 * block as it writes its scores, and only the rest runs in one block per row:
 *   score blocks  write their tile's scores and add each key's top 12 bits (31..20) into the row's
 *                 histogram in ctx->zs (global atomics, one per distinct bin per warp), then take a
 *                 ticket (threadfence + atomicAdd): the block that arrives last runs the tail.
 *   tail          reads the 4096-bin histogram (and zeroes it and the ticket for the next launch)
 *                 and finds the bin b0 holding the k-th best key; one pass over the row's scores
 *                 (from L2) sets a bitmask of the positions whose top digit is above b0 and collects
 *                 the few in b0 (position, key) in shared memory; two 10-bit digits over those
 *                 candidates give the exact k-th key T and how many keys == T are taken; the
 *                 candidates are marked (> T, == T) in the bitmasks, and one block scan of the
 *                 mask popcounts places every taken position, in ascending order. When the
 *                 candidates do not fit in shared memory (heavy ties) the two digits and the
 *                 marking read the row from L2 again: slower, same result.
 * The key is the order-preserving uint32 of topk_idx*.cu. Counters are left zero after every launch
 * (no memset node in a decode graph). */
#ifndef TANDEM_KERNELS_CUDA_TOPK_SEL_CUH
#define TANDEM_KERNELS_CUDA_TOPK_SEL_CUH

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_common.cuh"

#define KSEL_BINS0 4096 /* digit 0: key bits 31..20, counted by the score blocks */
#define KSEL_BINS 1024 /* digits 1 and 2: bits 19..10, 9..0 (tail, shared memory) */
#define KSEL_ROW_WORDS 4160 /* per row in ctx->zs: the KSEL_BINS0 bins, the ticket, padding */
#define KSEL_MAX_ROWS 256 /* more rows: the other paths (the zs area holds 315) */
#define KSEL_MAX_KEYS 131072 /* the tail's bitmasks: 2 x 16 KB of shared memory at this length */
#define KSEL_CAND_MIN 2048 /* candidates the tail's shared memory holds at least */
#define KSEL_U 16 /* float4 loads of a warp in flight in the tail's pass over the row */

__device__ __forceinline__ uint32_t ksel_key(float v)
{
	const uint32_t u = __float_as_uint(v);
	if (v == 0.0f) /* -0 ties with +0 as in the CPU's float comparison (position decides) */
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu; /* NaN ranks as -inf (the key of -inf) */
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* bit i of the 8-bit x to bit 4 i */
__device__ __forceinline__ uint32_t ksel_spread4(uint32_t x)
{
	x = (x | (x << 12)) & 0x000f000fu;
	x = (x | (x << 6)) & 0x03030303u;
	x = (x | (x << 3)) & 0x11111111u;
	return x;
}

/* Score block side: one key of each lane of a (whole) warp into the row's global histogram;
 * lanes with valid = false take part in the match but count nothing. */
__device__ __forceinline__ void ksel_count(unsigned *gh, bool valid, uint32_t key)
{
	const unsigned bin = valid ? key >> 20 : 0xffffffffu;
	const unsigned peers = __match_any_sync(0xffffffffu, bin);
	if (valid && __ffs(peers) - 1 == (int)(threadIdx.x & 31))
		atomicAdd(&gh[bin], (unsigned)__popc(peers));
}

/* bytes of dynamic shared memory the tail needs at n keys beyond the candidates */
static inline __host__ __device__ size_t ksel_smem_base(int64_t n)
{
	const int64_t words = 4 * ((n + 127) / 128); /* one bitmask, whole 128-position groups */
	return (size_t)(KSEL_BINS + 2 * words) * sizeof(uint32_t);
}

template <int W> struct ksel_shared {
	union {
		typename cub::BlockScan<unsigned, W>::TempStorage s32;
		typename cub::BlockScan<unsigned long long, W>::TempStorage s64;
	} scan;
	unsigned bin, need, n_cand;
};

/* Block-wide: the bins of this thread are c[0..PER) = bins NB-1-PER*tid .. NB-PER*(tid+1) (from the
 * top); the bin holding the need-th largest entry and how many of that bin are still needed. */
template <int W, int PER, int NB>
__device__ void ksel_find(ksel_shared<W> &sh, const unsigned (&c)[PER], unsigned need, unsigned *bin_out,
                          unsigned *need_out)
{
	static_assert(PER * W == NB, "every bin belongs to one thread");
	const int tid = threadIdx.x;
	unsigned tot = 0;
#pragma unroll
	for (int q = 0; q < PER; q++)
		tot += c[q];
	if (tid == 0) { /* not found (inconsistent counts; cannot happen): the lowest bin */
		sh.bin = 0;
		sh.need = need;
	}
	unsigned excl;
	cub::BlockScan<unsigned, W>(sh.scan.s32).ExclusiveSum(tot, excl);
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
	__syncthreads(); /* sh is reused next */
}

/* Every position of row[0..n) once, whole warps: fn(g, p, key[4]) for the 128-position group g, this
 * lane's positions p .. p + 3 (keys of positions >= n are given as -inf's; fn checks p + c < n);
 * KSEL_U float4 loads of a warp in flight (the pass is one L2 round trip per W * 4 * KSEL_U keys). */
template <int W, typename F> __device__ __forceinline__ void ksel_scan_row(const float *row, int n, F &&fn)
{
	constexpr int NW = W / 32;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int ngroups = (n + 127) >> 7;
	for (int g0 = warp; g0 < ngroups; g0 += NW * KSEL_U) {
		float4 v[KSEL_U];
#pragma unroll
		for (int u = 0; u < KSEL_U; u++) {
			const int g = g0 + u * NW, p = g * 128 + 4 * lane;
			if (g < ngroups && p + 3 < n) {
				v[u] = __ldcg((const float4 *)(row + p));
			} else {
				v[u].x = g < ngroups && p < n ? __ldcg(row + p) : -INFINITY;
				v[u].y = g < ngroups && p + 1 < n ? __ldcg(row + p + 1) : -INFINITY;
				v[u].z = g < ngroups && p + 2 < n ? __ldcg(row + p + 2) : -INFINITY;
				v[u].w = -INFINITY; /* p + 3 >= n here */
			}
		}
#pragma unroll
		for (int u = 0; u < KSEL_U; u++) {
			const int g = g0 + u * NW; /* warp-uniform */
			if (g >= ngroups)
				break;
			const uint32_t key[4] = {ksel_key(v[u].x), ksel_key(v[u].y), ksel_key(v[u].z),
			                         ksel_key(v[u].w)};
			fn(g, g * 128 + 4 * lane, key);
		}
	}
}

/* The tail, one block of W threads: the kk (0 < kk < n) best of row[0..n) into o[0..kk), ascending.
 * gh: the row's digit-0 histogram (complete: every score block counted), its ticket at
 * gh[KSEL_BINS0]; both are zero again on return. sm: dynamic shared memory of sm_bytes >=
 * ksel_smem_base(n) + 8 (the score kernel's, free now). row is 16-byte aligned.
 * Pass 1 over the row: bitmask of top digit > b0, candidates (top digit == b0) while they fit,
 * and the digit-1 histogram of all keys in b0. If the candidates fit (the usual case), digit 2 and
 * the marking run on them. Otherwise (a narrow or tied score distribution: the bin of 1/8 binade
 * holds more than the shared memory) pass 2 does the same one digit lower (mask of the top 22
 * bits > P, candidates == P, digit-2 histogram), and only when even those do not fit (massive
 * exact ties) pass 3 writes both masks from the row (key > T, key == T). */
template <int W>
__device__ void ksel_tail(const float *row, int n, int kk, unsigned *gh, int32_t *o, uint8_t *sm,
                          size_t sm_bytes)
{
	constexpr unsigned FULL = 0xffffffffu;
	constexpr int PER = KSEL_BINS / W;
	__shared__ ksel_shared<W> sh;
	const int tid = threadIdx.x, lane = tid & 31;
	const int ngroups = (n + 127) >> 7; /* 128 positions: a warp's float4 load, 4 mask words */
	const int nw = 4 * ngroups;
	unsigned *hist = (unsigned *)sm; /* [KSEL_BINS] */
	uint32_t *gtw = hist + KSEL_BINS; /* [nw]: taken for sure (key > T) */
	uint32_t *eqw = gtw + nw; /* [nw]: key == T */
	uint2 *cand = (uint2 *)(eqw + nw); /* (position, key) of the keys in the threshold bin */
	const unsigned cap = (unsigned)((sm_bytes - ksel_smem_base(n)) / sizeof(uint2));
	const unsigned lt = (1u << lane) - 1u;

	/* digit 0 from the global histogram; zeroed behind the read, with the ticket */
	constexpr int PER0 = KSEL_BINS0 / W;
	unsigned c0[PER0];
	{
		uint4 *g4 = (uint4 *)(gh + KSEL_BINS0 - PER0 * (tid + 1));
		unsigned t[PER0];
#pragma unroll
		for (int j = 0; j < PER0 / 4; j++) {
			const uint4 v = __ldcg(g4 + j);
			t[4 * j] = v.x;
			t[4 * j + 1] = v.y;
			t[4 * j + 2] = v.z;
			t[4 * j + 3] = v.w;
		}
#pragma unroll
		for (int j = 0; j < PER0 / 4; j++)
			g4[j] = make_uint4(0, 0, 0, 0);
#pragma unroll
		for (int q = 0; q < PER0; q++)
			c0[q] = t[PER0 - 1 - q];
		if (tid == 0)
			gh[KSEL_BINS0] = 0;
	}
	for (int i = tid; i < KSEL_BINS; i += W)
		hist[i] = 0;
	if (tid == 0)
		sh.n_cand = 0; /* ksel_find's barriers order these before pass 1 */
	unsigned b0, need;
	ksel_find<W, PER0, KSEL_BINS0>(sh, c0, (unsigned)kk, &b0, &need);

	/* the mask words of group g from the four components' ballots (bit 4 i + c of word w of the
	 * group = lane 8 w + i's component c) */
	auto put_words = [&](int g, const unsigned *bg, const unsigned *be) {
		if (lane < 4) {
			uint32_t wg = 0, we = 0;
#pragma unroll
			for (int c = 0; c < 4; c++) {
				wg |= ksel_spread4((bg[c] >> (8 * lane)) & 0xffu) << c;
				we |= ksel_spread4((be[c] >> (8 * lane)) & 0xffu) << c;
			}
			gtw[4 * g + lane] = wg;
			eqw[4 * g + lane] = we;
		}
	};
	/* the flagged keys (bc) into the candidate list (any order), as many as fit */
	auto append = [&](int p, const uint32_t *key, const unsigned *bc) {
		const unsigned tot = __popc(bc[0]) + __popc(bc[1]) + __popc(bc[2]) + __popc(bc[3]);
		if (!tot) /* warp-uniform */
			return;
		unsigned base = 0;
		if (lane == 0)
			base = atomicAdd(&sh.n_cand, tot);
		base = __shfl_sync(FULL, base, 0);
#pragma unroll
		for (int c = 0; c < 4; c++) {
			if ((bc[c] >> lane) & 1u) {
				const unsigned at = base + __popc(bc[c] & lt);
				if (at < cap)
					cand[at] = make_uint2((unsigned)(p + c), key[c]);
			}
			base += __popc(bc[c]);
		}
	};
	/* the flagged keys' 10-bit digit at `shift` into hist (one atomic per distinct digit per warp) */
	auto count = [&](const uint32_t *key, const unsigned *bc, int shift) {
#pragma unroll
		for (int c = 0; c < 4; c++) {
			if (!bc[c]) /* warp-uniform */
				continue;
			const bool ok = (bc[c] >> lane) & 1u;
			const unsigned d = ok ? (key[c] >> shift) & (KSEL_BINS - 1) : 0xffffffffu;
			const unsigned peers = __match_any_sync(FULL, d);
			if (ok && __ffs(peers) - 1 == lane)
				atomicAdd(&hist[d], (unsigned)__popc(peers));
		}
	};
	const unsigned none[4] = {0u, 0u, 0u, 0u};

	/* pass 1: top digit > b0 -> mask; == b0 -> candidates and the digit-1 histogram */
	ksel_scan_row<W>(row, n, [&](int g, int p, const uint32_t *key) {
		unsigned bg[4], bc[4];
#pragma unroll
		for (int c = 0; c < 4; c++) {
			const bool in = p + c < n;
			bg[c] = __ballot_sync(FULL, in && (key[c] >> 20) > b0);
			bc[c] = __ballot_sync(FULL, in && (key[c] >> 20) == b0);
		}
		put_words(g, bg, none);
		append(p, key, bc);
		count(key, bc, 10);
	});
	__syncthreads();
	unsigned m = sh.n_cand;
	const bool ovf = m > cap;
	unsigned c[PER];
#pragma unroll
	for (int q = 0; q < PER; q++)
		c[q] = hist[KSEL_BINS - 1 - PER * tid - q];
	unsigned b1;
	ksel_find<W, PER, KSEL_BINS>(sh, c, need, &b1, &need);
	const uint32_t P = (b0 << 10) | b1; /* the k-th best key's top 22 bits */
	for (int i = tid; i < KSEL_BINS; i += W)
		hist[i] = 0;
	if (ovf && tid == 0)
		sh.n_cand = 0; /* (every thread read m before ksel_find's barriers) */
	__syncthreads();
	if (!ovf) { /* digit 2 among the candidates whose top 22 bits are P */
		for (unsigned i0 = 0; i0 < m; i0 += W) { /* uniform trip count */
			const unsigned i = i0 + tid;
			const uint32_t key = i < m ? cand[i].y : 0u;
			const bool ok = i < m && (key >> 10) == P;
			const unsigned d = ok ? key & (KSEL_BINS - 1) : 0xffffffffu;
			const unsigned peers = __match_any_sync(FULL, d);
			if (ok && __ffs(peers) - 1 == lane)
				atomicAdd(&hist[d], (unsigned)__popc(peers));
		}
	} else { /* pass 2: top 22 bits > P -> mask; == P -> candidates and the digit-2 histogram */
		ksel_scan_row<W>(row, n, [&](int g, int p, const uint32_t *key) {
			unsigned bg[4], bc[4];
#pragma unroll
			for (int cc = 0; cc < 4; cc++) {
				const bool in = p + cc < n;
				bg[cc] = __ballot_sync(FULL, in && (key[cc] >> 10) > P);
				bc[cc] = __ballot_sync(FULL, in && (key[cc] >> 10) == P);
			}
			put_words(g, bg, none);
			append(p, key, bc);
			count(key, bc, 0);
		});
	}
	__syncthreads();
	if (ovf)
		m = sh.n_cand;
	const bool ovf2 = ovf && m > cap;
#pragma unroll
	for (int q = 0; q < PER; q++)
		c[q] = hist[KSEL_BINS - 1 - PER * tid - q];
	unsigned b2;
	ksel_find<W, PER, KSEL_BINS>(sh, c, need, &b2, &need);
	const uint32_t T =
	    (P << 10) | b2; /* the k-th best key; `need` keys == T are taken (lowest positions) */

	/* mark: the candidates (every key not yet in the mask that can be taken) > T and == T */
	if (!ovf2) {
		for (unsigned i = tid; i < m; i += W) {
			const uint2 e = cand[i];
			if (e.y > T)
				atomicOr(&gtw[e.x >> 5], 1u << (e.x & 31));
			else if (e.y == T)
				atomicOr(&eqw[e.x >> 5], 1u << (e.x & 31));
		}
	} else { /* pass 3: both masks from the row */
		ksel_scan_row<W>(row, n, [&](int g, int p, const uint32_t *key) {
			unsigned bg[4], be[4];
#pragma unroll
			for (int cc = 0; cc < 4; cc++) {
				const bool in = p + cc < n;
				bg[cc] = __ballot_sync(FULL, in && key[cc] > T);
				be[cc] = __ballot_sync(FULL, in && key[cc] == T);
			}
			put_words(g, bg, be);
		});
	}
	__syncthreads();

	/* ordered compaction: each thread a run of words; one scan of (taken > T, == T) counts */
	const int per = (nw + W - 1) / W;
	const int w0 = min(tid * per, nw), w1 = min(w0 + per, nw);
	unsigned ng = 0, ne = 0;
	for (int w = w0; w < w1; w++) {
		ng += __popc(gtw[w]);
		ne += __popc(eqw[w]);
	}
	unsigned long long xb;
	cub::BlockScan<unsigned long long, W>(sh.scan.s64)
	    .ExclusiveSum(((unsigned long long)ng << 32) | ne, xb);
	unsigned ei = (unsigned)xb; /* keys == T before this run */
	unsigned at = (unsigned)(xb >> 32) + min(ei, need);
	for (int w = w0; w < w1; w++) {
		uint32_t take = gtw[w], em = eqw[w];
		if (em) {
			const unsigned pc = __popc(em);
			if (ei >= need) {
				em = 0;
			} else if (ei + pc > need) { /* the lowest need - ei of them */
				uint32_t r = 0;
				for (unsigned keep = need - ei; keep; keep--) {
					const uint32_t lo = em & (0u - em);
					r |= lo;
					em ^= lo;
				}
				em = r;
			}
			ei += pc;
			take |= em;
		}
		while (take) {
			const int b = __ffs(take) - 1;
			take &= take - 1;
			if (at < (unsigned)kk) /* cannot fail with consistent counts; never write past kk */
				o[at] = 32 * w + b;
			at++;
		}
	}
}

#endif
