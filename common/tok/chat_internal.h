/* Internals shared by the chat files: chat.c (formats, prompt buffer, entry points), chat_msg.c
 * (validating OpenAI messages), chat_fmt.c (each format's layout) and chat_out.c. */
#ifndef TANDEM_TOK_CHAT_INTERNAL_H
#define TANDEM_TOK_CHAT_INTERNAL_H

#include "common/tok/chat.h"

/* DeepSeek's special tokens use U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE EIGHTH BLOCK. */
#define DS_BOS                                                                                               \
	"<\xef\xbd\x9c"                                                                                      \
	"begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_EOS                                                                                               \
	"<\xef\xbd\x9c"                                                                                      \
	"end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT                                                                                         \
	"<\xef\xbd\x9c"                                                                                      \
	"Assistant\xef\xbd\x9c>"
#define DS_CALLS_BEGIN                                                                                       \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"calls\xe2\x96\x81"                                                                                  \
	"begin\xef\xbd\x9c>"
#define DS_CALLS_END                                                                                         \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"calls\xe2\x96\x81"                                                                                  \
	"end\xef\xbd\x9c>"
#define DS_CALL_BEGIN                                                                                        \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"call\xe2\x96\x81"                                                                                   \
	"begin\xef\xbd\x9c>"
#define DS_CALL_END                                                                                          \
	"<\xef\xbd\x9ctool\xe2\x96\x81"                                                                      \
	"call\xe2\x96\x81"                                                                                   \
	"end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"
#define DS_OUTPUTS_BEGIN                                                                                     \
	"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"                                                   \
	"begin\xef\xbd\x9c>"
#define DS_OUTPUTS_END                                                                                       \
	"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"                                                   \
	"end\xef\xbd\x9c>"
#define DS_OUTPUT_BEGIN                                                                                      \
	"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                                    \
	"begin\xef\xbd\x9c>"
#define DS_OUTPUT_END                                                                                        \
	"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                                    \
	"end\xef\xbd\x9c>"

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

/* A tool call of a past assistant turn. */
struct chat_msg_call {
	const char *name; /* borrowed from the request JSON */
	char *args; /* JSON text of the arguments (owned) */
	json_t *args_obj; /* parsed arguments (owned), NULL if not an object */
};

/* One validated message. */
struct chat_msg {
	enum chat_role role;
	char *content; /* owned, NUL-terminated (text parts joined); "" when null */
	size_t content_len;
	bool content_null;
	const char *reasoning; /* borrowed; NULL when absent */
	struct chat_msg_call *calls;
	size_t n_calls;
};

/* chat_msg.c: validates and flattens `messages`; errors name the index and field. */
int chat_msg_parse(const json_t *messages, struct chat_msg **out, size_t *n_out, struct errbuf *e);
void chat_msg_free(struct chat_msg *m, size_t n);

/* chat.c: appends to the prompt; `special` marks text the format wrote (special tokens may match
 * there), the rest is message content. */
int chat_prompt_put(struct chat_prompt *p, const char *s, size_t n, bool special, struct errbuf *e);

/* chat_fmt.c: one renderer per family; opts has enable_thinking resolved (0/1). */
int chat_fmt_glm(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
                 struct chat_prompt *p, struct errbuf *e);
int chat_fmt_glm4(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
                  struct chat_prompt *p, struct errbuf *e);
int chat_fmt_deepseek(const struct chat *c, const struct chat_msg *m, size_t n, const struct chat_opts *o,
                      struct chat_prompt *p, struct errbuf *e);

#endif
