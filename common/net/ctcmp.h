/* Constant-time comparison of secrets (shared control tokens): the time taken depends only on the
 * lengths, never on where the first differing byte is, so a peer cannot find the token byte by
 * byte by timing failed Hellos. */
#ifndef TANDEM_NET_CTCMP_H
#define TANDEM_NET_CTCMP_H

#include <stdbool.h>

/* true when the two NUL-terminated strings are equal; NULL counts as "". */
bool ct_str_equal(const char *a, const char *b);

#endif
