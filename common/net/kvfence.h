/* The word a prefill worker writes into a decode worker's transfer-fence slot when it has stopped
 * writing a reservation's blocks for good, and decode's test of it (tandem.proto KvRegion,
 * PER-ATTEMPT FENCES). Attempt 0 writes the plain rid, which is what peers from before per-attempt
 * fences write and expect; every later attempt of the same rid has a word of its own, so a late
 * fence of an earlier attempt never vouches for the blocks of the current one. */
#ifndef TANDEM_NET_KVFENCE_H
#define TANDEM_NET_KVFENCE_H

#include <stdbool.h>
#include <stdint.h>

/* the fence word of (rid, attempt) */
uint64_t kvfence_word(uint64_t rid, uint32_t attempt);

/* Which earlier attempt (< attempt) of rid wrote `word`: true with *stale set, false when the word
 * is none of them (empty slot, the current attempt's word, a word of another request). */
bool kvfence_is_stale(uint64_t word, uint64_t rid, uint32_t attempt, uint32_t *stale);

#endif
