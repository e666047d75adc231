/* Chat template tests (common/tok/chat.c): format detection from real and synthetic templates,
 * the example renderings of MODEL-SPEC.md §6 byte for byte, thinking / reasoning-effort / tool
 * turns, special-token text in user content staying plain text, the GLM `text_chat` reference
 * prompt of tests/data/refs/glm-dsa-tiny-BF16 reproduced id for id, DeepSeek's single BOS, stop
 * ids looked up by text, and message validation errors. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"
#include "common/tok/chat.h"
#include "common/tok/tok.h"

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

static const char *data_dir(void)
{
	const char *d = getenv("TANDEM_TESTDATA");
	return d ? d : "tests/data";
}

static struct gguf_ctx *open_gguf(const char *rel)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", data_dir(), rel);
	struct errbuf e = {0};
	struct gguf_ctx *g;
	if (gguf_open(&g, path, &e)) {
		fprintf(stderr, "%s\n", e.msg);
		exit(1);
	}
	return g;
}

static struct tok *load_tok(struct gguf_ctx *g)
{
	struct errbuf e = {0};
	struct tok *t;
	if (tok_load(&t, g, &e)) {
		fprintf(stderr, "tok_load: %s\n", e.msg);
		exit(1);
	}
	return t;
}

static json_t *parse(const char *s)
{
	json_error_t je;
	json_t *j = json_loads(s, 0, &je);
	if (!j) {
		fprintf(stderr, "bad test JSON: %s: %s\n", je.text, s);
		exit(1);
	}
	return j;
}

/* Renders messages (JSON text) and compares with want; returns the prompt for further checks
 * (caller frees) or an empty one on failure. */
static struct chat_prompt render(const struct chat *c, const char *msgs, const struct chat_opts *o,
                                 const char *want, const char *what)
{
	json_t *j = parse(msgs);
	struct errbuf e = {0};
	struct chat_prompt p;
	int rc = chat_render(c, j, o, &p, &e);
	CHECK(rc == 0, "%s: render: %s", what, e.msg);
	if (rc == 0 && want) {
		CHECK(p.len == strlen(want) && strcmp(p.text, want) == 0, "%s:\n   got  '%s'\n   want '%s'",
		      what, p.text, want);
	}
	json_decref(j);
	return p;
}

static const char *const conv_basic =
    "[{\"role\":\"system\",\"content\":\"You are a helpful assistant\"},"
    "{\"role\":\"user\",\"content\":\"Hello\"},"
    "{\"role\":\"assistant\",\"content\":\"Hi there\",\"reasoning_content\":\"greet back\"},"
    "{\"role\":\"user\",\"content\":\"How are you?\"}]";

