/* Accessors of an open GGUF model: typed metadata getters with type conversion rules, array views
 * (O(1) element access through the tables the reader built), and tensor lookup by exact name.
 * Everything here reads data the reader already validated; out-of-range requests return NULL / 0
 * / an error instead of reading outside the mapping. */
#include "common/gguf/gguf_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t gguf_version(const struct gguf_ctx *g)
{
	return g->version;
}

int gguf_n_shards(const struct gguf_ctx *g)
{
	return g->n_shards;
}

size_t gguf_alignment(const struct gguf_ctx *g)
{
	return g->alignment;
}

const char *gguf_shard_path(const struct gguf_ctx *g, int shard)
{
	if (shard < 0 || shard >= g->n_shards)
		return NULL;
	return g->shards[shard].path;
}

uint64_t gguf_shard_size(const struct gguf_ctx *g, int shard)
{
	if (shard < 0 || shard >= g->n_shards)
		return 0;
	return g->shards[shard].size;
}

int64_t gguf_n_kv(const struct gguf_ctx *g)
{
	return g->meta.n;
}

int64_t gguf_find_key(const struct gguf_ctx *g, const char *key)
{
	return gguf_kvset_find(&g->meta, key);
}

const char *gguf_kv_key(const struct gguf_ctx *g, int64_t i)
{
	if (i < 0 || i >= g->meta.n)
		return NULL;
	return g->meta.kv[i].key;
}

enum gguf_vtype gguf_kv_type(const struct gguf_ctx *g, int64_t i)
{
	if (i < 0 || i >= g->meta.n)
		return GGUF_VT_COUNT;
	return g->meta.kv[i].type;
}

/* ---- scalar decoding --------------------------------------------------------------------------- */

/* Decodes a scalar of integer type t at p: *is_neg tells whether the value is negative (then *sv
 * holds it), else *uv holds it. Returns false for non-integer types. */
static bool decode_int(enum gguf_vtype t, const uint8_t *p, uint64_t *uv, int64_t *sv, bool *is_neg)
{
	int64_t s = 0;
	*is_neg = false;
	switch (t) {
	case GGUF_VT_U8: *uv = p[0]; return true;
	case GGUF_VT_U16: {
		uint16_t x;
		memcpy(&x, p, 2);
		*uv = x;
		return true;
	}
	case GGUF_VT_U32: {
		uint32_t x;
		memcpy(&x, p, 4);
		*uv = x;
		return true;
	}
	case GGUF_VT_U64: memcpy(uv, p, 8); return true;
	case GGUF_VT_I8: s = (int8_t)p[0]; break;
	case GGUF_VT_I16: {
		int16_t x;
		memcpy(&x, p, 2);
		s = x;
		break;
	}
	case GGUF_VT_I32: {
		int32_t x;
		memcpy(&x, p, 4);
		s = x;
		break;
	}
	case GGUF_VT_I64: memcpy(&s, p, 8); break;
	default: return false;
	}
	if (s < 0) {
		*is_neg = true;
		*sv = s;
	} else {
		*uv = (uint64_t)s;
	}
	return true;
}

static int find_typed(const struct gguf_ctx *g, const char *key, const struct gguf_kv_rec **kv,
                      struct errbuf *e)
{
	int64_t k = gguf_kvset_find(&g->meta, key);
	if (k < 0) {
		errbuf_set(e, ERR_NOTFOUND, "key '%s' not found", key);
		return ERR_NOTFOUND;
	}
	*kv = &g->meta.kv[k];
	return 0;
}

static int wrong_type(const struct gguf_kv_rec *kv, const char *expected, struct errbuf *e)
{
	return errbuf_set(e, ERR_FORMAT, "key '%s' (offset %llu) has type %s, expected %s", kv->key,
	                  (unsigned long long)kv->file_offset, gguf_vtype_name(kv->type), expected);
}

