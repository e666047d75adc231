/* GGUF v3 writer: collects metadata and tensor descriptions, then writes the file in one pass.
 * Tensor data comes from a borrowed buffer, a whole-tensor callback, or a chunked callback that is
 * called for a bounded number of rows at a time, so files much larger than memory (mkmodel's 17 GiB
 * GLM-5 files) stream through a buffer of a few tens of MiB. The file is written to PATH.tmp and
 * renamed when complete, so a failed write never leaves a truncated PATH behind. */
#include "common/gguf/gguf_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"

#define DEFAULT_CHUNK_BYTES (64u << 20)

struct wkv {
	char *key;
	enum gguf_vtype type;
	uint8_t *val; /* serialized value (as in the file, after the type) */
	size_t len;
};

struct wtensor {
	char *name;
	int type;
	int n_dims;
	int64_t ne[GGUF_MAX_DIMS];
	size_t row_bytes, nbytes;
	const void *data;
	gguf_fill_cb cb;
	gguf_fill_chunk_cb ccb;
	void *user;
	uint64_t offset; /* relative to the data section, assigned at write time */
};

struct gguf_writer {
	size_t alignment;
	struct wkv *kv;
	int64_t n_kv, cap_kv;
	struct wtensor *t;
	int64_t n_t, cap_t;
	int sticky; /* first setter failure */
	size_t chunk_bytes;
	gguf_progress_cb progress;
	void *progress_user;
	size_t sparse_min; /* tensors of at least this many bytes are left as file holes (0: none) */
};

static int sticky(struct gguf_writer *w, int rc)
{
	if (rc && !w->sticky)
		w->sticky = rc;
	return rc;
}

struct gguf_writer *gguf_writer_create(size_t alignment)
{
	if (alignment == 0)
		alignment = GGUF_DEFAULT_ALIGNMENT;
	if ((alignment & (alignment - 1)) || alignment > UINT32_MAX)
		return NULL;
	struct gguf_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->alignment = alignment;
	w->chunk_bytes = DEFAULT_CHUNK_BYTES;
	if (alignment != GGUF_DEFAULT_ALIGNMENT &&
	    gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment)) {
		gguf_writer_destroy(w);
		return NULL;
	}
	return w;
}

void gguf_writer_destroy(struct gguf_writer *w)
{
	if (!w)
		return;
	for (int64_t i = 0; i < w->n_kv; i++) {
		free(w->kv[i].key);
		free(w->kv[i].val);
	}
	for (int64_t i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->kv);
	free(w->t);
	free(w);
}

void gguf_writer_set_sparse(struct gguf_writer *w, size_t min_bytes)
{
	w->sparse_min = min_bytes;
}

void gguf_writer_set_chunk_bytes(struct gguf_writer *w, size_t chunk_bytes)
{
	w->chunk_bytes = chunk_bytes ? chunk_bytes : DEFAULT_CHUNK_BYTES;
}

void gguf_writer_set_progress(struct gguf_writer *w, gguf_progress_cb cb, void *user)
{
	w->progress = cb;
	w->progress_user = user;
}

static bool name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	return n >= 1 && n <= GGUF_MAX_NAME;
}

/* Adds key with an already serialized value; takes ownership of val (freed on failure). */
static int add_kv(struct gguf_writer *w, const char *key, enum gguf_vtype type, uint8_t *val, size_t len)
{
	int rc = 0;
	if (!name_ok(key)) {
		rc = -EINVAL;
		goto fail;
	}
	for (int64_t i = 0; i < w->n_kv; i++)
		if (strcmp(w->kv[i].key, key) == 0) {
			rc = -EEXIST;
			goto fail;
		}
	if (w->n_kv == w->cap_kv) {
		int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
		void *p = realloc(w->kv, (size_t)cap * sizeof(*w->kv));
		if (!p) {
			rc = -ENOMEM;
			goto fail;
		}
		w->kv = p;
		w->cap_kv = cap;
	}
	char *k = strdup(key);
	if (!k) {
		rc = -ENOMEM;
		goto fail;
	}
	w->kv[w->n_kv++] = (struct wkv){.key = k, .type = type, .val = val, .len = len};
	return 0;
fail:
	free(val);
	return sticky(w, rc);
}

