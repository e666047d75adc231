/* Human-readable dump of an open GGUF model for `tandem inspect`: header facts, every metadata key
 * (arrays abbreviated to their first elements, long strings cut), the tensor table, and byte totals
 * per tensor type. Strings from the file are printed escaped so control bytes cannot garble the
 * terminal. */
#include "common/gguf/gguf_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

#define SHOW_ELEMS 8
#define SHOW_STR 120

static void put_escaped(FILE *f, const char *s, size_t n, size_t max)
{
	fputc('"', f);
	for (size_t i = 0; i < n && i < max; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch == '\n')
			fputs("\\n", f);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\x%02x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
	if (n > max)
		fprintf(f, "...(%zu bytes)", n);
}

static void put_scalar(FILE *f, enum gguf_vtype t, const uint8_t *p)
{
	switch (t) {
	case GGUF_VT_U8: fprintf(f, "%u", p[0]); break;
	case GGUF_VT_I8: fprintf(f, "%d", (int8_t)p[0]); break;
	case GGUF_VT_BOOL: fputs(p[0] ? "true" : "false", f); break;
	case GGUF_VT_U16: {
		uint16_t v;
		memcpy(&v, p, 2);
		fprintf(f, "%u", v);
		break;
	}
	case GGUF_VT_I16: {
		int16_t v;
		memcpy(&v, p, 2);
		fprintf(f, "%d", v);
		break;
	}
	case GGUF_VT_U32: {
		uint32_t v;
		memcpy(&v, p, 4);
		fprintf(f, "%" PRIu32, v);
		break;
	}
	case GGUF_VT_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		fprintf(f, "%" PRId32, v);
		break;
	}
	case GGUF_VT_U64: {
		uint64_t v;
		memcpy(&v, p, 8);
		fprintf(f, "%" PRIu64, v);
		break;
	}
	case GGUF_VT_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		fprintf(f, "%" PRId64, v);
		break;
	}
	case GGUF_VT_F32: {
		float v;
		memcpy(&v, p, 4);
		fprintf(f, "%.9g", v);
		break;
	}
	case GGUF_VT_F64: {
		double v;
		memcpy(&v, p, 8);
		fprintf(f, "%.17g", v);
		break;
	}
	default: fputs("?", f); break;
	}
}

static void put_array(FILE *f, const struct gguf_arr *a, int depth)
{
	fprintf(f, "[%s x %" PRIu64 "] [", gguf_vtype_name(a->type), a->count);
	uint64_t n = a->count < SHOW_ELEMS ? a->count : SHOW_ELEMS;
	size_t esz = gguf_vtype_size(a->type);
	for (uint64_t i = 0; i < n; i++) {
		if (i)
			fputs(", ", f);
		if (esz) {
			put_scalar(f, a->type, (const uint8_t *)a->data + i * esz);
		} else if (a->type == GGUF_VT_STRING) {
			size_t len = 0;
			const char *s = gguf_arr_str(a, i, &len);
			put_escaped(f, s ? s : "", s ? len : 0, 40);
		} else if (a->type == GGUF_VT_ARRAY) {
			struct gguf_arr sub;
			if (depth < 3 && gguf_arr_sub(a, i, &sub) == 0)
				put_array(f, &sub, depth + 1);
			else
				fputs("[...]", f);
		}
	}
	if (a->count > n)
		fprintf(f, ", ... (%" PRIu64 " more)", a->count - n);
	fputc(']', f);
}

void gguf_print(const struct gguf_ctx *g, void *stdio_file)
{
	FILE *f = stdio_file;
	uint64_t fsize = 0;
	for (int i = 0; i < g->n_shards; i++)
		fsize += g->shards[i].size;
	fprintf(f, "file:       %s\n", g->shards[0].path);
	if (g->n_shards > 1)
		for (int i = 1; i < g->n_shards; i++)
			fprintf(f, "            %s\n", g->shards[i].path);
	fprintf(f, "format:     GGUF v%u, %d shard%s, %" PRIu64 " bytes, alignment %zu\n", g->version,
	        g->n_shards, g->n_shards == 1 ? "" : "s", fsize, g->alignment);

	fprintf(f, "\nmetadata (%" PRId64 " keys):\n", g->meta.n);
	for (int64_t i = 0; i < g->meta.n; i++) {
		const struct gguf_kv_rec *kv = &g->meta.kv[i];
		fprintf(f, "  %-48s %-5s ", kv->key, gguf_vtype_name(kv->type));
		if (kv->type == GGUF_VT_STRING) {
			uint64_t n;
			memcpy(&n, kv->val, 8);
			put_escaped(f, (const char *)kv->val + 8, (size_t)n, SHOW_STR);
		} else if (kv->type == GGUF_VT_ARRAY) {
			struct gguf_arr a;
			if (gguf_get_arr(g, kv->key, &a, NULL) == 0)
				put_array(f, &a, 0);
		} else {
			put_scalar(f, kv->type, kv->val);
		}
		fputc('\n', f);
	}

	fprintf(f, "\ntensors (%" PRId64 "):\n", g->n_tensors);
	fprintf(f, "  %-44s %-8s %-26s %14s %s\n", "name", "type", "ne", "bytes",
	        g->n_shards > 1 ? "shard" : "");
	uint64_t per_type_bytes[KT_COUNT] = {0}, per_type_n[KT_COUNT] = {0}, total = 0, elems = 0;
	for (int64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->tensors[i];
		char shape[96];
		int o = snprintf(shape, sizeof(shape), "[");
		for (int d = 0; d < t->n_dims && o < (int)sizeof(shape); d++)
			o += snprintf(shape + o, sizeof(shape) - (size_t)o, "%s%" PRId64, d ? ", " : "",
			              t->ne[d]);
		if (o < (int)sizeof(shape))
			snprintf(shape + o, sizeof(shape) - (size_t)o, "]");
		fprintf(f, "  %-44s %-8s %-26s %14zu", t->name, ktype_name(t->type), shape, t->nbytes);
		if (g->n_shards > 1)
			fprintf(f, " %d", t->shard + 1);
		fputc('\n', f);
		if (t->type >= 0 && t->type < KT_COUNT) {
			per_type_bytes[t->type] += t->nbytes;
			per_type_n[t->type]++;
		}
		total += t->nbytes;
		elems += (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
	}
	fprintf(f, "\ntotals per type:\n");
	for (int ty = 0; ty < KT_COUNT; ty++)
		if (per_type_n[ty])
			fprintf(f, "  %-8s %6" PRIu64 " tensors %16" PRIu64 " bytes (%.2f GiB)\n",
			        ktype_name(ty), per_type_n[ty], per_type_bytes[ty],
			        (double)per_type_bytes[ty] / (1u << 30));
	fprintf(f,
	        "  %-8s %6" PRId64 " tensors %16" PRIu64 " bytes (%.2f GiB), %" PRIu64
	        " parameters, %.2f bits/param\n",
	        "all", g->n_tensors, total, (double)total / (1u << 30), elems,
	        elems ? 8.0 * (double)total / (double)elems : 0.0);
}
