/* Model loading: reads the hyperparameters, checks the tensor table (arch.c), binds every weight
 * as a view into the GGUF mapping (no copy; only the small 1-D norm/bias vectors are converted to
 * fp32 copies) and cuts each rank's shard (MODEL-SPEC.md §3.2): q_b / k_b / v_b by heads, o_proj
 * row-parallel, dense and expert MLPs by their intermediate dim (gate/up column, down row), lm_head
 * by vocab; everything else replicated. A row-parallel cut must keep each shard's n_in a multiple
 * of the type's block size; otherwise the load is refused naming tensor and T. */
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/model/model_internal.h"
#include "common/model/upload.h"

void model_opts_default(struct model_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->n_threads = 1;
	o->tp = 1;
	o->rank = -1;
	o->kv_dtype = MODEL_KV_F32;
}

const struct model_hparams *model_hparams(const struct model *m)
{
	return &m->hp;
}
void model_set_graphs(struct model *m, int graphs)
{
	m->opts.graphs = graphs;
}
void model_set_collectives(struct model *m, bool on)
{
	m->skip_collectives = !on;
}
const struct model_opts *model_get_opts(const struct model *m)
{
	return &m->opts;
}
struct gguf_ctx *model_gguf(const struct model *m)
{
	return m->g;
}

static int bind(const struct gguf_ctx *g, const char *name, struct kweight *w, struct errbuf *e)
{
	const struct gguf_tensor *t = gguf_find_tensor(g, name);
	if (!t)
		return errbuf_set(e, ERR_FORMAT, "tensor %s is missing", name);
	size_t rb;
	if (!ktype_row_bytes(t->type, t->ne[0], &rb))
		return errbuf_set(e, ERR_FORMAT, "tensor %s: bad row size for type %s", name,
		                  ktype_name(t->type));
	w->type = t->type;
	w->n_in = t->ne[0];
	w->n_out = t->ne[1];
	w->row_bytes = rb;
	w->data = t->data;
	return 0;
}

static int bind3(const struct gguf_ctx *g, const char *name, struct kweight3 *w, struct errbuf *e)
{
	int rc = bind(g, name, &w->w, e);
	if (rc)
		return rc;
	const struct gguf_tensor *t = gguf_find_tensor(g, name);
	w->mat_bytes = w->w.row_bytes * (size_t)t->ne[1];
	w->n_mat = t->ne[2];
	return 0;
}

/* column-parallel: rows [r0, r0+n) */
static struct kweight cut_rows(struct kweight w, int64_t r0, int64_t n)
{
	w.data = (const char *)w.data + (size_t)r0 * w.row_bytes;
	w.n_out = n;
	return w;
}

/* row-parallel: inputs [c0, c0+n) of every row */
static int cut_cols(struct kweight *w, int64_t c0, int64_t n, const char *name, int T, struct errbuf *e)
{
	const struct ktype_info *ti = ktype_get(w->type);
	if (!ti || c0 % ti->blck || n % ti->blck)
		return errbuf_set(
		    e, ERR_UNSUPPORTED,
		    "tensor %s: TP=%d would split its rows of %lld %s values into %lld-value shards, not a "
		    "multiple of the type's block size %d; use a smaller TP degree",
		    name, T, (long long)w->n_in, ktype_name(w->type), (long long)n, ti ? ti->blck : 0);
	w->data = (const char *)w->data + (size_t)(c0 / ti->blck) * (size_t)ti->bytes;
	w->n_in = n;
	return 0;
}

static int vec(const struct gguf_ctx *g, const char *name, int64_t n, float **out, struct errbuf *e)
{
	const struct gguf_tensor *t = gguf_find_tensor(g, name);
	*out = NULL;
	if (!t)
		return errbuf_set(e, ERR_FORMAT, "tensor %s is missing", name);
	if (t->ne[0] != n || t->n_dims != 1)
		return errbuf_set(e, ERR_FORMAT, "tensor %s: expected ne=[%lld]", name, (long long)n);
	*out = malloc((size_t)n * sizeof(float));
	void *raw = malloc(t->nbytes);
	if (!*out || !raw) {
		free(raw);
		return errbuf_set(e, -ENOMEM, "out of memory");
	}
	/* the only read of tensor data before the weights are used (or uploaded): a file truncated
	 * since it was mapped raises SIGBUS here, which becomes an error naming the tensor */
	if (upload_copy_guarded(raw, t->data, t->nbytes)) {
		free(raw);
		return errbuf_set(e, -EFAULT,
		                  "tensor %s: read fault (SIGBUS) on the mapped file: it was truncated "
		                  "after it was opened, or its storage failed",
		                  name);
	}
	kcpu_dequant_row(t->type, raw, *out, n);
	free(raw);
	return 0;
}

