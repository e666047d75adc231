/* GGUF v3 reader: maps each file read-only and validates all of it at open, so the rest of tandem
 * can trust every length, offset and tensor size it gets from here. Parsing never reads a byte
 * before checking it lies inside the file; every count is checked against the bytes left before
 * anything is allocated for it (a count of 2^60 fails without allocating). Split models are found
 * from any shard's name (-NNNNN-of-NNNNN.gguf) and merged into one tensor table.
 *
 * Every error names the file, the offset and the key or tensor concerned. */
#include "common/gguf/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAGIC 0x46554747u
#define MAX_NESTING 8 /* arrays of arrays deeper than this are rejected (bounds the recursion) */
/* Smallest encodings, used to bound counts by the bytes left before allocating. */
#define MIN_KV_BYTES 13u /* key len (8) + 1 byte key + type (4) */
#define MIN_TINFO_BYTES 33u /* name len (8) + 1 byte + n_dims (4) + ne0 (8) + type (4) + offset (8) */
#define MIN_ARR_BYTES 12u /* element type (4) + count (8) */
#define MIN_STR_BYTES 8u

/* ---- parse cursor ------------------------------------------------------------------------------ */

struct cur {
	const uint8_t *base;
	size_t size;
	size_t pos;
	const char *file;
	struct errbuf *e;
};

static int fail_at(struct cur *c, int code, uint64_t off, const char *fmt, ...) TD_PRINTF(4, 5);

static int fail_at(struct cur *c, int code, uint64_t off, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return errbuf_set(c->e, code, "%s: offset %llu: %s", c->file, (unsigned long long)off, msg);
}

static size_t left(const struct cur *c)
{
	return c->size - c->pos;
}

static int need(struct cur *c, size_t n, const char *what)
{
	if (n > left(c))
		return fail_at(c, ERR_FORMAT, c->pos,
		               "%s: need %zu bytes, only %zu left in the file (truncated?)", what, n,
		               left(c));
	return 0;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
	int rc = need(c, 4, what);
	if (rc)
		return rc;
	memcpy(v, c->base + c->pos, 4);
	c->pos += 4;
	return 0;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
	int rc = need(c, 8, what);
	if (rc)
		return rc;
	memcpy(v, c->base + c->pos, 8);
	c->pos += 8;
	return 0;
}

/* A GGUF string: u64 length + bytes. Returns the bytes in place. */
static int rd_str(struct cur *c, const uint8_t **p, uint64_t *len, const char *what)
{
	uint64_t at = c->pos;
	int rc = rd_u64(c, len, what);
	if (rc)
		return rc;
	if (*len > left(c))
		return fail_at(c, ERR_FORMAT, at,
		               "%s: string length %llu exceeds the %zu bytes left in the file", what,
		               (unsigned long long)*len, left(c));
	*p = c->base + c->pos;
	c->pos += (size_t)*len;
	return 0;
}

/* A key or tensor name: 1..GGUF_MAX_NAME bytes, no NUL. Returns a NUL-terminated copy. */
static int rd_name(struct cur *c, char **out, const char *what)
{
	uint64_t at = c->pos, len;
	const uint8_t *p;
	int rc = rd_str(c, &p, &len, what);
	if (rc)
		return rc;
	if (len == 0 || len > GGUF_MAX_NAME)
		return fail_at(c, ERR_FORMAT, at, "%s: name length %llu (must be 1..%d)", what,
		               (unsigned long long)len, GGUF_MAX_NAME);
	/* names are printed and used as C strings: no NUL, no control bytes */
	for (uint64_t i = 0; i < len; i++)
		if (p[i] < 0x20 || p[i] == 0x7f)
			return fail_at(c, ERR_FORMAT, at, "%s: name contains the control byte 0x%02x at %llu",
			               what, p[i], (unsigned long long)i);
	char *s = malloc((size_t)len + 1);
	if (!s)
		return errbuf_set(c->e, -ENOMEM, "%s: out of memory", c->file);
	memcpy(s, p, (size_t)len);
	s[len] = '\0';
	*out = s;
	return 0;
}

/* ---- value types ------------------------------------------------------------------------------- */

size_t gguf_vtype_size(enum gguf_vtype t)
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

const char *gguf_vtype_name(enum gguf_vtype t)
{
	static const char *const names[GGUF_VT_COUNT] = {"u8",   "i8",  "u16",   "i16", "u32", "i32", "f32",
	                                                 "bool", "str", "array", "u64", "i64", "f64"};
	if ((unsigned)t < GGUF_VT_COUNT)
		return names[t];
	return "invalid";
}

/* ---- kv sets and hashing ----------------------------------------------------------------------- */

uint64_t gguf_hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++) {
		h ^= (uint8_t)*s;
		h *= 1099511628211ull;
	}
	return h;
}

