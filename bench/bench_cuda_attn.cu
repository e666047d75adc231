/* Timing of the CUDA attention ops at real GLM-5 / DeepSeek shapes, the fast kernels (default) and
 * the first ones (TANDEM_CUDA_ATTN=ref) side by side: MLA decode (C 512, R 64, H 8 / 16 / 64,
 * dense contexts 4096 and 32768, and top-k 2048 of 32768; bf16 and fp32 pools) and the DSA indexer
 * (HI 32, DI 128, K 2048: scores alone and scores + top-k, 32768 and 100000 positions), each at
 * batch 1, 8 and 32 (sequences of the same length over their own blocks).
 * Prints microseconds per call (mean of N after 5 warm-ups, wall clock around a stream sync, so
 * launch overhead is included), the KV bytes the op must read, GB/s, and that rate as a share of
 * the device-to-device copy rate measured first (bytes read + written per second by
 * cudaMemcpyAsync of 1 GiB). Pool contents are a constant byte pattern (finite values; the timing
 * does not depend on them). First, the attention chain of a GLM-5 decode layer (indexer top-k ->
 * MLA) in a CUDA graph of 78 layers, old vs new kernels (bench_layer); BENCH_ATTN_LAYER_ONLY=1
 * stops after it. Before that, the indexer scores + top-k alone in a graph (bench_idx: the fused
 * one-launch top-k (TANDEM_IDX_TOPK=fused) vs the default at batch 1 / 8 / 32, 4k / 32k / 128k keys;
 * BENCH_ATTN_IDX_ONLY=1 stops after it). Usage: bench_cuda_attn [iterations]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/prof.h"

/* mla_attn_dec6.cu: its launch plan for a rank shape, and its launch count */
extern "C" int kmla_dec6_plan(struct kcuda_ctx *c, int64_t n_q, int64_t H, int64_t max_keys,
                              int64_t ld_blocks, int bf16, int out[7]);
extern "C" unsigned long long kmla_dec6_launches;
/* mla_attn_dec7.cu: its launch count (one a call) */
extern "C" unsigned long long kmla_dec7_launches;
extern "C" void kmla_dec6_set_trace(unsigned long long *buf);

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct kcuda_ctx *ctx;
static int iters = 50;
static double copy_gbs = 4300; /* replaced by the measured rate */
static int noref; /* BENCH_ATTN_BIG: the fast kernels only (the ref column repeats them) */

static void set_mode(int ref)
{
	if (ref)
		setenv("TANDEM_CUDA_ATTN", "ref", 1);
	else
		unsetenv("TANDEM_CUDA_ATTN");
}

/* device-to-device copy of 1 GiB: (read + written bytes) / s */
static void measure_copy(void)
{
	const size_t n = (size_t)1 << 30;
	void *a = NULL, *b = NULL;
	if (kcuda_alloc(n, &a) || kcuda_alloc(n, &b)) {
		printf("copy rate: allocation failed, using 4300 GB/s\n");
		kcuda_free(a);
		return;
	}
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	kcuda_memset(ctx, a, 1, n);
	for (int i = 0; i < 2; i++)
		cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st);
	kcuda_sync(ctx);
	const int reps = 10;
	double t0 = now_s();
	for (int i = 0; i < reps; i++)
		cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st);
	kcuda_sync(ctx);
	double dt = (now_s() - t0) / reps;
	copy_gbs = 2.0 * (double)n / dt * 1e-9;
	printf("device copy: 1 GiB in %.1f us = %.0f GB/s (read + write)\n", dt * 1e6, copy_gbs);
	kcuda_free(a);
	kcuda_free(b);
}

struct setup {
	void *pool, *tbl, *q, *w, *out, *sel, *nk, *qseq;
};

/* B sequences of n_pos positions, each over its own contiguous blocks of one latent (or indexer)
 * layer; K > 0: every sequence reads K spread positions */
static int setup_init(struct setup *s, int B, int64_t dim, int elt, int64_t n_pos, int64_t H, int64_t C,
                      int K)
{
	memset(s, 0, sizeof(*s));
	const int64_t nb = (n_pos + 63) / 64;
	const size_t pool = (size_t)B * (size_t)nb * 64 * (size_t)dim * (size_t)elt;
	if (kcuda_alloc(pool, &s->pool) || kcuda_alloc(sizeof(int32_t) * (size_t)(B * nb), &s->tbl) ||
	    kcuda_alloc(sizeof(float) * (size_t)(B * H * dim), &s->q) ||
	    kcuda_alloc(sizeof(float) * (size_t)(B * H), &s->w) ||
	    kcuda_alloc(sizeof(float) * (size_t)(B * H * C + B * K + 1), &s->out) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)(B * (K > 0 ? K : 1)), &s->sel) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)B, &s->nk) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)B, &s->qseq))
		return -1;
	int32_t *t = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * nb));
	for (int64_t i = 0; i < B * nb; i++)
		t[i] = (int32_t)i;
	kcuda_upload(ctx, s->tbl, t, sizeof(int32_t) * (size_t)(B * nb));
	free(t);
	if (K > 0) { /* spread positions */
		int32_t *sl = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * K));
		for (int b = 0; b < B; b++)
			for (int i = 0; i < K; i++)
				sl[b * K + i] = (int32_t)((int64_t)i * n_pos / K);
		kcuda_upload(ctx, s->sel, sl, sizeof(int32_t) * (size_t)(B * K));
		free(sl);
	}
	int32_t *nk = (int32_t *)malloc(sizeof(int32_t) * (size_t)B),
	        *qs = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
	for (int b = 0; b < B; b++) {
		nk[b] = K > 0 ? K : (int32_t)n_pos;
		qs[b] = b;
	}
	kcuda_upload(ctx, s->nk, nk, sizeof(int32_t) * (size_t)B);
	kcuda_upload(ctx, s->qseq, qs, sizeof(int32_t) * (size_t)B);
	free(nk);
	free(qs);
	kcuda_memset(ctx, s->pool, 0x3c, pool);
	kcuda_memset(ctx, s->q, 0x3c, sizeof(float) * (size_t)(B * H * dim));
	kcuda_memset(ctx, s->w, 0x3c, sizeof(float) * (size_t)(B * H));
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
	kcuda_free(s->qseq);
}

