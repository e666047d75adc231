/* JSON config + flag overrides for the worker processes (see opts.h). */
#include "common/net/opts.h"

#include <stdio.h>

#include "common/base/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const struct opt *find_key(const struct opt *t, int n, const char *key, size_t len)
{
	for (int i = 0; i < n; i++)
		if (strlen(t[i].key) == len && strncmp(t[i].key, key, len) == 0)
			return &t[i];
	return NULL;
}

/* "--max-batch" -> "max_batch" */
static const struct opt *find_flag(const struct opt *t, int n, const char *flag, size_t len)
{
	char key[128];
	if (len >= sizeof(key))
		return NULL;
	for (size_t i = 0; i < len; i++)
		key[i] = flag[i] == '-' ? '_' : flag[i];
	return find_key(t, n, key, len);
}

static int set_str(const struct opt *o, const char *v, const char *from, struct errbuf *e)
{
	if (strlen(v) >= o->cap)
		return errbuf_set(e, -EINVAL, "%s '%s': longer than %zu bytes", from, o->key, o->cap - 1);
	memcpy(o->ptr, v, strlen(v) + 1);
	return 0;
}

static int set_int(const struct opt *o, long long v, const char *from, struct errbuf *e)
{
	if ((o->min || o->max) && (v < o->min || v > o->max))
		return errbuf_set(e, -EINVAL, "%s '%s': %lld outside [%ld, %ld]", from, o->key, v, o->min,
		                  o->max);
	if (v < -2147483647LL || v > 2147483647LL)
		return errbuf_set(e, -EINVAL, "%s '%s': %lld out of range", from, o->key, v);
	*(int *)o->ptr = (int)v;
	return 0;
}

static int set_from_text(const struct opt *o, const char *v, struct errbuf *e)
{
	char *end = NULL;
	switch (o->type) {
	case OPT_STR: return set_str(o, v, "flag", e);
	case OPT_INT: {
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (!*v || *end || errno)
			return errbuf_set(e, -EINVAL, "flag --%s: '%s' is not an integer", o->key, v);
		return set_int(o, x, "flag", e);
	}
	case OPT_DOUBLE: {
		double x = strtod(v, &end);
		if (!*v || *end)
			return errbuf_set(e, -EINVAL, "flag --%s: '%s' is not a number", o->key, v);
		*(double *)o->ptr = x;
		return 0;
	}
	case OPT_BOOL:
		if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes"))
			*(bool *)o->ptr = true;
		else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no"))
			*(bool *)o->ptr = false;
		else
			return errbuf_set(e, -EINVAL, "flag --%s: '%s' is not true/false", o->key, v);
		return 0;
	}
	return -EINVAL;
}

static int load_json(const struct opt *t, int n, const char *path, struct errbuf *e)
{
	json_error_t je;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return errbuf_set(e, -EINVAL, "config %s: line %d: %s", path, je.line, je.text);
	int rc = 0;
	if (!json_is_object(root)) {
		rc = errbuf_set(e, -EINVAL, "config %s: top level must be an object", path);
		goto out;
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v)
	{
		if (key[0] == '_' || !strcmp(key, "comment"))
			continue; /* "_comment": documentation inside the file */
		const struct opt *o = find_key(t, n, key, strlen(key));
		if (!o) {
			rc = errbuf_set(e, -EINVAL, "config %s: unknown key '%s' (see --help)", path, key);
			goto out;
		}
		switch (o->type) {
		case OPT_STR:
			rc = json_is_string(v)
			         ? set_str(o, json_string_value(v), "config key", e)
			         : errbuf_set(e, -EINVAL, "config %s: '%s' must be a string", path, key);
			break;
		case OPT_INT:
			rc = json_is_integer(v)
			         ? set_int(o, json_integer_value(v), "config key", e)
			         : errbuf_set(e, -EINVAL, "config %s: '%s' must be an integer", path, key);
			break;
		case OPT_DOUBLE:
			if (json_is_number(v))
				*(double *)o->ptr = json_number_value(v);
			else
				rc = errbuf_set(e, -EINVAL, "config %s: '%s' must be a number", path, key);
			break;
		case OPT_BOOL:
			if (json_is_boolean(v))
				*(bool *)o->ptr = json_is_true(v);
			else
				rc = errbuf_set(e, -EINVAL, "config %s: '%s' must be true or false", path,
				                key);
			break;
		}
		if (rc)
			goto out;
	}
out:
	json_decref(root);
	return rc;
}

