/* Synthetic models against an independent naive implementation. Writes small random-weight GGUFs
 * with the GGUF writer for three variants the reference files do not cover:
 *   glm-dsa    4 heads, indexer types [full, shared, full], top-k 5 (sparse from position 5)
 *   deepseek32 indexer on every layer (types key absent), HALF-SPLIT indexer RoPE, YaRN, group-
 *              limited routing (4 groups, 2 kept)
 *   deepseek2  softmax gating (expert_gating_func 1), no correction bias, tied lm_head (no output.weight)
 * (the glm-dsa file also carries an MTP layer blk.3.* that must be skipped)
 * and compares the engine (paged cache, absorbed MLA, chunked prefill + decode, TP=1/2/4 on CPU
 * threads) with a straightforward double-precision forward written here from MODEL-SPEC.md §2:
 * naive (non-absorbed) attention with per-head expanded keys/values, no cache, sort-based top-k. */
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "kernels/kernels.h"
#include "tests/model/refs.h"

enum {
	D = 64,
	H = 4,
	NN = 16,
	R = 8,
	VV = 16,
	C = 32,
	CQ = 48,
	VOC = 200,
	FF = 96,
	E = 8,
	KE = 2,
	F = 32,
	HI = 4,
	DI = 16,
	KT = 5,
	L = 3,
	T_MAX = 48
};

struct variant {
	const char *arch;
	bool types_key; /* glm-dsa.attention.indexer.types = [1,0,1] */
	bool idx_all; /* indexer tensors on every layer */
	bool indexer;
	bool yarn;
	int groups, groups_used;
	int gating; /* 1 softmax, 2 sigmoid */
	bool bias;
	int pair_idx; /* 0 interleaved, 1 half */
	bool nextn; /* one MTP layer blk.3.* in the file (must be skipped) */
	bool tied; /* no output.weight: lm_head = token_embd */
};

/* ---- weights -------------------------------------------------------------------------------- */
static uint64_t rs = 88172645463325252ULL;
static double urand(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (double)(rs >> 11) * 0x1.0p-53;
}
static float grand(double sd)
{
	double s = 0;
	for (int i = 0; i < 12; i++)
		s += urand();
	return (float)((s - 6.0) * sd);
}

struct tens {
	char name[64];
	int nd;
	int64_t ne[3];
	float *v;
};
static struct tens tt[128];
static int n_t;

