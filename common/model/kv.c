/* Paged KV pool layout and the KV-layout fingerprint (model.h). One block = 64 tokens of every
 * main layer's latent (c, k_r) followed by 64 tokens of every full indexer layer's key. The
 * fingerprint names everything a peer must agree on to exchange raw blocks. */
#include <stdlib.h>
#include <string.h>

#include "common/model/model_internal.h"

void model_kv_layout_get(const struct model *m, struct model_kv_layout *L)
{
	const struct model_hparams *hp = &m->hp;
	memset(L, 0, sizeof(*L));
	L->dtype = m->opts.kv_dtype;
	L->elt_bytes = L->dtype == MODEL_KV_BF16 ? 2 : 4;
	L->block_tokens = MODEL_KV_BLOCK_TOKENS;
	L->n_layers = hp->n_layers;
	L->n_idx = hp->has_indexer ? hp->n_idx_full : 0;
	L->lat_dim = hp->C + hp->R;
	L->idx_dim = hp->has_indexer ? hp->idx_D : 0;
	L->lat_layer_bytes = (size_t)L->block_tokens * (size_t)L->lat_dim * L->elt_bytes;
	L->idx_layer_bytes = (size_t)L->block_tokens * (size_t)L->idx_dim * L->elt_bytes;
	L->idx_offset = L->lat_layer_bytes * (size_t)L->n_layers;
	L->block_bytes = L->idx_offset + L->idx_layer_bytes * (size_t)L->n_idx;
}

int model_kv_init(struct model_kv *kv, const struct model *m, int64_t n_blocks, void *mem, size_t mem_bytes,
                  struct errbuf *e)
{
	memset(kv, 0, sizeof(*kv));
	model_kv_layout_get(m, &kv->layout);
	if (n_blocks < 1 || n_blocks > INT32_MAX)
		return errbuf_set(e, -EINVAL, "KV pool: %lld blocks out of range", (long long)n_blocks);
	size_t bb = kv->layout.block_bytes;
	if ((size_t)n_blocks > SIZE_MAX / bb)
		return errbuf_set(e, ERR_LIMIT, "KV pool: %lld blocks of %zu bytes overflow",
		                  (long long)n_blocks, bb);
	size_t need = (size_t)n_blocks * bb;
	if (mem) {
		if (mem_bytes < need)
			return errbuf_set(e, ERR_LIMIT,
			                  "KV pool: %zu bytes given, %lld blocks of %zu bytes need %zu",
			                  mem_bytes, (long long)n_blocks, bb, need);
		kv->base = mem;
	} else {
		const struct model_backend *be = &m->ranks[0].be;
		if (be->ops && be->ops->kv_alloc) {
			kv->base = be->ops->kv_alloc(be->ctx, need); /* zeroed device memory */
			kv->on_device = true;
			kv->be_ops = be->ops;
			kv->be_ctx = be->ctx;
		} else {
			kv->base = calloc(1, need);
		}
		if (!kv->base)
			return errbuf_set(e, -ENOMEM, "KV pool: cannot allocate %zu bytes", need);
		kv->owned = true;
	}
	kv->n_blocks = n_blocks;
	return 0;
}

void model_kv_fini(struct model_kv *kv)
{
	if (kv->owned && kv->be_ops)
		kv->be_ops->kv_free(kv->be_ctx, kv->base);
	else if (kv->owned)
		free(kv->base);
	memset(kv, 0, sizeof(*kv));
}

int model_kv_replicate(struct model *m, const struct model_kv *kv, const int32_t *blocks, int n_blocks,
                       struct errbuf *e)
{
	if (!kv->on_device || m->n_ranks_local < 2 || n_blocks <= 0)
		return 0;
#ifdef TANDEM_CUDA
	return model_backend_cuda_kv_replicate(m, kv, blocks, n_blocks, e);
#else
	(void)blocks;
	return errbuf_set(e, ERR_UNSUPPORTED, "KV pool on a device in a build without CUDA");
#endif
}

int model_kv_fingerprint(const struct model *m, char *buf, size_t size)
{
	struct model_kv_layout L;
	model_kv_layout_get(m, &L);
	const struct model_hparams *hp = &m->hp;
	char idx[2 * MODEL_MAX_LAYERS + 8];
	size_t o = 0;
	for (int l = 0; l < hp->n_layers; l++) {
		idx[o++] = hp->has_indexer && hp->idx_full[l] ? '1' : '0';
		if (l + 1 < hp->n_layers)
			idx[o++] = ',';
	}
	idx[o] = 0;
	return snprintf(buf, size, "arch=%s layers=%d block=%d C=%lld R=%lld DI=%lld dtype=%s idx=%s",
	                model_arch_name(hp->arch), hp->n_layers, L.block_tokens, (long long)hp->C,
	                (long long)hp->R, (long long)L.idx_dim, L.dtype == MODEL_KV_BF16 ? "bf16" : "f32",
	                idx);
}

