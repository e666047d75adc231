/* Control messages: every message type survives encode -> frame -> decode with all fields intact,
 * and decode refuses what a peer must not send (missing rid, bad enums, out-of-range sampling,
 * block ids outside the pool, mismatched logprob arrays, unknown type, truncated payload) with
 * ERR_PROTO and a message naming the field. Layout comparison names the differing field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/frame.h"
#include "common/net/msg.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

static const uint8_t rkey[5] = {1, 2, 3, 4, 5};
static const uint8_t addr[7] = {9, 8, 7, 6, 5, 4, 3};

/* encode m, check the frame header, decode into out (caller clears out) */
static int round_trip(const struct msg *m, struct msg *out, struct errbuf *e)
{
	uint8_t *frame;
	size_t len;
	int rc = msg_encode(m, FRAME_MAX_DEFAULT, &frame, &len, e);
	if (rc) {
		msg_init(out, m->type);
		return rc;
	}
	uint16_t t;
	uint32_t plen;
	CHECK(frame_parse_header(frame, FRAME_MAX_DEFAULT, &t, &plen, e) == 0);
	CHECK(t == m->type && plen + FRAME_HDR_BYTES == len);
	rc = msg_decode(t, frame + FRAME_HDR_BYTES, plen, out, e);
	free(frame);
	return rc;
}

static void fill_region(struct msg_kv_region *r)
{
	r->base_addr = 0x7f0000001000ull;
	r->block_stride = 4096;
	r->n_segments = 3;
	r->segment_stride = 1 << 20;
	r->segment_bytes = 1024;
	r->n_blocks = 100;
	r->rkey = rkey;
	r->rkey_len = sizeof(rkey);
}

static void check_region(const struct msg_kv_region *r)
{
	CHECK(r->base_addr == 0x7f0000001000ull && r->block_stride == 4096 && r->n_segments == 3);
	CHECK(r->segment_stride == (1 << 20) && r->segment_bytes == 1024 && r->n_blocks == 100);
	CHECK(r->rkey_len == 5 && memcmp(r->rkey, rkey, 5) == 0);
}

static void test_hello(void)
{
	struct msg m, d;
	struct errbuf e = {0};
	msg_init(&m, MSG_HELLO);
	struct msg_hello *h = &m.u.hello;
	h->protocol_version = PROTOCOL_VERSION;
	h->role = MSG_ROLE_DECODE;
	snprintf(h->name, sizeof(h->name), "decode-0");
	memset(h->model_id, 0xab, 32);
	h->model_id_len = 32;
	snprintf(h->model_name, sizeof(h->model_name), "glm-dsa-tiny");
	snprintf(h->kv_layout.arch, sizeof(h->kv_layout.arch), "glm-dsa");
	h->kv_layout.n_layers = 3, h->kv_layout.block_size = 64, h->kv_layout.latent_dim = 256;
	h->kv_layout.rope_dim = 32, h->kv_layout.n_indexer_layers = 3, h->kv_layout.indexer_dim = 128;
	h->kv_layout.dtype = MSG_KV_BF16, h->kv_layout.indexer_dtype = MSG_KV_BF16;
	h->kv_layout.block_bytes = 123456, h->kv_layout.fingerprint = 0xdeadbeefcafef00dull;
	h->tp_degree = 8, h->max_batch = 64, h->max_seq_len = 4096, h->n_blocks_total = 100;
	h->ucx_address = addr, h->ucx_address_len = sizeof(addr);
	h->has_kv_region = true;
	fill_region(&h->kv_region);
	snprintf(h->auth_token, sizeof(h->auth_token), "s3cret");
	h->metrics_port = 9101, h->pid = 4242;
	snprintf(h->ucx_transports, sizeof(h->ucx_transports), "tcp/lo");
	h->fence_attempts = true;
	CHECK(round_trip(&m, &d, &e) == 0);
	const struct msg_hello *g = &d.u.hello;
	CHECK(g->fence_attempts);
	CHECK(g->protocol_version == PROTOCOL_VERSION && g->role == MSG_ROLE_DECODE);
	CHECK(strcmp(g->name, "decode-0") == 0 && strcmp(g->model_name, "glm-dsa-tiny") == 0);
	CHECK(g->model_id_len == 32 && g->model_id[31] == 0xab);
	CHECK(msg_kv_layout_compare(&h->kv_layout, "a", &g->kv_layout, "b", &e) == 0);
	CHECK(g->tp_degree == 8 && g->max_batch == 64 && g->max_seq_len == 4096 && g->n_blocks_total == 100);
	CHECK(g->ucx_address_len == 7 && memcmp(g->ucx_address, addr, 7) == 0);
	CHECK(g->has_kv_region);
	check_region(&g->kv_region);
	CHECK(strcmp(g->auth_token, "s3cret") == 0 && g->metrics_port == 9101 && g->pid == 4242);
	CHECK(strcmp(g->ucx_transports, "tcp/lo") == 0);

	/* layout difference is named */
	struct msg_kv_layout other = h->kv_layout;
	other.block_size = 32;
	CHECK(msg_kv_layout_compare(&h->kv_layout, "prefill-0", &other, "decode-0", &e) == ERR_MISMATCH);
	CHECK(strstr(e.msg, "block_size: prefill-0 64, decode-0 32") != NULL);
	snprintf(other.arch, sizeof(other.arch), "deepseek2");
	CHECK(msg_kv_layout_compare(&h->kv_layout, "p", &other, "d", &e) == ERR_MISMATCH);
	CHECK(strstr(e.msg, "arch") != NULL);
	msg_clear(&d);

	/* a decode worker without UCX address is refused */
	h->ucx_address_len = 0;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO);
	CHECK(strstr(e.msg, "decode worker must publish") != NULL);
	msg_clear(&d);
	/* a bad role is refused */
	h->ucx_address_len = sizeof(addr);
	h->role = 9;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO);
	CHECK(strstr(e.msg, "role 9") != NULL);
	msg_clear(&d);
}