static float *mk(const char *name, int nd, int64_t a, int64_t b, int64_t c, double sd, double mean)
{
	struct tens *t = &tt[n_t++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->nd = nd;
	t->ne[0] = a;
	t->ne[1] = nd > 1 ? b : 1;
	t->ne[2] = nd > 2 ? c : 1;
	size_t n = (size_t)(t->ne[0] * t->ne[1] * t->ne[2]);
	t->v = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		t->v[i] = (float)mean + grand(sd);
	return t->v;
}

/* the model in HF orientation for the reference: W[out][in] = v[out * in + i] */
struct lw {
	float *attn_norm, *ffn_norm, *qan, *kvan, *qa, *qb, *kva, *kb, *vb, *o;
	float *iq, *ik, *iknw, *iknb, *iproj;
	float *g, *u, *dn, *gi, *bias, *ge, *ue, *de, *gs, *us, *ds;
};
static struct lw lw[L];
static float *embd, *onorm, *outw;

static void build(const struct variant *v)
{
	char nm[96];
	n_t = 0;
	rs = 88172645463325252ULL;
	embd = mk("token_embd.weight", 2, D, VOC, 0, 1.0, 0);
	onorm = mk("output_norm.weight", 1, D, 0, 0, 0.1, 1.0);
	outw = mk("output.weight", 2, D, VOC, 0, 0.2, 0);
	for (int l = 0; l < L; l++) {
		struct lw *w = &lw[l];
#define T(field, suffix, nd, a, b, c, sd, mean)                                                              \
	snprintf(nm, sizeof(nm), "blk.%d." suffix, l);                                                       \
	w->field = mk(nm, nd, a, b, c, sd, mean)
		T(attn_norm, "attn_norm.weight", 1, D, 0, 0, 0.1, 1.0);
		T(qa, "attn_q_a.weight", 2, D, CQ, 0, 1.0 / 8, 0);
		T(qan, "attn_q_a_norm.weight", 1, CQ, 0, 0, 0.1, 1.0);
		T(qb, "attn_q_b.weight", 2, CQ, H * (NN + R), 0, 1.0 / 7, 0);
		T(kva, "attn_kv_a_mqa.weight", 2, D, C + R, 0, 1.0 / 8, 0);
		T(kvan, "attn_kv_a_norm.weight", 1, C, 0, 0, 0.1, 1.0);
		T(kb, "attn_k_b.weight", 3, NN, C, H, 1.0 / 4, 0);
		T(vb, "attn_v_b.weight", 3, C, VV, H, 1.0 / 6, 0);
		T(o, "attn_output.weight", 2, H * VV, D, 0, 1.0 / 8, 0);
		bool full = v->indexer && (v->idx_all || l != 1);
		if (full) {
			T(iq, "indexer.attn_q_b.weight", 2, CQ, HI * DI, 0, 1.0 / 7, 0);
			T(ik, "indexer.attn_k.weight", 2, D, DI, 0, 1.0 / 8, 0);
			T(iknw, "indexer.k_norm.weight", 1, DI, 0, 0, 0.1, 1.0);
			T(iknb, "indexer.k_norm.bias", 1, DI, 0, 0, 0.1, 0);
			T(iproj, "indexer.proj.weight", 2, D, HI, 0, 1.0 / 8, 0);
		} else {
			w->iq = NULL;
		}
		T(ffn_norm, "ffn_norm.weight", 1, D, 0, 0, 0.1, 1.0);
		if (l == 0) {
			T(g, "ffn_gate.weight", 2, D, FF, 0, 1.0 / 8, 0);
			T(u, "ffn_up.weight", 2, D, FF, 0, 1.0 / 8, 0);
			T(dn, "ffn_down.weight", 2, FF, D, 0, 1.0 / 10, 0);
		} else {
			T(gi, "ffn_gate_inp.weight", 2, D, E, 0, 0.15, 0);
			if (v->bias) {
				T(bias, "exp_probs_b.bias", 1, E, 0, 0, 0.05, 0);
			} else {
				w->bias = NULL;
			}
			T(ge, "ffn_gate_exps.weight", 3, D, F, E, 1.0 / 8, 0);
			T(ue, "ffn_up_exps.weight", 3, D, F, E, 1.0 / 8, 0);
			T(de, "ffn_down_exps.weight", 3, F, D, E, 1.0 / 6, 0);
			T(gs, "ffn_gate_shexp.weight", 2, D, F, 0, 1.0 / 8, 0);
			T(us, "ffn_up_shexp.weight", 2, D, F, 0, 1.0 / 8, 0);
			T(ds, "ffn_down_shexp.weight", 2, F, D, 0, 1.0 / 6, 0);
		}
#undef T
	}
}

static int write_gguf(const struct variant *v, const char *path)
{
	struct gguf_writer *w = gguf_writer_create(32);
	char k[128];
#define K(s) (snprintf(k, sizeof(k), "%s." s, v->arch), k)
	gguf_writer_set_str(w, "general.architecture", v->arch);
	gguf_writer_set_u32(w, K("block_count"), v->nextn ? L + 1 : L);
	if (v->nextn)
		gguf_writer_set_u32(w, K("nextn_predict_layers"), 1);
	gguf_writer_set_u32(w, K("context_length"), 512);
	gguf_writer_set_u32(w, K("embedding_length"), D);
	gguf_writer_set_u32(w, K("feed_forward_length"), FF);
	gguf_writer_set_u32(w, K("attention.head_count"), H);
	gguf_writer_set_u32(w, K("attention.head_count_kv"), 1);
	gguf_writer_set_f32(w, K("rope.freq_base"), 10000.0f);
	gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-6f);
	gguf_writer_set_u32(w, K("expert_count"), E);
	gguf_writer_set_u32(w, K("expert_used_count"), KE);
	gguf_writer_set_u32(w, K("expert_group_count"), (uint32_t)v->groups);
	gguf_writer_set_u32(w, K("expert_group_used_count"), (uint32_t)v->groups_used);
	gguf_writer_set_u32(w, K("expert_gating_func"), (uint32_t)v->gating);
	gguf_writer_set_u32(w, K("leading_dense_block_count"), 1);
	gguf_writer_set_u32(w, K("vocab_size"), VOC);
	gguf_writer_set_u32(w, K("attention.q_lora_rank"), CQ);
	gguf_writer_set_u32(w, K("attention.kv_lora_rank"), C);
	gguf_writer_set_u32(w, K("attention.key_length_mla"), NN + R);
	gguf_writer_set_u32(w, K("attention.value_length_mla"), VV);
	gguf_writer_set_u32(w, K("expert_feed_forward_length"), F);
	gguf_writer_set_u32(w, K("expert_shared_count"), 1);
	gguf_writer_set_f32(w, K("expert_weights_scale"), 2.5f);
	gguf_writer_set_bool(w, K("expert_weights_norm"), true);
	gguf_writer_set_u32(w, K("rope.dimension_count"), R);
	if (v->indexer) {
		gguf_writer_set_u32(w, K("attention.indexer.head_count"), HI);
		gguf_writer_set_u32(w, K("attention.indexer.key_length"), DI);
		gguf_writer_set_u32(w, K("attention.indexer.top_k"), KT);
	}
	if (v->types_key) {
		uint8_t t[3] = {1, 0, 1};
		gguf_writer_set_arr(w, K("attention.indexer.types"), GGUF_VT_BOOL, t, 3);
	}
	if (v->yarn) {
		gguf_writer_set_str(w, K("rope.scaling.type"), "yarn");
		gguf_writer_set_f32(w, K("rope.scaling.factor"), 4.0f);
		gguf_writer_set_u32(w, K("rope.scaling.original_context_length"), 32);
		gguf_writer_set_f32(w, K("rope.scaling.yarn_log_multiplier"), 0.1f);
	}
#undef K
	for (int i = 0; i < n_t; i++) {
		if (v->tied && strcmp(tt[i].name, "output.weight") == 0)
			continue;
		gguf_writer_add_tensor(w, tt[i].name, KT_F32, tt[i].nd, tt[i].ne, tt[i].v);
		if (v->nextn && strncmp(tt[i].name, "blk.2.", 6) == 0) { /* an MTP layer: a copy of layer 2 */
			char nm[96];
			snprintf(nm, sizeof(nm), "blk.3.%s", tt[i].name + 6);
			gguf_writer_add_tensor(w, nm, KT_F32, tt[i].nd, tt[i].ne, tt[i].v);
		}
	}
	if (v->nextn) {
		int64_t ne[2] = {2 * D, D};
		static float eh[2 * D * D];
		gguf_writer_add_tensor(w, "blk.3.nextn.eh_proj.weight", KT_F32, 2, ne, eh);
	}
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	if (rc)
		printf("write: %s\n", e.msg);
	gguf_writer_destroy(w);
	return rc;
}