static int split(int64_t n, int T, int r, int64_t *lo, int64_t *cnt, const char *what, struct errbuf *e)
{
	if (n % T)
		return errbuf_set(e, ERR_UNSUPPORTED, "TP=%d does not divide %s (%lld)", T, what,
		                  (long long)n);
	*cnt = n / T;
	*lo = *cnt * r;
	return 0;
}

#define NM(fmt) (snprintf(nm, sizeof(nm), fmt, l), nm)

static int bind_rank(struct model *m, struct model_rank *rk, struct errbuf *e)
{
	const struct model_hparams *hp = &m->hp;
	const struct gguf_ctx *g = m->g;
	int T = m->T, r = rk->rank, rc;
	char nm[128];
	int l = 0;
	if ((rc = split(hp->H, T, r, &rk->h0, &rk->Hl, "the attention head count", e)) ||
	    (rc = split(hp->vocab, T, r, &rk->v0, &rk->vl, "the vocabulary size", e)))
		return rc;
	if (hp->n_dense_lead > 0 &&
	    (rc = split(hp->n_ff, T, r, &rk->ff0, &rk->ffl, "feed_forward_length", e)))
		return rc;
	if (hp->n_dense_lead < hp->n_layers) {
		if ((rc = split(hp->n_ff_exp, T, r, &rk->fe0, &rk->fel, "expert_feed_forward_length", e)))
			return rc;
		if (hp->n_expert_shared > 0 && (rc = split(hp->n_ff_exp * hp->n_expert_shared, T, r, &rk->fs0,
		                                           &rk->fsl, "the shared expert width", e)))
			return rc;
	}
	struct kweight lm;
	if ((rc = bind(g, hp->lm_head_tied ? "token_embd.weight" : "output.weight", &lm, e)))
		return rc;
	rk->lm_head = cut_rows(lm, rk->v0, rk->vl);
	rk->layers = calloc((size_t)hp->n_layers, sizeof(*rk->layers));
	if (!rk->layers)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int64_t NR = hp->N + hp->R;
	for (l = 0; l < hp->n_layers; l++) {
		struct layer_w *L = &rk->layers[l];
		struct kweight w;
		if ((rc = vec(g, NM("blk.%d.attn_norm.weight"), hp->D, &L->attn_norm, e)) ||
		    (rc = vec(g, NM("blk.%d.ffn_norm.weight"), hp->D, &L->ffn_norm, e)) ||
		    (rc = vec(g, NM("blk.%d.attn_q_a_norm.weight"), hp->Cq, &L->q_a_norm, e)) ||
		    (rc = vec(g, NM("blk.%d.attn_kv_a_norm.weight"), hp->C, &L->kv_a_norm, e)) ||
		    (rc = bind(g, NM("blk.%d.attn_q_a.weight"), &L->q_a, e)) ||
		    (rc = bind(g, NM("blk.%d.attn_kv_a_mqa.weight"), &L->kv_a, e)) ||
		    (rc = bind(g, NM("blk.%d.attn_q_b.weight"), &w, e)))
			return rc;
		L->q_b = cut_rows(w, rk->h0 * NR, rk->Hl * NR);
		if ((rc = bind3(g, NM("blk.%d.attn_k_b.weight"), &L->k_b, e)) ||
		    (rc = bind3(g, NM("blk.%d.attn_v_b.weight"), &L->v_b, e)))
			return rc;
		L->k_b.w.data = (const char *)L->k_b.w.data + (size_t)rk->h0 * L->k_b.mat_bytes;
		L->k_b.n_mat = rk->Hl;
		L->v_b.w.data = (const char *)L->v_b.w.data + (size_t)rk->h0 * L->v_b.mat_bytes;
		L->v_b.n_mat = rk->Hl;
		if ((rc = bind(g, NM("blk.%d.attn_output.weight"), &L->o, e)) ||
		    (rc = cut_cols(&L->o, rk->h0 * hp->V, rk->Hl * hp->V, nm, T, e)))
			return rc;
		if (hp->has_indexer && hp->idx_full[l]) {
			L->has_idx = true;
			if ((rc = bind(g, NM("blk.%d.indexer.attn_q_b.weight"), &L->idx_q_b, e)) ||
			    (rc = bind(g, NM("blk.%d.indexer.attn_k.weight"), &L->idx_k, e)) ||
			    (rc = bind(g, NM("blk.%d.indexer.proj.weight"), &L->idx_proj, e)) ||
			    (rc =
			         vec(g, NM("blk.%d.indexer.k_norm.weight"), hp->idx_D, &L->idx_knorm_w, e)) ||
			    (rc = vec(g, NM("blk.%d.indexer.k_norm.bias"), hp->idx_D, &L->idx_knorm_b, e)))
				return rc;
		}
		if (l < hp->n_dense_lead) {
			if ((rc = bind(g, NM("blk.%d.ffn_gate.weight"), &w, e)))
				return rc;
			L->ffn_gate = cut_rows(w, rk->ff0, rk->ffl);
			if ((rc = bind(g, NM("blk.%d.ffn_up.weight"), &w, e)))
				return rc;
			L->ffn_up = cut_rows(w, rk->ff0, rk->ffl);
			if ((rc = bind(g, NM("blk.%d.ffn_down.weight"), &L->ffn_down, e)) ||
			    (rc = cut_cols(&L->ffn_down, rk->ff0, rk->ffl, nm, T, e)))
				return rc;
			continue;
		}
		L->moe = true;
		if ((rc = bind(g, NM("blk.%d.ffn_gate_inp.weight"), &L->gate_inp, e)))
			return rc;
		if (gguf_find_tensor(g, NM("blk.%d.exp_probs_b.bias")) &&
		    (rc = vec(g, nm, hp->n_expert, &L->exp_bias, e)))
			return rc;
		if ((rc = bind3(g, NM("blk.%d.ffn_gate_exps.weight"), &L->gate_exps, e)) ||
		    (rc = bind3(g, NM("blk.%d.ffn_up_exps.weight"), &L->up_exps, e)) ||
		    (rc = bind3(g, NM("blk.%d.ffn_down_exps.weight"), &L->down_exps, e)))
			return rc;
		L->gate_exps.w = cut_rows(L->gate_exps.w, rk->fe0, rk->fel);
		L->up_exps.w = cut_rows(L->up_exps.w, rk->fe0, rk->fel);
		if ((rc = cut_cols(&L->down_exps.w, rk->fe0, rk->fel, nm, T, e)))
			return rc;
		if (hp->n_expert_shared > 0) {
			L->has_shexp = true;
			if ((rc = bind(g, NM("blk.%d.ffn_gate_shexp.weight"), &w, e)))
				return rc;
			L->sh_gate = cut_rows(w, rk->fs0, rk->fsl);
			if ((rc = bind(g, NM("blk.%d.ffn_up_shexp.weight"), &w, e)))
				return rc;
			L->sh_up = cut_rows(w, rk->fs0, rk->fsl);
			if ((rc = bind(g, NM("blk.%d.ffn_down_shexp.weight"), &L->sh_down, e)) ||
			    (rc = cut_cols(&L->sh_down, rk->fs0, rk->fsl, nm, T, e)))
				return rc;
		}
	}
	return 0;
}

