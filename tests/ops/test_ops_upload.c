/* The threaded weight upload on the GPU (common/model/upload.c with kernels/cuda/upload_lane.cu,
 * the sink the CUDA backend uses) against the file it reads: a random temporary file, mapped like
 * gguf_open maps it, uploaded as contiguous pieces of many sizes (one allocation each, guard bytes
 * between them) and as TP column slices (144 of every 1152-byte row: Q4_K at TP=8) with 1, 2, 4 and
 * 8 threads, pread and mapping reads, small and large buffers; every device byte is downloaded and
 * compared, the guards must be intact. Then the same file truncated: a clean error naming the
 * tensor, and an upload afterwards still works (no sticky CUDA error). Prints the rate of each
 * case (a small file: a smoke number, bench_upload measures). TANDEM_OPS_QUICK=1: 8 MiB file.
 * Exit 77 = no GPU (skip). */
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/model/upload.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/cuda/upload_lane.h"

#define GUARD 256
#define GUARD_BYTE 0x5A

static struct kcuda_ctx *ctx;
static int device;

static const char *name_cb(void *user, const void *src, size_t *off)
{
	const char *base = user;
	*off = (size_t)((const char *)src - base);
	return "the test file";
}

static struct upload_sink cuda_sink(void)
{
	return (struct upload_sink){kupl_lane_create, kupl_lane_buf,    kupl_lane_copy,    kupl_lane_commit,
	                            kupl_lane_wait,   kupl_lane_finish, kupl_lane_destroy, &device};
}

/* slice: 0 = contiguous pieces, else keep row/slice bytes of every row */
static void upload_case(const char *path, const char *map, size_t size, int nt, size_t buf, bool no_pread,
                        int slice)
{
	const size_t row = 1152;
	/* contiguous: pieces of 1, 4095, 4096, 4097, buf - 1, buf + 1, 3 buf + 5, then the rest cut in
	 * 7 MB + 3 pieces; each lands at its own offset with GUARD bytes before it */
	size_t cuts[64], n_cuts = 0;
	if (!slice) {
		size_t fixed[] = {1, 4095, 4096, 4097, buf - 1, buf + 1, 3 * buf + 5};
		size_t at = 0;
		for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]) && at + fixed[i] <= size; i++)
			at += cuts[n_cuts++] = fixed[i];
		while (at < size && n_cuts < 64) {
			size_t n = size - at < (7u << 20) + 3 ? size - at : (7u << 20) + 3;
			at += cuts[n_cuts++] = n;
		}
	}
	size_t rows = size / row, keep = slice ? row / (size_t)slice : 0;
	size_t out = slice ? rows * keep : size;
	size_t dev_n = out + GUARD * (n_cuts + 2);
	char *dev = NULL, *host = malloc(dev_n);
	struct upload_plan *p = NULL;
	if (!host || kcuda_alloc(dev_n, (void **)&dev) || kcuda_memset(ctx, dev, GUARD_BYTE, dev_n) ||
	    kcuda_sync(ctx) || upload_plan_create(buf, &p)) {
		OPS_CHECK(0, "setup");
		goto out;
	}
	if (slice) {
		OPS_CHECK(upload_plan_add(p, dev + GUARD, map, row, keep, rows) == 0, "plan slices");
	} else {
		size_t src = 0, dst = GUARD;
		for (size_t i = 0; i < n_cuts; i++) {
			upload_plan_new_dst(p); /* the guards make the pieces non-adjacent anyway */
			OPS_CHECK(upload_plan_add(p, dev + dst, map + src, cuts[i], cuts[i], 1) == 0,
			          "plan piece");
			src += cuts[i];
			dst += cuts[i] + GUARD;
		}
	}
	struct upload_sink sink = cuda_sink();
	struct upload_file uf = {.base = map, .size = size, .path = path};
	struct upload_opts o = {.n_threads = nt,
	                        .n_bufs = 2,
	                        .sink = &sink,
	                        .files = &uf,
	                        .n_files = 1,
	                        .no_pread = no_pread,
	                        .name_cb = name_cb,
	                        .user = (void *)map};
	struct upload_stats st;
	struct errbuf e = {0};
	int rc = upload_run(p, &o, &st, &e);
	OPS_CHECK(rc == 0 && st.bytes == out,
	          "upload (%d threads, buf %zu, %s, slice %d): rc %d %s, %llu of %zu bytes", nt, buf,
	          no_pread ? "mapping" : "pread", slice, rc, e.msg, (unsigned long long)st.bytes, out);
	if (rc || kcuda_download(ctx, host, dev, dev_n)) {
		OPS_CHECK(0, "download");
		goto out;
	}
	int bad = 0;
	if (slice) {
		for (size_t r = 0; r < rows && bad < 3; r++)
			if (memcmp(host + GUARD + r * keep, map + r * row, keep) != 0) {
				bad++;
				OPS_CHECK(0, "slice row %zu differs (%d threads)", r, nt);
			}
		for (size_t i = 0; i < GUARD; i++)
			bad += (unsigned char)host[i] != GUARD_BYTE ||
			       (unsigned char)host[GUARD + out + i] != GUARD_BYTE;
		OPS_CHECK(bad == 0, "slices: %d differences or overwritten guard bytes", bad);
	} else {
		size_t src = 0, dst = GUARD;
		for (size_t i = 0; i < n_cuts; i++) {
			OPS_CHECK(memcmp(host + dst, map + src, cuts[i]) == 0,
			          "piece %zu (%zu bytes) differs (%d threads)", i, cuts[i], nt);
			for (size_t g = 1; g <= GUARD; g++)
				if ((unsigned char)host[dst - g] != GUARD_BYTE) {
					OPS_CHECK(0, "guard before piece %zu overwritten", i);
					break;
				}
			src += cuts[i];
			dst += cuts[i] + GUARD;
		}
	}
	printf("  %d thread(s), %5zu KB buffers, %-7s %-10s %7.1f MB in %7.2f ms = %6.2f GB/s, %lld batches, "
	       "%lld "
	       "copies\n",
	       nt, buf >> 10, no_pread ? "mapping" : "pread", slice ? "slices" : "contiguous",
	       (double)out / 1e6, st.seconds * 1e3, st.seconds > 0 ? (double)out / st.seconds / 1e9 : 0.0,
	       (long long)st.batches, (long long)st.copies);
