/* Bench: the MoE decode ops at one TP=8 rank of GLM-5 (256 experts, top-8, D 6144, per-rank expert
 * slice F 256, Q4_K gate / up / down), old kernels (TANDEM_MOE_FAST=0: pairs up to 16 tokens,
 * sorted up to 256) against the tensor-core path (kernels/cuda/moe_mma.cu), batch 1, 8, 32, 128;
 * and kcuda_moe_route (sigmoid, bias, one group) at the same batches. Second table: routed + shared
 * expert (F 256, the same types), old = kcuda_moe_ffn + the backend's shared chain (3 kcuda_matmul,
 * kcuda_swiglu, kfwd_add: 5 launches) against kcuda_moe_ffn_shexp (one set of launches).
 *
 * Weights: one expert's rows filled at random (ops_fill_weight) and copied to all 256, so filling
 * is quick; every expert still has its own addresses (nothing is shared through the caches but what
 * the access pattern shares). Expert ids: distinct per token, uniform, seeded (seed printed).
 * GB/s counts the bytes of the experts the batch actually hits (distinct ids x (2 F rows of gate /
 * up + D rows of down)), each read once: the floor the op can reach. Time: CUDA events around 20
 * calls after 3 warm-up calls, median of 5 such batches. NG1 / NG2: the new path with one or two
 * n-tiles forced (TANDEM_MOE_MMA_NG; "new" picks by n). Also printed: the largest difference
 * between the two paths' outputs relative to max |out| (both are fp32-accurate: ~1e-6).
 *   bench_cuda_moe          exit 77 without a GPU */
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/model_fwd.h"
#include "tests/ops/ops_util.h"

#define CK KCUDA_CHECK

