/* Timing of the CUDA attention ops at real GLM-5 / DeepSeek shapes: MLA decode (batch 1, C 512,
 * R 64, H 8 / 16 / 64, dense contexts 4096 and 32768, and top-k 2048 of 32768), and the DSA
 * indexer at 32768 and 100000 positions (HI 32, DI 128, K 2048: scores alone and scores + top-k).
 * Prints microseconds per call (mean of 50 after 5 warm-ups, wall clock around a stream sync) and
 * the KV bytes the op must read divided by that time, to compare with the ~4.3 TB/s HBM copy rate
 * of the H200. Pool contents are a constant byte pattern (finite values; timing does not depend on
 * them). Usage: bench_cuda_attn [iterations]. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cuda/cuda_common.cuh"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct kcuda_ctx *ctx;
static int iters = 50;

struct setup {
	void *pool, *tbl, *q, *w, *out, *sel, *nk;
};

/* one sequence of n_pos positions over contiguous blocks of one latent (or indexer) layer */
static int setup_init(struct setup *s, int64_t dim, int elt, int64_t n_pos, int64_t H, int64_t C, int K)
{
	const int64_t nb = (n_pos + 63) / 64;
	if (kcuda_alloc((size_t)nb * 64 * (size_t)dim * (size_t)elt, &s->pool) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)nb, &s->tbl) ||
	    kcuda_alloc(sizeof(float) * (size_t)(H * dim), &s->q) ||
	    kcuda_alloc(sizeof(float) * (size_t)H, &s->w) ||
	    kcuda_alloc(sizeof(float) * (size_t)(H * C + K), &s->out) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)(K > 0 ? K : 1), &s->sel) ||
	    kcuda_alloc(sizeof(int32_t), &s->nk))
		return -1;
	int32_t *t = (int32_t *)malloc(sizeof(int32_t) * (size_t)nb);
	for (int64_t i = 0; i < nb; i++)
		t[i] = (int32_t)i;
	kcuda_upload(ctx, s->tbl, t, sizeof(int32_t) * (size_t)nb);
	free(t);
	if (K > 0) { /* every 16th position */
		int32_t *sl = (int32_t *)malloc(sizeof(int32_t) * (size_t)K);
		for (int i = 0; i < K; i++)
			sl[i] = (int32_t)((int64_t)i * n_pos / K);
		kcuda_upload(ctx, s->sel, sl, sizeof(int32_t) * (size_t)K);
		free(sl);
	}
	int32_t nk = K > 0 ? K : (int32_t)n_pos;
	kcuda_upload(ctx, s->nk, &nk, sizeof(int32_t));
	kcuda_memset(ctx, s->pool, 0x3c, (size_t)nb * 64 * (size_t)dim * (size_t)elt);
	kcuda_memset(ctx, s->q, 0x3c, sizeof(float) * (size_t)(H * dim));
	kcuda_memset(ctx, s->w, 0x3c, sizeof(float) * (size_t)H);
	return 0;
}
static void setup_fini(struct setup *s)
{
	kcuda_free(s->pool);
	kcuda_free(s->tbl);
	kcuda_free(s->q);
	kcuda_free(s->w);
	kcuda_free(s->out);
	kcuda_free(s->sel);
	kcuda_free(s->nk);
}

static void bench_mla(int64_t H, int64_t ctxlen, int bf16, int K)
{
	const int64_t C = 512, R = 64, dim = C + R;
	const int elt = bf16 ? 2 : 4;
	struct setup s;
	if (setup_init(&s, dim, elt, ctxlen, H, C, K)) {
		printf("mla: allocation failed\n");
		return;
	}
	struct kcuda_kv_view kv = {s.pool, (ctxlen + 63) / 64, (size_t)64 * dim * elt, 0, 64, dim, bf16};
	struct kcuda_attn_rows rows = {1,
	                               NULL,
	                               (const int32_t *)s.tbl,
	                               (ctxlen + 63) / 64,
	                               (const int32_t *)s.nk,
	                               0,
	                               K > 0 ? (const int32_t *)s.sel : NULL,
	                               K > 0 ? K : 1,
	                               K > 0 ? K : ctxlen};
	int rc = 0;
	for (int i = 0; i < 5; i++)
		rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f, (float *)s.out);
	kcuda_sync(ctx);
	double t0 = now_s();
	for (int i = 0; i < iters; i++)
		rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f, (float *)s.out);
	rc |= kcuda_sync(ctx);
	double us = (now_s() - t0) / iters * 1e6;
	double bytes = (double)(K > 0 ? K : ctxlen) * (double)dim * elt;
	printf("mla decode  B 1 H %3lld ctx %6lld %-10s kv %-4s %9.1f us  %7.1f GB/s of KV (%.1f%% of 4.3 "
	       "TB/s)%s\n",
	       (long long)H, (long long)ctxlen, K > 0 ? "top-2048" : "dense", bf16 ? "bf16" : "f32", us,
	       bytes / us * 1e-3, bytes / us * 1e-3 / 4300 * 100, rc ? " ERROR" : "");
	setup_fini(&s);
}

