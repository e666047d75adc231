/* kcuda_topk and kcuda_sample against the CPU on seeded random scores with many ties, NaN and
 * -inf: top-k must equal kcpu_topk exactly (score desc, ties to the lower index, NaN as -inf), in
 * ascending index order, for n in {1, 31, 33, 4097, 154880} and k from 1 to n + 5;
 * greedy sampling must equal the reference argmax; top-k sampling over 1000 copies of a row with
 * u = (i + 0.5) / 1000 must pick each candidate as often as its probability says (within 1 of the
 * double-precision count). Exit 77 = no GPU (skip). */
#include <errno.h>

#include "common/base/err.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else

static struct kcuda_ctx *ctx;
static const float *cmp_s;

/* better first: higher score (NaN as -inf), then lower index */
static int better(const float *s, int a, int b)
{
	const float x = isnan(s[a]) ? -INFINITY : s[a], y = isnan(s[b]) ? -INFINITY : s[b];
	if (x != y)
		return x > y;
	return a < b;
}
static int cmp_rank(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	return better(cmp_s, i, j) ? -1 : (better(cmp_s, j, i) ? 1 : 0);
}

static void fill_scores(float *s, int64_t n, int levels)
{
	for (int64_t i = 0; i < n; i++) {
		float v = ops_rng_unif() * 10.0f;
		if (levels)
			v = floorf(v * levels) / levels; /* many exact ties */
		uint64_t r = ops_rng_next() % 1000;
		if (r == 0)
			v = NAN;
		else if (r == 1)
			v = -INFINITY;
		s[i] = v;
	}
}

static void test_topk(void)
{
	static const int64_t ns[] = {1, 31, 33, 4097, 154880};
	static const int ks[] = {1, 8, 50, 2048, 5000};
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		const int64_t n = ns[ni], rows = 3, ld = n + 7;
		float *s = malloc(sizeof(float) * ld * rows);
		fill_scores(s, ld * rows, ni & 1 ? 4 : 0);
		struct ops_dbuf sb = {0};
		if (ops_dbuf_init(ctx, &sb, sizeof(float) * ld * rows) ||
		    kcuda_upload(ctx, sb.user, s, sb.bytes)) {
			OPS_CHECK(0, "topk setup");
			free(s);
			continue;
		}
		for (size_t ki = 0; ki <= sizeof(ks) / sizeof(ks[0]); ki++) {
			const int k = ki < sizeof(ks) / sizeof(ks[0]) ? ks[ki] : (int)n + 5;
			const int kk = k < n ? k : (int)n;
			const int64_t ldo = kk + 1;
			int32_t *out = malloc(sizeof(int32_t) * ldo * rows);
			int32_t *idx = malloc(sizeof(int32_t) * n);
			struct ops_dbuf ob = {0};
			if (ops_dbuf_init(ctx, &ob, sizeof(int32_t) * ldo * rows)) {
				OPS_CHECK(0, "topk out alloc");
				goto next;
			}
			int rc = kcuda_topk(ctx, sb.user, ld, n, rows, k, ob.user, ldo);
			OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "topk rc %d", rc);
			OPS_CHECK(ops_dbuf_get(ctx, &ob, out) == 0, "topk guard damaged");
			int bad = 0;
			for (int64_t r = 0; r < rows; r++) {
				const int got = kcpu_topk(s + r * ld, (int)n, k, idx); /* the CPU op */
				bad += got != kk;
				for (int i = 0; i < kk; i++)
					bad += out[r * ldo + i] != idx[i];
				uint32_t gap;
				memcpy(&gap, &out[r * ldo + kk], 4);
				bad += gap != 0xA5A5A5A5u;
			}
			OPS_CHECK(bad == 0, "topk n=%" PRId64 " k=%d: %d mismatches", n, k, bad);
			printf("topk n %6" PRId64 " k %5d %s\n", n, k, bad ? "FAIL" : "ok");
		next:
			ops_dbuf_fini(&ob);
			free(out);
			free(idx);
		}
		ops_dbuf_fini(&sb);
		free(s);
	}
	OPS_CHECK(kcuda_topk(ctx, (float *)16, 10, 10, 1, 0, (int32_t *)16, 10) == -EINVAL, "k = 0 accepted");
	OPS_CHECK(kcuda_topk(ctx, (float *)16, 9, 10, 1, 3, (int32_t *)16, 10) == -EINVAL, "ld < n accepted");
}

