/* The ggml type table: block size and bytes per block for every type id GGUF files may carry
 * (MODEL-SPEC.md §4.1, sizes from ggml-common.h), and whether tandem computes with it. The GGUF
 * reader uses it to validate tensor byte sizes even for types tandem cannot multiply; the
 * quant_*.c kernels implement the types marked compute = true. */
#include <stdio.h>

#include "kernels/kernels.h"

#define T(id, nm, blk, byt, comp) [id] = {.name = nm, .blck = blk, .bytes = byt, .compute = comp}

/* Sizes of the 256-element codebook types are the packed struct sizes of ggml's block_* types:
 * IQ2_XXS = fp16 d + 32 u16; IQ2_XS = d + 32 u16 + 8 scales; IQ2_S = d + 64 qs + 8 qh + 8 scales;
 * IQ3_XXS = d + 96; IQ3_S = d + 64 + 8 + 32 + 4; IQ1_S = d + 32 + 8 u16; IQ1_M = 32 + 16 + 8;
 * Q8_K = float d + 256 int8 + 16 int16 sums; TQ1_0 = 48 qs + 4 qh + d; TQ2_0 = 64 qs + d;
 * MXFP4 (32 elements) = e8m0 exponent byte + 16 nibble bytes. Ids 4, 5, 31-33, 36-38 were
 * removed from ggml and stay unassigned (NULL). */
static const struct ktype_info types[KT_COUNT] = {
    T(KT_F32, "F32", 1, 4, true),
    T(KT_F16, "F16", 1, 2, true),
    T(KT_Q4_0, "Q4_0", 32, 18, true),
    T(KT_Q4_1, "Q4_1", 32, 20, true),
    T(KT_Q5_0, "Q5_0", 32, 22, true),
    T(KT_Q5_1, "Q5_1", 32, 24, true),
    T(KT_Q8_0, "Q8_0", 32, 34, true),
    T(KT_Q8_1, "Q8_1", 32, 36, false),
    T(KT_Q2_K, "Q2_K", 256, 84, true),
    T(KT_Q3_K, "Q3_K", 256, 110, true),
    T(KT_Q4_K, "Q4_K", 256, 144, true),
    T(KT_Q5_K, "Q5_K", 256, 176, true),
    T(KT_Q6_K, "Q6_K", 256, 210, true),
    T(KT_Q8_K, "Q8_K", 256, 292, false),
    T(KT_IQ2_XXS, "IQ2_XXS", 256, 66, true),
    T(KT_IQ2_XS, "IQ2_XS", 256, 74, true),
    T(KT_IQ3_XXS, "IQ3_XXS", 256, 98, true),
    T(KT_IQ1_S, "IQ1_S", 256, 50, true),
    T(KT_IQ4_NL, "IQ4_NL", 32, 18, true),
    T(KT_IQ3_S, "IQ3_S", 256, 110, true),
    T(KT_IQ2_S, "IQ2_S", 256, 82, true),
    T(KT_IQ4_XS, "IQ4_XS", 256, 136, true),
    T(KT_I8, "I8", 1, 1, false),
    T(KT_I16, "I16", 1, 2, false),
    T(KT_I32, "I32", 1, 4, false),
    T(KT_I64, "I64", 1, 8, false),
    T(KT_F64, "F64", 1, 8, false),
    T(KT_IQ1_M, "IQ1_M", 256, 56, true),
    T(KT_BF16, "BF16", 1, 2, true),
    T(KT_TQ1_0, "TQ1_0", 256, 54, false),
    T(KT_TQ2_0, "TQ2_0", 256, 66, false),
    T(KT_MXFP4, "MXFP4", 32, 17, false),
};

#undef T

const struct ktype_info *ktype_get(int type)
{
	if (type < 0 || type >= KT_COUNT || types[type].name == NULL)
		return NULL;
	return &types[type];
}

const char *ktype_name(int type)
{
	/* constant strings for the unassigned in-range ids, so the pointer stays valid and no two
	 * threads ever write the same buffer; ids outside the table use a per-thread buffer (only
	 * ever printed in an error message) */
	static const char *const unassigned[KT_COUNT] = {
	    [4] = "type 4",   [5] = "type 5",   [31] = "type 31", [32] = "type 32",
	    [33] = "type 33", [36] = "type 36", [37] = "type 37", [38] = "type 38",
	};
	static _Thread_local char other[24];
	const struct ktype_info *t = ktype_get(type);

	if (t)
		return t->name;
	if (type >= 0 && type < KT_COUNT && unassigned[type])
		return unassigned[type];
	snprintf(other, sizeof other, "type %d", type);
	return other;
}

bool ktype_row_bytes(int type, int64_t n, size_t *out)
{
	const struct ktype_info *t = ktype_get(type);

	if (!t || n < 0 || n % t->blck != 0)
		return false;
	uint64_t blocks = (uint64_t)(n / t->blck);
	if (blocks > SIZE_MAX / (uint64_t)t->bytes)
		return false;
	*out = (size_t)blocks * (size_t)t->bytes;
	return true;
}
