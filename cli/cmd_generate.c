/* `tandem generate`: prompt (token ids, text, or a chat JSON) -> prefill over the paged KV cache
 * -> token-by-token decode with the sampler; prints the text as it is produced (streaming decode
 * that never splits a UTF-8 character) or, with --ids, the new token ids. Stops at the tokenizer's
 * end-of-generation ids (eos/eot/eom) unless --ignore-eos; the stop token itself is not printed.
 * With no sampling option the decode is greedy. --chat takes a JSON file holding an OpenAI-style
 * `messages` array (or an object with "messages"), rendered with the model's chat template
 * (common/tok/chat.h) with the generation prompt; the format's stop tokens also end generation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/model_args.h"
#include "common/gguf/gguf.h"
#include "common/model/model.h"
#include "common/tok/chat.h"
#include "common/tok/tok.h"

#include <jansson.h>

#define GEN_MAX_TOKENS (1 << 20)

static void generate_usage(FILE *f)
{
	fprintf(f,
	        "usage: tandem generate -m MODEL.gguf (--tokens 1,2,3 | -p TEXT | --chat FILE.json) -n N "
	        "[options]\n"
	        "  --chat-format NAME      glm5, glm5.2, glm4, deepseek-v3, deepseek-v3.1 (default: from the "
	        "GGUF)\n"
	        "  --greedy                argmax decoding (the default when no sampling option is given)\n"
	        "  --temperature X         sample with temperature X (0 = greedy)\n"
	        "  --top-k K  --top-p P  --min-p M\n"
	        "  --repetition-penalty R  --frequency-penalty F  --presence-penalty P\n"
	        "  --seed S                RNG seed (default 0)\n"
	        "  --ids                   print the new token ids separated by spaces instead of text\n"
	        "  --ignore-eos            do not stop at end-of-generation tokens\n"
	        "  --tp N --threads T      tensor-parallel degree (ranks as threads), CPU threads in total\n"
	        "  --backend cpu|cuda --device N   forward backend (default cpu), CUDA device (default 0)\n"
	        "  --fast                  CPU: approximate matmuls with int8-quantized activations\n");
}

struct gen_args {
	const char *model, *toks, *text, *chat, *chat_format;
	int64_t n;
	bool ids_only, ignore_eos, sampling;
	uint64_t seed;
	struct sample_params sp;
	struct model_opts mo;
};

static int parse(int argc, char **argv, struct gen_args *a)
{
	memset(a, 0, sizeof(*a));
	a->n = -1;
	sample_params_default(&a->sp);
	a->sp.no_logprob = true; /* the CLI prints no logprobs */
	model_opts_default(&a->mo);
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int64_t x;
		if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
			generate_usage(stdout);
			return 1;
		}
