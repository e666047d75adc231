/* `tandem mkmodel` weights: the tensor list of a glm-dsa / deepseek2 model (names and shapes of
 * MODEL-SPEC.md §4.3), the type of each tensor under the chosen mix, and the random values.
 * Values follow tests/data/README.md §2 so a forward pass stays finite: embeddings N(0,1), output
 * N(0,0.2) at D = 256 (scaled with 1/sqrt(D)), matrices N(0,1/fan_in), router N(0,0.1), norm weights
 * U(0.7,1.3), LayerNorm bias N(0,0.1), expert bias U(-0.1,0.1). Each row is generated from its own seed
 * (tensor seed, row index) with a counter-based 32-bit hash and a 4-term Irwin-Hall normal (two hashes per
 * value), then quantized with kcpu_quantize_row; the rows of a chunk are split over threads. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mkmodel.h"
#include "kernels/kernels.h"

enum kind { K_NORM, K_F32MAT, K_ATTN, K_FFN, K_EMB, K_OUT };

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s, uint64_t seed)
{
	uint64_t h = 1469598103934665603ull ^ seed;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return splitmix(&h);
}

const char *const mkmodel_role_names[MK_ROLE_COUNT] = {
    "attn", "indexer", "embd", "output", "ffn", "shexp", "gate_exps", "up_exps", "down_exps",
};

void mk_types_init(struct mk_types *t)
{
	memset(t, 0, sizeof(*t));
	for (int r = 0; r < MK_ROLE_COUNT; r++)
		t->role[r] = -1;
}

/* The role of a matrix of kind k named name */
static enum mk_role role_of(enum kind k, const char *name)
{
	if (k == K_EMB)
		return MK_ROLE_EMBD;
	if (k == K_OUT)
		return MK_ROLE_OUTPUT;
	if (k == K_ATTN)
		return strstr(name, ".indexer.") ? MK_ROLE_INDEXER : MK_ROLE_ATTN;
	if (strstr(name, "ffn_gate_exps."))
		return MK_ROLE_GATE_EXPS;
	if (strstr(name, "ffn_up_exps."))
		return MK_ROLE_UP_EXPS;
	if (strstr(name, "ffn_down_exps."))
		return MK_ROLE_DOWN_EXPS;
	return strstr(name, "_shexp.") ? MK_ROLE_SHEXP : MK_ROLE_FFN;
}

/* Type of a tensor under the mix and its overrides; falls back when ne0 is not a multiple of the block
 * size (e.g. attn_k_b, whose rows have N = 64/128/192 elements, cannot be a K-quant). */
static int pick_type(enum kind k, const char *name, int64_t ne0, const struct mk_types *t)
{
	if (k == K_NORM || k == K_F32MAT)
		return KT_F32;
	int want;
	const int over = t->role[role_of(k, name)];
	if (over >= 0)
		want = over;
	else if (t->mix == MK_MIX_Q4_K)
		want = k == K_ATTN ? KT_Q8_0 : k == K_OUT ? KT_Q6_K : KT_Q4_K;
	else
		want = t->single;
	const int order[3] = {want, KT_Q8_0, KT_F32};
	for (int i = 0; i < 3; i++) {
		const struct ktype_info *ki = ktype_get(order[i]);
		if (ki && ne0 % ki->blck == 0)
			return order[i];
	}
	return KT_F32;
}

struct list {
	struct mk_tensor *t;
	int n, cap;
	const struct mk_types *types;
	uint64_t seed;
	int n_threads;
};

static int add(struct list *L, enum kind k, enum mk_init init, float a, float b, int nd, int64_t ne0,
               int64_t ne1, int64_t ne2, const char *fmt, ...) __attribute__((format(printf, 10, 11)));

static int add(struct list *L, enum kind k, enum mk_init init, float a, float b, int nd, int64_t ne0,
               int64_t ne1, int64_t ne2, const char *fmt, ...)
{
	if (L->n == L->cap) {
		int cap = L->cap ? 2 * L->cap : 256;
		void *p = realloc(L->t, (size_t)cap * sizeof(*L->t));
		if (!p)
			return -1;
		L->t = p;
		L->cap = cap;
	}
	struct mk_tensor *t = &L->t[L->n++];
	memset(t, 0, sizeof(*t));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof(t->name), fmt, ap);
	va_end(ap);
	t->n_dims = nd;
	t->ne[0] = ne0;
	t->ne[1] = nd > 1 ? ne1 : 1;
	t->ne[2] = nd > 2 ? ne2 : 1;
	t->ne[3] = 1;
	t->type = pick_type(k, t->name, ne0, L->types);
	t->init = init;
	t->a = a;
	t->b = b;
	t->seed = hash_name(t->name, L->seed);
	t->n_threads = L->n_threads;
	return ktype_row_bytes(t->type, ne0, &t->row_bytes) ? 0 : -1;
}

