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
 * output, same work otherwise) to give the all-reduce share of a step. */
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

static void usage(void)
{
	printf(
	    "usage: tandem bench -m MODEL [--prompt N] [--gen N] [--batch B] [--threads T] [--tp N]\n"
	    "                    [--reps R] [--ubatch U] [--seed S] [--json] [--fast]\n"
	    "                    [--backend cpu|cuda] [--device N] [--rank r] [--graph 0|1] [--ctx N]\n"
	    "       tandem bench --synthetic glm5|deepseek3|tiny [--layers L] [--experts E] [--top-k K]\n"
	    "                    [--dense D] [--type q4_k] --backend cuda ... (no file: random weights in\n"
	    "                    device memory, laid out exactly as loaded ones; rank r's shard only)\n"
	    "Prefill and decode throughput (median of --reps runs; defaults: prompt 128, gen 32,\n"
	    "batch 1, threads = online CPUs, tp 1, reps 3, ubatch = prompt, backend cpu).\n"
	    "cuda: --rank r runs rank r of --tp alone (collectives skipped: one GPU measures one\n"
	    "rank's work); --tp T without --rank runs TP over GPUs --device .. --device+T-1 (NCCL)\n"
	    "and reports the all-reduce share of a decode step; --graph 1 (default) also times\n"
	    "decode replayed from CUDA graphs against eager; prints the weight upload rate and the\n"
	    "device-to-device copy bandwidth.\n");
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
	const char *cmd = "bench";
	*o = (struct bench_opts){
	    .prompt = 128, .gen = 32, .batch = 1, .tp = 1, .reps = 3, .seed = 1, .rank = -1, .graph = 1};
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
	if (o->ubatch == 0 || o->ubatch > o->prompt)
		o->ubatch = o->prompt;
	if (o->rank >= o->tp)
		return cli_usage_error(cmd, "--rank %d needs --tp > %d", o->rank, o->rank);
	return 0;
}

struct run_result {
	double prefill_s, decode_s;
};

/* One fresh run: prefill every sequence, then gen decode steps over all of them. */
static int run_once(struct model *m, const struct bench_opts *o, struct run_result *res, struct errbuf *e)
{
	const struct model_hparams *hp = model_hparams(m);
	int ctx = o->prompt + o->gen;
	int nb_seq = (ctx + MODEL_KV_BLOCK_TOKENS - 1) / MODEL_KV_BLOCK_TOKENS;
	int n_tok_max = o->ubatch > o->batch ? o->ubatch : o->batch;
	struct model_kv kv = {0};
	int rc = model_kv_init(&kv, m, (int64_t)nb_seq * o->batch, NULL, 0, e);
	if (rc)
		return rc;
	int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb_seq * (size_t)o->batch);
	struct model_seq *seqs = calloc((size_t)o->batch, sizeof(*seqs));
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	int32_t *sq = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok_max);
	uint8_t *want = calloc((size_t)n_tok_max, 1);
	float *logits = malloc(sizeof(float) * (size_t)hp->vocab * (size_t)o->batch);
	if (!blocks || !seqs || !tok || !sq || !pos || !want || !logits) {
		rc = errbuf_set(e, -ENOMEM, "bench: out of memory");
		goto out;
	}
	for (int s = 0; s < o->batch; s++) {
		for (int i = 0; i < nb_seq; i++)
			blocks[s * nb_seq + i] = s * nb_seq + i;
		seqs[s] = (struct model_seq){.blocks = blocks + (size_t)s * nb_seq, .n_blocks = nb_seq};
	}
	uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
	double t0 = now_s();
	for (int s = 0; s < o->batch && !rc; s++) {
		for (int p0 = 0; p0 < o->prompt && !rc; p0 += o->ubatch) {
			int n = o->prompt - p0 < o->ubatch ? o->prompt - p0 : o->ubatch;
			for (int i = 0; i < n; i++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				tok[i] = (int32_t)(x % (uint64_t)hp->vocab);
				sq[i] = s;
				pos[i] = p0 + i;
			}
			struct model_batch b = {.n_tokens = n,
			                        .tokens = tok,
			                        .seq = sq,
			                        .pos = pos,
			                        .logits = NULL,
			                        .n_seqs = o->batch,
			                        .seqs = seqs};
			rc = model_forward(m, &kv, &b, logits, NULL, e);
		}
	}
	double t1 = now_s();
	for (int i = 0; i < o->batch; i++)
		want[i] = 1;
	for (int step = 0; step < o->gen && !rc; step++) {
		for (int s = 0; s < o->batch; s++) {
			/* greedy-free: the next token is a cheap function of the logits so the step depends
			 * on the previous one like real decoding does */
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			tok[s] = (int32_t)(x % (uint64_t)hp->vocab);
			sq[s] = s;
			pos[s] = o->prompt + step;
		}
		struct model_batch b = {.n_tokens = o->batch,
		                        .tokens = tok,
		                        .seq = sq,
		                        .pos = pos,
		                        .logits = want,
		                        .n_seqs = o->batch,
		                        .seqs = seqs};
		rc = model_forward(m, &kv, &b, logits, NULL, e);
	}
	double t2 = now_s();
	res->prefill_s = t1 - t0;
	res->decode_s = t2 - t1;
