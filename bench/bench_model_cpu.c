/* CPU forward benchmark: prefill and decode throughput of the model core on a GGUF file.
 *   build/bench/bench_model_cpu MODEL.gguf [threads] [tp] [prompt_len] [decode_steps] [batch]
 * Prefills `batch` sequences of prompt_len random tokens (one sequence per forward, chunks of 512)
 * then decodes decode_steps steps of all sequences together. Prints tokens/s and the arithmetic
 * rate implied by the active weights (2 FLOP per weight per token, plus attention over the keys),
 * to compare with the machine's FMA peak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/model/model.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* multiply-adds per token of the weights a token touches (MODEL-SPEC.md §2), per layer kind */
static double macs_per_token(const struct model_hparams *hp)
{
	double D = (double)hp->D, H = (double)hp->H, NR = (double)(hp->N + hp->R), m = 0;
	for (int l = 0; l < hp->n_layers; l++) {
		m += D * (double)hp->Cq + (double)hp->Cq * H * NR + D * (double)(hp->C + hp->R);
		m += H * (double)hp->N * (double)hp->C + H * (double)hp->C * (double)hp->V +
		     H * (double)hp->V * D;
		if (hp->has_indexer && hp->idx_full[l])
			m += (double)hp->Cq * (double)(hp->idx_H * hp->idx_D) + D * (double)hp->idx_D +
			     D * (double)hp->idx_H;
		if (l < hp->n_dense_lead)
			m += 3 * D * (double)hp->n_ff;
		else
			m += D * hp->n_expert +
			     3 * D * (double)hp->n_ff_exp * (hp->n_expert_used + hp->n_expert_shared);
	}
	return m + D * (double)hp->vocab;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s MODEL.gguf [threads] [tp] [prompt_len] [decode_steps] [batch]\n",
		        argv[0]);
		return 2;
	}
	int threads = argc > 2 ? atoi(argv[2]) : 1, tp = argc > 3 ? atoi(argv[3]) : 1;
	int plen = argc > 4 ? atoi(argv[4]) : 512, steps = argc > 5 ? atoi(argv[5]) : 64,
	    B = argc > 6 ? atoi(argv[6]) : 1;
	if (threads < 1 || tp < 1 || plen < 1 || steps < 0 || B < 1 || B > 256 || plen + steps > 64 * 256) {
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	struct model_opts o;
	model_opts_default(&o);
	o.n_threads = threads;
	o.tp = tp;
	o.quiet = true;
	struct errbuf e = {0};
	struct model *m;
	if (model_load(&m, argv[1], &o, &e)) {
		fprintf(stderr, "%s\n", e.msg);
		return 2;
	}
	const struct model_hparams *hp = model_hparams(m);
	int nb = (int)model_kv_blocks_for(plen + steps);
	struct model_kv kv;
	if (model_kv_init(&kv, m, (int64_t)nb * B, NULL, 0, &e)) {
		fprintf(stderr, "%s\n", e.msg);
		return 1;
	}
	struct model_seq *seqs = calloc((size_t)B, sizeof(*seqs));
	int32_t *tbl = malloc(sizeof(int32_t) * (size_t)(nb * B));
	for (int s = 0; s < B; s++) {
		for (int i = 0; i < nb; i++)
			tbl[s * nb + i] = s * nb + i;
		seqs[s] = (struct model_seq){.blocks = tbl + s * nb, .n_blocks = nb};
	}
	int chunk = plen < 512 ? plen : 512;
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)(chunk > B ? chunk : B)),
	        *pos = malloc(sizeof(int32_t) * (size_t)(chunk > B ? chunk : B));
	int32_t *sq = calloc((size_t)(chunk > B ? chunk : B), sizeof(int32_t));
	float *lg = malloc(sizeof(float) * (size_t)hp->vocab * (size_t)B);
	srand(1);
	double t0 = now();
	for (int s = 0; s < B; s++)
		for (int c0 = 0; c0 < plen; c0 += chunk) {
			int n = plen - c0 < chunk ? plen - c0 : chunk;
			for (int i = 0; i < n; i++) {
				tok[i] = rand() % (int)hp->vocab;
				pos[i] = c0 + i;
				sq[i] = s;
			}
			struct model_batch b = {
			    .n_tokens = n, .tokens = tok, .seq = sq, .pos = pos, .n_seqs = B, .seqs = seqs};
			if (model_forward(m, &kv, &b, lg, NULL, &e)) {
				fprintf(stderr, "%s\n", e.msg);
				return 1;
			}
		}
	double t1 = now();
	uint8_t want[256];
	memset(want, 1, sizeof(want));
	for (int st = 0; st < steps; st++) {
		for (int s = 0; s < B; s++) {
			tok[s] = rand() % (int)hp->vocab;
			pos[s] = plen + st;
			sq[s] = s;
		}
		struct model_batch b = {.n_tokens = B,
		                        .tokens = tok,
		                        .seq = sq,
		                        .pos = pos,
		                        .logits = want,
		                        .n_seqs = B,
		                        .seqs = seqs};
		if (model_forward(m, &kv, &b, lg, NULL, &e)) {
			fprintf(stderr, "%s\n", e.msg);
			return 1;
		}
	}
	double t2 = now();
	double mac = macs_per_token(hp);
	double keys = hp->has_indexer && hp->idx_topk < plen ? (double)hp->idx_topk : plen / 2.0;
	double att = (double)hp->n_layers * (double)hp->H * 2 * (double)(hp->C + hp->R) * keys;
	double pf = (double)plen * B / (t1 - t0), dc = steps ? (double)steps * B / (t2 - t1) : 0;
	printf("%s: %s, %d threads, TP=%d: prefill %d x %d tokens %.1f tok/s (%.2f GFLOP/s), decode batch %d "
	       "x %d steps "
	       "%.1f tok/s (%.2f GFLOP/s), %.1f ms/step; %.2f M weight MACs/token\n",
	       argv[1], model_arch_name(hp->arch), threads, tp, B, plen, pf, pf * 2 * (mac + att) * 1e-9, B,
	       steps, dc, dc * 2 * (mac + att) * 1e-9, steps ? (t2 - t1) * 1e3 / steps : 0, mac * 1e-6);
	free(tok);
	free(pos);
	free(sq);
	free(lg);
	free(tbl);
	free(seqs);
	model_kv_fini(&kv);
	model_destroy(m);
	return 0;
}