/* ---- identity hash: FNV-1a 64 over metadata and tensor table ---------------------------------- */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

static size_t vt_size(enum gguf_vtype t)
{
	switch (t) {
	case GGUF_VT_U8:
	case GGUF_VT_I8:
	case GGUF_VT_BOOL: return 1;
	case GGUF_VT_U16:
	case GGUF_VT_I16: return 2;
	case GGUF_VT_U32:
	case GGUF_VT_I32:
	case GGUF_VT_F32: return 4;
	case GGUF_VT_U64:
	case GGUF_VT_I64:
	case GGUF_VT_F64: return 8;
	default: return 0;
	}
}

static uint64_t hash_arr(uint64_t h, const struct gguf_arr *a, int depth)
{
	uint32_t t = (uint32_t)a->type;
	uint64_t n = a->count;
	h = fnv(h, &t, sizeof(t));
	h = fnv(h, &n, sizeof(n));
	if (a->type == GGUF_VT_STRING) {
		for (uint64_t i = 0; i < n; i++) {
			size_t len;
			const char *s = gguf_arr_str(a, i, &len);
			h = fnv(h, &len, sizeof(len));
			if (s)
				h = fnv(h, s, len);
		}
	} else if (a->type == GGUF_VT_ARRAY) {
		for (uint64_t i = 0; i < n && depth < 8; i++) {
			struct gguf_arr sub;
			if (gguf_arr_sub(a, i, &sub) == 0)
				h = hash_arr(h, &sub, depth + 1);
		}
	} else if (a->data) {
		h = fnv(h, a->data, (size_t)n * vt_size(a->type));
	}
	return h;
}

