/* Piece dequantizers (quant_piece.cuh's kq<T> contract) of the codebook types IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (MODEL-SPEC.md §5.3), the types low-bit GLM-5 / DeepSeek GGUFs put on
 * their routed experts. A 256-element block has eight 32-element sub-blocks; piece p is half p & 1 of
 * sub-block (p & 15) >> 1, i.e. two groups of 8 elements, each an index into a codebook plus signs, all
 * under one scale, so w_j = a * v_j exactly as kernels/cpu/quant_iqg.c computes it (v: the codebook
 * value with its sign, or IQ1's value plus its +-1/8 shift; a: the scale, with the CPU's float
 * operations; b = 0). The codebooks (kernels/iq_grids.inc, ggml's) sit in global memory and are read
 * through the read-only cache: a lane looks up two 8-byte (or four 4-byte) entries a piece, with
 * indices that differ between lanes, which __constant__ memory would serialize. The 7-bit sign codes
 * carry their 8th bit as the parity of the other seven (ggml's ksigns table), computed here. */
#ifndef TANDEM_KERNELS_CUDA_QUANT_PIECE_IQ_CUH
#define TANDEM_KERNELS_CUDA_QUANT_PIECE_IQ_CUH

#include "kernels/iq_grids.inc"

static __device__ const uint64_t kc_grid_iq2xxs[256] = {IQ_GRID_IQ2XXS};
static __device__ const uint64_t kc_grid_iq2xs[512] = {IQ_GRID_IQ2XS};
static __device__ const uint64_t kc_grid_iq2s[1024] = {IQ_GRID_IQ2S};
static __device__ const uint32_t kc_grid_iq3xxs[256] = {IQ_GRID_IQ3XXS};
static __device__ const uint32_t kc_grid_iq3s[512] = {IQ_GRID_IQ3S};
static __device__ const uint64_t kc_grid_iq1s[2048] = {IQ_GRID_IQ1S};

/* entry i of an 8-byte codebook as two words */
__device__ __forceinline__ uint2 kc_grid8(const uint64_t *tab, uint32_t i)
{
	return __ldg((const uint2 *)(tab + i));
}

/* the 8 sign bits of a 7-bit sign code (bit 7: the parity of bits 0..6) */
__device__ __forceinline__ uint32_t kc_ksigns(uint32_t s)
{
	return s | ((uint32_t)(__popc(s) & 1) << 7);
}

/* 8 values: the unsigned bytes of lo, hi, negated where bit j of m is set */
__device__ __forceinline__ void kc_iq_put8(float *v, uint32_t lo, uint32_t hi, uint32_t m)
{
#pragma unroll
	for (int j = 0; j < 8; j++) {
		const float g = kc_u2f(kc_byte(j < 4 ? lo : hi, j & 3));
		v[j] = __uint_as_float(__float_as_uint(g) ^ (((m >> j) & 1u) << 31));
	}
}

/* 8 IQ1 values: the int8 bytes of lo, hi plus delta */
__device__ __forceinline__ void kc_iq1_put8(float *v, uint2 e, float delta)
{
#pragma unroll
	for (int j = 0; j < 8; j++)
		v[j] = kc_s8(j < 4 ? e.x : e.y, j & 3) + delta;
}

/* 16-bit word holding byte i of a 2-byte-aligned array, and that byte */
__device__ __forceinline__ uint32_t kc_byte_a2(const uint8_t *p, int i)
{
	return (kc_ld16(p + (i & ~1)) >> (8 * (i & 1))) & 0xffu;
}

template <> struct kq<KT_IQ2_XXS> { /* 66 B: d, qs[32] u16: per 32, 4 index bytes + u32 scale / signs */
	static constexpr int QK = 256, BYTES = 66;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t w[2];
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 66 * (p >> 4);
		r.d = kc_ld16(b);
		kc_ldw_a2<2>(b + 2 + 8 * ((p & 15) >> 1), r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const int l = 2 * h + g;
			const uint2 e = kc_grid8(kc_grid_iq2xxs, kc_byte(r.w[0], l));
			kc_iq_put8(v + 8 * g, e.x, e.y, kc_ksigns((r.w[1] >> (7 * l)) & 127u));
		}
		a = kc_h2f(r.d) * (0.5f + kc_u2f(r.w[1] >> 28)) * 0.25f, b = 0.0f;
	}
};

