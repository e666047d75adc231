/* topk_fast.cu's kernel SOURCE run on the CPU: every CUDA thread a std::thread, __syncthreads a
 * block-wide std::barrier, the warp intrinsics (shuffles, reductions, ballot) exchanges behind a
 * per-warp barrier, shared memory a static. test_topk_fast_sim.sh cuts the device part of
 * kernels/cuda/topk_fast.cu (from "#define TF_CAND" to the host launchers) into topk_fast_body.inc
 * and builds this file around it, so CI without a GPU checks the kernel's own indexing, digits,
 * candidate rank and ordered output against a sort (score descending, ties to the lower position,
 * NaN as -inf, -0 == +0, result ascending) for each block shape: rows of different lengths (n <= k,
 * n = k + 1, ld - 3, ld / 2 + 1), ten data kinds full of ties, unaligned rows. It does not check
 * the memory model or timing: the GPU op test (tests/ops/test_ops_indexer.c) does that. */
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(x) __attribute__((aligned(x)))
#define KDEP_ENTRY()                                                                                         \
	do {                                                                                                 \
	} while (0)
struct sim_dim {
	unsigned x;
};
thread_local sim_dim threadIdx, blockIdx;
struct float4 {
	float x, y, z, w;
};
struct uint4 {
	uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
	return {a, b, c, d};
}
static inline uint32_t __float_as_uint(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static inline int __clz(uint32_t x)
{
	return x ? __builtin_clz(x) : 32;
}
static inline int __ffs(uint32_t x)
{
	return x ? __builtin_ctz(x) + 1 : 0;
}
static inline int __popc(uint32_t x)
{
	return __builtin_popcount(x);
}
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
using std::max;
using std::min;

static std::barrier<> *sim_block_bar;
struct sim_warp {
	std::barrier<> *bar;
	uint64_t slot[32];
};
static sim_warp sim_warps[32];
static inline void __syncthreads()
{
	sim_block_bar->arrive_and_wait();
}
/* every lane's v, after all 32 lanes posted theirs */
static inline void sim_warp_all(uint64_t v, uint64_t out[32])
{
	sim_warp &w = sim_warps[threadIdx.x >> 5];
	w.slot[threadIdx.x & 31] = v;
	w.bar->arrive_and_wait();
	memcpy(out, w.slot, sizeof(w.slot));
	w.bar->arrive_and_wait();
}
static inline uint32_t __shfl_up_sync(unsigned, uint32_t v, int o)
{
	uint64_t a[32];
	sim_warp_all(v, a);
	const int l = threadIdx.x & 31;
	return l >= o ? (uint32_t)a[l - o] : v;
}
static inline uint32_t __shfl_sync(unsigned, uint32_t v, int src)
{
	uint64_t a[32];
	sim_warp_all(v, a);
	return (uint32_t)a[src & 31];
}
static inline uint32_t __reduce_add_sync(unsigned, uint32_t v)
{
	uint64_t a[32];
	sim_warp_all(v, a);
	uint32_t s = 0;
	for (int i = 0; i < 32; i++)
		s += (uint32_t)a[i];
	return s;
}
static inline uint32_t __reduce_min_sync(unsigned, uint32_t v)
{
	uint64_t a[32];
	sim_warp_all(v, a);
	uint32_t s = 0xffffffffu;
	for (int i = 0; i < 32; i++)
		s = std::min(s, (uint32_t)a[i]);
	return s;
}
static inline uint32_t __reduce_max_sync(unsigned, uint32_t v)
{
	uint64_t a[32];
	sim_warp_all(v, a);
	uint32_t s = 0;
	for (int i = 0; i < 32; i++)
		s = std::max(s, (uint32_t)a[i]);
	return s;
}
static inline unsigned __ballot_sync(unsigned, bool p)
{
	uint64_t a[32];
	sim_warp_all(p ? 1 : 0, a);
	unsigned b = 0;
	for (int i = 0; i < 32; i++)
		b |= (unsigned)a[i] << i;
	return b;
}
static uint32_t sim_dyn[1024 * 48]; /* the shared-memory keys */

#include "kernels/cuda/topk_fast.cuh"
#include "topk_fast_body.inc"

/* one block after the other, THREADS std::threads each */
template <int T, int P, bool S>
static void sim_run(const float *s, int64_t ld, int rows, const int32_t *n, int k, int32_t *out,
                    int32_t *n_out, unsigned *err, int sample)
{
	for (int b = 0; b < rows; b++) {
		std::barrier<> bb(T);
		sim_block_bar = &bb;
		std::vector<std::unique_ptr<std::barrier<>>> wb;
		for (int w = 0; w < T / 32; w++) {
			wb.emplace_back(new std::barrier<>(32));
			sim_warps[w].bar = wb.back().get();
		}
		std::vector<std::thread> th;
		for (int t = 0; t < T; t++)
			th.emplace_back([=]() {
				threadIdx.x = (unsigned)t;
				blockIdx.x = (unsigned)b;
				topk_fast_kernel<T, P, S>(s, ld, n, 0, k, out, k, n_out, err, sample);
				/* an exited thread no longer takes part in barriers (as on the GPU, where a
				 * warp that returned early does not hold up the others' __syncthreads): without
				 * this a warp leaving before the rest hung the simulation (CI, 2026-11-29 23:34) */
				sim_warps[t >> 5].bar->arrive_and_drop();
				sim_block_bar->arrive_and_drop();
			});
		for (auto &x : th)
			x.join();
	}
}

static std::vector<int> sorted_topk(const float *p, int n, int k)
{
	std::vector<int> idx(n);
	for (int i = 0; i < n; i++)
		idx[i] = i;
	auto sc = [&](int i) { return p[i] != p[i] ? -INFINITY : p[i]; };
	std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
		const float x = sc(a), y = sc(b);
		return x != y ? x > y : a < b;
	});
	std::vector<int> r(idx.begin(), idx.begin() + std::min(k, n));
	std::sort(r.begin(), r.end());
	return r;
}

