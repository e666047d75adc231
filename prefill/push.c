/* KV push (engine thread): local block i of a job goes to the decode worker's block
 * block_ids[i], segment by segment, at base + s * segment_stride + id * block_stride. Prefill and
 * decode agreed on the layout at registration (the router refuses a pair that differs), and the
 * segment size is checked again here against this engine's block size, so a put never writes
 * outside the block the decode worker reserved. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "common/base/log.h"
#include "common/net/crc32c.h"
#include "common/net/kvfence.h"
#include "prefill/engine.h"

static int fail(struct pf_job *j, int status, int code, const char *msg)
{
	j->status = status;
	j->err_code = code;
	snprintf(j->err_msg, sizeof(j->err_msg), "%.240s", msg);
	return status;
}

int pf_push_blocks(const struct pf_push_ctx *c, struct pf_job *j, uint32_t upto)
{
	struct errbuf e = {0};
	if (upto > j->n_local || upto > j->n_block_ids)
		return fail(j, -EINVAL, MSG_ERR_INVALID_REQUEST,
		            "more KV blocks than the decode worker reserved");
	if (j->n_pushed >= upto)
		return 0;
	const struct msg_kv_region *r = &j->region;
	if ((uint64_t)r->n_segments * r->segment_bytes != c->block_bytes)
		return fail(j, ERR_MISMATCH, MSG_ERR_LAYOUT_MISMATCH,
		            "decode worker's KV block size differs from this prefill worker's");
	struct kvx_peer *peer;
	if (j->peer_id) {
		/* the same endpoint as the earlier blocks, or the transfer is already broken */
		peer = kvx_peer_by_id(c->kvx, j->peer_id);
		if (!peer)
			return fail(j, ERR_UCX, MSG_ERR_TRANSFER,
			            "UCX: connection to the decode worker failed mid-transfer");
	} else {
		int rc = kvx_peer_get(c->kvx, j->ucx_addr, j->ucx_addr_len, j->rkey, j->rkey_len, &peer, &e);
		if (rc)
			return fail(j, rc, MSG_ERR_TRANSFER, e.msg);
		j->peer_id = kvx_peer_id(peer);
		j->t_first_put_ns = uv_hrtime();
	}
	if (j->want_checksums && !j->checksums) {
		j->checksums = calloc(j->n_block_ids, sizeof(uint32_t));
		if (!j->checksums)
			return fail(j, -ENOMEM, MSG_ERR_INTERNAL, "out of memory");
	}
	for (uint32_t i = j->n_pushed; i < upto; i++) {
		if (c->test_delay_us && j->n_tokens >= c->test_delay_min_tokens) {
			struct timespec ts = {.tv_sec = c->test_delay_us / 1000000u,
			                      .tv_nsec = (long)(c->test_delay_us % 1000000u) * 1000};
			nanosleep(&ts, NULL);
		}
		/* The write window: nothing is put for a cancelled job or after the job's deadline
		 * (decode may reuse the blocks once that window is over, see tandem.proto). Checked
		 * before every block, not once per step: a step may take long. */
		if (atomic_load(&j->cancelled)) {
			j->n_pushed = i;
			j->n_checksums = j->checksums ? i : 0;
			return fail(j, ERR_CANCELLED, MSG_ERR_CANCELLED, "cancelled during the KV transfer");
		}
		if (j->deadline_ms && uv_hrtime() / 1000000u > j->deadline_ms) {
			j->n_pushed = i;
			j->n_checksums = j->checksums ? i : 0;
			return fail(j, ERR_TIMEOUT, MSG_ERR_TIMEOUT,
			            "prefill deadline passed during the KV transfer");
		}
		const uint8_t *src = c->local_base + (size_t)j->local_blocks[i] * c->block_bytes;
		uint32_t id = j->block_ids[i];
		for (uint32_t s = 0; s < r->n_segments; s++) {
			uint64_t remote =
			    r->base_addr + (uint64_t)s * r->segment_stride + (uint64_t)id * r->block_stride;
			int rc = kvx_put(c->kvx, peer, src + (size_t)s * r->segment_bytes, c->local_region,
			                 r->segment_bytes, remote, &e);
			if (rc)
				return fail(j, rc, MSG_ERR_TRANSFER, e.msg);
		}
		if (j->checksums)
			j->checksums[i] = crc32c(0, src, c->block_bytes);
		j->kv_bytes += c->block_bytes;
	}
	j->n_pushed = upto;
	j->n_checksums = j->checksums ? upto : 0;
	return 0;
}

