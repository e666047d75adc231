/* `tandem tokenize -m MODEL`: reads UTF-8 text on stdin and prints its token ids as a JSON array
 * (no BOS unless --bos). Special-token text in the input is matched as special tokens, like HF
 * tokenizers does, unless --no-special. With --chat, stdin is an OpenAI `messages` array (or an
 * object with "messages" and optional "tools") rendered with the model's chat format, and
 * --render prints the prompt text instead of its ids. Only the GGUF metadata is read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/gguf/gguf.h"
#include "common/tok/chat.h"
#include "common/tok/tok.h"

#define TOKENIZE_MAX_INPUT (256u << 20)

static void tokenize_usage(FILE *f)
{
	fprintf(f,
	        "usage: tandem tokenize -m MODEL.gguf [--bos] [--no-special] < text\n"
	        "       tandem tokenize -m MODEL.gguf --chat [--format NAME] [--think on|off]\n"
	        "                       [--effort low|high|max] [--render] < messages.json\n"
	        "  prints the token ids of stdin as a JSON array\n"
	        "  --bos         prepend BOS when the model's tokenizer asks for it (add_bos_token)\n"
	        "  --no-special  tokenize special-token text (e.g. <|user|>) as plain text\n"
	        "  --chat        stdin is an OpenAI messages array (or {\"messages\": .., \"tools\": ..}),\n"
	        "                rendered with the model's chat format (or --format: glm5, glm5.2, glm4,\n"
	        "                deepseek-v3, deepseek-v3.1, deepseek-r1) and the generation prompt\n"
	        "  --think       thinking on/off (default: the format's)\n"
	        "  --effort      GLM-5.2 reasoning effort\n"
	        "  --render      with --chat: print the prompt text instead of ids\n");
}

static char *read_all(FILE *f, size_t *len, int *too_big)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	*too_big = 0;
	while (buf) {
		size_t k = fread(buf + n, 1, cap - n, f);
		n += k;
		if (k == 0)
			break;
		if (n == cap) {
			if (cap >= TOKENIZE_MAX_INPUT) {
				*too_big = 1;
				break;
			}
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
	}
	*len = n;
	return buf;
}

/* --chat: render the messages on stdin and tokenize them (or print the text with --render).
 * Returns the exit code. */
static int chat_ids(const struct tok *t, const struct gguf_ctx *g, const char *format, int think,
                    const char *effort, bool render, const char *text, size_t len, int32_t **ids, size_t *n)
{
	struct errbuf e = {0};
	json_error_t je;
	json_t *root = json_loadb(text, len, 0, &je);
	if (!root)
		return cli_usage_error("tokenize", "stdin: not JSON: %s (line %d)", je.text, je.line);
	json_t *msgs = json_is_object(root) ? json_object_get(root, "messages") : root;
	json_t *tools = json_is_object(root) ? json_object_get(root, "tools") : NULL;
	struct chat c;
	struct chat_prompt p = {0};
	int ret = 2;
	if (chat_init_gguf(&c, t, g, format, &e)) {
		cli_usage_error("tokenize", "%s", e.msg);
		goto cleanup;
	}
	struct chat_opts o = {.enable_thinking = think,
	                      .reasoning_effort = effort,
	                      .add_generation_prompt = true,
	                      .tools = tools};
	if (chat_render(&c, msgs, &o, &p, &e)) {
		cli_usage_error("tokenize", "stdin: %s", e.msg);
		goto cleanup;
	}
	if (render) {
		fwrite(p.text, 1, p.len, stdout);
		putchar('\n');
		ret = fflush(stdout) == 0 ? 0 : 1;
		goto cleanup;
	}
	size_t cap = tok_encode_max(p.len);
	*ids = malloc(sizeof(int32_t) * cap);
	if (!*ids) {
		fprintf(stderr, "tandem tokenize: out of memory\n");
		ret = 1;
		goto cleanup;
	}
	if (chat_encode(&c, &p, *ids, cap, n, &e)) {
		cli_usage_error("tokenize", "%s", e.msg);
		goto cleanup;
	}
	ret = 0;
cleanup:
	chat_prompt_fini(&p);
	json_decref(root);
	return ret;
}

