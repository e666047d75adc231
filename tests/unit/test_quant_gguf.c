/* Dequantization against real files: the reference GGUFs in tests/data/models were quantized by
 * llama-quantize from the BF16 file (which holds the model exactly), so every quantized tensor,
 * dequantized by tandem, must be close to its BF16 original within that type's quantization
 * error. A wrong block layout (scale packing, nibble order, high-bit placement) gives errors of
 * the order of the values themselves, far above these bounds. For Q8_0 the bound is per
 * element: |y - x| <= 0.57 * d of its block (0.5 d rounding + 127 d 2^-11 from storing d as fp16).
 * Also checks kcpu_dot_row against kcpu_dot_row_ref on every real row.
 *
 * The tensor table is parsed here with a minimal bounds-checked reader (header, skipped
 * metadata, tensor infos, alignment) so this test depends only on the kernels. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int n_fail;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

struct tensor {
	char name[128];
	int type;
	int n_dims;
	int64_t ne[4];
	uint64_t offset;
	const uint8_t *data;
	size_t nbytes;
};

struct file {
	uint8_t *buf;
	size_t size;
	int n_tensors;
	struct tensor *t;
};

struct rd {
	const uint8_t *p;
	size_t size, pos;
	int bad;
};

static uint64_t rd_n(struct rd *r, size_t n)
{
	uint64_t v = 0;
	if (r->bad || n > r->size - r->pos) {
		r->bad = 1;
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		v |= (uint64_t)r->p[r->pos + i] << (8 * i);
	r->pos += n;
	return v;
}

static void rd_skip(struct rd *r, uint64_t n)
{
	if (r->bad || n > r->size - r->pos)
		r->bad = 1;
	else
		r->pos += n;
}

static const int scalar_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static void skip_value(struct rd *r, uint32_t vt, int depth)
{
	if (vt > 12 || depth > 4) {
		r->bad = 1;
		return;
	}
	if (vt == 8) {
		rd_skip(r, rd_n(r, 8));
	} else if (vt == 9) {
		uint32_t et = (uint32_t)rd_n(r, 4);
		uint64_t count = rd_n(r, 8);
		if (et <= 12 && et != 8 && et != 9) {
			if (count > r->size)
				r->bad = 1;
			else
				rd_skip(r, count * (uint64_t)scalar_size[et]);
		} else {
			for (uint64_t i = 0; i < count && !r->bad; i++)
				skip_value(r, et, depth + 1);
		}
	} else {
		rd_skip(r, (uint64_t)scalar_size[vt]);
	}
}

static int load(struct file *f, const char *path)
{
	FILE *fp = fopen(path, "rb");
	memset(f, 0, sizeof *f);
	if (!fp) {
		printf("cannot open %s\n", path);
		return -1;
	}
	fseek(fp, 0, SEEK_END);
	f->size = (size_t)ftell(fp);
	fseek(fp, 0, SEEK_SET);
	f->buf = malloc(f->size);
	if (!f->buf || fread(f->buf, 1, f->size, fp) != f->size) {
		fclose(fp);
		return -1;
	}
	fclose(fp);

	struct rd r = {.p = f->buf, .size = f->size};
	uint32_t magic = (uint32_t)rd_n(&r, 4), version = (uint32_t)rd_n(&r, 4);
	uint64_t n_t = rd_n(&r, 8), n_kv = rd_n(&r, 8);
	uint64_t alignment = 32;
	if (magic != 0x46554747u || version != 3 || n_t > 100000 || n_kv > 100000)
		return -1;
	for (uint64_t i = 0; i < n_kv && !r.bad; i++) {
		uint64_t klen = rd_n(&r, 8);
		size_t kpos = r.pos;
		rd_skip(&r, klen);
		uint32_t vt = (uint32_t)rd_n(&r, 4);
		if (!r.bad && klen == 17 && memcmp(f->buf + kpos, "general.alignment", 17) == 0 && vt == 4) {
			alignment = rd_n(&r, 4);
			continue;
		}
		skip_value(&r, vt, 0);
	}
	f->t = calloc(n_t, sizeof *f->t);
	f->n_tensors = (int)n_t;
	for (uint64_t i = 0; i < n_t && !r.bad; i++) {
		struct tensor *t = &f->t[i];
		uint64_t nlen = rd_n(&r, 8);
		if (nlen >= sizeof t->name) {
			r.bad = 1;
			break;
		}
		size_t npos = r.pos;
		rd_skip(&r, nlen);
		if (r.bad)
			break;
		memcpy(t->name, f->buf + npos, nlen);
		t->n_dims = (int)rd_n(&r, 4);
		if (t->n_dims < 1 || t->n_dims > 4) {
			r.bad = 1;
			break;
		}
		for (int d = 0; d < 4; d++)
			t->ne[d] = d < t->n_dims ? (int64_t)rd_n(&r, 8) : 1;
		t->type = (int)rd_n(&r, 4);
		t->offset = rd_n(&r, 8);
	}
	if (r.bad || alignment == 0)
		return -1;
	size_t data_start = (r.pos + alignment - 1) / alignment * alignment;
	for (int i = 0; i < f->n_tensors; i++) {
		struct tensor *t = &f->t[i];
		size_t row;
		if (!ktype_row_bytes(t->type, t->ne[0], &row))
			return -1;
		t->nbytes = row * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
		if (data_start > f->size || t->offset > f->size - data_start ||
		    t->nbytes > f->size - data_start - t->offset)
			return -1;
		t->data = f->buf + data_start + t->offset;
	}
	return 0;
}

static const struct tensor *find(const struct file *f, const char *name)
{
	for (int i = 0; i < f->n_tensors; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

static double rms_bound(int type)
{
	switch (type) {
	case KT_Q8_0: return 0.006;
	case KT_Q6_K: return 0.02;
	case KT_Q5_0:
	case KT_Q5_K: return 0.05;
	case KT_Q4_K:
	case KT_Q4_0: return 0.1;
	default: return 0.3;
	}
}

struct stats {
	int n_tensors;
	double worst_rel;
	double worst_by_type[KT_COUNT];
	int n_by_type[KT_COUNT];
};

static void check_file(const struct file *ref, const char *path, struct stats *st)
{
	struct file f;
	if (load(&f, path) != 0) {
		CHECK(0, "cannot parse %s", path);
		return;
	}
	int checked = 0;
	for (int i = 0; i < f.n_tensors; i++) {
		const struct tensor *t = &f.t[i];
		const struct tensor *o = find(ref, t->name);
		CHECK(o != NULL, "%s: %s not in the BF16 file", path, t->name);
		if (!o)
			continue;
		CHECK(memcmp(o->ne, t->ne, sizeof t->ne) == 0, "%s: shape differs", t->name);
		int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
		int64_t rows = n / t->ne[0];
		size_t rb_q, rb_o;
		ktype_row_bytes(t->type, t->ne[0], &rb_q);
		ktype_row_bytes(o->type, o->ne[0], &rb_o);
		float *y = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
		float *act = malloc(sizeof(float) * (size_t)t->ne[0]);
		for (int64_t r = 0; r < rows; r++) {
			kcpu_dequant_row(t->type, t->data + (size_t)r * rb_q, y + r * t->ne[0], t->ne[0]);
			kcpu_dequant_row(o->type, o->data + (size_t)r * rb_o, x + r * t->ne[0], t->ne[0]);
		}
		if (t->type == o->type) {
			CHECK(memcmp(x, y, sizeof(float) * (size_t)n) == 0, "%s: same type, different data",
			      t->name);
		} else {
			double se = 0, sx = 0;
			int64_t over = 0;
			for (int64_t k = 0; k < n; k++) {
				double e = (double)y[k] - x[k];
				se += e * e;
				sx += (double)x[k] * x[k];
				if (t->type == KT_Q8_0) {
					const uint8_t *blk = t->data + (size_t)(k / t->ne[0]) * rb_q +
					                     (size_t)((k % t->ne[0]) / 32) * 34;
					float d = kfp16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
					if (fabs(e) > 0.57 * d)
						over++;
				}
			}
			double rel = sqrt(se / sx);
			CHECK(rel <= rms_bound(t->type) && rel > 0.0,
			      "%s %s (%s): rms error %.5f of rms, bound %.5f", path, t->name,
			      ktype_name(t->type), rel, rms_bound(t->type));
			CHECK(over == 0, "%s %s: %" PRId64 " Q8_0 elements off by more than 0.57 d", path,
			      t->name, over);
			if (rel > st->worst_rel)
				st->worst_rel = rel;
			if (rel > st->worst_by_type[t->type])
				st->worst_by_type[t->type] = rel;
			st->n_by_type[t->type]++;
		}
		/* fast dot == reference dot on real rows */
		for (int64_t k = 0; k < t->ne[0]; k++)
			act[k] = (float)sin(0.37 * (double)k + (double)i);
		for (int64_t r = 0; r < rows; r += 7) {
			const uint8_t *row = t->data + (size_t)r * rb_q;
			double mag = 0;
			for (int64_t k = 0; k < t->ne[0]; k++)
				mag += fabs((double)y[r * t->ne[0] + k] * act[k]);
			float a = kcpu_dot_row(t->type, row, act, t->ne[0]);
			float b = kcpu_dot_row_ref(t->type, row, act, t->ne[0]);
			CHECK(fabs((double)a - b) <= 1e-5 * mag + 1e-30,
			      "%s row %" PRId64 ": dot %.9g ref %.9g", t->name, r, a, b);
		}
		free(y);
		free(x);
		free(act);
		checked++;
	}
	printf("%s: %d tensors checked\n", path, checked);
	st->n_tensors += checked;
	free(f.t);
	free(f.buf);
}