static void test_request_messages(void)
{
	struct msg m, d;
	struct errbuf e = {0};
	uint32_t toks[300], blocks[5] = {4, 9, 0, 99, 17}, stop_ids[2] = {7, 8};
	for (int i = 0; i < 300; i++)
		toks[i] = (uint32_t)(i * 37 % 1000);
	const char *stops[2] = {"</s>", "\n\nUser:"};

	/* KvReserve */
	msg_init(&m, MSG_KV_RESERVE);
	struct msg_kv_reserve *r = &m.u.kv_reserve;
	r->rid = 77, r->n_prompt_tokens = 300, r->max_tokens = 50;
	r->sampling.temperature = 0.7f, r->sampling.top_p = 0.9f, r->sampling.top_k = 40,
	r->sampling.seed = 1ull << 40;
	r->sampling.logprobs = true, r->sampling.n_logprobs = 5;
	r->n_stop = 2, r->stop = stops, r->n_stop_token_ids = 2, r->stop_token_ids = stop_ids;
	r->ignore_eos = true, r->deadline_ms = 30000, r->n_prompt = 300, r->prompt = toks;
	CHECK(round_trip(&m, &d, &e) == 0);
	const struct msg_kv_reserve *gr = &d.u.kv_reserve;
	CHECK(gr->rid == 77 && gr->n_prompt_tokens == 300 && gr->max_tokens == 50);
	CHECK(fabsf(gr->sampling.temperature - 0.7f) < 1e-7f && gr->sampling.top_k == 40 &&
	      gr->sampling.seed == 1ull << 40);
	CHECK(gr->sampling.logprobs && gr->sampling.n_logprobs == 5);
	CHECK(gr->n_stop == 2 && strcmp(gr->stop[1], "\n\nUser:") == 0);
	CHECK(gr->n_stop_token_ids == 2 && gr->stop_token_ids[1] == 8 && gr->ignore_eos &&
	      gr->deadline_ms == 30000);
	CHECK(gr->n_prompt == 300 && gr->prompt[299] == toks[299]);
	CHECK(gr->attempt == 0); /* absent: the first attempt */
	msg_clear(&d);
	r->attempt = 3;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.kv_reserve.attempt == 3);
	msg_clear(&d);
	r->attempt = 0;
	/* out-of-range sampling refused by the encoder too */
	r->sampling.top_p = 1.5f;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO && strstr(e.msg, "top_p"));
	msg_clear(&d);
	r->sampling.top_p = NAN;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO);
	msg_clear(&d);
	r->sampling.top_p = 0.9f;
	r->rid = 0;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO && strstr(e.msg, "request id"));
	msg_clear(&d);

	/* KvReserved */
	msg_init(&m, MSG_KV_RESERVED);
	m.u.kv_reserved.rid = 5, m.u.kv_reserved.n_block_ids = 5, m.u.kv_reserved.block_ids = blocks;
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.kv_reserved.rid == 5 && d.u.kv_reserved.n_block_ids == 5 &&
	      d.u.kv_reserved.block_ids[3] == 99);
	msg_clear(&d);

	/* KvRelease, Cancel, Drain */
	msg_init(&m, MSG_KV_RELEASE);
	m.u.kv_release.rid = 123456789012345ull;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.kv_release.rid == 123456789012345ull);
	msg_clear(&d);
	msg_init(&m, MSG_CANCEL);
	m.u.cancel.rid = 3, m.u.cancel.reason = MSG_ERR_TIMEOUT;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.cancel.rid == 3 && d.u.cancel.reason == MSG_ERR_TIMEOUT);
	msg_clear(&d);
	msg_init(&m, MSG_DRAIN);
	m.u.drain.deadline_ms = 15000;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.drain.deadline_ms == 15000);
	msg_clear(&d);

	/* PrefillRequest */
	msg_init(&m, MSG_PREFILL_REQUEST);
	struct msg_prefill_request *p = &m.u.prefill_request;
	p->rid = 9, p->n_tokens = 300, p->tokens = toks;
	snprintf(p->target_name, sizeof(p->target_name), "decode-1");
	p->target_ucx_address = addr, p->target_ucx_address_len = sizeof(addr);
	fill_region(&p->target_region);
	p->n_block_ids = 5, p->block_ids = blocks, p->checksums = true, p->deadline_ms = 1000;
	CHECK(round_trip(&m, &d, &e) == 0);
	const struct msg_prefill_request *gp = &d.u.prefill_request;
	CHECK(gp->rid == 9 && gp->n_tokens == 300 && gp->tokens[150] == toks[150]);
	CHECK(strcmp(gp->target_name, "decode-1") == 0 && gp->target_ucx_address_len == 7);
	check_region(&gp->target_region);
	CHECK(gp->n_block_ids == 5 && gp->block_ids[4] == 17 && gp->checksums && gp->deadline_ms == 1000);
	CHECK(!gp->has_attempt && gp->attempt == 0); /* absent: the target has no per-attempt fences */
	msg_clear(&d);
	/* attempt 0 present is not the same as absent (the prefill may then fence on router loss) */
	p->has_attempt = true, p->attempt = 0;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.prefill_request.has_attempt &&
	      d.u.prefill_request.attempt == 0);
	msg_clear(&d);
	p->attempt = 2;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.prefill_request.has_attempt &&
	      d.u.prefill_request.attempt == 2);
	msg_clear(&d);
	p->has_attempt = false, p->attempt = 0;
	/* a block id outside the published pool is refused, naming the index */
	blocks[2] = 100;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO && strstr(e.msg, "block_ids[2] = 100"));
	msg_clear(&d);
	blocks[2] = 0;
	/* a region whose end wraps the address space is refused */
	p->target_region.base_addr = UINT64_MAX - 10;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO && strstr(e.msg, "address space"));
	msg_clear(&d);
}

