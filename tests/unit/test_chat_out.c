/* Generated-output parsing (common/tok/chat_out.c): ids fed one at a time split into reasoning,
 * content and tool calls for GLM (on a GLM-like vocab with the tool markers as tokens, written
 * here with the GGUF writer) and DeepSeek V3 / V3.1 (the real DeepSeek-V3 vocab); deltas are
 * always whole UTF-8 characters; stop tokens end the stream; unfinished calls come back as text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "common/tok/chat_out.h"

static int n_fail, n_checks;
#define CHECK(c, ...)                                                                                        \
	do {                                                                                                 \
		n_checks++;                                                                                  \
		if (!(c)) {                                                                                  \
			n_fail++;                                                                            \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                         \
			fprintf(stderr, __VA_ARGS__);                                                        \
			fputc('\n', stderr);                                                                 \
		}                                                                                            \
	} while (0)

#define DS_EOS                                                                                               \
	"<\xef\xbd\x9c"                                                                                      \
	"end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
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

struct collected {
	char content[4096], reasoning[4096];
	size_t n_content, n_reasoning;
	char names[4][64], args[4][256];
	int n_calls;
	bool stopped, all_utf8;
};

/* Encodes text (special tokens matched), then feeds the ids one by one. */
static void run(const struct chat *c, const struct chat_opts *opts, const char *text, struct collected *r)
{
	memset(r, 0, sizeof(*r));
	r->all_utf8 = true;
	struct errbuf e = {0};
	int32_t ids[4096];
	size_t n;
	if (tok_encode(c->t, text, strlen(text), 0, ids, 4096, &n, NULL, &e)) {
		CHECK(0, "encode: %s", e.msg);
		return;
	}
	struct chat_out o;
	if (chat_out_init(&o, c, opts, &e)) {
		CHECK(0, "init: %s", e.msg);
		return;
	}
	for (size_t i = 0; i <= n && !r->stopped; i++) {
		struct chat_delta d;
		int rc = i < n ? chat_out_feed(&o, ids[i], &d, &e) : chat_out_finish(&o, &d, &e);
		CHECK(rc == 0, "feed %zu: %s", i, e.msg);
		if (rc)
			break;
		r->all_utf8 &= tok_utf8_check(d.content, d.content_len) == d.content_len &&
		               tok_utf8_check(d.reasoning, d.reasoning_len) == d.reasoning_len;
		memcpy(r->content + r->n_content, d.content, d.content_len);
		r->n_content += d.content_len;
		memcpy(r->reasoning + r->n_reasoning, d.reasoning, d.reasoning_len);
		r->n_reasoning += d.reasoning_len;
		for (size_t k = 0; k < d.n_calls && r->n_calls < 4; k++, r->n_calls++) {
			snprintf(r->names[r->n_calls], 64, "%s", d.calls[k].name);
			snprintf(r->args[r->n_calls], 256, "%s", d.calls[k].arguments);
		}
		r->stopped = d.stop;
	}
	r->content[r->n_content] = '\0';
	r->reasoning[r->n_reasoning] = '\0';
	chat_out_fini(&o);
}

/* A GLM-like vocab: the 256 byte symbols and the GLM special tokens, tool markers included. */
static struct tok *glm_vocab(void)
{
	static const char *const ctrl[] = {"<|endoftext|>", "[gMASK]",       "<sop>",          "<|system|>",
	                                   "<|user|>",      "<|assistant|>", "<|observation|>"};
	static const char *const user[] = {"<think>",   "</think>",   "<tool_call>", "</tool_call>",
	                                   "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
	enum { N = 256 + 7 + 8 };
	static char bytes[256][3];
	const char *toks[N];
	int32_t types[N];
	for (unsigned b = 0; b < 256; b++) {
		unsigned cp = b, k = 0;
		bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
		if (!printable) {
			for (unsigned x = 0; x < b; x++)
				k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE));
			cp = 256 + k;
		}
		if (cp < 0x80) {
			bytes[b][0] = (char)cp;
		} else {
			bytes[b][0] = (char)(0xC0 | (cp >> 6));
			bytes[b][1] = (char)(0x80 | (cp & 0x3F));
		}
		toks[b] = bytes[b];
		types[b] = TOK_TYPE_NORMAL;
	}
	for (int i = 0; i < 7; i++) {
		toks[256 + i] = ctrl[i];
		types[256 + i] = TOK_TYPE_CONTROL;
	}
	for (int i = 0; i < 8; i++) {
		toks[263 + i] = user[i];
		types[263 + i] = TOK_TYPE_USER_DEFINED;
	}
	struct gguf_writer *w = gguf_writer_create(32);
	int rc = gguf_writer_set_str(w, "general.architecture", "glm-dsa") ||
	         gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") ||
	         gguf_writer_set_str(w, "tokenizer.ggml.pre", "glm4") ||
	         gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, N) ||
	         gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, N) ||
	         gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0) ||
	         gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);
	char path[] = "/tmp/test_chat_out_XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	struct errbuf e = {0};
	struct gguf_ctx *g = NULL;
	struct tok *t = NULL;
	if (rc || gguf_writer_write(w, path, &e) || gguf_open(&g, path, &e) || tok_load(&t, g, &e)) {
		fprintf(stderr, "synthetic GLM vocab: %s\n", e.msg);
		exit(1);
	}
	gguf_writer_destroy(w);
	gguf_close(g);
	unlink(path);
	return t;
}

