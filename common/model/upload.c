/* The threaded weight copier (upload.h): the plan (pieces cut into staging-buffer-sized batches)
 * and the run (copy threads that claim batches, read them into their own staging buffers and hand
 * them to their sink lane). The CUDA backend uploads a rank's weights with it; one thread copying
 * from the mapping reached 4.1 GB/s on the H200 machine while PCIe moves ~50 GB/s, so the host
 * side is what needs the threads.
 *
 * Reads: a contiguous piece inside a mapped file is pread() from the file (one open per thread
 * and file, so the kernel's readahead state is per thread): no page-table work for the mapping,
 * and a file truncated after it was mapped shows up as a short read. Row slices (a TP column cut
 * keeps row_bytes of every src_stride) and plain memory are memcpy'd under a SIGBUS guard: a
 * sigsetjmp per piece, and a handler installed only while a run is in progress, that jumps back
 * only for faults in an armed copy and hands every other SIGBUS to the previous disposition. */
#include "common/model/upload.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/base/log.h"

#define MAX_THREADS 256
#define MAX_FILES 4096

/* ---- plan -------------------------------------------------------------------------------------- */
struct piece {
	char *dst;
	const char *src;
	size_t stride, row_bytes, n_rows; /* contiguous: n_rows 1, stride = row_bytes */
	uint32_t gen; /* destination allocation (upload_plan_new_dst) */
};

struct batch {
	int64_t first, n; /* pieces [first, first + n) */
	uint64_t bytes;
};

struct upload_plan {
	size_t buf_bytes;
	struct piece *pc;
	int64_t n_pc, cap_pc;
	struct batch *bt;
	int64_t n_bt, cap_bt; /* the last one is open while pieces are added */
	uint64_t total;
	uint32_t gen;
};

int upload_plan_create(size_t buf_bytes, struct upload_plan **out)
{
	*out = NULL;
	if (buf_bytes < 4096)
		return -EINVAL;
	struct upload_plan *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->buf_bytes = buf_bytes;
	*out = p;
	return 0;
}

void upload_plan_destroy(struct upload_plan *p)
{
	if (!p)
		return;
	free(p->pc);
	free(p->bt);
	free(p);
}

void upload_plan_new_dst(struct upload_plan *p)
{
	p->gen++;
}

uint64_t upload_plan_bytes(const struct upload_plan *p)
{
	return p->total;
}

int64_t upload_plan_batches(const struct upload_plan *p)
{
	/* the open batch counts only once it holds a piece */
	return p->n_bt > 0 && p->bt[p->n_bt - 1].n == 0 ? p->n_bt - 1 : p->n_bt;
}

static int grow(void **a, int64_t *cap, int64_t need, size_t elt)
{
	if (need <= *cap)
		return 0;
	int64_t nc = *cap ? *cap * 2 : 256;
	while (nc < need)
		nc *= 2;
	void *na = realloc(*a, (size_t)nc * elt);
	if (!na)
		return -ENOMEM;
	*a = na;
	*cap = nc;
	return 0;
}

static int open_batch(struct upload_plan *p)
{
	if (p->n_bt > 0 && p->bt[p->n_bt - 1].n == 0)
		return 0; /* the open one is still empty */
	int rc = grow((void **)&p->bt, &p->cap_bt, p->n_bt + 1, sizeof(*p->bt));
	if (rc)
		return rc;
	p->bt[p->n_bt++] = (struct batch){.first = p->n_pc};
	return 0;
}

static int push(struct upload_plan *p, char *dst, const char *src, size_t stride, size_t rb, size_t n)
{
	int rc = grow((void **)&p->pc, &p->cap_pc, p->n_pc + 1, sizeof(*p->pc));
	if (rc)
		return rc;
	p->pc[p->n_pc++] = (struct piece){dst, src, stride, rb, n, p->gen};
	struct batch *b = &p->bt[p->n_bt - 1];
	b->n++;
	b->bytes += (uint64_t)rb * n;
	p->total += (uint64_t)rb * n;
	return 0;
}

