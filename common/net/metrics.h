/* A small Prometheus metrics registry (text exposition format 0.0.4), shared by every process.
 * Router helper: use this for the router's /metrics too (serve metrics_render() output).
 *
 * Metrics are registered at start-up and live as long as the registry; updates are lock-free
 * (C11 atomics) so engine threads update them while the loop thread renders. One metric = one
 * series: `labels` is a fixed label set in Prometheus syntax without braces ("outcome=\"ok\"") or
 * NULL; several series of one family share name, help and type (register each label set). The
 * registry's constant labels (role, worker name) are added to every series.
 * House rule (DESIGN.md section 8): register nothing that nothing updates. */
#ifndef TANDEM_NET_METRICS_H
#define TANDEM_NET_METRICS_H

#include <stddef.h>

#include "common/base/err.h"

struct metrics;
struct metric;

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

/* const_labels: e.g. "role=\"decode\",worker=\"decode-0\"" or NULL. */
struct metrics *metrics_create(const char *const_labels);
void metrics_destroy(struct metrics *r); /* NULL is fine */

/* Registration returns NULL only when out of memory or when name/labels are malformed (not
 * [a-zA-Z_:][a-zA-Z0-9_:]*); the update functions accept NULL and then do nothing. */
struct metric *metrics_counter(struct metrics *r, const char *name, const char *labels, const char *help);
struct metric *metrics_gauge(struct metrics *r, const char *name, const char *labels, const char *help);
/* bounds: increasing upper bounds (the +Inf bucket is implicit), at most 32. */
struct metric *metrics_histogram(struct metrics *r, const char *name, const char *labels, const char *help,
                                 const double *bounds, int n_bounds);

void metrics_add(struct metric *m, double v); /* counter (v >= 0) or gauge */
void metrics_set(struct metric *m, double v); /* gauge */
void metrics_observe(struct metric *m, double v); /* histogram */
double metrics_value(const struct metric *m); /* counter/gauge value; histogram: count */

/* Renders every metric; *out is malloc'd, NUL-terminated. */
int metrics_render(struct metrics *r, char **out, size_t *len) TD_MUST_CHECK;

/* Bucket bounds in seconds suitable for step times and latencies (0.5 ms .. 60 s). */
extern const double metrics_latency_bounds[];
extern const int metrics_n_latency_bounds;

#endif
