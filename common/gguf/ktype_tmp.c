/* TEMPORARY stand-in for kernels/cpu/ktype.c (owned by the `quant` helper) so the GGUF reader
 * builds before that branch is merged. Delete this file when merging `quant`. Sizes are ggml's
 * block sizes (MODEL-SPEC.md §4.1, §5). */
#include <stdio.h>

#include "kernels/kernels.h"

static const struct ktype_info infos[KT_COUNT] = {
	[KT_F32] = {"F32", 1, 4, true},	       [KT_F16] = {"F16", 1, 2, true},
	[KT_Q4_0] = {"Q4_0", 32, 18, true},    [KT_Q4_1] = {"Q4_1", 32, 20, true},
	[KT_Q5_0] = {"Q5_0", 32, 22, true},    [KT_Q5_1] = {"Q5_1", 32, 24, true},
	[KT_Q8_0] = {"Q8_0", 32, 34, true},    [KT_Q8_1] = {"Q8_1", 32, 36, false},
	[KT_Q2_K] = {"Q2_K", 256, 84, true},   [KT_Q3_K] = {"Q3_K", 256, 110, true},
	[KT_Q4_K] = {"Q4_K", 256, 144, true},  [KT_Q5_K] = {"Q5_K", 256, 176, true},
	[KT_Q6_K] = {"Q6_K", 256, 210, true},  [KT_Q8_K] = {"Q8_K", 256, 292, false},
	[KT_IQ2_XXS] = {"IQ2_XXS", 256, 66, true}, [KT_IQ2_XS] = {"IQ2_XS", 256, 74, true},
	[KT_IQ3_XXS] = {"IQ3_XXS", 256, 98, true}, [KT_IQ1_S] = {"IQ1_S", 256, 50, true},
	[KT_IQ4_NL] = {"IQ4_NL", 32, 18, true}, [KT_IQ3_S] = {"IQ3_S", 256, 110, true},
	[KT_IQ2_S] = {"IQ2_S", 256, 82, true}, [KT_IQ4_XS] = {"IQ4_XS", 256, 136, true},
	[KT_I8] = {"I8", 1, 1, false},	       [KT_I16] = {"I16", 1, 2, false},
	[KT_I32] = {"I32", 1, 4, false},       [KT_I64] = {"I64", 1, 8, false},
	[KT_F64] = {"F64", 1, 8, false},       [KT_IQ1_M] = {"IQ1_M", 256, 56, true},
	[KT_BF16] = {"BF16", 1, 2, true},      [KT_TQ1_0] = {"TQ1_0", 256, 54, false},
	[KT_TQ2_0] = {"TQ2_0", 256, 66, false}, [KT_MXFP4] = {"MXFP4", 32, 17, false},
};

const struct ktype_info *ktype_get(int type)
{
	if (type < 0 || type >= KT_COUNT || !infos[type].name)
		return NULL;
	return &infos[type];
}

const char *ktype_name(int type)
{
	static _Thread_local char buf[32];
	const struct ktype_info *k = ktype_get(type);
	if (k)
		return k->name;
	snprintf(buf, sizeof(buf), "type %d", type);
	return buf;
}

bool ktype_row_bytes(int type, int64_t n, size_t *out)
{
	const struct ktype_info *k = ktype_get(type);
	if (!k || n < 0 || n % k->blck)
		return false;
	int64_t blocks = n / k->blck;
	if (blocks > INT64_MAX / k->bytes)
		return false;
	*out = (size_t)(blocks * k->bytes);
	return true;
}
