/* Timing shared by the CUDA benchmarks: the median of batches of calls between CUDA events.
 * Include after kernels/cuda/cuda_common.cuh (KCUDA_CHECK). */
#pragma once
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

static inline float bench_median(std::vector<float> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

/* ms per call: `warm` warm-up calls, then the median over `reps` batches of `batch` calls of fn(i)
 * (i counts up across the batches, so callers can rotate buffers) */
template <class F> static float bench_time_ms(cudaStream_t s, int warm, int reps, int batch, F fn)
{
	cudaEvent_t a, b;
	KCUDA_CHECK(cudaEventCreate(&a));
	KCUDA_CHECK(cudaEventCreate(&b));
	for (int i = 0; i < warm; i++)
		fn(i);
	std::vector<float> v;
	int k = 0;
	for (int r = 0; r < reps; r++) {
		KCUDA_CHECK(cudaEventRecord(a, s));
		for (int i = 0; i < batch; i++)
			fn(k++);
		KCUDA_CHECK(cudaEventRecord(b, s));
		KCUDA_CHECK(cudaEventSynchronize(b));
		float ms;
		KCUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
		v.push_back(ms / batch);
	}
	KCUDA_CHECK(cudaEventDestroy(a));
	KCUDA_CHECK(cudaEventDestroy(b));
	return bench_median(v);
}
