/* Architecture tables: reads the hyperparameters of glm-dsa / deepseek2 / deepseek32 from the
 * GGUF metadata (MODEL-SPEC.md §4.2) and checks every tensor's exact name, shape and type against
 * what the architecture needs (§4.3). The loader refuses a file with any problem; `tandem inspect`
 * lists all of them through model_arch_check().
 *
 * Unknown tensor names are a WARNING by default (an error with model_opts.strict): published files
 * carry tensors we legitimately do not use (MTP/nextn layers, indexer tensors duplicated onto
 * "shared" layers, future additions), and refusing them would block real files; every tensor we DO
 * use is matched by its exact name and checked for shape and type, so a misnamed or missing one is
 * still an error. nextn layers and duplicated indexer tensors are not even warned about. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/model/model_internal.h"

const char *model_arch_name(enum model_arch a)
{
	switch (a) {
	case MODEL_ARCH_GLM_DSA: return "glm-dsa";
	case MODEL_ARCH_DEEPSEEK2: return "deepseek2";
	case MODEL_ARCH_DEEPSEEK32: return "deepseek32";
	}
	return "?";
}

static int arch_from_name(const char *s, size_t n, enum model_arch *out)
{
	static const enum model_arch all[] = {MODEL_ARCH_GLM_DSA, MODEL_ARCH_DEEPSEEK2,
	                                      MODEL_ARCH_DEEPSEEK32};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		const char *nm = model_arch_name(all[i]);
		if (strlen(nm) == n && memcmp(nm, s, n) == 0) {
			*out = all[i];
			return 0;
		}
	}
	return -1;
}

/* key "<arch>.<suffix>" */
static const char *akey(const struct model_hparams *hp, const char *suffix, char *buf, size_t size)
{
	snprintf(buf, size, "%s.%s", model_arch_name(hp->arch), suffix);
	return buf;
}

static int get_i(const struct gguf_ctx *g, const struct model_hparams *hp, const char *suffix, bool required,
                 int64_t dflt, int64_t lo, int64_t hi, int64_t *out, struct errbuf *e)
{
	char k[160];
	akey(hp, suffix, k, sizeof(k));
	int rc = gguf_get_i64(g, k, out, e);
	if (rc == ERR_NOTFOUND) {
		if (required)
			return errbuf_set(e, ERR_FORMAT, "metadata key %s is missing", k);
		*out = dflt;
		return 0;
	}
	if (rc)
		return rc;
	if (*out < lo || *out > hi)
		return errbuf_set(e, ERR_FORMAT, "metadata key %s = %lld is out of range [%lld, %lld]", k,
		                  (long long)*out, (long long)lo, (long long)hi);
	return 0;
}

static int get_f(const struct gguf_ctx *g, const struct model_hparams *hp, const char *suffix, float dflt,
                 float *out, struct errbuf *e)
{
	char k[160];
	akey(hp, suffix, k, sizeof(k));
	int rc = gguf_get_f32(g, k, out, e);
	if (rc == ERR_NOTFOUND) {
		*out = dflt;
		return 0;
	}
	if (rc)
		return rc;
	if (!isfinite(*out))
		return errbuf_set(e, ERR_FORMAT, "metadata key %s is not finite", k);
	return 0;
}

#define LIM (INT64_C(1) << 24) /* sanity bound on any dimension read from metadata */

