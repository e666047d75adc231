/* `tandem bench`: prefill and decode throughput of the model core on this machine's CPU backend.
 *
 *   tandem bench -m MODEL [--prompt N] [--gen N] [--batch B] [--threads T] [--tp N] [--reps R]
 *                [--ubatch U] [--seed S] [--json] [--fast]
 *
 * Prefill: B sequences of N seeded random prompt tokens each, run in chunks of U tokens (default: the
 * whole prompt in one batch). Decode: then --gen steps, each one token for every one of the B
 * sequences (continuous-batching shape). Each measurement is repeated --reps times over a fresh KV
 * cache; the median is reported. The "bytes/token" column is the weight bytes one decode step must
 * read (every matrix except the embedding table, routed experts counted at k/E of their size) and
 * "GB/s" is that over the step time: the roofline at batch 1 is the machine's read bandwidth. With
 * --rank r (one rank of --tp run alone) the bytes are that rank's: its shard of the split tensors.
 * --backend cuda --tp T without --rank runs real TP over T GPUs (NCCL, one thread per GPU); the
 * bytes are then one GPU's, and the decode is timed once more with the collectives skipped (wrong
 * output, same work otherwise) to give the all-reduce share of a step.
 * --kv-fill random skips the prefill (random KV at position --ctx); --matrix runs the batch x
 * context decode table of issue 4 and one long prefill on one weight upload; --profile prints the
 * CUDA backend's per-op tables (kernels/cuda/prof.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/base/log.h"
#include "common/gguf/gguf.h"
#include "cli/model_args.h"
#include "common/model/model.h"
#ifdef TANDEM_CUDA
#include "kernels/cuda/model_fwd.h"
#include "kernels/cuda/prof.h"
#endif

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Weight bytes a decode step reads for one token: all tensors but the embedding table (one row),
 * routed expert tensors (names ending in _exps.weight) at k/E. */
/* Tensors split T ways between TP ranks (MODEL-SPEC.md §3.2): q_b (or q), the per-head k_b / v_b,
 * o_proj, dense and shared FFN, routed experts, lm_head; the rest (q_a, kv_a, norms, indexer,
 * router) is replicated on every rank. */
static bool tp_sharded(const char *name)
{
	static const char *const blk[] = {
	    "attn_q_b.",       "attn_q.",        "attn_k_b.",    "attn_v_b.",       "attn_output.",
	    "ffn_gate.",       "ffn_up.",        "ffn_down.",    "ffn_gate_shexp.", "ffn_up_shexp.",
	    "ffn_down_shexp.", "ffn_gate_exps.", "ffn_up_exps.", "ffn_down_exps."};
	if (strcmp(name, "output.weight") == 0 || strcmp(name, "token_embd.weight") == 0)
		return true; /* lm_head (token_embd only counts when tied) */
	if (strncmp(name, "blk.", 4) != 0)
		return false;
	const char *dot = strchr(name + 4, '.');
	if (!dot)
		return false;
	for (size_t i = 0; i < sizeof(blk) / sizeof(blk[0]); i++)
		if (strncmp(dot + 1, blk[i], strlen(blk[i])) == 0)
			return true;
	return false;
}

/* Weight bytes one decode step reads: the whole model's active bytes (shard_tp 1: every rank runs
 * in this process), or one rank's (shard_tp = T for --rank r: sharded tensors count 1/T). */
static double decode_bytes_per_token(const struct model *m, int shard_tp)
{
	const struct gguf_ctx *g = model_gguf(m);
	const struct model_hparams *hp = model_hparams(m);
	double total = 0;
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		if (strcmp(t->name, "token_embd.weight") == 0 && !hp->lm_head_tied)
			continue;
		if (strncmp(t->name, "blk.", 4) == 0) {
			int l = atoi(t->name + 4);
			if (l >= hp->n_layers)
				continue; /* nextn layers are not run */
		}
		double b = (double)t->nbytes;
		if (strstr(t->name, "_exps.weight") && hp->n_expert > 0)
			b *= (double)hp->n_expert_used / hp->n_expert;
		if (shard_tp > 1 && tp_sharded(t->name))
			b /= shard_tp;
		total += b;
	}
	return total;
}

struct bench_opts {
	const char *model;
	int prompt, gen, batch, threads, tp, reps, ubatch;
	uint64_t seed;
	int json;
	int fast; /* --fast: CPU approximate matmuls (model_opts.fast_matmul) */
	int backend, device, rank, graph; /* cuda: --backend cuda [--device N] [--rank r] [--graph 0|1] */
	/* --synthetic PRESET: a sparse mkmodel file (shapes and small tensors only); the CUDA backend
	 * fills the matrices with random device memory */
	const char *synthetic, *syn_type, *syn_layers, *syn_experts, *syn_topk, *syn_dense;
	int kv_fill; /* --kv-fill random: no prefill, the KV pool is random and decode starts at --ctx */
	int pack; /* --pack: the prompts back to back in steps of up to --ubatch tokens (several sequences a
	           * step, as the prefill engine packs jobs' chunks) instead of one sequence a step */
	int kv_bf16; /* --kv-dtype bf16 (default f32; the matrix defaults to bf16) */
	int kv_dtype_set;
	int profile; /* --profile: per-op tables of eager decode steps (TANDEM_CUDA_PROFILE=1);
	              * 2 (--profile-graphs): of graph replays (TANDEM_CUDA_PROFILE=graph) */
	int matrix; /* --matrix: batch x context decode table + an 8k prefill, one weight upload */
	int mx_batch[8], n_mx_batch, mx_ctx[8], n_mx_ctx, mx_prefill;
};

