/* The eager-step op profiler (prof.h): CUDA event pairs around each op on the context's stream,
 * summed per (name, sub) after the step. Events are created once and reused step after step (the
 * pool grows to the largest step seen), so a profiled step allocates nothing on the device. The
 * event pairs measure GPU time between the two records, which includes the idle time when the
 * host launches slower than the GPU runs: the launch count per op shows where that can be. */
#include <cublas_v2.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/prof.h"

extern "C" {
unsigned long long kcuda_n_launch = 0;
struct kprof *kprof_active = NULL;
}
static int kprof_on = 1;
/* the live profilers (kprof_report_open prints each one's open table, in slot order; a backend
 * keeps one for decode steps and one for prompt steps, so their tables do not reset each other) */
#define KPROF_LIVE 8
static struct kprof *kprof_live[KPROF_LIVE];

extern "C" void kprof_set_enabled(int on)
{
	kprof_on = on != 0;
}

extern "C" int kprof_is_enabled(void)
{
	return kprof_on;
}

extern "C" int kfwd_bf16_tflops(struct kcuda_ctx *c, int n, int reps, double *tflops)
{
	void *a = NULL, *b = NULL, *d = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	const float one = 1.0f, zero = 0.0f;
	const size_t nn = (size_t)n * (size_t)n;
	cublasHandle_t h = (cublasHandle_t)c->cublas;
	int rc = ERR_CUDA;
	float ms = 0;
	*tflops = 0;
	if (cudaMalloc(&a, nn * 2) != cudaSuccess || cudaMalloc(&b, nn * 2) != cudaSuccess ||
	    cudaMalloc(&d, nn * 4) != cudaSuccess)
		goto cleanup;
	if (cudaMemsetAsync(a, 0, nn * 2, c->stream) != cudaSuccess ||
	    cudaMemsetAsync(b, 0, nn * 2, c->stream) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
	    cudaEventCreate(&e1) != cudaSuccess)
		goto cleanup;
	for (int i = 0; i <= reps; i++) {
		if (i == 1 && cudaEventRecord(e0, c->stream) != cudaSuccess) /* the first one warms up */
			goto cleanup;
		if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
		                 CUDA_R_16BF, n, &zero, d, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
		                 CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
			goto cleanup;
	}
	if (cudaEventRecord(e1, c->stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
	    cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess || ms <= 0)
		goto cleanup;
	*tflops = 2.0 * (double)n * (double)n * (double)n * reps / (ms * 1e-3) / 1e12;
	rc = 0;
cleanup:
	if (rc)
		(void)cudaGetLastError(); /* not sticky: keep it from failing the next op's launch check */
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	cudaFree(d);
	return rc;
}

#define KPROF_DEPTH 8
#define KPROF_KEYS 256

struct kprof_key {
	const char *name, *sub;
	int depth;
	double ms, bytes;
	unsigned long long calls, launches;
};

struct kprof_rec {
	int key, e0, e1;
	unsigned long long l0, launches;
	double bytes;
};

/* events reused step after step (eager), or owned by one captured graph (a segment) */
struct kprof_evset {
	cudaEvent_t *ev;
	int n_ev, cap_ev, used_ev;
};

/* what a captured graph records on every replay: its event nodes and the ops between them */
struct kprof_seg {
	struct kprof_evset es;
	struct kprof_rec *rec;
	int n_rec;
	unsigned long long launches;
	char shape[96];
};

struct kprof {
	cudaStream_t st;
	struct kprof_evset eager, *es; /* es: the set records go to (eager, or the capture's) */
	struct kprof_seg *cap; /* the segment being captured, or NULL */
	struct kprof_seg *prep; /* made by kprof_capture_prepare for the next capture */
	int max_ev; /* most events one step used */
	struct kprof_rec *rec;
	int n_rec, cap_rec;
	int stack[KPROF_DEPTH], depth;
	struct kprof_key keys[KPROF_KEYS];
	int n_keys;
	char shape[96];
	int seen; /* steps of this shape, the warm-up included */
	int steps; /* steps counted */
	double step_ms;
	unsigned long long step_launches, l_step0;
	bool open, broken;
};

/* the next event of the current set, recorded on the stream (inside a capture: as an event
 * record node of the graph); -1 on failure (the error is cleared: it must not fail an op) */
static int ev_take(struct kprof *p)
{
	struct kprof_evset *s = p->es;
	if (s->used_ev == s->n_ev && p->cap)
		return -1; /* no cudaEventCreate inside a capture: the segment's events are made before */
	if (s->used_ev == s->n_ev) {
		if (s->n_ev == s->cap_ev) {
			int cap = s->cap_ev ? 2 * s->cap_ev : 4096;
			cudaEvent_t *ne = (cudaEvent_t *)realloc(s->ev, sizeof(cudaEvent_t) * (size_t)cap);
			if (!ne)
				return -1;
			s->ev = ne;
			s->cap_ev = cap;
		}
		if (cudaEventCreate(&s->ev[s->n_ev]) != cudaSuccess) {
			(void)cudaGetLastError();
			return -1;
		}
		s->n_ev++;
	}
	int i = s->used_ev++;
	cudaError_t e = p->cap ? cudaEventRecordWithFlags(s->ev[i], p->st, cudaEventRecordExternal)
	                       : cudaEventRecord(s->ev[i], p->st);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return -1;
	}
	return i;
}

