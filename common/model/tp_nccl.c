/* NCCL tensor-parallel communicator (tp.h): T ranks as threads of one process, rank r on its own
 * GPU, one NCCL communicator per rank from one ncclCommInitRankConfig group. Buffers are device
 * memory of the rank's GPU and every collective is enqueued on the rank's compute stream, so the
 * decode step's CUDA graph captures it like any kernel.
 *
 * NCCL is loaded with dlopen("libnccl.so.2") (or $TANDEM_NCCL_LIB) and called through the few
 * declarations below, checked against nccl.h 2.28: the build needs no NCCL, and a binary without it
 * fails only when TP > 1 on the CUDA backend is asked for, with a message that says so.
 *
 * No wait is unbounded: the communicators are created non-blocking (config.blocking = 0), init is
 * polled with ncclCommGetAsyncError against a deadline and every communicator is aborted when it
 * passes; the host waits for a rank's stream (tp_nccl_wait) by polling an event against the same
 * deadline and aborts that rank's communicator (ncclCommAbort stops its kernels) when it passes, so
 * a rank whose peer stopped issuing collectives returns ERR_TIMEOUT instead of hanging. An aborted
 * group stays broken (every later call fails fast): the model must be loaded again.
 *
 * NVLink SHARP / multicast (NVLS) is switched off (NCCL_NVLS_ENABLE=0 unless the user set it) before
 * the first NCCL call: tandem never uses multicast objects. NCCL_RUNTIME_CONNECT=0 (unless set)
 * makes init connect every channel, so no connection is set up lazily inside a graph capture. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/log.h"
#include "common/model/tp.h"
#include "kernels/kernels.h"

/* ---- the NCCL ABI we use (nccl.h 2.28; unchanged since 2.14) ------------------------------------ */
enum {
	NCCL_SUCCESS = 0,
	NCCL_IN_PROGRESS = 7,
	NCCL_UINT8 = 1,
	NCCL_FLOAT32 = 7,
	NCCL_SUM = 0,
	NCCL_UNDEF_INT = INT_MIN,
};
#define NCCL_MIN_VERSION 21400 /* 2.14: non-blocking config, ncclCommGetAsyncError, ncclGetLastError */

struct nccl_id {
	char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
};

/* ncclConfig_t as of version 2.14 (NCCL copies `size` bytes and defaults the newer fields) */
struct nccl_config {
	size_t size;
	unsigned magic;
	unsigned version;
	int blocking;
	int cga_cluster_size;
	int min_ctas;
	int max_ctas;
	const char *net_name;
	int split_share;
};

struct nccl_lib {
	void *so;
	int version;
	int (*get_version)(int *v);
	int (*get_unique_id)(struct nccl_id *id);
	int (*comm_init_rank_config)(void **comm, int nranks, struct nccl_id id, int rank,
	                             struct nccl_config *cfg);
	int (*comm_get_async_error)(void *comm, int *res);
	int (*comm_finalize)(void *comm);
	int (*comm_destroy)(void *comm);
	int (*comm_abort)(void *comm);
	int (*all_reduce)(const void *s, void *r, size_t n, int dtype, int op, void *comm, void *stream);
	int (*all_gather)(const void *s, void *r, size_t n, int dtype, void *comm, void *stream);
	int (*broadcast)(const void *s, void *r, size_t n, int dtype, int root, void *comm, void *stream);
	int (*group_start)(void);
	int (*group_end)(void);
	const char *(*get_error_string)(int res);
	const char *(*get_last_error)(void *comm);
};

static struct nccl_lib nccl;
static pthread_mutex_t nccl_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *nccl_soname(void)
{
	const char *s = getenv("TANDEM_NCCL_LIB");
	return s && *s ? s : "libnccl.so.2";
}

#define NCCL_SYM(field, name)                                                                                \
	do {                                                                                                 \
		*(void **)(&L.field) = dlsym(L.so, name);                                                    \
		if (!L.field) {                                                                              \
			missing = name;                                                                      \
			goto bad;                                                                            \
		}                                                                                            \
	} while (0)