int64_t gguf_kvset_find(const struct gguf_kvset *set, const char *key)
{
	if (!set->slots || !key)
		return -1;
	size_t mask = set->n_slots - 1;
	for (size_t i = gguf_hash_str(key) & mask;; i = (i + 1) & mask) {
		int64_t k = set->slots[i];
		if (k < 0)
			return -1;
		if (strcmp(set->kv[k].key, key) == 0)
			return k;
	}
}

static void kvset_free(struct gguf_kvset *set)
{
	for (int64_t i = 0; i < set->n; i++)
		free(set->kv[i].key);
	for (int64_t i = 0; i < set->n_idx; i++) {
		free(set->idx[i].elem);
		free(set->idx[i].child);
	}
	free(set->kv);
	free(set->idx);
	free(set->slots);
	memset(set, 0, sizeof(*set));
}

static size_t table_size(uint64_t n)
{
	size_t s = 16;
	while (s < 2 * n)
		s *= 2;
	return s;
}

static int64_t new_index(struct cur *c, struct gguf_kvset *set, uint64_t count, bool with_child)
{
	if (set->n_idx == set->cap_idx) {
		int64_t cap = set->cap_idx ? 2 * set->cap_idx : 8;
		void *p = realloc(set->idx, (size_t)cap * sizeof(*set->idx));
		if (!p)
			return errbuf_set(c->e, -ENOMEM, "%s: out of memory", c->file);
		set->idx = p;
		set->cap_idx = cap;
	}
	struct gguf_arr_index *ix = &set->idx[set->n_idx];
	memset(ix, 0, sizeof(*ix));
	ix->count = count;
	/* count (> 0) was bounded by the bytes left (8 per string, 12 per array), so the tables are at
	 * most about 1.4x the bytes they index */
	ix->elem = malloc((size_t)count * sizeof(*ix->elem));
	if (with_child)
		ix->child = malloc((size_t)count * sizeof(*ix->child));
	if (!ix->elem || (with_child && !ix->child)) {
		free(ix->elem);
		free(ix->child);
		return errbuf_set(c->e, -ENOMEM, "%s: out of memory for an array of %llu elements", c->file,
		                  (unsigned long long)count);
	}
	return set->n_idx++;
}

/* Parses one array body (element type, count, elements) at the cursor. For arrays with
 * variable-size elements, *index gets the id of the element table built for it (else -1). */
static int parse_array(struct cur *c, struct gguf_kvset *set, const char *key, int depth, int64_t *index)
{
	uint64_t at = c->pos, count;
	uint32_t et;
	int rc;
	*index = -1;
	if (depth > MAX_NESTING)
		return fail_at(c, ERR_FORMAT, at, "key '%s': arrays nested deeper than %d levels", key,
		               MAX_NESTING);
	if ((rc = rd_u32(c, &et, "array element type")) || (rc = rd_u64(c, &count, "array element count")))
		return errbuf_prefix(c->e, "key '%s'", key), rc;
	if (et >= GGUF_VT_COUNT)
		return fail_at(c, ERR_FORMAT, at, "key '%s': invalid array element type %u", key, et);
	size_t esz = gguf_vtype_size((enum gguf_vtype)et);
	if (esz) {
		if (count > left(c) / esz)
			return fail_at(
			    c, ERR_FORMAT, at,
			    "key '%s': array of %llu %s elements needs more than the %zu bytes left", key,
			    (unsigned long long)count, gguf_vtype_name((enum gguf_vtype)et), left(c));
		if (et == GGUF_VT_BOOL)
			for (uint64_t i = 0; i < count; i++)
				if (c->base[c->pos + i] > 1)
					return fail_at(
					    c, ERR_FORMAT, c->pos + i,
					    "key '%s': bool array element %llu has value %u (must be 0 or 1)",
					    key, (unsigned long long)i, c->base[c->pos + i]);
		c->pos += (size_t)(count * esz);
		return 0;
	}
	size_t min = et == GGUF_VT_STRING ? MIN_STR_BYTES : MIN_ARR_BYTES;
	if (count > left(c) / min)
		return fail_at(c, ERR_FORMAT, at,
		               "key '%s': array of %llu %s elements needs more than the %zu bytes left", key,
		               (unsigned long long)count, gguf_vtype_name((enum gguf_vtype)et), left(c));
	if (count == 0)
		return 0; /* nothing to index (keeps empty nested arrays from costing memory) */
	int64_t id = new_index(c, set, count, et == GGUF_VT_ARRAY);
	if (id < 0)
		return (int)id;
	for (uint64_t i = 0; i < count; i++) {
		/* re-read the table each time: the recursion below may grow set->idx */
		set->idx[id].elem[i] = c->base + c->pos;
		if (et == GGUF_VT_STRING) {
			const uint8_t *p;
			uint64_t len;
			if ((rc = rd_str(c, &p, &len, "string array element")))
				return errbuf_prefix(c->e, "key '%s' element %llu", key,
				                     (unsigned long long)i),
				       rc;
		} else {
			int64_t child;
			if ((rc = parse_array(c, set, key, depth + 1, &child)))
				return rc;
			set->idx[id].child[i] = child;
		}
	}
	*index = id;
	return 0;
}

