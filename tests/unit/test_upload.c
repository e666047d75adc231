/* Tests of the threaded weight copier (common/model/upload.c) with the host sink: pieces of every
 * shape (empty, 1 byte, around the buffer size, many buffers, row slices, rows wider than a
 * buffer; from a mapped file and from plain memory) land exactly where they should with 1..8
 * threads and 1..3 buffers per thread, read with pread() or from the mapping, with guard bytes
 * around every destination; the progress callback counts up to the exact total; copies merge
 * within one allocation and never across two; a failing copy in one thread stops the others and
 * names the tensor; a file truncated after it was mapped is a clean error on both read paths
 * (short pread, SIGBUS on the mapping) and the SIGBUS handler is removed afterwards. Prints the
 * seed. */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/model/upload.h"

static int n_fail, n_check;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		n_check++;                                                                                   \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

static uint64_t rng_state;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* a temporary file of n random bytes, mapped read-only and private like gguf_open does */
struct tfile {
	char path[64];
	int fd;
	char *map;
	size_t size;
};

static int tfile_make(struct tfile *t, size_t n)
{
	snprintf(t->path, sizeof(t->path), "/tmp/test_upload_XXXXXX");
	t->fd = mkstemp(t->path);
	if (t->fd < 0)
		return -1;
	char *b = malloc(n);
	if (!b)
		return -1;
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(rnd() >> 24);
	size_t w = 0;
	while (w < n) {
		ssize_t k = write(t->fd, b + w, n - w);
		if (k <= 0) {
			free(b);
			return -1;
		}
		w += (size_t)k;
	}
	free(b);
	t->map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, t->fd, 0);
	t->size = n;
	return t->map == MAP_FAILED ? -1 : 0;
}

static void tfile_drop(struct tfile *t)
{
	munmap(t->map, t->size);
	close(t->fd);
	unlink(t->path);
}

struct prog {
	uint64_t last_done, total;
	int calls, lasts, backwards;
};

/* names: "T<i>" for the i-th 1 MiB of the file, so errors can be checked to name the right one;
 * the copy threads call name_cb concurrently: the strings are constant */
struct names {
	const struct tfile *f;
	struct prog pr; /* the same user pointer goes to the progress callback */
};

static void prog_cb(void *user, uint64_t done, uint64_t total, bool last)
{
	struct prog *p = &((struct names *)user)->pr;
	if (done < p->last_done)
		p->backwards++;
	p->last_done = done;
	p->total = total;
	p->calls++;
	p->lasts += last;
}

static const char *const tnames[] = {"T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7"};

static const char *name_cb(void *user, const void *src, size_t *off)
{
	struct names *n = user;
	const char *s = src;
	if (s < n->f->map || s >= n->f->map + n->f->size || (size_t)(s - n->f->map) >> 20 >= 8)
		return NULL;
	size_t at = (size_t)(s - n->f->map);
	*off = at & ((1u << 20) - 1);
	return tnames[at >> 20];
}

#define GUARD 64
#define GUARD_BYTE 0xA5

struct piece_spec {
	bool from_file;
	size_t src_off, stride, rb, n;
	size_t dst_off; /* in the destination arena */
};

/* one randomized plan: pieces from the file and from heap memory into one destination arena with
 * GUARD bytes around each piece */
