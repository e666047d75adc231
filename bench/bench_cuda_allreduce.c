/* NCCL all-reduce latency across the visible GPUs, through tandem's own communicator (tp_nccl.c:
 * one thread per GPU, collectives on each rank's stream), for the message sizes a decode step
 * reduces: 4 KB, 12 KB (one token of GLM-5's hidden size 6144 in fp32 is 24 KB; DeepSeek-V3's 7168
 * is 28 KB; 12 KB is the reference size), 48 KB, 1 MB, fp32 sum.
 *
 *   bench_cuda_allreduce [--gpus N] [--iters K]
 *
 * Each size is timed eagerly (K all-reduces enqueued back to back, then one wait: time per op) and
 * from a CUDA graph holding 100 all-reduces (launched K/100 times: time per op), which is how the
 * decode step runs them. NCCL reads its environment once per process, so the bench runs itself
 * twice: NCCL_PROTO unset (NCCL's choice) and NCCL_PROTO=LL. NCCL_NVLS_ENABLE=0 as in tandem.
 * Before timing, one all-reduce of (rank + 1) is checked to give T(T+1)/2 on every rank. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/model/tp.h"
#include "kernels/kernels.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: bench_cuda_allreduce: built without CUDA\n");
	return 0;
}
#else
#include "kernels/cuda/model_fwd.h"

#define N_SIZES 4
static const size_t sizes[N_SIZES] = {4096, 12288, 49152, 1048576};
#define PER_GRAPH 100

struct shared {
	int T, iters;
	struct tp_comm comms[8];
	struct kcuda_ctx *kc[8];
	pthread_barrier_t bar;
	double eager_us[N_SIZES], graph_us[N_SIZES];
	int bad;
};

struct targ {
	struct shared *s;
	int rank;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *rank_main(void *p)
{
	struct targ *a = p;
	struct shared *s = a->s;
	int r = a->rank;
	struct tp_comm *c = &s->comms[r];
	struct kcuda_ctx *kc = s->kc[r];
	float *buf = NULL;
	size_t maxf = sizes[N_SIZES - 1] / sizeof(float);
	if (kcuda_device_set(kcuda_ctx_device(kc)) || kcuda_alloc(maxf * sizeof(float), (void **)&buf)) {
		s->bad = 1;
		return NULL;
	}
	/* correctness: (r + 1) everywhere, summed -> T(T+1)/2 */
	float *h = malloc(maxf * sizeof(float));
	for (size_t i = 0; i < maxf; i++)
		h[i] = (float)(r + 1);
	int rc = kcuda_upload(kc, buf, h, maxf * sizeof(float));
	rc = rc ? rc : tp_all_reduce_sum(c, buf, maxf);
	rc = rc ? rc : tp_nccl_wait(c);
	rc = rc ? rc : kcuda_download(kc, h, buf, maxf * sizeof(float));
	float want = (float)(s->T * (s->T + 1) / 2);
	for (size_t i = 0; i < maxf && !rc; i++)
		if (h[i] != want) {
			fprintf(stderr, "rank %d: element %zu = %g after the all-reduce, want %g\n", r, i,
			        h[i], want);
			rc = -1;
		}
	free(h);
	if (rc || kcuda_memset(kc, buf, 0, maxf * sizeof(float))) {
		s->bad = 1;
		fprintf(stderr, "rank %d: all-reduce check failed (%d)\n", r, rc);
	}
	pthread_barrier_wait(&s->bar);
	for (int si = 0; si < N_SIZES; si++) { /* every rank meets every barrier */
		size_t n = sizes[si] / sizeof(float);
		for (int i = 0; i < 20; i++) /* warm-up */
			rc = rc ? rc : tp_all_reduce_sum(c, buf, n);
		rc = rc ? rc : tp_nccl_wait(c);
		pthread_barrier_wait(&s->bar);
		double t0 = now_s();
		for (int i = 0; i < s->iters; i++)
			rc = rc ? rc : tp_all_reduce_sum(c, buf, n);
		rc = rc ? rc : tp_nccl_wait(c);
		double t1 = now_s();
		if (r == 0)
			s->eager_us[si] = 1e6 * (t1 - t0) / s->iters;
		/* graph of PER_GRAPH all-reduces, every rank captures the same */
		void *ex = NULL;
		if (!rc && kfwd_graph_begin(kc) == 0) {
			for (int i = 0; i < PER_GRAPH; i++)
				rc = rc ? rc : tp_all_reduce_sum(c, buf, n);
			int rc2 = kfwd_graph_end(kc, &ex);
			rc = rc ? rc : rc2;
		} else {
			rc = rc ? rc : ERR_CUDA;
		}
		int reps = s->iters / PER_GRAPH > 0 ? s->iters / PER_GRAPH : 1;
		rc = rc ? rc : kfwd_graph_launch(kc, ex); /* warm */
		rc = rc ? rc : tp_nccl_wait(c);
		pthread_barrier_wait(&s->bar);
		t0 = now_s();
		for (int i = 0; i < reps; i++)
			rc = rc ? rc : kfwd_graph_launch(kc, ex);
		rc = rc ? rc : tp_nccl_wait(c);
		t1 = now_s();
		kfwd_graph_destroy(ex);
		if (r == 0)
			s->graph_us[si] = 1e6 * (t1 - t0) / ((double)reps * PER_GRAPH);
		if (rc) {
			fprintf(stderr, "rank %d: %zu bytes: error %d (%s)\n", r, sizes[si], rc,
			        err_name(rc));
			s->bad = 1;
		}
		pthread_barrier_wait(&s->bar);
	}
	kcuda_free(buf);
	return NULL;
}

