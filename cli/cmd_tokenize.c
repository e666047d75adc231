/* `tandem tokenize -m MODEL`: reads UTF-8 text on stdin and prints its token ids as a JSON array
 * (no BOS unless --bos). Special-token text in the input is matched as special tokens, like HF
 * tokenizers does, unless --no-special. Only the GGUF metadata is read, never the weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/gguf/gguf.h"
#include "common/tok/tok.h"

#define TOKENIZE_MAX_INPUT (256u << 20)

static void tokenize_usage(FILE *f)
{
	fprintf(f, "usage: tandem tokenize -m MODEL.gguf [--bos] [--no-special] < text\n"
	           "  prints the token ids of stdin as a JSON array\n"
	           "  --bos         prepend BOS when the model's tokenizer asks for it (add_bos_token)\n"
	           "  --no-special  tokenize special-token text (e.g. <|user|>) as plain text\n");
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

int cmd_tokenize(int argc, char **argv)
{
	const char *model = NULL;
	unsigned flags = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-m") == 0 || strcmp(argv[i], "--model") == 0) {
			if (i + 1 >= argc)
				return cli_usage_error("tokenize", "%s needs a GGUF path", argv[i]);
			model = argv[++i];
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
	size_t cap = tok_encode_max(len), n = 0;
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
