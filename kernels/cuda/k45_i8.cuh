/* One token's Q4_K / Q5_K unit (16 rows x one 256-element super-block) on the int8 tensor cores
 * (mma.sync m16n8k32, s8 x s8 -> s32: sm_80 and later, so sm_90, sm_100 and sm_120 alike).
 *
 * Why: gm_k45_math turns every nibble into an fp16 multiplier with its sub-block scale folded in
 * (LOP3 + HFMA2 per two weights) and needs a second product for the mins, and at batch 1 the MoE's
 * gate / up and down kernels are instruction-bound (session 8's phase trace: ~2.1M warp
 * instructions for gate / up at 0.25-0.5 issued per scheduler cycle; PERFORMANCE.md, session 9). Here
 * a nibble needs one AND (low) or SHF + AND (high) to become an int8 A entry and the scales and mins
 * are applied once per sub-block and row in fp32.
 *
 * The token's x is held as three int8 parts per 32-element sub-block j (mi8_stage): with
 * s = max|x| / 127 over the sub-block, x = s (q1 + q2 / 254 + q3 / 254^2) to within s / 129032
 * (each part the rounded remainder of the one before, in [-127, 127]): ~6e-8 of the sub-block's
 * largest |x|. Two parts (s / 508) were tried first and measured ~6e-5 of max|out| through the MoE
 * (H200, test_ops_moe) and 1e-3 on glm-dsa-tiny-Q4_K_M's logits, over test_gpu_model's 2e-4: not
 * good enough. The integer dots are exact, so the only rounding is x's and the fp32 epilogue's.
 *
 * The fragment trick. Lane (g, t) holds chunk t of rows g and g + 8 (gm_k45_load: bytes 32t .. 32t
 * + 31 of qs, i.e. sub-blocks 2t (low nibbles) and 2t + 1 (high nibbles)). In an m16n8k32 product
 * lane t supplies the A entries of k slots 4t..4t+3 and 16+4t..16+4t+3; we put its own chunk's
 * weights there. B column n is nonzero only on the slots of lane n / 2: column 2t' holds the
 * first part and 2t' + 1 the second part of x over the sub-block lane t' supplies. So the C
 * entries lane (g, t) gets back, columns 2t and 2t + 1, are exactly its own sub-block's dots with
 * those parts for rows g and g + 8. The third part goes through a second product (column 2t' only). Four
 * chained product pairs cover a sub-block (8 of its 32 positions per lane each), so a unit is 16 products
 * (low and high nibbles). Only lanes with g / 2 == t carry nonzero B words.
 *
 * Overflow: a part's dot is at most 32 x 31 x 127 = 125,984 in magnitude, so 254 q2 + q3 < 2^25 is
 * formed in int32 (exact in fp32 below 2^24; Q5_K's rare extreme loses < 1 ulp of it). */
#ifndef TANDEM_KERNELS_CUDA_K45_I8_CUH
#define TANDEM_KERNELS_CUDA_K45_I8_CUH

#include "kernels/cuda/gemv_mma.cuh"

/* a unit of one token's x as three int8 parts: q[sub-block][part][word], word w = elements 4w ..
 * 4w + 3 of the sub-block; x = p s (q1 + q2 / 254 + q3 / 254^2) with p a power of two (mi8_stage);
 * s NaN when the sub-block's x is not finite; sum: the sum of its x (the mins' term) */
#define MI8_P 3
struct mi8_x {
	uint32_t q[8][MI8_P][8];
	uint32_t zero[8]; /* what the lanes without B words of a product load (mi8_k45_unit) */
	float s[8], p[8], sum[8];
};

/* D += A * B, m16n8k32, int8 in, int32 accumulate */
__device__ __forceinline__ void mi8_mma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};"
	    : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Host: the context's int8 parts of the first `rows` rows of x (n wide, ldx apart; one row needs no
 * ldx), where a producer (kfuse_add_rmsnorm_parts, kfuse_mla_latent_parts) left them, else NULL */