static int run(int T, int iters)
{
	struct shared s = {.T = T, .iters = iters};
	struct errbuf e = {0};
	for (int r = 0; r < T; r++)
		if (kcuda_ctx_create(r, (size_t)1 << 20, &s.kc[r])) {
			fprintf(stderr, "cannot create a context on GPU %d\n", r);
			return 1;
		}
	struct tp_nccl_group *g = NULL;
	if (tp_nccl_group_create(&g, T, s.kc, s.comms, &e)) {
		fprintf(stderr, "bench_cuda_allreduce: %s\n", e.msg);
		return 1;
	}
	pthread_barrier_init(&s.bar, NULL, (unsigned)T);
	pthread_t th[8];
	struct targ ta[8];
	for (int r = 0; r < T; r++) {
		ta[r] = (struct targ){&s, r};
		if (r > 0)
			pthread_create(&th[r], NULL, rank_main, &ta[r]);
	}
	rank_main(&ta[0]);
	for (int r = 1; r < T; r++)
		pthread_join(th[r], NULL);
	const char *proto = getenv("NCCL_PROTO");
	for (int si = 0; si < N_SIZES && !s.bad; si++)
		printf(
		    "allreduce fp32  %d GPUs  NCCL_PROTO=%-7s %8zu bytes  eager %8.2f us/op  graph (%d per "
		    "graph) %8.2f us/op\n",
		    T, proto ? proto : "default", sizes[si], s.eager_us[si], PER_GRAPH, s.graph_us[si]);
	tp_nccl_group_destroy(g);
	for (int r = 0; r < T; r++)
		kcuda_ctx_destroy(s.kc[r]);
	pthread_barrier_destroy(&s.bar);
	return s.bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	int gpus = 0, iters = 1000, child = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--gpus") && i + 1 < argc)
			gpus = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--child"))
			child = 1;
		else {
			fprintf(stderr, "usage: bench_cuda_allreduce [--gpus N] [--iters K]\n");
			return 2;
		}
	}
	int n = kcuda_device_count();
	if (gpus <= 0 || gpus > n)
		gpus = n < 8 ? n : 8;
	if (gpus < 2) {
		printf("SKIP: bench_cuda_allreduce needs 2 GPUs, %d visible\n", n);
		return 0;
	}
	if (iters < PER_GRAPH)
		iters = PER_GRAPH;
	setenv("TANDEM_NCCL_TIMEOUT_S", "30", 0); /* a broken run ends in seconds, not minutes */
	if (child)
		return run(gpus, iters);
	/* NCCL reads NCCL_PROTO once per process: one child per setting */
	static const char *const protos[] = {NULL, "LL"};
	int bad = 0;
	for (int k = 0; k < 2; k++) {
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			if (protos[k])
				setenv("NCCL_PROTO", protos[k], 1);
			else
				unsetenv("NCCL_PROTO");
			char gs[16], is[16];
			snprintf(gs, sizeof(gs), "%d", gpus);
			snprintf(is, sizeof(is), "%d", iters);
			execl("/proc/self/exe", argv[0], "--child", "--gpus", gs, "--iters", is,
			      (char *)NULL);
			perror("exec");
			_exit(127);
		}
		int st = 0;
		if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
	}
	return bad;
}
#endif
