/* Error codes shared by every module, and a small buffer that carries a human-readable message
 * next to the code. Functions return 0 or a negative code; the message names what went wrong
 * ("tensor blk.3.attn_k_b: expected 3 dims, file has 2") so the caller can print it as is. */
#ifndef TANDEM_BASE_ERR_H
#define TANDEM_BASE_ERR_H

#include <errno.h>
#include <stddef.h>

#define TD_MUST_CHECK __attribute__((warn_unused_result))
#define TD_PRINTF(f, a) __attribute__((format(printf, f, a)))

enum {
	ERR_OK = 0,
	/* errno-style codes are returned negated (-ENOMEM, -EINVAL, -EIO, -ENOENT, -ETIMEDOUT, ...) */
	ERR_BASE = 1000,
	ERR_FORMAT = -1001, /* malformed input file or message */
	ERR_LIMIT = -1002, /* a bounded buffer or pool is full / a size exceeds its maximum */
	ERR_PROTO = -1003, /* control-protocol violation by a peer */
	ERR_UNSUPPORTED = -1004, /* valid input we do not handle (unknown quant type, architecture) */
	ERR_NOTFOUND = -1005,
	ERR_CUDA = -1006,
	ERR_NCCL = -1007,
	ERR_UCX = -1008,
	ERR_CANCELLED = -1009,
	ERR_TIMEOUT = -1010,
	ERR_MISMATCH = -1011, /* two peers or files that must agree do not */
};

/* A message buffer filled by the function that detects the error. Optional everywhere: pass
 * NULL when the message is not wanted. */
struct errbuf {
	int code;
	char msg[512];
};

/* Formats the message into e (if non-NULL) and returns code, so callers write
 * `return errbuf_set(e, ERR_FORMAT, "...", ...);`. */
int errbuf_set(struct errbuf *e, int code, const char *fmt, ...) TD_PRINTF(3, 4);
/* Prepends "prefix: " to an existing message (for adding context while unwinding). */
int errbuf_prefix(struct errbuf *e, const char *fmt, ...) TD_PRINTF(2, 3);
const char *err_name(int code);

#endif
