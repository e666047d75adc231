/* CPU matmul benchmark (kernels/cpu): for each weight type at GLM-5-like shapes, GEMV (n_tok = 1)
 * as GB/s of weight bytes read and GEMM (n_tok = 64) as GFLOP/s, with 1 and 2 threads, next to
 * the machine's read bandwidth measured here (an AVX2 sum over a buffer much larger than the
 * caches) and the kpool_for call overhead.
 *
 * GEMV is timed over enough copies of the weight matrix (>= --cold-mib MiB in total, default
 * 1024) that each call reads from DRAM, as a real model's weights do; GEMM reuses one copy (it is
 * compute-bound). The last two columns are the approximate int8-activation path
 * (kcpu_matmul_fast) where the type has one. Usage: bench_matmul [--types Q4_K,Q8_0,...] [--threads 2] [--cold-mib N]
 * [--tok N] [--quick] */
#include <immintrin.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- read bandwidth ------------------------------------------------------------------------ */
struct bw {
	const float *buf;
	float part[64];
};

static void bw_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	struct bw *b = u;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	/* i counts 64-float (256-byte) lines */
	for (int64_t i = i0; i < i1; i++) {
		const float *p = b->buf + i * 64;
		for (int k = 0; k < 64; k += 32) {
			a0 = _mm256_add_ps(a0, _mm256_load_ps(p + k));
			a1 = _mm256_add_ps(a1, _mm256_load_ps(p + k + 8));
			a2 = _mm256_add_ps(a2, _mm256_load_ps(p + k + 16));
			a3 = _mm256_add_ps(a3, _mm256_load_ps(p + k + 24));
		}
	}
	__m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
	float t[8];
	_mm256_storeu_ps(t, s);
	b->part[thread] += t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

static double read_bandwidth(struct kpool *p, size_t bytes, int reps)
{
	float *buf = aligned_alloc(64, bytes);
	for (size_t i = 0; i < bytes / 4; i++)
		buf[i] = (float)(i & 7);
	struct bw b = {.buf = buf};
	int64_t lines = (int64_t)(bytes / 256);
	kpool_for(p, lines, 4096, bw_cb, &b);
	double best = 0.0;
	for (int r = 0; r < reps; r++) {
		double t0 = now_s();
		kpool_for(p, lines, 4096, bw_cb, &b);
		double gbs = (double)bytes / (now_s() - t0) / 1e9;
		best = gbs > best ? gbs : best;
	}
	free(buf);
	return best;
}

static void noop_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	(void)u, (void)i0, (void)i1, (void)thread;
}

/* ---- matmul ------------------------------------------------------------------------------------ */
struct shape {
	int64_t n_in, n_out;
};

static uint64_t rng = 12345;
static float gauss(void)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	double u1 = ((double)(rng >> 11) + 0.5) * 0x1p-53;
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	double u2 = ((double)(rng >> 11) + 0.5) * 0x1p-53;
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

struct result {
	double gemv_gbs, gemv_us, gemm_gflops, gemm_tok_s;
	double fast_gemv_gbs, fast_gemm_gflops; /* 0: no fast path for the type */
};

typedef void (*matmul_fn)(struct kpool *, const struct kweight *, const float *, int64_t, int64_t,
			  float *, int64_t);

/* Both timers return the fastest single call: this machine is shared (2 cores, several agents),
 * and the fastest call is the one that ran without being descheduled. */

/* GEMV over rotating copies (each call reads its weights from DRAM) */
static double time_gemv(matmul_fn f, struct kpool *p, struct kweight *kw, const uint8_t *w, size_t wbytes,
			int copies, const float *x, float *y, double min_time)
{
	int calls = 0;
	double t0 = now_s(), best = 1e30;

	kw->data = w;
	f(p, kw, x, kw->n_in, 1, y, kw->n_out);
	do {
		kw->data = w + (size_t)(calls % copies) * wbytes;
		double t = now_s();
		f(p, kw, x, kw->n_in, 1, y, kw->n_out);
		t = now_s() - t;
		best = t < best ? t : best;
		calls++;
	} while (now_s() - t0 < min_time || calls < copies);
	return best;
}

static double time_gemm(matmul_fn f, struct kpool *p, struct kweight *kw, const uint8_t *w, int n_tok,
			const float *x, float *y, double min_time)
{
	double t0 = now_s(), best = 1e30;

	kw->data = w;
	f(p, kw, x, kw->n_in, n_tok, y, kw->n_out);
	do {
		double t = now_s();
		f(p, kw, x, kw->n_in, n_tok, y, kw->n_out);
		t = now_s() - t;
		best = t < best ? t : best;
	} while (now_s() - t0 < min_time);
	return best;
}