/* Parses all kvs of one shard into `set`. */
static int parse_kvs(struct cur *c, uint64_t n_kv, struct gguf_kvset *set)
{
	int rc;
	if (n_kv > left(c) / MIN_KV_BYTES)
		return fail_at(c, ERR_FORMAT, 16, "metadata count %llu is impossible for a file of %zu bytes",
		               (unsigned long long)n_kv, c->size);
	set->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof(*set->kv));
	set->n_slots = table_size(n_kv);
	set->slots = malloc(set->n_slots * sizeof(*set->slots));
	if (!set->kv || !set->slots)
		return errbuf_set(c->e, -ENOMEM, "%s: out of memory", c->file);
	memset(set->slots, 0xff, set->n_slots * sizeof(*set->slots));

	for (uint64_t i = 0; i < n_kv; i++) {
		struct gguf_kv_rec *kv = &set->kv[i];
		uint64_t at = c->pos;
		uint32_t t;
		kv->file_offset = at;
		kv->index = -1;
		if ((rc = rd_name(c, &kv->key, "metadata key"))) {
			errbuf_prefix(c->e, "metadata entry %llu", (unsigned long long)i);
			return rc;
		}
		set->n = (int64_t)i + 1; /* the key is owned by the set from here on */
		if ((rc = rd_u32(c, &t, "value type")))
			return errbuf_prefix(c->e, "key '%s'", kv->key), rc;
		if (t >= GGUF_VT_COUNT)
			return fail_at(c, ERR_FORMAT, at, "key '%s': invalid value type %u", kv->key, t);
		kv->type = (enum gguf_vtype)t;
		kv->val = c->base + c->pos;
		size_t v0 = c->pos, esz = gguf_vtype_size(kv->type);
		if (esz) {
			if ((rc = need(c, esz, "value")))
				return errbuf_prefix(c->e, "key '%s'", kv->key), rc;
			if (kv->type == GGUF_VT_BOOL && c->base[c->pos] > 1)
				return fail_at(c, ERR_FORMAT, c->pos,
				               "key '%s': bool value %u (must be 0 or 1)", kv->key,
				               c->base[c->pos]);
			c->pos += esz;
		} else if (kv->type == GGUF_VT_STRING) {
			const uint8_t *p;
			uint64_t len;
			if ((rc = rd_str(c, &p, &len, "string value")))
				return errbuf_prefix(c->e, "key '%s'", kv->key), rc;
		} else {
			if ((rc = parse_array(c, set, kv->key, 1, &kv->index)))
				return rc;
		}
		kv->val_len = c->pos - v0;

		size_t mask = set->n_slots - 1, s = gguf_hash_str(kv->key) & mask;
		for (; set->slots[s] >= 0; s = (s + 1) & mask)
			if (strcmp(set->kv[set->slots[s]].key, kv->key) == 0)
				return fail_at(c, ERR_FORMAT, at, "duplicate key '%s' (first at offset %llu)",
				               kv->key,
				               (unsigned long long)set->kv[set->slots[s]].file_offset);
		set->slots[s] = (int64_t)i;
	}
	return 0;
}

int gguf_value_validate(enum gguf_vtype type, const void *val, size_t len, struct errbuf *e)
{
	struct cur c = {.base = val, .size = len, .pos = 0, .file = "value", .e = e};
	struct gguf_kvset set = {0};
	int rc = 0;
	size_t esz = gguf_vtype_size(type);
	if (esz) {
		rc = len == esz ? 0
		                : errbuf_set(e, ERR_FORMAT, "value of type %s must be %zu bytes",
		                             gguf_vtype_name(type), esz);
		if (!rc && type == GGUF_VT_BOOL && ((const uint8_t *)val)[0] > 1)
			rc = errbuf_set(e, ERR_FORMAT, "bool value must be 0 or 1");
	} else if (type == GGUF_VT_STRING) {
		const uint8_t *p;
		uint64_t n;
		rc = rd_str(&c, &p, &n, "string");
	} else if (type == GGUF_VT_ARRAY) {
		int64_t ix;
		rc = parse_array(&c, &set, "value", 1, &ix);
	} else {
		rc = errbuf_set(e, ERR_FORMAT, "invalid value type %d", (int)type);
	}
	if (!rc && !esz && c.pos != len)
		rc = errbuf_set(e, ERR_FORMAT, "value has %zu trailing bytes", len - c.pos);
	kvset_free(&set);
	return rc;
}

