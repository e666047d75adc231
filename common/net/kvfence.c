/* Transfer-fence words (see kvfence.h and tandem.proto KvRegion). The multiplier is odd, so
 * attempt -> attempt * K is a bijection mod 2^64 and two attempts of one rid never share a word;
 * attempt 0 maps to the rid itself for peers that know nothing of attempts. */
#include "common/net/kvfence.h"

#define KVFENCE_MUL 0x9E3779B97F4A7C15ull
#define KVFENCE_SCAN_MAX 256u

uint64_t kvfence_word(uint64_t rid, uint32_t attempt)
{
	return rid ^ ((uint64_t)attempt * KVFENCE_MUL);
}

bool kvfence_is_stale(uint64_t word, uint64_t rid, uint32_t attempt, uint32_t *stale)
{
	/* attempts are few (the router's retry limit), so a scan is cheap; it runs only when the slot
	 * holds something other than the expected word. The cap bounds it whatever a peer sent. */
	for (uint32_t a = 0; a < attempt && a < KVFENCE_SCAN_MAX; a++)
		if (word == kvfence_word(rid, a)) {
			*stale = a;
			return true;
		}
	return false;
}