/* A matrix with rows of ne0 inputs: N(0, 1/fan_in). */
#define MAT(kind, nd, ne0, ne1, ne2, ...)                                                                    \
	add(L, kind, MK_INIT_NORMAL, 0.0f, 1.0f / sqrtf((float)(ne0)), nd, ne0, ne1, ne2, __VA_ARGS__)
#define NORM(n, ...) add(L, K_NORM, MK_INIT_UNIFORM, 0.7f, 1.3f, 1, n, 1, 1, __VA_ARGS__)

static int layer(struct list *L, const struct mk_config *c, int l)
{
	int rc = 0;
	bool moe = l >= c->n_dense;
	rc |= NORM(c->D, "blk.%d.attn_norm.weight", l);
	rc |= MAT(K_ATTN, 2, c->D, c->Cq, 1, "blk.%d.attn_q_a.weight", l);
	rc |= NORM(c->Cq, "blk.%d.attn_q_a_norm.weight", l);
	rc |= MAT(K_ATTN, 2, c->Cq, c->H * (c->N + c->R), 1, "blk.%d.attn_q_b.weight", l);
	rc |= MAT(K_ATTN, 2, c->D, c->C + c->R, 1, "blk.%d.attn_kv_a_mqa.weight", l);
	rc |= NORM(c->C, "blk.%d.attn_kv_a_norm.weight", l);
	rc |= MAT(K_ATTN, 3, c->N, c->C, c->H, "blk.%d.attn_k_b.weight", l);
	rc |= MAT(K_ATTN, 3, c->C, c->V, c->H, "blk.%d.attn_v_b.weight", l);
	rc |= MAT(K_ATTN, 2, c->H * c->V, c->D, 1, "blk.%d.attn_output.weight", l);
	if (c->HI > 0 && l % c->idx_every == 0) {
		rc |= MAT(K_ATTN, 2, c->Cq, c->HI * c->DI, 1, "blk.%d.indexer.attn_q_b.weight", l);
		rc |= MAT(K_ATTN, 2, c->D, c->DI, 1, "blk.%d.indexer.attn_k.weight", l);
		rc |= NORM(c->DI, "blk.%d.indexer.k_norm.weight", l);
		rc |= add(L, K_NORM, MK_INIT_NORMAL, 0.0f, 0.1f, 1, c->DI, 1, 1, "blk.%d.indexer.k_norm.bias",
		          l);
		rc |= MAT(K_F32MAT, 2, c->D, c->HI, 1, "blk.%d.indexer.proj.weight", l);
	}
	rc |= NORM(c->D, "blk.%d.ffn_norm.weight", l);
	if (!moe) {
		rc |= MAT(K_FFN, 2, c->D, c->n_ff, 1, "blk.%d.ffn_gate.weight", l);
		rc |= MAT(K_FFN, 2, c->D, c->n_ff, 1, "blk.%d.ffn_up.weight", l);
		rc |= MAT(K_FFN, 2, c->n_ff, c->D, 1, "blk.%d.ffn_down.weight", l);
		return rc;
	}
	rc |= add(L, K_F32MAT, MK_INIT_NORMAL, 0.0f, 0.1f, 2, c->D, c->E, 1, "blk.%d.ffn_gate_inp.weight", l);
	rc |= add(L, K_NORM, MK_INIT_UNIFORM, -0.1f, 0.1f, 1, c->E, 1, 1, "blk.%d.exp_probs_b.bias", l);
	rc |= MAT(K_FFN, 3, c->D, c->F, c->E, "blk.%d.ffn_gate_exps.weight", l);
	rc |= MAT(K_FFN, 3, c->D, c->F, c->E, "blk.%d.ffn_up_exps.weight", l);
	rc |= MAT(K_FFN, 3, c->F, c->D, c->E, "blk.%d.ffn_down_exps.weight", l);
	if (c->n_shared > 0) {
		rc |= MAT(K_FFN, 2, c->D, c->F * c->n_shared, 1, "blk.%d.ffn_gate_shexp.weight", l);
		rc |= MAT(K_FFN, 2, c->D, c->F * c->n_shared, 1, "blk.%d.ffn_up_shexp.weight", l);
		rc |= MAT(K_FFN, 2, c->F * c->n_shared, c->D, 1, "blk.%d.ffn_down_shexp.weight", l);
	}
	return rc;
}

