/* Dequantization of one 16-element "piece" of a weight row, per GGUF type, in registers.
 *
 * A piece is elements [16p, 16p + 16) of a row; every piece lies inside one scale group of its
 * block (16- or 32-element groups, MODEL-SPEC.md §5), so its weights are an affine function of
 * small per-element values: w_j = a * v_j + b. Kernels give consecutive pieces to consecutive lanes
 * (a warp covers 512 contiguous elements), load the raw bytes of several rows first
 * (kq<T>::load, so many loads are in flight) and decode them afterwards (kq<T>::decode -> v[16],
 * a, b). The dot product is then a * sum(v x) + b * sum(x), where sum(x) is shared by all rows.
 *
 * v is chosen to be cheap and exact: for a b-bit unsigned quant q (b <= 7), v = 1 + q / 2^(7-b),
 * made by moving q into the mantissa of 1.0f (no int-to-float conversion, a quarter-rate
 * instruction on sm_90 that would cap the GEMV below memory speed); a and b absorb the 2^(7-b)
 * factor and the offset. The cancellation in a * sum(v x) + b * sum(x) costs at most ~2 bits for
 * these widths (the factor 2^(7-b) is about the mean of q). int8 (Q8_0) and codebook values use
 * the exact 2^23 trick instead. Rows are in the GGUF block layout; fields are read with the
 * alignment the block size allows (Q8_0, Q6_K, ... are only 2-byte aligned: kc_ldw_a2). */
#ifndef TANDEM_KERNELS_CUDA_QUANT_PIECE_CUH
#define TANDEM_KERNELS_CUDA_QUANT_PIECE_CUH

#include "kernels/cuda/cuda_common.cuh"

template <int T> struct kq;

/* Float with value 1 + payload / 128 from byte k of w, whose bytes hold 0x80 | payload. */
__device__ __forceinline__ float kc_pv(uint32_t w, int k)
{
#ifndef KC_NO_PRMT
	return __uint_as_float(__byte_perm(w, 0x3f000000u, 0x7044u | ((uint32_t)k << 8)));
#else
	/* shift + and-or: measured 10% slower than PRMT on sm_90 (docs/PERFORMANCE.md) */
	const uint32_t s = k == 0 ? (w << 16) : (k == 1 ? (w << 8) : (k == 2 ? w : (w >> 8)));
	return __uint_as_float((s & 0x007f0000u) | 0x3f800000u);
#endif
}
/* four b-bit fields (at bit `sh` of each byte of w) as bytes 0x80 | (q << (7 - b)) */
template <int BITS> __device__ __forceinline__ uint32_t kc_payload(uint32_t w, int sh)
{
	const uint32_t m = ((1u << BITS) - 1u) * 0x01010101u;
	return (((w >> sh) & m) << (7 - BITS)) | 0x80808080u;
}
/* exact signed int8 byte k of w as float */
__device__ __forceinline__ float kc_s8(uint32_t w, int k)
{
#ifndef KC_NO_PRMT
	return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4b000000u, 0x7440u | (uint32_t)k)) - 8388736.0f;
#else
	return __uint_as_float((((w ^ 0x80808080u) >> (8 * k)) & 0xffu) | 0x4b000000u) - 8388736.0f;
#endif
}
/* Small unsigned integer to float without I2F: exact for q < 2^23. */
__device__ __forceinline__ float kc_u2f(uint32_t q)
{
	return __uint_as_float(0x4b000000u | q) - 8388608.0f;
}
/* 4 payload words -> 16 values */
__device__ __forceinline__ void kc_pv16(const uint32_t *pw, float *v)
{
#pragma unroll
	for (int i = 0; i < 16; i++)
		v[i] = kc_pv(pw[i / 4], i % 4);
}

template <> struct kq<KT_F32> {
	static constexpr int QK = 1, BYTES = 4;
	static constexpr bool HAS_B = false;
	struct raw {
		float4 f[4];
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const float4 *q = (const float4 *)(row + 64 * p);
#pragma unroll
		for (int i = 0; i < 4; i++)
			r.f[i] = __ldg(q + i);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[4 * i] = r.f[i].x, v[4 * i + 1] = r.f[i].y, v[4 * i + 2] = r.f[i].z,
			      v[4 * i + 3] = r.f[i].w;
		a = 1.0f, b = 0.0f;
	}
};

