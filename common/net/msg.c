/* Packs and unpacks control messages: the one file that uses the protobuf-c code generated from
 * proto/tandem.proto (see msg.h for ownership rules). Decoding validates everything the wire types
 * cannot express (ranges, counts, lengths, required rids), so the roles can trust a struct msg.
 * Encoding applies the same checks, so a peer never receives what it would refuse. */
#include "common/net/msg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/frame.h"
#include "proto/tandem.pb-c.h"

#define BLOCK_IDS_MAX (1u << 24)
#define CHECKSUMS_MAX (1u << 24)

/* ---- names -------------------------------------------------------------------------------- */

const char *msg_type_name(int type)
{
	static const char *names[] = {"NONE",         "HELLO",       "HELLO_ACK",  "HEARTBEAT",
	                              "KV_RESERVE",   "KV_RESERVED", "KV_RELEASE", "PREFILL_REQUEST",
	                              "PREFILL_DONE", "KV_READY",    "TOKENS",     "FINISH",
	                              "CANCEL",       "DRAIN",       "ERROR"};
	return type >= 0 && type <= MSG_TYPE_MAX ? names[type] : "UNKNOWN";
}

const char *msg_role_name(int role)
{
	static const char *names[] = {"unknown", "router", "prefill", "decode"};
	return role >= 0 && role <= 3 ? names[role] : "unknown";
}

const char *msg_error_name(int code)
{
	static const char *names[] = {
	    "NONE",           "PROTOCOL",    "VERSION",         "AUTH",     "LAYOUT_MISMATCH",
	    "MODEL_MISMATCH", "NO_CAPACITY", "UNKNOWN_REQUEST", "TIMEOUT",  "INTERNAL",
	    "TRANSFER",       "CANCELLED",   "INVALID_REQUEST", "DRAINING", "CHECKSUM",
	    "DUPLICATE"};
	return code >= 0 && code <= MSG_ERR_MAX ? names[code] : "UNKNOWN";
}

const char *msg_finish_name(int reason)
{
	static const char *names[] = {"none", "stop", "length", "cancelled", "error"};
	return reason >= 0 && reason <= 4 ? names[reason] : "unknown";
}

int msg_error_from_err(int err)
{
	switch (err) {
	case 0: return MSG_ERR_NONE;
	case ERR_PROTO:
	case ERR_FORMAT: return MSG_ERR_PROTOCOL;
	case ERR_LIMIT: return MSG_ERR_NO_CAPACITY;
	case ERR_UCX: return MSG_ERR_TRANSFER;
	case ERR_CANCELLED: return MSG_ERR_CANCELLED;
	case ERR_TIMEOUT:
	case -ETIMEDOUT: return MSG_ERR_TIMEOUT;
	case ERR_MISMATCH: return MSG_ERR_LAYOUT_MISMATCH;
	case -EINVAL: return MSG_ERR_INVALID_REQUEST;
	default: return MSG_ERR_INTERNAL;
	}
}

void msg_init(struct msg *m, int type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	if (type == MSG_FINISH)
		m->u.finish.stop_index = -1;
}

void msg_clear(struct msg *m)
{
	if (m->owned_pb)
		protobuf_c_message_free_unpacked(m->owned_pb, NULL);
	free(m->owned_extra);
	m->owned_pb = NULL;
	m->owned_extra = NULL;
}

/* ---- shared checks ----------------------------------------------------------------------------- */

static int check_str(const char *s, size_t max, const char *what, struct errbuf *e)
{
	if (s && strnlen(s, max + 1) > max)
		return errbuf_set(e, ERR_PROTO, "%s: longer than %zu bytes", what, max);
	return 0;
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what, struct errbuf *e)
{
	dst[0] = 0;
	if (!src)
		return 0;
	size_t n = strnlen(src, cap);
	if (n >= cap)
		return errbuf_set(e, ERR_PROTO, "%s: longer than %zu bytes", what, cap - 1);
	memcpy(dst, src, n);
	dst[n] = 0;
	return 0;
}

static int check_sampling(const struct msg_sampling *s, struct errbuf *e)
{
	if (!isfinite(s->temperature) || s->temperature < 0 || s->temperature > 100)
		return errbuf_set(e, ERR_PROTO, "sampling.temperature %g out of range [0, 100]",
		                  (double)s->temperature);
	if (!isfinite(s->top_p) || s->top_p < 0 || s->top_p > 1)
		return errbuf_set(e, ERR_PROTO, "sampling.top_p %g out of range [0, 1]", (double)s->top_p);
	if (!isfinite(s->min_p) || s->min_p < 0 || s->min_p > 1)
		return errbuf_set(e, ERR_PROTO, "sampling.min_p %g out of range [0, 1]", (double)s->min_p);
	if (!isfinite(s->presence_penalty) || fabsf(s->presence_penalty) > 2 ||
	    !isfinite(s->frequency_penalty) || fabsf(s->frequency_penalty) > 2)
		return errbuf_set(e, ERR_PROTO, "sampling: presence/frequency penalty out of range [-2, 2]");
	if (s->n_logprobs > MSG_TOP_LOGPROBS_MAX)
		return errbuf_set(e, ERR_PROTO, "sampling.n_logprobs %u exceeds %d", s->n_logprobs,
		                  MSG_TOP_LOGPROBS_MAX);
	return 0;
}

static int check_dtype(int d, const char *what, struct errbuf *e)
{
	if (d < MSG_KV_NONE || d > MSG_KV_FP8_E4M3)
		return errbuf_set(e, ERR_PROTO, "%s: unknown KV dtype %d", what, d);
	return 0;
}

