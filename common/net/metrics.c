/* Prometheus registry (see metrics.h). Values are stored as doubles in 64-bit atomics (bit
 * pattern, compare-and-swap on add) so updates never take a lock; rendering walks the list in
 * registration order and groups metrics of one name under one HELP/TYPE header. */
#include "common/net/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum metric_kind { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

struct metric {
	enum metric_kind kind;
	char name[96];
	char help[160];
	char label_name[32];
	char label_value[64];
	_Atomic uint64_t value; /* double bits */
	int n_bounds;
	double bounds[METRICS_MAX_BUCKETS];
	_Atomic uint64_t buckets[METRICS_MAX_BUCKETS + 1]; /* non-cumulative; last is +Inf */
	_Atomic uint64_t count;
	_Atomic uint64_t sum; /* double bits */
	struct metric *next;
};

struct metrics {
	struct metric *head, *tail;
};

const double metrics_buckets_latency[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
					  2.5, 5, 10, 30, 60, 120};
const int metrics_n_buckets_latency = sizeof(metrics_buckets_latency) / sizeof(double);
const double metrics_buckets_fast[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
				       0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
const int metrics_n_buckets_fast = sizeof(metrics_buckets_fast) / sizeof(double);

static double bits_to_d(uint64_t b)
{
	double d;
	memcpy(&d, &b, sizeof(d));
	return d;
}

static uint64_t d_to_bits(double d)
{
	uint64_t b;
	memcpy(&b, &d, sizeof(b));
	return b;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
	uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(a, &old, d_to_bits(bits_to_d(old) + v), memory_order_relaxed,
						      memory_order_relaxed))
		;
}

struct metrics *metrics_create(void)
{
	return calloc(1, sizeof(struct metrics));
}

void metrics_destroy(struct metrics *m)
{
	if (!m)
		return;
	struct metric *x = m->head;
	while (x) {
		struct metric *n = x->next;
		free(x);
		x = n;
	}
	free(m);
}

static bool valid_name(const char *s, bool label)
{
	if (!s || !*s)
		return false;
	for (const char *p = s; *p; p++) {
		char ch = *p;
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (!label && ch == ':') ||
			  (p != s && ch >= '0' && ch <= '9');
		if (!ok)
			return false;
	}
	return true;
}

static struct metric *add(struct metrics *m, enum metric_kind kind, const char *name, const char *help,
			  const char *label_name, const char *label_value)
{
	if (!m || !valid_name(name, false) || strlen(name) >= sizeof(((struct metric *)0)->name))
		return NULL;
	if (label_name && (!valid_name(label_name, true) || !label_value ||
			   strlen(label_name) >= sizeof(((struct metric *)0)->label_name) ||
			   strlen(label_value) >= sizeof(((struct metric *)0)->label_value) ||
			   strpbrk(label_value, "\"\\\n")))
		return NULL;
	struct metric *x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	x->kind = kind;
	snprintf(x->name, sizeof(x->name), "%s", name);
	snprintf(x->help, sizeof(x->help), "%s", help ? help : "");
	for (char *p = x->help; *p; p++)
		if (*p == '\n' || *p == '\\')
			*p = ' ';
	if (label_name) {
		snprintf(x->label_name, sizeof(x->label_name), "%s", label_name);
		snprintf(x->label_value, sizeof(x->label_value), "%s", label_value);
	}
	if (m->tail)
		m->tail->next = x;
	else
		m->head = x;
	m->tail = x;
	return x;
}

struct metric *metrics_counter(struct metrics *m, const char *name, const char *help, const char *label_name,
			       const char *label_value)
{
	return add(m, METRIC_COUNTER, name, help, label_name, label_value);
}

struct metric *metrics_gauge(struct metrics *m, const char *name, const char *help, const char *label_name,
			     const char *label_value)
{
	return add(m, METRIC_GAUGE, name, help, label_name, label_value);
}

struct metric *metrics_histogram(struct metrics *m, const char *name, const char *help, const double *bounds,
				 int n_bounds)
{
	if (n_bounds < 1 || n_bounds > METRICS_MAX_BUCKETS)
		return NULL;
	for (int i = 1; i < n_bounds; i++)
		if (!(bounds[i] > bounds[i - 1]))
			return NULL;
	struct metric *x = add(m, METRIC_HISTOGRAM, name, help, NULL, NULL);
	if (!x)
		return NULL;
	x->n_bounds = n_bounds;
	memcpy(x->bounds, bounds, (size_t)n_bounds * sizeof(double));
	return x;
}

