/* The one-shot all-reduce (kernels/cuda/allreduce.cu) on seeded random inputs: T ranks as T streams
 * of GPU 0 (T = 2, 3, 4, 8: the protocol is the same with plain pointers, so one GPU checks it), and
 * T = every visible GPU (up to 8) when there are several (peer loads). Checks: every rank's result is
 * bit-identical to the host's fixed-order sum 0 + x0 + x1 + ... for sizes 1 .. 65536 floats (the
 * chunk and block edges), many consecutive calls (both slot parities, epochs), three calls captured
 * in a CUDA graph per rank and replayed, guard bytes, no timeout counted; a call whose peer never
 * comes times out (counted, the wait returns) instead of hanging; bad arguments are refused.
 * Also prints the latency of one 6144-float call (information, not a check). Exit 77 = no GPU. */
#include <errno.h>
#include <time.h>

#include "common/base/err.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/cuda/model_fwd.h"

#define MAXR 8
#define MAXF 65536

static struct kcuda_ctx *ctx[MAXR];
static int dev[MAXR];

/* the host reference: the kernel's order exactly (fp32, 0 + x0 + x1 + ...) */
static void ref_sum(float *out, float *const *x, int T, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float s = 0.0f;
		for (int q = 0; q < T; q++)
			s += x[q][i];
		out[i] = s;
	}
}