static int check_region(const struct msg_kv_region *r, const char *what, struct errbuf *e)
{
	if (r->n_segments == 0 || r->n_segments > 4096)
		return errbuf_set(e, ERR_PROTO, "%s.n_segments %u out of range [1, 4096]", what,
		                  r->n_segments);
	if (r->segment_bytes == 0 || r->n_blocks == 0)
		return errbuf_set(e, ERR_PROTO, "%s: segment_bytes and n_blocks must be > 0", what);
	if (r->rkey_len == 0 || r->rkey_len > MSG_BLOB_MAX)
		return errbuf_set(e, ERR_PROTO, "%s.rkey: %zu bytes, expected 1..%d", what, r->rkey_len,
		                  MSG_BLOB_MAX);
	/* the highest byte addressed must not wrap: base + (nseg-1)*sstride + (nblk-1)*bstride + sbytes */
	unsigned __int128 top = (unsigned __int128)r->base_addr +
	                        (unsigned __int128)(r->n_segments - 1) * r->segment_stride +
	                        (unsigned __int128)(r->n_blocks - 1) * r->block_stride + r->segment_bytes;
	if (top > (unsigned __int128)UINT64_MAX)
		return errbuf_set(e, ERR_PROTO, "%s: region extends past the 64-bit address space", what);
	if (r->fence_addr &&
	    ((r->fence_addr & 7) || (unsigned __int128)r->fence_addr + (unsigned __int128)r->n_blocks * 8 >
	                                (unsigned __int128)UINT64_MAX))
		return errbuf_set(e, ERR_PROTO, "%s.fence_addr %#llx misaligned or past the address space",
		                  what, (unsigned long long)r->fence_addr);
	return 0;
}

static int check_token(const struct msg_token *t, const char *what, struct errbuf *e)
{
	if (t->n_top > MSG_TOP_LOGPROBS_MAX)
		return errbuf_set(e, ERR_PROTO, "%s: %u top logprobs exceed %d", what, t->n_top,
		                  MSG_TOP_LOGPROBS_MAX);
	if (isnan(t->logprob) || t->logprob > 0)
		return errbuf_set(e, ERR_PROTO, "%s: logprob %g is not <= 0", what, (double)t->logprob);
	return 0;
}

/* ---- sub-message conversion ---------------------------------------------------------------- */

static void sampling_to_pb(const struct msg_sampling *s, Tandem__Sampling *p)
{
	tandem__sampling__init(p);
	p->has_temperature = 1, p->temperature = s->temperature;
	p->has_top_p = 1, p->top_p = s->top_p;
	p->has_top_k = 1, p->top_k = s->top_k;
	p->has_seed = 1, p->seed = s->seed;
	p->has_n_logprobs = 1, p->n_logprobs = s->n_logprobs;
	p->has_logprobs = 1, p->logprobs = s->logprobs;
	p->has_min_p = 1, p->min_p = s->min_p;
	p->has_presence_penalty = 1, p->presence_penalty = s->presence_penalty;
	p->has_frequency_penalty = 1, p->frequency_penalty = s->frequency_penalty;
}

static int sampling_from_pb(const Tandem__Sampling *p, struct msg_sampling *s, struct errbuf *e)
{
	memset(s, 0, sizeof(*s));
	if (!p)
		return 0;
	s->temperature = p->has_temperature ? p->temperature : 0;
	s->top_p = p->has_top_p ? p->top_p : 0;
	s->top_k = p->has_top_k ? p->top_k : 0;
	s->seed = p->has_seed ? p->seed : 0;
	s->n_logprobs = p->has_n_logprobs ? p->n_logprobs : 0;
	s->logprobs = p->has_logprobs && p->logprobs;
	s->min_p = p->has_min_p ? p->min_p : 0;
	s->presence_penalty = p->has_presence_penalty ? p->presence_penalty : 0;
	s->frequency_penalty = p->has_frequency_penalty ? p->frequency_penalty : 0;
	return check_sampling(s, e);
}

static void layout_to_pb(const struct msg_kv_layout *l, Tandem__KvLayout *p)
{
	tandem__kv_layout__init(p);
	p->arch = (char *)l->arch;
	p->has_n_layers = 1, p->n_layers = l->n_layers;
	p->has_block_size = 1, p->block_size = l->block_size;
	p->has_latent_dim = 1, p->latent_dim = l->latent_dim;
	p->has_rope_dim = 1, p->rope_dim = l->rope_dim;
	p->has_n_indexer_layers = 1, p->n_indexer_layers = l->n_indexer_layers;
	p->has_indexer_dim = 1, p->indexer_dim = l->indexer_dim;
	p->has_dtype = 1, p->dtype = (Tandem__KvDtype)l->dtype;
	p->has_indexer_dtype = 1, p->indexer_dtype = (Tandem__KvDtype)l->indexer_dtype;
	p->has_block_bytes = 1, p->block_bytes = l->block_bytes;
	p->has_fingerprint = 1, p->fingerprint = l->fingerprint;
}

static int layout_from_pb(const Tandem__KvLayout *p, struct msg_kv_layout *l, struct errbuf *e)
{
	memset(l, 0, sizeof(*l));
	if (!p)
		return 0;
	int rc = copy_str(l->arch, sizeof(l->arch), p->arch, "kv_layout.arch", e);
	if (rc)
		return rc;
	l->n_layers = p->n_layers;
	l->block_size = p->block_size;
	l->latent_dim = p->latent_dim;
	l->rope_dim = p->rope_dim;
	l->n_indexer_layers = p->n_indexer_layers;
	l->indexer_dim = p->indexer_dim;
	l->dtype = p->has_dtype ? (int)p->dtype : 0;
	l->indexer_dtype = p->has_indexer_dtype ? (int)p->indexer_dtype : 0;
	l->block_bytes = p->block_bytes;
	l->fingerprint = p->fingerprint;
	if ((rc = check_dtype(l->dtype, "kv_layout.dtype", e)) ||
	    (rc = check_dtype(l->indexer_dtype, "kv_layout.indexer_dtype", e)))
		return rc;
	return 0;
}