int pf_push_finish(const struct pf_push_ctx *c, struct pf_job *j)
{
	if (!j->peer_id)
		return 0;
	struct kvx_peer *peer = kvx_peer_by_id(c->kvx, j->peer_id);
	if (!peer)
		return fail(j, ERR_UCX, MSG_ERR_TRANSFER,
		            "UCX: connection to the decode worker failed mid-transfer");
	uint64_t now = uv_hrtime() / 1000000u;
	uint32_t timeout = c->flush_timeout_ms;
	if (j->deadline_ms && j->deadline_ms <= now)
		timeout = 0;
	else if (j->deadline_ms && j->deadline_ms - now < timeout)
		timeout = (uint32_t)(j->deadline_ms - now);
	/* past the window: a flush that is not complete at once force-closes the endpoint (kvx_flush
	 * drops the peer on timeout), so nothing of this job can land later */
	struct errbuf e = {0};
	int rc = kvx_flush(c->kvx, peer, timeout, &e);
	if (rc)
		return fail(j, rc, rc == ERR_TIMEOUT ? MSG_ERR_TIMEOUT : MSG_ERR_TRANSFER, e.msg);
	j->transfer_us = (uint32_t)((uv_hrtime() - j->t_first_put_ns) / 1000u);
	return 0;
}

void pf_push_fence(const struct pf_push_ctx *c, struct pf_job *j)
{
	if (!j->region.fence_addr || !j->n_block_ids || !j->block_ids)
		return; /* the decode worker has no fences (older) */
	if (atomic_load(&j->no_fence))
		return;
	/* a decode worker that just failed a fence (dead, unreachable) is not tried again for a few
	 * seconds: a burst of cancelled jobs to it must not stall the engine for 2 s each. Engine
	 * thread only (one engine per process). */
	static uint64_t failed_addr_hash, failed_until_ms;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < j->ucx_addr_len; i++)
		h = (h ^ j->ucx_addr[i]) * 1099511628211ull;
	uint64_t now = uv_hrtime() / 1000000u;
	if (h == failed_addr_hash && now < failed_until_ms)
		return;
	struct errbuf e = {0};
	struct kvx_peer *peer;
	if (j->peer_id) {
		peer = kvx_peer_by_id(c->kvx, j->peer_id);
		if (!peer)
			return; /* force-closed after a failure: nothing of ours can land; decode's deadline
			         */
	} else if (kvx_peer_get(c->kvx, j->ucx_addr, j->ucx_addr_len, j->rkey, j->rkey_len, &peer, &e)) {
		LOG_DEBUG("prefill", "rid=%llu no fence: %s", (unsigned long long)j->rid, e.msg);
		failed_addr_hash = h;
		failed_until_ms = now + 5000;
		return;
	}
	/* the fence slot is never KV data: writing it even after the window cannot hurt another
	 * request (decode zeroes the slot when it hands the block out again, and a stale rid never
	 * matches the new reservation's) */
	uint64_t slot = j->region.fence_addr + (uint64_t)j->block_ids[0] * 8u;
	/* little-endian u64 on both sides (x86-64, aarch64) */
	j->fence_word = kvfence_word(j->rid, j->fence_attempt);
	if (kvx_put(c->kvx, peer, &j->fence_word, NULL, sizeof(j->fence_word), slot, &e) ||
	    kvx_flush(c->kvx, peer, c->flush_timeout_ms < 2000 ? c->flush_timeout_ms : 2000, &e)) {
		LOG_WARN("prefill", "rid=%llu transfer fence not written (decode waits for its deadline): %s",
		         (unsigned long long)j->rid, e.msg);
		failed_addr_hash = h;
		failed_until_ms = uv_hrtime() / 1000000u + 5000;
	}
}