static void evset_fini(struct kprof_evset *s)
{
	for (int i = 0; i < s->n_ev; i++)
		cudaEventDestroy(s->ev[i]);
	free(s->ev);
	memset(s, 0, sizeof(*s));
}

static int key_of(struct kprof *p, const char *name, const char *sub, int depth)
{
	for (int i = 0; i < p->n_keys; i++) {
		const struct kprof_key *k = &p->keys[i];
		if (k->depth == depth && (k->name == name || !strcmp(k->name, name)) &&
		    (k->sub == sub || (k->sub && sub && !strcmp(k->sub, sub))))
			return i;
	}
	if (p->n_keys == KPROF_KEYS)
		return -1;
	struct kprof_key *k = &p->keys[p->n_keys];
	memset(k, 0, sizeof(*k));
	k->name = name;
	k->sub = sub;
	k->depth = depth;
	return p->n_keys++;
}

extern "C" int kprof_create(struct kcuda_ctx *c, struct kprof **out)
{
	*out = NULL;
	struct kprof *p = (struct kprof *)calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->st = c->stream;
	p->es = &p->eager;
	for (int i = 0; i < KPROF_LIVE; i++)
		if (!kprof_live[i]) {
			kprof_live[i] = p;
			break;
		}
	*out = p;
	return 0;
}

static void use_shape(struct kprof *p, const char *shape)
{
	if (strncmp(p->shape, shape, sizeof(p->shape) - 1) != 0) {
		kprof_report(p, stdout);
		snprintf(p->shape, sizeof(p->shape), "%s", shape);
		p->seen = 0;
	}
}

extern "C" void kprof_step_begin(struct kprof *p, const char *shape)
{
	use_shape(p, shape);
	p->es = &p->eager;
	p->cap = NULL;
	p->es->used_ev = 0;
	p->n_rec = 0;
	p->depth = 0;
	p->broken = false;
	p->l_step0 = kcuda_n_launch;
	p->open = ev_take(p) == 0;
}

extern "C" void kprof_push(struct kprof *p, const char *name, const char *sub, double bytes)
{
	if (!p->open || p->broken)
		return;
	if (p->depth == KPROF_DEPTH || p->n_rec == INT32_MAX / 2) {
		p->broken = true;
		return;
	}
	if (p->n_rec == p->cap_rec) {
		int cap = p->cap_rec ? 2 * p->cap_rec : 4096;
		struct kprof_rec *nr = (struct kprof_rec *)realloc(p->rec, sizeof(*nr) * (size_t)cap);
		if (!nr) {
			p->broken = true;
			return;
		}
		p->rec = nr;
		p->cap_rec = cap;
	}
	int k = key_of(p, name, sub, p->depth);
	int e = ev_take(p);
	if (k < 0 || e < 0) {
		p->broken = true;
		return;
	}
	struct kprof_rec *r = &p->rec[p->n_rec];
	r->key = k;
	r->e0 = e;
	r->e1 = -1;
	r->l0 = kcuda_n_launch;
	r->launches = 0;
	r->bytes = bytes;
	p->stack[p->depth++] = p->n_rec++;
}

