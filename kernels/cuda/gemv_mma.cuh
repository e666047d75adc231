/* Experiment: decode GEMV on tensor cores (mma.sync.m16n8k16, fp16 in, fp32 accumulate) for the
 * GLM-5 quant mix Q4_K / Q5_K / Q6_K / Q8_0 (and, for the MoE kernels, the codebook types IQ2_XXS ...
 * IQ3_S: gm_unit_iq). Same semantics as kcuda_matmul's GEMV:
 * Y[t][r] = dot(W row r, X[t]) for n_tok 1..8, W in the GGUF block layout in device memory, X and Y
 * fp32. Lives in bench/ until it is measured and promoted (STYLE.md: one kernel per op in the tree).
 *
 * Why tensor cores: the fp32 GEMV (kernels/cuda/matmul_gemv.cu) is integer-ALU bound on K-quants
 * (docs/PERFORMANCE.md). Here the weights become the A operand (16 rows x 16 k) as exact small
 * integers in fp16, built two per LOP3 by dropping 4-bit fields into the mantissa of 1024.0
 * ((q & 0x000F000F) | 0x64006400 = 1024 + q in each half) and one fused HFMA2/HADD2 that removes
 * the 1024 (and, for Q4_K/Q5_K, multiplies by the 6-bit sub-block scale: sc * q <= 1953 is exact).
 * The tensor core then does the multiply-adds that cost the fp32 kernel most of its instructions.
 *
 * Activations: B (16 k x 8 columns) holds up to 4 tokens per mma, each token twice: column
 * 2 tok = fp16(x) ("hi"), column 2 tok + 1 = fp16(2048 (x - hi)) ("lo"). hi + lo / 2048 carries 22
 * bits of x, so a dot costs no more accuracy than fp32 does (tolerance in bench_cuda_gemv_mma.cu);
 * the lo column is free (n_tok 1 would leave 7 of 8 columns empty anyway). Tokens 5-8 take a
 * second mma on the same A. Each warp converts its own X slice per unit into fragment order in
 * shared memory with all lanes busy (gm_stage_x), shared by the R row tiles of the warp; a step
 * then costs one LDS.64 per lane for B.
 *
 * Fragment layout (PTX ISA, m16n8k16 .f16): lane = 4 g + t. A: a0 = (row g, k 2t..2t+1),
 * a1 = (row g+8, same k), a2 = (row g, k 2t+8..2t+9), a3 = (row g+8, same); B: b0 = (k 2t..2t+1,
 * col g), b1 = (k 2t+8..2t+9, col g); D: d0,d1 = (row g, col 2t, 2t+1), d2,d3 = (row g+8, ...).
 * The order of k inside one mma is free as long as A and B agree: in every step, lane t supplies
 * four consecutive elements e0(t, step) + {0,1,2,3} of its rows, as k = {2t, 2t+8, 2t+1, 2t+9}, so
 * a quant word's bytes 0,2 and 1,3 each make one half2 register, and B is one float4 of x.
 *
 * Grid: a block (GM_WARPS warps) owns 16 R consecutive rows (R = 1 or 2 tiles per warp); its
 * warps split K in units of 256 elements (warp w: units w, w + GM_WARPS, ...) and reduce through
 * shared memory. Units:
 *   Q4_K / Q5_K: one super-block; lane t owns chunk t of qs (elements 64t .. 64t+63, sub-blocks
 *     2t and 2t+1): 16-byte loads; scales folded into A; the mins go through a second mma whose A
 *     is the sub-block min, one a step (sum_k m(k) x_k = sum_sb m_sb sum(x over sb)), or, for a
 *     lane type with kMinSums, one a unit from the sums the staging formed (gm_stage_sum); d and
 *     dmin applied to the two accumulators once per super-block.
 *   Q6_K: one super-block; step = one 16-element scale group (int8 scales times q - 32 can reach
 *     4096, not exact in fp16), so the scale is applied to the fp32 accumulator per step. Blocks
 *     are 210 B (2-byte aligned): 4-byte loads, funnel-shifted for odd super-blocks.
 *   Q8_0: eight 34-byte blocks (272 B, 16-byte aligned); two steps per block, d per block on the
 *     accumulator; 4-byte loads (odd blocks aligned, even ones funnel-shifted).
 * Assumes: n_in % 256 == 0 (Q6_K: % 512, so rows start 4-byte aligned), W and X 16-byte aligned,
 * ldx % 4 == 0, |x| > 1e-6 for full accuracy (a unit with |x| >= 2^15 is staged scaled by a power
 * of two, gm_xscale), W
 * buffers padded by 16 bytes as kcuda_weight_upload does (the funnel loads of the last Q8_0
 * block read 2 bytes past it).
 * Rows past n_out are clamped for loads and not stored. */
#ifndef TANDEM_KERNELS_CUDA_GEMV_MMA_CUH
#define TANDEM_KERNELS_CUDA_GEMV_MMA_CUH

#include <errno.h>
#include <stdlib.h>
#include <vector>

#include "kernels/cuda/quant_piece.cuh"

#define GM_WARPS 4

/* Every helper below also compiles for the host, where bench_cuda_gemv_mma's emulator runs the
 * unit bodies lane by lane (gm_emu: mma.sync replayed from recorded fragments), so the fragment
 * and bit logic is tested on a machine without a GPU. */
#define GM_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define GM_UNROLL _Pragma("unroll")
#else
#define GM_UNROLL /* the host compiler does not know the pragma */
#endif

/* Host emulation of one warp's mma.sync: pass 1 records each lane's fragments per call, the
 * products are formed from all 32 lanes (PTX layout), pass 2 adds them in call order. */
struct gm_emu {
	int pass, lane, call;
	std::vector<uint32_t> rec[32]; /* a0..a3, b0, b1 per call */
	std::vector<float> prod[32]; /* d0..d3 per call */
};
static gm_emu *gm_emu_ctx;

/* D += A * B, m16n8k16, fp16 inputs, fp32 accumulate */
GM_HD void gm_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
#ifdef __CUDA_ARCH__
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
	gm_emu &e = *gm_emu_ctx;
	if (e.pass == 1) {
		const uint32_t r[6] = {a0, a1, a2, a3, b0, b1};
		e.rec[e.lane].insert(e.rec[e.lane].end(), r, r + 6);
	} else {
		const float *p = &e.prod[e.lane][4 * (size_t)e.call++];
		for (int i = 0; i < 4; i++)
			d[i] += p[i];
	}
#endif
}

template <class V> GM_HD V gm_ldg(const V *p)
{
#ifdef __CUDA_ARCH__
	return __ldg(p);
#else
	return *p;
#endif
}
GM_HD float gm_f16(uint32_t h) /* fp16 in the low 16 bits */
{
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half((uint16_t)h));
#else
	return kfp16_to_f32((uint16_t)h);
#endif
}
/* the emulator's products: from the 32 lanes' recorded fragments of every call (PTX m16n8k16
 * layout) each lane's d0..d3, in double then rounded once (host only; the benches' emu modes) */
