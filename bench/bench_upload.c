/* Weight upload rate of the threaded copier (common/model/upload.c) for 1..N copy threads, from a
 * file in the page cache (or dropped from it with --cold), the way the CUDA backend uploads a
 * rank's weights: the file cut into "tensors" of --piece-mb (or row slices with --slice T: every
 * row of --row bytes keeps row/T of them, a TP column cut), read with pread() or from the mapping,
 * through buffers of --buf-mb per thread, into
 *   --sink host: nowhere (the copy is skipped; measures file -> staging, what one host can feed)
 *   --sink cuda: device memory through pinned buffers (CUDA builds); --threads 0 is the old
 *                single-thread double-buffered stager (kfwd_stage) for comparison.
 * Every run is checked: the host sink counts the bytes, the cuda sink's device copy is compared
 * with the file on a sample of 64 KiB blocks.
 *
 *   build/bench/bench_upload --file model.gguf [--threads 0,1,2,4,8,16] [--sink host|cuda]
 *       [--read pread|mmap] [--buf-mb 8] [--piece-mb 64] [--slice T --row B] [--cold] [--reps 2]
 *       [--readahead 0|1] [--device N]
 *   build/bench/bench_upload --size-mb 2048 ...   (a temporary random file instead) */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/model/upload.h"
#include "kernels/kernels.h"
#ifdef TANDEM_CUDA
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/upload_lane.h"
#endif

struct args {
	const char *file;
	size_t size_mb;
	char threads[128];
	const char *sink, *read;
	size_t buf_mb, piece_mb, row;
	int slice, reps, device, readahead;
	bool cold;
};

/* CPU seconds of this process (all threads): GB per CPU second is what one core moves, a number
 * that other load on the machine does not change much */
static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
	       (double)ru.ru_stime.tv_usec * 1e-6;
}

static int usage(void)
{
	fprintf(stderr,
	        "usage: bench_upload (--file PATH | --size-mb N) [--threads 0,1,2,4] [--sink host|cuda] "
	        "[--read pread|mmap] [--buf-mb 8] [--piece-mb 64] [--slice T --row BYTES] [--cold] "
	        "[--reps 2] [--device 0] [--readahead 0|1]\n");
	return 2;
}

static int make_file(char *path, size_t bytes)
{
	snprintf(path, 64, "/tmp/bench_upload_XXXXXX");
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	size_t chunk = 8 << 20;
	uint64_t *b = malloc(chunk), x = 0x9e3779b97f4a7c15ull;
	for (size_t w = 0; b && w < bytes;) {
		for (size_t i = 0; i < chunk / 8; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			b[i] = x;
		}
		size_t n = bytes - w < chunk ? bytes - w : chunk;
		if (write(fd, b, n) != (ssize_t)n) {
			free(b);
			close(fd);
			return -1;
		}
		w += n;
	}
	free(b);
	close(fd);
	return 0;
}

/* the plan: pieces of piece bytes (one allocation each), or row slices */
static int build_plan(const struct args *a, const char *map, size_t size, char *dst_base,
                      struct upload_plan *p, uint64_t *bytes)
{
	int rc = 0;
	if (a->slice > 1) {
		size_t keep = a->row / (size_t)a->slice, rows = size / a->row, per = (size_t)64 << 20;
		size_t rows_per = per / a->row ? per / a->row : 1; /* one "tensor" per ~64 MB of file */
		char *d = dst_base;
		for (size_t r = 0; r < rows && !rc; r += rows_per) {
			size_t n = rows - r < rows_per ? rows - r : rows_per;
			upload_plan_new_dst(p);
			rc = upload_plan_add(p, d, map + r * a->row, a->row, keep, n);
			d += keep * n;
		}
	} else {
		size_t piece = a->piece_mb << 20;
		for (size_t off = 0; off < size && !rc; off += piece) {
			size_t n = size - off < piece ? size - off : piece;
			upload_plan_new_dst(p);
			rc = upload_plan_add(p, dst_base + off, map + off, n, n, 1);
		}
	}
	*bytes = upload_plan_bytes(p);
	return rc;
}

