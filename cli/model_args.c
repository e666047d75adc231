/* Strict parsing of numeric options and token-id lists for the model subcommands. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/model_args.h"

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	if (!s || !*s)
		return false;
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

bool cli_parse_f32(const char *s, float lo, float hi, float *out)
{
	if (!s || !*s)
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end || !isfinite(v) || v < lo || v > hi)
		return false;
	*out = (float)v;
	return true;
}

bool cli_parse_ids(const char *s, int32_t **ids, size_t *n)
{
	*ids = NULL;
	*n = 0;
	if (!s || !*s)
		return false;
	size_t cap = 1;
	for (const char *p = s; *p; p++)
		cap += *p == ',';
	int32_t *v = malloc(cap * sizeof(int32_t));
	if (!v)
		return false;
	const char *p = s;
	size_t k = 0;
	for (;;) {
		char *end;
		errno = 0;
		if (*p < '0' || *p > '9')
			goto bad;
		long long x = strtoll(p, &end, 10);
		if (errno || x > INT32_MAX || (*end != ',' && *end != 0))
			goto bad;
		v[k++] = (int32_t)x;
		if (!*end)
			break;
		p = end + 1;
	}
	*ids = v;
	*n = k;
	return true;
bad:
	free(v);
	return false;
}

bool cli_parse_backend(const char *s, int *out)
{
	if (s && !strcmp(s, "cpu"))
		*out = 0; /* MODEL_BACKEND_CPU */
	else if (s && !strcmp(s, "cuda"))
		*out = 1; /* MODEL_BACKEND_CUDA */
	else
		return false;
	return true;
}
