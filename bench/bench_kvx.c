/* KV transfer bandwidth over UCX between two processes, the way prefill pushes blocks to decode:
 * a "decode" process registers a pool and keeps its worker progressing; a "prefill" process puts
 * n blocks of block_bytes from a registered local buffer into distinct remote blocks and flushes
 * (remote completion), repeatedly. Reports GB/s (1e9 bytes/s) per block size, best of the rounds.
 * Compare with `ucx_perftest -t ucp_put_bw` on the same transport (docs/PERFORMANCE.md).
 *
 *   build/bench/bench_kvx [tls [devices [total_MiB]]]     e.g. bench_kvx tcp lo 512 ; bench_kvx sm,self */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/net/kvx.h"

#define POOL_BYTES (256u << 20)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int xfer(int fd, void *p, size_t n, int wr)
{
	size_t d = 0;
	while (d < n) {
		ssize_t k = wr ? write(fd, (char *)p + d, n - d) : read(fd, (char *)p + d, n - d);
		if (k <= 0)
			return -1;
		d += (size_t)k;
	}
	return 0;
}

static int target(int fd, struct kvx_opts *o)
{
	struct errbuf e;
	struct kvx *x;
	if (kvx_create(&x, o, &e)) {
		fprintf(stderr, "target: %s\n", e.msg);
		return 1;
	}
	uint8_t *pool = NULL;
	struct kvx_region *r;
	if (getenv("BENCH_MALLOC")) {
		pool = aligned_alloc(4096, POOL_BYTES);
		memset(pool, 0, POOL_BYTES);
		if (kvx_region_map(x, pool, POOL_BYTES, &r, &e))
			return 1;
	} else if (kvx_region_alloc(x, POOL_BYTES, (void **)&pool, &r, &e)) {
		fprintf(stderr, "target: %s\n", e.msg);
		return 1;
	}
	const uint8_t *a, *k;
	size_t al, kl;
	kvx_worker_address(x, &a, &al);
	kvx_region_rkey(r, &k, &kl);
	uint64_t base = (uint64_t)(uintptr_t)pool;
	uint32_t l32 = (uint32_t)al, k32 = (uint32_t)kl;
	if (xfer(fd, &l32, 4, 1) || xfer(fd, (void *)a, al, 1) || xfer(fd, &k32, 4, 1) ||
	    xfer(fd, (void *)k, kl, 1) || xfer(fd, &base, 8, 1))
		return 1;
	for (;;) {
		kvx_progress(x);
		if (kvx_arm(x) == 1)
			continue;
		struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = kvx_efd(x), .events = POLLIN}};
		poll(p, 2, 100);
		if (p[0].revents)
			break; /* initiator done (EOF) */
	}
	kvx_region_unmap(x, r);
	kvx_destroy(x);
	return 0;
}

static int initiator(int fd, struct kvx_opts *o, size_t total)
{
	struct errbuf e;
	uint8_t a[4096], k[4096];
	uint32_t al, kl;
	uint64_t base;
	if (xfer(fd, &al, 4, 0) || al > sizeof(a) || xfer(fd, a, al, 0) || xfer(fd, &kl, 4, 0) ||
	    kl > sizeof(k) || xfer(fd, k, kl, 0) || xfer(fd, &base, 8, 0))
		return 1;
	struct kvx *x;
	if (kvx_create(&x, o, &e)) {
		fprintf(stderr, "initiator: %s\n", e.msg);
		return 1;
	}
	uint8_t *src = aligned_alloc(4096, POOL_BYTES);
	memset(src, 0x5a, POOL_BYTES);
	struct kvx_region *lr;
	if (kvx_region_map(x, src, POOL_BYTES, &lr, &e))
		return 1;
	struct kvx_peer *p;
	if (kvx_peer_get(x, a, al, k, kl, &p, &e)) {
		fprintf(stderr, "initiator: %s\n", e.msg);
		return 1;
	}
	printf("transport: %s (resources: %s)\n", kvx_peer_transports(p), kvx_transports(x));
	/* the physical limit on one host: a shared-memory put is one copy; tcp over lo is two */
	uint8_t *dst = aligned_alloc(4096, POOL_BYTES);
	memset(dst, 0, POOL_BYTES);
	double best_copy = 0;
	for (int round = 0; round < 3; round++) {
		double t0 = now_s();
		memcpy(dst, src, POOL_BYTES);
		double g = POOL_BYTES / (now_s() - t0) / 1e9;
		best_copy = g > best_copy ? g : best_copy;
	}
	free(dst);
	printf("memcpy of %u MiB, one core: %.2f GB/s\n", POOL_BYTES >> 20, best_copy);
	printf("%12s %8s %10s %10s\n", "block_bytes", "blocks", "MiB", "GB/s");
	static const size_t sizes[] = {16384, 65536, 262144, 1u << 20, 4u << 20, 7u << 20};
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t bs = sizes[si];
		size_t n_pool = POOL_BYTES / bs;
		size_t n = total / bs;
		double best = 0;
		for (int round = 0; round < 3; round++) {
			double t0 = now_s();
			for (size_t i = 0; i < n; i++) {
				size_t slot =
				    (i * 7) % n_pool; /* scattered block ids, as a real reservation */
				if (kvx_put(x, p, src + slot * bs, lr, bs, base + slot * bs, &e)) {
					fprintf(stderr, "put: %s\n", e.msg);
					return 1;
				}
			}
			if (kvx_flush(x, p, 60000, &e)) {
				fprintf(stderr, "flush: %s\n", e.msg);
				return 1;
			}
			double gbs = (double)(n * bs) / (now_s() - t0) / 1e9;
			if (gbs > best)
				best = gbs;
		}
		printf("%12zu %8zu %10.0f %10.2f\n", bs, n, (double)(n * bs) / 1048576.0, best);
	}
	kvx_region_unmap(x, lr);
	kvx_destroy(x);
	return 0;
}

int main(int argc, char **argv)
{
	log_init("bench", -1);
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct kvx_opts o = {.tls = argc > 1 ? argv[1] : "tcp", .net_devices = argc > 2 ? argv[2] : "lo"};
	if (o.net_devices && !o.net_devices[0])
		o.net_devices = NULL;
	size_t total = (argc > 3 ? (size_t)atoi(argv[3]) : 256) << 20;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 1;
	pid_t t = fork();
	if (t == 0) {
		close(sv[1]);
		_exit(target(sv[0], &o));
	}
	close(sv[0]);
	int rc = initiator(sv[1], &o, total);
	close(sv[1]);
	int st;
	waitpid(t, &st, 0);
	return rc;
}