int gguf_get_u32(const struct gguf_ctx *g, const char *key, uint32_t *out, struct errbuf *e)
{
	const struct gguf_kv_rec *kv = NULL;
	int rc = find_typed(g, key, &kv, e);
	if (rc)
		return rc;
	uint64_t u;
	int64_t s;
	bool neg;
	if (!decode_int(kv->type, kv->val, &u, &s, &neg))
		return wrong_type(kv, "an integer", e);
	if (neg || u > UINT32_MAX)
		return errbuf_set(e, ERR_FORMAT, "key '%s' = %s%llu does not fit in u32", key, neg ? "-" : "",
		                  neg ? (unsigned long long)-(uint64_t)s : (unsigned long long)u);
	*out = (uint32_t)u;
	return 0;
}

int gguf_get_i64(const struct gguf_ctx *g, const char *key, int64_t *out, struct errbuf *e)
{
	const struct gguf_kv_rec *kv = NULL;
	int rc = find_typed(g, key, &kv, e);
	if (rc)
		return rc;
	uint64_t u;
	int64_t s;
	bool neg;
	if (!decode_int(kv->type, kv->val, &u, &s, &neg))
		return wrong_type(kv, "an integer", e);
	if (neg) {
		*out = s;
		return 0;
	}
	if (u > (uint64_t)INT64_MAX)
		return errbuf_set(e, ERR_FORMAT, "key '%s' = %llu does not fit in i64", key,
		                  (unsigned long long)u);
	*out = (int64_t)u;
	return 0;
}

int gguf_get_f32(const struct gguf_ctx *g, const char *key, float *out, struct errbuf *e)
{
	const struct gguf_kv_rec *kv = NULL;
	int rc = find_typed(g, key, &kv, e);
	if (rc)
		return rc;
	if (kv->type == GGUF_VT_F32) {
		memcpy(out, kv->val, 4);
		return 0;
	}
	if (kv->type == GGUF_VT_F64) {
		double d;
		memcpy(&d, kv->val, 8);
		*out = (float)d;
		return 0;
	}
	return wrong_type(kv, "f32 or f64", e);
}

int gguf_get_bool(const struct gguf_ctx *g, const char *key, bool *out, struct errbuf *e)
{
	const struct gguf_kv_rec *kv = NULL;
	int rc = find_typed(g, key, &kv, e);
	if (rc)
		return rc;
	if (kv->type == GGUF_VT_BOOL) {
		*out = kv->val[0] != 0;
		return 0;
	}
	uint64_t u;
	int64_t s;
	bool neg;
	if (decode_int(kv->type, kv->val, &u, &s, &neg) && !neg && u <= 1) {
		*out = u != 0;
		return 0;
	}
	return wrong_type(kv, "bool (or integer 0/1)", e);
}

int gguf_get_str(const struct gguf_ctx *g, const char *key, const char **ptr, size_t *len, struct errbuf *e)
{
	const struct gguf_kv_rec *kv = NULL;
	int rc = find_typed(g, key, &kv, e);
	if (rc)
		return rc;
	if (kv->type != GGUF_VT_STRING)
		return wrong_type(kv, "str", e);
	uint64_t n;
	memcpy(&n, kv->val, 8);
	*ptr = (const char *)kv->val + 8;
	*len = (size_t)n;
	return 0;
}

