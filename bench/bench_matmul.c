/* CPU matmul benchmark (kernels/cpu). First a hot-kernel table (one thread, weights in L2: the
 * compute cost per weight element), then for each weight type at GLM-5-like shapes GEMV (n_tok =
 * 1) as GB/s of weight bytes read and GEMM (n_tok = 64) as GFLOP/s, per thread count, next to
 * the machine's read bandwidth measured here (an AVX2 sum over 1 GiB, far beyond the caches,
 * timed per 16 MiB piece like the GEMV calls)
 * and the kpool_for call overhead.
 *
 * GEMV is timed over enough copies of the weight matrix (>= --cold-mib MiB in total, default
 * 1024) that each call reads from DRAM, as a real model's weights do; GEMM reuses one copy (it is
 * compute-bound). The read bandwidth is measured before and after each table and the better one
 * kept. The "fast" columns are the approximate int8-activation path (kcpu_matmul_fast) where the
 * type has one.
 *
 * Usage: bench_matmul [--types Q4_K,Q8_0,...] [--threads 1,2] [--cold-mib N] [--tok N]
 *                     [--quick] [--hot-only] [--xq8 avx2|avx512]
 * --xq8 forces one instruction-set variant of the fast path's integer dots (default: the best the
 * CPU has, as tandem picks it). */
#include <immintrin.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/quant_impl.h" /* quant_xq8_select */
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

/* Read bandwidth measured the way GEMV is timed: a 1 GiB buffer (beyond every cache) read in
 * 16 MiB pieces, one parallel-for per piece, keeping the fastest piece. On a shared machine this
 * is what one GEMV-sized call can get when it is not disturbed, which is the fair limit to
 * compare the fastest GEMV call with. */
static double read_bandwidth(struct kpool *p, size_t bytes, int passes)
{
	const size_t piece = (size_t)16 << 20;
	float *buf = aligned_alloc(64, bytes);
	for (size_t i = 0; i < bytes / 4; i++)
		buf[i] = (float)(i & 7);
	double best = 0.0;
	for (int r = 0; r < passes; r++) {
		for (size_t off = 0; off + piece <= bytes; off += piece) {
			struct bw b = {.buf = buf + off / 4};
			double t0 = now_s();
			kpool_for(p, (int64_t)(piece / 256), 1024, bw_cb, &b);
			double gbs = (double)piece / (now_s() - t0) / 1e9;
			best = gbs > best ? gbs : best;
		}
	}
	free(buf);
	return best;
}

/* ---- FMA peak: 10 independent 8-wide FMA chains per thread (enough to cover latency) ------ */
struct peak {
	long iters;
	float sink[64];
};

static void peak_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	struct peak *pk = u;
	__m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
	__m256 a0 = _mm256_set1_ps(0.1f), a1 = _mm256_set1_ps(0.2f), a2 = _mm256_set1_ps(0.3f);
	__m256 a3 = _mm256_set1_ps(0.4f), a4 = _mm256_set1_ps(0.5f), a5 = _mm256_set1_ps(0.6f);
	__m256 a6 = _mm256_set1_ps(0.7f), a7 = _mm256_set1_ps(0.8f), a8 = _mm256_set1_ps(0.9f);
	__m256 a9 = _mm256_set1_ps(1.0f);

	for (int64_t t = i0; t < i1; t++) {
		for (long k = 0; k < pk->iters; k++) {
			a0 = _mm256_fmadd_ps(a0, m, c);
			a1 = _mm256_fmadd_ps(a1, m, c);
			a2 = _mm256_fmadd_ps(a2, m, c);
			a3 = _mm256_fmadd_ps(a3, m, c);
			a4 = _mm256_fmadd_ps(a4, m, c);
			a5 = _mm256_fmadd_ps(a5, m, c);
			a6 = _mm256_fmadd_ps(a6, m, c);
			a7 = _mm256_fmadd_ps(a7, m, c);
			a8 = _mm256_fmadd_ps(a8, m, c);
			a9 = _mm256_fmadd_ps(a9, m, c);
		}
	}
	__m256 z = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
	                         _mm256_add_ps(_mm256_add_ps(a4, a5),
	                                       _mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9))));
	float o[8];
	_mm256_storeu_ps(o, z);
	pk->sink[thread] += o[0];
}