template <> struct kq<KT_F16> {
	static constexpr int QK = 1, BYTES = 2;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t w[8];
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		kc_ldw_a16<8>(row + 32 * p, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
#pragma unroll
		for (int i = 0; i < 8; i++) {
			float2 f = __half22float2(*(const __half2 *)&r.w[i]);
			v[2 * i] = f.x, v[2 * i + 1] = f.y;
		}
		a = 1.0f, b = 0.0f;
	}
};

template <> struct kq<KT_BF16> {
	static constexpr int QK = 1, BYTES = 2;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t w[8];
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		kc_ldw_a16<8>(row + 32 * p, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
#pragma unroll
		for (int i = 0; i < 8; i++) {
			v[2 * i] = __uint_as_float(r.w[i] << 16);
			v[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
		}
		a = 1.0f, b = 0.0f;
	}
};

/* Blocks of 32: piece p is half p & 1 of block p >> 1. */
template <> struct kq<KT_Q8_0> { /* 34 B: d, qs[32] */
	static constexpr int QK = 32, BYTES = 34;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t w[4];
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 34 * (p >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<4>(b + 2 + 16 * (p & 1), r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
#pragma unroll
		for (int i = 0; i < 16; i++)
			v[i] = kc_s8(r.w[i / 4], i % 4);
		a = kc_h2f(r.d), b = 0.0f;
	}
};

/* 4-bit blocks of 32: elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles. */
template <> struct kq<KT_Q4_0> { /* 18 B: d, qs[16]; w = d (q - 8) */
	static constexpr int QK = 32, BYTES = 18;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t w[4];
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 18 * (p >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<4>(b + 2, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			pw[i] = kc_payload<4>(r.w[i], 4 * (int)(p & 1));
		kc_pv16(pw, v);
		const float d = kc_h2f(r.d);
		a = 16.0f * d, b = -24.0f * d;
	}
};

template <> struct kq<KT_Q4_1> { /* 20 B: d, m, qs[16]; w = d q + m */
	static constexpr int QK = 32, BYTES = 20;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t w[4];
		uint32_t dm;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 20 * (p >> 1);
		kc_ldw_a4<1>(b, &r.dm);
		kc_ldw_a4<4>(b + 4, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			pw[i] = kc_payload<4>(r.w[i], 4 * (int)(p & 1));
		kc_pv16(pw, v);
		const float d = kc_h2f((uint16_t)r.dm), m = kc_h2f((uint16_t)(r.dm >> 16));
		a = 16.0f * d, b = m - 16.0f * d;
	}
};

/* 5th bits: bit (16h + i) of qh for element 16h + i; spread 4 of them to bit 4 of each byte */
__device__ __forceinline__ uint32_t kc_bits_to_bytes(uint32_t bits4)
{
	return (bits4 & 1u) | ((bits4 & 2u) << 7) | ((bits4 & 4u) << 14) | ((bits4 & 8u) << 21);
}

template <> struct kq<KT_Q5_0> { /* 22 B: d, qh (u32), qs[16]; w = d (q - 16) */
	static constexpr int QK = 32, BYTES = 22;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t w[5]; /* qh, qs */
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 22 * (p >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<5>(b + 2, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
		const uint32_t qh = r.w[0] >> (16 * h);
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t q =
			    ((r.w[1 + i] >> (4 * h)) & 0x0f0f0f0fu) | (kc_bits_to_bytes(qh >> (4 * i)) << 4);
			pw[i] = (q << 2) | 0x80808080u;
		}
		kc_pv16(pw, v);
		const float d = kc_h2f(r.d);
		a = 32.0f * d, b = -48.0f * d;
	}
};

template <> struct kq<KT_Q5_1> { /* 24 B: d, m, qh (u32), qs[16]; w = d q + m */
	static constexpr int QK = 32, BYTES = 24;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t w[6]; /* dm, qh, qs */
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		kc_ldw_a4<6>(row + 24 * (p >> 1), r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int h = (int)(p & 1);
		const uint32_t qh = r.w[1] >> (16 * h);
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t q =
			    ((r.w[2 + i] >> (4 * h)) & 0x0f0f0f0fu) | (kc_bits_to_bytes(qh >> (4 * i)) << 4);
			pw[i] = (q << 2) | 0x80808080u;
		}
		kc_pv16(pw, v);
		const float d = kc_h2f((uint16_t)r.w[0]), m = kc_h2f((uint16_t)(r.w[0] >> 16));
		a = 32.0f * d, b = m - 32.0f * d;
	}
};

/* IQ4_NL / IQ4_XS codebook lookup without memory: the 16 int8 values live in four 32-bit
 * constants and __byte_perm picks one (selector 0..7 within a half); exact. */
__device__ __forceinline__ float kc_iq4(uint32_t nib)
{
	/* {-127,-104,-83,-65,-49,-35,-22,-10} and {1,13,25,38,53,69,89,113} as little-endian bytes */
	const uint32_t lo_a = 0xbfad9881u, lo_b = 0xf6eaddcfu;
	const uint32_t hi_a = 0x26190d01u, hi_b = 0x71594535u;
	const uint32_t s = nib & 7u;
	const uint32_t byte = (nib & 8u) ? __byte_perm(hi_a, hi_b, s) : __byte_perm(lo_a, lo_b, s);
	return kc_s8(byte, 0);
}

template <> struct kq<KT_IQ4_NL> { /* 18 B: d, qs[16]; w = d T[q] */
	static constexpr int QK = 32, BYTES = 18;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t w[4];
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 18 * (p >> 1);
		r.d = kc_ld16(b);
		kc_ldw_a2<4>(b + 2, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int sh = 4 * (int)(p & 1);
#pragma unroll
		for (int i = 0; i < 16; i++)
			v[i] = kc_iq4((kc_byte(r.w[i / 4], i % 4) >> sh) & 15);
		a = kc_h2f(r.d), b = 0.0f;
	}
};

/* K-quants: super-block p >> 4 holds pieces; e0 = 16 * (p & 15) is the element offset in it. */
template <> struct kq<KT_Q2_K> { /* 84 B: scales[16], qs[64], d, dmin; w = d sc q - dmin m */
	static constexpr int QK = 256, BYTES = 84;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t w[4];
		uint32_t dd;
		uint32_t sc;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 84 * (p >> 4);
		const int e0 = 16 * (int)(p & 15), n = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
		kc_ldw_a4<4>(b + 16 + 32 * n + l0, r.w);
		kc_ldw_a4<1>(b + 80, &r.dd);
		r.sc = b[8 * n + 2 * j + (l0 >> 4)];
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int j = (int)((p >> 1) & 3);
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			pw[i] = kc_payload<2>(r.w[i], 2 * j);
		kc_pv16(pw, v);
		const float dl = kc_h2f((uint16_t)r.dd) * kc_u2f(r.sc & 15);
		const float ml = kc_h2f((uint16_t)(r.dd >> 16)) * kc_u2f(r.sc >> 4);
		a = 4.0f * dl, b = -(4.0f * dl + ml);
	}
};

/* Q3_K 6-bit signed scale k (0..15) from the 12 packed bytes in sw[0..2] */
__device__ __forceinline__ int kc_q3k_scale(const uint32_t *sw, int k)
{
	/* select, not sw[(k & 7) >> 2]: a dynamic index would put sw in local memory */
	const uint32_t w01 = ((k & 7) >> 2) ? sw[1] : sw[0];
	uint32_t lo = (kc_byte(w01, k & 3) >> (4 * (k >> 3))) & 15;
	uint32_t hi = (kc_byte(sw[2], k & 3) >> (2 * (k >> 2))) & 3;
	return (int)(lo | (hi << 4)) - 32;
}

template <> struct kq<KT_Q3_K> { /* 110 B: hmask[32], qs[64], scales[12], d; w = d S (q2 + 4h - 4) */
	static constexpr int QK = 256, BYTES = 110;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t hm[4], qs[4], sw[3];
		uint16_t d;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 110 * (p >> 4);
		const int e0 = 16 * (int)(p & 15), n = e0 >> 7, l0 = e0 & 31;
		kc_ldw_a2<4>(b + l0, r.hm);
		kc_ldw_a2<4>(b + 32 + 32 * n + l0, r.qs);
		kc_ldw_a2<3>(b + 96, r.sw);
		r.d = kc_ld16(b + 108);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int e0 = 16 * (int)(p & 15), n = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
		const int hb = 4 * n + j;
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t q =
			    ((r.qs[i] >> (2 * j)) & 0x03030303u) | (((r.hm[i] >> hb) & 0x01010101u) << 2);
			pw[i] = (q << 4) | 0x80808080u;
		}
		kc_pv16(pw, v);
		const float dl = kc_h2f(r.d) * (float)kc_q3k_scale(r.sw, 8 * n + 2 * j + (l0 >> 4));
		a = 8.0f * dl, b = -12.0f * dl;
	}
};