int cmd_tokenize(int argc, char **argv)
{
	const char *model = NULL, *format = NULL, *effort = NULL;
	unsigned flags = 0;
	bool chat = false, render = false;
	int think = -1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-m") == 0 || strcmp(argv[i], "--model") == 0) {
			if (i + 1 >= argc)
				return cli_usage_error("tokenize", "%s needs a GGUF path", argv[i]);
			model = argv[++i];
		} else if (strcmp(argv[i], "--chat") == 0) {
			chat = true;
		} else if (strcmp(argv[i], "--render") == 0) {
			render = true;
		} else if (strcmp(argv[i], "--format") == 0 || strcmp(argv[i], "--effort") == 0 ||
		           strcmp(argv[i], "--think") == 0) {
			if (i + 1 >= argc)
				return cli_usage_error("tokenize", "%s needs a value", argv[i]);
			const char *v = argv[++i];
			if (argv[i - 1][2] == 'f') {
				format = v;
			} else if (argv[i - 1][2] == 'e') {
				effort = v;
			} else if (strcmp(v, "on") == 0 || strcmp(v, "off") == 0) {
				think = strcmp(v, "on") == 0;
			} else {
				return cli_usage_error("tokenize", "--think takes on or off, not '%s'", v);
			}
		} else if (strcmp(argv[i], "--bos") == 0) {
			flags |= TOK_ENCODE_ADD_BOS;
		} else if (strcmp(argv[i], "--no-special") == 0) {
			flags |= TOK_ENCODE_NO_SPECIAL;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			tokenize_usage(stdout);
			return 0;
		} else {
			return cli_usage_error("tokenize", "unknown option '%s' (see tandem tokenize --help)",
			                       argv[i]);
		}
	}
	if (!model)
		return cli_usage_error("tokenize", "missing -m MODEL.gguf");
	if (!chat && (render || format || effort || think >= 0))
		return cli_usage_error("tokenize", "--render, --format, --effort and --think need --chat");
	if (chat && (flags & (TOK_ENCODE_ADD_BOS | TOK_ENCODE_NO_SPECIAL)))
		return cli_usage_error("tokenize",
		                       "--bos and --no-special do not apply to --chat (the format decides)");

	struct errbuf e = {0};
	struct gguf_ctx *g = NULL;
	struct tok *t = NULL;
	char *text = NULL;
	int32_t *ids = NULL;
	int ret = 2;
	if (gguf_open(&g, model, &e)) {
		cli_usage_error("tokenize", "%s", e.msg); /* the reader's message names the file */
		goto cleanup;
	}
	if (tok_load(&t, g, &e)) {
		cli_usage_error("tokenize", "%s: %s", model, e.msg);
		goto cleanup;
	}
	size_t len;
	int too_big;
	text = read_all(stdin, &len, &too_big);
	if (!text || too_big || ferror(stdin)) {
		cli_usage_error("tokenize", too_big ? "stdin: more than %u bytes" : "stdin: read failed (%u)",
		                TOKENIZE_MAX_INPUT);
		goto cleanup;
	}
	size_t n = 0;
	if (chat) {
		ret = chat_ids(t, g, format, think, effort, render, text, len, &ids, &n);
		if (ret || render)
			goto cleanup;
		ret = 2;
	} else {
		size_t cap = tok_encode_max(len);
		ids = malloc(sizeof(int32_t) * cap);
		if (!ids) {
			fprintf(stderr, "tandem tokenize: out of memory\n");
			ret = 1;
			goto cleanup;
		}
		if (tok_encode(t, text, len, flags, ids, cap, &n, NULL, &e)) {
			cli_usage_error("tokenize", "stdin: %s", e.msg);
			goto cleanup;
		}
	}
	putchar('[');
	for (size_t i = 0; i < n; i++)
		printf(i ? ", %d" : "%d", ids[i]);
	printf("]\n");
	ret = fflush(stdout) == 0 ? 0 : 1;
cleanup:
	free(ids);
	free(text);
	tok_destroy(t);
	gguf_close(g);
	return ret;
}