/* GFLOP/s of the FMA units with nt threads (one task per thread), best of 10 */
static double fma_peak(struct kpool *p, int nt)
{
	struct peak pk = {.iters = 2000000};
	double best = 0.0;

	for (int r = 0; r < 10; r++) {
		double t = now_s();
		kpool_for(p, nt, 1, peak_cb, &pk);
		double gf = (double)nt * (double)pk.iters * 10 * 16 / (now_s() - t) / 1e9;
		best = gf > best ? gf : best;
	}
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

typedef void (*matmul_fn)(struct kpool *, const struct kweight *, const float *, int64_t, int64_t, float *,
                          int64_t);

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

/* Hot kernels, one thread: a 64 x 4096 weight (L2-resident) multiplied again and again; the
 * fastest of many calls gives the compute cost per weight element without memory or
 * preemption effects. Also the dequantization cost (kcpu_dequant_row of one row, L1). */
static void bench_hot(const int *types, int n_types)
{
	enum { ROWS = 64, N = 4096, TOK = 64 };
	float *x = malloc(sizeof(float) * N * TOK), *y = malloc(sizeof(float) * ROWS * TOK),
	      *row = malloc(sizeof(float) * N);
	uint8_t *w = aligned_alloc(64, (size_t)ROWS * N * 4);

	for (int i = 0; i < N * TOK; i++)
		x[i] = gauss();
	double peak = fma_peak(NULL, 1);
	printf("\n## Hot kernels, 1 thread (64 x 4096 weight in L2; fastest of 300 calls; FMA peak %.1f "
	       "GFLOP/s)\n\n",
	       peak);
	printf("| type | GEMV ns/elt | GEMV GB/s equiv. | fast GEMV ns/elt | fast GB/s equiv. | dequant "
	       "ns/elt | GEMM%d GFLOP/s | %% of FMA peak |\n",
	       TOK);
	printf("|---|---|---|---|---|---|---|---|\n");
	for (int ti = 0; ti < n_types; ti++) {
		int type = types[ti];
		size_t rb;
		ktype_row_bytes(type, N, &rb);
		for (int r = 0; r < ROWS; r++) {
			for (int i = 0; i < N; i++)
				row[i] = gauss() * 0.02f;
			kcpu_quantize_row(type, row, w + (size_t)r * rb, N);
		}
		struct kweight kw = {.type = type, .n_in = N, .n_out = ROWS, .row_bytes = rb, .data = w};
		double best = 1e30, best_fast = 1e30, best_deq = 1e30, best_mm = 1e30;
		for (int k = 0; k < 300; k++) {
			double t = now_s();
			kcpu_matmul(NULL, &kw, x, N, 1, y, ROWS);
			t = now_s() - t;
			best = t < best ? t : best;
			t = now_s();
			kcpu_matmul_fast(NULL, &kw, x, N, 1, y, ROWS);
			t = now_s() - t;
			best_fast = t < best_fast ? t : best_fast;
			t = now_s();
			kcpu_dequant_row(type, w, row, N);
			t = now_s() - t;
			best_deq = t < best_deq ? t : best_deq;
			if (k % 3 == 0) {
				t = now_s();
				kcpu_matmul(NULL, &kw, x, N, TOK, y, ROWS);
				t = now_s() - t;
				best_mm = t < best_mm ? t : best_mm;
			}
		}
		double el = (double)ROWS * N, bpe = (double)rb / N;
		double gf = 2.0 * el * TOK / best_mm / 1e9;
		char f1[32] = "-", f2[32] = "-";
		if (kcpu_matmul_fast_supported(type)) {
			snprintf(f1, sizeof f1, "%.3f", 1e9 * best_fast / el);
			snprintf(f2, sizeof f2, "%.1f", bpe * el / best_fast / 1e9);
		}
		printf("| %s | %.3f | %.1f | %s | %s | %.3f | %.1f | %.0f%% |\n", ktype_name(type),
		       1e9 * best / el, bpe * el / best / 1e9, f1, f2, 1e9 * best_deq / N, gf,
		       100.0 * gf / peak);
	}
	free(x);
	free(y);
	free(row);
	free(w);
}

/* Hot GEMM by token count (one thread, 768 x 2048 weight, L2-resident): shows the three paths
 * of kcpu_matmul (1 token: fused dots; 2-7: 4x2 dot tiles; 8+: 6x8 / 6x16 FMA kernels). */
static void bench_hot_tokens(void)
{
	static const int types[] = {KT_Q8_0, KT_Q4_K, KT_BF16};
	static const int toks[] = {1, 2, 4, 7, 8, 15, 16, 32, 64};
	enum { ROWS = 768, N = 2048, NTOK = sizeof toks / sizeof toks[0] };
	float *x = malloc(sizeof(float) * N * 64), *y = malloc(sizeof(float) * ROWS * 64),
	      *row = malloc(sizeof(float) * N);
	uint8_t *w = aligned_alloc(64, (size_t)ROWS * N * 4);

	for (int i = 0; i < N * 64; i++)
		x[i] = gauss();
	printf("\n## Hot GEMM by token count, 1 thread (768 x 2048 weight in L2; fastest of 40 calls; "
	       "GFLOP/s)\n\n| type |");
	for (int k = 0; k < NTOK; k++)
		printf(" %d |", toks[k]);
	printf("\n|---|");
	for (int k = 0; k < NTOK; k++)
		printf("---|");
	printf("\n");
	for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
		size_t rb;
		ktype_row_bytes(types[ti], N, &rb);
		for (int r = 0; r < ROWS; r++) {
			for (int i = 0; i < N; i++)
				row[i] = gauss() * 0.02f;
			kcpu_quantize_row(types[ti], row, w + (size_t)r * rb, N);
		}
		struct kweight kw = {.type = types[ti], .n_in = N, .n_out = ROWS, .row_bytes = rb, .data = w};
		printf("| %s |", ktype_name(types[ti]));
		for (int k = 0; k < NTOK; k++) {
			double best = 1e30;
			for (int rep = 0; rep < 40; rep++) {
				double t = now_s();
				kcpu_matmul(NULL, &kw, x, N, toks[k], y, ROWS);
				t = now_s() - t;
				best = t < best ? t : best;
			}
			printf(" %.1f |", 2.0 * ROWS * N * toks[k] / best / 1e9);
		}
		printf("\n");
	}
	free(x);
	free(y);
	free(row);
	free(w);
}