#define NEEDV(what)                                                                                          \
	if (!v)                                                                                              \
		return cli_usage_error("generate", "%s needs %s", o, what);                                  \
	i++;
		if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
			NEEDV("a GGUF path");
			a->model = v;
		} else if (!strcmp(o, "--tokens")) {
			NEEDV("a list like 1,2,3");
			a->toks = v;
		} else if (!strcmp(o, "-p") || !strcmp(o, "--prompt")) {
			NEEDV("a text");
			a->text = v;
		} else if (!strcmp(o, "--chat")) {
			NEEDV("a JSON file");
			a->chat = v;
		} else if (!strcmp(o, "--chat-format")) {
			NEEDV("a format name");
			a->chat_format = v;
		} else if (!strcmp(o, "-n")) {
			NEEDV("a token count");
			if (!cli_parse_i64(v, 0, GEN_MAX_TOKENS, &a->n))
				return cli_usage_error("generate", "-n needs an integer 0..%d",
				                       GEN_MAX_TOKENS);
		} else if (!strcmp(o, "--greedy")) {
			a->sp.greedy = true;
		} else if (!strcmp(o, "--temperature")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, 0, 100, &a->sp.temperature))
				return cli_usage_error("generate",
				                       "--temperature needs a number in [0, 100]");
			a->sampling = true;
		} else if (!strcmp(o, "--top-k")) {
			NEEDV("an integer");
			if (!cli_parse_i64(v, 0, INT32_MAX, &x))
				return cli_usage_error("generate", "--top-k needs an integer >= 0");
			a->sp.top_k = (int)x;
			a->sampling = true;
		} else if (!strcmp(o, "--top-p")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, 1e-6f, 1, &a->sp.top_p))
				return cli_usage_error("generate", "--top-p needs a number in (0, 1]");
			a->sampling = true;
		} else if (!strcmp(o, "--min-p")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, 0, 1, &a->sp.min_p))
				return cli_usage_error("generate", "--min-p needs a number in [0, 1]");
			a->sampling = true;
		} else if (!strcmp(o, "--repetition-penalty")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, 1e-3f, 100, &a->sp.repetition_penalty))
				return cli_usage_error("generate",
				                       "--repetition-penalty needs a number in [0.001, 100]");
		} else if (!strcmp(o, "--frequency-penalty")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, -100, 100, &a->sp.frequency_penalty))
				return cli_usage_error("generate",
				                       "--frequency-penalty needs a number in [-100, 100]");
		} else if (!strcmp(o, "--presence-penalty")) {
			NEEDV("a number");
			if (!cli_parse_f32(v, -100, 100, &a->sp.presence_penalty))
				return cli_usage_error("generate",
				                       "--presence-penalty needs a number in [-100, 100]");
		} else if (!strcmp(o, "--seed")) {
			NEEDV("an integer");
			if (!cli_parse_i64(v, 0, INT64_MAX, &x))
				return cli_usage_error("generate", "--seed needs an integer >= 0");
			a->seed = (uint64_t)x;
		} else if (!strcmp(o, "--ids")) {
			a->ids_only = true;
		} else if (!strcmp(o, "--ignore-eos")) {
			a->ignore_eos = true;
		} else if (!strcmp(o, "--tp")) {
			NEEDV("an integer");
			if (!cli_parse_i64(v, 1, 256, &x))
				return cli_usage_error("generate", "--tp needs an integer 1..256");
			a->mo.tp = (int)x;
		} else if (!strcmp(o, "--threads")) {
			NEEDV("an integer");
			if (!cli_parse_i64(v, 1, 4096, &x))
				return cli_usage_error("generate", "--threads needs an integer 1..4096");
			a->mo.n_threads = (int)x;
		} else if (!strcmp(o, "--backend")) {
			NEEDV("cpu or cuda");
			int bk;
			if (!cli_parse_backend(v, &bk))
				return cli_usage_error("generate", "--backend needs cpu or cuda");
			a->mo.backend = (enum model_backend_kind)bk;
		} else if (!strcmp(o, "--fast")) {
			a->mo.fast_matmul = true;
		} else if (!strcmp(o, "--device")) {
			NEEDV("an integer");
			if (!cli_parse_i64(v, 0, 1023, &x))
				return cli_usage_error("generate", "--device needs an integer 0..1023");
			a->mo.device = (int)x;
		} else {
			return cli_usage_error("generate", "unknown option '%s' (see tandem generate --help)",
			                       o);
		}
#undef NEEDV
	}
	if (!a->model)
		return cli_usage_error("generate", "missing -m MODEL.gguf");
	if (!!a->toks + !!a->text + !!a->chat != 1)
		return cli_usage_error("generate", "give exactly one of --tokens, -p, --chat");
	if (a->n < 0)
		return cli_usage_error("generate", "missing -n N (tokens to generate)");
	if (a->sp.greedy && a->sampling)
		return cli_usage_error("generate", "--greedy cannot be combined with sampling options");
	if (!a->sampling)
		a->sp.greedy = true;
	if (a->mo.n_threads < a->mo.tp)
		a->mo.n_threads = a->mo.tp;
	a->mo.quiet = true;
	return 0;
}

