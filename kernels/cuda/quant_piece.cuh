/* Dequantization of one 8-element "piece" of a weight row, per GGUF type, in registers.
 *
 * A piece is elements [8p, 8p + 8) of a row. Kernels give consecutive pieces to consecutive lanes,
 * so a warp covers 256 contiguous elements (one K-quant super-block, or eight 32-blocks) and both
 * its weight loads and its activation loads are contiguous across the warp. kq<T>::piece(row, p, v)
 * fills v[j] = element 8p + j exactly as kcpu_dequant_row does (the same fp32 products
 * d*scale*q - dmin*min; MODEL-SPEC.md §5). Rows are in the GGUF block layout; fields are read with
 * the alignment the block size allows (Q8_0, Q6_K, ... are only 2-byte aligned: kc_ldw_a2). */
#ifndef TANDEM_KERNELS_CUDA_QUANT_PIECE_CUH
#define TANDEM_KERNELS_CUDA_QUANT_PIECE_CUH

#include "kernels/cuda/cuda_common.cuh"

template <int T> struct kq;

/* Small integers to float without I2F (a quarter-rate instruction on sm_90, which would cap the
 * GEMV below memory speed): OR the integer into the mantissa of 2^23 and subtract 2^23, both exact
 * for q < 2^23. */
__device__ __forceinline__ float kc_u2f(uint32_t q)
{
	return __uint_as_float(0x4b000000u | q) - 8388608.0f;
}
/* int8 byte i of w as float: bias to unsigned, convert, unbias (exact) */
__device__ __forceinline__ float kc_s8(uint32_t w, int i)
{
	return __uint_as_float(0x4b000000u | (((w >> (8 * i)) & 0xffu) ^ 0x80u)) - 8388736.0f;
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
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const float4 *q = (const float4 *)(row + 32 * p);
		const float4 a = __ldg(q), b = __ldg(q + 1);
		v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
	}
};

template <> struct kq<KT_F16> {
	static constexpr int QK = 1, BYTES = 2;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		uint32_t w[4];
		kc_ldw_a16<4>(row + 16 * p, w);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 f = __half22float2(*(const __half2 *)&w[i]);
			v[2 * i] = f.x, v[2 * i + 1] = f.y;
		}
	}
};

template <> struct kq<KT_BF16> {
	static constexpr int QK = 1, BYTES = 2;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		uint32_t w[4];
		kc_ldw_a16<4>(row + 16 * p, w);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			v[2 * i] = __uint_as_float(w[i] << 16);
			v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
		}
	}
};

template <> struct kq<KT_Q8_0> { /* 34 B: d, qs[32]; piece = quarter q of block b */
	static constexpr int QK = 32, BYTES = 34;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 34 * (p >> 2);
		uint32_t w[2];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<2>(b + 2 + 8 * (p & 3), w);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = d * kc_s8(w[i / 4], i % 4);
	}
};

/* 4-bit blocks of 32: elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles;
 * piece q (0..3) of a block = nibble half q >> 1 of bytes 8 * (q & 1) .. + 7. */
template <> struct kq<KT_Q4_0> { /* 18 B: d, qs[16] */
	static constexpr int QK = 32, BYTES = 18;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 18 * (p >> 2);
		const int q = (int)(p & 3), sh = 4 * (q >> 1);
		uint32_t w[2];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<2>(b + 2 + 8 * (q & 1), w);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = d * (kc_u2f((kc_byte(w[i / 4], i % 4) >> sh) & 15) - 8.0f);
	}
};

template <> struct kq<KT_Q4_1> { /* 20 B: d, m, qs[16] */
	static constexpr int QK = 32, BYTES = 20;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 20 * (p >> 2);
		const int q = (int)(p & 3), sh = 4 * (q >> 1);
		uint32_t dm, w[2];
		kc_ldw_a4<1>(b, &dm);
		kc_ldw_a4<2>(b + 4 + 8 * (q & 1), w);
		const float d = kc_h2f((uint16_t)dm), m = kc_h2f((uint16_t)(dm >> 16));
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = d * kc_u2f((kc_byte(w[i / 4], i % 4) >> sh) & 15) + m;
	}
};