static void bench_indexer(int64_t ctxlen, int bf16, int with_topk)
{
	const int64_t HI = 32, DI = 128;
	const int elt = bf16 ? 2 : 4, K = 2048;
	struct setup s;
	if (setup_init(&s, DI, elt, ctxlen, HI, 0, K)) {
		printf("indexer: allocation failed\n");
		return;
	}
	float *scores = NULL;
	if (kcuda_alloc(sizeof(float) * (size_t)ctxlen, (void **)&scores)) {
		printf("indexer: allocation failed\n");
		setup_fini(&s);
		return;
	}
	int32_t nk = (int32_t)ctxlen;
	kcuda_upload(ctx, s.nk, &nk, sizeof(int32_t));
	struct kcuda_kv_view kv = {s.pool, (ctxlen + 63) / 64, (size_t)64 * DI * elt, 0, 64, DI, bf16};
	struct kcuda_attn_rows rows = {
	    1, NULL, (const int32_t *)s.tbl, (ctxlen + 63) / 64, (const int32_t *)s.nk, 0, NULL, 1, ctxlen};
	int rc = 0;
	for (int i = 0; i < 5; i++) {
		if (with_topk)
			rc |= kcuda_indexer_topk(ctx, &kv, &rows, (const float *)s.q, (const float *)s.w, HI,
			                         DI, 0.088f, K, (int32_t *)s.sel, K, NULL);
		else
			rc |= kcuda_indexer_scores(ctx, &kv, &rows, (const float *)s.q, (const float *)s.w,
			                           HI, DI, 0.088f, scores, ctxlen);
	}
	kcuda_sync(ctx);
	double t0 = now_s();
	for (int i = 0; i < iters; i++) {
		if (with_topk)
			rc |= kcuda_indexer_topk(ctx, &kv, &rows, (const float *)s.q, (const float *)s.w, HI,
			                         DI, 0.088f, K, (int32_t *)s.sel, K, NULL);
		else
			rc |= kcuda_indexer_scores(ctx, &kv, &rows, (const float *)s.q, (const float *)s.w,
			                           HI, DI, 0.088f, scores, ctxlen);
	}
	rc |= kcuda_sync(ctx);
	double us = (now_s() - t0) / iters * 1e6;
	double bytes = (double)ctxlen * DI * elt;
	printf("indexer     T 1 HI %2lld ctx %6lld %-14s keys %-4s %9.1f us  %7.1f GB/s of keys (%.1f%% of "
	       "4.3 TB/s)%s\n",
	       (long long)HI, (long long)ctxlen, with_topk ? "scores+top2048" : "scores",
	       bf16 ? "bf16" : "f32", us, bytes / us * 1e-3, bytes / us * 1e-3 / 4300 * 100,
	       rc ? " ERROR" : "");
	kcuda_free(scores);
	setup_fini(&s);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		iters = atoi(argv[1]) > 0 ? atoi(argv[1]) : 50;
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	if (kcuda_ctx_create(0, 256u << 20, &ctx)) {
		printf("no CUDA context\n");
		return 1;
	}
	static const int64_t Hs[] = {8, 16, 64};
	for (int bf = 1; bf >= 0; bf--)
		for (size_t h = 0; h < 3; h++) {
			bench_mla(Hs[h], 4096, bf, 0);
			bench_mla(Hs[h], 32768, bf, 0);
			bench_mla(Hs[h], 32768, bf, 2048);
		}
	for (int bf = 1; bf >= 0; bf--) {
		bench_indexer(32768, bf, 0);
		bench_indexer(32768, bf, 1);
		bench_indexer(100000, bf, 1);
	}
	kcuda_ctx_destroy(ctx);
	return 0;
}
