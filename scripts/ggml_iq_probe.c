/* Reads ggml's codebooks for the IQ1 / IQ2 / IQ3 weight types out of a built libggml-base.so and writes
 * the reference data tandem's tests compare with. Not part of the build: it needs libggml-base.so, which
 * node-llama-cpp bundles (bench/llamacpp: `npm install` there puts it under
 * node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/).
 *
 *   cc -O2 -o /tmp/ggml_iq_probe scripts/ggml_iq_probe.c -ldl
 *   /tmp/ggml_iq_probe LIB/libggml-base.so grids > kernels/iq_grids.inc
 *   /tmp/ggml_iq_probe LIB/libggml-base.so ref tests/data/iq_ggml_ref.bin
 *
 * grids: every codebook entry is read back by dequantizing probe blocks with ggml's own
 * dequantize_row_* (scale fields set so that a value is its codebook magnitude times a power of two,
 * signs off), so the tables are exactly the ones ggml decodes with; MODEL-SPEC.md §5.3 names them.
 * ref: for each codebook type, rows of random blocks (every bit pattern is a valid block once the fp16
 * scales are finite) and rows quantized by ggml from random floats (ggml_quantize_chunk, importance
 * weights of 1), each stored with ggml's dequantized floats. Format (little-endian): "IQREF1\0\0", then
 * records {u32 type, u32 n_elements, u32 n_bytes, bytes, n_elements float32}, then u32 0. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*deq_fn)(const void *x, float *y, int64_t k);
typedef size_t (*qchunk_fn)(int type, const float *src, void *dst, int64_t start, int64_t nrows,
                            int64_t n_per_row, const float *imatrix);
typedef void (*qinit_fn)(int type);

static void *lib;

static void *sym(const char *name)
{
	void *p = dlsym(lib, name);
	if (!p) {
		fprintf(stderr, "ggml_iq_probe: %s not found: %s\n", name, dlerror());
		exit(2);
	}
	return p;
}

/* one 256-element block through ggml */
static void deq(const char *fn, const uint8_t *blk, float *y)
{
	((deq_fn)sym(fn))(blk, y, 256);
}