/* Q4_K / Q5_K 6-bit scale and min of sub-block sb from the 12 packed bytes in sw[0..2] (no branch:
 * both packings are computed and one is selected). */
__device__ __forceinline__ void kc_k4_scale_min(const uint32_t *sw, int sb, float *sc, float *mn)
{
	const int q = sb & 3;
	const uint32_t A = sw[0] >> (8 * q), B = sw[1] >> (8 * q), C = sw[2] >> (8 * q);
	const uint32_t s_lo = A & 63, m_lo = B & 63;
	const uint32_t s_hi = (C & 15) | ((A >> 2) & 0x30), m_hi = ((C >> 4) & 15) | ((B >> 2) & 0x30);
	*sc = kc_u2f(sb < 4 ? s_lo : s_hi);
	*mn = kc_u2f(sb < 4 ? m_lo : m_hi);
}

template <> struct kq<KT_Q4_K> { /* 144 B: d, dmin, scales[12], qs[128]; w = d sc q - dmin m */
	static constexpr int QK = 256, BYTES = 144;
	static constexpr bool HAS_B = true;
	struct raw {
		uint4 hd, qs;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 144 * (p >> 4);
		const int e0 = 16 * (int)(p & 15), sb = e0 >> 5, l0 = e0 & 31;
		r.hd = __ldg((const uint4 *)b);
		r.qs = __ldg((const uint4 *)(b + 16 + 32 * (sb >> 1) + l0));
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int sb = (int)((p & 15) >> 1);
		const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w}, sw[3] = {r.hd.y, r.hd.z, r.hd.w};
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			pw[i] = kc_payload<4>(w[i], 4 * (sb & 1));
		kc_pv16(pw, v);
		float sc, mn;
		kc_k4_scale_min(sw, sb, &sc, &mn);
		const float2 dm = __half22float2(*(const __half2 *)&r.hd.x);
		const float dl = dm.x * sc, ml = dm.y * mn;
		a = 16.0f * dl, b = -(16.0f * dl + ml);
	}
};