extern "C" void kprof_pop(struct kprof *p)
{
	if (!p->open || p->broken || p->depth == 0)
		return;
	struct kprof_rec *r = &p->rec[p->stack[--p->depth]];
	r->launches = kcuda_n_launch - r->l0;
	if ((r->e1 = ev_take(p)) < 0)
		p->broken = true;
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
	float t = 0;
	if (cudaEventElapsedTime(&t, a, b) != cudaSuccess) {
		(void)cudaGetLastError();
		t = 0;
	}
	return t;
}

/* one completed step's records (events ev[0] .. ev[e_last]) into the open table */
static void add_step(struct kprof *p, const struct kprof_rec *rec, int n_rec, cudaEvent_t *ev, int e_last,
                     unsigned long long launches)
{
	p->step_ms += elapsed_ms(ev[0], ev[e_last]);
	p->step_launches += launches;
	p->steps++;
	for (int i = 0; i < n_rec; i++) {
		const struct kprof_rec *r = &rec[i];
		struct kprof_key *k = &p->keys[r->key];
		k->ms += r->e1 >= 0 ? elapsed_ms(ev[r->e0], ev[r->e1]) : 0.0f;
		k->calls++;
		k->launches += r->launches;
		k->bytes += r->bytes;
	}
}

extern "C" int kprof_step_end(struct kprof *p)
{
	if (!p->open || p->cap)
		return 0;
	p->open = false;
	int e1 = ev_take(p);
	if (p->es->used_ev > p->max_ev)
		p->max_ev = p->es->used_ev;
	if (e1 < 0 || cudaEventSynchronize(p->es->ev[e1]) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0; /* no profile of this step; the step itself reports its own errors */
	}
	if (p->broken || p->depth != 0 || p->seen++ == 0) /* warm-up step of this shape, or unusable */
		return 0;
	add_step(p, p->rec, p->n_rec, p->es->ev, e1, kcuda_n_launch - p->l_step0);
	return 0;
}

extern "C" int kprof_capture_prepare(struct kprof *p, const char *shape)
{
	kprof_seg_destroy(p->prep);
	p->prep = (struct kprof_seg *)calloc(1, sizeof(*p->prep));
	if (!p->prep)
		return -ENOMEM;
	struct kprof_seg *g = p->prep;
	snprintf(g->shape, sizeof(g->shape), "%s", shape);
	/* twice the events of the largest step seen so far, at least 16k: a step records 2 per op */
	int want = 2 * (p->max_ev > 8192 ? p->max_ev : 8192);
	g->es.ev = (cudaEvent_t *)malloc(sizeof(cudaEvent_t) * (size_t)want);
	if (!g->es.ev)
		return -ENOMEM;
	g->es.cap_ev = want;
	for (; g->es.n_ev < want; g->es.n_ev++)
		if (cudaEventCreate(&g->es.ev[g->es.n_ev]) != cudaSuccess) {
			(void)cudaGetLastError();
			kprof_seg_destroy(g);
			p->prep = NULL;
			return ERR_CUDA;
		}
	return 0;
}

extern "C" void kprof_capture_begin(struct kprof *p)
{
	struct kprof_seg *g = p->prep;
	p->prep = NULL;
	p->open = false;
	if (!g)
		return;
	p->cap = g;
	p->es = &g->es;
	p->n_rec = 0;
	p->depth = 0;
	p->broken = false;
	p->l_step0 = kcuda_n_launch;
	p->open = ev_take(p) == 0;
}

extern "C" struct kprof_seg *kprof_capture_end(struct kprof *p)
{
	struct kprof_seg *g = p->cap;
	int e1 = p->open && g ? ev_take(p) : -1;
	if (g && g->es.used_ev > p->max_ev)
		p->max_ev = g->es.used_ev;
	p->open = false;
	p->cap = NULL;
	p->es = &p->eager;
	if (!g)
		return NULL;
	if (e1 < 0 || p->broken || p->depth != 0 ||
	    !(g->rec = (struct kprof_rec *)malloc(sizeof(*g->rec) * (size_t)(p->n_rec + 1)))) {
		kprof_seg_destroy(g);
		return NULL;
	}
	memcpy(g->rec, p->rec, sizeof(*g->rec) * (size_t)p->n_rec);
	g->n_rec = p->n_rec;
	g->launches = kcuda_n_launch - p->l_step0;
	return g;
}

