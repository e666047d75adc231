/* `tandem logits -m MODEL --tokens 1,2,3 [--all] [--tp N] [--threads T] -o OUT`: runs the prompt
 * through the model (one prefill over the paged KV cache) and writes little-endian float32 logits,
 * one row of vocab values per position: only the last position unless --all. Other tools (tests,
 * the CUDA comparison) script this interface. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/model_args.h"
#include "common/model/model.h"

#define LOGITS_CHUNK 512 /* tokens per forward */

static void logits_usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: tandem logits -m MODEL.gguf --tokens 1,2,3 [--all] [--tp N] [--threads T] -o OUT.f32\n"
	    "  writes float32 little-endian logits, one row of vocab values per position\n"
	    "  --all          every position (default: only the last)\n"
	    "  --tp N         tensor-parallel degree, ranks run as threads (default 1)\n"
	    "  --threads T    CPU threads in total (default 1)\n"
	    "  --kv-bf16      store the KV cache in bf16 (default fp32)\n"
	    "  --fast         CPU: approximate matmuls with int8-quantized activations (not the reference)\n"
	    "  --backend B    cpu (default) or cuda;  --device N  CUDA device (default 0)\n"
	    "  --latent-eps X RMSNorm eps of q_a_norm / kv_a_norm (default 1e-6, as the references;\n"
	    "                 llama.cpp uses the model's rms_norm_eps)\n");
}

