/* OpenAI request decoder (router/api.c), table-driven: every field's valid forms decode to the
 * expected typed value, every invalid form is a 400 whose `param` names the field. The ranges
 * are the ones the OpenAI API reference documents (temperature 0..2, top_p 0..1, penalties -2..2,
 * logprobs 0..5 for completions, top_logprobs 0..20 for chat). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/api.h"

static int n_fail;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                               \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

#define C API_KIND_COMPLETIONS
#define T API_KIND_CHAT
#define P "\"model\":\"m\",\"prompt\":\"hi\""
#define M "\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

enum field {
	F_NONE,
	F_MAX,
	F_TEMP,
	F_TOPP,
	F_TOPK,
	F_MINP,
	F_SEED,
	F_FREQ,
	F_PRES,
	F_N,
	F_STREAM,
	F_USAGE,
	F_LOGPROBS,
	F_TOPLP,
	F_NSTOP,
	F_STOP0,
	F_STOP1,
	F_PROMPT,
	F_NIDS,
	F_NMSG,
	F_MSG0,
	F_ROLE1
};

struct case_ {
	int kind;
	const char *body;
	const char *bad_param; /* NULL: must decode; "": must fail with param null */
	enum field f;
	double num; /* expected numeric value of f */
	const char *str; /* expected string value of f */
};