void opts_print_help(FILE *f, const struct opt *t, int n, const char *usage_line)
{
	fprintf(f, "usage: %s\n\n  --%-24s %s\n", usage_line, "config FILE",
	        "JSON file with any of the keys below");
	for (int i = 0; i < n; i++) {
		char flag[128];
		size_t k = 0;
		for (; t[i].key[k] && k < sizeof(flag) - 1; k++)
			flag[k] = t[i].key[k] == '_' ? '-' : t[i].key[k];
		flag[k] = 0;
		char def[160];
		switch (t[i].type) {
		case OPT_STR: snprintf(def, sizeof(def), "\"%s\"", (const char *)t[i].ptr); break;
		case OPT_INT: snprintf(def, sizeof(def), "%d", *(int *)t[i].ptr); break;
		case OPT_DOUBLE: snprintf(def, sizeof(def), "%g", *(double *)t[i].ptr); break;
		case OPT_BOOL: snprintf(def, sizeof(def), "%s", *(bool *)t[i].ptr ? "true" : "false"); break;
		}
		fprintf(f, "  --%-24s %s (JSON \"%s\", default %s)\n", flag, t[i].help, t[i].key, def);
	}
	fprintf(f, "  --%-24s %s\n", "help", "this text");
}

int opts_parse(const struct opt *t, int n, int argc, char **argv, const char *usage_line, struct errbuf *e)
{
	int rc;
	/* pass 1: --help and --config */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			opts_print_help(stdout, t, n, usage_line);
			return 1;
		}
	}
	for (int i = 1; i < argc; i++) {
		const char *path = NULL;
		if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) {
			if (i + 1 >= argc)
				return errbuf_set(e, -EINVAL, "--config needs a file name");
			path = argv[++i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9;
		}
		if (path && (rc = load_json(t, n, path, e)))
			return rc;
	}
	/* pass 2: every other flag overrides */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--config") || !strcmp(a, "-c")) {
			i++;
			continue;
		}
		if (!strncmp(a, "--config=", 9))
			continue;
		if (strncmp(a, "--", 2) != 0)
			return errbuf_set(e, -EINVAL, "unexpected argument '%s' (see --help)", a);
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t len = eq ? (size_t)(eq - name) : strlen(name);
		const struct opt *o = find_flag(t, n, name, len);
		if (!o)
			return errbuf_set(e, -EINVAL, "unknown flag '%s' (see --help)", a);
		const char *v;
		if (eq)
			v = eq + 1;
		else if (o->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0))
			v = "true"; /* a bare boolean flag */
		else if (i + 1 < argc)
			v = argv[++i];
		else
			return errbuf_set(e, -EINVAL, "flag '%s' needs a value", a);
		if ((rc = set_from_text(o, v, e)))
			return rc;
	}
	return 0;
}

int opts_read_token_file(const char *path, char *buf, size_t cap, struct errbuf *e)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return errbuf_set(e, -ENOENT, "token file %s: %s", path, strerror(errno));
	char *line = NULL;
	size_t n = 0;
	ssize_t len = getline(&line, &n, f);
	fclose(f);
	if (len < 0) {
		free(line);
		return errbuf_set(e, -EINVAL, "token file %s: empty", path);
	}
	while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = 0;
	int rc = 0;
	if (len == 0)
		rc = errbuf_set(e, -EINVAL, "token file %s: first line is empty", path);
	else if ((size_t)len >= cap)
		rc = errbuf_set(e, -EINVAL, "token file %s: token longer than %zu bytes", path, cap - 1);
	else
		memcpy(buf, line, (size_t)len + 1);
	free(line);
	return rc;
}

bool opts_worker_start(const char *prog, const char *role, int parse_rc, const struct errbuf *parse_e,
                       const char *log_level, const char *token_file, char *token, size_t token_size,
                       int *exit_code)
{
	*exit_code = 0;
	if (parse_rc == 1)
		return true;
	log_init(role, -1);
	*exit_code = 2;
	if (parse_rc) {
		fprintf(stderr, "%s: %s\n", prog, parse_e->msg);
		return true;
	}
	int lvl = log_parse_level(log_level);
	if (lvl < 0) {
		fprintf(stderr, "%s: log_level '%s': expected error, warn, info or debug\n", prog, log_level);
		return true;
	}
	log_level_max = lvl;
	struct errbuf e = {0};
	if (token_file[0] && opts_read_token_file(token_file, token, token_size, &e)) {
		fprintf(stderr, "%s: %s\n", prog, e.msg);
		return true;
	}
	*exit_code = 0;
	return false;
}