/* Reads an integer-typed kv of `set` (any integer type) into *v; 1 if absent, <0 on error. */
static int kv_uint(struct cur *c, const struct gguf_kvset *set, const char *key, uint64_t *v)
{
	int64_t k = gguf_kvset_find(set, key);
	if (k < 0)
		return 1;
	const struct gguf_kv_rec *kv = &set->kv[k];
	const uint8_t *p = kv->val;
	int64_t s;
	switch (kv->type) {
	case GGUF_VT_U8: *v = p[0]; return 0;
	case GGUF_VT_U16: {
		uint16_t x;
		memcpy(&x, p, 2);
		*v = x;
		return 0;
	}
	case GGUF_VT_U32: {
		uint32_t x;
		memcpy(&x, p, 4);
		*v = x;
		return 0;
	}
	case GGUF_VT_U64: memcpy(v, p, 8); return 0;
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
	default:
		return fail_at(c, ERR_FORMAT, kv->file_offset, "key '%s' has type %s, expected an integer",
		               key, gguf_vtype_name(kv->type));
	}
	if (s < 0)
		return fail_at(c, ERR_FORMAT, kv->file_offset, "key '%s' is negative (%lld)", key,
		               (long long)s);
	*v = (uint64_t)s;
	return 0;
}

/* ---- tensor infos ------------------------------------------------------------------------------ */

struct tinfo_pos {
	uint64_t info_off; /* where the tensor info starts (for messages) */
	int64_t t; /* index in ctx->tensors */
};

static int cmp_by_offset(const void *a, const void *b, void *arg)
{
	const struct gguf_tensor *ts = arg;
	const struct tinfo_pos *x = a, *y = b;
	uint64_t ox = ts[x->t].file_offset, oy = ts[y->t].file_offset;
	return ox < oy ? -1 : ox > oy;
}

static int add_tensor_slot(struct gguf_ctx *g)
{
	if (g->n_tensors < g->cap_tensors)
		return 0;
	int64_t cap = g->cap_tensors ? 2 * g->cap_tensors : 64;
	void *p = realloc(g->tensors, (size_t)cap * sizeof(*g->tensors));
	if (!p)
		return -ENOMEM;
	g->tensors = p;
	g->cap_tensors = cap;
	return 0;
}