static int wait_all(int T)
{
	int rc = 0;
	for (int r = 0; r < T; r++) {
		kcuda_device_set(dev[r]);
		int w = kcuda_ctx_wait(ctx[r], 20.0);
		rc = rc ? rc : w;
	}
	return rc;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void run_group(int T, const char *what)
{
	struct kcuda_ar *ar = NULL;
	char why[256];
	int rc = kcuda_ar_create(T, ctx, MAXF, 10.0, &ar, why, sizeof(why));
	if (rc == ERR_UNSUPPORTED) {
		printf("note: %s: %s (not checked)\n", what, why);
		return;
	}
	OPS_CHECK(rc == 0, "%s: create rc %d: %s", what, rc, why);
	if (rc)
		return;
	struct ops_dbuf b[MAXR] = {{0}};
	float *x[MAXR], *got = malloc(sizeof(float) * MAXF), *want = malloc(sizeof(float) * MAXF);
	for (int r = 0; r < T; r++) {
		x[r] = malloc(sizeof(float) * MAXF);
		kcuda_device_set(dev[r]);
		OPS_CHECK(ops_dbuf_init(ctx[r], &b[r], sizeof(float) * MAXF) == 0, "%s: alloc", what);
	}
	static const size_t sizes[] = {1, 5, 1000, 4096, 4097, 6144, 8192, 24576, 65535, 65536};
	int calls = 0;
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		const size_t n = sizes[si];
		for (int round = 0; round < 3; round++) { /* odd and even epochs */
			for (int r = 0; r < T; r++) {
				for (size_t i = 0; i < n; i++)
					x[r][i] = ops_rng_unif() * (float)(1 + r);
				kcuda_device_set(dev[r]);
				kcuda_upload(ctx[r], b[r].user, x[r], sizeof(float) * n);
			}
			ref_sum(want, x, T, n);
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				rc = kcuda_ar_sum(ar, r, b[r].user, (int64_t)n);
				OPS_CHECK(rc == 0, "%s: n %zu rank %d rc %d", what, n, r, rc);
			}
			calls++;
			OPS_CHECK(wait_all(T) == 0, "%s: n %zu: wait", what, n);
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				size_t bad = ops_dbuf_get(ctx[r], &b[r], got);
				OPS_CHECK(bad == 0, "%s: n %zu rank %d: %zu guard bytes damaged", what, n, r,
				          bad);
				size_t diff = 0;
				for (size_t i = 0; i < n; i++)
					diff += memcmp(&got[i], &want[i], 4) != 0;
				/* the part past n must be untouched (it still holds what was uploaded before)
				 */
				OPS_CHECK(
				    diff == 0,
				    "%s: n %zu rank %d round %d: %zu of %zu sums differ (e.g. [0] %g vs %g)",
				    what, n, r, round, diff, n, got[0], want[0]);
			}
		}
	}
	/* back-to-back calls without a host wait in between (the decode step's pattern): 50 sums of the
	 * same buffer in place, each rank's input the previous result */
	{
		const size_t n = 6144;
		for (int r = 0; r < T; r++) {
			for (size_t i = 0; i < n; i++)
				x[r][i] = (float)((int)(i % 7) - 3 + r);
			kcuda_device_set(dev[r]);
			kcuda_upload(ctx[r], b[r].user, x[r], sizeof(float) * n);
		}
		ref_sum(want, x, T, n);
		for (int k = 0; k < 50; k++)
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				/* even calls sum all n floats, odd ones only the first (so sizes vary within
				 * the burst too); the host replays the same sequence in fp32 below */
				(void)kcuda_ar_sum(ar, r, b[r].user, k % 2 ? 1 : (int64_t)n);
			}
		calls += 50;
		OPS_CHECK(wait_all(T) == 0, "%s: burst wait", what);
		float *cur[MAXR];
		for (int r = 0; r < T; r++)
			cur[r] = x[r];
		for (int k = 0; k < 50; k++) {
			size_t m = k % 2 ? 1 : n;
			ref_sum(want, cur, T, m);
			for (int r = 0; r < T; r++)
				memcpy(cur[r], want, sizeof(float) * m);
		}
		for (int r = 0; r < T; r++) {
			kcuda_device_set(dev[r]);
			ops_dbuf_get(ctx[r], &b[r], got);
			OPS_CHECK(memcmp(got, cur[r], sizeof(float) * n) == 0,
			          "%s: burst of 50 calls: rank %d differs", what, r);
		}
	}
	/* graphs: three calls per rank captured once, replayed 10 times */
	{
		const size_t n = 6144;
		void *ex[MAXR] = {0};
		int cap_ok = 1;
		for (int r = 0; r < T && cap_ok; r++) {
			kcuda_device_set(dev[r]);
			cap_ok = kfwd_graph_begin(ctx[r]) == 0;
			for (int k = 0; k < 3 && cap_ok; k++)
				cap_ok = kcuda_ar_sum(ar, r, b[r].user, (int64_t)n) == 0;
			cap_ok = kfwd_graph_end(ctx[r], &ex[r]) == 0 && cap_ok;
		}
		OPS_CHECK(cap_ok, "%s: graph capture", what);
		for (int rep = 0; rep < 10 && cap_ok; rep++) {
			for (int r = 0; r < T; r++) {
				for (size_t i = 0; i < n; i++)
					x[r][i] = (float)((int)((i + (size_t)rep) % 5) - 2 + r);
				kcuda_device_set(dev[r]);
				kcuda_upload(ctx[r], b[r].user, x[r], sizeof(float) * n);
			}
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				OPS_CHECK(kfwd_graph_launch(ctx[r], ex[r]) == 0, "%s: graph launch", what);
			}
			calls += 3;
			OPS_CHECK(wait_all(T) == 0, "%s: graph wait", what);
			float *cur[MAXR];
			for (int r = 0; r < T; r++)
				cur[r] = x[r];
			for (int k = 0; k < 3; k++) {
				ref_sum(want, cur, T, n);
				for (int r = 0; r < T; r++)
					memcpy(cur[r], want, sizeof(float) * n);
			}
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				ops_dbuf_get(ctx[r], &b[r], got);
				OPS_CHECK(memcmp(got, want, sizeof(float) * n) == 0,
				          "%s: graph replay %d rank %d differs", what, rep, r);
			}
		}
		for (int r = 0; r < T; r++)
			kfwd_graph_destroy(ex[r]);
	}
	/* latency of one GLM-5 token (6144 floats), eager, 200 calls back to back */
	{
		double t0 = now_s();
		for (int k = 0; k < 200; k++)
			for (int r = 0; r < T; r++) {
				kcuda_device_set(dev[r]);
				(void)kcuda_ar_sum(ar, r, b[r].user, 6144);
			}
		OPS_CHECK(wait_all(T) == 0, "%s: timing wait", what);
		calls += 200;
		printf("%s: %d calls checked; 6144 floats: %.2f us per all-reduce (eager, back to back)\n",
		       what, calls, (now_s() - t0) * 1e6 / 200);
	}
	for (int r = 0; r < T; r++)
		OPS_CHECK(kcuda_ar_errors(ar, r) == 0, "%s: rank %d counted %u timeouts", what, r,
		          kcuda_ar_errors(ar, r));
	for (int r = 0; r < T; r++) {
		kcuda_device_set(dev[r]);
		ops_dbuf_fini(&b[r]);
		free(x[r]);
	}
	free(got);
	free(want);
	kcuda_ar_destroy(ar);
}

