/* The model's CPU ops against brute-force versions written here (seeded random inputs, seed
 * printed): kcpu_topk (ties to the lower index, many exact ties), kcpu_moe_route (group limit,
 * sigmoid/softmax, normalisation), kcpu_rope (interleaved vs half-split are the same rotation on
 * permuted coordinates; norm preserved), kcpu_mla_attn_head (absorbed attention vs direct softmax
 * in double, fp32 and bf16 keys), kcpu_indexer_scores, kcpu_rmsnorm / kcpu_layernorm. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int n_fail;
#define CHECK(c, ...)                                                                                        \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			printf("FAIL line %d: ", __LINE__);                                                  \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

static uint64_t st;
static double ur(void)
{
	st ^= st << 13;
	st ^= st >> 7;
	st ^= st << 17;
	return (double)(st >> 11) * 0x1.0p-53;
}

static void test_topk(void)
{
	int bad = 0, cases = 0;
	for (int n = 1; n <= 70; n++)
		for (int k = 1; k <= n + 2; k += 3) {
			float s[70];
			int32_t out[72], want[72];
			for (int i = 0; i < n; i++)
				s[i] =
				    (float)(int)(ur() * 5) * (ur() < 0.2 ? 0.0f : 1.0f); /* many exact ties */
			int got = kcpu_topk(s, n, k, out);
			/* brute force: rank of i = #j better than i */
			int m = 0;
			for (int i = 0; i < n; i++) {
				int better = 0;
				for (int j = 0; j < n; j++)
					better += s[j] > s[i] || (s[j] == s[i] && j < i);
				if (better < k)
					want[m++] = i;
			}
			cases++;
			if (got != m || memcmp(out, want, sizeof(int32_t) * (size_t)m) != 0)
				bad++;
		}
	printf("topk: %d cases with ties, %d wrong\n", cases, bad);
	CHECK(bad == 0, "topk wrong in %d cases", bad);
}

static void test_route(void)
{
	int bad = 0;
	double wmax = 0;
	for (int it = 0; it < 500; it++) {
		int E = 8, k = 2 + it % 3, G = it % 2 ? 4 : 1, Gu = G == 4 ? 2 : 1, gating = 1 + it % 2;
		float z[8], b[8], scr[16], w[4];
		int32_t ids[4];
		for (int e = 0; e < E; e++) {
			z[e] = (float)(ur() * 4 - 2);
			b[e] = (float)(ur() * 0.2 - 0.1);
		}
		kcpu_moe_route(z, b, E, k, G, Gu, gating, true, 2.5f, ids, w, scr);
		double p[8], sel[8], zs = 0;
		for (int e = 0; e < E; e++)
			zs += exp(z[e]);
		for (int e = 0; e < E; e++) {
			p[e] = gating == 1 ? exp(z[e]) / zs : 1 / (1 + exp(-z[e]));
			sel[e] = p[e] + b[e];
		}
		if (G > 1) { /* groups of 2: score = sum of both; keep the best Gu */
			double gs[4];
			for (int g = 0; g < G; g++)
				gs[g] = sel[2 * g] + sel[2 * g + 1];
			for (int g = 0; g < G; g++) {
				int better = 0;
				for (int h = 0; h < G; h++)
					better += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
				if (better >= Gu)
					sel[2 * g] = sel[2 * g + 1] = 0.0;
			}
		}
		double sum = 0;
		for (int i = 0; i < k; i++)
			sum += p[ids[i]];
		for (int i = 0; i < k; i++) {
			int better = 0;
			for (int e = 0; e < E; e++)
				better += sel[e] > sel[ids[i]] + 1e-6 ||
				          (fabs(sel[e] - sel[ids[i]]) <= 1e-6 && e < ids[i]);
			bad += better >= k;
			wmax = fmax(wmax, fabs(w[i] - p[ids[i]] / sum * 2.5));
		}
	}
	printf("moe_route: 500 tokens, %d wrong choices, weights max|d| = %.2g\n", bad, wmax);
	CHECK(bad == 0 && wmax < 1e-5, "moe route");
}

static void test_rope(void)
{
	enum { R = 16 };
	float inv[R / 2], cs[R], x[R], y[R], xi[R];
	kcpu_rope_freqs(inv, R, 10000.0f, 4.0f, 64, 32.0f, 1.0f);
	kcpu_rope_cs(inv, R / 2, 37, cs);
	for (int i = 0; i < R; i++)
		x[i] = (float)(ur() * 2 - 1);
	/* interleaved on x == half-split on the de-interleaved x (pair i at i and i + R/2) */
	for (int i = 0; i < R / 2; i++) {
		xi[i] = x[2 * i];
		xi[i + R / 2] = x[2 * i + 1];
	}
	memcpy(y, x, sizeof(y));
	kcpu_rope(y, R, cs, 0);
	kcpu_rope(xi, R, cs, 1);
	double d = 0, n0 = 0, n1 = 0;
	for (int i = 0; i < R / 2; i++) {
		d = fmax(d, fabs(y[2 * i] - xi[i]) + fabs(y[2 * i + 1] - xi[i + R / 2]));
	}
	for (int i = 0; i < R; i++) {
		n0 += (double)x[i] * x[i];
		n1 += (double)y[i] * y[i];
	}
	printf("rope: interleaved vs half-split on permuted input max|d| = %.2g, norm change %.2g\n", d,
	       fabs(n0 - n1));
	CHECK(d < 1e-6 && fabs(n0 - n1) < 1e-5, "rope");
}