template <> struct kq<KT_Q5_K> { /* 176 B: d, dmin, scales[12], qh[32], qs[128] */
	static constexpr int QK = 256, BYTES = 176;
	static constexpr bool HAS_B = true;
	struct raw {
		uint4 hd, qh, qs;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 176 * (p >> 4);
		const int e0 = 16 * (int)(p & 15), sb = e0 >> 5, l0 = e0 & 31;
		r.hd = __ldg((const uint4 *)b);
		r.qh = __ldg((const uint4 *)(b + 16 + l0));
		r.qs = __ldg((const uint4 *)(b + 48 + 32 * (sb >> 1) + l0));
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int sb = (int)((p & 15) >> 1);
		const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w},
		               h[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
		const uint32_t sw[3] = {r.hd.y, r.hd.z, r.hd.w};
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t q =
			    ((w[i] >> (4 * (sb & 1))) & 0x0f0f0f0fu) | (((h[i] >> sb) & 0x01010101u) << 4);
			pw[i] = (q << 2) | 0x80808080u;
		}
		kc_pv16(pw, v);
		float sc, mn;
		kc_k4_scale_min(sw, sb, &sc, &mn);
		const float2 dm = __half22float2(*(const __half2 *)&r.hd.x);
		const float dl = dm.x * sc, ml = dm.y * mn;
		a = 32.0f * dl, b = -(32.0f * dl + ml);
	}
};