static int parse_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out)
{
	char *end;
	long x = v ? strtol(v, &end, 10) : 0;
	if (!v || *end || x < lo || x > hi)
		return cli_usage_error(cmd, "%s needs an integer in [%d, %d], got '%s'", flag, lo, hi,
		                       v ? v : "");
	*out = (int)x;
	return 0;
}

/* "1,8,32" -> out[0..n) (at most 8 values in [lo, hi]) */
static int parse_list(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out, int *n)
{
	*n = 0;
	const char *p = v;
	while (p && *p) {
		char *end;
		long x = strtol(p, &end, 10);
		if (end == p || x < lo || x > hi || *n == 8 || (*end && *end != ','))
			return cli_usage_error(
			    cmd, "%s needs up to 8 comma-separated integers in [%d, %d], got '%s'", flag, lo,
			    hi, v);
		out[(*n)++] = (int)x;
		p = *end ? end + 1 : end;
	}
	if (*n == 0)
		return cli_usage_error(cmd, "%s needs a list of integers", flag);
	return 0;
}

static void usage(void)
{
	printf(
	    "usage: tandem bench -m MODEL [--prompt N] [--gen N] [--batch B] [--threads T] [--tp N]\n"
	    "                    [--reps R] [--ubatch U] [--seed S] [--json] [--fast]\n"
	    "                    [--backend cpu|cuda] [--device N] [--rank r] [--graph 0|1] [--ctx N]\n"
	    "                    [--kv-fill random] [--kv-dtype f32|bf16] [--pack]\n"
	    "                    [--profile | --profile-graphs]\n"
	    "                    [--matrix [--matrix-batch 1,8,32,128] [--matrix-ctx 4096,32768]\n"
	    "                     [--matrix-prefill 8192]]\n"
	    "       tandem bench --synthetic glm5|deepseek3|tiny [--layers L] [--experts E] [--top-k K]\n"
	    "                    [--dense D] [--type q4_k] --backend cuda ... (no file: random weights in\n"
	    "                    device memory, laid out exactly as loaded ones; rank r's shard only;\n"
	    "                    --type as tandem mkmodel's, e.g. q4_k,exps=iq2_xxs,down_exps=iq3_xxs)\n"
	    "Prefill and decode throughput (median of --reps runs; defaults: prompt 128, gen 32,\n"
	    "batch 1, threads = online CPUs, tp 1, reps 3, ubatch = prompt, backend cpu).\n"
	    "cuda: --rank r runs rank r of --tp alone (collectives skipped: one GPU measures one\n"
	    "rank's work); --tp T without --rank runs TP over GPUs --device .. --device+T-1 (NCCL)\n"
	    "and reports the all-reduce share of a decode step; --graph 1 (default) also times\n"
	    "decode replayed from CUDA graphs against eager; prints the weight upload rate and the\n"
	    "device-to-device copy bandwidth.\n"
	    "--pack: the --batch prompts back to back in prefill steps of up to --ubatch tokens\n"
	    "(several sequences a step, as the prefill engine packs jobs; ubatch may then exceed\n"
	    "the prompt) instead of one sequence a step.\n"
	    "--kv-fill random: no prefill; every sequence's KV blocks hold random values and decode\n"
	    "starts at position --ctx (decode at 32k without a 32k prefill).\n"
	    "--profile: per-op tables of eager decode and prefill steps (time, calls, launches, GB/s;\n"
	    "cuda only).\n"
	    "--profile-graphs: the same of decode graph replays (event nodes in the captured graphs).\n"
	    "--matrix: decode step time eager and graphs for every batch x context of the lists (KV\n"
	    "random-filled, bf16 unless --kv-dtype; cells whose KV does not fit are skipped with the\n"
	    "bytes), achieved weight+KV read rate against the copy rate, then a --matrix-prefill\n"
	    "prompt (ubatch --ubatch, default 2048) against the bf16 tensor-core rate; with --profile\n"
	    "a profiled pass of every cell and of the prompt follows.\n");
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
	const char *cmd = "bench";
	*o = (struct bench_opts){.prompt = 128,
	                         .gen = 32,
	                         .batch = 1,
	                         .tp = 1,
	                         .reps = 3,
	                         .seed = 1,
	                         .rank = -1,
	                         .graph = 1,
	                         .mx_batch = {1, 8, 32, 128},
	                         .n_mx_batch = 4,
	                         .mx_ctx = {4096, 32768},
	                         .n_mx_ctx = 2,
	                         .mx_prefill = 8192};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	o->threads = ncpu > 0 ? (int)ncpu : 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc = 0;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage();
			exit(0);
		} else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
			if (!v)
				return cli_usage_error(cmd, "%s needs a path", a);
			o->model = v;
			i++;
		} else if (!strcmp(a, "--prompt")) {
			rc = parse_int(cmd, a, v, 1, 1 << 20, &o->prompt), i++;
		} else if (!strcmp(a, "--gen")) {
			rc = parse_int(cmd, a, v, 0, 1 << 20, &o->gen), i++;
		} else if (!strcmp(a, "--batch")) {
			rc = parse_int(cmd, a, v, 1, 4096, &o->batch), i++;
		} else if (!strcmp(a, "--threads")) {
			rc = parse_int(cmd, a, v, 1, 4096, &o->threads), i++;
		} else if (!strcmp(a, "--tp")) {
			rc = parse_int(cmd, a, v, 1, 64, &o->tp), i++;
		} else if (!strcmp(a, "--reps")) {
			rc = parse_int(cmd, a, v, 1, 1000, &o->reps), i++;
		} else if (!strcmp(a, "--ubatch")) {
			rc = parse_int(cmd, a, v, 1, 1 << 20, &o->ubatch), i++;
		} else if (!strcmp(a, "--seed")) {
			int s;
			rc = parse_int(cmd, a, v, 0, 1 << 30, &s), i++;
			o->seed = (uint64_t)s;
		} else if (!strcmp(a, "--json")) {
			o->json = 1;
		} else if (!strcmp(a, "--fast")) {
			o->fast = 1;
		} else if (!strcmp(a, "--backend")) {
			if (!cli_parse_backend(v, &o->backend))
				return cli_usage_error(cmd, "--backend needs cpu or cuda");
			i++;
		} else if (!strcmp(a, "--device")) {
			rc = parse_int(cmd, a, v, 0, 1023, &o->device), i++;
		} else if (!strcmp(a, "--rank")) {
			rc = parse_int(cmd, a, v, 0, 63, &o->rank), i++;
		} else if (!strcmp(a, "--graph")) {
			rc = parse_int(cmd, a, v, 0, 1, &o->graph), i++;
		} else if (!strcmp(a, "--ctx")) { /* decode at this context: the prompt length */
			rc = parse_int(cmd, a, v, 1, 1 << 20, &o->prompt), i++;
		} else if (!strcmp(a, "--kv-fill")) {
			if (!v || strcmp(v, "random"))
				return cli_usage_error(cmd, "--kv-fill needs 'random'");
			o->kv_fill = 1, i++;
		} else if (!strcmp(a, "--kv-dtype")) {
			if (!v || (strcmp(v, "bf16") && strcmp(v, "f32")))
				return cli_usage_error(cmd, "--kv-dtype needs bf16 or f32");
			o->kv_bf16 = !strcmp(v, "bf16"), o->kv_dtype_set = 1, i++;
		} else if (!strcmp(a, "--pack")) {
			o->pack = 1;
		} else if (!strcmp(a, "--profile")) {
			o->profile = 1;
		} else if (!strcmp(a, "--profile-graphs")) {
			o->profile = 2;
		} else if (!strcmp(a, "--matrix")) {
			o->matrix = 1;
		} else if (!strcmp(a, "--matrix-batch")) {
			rc = parse_list(cmd, a, v, 1, 4096, o->mx_batch, &o->n_mx_batch), i++;
		} else if (!strcmp(a, "--matrix-ctx")) {
			rc = parse_list(cmd, a, v, 1, 1 << 20, o->mx_ctx, &o->n_mx_ctx), i++;
		} else if (!strcmp(a, "--matrix-prefill")) {
			rc = parse_int(cmd, a, v, 0, 1 << 20, &o->mx_prefill), i++;
		} else if (!strcmp(a, "--synthetic") || !strcmp(a, "--type") || !strcmp(a, "--layers") ||
		           !strcmp(a, "--experts") || !strcmp(a, "--top-k") || !strcmp(a, "--dense")) {
			if (!v)
				return cli_usage_error(cmd, "%s needs a value", a);
			const char **dst = !strcmp(a, "--synthetic") ? &o->synthetic
			                   : !strcmp(a, "--type")    ? &o->syn_type
			                   : !strcmp(a, "--layers")  ? &o->syn_layers
			                   : !strcmp(a, "--experts") ? &o->syn_experts
			                   : !strcmp(a, "--top-k")   ? &o->syn_topk
			                                             : &o->syn_dense;
			*dst = v;
			i++;
		} else {
			return cli_usage_error(cmd, "unknown option '%s' (see tandem bench --help)", a);
		}
		if (rc)
			return rc;
	}
	if (!o->model && !o->synthetic)
		return cli_usage_error(cmd, "-m MODEL (or --synthetic PRESET) is required");
	if (o->model && o->synthetic)
		return cli_usage_error(cmd, "-m and --synthetic exclude each other");
	if (!o->synthetic && (o->syn_type || o->syn_layers || o->syn_experts || o->syn_topk || o->syn_dense))
		return cli_usage_error(cmd, "--type/--layers/--experts/--top-k/--dense go with --synthetic");
	if (o->matrix && !o->kv_dtype_set)
		o->kv_bf16 = 1;
	if (o->matrix && o->ubatch == 0)
		o->ubatch = o->mx_prefill < 2048 ? (o->mx_prefill > 0 ? o->mx_prefill : 1) : 2048;
	if (o->pack && (o->kv_fill || o->matrix))
		return cli_usage_error(cmd, "--pack packs the prefill: not with --kv-fill or --matrix");
	if (!o->matrix) { /* at most one prompt a step, or all of them packed (within --ubatch's range) */
		const int64_t all = o->pack ? (int64_t)o->prompt * o->batch : o->prompt;
		const int cap = all < (1 << 20) ? (int)all : 1 << 20;
		if (o->ubatch == 0 || o->ubatch > cap)
			o->ubatch = cap;
	}
	if (o->rank >= o->tp)
		return cli_usage_error(cmd, "--rank %d needs --tp > %d", o->rank, o->rank);
	return 0;
}

