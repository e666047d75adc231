/* Exact top-k of decode rows of indexer scores (up to KTOPK_FAST_MAX per row), one block per row with
 * the row's keys in REGISTERS (rows above KTOPK_FAST_REG: in shared memory): the default behind
 * kcuda_topk_idx_short and, for up to 64 rows, kcuda_topk_idx (TANDEM_TOPK=old: the shared-memory
 * radix kernel topk_short_kernel and the multi-block radix path of topk_idx_radix.cu, as before).
 * Same result as kcpu_topk:
 * score descending, ties to the LOWER position, NaN as -inf, -0 == +0, min(k, n) positions in
 * ascending order.
 *
 * Why: topk_short_kernel measured 12.1 us per layer at 4096 keys on the H200 (run14 nsys), a chain
 * of ~20 block barriers (4 fixed 8-bit digits, each: zero 32 warp histograms, match + atomics, a
 * 32-way bin sum, a scan; then two block scans). Here the chain is as short as the data allows:
 *   load     thread t holds positions [t*PER, t*PER + PER) as order-preserving uint32 keys (float4
 *            loads, issued together with the row length's load); warp min / max, one barrier.
 *   digit    the bins are the key RANGE [kmin, kmax] cut into NB = 4 * THREADS equal pieces of
 *            2^s keys (a monotone map, so a bin above another holds only larger keys). The scores
 *            of one row are narrow (sums of ReLU terms), so fixed top digits put most keys in one
 *            bin; the row's own range spreads them. Shared atomics, one barrier; the bin holding
 *            the k-th best key comes from a block scan over the bins from the top (each thread
 *            four bins, a warp scan, one barrier, warp prefixes read back), one barrier.
 *   finish   if the bin is one key wide, or every key in it is taken, the threshold is known;
 *            if it holds at most 32 keys, they are gathered and warp 0 ranks them (score, then
 *            position) by shuffles: two barriers; otherwise the next digit cuts that bin the same
 *            way (at most 4 digits for 32-bit keys, usually 1-2).
 *   output   T = the k-th key, need = how many keys == T are taken (the lowest-positioned ones):
 *            one block scan of (count > T, count == T) packed in one word gives every thread its
 *            output offset; each writes its taken positions in order.
 * About 6-8 barriers per row and one read of the row; the histogram's zeroing comes before
 * KDEP_ENTRY (it is this block's shared memory). Rows are independent blocks (batch 8: 8 SMs). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/topk_fast.cuh"

#define TF_CAND 32 /* bin sizes warp 0 ranks directly */
static_assert(KTOPK_FAST_MAX < 65536, "the output scan packs two counts of up to n in one word");

/* order-preserving key: larger score -> larger key; -0 == +0; NaN == -inf (0x007fffff, the smallest
 * key); never 0, which marks a slot past the row's end */
__device__ __forceinline__ uint32_t tf_key(float v)
{
	const uint32_t u = __float_as_uint(v);
	if (v == 0.0f)
		return 0x80000000u;
	if (v != v)
		return 0x007fffffu;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int THREADS> struct tf_shared {
	uint32_t hist[4 * THREADS]; /* NB bins */
	uint32_t wa[32], wb[32]; /* per-warp min / max, then per-warp scan totals */
	uint32_t cand_key[TF_CAND], cand_pos[TF_CAND];
	uint32_t n_cand;
	uint32_t bin, need, cnt; /* the find step's result */
	uint32_t T, need_eq; /* the candidate rank's result */
	uint32_t s_hi, s_lo; /* the sample's bins around the k-th key */
};

/* inclusive warp scan of v */
__device__ __forceinline__ uint32_t tf_warp_scan(uint32_t v, int lane)
{
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const uint32_t x = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= o)
			v += x;
	}
	return v;
}

/* sum of wb[0 .. w) (the totals of the warps before warp w), every lane */
template <int THREADS>
__device__ __forceinline__ uint32_t tf_warps_before(const tf_shared<THREADS> &sh, int w, int lane)
{
	const uint32_t x = lane < w ? sh.wb[lane] : 0u;
	return __reduce_add_sync(0xffffffffu, x);
}