/* ---- naive double-precision reference ---------------------------------------------------------- */
static void mv(const float *W, int out, int in, const double *x, double *y)
{
	for (int r = 0; r < out; r++) {
		double s = 0;
		for (int i = 0; i < in; i++)
			s += (double)W[r * in + i] * x[i];
		y[r] = s;
	}
}
static void rms(double *x, int n, const float *w, double eps)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += x[i] * x[i];
	double k = 1.0 / sqrt(s / n + eps);
	for (int i = 0; i < n; i++)
		x[i] = x[i] * k * w[i];
}
static double inv_freq(const struct variant *v, int i)
{
	double base = pow(10000.0, -2.0 * i / R);
	if (!v->yarn)
		return base;
	/* YaRN (MODEL-SPEC.md §2.3): factor 4, original context 32, beta 32 / 1 */
	double lo = floor(R * log(32.0 / (32 * 2 * M_PI)) / (2 * log(10000.0)));
	double hi = ceil(R * log(32.0 / (1 * 2 * M_PI)) / (2 * log(10000.0)));
	lo = lo < 0 ? 0 : lo;
	hi = hi > R - 1 ? R - 1 : hi;
	double r = (i - lo) / (hi - lo);
	r = r < 0 ? 0 : r > 1 ? 1 : r;
	return base * (1 - r) + base / 4.0 * r;
}
static void rope(const struct variant *v, double *x, int p, int pairing)
{
	for (int i = 0; i < R / 2; i++) {
		int a = pairing ? i : 2 * i, b = pairing ? i + R / 2 : 2 * i + 1;
		double ph = p * inv_freq(v, i), c = cos(ph), s = sin(ph);
		double xa = x[a], xb = x[b];
		x[a] = xa * c - xb * s;
		x[b] = xa * s + xb * c;
	}
}
static double silu(double x)
{
	return x / (1 + exp(-x));
}
static void swiglu_mlp(const float *g, const float *u, const float *d, int f, const double *x, double *y)
{
	double gg[FF], uu[FF];
	mv(g, f, D, x, gg);
	mv(u, f, D, x, uu);
	for (int i = 0; i < f; i++)
		gg[i] = silu(gg[i]) * uu[i];
	mv(d, D, f, gg, y);
}