static void print_row(const char *what, double bytes, const double *us, int rc)
{
	printf(
	    "%-58s %8.2f MB | fast %8.1f us %7.0f GB/s %5.1f%% | ref %8.1f us %7.0f GB/s %5.1f%% | x%.1f%s\n",
	    what, bytes * 1e-6, us[0], bytes / us[0] * 1e-3, bytes / us[0] * 1e-3 / copy_gbs * 100, us[1],
	    bytes / us[1] * 1e-3, bytes / us[1] * 1e-3 / copy_gbs * 100, us[1] / us[0], rc ? " ERROR" : "");
}

static void bench_mla(int B, int64_t H, int64_t ctxlen, int bf16, int K)
{
	const int64_t C = 512, R = 64, dim = C + R;
	const int elt = bf16 ? 2 : 4;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup s;
	if (setup_init(&s, B, dim, elt, ctxlen, H, C, K)) {
		printf("mla: allocation failed\n");
		setup_fini(&s);
		return;
	}
	struct kcuda_kv_view kv = {s.pool, B * nb, (size_t)64 * dim * elt, 0, 64, dim, bf16};
	struct kcuda_attn_rows rows = {B,
	                               (const int32_t *)s.qseq,
	                               (const int32_t *)s.tbl,
	                               nb,
	                               (const int32_t *)s.nk,
	                               0,
	                               K > 0 ? (const int32_t *)s.sel : NULL,
	                               K > 0 ? K : 1,
	                               K > 0 ? K : ctxlen};
	int rc = 0;
	double us[2];
	for (int mode = 0; mode < (noref ? 1 : 2); mode++) {
		set_mode(mode);
		for (int i = 0; i < 5; i++)
			rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f,
			                     (float *)s.out);
		rc |= kcuda_sync(ctx);
		double t0 = now_s();
		for (int i = 0; i < iters; i++)
			rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f,
			                     (float *)s.out);
		rc |= kcuda_sync(ctx);
		us[mode] = (now_s() - t0) / iters * 1e6;
	}
	set_mode(0);
	if (noref)
		us[1] = us[0];
	const double bytes = (double)B * (double)(K > 0 ? K : ctxlen) * (double)dim * elt;
	char what[128];
	snprintf(what, sizeof(what), "mla decode B %2d H %3lld ctx %6lld %-8s kv %s", B, (long long)H,
	         (long long)ctxlen, K > 0 ? "top-2048" : "dense", bf16 ? "bf16" : "f32 ");
	print_row(what, bytes, us, rc);
	setup_fini(&s);
}

static void bench_indexer(int B, int64_t ctxlen, int bf16, int with_topk)
{
	const int64_t HI = 32, DI = 128;
	const int elt = bf16 ? 2 : 4, K = 2048;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup s;
	float *scores = NULL;
	if (setup_init(&s, B, DI, elt, ctxlen, HI, 0, K) ||
	    kcuda_alloc(sizeof(float) * (size_t)(B * ctxlen), (void **)&scores)) {
		printf("indexer: allocation failed\n");
		setup_fini(&s);
		return;
	}
	int32_t *nk = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
	for (int b = 0; b < B; b++)
		nk[b] = (int32_t)ctxlen;
	kcuda_upload(ctx, s.nk, nk, sizeof(int32_t) * (size_t)B);
	free(nk);
	struct kcuda_kv_view kv = {s.pool, B * nb, (size_t)64 * DI * elt, 0, 64, DI, bf16};
	struct kcuda_attn_rows rows = {
	    B,     (const int32_t *)s.qseq, (const int32_t *)s.tbl, nb, (const int32_t *)s.nk, 0, NULL, 1,
	    ctxlen};
	int rc = 0;
	double us[2];
	for (int mode = 0; mode < (noref ? 1 : 2); mode++) {
		set_mode(mode);
		for (int i = 0; i < 5 + iters; i++) {
			if (i == 5) {
				rc |= kcuda_sync(ctx);
				us[mode] = now_s();
			}
			if (with_topk)
				rc |= kcuda_indexer_topk(ctx, &kv, &rows, (const float *)s.q,
				                         (const float *)s.w, HI, DI, 0.088f, K,
				                         (int32_t *)s.sel, K, NULL);
			else
				rc |=
				    kcuda_indexer_scores(ctx, &kv, &rows, (const float *)s.q,
				                         (const float *)s.w, HI, DI, 0.088f, scores, ctxlen);
		}
		rc |= kcuda_sync(ctx);
		us[mode] = (now_s() - us[mode]) / iters * 1e6;
	}
	set_mode(0);
	if (noref)
		us[1] = us[0];
	const double bytes = (double)B * (double)ctxlen * DI * elt;
	char what[128];
	snprintf(what, sizeof(what), "indexer    B %2d HI %2lld ctx %6lld %-14s keys %s", B, (long long)HI,
	         (long long)ctxlen, with_topk ? "scores+top2048" : "scores", bf16 ? "bf16" : "f32 ");
	print_row(what, bytes, us, rc);
	kcuda_free(scores);
	setup_fini(&s);
}

/* The attention half of one GLM-5 decode layer as the decode graph runs it (rank 0 of TP=8: H 8,
 * C 512, R 64; indexer HI 32, DI 128, top-2048; bf16 pools), 78 layers captured in one CUDA graph
 * and replayed: kcuda_indexer_topk over a context bucket (max_keys) above the rows' real length,
 * its selection feeding the MLA. old: what main ran before this branch (2 key tiles per indexer
 * block, the radix top-k above 8192 keys, rope_copy + kcuda_mla_attn); new: the defaults (one
 * tile at small batch, the shared-memory top-k up to 32768 keys, q's rope inside the MLA kernel).
 * PDL is on or off for the whole process (TANDEM_PDL=0): run twice to see its share. */