static void test_attn(void)
{
	enum { C = 40, R = 8, NK = 37, DI = 24, HI = 3 };
	float q[C + R], keys32[NK][C + R], out[C], sc[NK], out2[C];
	uint16_t keys16[NK][C + R];
	const void *kp[NK], *kp16[NK];
	for (int i = 0; i < C + R; i++)
		q[i] = (float)(ur() - 0.5);
	for (int t = 0; t < NK; t++) {
		for (int i = 0; i < C + R; i++) {
			keys16[t][i] = kf32_to_bf16((float)(ur() * 2 - 1));
			keys32[t][i] = kbf16_to_f32(keys16[t][i]); /* same values in both forms */
		}
		kp[t] = keys32[t];
		kp16[t] = keys16[t];
	}
	kcpu_mla_attn_head(q, C, R, kp, NK, 0, 0.3f, sc, out);
	kcpu_mla_attn_head(q, C, R, kp16, NK, 1, 0.3f, sc, out2);
	double s[NK], mx = -1e300, z = 0, d = 0, d16 = 0;
	for (int t = 0; t < NK; t++) {
		s[t] = 0;
		for (int i = 0; i < C + R; i++)
			s[t] += (double)q[i] * keys32[t][i];
		s[t] *= 0.3;
		mx = fmax(mx, s[t]);
	}
	for (int t = 0; t < NK; t++)
		z += exp(s[t] - mx);
	for (int i = 0; i < C; i++) {
		double o = 0;
		for (int t = 0; t < NK; t++)
			o += exp(s[t] - mx) / z * keys32[t][i];
		d = fmax(d, fabs(o - out[i]));
		d16 = fmax(d16, fabs(o - out2[i]));
	}
	printf("mla_attn_head: %d keys, fp32 keys max|d| = %.2g, bf16 keys max|d| = %.2g\n", NK, d, d16);
	CHECK(d < 1e-6 && d16 < 1e-6, "attention");
	/* indexer scores */
	float qi[HI * DI], w[HI], ks[NK][DI], got[NK];
	const void *kip[NK];
	for (int i = 0; i < HI * DI; i++)
		qi[i] = (float)(ur() - 0.5);
	for (int h = 0; h < HI; h++)
		w[h] = (float)(ur() - 0.3);
	for (int t = 0; t < NK; t++) {
		for (int i = 0; i < DI; i++)
			ks[t][i] = (float)(ur() - 0.5);
		kip[t] = ks[t];
	}
	kcpu_indexer_scores(qi, w, HI, DI, kip, NK, 0, 0.2f, got);
	double di = 0;
	for (int t = 0; t < NK; t++) {
		double e = 0;
		for (int h = 0; h < HI; h++) {
			double dd = 0;
			for (int i = 0; i < DI; i++)
				dd += (double)qi[h * DI + i] * ks[t][i];
			e += w[h] * fmax(0.0, dd * 0.2);
		}
		di = fmax(di, fabs(e - got[t]));
	}
	printf("indexer_scores: %d keys x %d heads max|d| = %.2g\n", NK, HI, di);
	CHECK(di < 1e-6, "indexer scores");
}

static void test_norms(void)
{
	enum { N = 300 };
	float x[2 * N], w[N], b[N], y[2 * N];
	for (int i = 0; i < 2 * N; i++)
		x[i] = (float)(ur() * 6 - 2);
	for (int i = 0; i < N; i++) {
		w[i] = (float)(ur() + 0.5);
		b[i] = (float)(ur() - 0.5);
	}
	kcpu_rmsnorm(y, N, x, N, w, N, 2, 1e-5f);
	double d = 0;
	for (int r = 0; r < 2; r++) {
		double ss = 0;
		for (int i = 0; i < N; i++)
			ss += (double)x[r * N + i] * x[r * N + i];
		for (int i = 0; i < N; i++)
			d = fmax(d, fabs(w[i] * x[r * N + i] / sqrt(ss / N + 1e-5) - y[r * N + i]));
	}
	kcpu_layernorm(y, N, x, N, w, b, N, 2, 1e-6f);
	double dl = 0;
	for (int r = 0; r < 2; r++) {
		double m = 0, v = 0;
		for (int i = 0; i < N; i++)
			m += x[r * N + i] / (double)N;
		for (int i = 0; i < N; i++)
			v += (x[r * N + i] - m) * (x[r * N + i] - m) / N;
		for (int i = 0; i < N; i++)
			dl = fmax(dl, fabs((x[r * N + i] - m) / sqrt(v + 1e-6) * w[i] + b[i] - y[r * N + i]));
	}
	/* without a bias (NULL): the same minus b (the CUDA op takes a NULL bias too) */
	float y0[2 * N];
	kcpu_layernorm(y0, N, x, N, w, NULL, N, 2, 1e-6f);
	int nb = 0;
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < N; i++)
			nb += fabs((double)y0[r * N + i] + b[i] - y[r * N + i]) > 1e-6;
	printf("rmsnorm max|d| = %.2g, layernorm max|d| = %.2g, %d of %d differ without the bias\n", d, dl,
	       nb, 2 * N);
	CHECK(d < 1e-5 && dl < 1e-5 && nb == 0, "norms");
}

int main(void)
{
	uint64_t seed = 0x5eed1234ULL;
	st = seed;
	printf("seed %llu\n", (unsigned long long)seed);
	test_topk();
	test_route();
	test_rope();
	test_attn();
	test_norms();
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