int main(void)
{
	const char *dir = getenv("TANDEM_TESTDATA");
	char path[512];
	static const char *const files[] = {"glm-dsa-tiny-Q8_0.gguf", "glm-dsa-tiny-Q6_K.gguf",
	                                    "glm-dsa-tiny-Q4_K_M.gguf"};
	struct file ref;
	struct stats st = {0};

	if (!dir)
		dir = "tests/data";
	snprintf(path, sizeof path, "%s/models/glm-dsa-tiny-BF16.gguf", dir);
	if (load(&ref, path) != 0) {
		printf("FAIL: cannot read %s (run from the repository root or set TANDEM_TESTDATA)\n", path);
		return 1;
	}
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		snprintf(path, sizeof path, "%s/models/%s", dir, files[i]);
		check_file(&ref, path, &st);
	}
	snprintf(path, sizeof path, "%s/models/deepseek2-tiny-BF16.gguf", dir);
	free(ref.t);
	free(ref.buf);
	if (load(&ref, path) == 0) {
		snprintf(path, sizeof path, "%s/models/deepseek2-tiny-Q8_0.gguf", dir);
		check_file(&ref, path, &st);
		free(ref.t);
		free(ref.buf);
	} else {
		CHECK(0, "cannot read %s", path);
	}
	for (int k = 0; k < KT_COUNT; k++)
		if (st.n_by_type[k])
			printf("  %-6s %3d tensors vs BF16: worst rms error %.5f of rms (bound %.3f)\n",
			       ktype_name(k), st.n_by_type[k], st.worst_by_type[k], rms_bound(k));
	printf("%d tensors, worst relative rms error %.5f; %s: %d failures\n", st.n_tensors, st.worst_rel,
	       n_fail ? "FAIL" : "OK", n_fail);
	return n_fail ? 1 : 0;
}
