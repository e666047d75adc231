/* Optional API keys: one key per line in a file (blank lines and lines starting with '#'
 * ignored). With keys loaded, every /v1/ request must carry `Authorization: Bearer <key>`. */
#ifndef TANDEM_ROUTER_AUTH_H
#define TANDEM_ROUTER_AUTH_H

#include <stdbool.h>

#include "common/base/err.h"

struct auth;

int auth_load(struct auth **out, const char *path, struct errbuf *e) TD_MUST_CHECK;
void auth_destroy(struct auth *a); /* accepts NULL */
/* header: the Authorization header value or NULL. */
bool auth_is_allowed(const struct auth *a, const char *header);
int auth_n_keys(const struct auth *a);

#endif