static void fill_token(struct msg_token *t, uint32_t id)
{
	memset(t, 0, sizeof(*t));
	t->id = id;
	t->logprob = -0.25f * (float)(id % 5);
	t->n_top = 3;
	for (int i = 0; i < 3; i++)
		t->top_ids[i] = id + (uint32_t)i, t->top_logprobs[i] = -1.0f - (float)i;
}

static void test_result_messages(void)
{
	struct msg m, d;
	struct errbuf e = {0};
	uint32_t sums[3] = {0x11111111, 0x22222222, 0xffffffff};

	msg_init(&m, MSG_PREFILL_DONE);
	struct msg_prefill_done *p = &m.u.prefill_done;
	p->rid = 11;
	fill_token(&p->first, 42);
	p->n_prompt_tokens = 300, p->kv_bytes = 1ull << 33, p->n_checksums = 3, p->checksums = sums;
	p->prefill_us = 1234, p->transfer_us = 56;
	CHECK(round_trip(&m, &d, &e) == 0);
	const struct msg_prefill_done *g = &d.u.prefill_done;
	CHECK(g->rid == 11 && g->first.id == 42 && g->first.logprob == -0.5f && g->first.n_top == 3);
	CHECK(g->first.top_ids[2] == 44 && g->first.top_logprobs[2] == -3.0f);
	CHECK(g->n_prompt_tokens == 300 && g->kv_bytes == 1ull << 33 && g->n_checksums == 3 &&
	      g->checksums[2] == 0xffffffff);
	CHECK(g->prefill_us == 1234 && g->transfer_us == 56);
	msg_clear(&d);

	msg_init(&m, MSG_KV_READY);
	m.u.kv_ready.rid = 12;
	fill_token(&m.u.kv_ready.first, 7);
	m.u.kv_ready.n_prompt_tokens = 3, m.u.kv_ready.n_checksums = 3, m.u.kv_ready.checksums = sums;
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.kv_ready.rid == 12 && d.u.kv_ready.first.id == 7 &&
	      d.u.kv_ready.checksums[0] == 0x11111111);
	msg_clear(&d);

	static struct msg_token toks[100];
	for (int i = 0; i < 100; i++)
		fill_token(&toks[i], (uint32_t)i);
	msg_init(&m, MSG_TOKENS);
	m.u.tokens.rid = 13, m.u.tokens.n_tokens = 100, m.u.tokens.tokens = toks;
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.tokens.rid == 13 && d.u.tokens.n_tokens == 100);
	CHECK(d.u.tokens.tokens[99].id == 99 && d.u.tokens.tokens[99].logprob == -1.0f &&
	      d.u.tokens.tokens[99].top_ids[1] == 100);
	msg_clear(&d);
	toks[50].logprob = 0.5f; /* a positive logprob is nonsense */
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO && strstr(e.msg, "logprob"));
	msg_clear(&d);
	m.u.tokens.n_tokens = 0;
	CHECK(round_trip(&m, &d, &e) == ERR_PROTO);
	msg_clear(&d);

	msg_init(&m, MSG_FINISH);
	m.u.finish.rid = 14, m.u.finish.reason = MSG_FINISH_STOP, m.u.finish.prompt_tokens = 9;
	m.u.finish.completion_tokens = 21, m.u.finish.stop_index = 1;
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.finish.rid == 14 && d.u.finish.reason == MSG_FINISH_STOP &&
	      d.u.finish.completion_tokens == 21);
	CHECK(d.u.finish.stop_index == 1 && d.u.finish.error_code == 0);
	msg_clear(&d);
	m.u.finish.reason = MSG_FINISH_ERROR, m.u.finish.error_code = MSG_ERR_CHECKSUM,
	m.u.finish.stop_index = -1;
	snprintf(m.u.finish.error_message, sizeof(m.u.finish.error_message), "block 3 checksum");
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.finish.error_code == MSG_ERR_CHECKSUM &&
	      strcmp(d.u.finish.error_message, "block 3 checksum") == 0);
	CHECK(d.u.finish.stop_index == -1);
	msg_clear(&d);

	msg_init(&m, MSG_ERROR);
	m.u.error.has_rid = true, m.u.error.rid = 15, m.u.error.code = MSG_ERR_NO_CAPACITY;
	snprintf(m.u.error.message, sizeof(m.u.error.message), "pool full: 0 of 100 blocks free");
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.error.has_rid && d.u.error.rid == 15 && d.u.error.code == MSG_ERR_NO_CAPACITY);
	CHECK(strcmp(d.u.error.message, "pool full: 0 of 100 blocks free") == 0);
	msg_clear(&d);

	msg_init(&m, MSG_HEARTBEAT);
	m.u.heartbeat.queued_tokens = 1ull << 35, m.u.heartbeat.free_blocks = 5,
	m.u.heartbeat.running_seqs = 6;
	m.u.heartbeat.queued_requests = 7, m.u.heartbeat.used_blocks = 8, m.u.heartbeat.draining = true;
	CHECK(round_trip(&m, &d, &e) == 0);
	CHECK(d.u.heartbeat.queued_tokens == 1ull << 35 && d.u.heartbeat.free_blocks == 5 &&
	      d.u.heartbeat.draining);
	msg_clear(&d);

	msg_init(&m, MSG_HELLO_ACK);
	m.u.hello_ack.protocol_version = 1, m.u.hello_ack.worker_id = 3, m.u.hello_ack.heartbeat_ms = 500;
	CHECK(round_trip(&m, &d, &e) == 0 && d.u.hello_ack.worker_id == 3 &&
	      d.u.hello_ack.heartbeat_ms == 500);
	msg_clear(&d);
}

