/* kernels/cuda/k45_i8.cuh's SOURCE run on the CPU (as gemv_res_sim.cc does for its kernel): the 32
 * lanes of one warp are 32 std::threads, __syncwarp a barrier, __shfl_xor_sync an exchange behind
 * it, and mma.sync m16n8k32 (s8 x s8 -> s32) a warp-wide exchange of the fragments in the PTX
 * layout, multiplied out in full. test_k45_i8_sim.sh cuts the header's device part (and
 * gemv_mma.cuh's gm_k45_w / gm_k45_load, which fill a lane's weight words) into .inc files, so CI
 * without a GPU checks the unit's own logic: the three-part staging of x, the fragment trick (each
 * lane's own sub-block in its own B columns), the nibble / fifth-bit extraction, the scale and min
 * decode and the epilogue. Each row's dot is held to a double-precision reference over the
 * dequantized row (this file's own Q4_K / Q5_K decode, written from MODEL-SPEC.md, not the CPU
 * backend's): |sim - ref| <= 1e-6 sum_i |w_i| m_j(i) + 1e-6 sum_i |w_i x_i| + 64 2^-149, where m_j
 * is the largest |x| of element i's sub-block (x's three parts carry <= 6.1e-8 of m_j; the
 * epilogue is fp32; the last term is for denormal results).
 * Cases: Q4_K and Q5_K, one and two tiles of 16 rows (R 1: batch 1's gate / up and down; R 2: the
 * two-tile gate / up block of batches 3-8), random super-blocks (every scale / min code, d and dmin of both
 * signs), x uniform, x with a zero sub-block, one huge element, all tiny (1e-35), x near 1e34 with one
 * element above 1e37, denormal x (1e-41), and an Inf / a NaN (the unit's rows must come out NaN).
 * The same unit made by the producer side (mi8_put4: 4 elements a lane, as fused.cu's add_rmsnorm
 * holds them) and copied (mi8_copy) must equal mi8_stage's bit for bit, and so must the dots.
 * It does not check timing or the kernels around the unit: tests/ops/test_ops_moe.c does that on a
 * GPU. */
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "tests/unit/sim_warp.h"

#include "k45_i8_body.inc"