/* renders --chat into ids; sets up *c (its stop tokens end generation) */
static int chat_ids(const struct gen_args *a, const struct tok *t, const struct gguf_ctx *g, struct chat *c,
                    int32_t **ids, size_t *n, struct errbuf *e)
{
	json_error_t je;
	json_t *root = json_load_file(a->chat, 0, &je);
	if (!root) {
		if (je.line > 0)
			return errbuf_set(e, -EINVAL, "--chat %s: line %d: %s", a->chat, je.line, je.text);
		return errbuf_set(e, -EINVAL, "--chat %s: %s", a->chat, je.text);
	}
	json_t *msgs = json_is_object(root) ? json_object_get(root, "messages") : root;
	struct chat_prompt cp = {0};
	struct chat_opts co = {.enable_thinking = -1, .add_generation_prompt = true};
	int rc;
	if (!json_is_array(msgs)) {
		rc = errbuf_set(e, -EINVAL, "expected a messages array or an object with \"messages\"");
		goto out;
	}
	if ((rc = chat_init_gguf(c, t, g, a->chat_format, e)))
		goto out;
	if ((rc = chat_render(c, msgs, &co, &cp, e)))
		goto out;
	size_t cap = tok_encode_max(cp.len);
	*ids = malloc(sizeof(int32_t) * cap);
	if (!*ids) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = chat_encode(c, &cp, *ids, cap, n, e))) {
		free(*ids);
		*ids = NULL;
	}
out:
	if (rc)
		errbuf_prefix(e, "--chat %s", a->chat);
	chat_prompt_fini(&cp);
	json_decref(root);
	return rc;
}

/* prompt ids from --tokens, -p or --chat (malloc'd) */
static int prompt_ids(const struct gen_args *a, const struct tok *t, const struct gguf_ctx *g, struct chat *c,
                      int32_t **ids, size_t *n, struct errbuf *e)
{
	if (a->toks) {
		if (!cli_parse_ids(a->toks, ids, n))
			return errbuf_set(
			    e, -EINVAL, "--tokens: '%s' is not a comma-separated list of token ids", a->toks);
		return 0;
	}
	if (a->chat)
		return chat_ids(a, t, g, c, ids, n, e);
	size_t len = strlen(a->text), cap = tok_encode_max(len);
	*ids = malloc(sizeof(int32_t) * (cap ? cap : 1));
	if (!*ids)
		return errbuf_set(e, -ENOMEM, "out of memory");
	int rc = tok_encode(t, a->text, len, TOK_ENCODE_ADD_BOS, *ids, cap, n, NULL, e);
	if (rc) {
		free(*ids);
		*ids = NULL;
	}
	return rc;
}

