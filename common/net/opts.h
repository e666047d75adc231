/* Worker configuration: one JSON file (jansson) whose keys are all overridable by flags, and a
 * generated --help. Described by a table of options the role owns (prefill/main.c, decode/main.c).
 *
 *   tandem-decode --config decode.json --router 127.0.0.1:7000 --max-batch=32
 *
 * Key "max_batch" in JSON is flag --max-batch (underscores become dashes). Precedence: defaults
 * (the values in the target variables before the call) < JSON file < flags. An unknown key or
 * flag, a value of the wrong type or out of range is an error naming it. */
#ifndef TANDEM_NET_OPTS_H
#define TANDEM_NET_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/base/err.h"

enum opt_type { OPT_STR, OPT_INT, OPT_BOOL, OPT_DOUBLE };

struct opt {
	const char *key; /* JSON key, snake_case */
	enum opt_type type;
	void *ptr; /* char[cap] for OPT_STR, int for OPT_INT, bool, double */
	size_t cap; /* OPT_STR buffer size */
	long min, max; /* OPT_INT range (ignored when min == max == 0) */
	const char *help;
};

/* Returns 0, 1 when --help was printed (exit 0), or a negative error. */
int opts_parse(const struct opt *table, int n, int argc, char **argv, const char *usage_line,
               struct errbuf *e) TD_MUST_CHECK;
/* Reads the first line of a secret file (a shared token), without the line end. The file must not be
 * empty; a line longer than cap - 1 is an error. */
int opts_read_token_file(const char *path, char *buf, size_t cap, struct errbuf *e) TD_MUST_CHECK;
/* The common start of a worker's main() after opts_parse returned parse_rc: starts logging as `role`,
 * applies log_level and reads the control token from token_file (if set) into token. Returns true when
 * main should exit now with *exit_code (0 after --help; 2 after printing "prog: problem"). */
bool opts_worker_start(const char *prog, const char *role, int parse_rc, const struct errbuf *parse_e,
                       const char *log_level, const char *token_file, char *token, size_t token_size,
                       int *exit_code);
void opts_print_help(FILE *f, const struct opt *table, int n, const char *usage_line);

#endif