int cmd_logits(int argc, char **argv)
{
	const char *model = NULL, *outp = NULL, *toks = NULL;
	bool all = false;
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has = i + 1 < argc;
		int64_t v;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			logits_usage(stdout);
			return 0;
		} else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
			if (!has)
				return cli_usage_error("logits", "%s needs a GGUF path", a);
			model = argv[++i];
		} else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
			if (!has)
				return cli_usage_error("logits", "%s needs an output path", a);
			outp = argv[++i];
		} else if (!strcmp(a, "--tokens")) {
			if (!has)
				return cli_usage_error("logits", "--tokens needs a list like 1,2,3");
			toks = argv[++i];
		} else if (!strcmp(a, "--all")) {
			all = true;
		} else if (!strcmp(a, "--latent-eps")) {
			if (!has || !cli_parse_f32(argv[++i], 1e-12f, 1.0f, &o.latent_eps))
				return cli_usage_error("logits", "--latent-eps needs a number in [1e-12, 1]");
		} else if (!strcmp(a, "--kv-bf16")) {
			o.kv_dtype = MODEL_KV_BF16;
		} else if (!strcmp(a, "--fast")) {
			o.fast_matmul = true;
		} else if (!strcmp(a, "--tp")) {
			if (!has || !cli_parse_i64(argv[++i], 1, 256, &v))
				return cli_usage_error("logits", "--tp needs an integer 1..256");
			o.tp = (int)v;
		} else if (!strcmp(a, "--threads")) {
			if (!has || !cli_parse_i64(argv[++i], 1, 4096, &v))
				return cli_usage_error("logits", "--threads needs an integer 1..4096");
			o.n_threads = (int)v;
		} else if (!strcmp(a, "--backend")) {
			int bk;
			if (!has || !cli_parse_backend(argv[++i], &bk))
				return cli_usage_error("logits", "--backend needs cpu or cuda");
			o.backend = (enum model_backend_kind)bk;
		} else if (!strcmp(a, "--device")) {
			if (!has || !cli_parse_i64(argv[++i], 0, 1023, &v))
				return cli_usage_error("logits", "--device needs an integer 0..1023");
			o.device = (int)v;
		} else {
			return cli_usage_error("logits", "unknown option '%s' (see tandem logits --help)", a);
		}
	}
	if (!model)
		return cli_usage_error("logits", "missing -m MODEL.gguf");
	if (!toks)
		return cli_usage_error("logits", "missing --tokens 1,2,3");
	if (!outp)
		return cli_usage_error("logits", "missing -o OUT");
	int32_t *ids;
	size_t n;
	if (!cli_parse_ids(toks, &ids, &n))
		return cli_usage_error("logits", "--tokens: '%s' is not a comma-separated list of token ids",
		                       toks);
	if (n > (size_t)1 << 20) {
		free(ids);
		return cli_usage_error("logits",
		                       "--tokens: %zu tokens is more than the 1048576 this command runs", n);
	}
	if (o.n_threads < o.tp)
		o.n_threads = o.tp;
	struct errbuf e = {0};
	struct model *m = NULL;
	struct model_kv kv = {0};
	float *lg = NULL;
	int32_t *seq = NULL, *pos = NULL, *blocks = NULL;
	uint8_t *want = NULL;
	FILE *f = NULL;
	int ret = 2;
	if (model_load(&m, model, &o, &e)) {
		fprintf(stderr, "tandem logits: %s\n", e.msg);
		goto out;
	}
	int64_t V = model_hparams(m)->vocab;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= V) {
			fprintf(stderr,
			        "tandem logits: token id %d at index %zu is outside the vocabulary (%lld)\n",
			        ids[i], i, (long long)V);
			goto out;
		}
	int n_blocks = (int)((n + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS);
	size_t rows = all ? n : 1;
	lg = malloc(sizeof(float) * rows * (size_t)V);
	seq = calloc(n, sizeof(int32_t));
	pos = malloc(sizeof(int32_t) * n);
	want = calloc(n, 1);
	blocks = malloc(sizeof(int32_t) * (size_t)n_blocks);
	ret = 1;
	if (!lg || !seq || !pos || !want || !blocks) {
		fprintf(stderr, "tandem logits: out of memory\n");
		goto out;
	}
	if (model_kv_init(&kv, m, n_blocks, NULL, 0, &e)) {
		fprintf(stderr, "tandem logits: %s\n", e.msg);
		goto out;
	}
	for (int b = 0; b < n_blocks; b++)
		blocks[b] = b;
	for (size_t i = 0; i < n; i++) {
		pos[i] = (int32_t)i;
		want[i] = all || i == n - 1;
	}
	struct model_seq s = {.blocks = blocks, .n_blocks = n_blocks};
	/* prefill in chunks (bounded scratch for long inputs); rows land in order */
	float *dst = lg;
	for (size_t c0 = 0; c0 < n; c0 += LOGITS_CHUNK) {
		size_t cn = n - c0 < LOGITS_CHUNK ? n - c0 : LOGITS_CHUNK, rows_here = 0;
		for (size_t i = 0; i < cn; i++)
			rows_here += want[c0 + i];
		struct model_batch b = {.n_tokens = (int)cn,
		                        .tokens = ids + c0,
		                        .seq = seq,
		                        .pos = pos + c0,
		                        .logits = want + c0,
		                        .n_seqs = 1,
		                        .seqs = &s};
		if (model_forward(m, &kv, &b, rows_here ? dst : NULL, NULL, &e)) {
			fprintf(stderr, "tandem logits: %s\n", e.msg);
			goto out;
		}
		dst += rows_here * (size_t)V;
	}
	f = fopen(outp, "wb");
	if (!f) {
		fprintf(stderr, "tandem logits: cannot create %s\n", outp);
		ret = 2;
		goto out;
	}
	/* host is little-endian (x86-64 / aarch64), the format is little-endian float32 */
	if (fwrite(lg, sizeof(float) * (size_t)V, rows, f) != rows || fclose(f) != 0) {
		f = NULL;
		fprintf(stderr, "tandem logits: writing %s failed\n", outp);
		goto out;
	}
	f = NULL;
	ret = 0;
out:
	if (f)
		fclose(f);
	model_kv_fini(&kv);
	model_destroy(m);
	free(lg);
	free(seq);
	free(pos);
	free(want);
	free(blocks);
	free(ids);
	return ret;
}
