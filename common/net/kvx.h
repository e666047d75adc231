/* KV transfer over UCX: decode exposes memory (its KV pool or a host staging area) for remote
 * writes; prefill writes blocks into it with RMA put and waits for remote completion (flush)
 * before telling anyone the KV is there (DESIGN.md section 6).
 *
 *   decode (target)                          prefill (initiator)
 *   kvx_create                                kvx_create
 *   kvx_region_map(pool) -> rkey blob         (gets decode's address + rkey via the router)
 *   kvx_worker_address -> address blob        kvx_peer_get(address, rkey)  (cached per address)
 *   progress the worker (kvx_efd + uv_poll:   kvx_put(...) x n blocks      (non-blocking)
 *   needed by emulated-RMA transports, tcp)   kvx_flush(peer, deadline)    (remote completion)
 *
 * A struct kvx (one UCP context + worker) is used by one thread at a time. Memory handed to
 * kvx_region_map stays owned by the caller and must outlive the region. Local source buffers may
 * be registered with kvx_region_map too (faster puts); unregistered sources also work.
 *
 * GPU memory: Debian's UCX has no CUDA transports, so GPU pools are staged through pinned host
 * memory that is mapped here; a UCX with cuda_ipc/gdr can map device memory directly later
 * (kvx_region_map takes any address UCX can register; the memory type is UCX's to detect). */
#ifndef TANDEM_NET_KVX_H
#define TANDEM_NET_KVX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

struct kvx;
struct kvx_region;
struct kvx_peer;

struct kvx_opts {
	const char *tls; /* UCX_TLS override ("tcp", "sm,self", ...); NULL/"" = UCX default/env */
	const char *net_devices; /* UCX_NET_DEVICES override ("lo", "mlx5_0:1"); NULL = default/env */
	bool want_rdma; /* warn loudly when an endpoint ends up without an RDMA transport */
	bool peer_failure; /* ask UCX for peer-failure detection (keepalive, PEER error mode).
	                    * Off by default: UCX then refuses shared-memory transports, so
	                    * same-host transfers would go over tcp (6x slower here). Without it
	                    * a crashed peer is still reported (tcp reset) and every wait has
	                    * the flush deadline. */
};

int kvx_create(struct kvx **out, const struct kvx_opts *o, struct errbuf *e) TD_MUST_CHECK;
void kvx_destroy(struct kvx *x); /* NULL is fine; closes peers, unmaps regions */

/* The worker address (to publish) and a one-line summary of the transports/devices UCX offers. */
void kvx_worker_address(const struct kvx *x, const uint8_t **addr, size_t *len);
const char *kvx_transports(const struct kvx *x);

/* Event fd for a libuv poll: call kvx_arm() before waiting; if it returns 1, progress first. */
int kvx_efd(const struct kvx *x);
int kvx_arm(struct kvx *x); /* 0 armed, 1 events pending (progress again), <0 error */
/* Progresses the worker until idle; returns the number of progress calls that did work. */
int kvx_progress(struct kvx *x);

int kvx_region_map(struct kvx *x, void *base, size_t len, struct kvx_region **out,
                   struct errbuf *e) TD_MUST_CHECK;
/* Allocates len bytes through UCX and registers them (UCP_MEM_MAP_ALLOCATE). Prefer this for
 * memory peers write into: UCX can then place it where every transport reaches it directly (a
 * shared-memory segment on one host: puts become one memcpy instead of messages). *base gets the
 * address; the memory is zeroed and lives until kvx_region_unmap. */
int kvx_region_alloc(struct kvx *x, size_t len, void **base, struct kvx_region **out,
                     struct errbuf *e) TD_MUST_CHECK;
void kvx_region_rkey(const struct kvx_region *r, const uint8_t **rkey, size_t *len);
void kvx_region_unmap(struct kvx *x, struct kvx_region *r); /* NULL is fine */

/* Returns an endpoint to the worker at addr with rkey unpacked; cached by (addr, rkey). The peer
 * belongs to x; it is dropped when a transfer to it fails (the next get reconnects). */
int kvx_peer_get(struct kvx *x, const uint8_t *addr, size_t addr_len, const uint8_t *rkey, size_t rkey_len,
                 struct kvx_peer **out, struct errbuf *e) TD_MUST_CHECK;
/* Peers are identified by a number that is never reused, so a caller can hold on to a peer across
 * calls without holding a pointer that a failure elsewhere may free: kvx_peer_by_id() returns
 * NULL once that peer has been dropped (its earlier puts are then lost). */
uint64_t kvx_peer_id(const struct kvx_peer *p);
struct kvx_peer *kvx_peer_by_id(struct kvx *x, uint64_t id);
/* Force-closes the peer's endpoint and forgets the peer (no-op when id is unknown): nothing
 * queued or issued on it can land at the target afterwards (the last resort when a transfer's
 * write window closes with puts that never reached remote completion). */
void kvx_peer_close(struct kvx *x, uint64_t id);
/* The transport lanes the endpoint uses ("rma: tcp/lo"), for logs. */
const char *kvx_peer_transports(const struct kvx_peer *p);

/* Starts a put of len bytes from local (optionally inside a mapped region, for zero-copy) to
 * remote_addr (inside the peer's rkey region). Returns 0 once queued or completed; the data is
 * guaranteed at the target only after kvx_flush() returns 0. */
int kvx_put(struct kvx *x, struct kvx_peer *p, const void *local, const struct kvx_region *local_region,
            size_t len, uint64_t remote_addr, struct errbuf *e) TD_MUST_CHECK;
/* Waits (progressing) until every put to p has completed remotely, for at most timeout_ms.
 * ERR_TIMEOUT or ERR_UCX (peer failed) drop the peer. */
int kvx_flush(struct kvx *x, struct kvx_peer *p, uint32_t timeout_ms, struct errbuf *e) TD_MUST_CHECK;

uint64_t kvx_bytes_put(const struct kvx *x);

#endif