static uint64_t identity_hash(const struct gguf_ctx *g)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	int64_t nkv = gguf_n_kv(g);
	for (int64_t i = 0; i < nkv; i++) {
		const char *k = gguf_kv_key(g, i);
		if (strncmp(k, "split.", 6) == 0)
			continue; /* the same model split differently is the same model */
		enum gguf_vtype t = gguf_kv_type(g, i);
		uint32_t t32 = (uint32_t)t;
		h = fnv(h, k, strlen(k) + 1);
		h = fnv(h, &t32, sizeof(t32));
		if (t == GGUF_VT_STRING) {
			const char *s;
			size_t len;
			if (gguf_get_str(g, k, &s, &len, NULL) == 0)
				h = fnv(fnv(h, &len, sizeof(len)), s, len);
		} else if (t == GGUF_VT_ARRAY) {
			struct gguf_arr a;
			if (gguf_get_arr(g, k, &a, NULL) == 0)
				h = hash_arr(h, &a, 0);
		} else if (t == GGUF_VT_F32 || t == GGUF_VT_F64) {
			float f = 0;
			if (gguf_get_f32(g, k, &f, NULL) == 0)
				h = fnv(h, &f, sizeof(f));
		} else if (t == GGUF_VT_BOOL) {
			bool b = false;
			if (gguf_get_bool(g, k, &b, NULL) == 0)
				h = fnv(h, &b, 1);
		} else {
			int64_t v = 0;
			if (gguf_get_i64(g, k, &v, NULL) == 0)
				h = fnv(h, &v, sizeof(v));
		}
	}
	int64_t nt = gguf_n_tensors(g);
	for (int64_t i = 0; i < nt; i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		int32_t ty = t->type, nd = t->n_dims;
		h = fnv(h, t->name, strlen(t->name) + 1);
		h = fnv(h, &ty, sizeof(ty));
		h = fnv(h, &nd, sizeof(nd));
		h = fnv(h, t->ne, sizeof(t->ne));
	}
	return h;
}

uint64_t model_identity_hash(const struct model *m)
{
	return m->identity;
}

void model_identity_hex(const struct model *m, char hex[17])
{
	snprintf(hex, 17, "%016llx", (unsigned long long)m->identity);
}

/* ---- load / destroy ----------------------------------------------------------------------------- */
static void free_layers(struct layer_w *L, int n)
{
	if (!L)
		return;
	for (int l = 0; l < n; l++) {
		free(L[l].attn_norm);
		free(L[l].ffn_norm);
		free(L[l].q_a_norm);
		free(L[l].kv_a_norm);
		free(L[l].idx_knorm_w);
		free(L[l].idx_knorm_b);
		free(L[l].exp_bias);
	}
	free(L);
}

int model_load_worker(struct model **out, const char *path, const struct model_worker_opts *w,
                      struct errbuf *e)
{
	*out = NULL;
	struct model_opts mo;
	model_opts_default(&mo);
	mo.n_threads = w->threads;
	mo.tp = w->tp;
	mo.kv_dtype = w->kv_dtype && strcmp(w->kv_dtype, "bf16") == 0 ? MODEL_KV_BF16 : MODEL_KV_F32;
	if (!w->backend || (strcmp(w->backend, "cpu") != 0 && strcmp(w->backend, "cuda") != 0))
		return errbuf_set(e, -EINVAL, "backend '%s': expected \"cpu\" or \"cuda\"",
		                  w->backend ? w->backend : "(none)");
	if (strcmp(w->backend, "cuda") == 0) {
		mo.backend = MODEL_BACKEND_CUDA;
		mo.device = w->device;
		mo.graphs = w->graphs;
		mo.mem_fraction = (float)w->mem_fraction;
		mo.max_tokens = w->max_tokens;
		mo.max_seqs = w->max_seqs;
		mo.max_ctx = w->max_ctx > 0 ? w->max_ctx : 4096;
	}
	struct errbuf le = {0};
	int rc = model_load(out, path, &mo, &le);
	if (rc)
		return errbuf_set(e, rc, "cannot load model: %s", le.msg);
	return 0;
}