/* ---- reference: Q4_K / Q5_K super-block decode (MODEL-SPEC.md) ---------------------------------- */
static void ref_scale_min(const uint8_t *q, int j, int *sc, int *mn)
{
	if (j < 4) {
		*sc = q[j] & 63, *mn = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
		*mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}
static void ref_dequant(int type, const uint8_t *b, double *w)
{
	const bool q5 = type == KT_Q5_K;
	const double d = sim_h2f((uint16_t)(b[0] | b[1] << 8)), dmin = sim_h2f((uint16_t)(b[2] | b[3] << 8));
	const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
	for (int j = 0; j < 8; j++) {
		int s, m;
		ref_scale_min(sc, j, &s, &m);
		for (int i = 0; i < 32; i++) {
			const uint8_t byte = qs[32 * (j / 2) + i];
			int q = (j & 1) ? byte >> 4 : byte & 15;
			if (q5)
				q |= ((qh[i] >> j) & 1) << 4;
			w[32 * j + i] = d * s * q - dmin * m;
		}
	}
}

static int fails, checks;

static mi8_x sim_x; /* the warp's staged x (shared memory) */
static mi8_x sim_made, sim_staged; /* the producer's unit (global memory); mi8_stage's, kept */

/* lane l of the warp: x staged (prod: made by the producer, mi8_put4 with 4 elements a lane, two
 * passes of 32 float4, then copied, mi8_copy; else quantized here, mi8_stage), the unit over R tiles
 * of 16 rows (tile r: rows 16 r ..), the rows' dots into got[] by the lanes (g, 0) */
template <int T, int R>
static void lane_body(int l, const uint8_t *rows, size_t bytes, const float *x, float *got, int prod)
{
	const int g = l >> 2, t = l & 3;
	const uint8_t *rp[R][2];
	for (int r = 0; r < R; r++) {
		rp[r][0] = rows + (size_t)(16 * r + g) * bytes;
		rp[r][1] = rows + (size_t)(16 * r + g + 8) * bytes;
	}
	gm_k45_w<T, R> w;
	float acc[R][2];
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = 0.f;
	if (prod == 2) { /* 8 elements a lane (mla_latent's c_q rows) */
		mi8_put8(&sim_made, l, ((const float4 *)x)[2 * l], ((const float4 *)x)[2 * l + 1]);
		__syncwarp();
		mi8_copy(sim_x, &sim_made, l);
	} else if (prod) {
		for (int c = l; c < 64; c += 32) /* float4 c of the row: lanes l & ~7 .. hold one sub-block */
			mi8_put4(&sim_made, c, ((const float4 *)x)[c], true);
		__syncwarp();
		mi8_copy(sim_x, &sim_made, l);
	} else {
		mi8_stage(sim_x, x, l);
		if (l == 0)
			sim_staged = sim_x;
		__syncwarp();
	}
	gm_k45_load<T, R>(w, rp, 0, t);
	mi8_k45_unit<T, R>(acc, w, sim_x, g, t);
	mi8_rows_sum<R>(acc);
	if (t == 0)
		for (int r = 0; r < R; r++) {
			got[16 * r + g] = acc[r][0];
			got[16 * r + g + 8] = acc[r][1];
		}
}

/* one unit: 16 R rows (one super-block each, R tiles) against x; mode: the x pattern */
static void run_case(int type, int R, int mode, std::mt19937 &rng, const char *what)
{
	const bool q5 = type == KT_Q5_K;
	const int BYTES = q5 ? 176 : 144;
	const int NR = 16 * R;
	std::vector<uint8_t> rows((size_t)NR * BYTES);
	std::uniform_int_distribution<int> byte(0, 255);
	std::uniform_real_distribution<float> u(-1.f, 1.f);
	for (int r = 0; r < NR; r++) {
		uint8_t *b = &rows[(size_t)r * BYTES];
		for (int i = 0; i < BYTES; i++)
			b[i] = (uint8_t)byte(rng);
		const uint16_t d = sim_f2h(u(rng) * 0.01f), dm = sim_f2h(u(rng) * 0.01f);
		b[0] = (uint8_t)d, b[1] = (uint8_t)(d >> 8), b[2] = (uint8_t)dm, b[3] = (uint8_t)(dm >> 8);
	}
	alignas(16) float x[256];
	for (int i = 0; i < 256; i++)
		x[i] = u(rng);
	bool want_nan = false;
	switch (mode) {
	case 1: /* a zero sub-block */
		for (int i = 64; i < 96; i++)
			x[i] = 0.f;
		break;
	case 2: /* one element far above its sub-block */ x[37] = 3.0e4f; break;
	case 3: /* all tiny: the exact division */
		for (int i = 0; i < 256; i++)
			x[i] *= 1e-35f;
		break;
	case 4: /* large, one sub-block's largest |x| above 1e37 (the exact division there; the
	         * rows' dots stay below fp32's top) */
		for (int i = 0; i < 256; i++)
			x[i] *= 1e34f;
		x[200] = 1.5e37f;
		break;
	case 7: /* denormal (the scales still normal: mi8_stage's power of two) */
		for (int i = 0; i < 256; i++)
			x[i] *= 1e-41f;
		break;
	case 5: x[100] = INFINITY, want_nan = true; break;
	case 6: x[3] = NAN, want_nan = true; break;
	default: break;
	}
	double ref[32], bound[32];
	for (int r = 0; r < NR; r++) {
		double w[256], s = 0, b1 = 0, b2 = 0;
		ref_dequant(type, &rows[(size_t)r * BYTES], w);
		for (int j = 0; j < 8; j++) {
			double m = 0;
			for (int i = 0; i < 32; i++)
				m = std::fmax(m, std::fabs((double)x[32 * j + i]));
			for (int i = 0; i < 32; i++) {
				s += w[32 * j + i] * x[32 * j + i];
				b1 += std::fabs(w[32 * j + i]) * m;
				b2 += std::fabs(w[32 * j + i] * x[32 * j + i]);
			}
		}
		/* + 64 of fp32's smallest denormals: a denormal result cannot be nearer than its ulp, and
		 * ~20 roundings reach it */
		ref[r] = s, bound[r] = 1e-6 * b1 + 1e-6 * b2 + 64.0 * std::ldexp(1.0, -149);
	}
	float got[32], got_p[32];
	std::barrier<> bar(32);
	sim_bar = &bar;
	for (int prod = 0; prod < 3; prod++) {
		float *o = prod ? got_p : got;
		memset(&sim_made, 0xA5, sizeof(sim_made)); /* every byte must be written */
		std::vector<std::thread> th;
		for (int l = 0; l < 32; l++)
			th.emplace_back([&, l] {
				sim_lane = l;
				if (q5)
					R == 2 ? lane_body<KT_Q5_K, 2>(l, rows.data(), BYTES, x, o, prod)
					       : lane_body<KT_Q5_K, 1>(l, rows.data(), BYTES, x, o, prod);
				else
					R == 2 ? lane_body<KT_Q4_K, 2>(l, rows.data(), BYTES, x, o, prod)
					       : lane_body<KT_Q4_K, 1>(l, rows.data(), BYTES, x, o, prod);
			});
		for (auto &t : th)
			t.join();
		if (!prod)
			continue;
		/* the producers' unit (mi8_put4: 4 elements a lane; mi8_put8: 8) is mi8_stage's bit for bit,
		 * so are the dots */
		checks++;
		if (memcmp(&sim_made, &sim_staged, sizeof(mi8_x)) ||
		    memcmp(got, got_p, sizeof(float) * (size_t)NR)) {
			fails++;
			printf("FAIL %s %s: the producer's parts (%s) differ from mi8_stage's\n",
			       q5 ? "Q5_K" : "Q4_K", what, prod == 1 ? "mi8_put4" : "mi8_put8");
		}
	}
	int bad = 0;
	double worst = 0;
	for (int r = 0; r < NR; r++) {
		checks++;
		const bool ok = want_nan ? std::isnan(got[r]) : std::fabs(got[r] - ref[r]) <= bound[r];
		if (!want_nan)
			worst = std::fmax(worst, std::fabs(got[r] - ref[r]) / bound[r] * 1e-6);
		if (!ok && bad++ < 3)
			printf("FAIL %s %s row %d: sim %.9g ref %.9g (bound %.3g)\n", q5 ? "Q5_K" : "Q4_K",
			       what, r, got[r], ref[r], bound[r]);
	}
	fails += bad;
	printf("%-4s %-22s %d rows: %s (largest |err| / (sum|w| m + sum|w x|) %.2g)\n", q5 ? "Q5_K" : "Q4_K",
	       what, NR, bad ? "FAIL" : "ok", worst);
}

int main(void)
{
	std::mt19937 rng(1234567u);
	printf("seed 1234567\n");
	static const char *names[] = {"uniform",          "zero sub-block",        "one huge element",
	                              "all tiny (1e-35)", "large, one above 1e37", "an Inf (NaN out)",
	                              "a NaN (NaN out)",  "denormal (1e-41)"};
	for (int type : {(int)KT_Q4_K, (int)KT_Q5_K})
		for (int mode = 0; mode < 8; mode++)
			for (int rep = 0; rep < (mode == 0 ? 6 : 2); rep++)
				run_case(type, rep & 1 ? 2 : 1, mode, rng,
				         names[mode]); /* one and two tiles */
	printf("%d checks, %d failed\n", checks, fails);
	return fails ? 1 : 0;
}
