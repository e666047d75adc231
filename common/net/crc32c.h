/* CRC32C (Castagnoli) of KV blocks: the optional per-block checksums prefill computes before the
 * transfer and decode verifies after it (catches corruption in tests and when asked for). */
#ifndef TANDEM_NET_CRC32C_H
#define TANDEM_NET_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c(0, "123456789", 9) == 0xe3069283 */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

#endif