int model_hparams_read(const struct gguf_ctx *g, const struct model_opts *o, struct model_hparams *hp,
                       struct errbuf *e)
{
	memset(hp, 0, sizeof(*hp));
	const char *an;
	size_t anl;
	int rc = gguf_get_str(g, "general.architecture", &an, &anl, e);
	if (rc == ERR_NOTFOUND)
		return errbuf_set(e, ERR_FORMAT, "metadata key general.architecture is missing");
	if (rc)
		return rc;
	if (arch_from_name(an, anl, &hp->arch))
		return errbuf_set(
		    e, ERR_UNSUPPORTED,
		    "unsupported architecture '%.*s' (tandem runs glm-dsa, deepseek2, deepseek32)",
		    (int)(anl > 64 ? 64 : anl), an);
	int64_t v;
#define GI(suffix, req, dflt, lo, hi, dst)                                                                   \
	do {                                                                                                 \
		rc = get_i(g, hp, suffix, req, dflt, lo, hi, &v, e);                                         \
		if (rc)                                                                                      \
			return rc;                                                                           \
		dst = v;                                                                                     \
	} while (0)
	GI("block_count", true, 0, 1, MODEL_MAX_LAYERS, hp->n_layers_file);
	GI("nextn_predict_layers", false, 0, 0, hp->n_layers_file - 1, hp->n_nextn);
	hp->n_layers = hp->n_layers_file - hp->n_nextn;
	GI("embedding_length", true, 0, 1, LIM, hp->D);
	GI("attention.head_count", true, 0, 1, 65536, hp->H);
	GI("context_length", false, 4096, 1, INT64_C(1) << 40, hp->n_ctx_train);
	char k[160];
	if (gguf_find_key(g, akey(hp, "attention.key_length_mla", k, sizeof(k))) < 0) {
		if (gguf_find_tensor(g, "blk.0.attn_kv_b.weight"))
			return errbuf_set(
			    e, ERR_UNSUPPORTED,
			    "legacy GGUF with blk.N.attn_kv_b (no %s): re-convert with a llama.cpp "
			    "converter that writes attn_k_b/attn_v_b",
			    k);
		return errbuf_set(e, ERR_FORMAT, "metadata key %s is missing", k);
	}
	if (gguf_find_key(g, akey(hp, "attention.q_lora_rank", k, sizeof(k))) < 0)
		return errbuf_set(e, ERR_UNSUPPORTED,
		                  "metadata key %s is missing (models with a direct attn_q "
		                  "projection are not supported)",
		                  k);
	int64_t klm;
	GI("attention.key_length_mla", true, 0, 2, LIM, klm);
	GI("attention.value_length_mla", true, 0, 1, LIM, hp->V);
	GI("rope.dimension_count", true, 0, 2, 4096, hp->R);
	if (hp->R % 2)
		return errbuf_set(e, ERR_FORMAT, "rope.dimension_count %lld is odd", (long long)hp->R);
	if (klm <= hp->R)
		return errbuf_set(e, ERR_FORMAT,
		                  "attention.key_length_mla %lld must exceed rope.dimension_count %lld",
		                  (long long)klm, (long long)hp->R);
	hp->N = klm - hp->R;
	GI("attention.q_lora_rank", true, 0, 1, LIM, hp->Cq);
	GI("attention.kv_lora_rank", true, 0, 1, LIM, hp->C);
	GI("leading_dense_block_count", false, 0, 0, hp->n_layers, hp->n_dense_lead);
	GI("feed_forward_length", hp->n_dense_lead > 0, 0, 1, LIM, hp->n_ff);
	bool has_moe = hp->n_dense_lead < hp->n_layers;
	GI("expert_count", has_moe, 0, 1, 65536, hp->n_expert);
	GI("expert_used_count", has_moe, 0, 1, hp->n_expert > 0 ? hp->n_expert : 1, hp->n_expert_used);
	GI("expert_feed_forward_length", has_moe, 0, 1, LIM, hp->n_ff_exp);
	GI("expert_shared_count", false, 0, 0, 64, hp->n_expert_shared);
	GI("expert_group_count", false, 1, 1, 256, hp->n_group);
	GI("expert_group_used_count", false, 1, 1, hp->n_group, hp->n_group_used);
	/* absent: sigmoid for glm-dsa / deepseek32 (their only router); deepseek2 files without the
	 * key are V2-era conversions that llama.cpp runs with softmax, so do the same */
	GI("expert_gating_func", false, hp->arch == MODEL_ARCH_DEEPSEEK2 ? 1 : 2, 1, 2, hp->gating_func);
	if (has_moe && hp->n_expert % hp->n_group)
		return errbuf_set(e, ERR_FORMAT, "expert_count %d is not a multiple of expert_group_count %d",
		                  hp->n_expert, hp->n_group);
	if (has_moe && hp->n_group > 1 && hp->n_expert / hp->n_group < 2)
		return errbuf_set(e, ERR_FORMAT, "expert groups need at least 2 experts each");
	if (has_moe && hp->n_expert_used > hp->n_expert)
		return errbuf_set(e, ERR_FORMAT, "expert_used_count > expert_count");
	bool bv = true;
	rc = gguf_get_bool(g, akey(hp, "expert_weights_norm", k, sizeof(k)), &bv, e);
	if (rc == ERR_NOTFOUND)
		bv = hp->arch != MODEL_ARCH_DEEPSEEK2 ? true : false;
	else if (rc)
		return rc;
	hp->expert_weights_norm = bv;
	if ((rc = get_f(g, hp, "expert_weights_scale", 1.0f, &hp->expert_weights_scale, e)))
		return rc;
	if ((rc = get_f(g, hp, "attention.layer_norm_rms_epsilon", 1e-6f, &hp->rms_eps, e)))
		return rc;
	if (hp->rms_eps <= 0)
		return errbuf_set(e, ERR_FORMAT, "attention.layer_norm_rms_epsilon must be > 0");
	hp->latent_eps = o && o->latent_eps > 0 ? o->latent_eps : 1e-6f;
	hp->idx_norm_eps = 1e-6f;
	if ((rc = get_f(g, hp, "rope.freq_base", 10000.0f, &hp->rope_theta, e)))
		return rc;
	if (hp->rope_theta <= 1.0f)
		return errbuf_set(e, ERR_FORMAT, "rope.freq_base must be > 1");
	hp->rope_main = MODEL_ROPE_INTERLEAVED;
	hp->rope_idx = hp->arch == MODEL_ARCH_DEEPSEEK32 ? MODEL_ROPE_HALF : MODEL_ROPE_INTERLEAVED;