int tp_nccl_available(struct errbuf *e)
{
	pthread_mutex_lock(&nccl_mu);
	if (nccl.so) {
		pthread_mutex_unlock(&nccl_mu);
		return 0;
	}
	const char *name = nccl_soname(), *missing = NULL;
	struct nccl_lib L = {0};
	L.so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!L.so) {
		const char *why = dlerror();
		pthread_mutex_unlock(&nccl_mu);
		return errbuf_set(e, ERR_NCCL,
		                  "NCCL: cannot load %s (%s); tensor parallelism over GPUs (--backend cuda "
		                  "--tp > 1) needs NCCL 2.14 or later: install libnccl2, or set "
		                  "TANDEM_NCCL_LIB to the library's path",
		                  name, why ? why : "unknown error");
	}
	NCCL_SYM(get_version, "ncclGetVersion");
	NCCL_SYM(get_unique_id, "ncclGetUniqueId");
	NCCL_SYM(comm_init_rank_config, "ncclCommInitRankConfig");
	NCCL_SYM(comm_get_async_error, "ncclCommGetAsyncError");
	NCCL_SYM(comm_finalize, "ncclCommFinalize");
	NCCL_SYM(comm_destroy, "ncclCommDestroy");
	NCCL_SYM(comm_abort, "ncclCommAbort");
	NCCL_SYM(all_reduce, "ncclAllReduce");
	NCCL_SYM(all_gather, "ncclAllGather");
	NCCL_SYM(broadcast, "ncclBroadcast");
	NCCL_SYM(group_start, "ncclGroupStart");
	NCCL_SYM(group_end, "ncclGroupEnd");
	NCCL_SYM(get_error_string, "ncclGetErrorString");
	NCCL_SYM(get_last_error, "ncclGetLastError");
	if (L.get_version(&L.version) != NCCL_SUCCESS || L.version < NCCL_MIN_VERSION) {
		int v = L.version;
		dlclose(L.so);
		pthread_mutex_unlock(&nccl_mu);
		return errbuf_set(e, ERR_NCCL, "NCCL: %s is version %d.%d.%d; tandem needs 2.14 or later",
		                  name, v / 10000, v / 100 % 100, v % 100);
	}
	nccl = L;
	pthread_mutex_unlock(&nccl_mu);
	return 0;
bad:
	dlclose(L.so);
	pthread_mutex_unlock(&nccl_mu);
	return errbuf_set(e, ERR_NCCL, "NCCL: %s has no %s: not an NCCL 2.14+ library", name, missing);
}

int tp_nccl_version(void)
{
	return nccl.so ? nccl.version : 0;
}

int tp_nccl_check_devices(int size, int first, int n_visible, struct errbuf *e)
{
	if (size < 2 || size > 256)
		return errbuf_set(e, -EINVAL, "TP over GPUs: degree %d out of range 2..256", size);
	if (first < 0)
		return errbuf_set(e, -EINVAL, "TP over GPUs: first device %d is negative", first);
	if (n_visible < 1)
		return errbuf_set(e, ERR_UNSUPPORTED,
		                  "TP=%d on the CUDA backend needs %d GPUs (devices %d..%d); no CUDA device "
		                  "is visible",
		                  size, size, first, first + size - 1);
	if ((long)first + size > n_visible)
		return errbuf_set(
		    e, ERR_UNSUPPORTED,
		    "TP=%d on the CUDA backend needs %d GPUs (devices %d..%d, one per rank); %d "
		    "visible (check CUDA_VISIBLE_DEVICES, --device and --tp)",
		    size, size, first, first + size - 1, n_visible);
	return 0;
}

double tp_nccl_timeout_s(void)
{
	const char *s = getenv("TANDEM_NCCL_TIMEOUT_S");
	if (s && *s) {
		char *end;
		double v = strtod(s, &end);
		if (*end == 0 && v > 0 && v <= 86400)
			return v;
		LOG_WARN("tp",
		         "TANDEM_NCCL_TIMEOUT_S='%s' is not a number of seconds in (0, 86400]; using 120", s);
	}
	return 120.0;
}