static void test_exact(const struct tfile *f, int n_threads, int n_bufs, bool no_pread, size_t buf_bytes)
{
	enum { N_PIECES = 40 };
	size_t heap_n = (size_t)3 << 20;
	char *heap = malloc(heap_n);
	for (size_t i = 0; i < heap_n; i++)
		heap[i] = (char)rnd();
	struct piece_spec ps[N_PIECES];
	size_t arena_n = 0;
	for (int i = 0; i < N_PIECES; i++) {
		struct piece_spec *s = &ps[i];
		s->from_file = (i % 3) != 0;
		size_t lim = s->from_file ? f->size : heap_n;
		switch (i % 8) {
		case 0: s->rb = 0, s->n = 1; break; /* empty */
		case 1: s->rb = 1, s->n = 1; break;
		case 2: s->rb = buf_bytes - 1 - rnd() % 3, s->n = 1; break; /* around one buffer */
		case 3: s->rb = buf_bytes + rnd() % 3, s->n = 1; break;
		case 4: s->rb = 3 * buf_bytes + 7, s->n = 1; break; /* many buffers */
		case 5: s->rb = 144, s->n = 1 + rnd() % 700; break; /* a TP column slice of Q4_K rows */
		case 6: s->rb = buf_bytes + 100, s->n = 3; break; /* slice rows wider than a buffer */
		default: s->rb = 1 + rnd() % 5000, s->n = 1 + rnd() % 9; break;
		}
		s->stride = (i % 8 >= 5) ? s->rb * (1 + rnd() % 8) + rnd() % 17 : s->rb;
		if (s->n == 1)
			s->stride = s->rb;
		size_t span = s->n ? (s->n - 1) * s->stride + s->rb : 0;
		if (span > lim) { /* keep inside the source */
			s->n = 1;
			s->stride = s->rb = lim / 4;
			span = s->rb;
		}
		s->src_off = lim - span ? rnd() % (lim - span) : 0;
		arena_n += GUARD;
		s->dst_off = arena_n;
		arena_n += s->rb * s->n;
	}
	arena_n += GUARD;
	char *arena = malloc(arena_n);
	memset(arena, GUARD_BYTE, arena_n);
	struct upload_plan *p = NULL;
	CHECK(upload_plan_create(buf_bytes, &p) == 0, "plan_create");
	uint64_t want_total = 0;
	for (int i = 0; i < N_PIECES; i++) {
		struct piece_spec *s = &ps[i];
		const char *src = (s->from_file ? f->map : heap) + s->src_off;
		upload_plan_new_dst(p); /* one allocation per piece: the guards sit between them */
		CHECK(upload_plan_add(p, arena + s->dst_off, src, s->stride, s->rb, s->n) == 0, "plan_add %d",
		      i);
		want_total += (uint64_t)s->rb * s->n;
	}
	CHECK(upload_plan_bytes(p) == want_total, "plan bytes %llu, want %llu",
	      (unsigned long long)upload_plan_bytes(p), (unsigned long long)want_total);
	struct upload_host_sink hs = {0};
	struct upload_sink sink;
	upload_host_sink_init(&hs, &sink);
	struct upload_file uf = {.base = f->map, .size = f->size, .path = f->path};
	struct names nm = {.f = f};
	struct prog *prp = &nm.pr;
	struct upload_opts o = {.n_threads = n_threads,
	                        .n_bufs = n_bufs,
	                        .sink = &sink,
	                        .files = &uf,
	                        .n_files = 1,
	                        .no_pread = no_pread,
	                        .progress_cb = prog_cb,
	                        .progress_every_s = 0.001,
	                        .name_cb = name_cb,
	                        .user = &nm};
	struct upload_stats st;
	struct errbuf e = {0};
	int rc = upload_run(p, &o, &st, &e);
	CHECK(rc == 0, "run (threads %d, bufs %d, no_pread %d): %d %s", n_threads, n_bufs, no_pread, rc,
	      e.msg);
	CHECK(st.bytes == want_total, "stats bytes %llu of %llu", (unsigned long long)st.bytes,
	      (unsigned long long)want_total);
	CHECK(st.batches == upload_plan_batches(p), "batches %lld of %lld", (long long)st.batches,
	      (long long)upload_plan_batches(p));
	CHECK(prp->lasts == 1 && prp->last_done == want_total && prp->total == want_total &&
	          prp->backwards == 0,
	      "progress: %d last calls, last done %llu of %llu, %d steps backwards", prp->lasts,
	      (unsigned long long)prp->last_done, (unsigned long long)prp->total, prp->backwards);
	CHECK(atomic_load(&hs.n_copies) == st.copies, "sink saw %lld copies, stats %lld",
	      (long long)atomic_load(&hs.n_copies), (long long)st.copies);
	int bad = 0;
	for (int i = 0; i < N_PIECES && bad < 5; i++) {
		struct piece_spec *s = &ps[i];
		const char *src = (s->from_file ? f->map : heap) + s->src_off;
		for (size_t r = 0; r < s->n; r++)
			if (memcmp(arena + s->dst_off + r * s->rb, src + r * s->stride, s->rb) != 0) {
				bad++;
				CHECK(0, "piece %d (rb %zu n %zu stride %zu) row %zu differs", i, s->rb, s->n,
				      s->stride, r);
				break;
			}
		for (int g = 1; g <= GUARD; g++)
			if ((unsigned char)arena[s->dst_off - (size_t)g] != GUARD_BYTE) {
				bad++;
				CHECK(0, "guard byte before piece %d overwritten", i);
				break;
			}
	}
	for (int g = 0; g < GUARD; g++)
		if ((unsigned char)arena[arena_n - 1 - (size_t)g] != GUARD_BYTE) {
			CHECK(0, "guard byte after the last piece overwritten");
			break;
		}
	upload_plan_destroy(p);
	free(arena);
	free(heap);
}