int main(int argc, char **argv)
{
	const char *types_arg = "F32,BF16,F16,Q8_0,Q6_K,Q5_K,Q4_K,Q3_K,Q2_K,Q5_0,Q4_0,IQ4_XS";
	const char *threads_arg = "1,2";
	int n_tok = 64;
	size_t cold_mib = 1024;
	double min_time = 0.5;
	int hot_only = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--types") && i + 1 < argc)
			types_arg = argv[++i];
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads_arg = argv[++i];
		else if (!strcmp(argv[i], "--cold-mib") && i + 1 < argc)
			cold_mib = (size_t)atol(argv[++i]);
		else if (!strcmp(argv[i], "--tok") && i + 1 < argc)
			n_tok = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--hot-only"))
			hot_only = 1;
		else if (!strcmp(argv[i], "--quick"))
			min_time = 0.15, cold_mib = 256;
		else if (!strcmp(argv[i], "--xq8") && i + 1 < argc) {
			const char *v = argv[++i];
			int isa = !strcmp(v, "avx2")     ? QUANT_XQ8_AVX2
			          : !strcmp(v, "avx512") ? QUANT_XQ8_AVX512
			                                 : -1;
			if (isa < 0 || quant_xq8_select(isa) < 0) {
				fprintf(stderr, "--xq8 %s: unknown or not supported by this CPU\n", v);
				return 2;
			}
		} else {
			fprintf(stderr,
			        "usage: %s [--types A,B] [--threads 1,2,..] [--cold-mib N] [--tok N] "
			        "[--quick] [--hot-only] [--xq8 avx2|avx512]\n",
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
		if (found < 0 || !ktype_get(found)->compute || n_types == KT_COUNT) {
			fprintf(stderr, "unknown or non-compute type %s\n", tok);
			return 2;
		}
		types[n_types++] = found;
	}
	free(list);
	int threads[64], n_threads = 0;
	list = strdup(threads_arg);
	for (char *tok = strtok(list, ","); tok && n_threads < 64; tok = strtok(NULL, ","))
		if (atoi(tok) >= 1)
			threads[n_threads++] = atoi(tok);
	free(list);

	bench_hot(types, n_types);
	bench_hot_tokens();
	if (hot_only)
		return 0;

	static const struct shape shapes[] = {{2048, 6144}, {6144, 2048}};
	struct result res[KT_COUNT][2];
	printf("# bench_matmul: GEMV n_tok=1 over >= %zu MiB of weight copies (DRAM), GEMM n_tok=%d (one "
	       "copy); fastest call\n",
	       cold_mib, n_tok);
	printf("# fast path integer dots: %s\n", quant_xq8_isa_name(quant_xq8_selected()));
	for (int ni = 0; ni < n_threads; ni++) {
		int nt = threads[ni];
		struct kpool *p = kpool_create(nt);
		/* bandwidth before and after the table; the better one is the machine's capability */
		double bw = read_bandwidth(p, (size_t)1 << 30, 3);
		for (int ti = 0; ti < n_types; ti++)
			for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
				bench_one(p, types[ti], shapes[si], cold_mib << 20, n_tok, min_time,
				          &res[ti][si]);
		double bw2 = read_bandwidth(p, (size_t)1 << 30, 3);
		bw = bw2 > bw ? bw2 : bw;
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
		double peak = fma_peak(p, nt);
		printf(
		    "\n## %d thread(s): read bandwidth %.1f GB/s (AVX2 sum, fastest 16 MiB piece of 1 GiB); "
		    "FMA peak %.1f GFLOP/s; kpool_for overhead %.2f us\n\n",
		    nt, bw, peak, ovh);
		printf(
		    "| type | shape (n_in x n_out) | GEMV GB/s | GEMV %% of read BW | GEMV us | GEMM%d "
		    "GFLOP/s | GEMM %% of FMA peak | GEMM%d tok/s | fast GEMV GB/s | fast GEMM%d GFLOP/s |\n",
		    n_tok, n_tok, n_tok);
		printf("|---|---|---|---|---|---|---|---|---|---|\n");
		for (int ti = 0; ti < n_types; ti++) {
			for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
				const struct result *r = &res[ti][si];
				char fg[32] = "-", fm[32] = "-";
				if (r->fast_gemv_gbs > 0) {
					snprintf(fg, sizeof fg, "%.1f", r->fast_gemv_gbs);
					snprintf(fm, sizeof fm, "%.1f", r->fast_gemm_gflops);
				}
				printf("| %s | %" PRId64 " x %" PRId64
				       " | %.1f | %.0f%% | %.0f | %.1f | %.0f%% | %.0f | %s | %s |\n",
				       ktype_name(types[ti]), shapes[si].n_in, shapes[si].n_out, r->gemv_gbs,
				       100.0 * r->gemv_gbs / bw, r->gemv_us, r->gemm_gflops,
				       100.0 * r->gemm_gflops / peak, r->gemm_tok_s, fg, fm);
			}
		}
		fflush(stdout);
		kpool_destroy(p);
	}
	return 0;
}