static void test_hostile_payloads(void)
{
	struct msg d;
	struct errbuf e = {0};
	/* unknown type */
	CHECK(msg_decode(99, (const uint8_t *)"", 0, &d, &e) == ERR_PROTO &&
	      strstr(e.msg, "unknown message type 99"));
	msg_clear(&d);
	/* empty payloads of request messages lack the rid */
	CHECK(msg_decode(MSG_PREFILL_REQUEST, (const uint8_t *)"", 0, &d, &e) == ERR_PROTO);
	msg_clear(&d);
	CHECK(msg_decode(MSG_FINISH, (const uint8_t *)"", 0, &d, &e) == ERR_PROTO);
	msg_clear(&d);
	/* a field claiming more bytes than the payload has */
	const uint8_t bad[] = {0x12, 0x7f, 0x01};
	CHECK(msg_decode(MSG_HELLO, bad, sizeof(bad), &d, &e) == ERR_PROTO && strstr(e.msg, "malformed"));
	msg_clear(&d);
	/* truncations of a valid PrefillRequest: never crash, never accept garbage silently */
	struct msg m;
	uint32_t toks[4] = {1, 2, 3, 4}, blocks[1] = {0};
	msg_init(&m, MSG_PREFILL_REQUEST);
	struct msg_prefill_request *p = &m.u.prefill_request;
	p->rid = 1, p->n_tokens = 4, p->tokens = toks;
	p->target_ucx_address = addr, p->target_ucx_address_len = sizeof(addr);
	fill_region(&p->target_region);
	p->n_block_ids = 1, p->block_ids = blocks;
	uint8_t *frame;
	size_t len;
	CHECK(msg_encode(&m, FRAME_MAX_DEFAULT, &frame, &len, &e) == 0);
	size_t plen = len - FRAME_HDR_BYTES;
	for (size_t cut = 0; cut < plen; cut++) {
		int rc = msg_decode(MSG_PREFILL_REQUEST, frame + FRAME_HDR_BYTES, cut, &d, &e);
		CHECK(rc == 0 || rc == ERR_PROTO);
		/* only cuts that drop the trailing optional fields (checksums: 2 bytes, deadline: 2) can
		 * be valid; everything cut into the rid, prompt or decode target must be refused */
		if (rc == 0)
			CHECK(cut >= plen - 4);
		msg_clear(&d);
	}
	free(frame);
	/* the maximum frame size applies when encoding */
	CHECK(msg_encode(&m, 10, &frame, &len, &e) == ERR_LIMIT && frame == NULL);
	CHECK(strstr(e.msg, "exceeds the frame maximum") != NULL);
}

int main(void)
{
	test_hello();
	test_request_messages();
	test_result_messages();
	test_hostile_payloads();
	if (n_fail) {
		fprintf(stderr, "test_proto_msg: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_proto_msg: all checks passed\n");
	return 0;
}
