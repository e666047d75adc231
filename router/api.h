/* OpenAI API request decoding (JSON -> typed request) and error bodies. Every field is checked
 * for type and range; the first problem becomes a 400 with `param` naming the field, the way the
 * OpenAI API reports it. Unknown fields are ignored (clients send `user`, `metadata`, ...).
 *
 * Ownership: struct api_request owns its strings and arrays; api_request_fini frees them. */
#ifndef TANDEM_ROUTER_API_H
#define TANDEM_ROUTER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define API_MAX_STOP 4
#define API_MAX_N 16
#define API_MAX_LOGPROBS_COMPLETIONS 5
#define API_MAX_TOP_LOGPROBS_CHAT 20
#define API_MAX_MESSAGES 4096
#define API_MAX_PROMPT_IDS (1 << 20)

enum api_kind { API_KIND_COMPLETIONS, API_KIND_CHAT };

struct api_message {
	char *role; /* system | user | assistant | tool | developer */
	char *content; /* text; array content parts of type "text" are concatenated */
};

struct api_request {
	enum api_kind kind;
	char *model;
	/* completions: either prompt text or prompt token ids */
	char *prompt;
	int32_t *prompt_ids;
	size_t n_prompt_ids;
	/* chat */
	struct api_message *messages;
	size_t n_messages;
	void *messages_json; /* json_t array, one reference owned (the model's chat renderer reads it) */

	int64_t max_tokens; /* -1: until the context is full */
	char *stop[API_MAX_STOP];
	int n_stop;
	double temperature; /* default 1 */
	double top_p; /* default 1 */
	int32_t top_k; /* 0: off */
	double min_p; /* 0: off */
	bool has_seed;
	uint64_t seed;
	double frequency_penalty;
	double presence_penalty;
	int n; /* choices, default 1 */
	bool stream;
	bool include_usage; /* stream_options.include_usage */
	bool logprobs; /* completions: logprobs != null; chat: logprobs == true */
	int top_logprobs; /* number of alternatives per token */
	bool echo; /* completions: echo the prompt (only accepted as false) */
	/* vLLM extensions: logprob tokens as "token_id:N"; generate max_tokens past end-of-generation */
	bool tokens_as_ids; /* return_tokens_as_token_ids */
	bool ignore_eos;
};

struct api_error {
	int status; /* HTTP status */
	const char *type; /* invalid_request_error, authentication_error, server_error, ... */
	const char *code; /* may be NULL */
	char param[64]; /* "" for null */
	char message[512];
};

/* Decodes body into req (zeroed first). On failure fills err (status 400) and returns a negative
 * code; req is then already finalized. */
int api_request_decode(enum api_kind kind, const char *body, size_t len, struct api_request *req,
                       struct api_error *err) TD_MUST_CHECK;
void api_request_fini(struct api_request *req);

/* Sets err and returns its status. */
int api_error_set(struct api_error *err, int status, const char *type, const char *code, const char *param,
                  const char *fmt, ...) TD_PRINTF(6, 7);
/* Renders {"error":{"message","type","param","code"}}; malloc'd, caller frees. */
char *api_error_json(const struct api_error *err, size_t *len_out);

#endif