template <> struct kq<KT_Q5_0> { /* 22 B: d, qh (u32), qs[16] */
	static constexpr int QK = 32, BYTES = 22;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 22 * (p >> 2);
		const int q = (int)(p & 3), sh = 4 * (q >> 1);
		uint32_t qh, w[2];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<1>(b + 2, &qh);
		kc_ldw_a2<2>(b + 6 + 8 * (q & 1), w);
		qh >>= 8 * q; /* bits of elements 8q .. 8q + 7 */
#pragma unroll
		for (int i = 0; i < 8; i++) {
			uint32_t x = ((kc_byte(w[i / 4], i % 4) >> sh) & 15) | (((qh >> i) & 1) << 4);
			v[i] = d * (kc_u2f(x) - 16.0f);
		}
	}
};

template <> struct kq<KT_Q5_1> { /* 24 B: d, m, qh (u32), qs[16] */
	static constexpr int QK = 32, BYTES = 24;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 24 * (p >> 2);
		const int q = (int)(p & 3), sh = 4 * (q >> 1);
		uint32_t hd[2], w[2];
		kc_ldw_a4<2>(b, hd);
		kc_ldw_a4<2>(b + 8 + 8 * (q & 1), w);
		const float d = kc_h2f((uint16_t)hd[0]), m = kc_h2f((uint16_t)(hd[0] >> 16));
		const uint32_t qh = hd[1] >> (8 * q);
#pragma unroll
		for (int i = 0; i < 8; i++) {
			uint32_t x = ((kc_byte(w[i / 4], i % 4) >> sh) & 15) | (((qh >> i) & 1) << 4);
			v[i] = d * kc_u2f(x) + m;
		}
	}
};

template <> struct kq<KT_IQ4_NL> { /* 18 B: d, qs[16] */
	static constexpr int QK = 32, BYTES = 18;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 18 * (p >> 2);
		const int q = (int)(p & 3), sh = 4 * (q >> 1);
		uint32_t w[2];
		const float d = kc_h2f(kc_ld16(b));
		kc_ldw_a2<2>(b + 2 + 8 * (q & 1), w);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = d * kc_iq4((kc_byte(w[i / 4], i % 4) >> sh) & 15);
	}
};

/* K-quants: super-block b = p >> 5 holds pieces 32b .. 32b + 31; e0 = element offset in it. */
template <> struct kq<KT_Q2_K> { /* 84 B: scales[16], qs[64], d, dmin */
	static constexpr int QK = 256, BYTES = 84;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 84 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), n = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
		uint32_t w[2], dd;
		kc_ldw_a4<2>(b + 16 + 32 * n + l0, w);
		kc_ldw_a4<1>(b + 80, &dd);
		const uint32_t sc = b[8 * n + 2 * j + (l0 >> 4)];
		const float dl = kc_h2f((uint16_t)dd) * (float)(sc & 15);
		const float ml = kc_h2f((uint16_t)(dd >> 16)) * (float)(sc >> 4);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = dl * kc_u2f((kc_byte(w[i / 4], i % 4) >> (2 * j)) & 3) - ml;
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
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 110 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), n = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
		uint32_t hm[2], qs[2], sw[3];
		kc_ldw_a2<2>(b + l0, hm);
		kc_ldw_a2<2>(b + 32 + 32 * n + l0, qs);
		kc_ldw_a2<3>(b + 96, sw);
		const float dl = kc_h2f(kc_ld16(b + 108)) * (float)kc_q3k_scale(sw, 8 * n + 2 * j + (l0 >> 4));
		const int hb = 4 * n + j;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			uint32_t q2 = (kc_byte(qs[i / 4], i % 4) >> (2 * j)) & 3;
			uint32_t h = (kc_byte(hm[i / 4], i % 4) >> hb) & 1;
			v[i] = dl * (kc_u2f(q2 | (h << 2)) - 4.0f);
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
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 144 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), sb = e0 >> 5, l0 = e0 & 31;
		uint32_t hd[4];
		kc_ldw_a16<4>(b, hd); /* d, dmin, scales[12]: same 16 bytes for the 32 lanes of a block */
		const uint2 w = __ldg((const uint2 *)(b + 16 + 32 * (sb >> 1) + l0));
		float sc, mn;
		kc_k4_scale_min(hd + 1, sb, &sc, &mn);
		const float dl = kc_h2f((uint16_t)hd[0]) * sc, ml = kc_h2f((uint16_t)(hd[0] >> 16)) * mn;
		const int sh = 4 * (sb & 1);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = dl * kc_u2f((kc_byte(i < 4 ? w.x : w.y, i % 4) >> sh) & 15) - ml;
	}
};