	/* YaRN */
	const char *st;
	size_t stl;
	rc = gguf_get_str(g, akey(hp, "rope.scaling.type", k, sizeof(k)), &st, &stl, e);
	if (rc && rc != ERR_NOTFOUND)
		return rc;
	float mscale2 = 1.0f;
	if (rc == 0 && stl == 4 && memcmp(st, "yarn", 4) == 0) {
		hp->yarn = true;
		if ((rc = get_f(g, hp, "rope.scaling.factor", 1.0f, &hp->yarn_factor, e)))
			return rc;
		GI("rope.scaling.original_context_length", true, 0, 1, INT64_C(1) << 40, hp->yarn_orig_ctx);
		if ((rc = get_f(g, hp, "rope.scaling.yarn_beta_fast", 32.0f, &hp->yarn_beta_fast, e)) ||
		    (rc = get_f(g, hp, "rope.scaling.yarn_beta_slow", 1.0f, &hp->yarn_beta_slow, e)))
			return rc;
		float lm;
		/* stored as 0.1 * mscale_all_dim (MODEL-SPEC.md §7.10) */
		if ((rc = get_f(g, hp, "rope.scaling.yarn_log_multiplier", 0.0f, &lm, e)))
			return rc;
		hp->yarn_mscale_all_dim = lm / 0.1f;
		if (hp->yarn_factor < 1.0f)
			return errbuf_set(e, ERR_FORMAT, "rope.scaling.factor %g < 1", hp->yarn_factor);
		if (hp->yarn_factor > 1.0f && hp->yarn_mscale_all_dim != 0.0f) {
			double m = 1.0 + 0.1 * (double)hp->yarn_mscale_all_dim * log((double)hp->yarn_factor);
			mscale2 = (float)(m * m);
		}
	} else if (rc == 0 && !(stl == 4 && memcmp(st, "none", 4) == 0) && stl != 0) {
		return errbuf_set(e, ERR_UNSUPPORTED,
		                  "rope.scaling.type '%.*s' is not supported (yarn or none)",
		                  (int)(stl > 32 ? 32 : stl), st);
	}
	hp->attn_scale = (float)(1.0 / sqrt((double)(hp->N + hp->R))) * mscale2;