static int parse_tensors(struct cur *c, struct gguf_ctx *g, int shard_no, uint64_t n_tensors,
                         size_t alignment)
{
	struct gguf_shard *sh = &g->shards[shard_no];
	int rc = 0;
	if (n_tensors > left(c) / MIN_TINFO_BYTES)
		return fail_at(c, ERR_FORMAT, 8, "tensor count %llu is impossible for a file of %zu bytes",
		               (unsigned long long)n_tensors, c->size);
	struct tinfo_pos *pos = malloc((size_t)(n_tensors ? n_tensors : 1) * sizeof(*pos));
	if (!pos)
		return errbuf_set(c->e, -ENOMEM, "%s: out of memory", c->file);

	for (uint64_t i = 0; i < n_tensors; i++) {
		uint64_t at = c->pos, rel_off;
		uint32_t nd, type;
		char *name = NULL;
		if ((rc = rd_name(c, &name, "tensor name"))) {
			errbuf_prefix(c->e, "tensor info %llu", (unsigned long long)i);
			goto out;
		}
		if ((rc = add_tensor_slot(g))) {
			free(name);
			rc = errbuf_set(c->e, rc, "%s: out of memory", c->file);
			goto out;
		}
		struct gguf_tensor *t = &g->tensors[g->n_tensors++];
		memset(t, 0, sizeof(*t));
		t->name = name;
		t->shard = shard_no;
		pos[i].info_off = at;
		pos[i].t = g->n_tensors - 1;
		if ((rc = rd_u32(c, &nd, "n_dims"))) {
			errbuf_prefix(c->e, "tensor '%s'", name);
			goto out;
		}
		if (nd < 1 || nd > GGUF_MAX_DIMS) {
			rc = fail_at(c, ERR_FORMAT, at, "tensor '%s': n_dims %u (must be 1..%d)", name, nd,
			             GGUF_MAX_DIMS);
			goto out;
		}
		t->n_dims = (int)nd;
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			t->ne[d] = 1;
		uint64_t n_rows = 1;
		for (uint32_t d = 0; d < nd; d++) {
			uint64_t ne;
			if ((rc = rd_u64(c, &ne, "dimension"))) {
				errbuf_prefix(c->e, "tensor '%s'", name);
				goto out;
			}
			if (ne == 0 || ne > (uint64_t)INT64_MAX) {
				rc = fail_at(c, ERR_FORMAT, at,
				             "tensor '%s': ne[%u] = %llu (must be 1..2^63-1)", name, d,
				             (unsigned long long)ne);
				goto out;
			}
			t->ne[d] = (int64_t)ne;
			if (d > 0) {
				if (n_rows > (uint64_t)INT64_MAX / ne) {
					rc = fail_at(c, ERR_FORMAT, at,
					             "tensor '%s': element count overflows", name);
					goto out;
				}
				n_rows *= ne;
			}
		}
		if ((rc = rd_u32(c, &type, "type")) || (rc = rd_u64(c, &rel_off, "data offset"))) {
			errbuf_prefix(c->e, "tensor '%s'", name);
			goto out;
		}
		t->type = (int)type;
		const struct ktype_info *ki = type < 1u << 30 ? ktype_get((int)type) : NULL;
		if (!ki || !ki->name) {
			rc = fail_at(c, ERR_UNSUPPORTED, at, "tensor '%s': unknown ggml type id %u", name,
			             type);
			goto out;
		}
		size_t row;
		if (!ktype_row_bytes((int)type, t->ne[0], &row)) {
			rc = fail_at(c, ERR_FORMAT, at,
			             "tensor '%s': ne0 = %lld is not a multiple of the %s block size %d (or "
			             "is too large)",
			             name, (long long)t->ne[0], ki->name, ki->blck);
			goto out;
		}
		if (row && n_rows > SIZE_MAX / row) {
			rc = fail_at(c, ERR_FORMAT, at, "tensor '%s': byte size overflows", name);
			goto out;
		}
		t->nbytes = row * (size_t)n_rows;
		if (rel_off % alignment) {
			rc = fail_at(c, ERR_FORMAT, at,
			             "tensor '%s': data offset %llu is not a multiple of the alignment %zu",
			             name, (unsigned long long)rel_off, alignment);
			goto out;
		}
		t->file_offset = rel_off; /* relative for now; made absolute below */
	}

	/* the data section starts at the next alignment boundary after the tensor infos */
	uint64_t ds = c->pos;
	if (ds % alignment)
		ds += alignment - ds % alignment;
	sh->data_start = ds;
	if (n_tensors > 0 && ds > c->size) {
		rc = fail_at(c, ERR_FORMAT, c->pos,
		             "data section would start at %llu, past the end of the file (%zu bytes)",
		             (unsigned long long)ds, c->size);
		goto out;
	}
	uint64_t avail = n_tensors > 0 ? c->size - ds : 0;
	for (uint64_t i = 0; i < n_tensors; i++) {
		struct gguf_tensor *t = &g->tensors[pos[i].t];
		uint64_t rel = t->file_offset;
		if (rel > avail || t->nbytes > avail - rel) {
			rc = fail_at(c, ERR_FORMAT, pos[i].info_off,
			             "tensor '%s': data [%llu, +%zu) runs past the end of the file (data "
			             "section has %llu bytes)",
			             t->name, (unsigned long long)(ds + rel), t->nbytes,
			             (unsigned long long)avail);
			goto out;
		}
		t->file_offset = ds + rel;
		t->data = c->base + t->file_offset;
	}
	qsort_r(pos, (size_t)n_tensors, sizeof(*pos), cmp_by_offset, g->tensors);
	for (uint64_t i = 1; i < n_tensors; i++) {
		const struct gguf_tensor *a = &g->tensors[pos[i - 1].t], *b = &g->tensors[pos[i].t];
		if (a->file_offset + a->nbytes > b->file_offset) {
			rc = fail_at(
			    c, ERR_FORMAT, pos[i].info_off,
			    "tensor '%s' (data at %llu) overlaps tensor '%s' (data at %llu, %zu bytes)",
			    b->name, (unsigned long long)b->file_offset, a->name,
			    (unsigned long long)a->file_offset, a->nbytes);
			goto out;
		}
	}
out:
	free(pos);
	return rc;
}

/* ---- one shard --------------------------------------------------------------------------------- */

static int map_file(struct gguf_shard *sh, const char *path, struct errbuf *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errbuf_set(e, -errno, "%s: cannot open: %s", path, strerror(errno));
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) < 0) {
		rc = errbuf_set(e, -errno, "%s: cannot stat: %s", path, strerror(errno));
		goto close_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = errbuf_set(e, ERR_FORMAT, "%s: not a regular file", path);
		goto close_fd;
	}
	if (st.st_size < 24) {
		rc = errbuf_set(e, ERR_FORMAT, "%s: %lld bytes is too small for a GGUF header (24 bytes)",
		                path, (long long)st.st_size);
		goto close_fd;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		rc = errbuf_set(e, ERR_LIMIT, "%s: file too large to map", path);
		goto close_fd;
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED) {
		rc = errbuf_set(e, -errno, "%s: mmap failed: %s", path, strerror(errno));
		goto close_fd;
	}
	sh->map = m;
	sh->size = (size_t)st.st_size;
	sh->mapped = true;
close_fd:
	close(fd);
	return rc;
}

/* Parses shard `no` of g (already mapped). Shard 0's keys become g->meta; other shards' keys go
 * to *keys (caller frees) so their split.* values can be checked. */