void model_destroy(struct model *m)
{
	if (!m)
		return;
	model_workers_stop(m);
	for (int i = 0; m->ranks && i < m->n_ranks_local; i++) {
		for (int t = 0; t < m->ranks[i].n_inl; t++)
			kpool_destroy(m->ranks[i].inl[t]);
		free(m->ranks[i].inl);
		kpool_destroy(m->ranks[i].pool);
		free_layers(m->ranks[i].layers, m->hp.n_layers);
		free(m->ranks[i].buf.p);
		if (m->ranks[i].be.ops)
			m->ranks[i].be.ops->destroy(m->ranks[i].be.ctx);
	}
	free(m->ranks);
	tp_nccl_group_destroy(m->nccl); /* after the backends: their graphs hold NCCL work */
	tp_cpu_group_destroy(m->group);
	free(m->out_norm);
	if (m->owns_g)
		gguf_close(m->g);
	free(m);
}

int model_load_gguf(struct model **out, struct gguf_ctx *g, const struct model_opts *o, struct errbuf *e)
{
	struct model_opts dflt;
	int rc;
	*out = NULL;
	if (!o) {
		model_opts_default(&dflt);
		o = &dflt;
	}
	if (o->tp < 1 || o->tp > 256)
		return errbuf_set(e, -EINVAL, "TP degree %d out of range 1..256", o->tp);
	if (o->rank < -1 || o->rank >= o->tp)
		return errbuf_set(e, -EINVAL, "rank %d out of range for TP=%d", o->rank, o->tp);
	if (o->n_threads < 1 || o->n_threads > 4096)
		return errbuf_set(e, -EINVAL, "thread count %d out of range", o->n_threads);
	if (o->kv_dtype != MODEL_KV_F32 && o->kv_dtype != MODEL_KV_BF16)
		return errbuf_set(e, -EINVAL, "unknown KV dtype %d", (int)o->kv_dtype);
	if (o->max_tokens < 0 || o->max_seqs < 0 || o->max_ctx < 0)
		return errbuf_set(e, -EINVAL, "negative batch limit (max_tokens / max_seqs / max_ctx)");
	if (o->backend != MODEL_BACKEND_CPU && o->backend != MODEL_BACKEND_CUDA)
		return errbuf_set(e, -EINVAL, "unknown backend %d", (int)o->backend);
	if (o->backend == MODEL_BACKEND_CUDA) {
#ifndef TANDEM_CUDA
		return errbuf_set(e, ERR_UNSUPPORTED, "backend cuda: this build has no CUDA (make CUDA=1)");
#else
		/* TP over GPUs (all ranks in this process, one thread and one GPU each, NCCL between
		 * them): fail before any weight moves when NCCL or the GPUs are missing */
		if (o->tp > 1 && o->rank < 0) {
			if ((rc = tp_nccl_check_devices(o->tp, o->device, kcuda_device_count(), e)) ||
			    (rc = tp_nccl_available(e)))
				return rc;
		}
#endif
	}
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		return errbuf_set(e, -ENOMEM, "out of memory");
	m->g = g;
	m->opts = *o;
	if (o->backend == MODEL_BACKEND_CUDA) { /* workspaces are sized from these at load */
		if (m->opts.max_tokens == 0)
			m->opts.max_tokens = 512;
		if (m->opts.max_seqs == 0)
			m->opts.max_seqs = 256;
		if (m->opts.max_ctx == 0)
			m->opts.max_ctx = 4096;
	}
	if ((rc = model_hparams_read(g, o, &m->hp, e)))
		goto fail;
	int n_prob = model_tensors_check(g, &m->hp, o->strict, NULL, e);
	if (n_prob < 0) {
		rc = n_prob;
		goto fail;
	}
	if (n_prob > 0) {
		if (n_prob > 1)
			errbuf_prefix(e, "%d problems, first", n_prob);
		rc = e ? e->code : ERR_FORMAT;
		goto fail;
	}
	if (m->hp.n_nextn > 0 && !o->quiet)
		LOG_INFO("model", "skipping %d nextn/MTP layer(s) (blk.%d..%d): not part of the main forward",
		         m->hp.n_nextn, m->hp.n_layers, m->hp.n_layers_file - 1);
	m->identity = identity_hash(g);
	if ((rc = bind(g, "token_embd.weight", &m->tok_embd, e)) ||
	    (rc = vec(g, "output_norm.weight", m->hp.D, &m->out_norm, e)))
		goto fail;
	m->T = o->tp;
	m->n_ranks_local = o->rank >= 0 ? 1 : o->tp;
	m->ranks = calloc((size_t)m->n_ranks_local, sizeof(*m->ranks));
	if (!m->ranks) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto fail;
	}
	struct tp_comm comms[256];
	if (o->rank < 0 && m->T > 1) {
		size_t maxf = MODEL_TP_CHUNK_FLOATS; /* forward.c reduces in chunks of this size */
		if ((rc = tp_cpu_group_create(&m->group, m->T, maxf, comms, e)))
			goto fail;
	}
	int per_rank = o->n_threads / m->n_ranks_local;
	if (per_rank < 1)
		per_rank = 1;
	for (int i = 0; i < m->n_ranks_local; i++) {
		struct model_rank *rk = &m->ranks[i];
		rk->rank = o->rank >= 0 ? o->rank : i;
		if (o->rank >= 0)
			tp_shard_comm_init(&rk->comm, o->rank, m->T);
		else if (m->T > 1)
			rk->comm = comms[i];
		else
			tp_shard_comm_init(&rk->comm, 0, 1);
		/* CUDA: every GPU holds its own copy of the pool and writes it */
		rk->writes_kv = o->rank >= 0 || i == 0 || o->backend == MODEL_BACKEND_CUDA;
		rk->pool = kpool_create(per_rank);
		if (!rk->pool) {
			rc = errbuf_set(e, -ENOMEM, "cannot create a thread pool of %d threads", per_rank);
			goto fail;
		}
		int nthr = kpool_n_threads(rk->pool);
		rk->inl = calloc((size_t)nthr, sizeof(*rk->inl));
		if (!rk->inl) {
			rc = errbuf_set(e, -ENOMEM, "out of memory");
			goto fail;
		}
		for (; rk->n_inl < nthr; rk->n_inl++)
			if (!(rk->inl[rk->n_inl] = kpool_create(1))) {
				rc = errbuf_set(e, -ENOMEM, "cannot create a thread pool");
				goto fail;
			}
		if ((rc = bind_rank(m, rk, e)))
			goto fail;
		if (o->backend == MODEL_BACKEND_CUDA) {
#ifdef TANDEM_CUDA
			if ((rc = model_backend_cuda_create(m, rk, &rk->be, e)))
				goto fail;
#endif
		} else if ((rc = model_backend_cpu_create(m, rk, &rk->be))) {
			errbuf_set(e, rc, "cannot create the CPU backend of rank %d", rk->rank);
			goto fail;
		}
	}
