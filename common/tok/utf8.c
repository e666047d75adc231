/* UTF-8 validation helpers and the GPT-2 byte-level alphabet (each of the 256 byte values is
 * written as one printable code point so that BPE vocabularies can be plain strings). Used by
 * vocab loading (initial symbols, decoded bytes), encode (input check) and the stream decoder. */
#include "common/tok/tok_internal.h"

int tok_utf8_seq(const uint8_t *s, size_t n)
{
	uint8_t b0 = s[0];
	int need;
	uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
	if (b0 < 0x80)
		return 1;
	if (b0 < 0xC2)
		return -1; /* stray continuation byte, or overlong C0/C1 lead */
	if (b0 < 0xE0) {
		need = 2;
	} else if (b0 < 0xF0) {
		need = 3;
		if (b0 == 0xE0)
			lo = 0xA0; /* overlong */
		else if (b0 == 0xED)
			hi = 0x9F; /* surrogates */
	} else if (b0 < 0xF5) {
		need = 4;
		if (b0 == 0xF0)
			lo = 0x90; /* overlong */
		else if (b0 == 0xF4)
			hi = 0x8F; /* above U+10FFFF */
	} else {
		return -1;
	}
	for (int i = 1; i < need; i++) {
		if ((size_t)i >= n)
			return 0;
		uint8_t c = s[i];
		uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
		if (c < l || c > h)
			return -i;
	}
	return need;
}

size_t tok_utf8_check(const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0;
	while (i < len) {
		if (u[i] < 0x80) {
			i++;
			continue;
		}
		int k = tok_utf8_seq(u + i, len - i);
		if (k <= 0)
			return i;
		i += (size_t)k;
	}
	return len;
}

/* The printable bytes keep their own code point; the other 68 bytes (controls, space, DEL, NBSP,
 * soft hyphen, ...) get U+0100 upwards, in byte order. */
static bool byte_is_printable(unsigned b)
{
	return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
	if (byte_is_printable(b))
		return b;
	uint32_t n = 0;
	for (unsigned c = 0; c < b; c++)
		if (!byte_is_printable(c))
			n++;
	return 256 + n;
}

int tok_cp_to_byte(uint32_t cp)
{
	if (cp < 256)
		return byte_is_printable(cp) ? (int)cp : -1;
	if (cp >= 256 + 68)
		return -1;
	uint32_t n = cp - 256;
	for (unsigned c = 0; c < 256; c++)
		if (!byte_is_printable(c) && n-- == 0)
			return (int)c;
	return -1;
}