static void set_layer_mode(int mode)
{
	if (mode == 1) { /* old */
		setenv("TANDEM_IDX_TOPK", "old", 1);
		setenv("TANDEM_IDX_TILES", "2", 1);
		setenv("TANDEM_TOPK_SHORT_MAX", "8192", 1);
		setenv("TANDEM_MLA_ROPE", "0", 1);
		setenv("TANDEM_MLA_DEC", "0", 1); /* mla4: the split kernel + combine launch */
	} else {
		unsetenv("TANDEM_IDX_TOPK");
		unsetenv("TANDEM_MLA_DEC");
		unsetenv("TANDEM_IDX_TILES");
		unsetenv("TANDEM_MLA_ROPE"); /* off by default */
		if (mode == 2) /* new, and the one-block top-k up to 32768 keys */
			setenv("TANDEM_TOPK_SHORT_MAX", "32768", 1);
		else
			unsetenv("TANDEM_TOPK_SHORT_MAX");
		if (mode == 3) /* new, and q's rope inside the MLA kernel (TANDEM_MLA_ROPE=1) */
			setenv("TANDEM_MLA_ROPE", "1", 1);
	}
}

static int layer_ops(struct setup *si, struct setup *sm, const struct kcuda_kv_view *kvi,
                     const struct kcuda_attn_rows *ri, const struct kcuda_kv_view *kvm,
                     const struct kcuda_attn_rows *rm, const struct kfuse_rope *rp, int B)
{
	const int64_t HI = 32, DI = 128, H = 8, C = 512, R = 64, dim = C + R;
	const int K = 2048;
	float *q = (float *)sm->q;
	int rc = kcuda_indexer_topk(ctx, kvi, ri, (const float *)si->q, (const float *)si->w, HI, DI, 0.088f,
	                            K, (int32_t *)sm->sel, K, (int32_t *)sm->nk);
	if (rc)
		return rc;
	rc = kfuse_mla_attn_rope(ctx, kvm, rm, q, H, C, R, 0.07f, (float *)sm->out, q + C, H * dim, dim, rp);
	if (rc != ERR_UNSUPPORTED)
		return rc;
	rc = kfuse_rope_copy(ctx, q + C, H * dim, dim, q + C, H * dim, dim, B, H, R, rp);
	return rc ? rc : kcuda_mla_attn(ctx, kvm, rm, q, H, C, R, 0.07f, (float *)sm->out);
}

static void bench_layer(int B, int64_t ctxlen, int64_t bucket)
{
	const int64_t HI = 32, DI = 128, H = 8, C = 512, R = 64, dim = C + R;
	const int K = 2048, L = 78;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup si, sm;
	void *d_pos = NULL, *d_inv = NULL;
	int rc = setup_init(&si, B, DI, 2, ctxlen, HI, 0, 0) | setup_init(&sm, B, dim, 2, ctxlen, H, C, K) |
	         kcuda_alloc(sizeof(int32_t) * (size_t)B, &d_pos) |
	         kcuda_alloc(sizeof(float) * (size_t)R, &d_inv);
	if (rc) {
		printf("layer: allocation failed\n");
		goto out;
	}
	{
		int32_t pos[256];
		float inv[64];
		for (int b = 0; b < B && b < 256; b++)
			pos[b] = (int32_t)ctxlen - 1;
		for (int i = 0; i < R / 2; i++)
			inv[i] = powf(10000.0f, -2.0f * (float)i / (float)R);
		kcuda_upload(ctx, d_pos, pos, sizeof(int32_t) * (size_t)B);
		kcuda_upload(ctx, d_inv, inv, sizeof(float) * (size_t)(R / 2));
	}
	{
		const struct kcuda_kv_view kvi = {si.pool, B * nb, (size_t)64 * DI * 2, 0, 64, DI, 1};
		const struct kcuda_attn_rows ri = {B,
		                                   (const int32_t *)si.qseq,
		                                   (const int32_t *)si.tbl,
		                                   nb,
		                                   (const int32_t *)si.nk,
		                                   0,
		                                   NULL,
		                                   1,
		                                   bucket};
		const struct kcuda_kv_view kvm = {sm.pool, B * nb, (size_t)64 * dim * 2, 0, 64, dim, 1};
		const struct kcuda_attn_rows rm = {B,
		                                   (const int32_t *)sm.qseq,
		                                   (const int32_t *)sm.tbl,
		                                   nb,
		                                   (const int32_t *)sm.nk,
		                                   0,
		                                   (const int32_t *)sm.sel,
		                                   K,
		                                   K};
		const struct kfuse_rope rp = {(const float *)d_inv, (const int32_t *)d_pos, 0};
		cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
		double us[4] = {0, 0, 0, 0}, eus[4] = {0, 0, 0, 0};
		int nodes[4] = {0, 0, 0, 0};
		for (int old = 3; old >= 0; old--) { /* 3: new + rope in MLA; 2: new + short top-k to 32k;
			                              * 1: old; 0: new */
			set_layer_mode(old);
			for (int i = 0; i < 3; i++) /* eager warm-up (attributes, first-launch costs) */
				rc |= layer_ops(&si, &sm, &kvi, &ri, &kvm, &rm, &rp, B);
			rc |= kcuda_sync(ctx);
			{ /* eager: the 78 layers launched one by one (prefill and eager steps run so) */
				const double t0 = now_s();
				for (int l = 0; l < L; l++)
					rc |= layer_ops(&si, &sm, &kvi, &ri, &kvm, &rm, &rp, B);
				rc |= kcuda_sync(ctx);
				eus[old] = (now_s() - t0) / L * 1e6;
			}
			cudaGraph_t g = NULL;
			cudaGraphExec_t ge = NULL;
			if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
				rc = 1;
				break;
			}
			for (int l = 0; l < L; l++)
				rc |= layer_ops(&si, &sm, &kvi, &ri, &kvm, &rm, &rp, B);
			if (cudaStreamEndCapture(st, &g) != cudaSuccess ||
			    cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
				(void)cudaGetLastError();
				rc = 1;
				if (g)
					cudaGraphDestroy(g);
				break;
			}
			size_t nn = 0;
			cudaGraphGetNodes(g, NULL, &nn);
			nodes[old] = (int)nn;
			for (int i = 0; i < 3; i++)
				cudaGraphLaunch(ge, st);
			rc |= kcuda_sync(ctx);
			const int reps = 20;
			const double t0 = now_s();
			for (int i = 0; i < reps; i++)
				cudaGraphLaunch(ge, st);
			rc |= kcuda_sync(ctx);
			us[old] = (now_s() - t0) / reps / L * 1e6;
			cudaGraphExecDestroy(ge);
			cudaGraphDestroy(g);
		}
		set_layer_mode(0);
		for (int e = 0; e < 2; e++) {
			const double *t = e ? us : eus;
			printf("layer attn %s B %d ctx %6lld bucket %6lld PDL %s | old %6.1f | new %6.1f "
			       "(x%.2f) | new, "
			       "rope in MLA %6.1f | new, short top-k to 32k %6.1f us/layer | nodes/layer old "
			       "%d new %d%s\n",
			       e ? "graph" : "eager", B, (long long)ctxlen, (long long)bucket,
			       kcuda_pdl_enabled() ? "on " : "off", t[1], t[0], t[0] > 0 ? t[1] / t[0] : 0.0,
			       t[3], t[2], nodes[1] / L, nodes[0] / L, rc ? " ERROR" : "");
		}
	}