static void drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd >= 0) {
		if (fdatasync(fd) != 0) {
		}
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

#ifdef TANDEM_CUDA
static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* the single-thread stager of the old path, over the same pieces */
static int run_old(const struct args *a, const char *map, size_t size, char *dev, double *secs)
{
	struct kfwd_stager *sg;
	int rc = kfwd_stager_create((size_t)64 << 20, &sg);
	if (rc)
		return rc;
	double t0 = now_s();
	size_t piece = a->piece_mb << 20;
	if (a->slice > 1) {
		size_t keep = a->row / (size_t)a->slice, rows = size / a->row;
		kfwd_stage_new_dst(sg);
		for (size_t r = 0; r < rows && !rc; r++)
			rc = kfwd_stage(sg, dev + r * keep, map + r * a->row, keep);
	} else {
		for (size_t off = 0; off < size && !rc; off += piece) {
			kfwd_stage_new_dst(sg);
			rc = kfwd_stage(sg, dev + off, map + off, size - off < piece ? size - off : piece);
		}
	}
	if (!rc)
		rc = kfwd_stager_finish(sg);
	*secs = now_s() - t0;
	kfwd_stager_destroy(sg);
	return rc;
}

/* 64 sampled blocks of 64 KiB of the device copy against the file */
static int check_device(struct kcuda_ctx *kc, const struct args *a, const char *map, size_t size,
                        const char *dev)
{
	size_t blk = 64 << 10;
	char *h = malloc(blk);
	int bad = 0;
	if (!h)
		return -ENOMEM;
	size_t out = a->slice > 1 ? (size / a->row) * (a->row / (size_t)a->slice) : size;
	for (int i = 0; i < 64 && out >= blk; i++) {
		size_t off = (out - blk) / 63 * (size_t)i,
		       keep = a->row / (size_t)(a->slice > 1 ? a->slice : 1);
		if (kcuda_download(kc, h, dev + off, blk)) {
			bad++;
			break;
		}
		for (size_t j = 0; j < blk; j++) {
			size_t o = off + j;
			size_t src = a->slice > 1 ? (o / keep) * a->row + o % keep : o;
			if (h[j] != map[src]) {
				bad++;
				break;
			}
		}
	}
	free(h);
	return bad ? -EIO : 0;
}
#endif

int main(int argc, char **argv)
{
	struct args a = {
	    .sink = "host", .read = "pread", .buf_mb = 8, .piece_mb = 64, .reps = 2, .row = 1152};
	snprintf(a.threads, sizeof(a.threads), "1,2,4,8,16");
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(k, "--cold") == 0) {
			a.cold = true;
			continue;
		}
		if (!v)
			return usage();
		i++;
		if (strcmp(k, "--file") == 0)
			a.file = v;
		else if (strcmp(k, "--size-mb") == 0)
			a.size_mb = strtoull(v, NULL, 10);
		else if (strcmp(k, "--threads") == 0)
			snprintf(a.threads, sizeof(a.threads), "%s", v);
		else if (strcmp(k, "--sink") == 0)
			a.sink = v;
		else if (strcmp(k, "--read") == 0)
			a.read = v;
		else if (strcmp(k, "--buf-mb") == 0)
			a.buf_mb = strtoull(v, NULL, 10);
		else if (strcmp(k, "--piece-mb") == 0)
			a.piece_mb = strtoull(v, NULL, 10);
		else if (strcmp(k, "--slice") == 0)
			a.slice = atoi(v);
		else if (strcmp(k, "--row") == 0)
			a.row = strtoull(v, NULL, 10);
		else if (strcmp(k, "--reps") == 0)
			a.reps = atoi(v);
		else if (strcmp(k, "--device") == 0)
			a.device = atoi(v);
		else if (strcmp(k, "--readahead") == 0)
			a.readahead = atoi(v);
		else
			return usage();
	}
	bool cuda = strcmp(a.sink, "cuda") == 0;
	if ((!a.file && !a.size_mb) || a.buf_mb < 1 || a.buf_mb > 1024 || a.piece_mb < 1 || a.reps < 1 ||
	    a.slice < 0 ||
	    (a.slice > 1 && (a.row < (size_t)a.slice || a.row / (size_t)a.slice > (a.buf_mb << 20))) ||
	    (!cuda && strcmp(a.sink, "host") != 0) ||
	    (strcmp(a.read, "pread") != 0 && strcmp(a.read, "mmap") != 0))
		return usage();
#ifndef TANDEM_CUDA
	if (cuda) {
		fprintf(stderr, "bench_upload: --sink cuda needs a CUDA build\n");
		return 2;
	}
#endif
	char tmp[64] = "";
	const char *path = a.file;
	if (!path) {
		if (make_file(tmp, a.size_mb << 20)) {
			fprintf(stderr, "bench_upload: cannot write a %zu MB temporary file\n", a.size_mb);
			return 1;
		}
		path = tmp;
	}
	int fd = open(path, O_RDONLY);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) || sb.st_size <= 0) {
		fprintf(stderr, "bench_upload: cannot open %s\n", path);
		return 1;
	}
	size_t size = (size_t)sb.st_size;
	int rc = 0;
	void *dev = NULL;
#ifdef TANDEM_CUDA
	struct kcuda_ctx *kc = NULL;
	if (cuda && (kcuda_ctx_create(a.device, 0, &kc) || kcuda_alloc(size, &dev))) {
		fprintf(stderr, "bench_upload: cannot allocate %zu bytes on device %d\n", size, a.device);
		return 1;
	}
