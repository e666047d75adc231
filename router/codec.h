/* Text <-> token ids for the router: prompt encoding, chat templating and per-token bytes for
 * detokenization and logprobs. Two implementations sit behind one interface: the model's own
 * tokenizer and chat template (common/tok, read from the GGUF metadata only), and a byte-level
 * codec (id = byte value, one end-of-sequence id) used with the simulated engine in tests and
 * benchmarks. */
#ifndef TANDEM_ROUTER_CODEC_H
#define TANDEM_ROUTER_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "router/api.h"

struct codec;

/* What the router learns from the GGUF besides the tokenizer. */
struct codec_model_info {
	char name[128]; /* the file name without .gguf */
	char arch[64]; /* general.architecture */
	uint32_t n_ctx; /* <arch>.context_length (0 if absent) */
};

struct codec *codec_create_bytes(void);
/* Loads tokenizer + chat format from the GGUF at path (metadata only). chat_format: a format name
 * ("glm4", "glm5", "deepseek-v3", ...) or NULL/"" to detect it from tokenizer.chat_template. */
int codec_create_gguf(struct codec **out, const char *path, const char *chat_format,
                      struct codec_model_info *info, struct errbuf *e) TD_MUST_CHECK;
void codec_destroy(struct codec *c); /* accepts NULL */

/* Encodes completion prompt text (BOS added when the vocabulary asks for it); *ids malloc'd. */
int codec_encode(const struct codec *c, const char *text, size_t len, int32_t **ids, uint32_t *n_ids,
                 struct errbuf *e) TD_MUST_CHECK;
/* Renders req's chat messages with the model's template (ending with the assistant turn opener)
 * and tokenizes them; *ids malloc'd. */
int codec_chat(const struct codec *c, const struct api_request *req, int32_t **ids, uint32_t *n_ids,
               struct errbuf *e) TD_MUST_CHECK;
/* The bytes one token stands for (borrowed; may be a partial UTF-8 sequence). ERR_FORMAT for an id
 * outside the vocabulary. Control tokens decode to nothing. */
int codec_token_bytes(const struct codec *c, int32_t id, const char **bytes, size_t *len);
uint32_t codec_n_vocab(const struct codec *c);
/* End of generation (EOS/EOT or the chat format's stop tokens). */
bool codec_is_eog(const struct codec *c, int32_t id);

#endif
