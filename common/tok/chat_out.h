/* Parsing what the model generates, token by token, into the OpenAI response fields: visible
 * `content`, `reasoning_content` (the text inside <think> … </think>) and `tool_calls`, for the
 * formats of chat.h. The router feeds every generated id; each feed returns the new text of each
 * channel (always whole UTF-8 characters, see tok_stream) and any tool call completed by it.
 *
 * Markers are recognised as tokens (the vocab's own ids of `<think>`, `</think>`, `<tool_call>`,
 * `<arg_key>`, … for GLM and of `<｜tool▁call▁begin｜>`, `<｜tool▁sep｜>`, … for DeepSeek), so marker
 * text written inside ordinary tokens is just text. A vocab without the tool markers simply never
 * produces tool calls. Control tokens that are not markers are dropped from the text; stop tokens
 * (chat_is_stop / tok_is_eog) set `stop` and are not emitted.
 *
 * GLM tool calls: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`;
 * each V that parses as a JSON number, true/false/null, object or array keeps that type, anything
 * else becomes a JSON string (GLM writes strings raw); a parameter the request's `tools` declare
 * as "type": "string" always stays a string. opts->tools must outlive the parser. DeepSeek V3.1:
 * `<｜tool▁call▁begin｜>NAME <｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`; V3:
 * `…begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n``` <｜tool▁call▁end｜>`. ARGS is passed through as
 * the arguments string. */
#ifndef TANDEM_TOK_CHAT_OUT_H
#define TANDEM_TOK_CHAT_OUT_H

#include "common/tok/chat.h"

#define CHAT_OUT_MAX_CALL_BYTES (1u << 20) /* one tool call's name + arguments */
#define CHAT_OUT_MAX_CALLS 64 /* tool calls completed by one feed (always <= 1 today) */

struct chat_tool_call {
	char *name; /* NUL-terminated */
	char *arguments; /* JSON text of the arguments object, NUL-terminated */
};

/* What one feed produced. Pointers are owned by the parser and valid until the next feed /
 * finish / fini; content and reasoning are never NULL ("" when empty). */
struct chat_delta {
	const char *content;
	size_t content_len;
	const char *reasoning;
	size_t reasoning_len;
	const struct chat_tool_call *calls;
	size_t n_calls;
	bool stop; /* the id was a stop token */
};

enum chat_out_mode {
	CHAT_OUT_CONTENT = 0,
	CHAT_OUT_REASONING,
	CHAT_OUT_TOOL, /* inside a tool call: collecting its text */
	CHAT_OUT_TOOL_SECTION, /* DeepSeek: between calls inside <｜tool▁calls▁begin｜> … end */
};

struct chat_out_buf {
	char *p;
	size_t len, cap;
};

struct chat_out {
	const struct chat *c;
	enum chat_out_mode mode;
	bool in_section; /* DeepSeek: the current call sits in a tool-calls section */
	struct tok_stream s_content, s_reasoning;
	char *out_content, *out_reasoning; /* per-feed output, cap_out bytes each */
	size_t cap_out;
	/* the tool call being collected */
	int glm_part; /* name / key / value / between (chat_out.c) */
	struct chat_out_buf name, key, val; /* GLM */
	struct chat_out_buf ds; /* DeepSeek: everything after the call-begin marker */
	size_t ds_sep; /* DeepSeek: offset of the first separator, SIZE_MAX none */
	struct chat_out_buf raw; /* every byte of the call, markers included */
	struct chat_out_buf fin; /* finish() output */
	json_t *args; /* GLM: arguments so far */
	const json_t *tools; /* borrowed from the chat_opts given to init (parameter types) */
	struct chat_tool_call done;
	/* marker ids (-1 when the vocab lacks them) */
	int32_t id_think, id_think_end;
	int32_t id_call, id_call_end, id_key, id_key_end, id_val, id_val_end; /* GLM */
	int32_t id_calls_begin, id_calls_end, id_sep; /* DeepSeek */
};

/* Starts parsing the answer to a prompt rendered with opts: generation starts inside the
 * reasoning when the prompt ended with `<think>` (GLM 5/5.2 and DeepSeek V3.1 with thinking on). */
int chat_out_init(struct chat_out *o, const struct chat *c, const struct chat_opts *opts,
                  struct errbuf *e) TD_MUST_CHECK;
int chat_out_feed(struct chat_out *o, int32_t id, struct chat_delta *d, struct errbuf *e) TD_MUST_CHECK;
/* End of generation: flushes held-back bytes; an unfinished tool call is returned as content
 * text (it was not a valid call). */
int chat_out_finish(struct chat_out *o, struct chat_delta *d, struct errbuf *e) TD_MUST_CHECK;
void chat_out_fini(struct chat_out *o);

#endif