int upload_plan_add(struct upload_plan *p, void *dst, const void *src, size_t src_stride, size_t row_bytes,
                    size_t n_rows)
{
	char *d = dst;
	const char *s = src;
	int rc;
	if (row_bytes == 0 || n_rows == 0)
		return 0;
	if (!d || !s)
		return -EINVAL;
	if (n_rows > SIZE_MAX / row_bytes || (n_rows > 1 && src_stride < row_bytes))
		return -EINVAL;
	if (n_rows == 1 || src_stride == row_bytes) { /* one contiguous range */
		row_bytes *= n_rows;
		n_rows = 1;
		src_stride = row_bytes;
	} else if (row_bytes > p->buf_bytes) { /* rows wider than a buffer: each row on its own */
		for (size_t r = 0; r < n_rows; r++)
			if ((rc = upload_plan_add(p, d + r * row_bytes, s + r * src_stride, row_bytes,
			                          row_bytes, 1)))
				return rc;
		return 0;
	}
	if (p->n_bt == 0 && (rc = open_batch(p)))
		return rc;
	while (n_rows > 0 && row_bytes > 0) {
		size_t room = p->buf_bytes - (size_t)p->bt[p->n_bt - 1].bytes;
		if (n_rows == 1) { /* contiguous: cut anywhere */
			size_t take = row_bytes < room ? row_bytes : room;
			if (take == 0) {
				if ((rc = open_batch(p)))
					return rc;
				continue;
			}
			if ((rc = push(p, d, s, take, take, 1)))
				return rc;
			d += take;
			s += take;
			row_bytes -= take;
		} else { /* rows: cut between rows */
			size_t k = room / row_bytes < n_rows ? room / row_bytes : n_rows;
			if (k == 0) {
				if ((rc = open_batch(p)))
					return rc;
				continue;
			}
			if ((rc = push(p, d, s, src_stride, row_bytes, k)))
				return rc;
			d += k * row_bytes;
			s += k * src_stride;
			n_rows -= k;
		}
	}
	return 0;
}

/* ---- SIGBUS guard ------------------------------------------------------------------------------ */
static _Thread_local sigjmp_buf tls_jb;
static _Thread_local volatile sig_atomic_t tls_armed;
static _Thread_local void *volatile tls_fault; /* the faulting address (si_addr) */
static pthread_mutex_t g_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_sig_users;
static struct sigaction g_old_bus;

static void bus_handler(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (tls_armed) {
		tls_armed = 0;
		tls_fault = si ? si->si_addr : NULL;
		siglongjmp(tls_jb, 1);
	}
	/* not a fault of a guarded copy: the previous disposition takes it (a fault repeats when the
	 * instruction does; a signal sent by someone is raised again) */
	sigaction(SIGBUS, &g_old_bus, NULL);
	if (si && si->si_code <= 0)
		raise(sig);
}

static int guard_install(void)
{
	int rc = 0;
	pthread_mutex_lock(&g_sig_mu);
	if (g_sig_users++ == 0) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = bus_handler;
		sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* siglongjmp leaves without restoring the mask */
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGBUS, &sa, &g_old_bus) != 0) {
			rc = -errno;
			g_sig_users--;
		}
	}
	pthread_mutex_unlock(&g_sig_mu);
	return rc;
}

static void guard_remove(void)
{
	pthread_mutex_lock(&g_sig_mu);
	if (--g_sig_users == 0)
		sigaction(SIGBUS, &g_old_bus, NULL);
	pthread_mutex_unlock(&g_sig_mu);
}

/* n rows of rb bytes, src stride apart -> dst contiguous; -EFAULT on a read fault, *fault = the
 * address that faulted (the start of its row if the kernel did not say) */
static int copy_guarded(char *dst, const char *src, size_t stride, size_t rb, size_t n, const char **fault)
{
	volatile size_t r = 0;
	if (sigsetjmp(tls_jb, 0)) {
		const char *a = tls_fault, *row = src + r * stride;
		*fault = a >= row && a < row + rb ? a : row;
		return -EFAULT;
	}
	tls_fault = NULL;
	tls_armed = 1;
	for (; r < n; r++)
		memcpy(dst + r * rb, src + r * stride, rb);
	tls_armed = 0;
	return 0;
}

int upload_copy_guarded(void *dst, const void *src, size_t bytes)
{
	const char *bad = NULL;
	int rc = guard_install();
	if (rc)
		return rc;
	rc = copy_guarded(dst, src, bytes, bytes, 1, &bad);
	guard_remove();
	return rc;
}

/* ---- run --------------------------------------------------------------------------------------- */
struct run {
	const struct upload_plan *p;
	const struct upload_opts *o;
	_Atomic int64_t next; /* next batch to claim */
	_Atomic uint64_t done; /* bytes whose copies completed */
	_Atomic int stop;
	_Atomic int64_t copies, batches;
	int n_threads; /* started */
	size_t lane_bytes; /* the largest batch: a small plan does not pin full-size buffers */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running;
	int err;
	struct errbuf e; /* the first error */
};