uint64_t model_kv_fingerprint_hash(const struct model *m)
{
	char buf[2 * MODEL_MAX_LAYERS + 256];
	int n = model_kv_fingerprint(m, buf, sizeof(buf));
	uint64_t h = 0xcbf29ce484222325ULL;
	for (int i = 0; i < n && i < (int)sizeof(buf); i++) {
		h ^= (unsigned char)buf[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* ---- KV staging (model.h) ---------------------------------------------------------------------- */

static int check_ids(const struct model_kv *kv, const int32_t *ids, int n, const char *what, struct errbuf *e)
{
	if (n < 0 || (n > 0 && !ids))
		return errbuf_set(e, -EINVAL, "KV %s: %d blocks", what, n);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= kv->n_blocks)
			return errbuf_set(e, ERR_FORMAT, "KV %s: entry %d names block %d of a pool of %lld",
			                  what, i, ids[i], (long long)kv->n_blocks);
	return 0;
}

/* copies the runs of consecutive ids; upload: host -> pool */
static int copy_blocks(const struct model_kv *kv, void *host, const int32_t *ids, int n, bool upload,
                       struct errbuf *e)
{
	size_t bb = kv->layout.block_bytes;
	for (int i = 0; i < n;) {
		int j = i + 1;
		while (j < n && ids[j] == ids[j - 1] + 1)
			j++;
		size_t off = (size_t)ids[i] * bb, bytes = (size_t)(j - i) * bb;
		char *dev = (char *)kv->base + off, *h = (char *)host + off;
		if (kv->on_device && kv->be_ops->kv_copy) {
			int rc = kv->be_ops->kv_copy(kv->be_ctx, dev, h, bytes, upload);
			if (rc)
				return errbuf_set(e, rc, "KV %s of blocks %d..%d failed",
				                  upload ? "upload" : "download", ids[i], ids[j - 1]);
		} else if (kv->on_device) {
			return errbuf_set(e, ERR_UNSUPPORTED, "KV staging: the %s backend cannot copy blocks",
			                  kv->be_ops->name);
		} else if (upload) {
			memcpy(dev, h, bytes);
		} else {
			memcpy(h, dev, bytes);
		}
		i = j;
	}
	return 0;
}

int model_kv_upload(struct model_kv *kv, const void *host, const int32_t *ids, int n, struct errbuf *e)
{
	int rc = check_ids(kv, ids, n, "upload", e);
	return rc ? rc : copy_blocks(kv, (void *)host, ids, n, true, e);
}

int model_kv_download(const struct model_kv *kv, void *host, const int32_t *ids, int n, struct errbuf *e)
{
	int rc = check_ids(kv, ids, n, "download", e);
	if (!rc)
		rc = copy_blocks(kv, host, ids, n, false, e);
	if (!rc && n > 0)
		rc = model_kv_wait(kv, e);
	return rc;
}

int model_kv_wait(const struct model_kv *kv, struct errbuf *e)
{
	if (!kv->on_device || !kv->be_ops->kv_wait)
		return 0;
	int rc = kv->be_ops->kv_wait(kv->be_ctx);
	return rc ? errbuf_set(e, rc, "KV copy failed on the %s backend", kv->be_ops->name) : 0;
}

bool model_kv_on_device(const struct model *m)
{
	const struct model_backend *be = &m->ranks[0].be;
	return be->ops && be->ops->kv_alloc;
}

int model_host_pin(struct model *m, void *p, size_t bytes, struct errbuf *e)
{
	const struct model_backend *be = &m->ranks[0].be;
	if (!be->ops || !be->ops->host_pin || !bytes)
		return 0;
	int rc = be->ops->host_pin(be->ctx, p, bytes);
	return rc ? errbuf_set(e, rc, "cannot page-lock %zu bytes of host memory for the %s backend", bytes,
	                       be->ops->name)
	          : 0;
}

void model_host_unpin(struct model *m, void *p)
{
	const struct model_backend *be = &m->ranks[0].be;
	if (be->ops && be->ops->host_unpin && p)
		be->ops->host_unpin(be->ctx, p);
}

int model_thread_attach(struct model *m, struct errbuf *e)
{
	const struct model_backend *be = &m->ranks[0].be;
	if (!be->ops || !be->ops->bind_thread)
		return 0;
	int rc = be->ops->bind_thread(be->ctx);
	return rc ? errbuf_set(e, rc, "cannot use device %d from this thread", m->opts.device) : 0;
}