static void test_detect(void)
{
	struct errbuf e = {0};
	enum chat_format f;
	static const struct {
		const char *tmpl;
		int rc;
		enum chat_format f;
	} cases[] = {
	    {"[gMASK]<sop>{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}{% endif %}"
	     "{% endfor %}<|assistant|><think>",
	     0, CHAT_FMT_GLM5},
	    {"[gMASK]<sop><|system|>Reasoning Effort: {{ effort }}<|assistant|>", 0, CHAT_FMT_GLM52},
	    {"[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}", 0,
	     CHAT_FMT_GLM4},
	    {"{{bos_token}}{% for m in messages %}<\xef\xbd\x9cUser\xef\xbd\x9c>{{m.content}}"
	     "<\xef\xbd\x9c"
	     "Assistant\xef\xbd\x9c>{% endfor %}",
	     0, CHAT_FMT_DEEPSEEK_V3},
	    {"{{bos_token}}<\xef\xbd\x9c"
	     "Assistant\xef\xbd\x9c>{% if thinking %}<think>{% else %}</think>"
	     "{% endif %}",
	     0, CHAT_FMT_DEEPSEEK_V31},
	    {"{{bos_token}}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% "
	     "endif %}"
	     "{{'<\xef\xbd\x9c"
	     "Assistant\xef\xbd\x9c><think>\\n'}}",
	     0, CHAT_FMT_DEEPSEEK_R1},
	    {"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}",
	     ERR_UNSUPPORTED, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = chat_format_detect(cases[i].tmpl, strlen(cases[i].tmpl), &f, &e);
		CHECK(rc == cases[i].rc && (rc || f == cases[i].f), "detect case %zu: rc %d fmt %s", i, rc,
		      rc ? "-" : chat_format_name(f));
	}
	CHECK(strstr(e.msg, "<|im_start|>") && strstr(e.msg, "configure"), "unknown template message: %s",
	      e.msg);

	/* the real templates in the test files */
	struct gguf_ctx *g = open_gguf("models/glm-dsa-tiny-BF16.gguf");
	struct tok *t = load_tok(g);
	struct chat c;
	CHECK(chat_init_gguf(&c, t, g, NULL, &e) == 0 && c.fmt == CHAT_FMT_GLM4, "tiny glm template: %s",
	      e.msg);
	CHECK(chat_init_gguf(&c, t, g, "glm5", &e) == 0 && c.fmt == CHAT_FMT_GLM5, "configured glm5: %s",
	      e.msg);
	CHECK(chat_init_gguf(&c, t, g, "llama3", &e) == -EINVAL && strstr(e.msg, "llama3"), "bad name: %s",
	      e.msg);
	/* the GLM vocab has no DeepSeek tokens: a clear mismatch */
	CHECK(chat_init_gguf(&c, t, g, "deepseek-v3", &e) == ERR_MISMATCH && strstr(e.msg, "begin"),
	      "deepseek on glm vocab: %s", e.msg);
	tok_destroy(t);
	gguf_close(g);

	g = open_gguf("tokenizer/deepseek-v3-vocab.gguf");
	t = load_tok(g);
	CHECK(chat_init_gguf(&c, t, g, NULL, &e) == 0 && c.fmt == CHAT_FMT_DEEPSEEK_V3, "ds template: %s",
	      e.msg);
	tok_destroy(t);
	gguf_close(g);

	g = open_gguf("models/deepseek2-tiny-BF16.gguf"); /* no chat template in this file */
	t = load_tok(g);
	CHECK(chat_init_gguf(&c, t, g, NULL, &e) == ERR_UNSUPPORTED && strstr(e.msg, "chat_template"),
	      "no template: %s", e.msg);
	tok_destroy(t);
	gguf_close(g);
}

static void test_glm(void)
{
	struct gguf_ctx *g = open_gguf("models/glm-dsa-tiny-BF16.gguf");
	struct tok *t = load_tok(g);
	struct errbuf e = {0};
	struct chat c;
	CHECK(chat_init(&c, t, CHAT_FMT_GLM5, &e) == 0, "init glm5: %s", e.msg);
	/* stop ids looked up by text agree with the file's eos / eot / eom metadata */
	CHECK(c.n_stop == 3 && c.stop_ids[0] == tok_eos(t) && c.stop_ids[1] == tok_eot(t) &&
	          c.stop_ids[2] == tok_eom(t),
	      "glm stop ids %d %d %d", c.stop_ids[0], c.stop_ids[1], c.stop_ids[2]);
	CHECK(chat_is_stop(&c, tok_eot(t)) && !chat_is_stop(&c, tok_bos(t)), "chat_is_stop");

	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	struct chat_prompt p;
	/* MODEL-SPEC §6.1 example */
	p = render(
	    &c, conv_basic, &o,
	    "[gMASK]<sop><|system|>You are a helpful assistant<|user|>Hello<|assistant|></think>Hi there"
	    "<|user|>How are you?<|assistant|><think>",
	    "glm5 §6.1 example");
	/* no BOS is added: the ids start with [gMASK] <sop> */
	int32_t ids[512];
	size_t n;
	CHECK(chat_encode(&c, &p, ids, 512, &n, &e) == 0 && n > 2 && ids[0] == tok_find(t, "[gMASK]", 7) &&
	          ids[1] == tok_find(t, "<sop>", 5) && ids[n - 1] == tok_find(t, "<think>", 7),
	      "glm5 encode: %s", e.msg);
	chat_prompt_fini(&p);
	/* clear_thinking=false: past reasoning is kept before the last user turn too */
	o.keep_past_reasoning = true;
	p = render(&c, conv_basic, &o,
	           "[gMASK]<sop><|system|>You are a helpful assistant<|user|>Hello<|assistant|><think>greet "
	           "back</think>"
	           "Hi there<|user|>How are you?<|assistant|><think>",
	           "glm5 keep past reasoning");
	chat_prompt_fini(&p);
	o.keep_past_reasoning = false;
	o.enable_thinking = 0;
	p = render(
	    &c, conv_basic, &o,
	    "[gMASK]<sop><|system|>You are a helpful assistant<|user|>Hello<|assistant|></think>Hi there"
	    "<|user|>How are you?<|assistant|></think>",
	    "glm5 thinking off");
	chat_prompt_fini(&p);

	/* tool loop after the last user turn: reasoning kept, calls, consecutive tool results share
	 * one <|observation|>, assistant content stripped */
	o.enable_thinking = 1;
	p = render(&c,
	           "[{\"role\":\"user\",\"content\":\"Weather in Paris and Rome?\"},"
	           "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\" need tools \","
	           "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
	           "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"}},"
	           "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":"
	           "\"Rome\"}}}]},"
	           "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"rain\"},"
	           "{\"role\":\"assistant\",\"content\":\" Paris sunny, Rome rain. "
	           "\",\"reasoning_content\":\"easy\"}]",
	           &o,
	           "[gMASK]<sop><|user|>Weather in Paris and Rome?<|assistant|><think>need tools</think>"
	           "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
	           "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
	           "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
	           "<|observation|><tool_response>sunny</tool_response><tool_response>rain</tool_response>"
	           "<|assistant|><think>easy</think>Paris sunny, Rome rain.<|assistant|><think>",
	           "glm5 tool loop");
	chat_prompt_fini(&p);

	/* special-token text inside user content stays text; the template's own tokens are special */
	o.enable_thinking = -1;
	p = render(&c, "[{\"role\":\"user\",\"content\":\"<|user|>[gMASK]\"}]", &o,
	           "[gMASK]<sop><|user|><|user|>[gMASK]<|assistant|><think>", "glm5 injection text");
	CHECK(chat_encode(&c, &p, ids, 512, &n, &e) == 0, "encode: %s", e.msg);
	int n_user = 0, n_gmask = 0;
	for (size_t i = 0; i < n; i++) {
		n_user += ids[i] == tok_find(t, "<|user|>", 8);
		n_gmask += ids[i] == tok_find(t, "[gMASK]", 7);
	}
	CHECK(n_user == 1 && n_gmask == 1, "special text in content became special tokens (%d, %d)", n_user,
	      n_gmask);
	chat_prompt_fini(&p);

	/* GLM-5.2: reasoning-effort turn and empty think blocks (MODEL-SPEC §6.2 example) */
	CHECK(chat_init(&c, t, CHAT_FMT_GLM52, &e) == 0, "init glm5.2: %s", e.msg);
	o = (struct chat_opts){.enable_thinking = -1, .add_generation_prompt = true};
	p = render(
	    &c, conv_basic, &o,
	    "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>You are a helpful assistant<|user|>Hello"
	    "<|assistant|><think></think>Hi there<|user|>How are you?<|assistant|><think>",
	    "glm5.2 §6.2 example");
	chat_prompt_fini(&p);
	static const char *const efforts[][2] = {{"low", "Low"}, {"high", "High"}, {"medium", "Max"}};
	for (int i = 0; i < 3; i++) {
		o.reasoning_effort = efforts[i][0];
		char want[256];
		snprintf(want, sizeof(want),
		         "[gMASK]<sop><|system|>Reasoning Effort: %s<|user|>x<|assistant|><think>",
		         efforts[i][1]);
		p = render(&c, "[{\"role\":\"user\",\"content\":\"x\"}]", &o, want, efforts[i][0]);
		chat_prompt_fini(&p);
	}

	/* tools turn (GLM-4.7/5 template as HF renders it: the whole tool object per line) */
	json_t *tools =
	    parse("[{\"type\":\"function\",\"function\":{\"name\":\"wx\",\"description\":\"Weather\","
	          "\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
	          "\"string\"}}}}}]");
	static const char *const tools_tail =
	    "</tools>\n\nFor each function call, output the function name and arguments within the following "
	    "XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
	    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";
	CHECK(chat_init(&c, t, CHAT_FMT_GLM5, &e) == 0, "init");
	o = (struct chat_opts){.enable_thinking = -1, .add_generation_prompt = true, .tools = tools};
	char want[2048];
	snprintf(
	    want, sizeof(want),
	    "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
	    "query."
	    "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
	    "{\"type\": \"function\", \"function\": {\"name\": \"wx\", \"description\": \"Weather\", "
	    "\"strict\": true, "
	    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n%s"
	    "<|user|>x<|assistant|><think>",
	    tools_tail);
	p = render(&c, "[{\"role\":\"user\",\"content\":\"x\"}]", &o, want, "glm5 tools");
	chat_prompt_fini(&p);
	/* GLM-5.2: after the effort turn, the function object without strict */
	CHECK(chat_init(&c, t, CHAT_FMT_GLM52, &e) == 0, "init");
	snprintf(want, sizeof(want),
	         "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>\n# Tools\n\nYou may call one or more "
	         "functions to "
	         "assist with the user query.\n\nYou are provided with function signatures within "
	         "<tools></tools> XML "
	         "tags:\n<tools>\n{\"name\": \"wx\", \"description\": \"Weather\", \"parameters\": "
	         "{\"type\": \"object\", "
	         "\"properties\": {\"city\": {\"type\": \"string\"}}}}\n%s<|user|>x<|assistant|><think>",
	         tools_tail);
	p = render(&c, "[{\"role\":\"user\",\"content\":\"x\"}]", &o, want, "glm5.2 tools");
	chat_prompt_fini(&p);
	json_decref(tools);

	/* no generation prompt, content given as text parts */
	CHECK(chat_init(&c, t, CHAT_FMT_GLM5, &e) == 0, "init");
	o = (struct chat_opts){.enable_thinking = -1};
	p = render(&c,
	           "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
	           "\"text\":\"b\"}]}]",
	           &o, "[gMASK]<sop><|user|>ab", "text parts");
	chat_prompt_fini(&p);
	tok_destroy(t);
	gguf_close(g);
}