static float median(std::vector<float> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

template <class Fn> static float time_us(cudaStream_t s, Fn fn)
{
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	for (int i = 0; i < 3; i++)
		fn();
	std::vector<float> v;
	for (int r = 0; r < 5; r++) {
		CK(cudaEventRecord(a, s));
		for (int i = 0; i < 20; i++)
			fn();
		CK(cudaEventRecord(b, s));
		CK(cudaEventSynchronize(b));
		float ms;
		CK(cudaEventElapsedTime(&ms, a, b));
		v.push_back(ms * 1000.f / 20.f);
	}
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	return median(v);
}

static void fill_experts(int type, int64_t n_in, int64_t rows_per_expert, int64_t E, size_t rb,
                         std::vector<uint8_t> &w)
{
	const size_t one = rb * (size_t)rows_per_expert;
	w.resize(one * (size_t)E);
	ops_fill_weight(type, n_in, rows_per_expert, rb, w.data());
	for (int64_t e = 1; e < E; e++)
		memcpy(w.data() + (size_t)e * one, w.data(), one);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	const uint64_t seed = ops_seed_init();
	(void)seed;
	const int64_t E = 256, F = 256, D = 6144;
	const int k = 8, type = KT_Q4_K;
	struct kcuda_ctx *c = NULL;
	/* a workspace as the model's (256 MiB): the old path at 17..256 tokens is then the fp32-exact
	 * sorted kernel the run-1 profile measured, not the bf16 grouped fallback a small workspace
	 * forces (which differs by ~3e-3 and made the 14:32 run print FAIL) */
	if (kcuda_ctx_create(0, 256u << 20, &c)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	size_t rb_d = 0, rb_f = 0;
	ktype_row_bytes(type, D, &rb_d);
	ktype_row_bytes(type, F, &rb_f);
	std::vector<uint8_t> hg, hu, hd;
	fill_experts(type, D, F, E, rb_d, hg);
	fill_experts(type, D, F, E, rb_d, hu);
	fill_experts(type, F, D, E, rb_f, hd);
	struct kweight g = {type, D, E * F, rb_d, hg.data()}, u = {type, D, E * F, rb_d, hu.data()},
	               dn = {type, F, E * D, rb_f, hd.data()};
	struct kweight dg = {}, du = {}, dd = {};
	/* the shared expert: expert 0's rows again (its own copy in device memory) */
	struct kweight sg = {type, D, F, rb_d, hg.data()}, su = {type, D, F, rb_d, hu.data()},
	               sd = {type, F, D, rb_f, hd.data()};
	struct kweight dsg = {}, dsu = {}, dsd = {};
	if (kcuda_weight_upload(c, &g, &dg) || kcuda_weight_upload(c, &u, &du) ||
	    kcuda_weight_upload(c, &dn, &dd) || kcuda_weight_upload(c, &sg, &dsg) ||
	    kcuda_weight_upload(c, &su, &dsu) || kcuda_weight_upload(c, &sd, &dsd)) {
		printf("FAIL: weight upload\n");
		return 1;
	}
	const double expert_bytes = 2.0 * (double)F * (double)rb_d + (double)D * (double)rb_f;
	printf("moe bench: GLM-5 TP=8 rank slice, E %lld top-%d, D %lld, F %lld, %s (%.2f MB per expert)\n",
	       (long long)E, k, (long long)D, (long long)F, ktype_name(type), expert_bytes / 1e6);
	printf("  batch  experts hit   old us   new us  speed-up   old GB/s   new GB/s  rel diff   route us  "
	       "new NG1 us  new NG2 us\n");
	static const int batches[] = {1, 8, 32, 128};
	int fails = 0;
	std::vector<double> sh_old(4), sh_new(4), sh_diff(4), sh_bytes(4);
	for (int bi = 0; bi < 4; bi++) {
		const int n = batches[bi];
		std::vector<float> x((size_t)(n * D)), w((size_t)(n * k)), lg((size_t)(n * E)),
		    bias((size_t)E);
		std::vector<int32_t> ids((size_t)(n * k));
		std::vector<char> hit((size_t)E, 0);
		for (auto &v : x)
			v = ops_rng_unif();
		for (auto &v : lg)
			v = ops_rng_unif() * 4.0f;
		for (auto &v : bias)
			v = ops_rng_unif() * 0.1f;
		for (int i = 0; i < n; i++)
			for (int j = 0; j < k; j++) {
				int32_t e;
				bool dup;
				do {
					e = (int32_t)(ops_rng_next() % (uint64_t)E);
					dup = false;
					for (int jj = 0; jj < j; jj++)
						dup |= ids[(size_t)(i * k + jj)] == e;
				} while (dup);
				ids[(size_t)(i * k + j)] = e;
				w[(size_t)(i * k + j)] = ops_rng_unif() + 1.5f;
				hit[(size_t)e] = 1;
			}
		int n_hit = 0;
		for (char h : hit)
			n_hit += h;
		void *d_x, *d_w, *d_ids, *d_o1, *d_o2, *d_lg, *d_b, *d_rid, *d_rw;
		CK(cudaMalloc(&d_x, x.size() * 4));
		CK(cudaMalloc(&d_w, w.size() * 4));
		CK(cudaMalloc(&d_ids, ids.size() * 4));
		CK(cudaMalloc(&d_o1, x.size() * 4));
		CK(cudaMalloc(&d_o2, x.size() * 4));
		CK(cudaMalloc(&d_lg, lg.size() * 4));
		CK(cudaMalloc(&d_b, bias.size() * 4));
		CK(cudaMalloc(&d_rid, ids.size() * 4));
		CK(cudaMalloc(&d_rw, w.size() * 4));
		CK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(d_lg, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(d_b, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
		int rc1 = 0, rc2 = 0;
		setenv("TANDEM_MOE_FAST", "0", 1);
		const float t_old = time_us(c->stream, [&] {
			rc1 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                     (const float *)d_w, k, &dg, &du, &dd, E, F, (float *)d_o1, D);
		});
		unsetenv("TANDEM_MOE_FAST");
		const float t_new = time_us(c->stream, [&] {
			rc2 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                     (const float *)d_w, k, &dg, &du, &dd, E, F, (float *)d_o2, D);
		});
		setenv("TANDEM_MOE_MMA_NG", "1", 1);
		const float t_ng1 = time_us(c->stream, [&] {
			rc2 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                     (const float *)d_w, k, &dg, &du, &dd, E, F, (float *)d_o2, D);
		});
		setenv("TANDEM_MOE_MMA_NG", "2", 1);
		const float t_ng2 = time_us(c->stream, [&] {
			rc2 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                     (const float *)d_w, k, &dg, &du, &dd, E, F, (float *)d_o2, D);
		});
		unsetenv("TANDEM_MOE_MMA_NG");
		const float t_route = time_us(c->stream, [&] {
			(void)kcuda_moe_route(c, (const float *)d_lg, E, (const float *)d_b, n, (int)E, k, 1,
			                      1, 0, true, 2.5f, (int32_t *)d_rid, (float *)d_rw);
		});
		/* routed + shared */
		void *d_t;
		CK(cudaMalloc(&d_t, (size_t)n * (size_t)(2 * F + D) * 4));
		float *t1 = (float *)d_t, *t2 = t1 + n * F, *ys = t2 + n * F;
		setenv("TANDEM_MOE_FAST", "0", 1);
		const float ts_old = time_us(c->stream, [&] {
			rc1 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                     (const float *)d_w, k, &dg, &du, &dd, E, F, (float *)d_o1, D);
			rc1 |= kcuda_matmul(c, &dsg, (const float *)d_x, D, n, t1, F);
			rc1 |= kcuda_matmul(c, &dsu, (const float *)d_x, D, n, t2, F);
			rc1 |= kcuda_swiglu(c, t1, F * n, t1, F * n, t2, F * n, n * F, 1);
			rc1 |= kcuda_matmul(c, &dsd, t1, F, n, ys, D);
			rc1 |= kfwd_add(c, (float *)d_o1, ys, n * D);
		});
		unsetenv("TANDEM_MOE_FAST");
		const float ts_new = time_us(c->stream, [&] {
			rc2 |= kcuda_moe_ffn_shexp(c, (const float *)d_x, D, n, (const int32_t *)d_ids,
			                           (const float *)d_w, k, &dg, &du, &dd, E, F, &dsg, &dsu,
			                           &dsd, (float *)d_o2, D);
		});
		CK(cudaFree(d_t));
		{
			std::vector<float> a(x.size()), b(x.size());
			CK(cudaMemcpy(a.data(), d_o1, a.size() * 4, cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(b.data(), d_o2, b.size() * 4, cudaMemcpyDeviceToHost));
			double mx = 0, df = 0;
			for (size_t i = 0; i < a.size(); i++) {
				mx = std::max(mx, (double)fabsf(a[i]));
				df = std::max(df, fabs((double)a[i] - (double)b[i]));
			}
			sh_old[(size_t)bi] = ts_old, sh_new[(size_t)bi] = ts_new;
			sh_diff[(size_t)bi] = mx > 0 ? df / mx : 0;
			sh_bytes[(size_t)bi] = (n_hit + 1) * expert_bytes;
			if (rc1 || rc2 || !(sh_diff[(size_t)bi] <= 1e-4)) {
				printf(
				    "FAIL: shared, batch %d: rc %d / %d, paths differ by %.3g of max|out|\n",
				    n, rc1, rc2, sh_diff[(size_t)bi]);
				fails++;
			}
		}
		/* the routed-only outputs again, for the first table's comparison */
		setenv("TANDEM_MOE_FAST", "0", 1);
		rc1 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids, (const float *)d_w,
		                     k, &dg, &du, &dd, E, F, (float *)d_o1, D);
		unsetenv("TANDEM_MOE_FAST");
		rc2 |= kcuda_moe_ffn(c, (const float *)d_x, D, n, (const int32_t *)d_ids, (const float *)d_w,
		                     k, &dg, &du, &dd, E, F, (float *)d_o2, D);
		std::vector<float> o1(x.size()), o2(x.size());
		CK(cudaMemcpy(o1.data(), d_o1, o1.size() * 4, cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(o2.data(), d_o2, o2.size() * 4, cudaMemcpyDeviceToHost));
		double mx = 0, df = 0;
		for (size_t i = 0; i < o1.size(); i++) {
			mx = std::max(mx, (double)fabsf(o1[i]));
			df = std::max(df, fabs((double)o1[i] - (double)o2[i]));
		}
		const double rel = mx > 0 ? df / mx : 0;
		if (rc1 || rc2 || !(rel <= 1e-4)) {
			printf("FAIL: batch %d: rc %d / %d, paths differ by %.3g of max|out|\n", n, rc1, rc2,
			       rel);
			fails++;
		}
		const double bytes = n_hit * expert_bytes;
		printf("  %5d  %11d  %7.1f  %7.1f  %8.2fx  %9.0f  %9.0f  %8.1e  %9.1f  %10.1f  %10.1f\n", n,
		       n_hit, t_old, t_new, t_old / t_new, bytes / (t_old * 1e3), bytes / (t_new * 1e3), rel,
		       t_route, t_ng1, t_ng2);
		CK(cudaFree(d_x));
		CK(cudaFree(d_w));
		CK(cudaFree(d_ids));
		CK(cudaFree(d_o1));
		CK(cudaFree(d_o2));
		CK(cudaFree(d_lg));
		CK(cudaFree(d_b));
		CK(cudaFree(d_rid));
		CK(cudaFree(d_rw));
	}
	printf("  routed + shared expert (old: kcuda_moe_ffn + 5-launch shared chain; new: "
	       "kcuda_moe_ffn_shexp)\n");
	printf("  batch   old us   new us  speed-up   old GB/s   new GB/s  rel diff\n");
	for (int bi = 0; bi < 4; bi++)
		printf("  %5d  %7.1f  %7.1f  %8.2fx  %9.0f  %9.0f  %8.1e\n", batches[bi], sh_old[(size_t)bi],
		       sh_new[(size_t)bi], sh_old[(size_t)bi] / sh_new[(size_t)bi],
		       sh_bytes[(size_t)bi] / (sh_old[(size_t)bi] * 1e3),
		       sh_bytes[(size_t)bi] / (sh_new[(size_t)bi] * 1e3), sh_diff[(size_t)bi]);
	kcuda_weight_free(&dsg);
	kcuda_weight_free(&dsu);
	kcuda_weight_free(&dsd);
	kcuda_weight_free(&dg);
	kcuda_weight_free(&du);
	kcuda_weight_free(&dd);
	kcuda_ctx_destroy(c);
	return fails ? 1 : 0;
}