static inline const mi8_x *kcuda_xparts_for(const struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n,
                                            int64_t rows)
{
	const bool ok = c->xp_of && c->xp_of == x && c->xp_n == n && n % 256 == 0 && rows >= 1 &&
	                rows <= c->xp_rows && (rows == 1 || ldx == n);
	return ok ? (const mi8_x *)c->xp : NULL;
}

/* the low bytes of a, b, c, d as one word (a in byte 0) */
__device__ __forceinline__ uint32_t mi8_pack4(int a, int b, int c, int d)
{
	return __byte_perm(__byte_perm((uint32_t)a, (uint32_t)b, 0x0040u),
	                   __byte_perm((uint32_t)c, (uint32_t)d, 0x0040u), 0x5410u);
}

/* The quantization of one 32-element sub-block held by 32 / NE consecutive lanes (NE = 8: 4 lanes,
 * NE = 4: 8 lanes; the group starts at a lane multiple of its size), NE consecutive elements v[]
 * a lane. Warp-collective (every lane calls it, full mask). Gives this lane's words of the three
 * parts (q[part][i]: elements 4i .. 4i + 3 of the lane's), and, on every lane of the group, the
 * sub-block's scale s (NaN when an element is not finite), the power of two p and the sum of its
 * elements. The sum is formed as a tree of fixed shape whatever NE is (each four consecutive
 * elements in order, then pairs of fours, then pairs of those, ...), so a producer holding four
 * elements a lane (fused.cu's add_rmsnorm) and mi8_stage holding eight give the same bits. */
template <int NE, int L = 32 / NE>
__device__ __forceinline__ void mi8_quant(const float (&v)[NE], uint32_t (&qw)[MI8_P][NE / 4], float &s_out,
                                          float &p_out, float &sum_out)
{
	/* L: lanes sharing the group (32 / NE: a 32-element sub-block); L 1 with NE 16: a 16-element
	 * group held by one lane (matmul_q6k1.cu: Q6_K's scale groups) */
	static_assert(((NE == 4 || NE == 8) && L == 32 / NE) || (NE == 16 && L == 1),
	              "4 or 8 elements a lane of a 32-element group, or 16 in one lane");
	float m = 0.f, sum = 0.f;
	bool bad = false; /* an Inf / NaN element (fmaxf would drop a NaN): the sub-block's scale NaN */
#pragma unroll
	for (int i = 0; i < NE; i++) {
		m = fmaxf(m, fabsf(v[i]));
		bad = bad || !(fabsf(v[i]) <= 3.40282347e38f);
	}
	sum = ((v[0] + v[1]) + v[2]) + v[3];
	if constexpr (NE >= 8)
		sum += ((v[4] + v[5]) + v[6]) + v[7];
	if constexpr (NE == 16)
		sum += (((v[8] + v[9]) + v[10]) + v[11]) + (((v[12] + v[13]) + v[14]) + v[15]);
#pragma unroll
	for (int o = 1; o < L; o <<= 1) {
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
		sum += __shfl_xor_sync(0xffffffffu, sum, o);
		bad = __shfl_xor_sync(0xffffffffu, (int)bad, o) || bad;
	}
	/* The parts are formed from x times P = 2^k, k = min(1 - e, 100) for m = f 2^e (0.5 <= f < 1):
	 * m P is in [1, 2) (or, below 2^-99, at least 2^-49), so the scale and both remainders' steps
	 * stay normal floats however small x is (without it a sub-block near 1e-35 lost ~2e-4 to
	 * denormals: tests/unit/k45_i8_sim.cc); the epilogue multiplies by 1 / P (exact). s inv = 1
	 * within a few ulp is all the parts need; the fast division is within 2 ulp on [1, 2). */
	int e = 0;
	(void)frexpf(m, &e);
	const int k = min(1 - e, 100);
	const float P = ldexpf(1.f, k), mp = m * P;
	const float s = mp * (1.f / 127.f), inv = mp > 0.f && !bad ? __fdividef(127.f, mp) : 0.f;
	const float s2 = s * (1.f / 254.f), inv2 = inv * 254.f, inv3 = inv2 * 254.f;
	/* no clamps needed: |v P| inv <= 127 (1 + 2^-22) rounds to at most 127, and each remainder is
	 * at most half a step of the part before (fma: one rounding), so the next part too */
	int q[MI8_P][NE];
#pragma unroll
	for (int i = 0; i < NE; i++) {
		const float vp = v[i] * P; /* exact: a power of two, no overflow (m P < 2) */
		const float f1 = rintf(vp * inv), r = fmaf(-f1, s, vp);
		const float f2 = rintf(r * inv2), r2 = fmaf(-f2, s2, r);
		q[0][i] = (int)f1, q[1][i] = (int)f2, q[2][i] = __float2int_rn(r2 * inv3);
	}
#pragma unroll
	for (int pt = 0; pt < MI8_P; pt++)
#pragma unroll
		for (int i = 0; i < NE / 4; i++)
			qw[pt][i] =
			    mi8_pack4(q[pt][4 * i], q[pt][4 * i + 1], q[pt][4 * i + 2], q[pt][4 * i + 3]);
	s_out = bad ? __int_as_float(0x7fc00000) : s;
	p_out = ldexpf(1.f, -k);
	sum_out = sum;
}

