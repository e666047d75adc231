/* Dispatch for the quantized-row functions of kernels.h: finds the type's row functions (in
 * quant_float.c, quant_legacy.c, quant_k.c, quant_iq.c, quant_iqg.c), checks the arguments, and
 * provides the generic scalar reference dot (dequantize one block with the spec-literal decoder, then
 * multiply and accumulate in fp32, in element order). Wrong arguments are caller bugs, not input errors: the
 * GGUF reader validates types and sizes before any kernel runs, so here they abort. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/quant_impl.h"

static const struct quant_ops *const ops_table[KT_COUNT] = {
    [KT_F32] = &quant_ops_f32,         [KT_F16] = &quant_ops_f16,       [KT_BF16] = &quant_ops_bf16,
    [KT_Q4_0] = &quant_ops_q4_0,       [KT_Q4_1] = &quant_ops_q4_1,     [KT_Q5_0] = &quant_ops_q5_0,
    [KT_Q5_1] = &quant_ops_q5_1,       [KT_Q8_0] = &quant_ops_q8_0,     [KT_IQ4_NL] = &quant_ops_iq4_nl,
    [KT_Q2_K] = &quant_ops_q2_k,       [KT_Q3_K] = &quant_ops_q3_k,     [KT_Q4_K] = &quant_ops_q4_k,
    [KT_Q5_K] = &quant_ops_q5_k,       [KT_Q6_K] = &quant_ops_q6_k,     [KT_IQ4_XS] = &quant_ops_iq4_xs,
    [KT_IQ2_XXS] = &quant_ops_iq2_xxs, [KT_IQ2_XS] = &quant_ops_iq2_xs, [KT_IQ2_S] = &quant_ops_iq2_s,
    [KT_IQ3_XXS] = &quant_ops_iq3_xxs, [KT_IQ3_S] = &quant_ops_iq3_s,   [KT_IQ1_S] = &quant_ops_iq1_s,
    [KT_IQ1_M] = &quant_ops_iq1_m,
};

/* Returns the ops of a compute type; aborts with a message naming the entry point on a type
 * without CPU kernels or an n that is not a non-negative multiple of the block size. */
static const struct quant_ops *ops_for(int type, int64_t n, const char *what)
{
	const struct ktype_info *t = ktype_get(type);

	if (!t || !t->compute || !ops_table[type]) {
		fprintf(stderr, "%s: type %s has no CPU kernels\n", what, ktype_name(type));
		abort();
	}
	if (n < 0 || n % t->blck != 0) {
		fprintf(stderr, "%s: n = %lld is not a multiple of the %s block size %d\n", what,
		        (long long)n, t->name, t->blck);
		abort();
	}
	return ops_table[type];
}

void kcpu_dequant_row(int type, const void *src, float *dst, int64_t n)
{
	const struct quant_ops *o = ops_for(type, n, "kcpu_dequant_row");

	if (n > 0)
		(o->dequant ? o->dequant : o->dequant_ref)(src, dst, n);
}

void kcpu_dequant_row_ref(int type, const void *src, float *dst, int64_t n)
{
	const struct quant_ops *o = ops_for(type, n, "kcpu_dequant_row_ref");

	if (n > 0)
		o->dequant_ref(src, dst, n);
}

float kcpu_dot_row_ref(int type, const void *row, const float *x, int64_t n)
{
	const struct quant_ops *o = ops_for(type, n, "kcpu_dot_row_ref");
	const struct ktype_info *t = ktype_get(type);
	const uint8_t *src = row;
	float buf[256];
	float sum = 0.0f;

	/* whole blocks at a time so a 256-element buffer suffices (F32/F16/BF16 have blck 1) */
	int64_t step = t->blck == 1 ? 256 : t->blck;
	for (int64_t i = 0; i < n; i += step) {
		int64_t m = n - i < step ? n - i : step;
		o->dequant_ref(src + (size_t)(i / t->blck) * (size_t)t->bytes, buf, m);
		for (int64_t j = 0; j < m; j++)
			sum += buf[j] * x[i + j];
	}
	return sum;
}

float kcpu_dot_row(int type, const void *row, const float *x, int64_t n)
{
	const struct quant_ops *o = ops_for(type, n, "kcpu_dot_row");

	if (n == 0)
		return 0.0f;
	if (o->dot)
		return o->dot(row, x, n);
	return kcpu_dot_row_ref(type, row, x, n);
}

void kcpu_quantize_row(int type, const float *src, void *dst, int64_t n)
{
	const struct quant_ops *o = ops_for(type, n, "kcpu_quantize_row");

	if (n > 0)
		o->quantize(src, dst, n);
}

/* Resolved once per matmul so the per-row calls skip the dispatch and argument checks (the
 * caller checked type and n); rows of a few dozen elements (per-head attn_k_b) make those
 * checks a visible share otherwise. */
static float dot_generic_ref(int type, const void *row, const float *x, int64_t n)
{
	return kcpu_dot_row_ref(type, row, x, n);
}

quant_dot_fn quant_dot_for(int type, quant_dot_ref_fn *ref)
{
	const struct quant_ops *o = ops_for(type, 0, "quant_dot_for");

	*ref = o->dot ? NULL : dot_generic_ref;
	return o->dot;
}

quant_dequant_fn quant_dequant_for(int type)
{
	const struct quant_ops *o = ops_for(type, 0, "quant_dequant_for");

	return o->dequant ? o->dequant : o->dequant_ref;
}

quant_dot_xsum_fn quant_dot_xsum_for(int type)
{
	return ops_for(type, 0, "quant_dot_xsum_for")->dot_xsum;
}