template <> struct kq<KT_Q6_K> { /* 210 B: ql[128], qh[64], scales[16] (int8), d; w = d sc (q - 32) */
	static constexpr int QK = 256, BYTES = 210;
	static constexpr bool HAS_B = true;
	struct raw {
		uint32_t ql[4], qh[4];
		uint16_t d;
		int8_t sc;
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 210 * (p >> 4);
		const int e0 = 16 * (int)(p & 15), n = e0 >> 7, k = (e0 >> 5) & 3, l0 = e0 & 31;
		kc_ldw_a2<4>(b + 64 * n + 32 * (k & 1) + l0, r.ql);
		kc_ldw_a2<4>(b + 128 + 32 * n + l0, r.qh);
		r.sc = (int8_t)b[192 + 8 * n + 2 * k + (l0 >> 4)];
		r.d = kc_ld16(b + 208);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int e0 = 16 * (int)(p & 15), k = (e0 >> 5) & 3;
		const int shl = 4 * (k >> 1), shh = 2 * k;
		uint32_t pw[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t q =
			    ((r.ql[i] >> shl) & 0x0f0f0f0fu) | (((r.qh[i] >> shh) & 0x03030303u) << 4);
			pw[i] = (q << 1) | 0x80808080u;
		}
		kc_pv16(pw, v);
		const float dl = kc_h2f(r.d) * (float)r.sc;
		a = 64.0f * dl, b = -96.0f * dl;
	}
};

template <> struct kq<KT_IQ4_XS> { /* 136 B: d, scales_h (u16), scales_l[4], qs[128]; w = dl T[q] */
	static constexpr int QK = 256, BYTES = 136;
	static constexpr bool HAS_B = false;
	struct raw {
		uint32_t hd[2], w[4];
	};
	__device__ static __forceinline__ void load(const uint8_t *row, int64_t p, raw &r)
	{
		const uint8_t *b = row + 136 * (p >> 4);
		const int ib = (int)((p & 15) >> 1);
		kc_ldw_a4<2>(b, r.hd); /* d, scales_h, scales_l[4] */
		kc_ldw_a4<4>(b + 8 + 16 * ib, r.w);
	}
	__device__ static __forceinline__ void decode(const raw &r, int64_t p, float *v, float &a, float &b)
	{
		const int ib = (int)((p & 15) >> 1), sh = 4 * (int)(p & 1);
#pragma unroll
		for (int i = 0; i < 16; i++)
			v[i] = kc_iq4((kc_byte(r.w[i / 4], i % 4) >> sh) & 15);
		const uint32_t hi = r.hd[0] >> 16;
		const int ls = (int)(((kc_byte(r.hd[1], ib >> 1) >> (4 * (ib & 1))) & 15) |
		                     (((hi >> (2 * ib)) & 3) << 4));
		a = kc_h2f((uint16_t)r.hd[0]) * (float)(ls - 32), b = 0.0f;
	}
};

#include "kernels/cuda/quant_piece_iq.cuh" /* IQ2_XXS .. IQ1_M */

/* Element j of piece p exactly as kcpu_dequant_row would give it, up to fp32 rounding of
 * a * v + b (embedding lookup, prefill dequantization); kq_values_raw: the same from raw bytes that
 * kq<T>::load already brought (a kernel that loads a step ahead). */
template <int T>
__device__ __forceinline__ void kq_values_raw(const typename kq<T>::raw &r, int64_t p, float *out)
{
	float a, b;
	kq<T>::decode(r, p, out, a, b);
#pragma unroll
	for (int i = 0; i < 16; i++)
		out[i] = fmaf(a, out[i], b);
}
template <int T> __device__ __forceinline__ void kq_values(const uint8_t *row, int64_t p, float *out)
{
	typename kq<T>::raw r;
	kq<T>::load(row, p, r);
	kq_values_raw<T>(r, p, out);
}

/* X-macro of the types with a piece dequantizer (the ones kcuda_matmul accepts). */
// clang-format off
#define KCUDA_FOR_EACH_TYPE(X) \
	X(KT_F32) X(KT_F16) X(KT_BF16) X(KT_Q8_0) X(KT_Q4_0) X(KT_Q4_1) X(KT_Q5_0) X(KT_Q5_1) \
	X(KT_IQ4_NL) X(KT_Q2_K) X(KT_Q3_K) X(KT_Q4_K) X(KT_Q5_K) X(KT_Q6_K) X(KT_IQ4_XS) \
	X(KT_IQ2_XXS) X(KT_IQ2_XS) X(KT_IQ2_S) X(KT_IQ3_XXS) X(KT_IQ3_S) X(KT_IQ1_S) X(KT_IQ1_M)
// clang-format on

#endif