/* One 256-element unit of x (xp: 16-byte aligned, global or shared) into X, warp-collective: lane
 * l quantizes elements 8l .. 8l + 7 (sub-block l / 4). Ends with __syncwarp: X is ready for every
 * lane. The caller syncs the warp before X is rewritten (the previous unit's reads). */
__device__ __forceinline__ void mi8_stage(mi8_x &X, const float *xp, int lane)
{
	const float4 a = ((const float4 *)xp)[2 * lane], b = ((const float4 *)xp)[2 * lane + 1];
	const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	uint32_t qw[MI8_P][2];
	float s, p, sum;
	mi8_quant<8>(v, qw, s, p, sum);
	const int j = lane >> 2, w = 2 * (lane & 3);
#pragma unroll
	for (int pt = 0; pt < MI8_P; pt++) {
		X.q[j][pt][w] = qw[pt][0];
		X.q[j][pt][w + 1] = qw[pt][1];
	}
	if (lane < 8)
		X.zero[lane] = 0u;
	if ((lane & 3) == 0) {
		X.s[j] = s;
		X.p[j] = p;
		X.sum[j] = sum;
	}
	__syncwarp();
}

/* The same unit made by a producer (a row's parts: mi8_put4, units in order) copied into X,
 * warp-collective, ends with __syncwarp. The same bits as mi8_stage of the unit's x. */
__device__ __forceinline__ void mi8_copy(mi8_x &X, const mi8_x *src, int lane)
{
	constexpr int N16 = (int)(sizeof(mi8_x) / 16); /* 56 */
	static_assert(sizeof(mi8_x) % 16 == 0 && N16 <= 64, "two 16-byte pieces a lane at most");
	const uint4 *s = (const uint4 *)src;
	uint4 *d = (uint4 *)&X;
	/* plain loads: the parts are written by the kernel before (never __ldg: cuda_common.cuh) */
	if (lane < N16 - 32) {
		const uint4 a = s[lane], b = s[32 + lane];
		d[lane] = a, d[32 + lane] = b;
	} else {
		d[lane] = s[lane];
	}
	__syncwarp();
}

/* Producer side, warp-collective: lane l holds elements 4c .. 4c + 3 of a row (c = the lane's float4
 * index in the row; the 8 lanes l & ~7 .. (l & ~7) + 7 hold one aligned 32-element sub-block, i.e.
 * c & 7 == l & 7 and c - (l & 7) is the same for the 8 lanes, a multiple of 8). Writes the lane's
 * words of the sub-block's parts into the row's units (row: unit 0 of the row, units in order; zero
 * words included) when `store`; every lane calls it (the shuffles), with zeros where it holds none. */
