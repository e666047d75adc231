/* A small Prometheus metrics registry shared by every role (router, prefill, decode): counters,
 * gauges and histograms, each optionally with one label, rendered in the text exposition format
 * (version 0.0.4). Updates are lock-free atomics, so worker threads may update while the loop
 * thread renders. Metrics are registered once at start-up; the registry owns them.
 *
 * Rule (DESIGN.md §8): register only what something updates. */
#ifndef TANDEM_NET_METRICS_H
#define TANDEM_NET_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define METRICS_MAX_BUCKETS 24

struct metrics;
struct metric;

struct metrics *metrics_create(void);
void metrics_destroy(struct metrics *m); /* accepts NULL */

/* name must match [a-zA-Z_:][a-zA-Z0-9_:]*; label_name/label_value may be NULL for none. Several
 * metrics may share a name with different label values (they render as one family). Returns NULL
 * on a bad name or out of memory. */
struct metric *metrics_counter(struct metrics *m, const char *name, const char *help, const char *label_name,
			       const char *label_value);
struct metric *metrics_gauge(struct metrics *m, const char *name, const char *help, const char *label_name,
			     const char *label_value);
/* bounds: ascending upper bounds (the +Inf bucket is implicit), at most METRICS_MAX_BUCKETS. */
struct metric *metrics_histogram(struct metrics *m, const char *name, const char *help, const double *bounds,
				 int n_bounds);

void metric_add(struct metric *c, double v);  /* counter (v >= 0) or gauge */
void metric_set(struct metric *g, double v);  /* gauge */
void metric_observe(struct metric *h, double v); /* histogram */
double metric_value(const struct metric *c);  /* counter/gauge value; histogram: count */
double metric_hist_sum(const struct metric *h);

/* Renders every metric; returns a malloc'd NUL-terminated string (caller frees) or NULL. */
char *metrics_render(const struct metrics *m, size_t *len_out);

/* Common bucket sets, in seconds. */
extern const double metrics_buckets_latency[];  /* 1 ms .. 120 s */
extern const int metrics_n_buckets_latency;
extern const double metrics_buckets_fast[];     /* 0.1 ms .. 5 s (inter-token) */
extern const int metrics_n_buckets_fast;

#endif