/* ---- the group --------------------------------------------------------------------------------- */
struct nccl_rank {
	struct tp_nccl_group *g;
	int rank;
	int device;
	struct kcuda_ctx *kc; /* borrowed: the rank's compute context (stream) */
	void *stream;
	void *comm; /* NULL once aborted */
	float *scratch; /* device float for barrier() */
};

struct tp_nccl_group {
	int size;
	double timeout_s;
	atomic_int broken; /* a communicator was aborted: every later collective fails */
	struct nccl_rank *ranks;
	struct kcuda_ar *ar; /* TANDEM_TP_ONESHOT=1: tandem's one-shot all-reduce for small sums */
};

static double mono_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *nccl_why(int res, void *comm)
{
	const char *last = comm && nccl.get_last_error ? nccl.get_last_error(comm) : NULL;
	return last && *last ? last : nccl.get_error_string(res);
}

static void abort_rank(struct nccl_rank *r)
{
	atomic_store(&r->g->broken, 1);
	if (r->comm) {
#ifdef TANDEM_CUDA
		(void)kcuda_device_set(r->device);
#endif
		nccl.comm_abort(r->comm);
		r->comm = NULL;
	}
}

/* After an NCCL call on a non-blocking communicator: ncclInProgress means NCCL is still
 * enqueuing (it may be connecting); wait for it against the deadline. */
static int nccl_done(struct nccl_rank *r, int res, const char *what)
{
	if (res == NCCL_IN_PROGRESS) {
		double t0 = mono_s();
		do {
			if (mono_s() - t0 > r->g->timeout_s) {
				LOG_ERROR(
				    "tp",
				    "NCCL %s on rank %d did not finish enqueuing within %.0f s; communicator "
				    "aborted",
				    what, r->rank, r->g->timeout_s);
				abort_rank(r);
				return ERR_TIMEOUT;
			}
			if (nccl.comm_get_async_error(r->comm, &res) != NCCL_SUCCESS)
				break;
		} while (res == NCCL_IN_PROGRESS);
	}
	if (res != NCCL_SUCCESS) {
		LOG_ERROR("tp", "NCCL %s on rank %d: %s", what, r->rank, nccl_why(res, r->comm));
		abort_rank(r);
		return ERR_NCCL;
	}
	return 0;
}

static struct nccl_rank *usable(struct tp_comm *c)
{
	struct nccl_rank *r = c->impl;
	return r->comm && !atomic_load(&r->g->broken) ? r : NULL;
}

static int nccl_all_reduce(struct tp_comm *c, float *buf, size_t n)
{
	struct nccl_rank *r = usable(c);
	if (!r)
		return ERR_NCCL;
#ifdef TANDEM_CUDA
	if (r->g->ar && n <= kcuda_ar_max_floats(r->g->ar))
		return kcuda_ar_sum(r->g->ar, r->rank, buf, (int64_t)n);
#endif
	return nccl_done(r, nccl.all_reduce(buf, buf, n, NCCL_FLOAT32, NCCL_SUM, r->comm, r->stream),
	                 "all-reduce");
}

static int nccl_all_gather(struct tp_comm *c, const float *send, size_t n, float *recv)
{
	struct nccl_rank *r = usable(c);
	if (!r)
		return ERR_NCCL;
	return nccl_done(r, nccl.all_gather(send, recv, n, NCCL_FLOAT32, r->comm, r->stream), "all-gather");
}

static int nccl_barrier(struct tp_comm *c)
{
	struct nccl_rank *r = usable(c);
	if (!r)
		return ERR_NCCL;
	return nccl_done(
	    r, nccl.all_reduce(r->scratch, r->scratch, 1, NCCL_FLOAT32, NCCL_SUM, r->comm, r->stream),
	    "barrier");
}

static int nccl_broadcast(struct tp_comm *c, void *buf, size_t bytes, int root)
{
	struct nccl_rank *r = usable(c);
	if (!r)
		return ERR_NCCL;
	if (root < 0 || root >= c->size)
		return -EINVAL;
	return nccl_done(r, nccl.broadcast(buf, buf, bytes, NCCL_UINT8, root, r->comm, r->stream),
	                 "broadcast");
}

