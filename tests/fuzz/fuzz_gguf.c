/* libFuzzer target for the GGUF reader. Build and run (from the repo root):
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o build/fuzz_gguf
 * tests/fuzz/fuzz_gguf.c $(find common/gguf -name '*.c') common/base/err.c $(ls kernels/cpu/ktype.c
 * 2>/dev/null) && build/fuzz_gguf -max_len=65536 -max_total_time=300 build/fuzz-corpus tests/fuzz/corpus_gguf
 * Each input is opened as an in-memory GGUF image; when it opens, every accessor is exercised on
 * every key and tensor (arrays element by element, nested arrays recursively, the printer), so a
 * file that passes validation but breaks a reader shows up here too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf/gguf.h"

static volatile uint64_t sink;

static void walk_arr(const struct gguf_arr *a, int depth)
{
	uint64_t n = a->count < 4096 ? a->count : 4096;
	for (uint64_t i = 0; i < n; i++) {
		size_t len = 0;
		const char *s;
		struct gguf_arr sub;
		switch (a->type) {
		case GGUF_VT_STRING:
			s = gguf_arr_str(a, i, &len);
			if (s && len)
				sink += (uint8_t)s[len - 1];
			break;
		case GGUF_VT_ARRAY:
			if (depth < 16 && gguf_arr_sub(a, i, &sub) == 0)
				walk_arr(&sub, depth + 1);
			break;
		default: sink += (uint64_t)gguf_arr_int(a, i) + (gguf_arr_float(a, i) > 0); break;
		}
	}
	/* out-of-range requests must be refused, not read */
	sink += (uint64_t)gguf_arr_int(a, a->count) + (gguf_arr_str(a, a->count, NULL) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* exact-size heap copy so the sanitizer sees any read past the end */
	uint8_t *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	if (gguf_open_mem(&g, copy, size, "fuzz", &e) == 0) {
		for (int64_t i = 0; i < gguf_n_kv(g); i++) {
			const char *key = gguf_kv_key(g, i);
			uint32_t u;
			int64_t v;
			float f;
			bool b;
			const char *s;
			size_t len;
			struct gguf_arr a;
			sink += (uint64_t)gguf_get_u32(g, key, &u, NULL) +
			        (uint64_t)gguf_get_i64(g, key, &v, NULL);
			sink += (uint64_t)gguf_get_f32(g, key, &f, NULL) +
			        (uint64_t)gguf_get_bool(g, key, &b, NULL);
			if (gguf_get_str(g, key, &s, &len, NULL) == 0 && len)
				sink += (uint8_t)s[len - 1];
			free(gguf_get_str_dup(g, key, NULL));
			if (gguf_get_arr(g, key, &a, NULL) == 0)
				walk_arr(&a, 0);
			if (gguf_find_key(g, key) != i)
				__builtin_trap();
		}
		for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
			const struct gguf_tensor *t = gguf_tensor(g, i);
			sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
			if (gguf_find_tensor(g, t->name) != t)
				__builtin_trap();
		}
		FILE *f = fopen("/dev/null", "w");
		if (f) {
			gguf_print(g, f);
			fclose(f);
		}
		gguf_close(g);
	} else if (e.msg[0] == '\0') {
		__builtin_trap(); /* every failure must say why */
	}
	free(copy);
	return 0;
}