static int add_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *v)
{
	size_t n = gguf_vtype_size(type);
	uint8_t *p = malloc(n);
	if (!p)
		return sticky(w, -ENOMEM);
	memcpy(p, v, n);
	return add_kv(w, key, type, p, n);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
	return add_scalar(w, key, GGUF_VT_U32, &v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
	return add_scalar(w, key, GGUF_VT_I32, &v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
	return add_scalar(w, key, GGUF_VT_U64, &v);
}

int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v)
{
	return add_scalar(w, key, GGUF_VT_I64, &v);
}

int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v)
{
	return add_scalar(w, key, GGUF_VT_U16, &v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
	return add_scalar(w, key, GGUF_VT_F32, &v);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v ? 1 : 0;
	return add_scalar(w, key, GGUF_VT_BOOL, &b);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
	if (!v)
		return sticky(w, -EINVAL);
	uint64_t n = strlen(v);
	uint8_t *p = malloc(8 + (size_t)n);
	if (!p)
		return sticky(w, -ENOMEM);
	memcpy(p, &n, 8);
	memcpy(p + 8, v, (size_t)n);
	return add_kv(w, key, GGUF_VT_STRING, p, 8 + (size_t)n);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *data,
                        uint64_t count)
{
	size_t esz = gguf_vtype_size(type);
	if (!esz || (count && !data) || count > (SIZE_MAX - 12) / esz)
		return sticky(w, -EINVAL);
	size_t n = 12 + (size_t)count * esz;
	uint8_t *p = malloc(n);
	if (!p)
		return sticky(w, -ENOMEM);
	uint32_t t = type;
	memcpy(p, &t, 4);
	memcpy(p + 4, &count, 8);
	if (count)
		memcpy(p + 12, data, (size_t)count * esz);
	return add_kv(w, key, GGUF_VT_ARRAY, p, n);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t count)
{
	if (count && !strs)
		return sticky(w, -EINVAL);
	size_t n = 12;
	for (uint64_t i = 0; i < count; i++) {
		if (!strs[i])
			return sticky(w, -EINVAL);
		n += 8 + strlen(strs[i]);
	}
	uint8_t *p = malloc(n), *q;
	if (!p)
		return sticky(w, -ENOMEM);
	uint32_t t = GGUF_VT_STRING;
	memcpy(p, &t, 4);
	memcpy(p + 4, &count, 8);
	q = p + 12;
	for (uint64_t i = 0; i < count; i++) {
		uint64_t l = strlen(strs[i]);
		memcpy(q, &l, 8);
		memcpy(q + 8, strs[i], (size_t)l);
		q += 8 + l;
	}
	return add_kv(w, key, GGUF_VT_ARRAY, p, n);
}

int gguf_writer_set_raw(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *val,
                        size_t len)
{
	if ((unsigned)type >= GGUF_VT_COUNT || !val || gguf_value_validate(type, val, len, NULL))
		return sticky(w, -EINVAL);
	uint8_t *p = malloc(len ? len : 1);
	if (!p)
		return sticky(w, -ENOMEM);
	memcpy(p, val, len);
	return add_kv(w, key, type, p, len);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_ctx *g, int64_t kv)
{
	if (!g || kv < 0 || kv >= g->meta.n)
		return sticky(w, -EINVAL);
	const struct gguf_kv_rec *r = &g->meta.kv[kv];
	uint8_t *p = malloc(r->val_len ? r->val_len : 1);
	if (!p)
		return sticky(w, -ENOMEM);
	memcpy(p, r->val, r->val_len);
	return add_kv(w, r->key, r->type, p, r->val_len);
}

static int add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                      struct wtensor *proto)
{
	if (!name_ok(name) || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
		return sticky(w, -EINVAL);
	struct wtensor t = *proto;
	t.type = type;
	t.n_dims = n_dims;
	uint64_t rows = 1;
	for (int d = 0; d < GGUF_MAX_DIMS; d++) {
		t.ne[d] = d < n_dims ? ne[d] : 1;
		if (t.ne[d] < 1)
			return sticky(w, -EINVAL);
		if (d > 0) {
			if (rows > (uint64_t)INT64_MAX / (uint64_t)t.ne[d])
				return sticky(w, -EINVAL);
			rows *= (uint64_t)t.ne[d];
		}
	}
	if (!ktype_get(type) || !ktype_row_bytes(type, t.ne[0], &t.row_bytes) ||
	    (t.row_bytes && rows > SIZE_MAX / t.row_bytes))
		return sticky(w, -EINVAL);
	t.nbytes = t.row_bytes * (size_t)rows;
	for (int64_t i = 0; i < w->n_t; i++)
		if (strcmp(w->t[i].name, name) == 0)
			return sticky(w, -EEXIST);
	if (w->n_t == w->cap_t) {
		int64_t cap = w->cap_t ? 2 * w->cap_t : 64;
		void *p = realloc(w->t, (size_t)cap * sizeof(*w->t));
		if (!p)
			return sticky(w, -ENOMEM);
		w->t = p;
		w->cap_t = cap;
	}
	t.name = strdup(name);
	if (!t.name)
		return sticky(w, -ENOMEM);
	w->t[w->n_t++] = t;
	return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                           const void *data)
{
	if (!data)
		return sticky(w, -EINVAL);
	struct wtensor p = {.data = data};
	return add_tensor(w, name, type, n_dims, ne, &p);
}

int gguf_writer_add_tensor_cb(struct gguf_writer *w, const char *name, int type, int n_dims,
                              const int64_t *ne, gguf_fill_cb cb, void *user)
{
	if (!cb)
		return sticky(w, -EINVAL);
	struct wtensor p = {.cb = cb, .user = user};
	return add_tensor(w, name, type, n_dims, ne, &p);
}

int gguf_writer_add_tensor_chunked(struct gguf_writer *w, const char *name, int type, int n_dims,
                                   const int64_t *ne, gguf_fill_chunk_cb cb, void *user)
{
	if (!cb)
		return sticky(w, -EINVAL);
	struct wtensor p = {.ccb = cb, .user = user};
	return add_tensor(w, name, type, n_dims, ne, &p);
}

/* ---- writing ----------------------------------------------------------------------------------- */

static int put(FILE *f, const void *p, size_t n)
{
	return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

static int put_str(FILE *f, const char *s)
{
	uint64_t n = strlen(s);
	int rc = put(f, &n, 8);
	return rc ? rc : put(f, s, (size_t)n);
}

static int put_zeros(FILE *f, size_t n)
{
	static const uint8_t z[256];
	while (n > 0) {
		size_t k = n < sizeof(z) ? n : sizeof(z);
		if (put(f, z, k))
			return -EIO;
		n -= k;
	}
	return 0;
}

static int write_tensor_data(struct gguf_writer *w, FILE *f, const struct wtensor *t, struct errbuf *e)
{
	if (w->sparse_min && t->nbytes >= w->sparse_min) /* a hole: reads as zeros, takes no disk */
		return fseeko(f, (off_t)t->nbytes, SEEK_CUR)
		           ? errbuf_set(e, -EIO, "tensor '%s': seek failed", t->name)
		           : 0;
	if (t->data)
		return put(f, t->data, t->nbytes) ? errbuf_set(e, -EIO, "tensor '%s': write failed", t->name)
		                                  : 0;
	int rc = 0;
	if (t->cb) {
		void *buf = malloc(t->nbytes);
		if (!buf)
			return errbuf_set(e, -ENOMEM, "tensor '%s': cannot allocate %zu bytes", t->name,
			                  t->nbytes);
		rc = t->cb(t->user, t->name, buf, t->nbytes);
		if (rc)
			rc = errbuf_set(e, rc < 0 ? rc : -EIO, "tensor '%s': data callback failed (%d)",
			                t->name, rc);
		else if (put(f, buf, t->nbytes))
			rc = errbuf_set(e, -EIO, "tensor '%s': write failed", t->name);
		free(buf);
		return rc;
	}
	size_t rows_per = w->chunk_bytes / t->row_bytes;
	if (rows_per == 0)
		rows_per = 1;
	size_t cap = rows_per * t->row_bytes;
	if (cap > t->nbytes)
		cap = t->nbytes;
	void *buf = malloc(cap);
	if (!buf)
		return errbuf_set(e, -ENOMEM, "tensor '%s': cannot allocate %zu bytes", t->name, cap);
	for (size_t off = 0; off < t->nbytes; off += cap) {
		size_t n = t->nbytes - off < cap ? t->nbytes - off : cap;
		rc = t->ccb(t->user, t->name, off, buf, n);
		if (rc) {
			rc = errbuf_set(e, rc < 0 ? rc : -EIO, "tensor '%s': data callback failed (%d)",
			                t->name, rc);
			break;
		}
		if (put(f, buf, n)) {
			rc = errbuf_set(e, -EIO, "tensor '%s': write failed", t->name);
			break;
		}
	}
	free(buf);
	return rc;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, struct errbuf *e)
{
	if (w->sticky)
		return errbuf_set(e, w->sticky, "gguf writer: an earlier setter failed (%s)",
		                  err_name(w->sticky));
	size_t plen = strlen(path) + 8;
	char *tmp = malloc(plen);
	if (!tmp)
		return errbuf_set(e, -ENOMEM, "out of memory");
	snprintf(tmp, plen, "%s.tmp", path);
	int rc = 0;
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		rc = errbuf_set(e, -errno, "%s: cannot create: %s", tmp, strerror(errno));
		goto free_tmp;
	}
	setvbuf(f, NULL, _IOFBF, 1 << 20);

	/* header, kvs and tensor infos */
	uint32_t magic = 0x46554747u, version = 3;
	uint64_t nt = (uint64_t)w->n_t, nkv = (uint64_t)w->n_kv;
	uint64_t pos = 24, total = 0;
	rc = put(f, &magic, 4) || put(f, &version, 4) || put(f, &nt, 8) || put(f, &nkv, 8) ? -EIO : 0;
	for (int64_t i = 0; !rc && i < w->n_kv; i++) {
		uint32_t t = w->kv[i].type;
		rc = put_str(f, w->kv[i].key) || put(f, &t, 4) || put(f, w->kv[i].val, w->kv[i].len) ? -EIO
		                                                                                     : 0;
		pos += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].len;
	}
	uint64_t off = 0;
	for (int64_t i = 0; !rc && i < w->n_t; i++) {
		struct wtensor *t = &w->t[i];
		uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
		t->offset = off;
		off += t->nbytes;
		off = (off + w->alignment - 1) / w->alignment * w->alignment;
		total += t->nbytes;
		rc = put_str(f, t->name) || put(f, &nd, 4) || put(f, t->ne, 8 * (size_t)nd) ||
		             put(f, &ty, 4) || put(f, &t->offset, 8)
		         ? -EIO
		         : 0;
		pos += 8 + strlen(t->name) + 4 + 8 * (size_t)nd + 4 + 8;
	}
	if (rc) {
		rc = errbuf_set(e, rc, "%s: write failed", tmp);
		goto close_f;
	}
	/* data section */
	if (w->n_t > 0 && (rc = put_zeros(f, (size_t)((w->alignment - pos % w->alignment) % w->alignment)))) {
		rc = errbuf_set(e, rc, "%s: write failed", tmp);
		goto close_f;
	}
	uint64_t done = 0;
	for (int64_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		if ((rc = write_tensor_data(w, f, t, e)))
			goto close_f;
		done += t->nbytes;
		uint64_t end = t->offset + t->nbytes;
		if (i + 1 < w->n_t && (rc = put_zeros(f, (size_t)(w->t[i + 1].offset - end)))) {
			rc = errbuf_set(e, rc, "%s: write failed", tmp);
			goto close_f;
		}
		if (w->progress)
			w->progress(w->progress_user, done, total);
	}
close_f:
	if (!rc && w->sparse_min) { /* a trailing hole: the file must still reach its full length */
		off_t end = ftello(f);
		if (fflush(f) != 0 || end < 0 || ftruncate(fileno(f), end) != 0)
			rc = errbuf_set(e, -EIO, "%s: cannot extend: %s", tmp, strerror(errno));
	}
	if (fclose(f) != 0 && !rc)
		rc = errbuf_set(e, -EIO, "%s: write failed: %s", tmp, strerror(errno));
	if (!rc && rename(tmp, path) != 0)
		rc = errbuf_set(e, -errno, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
	if (rc)
		unlink(tmp);
free_tmp:
	free(tmp);
	return rc;
}