static inline void gm_emu_replay(gm_emu &emu)
{
	const size_t n_calls = emu.rec[0].size() / 6;
	for (int l = 0; l < 32; l++)
		emu.prod[l].assign(4 * n_calls, 0.f);
	for (size_t c = 0; c < n_calls; c++) {
		float A[16][16], B[16][8];
		for (int l = 0; l < 32; l++) {
			const uint32_t *f = &emu.rec[l][6 * c];
			const int g = l >> 2, t = l & 3;
			for (int h = 0; h < 2; h++) {
				A[g][2 * t + h] = gm_f16(f[0] >> (16 * h));
				A[g + 8][2 * t + h] = gm_f16(f[1] >> (16 * h));
				A[g][2 * t + 8 + h] = gm_f16(f[2] >> (16 * h));
				A[g + 8][2 * t + 8 + h] = gm_f16(f[3] >> (16 * h));
				B[2 * t + h][g] = gm_f16(f[4] >> (16 * h));
				B[2 * t + 8 + h][g] = gm_f16(f[5] >> (16 * h));
			}
		}
		for (int l = 0; l < 32; l++) {
			const int g = l >> 2, t = l & 3;
			for (int i = 0; i < 4; i++) {
				const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
				double d = 0;
				for (int k = 0; k < 16; k++)
					d += (double)A[row][k] * B[k][col];
				emu.prod[l][4 * c + i] = (float)d;
			}
		}
	}
}
GM_HD uint32_t gm_pack(float lo, float hi) /* half2 bits, round to nearest even */
{
#ifdef __CUDA_ARCH__
	const __half2 h = __floats2half2_rn(lo, hi);
	return *(const uint32_t *)&h;
#else
	return (uint32_t)kf32_to_fp16(lo) | (uint32_t)kf32_to_fp16(hi) << 16;
#endif
}
GM_HD uint32_t gm_hfma2(uint32_t a, uint32_t b, uint32_t c)
{
#ifdef __CUDA_ARCH__
	uint32_t d;
	asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
#else /* fused: exact in double for the fp16 operands, one rounding */
	const double lo = (double)gm_f16(a) * gm_f16(b) + gm_f16(c);
	const double hi = (double)gm_f16(a >> 16) * gm_f16(b >> 16) + gm_f16(c >> 16);
	return gm_pack((float)lo, (float)hi);
#endif
}
GM_HD uint32_t gm_hadd2(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
	uint32_t d;
	asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
	return d;
#else
	return gm_pack(gm_f16(a) + gm_f16(b), gm_f16(a >> 16) + gm_f16(b >> 16));
#endif
}
GM_HD uint32_t gm_perm(uint32_t x, uint32_t y, uint32_t sel)
{
#ifdef __CUDA_ARCH__
	return __byte_perm(x, y, sel);
#else
	const uint64_t v = x | (uint64_t)y << 32;
	uint32_t r = 0;
	for (int i = 0; i < 4; i++)
		r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 255) << (8 * i);
	return r;
#endif
}
GM_HD float gm_s8(uint32_t w, int k) /* signed byte k of w */
{
#ifdef __CUDA_ARCH__
	return kc_s8(w, k);
#else
	return (float)(int8_t)(w >> (8 * k));
#endif
}
GM_HD void gm_syncwarp(void)
{
#ifdef __CUDA_ARCH__
	__syncwarp();
#endif
}
/* half2 (v, v) of a float that fp16 holds exactly (small integers, their /16 and *1024) */
GM_HD uint32_t gm_h2(float v)
{
	return gm_pack(v, v);
}
/* 32-bit word at p. AM 1: p 4-byte aligned (plain load); 0: p = 2 mod 4 (two aligned loads and
 * a funnel shift), known at compile time from the block layout; 2: either, found at run time
 * (the MoE's Q6_K rows of 210 bytes, n_in 256, where the lanes of a warp differ) */
template <int AM> GM_HD uint32_t gm_ldw(const uint8_t *p)
{
	if (AM == 1)
		return gm_ldg((const uint32_t *)p);
	if (AM == 0) {
		const uint32_t *b = (const uint32_t *)(p - 2);
		return (gm_ldg(b) >> 16) | (gm_ldg(b + 1) << 16); /* one funnel shift (SHF) */
	}
	const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
	const uint32_t sh = ((uint32_t)(uintptr_t)p & 3u) * 8u;
#ifdef __CUDA_ARCH__
	return __funnelshift_r(gm_ldg(b), gm_ldg(b + 1), sh);
#else
	return sh ? (gm_ldg(b) >> sh) | (gm_ldg(b + 1) << (32 - sh)) : gm_ldg(b);
#endif
}
GM_HD uint32_t gm_u16(const uint8_t *p)
{
	return *(const uint16_t *)p;
}

/* X staging: at the start of each 256-element unit a warp converts its slice of X for the (up
 * to 4 NG) tokens into B fragments in shared memory, every lane busy: entry q (0..63) of token tok
 * is x[tok][4q .. 4q+3], one step's four elements for one lane t; hi goes to column 2 (tok % 4),
 * lo to the next. The steps then read their fragments with one conflict-free LDS.64 per lane
 * (sb[k][s][lane]). K45: lane t owns elements 64t + 4s (q = 16t + s); otherwise 16s + 4t
 * (q = 4s + t). Columns of tokens >= n_tok hold zeros (set once) and are never stored. Steps
 * are 33 entries apart so the staging stores of consecutive steps (K45: 16 lanes write steps
 * 0..15 of one column) land in different banks (32 apart: 16-way conflicts; 33: at most 2-4). */
template <int NG> struct gm_stage {
	uint2 b[NG][16][33]; /* 33: a step's 32 entries plus one of padding, see above */
	float f[4 * NG]; /* per token: the unit was staged times 1 / f (a power of two; 1 nearly always) */
	/* Q4_K / Q5_K with the sub-block sums (a lane type whose kMinSums is true, gm_stage_sum): the B
	 * fragment b0 of the mins product for lane (g, t) of n-tile k: sub-blocks 2t and 2t + 1 of column
	 * g, i.e. (sum of the sub-block's 32 x) / 32 of token 4 k + g / 2, as fp16 hi (g even) or lo */
	uint32_t s[NG][32];
};

/* fp16 holds |x| < 65504 and the lo part needs headroom: a unit whose largest |x| reaches 2^15 is
 * staged times 2^(15 - e) (m < 2^e), exactly, and its partial sums are multiplied back by the unit
 * bodies (sm.f). Below 2^15 the factor is 1 and nothing changes. Inf / NaN stay as they are (the
 * sampler reports a non-finite logit). */
GM_HD float gm_xscale(float m)
{
	if (!(m >= 32768.f) || !(m <= 3.4e38f))
		return 1.f;
	int e;
	(void)frexpf(m, &e); /* m = f 2^e, 0.5 <= f < 1 */
	return ldexpf(1.f, 15 - e);
}

/* Where token column tok's activations start: rows ldx apart (the GEMV), or a table of row
 * pointers (the MoE: the tokens routed to one expert are not contiguous) */
struct gm_rows_strided {
	const float *x;
	int64_t ldx;
	GM_HD const float *operator()(int tok) const
	{
		return x + tok * ldx;
	}
};
struct gm_rows_table {
	const float *const *xr;
	GM_HD const float *operator()(int tok) const
	{
		return xr[tok];
	}
};

/* The range vote on the packed halves: bit 15 of a half of the result is set when that half's
 * |value| field is >= 0x7800, i.e. fp16(x) >= 2^15 in magnitude (or inf / NaN). The packing has
 * computed the halves anyway; a value that rounds up to 2^15 from below is flagged too, which only
 * sends the unit to the slow path with factor 1 (the same bits). */
GM_HD uint32_t gm_big_bits(uint32_t h)
{
	return (h & 0x7fff7fffu) + 0x08000800u; /* no carry between the halves: 0x7fff + 0x0800 < 2^16 */
}

/* one float4 of token tok (elements 4q .. 4q+3 of the unit), times sc, as hi / lo halves; returns
 * gm_big_bits of the hi halves (OR-ed; & 0x80008000 tests the vote) */