/* a thread's PER keys: registers (SMEM false), or dynamic shared memory for rows longer than the
 * registers hold (key u of thread t at [u * THREADS + t]: a warp's accesses hit 32 banks) */
template <int THREADS, int PER, bool SMEM> struct tf_keys;
template <int THREADS, int PER> struct tf_keys<THREADS, PER, false> {
	uint32_t k[PER];
	__device__ __forceinline__ void init(uint32_t *, int)
	{
	}
	__device__ __forceinline__ uint32_t get(int u) const
	{
		return k[u];
	}
	__device__ __forceinline__ void set(int u, uint32_t v)
	{
		k[u] = v;
	}
};
template <int THREADS, int PER> struct tf_keys<THREADS, PER, true> {
	uint32_t *k;
	__device__ __forceinline__ void init(uint32_t *dyn, int tid)
	{
		k = dyn + tid;
	}
	__device__ __forceinline__ uint32_t get(int u) const
	{
		return k[u * THREADS];
	}
	__device__ __forceinline__ void set(int u, uint32_t v)
	{
		k[u * THREADS] = v;
	}
};

template <int THREADS, int PER, bool SMEM>
__global__ void __launch_bounds__(THREADS)
    topk_fast_kernel(const float *s, int64_t ld, const int32_t *n_dev, int64_t n0, int k, int32_t *out,
                     int64_t ldo, int32_t *n_out, unsigned *err, int sample)
{
	extern __shared__ uint32_t tf_dyn[]; /* SMEM: THREADS * PER keys */
	constexpr int NB = 4 * THREADS, NW = THREADS / 32;
	/* the digit's bits: floor(log2(NB)) (640 threads: 2048 of the 2560 bins are used) */
	constexpr int NB_BITS = NB >= 4096 ? 12 : (NB >= 2048 ? 11 : 10);
	static_assert((1 << NB_BITS) <= NB && NB < (2 << NB_BITS), "bins");
	static_assert(PER % 4 == 0, "keys per thread: float4 loads");
	__shared__ __align__(16) tf_shared<THREADS> sh;
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	/* our own shared memory: zeroed while the kernel before still runs */
#pragma unroll
	for (int q = 0; q < 4; q++)
		sh.hist[q * THREADS + tid] = 0;
	if (tid == 0)
		sh.n_cand = 0;
	KDEP_ENTRY();
	const int64_t row = blockIdx.x;
	const float *p = s + row * ld;
	/* thread t holds positions [t*S, t*S + S): S keys of its PER slots, S the least that covers ld
	 * (4112 = 4096 + 16 in 1024 x 8: 823 threads of 5 keys, not 513 of 8). The long shapes keep
	 * S = PER: a run-time S costs them registers (spills at 64 / 96) */
	const int S = PER >= 16 ? PER : (int)min((int64_t)PER, (ld + THREADS - 1) / THREADS);
	const int base = tid * S;
	/* the keys' loads go out with the length's: a row has ld floats, whatever its length */
	tf_keys<THREADS, PER, SMEM> key;
	key.init(tf_dyn, tid);
	if (((uintptr_t)p & 15) == 0 && S % 4 == 0 && base + S <= ld) {
#pragma unroll
		for (int u = 0; u < PER; u += 4) {
			if (u < S) {
				const float4 f = *(const float4 *)(p + base + u);
				key.set(u, tf_key(f.x));
				key.set(u + 1, tf_key(f.y));
				key.set(u + 2, tf_key(f.z));
				key.set(u + 3, tf_key(f.w));
			} else {
				key.set(u, 0u);
				key.set(u + 1, 0u);
				key.set(u + 2, 0u);
				key.set(u + 3, 0u);
			}
		}
	} else {
#pragma unroll
		for (int u = 0; u < PER; u++)
			key.set(u, u < S && base + u < ld ? tf_key(p[base + u]) : 0u);
	}
	int64_t n64 = n_dev ? (int64_t)n_dev[row] : n0 + row + 1;
	if (n64 > ld) { /* longer than the row: counted, clamped (as the other top-k kernels) */
		if (tid == 0)
			atomicAdd(err, 1u);
		n64 = ld;
	}
	const int n = n64 < 0 ? 0 : (int)n64;
	const int kk = k < n ? k : n;
	int32_t *o = out + row * ldo;
	if (n_out && tid == 0)
		n_out[row] = kk;
	if (kk <= 0)
		return;
	if (kk == n) { /* every position, in order (the scores need not even exist) */
		for (int i = tid; i < n; i += THREADS)
			o[i] = i;
		return;
	}
	uint32_t lo_k = 0xffffffffu, hi_k = 0;
#pragma unroll
	for (int u = 0; u < PER; u++) {
		if (u >= S || base + u >= n)
			key.set(u, 0u); /* past the row's end: below every key, never counted */
		const uint32_t x = key.get(u);
		if (x) {
			lo_k = min(lo_k, x);
			hi_k = max(hi_k, x);
		}
	}
	lo_k = __reduce_min_sync(0xffffffffu, lo_k);
	hi_k = __reduce_max_sync(0xffffffffu, hi_k);
	if (lane == 0) {
		sh.wa[w] = lo_k;
		sh.wb[w] = hi_k;
	}
	__syncthreads();
	const uint32_t kmin = __reduce_min_sync(0xffffffffu, lane < NW ? sh.wa[lane] : 0xffffffffu);
	const uint32_t kmax = __reduce_max_sync(0xffffffffu, lane < NW ? sh.wb[lane] : 0u);

	/* digits: [lo, lo + wmask] is the range still open, need the keys to take from it */
	uint32_t lo = kmin, wmask = kmax - kmin, need = (uint32_t)kk;
	uint32_t T = 0, need_eq = 0;
	if (sample && wmask != 0) {
		/* long rows: the histogram's shared atomics dominate (one per key: ~16 us for 32k keys
		 * on the H200, 22:13 run). Each thread's first key is a sample; the sample's bins around
		 * rank k * samples / n (+- 4 sigma + 8) bound a range [lo2, hi2]; two counts over all keys
		 * (keys above it, keys in it) check that the k-th key lies inside, and then only the keys
		 * in it are histogrammed (most rows: ~1/8 of the keys). Otherwise the full range, as
		 * without the sample. */
		const int bits = 32 - __clz(wmask);
		const int sft = bits > NB_BITS ? bits - NB_BITS : 0;
		const uint32_t x0 = key.get(0);
		if (x0)
			atomicAdd(&sh.hist[(x0 - lo) >> sft], 1u);
		if (tid == 0)
			sh.s_hi = sh.s_lo = 0xffffffffu;
		const uint32_t ns = (uint32_t)min(THREADS, (n + S - 1) / S); /* threads with a key */
		const uint32_t r = (uint32_t)(((uint64_t)kk * ns) / (uint32_t)n);
		const uint32_t m = (uint32_t)(4.0f * sqrtf((float)r) + 8.0f);
		const uint32_t t_hi = r > m ? r - m : 0u; /* 0: no upper cut */
		const uint32_t t_lo = r + m < ns ? r + m : 0u; /* 0: no lower cut */
		__syncthreads();
		const uint4 h = *(const uint4 *)&sh.hist[NB - 4 - 4 * tid];
		*(uint4 *)&sh.hist[NB - 4 - 4 * tid] = make_uint4(0, 0, 0, 0);
		const uint32_t c[4] = {h.w, h.z, h.y, h.x};
		const uint32_t tot = c[0] + c[1] + c[2] + c[3];
		const uint32_t incl = tf_warp_scan(tot, lane);
		if (lane == 31)
			sh.wb[w] = incl;
		__syncthreads();
		const uint32_t excl = tf_warps_before(sh, w, lane) + incl - tot;
		uint32_t cum = excl;
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (t_hi && cum < t_hi && cum + c[q] >= t_hi)
				sh.s_hi = (uint32_t)(NB - 1 - 4 * tid - q);
			if (t_lo && cum < t_lo && cum + c[q] >= t_lo)
				sh.s_lo = (uint32_t)(NB - 1 - 4 * tid - q);
			cum += c[q];
		}
		__syncthreads();
		const uint32_t bh = sh.s_hi, bl = sh.s_lo;
		const uint32_t lo2 = bl != 0xffffffffu ? lo + (bl << sft) : lo;
		const uint64_t h2 = bh != 0xffffffffu ? (uint64_t)lo + ((uint64_t)(bh + 1) << sft) - 1 : kmax;
		const uint32_t hi2 = h2 < kmax ? (uint32_t)h2 : kmax;
		uint32_t above = 0, inr = 0;
#pragma unroll
		for (int u = 0; u < PER; u++) {
			const uint32_t x = key.get(u);
			above += x > hi2;
			inr += x >= lo2 && x <= hi2;
		}
		/* both counts below 2^16 (n <= KTOPK_FAST_MAX) */
		const uint32_t wsum = __reduce_add_sync(0xffffffffu, above << 16 | inr);
		if (lane == 0)
			sh.wa[w] = wsum;
		__syncthreads();
		const uint32_t all = __reduce_add_sync(0xffffffffu, lane < NW ? sh.wa[lane] : 0u);
		const uint32_t a = all >> 16, in = all & 0xffffu;
		if (a < need && a + in >= need) {
			lo = lo2;
			wmask = hi2 - lo2;
			need -= a;
		}
	}
	for (;;) {
		if (wmask == 0) { /* one key value left (all keys equal, or a tied k-th key) */
			T = lo;
			need_eq = need;
			break;
		}
		const int bits = wmask ? 32 - __clz(wmask) : 0;
		const int sft = bits > NB_BITS ? bits - NB_BITS : 0;
#pragma unroll
		for (int u = 0; u < PER; u++) {
			const uint32_t x = key.get(u), d = x - lo;
			if (x >= lo && d <= wmask)
				atomicAdd(&sh.hist[d >> sft], 1u);
		}
		__syncthreads();
		/* thread tid holds bins NB-1-4*tid .. NB-4-4*tid (from the top); it zeroes them for the
		 * next digit (no other thread reads them) */
		const uint4 h = *(const uint4 *)&sh.hist[NB - 4 - 4 * tid];
		*(uint4 *)&sh.hist[NB - 4 - 4 * tid] = make_uint4(0, 0, 0, 0);
		const uint32_t c[4] = {h.w, h.z, h.y, h.x};
		const uint32_t tot = c[0] + c[1] + c[2] + c[3];
		const uint32_t incl = tf_warp_scan(tot, lane);
		if (lane == 31)
			sh.wb[w] = incl;
		__syncthreads();
		const uint32_t excl = tf_warps_before(sh, w, lane) + incl - tot;
		if (excl < need && excl + tot >= need) {
			uint32_t cum = excl;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				if (cum + c[q] >= need) {
					sh.bin = (uint32_t)(NB - 1 - 4 * tid - q);
					sh.need = need - cum;
					sh.cnt = c[q];
					break;
				}
				cum += c[q];
			}
		}
		__syncthreads();
		const uint32_t bin = sh.bin, cnt = sh.cnt;
		need = sh.need; /* >= 1 */
		lo += bin << sft;
		wmask = sft ? (1u << sft) - 1u : 0u;
		if (sft == 0) { /* the bin is one key: it is T */
			T = lo;
			need_eq = need;
			break;
		}
		if (cnt == need) { /* the whole bin is taken: every key >= lo */
			T = lo - 1u; /* lo >= kmin >= 0x007fffff: no wrap */
			need_eq = 0;
			break;
		}
		if (cnt <= TF_CAND) { /* few keys: warp 0 ranks them */
#pragma unroll
			for (int u = 0; u < PER; u++) {
				const uint32_t x = key.get(u), d = x - lo;
				if (x >= lo && d <= wmask) {
					const uint32_t j = atomicAdd(&sh.n_cand, 1u);
					if (j < TF_CAND) { /* cannot fail with consistent counts */
						sh.cand_key[j] = x;
						sh.cand_pos[j] = (uint32_t)(base + u);
					}
				}
			}
			__syncthreads();
			if (w == 0) {
				const uint32_t nc = min(sh.n_cand, (uint32_t)TF_CAND);
				const bool in = (uint32_t)lane < nc;
				const uint32_t ck = in ? sh.cand_key[lane] : 0u,
				               cp = in ? sh.cand_pos[lane] : 0u;
				/* all 32 lanes, unrolled (the shuffles overlap): an empty lane's key 0 is
				 * neither above nor equal to a candidate's */
				uint32_t rank = 0;
#pragma unroll
				for (int j = 0; j < 32; j++) {
					const uint32_t kj = __shfl_sync(0xffffffffu, ck, j);
					const uint32_t pj = __shfl_sync(0xffffffffu, cp, j);
					rank += kj > ck || (kj == ck && pj < cp);
				}
				const unsigned at = __ballot_sync(0xffffffffu, in && rank == need - 1u);
				const uint32_t t = __shfl_sync(0xffffffffu, ck, at ? __ffs(at) - 1 : 0);
				const unsigned eq = __ballot_sync(0xffffffffu, in && rank < need && ck == t);
				if (lane == 0) {
					sh.T = at ? t : lo - 1u;
					sh.need_eq = at ? (uint32_t)__popc(eq) : 0u;
				}
			}
			__syncthreads();
			T = sh.T;
			need_eq = sh.need_eq;
			break;
		}
	}

	/* output: keys > T, then the first need_eq keys == T, in position order. One block scan of
	 * (gt << 16 | eq): both sums stay below 2^16 (n <= KTOPK_FAST_MAX). The barrier first: a row
	 * whose keys are all equal (wmask 0 at once) reaches this scan with no barrier since the
	 * kmin / kmax reads of sh.wb above, and a warp's scan total must not overwrite sh.wb[w] while a
	 * slower warp still reads it (racecheck on the H200, 2026-11-30: a slow warp then saw another
	 * kmax, took the histogram loop alone and waited at its barrier; the CPU simulation hung the
	 * same way once in CI) */
	__syncthreads();
	uint32_t gt = 0, eq = 0;
