/* Host <-> device KV block staging for the prefill and decode workers (common/model/kv.c through
 * the CUDA backend): pinning a host region (cudaHostRegister) so that copies from and to it are
 * real DMA, asynchronous copies on a kcuda context's stream, and binding a thread to the
 * context's device. Debian's UCX has no CUDA transports, so the KV blocks a worker exchanges over
 * UCX live in host memory and travel to and from the device pool through these calls
 * (DESIGN.md section 6). Return 0 or ERR_CUDA (with a line on stderr naming the call). */
#ifndef TANDEM_KERNELS_CUDA_KV_STAGE_H
#define TANDEM_KERNELS_CUDA_KV_STAGE_H

#include <stddef.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_CUDA) || defined(__CUDACC__)
/* Page-locks [p, p + bytes) for the device of c (portable: every device may use it). */
int kstage_host_register(struct kcuda_ctx *c, void *p, size_t bytes);
void kstage_host_unregister(void *p);
/* Starts a copy of bytes on c's stream: host -> device when to_device, else device -> host.
 * Asynchronous: the host memory must stay untouched until kcuda_sync(c) (or a later synchronising
 * call on the stream) returns. */
int kstage_copy(struct kcuda_ctx *c, void *dst, const void *src, size_t bytes, int to_device);
/* Makes c's device current on the calling thread (the CUDA runtime keeps it per thread). */
int kstage_bind_thread(struct kcuda_ctx *c);
#endif

#ifdef __cplusplus
}
#endif
#endif