struct worker {
	struct run *r;
	int idx;
	pthread_t th;
	int fds[MAX_FILES]; /* per file: -1 not opened yet, -2 not readable (use the mapping) */
};

static int run_fail(struct run *r, int code, const char *fmt, ...) TD_PRINTF(3, 4);
static int run_fail(struct run *r, int code, const char *fmt, ...)
{
	pthread_mutex_lock(&r->mu);
	if (!r->err) {
		va_list ap;
		va_start(ap, fmt);
		r->err = code;
		r->e.code = code;
		vsnprintf(r->e.msg, sizeof(r->e.msg), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&r->mu);
	atomic_store(&r->stop, 1);
	return code;
}

static int find_file(const struct upload_opts *o, const char *src, size_t bytes, size_t *off)
{
	for (int i = 0; i < o->n_files; i++) {
		const char *b = o->files[i].base;
		if (src >= b && (size_t)(src - b) <= o->files[i].size &&
		    bytes <= o->files[i].size - (size_t)(src - b)) {
			*off = (size_t)(src - b);
			return i;
		}
	}
	return -1;
}

static const char *tensor_name(const struct run *r, const void *src, size_t *off)
{
	const char *n = r->o->name_cb ? r->o->name_cb(r->o->user, src, off) : NULL;
	if (!n) {
		*off = 0;
		return "(host memory)";
	}
	return n;
}

/* the per-thread descriptor of file i, opened on first use and checked against the mapping: a
 * file replaced since it was mapped must not be read in its place */
static int file_fd(struct worker *w, int i)
{
	const struct upload_file *f = &w->r->o->files[i];
	if (w->fds[i] != -1)
		return w->fds[i];
	w->fds[i] = -2;
	if (!f->path || w->r->o->no_pread)
		return -2;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -2;
	char head[4096];
	size_t n = f->size < sizeof(head) ? f->size : sizeof(head);
	if (pread(fd, head, n, 0) != (ssize_t)n || memcmp(head, f->base, n) != 0) {
		close(fd);
		return -2;
	}
	return w->fds[i] = fd;
}

static int read_piece(struct worker *w, const struct piece *pc, char *buf)
{
	struct run *r = w->r;
	size_t bytes = pc->row_bytes * pc->n_rows, foff = 0, off = 0;
	int fi = -1;
	if (pc->n_rows == 1 && r->o->n_files > 0)
		fi = find_file(r->o, pc->src, bytes, &foff);
	int fd = fi >= 0 ? file_fd(w, fi) : -2;
	if (fd >= 0) {
		size_t got = 0;
		while (got < bytes) {
			ssize_t k = pread(fd, buf + got, bytes - got, (off_t)(foff + got));
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				int code = k < 0 ? -errno : -EIO;
				const char *nm = tensor_name(r, pc->src + got, &off);
				return run_fail(
				    r, code,
				    "weight upload: tensor %s: cannot read %zu bytes at its byte %zu "
				    "(file %s, offset %zu): %s",
				    nm, bytes - got, off, r->o->files[fi].path, foff + got,
				    k < 0 ? strerror(errno)
				          : "the file ends there (truncated after it was opened?)");
			}
			got += (size_t)k;
		}
		return 0;
	}
	const char *bad = NULL;
	if (copy_guarded(buf, pc->src, pc->stride, pc->row_bytes, pc->n_rows, &bad)) {
		const char *nm = tensor_name(r, bad, &off);
		return run_fail(
		    r, -EFAULT,
		    "weight upload: tensor %s: read fault at its byte %zu (SIGBUS on the mapping: "
		    "the file was truncated or its storage failed)",
		    nm, off);
	}
	return 0;
}

static void readahead_batch(struct worker *w, int64_t b)
{
	const struct upload_plan *p = w->r->p;
	if (b >= p->n_bt)
		return;
	for (int64_t i = p->bt[b].first; i < p->bt[b].first + p->bt[b].n; i++) {
		const struct piece *pc = &p->pc[i];
		size_t foff;
		int fi = pc->n_rows == 1 ? find_file(w->r->o, pc->src, pc->row_bytes, &foff) : -1;
		int fd = fi >= 0 ? file_fd(w, fi) : -2;
		if (fd >= 0)
			(void)posix_fadvise(fd, (off_t)foff, (off_t)pc->row_bytes, POSIX_FADV_WILLNEED);
	}
}

/* buffer k of the lane holds batch b: one sink copy per run of consecutive destination bytes of
 * one allocation */
