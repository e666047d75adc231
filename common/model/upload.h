/* Threaded weight copier: moves a list of host byte ranges (views into the GGUF mapping, or plain
 * host memory) to destinations through per-thread staging buffers and a pluggable sink (the CUDA
 * backend's sink issues pinned -> device copies on one stream per thread; the host sink memcpy's,
 * for tests and the bench).
 *
 *   plan:  upload_plan_add() records pieces (a contiguous range, or n_rows rows of row_bytes taken
 *          src_stride apart: a TP column slice), cut into batches of at most buf_bytes each.
 *   run:   upload_run() starts n_threads threads; each claims the next batch (one atomic counter:
 *          order-independent), reads its pieces into one of its n_bufs staging buffers (pread()
 *          from the file for contiguous pieces of a mapped file; memcpy from the mapping for row
 *          slices and for memory that is not a file), then hands the buffer to its sink lane, which
 *          copies it out asynchronously while the thread fills its next buffer.
 *
 * Every byte is accounted for: progress counts bytes whose copy has completed (the lane's buffer
 * was waited for), so the final count equals upload_plan_bytes() exactly. The first error (a short
 * read: the file was truncated after it was opened; a read fault on the mapping: SIGBUS, caught by
 * a handler installed only while a run is in progress; a sink error) stops every thread before its
 * next batch and is reported naming the tensor (name_cb) and the byte offset. */
#ifndef TANDEM_MODEL_UPLOAD_H
#define TANDEM_MODEL_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

struct upload_plan;

/* buf_bytes: the staging buffer size every run of this plan uses (>= 4096). */
int upload_plan_create(size_t buf_bytes, struct upload_plan **out) TD_MUST_CHECK;
void upload_plan_destroy(struct upload_plan *p); /* accepts NULL */
/* n_rows rows of row_bytes, row r at src + r * src_stride, land contiguously at dst (dst is the
 * sink's address: device memory for the CUDA sink). src_stride == row_bytes (or n_rows == 1) is one
 * contiguous range. Zero-byte pieces are ignored. */
int upload_plan_add(struct upload_plan *p, void *dst, const void *src, size_t src_stride, size_t row_bytes,
                    size_t n_rows) TD_MUST_CHECK;
/* pieces added after this go to another allocation: the sink never gets one copy that spans two
 * (two separately allocated blocks may be adjacent in the address space) */
void upload_plan_new_dst(struct upload_plan *p);
uint64_t upload_plan_bytes(const struct upload_plan *p);
int64_t upload_plan_batches(const struct upload_plan *p);

/* A sink: one lane per copy thread, created and used only by that thread. A lane owns n_bufs
 * staging buffers of buf_bytes; copy() starts the copy of bytes at buffer k + off to dst;
 * commit(k) marks the end of buffer k's copies; wait(k) returns when buffer k's committed copies
 * are done (so it may be refilled); finish() waits for all. 0 or a negative code. */
struct upload_sink {
	int (*lane_create)(void *ctx, int thread, size_t buf_bytes, int n_bufs, void **lane);
	void *(*lane_buf)(void *lane, int k);
	int (*lane_copy)(void *lane, int k, void *dst, size_t off, size_t bytes);
	int (*lane_commit)(void *lane, int k);
	int (*lane_wait)(void *lane, int k);
	int (*lane_finish)(void *lane);
	void (*lane_destroy)(void *lane); /* waits for copies in flight; accepts NULL */
	void *ctx;
};

/* A file whose mapping [base, base + size) the pieces may point into: contiguous pieces inside it
 * are read with pread() from path (opened once per thread) instead of being copied from the
 * mapping (no page faults, and a truncated file is a short read instead of SIGBUS). */
struct upload_file {
	const void *base;
	size_t size;
	const char *path; /* NULL: copy from the mapping */
};

struct upload_opts {
	int n_threads; /* >= 1 */
	int n_bufs; /* staging buffers per thread, >= 1 (2: one filling, one copying) */
	const struct upload_sink *sink;
	const struct upload_file *files;
	int n_files;
	bool no_pread; /* copy from the mappings even where a path is given */
	bool readahead; /* posix_fadvise(WILLNEED) of a thread's next batch (for cold files; no gain
	                 * measured on the 2-core VM's disk, and it costs CPU when the file is cached) */
	/* progress: called from the thread that called upload_run, at most every progress_every_s
	 * and once at the end with last = true (done == total then, on success) */
	void (*progress_cb)(void *user, uint64_t done, uint64_t total, bool last);
	double progress_every_s;
	/* the name of the tensor holding src (NULL: unknown) and src's offset in it, for errors */
	const char *(*name_cb)(void *user, const void *src, size_t *off);
	void *user;
};

struct upload_stats {
	uint64_t bytes; /* completed */
	int64_t batches, copies; /* batches done, sink copies issued (after merging) */
	double seconds;
	int n_threads;
};

int upload_run(const struct upload_plan *p, const struct upload_opts *o, struct upload_stats *st,
               struct errbuf *e) TD_MUST_CHECK;

/* The host sink (upload_sink_host.c): lanes with malloc'd buffers whose copies are memcpy to host
 * addresses, done at once (discard: not done at all; the bench measures file -> staging). Failure
 * injection for tests: the copy to [fail_dst, fail_dst + 1) fails with -EIO (NULL: never);
 * delay_us sleeps in every copy (a slow DMA). */
struct upload_host_sink {
	void *fail_dst;
	unsigned delay_us;
	bool discard;
	_Atomic int64_t n_copies;
};
void upload_host_sink_init(struct upload_host_sink *h, struct upload_sink *out);

/* One memcpy from a mapping under the SIGBUS guard: 0, or -EFAULT where the read faulted (the
 * file was truncated after it was mapped). For the loader's own small reads of the mapping. */
int upload_copy_guarded(void *dst, const void *src, size_t bytes) TD_MUST_CHECK;

/* Copy threads for one upload when nothing is configured: TANDEM_UPLOAD_THREADS if set (0 = the
 * old single-thread path, the caller decides), else the CPUs this process may run on divided by
 * `sharing` (processes that upload at the same time on this machine), clamped to 1..16. */
int upload_default_threads(int sharing);

#endif