out:
	upload_plan_destroy(p);
	kcuda_free(dev);
	free(host);
}

static void truncated_case(const char *path, char *map, size_t size, int fd)
{
	char *dev = NULL;
	struct upload_plan *p = NULL;
	OPS_CHECK(ftruncate(fd, (off_t)(size / 2)) == 0, "ftruncate");
	if (kcuda_alloc(size, (void **)&dev) || upload_plan_create(1 << 20, &p)) {
		OPS_CHECK(0, "setup");
		goto out;
	}
	OPS_CHECK(upload_plan_add(p, dev, map, size, size, 1) == 0, "plan");
	struct upload_sink sink = cuda_sink();
	struct upload_file uf = {.base = map, .size = size, .path = path};
	for (int no_pread = 0; no_pread < 2; no_pread++) {
		struct upload_opts o = {.n_threads = 4,
		                        .n_bufs = 2,
		                        .sink = &sink,
		                        .files = &uf,
		                        .n_files = 1,
		                        .no_pread = no_pread,
		                        .name_cb = name_cb,
		                        .user = map};
		struct errbuf e = {0};
		int rc = upload_run(p, &o, NULL, &e);
		OPS_CHECK(rc == (no_pread ? -EFAULT : -EIO) && strstr(e.msg, "the test file"),
		          "truncated file (%s): rc %d, %s", no_pread ? "mapping" : "pread", rc, e.msg);
		printf("  truncated file, %s: \"%s\"\n", no_pread ? "mapping" : "pread", e.msg);
	}
	OPS_CHECK(kcuda_sync(ctx) == 0, "the context is usable after the failed uploads");
out:
	upload_plan_destroy(p);
	kcuda_free(dev);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	ops_seed_init();
	if (kcuda_ctx_create(device, 16u << 20, &ctx)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	const char *q = getenv("TANDEM_OPS_QUICK");
	bool quick = q && strcmp(q, "0") != 0;
	size_t size = quick ? (size_t)8 << 20 : (size_t)256 << 20;
	char path[] = "/tmp/test_ops_upload_XXXXXX";
	int fd = mkstemp(path);
	uint64_t *b = malloc(size);
	if (fd < 0 || !b) {
		printf("FAIL: temporary file\n");
		return 1;
	}
	for (size_t i = 0; i < size / 8; i++)
		b[i] = ops_rng_next();
	OPS_CHECK(write(fd, b, size) == (ssize_t)size, "write");
	free(b);
	char *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		printf("FAIL: mmap\n");
		return 1;
	}
	static const int threads[] = {1, 2, 4, 8};
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++)
		for (int np = 0; np < 2; np++) {
			upload_case(path, map, size, threads[t], (size_t)1 << 20, np, 0);
			upload_case(path, map, size, threads[t], 4096 + 1152, np, 0);
			upload_case(path, map, size, threads[t], (size_t)16 << 20, np, 8);
		}
	truncated_case(path, map, size, fd);
	munmap(map, size);
	close(fd);
	unlink(path);
	kcuda_ctx_destroy(ctx);
	printf("%s: %d checks, %d failures\n", ops_n_fail ? "FAIL" : "OK", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