static const struct tp_ops nccl_ops = {
    .all_reduce_sum = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .barrier = nccl_barrier,
    .broadcast = nccl_broadcast,
};

bool tp_is_nccl(const struct tp_comm *c)
{
	return c && c->ops == &nccl_ops;
}

int tp_nccl_wait(struct tp_comm *c)
{
#ifdef TANDEM_CUDA
	struct nccl_rank *r = c->impl;
	if (!r->comm)
		return ERR_NCCL;
	int rc = kcuda_ctx_wait(r->kc, r->g->timeout_s);
	if (rc == -ETIMEDOUT) {
		LOG_ERROR(
		    "tp",
		    "rank %d (GPU %d): the step's collectives did not finish within %.0f s (a peer rank "
		    "stopped or failed?); NCCL communicator aborted, the model must be reloaded "
		    "(TANDEM_NCCL_TIMEOUT_S sets the deadline)",
		    r->rank, r->device, r->g->timeout_s);
		abort_rank(r);
		return ERR_TIMEOUT;
	}
	if (rc)
		return rc;
	int res = NCCL_SUCCESS;
	if (nccl.comm_get_async_error(r->comm, &res) == NCCL_SUCCESS && res != NCCL_SUCCESS &&
	    res != NCCL_IN_PROGRESS) {
		LOG_ERROR("tp", "rank %d: NCCL: %s", r->rank, nccl_why(res, r->comm));
		abort_rank(r);
		return ERR_NCCL;
	}
	unsigned ar_err = r->g->ar ? kcuda_ar_errors(r->g->ar, r->rank) : 0;
	if (ar_err) {
		LOG_ERROR(
		    "tp",
		    "rank %d (GPU %d): %u one-shot all-reduce(s) gave up waiting for a peer within %.0f s; "
		    "the group is broken, the model must be reloaded",
		    r->rank, r->device, ar_err, r->g->timeout_s);
		abort_rank(r);
		return ERR_TIMEOUT;
	}
	return atomic_load(&r->g->broken) ? ERR_NCCL : 0;
#else
	(void)c;
	return ERR_UNSUPPORTED;
#endif
}

bool tp_nccl_broken(const struct tp_comm *c)
{
	const struct nccl_rank *r = c->impl;
	return !r->comm || atomic_load(&r->g->broken);
}

void tp_nccl_group_destroy(struct tp_nccl_group *g)
{
	if (!g)
		return;
	/* finalize every communicator (flushes), wait for all of them, then destroy; abort on error or
	 * past the deadline */
	bool ok = !atomic_load(&g->broken);
	for (int i = 0; i < g->size && ok; i++) {
		struct nccl_rank *r = &g->ranks[i];
#ifdef TANDEM_CUDA
		(void)kcuda_device_set(r->device);
#endif
		int res = r->comm ? nccl.comm_finalize(r->comm) : NCCL_SUCCESS;
		ok = res == NCCL_SUCCESS || res == NCCL_IN_PROGRESS;
	}
	double t0 = mono_s();
	for (int i = 0; i < g->size && ok; i++) {
		struct nccl_rank *r = &g->ranks[i];
		int res = NCCL_IN_PROGRESS;
		while (ok && r->comm && res == NCCL_IN_PROGRESS) {
			if (nccl.comm_get_async_error(r->comm, &res) != NCCL_SUCCESS ||
			    mono_s() - t0 > g->timeout_s)
				ok = false;
			ok = ok && (res == NCCL_SUCCESS || res == NCCL_IN_PROGRESS);
		}
	}
	for (int i = 0; i < g->size; i++) {
		struct nccl_rank *r = &g->ranks[i];
		if (r->comm) {
#ifdef TANDEM_CUDA
			(void)kcuda_device_set(r->device);
#endif
			if (ok)
				nccl.comm_destroy(r->comm);
			else
				nccl.comm_abort(r->comm);
			r->comm = NULL;
		}
#ifdef TANDEM_CUDA
		if (r->scratch) {
			(void)kcuda_device_set(r->device);
			kcuda_free(r->scratch);
		}
#endif
	}
	if (!ok)
		LOG_WARN("tp", "NCCL communicators aborted at shutdown (they did not finalize cleanly)");
#ifdef TANDEM_CUDA
	kcuda_ar_destroy(g->ar);
#endif
	free(g->ranks);
	free(g);
}