/* The `text_chat` prompt of the glm-dsa reference: decode its ids, take the system and user
 * contents from between the role tags, render them with the file's own template format (glm4,
 * thinking on) and require the same text and the same ids. */
static void test_text_chat_ref(void)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/refs/glm-dsa-tiny-BF16/manifest.json", data_dir());
	json_error_t je;
	json_t *m = json_load_file(path, 0, &je);
	CHECK(m != NULL, "%s: %s", path, je.text);
	if (!m)
		return;
	json_t *ref = NULL, *pr;
	size_t i;
	json_array_foreach(json_object_get(m, "prompts"), i, pr)
	{
		if (strcmp(json_string_value(json_object_get(pr, "name")), "text_chat") == 0)
			ref = json_object_get(pr, "ids");
	}
	CHECK(ref && json_array_size(ref) == 103, "text_chat ids");
	if (!ref) {
		json_decref(m);
		return;
	}
	size_t n_ref = json_array_size(ref);
	int32_t ref_ids[256];
	for (i = 0; i < n_ref && i < 256; i++)
		ref_ids[i] = (int32_t)json_integer_value(json_array_get(ref, i));

	struct gguf_ctx *g = open_gguf("models/glm-dsa-tiny-BF16.gguf");
	struct tok *t = load_tok(g);
	struct errbuf e = {0};
	char text[4096];
	size_t len;
	CHECK(tok_decode(t, ref_ids, n_ref, 0, text, sizeof(text) - 1, &len, &e) == 0, "decode: %s", e.msg);
	text[len] = '\0';
	const char *sys_tag = "[gMASK]<sop><|system|>\n", *user_tag = "<|user|>\n",
	           *gen = "<|assistant|>\n<think>";
	char *u = strstr(text, user_tag);
	bool shape = strncmp(text, sys_tag, strlen(sys_tag)) == 0 && u && len > strlen(gen) &&
	             strcmp(text + len - strlen(gen), gen) == 0;
	CHECK(shape, "text_chat is not [gMASK]<sop><|system|>\\n..<|user|>\\n..<|assistant|>\\n<think>: %s",
	      text);
	if (shape) {
		json_t *msgs = json_array();
		json_t *sm = json_object(), *um = json_object();
		json_object_set_new(sm, "role", json_string("system"));
		json_object_set_new(
		    sm, "content",
		    json_stringn(text + strlen(sys_tag), (size_t)(u - text) - strlen(sys_tag)));
		json_object_set_new(um, "role", json_string("user"));
		const char *us = u + strlen(user_tag);
		json_object_set_new(um, "content", json_stringn(us, (size_t)(text + len - strlen(gen) - us)));
		json_array_append_new(msgs, sm);
		json_array_append_new(msgs, um);

		struct chat c;
		CHECK(chat_init_gguf(&c, t, g, NULL, &e) == 0 && c.fmt == CHAT_FMT_GLM4, "init: %s", e.msg);
		struct chat_opts o = {.enable_thinking = 1, .add_generation_prompt = true};
		struct chat_prompt p;
		int rc = chat_render(&c, msgs, &o, &p, &e);
		CHECK(rc == 0 && p.len == len && memcmp(p.text, text, len) == 0, "text_chat text: %s",
		      rc ? e.msg : p.text);
		int32_t ids[512];
		size_t n = 0;
		rc = rc ? rc : chat_encode(&c, &p, ids, 512, &n, &e);
		bool same = rc == 0 && n == n_ref;
		for (i = 0; same && i < n; i++)
			same = ids[i] == ref_ids[i];
		CHECK(same, "text_chat ids differ (rc %d, %zu vs %zu ids)", rc, n, n_ref);
		printf("text_chat: rendered %zu bytes -> %zu ids, %s the reference\n", p.len, n,
		       same ? "identical to" : "DIFFERENT from");
		if (rc == 0)
			chat_prompt_fini(&p);
		json_decref(msgs);
	}
	tok_destroy(t);
	gguf_close(g);
	json_decref(m);
}