out:
	setup_fini(&si);
	setup_fini(&sm);
	kcuda_free(d_pos);
	kcuda_free(d_inv);
}

/* The indexer alone as the decode graph runs it (GLM-5: HI 32, DI 128, top-2048; bf16 or f32 keys):
 * kcuda_indexer_topk over B rows of ctxlen keys (max_keys = bucket), 78 calls captured in one CUDA
 * graph, us per call: old = the default (score kernel, then the one-block / radix top-k),
 * new = TANDEM_IDX_TOPK=fused (scores and top-k in one launch), new/TK64 = new with 64-key tiles
 * (TANDEM_IDX_TK=64). Also checks that old and new select the same positions. */
static void bench_idx(int B, int64_t ctxlen, int64_t bucket, int bf16)
{
	const int64_t HI = 32, DI = 128;
	const int K = 2048, L = 78, elt = bf16 ? 2 : 4;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup s;
	int32_t *sel_h[2] = {NULL, NULL};
	int rc = setup_init(&s, B, DI, elt, ctxlen, HI, 0, 0);
	if (rc) {
		printf("idx: allocation failed\n");
		setup_fini(&s);
		return;
	}
	{ /* distinct scores: q and w from a ramp, keys from a hash (a constant pool ties everything) */
		const size_t nq = (size_t)(B * HI * DI), nk = (size_t)(B * nb * 64 * DI);
		float *q = (float *)malloc(sizeof(float) * nq), *w = (float *)malloc(sizeof(float) * B * HI);
		uint8_t *k = (uint8_t *)malloc(nk * elt);
		for (size_t i = 0; i < nq; i++)
			q[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.3f;
		for (int i = 0; i < B * HI; i++)
			w[i] = (float)(i % 7 + 1) / 16.0f;
		for (size_t i = 0; i < nk; i++) {
			const float v = (float)((i * 2246822519u + 7) % 2001) / 1000.0f - 1.0f;
			uint32_t u;
			memcpy(&u, &v, 4);
			if (bf16) {
				const uint16_t h = (uint16_t)(u >> 16);
				memcpy(k + 2 * i, &h, 2);
			} else {
				memcpy(k + 4 * i, &u, 4);
			}
		}
		kcuda_upload(ctx, s.q, q, sizeof(float) * nq);
		kcuda_upload(ctx, s.w, w, sizeof(float) * B * HI);
		kcuda_upload(ctx, s.pool, k, nk * elt);
		free(q);
		free(w);
		free(k);
	}
	{
		int32_t *nk = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
		for (int b = 0; b < B; b++)
			nk[b] = (int32_t)ctxlen;
		kcuda_upload(ctx, s.nk, nk, sizeof(int32_t) * (size_t)B);
		free(nk);
	}
	void *d_sel = NULL;
	if (kcuda_alloc(sizeof(int32_t) * (size_t)(B * K), &d_sel)) {
		setup_fini(&s);
		return;
	}
	const struct kcuda_kv_view kv = {s.pool, B * nb, (size_t)64 * DI * elt, 0, 64, DI, bf16};
	const struct kcuda_attn_rows rows = {
	    B,     (const int32_t *)s.qseq, (const int32_t *)s.tbl, nb, (const int32_t *)s.nk, 0, NULL, 1,
	    bucket};
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	double us[3] = {0, 0, 0}, eus[3] = {0, 0, 0};
	for (int mode = 0; mode < 3; mode++) { /* 0 old, 1 new, 2 new with 64-key tiles */
		if (mode == 0)
			unsetenv("TANDEM_IDX_TOPK");
		else
			setenv("TANDEM_IDX_TOPK", "fused", 1);
		if (mode == 2)
			setenv("TANDEM_IDX_TK", "64", 1);
		else
			unsetenv("TANDEM_IDX_TK");
		auto call = [&]() {
			return kcuda_indexer_topk(ctx, &kv, &rows, (const float *)s.q, (const float *)s.w, HI,
			                          DI, 0.088f, K, (int32_t *)d_sel, K, NULL);
		};
		for (int i = 0; i < 3; i++)
			rc |= call();
		rc |= kcuda_sync(ctx);
		if (mode < 2) {
			sel_h[mode] = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * K));
			rc |= kcuda_download(ctx, sel_h[mode], d_sel, sizeof(int32_t) * (size_t)(B * K));
		}
		double t0 = now_s();
		for (int l = 0; l < L; l++)
			rc |= call();
		rc |= kcuda_sync(ctx);
		eus[mode] = (now_s() - t0) / L * 1e6;
		cudaGraph_t g = NULL;
		cudaGraphExec_t ge = NULL;
		if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
			rc = 1;
			break;
		}
		for (int l = 0; l < L; l++)
			rc |= call();
		if (cudaStreamEndCapture(st, &g) != cudaSuccess ||
		    cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
			(void)cudaGetLastError();
			rc = 1;
			if (g)
				cudaGraphDestroy(g);
			break;
		}
		for (int i = 0; i < 3; i++)
			cudaGraphLaunch(ge, st);
		rc |= kcuda_sync(ctx);
		const int reps = 20;
		t0 = now_s();
		for (int i = 0; i < reps; i++)
			cudaGraphLaunch(ge, st);
		rc |= kcuda_sync(ctx);
		us[mode] = (now_s() - t0) / reps / L * 1e6;
		cudaGraphExecDestroy(ge);
		cudaGraphDestroy(g);
	}
	unsetenv("TANDEM_IDX_TOPK");
	unsetenv("TANDEM_IDX_TK");
	const int same =
	    sel_h[0] && sel_h[1] && memcmp(sel_h[0], sel_h[1], sizeof(int32_t) * (size_t)(B * K)) == 0;
	printf("indexer+top-k B %d ctx %6lld bucket %6lld keys %s | graph old %6.1f new %6.1f (x%.2f) "
	       "new/TK64 %6.1f "
	       "| eager old %6.1f new %6.1f us/call | selections %s%s\n",
	       B, (long long)ctxlen, (long long)bucket, bf16 ? "bf16" : "f32 ", us[0], us[1],
	       us[1] > 0 ? us[0] / us[1] : 0.0, us[2], eus[0], eus[1], same ? "equal" : "DIFFER",
	       rc ? " ERROR" : "");
	free(sel_h[0]);
	free(sel_h[1]);
	kcuda_free(d_sel);
	setup_fini(&s);
}

