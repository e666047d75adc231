/* Constant-time string equality for secrets (see ctcmp.h). Every byte position up to the longer
 * length is visited and differences are OR-ed together, with no early exit; the volatile
 * accumulator keeps the compiler from turning the loop back into a short-circuit compare. */
#include "common/net/ctcmp.h"

#include <string.h>

bool ct_str_equal(const char *a, const char *b)
{
	if (!a)
		a = "";
	if (!b)
		b = "";
	size_t la = strlen(a), lb = strlen(b);
	size_t n = la > lb ? la : lb;
	volatile unsigned char diff = (unsigned char)(la != lb);
	for (size_t i = 0; i < n; i++) {
		unsigned char x = i < la ? (unsigned char)a[i] : 0;
		unsigned char y = i < lb ? (unsigned char)b[i] : 0;
		diff |= (unsigned char)(x ^ y);
	}
	return diff == 0;
}
