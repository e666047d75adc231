/* CRC32C with the SSE4.2 crc32 instruction (8 bytes per step; the build targets AVX2 machines,
 * which all have SSE4.2), and a bitwise fallback for other compilers/targets. */
#include "common/net/crc32c.h"

#include <string.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t c = ~crc;
	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
		p += 8, len -= 8;
	}
	uint32_t c32 = (uint32_t)c;
	while (len--)
		c32 = _mm_crc32_u8(c32, *p++);
	return ~c32;
}
#else
uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	crc = ~crc;
	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
	}
	return ~crc;
}
#endif