/* MLA decode, the split kernel + combine launch (TANDEM_MLA_DEC=0) against the one-launch
 * small-batch kernel (mla_attn_dec.cu; by default only for one sparse row, here forced with
 * TANDEM_MLA_DEC=65535 on every shape), each as 78 calls in one CUDA graph
 * (the decode step's form; PDL per TANDEM_PDL) and eagerly (mean of the calls, launch cost
 * included). Shapes: GLM-5 rank 0 of TP=8 (H 8; top-2048 of 4096 / 32768; its dense layers at
 * 4096), DeepSeek-V3 rank 0 (H 16, dense 4096 / 32768), batch 1, 2, 4, 8, bf16 pools, plus an
 * fp32 pool and H 64. BENCH_ATTN_MLA_ONLY=1 runs only this table. */
static double mla_graph_us(const struct kcuda_kv_view *kv, const struct kcuda_attn_rows *rows, const float *q,
                           int64_t H, float *out, double *eager_us, int *rc)
{
	const int L = 78, reps = 20;
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	for (int i = 0; i < 3; i++)
		*rc |= kcuda_mla_attn(ctx, kv, rows, q, H, 512, 64, 0.07f, out);
	*rc |= kcuda_sync(ctx);
	double t0 = now_s();
	for (int i = 0; i < L; i++)
		*rc |= kcuda_mla_attn(ctx, kv, rows, q, H, 512, 64, 0.07f, out);
	*rc |= kcuda_sync(ctx);
	*eager_us = (now_s() - t0) / L * 1e6;
	cudaGraph_t g = NULL;
	cudaGraphExec_t ge = NULL;
	if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
		*rc = 1;
		return 0;
	}
	for (int i = 0; i < L; i++)
		*rc |= kcuda_mla_attn(ctx, kv, rows, q, H, 512, 64, 0.07f, out);
	if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
		(void)cudaGetLastError();
		*rc = 1;
		if (g)
			cudaGraphDestroy(g);
		return 0;
	}
	for (int i = 0; i < 3; i++)
		cudaGraphLaunch(ge, st);
	*rc |= kcuda_sync(ctx);
	t0 = now_s();
	for (int i = 0; i < reps; i++)
		cudaGraphLaunch(ge, st);
	*rc |= kcuda_sync(ctx);
	const double us = (now_s() - t0) / reps / L * 1e6;
	cudaGraphExecDestroy(ge);
	cudaGraphDestroy(g);
	return us;
}