static int parse_shard(struct gguf_ctx *g, int no, struct gguf_kvset *keys, struct errbuf *e)
{
	struct gguf_shard *sh = &g->shards[no];
	struct cur c = {.base = sh->map, .size = sh->size, .pos = 0, .file = sh->path, .e = e};
	uint32_t magic, version;
	uint64_t n_tensors, n_kv;
	int rc;
	if ((rc = rd_u32(&c, &magic, "magic")))
		return rc;
	if (magic != GGUF_MAGIC)
		return fail_at(&c, ERR_FORMAT, 0, "not a GGUF file (magic %02x %02x %02x %02x)", sh->map[0],
		               sh->map[1], sh->map[2], sh->map[3]);
	if ((rc = rd_u32(&c, &version, "version")))
		return rc;
	if (version == 0x03000000u)
		return fail_at(&c, ERR_UNSUPPORTED, 4, "big-endian GGUF files are not supported");
	if (version != 3)
		return fail_at(&c, ERR_UNSUPPORTED, 4, "GGUF version %u is not supported (only version 3)",
		               version);
	if ((rc = rd_u64(&c, &n_tensors, "tensor count")) || (rc = rd_u64(&c, &n_kv, "metadata count")))
		return rc;
	g->version = version;
	if ((rc = parse_kvs(&c, n_kv, keys)))
		return rc;

	uint64_t align = GGUF_DEFAULT_ALIGNMENT;
	int64_t ak = gguf_kvset_find(keys, "general.alignment");
	if (ak >= 0) {
		const struct gguf_kv_rec *kv = &keys->kv[ak];
		if (kv->type != GGUF_VT_U32)
			return fail_at(&c, ERR_FORMAT, kv->file_offset,
			               "key 'general.alignment' has type %s, expected u32",
			               gguf_vtype_name(kv->type));
		uint32_t a;
		memcpy(&a, kv->val, 4);
		if (a == 0 || (a & (a - 1)))
			return fail_at(&c, ERR_FORMAT, kv->file_offset,
			               "key 'general.alignment' = %u is not a power of two > 0", a);
		align = a;
	}
	if (no == 0)
		g->alignment = (size_t)align;
	else if (align != g->alignment)
		return fail_at(&c, ERR_MISMATCH, 0,
		               "general.alignment %llu differs from the first shard's %zu",
		               (unsigned long long)align, g->alignment);
	return parse_tensors(&c, g, no, n_tensors, (size_t)align);
}

/* ---- split sets -------------------------------------------------------------------------------- */

/* Recognizes "<prefix>-NNNNN-of-MMMMM.gguf"; fills the prefix length, the numbers and the digit
 * widths. Returns false if the name does not follow the pattern. */
struct split_name {
	size_t prefix_len;
	unsigned long no, count;
	int w_no, w_count;
};

static bool parse_split_name(const char *path, struct split_name *sn)
{
	size_t n = strlen(path);
	if (n < 5 || strcmp(path + n - 5, ".gguf") != 0)
		return false;
	size_t end = n - 5, i = end;
	while (i > 0 && path[i - 1] >= '0' && path[i - 1] <= '9')
		i--;
	size_t w_count = end - i;
	if (w_count == 0 || w_count > 9 || i < 4 || memcmp(path + i - 4, "-of-", 4) != 0)
		return false;
	size_t j = i - 4, k = j;
	while (k > 0 && path[k - 1] >= '0' && path[k - 1] <= '9')
		k--;
	size_t w_no = j - k;
	if (w_no == 0 || w_no > 9 || k < 1 || path[k - 1] != '-')
		return false;
	sn->prefix_len = k - 1;
	sn->no = strtoul(path + k, NULL, 10);
	sn->count = strtoul(path + i, NULL, 10);
	sn->w_no = (int)w_no;
	sn->w_count = (int)w_count;
	return true;
}

static int check_split_keys(struct gguf_ctx *g, int no, const struct gguf_kvset *keys, uint64_t count,
                            struct errbuf *e)
{
	struct gguf_shard *sh = &g->shards[no];
	struct cur c = {.base = sh->map, .size = sh->size, .file = sh->path, .e = e};
	uint64_t v;
	int rc = kv_uint(&c, keys, "split.count", &v);
	if (rc < 0)
		return rc;
	if (rc > 0)
		return errbuf_set(e, ERR_MISMATCH, "%s: shard %d of %llu has no split.count key", sh->path,
		                  no + 1, (unsigned long long)count);
	if (v != count)
		return errbuf_set(e, ERR_MISMATCH, "%s: split.count = %llu, but the first shard says %llu",
		                  sh->path, (unsigned long long)v, (unsigned long long)count);
	rc = kv_uint(&c, keys, "split.no", &v);
	if (rc < 0)
		return rc;
	if (rc > 0 || v != (uint64_t)no)
		return errbuf_set(
		    e, ERR_MISMATCH, "%s: split.no is %s%llu, expected %d (from its position in the set)",
		    sh->path, rc > 0 ? "missing " : "", rc > 0 ? 0ull : (unsigned long long)v, no);
	return 0;
}

