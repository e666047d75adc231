/* libFuzzer target for the OpenAI JSON request decoder (router/api.c): any bytes, as completions
 * and as chat. Invariants: decoding never crashes; a failure always carries status 400 (or 503 for
 * memory) and a message; a success satisfies every documented range (so later code may rely on
 * them); the error body renders as JSON.
 * Not part of `make all`. Build and run (clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_api.c router/api.c \
 *     common/base/err.c -ljansson -lm -o build/fuzz_api
 *   build/fuzz_api -max_total_time=60
 * Without clang: add -DFUZZ_MAIN and use gcc: it runs each file given on the command line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ok(const struct api_request *r)
{
	if (!r->model || (r->kind == API_KIND_COMPLETIONS && !r->prompt && !r->prompt_ids) ||
	    (r->kind == API_KIND_CHAT && r->n_messages == 0))
		abort();
	if (r->n < 1 || r->n > API_MAX_N || r->n_stop < 0 || r->n_stop > API_MAX_STOP)
		abort();
	if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1))
		abort();
	if (!(r->min_p >= 0 && r->min_p <= 1) || r->top_k < 0)
		abort();
	if (r->max_tokens == 0 || r->max_tokens < -1 || r->top_logprobs < 0 || r->top_logprobs > 20)
		abort();
	for (int i = 0; i < r->n_stop; i++)
		if (!r->stop[i] || !r->stop[i][0])
			abort();
	for (size_t i = 0; i < r->n_prompt_ids; i++)
		if (r->prompt_ids[i] < 0)
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (int k = 0; k < 2; k++) {
		struct api_request r;
		struct api_error e;
		enum api_kind kind = k ? API_KIND_CHAT : API_KIND_COMPLETIONS;
		if (api_request_decode(kind, (const char *)data, size, &r, &e) == 0) {
			check_ok(&r);
			api_request_fini(&r);
		} else {
			if ((e.status != 400 && e.status != 503) || !e.message[0])
				abort();
			char *j = api_error_json(&e, NULL);
			if (!j)
				abort();
			free(j);
		}
	}
	return 0;
}

#ifdef FUZZ_MAIN
int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f)
			continue;
		static uint8_t buf[1 << 20];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
	}
	return 0;
}
#endif