template <bool K45, int NG>
GM_HD uint32_t gm_stage_entry(gm_stage<NG> &sm, float4 v, float sc, int tok, int q)
{
	const int st = K45 ? (q & 15) : (q >> 2), t = K45 ? (q >> 4) : (q & 3);
	v.x *= sc, v.y *= sc, v.z *= sc, v.w *= sc; /* a power of two: exact */
	const uint32_t h0 = gm_pack(v.x, v.z), h1 = gm_pack(v.y, v.w);
	/* x - hi is exact in fp32, so is the scaling by 2^11 */
	const uint32_t l0 = gm_pack((v.x - gm_f16(h0)) * 2048.f, (v.z - gm_f16(h0 >> 16)) * 2048.f);
	const uint32_t l1 = gm_pack((v.y - gm_f16(h1)) * 2048.f, (v.w - gm_f16(h1 >> 16)) * 2048.f);
	uint2 *row = sm.b[tok >> 2][st];
	const int g = 2 * (tok & 3);
	row[4 * g + t] = make_uint2(h0, h1);
	row[4 * (g + 1) + t] = make_uint2(l0, l1);
	return gm_big_bits(h0) | gm_big_bits(h1);
}

/* The mins of a Q4_K / Q5_K unit as ONE product a row tile and n-tile, not one a step: sum_k m(k) x_k =
 * sum_sb m_sb S_sb with S_sb the sum of sub-block sb's 32 x. The unit bodies then take A = 32 m_sb (at
 * most 2016: exact in fp16) in k slots 0..7 and B = S_sb / 32 (below 2^15 while every |x| is: the
 * range vote's bound) as hi and 2048 (S / 32 - hi) lo, like x. Entry q of a token (x[4q .. 4q + 3]) is
 * in sub-block q / 8, and the entries of one round of the staging loops are held by consecutive lanes,
 * so the 8 lanes of a sub-block sum it with three shuffles; its lanes 0 and 1 store hi and lo. Every
 * lane of the warp must call this in the same round. v times sc (a power of two) first, as staged. */
template <int NG> GM_HD void gm_stage_sum(gm_stage<NG> &sm, float4 v, float sc, int tok, int q, int lane)
{
#ifdef __CUDA_ARCH__
	v.x *= sc, v.y *= sc, v.z *= sc, v.w *= sc;
	float s = (v.x + v.y) + (v.z + v.w);
	s += __shfl_xor_sync(0xffffffffu, s, 1);
	s += __shfl_xor_sync(0xffffffffu, s, 2);
	s += __shfl_xor_sync(0xffffffffu, s, 4);
	const int c = lane & 7, sb = q >> 3;
	if (c < 2) {
		s *= 0.03125f;
		const float hi = __half2float(__float2half_rn(s));
		uint16_t *p = (uint16_t *)&sm.s[tok >> 2][4 * (2 * (tok & 3) + c) + (sb >> 1)];
		p[sb & 1] = __half_as_ushort(__float2half_rn(c == 0 ? s : (s - hi) * 2048.f));
	}
#else /* the host emulator stages a warp's entries in one lane: the sums are not formed there */
	(void)sm, (void)v, (void)sc, (void)tok, (void)q, (void)lane;
	abort();
#endif
}

/* the unit's X of every token column into the staging area (xs(tok): the token's row); MS: also the
 * sub-block sums of gm_stage_sum (K45 only; on the GPU only) */
template <bool K45, int NG, class XS, bool MS = false>
GM_HD void gm_stage_x(gm_stage<NG> &sm, XS xs, int n_tok, int64_t u, int lane)
{
	gm_syncwarp(); /* the previous unit's reads are done */
	const int nt = n_tok < 4 * NG ? n_tok : 4 * NG, n_ent = 64 * nt;
#ifdef __CUDA_ARCH__
	const int e0 = lane, de = 32;
#else /* the emulator runs lanes one after another: each does the whole warp's share */
	const int e0 = 0, de = 1;
#endif
	/* the common case: every |x| < 2^15, staged as it is (factor 1); loads all in flight */
	uint32_t vote = 0u;
	for (int e = e0; e < n_ent; e += de) {
		const float4 v = gm_ldg((const float4 *)(xs(e >> 6) + 256 * u + 4 * (e & 63)));
		vote |= gm_stage_entry<K45, NG>(sm, v, 1.f, e >> 6, e & 63);
		if constexpr (MS)
			gm_stage_sum<NG>(sm, v, 1.f, e >> 6, e & 63, lane);
	}
	for (int i = e0; i < nt; i += de)
		sm.f[i] = 1.f;
	bool big = (vote & 0x80008000u) != 0u;
#ifdef __CUDA_ARCH__
	big = __any_sync(0xffffffffu, big);
#endif
	if (big) { /* rare: some token's unit reaches 2^15: stage every token again with its own scale */
		gm_syncwarp();
		for (int tok = 0; tok < nt; tok++) {
			const float *xt = xs(tok) + 256 * u;
			float m = 0.f; /* the token's largest |x| in this unit, over the warp */
			for (int q = e0; q < 64; q += de) {
				const float4 v = gm_ldg((const float4 *)(xt + 4 * q));
				m = fmaxf(
				    m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
			}
#ifdef __CUDA_ARCH__
			GM_UNROLL
			for (int o = 16; o > 0; o >>= 1)
				m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
#endif
			const float sc = gm_xscale(m);
			if (e0 == 0)
				sm.f[tok] = 1.f / sc;
			for (int q = e0; q < 64; q += de) {
				const float4 v = gm_ldg((const float4 *)(xt + 4 * q));
				gm_stage_entry<K45, NG>(sm, v, sc, tok, q);
				if constexpr (MS)
					gm_stage_sum<NG>(sm, v, sc, tok, q, lane);
			}
		}
	}
	gm_syncwarp();
}

/* Whether a lane type asks for the mins through the staged sub-block sums (gm_stage_sum): its
 * static member kMinSums; lane types without one do not */
template <class LN, class = void> struct gm_min_sums {
	static constexpr bool value = false;
};
template <class LN> struct gm_min_sums<LN, decltype((void)LN::kMinSums)> {
	static constexpr bool value = LN::kMinSums;
};

/* Per-lane state shared by the unit bodies: lane coordinates, the warp's staged X, and the
 * accumulators acc[r][grp][i] in D layout (i = 0,1: row
 * g hi/lo; 2,3: row g+8 hi/lo; the token is 4 grp + t). */
template <int R, int NG> struct gm_lane {
	int g, t, lane, n_tok;
	gm_stage<NG> *sm;
	const float *x;
	int64_t ldx;
	float acc[R][NG][4];
	/* unit u's X into the staging area (the unit bodies call this while their weights load; the
	 * MoE's lane type, moe_mma_units.cuh, has its own) */
	template <bool K45> GM_HD void stage(int64_t u)
	{
		gm_stage_x<K45, NG>(*sm, gm_rows_strided{x, ldx}, n_tok, u, lane);
	}
};
/* The unit bodies below take any lane type LN with gm_lane's members g, t, lane, sm, acc and a
 * stage<K45>(u) member. */
template <class LN> GM_HD uint2 gm_b(const LN &L, int k, int s)
{
	return L.sm->b[k][s][L.lane];
}

/* Loads per row of a tile: r in [0, R), hr 0 = row g, 1 = row g+8 */
#define GM_FOR_ROWS(R) GM_UNROLL for (int r = 0; r < R; r++) GM_UNROLL for (int hr = 0; hr < 2; hr++)

/* ---- Q4_K / Q5_K: one super-block per unit -------------------------------------------------- */
/* the unit's weight words of one lane (a super-block per row: header, its 32 bytes of qs, Q5_K's
 * high bits), loaded by gm_k45_load and used by gm_k45_math: split so a caller can have the next
 * unit's loads in flight while it computes this one (moe_small.cu) */
template <int T, int R> struct gm_k45_w {
	uint4 hd[R][2], qa[R][2], qb[R][2], ha[R][2], hb[R][2];
};
template <int T, int R>
GM_HD void gm_k45_load(gm_k45_w<T, R> &W, const uint8_t *const (&rows)[R][2], int64_t u, int t)
{
	constexpr bool Q5 = T == KT_Q5_K;
	constexpr int BYTES = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
	GM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)BYTES * u;
		W.hd[r][hr] = gm_ldg((const uint4 *)b);
		W.qa[r][hr] = gm_ldg((const uint4 *)(b + QS + 32 * t));
		W.qb[r][hr] = gm_ldg((const uint4 *)(b + QS + 32 * t + 16));
		if (Q5) {
			W.ha[r][hr] = gm_ldg((const uint4 *)(b + 16));
			W.hb[r][hr] = gm_ldg((const uint4 *)(b + 32));
		}
	}
}
/* MS (the lane type's kMinSums): the mins as one product a row tile and n-tile from the staged
 * sub-block sums (gm_stage_sum) instead of one a step, and an n-tile past the unit's tokens skipped */