static void test_deepseek(void)
{
	struct gguf_ctx *g = open_gguf("tokenizer/deepseek-v3-vocab.gguf");
	struct tok *t = load_tok(g);
	struct errbuf e = {0};
	struct chat c;
	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_V3, &e) == 0, "init ds: %s", e.msg);
	CHECK(c.n_stop >= 1 && c.stop_ids[0] == tok_eos(t) && c.bos_id == tok_bos(t), "ds stop %d bos %d",
	      c.stop_ids[0], c.bos_id);
	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	const char *two_sys =
	    "[{\"role\":\"system\",\"content\":\"S1\"},{\"role\":\"user\",\"content\":\"Hello\"},"
	    "{\"role\":\"assistant\",\"content\":\"Hi there\"},{\"role\":\"system\",\"content\":\"S2\"},"
	    "{\"role\":\"user\",\"content\":\"How are you?\"}]";
	struct chat_prompt p = render(&c, two_sys, &o,
	                              DS_BOS "S1\n\nS2" DS_USER "Hello" DS_ASSISTANT "Hi there" DS_EOS DS_USER
	                                     "How are you?" DS_ASSISTANT,
	                              "deepseek-v3 §6.3");
	int32_t ids[512];
	size_t n;
	int rc = chat_encode(&c, &p, ids, 512, &n, &e);
	size_t n_bos = 0, n_eos = 0;
	for (size_t i = 0; i < n; i++) {
		n_bos += ids[i] == tok_bos(t);
		n_eos += ids[i] == tok_eos(t);
	}
	CHECK(rc == 0 && ids[0] == tok_bos(t) && n_bos == 1 && n_eos == 1 &&
	          ids[n - 1] == tok_find(t, DS_ASSISTANT, strlen(DS_ASSISTANT)),
	      "ds encode: rc %d bos %zu eos %zu: %s", rc, n_bos, n_eos, e.msg);
	chat_prompt_fini(&p);

	/* user text with the BOS string stays text: still exactly one BOS */
	p = render(&c, "[{\"role\":\"user\",\"content\":\"" DS_BOS "\"}]", &o, NULL, "ds bos in content");
	rc = chat_encode(&c, &p, ids, 512, &n, &e);
	CHECK(rc == 0 && n > 3, "one BOS with BOS text in content: %s", e.msg);
	chat_prompt_fini(&p);

	/* tool round (original V3 layout) */
	p = render(
	    &c,
	    "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
	    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
	    "{\"role\":\"tool\",\"content\":\"r1\"},{\"role\":\"tool\",\"content\":\"r2\"},"
	    "{\"role\":\"assistant\",\"content\":\"done\"},{\"role\":\"user\",\"content\":\"ok\"}]",
	    &o,
	    DS_BOS DS_USER "q" DS_ASSISTANT "<\xef\xbd\x9ctool\xe2\x96\x81"
	                   "calls\xe2\x96\x81"
	                   "begin\xef\xbd\x9c>"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81"
	                   "call\xe2\x96\x81"
	                   "begin\xef\xbd\x9c>function"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>f\n```json\n{\"a\":1}\n```"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81"
	                   "call\xe2\x96\x81"
	                   "end\xef\xbd\x9c>"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81"
	                   "calls\xe2\x96\x81"
	                   "end\xef\xbd\x9c>" DS_EOS "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
	                   "begin\xef\xbd\x9c>"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
	                   "begin\xef\xbd\x9c>r1"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
	                   "end\xef\xbd\x9c>\n"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
	                   "begin\xef\xbd\x9c>r2"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
	                   "end\xef\xbd\x9c>"
	                   "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
	                   "end\xef\xbd\x9c>done" DS_EOS DS_USER "ok" DS_ASSISTANT,
	    "deepseek-v3 tools");
	chat_prompt_fini(&p);

	/* R1: past answers keep what follows the last </think>; the prompt opens the reasoning */
	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_R1, &e) == 0, "init r1: %s", e.msg);
	p = render(&c,
	           "[{\"role\":\"user\",\"content\":\"Hello\"},"
	           "{\"role\":\"assistant\",\"content\":\"<think>a</think>b</think>Hi there\"},"
	           "{\"role\":\"user\",\"content\":\"How are you?\"}]",
	           &o,
	           DS_BOS DS_USER "Hello" DS_ASSISTANT "Hi there" DS_EOS DS_USER "How are you?" DS_ASSISTANT
	                          "<think>\n",
	           "deepseek-r1");
	chat_prompt_fini(&p);

	/* V3.1: history answers get </think> with reasoning removed; thinking control */
	CHECK(chat_init(&c, t, CHAT_FMT_DEEPSEEK_V31, &e) == 0, "init v3.1: %s", e.msg);
	const char *hist = "[{\"role\":\"user\",\"content\":\"Hello\"},"
	                   "{\"role\":\"assistant\",\"content\":\"<think>hmm</think>Hi there\"},"
	                   "{\"role\":\"user\",\"content\":\"How are you?\"}]";
	p = render(&c, hist, &o,
	           DS_BOS DS_USER "Hello" DS_ASSISTANT "</think>Hi there" DS_EOS DS_USER
	                          "How are you?" DS_ASSISTANT "</think>",
	           "deepseek-v3.1 non-thinking");
	chat_prompt_fini(&p);
	o.enable_thinking = 1;
	p = render(&c, hist, &o,
	           DS_BOS DS_USER "Hello" DS_ASSISTANT "</think>Hi there" DS_EOS DS_USER
	                          "How are you?" DS_ASSISTANT "<think>",
	           "deepseek-v3.1 thinking");
	chat_prompt_fini(&p);
	tok_destroy(t);
	gguf_close(g);
}

