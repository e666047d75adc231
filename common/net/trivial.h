/* The "trivial" engine shared by tandem-prefill and tandem-decode when configured with
 * `engine: "trivial"`: no model, deterministic KV bytes and tokens, so the serving plane (router,
 * control protocol, UCX transfer, batching) can be tested and benchmarked without model compute.
 * Used only where a configuration asks for it. Prefill and decode both follow these rules, so
 * decode can check that the KV it received is the KV of the prompt it was told about. */
#ifndef TANDEM_NET_TRIVIAL_H
#define TANDEM_NET_TRIVIAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/net/msg.h"

#define TRIVIAL_VOCAB 1000
#define TRIVIAL_BLOCK_TOKENS 64
#define TRIVIAL_SLOT_BYTES 16 /* per token: u32 id, u32 position, u64 running hash */
#define TRIVIAL_BLOCK_BYTES (TRIVIAL_BLOCK_TOKENS * TRIVIAL_SLOT_BYTES)

void trivial_layout(struct msg_kv_layout *l);
/* Writes the KV slots of tokens[0..n) at positions start_pos.. into the block memory. The
 * running hash chains over all earlier positions, so it takes the hash before start_pos. */
uint64_t trivial_write_kv(uint8_t *const *blocks, const uint32_t *tokens, uint32_t n, uint32_t start_pos,
                          uint64_t hash);
/* Reads back position pos: 0 if the slot holds (token, pos), else -1. */
int trivial_check_slot(const uint8_t *block, uint32_t pos, uint32_t token);
uint32_t trivial_first_token(const uint32_t *tokens, uint32_t n);
uint32_t trivial_next_token(uint32_t prev, uint32_t pos);

#endif