	/* vocab: rows of token_embd (vocab_size key is informational) */
	const struct gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
	if (!te)
		return errbuf_set(e, ERR_FORMAT, "tensor token_embd.weight is missing");
	if (te->n_dims != 2 || te->ne[0] != hp->D)
		return errbuf_set(
		    e, ERR_FORMAT,
		    "tensor token_embd.weight: expected ne=[%lld, vocab], file has %d dims ne0=%lld",
		    (long long)hp->D, te->n_dims, (long long)te->ne[0]);
	hp->vocab = te->ne[1];
	hp->lm_head_tied = gguf_find_tensor(g, "output.weight") == NULL;

	/* indexer schedule */
	for (int l = 0; l < MODEL_MAX_LAYERS; l++) {
		hp->idx_src[l] = -1;
		hp->idx_slot[l] = -1;
	}
	if (hp->arch != MODEL_ARCH_DEEPSEEK2) {
		GI("attention.indexer.head_count", false, 0, 0, 65536, hp->idx_H);
		GI("attention.indexer.key_length", false, 0, 0, LIM, hp->idx_D);
		GI("attention.indexer.top_k", false, 0, 0, INT64_C(1) << 30, hp->idx_topk);
		struct gguf_arr arr;
		rc = gguf_get_arr(g, akey(hp, "attention.indexer.types", k, sizeof(k)), &arr, e);
		if (rc && rc != ERR_NOTFOUND)
			return rc;
		bool have_types = rc == 0;
		if (have_types && arr.count < (uint64_t)hp->n_layers)
			return errbuf_set(e, ERR_FORMAT, "%s has %llu entries, need one per main layer (%d)",
			                  k, (unsigned long long)arr.count, hp->n_layers);
		if (have_types && (arr.type == GGUF_VT_STRING || arr.type == GGUF_VT_ARRAY))
			return errbuf_set(e, ERR_FORMAT, "%s must be an array of bools", k);
		for (int l = 0; l < hp->n_layers; l++) {
			bool full;
			if (have_types) {
				full = gguf_arr_int(&arr, (uint64_t)l) != 0;
			} else {
				char tn[96];
				snprintf(tn, sizeof(tn), "blk.%d.indexer.attn_k.weight", l);
				full = gguf_find_tensor(g, tn) != NULL;
			}
			hp->idx_full[l] = full;
		}
		if (!have_types && hp->arch == MODEL_ARCH_GLM_DSA && hp->n_ctx_train >= 1048576 &&
		    hp->idx_full[0] && (!o || !o->quiet))
			LOG_WARN(
			    "model",
			    "%s is absent and context_length is %lld: a GLM-5.2 file shares indexers (21 "
			    "full / "
			    "57 shared layers) but without the key every layer with indexer tensors runs its "
			    "own; "
			    "results differ from GLM-5.2 beyond top_k tokens (re-convert with indexer types)",
			    k, (long long)hp->n_ctx_train);
		if (hp->idx_full[0] || have_types) {
			if (!hp->idx_full[0])
				return errbuf_set(e, ERR_FORMAT, "%s: layer 0 must have a full indexer", k);
			hp->has_indexer = true;
		} else {
			for (int l = 0; l < hp->n_layers; l++)
				if (hp->idx_full[l])
					return errbuf_set(e, ERR_FORMAT,
					                  "blk.%d has indexer tensors but blk.0 has none "
					                  "(layer 0 must have a full indexer)",
					                  l);
		}
		if (hp->has_indexer) {
			if (hp->idx_H <= 0 || hp->idx_D <= 0 || hp->idx_topk <= 0)
				return errbuf_set(e, ERR_FORMAT,
				                  "indexer layers present but %s.attention.indexer."
				                  "{head_count,key_length,top_k} missing or zero",
				                  model_arch_name(hp->arch));
			if (hp->idx_D < hp->R)
				return errbuf_set(e, ERR_FORMAT, "indexer key_length %lld < rope dims %lld",
				                  (long long)hp->idx_D, (long long)hp->R);
			int src = 0;
			for (int l = 0; l < hp->n_layers; l++) {
				if (hp->idx_full[l]) {
					src = l;
					hp->idx_slot[l] = hp->n_idx_full++;
				}
				hp->idx_src[l] = src;
			}
		}
	}
#undef GI
	return 0;
}

