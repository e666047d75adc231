/* Test support for PDL ordering (tests/ops): a kernel that writes its outputs LATE, so the kernel
 * launched right after it (programmatic dependent launch) runs its pre-KDEP_ENTRY part while these
 * writes are still pending; a consumer that reads any of them before its griddepcontrol.wait sees
 * the old bytes and fails its comparison. */
#ifndef TANDEM_KERNELS_CUDA_PDL_PROBE_H
#define TANDEM_KERNELS_CUDA_PDL_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kcuda_ctx;

#define KPROBE_MAX 16
/* one block: spin about spin_us microseconds, then copy src[i] -> dst[i] (bytes[i] each, i < n <=
 * KPROBE_MAX; device pointers, 4-byte multiples and alignment). Launched with the PDL attribute
 * on c's stream. Returns 0, -EINVAL or ERR_CUDA. */
int kcuda_pdl_late_copy(struct kcuda_ctx *c, int n, void *const *dst, const void *const *src,
                        const size_t *bytes, double spin_us);

#ifdef __cplusplus
}
#endif

#endif