__device__ __forceinline__ void mi8_put4(mi8_x *row, int64_t c, float4 x, bool store)
{
	const float v[4] = {x.x, x.y, x.z, x.w};
	uint32_t qw[MI8_P][1];
	float s, p, sum;
	mi8_quant<4>(v, qw, s, p, sum);
	if (!store)
		return;
	mi8_x *u = row + (c >> 6); /* 64 float4 a unit */
	const int j = (int)((c >> 3) & 7), w = (int)(c & 7);
#pragma unroll
	for (int pt = 0; pt < MI8_P; pt++)
		u->q[j][pt][w] = qw[pt][0];
	if (j == 0)
		u->zero[w] = 0u;
	if (w == 0) {
		u->s[j] = s;
		u->p[j] = p;
		u->sum[j] = sum;
	}
}

/* Producer side with 8 elements a lane, warp-collective: lane l holds elements 8c .. 8c + 7 of a row
 * (c & 3 == l & 3, the 4 lanes l & ~3 .. holding one aligned sub-block); writes the lane's words of
 * its sub-block's parts into the row's units (as mi8_put4; the same bits as mi8_stage) */
__device__ __forceinline__ void mi8_put8(mi8_x *row, int64_t c, float4 a, float4 b)
{
	const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	uint32_t qw[MI8_P][2];
	float s, p, sum;
	mi8_quant<8>(v, qw, s, p, sum);
	mi8_x *u = row + (c >> 5); /* 32 lanes' 8 elements a unit */
	const int j = (int)((c >> 2) & 7), w = 2 * (int)(c & 3);
#pragma unroll
	for (int pt = 0; pt < MI8_P; pt++) {
		u->q[j][pt][w] = qw[pt][0];
		u->q[j][pt][w + 1] = qw[pt][1];
	}
	if (j == 0)
		u->zero[w] = 0u, u->zero[w + 1] = 0u;
	if (w == 0) {
		u->s[j] = s;
		u->p[j] = p;
		u->sum[j] = sum;
	}
}

/* acc[r][hr] += the unit's dot for row g (hr 0) / g + 8 (hr 1) of tile r, over this lane's two
 * sub-blocks (2t, 2t + 1); the row's full dot is the sum over the 4 lanes t (mi8_rows_sum). W from
 * gm_k45_load / mo_k45_lds (any source: the layout is the same). */