#pragma unroll
	for (int u = 0; u < PER; u++) {
		gt += key.get(u) > T;
		eq += key.get(u) == T;
	}
	const uint32_t v = gt << 16 | eq;
	const uint32_t incl = tf_warp_scan(v, lane);
	if (lane == 31)
		sh.wb[w] = incl;
	__syncthreads();
	const uint32_t excl = tf_warps_before(sh, w, lane) + incl - v;
	uint32_t e = excl & 0xffffu;
	uint32_t at = (excl >> 16) + min(e, need_eq);
#pragma unroll
	for (int u = 0; u < PER; u++) {
		const uint32_t x = key.get(u);
		const bool ise = x == T;
		const bool take = x > T || (ise && e < need_eq);
		e += ise;
		if (take) {
			if (at < (uint32_t)kk) /* cannot fail with consistent counts; never past kk */
				o[at] = base + u;
			at++;
		}
	}
}

static int tf_old(void)
{
	const char *e = getenv("TANDEM_TOPK");
	return e && strcmp(e, "old") == 0;
}

/* rows beyond the registers' KTOPK_FAST_REG keys: 1024 threads x 48 keys in dynamic shared memory,
 * 192 KB (Hopper / sm_100 take it; sm_120's 99 KB does not) */
#define TF_SMEM_PER 48
static const size_t tf_smem_bytes = (size_t)1024 * TF_SMEM_PER * sizeof(uint32_t);

