/* Stop strings: detokenizes a sequence's generated tokens as they come (streaming, so a stop
 * string split across tokens or inside a multi-byte character is still found) and reports the
 * first stop string that appears in the text. Keeps only the last (longest stop - 1) bytes. */
#ifndef TANDEM_DECODE_STOP_H
#define TANDEM_DECODE_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "common/tok/tok.h"

struct stop_matcher {
	const struct tok *t;
	struct tok_stream ts;
	char **stop; /* borrowed */
	size_t *stop_len;
	uint32_t n_stop;
	size_t max_len;
	char *buf; /* tail of the text + room for one token's bytes */
	size_t n_buf, cap;
};

/* stop[] must outlive the matcher. t may be NULL (no tokenizer: nothing ever matches). */
int stop_init(struct stop_matcher *m, const struct tok *t, char **stop, uint32_t n_stop) TD_MUST_CHECK;
void stop_fini(struct stop_matcher *m);
/* Feeds one generated token; returns the index of the stop string now present, or -1. */
int stop_feed(struct stop_matcher *m, int32_t token);

#endif
