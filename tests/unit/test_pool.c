/* Tests of the thread pool (kernels/cpu/pool.c): every index of [0, n) runs exactly once for a
 * sweep of n, grain and thread counts; chunks are contiguous and at least `grain` long; thread
 * indices are in range and never run two chunks at the same time; many back-to-back calls (the
 * decode pattern) and several pools used concurrently from different threads; per-thread scratch.
 * Prints the measured overhead of one kpool_for call. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static int n_fail;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

struct cover {
	_Atomic int *hits;
	int64_t grain, n;
	int n_threads;
	_Atomic int busy[64]; /* per thread index: calls in flight */
	_Atomic int bad_chunk, bad_thread, overlap;
};

static void cover_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	struct cover *c = u;

	if (thread < 0 || thread >= c->n_threads) {
		atomic_fetch_add(&c->bad_thread, 1);
		return;
	}
	if (atomic_fetch_add(&c->busy[thread], 1) != 0)
		atomic_fetch_add(&c->overlap, 1);
	if (i1 <= i0 || (i1 - i0 < c->grain && !(i0 == 0 && i1 == c->n)))
		atomic_fetch_add(&c->bad_chunk, 1);
	for (int64_t i = i0; i < i1; i++)
		atomic_fetch_add(&c->hits[i], 1);
	atomic_fetch_sub(&c->busy[thread], 1);
}

static void test_cover(struct kpool *p, int n_threads)
{
	static const int64_t ns[] = {1, 2, 3, 7, 8, 31, 32, 33, 100, 1000, 4097, 65536};
	static const int64_t grains[] = {1, 2, 5, 16, 1000, 100000};
	_Atomic int *hits = calloc(65536, sizeof *hits);

	for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
		for (size_t b = 0; b < sizeof grains / sizeof grains[0]; b++) {
			struct cover c = {
			    .hits = hits, .grain = grains[b], .n = ns[a], .n_threads = n_threads};
			for (int64_t i = 0; i < ns[a]; i++)
				atomic_store(&hits[i], 0);
			kpool_for(p, ns[a], grains[b], cover_cb, &c);
			int wrong = 0;
			for (int64_t i = 0; i < ns[a]; i++)
				wrong += atomic_load(&hits[i]) != 1;
			CHECK(wrong == 0,
			      "threads %d n %" PRId64 " grain %" PRId64 ": %d indices not run once",
			      n_threads, ns[a], grains[b], wrong);
			CHECK(c.bad_chunk == 0 && c.bad_thread == 0 && c.overlap == 0,
			      "threads %d n %" PRId64 " grain %" PRId64
			      ": %d short chunks, %d bad thread ids, %d overlaps",
			      n_threads, ns[a], grains[b], (int)c.bad_chunk, (int)c.bad_thread,
			      (int)c.overlap);
		}
	}
	free(hits);
}

struct sum {
	_Atomic int64_t total;
};

static void sum_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	struct sum *s = u;
	int64_t acc = 0;

	(void)thread;
	for (int64_t i = i0; i < i1; i++)
		acc += i;
	atomic_fetch_add(&s->total, acc);
}