template <int T, int R, int NG, class LN> GM_HD void gm_k45_math(LN &L, const gm_k45_w<T, R> &W, int64_t u)
{
	constexpr bool Q5 = T == KT_Q5_K, MS = gm_min_sums<LN>::value;
	const uint4(&hd)[R][2] = W.hd;
	const uint4(&qa)[R][2] = W.qa;
	const uint4(&qb)[R][2] = W.qb;
	const uint4(&ha)[R][2] = W.ha;
	const uint4(&hb)[R][2] = W.hb;
	L.template stage<true>(u); /* while the weights load */
	/* sub-blocks 2t (low nibbles) and 2t+1 (high nibbles): A multipliers and the mins */
	uint32_t s_lo[R][2], n_lo[R][2], s_hi[R][2], n_hi[R][2], m_lo[R][2], m_hi[R][2]; /* MS: m_lo only */
	float dd[R][2], dm[R][2];
	GM_FOR_ROWS(R)
	{
		const uint4 h = hd[r][hr];
		int sc[2], mn[2];
		GM_UNROLL
		for (int e = 0; e < 2; e++) {
			const int q = 2 * (L.t & 1) + e;
			const uint32_t A = (h.y >> (8 * q)) & 255, B = (h.z >> (8 * q)) & 255,
			               C = (h.w >> (8 * q)) & 255;
			sc[e] = (int)(L.t < 2 ? (A & 63) : ((C & 15) | ((A >> 6) << 4)));
			mn[e] = (int)(L.t < 2 ? (B & 63) : ((C >> 4) | ((B >> 6) << 4)));
		}
		s_lo[r][hr] = gm_h2((float)sc[0]);
		n_lo[r][hr] = gm_h2(-1024.f * sc[0]); /* (1024 + q) sc - 1024 sc */
		s_hi[r][hr] = gm_h2(sc[1] / 16.f); /* (1024 + 16 q) sc / 16 - 64 sc */
		n_hi[r][hr] = gm_h2(-64.f * sc[1]);
		/* MS: A of the mins product, 32 m of sub-blocks 2t and 2t + 1 in k slots 2t and 2t + 1 */
		if constexpr (MS) {
			m_lo[r][hr] = gm_pack(32.f * mn[0], 32.f * mn[1]);
		} else {
			m_lo[r][hr] = gm_h2((float)mn[0]);
			m_hi[r][hr] = gm_h2((float)mn[1]);
		}
		dd[r][hr] = gm_f16(h.x), dm[r][hr] = gm_f16(h.x >> 16);
	}
	float dq[R][NG][4], dn[R][NG][4];
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		GM_UNROLL
	for (int i = 0; i < 4; i++)
		dq[r][k][i] = 0.f, dn[r][k][i] = 0.f;
	GM_UNROLL
	for (int i = 0; i < 8; i++) { /* word i of the chunk: step i (low nibbles), 8 + i (high) */
		uint32_t bl[NG][2], bh[NG][2];
		GM_UNROLL
		for (int k = 0; k < NG; k++) {
			if (MS && k > 0 && L.n_tok <= 4 * k) { /* skipped below */
				bl[k][0] = bl[k][1] = bh[k][0] = bh[k][1] = 0u;
				continue;
			}
			const uint2 b0 = gm_b(L, k, i), b1 = gm_b(L, k, 8 + i);
			bl[k][0] = b0.x, bl[k][1] = b0.y, bh[k][0] = b1.x, bh[k][1] = b1.y;
		}
		GM_UNROLL
		for (int r = 0; r < R; r++) {
			uint32_t v[2][4]; /* [hr]: low 02, low 13, high 02, high 13 (1024 + q, 1024 + 16 q) */
			GM_UNROLL
			for (int hr = 0; hr < 2; hr++) {
				const uint4 q4 = i < 4 ? qa[r][hr] : qb[r][hr];
				const uint32_t w = (i & 3) == 0   ? q4.x
				                   : (i & 3) == 1 ? q4.y
				                   : (i & 3) == 2 ? q4.z
				                                  : q4.w;
				const uint32_t w8 = w >> 8;
				uint32_t l02 = (w & 0x000F000Fu) | 0x64006400u,
				         l13 = (w8 & 0x000F000Fu) | 0x64006400u;
				uint32_t h02 = (w & 0x00F000F0u) | 0x64006400u,
				         h13 = (w8 & 0x00F000F0u) | 0x64006400u;
				if (Q5) {
					const uint4 h4 = i < 4 ? ha[r][hr] : hb[r][hr];
					const uint32_t hw = (i & 3) == 0   ? h4.x
					                    : (i & 3) == 1 ? h4.y
					                    : (i & 3) == 2 ? h4.z
					                                   : h4.w;
					const uint32_t hs =
					    hw >> (2 * L.t); /* bit 0: low sub-block, bit 1: high */
					l02 |= (hs << 4) & 0x00100010u;
					l13 |= (hs >> 4) & 0x00100010u;
					h02 |= (hs << 7) & 0x01000100u;
					h13 |= (hs >> 1) & 0x01000100u;
				}
				v[hr][0] = gm_hfma2(l02, s_lo[r][hr], n_lo[r][hr]);
				v[hr][1] = gm_hfma2(l13, s_lo[r][hr], n_lo[r][hr]);
				v[hr][2] = gm_hfma2(h02, s_hi[r][hr], n_hi[r][hr]);
				v[hr][3] = gm_hfma2(h13, s_hi[r][hr], n_hi[r][hr]);
			}
			GM_UNROLL
			for (int k = 0; k < NG; k++) {
				if constexpr (MS) {
					if (k > 0 && L.n_tok <= 4 * k)
						continue; /* no token in this n-tile */
					gm_mma(dq[r][k], v[0][0], v[1][0], v[0][1], v[1][1], bl[k][0],
					       bl[k][1]);
					gm_mma(dq[r][k], v[0][2], v[1][2], v[0][3], v[1][3], bh[k][0],
					       bh[k][1]);
					continue;
				}
				gm_mma(dq[r][k], v[0][0], v[1][0], v[0][1], v[1][1], bl[k][0], bl[k][1]);
				gm_mma(dn[r][k], m_lo[r][0], m_lo[r][1], m_lo[r][0], m_lo[r][1], bl[k][0],
				       bl[k][1]);
				gm_mma(dq[r][k], v[0][2], v[1][2], v[0][3], v[1][3], bh[k][0], bh[k][1]);
				gm_mma(dn[r][k], m_hi[r][0], m_hi[r][1], m_hi[r][0], m_hi[r][1], bh[k][0],
				       bh[k][1]);
			}
		}
	}
	if constexpr (MS) {
		GM_UNROLL
		for (int r = 0; r < R; r++)
			GM_UNROLL
		for (int k = 0; k < NG; k++)
			if (k == 0 || L.n_tok > 4 * k)
				gm_mma(dn[r][k], m_lo[r][0], m_lo[r][1], 0u, 0u, L.sm->s[k][L.lane], 0u);
	}
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		GM_UNROLL
	for (int i = 0; i < 4; i++) {
		const int hr = i >> 1;
		const float f = L.sm->f[4 * k + L.t]; /* the unit's x scale back (1 nearly always) */
		L.acc[r][k][i] = fmaf(dd[r][hr] * f, dq[r][k][i], L.acc[r][k][i]);
		L.acc[r][k][i] = fmaf(-dm[r][hr] * f, dn[r][k][i], L.acc[r][k][i]);
	}
}

