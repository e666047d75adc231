/* Trivial engine rules (see trivial.h). */
#include "common/net/trivial.h"

#include <stdio.h>
#include <string.h>

void trivial_layout(struct msg_kv_layout *l)
{
	memset(l, 0, sizeof(*l));
	snprintf(l->arch, sizeof(l->arch), "trivial");
	l->n_layers = 1;
	l->block_size = TRIVIAL_BLOCK_TOKENS;
	l->latent_dim = TRIVIAL_SLOT_BYTES;
	l->dtype = MSG_KV_NONE;
	l->block_bytes = TRIVIAL_BLOCK_BYTES;
	l->fingerprint = 0x7472697669616cull; /* "trivial" */
}

uint64_t trivial_write_kv(uint8_t *const *blocks, const uint32_t *tokens, uint32_t n, uint32_t start_pos,
                          uint64_t hash)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = start_pos + i;
		uint8_t *slot = blocks[pos / TRIVIAL_BLOCK_TOKENS] +
		                (size_t)(pos % TRIVIAL_BLOCK_TOKENS) * TRIVIAL_SLOT_BYTES;
		hash = (hash ^ tokens[i]) * 0x100000001b3ull;
		memcpy(slot, &tokens[i], 4);
		memcpy(slot + 4, &pos, 4);
		memcpy(slot + 8, &hash, 8);
	}
	return hash;
}

int trivial_check_slot(const uint8_t *block, uint32_t pos, uint32_t token)
{
	const uint8_t *slot = block + (size_t)(pos % TRIVIAL_BLOCK_TOKENS) * TRIVIAL_SLOT_BYTES;
	uint32_t t, p;
	memcpy(&t, slot, 4);
	memcpy(&p, slot + 4, 4);
	return t == token && p == pos ? 0 : -1;
}

uint32_t trivial_first_token(const uint32_t *tokens, uint32_t n)
{
	uint64_t s = n;
	for (uint32_t i = 0; i < n; i++)
		s = s * 31 + tokens[i];
	return (uint32_t)(s % TRIVIAL_VOCAB);
}

uint32_t trivial_next_token(uint32_t prev, uint32_t pos)
{
	return (uint32_t)(((uint64_t)prev * 7 + (uint64_t)pos * 13 + 1) % TRIVIAL_VOCAB);
}
