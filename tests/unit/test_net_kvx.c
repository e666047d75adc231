/* UCX KV transfer between two real processes, once over tcp (UCX_NET_DEVICES=lo) and once over
 * shared memory (sm,self): the "decode" process registers a pool and publishes its worker address
 * and rkey; the "prefill" process puts blocks into a permuted set of block ids and flushes; decode
 * then checks every byte: written blocks hold exactly the pattern, untouched blocks are unchanged,
 * CRC32C of each block matches what prefill computed before sending. Over tcp, prefill also checks
 * that a transfer to a decode process that has exited fails within its deadline instead of hanging. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/net/crc32c.h"
#include "common/net/kvx.h"

#define N_BLOCKS 48
#define N_PUT 40
#define BLOCK_BYTES (65536 + 24)

static uint8_t pattern(int src, size_t off)
{
	return (uint8_t)(src * 131 + off * 7 + (off >> 9));
}
static int perm(int i)
{
	return (i * 29 + 5) % N_BLOCKS;
} /* 29 is coprime with 48: distinct ids */

static int send_blob(int fd, const void *p, uint32_t len)
{
	if (write(fd, &len, 4) != 4)
		return -1;
	return len == 0 || write(fd, p, len) == (ssize_t)len ? 0 : -1;
}

static int recv_all(int fd, void *p, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, (char *)p + got, len - got);
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static int recv_blob(int fd, void *p, uint32_t cap, uint32_t *len)
{
	if (recv_all(fd, len, 4) || *len > cap)
		return -1;
	return recv_all(fd, p, *len);
}

static int decode_child(int fd, const char *tls, const char *dev)
{
	struct errbuf e = {0};
	struct kvx *x;
	struct kvx_opts o = {.tls = tls, .net_devices = dev};
	if (kvx_create(&x, &o, &e)) {
		fprintf(stderr, "decode: %s\n", e.msg);
		return 1;
	}
	printf("decode: UCX resources: %s\n", kvx_transports(x));
	uint8_t *pool = aligned_alloc(64, (size_t)N_BLOCKS * BLOCK_BYTES);
	memset(pool, 0xee, (size_t)N_BLOCKS * BLOCK_BYTES);
	struct kvx_region *r;
	if (kvx_region_map(x, pool, (size_t)N_BLOCKS * BLOCK_BYTES, &r, &e)) {
		fprintf(stderr, "decode: %s\n", e.msg);
		return 1;
	}
	const uint8_t *addr, *rkey;
	size_t addr_len, rkey_len;
	kvx_worker_address(x, &addr, &addr_len);
	kvx_region_rkey(r, &rkey, &rkey_len);
	uint64_t base = (uint64_t)(uintptr_t)pool;
	if (send_blob(fd, addr, (uint32_t)addr_len) || send_blob(fd, rkey, (uint32_t)rkey_len) ||
	    send_blob(fd, &base, 8))
		return 1;
	/* progress UCX (tcp emulates RMA with messages the target must process) until prefill is done */
	for (;;) {
		kvx_progress(x);
		if (kvx_arm(x) == 1)
			continue;
		struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = kvx_efd(x), .events = POLLIN}};
		if (poll(p, 2, 100) < 0)
			return 1;
		if (p[0].revents)
			break;
	}
	uint32_t sums[N_PUT], len;
	if (recv_blob(fd, sums, sizeof(sums), &len) || len != sizeof(sums))
		return 1;
	int bad = 0;
	uint8_t written[N_BLOCKS] = {0};
	for (int i = 0; i < N_PUT; i++) {
		int b = perm(i);
		written[b] = 1;
		const uint8_t *blk = pool + (size_t)b * BLOCK_BYTES;
		for (size_t k = 0; k < BLOCK_BYTES; k++)
			if (blk[k] != pattern(i, k)) {
				fprintf(stderr, "decode: block %d byte %zu: 0x%02x, expected 0x%02x\n", b, k,
				        blk[k], pattern(i, k));
				bad++;
				break;
			}
		if (crc32c(0, blk, BLOCK_BYTES) != sums[i]) {
			fprintf(stderr, "decode: block %d checksum differs\n", b);
			bad++;
		}
	}
	for (int b = 0; b < N_BLOCKS; b++) {
		if (written[b])
			continue;
		const uint8_t *blk = pool + (size_t)b * BLOCK_BYTES;
		for (size_t k = 0; k < BLOCK_BYTES; k++)
			if (blk[k] != 0xee) {
				fprintf(stderr, "decode: untouched block %d changed at byte %zu\n", b, k);
				bad++;
				break;
			}
	}
	printf("decode: %d blocks of %d bytes checked, %d bad\n", N_PUT, BLOCK_BYTES, bad);
	uint8_t result = bad ? 1 : 0;
	if (send_blob(fd, &result, 1))
		return 1;
	kvx_region_unmap(x, r);
	kvx_destroy(x);
	free(pool);
	return bad ? 1 : 0;
}