static int add_shard(struct gguf_ctx *g, const char *path)
{
	void *p = realloc(g->shards, (size_t)(g->n_shards + 1) * sizeof(*g->shards));
	if (!p)
		return -ENOMEM;
	g->shards = p;
	struct gguf_shard *sh = &g->shards[g->n_shards];
	memset(sh, 0, sizeof(*sh));
	sh->path = strdup(path);
	if (!sh->path)
		return -ENOMEM;
	g->n_shards++;
	return 0;
}

static int build_tensor_table(struct gguf_ctx *g, struct errbuf *e)
{
	g->n_tslots = table_size((uint64_t)g->n_tensors);
	g->tslots = malloc(g->n_tslots * sizeof(*g->tslots));
	if (!g->tslots)
		return errbuf_set(e, -ENOMEM, "out of memory");
	memset(g->tslots, 0xff, g->n_tslots * sizeof(*g->tslots));
	size_t mask = g->n_tslots - 1;
	for (int64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		size_t s = gguf_hash_str(t->name) & mask;
		for (; g->tslots[s] >= 0; s = (s + 1) & mask) {
			const struct gguf_tensor *o = &g->tensors[g->tslots[s]];
			if (strcmp(o->name, t->name) == 0) {
				const char *where = g->shards[t->shard].path;
				return errbuf_set(e, ERR_FORMAT,
				                  "%s: duplicate tensor name '%s' (data at offset %llu; "
				                  "first in %s at %llu)",
				                  where, t->name, (unsigned long long)t->file_offset,
				                  g->shards[o->shard].path,
				                  (unsigned long long)o->file_offset);
			}
		}
		g->tslots[s] = i;
	}
	return 0;
}

static int open_split_rest(struct gguf_ctx *g, const char *given, uint64_t count, struct errbuf *e)
{
	struct split_name sn;
	if (!parse_split_name(given, &sn))
		return errbuf_set(
		    e, ERR_FORMAT,
		    "%s: split.count = %llu but the file name does not follow <name>-NNNNN-of-NNNNN.gguf",
		    given, (unsigned long long)count);
	if (sn.count != count)
		return errbuf_set(e, ERR_MISMATCH, "%s: file name says %lu shards, split.count says %llu",
		                  given, sn.count, (unsigned long long)count);
	if (count > 9999)
		return errbuf_set(e, ERR_LIMIT, "%s: split.count %llu is too large", given,
		                  (unsigned long long)count);
	size_t plen = sn.prefix_len + 32;
	char *p = malloc(plen);
	if (!p)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int rc = 0;
	/* shard 0 is already open (the caller opened the first shard's path); open 1..count-1 */
	for (uint64_t i = 1; i < count; i++) {
		snprintf(p, plen, "%.*s-%0*llu-of-%0*llu.gguf", (int)sn.prefix_len, given, sn.w_no,
		         (unsigned long long)(i + 1), sn.w_count, (unsigned long long)count);
		struct stat st;
		if (stat(p, &st) < 0) {
			rc = errbuf_set(e, -ENOENT, "split model: shard %llu of %llu is missing: %s",
			                (unsigned long long)(i + 1), (unsigned long long)count, p);
			goto out;
		}
		if ((rc = add_shard(g, p))) {
			rc = errbuf_set(e, rc, "out of memory");
			goto out;
		}
		int no = g->n_shards - 1;
		if ((rc = map_file(&g->shards[no], p, e)))
			goto out;
		struct gguf_kvset keys = {0};
		rc = parse_shard(g, no, &keys, e);
		if (!rc)
			rc = check_split_keys(g, no, &keys, count, e);
		kvset_free(&keys);
		if (rc)
			goto out;
	}
out:
	free(p);
	return rc;
}

