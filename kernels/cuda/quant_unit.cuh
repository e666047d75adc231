/* Dequantization of one 32-element "unit" of a weight row, per GGUF type, in registers.
 *
 * A unit is elements [32u, 32u + 32) of a row; every block type tandem computes with is a whole
 * number of units (32-element blocks, or 256-element super-blocks made of 8 sub-blocks of 32), so
 * the GEMV gives one unit to one lane at a time and the dequantizer for prefill writes one unit per
 * thread. kq<T>::unit(row, u, v) fills v[j] = element 32u + j exactly as kcpu_dequant_row does
 * (same products d*scale*q - dmin*min in fp32; MODEL-SPEC.md §5). Rows are in the GGUF block
 * layout; alignment of each type's fields is what the block size allows (Q8_0, Q6_K, ... are
 * 2-byte aligned, so they are read as 32-bit words with a funnel shift, kc_ldw_a2). */
#ifndef TANDEM_KERNELS_CUDA_QUANT_UNIT_CUH
#define TANDEM_KERNELS_CUDA_QUANT_UNIT_CUH

#include "kernels/cuda/cuda_common.cuh"

template <int T> struct kq;

/* int8 byte i of w as float */
__device__ __forceinline__ float kc_s8(uint32_t w, int i)
{
	return (float)(int8_t)(uint8_t)(w >> (8 * i));
}

/* IQ4_NL / IQ4_XS codebook lookup without memory: the 16 int8 values live in four 32-bit
 * constants and __byte_perm picks one (selector 0..7 within a half). */
__device__ __forceinline__ float kc_iq4(uint32_t nib)
{
	/* {-127,-104,-83,-65,-49,-35,-22,-10} and {1,13,25,38,53,69,89,113} as little-endian bytes */
	const uint32_t lo_a = 0xbfad9881u, lo_b = 0xf6eaddcfu;
	const uint32_t hi_a = 0x26190d01u, hi_b = 0x71594535u;
	uint32_t s = nib & 7u;
	uint32_t b = (nib & 8u) ? __byte_perm(hi_a, hi_b, s) : __byte_perm(lo_a, lo_b, s);
	return (float)(int8_t)(uint8_t)b;
}

template <> struct kq<KT_F32> {
	static constexpr int QK = 1, BYTES = 4;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const float4 *p = (const float4 *)(row + 128 * (size_t)u);
#pragma unroll
		for (int i = 0; i < 8; i++) {
			float4 f = __ldg(p + i);
			v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
		}
	}
};

template <> struct kq<KT_F16> {
	static constexpr int QK = 1, BYTES = 2;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		uint32_t w[16];
		kc_ldw_a16<16>(row + 64 * (size_t)u, w);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			float2 f = __half22float2(*(const __half2 *)&w[i]);
			v[2 * i] = f.x, v[2 * i + 1] = f.y;
		}
	}
};

template <> struct kq<KT_BF16> {
	static constexpr int QK = 1, BYTES = 2;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		uint32_t w[16];
		kc_ldw_a16<16>(row + 64 * (size_t)u, w);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			v[2 * i] = __uint_as_float(w[i] << 16);
			v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
		}
	}
};

template <> struct kq<KT_Q8_0> { /* 34 B: d, qs[32] */
	static constexpr int QK = 32, BYTES = 34;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 34 * (size_t)u;
		uint32_t w[8];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<8>(b + 2, w);
#pragma unroll
		for (int i = 0; i < 32; i++)
			v[i] = d * kc_s8(w[i / 4], i % 4);
	}
};

template <> struct kq<KT_Q4_0> { /* 18 B: d, qs[16] */
	static constexpr int QK = 32, BYTES = 18;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 18 * (size_t)u;
		uint32_t w[4];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<4>(b + 2, w);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[i / 4], i % 4);
			v[i] = d * (float)((int)(q & 15) - 8);
			v[i + 16] = d * (float)((int)(q >> 4) - 8);
		}
	}
};

template <> struct kq<KT_Q4_1> { /* 20 B: d, m, qs[16] */
	static constexpr int QK = 32, BYTES = 20;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 20 * (size_t)u;
		uint32_t w[5];
		kc_ldw_a4<5>(b, w);
		const float d = kc_h2f((uint16_t)w[0]), m = kc_h2f((uint16_t)(w[0] >> 16));
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[1 + i / 4], i % 4);
			v[i] = d * (float)(q & 15) + m;
			v[i + 16] = d * (float)(q >> 4) + m;
		}
	}
};

template <> struct kq<KT_Q5_0> { /* 22 B: d, qh (u32), qs[16] */
	static constexpr int QK = 32, BYTES = 22;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 22 * (size_t)u;
		uint32_t w[5];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<5>(b + 2, w); /* w[0] = qh, w[1..4] = qs */
		const uint32_t qh = w[0];
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[1 + i / 4], i % 4);
			int q0 = (int)((q & 15) | (((qh >> i) & 1) << 4));
			int q1 = (int)((q >> 4) | (((qh >> (i + 16)) & 1) << 4));
			v[i] = d * (float)(q0 - 16);
			v[i + 16] = d * (float)(q1 - 16);
		}
	}
};