static uint8_t mag(float y, float unit)
{
	const float q = fabsf(y) / unit;
	const long r = lroundf(q);
	if (fabsf(q - (float)r) > 1e-6f || r > 255) {
		fprintf(stderr, "ggml_iq_probe: value %g is not a multiple of %g\n", y, unit);
		exit(2);
	}
	return (uint8_t)r;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

/* entry e of a codebook whose entries have `width` bytes, from 'width' decoded magnitudes */
static void emit(const char *name, const uint8_t *tab, int n, int width)
{
	printf("#define %s \\\n", name);
	for (int e = 0; e < n; e++) {
		uint64_t v = 0;
		for (int j = 0; j < width; j++)
			v |= (uint64_t)tab[e * width + j] << (8 * j);
		printf("%s0x%0*llx%s", e % 8 == 0 ? "\t" : "", 2 * width, (unsigned long long)v,
		       e + 1 == n   ? "\n"
		       : e % 8 == 7 ? ", \\\n"
		                    : ", ");
	}
	printf("\n");
}

static void grids(void)
{
	static uint8_t g2xxs[256 * 8], g2xs[512 * 8], g2s[1024 * 8], g3xxs[256 * 4], g3s[512 * 4];
	static uint8_t g1s[2048 * 8], ksigns[128];
	uint8_t b[128];
	float y[256];

	/* IQ2_XXS: d = 1, per 32: 4 index bytes, a u32 whose scale nibble and signs are 0: db = 1/8 */
	for (int e0 = 0; e0 < 256; e0 += 32) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 32; i++)
			b[2 + 8 * (i / 4) + i % 4] = (uint8_t)(e0 + i);
		deq("dequantize_row_iq2_xxs", b, y);
		for (int i = 0; i < 256; i++)
			g2xxs[e0 * 8 + i] = mag(y[i], 0.125f);
	}
	/* the sign table: entry 0 of the grid (all bytes > 0) under sign index s */
	for (int s = 0; s < 128; s++) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		b[2 + 4] = (uint8_t)s; /* a1 bits 0..6: signs of group l = 0 */
		deq("dequantize_row_iq2_xxs", b, y);
		uint8_t m = 0;
		for (int j = 0; j < 8; j++) {
			if (y[j] == 0.0f) {
				fprintf(stderr, "ggml_iq_probe: IQ2_XXS grid entry 0 has a zero\n");
				exit(2);
			}
			m |= (uint8_t)((y[j] < 0) << j);
		}
		ksigns[s] = m;
	}
	/* IQ2_XS: 16-bit words, index = q & 511, signs q >> 9 = 0; scales 0: db = 1/8 */
	for (int e0 = 0; e0 < 512; e0 += 32) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 32; i++)
			put16(b + 2 + 2 * i, (uint16_t)(e0 + i));
		deq("dequantize_row_iq2_xs", b, y);
		for (int i = 0; i < 256; i++)
			g2xs[e0 * 8 + i] = mag(y[i], 0.125f);
	}
	/* IQ2_S: qs[0..31] index low bytes, qs[32..63] signs, qh[8] (2 high bits per group), scales[8] */
	for (int e0 = 0; e0 < 1024; e0 += 32) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 32; i++) {
			const int e = e0 + i, ib = i / 4, l = i % 4;
			b[2 + i] = (uint8_t)(e & 255);
			b[66 + ib] |= (uint8_t)(((e >> 8) & 3) << (2 * l));
		}
		deq("dequantize_row_iq2_s", b, y);
		for (int i = 0; i < 256; i++)
			g2s[e0 * 8 + i] = mag(y[i], 0.125f);
	}
	/* IQ3_XXS: 64 index bytes (4-value entries), then 8 u32 of scale and signs = 0: db = 1/4 */
	for (int e0 = 0; e0 < 256; e0 += 64) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 64; i++)
			b[2 + i] = (uint8_t)(e0 + i);
		deq("dequantize_row_iq3_xxs", b, y);
		for (int i = 0; i < 256; i++)
			g3xxs[e0 * 4 + i] = mag(y[i], 0.25f);
	}
	/* IQ3_S: qs[64] index low bytes, qh[8] the 9th bits, signs 0, scales 0: db = 1 */
	for (int e0 = 0; e0 < 512; e0 += 64) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 64; i++) {
			const int e = e0 + i;
			b[2 + i] = (uint8_t)(e & 255);
			b[66 + i / 8] |= (uint8_t)(((e >> 8) & 1) << (i % 8));
		}
		deq("dequantize_row_iq3_s", b, y);
		for (int i = 0; i < 256; i++)
			g3s[e0 * 4 + i] = mag(y[i], 1.0f);
	}
	/* IQ1_S: qs[32] index low bytes, qh[8] u16 (3 high bits per group, scale 0, delta +1/8) */
	for (int e0 = 0; e0 < 2048; e0 += 32) {
		memset(b, 0, sizeof b), put16(b, 0x3c00);
		for (int i = 0; i < 32; i++) {
			const int e = e0 + i, ib = i / 4, l = i % 4;
			b[2 + i] = (uint8_t)(e & 255);
			const uint16_t h = (uint16_t)(b[34 + 2 * ib] | b[35 + 2 * ib] << 8);
			put16(b + 34 + 2 * ib, (uint16_t)(h | ((e >> 8) & 7) << (3 * l)));
		}
		deq("dequantize_row_iq1_s", b, y);
		for (int i = 0; i < 256; i++) {
			const float v = y[i] - 0.125f; /* -1, 0 or 1 */
			if (v != -1.0f && v != 0.0f && v != 1.0f) {
				fprintf(stderr, "ggml_iq_probe: IQ1_S value %g\n", y[i]);
				exit(2);
			}
			g1s[e0 * 8 + i] = (uint8_t)(int8_t)v;
		}
	}
	printf(
	    "/* ggml's codebooks of the IQ1 / IQ2 / IQ3 weight types (MODEL-SPEC.md §5.3), read back from\n"
	    " * libggml-base.so by scripts/ggml_iq_probe.c (generated: do not edit). ggml is MIT-licensed.\n"
	    " * Entry e is a little-endian word of bytes: unsigned magnitudes (IQ2 / IQ3) or int8 values in\n"
	    " * {-1, 0, 1} (IQ1). KSIGNS: the 8 sign bits (bit j: element j negative) of a 7-bit sign index\n"
	    " * (bit 7 makes the count of negatives even). */\n");
	emit("IQ_GRID_IQ2XXS", g2xxs, 256, 8);
	emit("IQ_GRID_IQ2XS", g2xs, 512, 8);
	emit("IQ_GRID_IQ2S", g2s, 1024, 8);
	emit("IQ_GRID_IQ3XXS", g3xxs, 256, 4);
	emit("IQ_GRID_IQ3S", g3s, 512, 4);
	emit("IQ_GRID_IQ1S", g1s, 2048, 8);
	emit("IQ_KSIGNS", ksigns, 128, 1);
}

