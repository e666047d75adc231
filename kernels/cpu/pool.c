/* Thread pool for the CPU backend: n_threads - 1 workers plus the calling thread run one
 * parallel-for at a time (kpool_for). Built for many small parallel-fors (a decode step issues
 * hundreds): workers spin briefly on the job generation before sleeping on a futex, and the
 * caller never waits for a worker that has not started: chunks are claimed with a CAS on a
 * counter tagged with the job's generation, so a worker that wakes late (or was descheduled on an
 * oversubscribed machine) finds the counter moved on and claims nothing. The caller only waits for
 * chunks that were actually claimed.
 *
 *   caller: write job slot (gen & 1), done = 0, ctr = gen << 32, publish gen, wake sleepers,
 *           claim chunks itself, then wait until done == n_chunks.
 *   worker: wait for gen != seen (spin, then futex), copy the job slot, claim (CAS on ctr, which
 *           fails if the generation moved on), run, done += 1, repeat until no chunk is left.
 *
 * A stale worker may read a job slot while the caller rewrites it for a later job, but its CAS
 * then fails (the counter carries the later generation), so it never runs what it read (the
 * slot's fields are relaxed atomics so that this read is not a data race). Several pools may
 * exist at once (one per CPU TP rank); they share nothing. */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "kernels/kernels.h"

/* How long an idle worker spins before sleeping: long enough to bridge the gaps between the
 * kpool_for calls of one decode step (microseconds), short enough not to burn a core between
 * requests or on an oversubscribed machine. Timed with the clock because the cost of a pause
 * instruction differs 10x between CPUs (about 10 ns on the test machine). */
#define SPIN_NS 100000
#define CHUNKS_PER_THREAD 4

/* A job slot. Its fields are atomics (relaxed) only because a stale worker may read a slot
 * while the caller rewrites it for a later job; such a worker's CAS then fails, so what it read
 * is never used, but the read must not be a data race. */
struct job_slot {
	_Atomic(kpool_fn) fn;
	_Atomic(void *) user;
	_Atomic int64_t n;
	_Atomic int64_t n_chunks;
};

struct job {
	kpool_fn fn;
	void *user;
	int64_t n;
	int64_t n_chunks;
};

struct scratch {
	void *p;
	size_t size;
} __attribute__((aligned(64)));

struct kpool {
	int n_threads;
	pthread_t *threads;
	struct scratch *scratch; /* per thread, grown by kpool_scratch */
	struct job_slot jobs[2];
	_Alignas(64) _Atomic uint64_t ctr; /* gen << 32 | next chunk */
	_Alignas(64) _Atomic uint32_t gen; /* futex word: last published job */
	_Atomic int sleepers;
	_Atomic bool stop;
	_Alignas(64) _Atomic int64_t done; /* chunks finished in the current job */
};

struct worker_arg {
	struct kpool *p;
	int index;
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static inline void chunk_range(const struct job *j, int64_t c, int64_t *i0, int64_t *i1)
{
	/* n * c fits: n < 2^62 in practice; chunk counts are small */
	*i0 = (int64_t)((__int128)j->n * c / j->n_chunks);
	*i1 = (int64_t)((__int128)j->n * (c + 1) / j->n_chunks);
}

/* Claims and runs chunks of job generation g until none is left or the job is no longer
 * current. */
static void run_chunks(struct kpool *p, const struct job *j, uint32_t g, int thread)
{
	uint64_t c = atomic_load_explicit(&p->ctr, memory_order_acquire);

	for (;;) {
		if ((uint32_t)(c >> 32) != g || (int64_t)(uint32_t)c >= j->n_chunks)
			return;
		if (!atomic_compare_exchange_weak_explicit(&p->ctr, &c, c + 1, memory_order_acq_rel,
		                                           memory_order_acquire))
			continue;
		int64_t i0, i1;
		chunk_range(j, (int64_t)(uint32_t)c, &i0, &i1);
		j->fn(j->user, i0, i1, thread);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
		c = atomic_load_explicit(&p->ctr, memory_order_acquire);
	}
}

static void read_slot(struct job_slot *s, struct job *j)
{
	j->fn = atomic_load_explicit(&s->fn, memory_order_relaxed);
	j->user = atomic_load_explicit(&s->user, memory_order_relaxed);
	j->n = atomic_load_explicit(&s->n, memory_order_relaxed);
	j->n_chunks = atomic_load_explicit(&s->n_chunks, memory_order_relaxed);
}

static void *worker_main(void *argp)
{
	struct worker_arg *a = argp;
	struct kpool *p = a->p;
	int index = a->index;
	uint32_t seen = atomic_load(&p->gen);

	free(a);
	for (;;) {
		uint32_t g;
		int spins = 0;
		int64_t spin_start = now_ns();
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
			if (atomic_load_explicit(&p->stop, memory_order_relaxed))
				return NULL;
			if ((++spins & 255) != 0 || now_ns() - spin_start < SPIN_NS) {
				cpu_relax();
				continue;
			}
			atomic_fetch_add(&p->sleepers, 1);
			/* re-checked by the kernel: returns at once if gen already moved on */
			if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
				futex(&p->gen, FUTEX_WAIT_PRIVATE, seen);
			atomic_fetch_sub(&p->sleepers, 1);
			spins = 0;
			spin_start = now_ns();
		}
		if (atomic_load_explicit(&p->stop, memory_order_relaxed))
			return NULL;
		seen = g;
		struct job j;
		read_slot(&p->jobs[g & 1], &j);
		run_chunks(p, &j, g, index);
	}
}