static void bench_mla_dec(int B, int64_t H, int64_t ctxlen, int bf16, int K)
{
	const int64_t C = 512, R = 64, dim = C + R;
	const int elt = bf16 ? 2 : 4;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup s;
	if (setup_init(&s, B, dim, elt, ctxlen, H, C, K)) {
		printf("mla dec: allocation failed\n");
		setup_fini(&s);
		return;
	}
	struct kcuda_kv_view kv = {s.pool, B * nb, (size_t)64 * dim * elt, 0, 64, dim, bf16};
	struct kcuda_attn_rows rows = {B,
	                               (const int32_t *)s.qseq,
	                               (const int32_t *)s.tbl,
	                               nb,
	                               (const int32_t *)s.nk,
	                               0,
	                               K > 0 ? (const int32_t *)s.sel : NULL,
	                               K > 0 ? K : 1,
	                               K > 0 ? K : ctxlen};
	int rc = 0;
	/* 0 old: split + combine; 1 v4: mla_attn_dec.cu everywhere */
	/* 2..5: mla_dec6 (TANDEM_MLA_DEC_V=6, forced on every shape): 16-key tiles, 32-key tiles
	 * (TANDEM_MLA_DEC6_KB=32), at least 2 tiles a block (TANDEM_MLA_DEC6_T=2), the block table
	 * after the wait (TANDEM_MLA_DEC6_EARLY=0) */
	/* 6, 7: mla_dec7 (TANDEM_MLA_DEC_V=7 TANDEM_MLA_DEC=65535, two launches without a merge):
	 * 16-key score tiles, 32-key score tiles (TANDEM_MLA_DEC6_KB=32) */
	enum { NM = 8 };
	double g[NM], e[NM];
	unsigned long long nl[NM];
	for (int mode = 0; mode < NM; mode++) {
		unsetenv("TANDEM_MLA_DEC");
		unsetenv("TANDEM_MLA_DEC_V");
		unsetenv("TANDEM_MLA_DEC6_KB");
		unsetenv("TANDEM_MLA_DEC6_T");
		unsetenv("TANDEM_MLA_DEC6_EARLY");
		g[mode] = e[mode] = 0;
		nl[mode] = 0;
		if (mode >= 2) { /* forced: dec6 (2..5) or dec7 (6, 7), timed only where it took the shape */
			const int d7 = mode >= 6;
			setenv("TANDEM_MLA_DEC_V", d7 ? "7" : "6", 1);
			setenv("TANDEM_MLA_DEC", "65535", 1);
			if (mode == 3 || mode == 7)
				setenv("TANDEM_MLA_DEC6_KB", "32", 1);
			if (mode == 4)
				setenv("TANDEM_MLA_DEC6_T", "2", 1);
			if (mode == 5)
				setenv("TANDEM_MLA_DEC6_EARLY", "0", 1);
			const unsigned long long *took = d7 ? &kmla_dec7_launches : &kmla_dec6_launches;
			const unsigned long long l0 = kcuda_n_launch, d0 = *took;
			rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f,
			                     (float *)s.out);
			nl[mode] = kcuda_n_launch - l0;
			if (*took != d0)
				g[mode] = mla_graph_us(&kv, &rows, (const float *)s.q, H, (float *)s.out,
				                       &e[mode], &rc);
			continue;
		}
		if (mode == 0)
			setenv("TANDEM_MLA_DEC", "0", 1);
		if (mode == 1) {
			setenv("TANDEM_MLA_DEC_V", "4", 1);
			setenv("TANDEM_MLA_DEC", "65535", 1);
		}
		const unsigned long long l0 = kcuda_n_launch;
		rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f, (float *)s.out);
		nl[mode] = kcuda_n_launch - l0;
		g[mode] = mla_graph_us(&kv, &rows, (const float *)s.q, H, (float *)s.out, &e[mode], &rc);
	}
	unsetenv("TANDEM_MLA_DEC");
	unsetenv("TANDEM_MLA_DEC_V");
	unsetenv("TANDEM_MLA_DEC6_KB");
	unsetenv("TANDEM_MLA_DEC6_T");
	unsetenv("TANDEM_MLA_DEC6_EARLY");
	const double bytes = (double)B * (double)(K > 0 ? K : ctxlen) * (double)dim * elt;
	printf("mla dec B %d H %3lld ctx %6lld %-8s kv %s %6.2f MB | graph old %6.1f v4 %6.1f us "
	       "(x%.2f vs old, %5.0f GB/s %4.1f%%) | eager old %6.1f v4 %6.1f | launches %llu %llu%s\n",
	       B, (long long)H, (long long)ctxlen, K > 0 ? "top-2048" : "dense", bf16 ? "bf16" : "f32 ",
	       bytes * 1e-6, g[0], g[1], g[1] > 0 ? g[0] / g[1] : 0.0, g[1] > 0 ? bytes / g[1] * 1e-3 : 0.0,
	       g[1] > 0 ? bytes / g[1] * 1e-3 / copy_gbs * 100 : 0.0, e[0], e[1], nl[0], nl[1],
	       rc ? " ERROR" : "");
	const double best_old = g[1] > 0 && g[1] < g[0] ? g[1] : g[0];
	printf("mla dec6 B %d H %3lld ctx %6lld %-8s kv %s | graph dec6 %6.1f us (x%.2f vs best of old / v4, "
	       "%5.0f GB/s) | KB32 %6.1f T2 %6.1f table after wait %6.1f | eager dec6 %6.1f KB32 %6.1f | "
	       "launches %llu (0.0: declined)%s\n",
	       B, (long long)H, (long long)ctxlen, K > 0 ? "top-2048" : "dense", bf16 ? "bf16" : "f32 ", g[2],
	       g[2] > 0 ? best_old / g[2] : 0.0, g[2] > 0 ? bytes / g[2] * 1e-3 : 0.0, g[3], g[4], g[5], e[2],
	       e[3], nl[2], rc ? " ERROR" : "");
	printf("mla dec7 B %d H %3lld ctx %6lld %-8s kv %s | graph dec7 %6.1f us (x%.2f vs best of old / v4, "
	       "%5.0f GB/s) | KB32 %6.1f | eager dec7 %6.1f KB32 %6.1f | launches %llu (0.0: declined)%s\n",
	       B, (long long)H, (long long)ctxlen, K > 0 ? "top-2048" : "dense", bf16 ? "bf16" : "f32 ", g[6],
	       g[6] > 0 ? best_old / g[6] : 0.0, g[6] > 0 ? bytes / g[6] * 1e-3 : 0.0, g[7], e[6], e[7],
	       nl[6], rc ? " ERROR" : "");
	setup_fini(&s);
}

static void bench_mla_dec_table(void)
{
	printf("MLA decode: split kernel + combine (old, TANDEM_MLA_DEC=0) | mla_dec v4 (TANDEM_MLA_DEC_V=4 "
	       "TANDEM_MLA_DEC=65535), us per call, 78 calls per graph, PDL %s\n",
	       kcuda_pdl_enabled() ? "on" : "off");
	/* mla_dec6's plans (16-key tiles; 32 in brackets) for the table's shapes */
	static const int qB[] = {1, 2, 4, 8, 1, 8, 1, 1, 8};
	static const int64_t qH[] = {8, 8, 8, 8, 8, 8, 16, 16, 16};
	static const int64_t qK[] = {2048, 2048, 2048, 2048, 4096, 4096, 4096, 32768, 32768};
	for (int i = 0; i < 9; i++) {
		int pl[7], p32[7];
		setenv("TANDEM_MLA_DEC6_KB", "32", 1);
		const int r32 = kmla_dec6_plan(ctx, qB[i], qH[i], qK[i], (qK[i] + 63) / 64 + 1, 1, p32);
		unsetenv("TANDEM_MLA_DEC6_KB");
		if (kmla_dec6_plan(ctx, qB[i], qH[i], qK[i], (qK[i] + 63) / 64 + 1, 1, pl) == 0)
			printf("mla_dec6 plan B %d H %2lld keys %5lld: %d keys a block, %d splits a row-head "
			       "group, "
			       "cluster %d, %d clusters, %d blocks per SM, %d registers, %d B shared memory "
			       "[KB32: %d keys, %d splits, %d clusters, %d blocks per SM, %d B]\n",
			       qB[i], (long long)qH[i], (long long)qK[i], pl[0], pl[1], pl[2], pl[3], pl[4],
			       pl[5], pl[6], r32 ? 0 : p32[0], r32 ? 0 : p32[1], r32 ? 0 : p32[3],
			       r32 ? 0 : p32[4], r32 ? 0 : p32[6]);
		else
			printf("mla_dec6 plan B %d H %2lld keys %5lld: declined\n", qB[i], (long long)qH[i],
			       (long long)qK[i]);
	}
	for (int bf = 1; bf >= 0; bf--) { /* residency: the 19:30 run had 256 blocks cost ~2x 128 */
		int bps = 0, ncl = 0, regs = 0, smem = 0;
		if (kmla_dec_occupancy(ctx, bf, &bps, &ncl, &regs, &smem) == 0)
			printf(
			    "mla_dec residency (%s pool): %d blocks per SM, %d 8-block clusters at once, %d "
			    "registers, %d B shared memory per block\n",
			    bf ? "bf16" : "f32", bps, ncl, regs, smem);
	}
	static const int Bs[] = {1, 2, 4, 8};
	for (int bi = 0; bi < 4; bi++) {
		bench_mla_dec(Bs[bi], 8, 4096, 1, 2048);
		bench_mla_dec(Bs[bi], 8, 32768, 1, 2048);
		bench_mla_dec(Bs[bi], 8, 4096, 1, 0);
		bench_mla_dec(Bs[bi], 16, 4096, 1, 0);
	}
	bench_mla_dec(1, 16, 32768, 1, 0);
	bench_mla_dec(8, 16, 32768, 1, 0);
	bench_mla_dec(1, 8, 4096, 0, 2048);
	bench_mla_dec(1, 64, 32768, 1, 0);
	bench_mla_dec(8, 64, 4096, 1, 2048);
}

