/* Transfer-fence words (common/net/kvfence.h): attempt 0 is the plain rid (what peers without
 * per-attempt fences write and expect); the attempts of one rid never share a word; a stale
 * attempt's word is recognised with its number, and nothing else is taken for one. */
#include <stdio.h>

#include "common/net/kvfence.h"

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
	static const uint64_t rids[] = {1, 2, 77, 123456789012345ull, (1ull << 48) + 5, UINT64_MAX};
	for (size_t i = 0; i < sizeof(rids) / sizeof(rids[0]); i++) {
		uint64_t rid = rids[i];
		CHECK(kvfence_word(rid, 0) == rid);
		/* every pair of attempts 0..255 of one rid differs */
		for (uint32_t a = 0; a < 256; a++)
			for (uint32_t b = a + 1; b < 256; b++)
				if (kvfence_word(rid, a) == kvfence_word(rid, b)) {
					fprintf(stderr, "rid %llu: attempts %u and %u share a word\n",
					        (unsigned long long)rid, a, b);
					n_fail++;
				}
		uint32_t st = 99;
		/* the current attempt's word, an empty slot and another rid's word are not stale */
		CHECK(!kvfence_is_stale(kvfence_word(rid, 3), rid, 3, &st));
		CHECK(!kvfence_is_stale(0, rid, 3, &st));
		CHECK(!kvfence_is_stale(kvfence_word(rid + 1, 1), rid, 3, &st));
		CHECK(st == 99);
		/* a later attempt's word is not an earlier one's */
		CHECK(!kvfence_is_stale(kvfence_word(rid, 4), rid, 3, &st));
		for (uint32_t a = 0; a < 3; a++) {
			CHECK(kvfence_is_stale(kvfence_word(rid, a), rid, 3, &st) && st == a);
		}
		/* attempt 0 has no earlier attempts */
		CHECK(!kvfence_is_stale(rid, rid, 0, &st));
	}
	/* a hostile attempt number does not make the scan long: it stops at its cap (returns quickly) */
	uint32_t st;
	CHECK(!kvfence_is_stale(12345, 1, UINT32_MAX, &st));
	if (n_fail) {
		fprintf(stderr, "test_net_kvfence: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_kvfence: all checks passed\n");
	return 0;
}