static void test_glm(void)
{
	struct tok *t = glm_vocab();
	struct errbuf e = {0};
	struct chat c;
	CHECK(chat_init(&c, t, CHAT_FMT_GLM5, &e) == 0, "init: %s", e.msg);
	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	struct collected r;

	run(&c, &o,
	    "I should call the tool, \xe6\x80\x9d\xe8\x80\x83.</think>Let me check. "
	    "\xf0\x9f\x8c\xa6<tool_call>get_weather"
	    "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</"
	    "arg_value>"
	    "<arg_key>opts</arg_key><arg_value>{\"metric\": "
	    "true}</arg_value></tool_call><|observation|>ignored",
	    &r);
	CHECK(strcmp(r.reasoning, "I should call the tool, \xe6\x80\x9d\xe8\x80\x83.") == 0, "reasoning '%s'",
	      r.reasoning);
	CHECK(strcmp(r.content, "Let me check. \xf0\x9f\x8c\xa6") == 0, "content '%s'", r.content);
	CHECK(r.n_calls == 1 && strcmp(r.names[0], "get_weather") == 0 &&
	          strcmp(r.args[0], "{\"city\": \"Paris\", \"days\": 2, \"opts\": {\"metric\": true}}") == 0,
	      "calls %d: %s %s", r.n_calls, r.names[0], r.args[0]);
	CHECK(r.stopped && r.all_utf8, "stop %d utf8 %d", r.stopped, r.all_utf8);

	/* thinking off: everything is content; two calls; a call without arguments */
	o.enable_thinking = 0;
	run(&c, &o,
	    "Done.<tool_call>ping</tool_call><tool_call> list_files <arg_key>path</arg_key><arg_value>/tmp"
	    "</arg_value></tool_call><|user|>",
	    &r);
	CHECK(strcmp(r.content, "Done.") == 0 && r.n_reasoning == 0, "content '%s'", r.content);
	CHECK(r.n_calls == 2 && strcmp(r.names[0], "ping") == 0 && strcmp(r.args[0], "{}") == 0 &&
	          strcmp(r.names[1], "list_files") == 0 && strcmp(r.args[1], "{\"path\": \"/tmp\"}") == 0,
	      "calls %d: %s %s / %s %s", r.n_calls, r.names[0], r.args[0], r.names[1], r.args[1]);
	CHECK(r.stopped, "stop on <|user|>");

	/* unfinished call and no stop: the call's text comes back as content at finish */
	run(&c, &o, "Hi <tool_call>f<arg_key>x", &r);
	CHECK(strcmp(r.content, "Hi <tool_call>f<arg_key>x") == 0 && r.n_calls == 0 && !r.stopped,
	      "unfinished '%s'", r.content);
	/* control tokens that are no marker vanish from the text */
	run(&c, &o, "a[gMASK]b<sop>c", &r);
	CHECK(strcmp(r.content, "abc") == 0, "control dropped: '%s'", r.content);
	tok_destroy(t);
}

static void test_deepseek(void)
{
	const char *d = getenv("TANDEM_TESTDATA");
	char path[512];
	snprintf(path, sizeof(path), "%s/tokenizer/deepseek-v3-vocab.gguf", d ? d : "tests/data");
	struct errbuf e = {0};
	struct gguf_ctx *g;
	struct tok *t;
	if (gguf_open(&g, path, &e) || tok_load(&t, g, &e)) {
		CHECK(0, "%s: %s", path, e.msg);
		return;
	}
	gguf_close(g);
	struct chat c;
	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	struct collected r;
	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_V3, &e) == 0, "init: %s", e.msg);
	run(&c, &o,
	    "Sure." DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP
	    "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CALL_END "\n" DS_CALL_BEGIN
	    "function" DS_SEP "ping\n```json\n{}\n```" DS_CALL_END DS_CALLS_END DS_EOS "after",
	    &r);
	CHECK(strcmp(r.content, "Sure.") == 0, "content '%s'", r.content);
	CHECK(r.n_calls == 2 && strcmp(r.names[0], "get_weather") == 0 &&
	          strcmp(r.args[0], "{\"city\": \"Paris\"}") == 0 && strcmp(r.names[1], "ping") == 0 &&
	          strcmp(r.args[1], "{}") == 0,
	      "v3 calls %d: '%s' '%s' / '%s' '%s'", r.n_calls, r.names[0], r.args[0], r.names[1], r.args[1]);
	CHECK(r.stopped && r.all_utf8, "v3 stop");

	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_V31, &e) == 0, "init: %s", e.msg);
	run(&c, &o,
	    "\xe5\xa5\xbd" DS_CALLS_BEGIN DS_CALL_BEGIN "get_weather" DS_SEP
	    "{\"city\":\"Rome\"}" DS_CALL_END DS_CALLS_END DS_EOS,
	    &r);
	CHECK(strcmp(r.content, "\xe5\xa5\xbd") == 0 && r.n_calls == 1 &&
	          strcmp(r.names[0], "get_weather") == 0 && strcmp(r.args[0], "{\"city\":\"Rome\"}") == 0 &&
	          r.stopped,
	      "v3.1: '%s' %d '%s' '%s'", r.content, r.n_calls, r.names[0], r.args[0]);
	tok_destroy(t);
}

int main(void)
{
	test_glm();
	test_deepseek();
	printf("chat output: %d checks, %d failed\n", n_checks, n_fail);
	return n_fail ? 1 : 0;
}