/* a rank whose peer never calls: the kernel gives up at its deadline and counts it */
static void test_timeout(void)
{
	struct kcuda_ar *ar = NULL;
	char why[256];
	int rc = kcuda_ar_create(2, ctx, 1024, 0.05, &ar, why, sizeof(why));
	OPS_CHECK(rc == 0, "timeout: create rc %d: %s", rc, why);
	if (rc)
		return;
	struct ops_dbuf b = {0};
	kcuda_device_set(dev[0]);
	OPS_CHECK(ops_dbuf_init(ctx[0], &b, 4096) == 0, "timeout: alloc");
	double t0 = now_s();
	OPS_CHECK(kcuda_ar_sum(ar, 0, b.user, 1024) == 0, "timeout: launch");
	OPS_CHECK(kcuda_ctx_wait(ctx[0], 20.0) == 0, "timeout: the lone rank did not return");
	double dt = now_s() - t0;
	OPS_CHECK(kcuda_ar_errors(ar, 0) >= 1, "timeout: not counted (%u)", kcuda_ar_errors(ar, 0));
	OPS_CHECK(dt < 5.0, "timeout: took %.2f s for a 0.05 s deadline", dt);
	/* bad arguments */
	OPS_CHECK(kcuda_ar_sum(ar, 0, b.user, 1025) == -EINVAL, "n past max_floats accepted");
	OPS_CHECK(kcuda_ar_sum(ar, 2, b.user, 16) == -EINVAL, "rank 2 of 2 accepted");
	OPS_CHECK(kcuda_ar_sum(ar, 0, NULL, 16) == -EINVAL, "null buffer accepted");
	ops_dbuf_fini(&b);
	kcuda_ar_destroy(ar);
	struct kcuda_ar *bad = NULL;
	OPS_CHECK(kcuda_ar_create(9, ctx, 1024, 1.0, &bad, why, sizeof(why)) == -EINVAL && !bad,
	          "9 ranks accepted");
	OPS_CHECK(kcuda_ar_create(2, ctx, 0, 1.0, &bad, why, sizeof(why)) == -EINVAL && !bad,
	          "0 floats accepted");
}

int main(void)
{
	int ngpu = kcuda_device_count();
	if (ngpu < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	for (int r = 0; r < MAXR; r++) {
		dev[r] = 0;
		if (kcuda_ctx_create(0, 1u << 20, &ctx[r])) {
			printf("FAIL: context %d on GPU 0\n", r);
			return 1;
		}
	}
	static const int Ts[] = {2, 3, 4, 8};
	for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "T=%d on GPU 0", Ts[i]);
		run_group(Ts[i], what);
	}
	test_timeout();
	for (int r = 0; r < MAXR; r++)
		kcuda_ctx_destroy(ctx[r]);
	if (ngpu >= 2) {
		int T = ngpu < MAXR ? ngpu : MAXR;
		for (int r = 0; r < T; r++) {
			dev[r] = r;
			kcuda_device_set(r);
			if (kcuda_ctx_create(r, 1u << 20, &ctx[r])) {
				printf("FAIL: context on GPU %d\n", r);
				return 1;
			}
		}
		char what[64];
		snprintf(what, sizeof(what), "T=%d over %d GPUs", T, T);
		run_group(T, what);
		for (int r = 0; r < T; r++)
			kcuda_ctx_destroy(ctx[r]);
	}
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
