/* Shared between the files of `tandem mkmodel` (cmd_mkmodel.c: options and metadata,
 * mkmodel_vocab.c: tokenizer keys, mkmodel_weights.c: tensor list and random weights). */
#ifndef TANDEM_CLI_MKMODEL_H
#define TANDEM_CLI_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gguf/gguf.h"

/* Shapes of one model (names as MODEL-SPEC.md §0.2). */
struct mk_config {
	const char *preset; /* tiny, glm5, deepseek3 */
	const char *arch; /* GGUF architecture: glm-dsa or deepseek2 */
	int64_t D, n_ff, H, Cq, C, N, R, V, E, k, F, n_shared, n_group, n_group_used;
	int64_t HI, DI, K; /* indexer (HI = 0: none) */
	int64_t vocab;
	int n_layers; /* main layers */
	int n_dense; /* leading dense layers */
	int nextn; /* MTP layers written after the main layers (0 or 1) */
	int idx_every; /* layer l has a full indexer iff l % idx_every == 0 (1: all) */
	int64_t n_ctx;
	float theta, eps;
	bool yarn;
	float yarn_factor, yarn_log_mul;
	int64_t yarn_orig_ctx;
	const char *tokenizer_from; /* copy tokenizer.* keys from this GGUF instead of synthesizing */
};

/* Weight type mix: a named mix or one type for every matrix that allows it, then per-role
 * overrides (`--type q4_k,exps=iq2_xxs,down_exps=iq3_xxs`). */
enum mk_mix { MK_MIX_Q4_K, MK_MIX_SINGLE };

/* The roles a --type override names (mkmodel_role_names spells them) */
enum mk_role {
	MK_ROLE_ATTN, /* q_a, q_b, kv_a_mqa, k_b, v_b, attn_output, nextn eh_proj */
	MK_ROLE_INDEXER, /* indexer.attn_q_b, indexer.attn_k */
	MK_ROLE_EMBD, /* token_embd */
	MK_ROLE_OUTPUT, /* output (the lm head) */
	MK_ROLE_FFN, /* the dense layers' gate / up / down */
	MK_ROLE_SHEXP, /* the shared expert's gate / up / down */
	MK_ROLE_GATE_EXPS,
	MK_ROLE_UP_EXPS,
	MK_ROLE_DOWN_EXPS,
	MK_ROLE_COUNT
};
extern const char *const mkmodel_role_names[MK_ROLE_COUNT];

struct mk_types {
	enum mk_mix mix;
	int single; /* ktype for MK_MIX_SINGLE */
	int role[MK_ROLE_COUNT]; /* a ktype where overridden, else -1 (mk_types_init) */
};

/* The base mix with no overrides */
void mk_types_init(struct mk_types *t);

enum mk_init { MK_INIT_NORMAL, MK_INIT_UNIFORM };

/* One tensor to generate: every row is a pure function of (seed, name, row index), so the output
 * does not depend on chunking or the number of threads. */
struct mk_tensor {
	char name[96];
	int type;
	int n_dims;
	int64_t ne[4];
	enum mk_init init;
	float a, b; /* normal: mean a, std b; uniform: [a, b) */
	uint64_t seed;
	int n_threads;
	size_t row_bytes;
};

/* Builds the tensor list of the config (caller frees *out). */
int mkmodel_tensors(const struct mk_config *c, const struct mk_types *t, uint64_t seed, int n_threads,
                    struct mk_tensor **out, int *n_out, char *err, size_t err_size);
/* gguf_fill_chunk_cb for a struct mk_tensor (user). */
int mkmodel_fill(void *user, const char *name, uint64_t offset, void *dst, size_t nbytes);

/* Writes the tokenizer.* keys: copied from c->tokenizer_from, or synthesized for the preset
 * (byte-level BPE: 256 byte tokens, merges for common words, the special tokens at their real
 * ids, [PAD<id>] fill to c->vocab). */
int mkmodel_vocab(struct gguf_writer *w, const struct mk_config *c, char *err, size_t err_size);

#endif