/* ---- tensor table ------------------------------------------------------------------------------ */

enum tkind { TK_MATRIX, TK_VEC, TK_ROUTER };

struct tspec {
	char name[96];
	int n_dims;
	int64_t ne[3];
	enum tkind kind;
	bool optional;
};

static void add(struct tspec *v, int *n, enum tkind kind, bool opt, int nd, int64_t a, int64_t b, int64_t c,
                const char *suffix, int l)
{
	struct tspec *t = &v[(*n)++];
	/* names are "blk.<l>.<suffix>" or a top-level name (l < 0) */
	if (l < 0)
		snprintf(t->name, sizeof(t->name), "%s", suffix);
	else
		snprintf(t->name, sizeof(t->name), "blk.%d.%s", l, suffix);
	t->n_dims = nd;
	t->ne[0] = a;
	t->ne[1] = b;
	t->ne[2] = c;
	t->kind = kind;
	t->optional = opt;
}

/* Expected tensors for hp (allocated; *n_out entries). */
static struct tspec *tensor_specs(const struct model_hparams *hp, int *n_out)
{
	int cap = 8 + hp->n_layers * 32;
	struct tspec *v = calloc((size_t)cap, sizeof(*v));
	if (!v)
		return NULL;
	int n = 0;
	int64_t D = hp->D, H = hp->H, N = hp->N, R = hp->R, C = hp->C, V = hp->V, Cq = hp->Cq;
	add(v, &n, TK_MATRIX, false, 2, D, hp->vocab, 0, "token_embd.weight", -1);
	add(v, &n, TK_VEC, false, 1, D, 0, 0, "output_norm.weight", -1);
	add(v, &n, TK_MATRIX, true, 2, D, hp->vocab, 0, "output.weight", -1);
	for (int l = 0; l < hp->n_layers; l++) {
		add(v, &n, TK_VEC, false, 1, D, 0, 0, "attn_norm.weight", l);
		add(v, &n, TK_MATRIX, false, 2, D, Cq, 0, "attn_q_a.weight", l);
		add(v, &n, TK_VEC, false, 1, Cq, 0, 0, "attn_q_a_norm.weight", l);
		add(v, &n, TK_MATRIX, false, 2, Cq, H * (N + R), 0, "attn_q_b.weight", l);
		add(v, &n, TK_MATRIX, false, 2, D, C + R, 0, "attn_kv_a_mqa.weight", l);
		add(v, &n, TK_VEC, false, 1, C, 0, 0, "attn_kv_a_norm.weight", l);
		add(v, &n, TK_MATRIX, false, 3, N, C, H, "attn_k_b.weight", l);
		add(v, &n, TK_MATRIX, false, 3, C, V, H, "attn_v_b.weight", l);
		add(v, &n, TK_MATRIX, false, 2, H * V, D, 0, "attn_output.weight", l);
		if (hp->has_indexer && hp->idx_full[l]) {
			int64_t HI = hp->idx_H, DI = hp->idx_D;
			add(v, &n, TK_MATRIX, false, 2, Cq, HI * DI, 0, "indexer.attn_q_b.weight", l);
			add(v, &n, TK_MATRIX, false, 2, D, DI, 0, "indexer.attn_k.weight", l);
			add(v, &n, TK_VEC, false, 1, DI, 0, 0, "indexer.k_norm.weight", l);
			add(v, &n, TK_VEC, false, 1, DI, 0, 0, "indexer.k_norm.bias", l);
			add(v, &n, TK_ROUTER, false, 2, D, HI, 0, "indexer.proj.weight", l);
		}
		add(v, &n, TK_VEC, false, 1, D, 0, 0, "ffn_norm.weight", l);
		if (l < hp->n_dense_lead) {
			add(v, &n, TK_MATRIX, false, 2, D, hp->n_ff, 0, "ffn_gate.weight", l);
			add(v, &n, TK_MATRIX, false, 2, D, hp->n_ff, 0, "ffn_up.weight", l);
			add(v, &n, TK_MATRIX, false, 2, hp->n_ff, D, 0, "ffn_down.weight", l);
		} else {
			int64_t E = hp->n_expert, F = hp->n_ff_exp, FS = F * hp->n_expert_shared;
			add(v, &n, TK_ROUTER, false, 2, D, E, 0, "ffn_gate_inp.weight", l);
			add(v, &n, TK_VEC, true, 1, E, 0, 0, "exp_probs_b.bias", l);
			add(v, &n, TK_MATRIX, false, 3, D, F, E, "ffn_gate_exps.weight", l);
			add(v, &n, TK_MATRIX, false, 3, D, F, E, "ffn_up_exps.weight", l);
			add(v, &n, TK_MATRIX, false, 3, F, D, E, "ffn_down_exps.weight", l);
			if (hp->n_expert_shared > 0) {
				add(v, &n, TK_MATRIX, false, 2, D, FS, 0, "ffn_gate_shexp.weight", l);
				add(v, &n, TK_MATRIX, false, 2, D, FS, 0, "ffn_up_shexp.weight", l);
				add(v, &n, TK_MATRIX, false, 2, FS, D, 0, "ffn_down_shexp.weight", l);
			}
		}
	}
	*n_out = n;
	return v;
}