static void reference(const struct variant *v, const int32_t *tok, int n, double *logits)
{
	static double h[T_MAX][D], a[T_MAX][D], cq[T_MAX][CQ], q[T_MAX][H * (NN + R)], c[T_MAX][C],
	    kr[T_MAX][R];
	static double qI[T_MAX][HI * DI], kI[T_MAX][DI], wI[T_MAX][HI];
	static int sel[T_MAX][T_MAX], nsel[T_MAX];
	double msc = v->yarn ? 1 + 0.1 * log(4.0) : 1.0, sigma = msc * msc / sqrt(NN + R);
	for (int t = 0; t < n; t++)
		for (int i = 0; i < D; i++)
			h[t][i] = embd[tok[t] * D + i];
	for (int l = 0; l < L; l++) {
		struct lw *w = &lw[l];
		for (int t = 0; t < n; t++) {
			double kv[C + R], tmp[CQ];
			memcpy(a[t], h[t], sizeof(a[t]));
			rms(a[t], D, w->attn_norm, 1e-6);
			mv(w->qa, CQ, D, a[t], tmp);
			rms(tmp, CQ, w->qan, 1e-6);
			memcpy(cq[t], tmp, sizeof(cq[t]));
			mv(w->qb, H * (NN + R), CQ, cq[t], q[t]);
			for (int hh = 0; hh < H; hh++)
				rope(v, q[t] + hh * (NN + R) + NN, t, 0);
			mv(w->kva, C + R, D, a[t], kv);
			rms(kv, C, w->kvan, 1e-6);
			memcpy(c[t], kv, sizeof(c[t]));
			memcpy(kr[t], kv + C, sizeof(kr[t]));
			rope(v, kr[t], t, 0);
		}
		if (v->indexer && w->iq) {
			for (int t = 0; t < n; t++) {
				mv(w->iq, HI * DI, CQ, cq[t], qI[t]);
				mv(w->ik, DI, D, a[t], kI[t]);
				double mean = 0, var = 0;
				for (int i = 0; i < DI; i++)
					mean += kI[t][i] / DI;
				for (int i = 0; i < DI; i++)
					var += (kI[t][i] - mean) * (kI[t][i] - mean) / DI;
				for (int i = 0; i < DI; i++)
					kI[t][i] =
					    (kI[t][i] - mean) / sqrt(var + 1e-6) * w->iknw[i] + w->iknb[i];
				for (int hh = 0; hh < HI; hh++)
					rope(v, qI[t] + hh * DI, t, v->pair_idx); /* rope part first */
				rope(v, kI[t], t, v->pair_idx);
				mv(w->iproj, HI, D, a[t], wI[t]);
			}
			for (int p = 0; p < n; p++) {
				double sc[T_MAX];
				for (int t = 0; t <= p; t++) {
					sc[t] = 0;
					for (int hh = 0; hh < HI; hh++) {
						double d = 0;
						for (int i = 0; i < DI; i++)
							d += qI[p][hh * DI + i] * kI[t][i];
						d /= sqrt((double)DI);
						sc[t] += wI[p][hh] / sqrt((double)HI) * (d > 0 ? d : 0);
					}
				}
				int ord[T_MAX];
				for (int t = 0; t <= p; t++)
					ord[t] = t;
				for (int i = 1; i <= p; i++) /* insertion sort: score desc, position asc */
					for (int j = i;
					     j > 0 && (sc[ord[j]] > sc[ord[j - 1]] ||
					               (sc[ord[j]] == sc[ord[j - 1]] && ord[j] < ord[j - 1]));
					     j--) {
						int x = ord[j];
						ord[j] = ord[j - 1];
						ord[j - 1] = x;
					}
				nsel[p] = p + 1 < KT ? p + 1 : KT;
				for (int i = 0; i < nsel[p]; i++)
					sel[p][i] = ord[i];
			}
		}
		for (int p = 0; p < n; p++) {
			double o[H * VV], out[D];
			for (int hh = 0; hh < H; hh++) {
				const double *qn = q[p] + hh * (NN + R), *qr = qn + NN;
				double s[T_MAX], mx = -1e300, sum = 0;
				int keys[T_MAX], nk = 0;
				if (v->indexer)
					for (int i = 0; i < nsel[p]; i++)
						keys[nk++] = sel[p][i];
				else
					for (int t = 0; t <= p; t++)
						keys[nk++] = t;
				for (int j = 0; j < nk; j++) {
					int t = keys[j];
					double dot = 0;
					for (int nn = 0; nn < NN;
					     nn++) { /* k_n = W_UK c_t, W_UK[n][c] = attn_k_b[h][c][n] */
						double kn = 0;
						for (int cc = 0; cc < C; cc++)
							kn +=
							    (double)w->kb[(hh * C + cc) * NN + nn] * c[t][cc];
						dot += qn[nn] * kn;
					}
					for (int i = 0; i < R; i++)
						dot += qr[i] * kr[t][i];
					s[j] = sigma * dot;
					mx = s[j] > mx ? s[j] : mx;
				}
				for (int j = 0; j < nk; j++)
					sum += (s[j] = exp(s[j] - mx));
				for (int vv = 0; vv < VV; vv++) {
					double acc = 0;
					for (int j = 0; j < nk; j++) {
						double val =
						    0; /* v = W_UV c_t, W_UV[v][c] = attn_v_b[h][v][c] */
						for (int cc = 0; cc < C; cc++)
							val += (double)w->vb[(hh * VV + vv) * C + cc] *
							       c[keys[j]][cc];
						acc += s[j] / sum * val;
					}
					o[hh * VV + vv] = acc;
				}
			}
			mv(w->o, D, H * VV, o, out);
			for (int i = 0; i < D; i++)
				h[p][i] += out[i];
		}
		for (int p = 0; p < n; p++) {
			double b[D], y[D], acc[D] = {0};
			memcpy(b, h[p], sizeof(b));
			rms(b, D, w->ffn_norm, 1e-6);
			if (l == 0) {
				swiglu_mlp(w->g, w->u, w->dn, FF, b, acc);
			} else {
				double z[E], pr[E], chs[E];
				mv(w->gi, E, D, b, z);
				double zm = -1e300, zs = 0;
				for (int e = 0; e < E; e++)
					zm = z[e] > zm ? z[e] : zm;
				for (int e = 0; e < E; e++)
					zs += exp(z[e] - zm);
				for (int e = 0; e < E; e++) {
					pr[e] = v->gating == 1 ? exp(z[e] - zm) / zs : 1 / (1 + exp(-z[e]));
					chs[e] = pr[e] + (w->bias ? w->bias[e] : 0);
				}
				int gsz = E / v->groups;
				if (v->groups_used < v->groups) {
					double gsc[E];
					int keep[E] = {0};
					for (int g = 0; g < v->groups; g++) {
						double b1 = -1e300, b2 = -1e300;
						for (int j = 0; j < gsz; j++) {
							double x = chs[g * gsz + j];
							if (x > b1) {
								b2 = b1;
								b1 = x;
							} else if (x > b2)
								b2 = x;
						}
						gsc[g] = b1 + b2;
					}
					for (int i = 0; i < v->groups_used; i++) {
						int best = -1;
						for (int g = 0; g < v->groups; g++)
							if (!keep[g] && (best < 0 || gsc[g] > gsc[best]))
								best = g;
						keep[best] = 1;
					}
					for (int e = 0; e < E; e++)
						if (!keep[e / gsz])
							chs[e] = 0.0;
				}
				int ids[KE];
				double wt[KE], ws = 0;
				for (int i = 0; i < KE; i++) {
					int best = -1;
					for (int e = 0; e < E; e++) {
						bool used = false;
						for (int j = 0; j < i; j++)
							used |= ids[j] == e;
						if (!used && (best < 0 || chs[e] > chs[best]))
							best = e;
					}
					ids[i] = best;
					ws += (wt[i] = pr[best]);
				}
				for (int i = 0; i < KE; i++) {
					int e = ids[i];
					swiglu_mlp(w->ge + (size_t)e * F * D, w->ue + (size_t)e * F * D,
					           w->de + (size_t)e * D * F, F, b, y);
					for (int d = 0; d < D; d++)
						acc[d] += wt[i] / ws * 2.5 * y[d];
				}
				swiglu_mlp(w->gs, w->us, w->ds, F, b, y);
				for (int d = 0; d < D; d++)
					acc[d] += y[d];
			}
			for (int d = 0; d < D; d++)
				h[p][d] += acc[d];
		}
	}
	for (int p = 0; p < n; p++) {
		double y[D];
		memcpy(y, h[p], sizeof(y));
		rms(y, D, onorm, 1e-6);
		mv(v->tied ? embd : outw, VOC, D, y, logits + (size_t)p * VOC);
	}
}

