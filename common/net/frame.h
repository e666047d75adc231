/* Control-frame codec: the 8-byte header and a streaming reader that turns arbitrary chunks of a
 * byte stream (partial frames, many frames per read) into whole frames. No I/O here: conn.c feeds
 * it from libuv reads, tests and the fuzzer feed it directly.
 *
 *     u16 magic 0x5444 ("TD") | u16 type | u32 payload length | payload      (big-endian)
 *
 * The length is checked against the reader's maximum from the header alone, before any buffer is
 * grown, so a hostile peer cannot make us allocate more than max_payload. */
#ifndef TANDEM_NET_FRAME_H
#define TANDEM_NET_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define FRAME_MAGIC 0x5444u
#define FRAME_HDR_BYTES 8u
#define FRAME_MAX_DEFAULT (16u << 20) /* 16 MiB: a 1M-token prompt plus block ids fits */
#define FRAME_MAX_LIMIT (1u << 30) /* no configuration may exceed this */

void frame_put_header(uint8_t out[FRAME_HDR_BYTES], uint16_t type, uint32_t payload_len);
/* Checks magic, type != 0 and payload length <= max_payload. ERR_PROTO / ERR_LIMIT with a message. */
int frame_parse_header(const uint8_t hdr[FRAME_HDR_BYTES], size_t max_payload, uint16_t *type,
                       uint32_t *payload_len, struct errbuf *e) TD_MUST_CHECK;

/* Called once per complete frame. `payload` is borrowed for the duration of the call. A nonzero
 * return stops feeding and is returned by frame_reader_feed (use it when the connection closes). */
typedef int (*frame_cb)(void *ctx, uint16_t type, const uint8_t *payload, size_t len);

struct frame_reader {
	size_t max_payload;
	uint8_t hdr[FRAME_HDR_BYTES];
	size_t n_hdr; /* header bytes collected so far */
	int have_hdr; /* hdr parsed: type/len valid, collecting payload */
	uint16_t type;
	uint32_t len;
	uint8_t *buf; /* owned: payload being collected when it spans reads */
	size_t n_buf, cap_buf;
	int broken; /* a previous feed failed: the stream is out of sync for good */
	uint64_t n_frames; /* frames delivered */
};

void frame_reader_init(struct frame_reader *r, size_t max_payload);
void frame_reader_fini(struct frame_reader *r);
/* Feeds n bytes. Returns 0, a negative error (ERR_PROTO/ERR_LIMIT/-ENOMEM; the reader is then
 * broken and every later feed fails), or the callback's nonzero return. */
int frame_reader_feed(struct frame_reader *r, const uint8_t *data, size_t n, frame_cb cb, void *ctx,
                      struct errbuf *e) TD_MUST_CHECK;

#endif