static void region_to_pb(const struct msg_kv_region *r, Tandem__KvRegion *p)
{
	tandem__kv_region__init(p);
	p->has_base_addr = 1, p->base_addr = r->base_addr;
	p->has_block_stride = 1, p->block_stride = r->block_stride;
	p->has_n_segments = 1, p->n_segments = r->n_segments;
	p->has_segment_stride = 1, p->segment_stride = r->segment_stride;
	p->has_segment_bytes = 1, p->segment_bytes = r->segment_bytes;
	p->has_n_blocks = 1, p->n_blocks = r->n_blocks;
	p->has_rkey = 1, p->rkey.data = (uint8_t *)r->rkey, p->rkey.len = r->rkey_len;
	p->has_fence_addr = r->fence_addr != 0, p->fence_addr = r->fence_addr;
}

static int region_from_pb(const Tandem__KvRegion *p, struct msg_kv_region *r, const char *what,
                          struct errbuf *e)
{
	memset(r, 0, sizeof(*r));
	if (!p)
		return errbuf_set(e, ERR_PROTO, "%s: missing", what);
	r->base_addr = p->base_addr;
	r->block_stride = p->block_stride;
	r->n_segments = p->n_segments;
	r->segment_stride = p->segment_stride;
	r->segment_bytes = p->segment_bytes;
	r->n_blocks = p->n_blocks;
	r->rkey = p->has_rkey ? p->rkey.data : NULL;
	r->rkey_len = p->has_rkey ? p->rkey.len : 0;
	r->fence_addr = p->has_fence_addr ? p->fence_addr : 0;
	return check_region(r, what, e);
}

static void token_to_pb(const struct msg_token *t, Tandem__TokenLogprob *p)
{
	tandem__token_logprob__init(p);
	p->has_id = 1, p->id = t->id;
	p->has_logprob = 1, p->logprob = t->logprob;
	p->n_top_ids = t->n_top, p->top_ids = (uint32_t *)t->top_ids;
	p->n_top_logprobs = t->n_top, p->top_logprobs = (float *)t->top_logprobs;
}

static int token_from_pb(const Tandem__TokenLogprob *p, struct msg_token *t, const char *what,
                         struct errbuf *e)
{
	memset(t, 0, sizeof(*t));
	if (!p)
		return errbuf_set(e, ERR_PROTO, "%s: missing", what);
	if (!p->has_id)
		return errbuf_set(e, ERR_PROTO, "%s: missing token id", what);
	if (p->n_top_ids != p->n_top_logprobs)
		return errbuf_set(e, ERR_PROTO, "%s: %zu top ids but %zu top logprobs", what, p->n_top_ids,
		                  p->n_top_logprobs);
	if (p->n_top_ids > MSG_TOP_LOGPROBS_MAX)
		return errbuf_set(e, ERR_PROTO, "%s: %zu top logprobs exceed %d", what, p->n_top_ids,
		                  MSG_TOP_LOGPROBS_MAX);
	t->id = p->id;
	t->logprob = p->has_logprob ? p->logprob : 0;
	t->n_top = (uint32_t)p->n_top_ids;
	for (size_t i = 0; i < p->n_top_ids; i++) {
		t->top_ids[i] = p->top_ids[i];
		t->top_logprobs[i] = p->top_logprobs[i];
	}
	return check_token(t, what, e);
}

/* ---- encode ------------------------------------------------------------------------------------ */

/* Packs pb into a new frame of the given type. */
static int pack_frame(int type, const ProtobufCMessage *pb, size_t max_payload, uint8_t **frame,
                      size_t *frame_len, struct errbuf *e)
{
	size_t len = protobuf_c_message_get_packed_size(pb);
	if (len > max_payload || len > UINT32_MAX)
		return errbuf_set(e, ERR_LIMIT, "%s message of %zu bytes exceeds the frame maximum of %zu",
		                  msg_type_name(type), len, max_payload);
	uint8_t *buf = malloc(FRAME_HDR_BYTES + len + 1);
	if (!buf)
		return errbuf_set(e, -ENOMEM, "cannot allocate a %zu-byte frame", len);
	frame_put_header(buf, (uint16_t)type, (uint32_t)len);
	size_t n = protobuf_c_message_pack(pb, buf + FRAME_HDR_BYTES);
	TD_ASSERT(n == len);
	*frame = buf;
	*frame_len = FRAME_HDR_BYTES + len;
	return 0;
}

static int check_rid(uint64_t rid, int type, struct errbuf *e)
{
	if (rid == 0)
		return errbuf_set(e, ERR_PROTO, "%s: missing request id (rid 0)", msg_type_name(type));
	return 0;
}

