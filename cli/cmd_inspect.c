/* `tandem inspect MODEL`: opens a GGUF model (any shard of a split set), prints its metadata,
 * tensor table and per-type totals, the detected architecture, and every problem found: the
 * architecture check of common/model (model_arch_check: missing keys, missing / extra / mis-shaped
 * tensors) plus file-level checks done here (tensor types tandem cannot compute with, vocabulary
 * sizes that disagree, special token ids outside the vocabulary). A file the reader rejects gets
 * one line naming the problem and exit code 2; a file that opens but has problems lists them all
 * and exits 1; a clean file exits 0. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/gguf/gguf.h"
#include "common/model/model.h"
#include "kernels/kernels.h"

struct problems {
	int n;
};

static void problem(struct problems *p, const char *fmt, ...) TD_PRINTF(2, 3);

static void problem(struct problems *p, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("problem: ");
	vprintf(fmt, ap);
	putchar('\n');
	va_end(ap);
	p->n++;
}

/* File-level checks that need no architecture tables (model_arch_check does the rest). */
static void check_file(const struct gguf_ctx *g, const char *arch, struct problems *p)
{
	/* tensor types tandem can size but not compute with */
	int64_t n_nocompute = 0;
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		const struct ktype_info *k = ktype_get(t->type);
		if (k && !k->compute && n_nocompute++ < 10)
			problem(p, "tensor '%s' has type %s, which tandem cannot compute with", t->name,
			        k->name);
	}
	if (n_nocompute > 10)
		problem(p, "... and %" PRId64 " more tensors of types tandem cannot compute with",
		        n_nocompute - 10);

	/* vocabulary: tokens array, {arch}.vocab_size and the embedding rows must agree */
	struct gguf_arr tok;
	int64_t n_tok = -1, vocab = -1;
	if (gguf_get_arr(g, "tokenizer.ggml.tokens", &tok, NULL) == 0) {
		if (tok.type != GGUF_VT_STRING)
			problem(p, "tokenizer.ggml.tokens is an array of %s, expected str",
			        gguf_vtype_name(tok.type));
		else
			n_tok = (int64_t)tok.count;
	} else {
		problem(p, "tokenizer.ggml.tokens is missing (no tokenizer)");
	}
	if (arch) {
		char key[128];
		snprintf(key, sizeof(key), "%s.vocab_size", arch);
		struct errbuf e = {0};
		int rc = gguf_get_i64(g, key, &vocab, &e);
		if (rc && rc != ERR_NOTFOUND)
			problem(p, "%s", e.msg);
	}
	const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
	if (n_tok >= 0 && vocab >= 0 && n_tok != vocab)
		problem(p, "tokenizer has %" PRId64 " tokens but %s.vocab_size is %" PRId64, n_tok, arch,
		        vocab);
	if (emb && n_tok >= 0 && emb->ne[1] != n_tok)
		problem(p, "token_embd.weight has %" PRId64 " rows but the tokenizer has %" PRId64 " tokens",
		        emb->ne[1], n_tok);
	if (gguf_n_tensors(g) > 0 && !emb)
		problem(p, "token_embd.weight is missing");

	/* special token ids must index the vocabulary */
	static const char *const ids[] = {"bos", "eos", "eot", "eom", "unknown", "padding"};
	for (size_t i = 0; n_tok >= 0 && i < sizeof(ids) / sizeof(ids[0]); i++) {
		char key[64];
		snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", ids[i]);
		int64_t id;
		struct errbuf e = {0};
		int rc = gguf_get_i64(g, key, &id, &e);
		if (rc == 0 && (id < 0 || id >= n_tok))
			problem(p, "%s = %" PRId64 " is outside the vocabulary (%" PRId64 " tokens)", key, id,
			        n_tok);
		else if (rc && rc != ERR_NOTFOUND)
			problem(p, "%s", e.msg);
	}
}

int cmd_inspect(int argc, char **argv)
{
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			printf("usage: tandem inspect MODEL.gguf\n\n"
			       "Prints metadata, the tensor table with types, shapes and bytes, totals per "
			       "type, the\n"
			       "detected architecture and every problem found. Any shard of a split model "
			       "may be given.\n"
			       "Exit code: 0 no problems, 1 problems listed, 2 bad arguments or unreadable "
			       "file.\n");
			return 0;
		}
		if (argv[i][0] == '-' && argv[i][1])
			return cli_usage_error("inspect", "unknown option '%s' (see tandem inspect --help)",
			                       argv[i]);
		if (path)
			return cli_usage_error("inspect", "more than one model given ('%s' and '%s')", path,
			                       argv[i]);
		path = argv[i];
	}
	if (!path)
		return cli_usage_error("inspect", "no model given (usage: tandem inspect MODEL.gguf)");

	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	int rc = gguf_open(&g, path, &e);
	if (rc)
		return cli_usage_error("inspect", "%s", e.msg);

	gguf_print(g, stdout);
	char *arch = gguf_get_str_dup(g, "general.architecture", NULL);
	printf("\ngeneral.architecture: %s\n", arch ? arch : "(none)");
	struct problems p = {0};
	printf("\ncheck:\n");
	fflush(stdout);
	int n_arch = model_arch_check(g, stdout);
	if (n_arch < 0)
		problem(&p, "the architecture check could not run: %s", err_name(n_arch));
	else
		p.n += n_arch;
	check_file(g, arch, &p);
	if (p.n == 0)
		printf("no problems found\n");
	else
		printf("%d problem%s found\n", p.n, p.n == 1 ? "" : "s");
	free(arch);
	gguf_close(g);
	return p.n ? 1 : 0;
}