template <> struct kq<KT_Q5_K> { /* 176 B: d, dmin, scales[12], qh[32], qs[128] */
	static constexpr int QK = 256, BYTES = 176;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 176 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), sb = e0 >> 5, l0 = e0 & 31;
		uint32_t hd[4];
		kc_ldw_a16<4>(b, hd);
		const uint2 h = __ldg((const uint2 *)(b + 16 + l0));
		const uint2 w = __ldg((const uint2 *)(b + 48 + 32 * (sb >> 1) + l0));
		float sc, mn;
		kc_k4_scale_min(hd + 1, sb, &sc, &mn);
		const float dl = kc_h2f((uint16_t)hd[0]) * sc, ml = kc_h2f((uint16_t)(hd[0] >> 16)) * mn;
		const int sh = 4 * (sb & 1);
#pragma unroll
		for (int i = 0; i < 8; i++) {
			uint32_t q = ((kc_byte(i < 4 ? w.x : w.y, i % 4) >> sh) & 15) |
				     (((kc_byte(i < 4 ? h.x : h.y, i % 4) >> sb) & 1) << 4);
			v[i] = dl * kc_u2f(q) - ml;
		}
	}
};

template <> struct kq<KT_Q6_K> { /* 210 B: ql[128], qh[64], scales[16] (int8), d */
	static constexpr int QK = 256, BYTES = 210;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 210 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), n = e0 >> 7, k = (e0 >> 5) & 3, l0 = e0 & 31;
		uint32_t ql[2], qh[2];
		kc_ldw_a2<2>(b + 64 * n + 32 * (k & 1) + l0, ql);
		kc_ldw_a2<2>(b + 128 + 32 * n + l0, qh);
		const float dl = kc_h2f(kc_ld16(b + 208)) * (float)(int8_t)b[192 + 8 * n + 2 * k + (l0 >> 4)];
		const int shl = 4 * (k >> 1), shh = 2 * k;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			uint32_t q = ((kc_byte(ql[i / 4], i % 4) >> shl) & 15) |
				     (((kc_byte(qh[i / 4], i % 4) >> shh) & 3) << 4);
			v[i] = dl * (kc_u2f(q) - 32.0f);
		}
	}
};

template <> struct kq<KT_IQ4_XS> { /* 136 B: d, scales_h (u16), scales_l[4], qs[128] */
	static constexpr int QK = 256, BYTES = 136;
	__device__ static __forceinline__ void piece(const uint8_t *row, int64_t p, float *v)
	{
		const uint8_t *b = row + 136 * (p >> 5);
		const int e0 = 8 * (int)(p & 31), ib = e0 >> 5, l0 = e0 & 31;
		uint32_t hd[2], w[2];
		kc_ldw_a4<2>(b, hd); /* d, scales_h, scales_l[4] */
		kc_ldw_a4<2>(b + 8 + 16 * ib + (l0 & 8), w);
		const uint32_t sh = hd[0] >> 16;
		const int ls = (int)(((kc_byte(hd[1], ib >> 1) >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4));
		const float dl = kc_h2f((uint16_t)hd[0]) * (float)(ls - 32);
		const int nsh = 4 * (l0 >> 4);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = dl * kc_iq4((kc_byte(w[i / 4], i % 4) >> nsh) & 15);
	}
};

/* X-macro of the types with a piece dequantizer (the ones kcuda_matmul accepts). */
#define KCUDA_FOR_EACH_TYPE(X)                                                                     \
	X(KT_F32) X(KT_F16) X(KT_BF16) X(KT_Q8_0) X(KT_Q4_0) X(KT_Q4_1) X(KT_Q5_0) X(KT_Q5_1)      \
	X(KT_IQ4_NL) X(KT_Q2_K) X(KT_Q3_K) X(KT_Q4_K) X(KT_Q5_K) X(KT_Q6_K) X(KT_IQ4_XS)

#endif
