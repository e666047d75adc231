/* Chat templates: OpenAI-style `messages` (a jansson array) -> the prompt text of a model family
 * (MODEL-SPEC.md §6), and that text -> token ids. Instead of a Jinja interpreter we recognise the
 * GGUF's tokenizer.chat_template by distinctive substrings (or take a configured format name) and
 * render the format in C.
 *
 * Formats:
 *   "glm5"          GLM-4.7 / GLM-5 / GLM-5.1: [gMASK]<sop>, role tags with no newline after them,
 *                   past reasoning dropped (`</think>`) before the last user turn and kept
 *                   (`<think>…</think>`) after it; generation prompt `<|assistant|><think>` or,
 *                   with thinking off, `<|assistant|></think>`.
 *   "glm5.2"        GLM-5.2: adds the `<|system|>Reasoning Effort: Max|High|Low` turn and renders
 *                   hidden reasoning as `<think></think>`; with thinking off the generation prompt
 *                   is `<|assistant|><think></think>` (inferred from that convention, not verified).
 *   "glm4"          GLM-4 chat: a newline after every role tag (`<|user|>\n…`), generation prompt
 *                   `<|assistant|>\n` (+ `<think>` with thinking on); the tiny test models use it.
 *   "deepseek-v3"   DeepSeek-V3 (2024-12 / 0324): BOS + system prompts, <｜User｜> / <｜Assistant｜>;
 *                   tool calls / outputs as the template in deepseek-v3-vocab.gguf intends (its
 *                   never-reset "first call/output" flags are reset per assistant turn / tool run).
 *   "deepseek-v3.1" DeepSeek-V3.1: as V3 with `<think>` / `</think>` thinking control.
 *   "deepseek-r1"   DeepSeek-R1: as V3, past answers keep only the text after `</think>`, and the
 *                   generation prompt is `<｜Assistant｜><think>\n` (it always reasons).
 *
 * Unverified against real GGUFs (none is in tests/data): the exact GLM-5 template (MODEL-SPEC §8.1);
 * detection keys on "[gMASK]<sop>" / "<|assistant|>"+"<|user|>" (GLM; "Reasoning Effort" -> 5.2;
 * a role interpolated into the tag, "<|{{", plus "|>\n" -> glm4) and "<｜Assistant｜>" (DeepSeek;
 * "thinking" -> V3.1, else "<think>" / "</think>" -> R1).
 *
 * Special tokens only come from the template: in chat_encode, special-token text inside message
 * content is tokenized as plain text (no prompt injection of `<|user|>`), while the tokens the
 * format emits are matched as special tokens. BOS (MODEL-SPEC §7.15): GLM gets none (the
 * `[gMASK]<sop>` prefix replaces it); DeepSeek gets exactly one, written by the template.
 *
 * Tools: GLM-5 / GLM-5.2 render `tools` (function definitions) as the templates' "# Tools" system
 * turn (GLM-4.7/5: each tool object as JSON; GLM-5.2: its function object without
 * defer_loading / strict); the other formats refuse them with ERR_UNSUPPORTED rather than drop
 * them. History tool calls and tool results are rendered in every format. Assistant content and
 * reasoning are stripped of surrounding ASCII whitespace in GLM formats, as GLM's templates do.
 * JSON written into prompts (tool definitions, non-string arguments) uses jansson's ", " / ": "
 * separators and key order, like Python's json.dumps; number formatting may differ in rare cases. */
#ifndef TANDEM_TOK_CHAT_H
#define TANDEM_TOK_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"
#include "common/tok/tok.h"

struct gguf_ctx;

enum chat_format {
	CHAT_FMT_GLM5 = 0,
	CHAT_FMT_GLM52,
	CHAT_FMT_GLM4,
	CHAT_FMT_DEEPSEEK_V3,
	CHAT_FMT_DEEPSEEK_V31,
	CHAT_FMT_DEEPSEEK_R1,
	CHAT_FMT_COUNT
};

#define CHAT_MAX_STOP 4
#define CHAT_DEFAULT_MAX_BYTES (64u << 20)

/* Per-model chat configuration; immutable after chat_init, borrows the tok. */
struct chat {
	enum chat_format fmt;
	const struct tok *t;
	int32_t stop_ids[CHAT_MAX_STOP]; /* end-of-generation ids of this format */
	int n_stop;
	int32_t bos_id; /* DeepSeek: the BOS the template writes; -1 for GLM */
};

struct chat_opts {
	int enable_thinking; /* -1: the format's default (GLM5/5.2 on, others off); 0; 1 */
	const char *reasoning_effort; /* GLM-5.2: "low", "high"; anything else or NULL = max */
	bool keep_past_reasoning; /* GLM: clear_thinking=false, keep reasoning_content of turns
	                           * before the last user message too */
	bool add_generation_prompt;
	const json_t *tools; /* borrowed OpenAI `tools` array or NULL (GLM formats only) */
	size_t max_bytes; /* 0 = CHAT_DEFAULT_MAX_BYTES; longer prompts are ERR_LIMIT */
};

/* A rendered prompt: text, plus the byte spans the format itself wrote (where special tokens may
 * be matched). Owned; free with chat_prompt_fini. */
struct chat_prompt {
	char *text; /* NUL-terminated */
	size_t len, cap, max;
	struct tok_span *spans;
	size_t n_spans, cap_spans;
};

const char *chat_format_name(enum chat_format f);
/* "glm5", "glm5.2", "glm4", "deepseek-v3", "deepseek-v3.1", "deepseek-r1" -> format;
 * ERR_NOTFOUND otherwise. */
int chat_format_from_name(const char *name, enum chat_format *out);
/* Recognises a Jinja chat template; ERR_UNSUPPORTED with a message when it is none we know. */
int chat_format_detect(const char *tmpl, size_t len, enum chat_format *out, struct errbuf *e);

/* Sets up c for fmt: checks the vocab has the special tokens the format writes, and looks the
 * stop tokens up by text (GLM: <|endoftext|>, <|user|>, <|observation|>; DeepSeek: the end of
 * sentence token). Missing tokens are ERR_MISMATCH naming them. */
int chat_init(struct chat *c, const struct tok *t, enum chat_format fmt, struct errbuf *e) TD_MUST_CHECK;
/* The configured name if given (NULL or "" = none), else the GGUF's tokenizer.chat_template;
 * neither is a clear error. */
int chat_init_gguf(struct chat *c, const struct tok *t, const struct gguf_ctx *g, const char *configured,
                   struct errbuf *e) TD_MUST_CHECK;

/* Renders messages (validated: an array of objects with a known role and string / text-part
 * content; errors name the message index and field). On error out is left empty. */
int chat_render(const struct chat *c, const json_t *messages, const struct chat_opts *o,
                struct chat_prompt *out, struct errbuf *e) TD_MUST_CHECK;
void chat_prompt_fini(struct chat_prompt *p);

/* Tokenizes a rendered prompt: special tokens only inside the format's spans, no automatic BOS;
 * for DeepSeek checks the result starts with exactly one BOS. */
int chat_encode(const struct chat *c, const struct chat_prompt *p, int32_t *ids, size_t n_ids_max,
                size_t *n_ids, struct errbuf *e) TD_MUST_CHECK;

bool chat_is_stop(const struct chat *c, int32_t id);

#endif