template <> struct kq<KT_IQ2_XS> { /* 74 B: d, qs[32] u16 (9-bit index, 7-bit signs), scales[8] */
	static constexpr int QK = 256, BYTES = 74;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t q; /* the piece's two 16-bit codes */
		uint16_t d;
		uint8_t sc;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 74 * (p >> 4);
		const int ib = (int)((p & 15) >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<1>(b + 2 + 8 * ib + 4 * (int)(p & 1), &r.q);
		r.sc = (uint8_t)kc_byte_a2(b + 66, ib);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const uint32_t q = (r.q >> (16 * g)) & 0xffffu;
			const uint2 e = kc_grid8(kc_grid_iq2xs, q & 511u);
			kc_iq_put8(v + 8 * g, e.x, e.y, kc_ksigns(q >> 9));
		}
		a = kc_h2f(r.d) * (0.5f + kc_u2f((r.sc >> (4 * h)) & 15u)) * 0.25f, b = 0.0f;
	}
};

template <> struct kq<KT_IQ2_S> { /* 82 B: d, qs[32] index bytes, signs[32], qh[8], scales[8] */
	static constexpr int QK = 256, BYTES = 82;
	static constexpr bool HAS_B = false;
	struct raw {
		uint16_t d, qs, sg; /* the piece's two index bytes and two sign bytes */
		uint8_t qh, sc;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 82 * (p >> 4);
		const int ib = (int)((p & 15) >> 1), o = 4 * ib + 2 * (int)(p & 1);
		r.d = kc_ld16(b);
		r.qs = kc_ld16(b + 2 + o);
		r.sg = kc_ld16(b + 34 + o);
		r.qh = (uint8_t)kc_byte_a2(b + 66, ib);
		r.sc = (uint8_t)kc_byte_a2(b + 74, ib);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const int l = 2 * h + g;
			const uint32_t i =
			    ((r.qs >> (8 * g)) & 0xffu) | (((uint32_t)r.qh << (8 - 2 * l)) & 0x300u);
			const uint2 e = kc_grid8(kc_grid_iq2s, i);
			kc_iq_put8(v + 8 * g, e.x, e.y, (r.sg >> (8 * g)) & 0xffu);
		}
		a = kc_h2f(r.d) * (0.5f + kc_u2f((r.sc >> (4 * h)) & 15u)) * 0.25f, b = 0.0f;
	}
};

template <> struct kq<KT_IQ3_XXS> { /* 98 B: d, qs[64] index bytes, 8 u32 of scale / signs */
	static constexpr int QK = 256, BYTES = 98;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t qs, aux; /* the piece's four index bytes; its sub-block's word */
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 98 * (p >> 4);
		const int ib = (int)((p & 15) >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<1>(b + 2 + 8 * ib + 4 * (int)(p & 1), &r.qs);
		kc_ldw_a2<1>(b + 66 + 4 * ib, &r.aux);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const int l = 2 * h + g;
			const uint32_t e1 = __ldg(kc_grid_iq3xxs + kc_byte(r.qs, 2 * g));
			const uint32_t e2 = __ldg(kc_grid_iq3xxs + kc_byte(r.qs, 2 * g + 1));
			kc_iq_put8(v + 8 * g, e1, e2, kc_ksigns((r.aux >> (7 * l)) & 127u));
		}
		a = kc_h2f(r.d) * (0.5f + kc_u2f(r.aux >> 28)) * 0.5f, b = 0.0f;
	}
};