int tp_nccl_group_create(struct tp_nccl_group **out, int size, struct kcuda_ctx *const *ctxs,
                         struct tp_comm *comms, struct errbuf *e)
{
	*out = NULL;
#ifndef TANDEM_CUDA
	(void)size, (void)ctxs, (void)comms;
	return errbuf_set(e, ERR_UNSUPPORTED, "TP over GPUs: this build has no CUDA");
#else
	int rc;
	if (size < 2 || size > 256)
		return errbuf_set(e, -EINVAL, "TP over GPUs: degree %d out of range 2..256", size);
	if ((rc = tp_nccl_available(e)))
		return rc;
	/* NCCL reads its environment once, at the first call */
	setenv("NCCL_NVLS_ENABLE", "0", 0);
	setenv("NCCL_RUNTIME_CONNECT", "0", 0);
	struct tp_nccl_group *g = calloc(1, sizeof(*g));
	if (!g || !(g->ranks = calloc((size_t)size, sizeof(*g->ranks)))) {
		free(g);
		return errbuf_set(e, -ENOMEM, "out of memory");
	}
	g->size = size;
	g->timeout_s = tp_nccl_timeout_s();
	for (int i = 0; i < size; i++) {
		struct nccl_rank *r = &g->ranks[i];
		r->g = g;
		r->rank = i;
		r->kc = ctxs[i];
		r->device = kcuda_ctx_device(ctxs[i]);
		r->stream = kcuda_ctx_stream(ctxs[i]);
	}
	struct nccl_id id;
	int res = nccl.get_unique_id(&id);
	if (res != NCCL_SUCCESS) {
		rc = errbuf_set(e, ERR_NCCL, "NCCL: ncclGetUniqueId: %s", nccl.get_error_string(res));
		goto fail;
	}
	/* TANDEM_NCCL_BLOCKING=1: blocking communicators (a fallback should the non-blocking ones
	 * misbehave; init and enqueueing then have no deadline, the stream waits still do) */
	const char *blk = getenv("TANDEM_NCCL_BLOCKING");
	bool blocking = blk && strcmp(blk, "1") == 0;
	struct nccl_config cfg = {.size = sizeof(cfg),
	                          .magic = 0xcafebeef,
	                          .version = NCCL_MIN_VERSION,
	                          .blocking = blocking ? 1 : 0,
	                          .cga_cluster_size = NCCL_UNDEF_INT,
	                          .min_ctas = NCCL_UNDEF_INT,
	                          .max_ctas = NCCL_UNDEF_INT,
	                          .net_name = NULL,
	                          .split_share = NCCL_UNDEF_INT};
	int first_bad = NCCL_SUCCESS, bad_rank = -1;
	/* one thread creates every rank's communicator: inside a group, each after selecting its GPU */
	nccl.group_start();
	for (int i = 0; i < size; i++) {
		if (kcuda_device_set(g->ranks[i].device)) {
			first_bad = first_bad ? first_bad : 1, bad_rank = bad_rank < 0 ? i : bad_rank;
			continue;
		}
		res = nccl.comm_init_rank_config(&g->ranks[i].comm, size, id, i, &cfg);
		if (res != NCCL_SUCCESS && res != NCCL_IN_PROGRESS && first_bad == NCCL_SUCCESS)
			first_bad = res, bad_rank = i;
	}
	res = nccl.group_end();
	if (res != NCCL_SUCCESS && res != NCCL_IN_PROGRESS && first_bad == NCCL_SUCCESS)
		first_bad = res;
	/* poll every communicator until it is ready, fails, or the deadline passes */
	double t0 = mono_s();
	for (int i = 0; i < size && first_bad == NCCL_SUCCESS; i++) {
		struct nccl_rank *r = &g->ranks[i];
		int st = r->comm ? NCCL_IN_PROGRESS : 3 /* ncclInternalError: no handle */;
		while (r->comm && st == NCCL_IN_PROGRESS) {
			if (nccl.comm_get_async_error(r->comm, &st) != NCCL_SUCCESS)
				st = 3;
			if (st == NCCL_IN_PROGRESS && mono_s() - t0 > g->timeout_s) {
				for (int j = 0; j < size; j++)
					abort_rank(&g->ranks[j]);
				rc = errbuf_set(
				    e, ERR_TIMEOUT,
				    "NCCL: communicator init over %d GPUs did not finish within %.0f s "
				    "(TANDEM_NCCL_TIMEOUT_S); all communicators aborted",
				    size, g->timeout_s);
				goto fail;
			}
			if (st == NCCL_IN_PROGRESS) {
				struct timespec nap = {0, 1000000};
				nanosleep(&nap, NULL);
			}
		}
		if (st != NCCL_SUCCESS)
			first_bad = st, bad_rank = i;
	}
	if (first_bad != NCCL_SUCCESS) {
		const char *why = bad_rank >= 0 && g->ranks[bad_rank].comm
		                      ? nccl_why(first_bad, g->ranks[bad_rank].comm)
		                      : nccl.get_error_string(first_bad);
		rc = errbuf_set(e, ERR_NCCL, "NCCL: communicator init over %d GPUs failed (rank %d): %s",
		                size, bad_rank, why);
		for (int j = 0; j < size; j++)
			abort_rank(&g->ranks[j]);
		goto fail;
	}
	for (int i = 0; i < size; i++) {
		struct nccl_rank *r = &g->ranks[i];
		void *p = NULL;
		if (kcuda_device_set(r->device) || kcuda_alloc(sizeof(float), &p) ||
		    kcuda_memset(r->kc, p, 0, sizeof(float)) || kcuda_sync(r->kc)) {
			kcuda_free(p);
			rc = errbuf_set(e, -ENOMEM, "TP over GPUs: cannot allocate on device %d", r->device);
			goto fail;
		}
		r->scratch = p;
		comms[i] = (struct tp_comm){.rank = i, .size = size, .ops = &nccl_ops, .impl = r};
	}
	/* TANDEM_TP_ONESHOT=1: sums of up to 64 K floats (a decode step's, up to ~10 tokens of GLM-5) go
	 * through tandem's one-shot kernel instead of NCCL when every GPU pair has peer access; NCCL
	 * keeps the larger ones. Opt-in until measured against NCCL on several GPUs. */
	const char *os = getenv("TANDEM_TP_ONESHOT");
	if (os && strcmp(os, "1") == 0) {
		struct kcuda_ctx *kcs[8];
		char why[256] = "";
		int arc = size <= 8 ? 0 : ERR_UNSUPPORTED;
		for (int i = 0; i < size && !arc; i++)
			kcs[i] = ctxs[i];
		if (!arc)
			arc = kcuda_ar_create(size, kcs, 65536, g->timeout_s, &g->ar, why, sizeof(why));
		if (arc)
			LOG_WARN("tp", "TANDEM_TP_ONESHOT=1: not used (%s); NCCL does every all-reduce",
			         size > 8 ? "more than 8 ranks" : why);
		else
			LOG_INFO("tp", "one-shot all-reduce for sums up to %zu floats, NCCL above",
			         kcuda_ar_max_floats(g->ar));
	}
	LOG_INFO("tp", "NCCL %d.%d.%d: %d ranks as threads, GPUs %d..%d, %s communicators, deadline %.0f s",
	         nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100, size, g->ranks[0].device,
	         g->ranks[size - 1].device, blocking ? "blocking" : "non-blocking", g->timeout_s);
	*out = g;
	return 0;
fail:
	tp_nccl_group_destroy(g);
	return rc;
#endif
}