/* Tensors that are legitimately present but not used: nextn/MTP layers (index >= main layers) and
 * indexer tensors duplicated onto "shared" layers (MODEL-SPEC.md §2.6.7). */
static int ignorable(const struct model_hparams *hp, const char *name)
{
	int l;
	int off = 0;
	if (sscanf(name, "blk.%d.%n", &l, &off) == 1 && off > 0) {
		if (l >= hp->n_layers && l < hp->n_layers_file)
			return 1; /* nextn */
		if (l >= 0 && l < hp->n_layers && strncmp(name + off, "indexer.", 8) == 0 &&
		    (!hp->has_indexer || !hp->idx_full[l]))
			return 2;
	}
	return 0;
}

static bool type_ok(int type, enum tkind kind)
{
	const struct ktype_info *ti = ktype_get(type);
	if (!ti || !ti->compute)
		return false;
	(void)kind;
	return true;
}

static void problem(int *n, FILE *report, struct errbuf *e, int code, const char *fmt, ...) TD_PRINTF(5, 6);
static void problem(int *n, FILE *report, struct errbuf *e, int code, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (report)
		fprintf(report, "problem: %s\n", msg);
	if (*n == 0)
		errbuf_set(e, code, "%s", msg);
	(*n)++;
}

int model_tensors_check(const struct gguf_ctx *g, const struct model_hparams *hp, bool strict, FILE *report,
                        struct errbuf *e)
{
	int n_spec;
	struct tspec *spec = tensor_specs(hp, &n_spec);
	if (!spec)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int n_prob = 0;
	for (int i = 0; i < n_spec; i++) {
		const struct tspec *s = &spec[i];
		const struct gguf_tensor *t = gguf_find_tensor(g, s->name);
		if (!t) {
			if (!s->optional)
				problem(&n_prob, report, e, ERR_FORMAT,
				        "tensor %s is missing (required by %s)", s->name,
				        model_arch_name(hp->arch));
			continue;
		}
		bool shape_ok = t->n_dims == s->n_dims;
		for (int d = 0; d < s->n_dims && shape_ok; d++)
			shape_ok = t->ne[d] == s->ne[d];
		if (!shape_ok) {
			char want[80], have[80];
			if (s->n_dims == 1)
				snprintf(want, sizeof(want), "[%lld]", (long long)s->ne[0]);
			else if (s->n_dims == 2)
				snprintf(want, sizeof(want), "[%lld, %lld]", (long long)s->ne[0],
				         (long long)s->ne[1]);
			else
				snprintf(want, sizeof(want), "[%lld, %lld, %lld]", (long long)s->ne[0],
				         (long long)s->ne[1], (long long)s->ne[2]);
			int o = snprintf(have, sizeof(have), "[");
			for (int d = 0; d < t->n_dims && o < (int)sizeof(have); d++)
				o += snprintf(have + o, sizeof(have) - (size_t)o, "%s%lld", d ? ", " : "",
				              (long long)t->ne[d]);
			if (o < (int)sizeof(have))
				snprintf(have + o, sizeof(have) - (size_t)o, "]");
			problem(&n_prob, report, e, ERR_FORMAT, "tensor %s: expected ne=%s, file has ne=%s",
			        s->name, want, have);
			continue;
		}
		if (!type_ok(t->type, s->kind))
			problem(&n_prob, report, e, ERR_UNSUPPORTED,
			        "tensor %s: type %s is not supported for computing", s->name,
			        ktype_name(t->type));
	}
	/* extra tensors */
	int64_t nt = gguf_n_tensors(g);
	int n_nextn = 0, n_dup = 0;
	for (int64_t i = 0; i < nt; i++) {
		const char *name = gguf_tensor(g, i)->name;
		bool known = false;
		for (int j = 0; j < n_spec && !known; j++)
			known = strcmp(spec[j].name, name) == 0;
		if (known)
			continue;
		int ig = ignorable(hp, name);
		if (ig == 1) {
			n_nextn++;
			continue;
		}
		if (ig == 2) {
			n_dup++;
			continue;
		}
		if (strict)
			problem(&n_prob, report, e, ERR_FORMAT, "tensor %s is not part of architecture %s",
			        name, model_arch_name(hp->arch));
		else if (report)
			fprintf(report, "warning: tensor %s is not part of architecture %s (ignored)\n", name,
			        model_arch_name(hp->arch));
		else
			LOG_WARN("model", "tensor %s is not part of architecture %s (ignored)", name,
			         model_arch_name(hp->arch));
	}
	if (report && (n_nextn || n_dup))
		fprintf(report,
		        "info: %d nextn/MTP tensors and %d indexer tensors of shared layers are not used\n",
		        n_nextn, n_dup);
	free(spec);
	return n_prob;
}