#ifdef TANDEM_CUDA
	if (o->backend == MODEL_BACKEND_CUDA && m->n_ranks_local > 1) {
		struct kcuda_ctx *kcs[256];
		for (int i = 0; i < m->n_ranks_local; i++)
			kcs[i] = model_backend_cuda_kctx(&m->ranks[i]);
		if ((rc = tp_nccl_group_create(&m->nccl, m->n_ranks_local, kcs, comms, e)))
			goto fail;
		for (int i = 0; i < m->n_ranks_local; i++)
			m->ranks[i].dcomm = comms[i];
	}
#endif
	if (!o->quiet) {
		struct model_kv_layout kl;
		model_kv_layout_get(m, &kl);
		LOG_INFO("model",
		         "loaded %s: %d layers, D=%lld H=%lld, %d experts (k=%d), indexer %s; TP=%d%s, %d "
		         "thread(s); "
		         "KV %s, %zu bytes per 64-token block",
		         model_arch_name(m->hp.arch), m->hp.n_layers, (long long)m->hp.D, (long long)m->hp.H,
		         m->hp.n_expert, m->hp.n_expert_used, m->hp.has_indexer ? "yes" : "no", m->T,
		         o->rank >= 0 ? " (rank-shard)" : "", o->n_threads,
		         kl.dtype == MODEL_KV_BF16 ? "bf16" : "f32", kl.block_bytes);
	}
	*out = m;
	return 0;
fail:
	model_destroy(m);
	return rc;
}

int model_load(struct model **out, const char *path, const struct model_opts *o, struct errbuf *e)
{
	struct gguf_ctx *g;
	*out = NULL;
	int rc = gguf_open(&g, path, e);
	if (rc)
		return rc;
	rc = model_load_gguf(out, g, o, e);
	if (rc) {
		gguf_close(g);
		errbuf_prefix(e, "%s", path); /* gguf_open's messages name the file already */
		return rc;
	}
	(*out)->owns_g = true;
	return 0;
}