void metric_add(struct metric *c, double v)
{
	if (!c || c->kind == METRIC_HISTOGRAM)
		return;
	if (c->kind == METRIC_COUNTER && !(v >= 0))
		return; /* counters only go up; ignore NaN and negatives */
	atomic_add_double(&c->value, v);
}

void metric_set(struct metric *g, double v)
{
	if (!g || g->kind != METRIC_GAUGE)
		return;
	atomic_store_explicit(&g->value, d_to_bits(v), memory_order_relaxed);
}

void metric_observe(struct metric *h, double v)
{
	if (!h || h->kind != METRIC_HISTOGRAM || isnan(v))
		return;
	int i = 0;
	while (i < h->n_bounds && v > h->bounds[i])
		i++;
	atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
	atomic_add_double(&h->sum, v);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

double metric_value(const struct metric *c)
{
	if (!c)
		return 0;
	if (c->kind == METRIC_HISTOGRAM)
		return (double)atomic_load_explicit(&((struct metric *)c)->count, memory_order_relaxed);
	return bits_to_d(atomic_load_explicit(&((struct metric *)c)->value, memory_order_relaxed));
}

double metric_hist_sum(const struct metric *h)
{
	return h ? bits_to_d(atomic_load_explicit(&((struct metric *)h)->sum, memory_order_relaxed)) : 0;
}

struct sbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) TD_PRINTF(2, 3);
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	if (b->failed)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->failed = true;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap * 2 + (size_t)n;
		char *np = realloc(b->p, cap);
		if (!np) {
			b->failed = true;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
}

/* Prometheus wants +Inf/-Inf/NaN spelled that way and plain decimal otherwise. */
static void fmt_double(char *out, size_t cap, double v)
{
	if (isnan(v))
		snprintf(out, cap, "NaN");
	else if (isinf(v))
		snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 1e15)
		snprintf(out, cap, "%.0f", v);
	else
		snprintf(out, cap, "%.9g", v);
}

char *metrics_render(const struct metrics *m, size_t *len_out)
{
	struct sbuf b = {malloc(4096), 0, 4096, false};
	if (!b.p)
		return NULL;
	b.p[0] = '\0';
	/* families: print HELP/TYPE at the first metric of each name, then every metric of that name */
	for (const struct metric *x = m->head; x; x = x->next) {
		bool seen = false;
		for (const struct metric *y = m->head; y != x; y = y->next)
			if (strcmp(y->name, x->name) == 0)
				seen = true;
		if (seen)
			continue;
		static const char *types[] = {"counter", "gauge", "histogram"};
		sb_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name, types[x->kind]);
		for (const struct metric *y = x; y; y = y->next) {
			if (strcmp(y->name, x->name) != 0)
				continue;
			char v[64];
			if (y->kind != METRIC_HISTOGRAM) {
				fmt_double(v, sizeof(v), metric_value(y));
				if (y->label_name[0])
					sb_printf(&b, "%s{%s=\"%s\"} %s\n", y->name, y->label_name, y->label_value, v);
				else
					sb_printf(&b, "%s %s\n", y->name, v);
				continue;
			}
			uint64_t cum = 0;
			for (int i = 0; i <= y->n_bounds; i++) {
				cum += atomic_load_explicit(&((struct metric *)y)->buckets[i], memory_order_relaxed);
				if (i < y->n_bounds)
					fmt_double(v, sizeof(v), y->bounds[i]);
				else
					snprintf(v, sizeof(v), "+Inf");
				sb_printf(&b, "%s_bucket{le=\"%s\"} %llu\n", y->name, v, (unsigned long long)cum);
			}
			fmt_double(v, sizeof(v), metric_hist_sum(y));
			sb_printf(&b, "%s_sum %s\n%s_count %llu\n", y->name, v, y->name, (unsigned long long)cum);
		}
	}
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	if (len_out)
		*len_out = b.len;
	return b.p;
}