int model_arch_check(const struct gguf_ctx *g, FILE *report)
{
	struct model_hparams *hp = malloc(sizeof(*hp));
	struct errbuf e = {0};
	if (!hp)
		return -ENOMEM;
	int rc = model_hparams_read(g, NULL, hp, &e);
	if (rc) {
		if (report)
			fprintf(report, "problem: %s\n", e.msg);
		free(hp);
		return 1;
	}
	if (report)
		fprintf(
		    report,
		    "architecture %s: %d main layers (+%d nextn), D=%lld H=%lld N=%lld R=%lld V=%lld C=%lld "
		    "Cq=%lld vocab=%lld, %d dense + %d MoE layers (E=%d k=%d F=%lld), indexer %s (HI=%lld "
		    "DI=%lld "
		    "K=%lld, %d full layers)\n",
		    model_arch_name(hp->arch), hp->n_layers, hp->n_nextn, (long long)hp->D, (long long)hp->H,
		    (long long)hp->N, (long long)hp->R, (long long)hp->V, (long long)hp->C, (long long)hp->Cq,
		    (long long)hp->vocab, hp->n_dense_lead, hp->n_layers - hp->n_dense_lead, hp->n_expert,
		    hp->n_expert_used, (long long)hp->n_ff_exp, hp->has_indexer ? "yes" : "no",
		    (long long)hp->idx_H, (long long)hp->idx_D, (long long)hp->idx_topk, hp->n_idx_full);
	rc = model_tensors_check(g, hp, false, report, &e);
	free(hp);
	return rc;
}