#endif
	char *fake_dst = (char *)(uintptr_t)4096; /* host sink: copies are skipped, never written */
	printf(
	    "bench_upload: %s, %.2f GB, sink %s, read %s%s, %zu MB buffers x2 per thread, %s, %s, %d CPUs\n",
	    path, (double)size / 1e9, a.sink, a.read, a.readahead ? " + readahead" : "", a.buf_mb,
	    a.slice > 1 ? "row slices" : "contiguous pieces",
	    a.cold ? "cold (page cache dropped)" : "page cache warm", (int)sysconf(_SC_NPROCESSORS_ONLN));
	if (a.slice > 1)
		printf("  rows of %zu bytes, %zu kept of each (TP=%d column cut)\n", a.row,
		       a.row / (size_t)a.slice, a.slice);
	printf("%8s %10s %10s %9s %11s %9s %9s\n", "threads", "GB", "best s", "GB/s", "GB/cpu-s", "batches",
	       "copies");
	char *list = strdup(a.threads), *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
		int nt = atoi(tok);
		double best = 0, best_cpu = 0;
		struct upload_stats st = {0};
		for (int rep = 0; rep < a.reps + (a.cold ? 0 : 1) && !rc;
		     rep++) { /* warm: one untimed pass */
			if (a.cold)
				drop_cache(path);
			char *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
			if (map == MAP_FAILED) {
				rc = -errno;
				break;
			}
			double secs = 0, c0 = cpu_s();
			if (nt == 0) {
#ifdef TANDEM_CUDA
				if (cuda)
					rc = run_old(&a, map, size, dev, &secs);
				st = (struct upload_stats){.n_threads = 1};
#endif
				if (!cuda) {
					fprintf(
					    stderr,
					    "bench_upload: --threads 0 (the old stager) needs --sink cuda\n");
					rc = -EINVAL;
				}
			} else {
				struct upload_plan *p = NULL;
				uint64_t bytes = 0;
				if ((rc = upload_plan_create(a.buf_mb << 20, &p)) ||
				    (rc = build_plan(&a, map, size, cuda ? dev : fake_dst, p, &bytes))) {
					upload_plan_destroy(p);
					munmap(map, size);
					break;
				}
				struct upload_host_sink hs = {.discard = true};
				struct upload_sink sink;
				upload_host_sink_init(&hs, &sink);
#ifdef TANDEM_CUDA
				int devno = a.device;
				if (cuda)
					sink = (struct upload_sink){kupl_lane_create,  kupl_lane_buf,
					                            kupl_lane_copy,    kupl_lane_commit,
					                            kupl_lane_wait,    kupl_lane_finish,
					                            kupl_lane_destroy, &devno};
#endif
				struct upload_file uf = {.base = map, .size = size, .path = path};
				struct upload_opts o = {.n_threads = nt,
				                        .n_bufs = 2,
				                        .sink = &sink,
				                        .files = &uf,
				                        .n_files = 1,
				                        .no_pread = strcmp(a.read, "mmap") == 0,
				                        .readahead = a.readahead != 0};
				struct errbuf e = {0};
				rc = upload_run(p, &o, &st, &e);
				if (rc)
					fprintf(stderr, "bench_upload: %s\n", e.msg);
				else if (st.bytes != bytes) {
					fprintf(stderr, "bench_upload: %llu of %llu bytes\n",
					        (unsigned long long)st.bytes, (unsigned long long)bytes);
					rc = -EIO;
				}
				secs = st.seconds;
				upload_plan_destroy(p);
			}
			double cpu = cpu_s() - c0;
#ifdef TANDEM_CUDA
			if (!rc && cuda && (rc = check_device(kc, &a, map, size, dev)))
				fprintf(stderr, "bench_upload: the device copy differs from the file\n");
#endif
			munmap(map, size);
			if (!rc && (a.cold || rep > 0) && (best == 0 || secs < best))
				best = secs;
			if (!rc && (a.cold || rep > 0) && (best_cpu == 0 || cpu < best_cpu))
				best_cpu = cpu;
		}
		if (rc)
			break;
		double gb = a.slice > 1 ? (double)((size / a.row) * (a.row / (size_t)a.slice)) / 1e9
		                        : (double)size / 1e9;
		printf("%8d %10.3f %10.3f %9.2f %11.2f %9lld %9lld%s\n", nt, gb, best,
		       best > 0 ? gb / best : 0.0, best_cpu > 0 ? gb / best_cpu : 0.0, (long long)st.batches,
		       (long long)st.copies, nt == 0 ? "  (old single-thread stager)" : "");
		fflush(stdout);
	}
	free(list);
#ifdef TANDEM_CUDA
	if (dev)
		kcuda_free(dev);
	kcuda_ctx_destroy(kc);
#endif
	close(fd);
	if (tmp[0])
		unlink(tmp);
	return rc ? 1 : 0;
}
