/* Control messages as plain C structs, and their conversion to and from protobuf frames.
 * msg.c is the only user of the code protoc-c generates from proto/tandem.proto; the meaning of
 * every message and field, and the request life cycle, are documented there.
 *
 * Ownership:
 *  - msg_encode() borrows everything the struct points to and returns a malloc'd frame (header +
 *    payload) that the caller owns (hand it to conn_send_take()).
 *  - msg_decode() fills a struct msg whose pointers (strings, arrays, bytes) are owned by the
 *    struct; msg_clear() frees them. Decoded strings are NUL-terminated.
 *  - msg_decode() validates what the types cannot: enum ranges, array counts, string lengths, a rid
 *    on every request message, matching lengths of paired arrays. A message that fails is ERR_PROTO
 *    with a message naming the field; the receiver then sends Error(PROTOCOL) and closes. */
#ifndef TANDEM_NET_MSG_H
#define TANDEM_NET_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define PROTOCOL_VERSION 1

/* Same numbers as enum MsgType in tandem.proto (the frame type). */
enum msg_type {
	MSG_HELLO = 1,
	MSG_HELLO_ACK = 2,
	MSG_HEARTBEAT = 3,
	MSG_KV_RESERVE = 4,
	MSG_KV_RESERVED = 5,
	MSG_KV_RELEASE = 6,
	MSG_PREFILL_REQUEST = 7,
	MSG_PREFILL_DONE = 8,
	MSG_KV_READY = 9,
	MSG_TOKENS = 10,
	MSG_FINISH = 11,
	MSG_CANCEL = 12,
	MSG_DRAIN = 13,
	MSG_ERROR = 14,
	MSG_TYPE_MAX = 14,
};

enum msg_role { MSG_ROLE_UNKNOWN = 0, MSG_ROLE_ROUTER = 1, MSG_ROLE_PREFILL = 2, MSG_ROLE_DECODE = 3 };

/* Same numbers as enum ErrorCode in tandem.proto. */
enum msg_error {
	MSG_ERR_NONE = 0,
	MSG_ERR_PROTOCOL = 1,
	MSG_ERR_VERSION = 2,
	MSG_ERR_AUTH = 3,
	MSG_ERR_LAYOUT_MISMATCH = 4,
	MSG_ERR_MODEL_MISMATCH = 5,
	MSG_ERR_NO_CAPACITY = 6,
	MSG_ERR_UNKNOWN_REQUEST = 7,
	MSG_ERR_TIMEOUT = 8,
	MSG_ERR_INTERNAL = 9,
	MSG_ERR_TRANSFER = 10,
	MSG_ERR_CANCELLED = 11,
	MSG_ERR_INVALID_REQUEST = 12,
	MSG_ERR_DRAINING = 13,
	MSG_ERR_CHECKSUM = 14,
	MSG_ERR_DUPLICATE = 15,
	MSG_ERR_MAX = 15,
};

enum msg_finish {
	MSG_FINISH_NONE = 0,
	MSG_FINISH_STOP = 1,
	MSG_FINISH_LENGTH = 2,
	MSG_FINISH_CANCELLED = 3,
	MSG_FINISH_ERROR = 4,
};

enum msg_kv_dtype { MSG_KV_NONE = 0, MSG_KV_F32 = 1, MSG_KV_BF16 = 2, MSG_KV_F16 = 3, MSG_KV_FP8_E4M3 = 4 };

/* Limits enforced on decode (and on encode, so we never send what a peer would refuse). */
#define MSG_NAME_MAX 64 /* worker name, model name, arch, transports: bytes without NUL */
#define MSG_TOKEN_MAX 256 /* auth token */
#define MSG_BLOB_MAX 4096 /* UCX worker address, rkey */
#define MSG_STOP_MAX 16 /* stop strings per request */
#define MSG_STOP_LEN_MAX 256
#define MSG_STOP_IDS_MAX 64
#define MSG_TOP_LOGPROBS_MAX 20
#define MSG_TOKENS_PER_MSG_MAX 4096
#define MSG_MODEL_ID_MAX 64

struct msg_kv_layout {
	char arch[MSG_NAME_MAX + 1];
	uint32_t n_layers, block_size, latent_dim, rope_dim, n_indexer_layers, indexer_dim;
	int dtype, indexer_dtype; /* enum msg_kv_dtype */
	uint64_t block_bytes;
	uint64_t fingerprint;
};

struct msg_kv_region {
	uint64_t base_addr, block_stride;
	uint32_t n_segments;
	uint64_t segment_stride, segment_bytes;
	uint32_t n_blocks;
	const uint8_t *rkey; /* borrowed on encode, owned by the msg after decode */
	size_t rkey_len;
	uint64_t fence_addr; /* 0: no transfer fences (see tandem.proto KvRegion) */
};

struct msg_sampling {
	float temperature, top_p, min_p, presence_penalty, frequency_penalty;
	uint32_t top_k;
	uint64_t seed;
	bool logprobs;
	uint32_t n_logprobs; /* <= MSG_TOP_LOGPROBS_MAX */
};

struct msg_token {
	uint32_t id;
	float logprob;
	uint32_t n_top; /* <= MSG_TOP_LOGPROBS_MAX */
	uint32_t top_ids[MSG_TOP_LOGPROBS_MAX];
	float top_logprobs[MSG_TOP_LOGPROBS_MAX];
};