template <int T, int R, int NG, class LN>
GM_HD void gm_unit_k45(LN &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	gm_k45_w<T, R> W;
	gm_k45_load<T, R>(W, rows, u, L.t);
	gm_k45_math<T, R, NG>(L, W, u);
}

/* ---- Q6_K: one super-block per unit; AM: the super-block's alignment (gm_ldw) ------------------ */
template <int AM, int R, int NG, class LN>
GM_HD void gm_unit_q6k(LN &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	uint32_t ql[R][2][8], qh[R][2][4], sc[R][2][4];
	float d[R][2];
	GM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)210 * u;
		GM_UNROLL
		for (int i = 0; i < 8; i++) /* i = 4n + 2 (j & 1) + hh */
			ql[r][hr][i] =
			    gm_ldw<AM>(b + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * L.t);
		GM_UNROLL
		for (int i = 0; i < 4; i++) { /* i = 2n + hh */
			qh[r][hr][i] = gm_ldw<AM>(b + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * L.t);
			sc[r][hr][i] = gm_ldw<AM>(b + 192 + 4 * i);
		}
		d[r][hr] = gm_f16(gm_u16(b + 208));
	}
	L.template stage<false>(u);
	float fk[NG]; /* the unit's x scale back per token group (1 nearly always) */
	GM_UNROLL
	for (int k = 0; k < NG; k++)
		fk[k] = L.sm->f[4 * k + L.t];
	GM_UNROLL
	for (int s = 0; s < 16; s++) { /* one 16-element scale group: elements 128n + 32j + 16hh + .. */
		const int n = s >> 3, j = (s >> 1) & 3, hh = s & 1;
		const int sl = 4 * (j >> 1), sh = 2 * j, is = 8 * n + 2 * j + hh;
		uint32_t b[NG][2];
		GM_UNROLL
		for (int k = 0; k < NG; k++) {
			const uint2 v2 = gm_b(L, k, s);
			b[k][0] = v2.x, b[k][1] = v2.y;
		}
		GM_UNROLL
		for (int r = 0; r < R; r++) {
			uint32_t v[2][2];
			float scale[2];
			GM_UNROLL
			for (int hr = 0; hr < 2; hr++) {
				const uint32_t lw = ql[r][hr][4 * n + 2 * (j & 1) + hh] >> sl;
				const uint32_t hw = qh[r][hr][2 * n + hh] >> sh;
				const uint32_t v02 =
				    (lw & 0x000F000Fu) | ((hw << 4) & 0x00300030u) | 0x64006400u;
				const uint32_t v13 =
				    ((lw >> 8) & 0x000F000Fu) | ((hw >> 4) & 0x00300030u) | 0x64006400u;
				v[hr][0] = gm_hadd2(v02, 0xE420E420u); /* - 1056: q - 32 */
				v[hr][1] = gm_hadd2(v13, 0xE420E420u);
				scale[hr] = d[r][hr] * gm_s8(sc[r][hr][is >> 2], is & 3);
			}
			GM_UNROLL
			for (int k = 0; k < NG; k++) {
				float D[4] = {0.f, 0.f, 0.f, 0.f};
				gm_mma(D, v[0][0], v[1][0], v[0][1], v[1][1], b[k][0], b[k][1]);
				GM_UNROLL
				for (int i = 0; i < 4; i++)
					L.acc[r][k][i] = fmaf(scale[i >> 1] * fk[k], D[i], L.acc[r][k][i]);
			}
		}
	}
}

/* ---- Q8_0: eight blocks (272 B) per unit -------------------------------------------------------- */
template <int R, int NG, class LN>
GM_HD void gm_unit_q80(LN &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	uint32_t qw[R][2][16];
	float d[R][2][8];
	GM_FOR_ROWS(R)
	{
		const uint8_t *b = rows[r][hr] + (size_t)272 * u;
		GM_UNROLL
		for (int s = 0; s < 16; s++) {
			const int bi = s >> 1, off = 34 * bi + 2 + 16 * (s & 1) + 4 * L.t;
			qw[r][hr][s] = (bi & 1) ? gm_ldw<1>(b + off) : gm_ldw<0>(b + off);
		}
		GM_UNROLL
		for (int bi = 0; bi < 8; bi++)
			d[r][hr][bi] = gm_f16(gm_u16(b + 34 * bi));
	}
	L.template stage<false>(u);
	float fk[NG];
	GM_UNROLL
	for (int k = 0; k < NG; k++)
		fk[k] = L.sm->f[4 * k + L.t];
	GM_UNROLL
	for (int bi = 0; bi < 8; bi++) {
		uint32_t b[NG][2][2];
		GM_UNROLL
		for (int k = 0; k < NG; k++)
			GM_UNROLL
		for (int hf = 0; hf < 2; hf++) {
			const uint2 v2 = gm_b(L, k, 2 * bi + hf);
			b[k][hf][0] = v2.x, b[k][hf][1] = v2.y;
		}
		GM_UNROLL
		for (int r = 0; r < R; r++) {
			uint32_t v[2][2][2]; /* [hf][hr][02 / 13] */
			GM_UNROLL
			for (int hf = 0; hf < 2; hf++)
				GM_UNROLL
			for (int hr = 0; hr < 2; hr++) {
				const uint32_t w = qw[r][hr][2 * bi + hf] ^ 0x80808080u; /* int8 + 128 */
				v[hf][hr][0] = gm_hadd2(gm_perm(w, 0x64646464u, 0x4240), 0xE480E480u);
				v[hf][hr][1] = gm_hadd2(gm_perm(w, 0x64646464u, 0x4341), 0xE480E480u);
			}
			GM_UNROLL
			for (int k = 0; k < NG; k++) {
				float D[4] = {0.f, 0.f, 0.f, 0.f};
				gm_mma(D, v[0][0][0], v[0][1][0], v[0][0][1], v[0][1][1], b[k][0][0],
				       b[k][0][1]);
				gm_mma(D, v[1][0][0], v[1][1][0], v[1][0][1], v[1][1][1], b[k][1][0],
				       b[k][1][1]);
				GM_UNROLL
				for (int i = 0; i < 4; i++)
					L.acc[r][k][i] = fmaf(d[r][i >> 1][bi] * fk[k], D[i], L.acc[r][k][i]);
			}
		}
	}
}

