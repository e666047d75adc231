/* One copy thread's half of the weight upload (common/model/upload.c's CUDA sink): pinned staging
 * buffers, a non-blocking stream of its own and one event per buffer, so every copy thread moves
 * its batches to the device independently of the others and of the backend's compute stream.
 * The signatures are those of struct upload_sink (common/model/upload.h); ctx points at the int
 * device id. Every call comes from the thread that created the lane (the CUDA runtime binds the
 * device per thread; create binds it). Return 0, -EINVAL / -ENOMEM or ERR_CUDA (with a line on
 * stderr naming the call). */
#ifndef TANDEM_KERNELS_CUDA_UPLOAD_LANE_H
#define TANDEM_KERNELS_CUDA_UPLOAD_LANE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_CUDA) || defined(__CUDACC__)
int kupl_lane_create(void *ctx, int thread, size_t buf_bytes, int n_bufs, void **lane);
void *kupl_lane_buf(void *lane, int k);
/* starts the copy of bytes at staging buffer k + off to device address dst on the lane's stream */
int kupl_lane_copy(void *lane, int k, void *dst, size_t off, size_t bytes);
int kupl_lane_commit(void *lane, int k); /* buffer k's copies end here (an event) */
int kupl_lane_wait(void *lane, int k); /* buffer k's committed copies are done: it may be refilled */
int kupl_lane_finish(void *lane); /* every copy of the lane is done */
void kupl_lane_destroy(void *lane); /* waits for copies in flight; accepts NULL */
#endif

#ifdef __cplusplus
}
#endif
#endif