/* ---- reference rows ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}
static float rndf(void) /* [-1, 1) */
{
	return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* an fp16 scale in [2^-9, 2^-5) with random mantissa */
static uint16_t rnd_scale(void)
{
	return (uint16_t)(((15 - 9 + (int)(rnd() % 4)) << 10) | (rnd() & 0x3ff));
}

struct tinfo {
	int type;
	const char *name, *deq;
	int bytes;
};
static const struct tinfo types[] = {
    {16, "IQ2_XXS", "dequantize_row_iq2_xxs", 66}, {17, "IQ2_XS", "dequantize_row_iq2_xs", 74},
    {18, "IQ3_XXS", "dequantize_row_iq3_xxs", 98}, {19, "IQ1_S", "dequantize_row_iq1_s", 50},
    {21, "IQ3_S", "dequantize_row_iq3_s", 110},    {22, "IQ2_S", "dequantize_row_iq2_s", 82},
    {29, "IQ1_M", "dequantize_row_iq1_m", 56},
};

/* random bytes, fp16 scale fields made finite and moderate */
static void rnd_block(const struct tinfo *t, uint8_t *b)
{
	for (int i = 0; i < t->bytes; i++)
		b[i] = (uint8_t)rnd();
	if (t->type == 29) { /* IQ1_M: the fp16 scale is the top nibbles of the 4 u16 scale words */
		const uint16_t s = rnd_scale();
		for (int k = 0; k < 4; k++) {
			uint8_t *w = b + 48 + 2 * k;
			w[1] = (uint8_t)((w[1] & 0x0f) | (((s >> (4 * k)) & 15) << 4));
		}
	} else {
		put16(b, rnd_scale());
	}
}

static void record(FILE *f, int type, int n, const uint8_t *q, size_t nb, const float *y)
{
	const uint32_t h[3] = {(uint32_t)type, (uint32_t)n, (uint32_t)nb};
	fwrite(h, 4, 3, f), fwrite(q, 1, nb, f), fwrite(y, 4, (size_t)n, f);
}

static void ref(const char *path)
{
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		exit(2);
	}
	fwrite("IQREF1\0\0", 1, 8, f);
	qchunk_fn qc = (qchunk_fn)sym("ggml_quantize_chunk");
	qinit_fn qi = (qinit_fn)sym("ggml_quantize_init");
	enum { N = 512, ROWS = 4 };
	static uint8_t q[ROWS * 2 * 128];
	static float x[ROWS * N], y[ROWS * N], im[N];
	for (int i = 0; i < N; i++)
		im[i] = 1.0f;
	for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
		const struct tinfo *t = &types[k];
		const size_t rb = (size_t)t->bytes * (N / 256);
		/* random blocks */
		for (int r = 0; r < ROWS; r++) {
			for (int b = 0; b < N / 256; b++)
				rnd_block(t, q + r * rb + (size_t)b * t->bytes);
			((deq_fn)sym(t->deq))(q + r * rb, y + r * N, N);
			record(f, t->type, N, q + r * rb, rb, y + r * N);
		}
		/* quantized by ggml from random floats (one row with a wide range) */
		for (int i = 0; i < ROWS * N; i++)
			x[i] = rndf() * (i / N == 1 ? 100.0f : 0.05f);
		qi(t->type);
		const size_t got = qc(t->type, x, q, 0, ROWS, N, im);
		if (got != ROWS * rb) {
			fprintf(stderr, "ggml_iq_probe: %s: quantize_chunk wrote %zu bytes, expected %zu\n",
			        t->name, got, ROWS * rb);
			exit(2);
		}
		for (int r = 0; r < ROWS; r++) {
			((deq_fn)sym(t->deq))(q + r * rb, y + r * N, N);
			record(f, t->type, N, q + r * rb, rb, y + r * N);
		}
		fprintf(stderr, "%s: %d random rows, %d quantized rows of %d\n", t->name, ROWS, ROWS, N);
	}
	const uint32_t end = 0;
	fwrite(&end, 4, 1, f);
	if (fclose(f)) {
		perror(path);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[2], "grids") && (strcmp(argv[2], "ref") || argc < 4))) {
		fprintf(stderr, "usage: ggml_iq_probe LIBGGML_BASE.so grids | ref OUT.bin\n");
		return 2;
	}
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "ggml_iq_probe: %s\n", dlerror());
		return 2;
	}
	if (!strcmp(argv[2], "grids"))
		grids();
	else
		ref(argv[3]);
	return 0;
}
