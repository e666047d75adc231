/* Scaffolding for running one kernel's SOURCE on the CPU, a block at a time (gemv_res_sim.cc,
 * mm_multi_sim.cc): the CUDA keywords as plain C++, every CUDA thread a std::thread, __syncthreads a
 * block-wide std::barrier, __shfl_xor_sync an exchange behind a per-warp barrier, and cp.async a
 * 16-byte memcpy deferred until the cp.async.wait_group that covers its commit group (a wait count
 * that lets the kernel read a row whose group was not waited for reads the stale fill and fails).
 * Include it, then the kernel's .inc files; run a block with sim_block(). */
#ifndef TANDEM_TESTS_UNIT_SIM_BLOCK_H
#define TANDEM_TESTS_UNIT_SIM_BLOCK_H

#include <atomic>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

#include "tests/unit/sim_cuda.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __grid_constant__
#define __align__(x) __attribute__((aligned(x)))
#define KDEP_ENTRY()                                                                                         \
	do {                                                                                                 \
	} while (0)

struct sim_dim {
	unsigned x, y;
};
thread_local sim_dim threadIdx, blockIdx;
struct __half {
	uint16_t x;
};
using std::max;
using std::min;

static inline float __half2float(__half h)
{
	return sim_h2f(h.x);
}
static inline float kc_h2f(uint16_t h)
{
	return sim_h2f(h);
}
static inline float kc_bf2f(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}
template <typename T> static inline const T *kdep_after(const T *p)
{
	return p;
}

static std::barrier<> *sim_block_bar;
struct sim_warp {
	std::barrier<> *bar;
	float slot[32];
};
static sim_warp sim_warps[32];
static inline void __syncthreads()
{
	sim_block_bar->arrive_and_wait();
}
static inline float __shfl_xor_sync(unsigned, float v, int m)
{
	sim_warp &w = sim_warps[threadIdx.x >> 5];
	w.slot[threadIdx.x & 31] = v;
	w.bar->arrive_and_wait();
	const float r = w.slot[(threadIdx.x & 31) ^ (unsigned)m];
	w.bar->arrive_and_wait();
	return r;
}

/* cp.async, deferred */
struct sim_copy {
	void *dst;
	const void *src;
	int n; /* bytes: 16 (g3_cp16), or 8 / 16 (sim_cp) */
};
thread_local std::vector<std::vector<sim_copy>> sim_groups; /* committed, oldest first */
thread_local std::vector<sim_copy> sim_open; /* not yet committed */
static inline void g3_cp16(void *dst, const void *src)
{
	sim_open.push_back({dst, src, 16});
}
/* a cp.async of N bytes, deferred like g3_cp16 */
template <int N> static inline void sim_cp(void *dst, const void *src)
{
	sim_open.push_back({dst, src, N});
}
static inline void g3_commit(void)
{
	sim_groups.push_back(sim_open);
	sim_open.clear();
}
template <int N> static inline void g3_wait(void)
{
	while ((int)sim_groups.size() > N) {
		for (const sim_copy &c : sim_groups.front())
			memcpy(c.dst, c.src, (size_t)c.n);
		sim_groups.erase(sim_groups.begin());
	}
}

static std::atomic<int> sim_leaks; /* threads that ended with copies never waited for */

/* block (bx, by) of n_thr threads running body() (the kernel call); threads that end early drop out
 * of the barriers, as exited CUDA threads do */
template <class F> static void sim_block(int n_thr, unsigned bx, unsigned by, F body)
{
	std::barrier<> bb(n_thr);
	sim_block_bar = &bb;
	std::vector<std::unique_ptr<std::barrier<>>> wb;
	for (int i = 0; i < (n_thr + 31) / 32; i++) {
		wb.emplace_back(new std::barrier<>(32));
		sim_warps[i].bar = wb.back().get();
	}
	std::vector<std::thread> th;
	for (int t = 0; t < n_thr; t++)
		th.emplace_back([=, &body]() {
			threadIdx.x = (unsigned)t;
			blockIdx.x = bx;
			blockIdx.y = by;
			body();
			if (!sim_groups.empty() || !sim_open.empty())
				sim_leaks++;
			sim_groups.clear();
			sim_open.clear();
			sim_warps[t >> 5].bar->arrive_and_drop();
			sim_block_bar->arrive_and_drop();
		});
	for (auto &t : th)
		t.join();
}

#endif
