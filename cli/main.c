/* build/tandem: the model-core command line (logits, generate, tokenize, inspect, mkmodel, bench).
 * main() only dispatches; each subcommand lives in its own cmd_*.c file. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/base/log.h"

struct subcmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

/* Subcommands are weak symbols: each cmd_*.c defines one, and a command whose file is not built
 * yet is simply not listed. */
#pragma weak cmd_inspect
#pragma weak cmd_tokenize
#pragma weak cmd_logits
#pragma weak cmd_generate
#pragma weak cmd_mkmodel
#pragma weak cmd_bench

static const struct subcmd subcmds[] = {
    {"logits", cmd_logits, "-m MODEL --tokens 1,2,3 [--all] [--tp N] -o OUT   write float32 logits"},
    {"generate", cmd_generate, "-m MODEL (--tokens ..|-p TEXT|--chat F.json) -n N [...]   generate text"},
    {"tokenize", cmd_tokenize, "-m MODEL < text   print token ids as a JSON array"},
    {"inspect", cmd_inspect, "MODEL   metadata, tensor table, architecture and problems"},
    {"mkmodel", cmd_mkmodel, "--preset NAME [--layers L] [--experts E] --type T -o OUT.gguf"},
    {"bench", cmd_bench, "decode/prefill benchmarks"},
    {NULL, NULL, NULL},
};

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "tandem %s: ", cmd);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 2;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tandem <command> [options]\n\ncommands:\n");
	for (const struct subcmd *s = subcmds; s->name; s++)
		if (s->fn)
			fprintf(f, "  %-9s %s\n", s->name, s->help);
	fprintf(f, "\n'tandem <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
	log_init("tandem", -1);
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (const struct subcmd *s = subcmds; s->name; s++)
		if (s->fn && strcmp(argv[1], s->name) == 0)
			return s->fn(argc - 1, argv + 1);
	fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
	return 2;
}