static void bench_one(struct kpool *p, int type, struct shape sh, size_t cold_bytes, int n_tok,
		      double min_time, struct result *res)
{
	size_t rb;
	ktype_row_bytes(type, sh.n_in, &rb);
	size_t wbytes = rb * (size_t)sh.n_out;
	int copies = (int)((cold_bytes + wbytes - 1) / wbytes);
	if (copies < 1)
		copies = 1;
	uint8_t *w = aligned_alloc(64, (wbytes * (size_t)copies + 63) & ~(size_t)63);
	float *row = malloc(sizeof(float) * (size_t)sh.n_in);
	for (int64_t r = 0; r < sh.n_out; r++) {
		for (int64_t i = 0; i < sh.n_in; i++)
			row[i] = gauss() * 0.02f;
		kcpu_quantize_row(type, row, w + (size_t)r * rb, sh.n_in);
	}
	for (int c = 1; c < copies; c++)
		memcpy(w + (size_t)c * wbytes, w, wbytes);
	float *x = malloc(sizeof(float) * (size_t)(sh.n_in * n_tok));
	float *y = malloc(sizeof(float) * (size_t)(sh.n_out * n_tok));
	for (int64_t i = 0; i < sh.n_in * n_tok; i++)
		x[i] = gauss();

	struct kweight kw = {.type = type, .n_in = sh.n_in, .n_out = sh.n_out, .row_bytes = rb};
	double flops = 2.0 * (double)sh.n_in * (double)sh.n_out * n_tok;
	double per = time_gemv(kcpu_matmul, p, &kw, w, wbytes, copies, x, y, min_time);
	res->gemv_gbs = (double)wbytes / per / 1e9;
	res->gemv_us = 1e6 * per;
	per = time_gemm(kcpu_matmul, p, &kw, w, n_tok, x, y, min_time);
	res->gemm_gflops = flops / per / 1e9;
	res->gemm_tok_s = n_tok / per;
	res->fast_gemv_gbs = res->fast_gemm_gflops = 0.0;
	if (kcpu_matmul_fast_supported(type)) {
		per = time_gemv(kcpu_matmul_fast, p, &kw, w, wbytes, copies, x, y, min_time);
		res->fast_gemv_gbs = (double)wbytes / per / 1e9;
		per = time_gemm(kcpu_matmul_fast, p, &kw, w, n_tok, x, y, min_time);
		res->fast_gemm_gflops = flops / per / 1e9;
	}
	free(w);
	free(row);
	free(x);
	free(y);
}

int main(int argc, char **argv)
{
	const char *types_arg = "F32,BF16,F16,Q8_0,Q6_K,Q5_K,Q4_K,Q3_K,Q2_K,Q5_0,Q4_0,IQ4_XS";
	int max_threads = 2, n_tok = 64;
	size_t cold_mib = 1024;
	double min_time = 0.5;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--types") && i + 1 < argc)
			types_arg = argv[++i];
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			max_threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cold-mib") && i + 1 < argc)
			cold_mib = (size_t)atol(argv[++i]);
		else if (!strcmp(argv[i], "--tok") && i + 1 < argc)
			n_tok = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--quick"))
			min_time = 0.15, cold_mib = 256;
		else {
			fprintf(stderr, "usage: %s [--types A,B] [--threads N] [--cold-mib N] [--tok N] [--quick]\n",
				argv[0]);
			return 2;
		}
	}
	int types[KT_COUNT], n_types = 0;
	char *list = strdup(types_arg);
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		int found = -1;
		for (int t = 0; t < KT_COUNT; t++)
			if (ktype_get(t) && !strcmp(ktype_get(t)->name, tok))
				found = t;
		if (found < 0 || !ktype_get(found)->compute) {
			fprintf(stderr, "unknown or non-compute type %s\n", tok);
			return 2;
		}
		types[n_types++] = found;
	}
	free(list);

	static const struct shape shapes[] = {{2048, 6144}, {6144, 2048}};
	printf("# bench_matmul: GEMV n_tok=1 over >= %zu MiB of weight copies (DRAM), GEMM n_tok=%d (one copy); fastest call\n",
	       cold_mib, n_tok);
	for (int nt = 1; nt <= max_threads; nt++) {
		struct kpool *p = kpool_create(nt);
		double bw = read_bandwidth(p, (size_t)1 << 30, 8);
		for (int k = 0; k < 1000; k++)
			kpool_for(p, 64, 1, noop_cb, NULL);
		/* best of 20 rounds of 5000 calls */
		double ovh = 1e30;
		for (int round = 0; round < 20; round++) {
			double t0 = now_s();
			for (int k = 0; k < 5000; k++)
				kpool_for(p, 64, 1, noop_cb, NULL);
			double o = 1e6 * (now_s() - t0) / 5000;
			ovh = o < ovh ? o : ovh;
		}
		printf("\n## %d thread(s): read bandwidth %.1f GB/s (AVX2 sum over 1 GiB, best of 8); kpool_for overhead %.2f us\n\n",
		       nt, bw, ovh);
		printf("| type | shape (n_in x n_out) | GEMV GB/s | GEMV %% of read BW | GEMV us | GEMM%d GFLOP/s | GEMM%d tok/s | fast GEMV GB/s | fast GEMM%d GFLOP/s |\n",
		       n_tok, n_tok, n_tok);
		printf("|---|---|---|---|---|---|---|---|---|\n");
		for (int ti = 0; ti < n_types; ti++) {
			for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
				struct result r;
				bench_one(p, types[ti], shapes[si], cold_mib << 20, n_tok, min_time, &r);
				char fg[32] = "-", fm[32] = "-";
				if (r.fast_gemv_gbs > 0) {
					snprintf(fg, sizeof fg, "%.1f", r.fast_gemv_gbs);
					snprintf(fm, sizeof fm, "%.1f", r.fast_gemm_gflops);
				}
				printf("| %s | %" PRId64 " x %" PRId64 " | %.1f | %.0f%% | %.0f | %.1f | %.0f | %s | %s |\n",
				       ktype_name(types[ti]), shapes[si].n_in, shapes[si].n_out, r.gemv_gbs,
				       100.0 * r.gemv_gbs / bw, r.gemv_us, r.gemm_gflops, r.gemm_tok_s, fg, fm);
				fflush(stdout);
			}
		}
		kpool_destroy(p);
	}
	return 0;
}