struct msg_hello {
	uint32_t protocol_version;
	int role; /* enum msg_role */
	char name[MSG_NAME_MAX + 1];
	uint8_t model_id[MSG_MODEL_ID_MAX];
	size_t model_id_len;
	char model_name[MSG_NAME_MAX + 1];
	struct msg_kv_layout kv_layout;
	uint32_t tp_degree, max_batch, max_seq_len, n_blocks_total, max_tokens_per_step;
	const uint8_t *ucx_address;
	size_t ucx_address_len;
	bool has_kv_region;
	struct msg_kv_region kv_region;
	char auth_token[MSG_TOKEN_MAX + 1];
	uint32_t metrics_port;
	char ucx_transports[MSG_NAME_MAX * 4 + 1];
	uint32_t pid;
	bool fence_attempts; /* decode: checks per-attempt fences (tandem.proto Hello) */
};

struct msg_hello_ack {
	uint32_t protocol_version, worker_id, heartbeat_ms;
};

struct msg_heartbeat {
	uint64_t queued_tokens;
	uint32_t free_blocks, running_seqs, queued_requests, used_blocks;
	bool draining;
};

struct msg_kv_reserve {
	uint64_t rid;
	uint32_t n_prompt_tokens, max_tokens;
	struct msg_sampling sampling;
	size_t n_stop;
	const char *const *stop; /* n_stop NUL-terminated strings */
	size_t n_stop_token_ids;
	const uint32_t *stop_token_ids;
	bool ignore_eos;
	uint32_t deadline_ms;
	size_t n_prompt;
	const uint32_t *prompt; /* optional */
	uint32_t attempt; /* prefill attempt whose fence counts; on a held rid: an announcement */
	uint32_t prefill_window_ms; /* the prefill's write window (0: the default 120 s) */
};

struct msg_kv_reserved {
	uint64_t rid;
	size_t n_block_ids;
	const uint32_t *block_ids;
};

struct msg_rid {
	uint64_t rid;
};

struct msg_kv_release {
	uint64_t rid;
	bool no_writer; /* no prefill can be writing: free at once (no quarantine) */
};

struct msg_prefill_request {
	uint64_t rid;
	size_t n_tokens;
	const uint32_t *tokens;
	struct msg_sampling sampling;
	/* decode target */
	char target_name[MSG_NAME_MAX + 1];
	const uint8_t *target_ucx_address;
	size_t target_ucx_address_len;
	struct msg_kv_region target_region;
	size_t n_block_ids;
	const uint32_t *block_ids;
	bool checksums;
	uint32_t deadline_ms;
	bool has_attempt; /* absent: the target has no per-attempt fences (write the plain rid) */
	uint32_t attempt;
};

struct msg_prefill_done {
	uint64_t rid;
	struct msg_token first;
	uint32_t n_prompt_tokens;
	uint64_t kv_bytes;
	size_t n_checksums;
	const uint32_t *checksums;
	uint32_t prefill_us, transfer_us;
};

struct msg_kv_ready {
	uint64_t rid;
	struct msg_token first;
	uint32_t n_prompt_tokens;
	size_t n_checksums;
	const uint32_t *checksums;
};

struct msg_tokens {
	uint64_t rid;
	size_t n_tokens; /* 1..MSG_TOKENS_PER_MSG_MAX */
	const struct msg_token *tokens;
};

struct msg_finish_m {
	uint64_t rid;
	int reason; /* enum msg_finish */
	uint32_t prompt_tokens, completion_tokens;
	int error_code; /* enum msg_error */
	char error_message[512];
	int32_t stop_index; /* -1: none */
};

struct msg_cancel {
	uint64_t rid;
	int reason; /* enum msg_error */
};

struct msg_drain {
	uint32_t deadline_ms;
};

struct msg_error_m {
	bool has_rid;
	uint64_t rid;
	int code; /* enum msg_error */
	char message[512];
};

struct msg {
	int type; /* enum msg_type */
	union {
		struct msg_hello hello;
		struct msg_hello_ack hello_ack;
		struct msg_heartbeat heartbeat;
		struct msg_kv_reserve kv_reserve;
		struct msg_kv_reserved kv_reserved;
		struct msg_kv_release kv_release;
		struct msg_prefill_request prefill_request;
		struct msg_prefill_done prefill_done;
		struct msg_kv_ready kv_ready;
		struct msg_tokens tokens;
		struct msg_finish_m finish;
		struct msg_cancel cancel;
		struct msg_drain drain;
		struct msg_error_m error;
	} u;
	/* decode: allocations backing the pointers above (freed by msg_clear) */
	void *owned_pb; /* the unpacked protobuf-c message */
	void *owned_extra; /* converted arrays (struct msg_token for Tokens) */
};

/* Zeroes m and sets its type (and the defaults that are not zero: stop_index -1). */
void msg_init(struct msg *m, int type);
/* Encodes m as one frame (header + payload) into a new malloc'd buffer. ERR_LIMIT when the payload
 * would exceed max_payload, ERR_PROTO when a field is out of range (what the peer would refuse). */
int msg_encode(const struct msg *m, size_t max_payload, uint8_t **frame, size_t *frame_len,
               struct errbuf *e) TD_MUST_CHECK;
/* Decodes one frame payload of the given type into m (msg_clear() it afterwards, also on error). */
int msg_decode(int type, const uint8_t *payload, size_t len, struct msg *m, struct errbuf *e) TD_MUST_CHECK;
void msg_clear(struct msg *m);

const char *msg_type_name(int type);
const char *msg_role_name(int role);
const char *msg_error_name(int code);
const char *msg_finish_name(int reason);
/* Maps a tandem error code (err.h) to the protocol code a peer should see. */
int msg_error_from_err(int err);

/* Compares two layouts field by field; 0 when equal, else ERR_MISMATCH with e naming the first
 * field that differs and both values ("block_size: prefill 64, decode 32"). */
int msg_kv_layout_compare(const struct msg_kv_layout *a, const char *a_name, const struct msg_kv_layout *b,
                          const char *b_name, struct errbuf *e) TD_MUST_CHECK;

#endif