out:
	free(blocks);
	free(seqs);
	free(tok);
	free(sq);
	free(pos);
	free(want);
	free(logits);
	model_kv_fini(&kv);
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

int cmd_bench(int argc, char **argv)
{
	struct bench_opts o;
	int rc = parse(argc, argv, &o);
	if (rc)
		return rc;
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
	if (o.backend == MODEL_BACKEND_CUDA) { /* workspaces sized for exactly this run */
		mo.max_tokens = o.ubatch > o.batch ? o.ubatch : o.batch;
		mo.max_seqs = o.batch;
		mo.max_ctx = o.prompt + o.gen;
		mo.quiet = o.json != 0; /* the upload progress line goes to stderr */
	}
	struct model *m = NULL;
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
	if (!pf || !dc) {
		fprintf(stderr, "tandem bench: out of memory\n");
		rc = 1;
		goto out;
	}
	struct run_result warm;
	struct bench_opts ow = o;
	ow.gen = o.gen > 2 ? 2 : o.gen;
	if (run_once(m, &ow, &warm, &e)) { /* warm-up: page in the mapping, grow scratch buffers */
		fprintf(stderr, "tandem bench: %s\n", e.msg);
		rc = 1;
		goto out;
	}
	for (int r = 0; r < o.reps; r++) {
		struct run_result res;
		if (run_once(m, &o, &res, &e)) {
			fprintf(stderr, "tandem bench: %s\n", e.msg);
			rc = 1;
			goto out;
		}
		pf[r] = res.prefill_s;
		dc[r] = res.decode_s;
	}
	double pf_s = median(pf, o.reps), dc_s = median(dc, o.reps);
	double dc_graph_s = 0, d2d = 0, dc_nocoll_s = 0;
#ifdef TANDEM_CUDA
	if (o.backend == MODEL_BACKEND_CUDA && o.graph && o.gen > 0) { /* decode again from graphs */
		model_set_graphs(m, 1);
		for (int r = 0; r < o.reps && !rc; r++) {
			struct run_result res;
			if (run_once(m, &o, &res, &e)) {
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
			if (run_once(m, &o, &res, &e)) {
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
	if (o.backend == MODEL_BACKEND_CUDA) {
		struct kcuda_ctx *kc;
		if (kcuda_ctx_create(o.device, (size_t)1 << 20, &kc) == 0) {
			if (kfwd_d2d_gbps(kc, (size_t)1 << 30, 10, &d2d))
				d2d = 0;
			kcuda_ctx_destroy(kc);
		}
	}
#endif
	double pf_tps = (double)o.prompt * o.batch / pf_s;
	double dc_tps = o.gen > 0 ? (double)o.gen * o.batch / dc_s : 0;
	double step_ms = o.gen > 0 ? 1e3 * dc_s / o.gen : 0;
	double gbs = o.gen > 0 ? bytes_tok / (dc_s / o.gen) / 1e9 : 0;
	if (o.json) {
		printf(
		    "{\"model\":\"%s\",\"arch\":\"%s\",\"layers\":%d,\"threads\":%d,\"tp\":%d,\"batch\":%d,"
		    "\"fast\":%d,"
		    "\"prompt\":%d,\"gen\":%d,\"load_s\":%.3f,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,"
		    "\"decode_step_ms\":%.3f,\"decode_weight_bytes\":%.0f,\"decode_gb_s\":%.3f}\n",
		    o.model, model_arch_name(hp->arch), hp->n_layers, o.threads, o.tp, o.batch, o.fast,
		    o.prompt, o.gen, load_s, pf_tps, dc_tps, step_ms, bytes_tok, gbs);
	} else {
		printf("model %s (%s, %d layers), threads %d, tp %d, batch %d, load %.2f s\n", o.model,
		       model_arch_name(hp->arch), hp->n_layers, o.threads, o.tp, o.batch, load_s);
		printf("prefill  %6d tokens/seq  %10.1f tok/s\n", o.prompt, pf_tps);
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
	return rc;
}