int kcuda_topk_fast_takes(struct kcuda_ctx *c, int64_t ld)
{
	if (!c || ld < 1 || ld > KTOPK_FAST_MAX || tf_old())
		return 0;
	if (ld <= KTOPK_FAST_REG)
		return 1;
	/* the shared-memory variant: asked once per device (a racing first call stores the same) */
	static int ok[64];
	const int dev = c->device >= 0 && c->device < 64 ? c->device : -1;
	if (dev >= 0 && ok[dev])
		return ok[dev] > 0;
	const int max_smem = kcuda_smem_optin(c->device);
	cudaFuncAttributes fa;
	int r = max_smem > 0 &&
	        cudaFuncGetAttributes(&fa, topk_fast_kernel<1024, TF_SMEM_PER, true>) == cudaSuccess;
	if (!r)
		(void)cudaGetLastError();
	r = r && fa.sharedSizeBytes + tf_smem_bytes <= (size_t)max_smem;
	if (dev >= 0)
		ok[dev] = r ? 1 : -1;
	return r;
}

template <int THREADS, int PER, bool SMEM>
static int tf_launch(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                     int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out, int sample)
{
	const size_t smem = SMEM ? (size_t)THREADS * PER * sizeof(uint32_t) : 0;
	if (SMEM)
		KCUDA_CHECK(cudaFuncSetAttribute(topk_fast_kernel<THREADS, PER, SMEM>,
		                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	return klaunch("topk_fast", topk_fast_kernel<THREADS, PER, SMEM>, dim3((unsigned)n_rows),
	               dim3(THREADS), smem, c->stream, scores, ld, n, n0, k, out, ldo, n_out, c->err_dev,
	               sample);
}

int kcuda_topk_fast(struct kcuda_ctx *c, const float *scores, int64_t ld, int64_t n_rows, const int32_t *n,
                    int64_t n0, int k, int32_t *out, int64_t ldo, int32_t *n_out)
{
	if (!c || !scores || !out || n_rows < 0 || k < 0 || ldo < k || ld < 1)
		return kcuda_bad_arg("topk_fast", "rows %lld k %d ldo %lld ld %lld%s", (long long)n_rows, k,
		                     (long long)ldo, (long long)ld,
		                     !c || !scores || !out ? ", or a null pointer" : "");
	if (!kcuda_topk_fast_takes(c, ld))
		return ERR_UNSUPPORTED;
	if (n_rows == 0)
		return 0;
	if (n_rows > INT32_MAX)
		return ERR_LIMIT;
	/* the block shape: TANDEM_TOPK_THREADS (256 / 512 / 1024) where that shape covers ld, else the
	 * default (fewer threads for shorter rows: cheaper barriers and scans); TANDEM_TOPK_SMEM=1 the
	 * shared-memory keys from 16k on (to compare) */
	const char *te = getenv("TANDEM_TOPK_THREADS"), *se = getenv("TANDEM_TOPK_SMEM");
	const int want = te ? atoi(te) : 0;
	/* the sampled range (rows above 8192 by default; TANDEM_TOPK_SAMPLE=0 never, =1 always) */
	const char *pe = getenv("TANDEM_TOPK_SAMPLE");
	const int sample = pe && pe[0] ? strcmp(pe, "0") != 0 : ld > 8192;
#define TF_TRY(T, P)                                                                                         \
	if (want == (T) && ld <= (int64_t)(T) * (P))                                                         \
		return tf_launch<T, P, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	TF_TRY(256, 8)
	TF_TRY(256, 16)
	TF_TRY(256, 32)
	TF_TRY(512, 8)
	TF_TRY(512, 16)
	TF_TRY(1024, 4)
#undef TF_TRY
	if (ld <= 2048)
		return tf_launch<256, 8, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	if (ld <= 4096) /* 1024 x 4 measured 4.32 us against 512 x 8 4.61 (H200, 22:13) */
		return tf_launch<1024, 4, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	if (ld <= 8192)
		return tf_launch<1024, 8, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	if (ld <= 16384)
		return tf_launch<1024, 16, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	const int smem = se && strcmp(se, "1") == 0 && kcuda_topk_fast_takes(c, KTOPK_FAST_MAX);
	if (ld <= 32768 && !smem)
		return tf_launch<1024, 32, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	/* the 32k graphs' stride (32832: max_ctx 32784 rounded to 256 bytes): 640 threads have 96
	 * registers each, room for 52 keys (768 x 44 spilled at 80) */
	if (ld <= KTOPK_FAST_REG && !smem)
		return tf_launch<640, 52, false>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
	return tf_launch<1024, TF_SMEM_PER, true>(c, scores, ld, n_rows, n, n0, k, out, ldo, n_out, sample);
}
