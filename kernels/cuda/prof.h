/* Per-op profile of eager CUDA steps (TANDEM_CUDA_PROFILE=1, `tandem bench --profile`; decode steps
 * and prompt chunks, the latter in a profiler of their own, shape "prefill N tokens per step"): the model's
 * CUDA backend brackets every op with kprof_push / kprof_pop, which record a CUDA event pair on the
 * context's stream; kprof_step_end waits for the step and adds each pair's elapsed time, the call
 * count, the kernel launches (kcuda_n_launch delta) and the bytes the op reads to a table keyed by
 * (name, sub). Ops may nest (moe -> its stages); nested rows are reported indented and not added
 * to the step total. Tables are per step shape (batch x context): a new shape prints the previous
 * table, the first step of each shape is a warm-up and not counted. Nothing here runs unless the
 * backend created a profiler. Host-only API, callable from C. */
#ifndef TANDEM_KERNELS_CUDA_PROF_H
#define TANDEM_KERNELS_CUDA_PROF_H

#include <stdio.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_CUDA) || defined(__CUDACC__)
struct kprof;
/* kernel launches made through the kcuda_* ops so far (cuBLAS launches are not counted) */
extern unsigned long long kcuda_n_launch;
/* the profiler the kcuda_* ops may mark their stages in (NULL: none) */
extern struct kprof *kprof_active;

/* profiling of new steps on (default) or off, for every profiler of the process (the bench
 * times with it off and profiles with it on, on one loaded model) */
void kprof_set_enabled(int on);
int kprof_is_enabled(void);
/* the cuBLAS bf16 GEMM rate (n x n x n, fp32 accumulate) in TFLOP/s, the tensor-core roofline */
int kfwd_bf16_tflops(struct kcuda_ctx *c, int n, int reps, double *tflops);

int kprof_create(struct kcuda_ctx *c, struct kprof **out);
void kprof_destroy(struct kprof *p); /* prints the open table first; NULL ok */
/* shape label of this step (copied); a different label than the last prints and resets */
void kprof_step_begin(struct kprof *p, const char *shape);
/* name and sub must be string literals (or live as long as p); bytes: what the op reads */
void kprof_push(struct kprof *p, const char *name, const char *sub, double bytes);
void kprof_pop(struct kprof *p);
int kprof_step_end(struct kprof *p); /* waits for the step's events; 0 or ERR_CUDA */
void kprof_report(struct kprof *p, FILE *f); /* prints the open table, then resets it */
void kprof_report_open(FILE *f); /* kprof_report of every live profiler of the process (slot order) */

/* Graph mode (TANDEM_CUDA_PROFILE=graph): the pushes / pops of a step being captured become event
 * record nodes of the graph (a segment, owned by the caller with the graph); after each replay of
 * that graph, kprof_seg_collect adds its times to the table of the segment's shape (the first
 * replay is a warm-up). The times are then those of graph replay: no host launch gaps. */
struct kprof_seg;
/* before the capture begins: the segment and its events (no cudaEventCreate inside a capture) */
int kprof_capture_prepare(struct kprof *p, const char *shape);
void kprof_capture_begin(struct kprof *p); /* right after the capture began */
struct kprof_seg *kprof_capture_end(struct kprof *p); /* right before it ends; NULL: unusable */
int kprof_seg_collect(struct kprof *p, struct kprof_seg *g); /* after the replay (waits for it) */
void kprof_seg_destroy(struct kprof_seg *g); /* NULL ok */
#endif

#ifdef __cplusplus
}
#endif
#endif