/* consecutive pieces of one allocation become one copy per batch; a new allocation starts a new
 * copy even where the addresses touch */
static void test_merge(const struct tfile *f)
{
	size_t buf = 64 << 10, piece = 4096, n = 256; /* 1 MiB in 16 batches */
	char *dst = malloc(n * piece);
	for (int split = 0; split < 2; split++) {
		struct upload_plan *p = NULL;
		CHECK(upload_plan_create(buf, &p) == 0, "plan_create");
		for (size_t i = 0; i < n; i++) {
			if (split)
				upload_plan_new_dst(p);
			CHECK(upload_plan_add(p, dst + i * piece, f->map + i * piece, piece, piece, 1) == 0,
			      "add");
		}
		struct upload_host_sink hs = {0};
		struct upload_sink sink;
		upload_host_sink_init(&hs, &sink);
		struct upload_opts o = {.n_threads = 3, .n_bufs = 2, .sink = &sink};
		struct upload_stats st;
		struct errbuf e = {0};
		CHECK(upload_run(p, &o, &st, &e) == 0, "run: %s", e.msg);
		CHECK(st.batches == 16, "batches %lld, want 16", (long long)st.batches);
		CHECK(st.copies == (split ? 256 : 16), "copies %lld, want %d (split %d)",
		      (long long)st.copies, split ? 256 : 16, split);
		CHECK(memcmp(dst, f->map, n * piece) == 0, "merged data differs");
		upload_plan_destroy(p);
	}
	free(dst);
}

/* a copy that fails in one thread stops the others well before the end and names the tensor */
static void test_fail_stops(const struct tfile *f)
{
	size_t buf = 16 << 10, n = f->size; /* 4 MiB file: 256 batches */
	char *dst = malloc(n);
	struct upload_plan *p = NULL;
	CHECK(upload_plan_create(buf, &p) == 0, "plan_create");
	CHECK(upload_plan_add(p, dst, f->map, n, n, 1) == 0, "add");
	struct upload_host_sink hs = {.fail_dst = dst + (2u << 20) + 5, .delay_us = 5000};
	struct upload_sink sink;
	upload_host_sink_init(&hs, &sink);
	struct upload_file uf = {.base = f->map, .size = f->size, .path = f->path};
	struct names nm = {.f = f};
	struct upload_opts o = {.n_threads = 4,
	                        .n_bufs = 2,
	                        .sink = &sink,
	                        .files = &uf,
	                        .n_files = 1,
	                        .name_cb = name_cb,
	                        .user = &nm};
	struct upload_stats st;
	struct errbuf e = {0};
	int rc = upload_run(p, &o, &st, &e);
	CHECK(rc == -EIO, "rc %d, want -EIO", rc);
	CHECK(strstr(e.msg, "tensor T2") != NULL, "message does not name tensor T2: %s", e.msg);
	CHECK(st.batches < 220, "%lld of 256 batches ran after the failure at batch 128",
	      (long long)st.batches);
	CHECK(st.bytes < n, "bytes %zu", (size_t)st.bytes);
	printf("failure injected at batch 128 of 256 (4 threads): stopped after %lld batches: \"%s\"\n",
	       (long long)st.batches, e.msg);
	upload_plan_destroy(p);
	free(dst);
}

