/* Generated-output parsing (common/tok/chat_out.c): ids fed one at a time split into reasoning,
 * content and tool calls for GLM (on a GLM-like vocab with the tool markers as tokens, written
 * here with the GGUF writer) and DeepSeek V3 / V3.1 (the real DeepSeek-V3 vocab); deltas are
 * always whole UTF-8 characters; stop tokens end the stream; unfinished calls come back as text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

	/* with the request's tools: a parameter declared string stays a string */
	json_error_t je;
	json_t *tools =
	    json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
	               "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
	               "\"zip\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]",
	               0, &je);
	struct chat_opts ot = {.enable_thinking = 0, .add_generation_prompt = true, .tools = tools};
	run(&c, &ot,
	    "<tool_call>get_weather<arg_key>zip</arg_key><arg_value>75001</arg_value><arg_key>days</arg_key>"
	    "<arg_value>3</arg_value></tool_call>",
	    &r);
	CHECK(r.n_calls == 1 && strcmp(r.args[0], "{\"zip\": \"75001\", \"days\": 3}") == 0, "typed args: %s",
	      r.args[0]);
	json_decref(tools);

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

	/* R1 starts inside the reasoning (its prompt ends with <think>\n) */
	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_R1, &e) == 0, "init: %s", e.msg);
	run(&c, &o, "\nstep 1\n</think>\n\nThe answer is 4." DS_EOS, &r);
	if (tok_find(t, "</think>", 8) >= 0)
		CHECK(strcmp(r.reasoning, "\nstep 1\n") == 0 &&
		          strcmp(r.content, "\n\nThe answer is 4.") == 0 && r.stopped,
		      "r1: reasoning '%s' content '%s'", r.reasoning, r.content);
	else /* a vocab without the marker token: all of it is reasoning text */
		CHECK(r.n_content == 0 && strstr(r.reasoning, "</think>") && r.stopped,
		      "r1 without marker: '%s'", r.reasoning);

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

/* Random ids (biased towards the markers) in every format: every delta and every call is valid
 * UTF-8 / JSON-safe text and nothing crashes. Seed printed; TANDEM_TEST_SEED reruns one. */
static void test_random(void)
{
	const char *d = getenv("TANDEM_TESTDATA");
	char path[512];
	snprintf(path, sizeof(path), "%s/tokenizer/deepseek-v3-vocab.gguf", d ? d : "tests/data");
	struct errbuf e = {0};
	struct gguf_ctx *g;
	struct tok *ds;
	if (gguf_open(&g, path, &e) || tok_load(&ds, g, &e)) {
		CHECK(0, "%s: %s", path, e.msg);
		return;
	}
	gguf_close(g);
	struct tok *glm = glm_vocab();
	uint64_t seed = getenv("TANDEM_TEST_SEED") ? strtoull(getenv("TANDEM_TEST_SEED"), NULL, 10)
	                                           : (uint64_t)time(NULL);
	uint64_t st = seed;
	int n_calls = 0, n_bad = 0, n_runs = 0;
	for (int f = 0; f < CHAT_FMT_COUNT; f++) {
		struct tok *t = f <= CHAT_FMT_GLM4 ? glm : ds;
		struct chat c;
		if (chat_init(&c, t, (enum chat_format)f, &e)) {
			CHECK(0, "init %d: %s", f, e.msg);
			continue;
		}
		struct chat_out o;
		/* markers of both families plus ordinary ids */
		int32_t pool[64];
		int n_pool = 0;
		static const char *const marks[] = {"<think>",   "</think>",   "<tool_call>", "</tool_call>",
		                                    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
		for (int k = 0; k < 8; k++)
			if (tok_find(t, marks[k], strlen(marks[k])) >= 0)
				pool[n_pool++] = tok_find(t, marks[k], strlen(marks[k]));
		const char *dsm[] = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP};
		for (int k = 0; k < 5; k++)
			if (tok_find(t, dsm[k], strlen(dsm[k])) >= 0)
				pool[n_pool++] = tok_find(t, dsm[k], strlen(dsm[k]));
		for (int run_i = 0; run_i < 50; run_i++, n_runs++) {
			struct chat_opts opts = {.enable_thinking = run_i % 3 - 1,
			                         .add_generation_prompt = true};
			if (chat_out_init(&o, &c, &opts, &e)) {
				CHECK(0, "init: %s", e.msg);
				break;
			}
			for (int k = 0; k <= 200; k++) {
				st = st * 6364136223846793005ull + 1442695040888963407ull;
				uint32_t r = (uint32_t)(st >> 33);
				int32_t id = r % 4 == 0 && n_pool
				                 ? pool[(r >> 2) % (uint32_t)n_pool]
				                 : (int32_t)((r >> 2) % (uint32_t)tok_n_vocab(t));
				struct chat_delta dl;
				int rc =
				    k < 200 ? chat_out_feed(&o, id, &dl, &e) : chat_out_finish(&o, &dl, &e);
				if (rc) {
					n_bad++;
					fprintf(stderr, "random fmt %d run %d step %d: %s\n", f, run_i, k,
					        e.msg);
					break;
				}
				bool ok = tok_utf8_check(dl.content, dl.content_len) == dl.content_len &&
				          tok_utf8_check(dl.reasoning, dl.reasoning_len) == dl.reasoning_len;
				for (size_t q = 0; q < dl.n_calls; q++) {
					ok = ok &&
					     tok_utf8_check(dl.calls[q].name, strlen(dl.calls[q].name)) ==
					         strlen(dl.calls[q].name) &&
					     tok_utf8_check(dl.calls[q].arguments,
					                    strlen(dl.calls[q].arguments)) ==
					         strlen(dl.calls[q].arguments);
					n_calls++;
				}
				if (!ok) {
					n_bad++;
					fprintf(stderr, "random fmt %d run %d step %d: invalid UTF-8 out\n",
					        f, run_i, k);
				}
			}
			chat_out_fini(&o);
		}
	}
	printf("random ids (seed %llu): %d runs over %d formats, %d tool calls parsed, %d bad\n",
	       (unsigned long long)seed, n_runs, CHAT_FMT_COUNT, n_calls, n_bad);
	CHECK(n_bad == 0, "random: %d bad (seed %llu)", n_bad, (unsigned long long)seed);
	tok_destroy(glm);
	tok_destroy(ds);
}

int main(void)
{
	test_glm();
	test_deepseek();
	test_random();
	printf("chat output: %d checks, %d failed\n", n_checks, n_fail);
	return n_fail ? 1 : 0;
}
