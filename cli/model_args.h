/* Argument helpers shared by the model subcommands (logits, generate): strict number parsing and
 * the --tokens list, each failing with a message that names the option. */
#ifndef TANDEM_CLI_MODEL_ARGS_H
#define TANDEM_CLI_MODEL_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whole-string integer / float in [lo, hi]; false if malformed or out of range. */
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_f32(const char *s, float lo, float hi, float *out);
/* "1,2,3" -> malloc'd ids (each in [0, INT32_MAX]); false on any malformed entry or empty list. */
bool cli_parse_ids(const char *s, int32_t **ids, size_t *n);

/* "cpu" | "cuda" -> MODEL_BACKEND_CPU / MODEL_BACKEND_CUDA (common/model/model.h) */
bool cli_parse_backend(const char *s, int *out);

#endif