template <> struct kq<KT_IQ3_S> { /* 110 B: d, qs[64] index bytes, qh[8], signs[32], scales[4] */
	static constexpr int QK = 256, BYTES = 110;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t qs; /* the piece's four index bytes */
		uint16_t d, sg;
		uint8_t qh, sc;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 110 * (p >> 4);
		const int ib = (int)((p & 15) >> 1), h = (int)(p & 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<1>(b + 2 + 8 * ib + 4 * h, &r.qs);
		r.qh = (uint8_t)kc_byte_a2(b + 66, ib);
		r.sg = kc_ld16(b + 74 + 4 * ib + 2 * h);
		r.sc = (uint8_t)kc_byte_a2(b + 106, ib >> 1);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int ib = (int)((p & 15) >> 1), h = (int)(p & 1);
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const int l = 2 * h + g;
			const uint32_t i1 = kc_byte(r.qs, 2 * g) | (((uint32_t)r.qh << (8 - 2 * l)) & 256u);
			const uint32_t i2 =
			    kc_byte(r.qs, 2 * g + 1) | (((uint32_t)r.qh << (7 - 2 * l)) & 256u);
			kc_iq_put8(v + 8 * g, __ldg(kc_grid_iq3s + i1), __ldg(kc_grid_iq3s + i2),
			           (r.sg >> (8 * g)) & 0xffu);
		}
		a = kc_h2f(r.d) * kc_u2f(1u + 2u * ((r.sc >> (4 * (ib & 1))) & 15u)), b = 0.0f;
	}
};

template <>
struct kq<KT_IQ1_S> { /* 50 B: d, qs[32] index bytes, qh[8] u16 (3 index bits a group,
	                 3-bit scale, delta sign) */
	static constexpr int QK = 256, BYTES = 50;
	static constexpr bool HAS_B = false;
	struct raw {
		uint16_t d, qs, qh;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 50 * (p >> 4);
		const int ib = (int)((p & 15) >> 1);
		r.d = kc_ld16(b);
		r.qs = kc_ld16(b + 2 + 4 * ib + 2 * (int)(p & 1));
		r.qh = kc_ld16(b + 34 + 2 * ib);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
		const uint32_t qh = r.qh;
		const float delta = (qh & 0x8000u) ? -0.125f : 0.125f;
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const int l = 2 * h + g;
			const uint32_t i = ((r.qs >> (8 * g)) & 0xffu) | (((qh >> (3 * l)) & 7u) << 8);
			kc_iq1_put8(v + 8 * g, kc_grid8(kc_grid_iq1s, i), delta);
		}
		a = kc_h2f(r.d) * kc_u2f(2u * ((qh >> 12) & 7u) + 1u), b = 0.0f;
	}
};

template <>
struct kq<KT_IQ1_M> { /* 56 B: qs[32] index bytes, qh[16] (3 index bits + delta sign a
	                 group), 4 u16 scale words (3-bit scales; the fp16 super-scale in
	                 their top nibbles) */
	static constexpr int QK = 256, BYTES = 56;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t sc[2];
		uint16_t qs;
		uint8_t qh;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 56 * (p >> 4);
		const int ib = (int)((p & 15) >> 1), h = (int)(p & 1);
		kc_ldw_a4<2>(b + 48, r.sc);
		r.qs = kc_ld16(b + 4 * ib + 2 * h);
		r.qh = (uint8_t)kc_byte_a2(b + 32, 2 * ib + h);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int ib = (int)((p & 15) >> 1), h = (int)(p & 1);
		const uint32_t s0 = r.sc[0] & 0xffffu, s1 = r.sc[0] >> 16, s2 = r.sc[1] & 0xffffu,
		               s3 = r.sc[1] >> 16;
		const uint32_t du =
		    (s0 >> 12) | ((s1 >> 8) & 0x00f0u) | ((s2 >> 4) & 0x0f00u) | (s3 & 0xf000u);
		const int k = ib >> 1; /* scale word k: words 0, 1 in sc[0], 2, 3 in sc[1] */
		const uint32_t s = ((k >> 1 ? r.sc[1] : r.sc[0]) >> (16 * (k & 1))) & 0xffffu;
#pragma unroll
		for (int g = 0; g < 2; g++) {
			const uint32_t q = (uint32_t)r.qh >> (4 * g);
			const uint32_t i = ((r.qs >> (8 * g)) & 0xffu) | ((q & 7u) << 8);
			kc_iq1_put8(v + 8 * g, kc_grid8(kc_grid_iq1s, i), (q & 8u) ? -0.125f : 0.125f);
		}
		a = kc_h2f((uint16_t)du) * kc_u2f(2u * ((s >> (6 * (ib & 1) + 3 * h)) & 7u) + 1u), b = 0.0f;
	}
};

#endif