template <> struct kq<KT_Q5_1> { /* 24 B: d, m, qh (u32), qs[16] */
	static constexpr int QK = 32, BYTES = 24;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 24 * (size_t)u;
		uint32_t w[6];
		kc_ldw_a4<6>(b, w);
		const float d = kc_h2f((uint16_t)w[0]), m = kc_h2f((uint16_t)(w[0] >> 16));
		const uint32_t qh = w[1];
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[2 + i / 4], i % 4);
			uint32_t q0 = (q & 15) | (((qh >> i) & 1) << 4);
			uint32_t q1 = (q >> 4) | (((qh >> (i + 16)) & 1) << 4);
			v[i] = d * (float)q0 + m;
			v[i + 16] = d * (float)q1 + m;
		}
	}
};

template <> struct kq<KT_IQ4_NL> { /* 18 B: d, qs[16] */
	static constexpr int QK = 32, BYTES = 18;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 18 * (size_t)u;
		uint32_t w[4];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<4>(b + 2, w);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[i / 4], i % 4);
			v[i] = d * kc_iq4(q & 15);
			v[i + 16] = d * kc_iq4(q >> 4);
		}
	}
};

template <> struct kq<KT_Q2_K> { /* 84 B: scales[16], qs[64], d, dmin */
	static constexpr int QK = 256, BYTES = 84;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 84 * (size_t)(u >> 3);
		const int s = u & 7, n = s >> 2, j = s & 3;
		uint32_t w[8];
		kc_ldw_a4<8>(b + 16 + 32 * n, w);
		const uint32_t dd = *(const uint32_t *)(b + 80);
		const float d = kc_h2f((uint16_t)dd), dmin = kc_h2f((uint16_t)(dd >> 16));
		const uint32_t sc2 = kc_ld16(b + 8 * n + 2 * j);
		const float dl0 = d * (float)(sc2 & 15), ml0 = dmin * (float)((sc2 >> 4) & 15);
		const float dl1 = d * (float)((sc2 >> 8) & 15), ml1 = dmin * (float)((sc2 >> 12) & 15);
#pragma unroll
		for (int i = 0; i < 32; i++) {
			float q = (float)((kc_byte(w[i / 4], i % 4) >> (2 * j)) & 3);
			v[i] = i < 16 ? dl0 * q - ml0 : dl1 * q - ml1;
		}
	}
};

/* Q3_K 6-bit signed scale k (0..15) from the 12 packed bytes in sw[0..2] */
__device__ __forceinline__ int kc_q3k_scale(const uint32_t *sw, int k)
{
	uint32_t lo = (kc_byte(sw[(k & 7) >> 2], k & 3) >> (4 * (k >> 3))) & 15;
	uint32_t hi = (kc_byte(sw[2], k & 3) >> (2 * (k >> 2))) & 3;
	return (int)(lo | (hi << 4)) - 32;
}

template <> struct kq<KT_Q3_K> { /* 110 B: hmask[32], qs[64], scales[12], d */
	static constexpr int QK = 256, BYTES = 110;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 110 * (size_t)(u >> 3);
		const int s = u & 7, n = s >> 2, j = s & 3;
		uint32_t hm[8], qs[8], sw[3];
		kc_ldw_a2<8>(b, hm);
		kc_ldw_a2<8>(b + 32 + 32 * n, qs);
		kc_ldw_a2<3>(b + 96, sw);
		const float d = kc_h2f(kc_ld16(b + 108));
		const float dl0 = d * (float)kc_q3k_scale(sw, 8 * n + 2 * j);
		const float dl1 = d * (float)kc_q3k_scale(sw, 8 * n + 2 * j + 1);
		const int hb = 4 * n + j;
#pragma unroll
		for (int i = 0; i < 32; i++) {
			int q2 = (int)((kc_byte(qs[i / 4], i % 4) >> (2 * j)) & 3);
			int h = (int)((kc_byte(hm[i / 4], i % 4) >> hb) & 1);
			float q = (float)(q2 - (h ? 0 : 4));
			v[i] = (i < 16 ? dl0 : dl1) * q;
		}
	}
};

/* Q4_K / Q5_K 6-bit scale and min of sub-block sb from the 12 packed bytes in sw[0..2] */
__device__ __forceinline__ void kc_k4_scale_min(const uint32_t *sw, int sb, float *sc, float *mn)
{
	if (sb < 4) {
		*sc = (float)(kc_byte(sw[0], sb) & 63);
		*mn = (float)(kc_byte(sw[1], sb) & 63);
	} else {
		*sc = (float)((kc_byte(sw[2], sb - 4) & 15) | ((kc_byte(sw[0], sb - 4) >> 6) << 4));
		*mn = (float)((kc_byte(sw[2], sb - 4) >> 4) | ((kc_byte(sw[1], sb - 4) >> 6) << 4));
	}
}