char *gguf_get_str_dup(const struct gguf_ctx *g, const char *key, struct errbuf *e)
{
	const char *p;
	size_t n;
	if (gguf_get_str(g, key, &p, &n, e))
		return NULL;
	char *s = malloc(n + 1);
	if (!s) {
		errbuf_set(e, -ENOMEM, "out of memory copying key '%s'", key);
		return NULL;
	}
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/* ---- arrays ------------------------------------------------------------------------------------ */

/* Fills an array view from the start of an array body (u32 type, u64 count, elements). */
static void arr_view(const struct gguf_ctx *g, const uint8_t *body, int64_t kv, int64_t index,
                     struct gguf_arr *a)
{
	uint32_t t;
	memcpy(&t, body, 4);
	memcpy(&a->count, body + 4, 8);
	a->g = g;
	a->type = (enum gguf_vtype)t;
	a->data = body + 12;
	a->kv = kv;
	a->path = index < 0 ? 0 : (uint64_t)index + 1;
}

int gguf_get_arr(const struct gguf_ctx *g, const char *key, struct gguf_arr *out, struct errbuf *e)
{
	int64_t k = gguf_kvset_find(&g->meta, key);
	if (k < 0)
		return errbuf_set(e, ERR_NOTFOUND, "key '%s' not found", key);
	const struct gguf_kv_rec *kv = &g->meta.kv[k];
	if (kv->type != GGUF_VT_ARRAY)
		return wrong_type(kv, "array", e);
	arr_view(g, kv->val, k, kv->index, out);
	return 0;
}

static const struct gguf_arr_index *arr_index(const struct gguf_arr *a)
{
	if (!a || !a->g || a->path == 0 || a->path > (uint64_t)a->g->meta.n_idx)
		return NULL;
	return &a->g->meta.idx[a->path - 1];
}

const char *gguf_arr_str(const struct gguf_arr *a, uint64_t i, size_t *len)
{
	const struct gguf_arr_index *ix = arr_index(a);
	if (!ix || a->type != GGUF_VT_STRING || i >= ix->count)
		return NULL;
	uint64_t n;
	memcpy(&n, ix->elem[i], 8);
	if (len)
		*len = (size_t)n;
	return (const char *)ix->elem[i] + 8;
}

int gguf_arr_sub(const struct gguf_arr *a, uint64_t i, struct gguf_arr *out)
{
	const struct gguf_arr_index *ix = arr_index(a);
	if (!ix || a->type != GGUF_VT_ARRAY || i >= ix->count)
		return -EINVAL;
	arr_view(a->g, ix->elem[i], a->kv, ix->child[i], out);
	return 0;
}

/* Float to int64 without undefined behaviour: NaN gives 0, out-of-range values saturate. */
static int64_t sat_i64(double d)
{
	if (d != d)
		return 0;
	if (d >= 9223372036854775807.0)
		return INT64_MAX;
	if (d <= -9223372036854775808.0)
		return INT64_MIN;
	return (int64_t)d;
}

int64_t gguf_arr_int(const struct gguf_arr *a, uint64_t i)
{
	size_t esz = gguf_vtype_size(a->type);
	if (!esz || i >= a->count)
		return 0;
	const uint8_t *p = (const uint8_t *)a->data + i * esz;
	if (a->type == GGUF_VT_F32) {
		float f;
		memcpy(&f, p, 4);
		return sat_i64(f);
	}
	if (a->type == GGUF_VT_F64) {
		double d;
		memcpy(&d, p, 8);
		return sat_i64(d);
	}
	if (a->type == GGUF_VT_BOOL)
		return p[0] != 0;
	uint64_t u;
	int64_t s;
	bool neg;
	if (!decode_int(a->type, p, &u, &s, &neg))
		return 0;
	return neg ? s : (int64_t)u;
}

double gguf_arr_float(const struct gguf_arr *a, uint64_t i)
{
	size_t esz = gguf_vtype_size(a->type);
	if (!esz || i >= a->count)
		return 0;
	const uint8_t *p = (const uint8_t *)a->data + i * esz;
	if (a->type == GGUF_VT_F32) {
		float f;
		memcpy(&f, p, 4);
		return f;
	}
	if (a->type == GGUF_VT_F64) {
		double d;
		memcpy(&d, p, 8);
		return d;
	}
	if (a->type == GGUF_VT_BOOL)
		return p[0] != 0;
	uint64_t u;
	int64_t s;
	bool neg;
	if (!decode_int(a->type, p, &u, &s, &neg))
		return 0;
	return neg ? (double)s : (double)u;
}

/* ---- tensors ----------------------------------------------------------------------------------- */

int64_t gguf_n_tensors(const struct gguf_ctx *g)
{
	return g->n_tensors;
}

const struct gguf_tensor *gguf_tensor(const struct gguf_ctx *g, int64_t i)
{
	if (i < 0 || i >= g->n_tensors)
		return NULL;
	return &g->tensors[i];
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_ctx *g, const char *name)
{
	if (!g->tslots || !name)
		return NULL;
	size_t mask = g->n_tslots - 1;
	for (size_t i = gguf_hash_str(name) & mask;; i = (i + 1) & mask) {
		int64_t k = g->tslots[i];
		if (k < 0)
			return NULL;
		if (strcmp(g->tensors[k].name, name) == 0)
			return &g->tensors[k];
	}
}