/* the file shrinks after it was mapped: pread sees its end, the mapping raises SIGBUS; both are
 * errors naming the tensor, and the process's SIGBUS disposition is back afterwards */
static void test_truncated(void)
{
	struct tfile f;
	size_t n = (size_t)4 << 20;
	CHECK(tfile_make(&f, n) == 0, "tmp file");
	char *dst = malloc(n);
	struct sigaction before, after;
	sigaction(SIGBUS, NULL, &before);
	CHECK(ftruncate(f.fd, (off_t)(3u << 20) + 100) == 0, "ftruncate");
	for (int mode = 0; mode < 3; mode++) {
		/* 0: contiguous with pread; 1: contiguous from the mapping; 2: a row slice (always the
		 * mapping) */
		struct upload_plan *p = NULL;
		CHECK(upload_plan_create(64 << 10, &p) == 0, "plan_create");
		if (mode < 2)
			CHECK(upload_plan_add(p, dst, f.map, n, n, 1) == 0, "add");
		else
			CHECK(upload_plan_add(p, dst, f.map, 4096, 1024, n / 4096) == 0, "add");
		struct upload_host_sink hs = {0};
		struct upload_sink sink;
		upload_host_sink_init(&hs, &sink);
		struct upload_file uf = {.base = f.map, .size = f.size, .path = f.path};
		struct names nm = {.f = &f};
		struct upload_opts o = {.n_threads = 2,
		                        .n_bufs = 2,
		                        .sink = &sink,
		                        .files = &uf,
		                        .n_files = 1,
		                        .no_pread = mode == 1,
		                        .name_cb = name_cb,
		                        .user = &nm};
		struct upload_stats st;
		struct errbuf e = {0};
		int rc = upload_run(p, &o, &st, &e);
		CHECK(rc == (mode == 0 ? -EIO : -EFAULT), "mode %d: rc %d (%s)", mode, rc, e.msg);
		/* the first missing page is in the fourth MiB */
		CHECK(strstr(e.msg, "tensor T3") != NULL, "mode %d: message does not name T3: %s", mode,
		      e.msg);
		CHECK(strstr(e.msg, mode == 0 ? "the file ends there" : "SIGBUS") != NULL, "mode %d: %s",
		      mode, e.msg);
		printf("truncated file, %s: \"%s\"\n",
		       mode == 0   ? "pread"
		       : mode == 1 ? "mapping"
		                   : "row slice",
		       e.msg);
		upload_plan_destroy(p);
	}
	sigaction(SIGBUS, NULL, &after);
	CHECK(after.sa_handler == before.sa_handler && after.sa_flags == before.sa_flags,
	      "the SIGBUS disposition was not restored");
	free(dst);
	tfile_drop(&f);
}

/* a path that names another file than the mapped one is not read in its place */
static void test_replaced(const struct tfile *f)
{
	struct tfile other;
	CHECK(tfile_make(&other, f->size) == 0, "tmp file");
	size_t n = (size_t)1 << 20;
	char *dst = malloc(n);
	struct upload_plan *p = NULL;
	CHECK(upload_plan_create(64 << 10, &p) == 0, "plan_create");
	CHECK(upload_plan_add(p, dst, f->map + 12345, n, n, 1) == 0, "add");
	struct upload_host_sink hs = {0};
	struct upload_sink sink;
	upload_host_sink_init(&hs, &sink);
	struct upload_file uf = {.base = f->map, .size = f->size, .path = other.path};
	struct upload_opts o = {.n_threads = 2, .n_bufs = 2, .sink = &sink, .files = &uf, .n_files = 1};
	struct errbuf e = {0};
	CHECK(upload_run(p, &o, NULL, &e) == 0, "run: %s", e.msg);
	CHECK(memcmp(dst, f->map + 12345, n) == 0, "data came from the other file");
	upload_plan_destroy(p);
	free(dst);
	tfile_drop(&other);
}