static std::mt19937_64 rng(20261129);
static float val(int mode, int j)
{
	std::uniform_real_distribution<float> u(-1, 1);
	switch (mode) {
	case 0: return u(rng) * 10;
	case 1: { /* an indexer score: weighted ReLU sum */
		float v = 0;
		for (int h = 0; h < 32; h++) {
			const float x = u(rng);
			v += (float)(h % 7 + 1) / 16.0f * (x > 0 ? x : 0);
		}
		return v;
	}
	case 2: return 0.375f;
	case 3: return (rng() & 1) ? 1.5f : -2.0f;
	case 4: return (rng() & 1) ? 0.0f : -0.0f;
	case 5: {
		const unsigned z = (unsigned)(rng() % 8);
		return z == 0 ? NAN : (z == 1 ? -INFINITY : (float)(int)(z % 3));
	}
	case 6: return j == 77 ? INFINITY : 1.0f + 0.01f * u(rng);
	case 7: return NAN;
	case 8: return floorf(u(rng) * 40) / 4;
	default: return nextafterf(1.0f, 2.0f) + (float)(rng() % 5) * 1.1920929e-7f;
	}
}

static int n_fail, n_rows;
template <int T, int P, bool S> static void sim_case(int64_t ld, int mode, int off, int k, int sample)
{
	const int rows = 3;
	float *buf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(ld * rows + 16));
	float *s = buf + off;
	for (int64_t j = 0; j < ld * rows; j++)
		s[j] = val(mode, (int)(j % ld));
	int32_t n[3] = {(int32_t)ld, (int32_t)std::max<int64_t>(1, ld - 3),
	                (int32_t)std::min<int64_t>(ld, k + 1)};
	if (mode % 2)
		n[1] = (int32_t)std::max<int64_t>(1, ld / 2 + 1);
	std::vector<int32_t> out((size_t)k * rows, -7), n_out(rows, -7);
	unsigned err = 0;
	sim_run<T, P, S>(s, ld, rows, n, k, out.data(), n_out.data(), &err, sample);
	for (int r = 0; r < rows; r++) {
		const std::vector<int> want = sorted_topk(s + r * ld, n[r], k);
		const bool ok =
		    n_out[r] == (int)want.size() && std::equal(want.begin(), want.end(), out.begin() + r * k);
		n_rows++;
		if (!ok) {
			n_fail++;
			printf("FAIL block %d x %d%s ld %lld n %d data %d k %d sample %d\n", T, P,
			       S ? " (shared keys)" : "", (long long)ld, n[r], mode, k, sample);
		}
	}
	if (err) {
		n_fail++;
		printf("FAIL: %u bad inputs counted\n", err);
	}
	free(buf);
}

int main(int argc, char **argv)
{
	const int big = argc > 1 && !strcmp(argv[1], "big");
	for (int mode = 0; mode < 10; mode++) {
		/* the sampled range on odd data kinds at short rows (on by default above 8192) */
		const int sm = mode & 1;
		sim_case<256, 8, false>(2048, mode, mode & 1, 2047 - (mode % 3) * 1000, sm);
		sim_case<256, 8, false>(2047, mode, 1, 1000, !sm);
		sim_case<256, 8, false>(1000, mode, 0, 2048, sm); /* n <= k: every position */
		sim_case<256, 8, false>(2048, mode, 0, 1, sm);
		sim_case<1024, 4, false>(4096, mode, 0, 2048, sm);
		sim_case<256, 16, false>(4096, mode, 0, 7, !sm);
		sim_case<256, 32, false>(8192, mode, 0, 2048, 1);
		if (big || mode % 3 == 1) {
			sim_case<1024, 8, false>(4112, mode, 0, 2048, 0);
			sim_case<640, 52, false>(32832, mode, 0, 2048, 1);
			sim_case<1024, 48, true>(33281, mode, 1, 2048, 1);
		}
	}
	printf("topk_fast on the CPU: %d rows, %d failed\n", n_rows, n_fail);
	return n_fail ? 1 : 0;
}