extern "C" int kprof_seg_collect(struct kprof *p, struct kprof_seg *g)
{
	if (!g || g->es.used_ev < 1)
		return 0;
	const int e_last = g->es.used_ev - 1;
	if (cudaEventSynchronize(g->es.ev[e_last]) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	use_shape(p, g->shape);
	if (p->seen++ == 0) /* the replay right after the capture: warm-up */
		return 0;
	add_step(p, g->rec, g->n_rec, g->es.ev, e_last, g->launches);
	return 0;
}

extern "C" void kprof_seg_destroy(struct kprof_seg *g)
{
	if (!g)
		return;
	evset_fini(&g->es);
	free(g->rec);
	free(g);
}

/* order of the report: top-level rows by time, each followed by its nested rows by time */
static int cmp_ms(const void *a, const void *b)
{
	const struct kprof_key *x = *(const struct kprof_key *const *)a,
	                       *y = *(const struct kprof_key *const *)b;
	return (x->ms < y->ms) - (x->ms > y->ms);
}

extern "C" void kprof_report(struct kprof *p, FILE *f)
{
	if (p->steps > 0) {
		const double n = p->steps, step_us = 1e3 * p->step_ms / n;
		const double launches = (double)p->step_launches / n;
		double top_us = 0;
		for (int i = 0; i < p->n_keys; i++)
			if (p->keys[i].depth == 0)
				top_us += 1e3 * p->keys[i].ms / n;
		fprintf(
		    f,
		    "cuda profile: %s, %d eager steps: %.0f us/step, %.0f kernel launches/step (launch-bound "
		    "estimate at ~3 us each: %.1f ms)\n",
		    p->shape, p->steps, step_us, launches, launches * 3e-3);
		fprintf(f, "  %-28s %-6s %9s %9s %10s %6s %8s\n", "op", "type", "calls/st", "launch/st",
		        "us/step", "%step", "GB/s");
		struct kprof_key *ord[KPROF_KEYS];
		int n_ord = 0;
		for (int i = 0; i < p->n_keys; i++)
			if (p->keys[i].calls) /* keys of other shapes stay in the list unused */
				ord[n_ord++] = &p->keys[i];
		qsort(ord, (size_t)n_ord, sizeof(ord[0]), cmp_ms);
		for (int i = 0; i < n_ord; i++) {
			const struct kprof_key *k = ord[i];
			if (k->depth != 0)
				continue;
			for (int pass = 0; pass < 2; pass++)
				for (int j = 0; j < n_ord; j++) {
					const struct kprof_key *q = ord[j];
					/* pass 0: the row itself; pass 1: rows nested under a name
					 * that starts with this row's name */
					if (pass == 0
					        ? q != k
					        : q->depth == 0 || strncmp(q->name, k->name, strlen(k->name)))
						continue;
					const double us = 1e3 * q->ms / n;
					fprintf(f, "  %s%-*s %-6s %9.1f %9.1f %10.1f %5.1f%% %8.1f\n",
					        q->depth ? "  " : "", q->depth ? 26 : 28, q->name,
					        q->sub ? q->sub : "-", (double)q->calls / n,
					        (double)q->launches / n, us, 100.0 * us / step_us,
					        q->ms > 0 ? q->bytes / (q->ms * 1e-3) / 1e9 : 0.0);
				}
		}
		fprintf(f, "  %-28s %-6s %9s %9s %10.1f %5.1f%%\n", "(between ops: host gaps)", "-", "", "",
		        step_us - top_us, 100.0 * (step_us - top_us) / step_us);
		fflush(f);
	}
	for (int i = 0; i < p->n_keys; i++) {
		p->keys[i].ms = p->keys[i].bytes = 0;
		p->keys[i].calls = p->keys[i].launches = 0;
	}
	p->steps = 0;
	p->step_ms = 0;
	p->step_launches = 0;
}

extern "C" void kprof_report_open(FILE *f)
{
	for (int i = 0; i < KPROF_LIVE; i++)
		if (kprof_live[i])
			kprof_report(kprof_live[i], f);
}

extern "C" void kprof_destroy(struct kprof *p)
{
	if (!p)
		return;
	kprof_report(p, stdout);
	if (kprof_active == p)
		kprof_active = NULL;
	for (int i = 0; i < KPROF_LIVE; i++)
		if (kprof_live[i] == p)
			kprof_live[i] = NULL;
	kprof_seg_destroy(p->cap);
	kprof_seg_destroy(p->prep);
	evset_fini(&p->eager);
	free(p->rec);
	free(p);
}