static void test_variant(const struct variant *v)
{
	build(v);
	char path[128];
	snprintf(path, sizeof(path), "/tmp/tandem_synth_%s.%d.gguf", v->arch, (int)getpid());
	if (write_gguf(v, path)) {
		CHECK(0, "%s: write failed", v->arch);
		return;
	}
	int32_t tok[T_MAX];
	for (int i = 0; i < T_MAX; i++)
		tok[i] = (int32_t)(urand() * VOC);
	const int n_pre = 40, n = T_MAX;
	double *ref = malloc(sizeof(double) * (size_t)(n * VOC));
	reference(v, tok, n, ref);
	float *out = malloc(sizeof(float) * (size_t)(n * VOC));
	for (int T = 1; T <= 4; T *= 2) {
		struct model_opts o;
		model_opts_default(&o);
		o.tp = T;
		o.n_threads = T;
		o.quiet = T > 1; /* TP=1 shows the one INFO line about skipped nextn layers */
		struct errbuf e = {0};
		struct model *m;
		if (model_load(&m, path, &o, &e)) {
			CHECK(0, "%s TP=%d: %s", v->arch, T, e.msg);
			continue;
		}
		const struct model_hparams *hp = model_hparams(m);
		CHECK(hp->n_layers == L && hp->n_nextn == (v->nextn ? 1 : 0) && hp->lm_head_tied == v->tied,
		      "%s: layers %d nextn %d tied %d", v->arch, hp->n_layers, hp->n_nextn, hp->lm_head_tied);
		struct model_kv kv;
		if (model_kv_init(&kv, m, 2, NULL, 0, &e)) {
			CHECK(0, "kv: %s", e.msg);
			model_destroy(m);
			continue;
		}
		struct tseq s;
		tseq_init(&s, 1, 1, 1);
		/* prefill 40 tokens in chunks of 9, then decode the rest one by one (teacher forced) */
		int rc = run_seq(m, &kv, &s, tok, n_pre, 9, true, out);
		for (int i = n_pre; i < n && !rc; i++)
			rc = run_seq(m, &kv, &s, tok + i, 1, 1, true, out + (size_t)i * VOC);
		CHECK(rc == 0, "%s TP=%d forward failed", v->arch, T);
		double d = 0, mx = 0;
		for (int i = 0; i < n * VOC; i++) {
			d = fmax(d, fabs(out[i] - ref[i]));
			mx = fmax(mx, fabs(ref[i]));
		}
		printf("%-10s TP=%d: %d positions (chunked prefill + decode) vs naive fp64 reference: max|d| "
		       "= %.3g "
		       "(logits up to %.1f)\n",
		       v->arch, T, n, d, mx);
		CHECK(d < 1e-4, "%s TP=%d differs from the naive reference by %g", v->arch, T, d);
		model_kv_fini(&kv);
		model_destroy(m);
	}
	free(ref);
	free(out);
	remove(path);
	for (int i = 0; i < n_t; i++)
		free(tt[i].v);
}

int main(void)
{
	const struct variant vs[] = {
	    {.arch = "glm-dsa",
	     .types_key = true,
	     .indexer = true,
	     .groups = 1,
	     .groups_used = 1,
	     .gating = 2,
	     .bias = true,
	     .pair_idx = 0,
	     .nextn = true},
	    {.arch = "deepseek32",
	     .idx_all = true,
	     .indexer = true,
	     .yarn = true,
	     .groups = 4,
	     .groups_used = 2,
	     .gating = 2,
	     .bias = true,
	     .pair_idx = 1},
	    {.arch = "deepseek2",
	     .yarn = true,
	     .groups = 1,
	     .groups_used = 1,
	     .gating = 1,
	     .bias = false,
	     .tied = true},
	};
	for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
		test_variant(&vs[i]);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