template <int T, int R>
__device__ __forceinline__ void mi8_k45_unit(float (&acc)[R][2], const gm_k45_w<T, R> &W, const mi8_x &X,
                                             int g, int t)
{
	constexpr bool Q5 = T == KT_Q5_K;
	/* B: lane (2t', t') the first part of lane t''s sub-block, (2t' + 1, t') the second; the third
	 * (second product) on lane (2t', t') only */
	const bool own = (g >> 1) == t, own3 = g == 2 * t;
	const int pt = g & 1;
#pragma unroll
	for (int e = 0; e < 2; e++) { /* pass e: sub-block 2t + e, the low (0) / high (1) nibbles */
		const int j = 2 * t + e;
		uint32_t b[8], b3[8];
		{
			/* the barrier keeps the compiler from hoisting the next pass's loads here (measured:
			 * 93 registers instead of 75, so 2 instead of 3 blocks of 8 warps an SM) */
			asm volatile("" ::: "memory");
			const uint4 *bp = (const uint4 *)(own ? X.q[j][pt] : X.zero);
			const uint4 *rp = (const uint4 *)(own3 ? X.q[j][2] : X.zero);
			const uint4 p0 = bp[0], p1 = bp[1], r0 = rp[0], r1 = rp[1];
			b[0] = p0.x, b[1] = p0.y, b[2] = p0.z, b[3] = p0.w;
			b[4] = p1.x, b[5] = p1.y, b[6] = p1.z, b[7] = p1.w;
			b3[0] = r0.x, b3[1] = r0.y, b3[2] = r0.z, b3[3] = r0.w;
			b3[4] = r1.x, b3[5] = r1.y, b3[6] = r1.z, b3[7] = r1.w;
		}
		const float xs = X.s[j], xp = X.p[j], xsum = X.sum[j];
		const int q = 2 * (t & 1) + e; /* sub-block j's byte in the scale words */
#pragma unroll
		for (int r = 0; r < R; r++) {
			int c[4] = {0, 0, 0, 0}, c3[4] = {0, 0, 0, 0}; /* parts 1, 2 | part 3 (columns 2t) */
#pragma unroll
			for (int m = 0; m < 4; m++) {
				uint32_t a[2][2]; /* [hr][word 2m, 2m + 1] */
#pragma unroll
				for (int hr = 0; hr < 2; hr++)
#pragma unroll
					for (int k = 0; k < 2; k++) {
						const int wi = 2 * m + k;
						const uint4 q4 = wi < 4 ? W.qa[r][hr] : W.qb[r][hr];
						const uint32_t w = (wi & 3) == 0   ? q4.x
						                   : (wi & 3) == 1 ? q4.y
						                   : (wi & 3) == 2 ? q4.z
						                                   : q4.w;
						uint32_t v = (e ? w >> 4 : w) & 0x0F0F0F0Fu;
						if (Q5) { /* bit 2t of qh: the low sub-block's fifth bit, 2t +
							     1 the high's */
							const uint4 h4 = wi < 4 ? W.ha[r][hr] : W.hb[r][hr];
							const uint32_t hw = (wi & 3) == 0   ? h4.x
							                    : (wi & 3) == 1 ? h4.y
							                    : (wi & 3) == 2 ? h4.z
							                                    : h4.w;
							v |= ((hw >> j) & 0x01010101u) << 4;
						}
						a[hr][k] = v;
					}
				mi8_mma(c, a[0][0], a[1][0], a[0][1], a[1][1], b[2 * m], b[2 * m + 1]);
				mi8_mma(c3, a[0][0], a[1][0], a[0][1], a[1][1], b3[2 * m], b3[2 * m + 1]);
			}
#pragma unroll
			for (int hr = 0; hr < 2; hr++) {
				const uint4 h = W.hd[r][hr];
				const uint32_t A = (h.y >> (8 * q)) & 255, B = (h.z >> (8 * q)) & 255,
				               C = (h.w >> (8 * q)) & 255;
				const int sc = (int)(t < 2 ? (A & 63) : ((C & 15) | ((A >> 6) << 4)));
				const int mn = (int)(t < 2 ? (B & 63) : ((C >> 4) | ((B >> 6) << 4)));
				const int v = 254 * c[2 * hr + 1] + c3[2 * hr]; /* parts 2 and 3 */
				const float dot = fmaf((float)v, 1.f / 64516.f, (float)c[2 * hr]);
				const float d = gm_f16(h.x), dmin = gm_f16(h.x >> 16);
				/* (d sc s dot) p: the product's range stays normal, p scales it exactly */
				acc[r][hr] = fmaf(d * (float)sc * xs * dot, xp,
				                  fmaf(-dmin * (float)mn, xsum, acc[r][hr]));
			}
		}
	}
}

/* the rows' dots: the sum over the 4 lanes of a row (every lane gets it) */
template <int R> __device__ __forceinline__ void mi8_rows_sum(float (&acc)[R][2])
{
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int hr = 0; hr < 2; hr++) {
			acc[r][hr] += __shfl_xor_sync(0xffffffffu, acc[r][hr], 1);
			acc[r][hr] += __shfl_xor_sync(0xffffffffu, acc[r][hr], 2);
		}
}

#endif