static void test_args(void)
{
	struct upload_plan *p = NULL;
	CHECK(upload_plan_create(100, &p) == -EINVAL && !p, "a tiny buffer is refused");
	CHECK(upload_plan_create(4096, &p) == 0, "plan_create");
	char a[64], b[64];
	CHECK(upload_plan_add(p, a, b, 8, 16, 2) == -EINVAL, "stride below row bytes is refused");
	CHECK(upload_plan_add(p, a, b, SIZE_MAX, SIZE_MAX / 2, 3) == -EINVAL, "size overflow is refused");
	CHECK(upload_plan_add(p, NULL, b, 8, 8, 1) == -EINVAL, "NULL destination is refused");
	CHECK(upload_plan_add(p, a, b, 0, 0, 5) == 0 && upload_plan_bytes(p) == 0, "empty piece ignored");
	struct upload_host_sink hs = {0};
	struct upload_sink sink;
	upload_host_sink_init(&hs, &sink);
	struct upload_opts o = {.n_threads = 0, .n_bufs = 2, .sink = &sink};
	struct errbuf e = {0};
	CHECK(upload_run(p, &o, NULL, &e) == -EINVAL, "0 threads refused");
	o.n_threads = 2;
	o.n_bufs = 9;
	CHECK(upload_run(p, &o, NULL, &e) == -EINVAL, "9 buffers refused");
	o.n_bufs = 2;
	struct upload_stats st;
	CHECK(upload_run(p, &o, &st, &e) == 0 && st.bytes == 0, "an empty plan runs: %s", e.msg);
	upload_plan_destroy(p);

	setenv("TANDEM_UPLOAD_THREADS", "3", 1);
	CHECK(upload_default_threads(4) == 3, "TANDEM_UPLOAD_THREADS=3");
	setenv("TANDEM_UPLOAD_THREADS", "0", 1);
	CHECK(upload_default_threads(1) == 0, "TANDEM_UPLOAD_THREADS=0 (the old path)");
	setenv("TANDEM_UPLOAD_THREADS", "x7", 1);
	int d = upload_default_threads(1);
	CHECK(d >= 1 && d <= 16, "a bad TANDEM_UPLOAD_THREADS falls back to the default (%d)", d);
	unsetenv("TANDEM_UPLOAD_THREADS");
	CHECK(upload_default_threads(100000) == 1, "more sharers than CPUs: 1 thread");
}

int main(void)
{
	const char *s = getenv("TANDEM_SEED");
	uint64_t seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	rng_state = seed ? seed : 1;
	printf("seed %llu (TANDEM_SEED to repeat)\n", (unsigned long long)seed);
	struct tfile f;
	if (tfile_make(&f, (size_t)4 << 20)) {
		printf("FAIL: cannot make a temporary file\n");
		return 1;
	}
	static const int threads[] = {1, 2, 3, 8};
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++)
		for (int nb = 1; nb <= 3; nb++)
			for (int np = 0; np < 2; np++)
				test_exact(&f, threads[t], nb, np, (size_t)(nb == 2 ? 65536 : 4096 + 8 * nb));
	test_merge(&f);
	test_fail_stops(&f);
	test_truncated();
	test_replaced(&f);
	test_args();
	tfile_drop(&f);
	printf("%s: %d checks, %d failures\n", n_fail ? "FAIL" : "OK", n_check, n_fail);
	return n_fail ? 1 : 0;
}