/* BENCH_ATTN_MLA_TRACE=1: where mla_dec6's time goes. Its trace mode stamps %globaltimer (ns) at
 * each phase of every block (mla_attn_dec6.cu: D6_NTRACE = 10 stamps a block); here calls 39 and
 * 40 of a graph of 78 (PDL per TANDEM_PDL) are traced, in the 4th replay. Printed per phase: min /
 * median / max over the blocks of (stamp - the earliest entry of call 40) in us, and when call 39's
 * last block ended on the same clock. */
enum { D6_TR = 10 };
static void trace_row(const char *name, const unsigned long long *t, int nb, int ph, double t0)
{
	std::vector<double> v;
	for (int b = 0; b < nb; b++)
		if (t[(size_t)b * D6_TR + ph])
			v.push_back(((double)t[(size_t)b * D6_TR + ph] - t0) * 1e-3);
	if (v.empty()) {
		printf("  %-44s (no block)\n", name);
		return;
	}
	std::sort(v.begin(), v.end());
	printf("  %-44s min %7.2f median %7.2f max %7.2f us (%zu blocks)\n", name, v[0], v[v.size() / 2],
	       v.back(), v.size());
}

static void bench_mla_dec6_trace(int B, int KB)
{
	const int64_t H = 8, C = 512, R = 64, dim = C + R, ctxlen = 4096;
	const int K = 2048, L = 78;
	const int64_t nb = (ctxlen + 63) / 64;
	struct setup s;
	unsigned long long *tr[2] = {NULL, NULL};
	cudaGraph_t g = NULL;
	cudaGraphExec_t ge = NULL;
	cudaStream_t st = (cudaStream_t)kcuda_ctx_stream(ctx);
	int rc = 0, pl[7];
	setenv("TANDEM_MLA_DEC_V", "6", 1);
	setenv("TANDEM_MLA_DEC", "65535", 1);
	setenv("TANDEM_MLA_DEC6_KB", KB == 32 ? "32" : "16", 1);
	if (setup_init(&s, B, dim, 2, ctxlen, H, C, K) || kmla_dec6_plan(ctx, B, H, K, nb, 1, pl)) {
		printf("mla dec6 trace: setup or plan failed\n");
		goto out;
	}
	{
		const int nblk = pl[1] * B; /* one head group */
		const size_t bytes = sizeof(unsigned long long) * (size_t)nblk * D6_TR;
		struct kcuda_kv_view kv = {s.pool, B * nb, (size_t)64 * dim * 2, 0, 64, dim, 1};
		struct kcuda_attn_rows rows = {B,
		                               (const int32_t *)s.qseq,
		                               (const int32_t *)s.tbl,
		                               nb,
		                               (const int32_t *)s.nk,
		                               0,
		                               (const int32_t *)s.sel,
		                               K,
		                               K};
		if (kcuda_alloc(bytes, (void **)&tr[0]) || kcuda_alloc(bytes, (void **)&tr[1])) {
			printf("mla dec6 trace: allocation failed\n");
			goto out;
		}
		rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f, (float *)s.out);
		rc |= kcuda_sync(ctx);
		if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
			printf("mla dec6 trace: capture failed\n");
			goto out;
		}
		for (int i = 0; i < L; i++) {
			kmla_dec6_set_trace(i == L / 2 - 1 ? tr[0] : i == L / 2 ? tr[1] : NULL);
			rc |= kcuda_mla_attn(ctx, &kv, &rows, (const float *)s.q, H, C, R, 0.07f,
			                     (float *)s.out);
		}
		kmla_dec6_set_trace(NULL);
		if (cudaStreamEndCapture(st, &g) != cudaSuccess ||
		    cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
			(void)cudaGetLastError();
			printf("mla dec6 trace: graph failed\n");
			goto out;
		}
		for (int i = 0; i < 3; i++)
			cudaGraphLaunch(ge, st);
		rc |= kcuda_sync(ctx);
		rc |= kcuda_memset(ctx, tr[0], 0, bytes);
		rc |= kcuda_memset(ctx, tr[1], 0, bytes);
		rc |= kcuda_sync(ctx);
		const double t0w = now_s();
		cudaGraphLaunch(ge, st);
		rc |= kcuda_sync(ctx);
		const double us_call = (now_s() - t0w) / L * 1e6;
		std::vector<unsigned long long> h0((size_t)nblk * D6_TR), h1((size_t)nblk * D6_TR);
		rc |= kcuda_download(ctx, h0.data(), tr[0], bytes);
		rc |= kcuda_download(ctx, h1.data(), tr[1], bytes);
		double t0 = 0, prev_end = 0;
		for (int b = 0; b < nblk; b++) {
			const double e = (double)h1[(size_t)b * D6_TR];
			if (e > 0 && (t0 == 0 || e < t0))
				t0 = e;
			for (int ph = 0; ph < D6_TR; ph++)
				prev_end = std::max(prev_end, (double)h0[(size_t)b * D6_TR + ph]);
		}
		printf("mla dec6 trace B %d H 8 top-2048 of 4096 bf16, KB %d: %d blocks (%d keys a block, "
		       "cluster %d, %d "
		       "clusters), call 40 of a graph of 78 (%.1f us a call in this replay, PDL %s); us from "
		       "the first "
		       "block's entry:%s\n",
		       B, KB, nblk, pl[0], pl[2], pl[3], us_call, kcuda_pdl_enabled() ? "on" : "off",
		       rc ? " ERROR" : "");
		printf("  %-44s %7.2f us (the last stamp of any block of call 39)\n", "previous call's end",
		       prev_end > 0 ? (prev_end - t0) * 1e-3 : 0.0);
		static const char *const names[D6_TR] = {"0 entry",
		                                         "1 after KDEP_ENTRY (griddepcontrol.wait)",
		                                         "2 key count + tile-0 top-k landed, copies issued",
		                                         "3 tile-0 KV rows + q landed (1st barrier)",
		                                         "4 scores + softmax of the last tile",
		                                         "5 PV of the last tile",
		                                         "6 cluster merge (DSMEM) done",
		                                         "7 ticket drawn, cluster barrier passed",
		                                         "8 last block: cross-cluster merge stored",
		                                         "9 (unused)"};
		for (int ph = 0; ph < 9; ph++)
			trace_row(names[ph], h1.data(), nblk, ph, t0);
	}