/* ---- the codebook types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: one super-block per unit ----------------
 * Step s is elements 16 s .. 16 s + 15: sub-block s >> 1, and lane t's four elements 16 s + 4 t .. are
 * bytes 4 (t & 1) .. of the 8-value group 2 (s & 1) + (t >> 1). A codebook byte is a magnitude <= 63
 * and the sub-block's scale an odd integer ls <= 31 (the float scale is d ls / 8, / 4 or / 1), so A
 * holds +-m ls <= 1953, exact in fp16: (1024 + m) from the byte by a permute, then one HFMA2 by +-ls
 * (sign bits as the halves' sign bits) plus -+1024 ls. The steps accumulate in D, and the block's d
 * times the type's factor is applied once a unit. The words are read with 1- and 2-byte loads (the
 * blocks are 66 ... 110 bytes, only 2-byte aligned); the codebooks through the read-only cache. */
/* quant_piece_iq.cuh's codebooks (host arrays where the units are compiled for the host: test_gm_units.cc,
 * whose __device__ is empty; nvcc instantiates these units for the device only) */
#define GM_GRID(name) kc_grid_##name
/* the 8 sign bits of a 7-bit sign code (bit 7: the parity of bits 0..6; quant_piece_iq.cuh's kc_ksigns) */
GM_HD uint32_t gm_ksigns(uint32_t c)
{
#ifdef __CUDA_ARCH__
	return c | ((uint32_t)(__popc(c) & 1) << 7);
#else
	return c | ((uint32_t)(__builtin_popcount(c) & 1) << 7);
#endif
}
template <int T> struct gm_iq;
/* IQ2_XXS / IQ3_XXS keep a sub-block's four 7-bit sign codes and its 4-bit scale s in one 32-bit word at p
 * (2-byte aligned): group l's signs for bytes 4 hw .., and ls = 2 s + 1 */
GM_HD void gm_iq_aux(const uint8_t *p, int l, int hw, uint32_t &s4, int &ls)
{
	const uint32_t aux = gm_u16(p) | gm_u16(p + 2) << 16;
	s4 = (gm_ksigns((aux >> (7 * l)) & 127u) >> (4 * hw)) & 15u;
	ls = 2 * (int)(aux >> 28) + 1;
}
/* what most of them share: the block's fp16 d in its first two bytes, codebook bytes under sign bits */
struct gm_iq_sb {
	static constexpr bool kI1 = false;
	static GM_HD float d(const uint8_t *b)
	{
		return gm_f16(gm_u16(b));
	}
};
template <> struct gm_iq<KT_IQ2_XXS> : gm_iq_sb {
	static constexpr float kMul = 0.125f;
	/* group l's bytes 4 hw .. 4 hw + 3 of sub-block ib (scale half h) and their 4 sign bits */
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &s4,
	                        int &ls)
	{
		const uint8_t *p = b + 2 + 8 * ib;
		const uint2 e = gm_ldg((const uint2 *)(GM_GRID(iq2xxs) + gm_ldg(p + l)));
		w = hw ? e.y : e.x;
		gm_iq_aux(p + 4, l, hw, s4, ls);
	}
};
template <> struct gm_iq<KT_IQ2_XS> : gm_iq_sb {
	static constexpr float kMul = 0.125f;
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &s4,
	                        int &ls)
	{
		const uint32_t q = gm_u16(b + 2 + 2 * (4 * ib + l));
		const uint2 e = gm_ldg((const uint2 *)(GM_GRID(iq2xs) + (q & 511u)));
		w = hw ? e.y : e.x;
		s4 = (gm_ksigns(q >> 9) >> (4 * hw)) & 15u;
		ls = 2 * (int)((gm_ldg(b + 66 + ib) >> (4 * h)) & 15u) + 1;
	}
};
template <> struct gm_iq<KT_IQ2_S> : gm_iq_sb {
	static constexpr float kMul = 0.125f;
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &s4,
	                        int &ls)
	{
		const uint32_t qh = gm_ldg(b + 66 + ib);
		const uint32_t i = gm_ldg(b + 2 + 4 * ib + l) | ((qh >> (2 * l)) & 3u) << 8;
		const uint2 e = gm_ldg((const uint2 *)(GM_GRID(iq2s) + i));
		w = hw ? e.y : e.x;
		s4 = ((uint32_t)gm_ldg(b + 34 + 4 * ib + l) >> (4 * hw)) & 15u;
		ls = 2 * (int)((gm_ldg(b + 74 + ib) >> (4 * h)) & 15u) + 1;
	}
};
template <> struct gm_iq<KT_IQ3_XXS> : gm_iq_sb {
	static constexpr float kMul = 0.25f;
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &s4,
	                        int &ls)
	{
		w = gm_ldg(GM_GRID(iq3xxs) + gm_ldg(b + 2 + 8 * ib + 2 * l + hw));
		gm_iq_aux(b + 66 + 4 * ib, l, hw, s4, ls);
	}
};
template <> struct gm_iq<KT_IQ3_S> : gm_iq_sb {
	static constexpr float kMul = 1.0f;
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &s4,
	                        int &ls)
	{
		const int j = 2 * l + hw; /* the 4-value codebook entry */
		const uint32_t i = gm_ldg(b + 2 + 8 * ib + j) | ((uint32_t)(gm_ldg(b + 66 + ib) >> j) & 1u)
		                                                    << 8;
		w = gm_ldg(GM_GRID(iq3s) + i);
		s4 = ((uint32_t)gm_ldg(b + 74 + 4 * ib + l) >> (4 * hw)) & 15u;
		ls = 2 * (int)((gm_ldg(b + 106 + ib / 2) >> (4 * (ib & 1))) & 15u) + 1;
	}
};
/* IQ1_S / IQ1_M: codebook bytes are int8 g in {-1, 0, 1} plus a +-1/8 shift per group (IQ1_S: per
 * sub-block), so A holds (8 g +- 1) ls <= 9 * 15 (ls = 2 s + 1, s <= 7) and the factor is d / 8. piece
 * gives the 4 int8 bytes, the shift's sign (dneg: 1 for -1/8) and ls. */
template <> struct gm_iq<KT_IQ1_S> : gm_iq_sb {
	static constexpr bool kI1 = true;
	static constexpr float kMul = 0.125f;
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &dneg,
	                        int &ls)
	{
		const uint32_t q = gm_u16(b + 34 + 2 * ib);
		const uint2 e = gm_ldg((const uint2 *)(GM_GRID(iq1s) + (gm_ldg(b + 2 + 4 * ib + l) |
		                                                        ((q >> (3 * l)) & 7u) << 8)));
		w = hw ? e.y : e.x;
		dneg = q >> 15;
		ls = 2 * (int)((q >> 12) & 7u) + 1;
	}
};
template <> struct gm_iq<KT_IQ1_M> {
	static constexpr bool kI1 = true;
	static constexpr float kMul = 0.125f;
	static GM_HD float d(const uint8_t *b) /* the fp16 scale: the top nibbles of the four scale words */
	{
		return gm_f16((gm_u16(b + 48) >> 12) | ((gm_u16(b + 50) >> 8) & 0x00f0u) |
		              ((gm_u16(b + 52) >> 4) & 0x0f00u) | (gm_u16(b + 54) & 0xf000u));
	}
	static GM_HD void piece(const uint8_t *b, int ib, int l, int hw, int h, uint32_t &w, uint32_t &dneg,
	                        int &ls)
	{
		const uint32_t qh = (uint32_t)gm_ldg(b + 32 + 2 * ib + l / 2) >>
		                    (4 * (l & 1)); /* 3 index bits, the shift's sign */
		const uint2 e =
		    gm_ldg((const uint2 *)(GM_GRID(iq1s) + (gm_ldg(b + 4 * ib + l) | (qh & 7u) << 8)));
		w = hw ? e.y : e.x;
		dneg = (qh >> 3) & 1u;
		ls = 2 * (int)((gm_u16(b + 48 + 2 * (ib / 2)) >> (6 * (ib & 1) + 3 * h)) & 7u) + 1;
	}
};
/* the types gm_unit_iq takes (the host's test; gm_is_iq<T> for the units) */
static constexpr bool gm_iq_type(int t)
{
	return t == KT_IQ2_XXS || t == KT_IQ2_XS || t == KT_IQ2_S || t == KT_IQ3_XXS || t == KT_IQ3_S ||
	       t == KT_IQ1_S || t == KT_IQ1_M;
}
template <int T> constexpr bool gm_is_iq = gm_iq_type(T);