int cmd_generate(int argc, char **argv)
{
	struct gen_args a;
	int rc = parse(argc, argv, &a);
	if (rc)
		return rc == 1 ? 0 : rc;
	struct errbuf e = {0};
	struct model *m = NULL;
	struct tok *t = NULL;
	struct model_kv kv = {0};
	struct sample_work sw = {0};
	int32_t *hist = NULL, *blocks = NULL;
	float *lg = NULL;
	char *obuf = NULL;
	int ret = 2;
	if (model_load(&m, a.model, &a.mo, &e)) {
		fprintf(stderr, "tandem generate: %s\n", e.msg);
		goto out;
	}
	if ((a.text || a.chat || !a.ids_only) && tok_load(&t, model_gguf(m), &e)) {
		fprintf(stderr, "tandem generate: %s: tokenizer: %s\n", a.model, e.msg);
		goto out;
	}
	int32_t *pids;
	size_t np;
	struct chat chat;
	bool have_chat = a.chat != NULL;
	if (prompt_ids(&a, t, model_gguf(m), &chat, &pids, &np, &e)) {
		fprintf(stderr, "tandem generate: %s\n", e.msg);
		goto out;
	}
	int64_t V = model_hparams(m)->vocab;
	size_t total = np + (size_t)a.n;
	if (np == 0 || total > GEN_MAX_TOKENS) {
		free(pids);
		fprintf(stderr, "tandem generate: prompt of %zu tokens + %lld new is outside 1..%d\n", np,
		        (long long)a.n, GEN_MAX_TOKENS);
		goto out;
	}
	for (size_t i = 0; i < np; i++)
		if (pids[i] >= V) {
			fprintf(
			    stderr,
			    "tandem generate: token id %d at index %zu is outside the vocabulary (%lld)\n",
			    pids[i], i, (long long)V);
			free(pids);
			goto out;
		}
	ret = 1;
	hist = realloc(pids, sizeof(int32_t) * total);
	if (!hist) {
		free(pids);
		goto oom;
	}
	int n_blocks = (int)((total + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS);
	blocks = malloc(sizeof(int32_t) * (size_t)n_blocks);
	lg = malloc(sizeof(float) * (size_t)V);
	if (!blocks || !lg || sample_work_init(&sw, V))
		goto oom;
	if (t && !(obuf = malloc(tok_stream_max_out(t) + 8)))
		goto oom;
	if (model_kv_init(&kv, m, n_blocks, NULL, 0, &e)) {
		fprintf(stderr, "tandem generate: %s\n", e.msg);
		goto out;
	}
	for (int b = 0; b < n_blocks; b++)
		blocks[b] = b;
	struct model_seq s = {.blocks = blocks, .n_blocks = n_blocks};
	/* prefill */
	{
		int32_t *seq = calloc(np, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * np);
		if (!seq || !pos) {
			free(seq);
			free(pos);
			goto oom;
		}
		for (size_t i = 0; i < np; i++)
			pos[i] = (int32_t)i;
		rc = 0;
		for (size_t c0 = 0; c0 < np && !rc;
		     c0 += 512) { /* chunked: bounded scratch; logits of the last */
			size_t cn = np - c0 < 512 ? np - c0 : 512;
			struct model_batch b = {.n_tokens = (int)cn,
			                        .tokens = hist + c0,
			                        .seq = seq,
			                        .pos = pos + c0,
			                        .n_seqs = 1,
			                        .seqs = &s};
			rc = model_forward(m, &kv, &b, lg, NULL, &e);
		}
		free(seq);
		free(pos);
		if (rc) {
			fprintf(stderr, "tandem generate: %s\n", e.msg);
			goto out;
		}
	}
	struct sample_rng rng;
	sample_rng_seed(&rng, a.seed);
	struct tok_stream ts;
	if (t)
		tok_stream_init(&ts, t, 0);
	size_t n_hist = np;
	for (int64_t i = 0; i < a.n; i++) {
		struct sample_result r;
		if (sample_token(&a.sp, &rng, &sw, lg, V, hist, (int64_t)n_hist, &r, &e)) {
			fprintf(stderr, "tandem generate: %s\n", e.msg);
			goto out;
		}
		if (!a.ignore_eos && t &&
		    (tok_is_eog(t, r.token) || (have_chat && chat_is_stop(&chat, r.token))))
			break;
		hist[n_hist++] = r.token;
		if (a.ids_only) {
			printf(i ? " %d" : "%d", r.token);
		} else {
			size_t no;
			if (tok_stream_feed(&ts, r.token, obuf, tok_stream_max_out(t) + 8, &no, &e)) {
				fprintf(stderr, "tandem generate: %s\n", e.msg);
				goto out;
			}
			fwrite(obuf, 1, no, stdout);
		}
		fflush(stdout);
		if (i + 1 == a.n)
			break;
		int32_t seq0 = 0, pos = (int32_t)(n_hist - 1);
		struct model_batch b = {
		    .n_tokens = 1, .tokens = &r.token, .seq = &seq0, .pos = &pos, .n_seqs = 1, .seqs = &s};
		if (model_forward(m, &kv, &b, lg, NULL, &e)) {
			fprintf(stderr, "tandem generate: %s\n", e.msg);
			goto out;
		}
	}
	if (!a.ids_only && t) {
		size_t no;
		if (tok_stream_flush(&ts, obuf, tok_stream_max_out(t) + 8, &no, &e) == 0)
			fwrite(obuf, 1, no, stdout);
	}
	printf("\n");
	ret = 0;
	goto out;
oom:
	fprintf(stderr, "tandem generate: out of memory\n");
	ret = 1;
out:
	free(obuf);
	free(lg);
	free(blocks);
	free(hist);
	sample_work_fini(&sw);
	model_kv_fini(&kv);
	tok_destroy(t);
	model_destroy(m);
	return ret;
}