int msg_encode(const struct msg *m, size_t max_payload, uint8_t **frame, size_t *frame_len, struct errbuf *e)
{
	int rc = 0;
	*frame = NULL;
	*frame_len = 0;
	switch (m->type) {
	case MSG_HELLO: {
		const struct msg_hello *h = &m->u.hello;
		Tandem__Hello p;
		Tandem__KvLayout pl;
		Tandem__KvRegion pr;
		tandem__hello__init(&p);
		if (h->ucx_address_len > MSG_BLOB_MAX || h->model_id_len > MSG_MODEL_ID_MAX)
			return errbuf_set(e, ERR_PROTO, "HELLO: ucx address or model id too long");
		p.has_protocol_version = 1, p.protocol_version = h->protocol_version;
		p.has_role = 1, p.role = (Tandem__Role)h->role;
		p.name = (char *)h->name;
		p.has_model_id = 1, p.model_id.data = (uint8_t *)h->model_id,
		p.model_id.len = h->model_id_len;
		p.model_name = (char *)h->model_name;
		layout_to_pb(&h->kv_layout, &pl);
		p.kv_layout = &pl;
		p.has_tp_degree = 1, p.tp_degree = h->tp_degree;
		p.has_max_batch = 1, p.max_batch = h->max_batch;
		p.has_max_seq_len = 1, p.max_seq_len = h->max_seq_len;
		p.has_n_blocks_total = 1, p.n_blocks_total = h->n_blocks_total;
		p.has_max_tokens_per_step = 1, p.max_tokens_per_step = h->max_tokens_per_step;
		if (h->ucx_address_len)
			p.has_ucx_address = 1, p.ucx_address.data = (uint8_t *)h->ucx_address,
			p.ucx_address.len = h->ucx_address_len;
		if (h->has_kv_region) {
			if ((rc = check_region(&h->kv_region, "HELLO.kv_region", e)))
				return rc;
			region_to_pb(&h->kv_region, &pr);
			p.kv_region = &pr;
		}
		p.auth_token = h->auth_token[0] ? (char *)h->auth_token : NULL;
		p.has_metrics_port = 1, p.metrics_port = h->metrics_port;
		p.ucx_transports = (char *)h->ucx_transports;
		p.has_pid = 1, p.pid = h->pid;
		p.has_fence_attempts = h->fence_attempts, p.fence_attempts = h->fence_attempts;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_HELLO_ACK: {
		Tandem__HelloAck p;
		tandem__hello_ack__init(&p);
		p.has_protocol_version = 1, p.protocol_version = m->u.hello_ack.protocol_version;
		p.has_worker_id = 1, p.worker_id = m->u.hello_ack.worker_id;
		p.has_heartbeat_ms = 1, p.heartbeat_ms = m->u.hello_ack.heartbeat_ms;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_HEARTBEAT: {
		const struct msg_heartbeat *h = &m->u.heartbeat;
		Tandem__Heartbeat p;
		tandem__heartbeat__init(&p);
		p.has_queued_tokens = 1, p.queued_tokens = h->queued_tokens;
		p.has_free_blocks = 1, p.free_blocks = h->free_blocks;
		p.has_running_seqs = 1, p.running_seqs = h->running_seqs;
		p.has_queued_requests = 1, p.queued_requests = h->queued_requests;
		p.has_used_blocks = 1, p.used_blocks = h->used_blocks;
		p.has_draining = 1, p.draining = h->draining;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_KV_RESERVE: {
		const struct msg_kv_reserve *r = &m->u.kv_reserve;
		Tandem__KvReserve p;
		Tandem__Sampling ps;
		if ((rc = check_rid(r->rid, m->type, e)) || (rc = check_sampling(&r->sampling, e)))
			return rc;
		if (r->n_stop > MSG_STOP_MAX || r->n_stop_token_ids > MSG_STOP_IDS_MAX)
			return errbuf_set(e, ERR_PROTO,
			                  "KV_RESERVE: more than %d stop strings or %d stop ids",
			                  MSG_STOP_MAX, MSG_STOP_IDS_MAX);
		for (size_t i = 0; i < r->n_stop; i++)
			if ((rc = check_str(r->stop[i], MSG_STOP_LEN_MAX, "KV_RESERVE.stop", e)))
				return rc;
		tandem__kv_reserve__init(&p);
		p.has_rid = 1, p.rid = r->rid;
		p.has_n_prompt_tokens = 1, p.n_prompt_tokens = r->n_prompt_tokens;
		p.has_max_tokens = 1, p.max_tokens = r->max_tokens;
		sampling_to_pb(&r->sampling, &ps);
		p.sampling = &ps;
		p.n_stop = r->n_stop, p.stop = (char **)r->stop;
		p.n_stop_token_ids = r->n_stop_token_ids, p.stop_token_ids = (uint32_t *)r->stop_token_ids;
		p.has_ignore_eos = 1, p.ignore_eos = r->ignore_eos;
		p.has_deadline_ms = 1, p.deadline_ms = r->deadline_ms;
		p.n_prompt = r->n_prompt, p.prompt = (uint32_t *)r->prompt;
		p.has_attempt = r->attempt != 0, p.attempt = r->attempt;
		p.has_prefill_window_ms = r->prefill_window_ms != 0,
		p.prefill_window_ms = r->prefill_window_ms;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_KV_RESERVED: {
		Tandem__KvReserved p;
		if ((rc = check_rid(m->u.kv_reserved.rid, m->type, e)))
			return rc;
		tandem__kv_reserved__init(&p);
		p.has_rid = 1, p.rid = m->u.kv_reserved.rid;
		p.n_block_ids = m->u.kv_reserved.n_block_ids,
		p.block_ids = (uint32_t *)m->u.kv_reserved.block_ids;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_KV_RELEASE: {
		Tandem__KvRelease p;
		if ((rc = check_rid(m->u.kv_release.rid, m->type, e)))
			return rc;
		tandem__kv_release__init(&p);
		p.has_rid = 1, p.rid = m->u.kv_release.rid;
		p.has_no_writer = m->u.kv_release.no_writer, p.no_writer = m->u.kv_release.no_writer;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_PREFILL_REQUEST: {
		const struct msg_prefill_request *r = &m->u.prefill_request;
		Tandem__PrefillRequest p;
		Tandem__Sampling ps;
		Tandem__DecodeTarget pt;
		Tandem__KvRegion pr;
		if ((rc = check_rid(r->rid, m->type, e)) || (rc = check_sampling(&r->sampling, e)) ||
		    (rc = check_region(&r->target_region, "PREFILL_REQUEST.target.kv_region", e)))
			return rc;
		if (r->n_tokens == 0)
			return errbuf_set(e, ERR_PROTO, "PREFILL_REQUEST: empty prompt");
		if (r->target_ucx_address_len > MSG_BLOB_MAX)
			return errbuf_set(e, ERR_PROTO, "PREFILL_REQUEST: target UCX address too long");
		tandem__prefill_request__init(&p);
		p.has_rid = 1, p.rid = r->rid;
		p.n_tokens = r->n_tokens, p.tokens = (uint32_t *)r->tokens;
		sampling_to_pb(&r->sampling, &ps);
		p.sampling = &ps;
		tandem__decode_target__init(&pt);
		pt.name = (char *)r->target_name;
		pt.has_ucx_address = 1, pt.ucx_address.data = (uint8_t *)r->target_ucx_address,
		pt.ucx_address.len = r->target_ucx_address_len;
		region_to_pb(&r->target_region, &pr);
		pt.kv_region = &pr;
		pt.n_block_ids = r->n_block_ids, pt.block_ids = (uint32_t *)r->block_ids;
		p.target = &pt;
		p.has_checksums = 1, p.checksums = r->checksums;
		p.has_deadline_ms = 1, p.deadline_ms = r->deadline_ms;
		p.has_attempt = r->has_attempt, p.attempt = r->attempt;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_PREFILL_DONE: {
		const struct msg_prefill_done *d = &m->u.prefill_done;
		Tandem__PrefillDone p;
		Tandem__TokenLogprob pt;
		if ((rc = check_rid(d->rid, m->type, e)) ||
		    (rc = check_token(&d->first, "PREFILL_DONE.first", e)))
			return rc;
		tandem__prefill_done__init(&p);
		p.has_rid = 1, p.rid = d->rid;
		token_to_pb(&d->first, &pt);
		p.first = &pt;
		p.has_n_prompt_tokens = 1, p.n_prompt_tokens = d->n_prompt_tokens;
		p.has_kv_bytes = 1, p.kv_bytes = d->kv_bytes;
		p.n_block_checksums = d->n_checksums, p.block_checksums = (uint32_t *)d->checksums;
		p.has_prefill_us = 1, p.prefill_us = d->prefill_us;
		p.has_transfer_us = 1, p.transfer_us = d->transfer_us;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_KV_READY: {
		const struct msg_kv_ready *d = &m->u.kv_ready;
		Tandem__KvReady p;
		Tandem__TokenLogprob pt;
		if ((rc = check_rid(d->rid, m->type, e)) ||
		    (rc = check_token(&d->first, "KV_READY.first", e)))
			return rc;
		tandem__kv_ready__init(&p);
		p.has_rid = 1, p.rid = d->rid;
		token_to_pb(&d->first, &pt);
		p.first = &pt;
		p.has_n_prompt_tokens = 1, p.n_prompt_tokens = d->n_prompt_tokens;
		p.n_block_checksums = d->n_checksums, p.block_checksums = (uint32_t *)d->checksums;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_TOKENS: {
		const struct msg_tokens *t = &m->u.tokens;
		if ((rc = check_rid(t->rid, m->type, e)))
			return rc;
		if (t->n_tokens == 0 || t->n_tokens > MSG_TOKENS_PER_MSG_MAX)
			return errbuf_set(e, ERR_PROTO, "TOKENS: %zu tokens, expected 1..%d", t->n_tokens,
			                  MSG_TOKENS_PER_MSG_MAX);
		Tandem__TokenLogprob *pts = malloc(t->n_tokens * sizeof(*pts));
		Tandem__TokenLogprob **pp = malloc(t->n_tokens * sizeof(*pp));
		if (!pts || !pp) {
			rc = errbuf_set(e, -ENOMEM, "TOKENS: out of memory");
			goto tokens_out;
		}
		for (size_t i = 0; i < t->n_tokens; i++) {
			if ((rc = check_token(&t->tokens[i], "TOKENS.tokens", e)))
				goto tokens_out;
			token_to_pb(&t->tokens[i], &pts[i]);
			pp[i] = &pts[i];
		}
		Tandem__Tokens p;
		tandem__tokens__init(&p);
		p.has_rid = 1, p.rid = t->rid;
		p.n_tokens = t->n_tokens, p.tokens = pp;
		rc = pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	tokens_out:
		free(pp);
		free(pts);
		return rc;
	}
	case MSG_FINISH: {
		const struct msg_finish_m *f = &m->u.finish;
		Tandem__Finish p;
		if ((rc = check_rid(f->rid, m->type, e)))
			return rc;
		if (f->reason < MSG_FINISH_STOP || f->reason > MSG_FINISH_ERROR)
			return errbuf_set(e, ERR_PROTO, "FINISH: reason %d out of range", f->reason);
		tandem__finish__init(&p);
		p.has_rid = 1, p.rid = f->rid;
		p.has_reason = 1, p.reason = (Tandem__FinishReason)f->reason;
		p.has_prompt_tokens = 1, p.prompt_tokens = f->prompt_tokens;
		p.has_completion_tokens = 1, p.completion_tokens = f->completion_tokens;
		p.has_error_code = 1, p.error_code = (Tandem__ErrorCode)f->error_code;
		p.error_message = f->error_message[0] ? (char *)f->error_message : NULL;
		p.has_stop_index = 1, p.stop_index = f->stop_index;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_CANCEL: {
		Tandem__Cancel p;
		if ((rc = check_rid(m->u.cancel.rid, m->type, e)))
			return rc;
		tandem__cancel__init(&p);
		p.has_rid = 1, p.rid = m->u.cancel.rid;
		p.has_reason = 1, p.reason = (Tandem__ErrorCode)m->u.cancel.reason;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_DRAIN: {
		Tandem__Drain p;
		tandem__drain__init(&p);
		p.has_deadline_ms = 1, p.deadline_ms = m->u.drain.deadline_ms;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	case MSG_ERROR: {
		const struct msg_error_m *er = &m->u.error;
		Tandem__Error p;
		tandem__error__init(&p);
		if (er->has_rid)
			p.has_rid = 1, p.rid = er->rid;
		p.has_code = 1, p.code = (Tandem__ErrorCode)er->code;
		p.message = (char *)er->message;
		return pack_frame(m->type, &p.base, max_payload, frame, frame_len, e);
	}
	default: return errbuf_set(e, ERR_PROTO, "cannot encode unknown message type %d", m->type);
	}
}

/* ---- decode ------------------------------------------------------------------------------------ */

static int need_rid(protobuf_c_boolean has, uint64_t rid, int type, struct errbuf *e)
{
	if (!has || rid == 0)
		return errbuf_set(e, ERR_PROTO, "%s: missing request id", msg_type_name(type));
	return 0;
}

static int decode_hello(const Tandem__Hello *p, struct msg_hello *h, struct errbuf *e)
{
	int rc;
	if (!p->has_protocol_version)
		return errbuf_set(e, ERR_PROTO, "HELLO: missing protocol_version");
	h->protocol_version = p->protocol_version;
	h->role = p->has_role ? (int)p->role : 0;
	if (h->role != MSG_ROLE_PREFILL && h->role != MSG_ROLE_DECODE && h->role != MSG_ROLE_ROUTER)
		return errbuf_set(e, ERR_PROTO, "HELLO: role %d is not prefill, decode or router", h->role);
	if ((rc = copy_str(h->name, sizeof(h->name), p->name, "HELLO.name", e)) ||
	    (rc = copy_str(h->model_name, sizeof(h->model_name), p->model_name, "HELLO.model_name", e)) ||
	    (rc = copy_str(h->auth_token, sizeof(h->auth_token), p->auth_token, "HELLO.auth_token", e)) ||
	    (rc = copy_str(h->ucx_transports, sizeof(h->ucx_transports), p->ucx_transports,
	                   "HELLO.ucx_transports", e)))
		return rc;
	if (p->has_model_id) {
		if (p->model_id.len > MSG_MODEL_ID_MAX)
			return errbuf_set(e, ERR_PROTO, "HELLO.model_id: %zu bytes exceed %d",
			                  p->model_id.len, MSG_MODEL_ID_MAX);
		memcpy(h->model_id, p->model_id.data, p->model_id.len);
		h->model_id_len = p->model_id.len;
	}
	if ((rc = layout_from_pb(p->kv_layout, &h->kv_layout, e)))
		return rc;
	h->tp_degree = p->tp_degree;
	h->max_batch = p->max_batch;
	h->max_seq_len = p->max_seq_len;
	h->n_blocks_total = p->n_blocks_total;
	h->max_tokens_per_step = p->max_tokens_per_step;
	if (p->has_ucx_address) {
		if (p->ucx_address.len > MSG_BLOB_MAX)
			return errbuf_set(e, ERR_PROTO, "HELLO.ucx_address: %zu bytes exceed %d",
			                  p->ucx_address.len, MSG_BLOB_MAX);
		h->ucx_address = p->ucx_address.data;
		h->ucx_address_len = p->ucx_address.len;
	}
	if (p->kv_region) {
		h->has_kv_region = 1;
		if ((rc = region_from_pb(p->kv_region, &h->kv_region, "HELLO.kv_region", e)))
			return rc;
	}
	if (h->role == MSG_ROLE_DECODE && (!h->has_kv_region || h->ucx_address_len == 0))
		return errbuf_set(e, ERR_PROTO,
		                  "HELLO: a decode worker must publish its UCX address and KV region");
	h->metrics_port = p->metrics_port;
	h->pid = p->pid;
	h->fence_attempts = p->has_fence_attempts && p->fence_attempts;
	return 0;
}

static int decode_u32_array(size_t n, size_t max, const char *what, struct errbuf *e)
{
	if (n > max)
		return errbuf_set(e, ERR_PROTO, "%s: %zu entries exceed %zu", what, n, max);
	return 0;
}

int msg_decode(int type, const uint8_t *payload, size_t len, struct msg *m, struct errbuf *e)
{
	int rc = 0;
	msg_init(m, type);
	const ProtobufCMessageDescriptor *desc = NULL;
	switch (type) {
	case MSG_HELLO: desc = &tandem__hello__descriptor; break;
	case MSG_HELLO_ACK: desc = &tandem__hello_ack__descriptor; break;
	case MSG_HEARTBEAT: desc = &tandem__heartbeat__descriptor; break;
	case MSG_KV_RESERVE: desc = &tandem__kv_reserve__descriptor; break;
	case MSG_KV_RESERVED: desc = &tandem__kv_reserved__descriptor; break;
	case MSG_KV_RELEASE: desc = &tandem__kv_release__descriptor; break;
	case MSG_PREFILL_REQUEST: desc = &tandem__prefill_request__descriptor; break;
	case MSG_PREFILL_DONE: desc = &tandem__prefill_done__descriptor; break;
	case MSG_KV_READY: desc = &tandem__kv_ready__descriptor; break;
	case MSG_TOKENS: desc = &tandem__tokens__descriptor; break;
	case MSG_FINISH: desc = &tandem__finish__descriptor; break;
	case MSG_CANCEL: desc = &tandem__cancel__descriptor; break;
	case MSG_DRAIN: desc = &tandem__drain__descriptor; break;
	case MSG_ERROR: desc = &tandem__error__descriptor; break;
	default: return errbuf_set(e, ERR_PROTO, "control frame: unknown message type %d", type);
	}
	ProtobufCMessage *pb = protobuf_c_message_unpack(desc, NULL, len, payload);
	if (!pb)
		return errbuf_set(e, ERR_PROTO, "%s: malformed protobuf payload (%zu bytes)",
		                  msg_type_name(type), len);
	m->owned_pb = pb;

	switch (type) {
	case MSG_HELLO: return decode_hello((const Tandem__Hello *)pb, &m->u.hello, e);
	case MSG_HELLO_ACK: {
		const Tandem__HelloAck *p = (const Tandem__HelloAck *)pb;
		m->u.hello_ack.protocol_version = p->protocol_version;
		m->u.hello_ack.worker_id = p->worker_id;
		m->u.hello_ack.heartbeat_ms = p->heartbeat_ms;
		return 0;
	}
	case MSG_HEARTBEAT: {
		const Tandem__Heartbeat *p = (const Tandem__Heartbeat *)pb;
		struct msg_heartbeat *h = &m->u.heartbeat;
		h->queued_tokens = p->queued_tokens;
		h->free_blocks = p->free_blocks;
		h->running_seqs = p->running_seqs;
		h->queued_requests = p->queued_requests;
		h->used_blocks = p->used_blocks;
		h->draining = p->has_draining && p->draining;
		return 0;
	}
	case MSG_KV_RESERVE: {
		const Tandem__KvReserve *p = (const Tandem__KvReserve *)pb;
		struct msg_kv_reserve *r = &m->u.kv_reserve;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)) ||
		    (rc = sampling_from_pb(p->sampling, &r->sampling, e)))
			return rc;
		if ((rc = decode_u32_array(p->n_stop, MSG_STOP_MAX, "KV_RESERVE.stop", e)) ||
		    (rc = decode_u32_array(p->n_stop_token_ids, MSG_STOP_IDS_MAX, "KV_RESERVE.stop_token_ids",
		                           e)))
			return rc;
		for (size_t i = 0; i < p->n_stop; i++) {
			if ((rc = check_str(p->stop[i], MSG_STOP_LEN_MAX, "KV_RESERVE.stop", e)))
				return rc;
			if (!p->stop[i] || !p->stop[i][0])
				return errbuf_set(e, ERR_PROTO, "KV_RESERVE.stop[%zu]: empty stop string", i);
		}
		r->rid = p->rid;
		r->n_prompt_tokens = p->n_prompt_tokens;
		r->max_tokens = p->max_tokens;
		r->n_stop = p->n_stop, r->stop = (const char *const *)p->stop;
		r->n_stop_token_ids = p->n_stop_token_ids, r->stop_token_ids = p->stop_token_ids;
		r->ignore_eos = p->has_ignore_eos && p->ignore_eos;
		r->deadline_ms = p->deadline_ms;
		r->n_prompt = p->n_prompt, r->prompt = p->prompt;
		r->attempt = p->has_attempt ? p->attempt : 0;
		r->prefill_window_ms = p->has_prefill_window_ms ? p->prefill_window_ms : 0;
		if (r->n_prompt_tokens == 0)
			return errbuf_set(e, ERR_PROTO, "KV_RESERVE: n_prompt_tokens is 0");
		if (r->n_prompt && r->n_prompt != r->n_prompt_tokens)
			return errbuf_set(e, ERR_PROTO, "KV_RESERVE: %zu prompt ids but n_prompt_tokens %u",
			                  r->n_prompt, r->n_prompt_tokens);
		return 0;
	}
	case MSG_KV_RESERVED: {
		const Tandem__KvReserved *p = (const Tandem__KvReserved *)pb;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)) ||
		    (rc = decode_u32_array(p->n_block_ids, BLOCK_IDS_MAX, "KV_RESERVED.block_ids", e)))
			return rc;
		if (p->n_block_ids == 0)
			return errbuf_set(e, ERR_PROTO, "KV_RESERVED: no block ids");
		m->u.kv_reserved.rid = p->rid;
		m->u.kv_reserved.n_block_ids = p->n_block_ids;
		m->u.kv_reserved.block_ids = p->block_ids;
		return 0;
	}
	case MSG_KV_RELEASE: {
		const Tandem__KvRelease *p = (const Tandem__KvRelease *)pb;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)))
			return rc;
		m->u.kv_release.rid = p->rid;
		m->u.kv_release.no_writer = p->has_no_writer && p->no_writer;
		return 0;
	}
	case MSG_PREFILL_REQUEST: {
		const Tandem__PrefillRequest *p = (const Tandem__PrefillRequest *)pb;
		struct msg_prefill_request *r = &m->u.prefill_request;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)) ||
		    (rc = sampling_from_pb(p->sampling, &r->sampling, e)))
			return rc;
		if (p->n_tokens == 0)
			return errbuf_set(e, ERR_PROTO, "PREFILL_REQUEST: empty prompt");
		if (!p->target)
			return errbuf_set(e, ERR_PROTO, "PREFILL_REQUEST: missing decode target");
		const Tandem__DecodeTarget *t = p->target;
		if ((rc = copy_str(r->target_name, sizeof(r->target_name), t->name,
		                   "PREFILL_REQUEST.target.name", e)) ||
		    (rc = region_from_pb(t->kv_region, &r->target_region, "PREFILL_REQUEST.target.kv_region",
		                         e)) ||
		    (rc = decode_u32_array(t->n_block_ids, BLOCK_IDS_MAX, "PREFILL_REQUEST.target.block_ids",
		                           e)))
			return rc;
		if (!t->has_ucx_address || t->ucx_address.len == 0 || t->ucx_address.len > MSG_BLOB_MAX)
			return errbuf_set(
			    e, ERR_PROTO,
			    "PREFILL_REQUEST.target.ucx_address: missing or longer than %d bytes",
			    MSG_BLOB_MAX);
		for (size_t i = 0; i < t->n_block_ids; i++)
			if (t->block_ids[i] >= r->target_region.n_blocks)
				return errbuf_set(e, ERR_PROTO,
				                  "PREFILL_REQUEST.target.block_ids[%zu] = %u outside the "
				                  "pool of %u blocks",
				                  i, t->block_ids[i], r->target_region.n_blocks);
		r->rid = p->rid;
		r->n_tokens = p->n_tokens, r->tokens = p->tokens;
		r->target_ucx_address = t->ucx_address.data, r->target_ucx_address_len = t->ucx_address.len;
		r->n_block_ids = t->n_block_ids, r->block_ids = t->block_ids;
		r->checksums = p->has_checksums && p->checksums;
		r->deadline_ms = p->deadline_ms;
		r->has_attempt = p->has_attempt;
		r->attempt = p->has_attempt ? p->attempt : 0;
		return 0;
	}
	case MSG_PREFILL_DONE: {
		const Tandem__PrefillDone *p = (const Tandem__PrefillDone *)pb;
		struct msg_prefill_done *d = &m->u.prefill_done;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)) ||
		    (rc = token_from_pb(p->first, &d->first, "PREFILL_DONE.first", e)) ||
		    (rc = decode_u32_array(p->n_block_checksums, CHECKSUMS_MAX,
		                           "PREFILL_DONE.block_checksums", e)))
			return rc;
		d->rid = p->rid;
		d->n_prompt_tokens = p->n_prompt_tokens;
		d->kv_bytes = p->kv_bytes;
		d->n_checksums = p->n_block_checksums, d->checksums = p->block_checksums;
		d->prefill_us = p->prefill_us;
		d->transfer_us = p->transfer_us;
		return 0;
	}
	case MSG_KV_READY: {
		const Tandem__KvReady *p = (const Tandem__KvReady *)pb;
		struct msg_kv_ready *d = &m->u.kv_ready;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)) ||
		    (rc = token_from_pb(p->first, &d->first, "KV_READY.first", e)) ||
		    (rc = decode_u32_array(p->n_block_checksums, CHECKSUMS_MAX, "KV_READY.block_checksums",
		                           e)))
			return rc;
		d->rid = p->rid;
		d->n_prompt_tokens = p->n_prompt_tokens;
		d->n_checksums = p->n_block_checksums, d->checksums = p->block_checksums;
		return 0;
	}
	case MSG_TOKENS: {
		const Tandem__Tokens *p = (const Tandem__Tokens *)pb;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)))
			return rc;
		if (p->n_tokens == 0 || p->n_tokens > MSG_TOKENS_PER_MSG_MAX)
			return errbuf_set(e, ERR_PROTO, "TOKENS: %zu tokens, expected 1..%d", p->n_tokens,
			                  MSG_TOKENS_PER_MSG_MAX);
		struct msg_token *ts = calloc(p->n_tokens, sizeof(*ts));
		if (!ts)
			return errbuf_set(e, -ENOMEM, "TOKENS: out of memory");
		m->owned_extra = ts;
		for (size_t i = 0; i < p->n_tokens; i++)
			if ((rc = token_from_pb(p->tokens[i], &ts[i], "TOKENS.tokens", e)))
				return rc;
		m->u.tokens.rid = p->rid;
		m->u.tokens.n_tokens = p->n_tokens;
		m->u.tokens.tokens = ts;
		return 0;
	}
	case MSG_FINISH: {
		const Tandem__Finish *p = (const Tandem__Finish *)pb;
		struct msg_finish_m *f = &m->u.finish;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)))
			return rc;
		f->rid = p->rid;
		f->reason = p->has_reason ? (int)p->reason : 0;
		if (f->reason < MSG_FINISH_STOP || f->reason > MSG_FINISH_ERROR)
			return errbuf_set(e, ERR_PROTO, "FINISH: reason %d out of range", f->reason);
		f->prompt_tokens = p->prompt_tokens;
		f->completion_tokens = p->completion_tokens;
		f->error_code = p->has_error_code ? (int)p->error_code : 0;
		if (f->error_code < 0 || f->error_code > 0xffff)
			return errbuf_set(e, ERR_PROTO, "FINISH: error code %d out of range", f->error_code);
		/* an over-long message from a peer is truncated rather than refused: it is only for people */
		if (p->error_message)
			snprintf(f->error_message, sizeof(f->error_message), "%s", p->error_message);
		f->stop_index = p->has_stop_index ? p->stop_index : -1;
		if (f->stop_index < -1 || f->stop_index >= MSG_STOP_MAX)
			return errbuf_set(e, ERR_PROTO, "FINISH: stop_index %d out of range", f->stop_index);
		return 0;
	}
	case MSG_CANCEL: {
		const Tandem__Cancel *p = (const Tandem__Cancel *)pb;
		if ((rc = need_rid(p->has_rid, p->rid, type, e)))
			return rc;
		m->u.cancel.rid = p->rid;
		m->u.cancel.reason = p->has_reason ? (int)p->reason : MSG_ERR_CANCELLED;
		if (m->u.cancel.reason < 0 || m->u.cancel.reason > 0xffff)
			return errbuf_set(e, ERR_PROTO, "CANCEL: reason %d out of range", m->u.cancel.reason);
		return 0;
	}
	case MSG_DRAIN: m->u.drain.deadline_ms = ((const Tandem__Drain *)pb)->deadline_ms; return 0;
	case MSG_ERROR: {
		const Tandem__Error *p = (const Tandem__Error *)pb;
		struct msg_error_m *er = &m->u.error;
		er->has_rid = p->has_rid && p->rid != 0;
		er->rid = p->rid;
		er->code = p->has_code ? (int)p->code : MSG_ERR_INTERNAL;
		if (er->code < 0 || er->code > 0xffff)
			return errbuf_set(e, ERR_PROTO, "ERROR: code %d out of range", er->code);
		if (p->message)
			snprintf(er->message, sizeof(er->message), "%s", p->message);
		return 0;
	}
	}
	return errbuf_set(e, ERR_PROTO, "control frame: unknown message type %d", type);
}

