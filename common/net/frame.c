/* Control-frame codec (see frame.h). The reader keeps at most one partial frame: the header bytes
 * seen so far and, once the header is validated, a payload buffer of exactly the announced size.
 * A frame wholly inside one chunk is handed to the callback in place, without copying. */
#include "common/net/frame.h"

#include <stdlib.h>
#include <string.h>

/* Payload buffers above this are released after use so one huge prompt does not pin memory. */
#define KEEP_BUF_MAX (1u << 20)

void frame_put_header(uint8_t out[FRAME_HDR_BYTES], uint16_t type, uint32_t payload_len)
{
	out[0] = (uint8_t)(FRAME_MAGIC >> 8);
	out[1] = (uint8_t)(FRAME_MAGIC & 0xff);
	out[2] = (uint8_t)(type >> 8);
	out[3] = (uint8_t)(type & 0xff);
	out[4] = (uint8_t)(payload_len >> 24);
	out[5] = (uint8_t)(payload_len >> 16);
	out[6] = (uint8_t)(payload_len >> 8);
	out[7] = (uint8_t)(payload_len);
}

int frame_parse_header(const uint8_t hdr[FRAME_HDR_BYTES], size_t max_payload, uint16_t *type,
                       uint32_t *payload_len, struct errbuf *e)
{
	uint16_t magic = (uint16_t)((hdr[0] << 8) | hdr[1]);
	if (magic != FRAME_MAGIC)
		return errbuf_set(e, ERR_PROTO,
		                  "control frame: bad magic 0x%02x%02x (expected 0x5444 'TD'; is the peer a "
		                  "tandem process speaking the control protocol?)",
		                  hdr[0], hdr[1]);
	uint16_t t = (uint16_t)((hdr[2] << 8) | hdr[3]);
	uint32_t len = ((uint32_t)hdr[4] << 24) | ((uint32_t)hdr[5] << 16) | ((uint32_t)hdr[6] << 8) | hdr[7];
	if (t == 0)
		return errbuf_set(e, ERR_PROTO, "control frame: type 0 is not a message type");
	if (len > max_payload)
		return errbuf_set(e, ERR_LIMIT,
		                  "control frame: type %u payload of %u bytes exceeds the maximum of %zu", t,
		                  len, max_payload);
	*type = t;
	*payload_len = len;
	return 0;
}

void frame_reader_init(struct frame_reader *r, size_t max_payload)
{
	memset(r, 0, sizeof(*r));
	if (max_payload > FRAME_MAX_LIMIT)
		max_payload = FRAME_MAX_LIMIT;
	r->max_payload = max_payload;
}

void frame_reader_fini(struct frame_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->cap_buf = r->n_buf = 0;
}

static void reset_frame(struct frame_reader *r)
{
	r->n_hdr = 0;
	r->have_hdr = 0;
	r->n_buf = 0;
	if (r->cap_buf > KEEP_BUF_MAX) {
		free(r->buf);
		r->buf = NULL;
		r->cap_buf = 0;
	}
}

int frame_reader_feed(struct frame_reader *r, const uint8_t *data, size_t n, frame_cb cb, void *ctx,
                      struct errbuf *e)
{
	if (r->broken)
		return errbuf_set(e, ERR_PROTO,
		                  "control frame stream already failed; connection must be closed");
	size_t off = 0;
	while (off < n) {
		if (!r->have_hdr) {
			size_t take = FRAME_HDR_BYTES - r->n_hdr;
			if (take > n - off)
				take = n - off;
			memcpy(r->hdr + r->n_hdr, data + off, take);
			r->n_hdr += take;
			off += take;
			if (r->n_hdr < FRAME_HDR_BYTES)
				break;
			int rc = frame_parse_header(r->hdr, r->max_payload, &r->type, &r->len, e);
			if (rc) {
				r->broken = 1;
				return rc;
			}
			r->have_hdr = 1;
			r->n_buf = 0;
		}
		size_t avail = n - off;
		if (r->n_buf == 0 && avail >= r->len) {
			/* whole payload in this chunk: deliver in place */
			const uint8_t *p = data + off;
			off += r->len;
			uint16_t t = r->type;
			uint32_t len = r->len;
			reset_frame(r);
			r->n_frames++;
			int rc = cb(ctx, t, p, len);
			if (rc)
				return rc;
			continue;
		}
		if (r->cap_buf < r->len) {
			/* r->len was validated against max_payload above */
			uint8_t *nb = realloc(r->buf, r->len);
			if (!nb) {
				r->broken = 1;
				return errbuf_set(e, -ENOMEM, "control frame: cannot allocate %u bytes",
				                  r->len);
			}
			r->buf = nb;
			r->cap_buf = r->len;
		}
		size_t need = r->len - r->n_buf;
		size_t take = need < avail ? need : avail;
		memcpy(r->buf + r->n_buf, data + off, take);
		r->n_buf += take;
		off += take;
		if (r->n_buf == r->len) {
			uint16_t t = r->type;
			uint32_t len = r->len;
			r->n_frames++;
			/* the callback reads r->buf; reset afterwards (it may release the buffer) */
			r->have_hdr = 0;
			r->n_hdr = 0;
			int rc = cb(ctx, t, r->buf, len);
			reset_frame(r);
			if (rc)
				return rc;
		}
	}
	return 0;
}
