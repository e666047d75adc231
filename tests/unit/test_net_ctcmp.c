/* ct_str_equal (common/net/ctcmp.c), the control-token comparison of the router: equal exactly
 * when strcmp says so, for equal and different lengths, prefixes, NULL and empty strings, and
 * every single-bit difference at every position of a token. */
#include <stdio.h>
#include <string.h>

#include "common/net/ctcmp.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

int main(void)
{
	const char *v[] = {"", "a", "b", "s3cret", "s3cre", "s3cret!", "S3cret", "s3creu", "\xff\x01"};
	int n = (int)(sizeof(v) / sizeof(v[0]));
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			CHECK(ct_str_equal(v[i], v[j]) == (strcmp(v[i], v[j]) == 0));
	CHECK(ct_str_equal(NULL, ""));
	CHECK(ct_str_equal("", NULL));
	CHECK(!ct_str_equal(NULL, "x"));
	char tok[65], mod[65];
	for (int i = 0; i < 64; i++)
		tok[i] = (char)('A' + i % 50);
	tok[64] = 0;
	for (int pos = 0; pos < 64; pos++)
		for (int bit = 0; bit < 7; bit++) {
			memcpy(mod, tok, sizeof(tok));
			mod[pos] = (char)(mod[pos] ^ (1 << bit));
			CHECK(!ct_str_equal(tok, mod));
		}
	CHECK(ct_str_equal(tok, tok));
	if (n_fail) {
		fprintf(stderr, "test_net_ctcmp: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_ctcmp: all checks passed\n");
	return 0;
}
