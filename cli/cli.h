/* Subcommands of build/tandem. Each returns the process exit code: 0 ok, 2 for bad arguments or
 * bad input files (after printing one line naming the problem), 1 for other failures. */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H

int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "tandem <cmd>: <message>" to stderr and returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