/* The sequences of one run: KV pool, block tables and the step arrays. */
struct bench_seqs {
	struct model_kv kv;
	int32_t *blocks, *tok, *sq, *pos;
	struct model_seq *seqs;
	uint8_t *want;
	float *logits;
	int batch, nb_seq;
};

static void seqs_fini(struct bench_seqs *s)
{
	free(s->blocks);
	free(s->seqs);
	free(s->tok);
	free(s->sq);
	free(s->pos);
	free(s->want);
	free(s->logits);
	model_kv_fini(&s->kv);
	memset(s, 0, sizeof(*s));
}

/* batch sequences of ctx positions each, n_tok_max tokens per forward at most */
static int seqs_init(struct bench_seqs *s, struct model *m, int batch, int ctx, int n_tok_max,
                     struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(m);
	memset(s, 0, sizeof(*s));
	s->batch = batch;
	s->nb_seq = (ctx + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS;
	int rc = model_kv_init(&s->kv, m, (int64_t)s->nb_seq * batch, NULL, 0, e);
	if (rc)
		return rc;
	s->blocks = malloc(sizeof(int32_t) * (size_t)s->nb_seq * (size_t)batch);
	s->seqs = calloc((size_t)batch, sizeof(*s->seqs));
	s->tok = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	s->sq = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	s->pos = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	s->want = calloc((size_t)n_tok_max, 1);
	s->logits = malloc(sizeof(float) * (size_t)hp->vocab * (size_t)batch);
	if (!s->blocks || !s->seqs || !s->tok || !s->sq || !s->pos || !s->want || !s->logits) {
		seqs_fini(s);
		return errbuf_set(e, -ENOMEM, "bench: out of memory");
	}
	for (int q = 0; q < batch; q++) {
		for (int i = 0; i < s->nb_seq; i++)
			s->blocks[q * s->nb_seq + i] = q * s->nb_seq + i;
		s->seqs[q] =
		    (struct model_seq){.blocks = s->blocks + (size_t)q * s->nb_seq, .n_blocks = s->nb_seq};
	}
	return 0;
}

/* Random KV contents (as if a prompt had been prefilled): device memory filled on the GPU
 * (bf16 / f32 fields finite, |x| < 2), host memory with uniform values in [-1, 1). */
static int kv_fill_random(struct bench_seqs *s, void *kc, uint64_t seed, struct errbuf *e)
{
	size_t bytes = (size_t)s->kv.n_blocks * s->kv.layout.block_bytes;
	if (s->kv.on_device) {
#ifdef TANDEM_CUDA
		if (kc && !kfwd_fill_random(kc, s->kv.base, bytes, seed) && !kcuda_sync(kc))
			return 0;
#endif
		return errbuf_set(e, ERR_CUDA, "bench: cannot fill the %zu-byte device KV pool", bytes);
	}
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
	if (s->kv.layout.dtype == MODEL_KV_BF16) {
		uint16_t *p = s->kv.base;
		for (size_t i = 0; i < bytes / 2; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			float f = (float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
			uint32_t u;
			memcpy(&u, &f, 4);
			p[i] = (uint16_t)(u >> 16);
		}
	} else {
		float *p = s->kv.base;
		for (size_t i = 0; i < bytes / 4; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			p[i] = (float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
		}
	}
	return 0;
}

/* n decode steps, one token for every sequence at positions pos0, pos0 + 1, ... */
static int decode_steps(struct model *m, struct bench_seqs *s, int pos0, int n, uint64_t *x, double *secs,
                        struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(m);
	int rc = 0;
	double t0 = now_s();
	for (int i = 0; i < s->batch; i++)
		s->want[i] = 1;
	for (int step = 0; step < n && !rc; step++) {
		for (int q = 0; q < s->batch; q++) {
			/* greedy-free: the next token is a cheap function of the logits so the step depends
			 * on the previous one like real decoding does */
			*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
			s->tok[q] = (int32_t)(*x % (uint64_t)hp->vocab);
			s->sq[q] = q;
			s->pos[q] = pos0 + step;
		}
		struct model_batch b = {.n_tokens = s->batch,
		                        .tokens = s->tok,
		                        .seq = s->sq,
		                        .pos = s->pos,
		                        .logits = s->want,
		                        .n_seqs = s->batch,
		                        .seqs = s->seqs};
		rc = model_forward(m, &s->kv, &b, s->logits, NULL, e);
	}
	*secs = now_s() - t0;
	return rc;
}

/* a prompt of n random tokens for every sequence: one sequence a step in chunks of ubatch, or (pack)
 * the prompts back to back, steps of up to ubatch rows that hold the end of one prompt and the start
 * of the next; *steps (may be NULL) counts the steps */
static int prefill(struct model *m, struct bench_seqs *s, int n_prompt, int ubatch, int pack, uint64_t *x,
                   int *steps, struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(m);
	const int64_t total = (int64_t)n_prompt * s->batch;
	int rc = 0, n_steps = 0;
	for (int64_t g0 = 0; g0 < total && !rc; n_steps++) {
		/* rows g0 .. g0 + n - 1 of the sequences' prompts laid end to end */
		const int64_t q0 = g0 / n_prompt, end = pack ? total : (q0 + 1) * n_prompt;
		const int n = (int)(end - g0 < ubatch ? end - g0 : ubatch);
		for (int i = 0; i < n; i++) {
			*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
			s->tok[i] = (int32_t)(*x % (uint64_t)hp->vocab);
			s->sq[i] = (int32_t)((g0 + i) / n_prompt);
			s->pos[i] = (int32_t)((g0 + i) % n_prompt);
		}
		struct model_batch b = {.n_tokens = n,
		                        .tokens = s->tok,
		                        .seq = s->sq,
		                        .pos = s->pos,
		                        .logits = NULL,
		                        .n_seqs = s->batch,
		                        .seqs = s->seqs};
		rc = model_forward(m, &s->kv, &b, s->logits, NULL, e);
		g0 += n;
	}
	if (steps)
		*steps = n_steps;
	return rc;
}

struct run_result {
	double prefill_s, decode_s;
	int prefill_steps;
};

/* One fresh run: prefill every sequence (or fill the KV with random values), then gen decode
 * steps over all of them. */
static int run_once(struct model *m, const struct bench_opts *o, void *kc, struct run_result *res,
                    struct errbuf *e)
{
	struct bench_seqs s;
	int n_tok_max = o->ubatch > o->batch ? o->ubatch : o->batch;
	int rc = seqs_init(&s, m, o->batch, o->prompt + o->gen, n_tok_max, e);
	if (rc)
		return rc;
	uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
	res->prefill_steps = 0;
	double t0 = now_s();
	rc = o->kv_fill ? kv_fill_random(&s, kc, o->seed, e)
	                : prefill(m, &s, o->prompt, o->ubatch, o->pack, &x, &res->prefill_steps, e);
	double t1 = now_s();
	if (!rc)
		rc = decode_steps(m, &s, o->prompt, o->gen, &x, &res->decode_s, e);
	res->prefill_s = t1 - t0;
	seqs_fini(&s);
	return rc;
}

/* Writes the sparse synthetic model file (tandem mkmodel --sparse) to path. */
static int make_synthetic(const struct bench_opts *o, const char *path)
{
	const char *av[20];
	int ac = 0;
	av[ac++] = "mkmodel";
	av[ac++] = "--preset";
	av[ac++] = o->synthetic;
	av[ac++] = "--type";
	av[ac++] = o->syn_type ? o->syn_type : "q4_k";
	av[ac++] = "-o";
	av[ac++] = path;
	av[ac++] = "--sparse";
	if (o->syn_layers)
		av[ac++] = "--layers", av[ac++] = o->syn_layers;
	if (o->syn_experts)
		av[ac++] = "--experts", av[ac++] = o->syn_experts;
	if (o->syn_topk)
		av[ac++] = "--top-k", av[ac++] = o->syn_topk;
	if (o->syn_dense)
		av[ac++] = "--dense", av[ac++] = o->syn_dense;
	av[ac] = NULL;
	return cmd_mkmodel(ac, (char **)av);
}

/* Weight bytes and elements one decode step reads, experts apart: experts scale with the
 * number of distinct experts the batch routes to, the rest is read once per step. */
struct wsum {
	double bytes, elems; /* all but routed experts (and the embedding table) */
	double exp_bytes, exp_elems; /* routed experts, all E of them */
};

static void weight_sums(const struct model *m, int shard_tp, struct wsum *w)
{
	const struct gguf_ctx *g = model_gguf(m);
	const struct model_hparams *hp = model_hparams(m);
	memset(w, 0, sizeof(*w));
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		if (strcmp(t->name, "token_embd.weight") == 0 && !hp->lm_head_tied)
			continue;
		if (strncmp(t->name, "blk.", 4) == 0 && atoi(t->name + 4) >= hp->n_layers)
			continue;
		double b = (double)t->nbytes, n = 1;
		for (int d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++)
			n *= (double)t->ne[d];
		if (shard_tp > 1 && tp_sharded(t->name))
			b /= shard_tp, n /= shard_tp;
		if (strstr(t->name, "_exps.weight") && hp->n_expert > 0)
			w->exp_bytes += b, w->exp_elems += n;
		else
			w->bytes += b, w->elems += n;
	}
}

/* expected share of the E experts a batch of `batch` tokens routes to (uniform routing) */
static double expert_share(const struct model_hparams *hp, int batch)
{
	if (hp->n_expert <= 0)
		return 0;
	return 1.0 - pow(1.0 - (double)hp->n_expert_used / hp->n_expert, batch);
}

/* KV bytes one sequence's decode step reads at context ctx: the latent rows attention reads
 * (the indexer's top-k, or every position without an indexer) and every indexer key */
static double kv_read_bytes(const struct model *m, int ctx)
{
	const struct model_hparams *hp = model_hparams(m);
	struct model_kv_layout L;
	model_kv_layout_get(m, &L);
	double keys = hp->has_indexer && hp->idx_topk < ctx ? (double)hp->idx_topk : (double)ctx;
	return (double)L.elt_bytes * ((double)hp->n_layers * keys * (double)L.lat_dim +
	                              (double)L.n_idx * (double)ctx * (double)L.idx_dim);
}

/* The issue-4 matrix on one loaded model: decode step time eager and from graphs for every
 * batch x context (KV random-filled), the read rate against the copy rate, then one prefill. */
static int run_matrix(struct model *m, const struct bench_opts *o, void *kc, double d2d, double tflops,
                      struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(m);
	struct wsum ws;
	weight_sums(m, o->rank >= 0 ? o->tp : 1, &ws);
	struct model_kv_layout L;
	model_kv_layout_get(m, &L);
	int gen = o->gen > 0 ? o->gen : 1;
	uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
	int rc = 0;
	printf("matrix   %s, %d layers%s, KV %s (%.1f KB/token), %d decode steps per cell after 1 warm-up; "
	       "copy rate "
	       "%.0f GB/s (DRAM %.0f GB/s)\n",
	       model_arch_name(hp->arch), hp->n_layers, o->rank >= 0 ? ", rank-shard" : "",
	       L.dtype == MODEL_KV_BF16 ? "bf16" : "f32", (double)L.block_bytes / MODEL_KV_BLOCK_TOKENS / 1e3,
	       gen, d2d, 2 * d2d);

	/* pass 1 (--profile) first: the tables matter most when a run is cut short */
	for (int pass = o->profile ? 1 : 0; pass >= 0 && !rc; pass--) {
#ifdef TANDEM_CUDA
		kprof_set_enabled(pass == 1);
#endif
		if (pass == 0)
			printf("  %5s %6s %10s %10s %9s %10s %10s %9s %7s\n", "batch", "ctx", "eager ms",
			       "graph ms", "tok/s", "weights MB", "KV MB", "GB/s", "%DRAM");
		if (pass == 1)
			printf("matrix   profiled pass (eager, events around every op, 1 warm-up + 3 steps "
			       "per cell): "
			       "tables follow\n");
		for (int ci = 0; ci < o->n_mx_ctx && !rc; ci++)
			for (int bi = 0; bi < o->n_mx_batch && !rc; bi++) {
				int B = o->mx_batch[bi], ctx = o->mx_ctx[ci];
				int steps = pass ? 4 : 2 + 2 * gen;
				int total = ctx + steps;
				double need =
				    (double)B *
				    (double)((total + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS) *
				    (double)L.block_bytes;
				size_t fr = 0, tot = 0;
#ifdef TANDEM_CUDA
				if (kc && kfwd_mem_info(&fr, &tot))
					fr = 0;
#else
				(void)tot;
#endif
				if (kc && fr > 0 && need + 2e9 > (double)fr) {
					if (pass == 0)
						printf("  %5d %6d  skipped: KV needs %.1f GB (%d seqs x %d "
						       "positions x %.0f "
						       "B), %.1f GB free (2 GB kept)\n",
						       B, ctx, need / 1e9, B, total,
						       (double)L.block_bytes / MODEL_KV_BLOCK_TOKENS,
						       (double)fr / 1e9);
					continue;
				}
				struct bench_seqs s;
				if ((rc = seqs_init(&s, m, B, total, B, e)))
					break;
				double t_warm, te = 0, tg = 0;
				if (!(rc = kv_fill_random(&s, kc, o->seed + (uint64_t)ci * 16 + (uint64_t)bi,
				                          e)) &&
				    !(rc = decode_steps(m, &s, ctx, 1, &x, &t_warm, e)))
					rc = decode_steps(m, &s, ctx + 1, pass ? 3 : gen, &x, &te, e);
				if (!rc && pass == 0 && o->graph && o->backend == MODEL_BACKEND_CUDA) {
					model_set_graphs(m, 1);
					if (!(rc = decode_steps(m, &s, ctx + 1 + gen, 1, &x, &t_warm, e)))
						rc = decode_steps(m, &s, ctx + 2 + gen, gen, &x, &tg, e);
					model_set_graphs(m, 0);
				}
				seqs_fini(&s);
#ifdef TANDEM_CUDA
				if (pass)
					kprof_report_open(stdout); /* this cell's table now */
#endif
				if (rc)
					break;
				if (pass)
					continue;
				double best = (tg > 0 ? tg : te) / gen;
				double wb = ws.bytes + ws.exp_bytes * expert_share(hp, B);
				double kvb = (double)B * kv_read_bytes(m, ctx);
				double gbs = (wb + kvb) / best / 1e9;
				char gcol[32] = "-";
				if (tg > 0)
					snprintf(gcol, sizeof(gcol), "%.2f", 1e3 * tg / gen);
				printf("  %5d %6d %10.2f %10s %9.1f %10.1f %10.1f %9.1f %6.1f%%\n", B, ctx,
				       1e3 * te / gen, gcol, B / best, wb / 1e6, kvb / 1e6, gbs,
				       d2d > 0 ? 100 * gbs / (2 * d2d) : 0.0);
				fflush(stdout);
			}
	}
#ifdef TANDEM_CUDA
	kprof_set_enabled(0);
#endif
	if (rc || o->mx_prefill <= 0)
		return rc;
	/* prefill: a warm-up chunk, then the whole prompt */
	struct bench_seqs s;
	if ((rc = seqs_init(&s, m, 1, o->mx_prefill, o->ubatch, e)))
		return rc;
	double t0 = 0;
	if (!(rc = prefill(m, &s, o->ubatch < o->mx_prefill ? o->ubatch : o->mx_prefill, o->ubatch, 0, &x,
	                   NULL, e))) {
		t0 = now_s();
		rc = prefill(m, &s, o->mx_prefill, o->ubatch, 0, &x, NULL, e);
		t0 = now_s() - t0;
	}
	seqs_fini(&s);
	if (rc)
		return rc;
	double tps = o->mx_prefill / t0;
	double flop_tok =
	    2.0 *
	    (ws.elems + ws.exp_elems * (hp->n_expert > 0 ? (double)hp->n_expert_used / hp->n_expert : 0));
	printf("prefill  %d tokens (ubatch %d): %.2f s, %.1f tok/s; weight products %.1f TFLOP/s = %.1f%% of "
	       "the "
	       "measured bf16 tensor-core rate %.0f TFLOP/s (attention and indexer FLOPs not counted)\n",
	       o->mx_prefill, o->ubatch, t0, tps, tps * flop_tok / 1e12,
	       tflops > 0 ? 100 * tps * flop_tok / 1e12 / tflops : 0.0, tflops);
#ifdef TANDEM_CUDA
	if (o->profile == 1 && kc) { /* the prompt again, an event pair around every op */
		printf("prefill  profiled pass (eager, events around every op; a warm-up chunk, then the "
		       "%d-token prompt in chunks of %d): table follows\n",
		       o->mx_prefill, o->ubatch);
		if ((rc = seqs_init(&s, m, 1, o->mx_prefill, o->ubatch, e)))
			return rc;
		kprof_set_enabled(1);
		rc = prefill(m, &s, o->ubatch < o->mx_prefill ? o->ubatch : o->mx_prefill, o->ubatch, 0, &x,
		             NULL, e);
		if (!rc)
			rc = prefill(m, &s, o->mx_prefill, o->ubatch, 0, &x, NULL, e);
		kprof_set_enabled(0);
		seqs_fini(&s);
		kprof_report_open(stdout);
		fflush(stdout);
	}
#endif
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	struct bench_opts o;
	int rc = parse(argc, argv, &o);
	if (rc)
		return rc;
	if (o.profile) {
		if (o.backend != MODEL_BACKEND_CUDA)
			return cli_usage_error("bench", "--profile needs --backend cuda");
		if (o.profile == 2 && o.matrix)
			return cli_usage_error("bench", "--profile-graphs goes without --matrix");
		/* the backend creates its profiler at load */
		setenv("TANDEM_CUDA_PROFILE", o.profile == 2 ? "graph" : "1", 1);
		if (!o.matrix && o.profile == 1)
			o.graph = 0; /* profiled steps run eagerly */
		if (o.profile == 2)
			o.graph = 1;
	}
	char synpath[256] = "";
	if (o.synthetic) {
		const char *td = getenv("TMPDIR");
		snprintf(synpath, sizeof(synpath), "%s/tandem-synth-%ld.gguf", td && *td ? td : "/tmp",
		         (long)getpid());
		if (make_synthetic(&o, synpath)) {
			fprintf(stderr, "tandem bench: cannot make the synthetic model\n");
			return 2;
		}
		o.model = synpath;
	}
	struct errbuf e = {0};
	struct model_opts mo;
	model_opts_default(&mo);
	mo.n_threads = o.threads;
	mo.tp = o.tp;
	mo.quiet = true;
	mo.rank = o.rank;
	mo.backend = (enum model_backend_kind)o.backend;
	mo.fast_matmul = o.fast != 0;
	mo.device = o.device;
	mo.synthetic = o.synthetic && o.backend == MODEL_BACKEND_CUDA;
	if (o.kv_bf16)
		mo.kv_dtype = MODEL_KV_BF16;
	int max_batch = o.batch, max_ctx = o.prompt + o.gen;
	if (o.matrix) {
		max_batch = 1;
		max_ctx = o.mx_prefill;
		for (int i = 0; i < o.n_mx_batch; i++)
			max_batch = o.mx_batch[i] > max_batch ? o.mx_batch[i] : max_batch;
		for (int i = 0; i < o.n_mx_ctx; i++) {
			int c = o.mx_ctx[i] + 2 * (o.gen > 0 ? o.gen : 1) + 4;
			max_ctx = c > max_ctx ? c : max_ctx;
		}
	}
	if (o.backend == MODEL_BACKEND_CUDA) { /* workspaces sized for exactly this run */
		/* no prefill with --kv-fill (outside the matrix): the ubatch needs no room */
		int ub = o.kv_fill && !o.matrix ? 1 : o.ubatch;
		mo.max_tokens = ub > max_batch ? ub : max_batch;
		mo.max_seqs = max_batch;
		mo.max_ctx = max_ctx;
		mo.quiet = o.json != 0; /* the upload progress line goes to stderr */
	}
	struct model *m = NULL;
	void *kc = NULL; /* the bench's own CUDA context: KV fill, copy-rate and GEMM probes */
	double tl0 = now_s();
	rc = model_load(&m, o.model, &mo, &e);
	if (synpath[0]) /* the mapping stays valid; the (sparse) file is not needed on disk */
		unlink(synpath);
	if (rc) {
		fprintf(stderr, "tandem bench: %s\n", e.msg);
		return 2;
	}
	double load_s = now_s() - tl0;
	const struct model_hparams *hp = model_hparams(m);
	bool tp_gpus = o.backend == MODEL_BACKEND_CUDA && o.tp > 1 && o.rank < 0; /* NCCL, one GPU per rank */
	double bytes_tok = decode_bytes_per_token(m, o.rank >= 0 || tp_gpus ? o.tp : 1); /* per rank / GPU */
	double *pf = calloc((size_t)o.reps, sizeof(double)), *dc = calloc((size_t)o.reps, sizeof(double));
	double dc_graph_s = 0, d2d = 0, tflops = 0, dc_nocoll_s = 0;
	if (!pf || !dc) {
		fprintf(stderr, "tandem bench: out of memory\n");
		rc = 1;
		goto out;
	}
#ifdef TANDEM_CUDA
	if (o.backend == MODEL_BACKEND_CUDA) {
		struct kcuda_ctx *c;
		if (kcuda_ctx_create(o.device, (size_t)1 << 20, &c) == 0) {
			kc = c;
			if (kfwd_d2d_gbps(c, (size_t)1 << 30, 10, &d2d))
				d2d = 0;
			if (o.matrix && kfwd_bf16_tflops(c, 8192, 5, &tflops))
				tflops = 0;
		}
		if (!kc && o.kv_fill) {
			fprintf(stderr, "tandem bench: cannot create a CUDA context for --kv-fill\n");
			rc = 1;
			goto out;
		}
	}
#endif
	if (o.matrix) {
		printf("model %s (%s, %d layers), tp %d%s, load %.2f s\n", o.model, model_arch_name(hp->arch),
		       hp->n_layers, o.tp, o.rank >= 0 ? " (rank-shard)" : "", load_s);
		if (run_matrix(m, &o, kc, d2d, tflops, &e)) {
			fprintf(stderr, "tandem bench (matrix): %s\n", e.msg);
			rc = 1;
		}
		goto out;
	}
#ifdef TANDEM_CUDA
	if (o.profile)
		kprof_set_enabled(1);
#endif
	struct run_result warm;
	struct bench_opts ow = o;
	ow.gen = o.gen > 2 ? 2 : o.gen;
	int pf_steps = 0; /* prefill steps of a run (the same every run) */
	if (run_once(m, &ow, kc, &warm, &e)) { /* warm-up: page in the mapping, grow scratch buffers */
		fprintf(stderr, "tandem bench: %s\n", e.msg);
		rc = 1;
		goto out;
	}
	for (int r = 0; r < o.reps; r++) {
		struct run_result res;
		if (run_once(m, &o, kc, &res, &e)) {
			fprintf(stderr, "tandem bench: %s\n", e.msg);
			rc = 1;
			goto out;
		}
		pf[r] = res.prefill_s;
		dc[r] = res.decode_s;
		pf_steps = res.prefill_steps;
	}
	double pf_s = median(pf, o.reps), dc_s = median(dc, o.reps);
#ifdef TANDEM_CUDA
	if (o.backend == MODEL_BACKEND_CUDA && o.graph && o.gen > 0) { /* decode again from graphs */
		model_set_graphs(m, 1);
		for (int r = 0; r < o.reps && !rc; r++) {
			struct run_result res;
			if (run_once(m, &o, kc, &res, &e)) {
				fprintf(stderr, "tandem bench (graphs): %s\n", e.msg);
				rc = 1;
				goto out;
			}
			dc[r] = res.decode_s;
		}
		dc_graph_s = median(dc, o.reps);
		model_set_graphs(m, 0);
	}
	if (tp_gpus && o.gen > 0) { /* the same decode without the collectives: their share of a step */
		model_set_graphs(m, o.graph);
		model_set_collectives(m, false);
		for (int r = 0; r < o.reps && !rc; r++) {
			struct run_result res;
			if (run_once(m, &o, kc, &res, &e)) {
				fprintf(stderr, "tandem bench (collectives skipped): %s\n", e.msg);
				rc = 1;
				goto out;
			}
			dc[r] = res.decode_s;
		}
		dc_nocoll_s = median(dc, o.reps);
		model_set_collectives(m, true);
		model_set_graphs(m, 0);
	}
#endif
	double pf_tps = o.kv_fill ? 0 : (double)o.prompt * o.batch / pf_s;
	double dc_tps = o.gen > 0 ? (double)o.gen * o.batch / dc_s : 0;
	double step_ms = o.gen > 0 ? 1e3 * dc_s / o.gen : 0;
	double gbs = o.gen > 0 ? bytes_tok / (dc_s / o.gen) / 1e9 : 0;
	if (o.json) {
		printf(
		    "{\"model\":\"%s\",\"arch\":\"%s\",\"layers\":%d,\"threads\":%d,\"tp\":%d,\"batch\":%d,"
		    "\"fast\":%d,"
		    "\"prompt\":%d,\"gen\":%d,\"pack\":%d,\"prefill_steps\":%d,\"load_s\":%.3f,"
		    "\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,"
		    "\"decode_step_ms\":%.3f,\"decode_weight_bytes\":%.0f,\"decode_gb_s\":%.3f}\n",
		    o.model, model_arch_name(hp->arch), hp->n_layers, o.threads, o.tp, o.batch, o.fast,
		    o.prompt, o.gen, o.pack, pf_steps, load_s, pf_tps, dc_tps, step_ms, bytes_tok, gbs);
	} else {
		printf("model %s (%s, %d layers), threads %d, tp %d, batch %d, load %.2f s\n", o.model,
		       model_arch_name(hp->arch), hp->n_layers, o.threads, o.tp, o.batch, load_s);
		if (o.kv_fill)
			printf("prefill  none: KV random-filled to position %d\n", o.prompt);
		else
			printf("prefill  %6d tokens/seq  %10.1f tok/s  (%d steps of <= %d tokens%s)\n",
			       o.prompt, pf_tps, pf_steps, o.ubatch,
			       o.pack ? ", prompts packed" : ", one sequence a step");
		printf("decode   %6d steps       %10.1f tok/s  %8.2f ms/step  %.1f MB weights/step%s  %.2f "
		       "GB/s\n",
		       o.gen, dc_tps, step_ms, bytes_tok / 1e6,
		       o.rank >= 0 ? " (this rank)"
		       : tp_gpus   ? " (per GPU)"
		                   : "",
		       gbs);
		if (o.backend == MODEL_BACKEND_CUDA) {
			double wbytes = bytes_tok; /* the decode-read estimate; upload moves every weight */
			printf(
			    "cuda     device %d%s: weights loaded in %.2f s; device-to-device copy %.1f GB/s "
			    "(%.1f GB/s of DRAM traffic)\n",
			    o.device, o.rank >= 0 ? " (rank-shard)" : "", load_s, d2d, 2 * d2d);
			if (dc_graph_s > 0) {
				double gstep = 1e3 * dc_graph_s / o.gen;
				printf("graphs   %6d steps       %10.1f tok/s  %8.2f ms/step  (eager %.2f "
				       "ms/step)  %.2f "
				       "GB/s of weights = %.0f%% of the copy rate\n",
				       o.gen, (double)o.gen * o.batch / dc_graph_s, gstep, step_ms,
				       wbytes / (gstep * 1e-3) / 1e9,
				       d2d > 0 ? 100.0 * wbytes / (gstep * 1e-3) / 1e9 / (2 * d2d) : 0.0);
			}
			if (dc_nocoll_s > 0) {
				double with = 1e3 * (o.graph && dc_graph_s > 0 ? dc_graph_s : dc_s) / o.gen;
				double without = 1e3 * dc_nocoll_s / o.gen;
				printf("tp       %d GPUs (NCCL %d.%d.%d): %s decode step %.3f ms with the "
				       "all-reduces, %.3f ms without: all-reduce share %.1f%% (%d "
				       "all-reduces + 1 "
				       "all-gather per step)\n",
				       o.tp, tp_nccl_version() / 10000, tp_nccl_version() / 100 % 100,
				       tp_nccl_version() % 100, o.graph && dc_graph_s > 0 ? "graph" : "eager",
				       with, without, with > 0 ? 100.0 * (with - without) / with : 0.0,
				       2 * hp->n_layers);
			}
		}
	}
out:
	free(pf);
	free(dc);
	model_destroy(m);
#ifdef TANDEM_CUDA
	if (kc)
		kcuda_ctx_destroy(kc);
#endif
	return rc;
}