/* ---- layouts ------------------------------------------------------------------------------------ */

int msg_kv_layout_compare(const struct msg_kv_layout *a, const char *an, const struct msg_kv_layout *b,
                          const char *bn, struct errbuf *e)
{
	if (strcmp(a->arch, b->arch) != 0)
		return errbuf_set(e, ERR_MISMATCH, "KV layout arch: %s '%s', %s '%s'", an, a->arch, bn,
		                  b->arch);
	struct {
		const char *name;
		unsigned long long va, vb;
	} f[] = {
	    {"n_layers", a->n_layers, b->n_layers},
	    {"block_size", a->block_size, b->block_size},
	    {"latent_dim", a->latent_dim, b->latent_dim},
	    {"rope_dim", a->rope_dim, b->rope_dim},
	    {"n_indexer_layers", a->n_indexer_layers, b->n_indexer_layers},
	    {"indexer_dim", a->indexer_dim, b->indexer_dim},
	    {"dtype", (unsigned long long)a->dtype, (unsigned long long)b->dtype},
	    {"indexer_dtype", (unsigned long long)a->indexer_dtype, (unsigned long long)b->indexer_dtype},
	    {"block_bytes", a->block_bytes, b->block_bytes},
	    {"fingerprint", a->fingerprint, b->fingerprint},
	};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		if (f[i].va != f[i].vb)
			return errbuf_set(e, ERR_MISMATCH, "KV layout %s: %s %llu, %s %llu", f[i].name, an,
			                  f[i].va, bn, f[i].vb);
	return 0;
}