int mkmodel_tensors(const struct mk_config *c, const struct mk_types *types, uint64_t seed, int n_threads,
                    struct mk_tensor **out, int *n_out, char *err, size_t err_size)
{
	struct list l0 = {.types = types, .seed = seed, .n_threads = n_threads}, *L = &l0;
	int rc = 0;
	rc |= add(L, K_EMB, MK_INIT_NORMAL, 0.0f, 1.0f, 2, c->D, c->vocab, 1, "token_embd.weight");
	rc |= NORM(c->D, "output_norm.weight");
	/* N(0, 0.2) at D = 256 as in tests/data; scaled by sqrt(256 / D) so the logits keep a standard
	 * deviation of about 3 at any width (0.2 at D = 6144 would give logits of +-80) */
	rc |= add(L, K_OUT, MK_INIT_NORMAL, 0.0f, 3.2f / sqrtf((float)c->D), 2, c->D, c->vocab, 1,
	          "output.weight");
	for (int i = 0; i < c->n_layers + c->nextn; i++)
		rc |= layer(L, c, i);
	for (int i = c->n_layers; i < c->n_layers + c->nextn; i++) {
		rc |= MAT(K_ATTN, 2, 2 * c->D, c->D, 1, "blk.%d.nextn.eh_proj.weight", i);
		rc |= NORM(c->D, "blk.%d.nextn.enorm.weight", i);
		rc |= NORM(c->D, "blk.%d.nextn.hnorm.weight", i);
		rc |= NORM(c->D, "blk.%d.nextn.shared_head_norm.weight", i);
	}
	if (rc) {
		free(L->t);
		snprintf(err, err_size,
		         "cannot build the tensor list (out of memory or a size is not representable)");
		return -1;
	}
	*out = L->t;
	*n_out = L->n;
	return 0;
}

/* ---- values ------------------------------------------------------------------------------------ */

struct job {
	const struct mk_tensor *t;
	uint8_t *dst;
	int64_t r0, r1; /* global row range */
	int64_t base; /* global row of dst[0] */
	int rc;
};

/* 32-bit bijective integer hash (lowbias32): a counter-based generator, so every value depends
 * only on (row key, index) and the loops below vectorize (8 lanes of 32-bit math with AVX2). */
static inline uint32_t h32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352dU;
	x ^= x >> 15;
	x *= 0x846ca68bU;
	x ^= x >> 16;
	return x;
}

static void gen_row(const struct mk_tensor *t, int64_t row, float *x)
{
	uint64_t s = t->seed ^ ((uint64_t)row * 0xd1342543de82ef95ull);
	uint32_t key = (uint32_t)splitmix(&s);
	int64_t n = t->ne[0];
	if (t->init == MK_INIT_UNIFORM) {
		float scale = (t->b - t->a) / 4294967296.0f;
		for (int64_t i = 0; i < n; i++)
			x[i] = t->a + (float)h32(key + (uint32_t)i) * scale;
		return;
	}
	/* sum of four 16-bit uniforms (two hashes): mean 2, variance 1/3 -> scale by sqrt(3); the
	 * result is within 3.46 standard deviations, which keeps random models tame */
	const float k = 1.7320508f / 65536.0f * t->b;
	const float a = t->a;
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = h32(key + 2 * (uint32_t)i), v = h32(key + 2 * (uint32_t)i + 1);
		int32_t sum = (int32_t)(u & 0xffff) + (int32_t)(u >> 16) + (int32_t)(v & 0xffff) +
		              (int32_t)(v >> 16) - 131070;
		x[i] = a + (float)sum * k;
	}
}

static void *worker(void *arg)
{
	struct job *j = arg;
	const struct mk_tensor *t = j->t;
	float *x = malloc((size_t)t->ne[0] * sizeof(float));
	if (!x) {
		j->rc = -1;
		return NULL;
	}
	for (int64_t r = j->r0; r < j->r1; r++) {
		uint8_t *d = j->dst + (size_t)(r - j->base) * t->row_bytes;
		gen_row(t, r, t->type == KT_F32 ? (float *)(void *)d : x);
		if (t->type != KT_F32)
			kcpu_quantize_row(t->type, x, d, t->ne[0]);
	}
	free(x);
	return NULL;
}

int mkmodel_fill(void *user, const char *name, uint64_t offset, void *dst, size_t nbytes)
{
	const struct mk_tensor *t = user;
	int64_t r0 = (int64_t)(offset / t->row_bytes), n = (int64_t)(nbytes / t->row_bytes);
	int nt = t->n_threads;
	if (nt > n)
		nt = (int)n;
	if (nt < 1)
		nt = 1;
	struct job jobs[64];
	pthread_t th[64];
	bool spawned[64] = {false};
	if (nt > 64)
		nt = 64;
	for (int i = 0; i < nt; i++)
		jobs[i] = (struct job){
		    .t = t, .dst = dst, .base = r0, .r0 = r0 + n * i / nt, .r1 = r0 + n * (i + 1) / nt};
	/* the calling thread does share 0; a share whose thread cannot start is done here too */
	for (int i = 1; i < nt; i++)
		spawned[i] = pthread_create(&th[i], NULL, worker, &jobs[i]) == 0;
	for (int i = 0; i < nt; i++)
		if (!spawned[i])
			worker(&jobs[i]);
	int rc = 0;
	for (int i = 0; i < nt; i++) {
		if (spawned[i])
			pthread_join(th[i], NULL);
		rc |= jobs[i].rc;
	}
	(void)name;
	return rc ? -1 : 0;
}