struct kpool *kpool_create(int n_threads)
{
	if (n_threads < 1)
		return NULL;
	struct kpool *p = aligned_alloc(64, sizeof *p);
	if (!p)
		return NULL;
	memset(p, 0, sizeof *p);
	p->n_threads = n_threads;
	/* one scratch per thread plus one for the caller's own use between calls */
	p->scratch = aligned_alloc(64, sizeof(struct scratch) * (size_t)(n_threads + 1));
	p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
	if (!p->scratch || !p->threads)
		goto fail_alloc;
	memset(p->scratch, 0, sizeof(struct scratch) * (size_t)(n_threads + 1));
	atomic_init(&p->ctr, 0);
	atomic_init(&p->gen, 0);
	atomic_init(&p->sleepers, 0);
	atomic_init(&p->stop, false);
	atomic_init(&p->done, 0);

	int started = 1;
	for (; started < n_threads; started++) {
		struct worker_arg *a = malloc(sizeof *a);
		if (!a)
			goto fail_threads;
		a->p = p;
		a->index = started;
		if (pthread_create(&p->threads[started], NULL, worker_main, a) != 0) {
			free(a);
			goto fail_threads;
		}
	}
	return p;

fail_threads:
	p->n_threads = started; /* only the threads that exist get joined */
	kpool_destroy(p);
	return NULL;
fail_alloc:
	free(p->threads);
	free(p->scratch);
	free(p);
	return NULL;
}

void kpool_destroy(struct kpool *p)
{
	if (!p)
		return;
	atomic_store(&p->stop, true);
	atomic_fetch_add(&p->gen, 1);
	futex(&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
	for (int i = 1; i < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	for (int i = 0; i <= p->n_threads; i++)
		free(p->scratch[i].p);
	free(p->scratch);
	free(p->threads);
	free(p);
}

int kpool_n_threads(const struct kpool *p)
{
	return p ? p->n_threads : 1;
}

void kpool_for(struct kpool *p, int64_t n, int64_t grain, kpool_fn fn, void *user)
{
	if (n <= 0)
		return;
	if (grain < 1)
		grain = 1;
	int64_t n_chunks = n / grain; /* floor: every chunk gets at least `grain` items */
	int64_t cap = p ? (int64_t)p->n_threads * CHUNKS_PER_THREAD : 1;
	if (n_chunks > cap)
		n_chunks = cap;
	if (!p || p->n_threads == 1 || n_chunks <= 1) {
		fn(user, 0, n, 0);
		return;
	}

	uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
	struct job_slot *slot = &p->jobs[g & 1];
	atomic_store_explicit(&slot->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&slot->user, user, memory_order_relaxed);
	atomic_store_explicit(&slot->n, n, memory_order_relaxed);
	atomic_store_explicit(&slot->n_chunks, n_chunks, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store_explicit(&p->ctr, (uint64_t)g << 32, memory_order_release);
	atomic_store(&p->gen, g); /* seq_cst: ordered before the sleepers check below */
	if (atomic_load(&p->sleepers) > 0)
		futex(&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);

	struct job mine = {.fn = fn, .user = user, .n = n, .n_chunks = n_chunks};
	run_chunks(p, &mine, g, 0);
	int spins = 0;
	while (atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks) {
		/* only claimed chunks are outstanding and their workers are running; yield if one
		 * of them got descheduled so it can finish on this core */
		if (++spins < 4096)
			cpu_relax();
		else
			sched_yield();
	}
}

/* Scratch of threads that call kernels without a pool (p == NULL): two buffers per thread, kept
 * in a thread-specific slot whose destructor frees them when the thread exits. */
static pthread_key_t solo_key;
static pthread_once_t solo_once = PTHREAD_ONCE_INIT;

static void solo_free(void *v)
{
	struct scratch *s = v;

	free(s[0].p);
	free(s[1].p);
	free(s);
}

static void solo_init(void)
{
	if (pthread_key_create(&solo_key, solo_free) != 0)
		abort(); /* only fails when the process is out of keys: a broken invariant */
}

static struct scratch *solo_scratch(void)
{
	pthread_once(&solo_once, solo_init);
	struct scratch *s = pthread_getspecific(solo_key);
	if (!s) {
		s = calloc(2, sizeof *s);
		if (s && pthread_setspecific(solo_key, s) != 0) {
			free(s);
			s = NULL;
		}
	}
	return s;
}

void *kpool_scratch(struct kpool *p, int thread, size_t bytes)
{
	int n = p ? p->n_threads : 1;

	if (thread < 0 || thread > n)
		return NULL;
	struct scratch *s = p ? &p->scratch[thread] : solo_scratch();
	if (!s)
		return NULL;
	if (!p)
		s += thread;
	if (s->size < bytes) {
		size_t size = (bytes + 4095) & ~(size_t)4095;
		void *q = aligned_alloc(64, size);
		if (!q)
			return NULL;
		free(s->p);
		s->p = q;
		s->size = size;
	}
	return s->p;
}