static const struct case_ cases[] = {
    /* structure */
    {C, "{" P "}", NULL, F_MAX, 16, NULL}, /* completions default max_tokens */
    {T, "{" M "}", NULL, F_MAX, -1, NULL}, /* chat default: until the context is full */
    {C, "not json", "", F_NONE, 0, NULL},
    {C, "[1,2]", "", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"model\":\"n\",\"prompt\":\"x\"}", "", F_NONE, 0, NULL}, /* duplicate key */
    {C, "{\"prompt\":\"hi\"}", "model", F_NONE, 0, NULL},
    {C, "{\"model\":5,\"prompt\":\"hi\"}", "model", F_NONE, 0, NULL},
    {C, "{" P ",\"user\":\"u1\",\"metadata\":{}}", NULL, F_NONE, 0, NULL}, /* unknown fields ignored */
    /* prompt */
    {C, "{\"model\":\"m\"}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":\"caf\\u00e9\"}", NULL, F_PROMPT, 0, "caf\xc3\xa9"},
    {C, "{\"model\":\"m\",\"prompt\":[\"one\"]}", NULL, F_PROMPT, 0, "one"},
    {C, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":[1,2,3]}", NULL, F_NIDS, 3, NULL},
    {C, "{\"model\":\"m\",\"prompt\":[[4,5]]}", NULL, F_NIDS, 2, NULL},
    {C, "{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":[1,2.5]}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":[]}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":{}}", "prompt", F_NONE, 0, NULL},
    {C, "{\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", "prompt", F_NONE, 0, NULL},
    /* messages */
    {T, "{\"model\":\"m\"}", "messages", F_NONE, 0, NULL},
    {T, "{\"model\":\"m\",\"messages\":[]}", "messages", F_NONE, 0, NULL},
    {T, "{\"model\":\"m\",\"messages\":{}}", "messages", F_NONE, 0, NULL},
    {T, "{\"model\":\"m\",\"messages\":[\"hi\"]}", "messages", F_NONE, 0, NULL},
    {T, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages", F_NONE, 0,
     NULL},
    {T, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages", F_NONE, 0, NULL},
    {T, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages", F_NONE, 0, NULL},
    {T,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":["
     "{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
     NULL, F_MSG0, 2, "ab"},
    {T,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}"
     "}]}]}",
     "messages", F_NONE, 0, NULL},
    {T,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
     "\"content\":null}]}",
     NULL, F_ROLE1, 0, "assistant"},
    /* max_tokens / max_completion_tokens */
    {C, "{" P ",\"max_tokens\":7}", NULL, F_MAX, 7, NULL},
    {C, "{" P ",\"max_tokens\":7.0}", NULL, F_MAX, 7, NULL},
    {C, "{" P ",\"max_tokens\":null}", NULL, F_MAX, 16, NULL},
    {C, "{" P ",\"max_tokens\":0}", "max_tokens", F_NONE, 0, NULL},
    {C, "{" P ",\"max_tokens\":-1}", "max_tokens", F_NONE, 0, NULL},
    {C, "{" P ",\"max_tokens\":1.5}", "max_tokens", F_NONE, 0, NULL},
    {C, "{" P ",\"max_tokens\":\"7\"}", "max_tokens", F_NONE, 0, NULL},
    {C, "{" P ",\"max_tokens\":99999999999}", "max_tokens", F_NONE, 0, NULL},
    {T, "{" M ",\"max_completion_tokens\":9,\"max_tokens\":3}", NULL, F_MAX, 9, NULL},
    {T, "{" M ",\"max_completion_tokens\":0}", "max_completion_tokens", F_NONE, 0, NULL},
    /* stop */
    {C, "{" P ",\"stop\":\"\\n\"}", NULL, F_STOP0, 1, "\n"},
    {C, "{" P ",\"stop\":[\"a\",\"bc\"]}", NULL, F_STOP1, 2, "bc"},
    {C, "{" P ",\"stop\":null}", NULL, F_NSTOP, 0, NULL},
    {C, "{" P ",\"stop\":[]}", NULL, F_NSTOP, 0, NULL},
    {C, "{" P ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", F_NONE, 0, NULL},
    {C, "{" P ",\"stop\":[\"a\",1]}", "stop", F_NONE, 0, NULL},
    {C, "{" P ",\"stop\":\"\"}", "stop", F_NONE, 0, NULL},
    {C, "{" P ",\"stop\":5}", "stop", F_NONE, 0, NULL},
    /* temperature */
    {C, "{" P ",\"temperature\":0}", NULL, F_TEMP, 0, NULL},
    {C, "{" P ",\"temperature\":1.5}", NULL, F_TEMP, 1.5, NULL},
    {C, "{" P "}", NULL, F_TEMP, 1, NULL},
    {C, "{" P ",\"temperature\":2.1}", "temperature", F_NONE, 0, NULL},
    {C, "{" P ",\"temperature\":-0.1}", "temperature", F_NONE, 0, NULL},
    {C, "{" P ",\"temperature\":\"hot\"}", "temperature", F_NONE, 0, NULL},
    /* top_p */
    {C, "{" P ",\"top_p\":0.9}", NULL, F_TOPP, 0.9, NULL},
    {C, "{" P ",\"top_p\":0}", "top_p", F_NONE, 0, NULL},
    {C, "{" P ",\"top_p\":1.01}", "top_p", F_NONE, 0, NULL},
    {C, "{" P ",\"top_p\":true}", "top_p", F_NONE, 0, NULL},
    /* top_k */
    {C, "{" P ",\"top_k\":40}", NULL, F_TOPK, 40, NULL},
    {C, "{" P ",\"top_k\":-1}", NULL, F_TOPK, 0, NULL},
    {C, "{" P ",\"top_k\":-2}", "top_k", F_NONE, 0, NULL},
    {C, "{" P ",\"top_k\":0.5}", "top_k", F_NONE, 0, NULL},
    /* min_p */
    {C, "{" P ",\"min_p\":0.05}", NULL, F_MINP, 0.05, NULL},
    {C, "{" P ",\"min_p\":1.5}", "min_p", F_NONE, 0, NULL},
    {C, "{" P ",\"min_p\":[]}", "min_p", F_NONE, 0, NULL},
    /* seed */
    {C, "{" P ",\"seed\":42}", NULL, F_SEED, 42, NULL},
    {C, "{" P ",\"seed\":-5}", NULL, F_SEED, -5, NULL},
    {C, "{" P ",\"seed\":\"42\"}", "seed", F_NONE, 0, NULL},
    {C, "{" P ",\"seed\":4.2}", "seed", F_NONE, 0, NULL},
    /* penalties */
    {C, "{" P ",\"frequency_penalty\":-2}", NULL, F_FREQ, -2, NULL},
    {C, "{" P ",\"frequency_penalty\":2.5}", "frequency_penalty", F_NONE, 0, NULL},
    {C, "{" P ",\"presence_penalty\":1.25}", NULL, F_PRES, 1.25, NULL},
    {C, "{" P ",\"presence_penalty\":-3}", "presence_penalty", F_NONE, 0, NULL},
    {C, "{" P ",\"presence_penalty\":\"x\"}", "presence_penalty", F_NONE, 0, NULL},
    /* n */
    {C, "{" P ",\"n\":2}", NULL, F_N, 2, NULL},
    {C, "{" P "}", NULL, F_N, 1, NULL},
    {C, "{" P ",\"n\":0}", "n", F_NONE, 0, NULL},
    {C, "{" P ",\"n\":17}", "n", F_NONE, 0, NULL},
    {C, "{" P ",\"n\":\"2\"}", "n", F_NONE, 0, NULL},
    /* stream, stream_options */
    {C, "{" P ",\"stream\":true}", NULL, F_STREAM, 1, NULL},
    {C, "{" P ",\"stream\":false}", NULL, F_STREAM, 0, NULL},
    {C, "{" P ",\"stream\":1}", "stream", F_NONE, 0, NULL},
    {C, "{" P ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL, F_USAGE, 1, NULL},
    {C, "{" P ",\"stream\":true,\"stream_options\":{}}", NULL, F_USAGE, 0, NULL},
    {C, "{" P ",\"stream_options\":{\"include_usage\":true}}", "stream_options", F_NONE, 0, NULL},
    {C, "{" P ",\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}}",
     "stream_options.include_usage", F_NONE, 0, NULL},
    {C, "{" P ",\"stream\":true,\"stream_options\":[]}", "stream_options", F_NONE, 0, NULL},
    /* logprobs: completions integer 0..5 */
    {C, "{" P ",\"logprobs\":3}", NULL, F_TOPLP, 3, NULL},
    {C, "{" P ",\"logprobs\":0}", NULL, F_LOGPROBS, 1, NULL},
    {C, "{" P ",\"logprobs\":null}", NULL, F_LOGPROBS, 0, NULL},
    {C, "{" P ",\"logprobs\":6}", "logprobs", F_NONE, 0, NULL},
    {C, "{" P ",\"logprobs\":true}", "logprobs", F_NONE, 0, NULL},
    {C, "{" P ",\"echo\":true}", "echo", F_NONE, 0, NULL},
    {C, "{" P ",\"return_tokens_as_token_ids\":1}", "return_tokens_as_token_ids", F_NONE, 0, NULL},
    {C, "{" P ",\"ignore_eos\":\"yes\"}", "ignore_eos", F_NONE, 0, NULL},
    {C, "{" P ",\"ignore_eos\":true}", NULL, F_NONE, 0, NULL},
    /* logprobs: chat bool + top_logprobs 0..20 */
    {T, "{" M ",\"logprobs\":true,\"top_logprobs\":5}", NULL, F_TOPLP, 5, NULL},
    {T, "{" M ",\"logprobs\":true}", NULL, F_LOGPROBS, 1, NULL},
    {T, "{" M ",\"logprobs\":2}", "logprobs", F_NONE, 0, NULL},
    {T, "{" M ",\"top_logprobs\":2}", "top_logprobs", F_NONE, 0, NULL},
    {T, "{" M ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", F_NONE, 0, NULL},
};

static double field_num(const struct api_request *r, enum field f)
{
	switch (f) {
	case F_MAX: return (double)r->max_tokens;
	case F_TEMP: return r->temperature;
	case F_TOPP: return r->top_p;
	case F_TOPK: return r->top_k;
	case F_MINP: return r->min_p;
	case F_SEED: return r->has_seed ? (double)(int64_t)r->seed : NAN;
	case F_FREQ: return r->frequency_penalty;
	case F_PRES: return r->presence_penalty;
	case F_N: return r->n;
	case F_STREAM: return r->stream;
	case F_USAGE: return r->include_usage;
	case F_LOGPROBS: return r->logprobs;
	case F_TOPLP: return r->top_logprobs;
	case F_NSTOP:
	case F_STOP0:
	case F_STOP1: return r->n_stop;
	case F_NIDS: return (double)r->n_prompt_ids;
	case F_MSG0:
	case F_ROLE1:
	case F_NMSG: return (double)r->n_messages;
	default: return 0;
	}
}

static const char *field_str(const struct api_request *r, enum field f)
{
	switch (f) {
	case F_STOP0: return r->stop[0];
	case F_STOP1: return r->stop[1];
	case F_PROMPT: return r->prompt;
	case F_MSG0: return r->n_messages > 1 ? r->messages[1].content : NULL;
	case F_ROLE1: return r->n_messages > 1 ? r->messages[1].role : NULL;
	default: return NULL;
	}
}

static void test_table(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct case_ *k = &cases[i];
		struct api_request r;
		struct api_error e;
		int rc = api_request_decode((enum api_kind)k->kind, k->body, strlen(k->body), &r, &e);
		if (k->bad_param) {
			CHECK(rc < 0, "case %zu %s: should fail", i, k->body);
			CHECK(e.status == 400, "case %zu: status %d", i, e.status);
			CHECK(strcmp(e.param, k->bad_param) == 0, "case %zu %s: param '%s', want '%s' (%s)",
			      i, k->body, e.param, k->bad_param, e.message);
			CHECK(e.message[0] != '\0', "case %zu: message", i);
			continue;
		}
		CHECK(rc == 0, "case %zu %s: %s", i, k->body, e.message);
		if (rc)
			continue;
		if (k->f == F_NIDS || k->f == F_MSG0 || k->f == F_ROLE1 ||
		    (k->f != F_NONE && k->f != F_PROMPT))
			if (k->f != F_ROLE1 && k->f != F_MSG0)
				CHECK(fabs(field_num(&r, k->f) - k->num) < 1e-9,
				      "case %zu %s: value %g, want %g", i, k->body, field_num(&r, k->f),
				      k->num);
		if (k->str) {
			const char *s = field_str(&r, k->f);
			CHECK(s && strcmp(s, k->str) == 0, "case %zu %s: '%s', want '%s'", i, k->body,
			      s ? s : "(null)", k->str);
		}
		api_request_fini(&r);
	}
}

static void test_ids_and_errors(void)
{
	struct api_request r;
	struct api_error e;
	const char *b = "{\"model\":\"m\",\"prompt\":[7,0,2147483647]}";
	CHECK(api_request_decode(API_KIND_COMPLETIONS, b, strlen(b), &r, &e) == 0, "ids");
	CHECK(r.n_prompt_ids == 3 && r.prompt_ids[0] == 7 && r.prompt_ids[2] == 2147483647, "id values");
	api_request_fini(&r);

	api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model", "no model \"%s\"", "x");
	char *j = api_error_json(&e, NULL);
	CHECK(
	    j && strcmp(
	             j,
	             "{\"error\": {\"message\": \"no model \\\"x\\\"\", \"type\": \"invalid_request_error\", "
	             "\"param\": \"model\", \"code\": \"model_not_found\"}}") != 0,
	    "compact form expected");
	CHECK(j && strstr(j, "\"message\":\"no model \\\"x\\\"\"") && strstr(j, "\"param\":\"model\"") &&
	          strstr(j, "\"code\":\"model_not_found\""),
	      "error json: %s", j ? j : "(null)");
	free(j);
	api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "bad");
	j = api_error_json(&e, NULL);
	CHECK(j && strstr(j, "\"param\":null") && strstr(j, "\"code\":null"), "nulls: %s", j ? j : "(null)");
	free(j);

	/* a parse error quoting invalid UTF-8 from the body still renders as valid JSON (found by
	 * fuzz_api): the bytes are replaced */
	const char bad_utf8[] = "{\"mo\":\"\\\xd7\x93\x9e\x93,\"prompt\":[[1,2,3]]}";
	CHECK(api_request_decode(API_KIND_COMPLETIONS, bad_utf8, sizeof(bad_utf8) - 1, &r, &e) != 0,
	      "invalid");
	j = api_error_json(&e, NULL);
	CHECK(e.status == 400 && j != NULL, "error body renders: %s", e.message);
	free(j);

	/* a body that is not NUL-terminated is read only up to its length */
	char buf[64];
	memcpy(buf, "{\"model\":\"m\",\"prompt\":\"x\"}GARBAGE", 33);
	CHECK(api_request_decode(API_KIND_COMPLETIONS, buf, 26, &r, &e) == 0, "length-bounded body: %s",
	      e.message);
	api_request_fini(&r);
}

int main(void)
{
	test_table();
	test_ids_and_errors();
	printf("test_api: %zu table cases, %s (%d failures)\n", sizeof(cases) / sizeof(cases[0]),
	       n_fail ? "FAIL" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