/* Opens `path` (or, for a split set, the first shard named like it) as g's shard 0. */
static int open_impl(struct gguf_ctx *g, const char *path, struct errbuf *e)
{
	int rc;
	struct split_name sn;
	char *first = NULL;
	/* metadata lives in the first shard: if given another one, start from the first */
	if (parse_split_name(path, &sn) && sn.no != 1 && sn.count > 1) {
		size_t plen = sn.prefix_len + 32;
		first = malloc(plen);
		if (!first)
			return errbuf_set(e, -ENOMEM, "out of memory");
		snprintf(first, plen, "%.*s-%0*d-of-%0*lu.gguf", (int)sn.prefix_len, path, sn.w_no, 1,
		         sn.w_count, sn.count);
		struct stat st;
		if (stat(first, &st) < 0) {
			rc = errbuf_set(e, -ENOENT, "split model: shard 1 of %lu is missing: %s", sn.count,
			                first);
			goto out;
		}
	}
	const char *p0 = first ? first : path;
	if ((rc = add_shard(g, p0))) {
		rc = errbuf_set(e, rc, "out of memory");
		goto out;
	}
	if ((rc = map_file(&g->shards[0], p0, e)) || (rc = parse_shard(g, 0, &g->meta, e)))
		goto out;

	struct cur c = {.base = g->shards[0].map, .size = g->shards[0].size, .file = p0, .e = e};
	uint64_t count = 1, no = 0;
	int r1 = kv_uint(&c, &g->meta, "split.count", &count);
	if (r1 < 0) {
		rc = r1;
		goto out;
	}
	int r2 = kv_uint(&c, &g->meta, "split.no", &no);
	if (r2 < 0) {
		rc = r2;
		goto out;
	}
	if (r1 > 0)
		count = 1;
	if (count == 0) {
		rc = errbuf_set(e, ERR_FORMAT, "%s: split.count is 0", p0);
		goto out;
	}
	struct split_name sn0;
	if (count == 1 && parse_split_name(p0, &sn0) && sn0.count > 1) {
		rc = errbuf_set(e, ERR_MISMATCH, "%s: the file name says %lu shards but the file has %s", p0,
		                sn0.count, r1 > 0 ? "no split.count key" : "split.count = 1");
		goto out;
	}
	if (count > 1) {
		if (r2 > 0 || no != 0) {
			rc =
			    errbuf_set(e, ERR_MISMATCH,
			               "%s: first shard of a %llu-shard set has split.no %s%llu (expected 0)",
			               p0, (unsigned long long)count, r2 > 0 ? "missing " : "",
			               (unsigned long long)(r2 > 0 ? 0 : no));
			goto out;
		}
		if ((rc = open_split_rest(g, p0, count, e)))
			goto out;
		int64_t k = gguf_kvset_find(&g->meta, "split.tensors.count");
		uint64_t total;
		if (k >= 0) {
			if ((rc = kv_uint(&c, &g->meta, "split.tensors.count", &total)) < 0)
				goto out;
			if (total != (uint64_t)g->n_tensors) {
				rc = errbuf_set(
				    e, ERR_MISMATCH,
				    "%s: split.tensors.count = %llu but the %llu shards hold %lld tensors",
				    p0, (unsigned long long)total, (unsigned long long)count,
				    (long long)g->n_tensors);
				goto out;
			}
		}
	}
	rc = build_tensor_table(g, e);
out:
	free(first);
	return rc;
}

int gguf_open(struct gguf_ctx **out, const char *path, struct errbuf *e)
{
	*out = NULL;
	if (!path || !*path)
		return errbuf_set(e, -EINVAL, "gguf_open: empty path");
	struct gguf_ctx *g = calloc(1, sizeof(*g));
	if (!g)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int rc = open_impl(g, path, e);
	if (rc) {
		gguf_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

int gguf_open_mem(struct gguf_ctx **out, const void *data, size_t size, const char *label, struct errbuf *e)
{
	*out = NULL;
	struct gguf_ctx *g = calloc(1, sizeof(*g));
	if (!g)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int rc = add_shard(g, label ? label : "<memory>");
	if (rc) {
		rc = errbuf_set(e, rc, "out of memory");
		goto fail;
	}
	g->shards[0].map = data;
	g->shards[0].size = size;
	if (size < 24) {
		rc = errbuf_set(e, ERR_FORMAT, "%s: %zu bytes is too small for a GGUF header (24 bytes)",
		                g->shards[0].path, size);
		goto fail;
	}
	if ((rc = parse_shard(g, 0, &g->meta, e)))
		goto fail;
	struct cur c = {.base = data, .size = size, .file = g->shards[0].path, .e = e};
	uint64_t count;
	rc = kv_uint(&c, &g->meta, "split.count", &count);
	if (rc < 0)
		goto fail;
	if (rc == 0 && count != 1) {
		rc = errbuf_set(e, ERR_UNSUPPORTED,
		                "%s: split.count = %llu: split sets must be opened from files",
		                g->shards[0].path, (unsigned long long)count);
		goto fail;
	}
	if ((rc = build_tensor_table(g, e)))
		goto fail;
	*out = g;
	return 0;
fail:
	gguf_close(g);
	return rc;
}

void gguf_close(struct gguf_ctx *g)
{
	if (!g)
		return;
	for (int64_t i = 0; i < g->n_tensors; i++)
		free((char *)g->tensors[i].name);
	free(g->tensors);
	free(g->tslots);
	kvset_free(&g->meta);
	for (int i = 0; i < g->n_shards; i++) {
		if (g->shards[i].mapped)
			munmap((void *)g->shards[i].map, g->shards[i].size);
		free(g->shards[i].path);
	}
	free(g->shards);
	free(g);
}