static void noop_cb(void *u, int64_t i0, int64_t i1, int thread)
{
	(void)u;
	(void)i0;
	(void)i1;
	(void)thread;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* back-to-back calls, checking every result */
static int hammer(struct kpool *p, int iters)
{
	int bad = 0;

	for (int k = 0; k < iters; k++) {
		int64_t n = 1 + k % 300;
		struct sum s = {0};
		kpool_for(p, n, 1 + k % 7, sum_cb, &s);
		bad += atomic_load(&s.total) != n * (n - 1) / 2;
	}
	return bad;
}

struct pool_thread {
	struct kpool *p;
	int bad;
};

static void *pool_thread_main(void *u)
{
	struct pool_thread *t = u;
	t->bad = hammer(t->p, 20000);
	return NULL;
}

/* scratch without a pool: two buffers per thread, distinct, freed at thread exit (the ASan
 * build's leak check would report them otherwise) */
static void *solo_thread_main(void *u)
{
	int *ok = u;
	char *a = kpool_scratch(NULL, 0, 1000), *b = kpool_scratch(NULL, 1, 2000);
	*ok = a && b && a != b && kpool_scratch(NULL, 2, 10) == NULL && kpool_scratch(NULL, -1, 10) == NULL;
	if (*ok) {
		memset(a, 1, 1000);
		memset(b, 2, 2000);
		*ok = kpool_scratch(NULL, 0, 10) == a; /* kept */
	}
	return NULL;
}

int main(void)
{
	int thread_counts[] = {1, 2, 3, 4, 8};

	CHECK(kpool_create(0) == NULL, "0 threads accepted");
	kpool_destroy(NULL);
	for (size_t i = 0; i < sizeof thread_counts / sizeof thread_counts[0]; i++) {
		int nt = thread_counts[i];
		struct kpool *p = kpool_create(nt);
		CHECK(p != NULL, "create %d", nt);
		if (!p)
			continue;
		CHECK(kpool_n_threads(p) == nt, "n_threads");
		test_cover(p, nt);
		int bad = hammer(p, 50000);
		CHECK(bad == 0, "threads %d: %d of 50000 back-to-back calls wrong", nt, bad);
		/* scratch: per thread, kept, grown */
		char *s0 = kpool_scratch(p, 0, 100);
		CHECK(s0 && ((uintptr_t)s0 & 63) == 0, "scratch aligned");
		memset(s0, 1, 100);
		CHECK(kpool_scratch(p, 0, 50) == s0, "scratch kept when smaller");
		char *s1 = kpool_scratch(p, nt - 1, 1 << 20);
		CHECK(s1 != NULL, "scratch grows");
		if (s1)
			memset(s1, 2, 1 << 20);
		kpool_destroy(p);
	}
	for (int k = 0; k < 4; k++) {
		pthread_t th1;
		int ok = 0;
		pthread_create(&th1, NULL, solo_thread_main, &ok);
		pthread_join(th1, NULL);
		CHECK(ok, "scratch without a pool");
	}
	/* NULL pool runs inline */
	struct sum s = {0};
	kpool_for(NULL, 1000, 1, sum_cb, &s);
	CHECK(atomic_load(&s.total) == 999 * 1000 / 2, "NULL pool");

	/* several pools at once, each driven by its own thread */
	struct kpool *pools[3];
	pthread_t th[3];
	struct pool_thread pt[3];
	for (int i = 0; i < 3; i++) {
		pools[i] = kpool_create(2);
		pt[i] = (struct pool_thread){.p = pools[i]};
		pthread_create(&th[i], NULL, pool_thread_main, &pt[i]);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		CHECK(pt[i].bad == 0, "concurrent pool %d: %d wrong", i, pt[i].bad);
		kpool_destroy(pools[i]);
	}

	/* overhead of one kpool_for call (trivial body, n = 64, grain 1): rounds of 5000 back-to-back
	 * calls; the best round is the cost without preemption (the test machine is shared), the
	 * median what a loaded machine gives */
	for (int nt = 1; nt <= 2; nt++) {
		struct kpool *p = kpool_create(nt);
		double r[21];
		for (int k = 0; k < 1000; k++)
			kpool_for(p, 64, 1, noop_cb, NULL);
		for (int round = 0; round < 21; round++) {
			double t0 = now_s();
			for (int k = 0; k < 5000; k++)
				kpool_for(p, 64, 1, noop_cb, NULL);
			r[round] = 1e6 * (now_s() - t0) / 5000;
		}
		for (int a = 0; a < 21; a++) /* sort */
			for (int b = a + 1; b < 21; b++)
				if (r[b] < r[a]) {
					double t = r[a];
					r[a] = r[b];
					r[b] = t;
				}
		printf("kpool_for overhead, %d thread(s): best %.3f us, median %.3f us per call (21 x 5000 "
		       "calls)\n",
		       nt, r[0], r[10]);
		/* a call after the workers went to sleep (idle 1 ms > spin time): futex wake-up;
		 * the call must still be correct */
		double wake[21];
		for (int k = 0; k < 21; k++) {
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
			struct sum s2 = {0};
			double t0 = now_s();
			kpool_for(p, 1000, 1, sum_cb, &s2);
			wake[k] = 1e6 * (now_s() - t0);
			CHECK(atomic_load(&s2.total) == 999 * 1000 / 2, "call after idle");
		}
		for (int a = 0; a < 21; a++)
			for (int b = a + 1; b < 21; b++)
				if (wake[b] < wake[a]) {
					double t = wake[a];
					wake[a] = wake[b];
					wake[b] = t;
				}
		printf("kpool_for after 1 ms idle, %d thread(s): best %.2f us, median %.2f us\n", nt, wake[0],
		       wake[10]);
		kpool_destroy(p);
	}
	printf("%s: %d failures\n", n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