static int send_batch(struct worker *w, void *lane, int k, const struct batch *b)
{
	struct run *r = w->r;
	const struct upload_sink *s = r->o->sink;
	const struct piece *pc = &r->p->pc[b->first];
	size_t off = 0, run_off = 0, run_bytes = 0;
	int64_t run_i = 0;
	char *run_dst = NULL;
	uint32_t run_gen = 0;
	int rc;
	for (int64_t i = 0; i <= b->n; i++) {
		size_t bytes = i < b->n ? pc[i].row_bytes * pc[i].n_rows : 0;
		if (i < b->n && run_bytes && pc[i].gen == run_gen && run_dst + run_bytes == pc[i].dst) {
			run_bytes += bytes;
			off += bytes;
			continue;
		}
		if (run_bytes) {
			if ((rc = s->lane_copy(lane, k, run_dst, run_off, run_bytes))) {
				size_t toff;
				const char *nm = tensor_name(r, pc[run_i].src, &toff);
				return run_fail(
				    r, rc,
				    "weight upload: tensor %s: the copy of %zu bytes from its byte %zu "
				    "failed: %s",
				    nm, run_bytes, toff, err_name(rc));
			}
			atomic_fetch_add(&r->copies, 1);
		}
		if (i == b->n)
			break;
		run_dst = pc[i].dst;
		run_i = i;
		run_off = off;
		run_bytes = bytes;
		run_gen = pc[i].gen;
		off += bytes;
	}
	if ((rc = s->lane_commit(lane, k)))
		return run_fail(r, rc, "weight upload: staging copy failed: %s", err_name(rc));
	return 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->r;
	const struct upload_opts *o = r->o;
	const struct upload_sink *s = o->sink;
	const struct upload_plan *p = r->p;
	uint64_t held[8] = {0}; /* bytes committed in buffer k, not yet known to be copied */
	int nb = o->n_bufs, k = 0, rc;
	void *lane = NULL;
	if ((rc = s->lane_create(s->ctx, w->idx, r->lane_bytes, nb, &lane))) {
		run_fail(
		    r, rc,
		    "weight upload: cannot create the staging buffers of copy thread %d (%d x %zu bytes): %s",
		    w->idx, nb, r->lane_bytes, err_name(rc));
		goto out;
	}
	while (!atomic_load(&r->stop)) {
		int64_t b = atomic_fetch_add(&r->next, 1);
		if (b >= p->n_bt)
			break;
		if (p->bt[b].n == 0)
			continue;
		if (o->readahead) /* this thread's next batch, if the claims go round in turn */
			readahead_batch(w, b + r->n_threads);
		if (held[k]) {
			if ((rc = s->lane_wait(lane, k))) {
				run_fail(r, rc, "weight upload: staging copy failed: %s", err_name(rc));
				break;
			}
			atomic_fetch_add(&r->done, held[k]);
			held[k] = 0;
		}
		char *buf = s->lane_buf(lane, k);
		const struct batch *bt = &p->bt[b];
		size_t off = 0;
		rc = 0;
		for (int64_t i = bt->first; i < bt->first + bt->n && !rc; i++) {
			rc = read_piece(w, &p->pc[i], buf + off);
			off += p->pc[i].row_bytes * p->pc[i].n_rows;
		}
		if (rc || (rc = send_batch(w, lane, k, bt)))
			break;
		held[k] = bt->bytes;
		atomic_fetch_add(&r->batches, 1);
		k = (k + 1) % nb;
	}
	if ((rc = s->lane_finish(lane)))
		run_fail(r, rc, "weight upload: staging copies failed: %s", err_name(rc));
	else
		for (int i = 0; i < nb; i++)
			atomic_fetch_add(&r->done, held[i]);
out:
	if (lane)
		s->lane_destroy(lane);
	for (int i = 0; i < o->n_files; i++)
		if (w->fds[i] >= 0)
			close(w->fds[i]);
	pthread_mutex_lock(&r->mu);
	r->running--;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int upload_run(const struct upload_plan *p, const struct upload_opts *o, struct upload_stats *st,
               struct errbuf *e)
{
	struct upload_stats dummy;
	if (!st)
		st = &dummy;
	memset(st, 0, sizeof(*st));
	if (!o->sink || o->n_threads < 1 || o->n_threads > MAX_THREADS || o->n_bufs < 1 || o->n_bufs > 8 ||
	    o->n_files < 0 || o->n_files > MAX_FILES || (o->n_files && !o->files))
		return errbuf_set(
		    e, -EINVAL,
		    "weight upload: bad options (threads %d of 1..%d, buffers %d of 1..8, files %d of "
		    "0..%d)",
		    o->n_threads, MAX_THREADS, o->n_bufs, o->n_files, MAX_FILES);
	int64_t n_bt = upload_plan_batches(p);
	int nt = o->n_threads < n_bt ? o->n_threads : (int)(n_bt > 0 ? n_bt : 1);
	struct run *r = calloc(1, sizeof(*r));
	struct worker *ws = calloc((size_t)nt, sizeof(*ws));
	int rc = 0, started = 0;
	double t0 = now_s();
	if (!r || !ws) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto free_mem;
	}
	r->p = p;
	r->o = o;
	r->n_threads = nt;
	for (int64_t b = 0; b < p->n_bt; b++)
		if (p->bt[b].bytes > r->lane_bytes)
			r->lane_bytes = (size_t)p->bt[b].bytes;
	if (pthread_mutex_init(&r->mu, NULL)) {
		rc = errbuf_set(e, -ENOMEM, "weight upload: cannot create a mutex");
		goto free_mem;
	}
	if (pthread_cond_init(&r->cv, NULL)) {
		rc = errbuf_set(e, -ENOMEM, "weight upload: cannot create a condition variable");
		goto destroy_mu;
	}
	if ((rc = guard_install())) {
		errbuf_set(e, rc, "weight upload: cannot install the SIGBUS handler: %s", strerror(-rc));
		goto destroy_cv;
	}
	if (n_bt == 0)
		goto report;
	for (int i = 0; i < nt; i++) {
		ws[i].r = r;
		ws[i].idx = i;
		for (int f = 0; f < o->n_files; f++)
			ws[i].fds[f] = -1;
		pthread_mutex_lock(&r->mu);
		r->running++;
		pthread_mutex_unlock(&r->mu);
		int prc = pthread_create(&ws[i].th, NULL, worker_main, &ws[i]);
		if (prc) {
			pthread_mutex_lock(&r->mu);
			r->running--;
			pthread_mutex_unlock(&r->mu);
			run_fail(r, -prc, "weight upload: cannot start copy thread %d of %d: %s", i, nt,
			         strerror(prc));
			break;
		}
		started++;
	}
	/* progress from this thread only: the line is printed by one writer */
	pthread_mutex_lock(&r->mu);
	while (r->running > 0) {
		double every = o->progress_every_s > 0 ? o->progress_every_s : 1.0;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + every;
		ts.tv_sec = (time_t)t;
		ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
		int w = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (w == ETIMEDOUT && r->running > 0 && o->progress_cb) {
			pthread_mutex_unlock(&r->mu);
			o->progress_cb(o->user, atomic_load(&r->done), p->total, false);
			pthread_mutex_lock(&r->mu);
		}
	}
	pthread_mutex_unlock(&r->mu);
	for (int i = 0; i < started; i++)
		pthread_join(ws[i].th, NULL);
report:
	st->bytes = atomic_load(&r->done);
	st->batches = atomic_load(&r->batches);
	st->copies = atomic_load(&r->copies);
	st->seconds = now_s() - t0;
	st->n_threads = nt;
	if (o->progress_cb)
		o->progress_cb(o->user, st->bytes, p->total, true);
	if (r->err) {
		rc = r->err;
		errbuf_set(e, rc, "%s", r->e.msg);
	} else if (st->bytes != p->total) { /* every byte accounted for, or a bug above */
		rc = errbuf_set(e, -EIO, "weight upload: %llu of %llu bytes copied",
		                (unsigned long long)st->bytes, (unsigned long long)p->total);
	}
	guard_remove();
destroy_cv:
	pthread_cond_destroy(&r->cv);
destroy_mu:
	pthread_mutex_destroy(&r->mu);
free_mem:
	free(ws);
	free(r);
	return rc;
}

int upload_default_threads(int sharing)
{
	const char *s = getenv("TANDEM_UPLOAD_THREADS");
	if (s && *s) {
		char *end;
		long v = strtol(s, &end, 10);
		if (*end == '\0' && v >= 0 && v <= MAX_THREADS)
			return (int)v;
		LOG_WARN("upload", "TANDEM_UPLOAD_THREADS=%s is not a count of 0..%d; using the default", s,
		         MAX_THREADS);
	}
	long n = 0;
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) == 0)
		n = CPU_COUNT(&cs);
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	if (sharing < 1)
		sharing = 1;
	n /= sharing;
	return n < 1 ? 1 : n > 16 ? 16 : (int)n;
}
