/* Text <-> token ids for the router: prompt encoding, chat templating and per-token bytes for
 * detokenization and logprobs. Two implementations sit behind one interface: the model's own
 * tokenizer and chat template (common/tok, from the GGUF metadata), and a byte-level codec (id =
 * byte value, one end-of-sequence id) used with the simulated engine in tests and benchmarks. */
#ifndef TANDEM_ROUTER_CODEC_H
#define TANDEM_ROUTER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "router/api.h"

struct codec;

struct codec *codec_create_bytes(void);
void codec_destroy(struct codec *c); /* accepts NULL */

/* Encodes text; *ids is malloc'd (caller frees). */
int codec_encode(const struct codec *c, const char *text, size_t len, int32_t **ids, uint32_t *n_ids,
		 struct errbuf *e) TD_MUST_CHECK;
/* Renders chat messages with the model's template, ending with the assistant turn opener;
 * *out malloc'd. */
int codec_chat(const struct codec *c, const struct api_message *m, size_t n, char **out,
	       struct errbuf *e) TD_MUST_CHECK;
/* The bytes one token stands for (borrowed; may be a partial UTF-8 sequence). ERR_FORMAT for an id
 * outside the vocabulary. */
int codec_token_bytes(const struct codec *c, int32_t id, const char **bytes, size_t *len);
uint32_t codec_n_vocab(const struct codec *c);
int32_t codec_eos(const struct codec *c);

#endif
