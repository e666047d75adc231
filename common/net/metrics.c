/* Prometheus metrics registry (see metrics.h). Values are doubles stored as atomic 64-bit
 * patterns (add = compare-and-swap loop) so any thread may update; rendering reads them without
 * locks (a scrape may see a histogram mid-update by one observation: acceptable for monitoring). */
#include "common/net/metrics.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIST_MAX 32

const double metrics_latency_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
const int metrics_n_latency_bounds =
    (int)(sizeof(metrics_latency_bounds) / sizeof(metrics_latency_bounds[0]));

struct metric {
	enum metric_type type;
	char *name, *labels, *help;
	_Atomic uint64_t value; /* double bits: counter/gauge value, histogram sum */
	int n_bounds;
	double bounds[HIST_MAX];
	_Atomic uint64_t buckets[HIST_MAX + 1]; /* non-cumulative counts; last = +Inf */
	_Atomic uint64_t count;
	struct metric *next;
};

struct metrics {
	char *const_labels;
	struct metric *head, *tail;
};

static uint64_t d2u(double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	return u;
}

static double u2d(uint64_t u)
{
	double d;
	memcpy(&d, &u, 8);
	return d;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
	uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(a, &old, d2u(u2d(old) + v), memory_order_relaxed,
	                                              memory_order_relaxed))
		;
}

struct metrics *metrics_create(const char *const_labels)
{
	struct metrics *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->const_labels = strdup(const_labels ? const_labels : "");
	if (!r->const_labels) {
		free(r);
		return NULL;
	}
	return r;
}

void metrics_destroy(struct metrics *r)
{
	if (!r)
		return;
	for (struct metric *m = r->head, *n; m; m = n) {
		n = m->next;
		free(m->name);
		free(m->labels);
		free(m->help);
		free(m);
	}
	free(r->const_labels);
	free(r);
}

static int valid_name(const char *s)
{
	if (!s || !*s || !(((*s | 32) >= 'a' && (*s | 32) <= 'z') || *s == '_' || *s == ':'))
		return 0;
	for (; *s; s++)
		if (!(((*s | 32) >= 'a' && (*s | 32) <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' ||
		      *s == ':'))
			return 0;
	return 1;
}

static struct metric *add(struct metrics *r, enum metric_type t, const char *name, const char *labels,
                          const char *help)
{
	if (!r || !valid_name(name) || (labels && strpbrk(labels, "{}\n")))
		return NULL;
	struct metric *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->type = t;
	m->name = strdup(name);
	m->labels = strdup(labels ? labels : "");
	m->help = strdup(help ? help : "");
	if (!m->name || !m->labels || !m->help) {
		free(m->name);
		free(m->labels);
		free(m->help);
		free(m);
		return NULL;
	}
	/* keep families together: insert after the last series of the same name */
	struct metric *after = NULL;
	for (struct metric *p = r->head; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			after = p;
	if (after) {
		m->next = after->next;
		after->next = m;
		if (r->tail == after)
			r->tail = m;
	} else {
		if (r->tail)
			r->tail->next = m;
		else
			r->head = m;
		r->tail = m;
	}
	return m;
}

struct metric *metrics_counter(struct metrics *r, const char *name, const char *labels, const char *help)
{
	return add(r, METRIC_COUNTER, name, labels, help);
}

struct metric *metrics_gauge(struct metrics *r, const char *name, const char *labels, const char *help)
{
	return add(r, METRIC_GAUGE, name, labels, help);
}

struct metric *metrics_histogram(struct metrics *r, const char *name, const char *labels, const char *help,
                                 const double *bounds, int n_bounds)
{
	if (n_bounds < 1 || n_bounds > HIST_MAX)
		return NULL;
	for (int i = 1; i < n_bounds; i++)
		if (!(bounds[i] > bounds[i - 1]))
			return NULL;
	struct metric *m = add(r, METRIC_HISTOGRAM, name, labels, help);
	if (!m)
		return NULL;
	m->n_bounds = n_bounds;
	memcpy(m->bounds, bounds, (size_t)n_bounds * sizeof(double));
	return m;
}

void metrics_add(struct metric *m, double v)
{
	if (m && m->type != METRIC_HISTOGRAM)
		atomic_add_double(&m->value, v);
}

void metrics_set(struct metric *m, double v)
{
	if (m && m->type == METRIC_GAUGE)
		atomic_store_explicit(&m->value, d2u(v), memory_order_relaxed);
}

void metrics_observe(struct metric *m, double v)
{
	if (!m || m->type != METRIC_HISTOGRAM)
		return;
	int b = 0;
	while (b < m->n_bounds && v > m->bounds[b])
		b++;
	atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed);
	atomic_add_double(&m->value, v);
}

double metrics_value(const struct metric *m)
{
	if (!m)
		return 0;
	if (m->type == METRIC_HISTOGRAM)
		return (double)atomic_load_explicit(&((struct metric *)m)->count, memory_order_relaxed);
	return u2d(atomic_load_explicit(&((struct metric *)m)->value, memory_order_relaxed));
}

/* shortest text that reads back as the same double (0.0005, not 0.00050000000000000001) */
static void fmt_double(char *buf, size_t cap, double v)
{
	for (int prec = 6; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

/* writes "{const,labels[,extra]}" (or nothing when all are empty) */
static void put_labels(FILE *f, const char *c, const char *l, const char *extra)
{
	const char *parts[3] = {c, l, extra};
	int n = 0;
	for (int i = 0; i < 3; i++) {
		if (!parts[i] || !*parts[i])
			continue;
		fputs(n++ ? "," : "{", f);
		fputs(parts[i], f);
	}
	if (n)
		fputc('}', f);
}

int metrics_render(struct metrics *r, char **out, size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return -ENOMEM;
	static const char *types[] = {"counter", "gauge", "histogram"};
	const char *last_name = "";
	for (struct metric *m = r->head; m; m = m->next) {
		if (strcmp(m->name, last_name) != 0) {
			fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, types[m->type]);
			last_name = m->name;
		}
		if (m->type != METRIC_HISTOGRAM) {
			fputs(m->name, f);
			put_labels(f, r->const_labels, m->labels, NULL);
			char v[40];
			fmt_double(v, sizeof(v), metrics_value(m));
			fprintf(f, " %s\n", v);
			continue;
		}
		uint64_t cum = 0;
		char le[64];
		for (int b = 0; b <= m->n_bounds; b++) {
			cum += atomic_load_explicit(&m->buckets[b], memory_order_relaxed);
			if (b < m->n_bounds) {
				char v[40];
				fmt_double(v, sizeof(v), m->bounds[b]);
				snprintf(le, sizeof(le), "le=\"%s\"", v);
			} else
				snprintf(le, sizeof(le), "le=\"+Inf\"");
			fprintf(f, "%s_bucket", m->name);
			put_labels(f, r->const_labels, m->labels, le);
			fprintf(f, " %llu\n", (unsigned long long)cum);
		}
		fprintf(f, "%s_sum", m->name);
		put_labels(f, r->const_labels, m->labels, NULL);
		char v[40];
		fmt_double(v, sizeof(v), u2d(atomic_load_explicit(&m->value, memory_order_relaxed)));
		fprintf(f, " %s\n", v);
		fprintf(f, "%s_count", m->name);
		put_labels(f, r->const_labels, m->labels, NULL);
		fprintf(f, " %llu\n", (unsigned long long)cum);
	}
	if (fclose(f) != 0) {
		free(buf);
		return -ENOMEM;
	}
	*out = buf;
	*len = n;
	return 0;
}