static void test_errors(void)
{
	struct gguf_ctx *g = open_gguf("models/glm-dsa-tiny-BF16.gguf");
	struct tok *t = load_tok(g);
	struct errbuf e = {0};
	struct chat c;
	CHECK(chat_init(&c, t, CHAT_FMT_GLM5, &e) == 0, "init");
	static const struct {
		const char *msgs;
		int rc;
		const char *in_msg;
	} cases[] = {
	    {"{\"role\":\"user\"}", -EINVAL, "non-empty array"},
	    {"[]", -EINVAL, "non-empty array"},
	    {"[{\"content\":\"x\"}]", -EINVAL, "messages[0]: missing \"role\""},
	    {"[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"wizard\",\"content\":\"x\"}]", -EINVAL,
	     "messages[1].role: 'wizard'"},
	    {"[{\"role\":\"user\",\"content\":7}]", -EINVAL, "messages[0].content"},
	    {"[{\"role\":\"user\"}]", -EINVAL, "messages[0].content: missing"},
	    {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]", ERR_UNSUPPORTED,
	     "messages[0].content[0]: part type 'image_url'"},
	    {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", -EINVAL,
	     "messages[0].content[0].text"},
	    {"[\"hi\"]", -EINVAL, "messages[0]: expected an object"},
	    {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{}}]}]", -EINVAL,
	     "messages[0].tool_calls[0]"},
	    {"[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":5}]", -EINVAL,
	     "reasoning_content"},
	};
	struct chat_opts o = {.enable_thinking = -1, .add_generation_prompt = true};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *j = parse(cases[i].msgs);
		struct chat_prompt p;
		memset(&e, 0, sizeof(e));
		int rc = chat_render(&c, j, &o, &p, &e);
		CHECK(rc == cases[i].rc && strstr(e.msg, cases[i].in_msg) && p.text == NULL,
		      "error case %zu: rc %d '%s' (want %d '%s')", i, rc, e.msg, cases[i].rc,
		      cases[i].in_msg);
		json_decref(j);
	}
	/* tools where a format cannot render them: refused clearly rather than silently dropped */
	json_t *j = parse("[{\"role\":\"user\",\"content\":\"x\"}]");
	json_t *tools = parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
	struct chat_prompt p;
	struct chat c4;
	CHECK(chat_init(&c4, t, CHAT_FMT_GLM4, &e) == 0, "init glm4");
	o.tools = tools;
	CHECK(chat_render(&c4, j, &o, &p, &e) == ERR_UNSUPPORTED && strstr(e.msg, "tools"), "tools: %s",
	      e.msg);
	json_t *bad_tools = parse("[5]");
	o.tools = bad_tools;
	CHECK(chat_render(&c, j, &o, &p, &e) == -EINVAL && strstr(e.msg, "tools[0]"), "bad tools: %s", e.msg);
	json_decref(bad_tools);
	o.tools = NULL;
	/* the prompt size limit */
	o.max_bytes = 16;
	CHECK(chat_render(&c, j, &o, &p, &e) == ERR_LIMIT, "limit: %s", e.msg);
	json_decref(tools);
	json_decref(j);
	tok_destroy(t);
	gguf_close(g);
}

int main(void)
{
	test_detect();
	test_glm();
	test_text_chat_ref();
	test_deepseek();
	test_errors();
	printf("chat: %d checks, %d failed\n", n_checks, n_fail);
	return n_fail ? 1 : 0;
}