out:
	if (ge)
		cudaGraphExecDestroy(ge);
	if (g)
		cudaGraphDestroy(g);
	kmla_dec6_set_trace(NULL);
	kcuda_free(tr[0]);
	kcuda_free(tr[1]);
	setup_fini(&s);
	unsetenv("TANDEM_MLA_DEC_V");
	unsetenv("TANDEM_MLA_DEC");
	unsetenv("TANDEM_MLA_DEC6_KB");
}

int main(int argc, char **argv)
{
	if (argc > 1)
		iters = atoi(argv[1]) > 0 ? atoi(argv[1]) : 50;
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	/* 1 GiB workspace: the indexer top-k keeps the scores of 32 rows of 100k there */
	if (kcuda_ctx_create(0, (size_t)1 << 30, &ctx)) {
		printf("no CUDA context\n");
		return 1;
	}
	measure_copy();
	if (getenv("BENCH_ATTN_MLA_TRACE")) {
		bench_mla_dec6_trace(1, 16);
		bench_mla_dec6_trace(1, 32);
		bench_mla_dec6_trace(8, 16);
		goto done;
	}
	if (getenv("BENCH_ATTN_BIG")) { /* the large-batch decode shapes, fast kernels only */
		noref = 1;
		bench_mla(128, 8, 4096, 1, 2048); /* GLM-5 rank: top-2048 of 4096 */
		bench_mla(128, 16, 4096, 1, 0); /* DeepSeek-V3 rank: dense 4096 */
		bench_mla(32, 8, 32768, 1, 2048);
		bench_mla(32, 16, 32768, 1, 0);
		bench_mla(32, 8, 4096, 1, 2048);
		bench_mla(32, 16, 4096, 1, 0);
		bench_indexer(128, 4096, 1, 0);
		bench_indexer(128, 4096, 1, 1);
		bench_indexer(32, 32768, 1, 0);
		goto done;
	}
	if (getenv("BENCH_ATTN_MLA_ONLY")) {
		bench_mla_dec_table();
		goto done;
	}
	printf("fast = default kernels (tensor cores, multi-block top-k); ref = TANDEM_CUDA_ATTN=ref (the "
	       "first kernels); %% = of the copy rate above\n");
	/* the indexer alone, old vs new (BENCH_ATTN_IDX_ONLY=1 stops after it) */
	bench_idx(1, 4096, 4096, 0);
	bench_idx(1, 4096, 8192, 1);
	bench_idx(1, 4096, 4096, 1);
	bench_idx(8, 4096, 4096, 1);
	bench_idx(1, 32768, 32768, 1);
	bench_idx(8, 32768, 32768, 1);
	bench_idx(1, 131072, 131072, 1);
	bench_idx(32, 4096, 4096, 1);
	if (getenv("BENCH_ATTN_IDX_ONLY"))
		goto done;
	/* the decode graph's attention chain first (GLM-5 rank 0 of TP=8; the 4k point at the
	 * 8192 bucket the synthetic bench captures, 32k at its own bucket) */
	bench_layer(1, 4096, 8192);
	bench_layer(8, 4096, 8192);
	bench_layer(1, 2048, 2048);
	bench_layer(1, 32768, 32768);
	bench_layer(8, 32768, 32768);
	if (getenv("BENCH_ATTN_LAYER_ONLY"))
		goto done;
	bench_mla_dec_table();
	static const int Bs[] = {1, 8, 32};
	for (size_t bi = 0; bi < 3; bi++) {
		const int B = Bs[bi];
		bench_mla(B, 8, 4096, 1, 0);
		bench_mla(B, 8, 32768, 1, 0);
		bench_mla(B, 8, 32768, 1, 2048);
		bench_mla(B, 16, 4096, 1, 0);
		bench_mla(B, 16, 32768, 1, 0);
		bench_mla(B, 16, 32768, 1, 2048);
		bench_mla(B, 64, 32768, 1, 0);
		bench_mla(B, 16, 32768, 0, 0);
		bench_mla(B, 8, 32768, 0, 0);
		bench_indexer(B, 32768, 1, 0);
		bench_indexer(B, 32768, 1, 1);
		bench_indexer(B, 100000, 1, 1);
		bench_indexer(B, 32768, 0, 0);
	}
done:
	kcuda_ctx_destroy(ctx);
	return 0;
}