template <int T, int R, int NG, class LN>
GM_HD void gm_unit_iq(LN &L, const uint8_t *const (&rows)[R][2], int64_t u)
{
	const uint8_t *blk[R][2];
	float dm[R][2];
	GM_FOR_ROWS(R)
	{
		blk[r][hr] = rows[r][hr] + (size_t)kq<T>::BYTES * u;
		dm[r][hr] = gm_iq<T>::d(blk[r][hr]) * gm_iq<T>::kMul;
	}
	L.template stage<false>(u);
	float fk[NG];
	GM_UNROLL
	for (int k = 0; k < NG; k++)
		fk[k] = L.sm->f[4 * k + L.t];
	float D[R][NG][4];
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		D[r][k][0] = D[r][k][1] = D[r][k][2] = D[r][k][3] = 0.f;
	const int hw = L.t & 1;
	GM_UNROLL
	for (int s = 0; s < 16; s++) {
		const int ib = s >> 1, h = s & 1, l = 2 * h + (L.t >> 1);
		uint32_t b[NG][2];
		GM_UNROLL
		for (int k = 0; k < NG; k++) {
			const uint2 v2 = gm_b(L, k, s);
			b[k][0] = v2.x, b[k][1] = v2.y;
		}
		GM_UNROLL
		for (int r = 0; r < R; r++) {
			uint32_t v[2][2]; /* [hr][02 / 13] */
			GM_UNROLL
			for (int hr = 0; hr < 2; hr++) {
				uint32_t w, s4;
				int ls;
				gm_iq<T>::piece(blk[r][hr], ib, l, hw, h, w, s4, ls);
				if constexpr (gm_iq<T>::kI1) { /* s4: the shift's sign */
					/* int8 g as 1152 + g (Q8_0's permute), minus 1152: g exactly; then
					 * g 8 ls +- ls */
					const uint32_t w8 = w ^ 0x80808080u, l8 = gm_h2((float)(8 * ls));
					const uint32_t c = gm_h2(s4 ? (float)-ls : (float)ls);
					v[hr][0] = gm_hfma2(
					    gm_hadd2(gm_perm(w8, 0x64646464u, 0x4240), 0xE480E480u), l8, c);
					v[hr][1] = gm_hfma2(
					    gm_hadd2(gm_perm(w8, 0x64646464u, 0x4341), 0xE480E480u), l8, c);
					continue;
				}
				const uint32_t lh = gm_h2((float)ls);
				/* +-ls a half (elements 0, 2 and 1, 3), and -1024 times that: the sign
				 * flipped and 10 added to the exponent (ls <= 31: no carry out of a half) */
				const uint32_t s02 = lh ^ ((s4 & 1u) << 15) ^ ((s4 & 4u) << 29);
				const uint32_t s13 = lh ^ ((s4 & 2u) << 14) ^ ((s4 & 8u) << 28);
				v[hr][0] = gm_hfma2(gm_perm(w, 0x64646464u, 0x4240), s02,
				                    (s02 ^ 0x80008000u) + 0x28002800u);
				v[hr][1] = gm_hfma2(gm_perm(w, 0x64646464u, 0x4341), s13,
				                    (s13 ^ 0x80008000u) + 0x28002800u);
			}
			GM_UNROLL
			for (int k = 0; k < NG; k++)
				gm_mma(D[r][k], v[0][0], v[1][0], v[0][1], v[1][1], b[k][0], b[k][1]);
		}
	}
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		GM_UNROLL
	for (int i = 0; i < 4; i++)
		L.acc[r][k][i] = fmaf(dm[r][i >> 1] * fk[k], D[r][k][i], L.acc[r][k][i]);
}

/* One 256-element unit of this warp's K range, all R tiles (the GEMV and the MoE kernels). rb4:
 * rows start 4-byte aligned (only Q6_K asks: the MoE's 210-byte rows at n_in 256 do not) */
template <int T, int R, int NG, class LN>
GM_HD void gm_unit(LN &L, const uint8_t *const (&rows)[R][2], int64_t u, bool rb4 = true)
{
	if constexpr (T == KT_Q4_K || T == KT_Q5_K)
		gm_unit_k45<T, R, NG>(L, rows, u);
	else if constexpr (T == KT_Q6_K) {
		if (!rb4) /* lanes of one warp differ in alignment */
			gm_unit_q6k<2, R, NG>(L, rows, u);
		else if (u & 1) /* 210 u = 2 mod 4 */
			gm_unit_q6k<0, R, NG>(L, rows, u);
		else
			gm_unit_q6k<1, R, NG>(L, rows, u);
	} else if constexpr (gm_is_iq<T>)
		gm_unit_iq<T, R, NG>(L, rows, u);
	else
		gm_unit_q80<R, NG>(L, rows, u);
}

/* Host emulation of a warp walking rows [0, n_out) of w (rb bytes apart), 16 R at a time, over all n_in / 256
 * units (the benches' emu modes, tests/unit/test_gm_units.cc): the 32 lanes run the unit one after another,
 * mma.sync replayed from their recorded fragments. init(lane) points a lane (g, t, lane, n_tok, sm and acc
 * already set) at its x; store(row, col, v) receives output column col (4 k + t) of each row < n_out,
 * col < n_tok, as hi + lo / 2048. rb4: rows start 4-byte aligned (gm_unit's). */
template <int T, int R, int NG, class LN, class Init, class Store>
static void gm_emulate_rows(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, int n_tok, bool rb4,
                            Init init, Store store)
{
	gm_emu emu;
	gm_emu_ctx = &emu;
	std::vector<LN> L(32);
	std::vector<const uint8_t *> rp(32 * R * 2);
	gm_stage<NG> stage;
	for (int64_t row0 = 0; row0 < n_out; row0 += 16 * R) {
		memset(&stage, 0, sizeof(stage));
		for (float &f : stage.f)
			f = 1.f;
		for (int l = 0; l < 32; l++) {
			LN &a = L[l];
			a.g = l >> 2, a.t = l & 3, a.lane = l, a.n_tok = n_tok, a.sm = &stage;
			memset(a.acc, 0, sizeof(a.acc));
			init(a);
			for (int r = 0; r < R; r++)
				for (int hr = 0; hr < 2; hr++) {
					const int64_t row = row0 + 16 * r + 8 * hr + a.g;
					rp[(l * R + r) * 2 + hr] =
					    w + (size_t)(row < n_out ? row : n_out - 1) * rb;
				}
		}
		for (int64_t u = 0; u < n_in / 256; u++)
			for (int pass = 1; pass <= 2; pass++) {
				if (pass == 2)
					gm_emu_replay(emu);
				emu.pass = pass;
				for (int l = 0; l < 32; l++) {
					const uint8_t *rows[R][2];
					for (int r = 0; r < R; r++)
						rows[r][0] = rp[(l * R + r) * 2],
						rows[r][1] = rp[(l * R + r) * 2 + 1];
					emu.lane = l;
					emu.call = 0;
					if (pass == 1) { /* record the fragments, leave the lane as it was */
						const LN keep = L[l];
						emu.rec[l].clear();
						gm_unit<T, R, NG>(L[l], rows, u, rb4);
						L[l] = keep;
					} else {
						gm_unit<T, R, NG>(L[l], rows, u, rb4);
					}
				}
			}
		for (int l = 0; l < 32; l++)
			for (int r = 0; r < R; r++)
				for (int k = 0; k < NG; k++)
					for (int hr = 0; hr < 2; hr++) {
						const int64_t row = row0 + 16 * r + 8 * hr + L[l].g;
						const int col = 4 * k + L[l].t;
						if (row < n_out && col < n_tok)
							store(row, col,
							      fmaf(L[l].acc[r][k][2 * hr + 1], 1.f / 2048.f,
							           L[l].acc[r][k][2 * hr]));
					}
	}
	gm_emu_ctx = NULL;
}

