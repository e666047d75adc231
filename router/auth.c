/* API-key check (see auth.h). Keys are compared in constant time so that response timing does not
 * reveal how much of a guessed key was right. */
#include "router/auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AUTH_MAX_KEYS 4096
#define AUTH_MAX_KEY_LEN 256

struct auth {
	char **keys;
	int n_keys;
};

int auth_n_keys(const struct auth *a)
{
	return a ? a->n_keys : 0;
}

void auth_destroy(struct auth *a)
{
	if (!a)
		return;
	for (int i = 0; i < a->n_keys; i++)
		free(a->keys[i]);
	free(a->keys);
	free(a);
}

int auth_load(struct auth **out, const char *path, struct errbuf *e)
{
	*out = NULL;
	FILE *f = fopen(path, "r");
	if (!f)
		return errbuf_set(e, -errno, "api keys file %s: cannot open: %s", path, strerror(errno));
	struct auth *a = calloc(1, sizeof(*a));
	int rc = 0;
	if (!a || !(a->keys = calloc(AUTH_MAX_KEYS, sizeof(char *)))) {
		rc = errbuf_set(e, -ENOMEM, "api keys: out of memory");
		goto fail;
	}
	char line[AUTH_MAX_KEY_LEN + 4];
	int lineno = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		size_t n = strlen(line);
		if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
			rc = errbuf_set(e, ERR_FORMAT, "api keys file %s:%d: key longer than %d bytes", path,
			                lineno, AUTH_MAX_KEY_LEN);
			goto fail;
		}
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' ||
		                 line[n - 1] == '\t'))
			line[--n] = '\0';
		char *k = line;
		while (*k == ' ' || *k == '\t')
			k++;
		if (*k == '\0' || *k == '#')
			continue;
		if (a->n_keys == AUTH_MAX_KEYS) {
			rc = errbuf_set(e, ERR_LIMIT, "api keys file %s: more than %d keys", path,
			                AUTH_MAX_KEYS);
			goto fail;
		}
		if (!(a->keys[a->n_keys] = strdup(k))) {
			rc = errbuf_set(e, -ENOMEM, "api keys: out of memory");
			goto fail;
		}
		a->n_keys++;
	}
	if (a->n_keys == 0) {
		rc = errbuf_set(e, ERR_FORMAT,
		                "api keys file %s holds no key (refusing to run open by accident)", path);
		goto fail;
	}
	fclose(f);
	*out = a;
	return 0;
fail:
	fclose(f);
	auth_destroy(a);
	return rc;
}

static bool const_time_eq(const char *a, size_t an, const char *b, size_t bn)
{
	unsigned char d = an != bn;
	size_t n = an < bn ? an : bn;
	for (size_t i = 0; i < n; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

bool auth_is_allowed(const struct auth *a, const char *header)
{
	if (!a)
		return true;
	if (!header || strncasecmp(header, "Bearer ", 7) != 0)
		return false;
	const char *k = header + 7;
	while (*k == ' ')
		k++;
	size_t kn = strlen(k);
	bool ok = false;
	for (int i = 0; i < a->n_keys; i++)
		ok |= const_time_eq(a->keys[i], strlen(a->keys[i]), k, kn);
	return ok;
}