template <> struct kq<KT_Q4_K> { /* 144 B: d, dmin, scales[12], qs[128] */
	static constexpr int QK = 256, BYTES = 144;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 144 * (size_t)(u >> 3);
		const int sb = u & 7, c = sb >> 1;
		uint32_t hd[4], w[8];
		kc_ldw_a16<4>(b, hd); /* d, dmin, scales[12] */
		kc_ldw_a16<8>(b + 16 + 32 * c, w);
		const float d = kc_h2f((uint16_t)hd[0]), dmin = kc_h2f((uint16_t)(hd[0] >> 16));
		float sc, mn;
		kc_k4_scale_min(hd + 1, sb, &sc, &mn);
		const float dl = d * sc, ml = dmin * mn;
		const int sh = 4 * (sb & 1);
#pragma unroll
		for (int i = 0; i < 32; i++)
			v[i] = dl * (float)((kc_byte(w[i / 4], i % 4) >> sh) & 15) - ml;
	}
};

template <> struct kq<KT_Q5_K> { /* 176 B: d, dmin, scales[12], qh[32], qs[128] */
	static constexpr int QK = 256, BYTES = 176;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 176 * (size_t)(u >> 3);
		const int sb = u & 7, c = sb >> 1;
		uint32_t hd[4], qh[8], w[8];
		kc_ldw_a16<4>(b, hd);
		kc_ldw_a16<8>(b + 16, qh);
		kc_ldw_a16<8>(b + 48 + 32 * c, w);
		const float d = kc_h2f((uint16_t)hd[0]), dmin = kc_h2f((uint16_t)(hd[0] >> 16));
		float sc, mn;
		kc_k4_scale_min(hd + 1, sb, &sc, &mn);
		const float dl = d * sc, ml = dmin * mn;
		const int sh = 4 * (sb & 1);
#pragma unroll
		for (int i = 0; i < 32; i++) {
			uint32_t q = ((kc_byte(w[i / 4], i % 4) >> sh) & 15) |
				     (((kc_byte(qh[i / 4], i % 4) >> sb) & 1) << 4);
			v[i] = dl * (float)q - ml;
		}
	}
};

template <> struct kq<KT_Q6_K> { /* 210 B: ql[128], qh[64], scales[16] (int8), d */
	static constexpr int QK = 256, BYTES = 210;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 210 * (size_t)(u >> 3);
		const int s = u & 7, n = s >> 2, k = s & 3;
		uint32_t ql[8], qh[8];
		kc_ldw_a2<8>(b + 64 * n + 32 * (k & 1), ql);
		kc_ldw_a2<8>(b + 128 + 32 * n, qh);
		const uint32_t sc2 = kc_ld16(b + 192 + 8 * n + 2 * k);
		const float d = kc_h2f(kc_ld16(b + 208));
		const float dl0 = d * (float)(int8_t)(uint8_t)sc2, dl1 = d * (float)(int8_t)(uint8_t)(sc2 >> 8);
		const int shl = 4 * (k >> 1), shh = 2 * k;
#pragma unroll
		for (int i = 0; i < 32; i++) {
			int q = (int)(((kc_byte(ql[i / 4], i % 4) >> shl) & 15) |
				      (((kc_byte(qh[i / 4], i % 4) >> shh) & 3) << 4));
			v[i] = (i < 16 ? dl0 : dl1) * (float)(q - 32);
		}
	}
};

template <> struct kq<KT_IQ4_XS> { /* 136 B: d, scales_h (u16), scales_l[4], qs[128] */
	static constexpr int QK = 256, BYTES = 136;
	__device__ static __forceinline__ void unit(const uint8_t *row, int u, float *v)
	{
		const uint8_t *b = row + 136 * (size_t)(u >> 3);
		const int ib = u & 7;
		uint32_t hd[2], w[4];
		kc_ldw_a4<2>(b, hd); /* d, scales_h, scales_l[4] */
		kc_ldw_a4<4>(b + 8 + 16 * ib, w);
		const float d = kc_h2f((uint16_t)hd[0]);
		const uint32_t sh = hd[0] >> 16;
		const int ls = (int)(((kc_byte(hd[1], ib >> 1) >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4));
		const float dl = d * (float)(ls - 32);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			uint32_t q = kc_byte(w[i / 4], i % 4);
			v[i] = dl * kc_iq4(q & 15);
			v[i + 16] = dl * kc_iq4(q >> 4);
		}
	}
};

/* X-macro of the types with a unit dequantizer (the ones kcuda_matmul accepts). */
#define KCUDA_FOR_EACH_TYPE(X)                                                                     \
	X(KT_F32) X(KT_F16) X(KT_BF16) X(KT_Q8_0) X(KT_Q4_0) X(KT_Q4_1) X(KT_Q5_0) X(KT_Q5_1)      \
	X(KT_IQ4_NL) X(KT_Q2_K) X(KT_Q3_K) X(KT_Q4_K) X(KT_Q5_K) X(KT_Q6_K) X(KT_IQ4_XS)

#endif