#ifndef GEMV_MMA_UNITS_ONLY /* moe_mma_units.cuh takes the unit bodies alone */
/* Grid: blockIdx.x = rows [16 R blockIdx.x, 16 R (blockIdx.x + 1)); NG = ceil(n_tok / 4). */
template <int T, int R, int NG>
__global__ void __launch_bounds__(GM_WARPS * 32, 1)
    gemv_mma_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_out, int64_t n_units,
                    const float *__restrict__ x, int64_t ldx, int n_tok, float *__restrict__ y, int64_t ldy)
{
	KDEP_ENTRY();
	__shared__ float part[GM_WARPS][16 * R][4 * NG];
	__shared__ gm_stage<NG> stage[GM_WARPS];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	gm_lane<R, NG> L;
	L.g = lane >> 2, L.t = lane & 3, L.lane = lane, L.sm = &stage[warp];
	L.x = x, L.ldx = ldx, L.n_tok = n_tok;
	for (int i = lane; i < NG * 16 * 33; i += 32)
		(&stage[warp].b[0][0][0])[i] = make_uint2(0u, 0u);
	for (int i = lane; i < 4 * NG; i += 32)
		stage[warp].f[i] = 1.f; /* tokens >= n_tok: zero columns, factor 1 */
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		GM_UNROLL
	for (int i = 0; i < 4; i++)
		L.acc[r][k][i] = 0.f;
	const int64_t row0 = (int64_t)blockIdx.x * 16 * R;
	const uint8_t *rows[R][2];
	GM_FOR_ROWS(R)
	rows[r][hr] = w + (size_t)min(row0 + 16 * r + 8 * hr + L.g, n_out - 1) * row_bytes;

	for (int64_t u = warp; u < n_units; u += GM_WARPS)
		gm_unit<T, R, NG>(L, rows, u);
	/* lane holds rows g, g+8 of each tile for token 4k + t */
	GM_UNROLL
	for (int r = 0; r < R; r++)
		GM_UNROLL
	for (int k = 0; k < NG; k++)
		GM_UNROLL
	for (int hr = 0; hr < 2; hr++)
		part[warp][16 * r + 8 * hr + L.g][4 * k + L.t] =
		    fmaf(L.acc[r][k][2 * hr + 1], 1.f / 2048.f, L.acc[r][k][2 * hr]);
	__syncthreads();
	for (int i = threadIdx.x; i < 16 * R * 4 * NG; i += GM_WARPS * 32) {
		const int rr = i / (4 * NG), tok = i % (4 * NG);
		float s = 0.f;
		GM_UNROLL
		for (int k = 0; k < GM_WARPS; k++)
			s += part[k][rr][tok];
		if (tok < n_tok && row0 + rr < n_out)
			y[tok * ldy + row0 + rr] = s;
	}
}

template <int T, int R>
static int gm_launch_r(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, const float *x, int64_t ldx,
                       int n_tok, float *y, int64_t ldy, cudaStream_t s)
{
	const unsigned grid = (unsigned)((n_out + 16 * R - 1) / (16 * R));
	if (n_tok <= 4)
		return klaunch("gemv_mma", gemv_mma_kernel<T, R, 1>, dim3(grid), dim3(GM_WARPS * 32), 0, s, w,
		               rb, n_out, n_in / 256, x, ldx, n_tok, y, ldy);
	return klaunch("gemv_mma", gemv_mma_kernel<T, R, 2>, dim3(grid), dim3(GM_WARPS * 32), 0, s, w, rb,
	               n_out, n_in / 256, x, ldx, n_tok, y, ldy);
}

template <int T>
static int gm_launch_t(const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out, const float *x, int64_t ldx,
                       int n_tok, float *y, int64_t ldy, cudaStream_t s, int n_sm, int r_tiles)
{
	/* two tiles per warp share the X staging, unless that leaves SMs idle; not for Q6_K/Q8_0,
	 * whose R = 2 instantiations need ~230-250 registers (8 warps/SM against 12-16 at R = 1) */
	const bool heavy = T == KT_Q6_K || T == KT_Q8_0;
	if (r_tiles == 2 || (r_tiles == 0 && !heavy && (n_out + 31) / 32 >= 2 * (int64_t)n_sm))
		return gm_launch_r<T, 2>(w, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s);
	return gm_launch_r<T, 1>(w, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s);
}

/* Y[t][r] = dot(W row r, X[t]), t < n_tok <= 8. r_tiles: row tiles per warp, 1 or 2 (0 = chosen
 * from n_out and the SM count n_sm; the bench forces it for A/B runs). Returns 0, -EINVAL when the shape or
 * alignment is outside what the kernel assumes (header comment), ERR_UNSUPPORTED for other types, ERR_CUDA
 * when the launch fails. */
static inline int gemv_mma(int type, const void *w, size_t row_bytes, int64_t n_in, int64_t n_out,
                           const float *x, int64_t ldx, int n_tok, float *y, int64_t ldy, cudaStream_t s,
                           int n_sm, int r_tiles)
{
	size_t rb;
	if (n_tok < 1 || n_tok > 8 || n_out < 1 || n_in < 256 || n_in % 256 ||
	    !ktype_row_bytes(type, n_in, &rb) || rb != row_bytes ||
	    row_bytes % (type == KT_Q6_K    ? 4
	                 : gm_iq_type(type) ? 2
	                                    : 16) ||
	    (uintptr_t)w % 16 || (uintptr_t)x % 16 || ldx % 4 || ldx < n_in || ldy < n_out || r_tiles < 0 ||
	    r_tiles > 2)
		return -EINVAL;
	const uint8_t *wb = (const uint8_t *)w;
	switch (type) {
	case KT_Q4_K:
		return gm_launch_t<KT_Q4_K>(wb, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s, n_sm, r_tiles);
	case KT_Q5_K:
		return gm_launch_t<KT_Q5_K>(wb, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s, n_sm, r_tiles);
	case KT_Q6_K:
		return gm_launch_t<KT_Q6_K>(wb, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s, n_sm, r_tiles);
	case KT_Q8_0:
		return gm_launch_t<KT_Q8_0>(wb, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s, n_sm, r_tiles);
#define GM_IQ_CASE(T)                                                                                        \
	case T: return gm_launch_t<T>(wb, rb, n_in, n_out, x, ldx, n_tok, y, ldy, s, n_sm, r_tiles);
		GM_IQ_CASE(KT_IQ2_XXS)
		GM_IQ_CASE(KT_IQ2_XS)
		GM_IQ_CASE(KT_IQ2_S)
		GM_IQ_CASE(KT_IQ3_XXS)
		GM_IQ_CASE(KT_IQ3_S)
		GM_IQ_CASE(KT_IQ1_S)
		GM_IQ_CASE(KT_IQ1_M)
#undef GM_IQ_CASE
	default: return ERR_UNSUPPORTED;
	}
}

#endif /* GEMV_MMA_UNITS_ONLY */

#endif