static void test_greedy(void)
{
	static const int64_t ns[] = {1, 33, 4097, 154880, 129280};
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		const int64_t n = ns[ni], rows = 5, ld = n + 1;
		float *s = malloc(sizeof(float) * ld * rows);
		int32_t out[5];
		fill_scores(s, ld * rows, ni & 1 ? 2 : 0);
		for (int64_t i = 0; i < n; i++) /* row 4: all NaN (ties at -inf) -> id 0 */
			s[4 * ld + i] = NAN;
		s[3 * ld + n - 1] = NAN; /* a NaN never beats a number */
		struct ops_dbuf sb = {0}, ob = {0};
		if (ops_dbuf_init(ctx, &sb, sizeof(float) * ld * rows) ||
		    kcuda_upload(ctx, sb.user, s, sb.bytes) || ops_dbuf_init(ctx, &ob, sizeof(out))) {
			OPS_CHECK(0, "greedy setup");
			goto next;
		}
		int rc = kcuda_sample(ctx, sb.user, ld, n, rows, 0, 0.0f, NULL, ob.user);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "greedy rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &ob, out) == 0, "greedy guard damaged");
		for (int64_t r = 0; r < rows; r++) {
			int32_t best = 0;
			kcpu_topk(s + r * ld, (int)n, 1, &best); /* greedy = top-1 of the CPU op */
			OPS_CHECK(out[r] == best, "greedy n=%" PRId64 " row %" PRId64 ": got %d want %d", n,
			          r, out[r], best);
		}
		printf("greedy n %6" PRId64 " ok\n", n);
	next:
		ops_dbuf_fini(&sb);
		ops_dbuf_fini(&ob);
		free(s);
	}
}

static void test_sample_topk(void)
{
	const int64_t n = 154880, rows = 1000;
	const int ks[] = {2, 4, 40};
	const float temps[] = {1.0f, 0.7f, 1.5f};
	float *row = malloc(sizeof(float) * n), *s = malloc(sizeof(float) * n * rows), u[1000];
	int32_t *out = malloc(sizeof(int32_t) * rows);
	for (int64_t i = 0; i < n; i++)
		row[i] = ops_rng_unif() * 3.0f;
	row[77] = 4.0f, row[5000] = 4.0f, row[123] = 3.9f; /* a tie at the top */
	for (int64_t r = 0; r < rows; r++) {
		memcpy(s + r * n, row, sizeof(float) * n);
		u[r] = ((float)r + 0.5f) / (float)rows;
	}
	struct ops_dbuf sb = {0}, ub = {0}, ob = {0};
	if (ops_dbuf_init(ctx, &sb, sizeof(float) * n * rows) || kcuda_upload(ctx, sb.user, s, sb.bytes) ||
	    ops_dbuf_init(ctx, &ub, sizeof(u)) || kcuda_upload(ctx, ub.user, u, sizeof(u)) ||
	    ops_dbuf_init(ctx, &ob, sizeof(int32_t) * rows)) {
		OPS_CHECK(0, "sample setup");
		goto out;
	}
	for (size_t ki = 0; ki < 3; ki++) {
		const int k = ks[ki];
		int rc = kcuda_sample(ctx, sb.user, n, n, rows, k, temps[ki], ub.user, ob.user);
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "sample rc %d", rc);
		OPS_CHECK(ops_dbuf_get(ctx, &ob, out) == 0, "sample guard damaged");
		/* reference: candidates in rank order, probabilities in double, expected counts */
		int *idx = malloc(sizeof(int) * n);
		for (int64_t i = 0; i < n; i++)
			idx[i] = (int)i;
		cmp_s = row;
		qsort(idx, n, sizeof(int), cmp_rank);
		double p[64], tot = 0;
		for (int j = 0; j < k; j++)
			tot += (p[j] = exp(((double)row[idx[j]] - row[idx[0]]) / temps[ki]));
		int bad = 0;
		double cum = 0;
		for (int j = 0; j < k; j++) {
			const double lo = cum / tot;
			cum += p[j];
			const double hi = cum / tot;
			int want = 0, got = 0;
			for (int64_t r = 0; r < rows; r++) {
				const double uu = ((double)r + 0.5) / rows;
				want += uu >= lo && uu < hi;
				got += out[r] == idx[j];
			}
			if (abs(want - got) > 1) {
				bad++;
				printf("  k %d cand %d (id %d): picked %d times, want %d\n", k, j, idx[j],
				       got, want);
			}
		}
		for (int64_t r = 0; r < rows; r++) { /* every pick is one of the k candidates */
			int ok = 0;
			for (int j = 0; j < k; j++)
				ok |= out[r] == idx[j];
			bad += !ok;
		}
		OPS_CHECK(bad == 0, "top-k sampling k=%d temp=%.2f: %d mismatches", k, temps[ki], bad);
		printf("sample top-k k %2d temp %.2f %s\n", k, temps[ki], bad ? "FAIL" : "ok");
		free(idx);
	}
	OPS_CHECK(kcuda_sample(ctx, sb.user, n, n, 1, 2000, 1.0f, ub.user, ob.user) == -EINVAL,
	          "k > 1024 accepted");
	OPS_CHECK(kcuda_sample(ctx, sb.user, n, n, 1, 4, 1.0f, NULL, ob.user) == -EINVAL,
	          "sampling without u accepted");
out:
	ops_dbuf_fini(&sb);
	ops_dbuf_fini(&ub);
	ops_dbuf_fini(&ob);
	free(row);
	free(s);
	free(out);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	if (kcuda_ctx_create(0, 16u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	test_topk();
	test_greedy();
	test_sample_topk();
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