static int prefill_child(int fd, const char *tls, const char *dev, int try_dead_peer)
{
	struct errbuf e = {0};
	uint8_t addr[4096], rkey[4096];
	uint32_t addr_len, rkey_len, blen;
	uint64_t base;
	if (recv_blob(fd, addr, sizeof(addr), &addr_len) || recv_blob(fd, rkey, sizeof(rkey), &rkey_len) ||
	    recv_blob(fd, &base, 8, &blen))
		return 1;
	struct kvx *x;
	struct kvx_opts o = {.tls = tls, .net_devices = dev};
	if (kvx_create(&x, &o, &e)) {
		fprintf(stderr, "prefill: %s\n", e.msg);
		return 1;
	}
	uint8_t *src = malloc((size_t)N_PUT * BLOCK_BYTES);
	uint32_t sums[N_PUT];
	for (int i = 0; i < N_PUT; i++) {
		for (size_t k = 0; k < BLOCK_BYTES; k++)
			src[(size_t)i * BLOCK_BYTES + k] = pattern(i, k);
		sums[i] = crc32c(0, src + (size_t)i * BLOCK_BYTES, BLOCK_BYTES);
	}
	struct kvx_region *lr;
	if (kvx_region_map(x, src, (size_t)N_PUT * BLOCK_BYTES, &lr, &e))
		return 1;
	struct kvx_peer *p;
	if (kvx_peer_get(x, addr, addr_len, rkey, rkey_len, &p, &e)) {
		fprintf(stderr, "prefill: %s\n", e.msg);
		return 1;
	}
	printf("prefill: endpoint %s\n", kvx_peer_transports(p));
	struct kvx_peer *p2;
	if (kvx_peer_get(x, addr, addr_len, rkey, rkey_len, &p2, &e) || p2 != p) {
		fprintf(stderr, "prefill: peer not cached\n");
		return 1;
	}
	for (int i = 0; i < N_PUT; i++)
		if (kvx_put(x, p, src + (size_t)i * BLOCK_BYTES, i % 2 ? lr : NULL, BLOCK_BYTES,
		            base + (uint64_t)perm(i) * BLOCK_BYTES, &e)) {
			fprintf(stderr, "prefill: %s\n", e.msg);
			return 1;
		}
	if (kvx_flush(x, p, 10000, &e)) {
		fprintf(stderr, "prefill: %s\n", e.msg);
		return 1;
	}
	if (kvx_bytes_put(x) != (uint64_t)N_PUT * BLOCK_BYTES)
		return 1;
	if (send_blob(fd, sums, sizeof(sums)))
		return 1;
	uint8_t result = 1;
	uint32_t rlen;
	if (recv_blob(fd, &result, 1, &rlen) || result != 0) {
		fprintf(stderr, "prefill: decode reported bad data\n");
		return 1;
	}
	if (try_dead_peer) {
		/* wait for the decode process to exit (EOF), then write again: must fail, within the deadline
		 */
		char c;
		while (read(fd, &c, 1) > 0)
			;
		usleep(100 * 1000);
		int rc = kvx_peer_get(x, addr, addr_len, rkey, rkey_len, &p, &e);
		if (!rc)
			rc = kvx_put(x, p, src, lr, BLOCK_BYTES, base, &e);
		if (!rc)
			rc = kvx_flush(x, p, 2000, &e);
		printf("prefill: transfer to an exited decode process: %s\n",
		       rc ? e.msg : "succeeded (WRONG)");
		if (rc == 0)
			return 1;
	}
	kvx_region_unmap(x, lr);
	kvx_destroy(x);
	free(src);
	return 0;
}

static int run_pair(const char *tls, const char *dev, int try_dead_peer)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 1;
	fflush(stdout);
	pid_t d = fork();
	if (d == 0) {
		close(sv[1]);
		alarm(60);
		_exit(decode_child(sv[0], tls, dev));
	}
	pid_t p = fork();
	if (p == 0) {
		close(sv[0]);
		alarm(60);
		_exit(prefill_child(sv[1], tls, dev, try_dead_peer));
	}
	close(sv[0]);
	close(sv[1]);
	int sd = 0, sp = 0;
	waitpid(d, &sd, 0);
	waitpid(p, &sp, 0);
	int ok = WIFEXITED(sd) && WEXITSTATUS(sd) == 0 && WIFEXITED(sp) && WEXITSTATUS(sp) == 0;
	printf("UCX_TLS=%s: %s (decode status %d, prefill status %d)\n", tls, ok ? "ok" : "FAILED", sd, sp);
	return ok ? 0 : 1;
}

int main(void)
{
	log_init("test", -1);
	setvbuf(stdout, NULL, _IOLBF, 0);
	int fails = 0;
	fails += run_pair("tcp", "lo", 1);
	fails += run_pair("sm,self", NULL, 0);
	if (fails) {
		fprintf(stderr, "test_net_kvx: %d transports failed\n", fails);
		return 1;
	}
	printf("test_net_kvx: all checks passed\n");
	return 0;
}
