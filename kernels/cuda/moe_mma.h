/* The tensor-core decode path of kcuda_moe_ffn (moe_mma.cu), internal to kernels/cuda: moe_ffn.cu
 * asks moe_mma_fits and, when it says yes, hands the whole op to moe_mma_ffn. */
#ifndef TANDEM_KERNELS_CUDA_MOE_MMA_H
#define TANDEM_KERNELS_CUDA_MOE_MMA_H

#include "kernels/cuda/cuda_common.cuh"

/* the largest token count of the path (its sort kernel has no host sync) */
#define MOE_MMA_MAX_TOKENS 256

/* the weight types moe_mma_ffn's units decode: Q4_K, Q5_K, Q6_K, Q8_0, and the codebook types IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (gemv_mma.cuh gm_unit_iq; their 1..4-token calls take the
 * sorted kernels, not moe_small.cu's, whose units are the first four's) */
bool moe_mma_type_ok(int t);
/* true when moe_mma_ffn takes this call: TANDEM_MOE_FAST unset or not "0", gate/up and down each
 * of moe_mma_type_ok's types, D and F multiples of 256, x 16-byte aligned with ldx % 4 == 0,
 * 1 <= n <= MOE_MMA_MAX_TOKENS, E <= 1024 and the workspace large enough. Arguments already
 * checked by kcuda_moe_ffn. */
bool moe_mma_fits(const struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, int k,
                  const struct kweight *gate, const struct kweight *up, const struct kweight *down, int64_t E,
                  int64_t F);
/* true when the shared expert can ride in the same launches as expert number E: gate / up / down
 * of the routed experts' types and row sizes, F rows (one routed expert's shape), 16-byte aligned */
bool moe_mma_fits_shared(const struct kweight *gate, const struct kweight *down, int64_t F,
                         const struct kweight *sh_gate, const struct kweight *sh_up,
                         const struct kweight *sh_down);
/* kcuda_moe_ffn's contract (kernels.h), no host sync; with sh_gate non-NULL (moe_mma_fits_shared)
 * the shared expert's output is added with weight 1 (kcuda_moe_ffn_shexp) */
int moe_mma_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo);
/* The small-batch variant (moe_small.cu): no sort and no combine launch, for 1..TANDEM_MOE_SMALL_MAX
 * tokens (default MOE_SMALL_DEFAULT_TOKENS, at most MOE_SMALL_MAX_TOKENS, and at most 80 (token,
 * expert) pairs counting the shared expert's); TANDEM_MOE_SMALL=0 turns it off. moe_mma_ffn hands
 * such calls to moe_small_ffn (same contract) when moe_small_fits says yes. */
/* H200: bench_cuda_moe (routed only, 16:15) small vs sorted path 25.0 / 27.7 us at batch 1, 32.0 /
 * 36.5 at 2, 55.8 / 57.2 at 4, 101.1 / 96.4 at 8; the batch-8 decode step then (2026-11-29 16:55,
 * graphs) 26.43 ms with the small path against 27.51 with the sorted one, so the limit was 8 tokens.
 * Against today's step (session 12, 2026-12-02, synthetic GLM-5 rank 0 of TP=8, ctx 4096) the sorted
 * path is faster from 6 tokens: batch 6 17.32 / 17.20 ms against 17.65 / 17.65, batch 8 16.68 / 16.81
 * against 17.03 / 17.06 (nsys, batch 8: gate/up + down 66 us a layer with sort and combine, against
 * 73 for the small path); batch 4 the same either way. So the limit is 4 tokens. */
#define MOE_SMALL_DEFAULT_TOKENS 4
#define MOE_SMALL_MAX_TOKENS 16
bool moe_small_fits(const struct kcuda_ctx *c, int64_t n, int k, bool shared, int64_t F);
int moe_small_ffn(struct kcuda_ctx *c, const float *x, int64_t ldx, int64_t n, const int32_t *ids,
                  const float *weights, int k, const struct kweight *gate, const struct kweight *up,
                  const struct kweight *down, int64_t E, int64_t F, const struct kweight *sh_gate,
                  const struct kweight *sh_up, const struct kweight *sh_down, float *out, int64_t ldo);
/* The batch-1 expert kernels (moe_one.cu): moe_small_ffn hands a 1-token call to them for Q4_K /
 * Q5_K experts (gate / up: D <= 8192; down: F 256, <= 9 pairs) as TANDEM_MOE_SMALL_V says: "old"
 * the moe_small kernels, "gu" only gate / up new, "new" both (and kcuda_moe_route_ffn1 folds the
 * route in), unset / "dn": only down new (the default since the 22:13 H200 run, moe_one.cu). Same
 * unit arithmetic as moe_small's one-tile kernels, the weights issued up front. */
#define MOE_ONE_GU 1
#define MOE_ONE_DN 2
struct moe_one_route { /* kcuda_moe_route's arguments for one token (kcuda_moe_route_ffn1) */
	const float *logits, *bias;
	int n_group, n_group_used, gating, norm;
	float scale;
	int32_t *ids;
	float *weights;
};
struct moe_one_args {
	const struct kweight *gate, *up, *down;
	const void *sg, *su, *sd; /* the shared expert's data, or NULL */
	const float *x, *w; /* x: the token (16-byte aligned); w: the k routing weights */
	const int32_t *ids;
	int64_t D, F;
	int E, np_r, np; /* pairs: np_r = k routed, np = k (+ 1 with the shared expert) */
	float *h, *out; /* h [np][F] (workspace), out [D] */
	const struct moe_one_route *route; /* non-NULL: the kernels route the token (ids unused) */
};
int moe_one_mode(void); /* MOE_ONE_* under TANDEM_MOE_SMALL_V */
bool moe_one_gate_up_fits(const struct kcuda_ctx *c, int type, int64_t D, int64_t F, int np);
bool moe_one_down_fits(int type, int64_t F, int np);
/* h[p][f] = SiLU(gate_p x) up_p x; -EINVAL when the fits say no */
int moe_one_gate_up(struct kcuda_ctx *c, const struct moe_one_args *a);
/* out = sum_j w_j down_{ids j} h_j (+ the shared expert's down h_k); must follow a gate / up launch
 * (moe_one_down_kernel's comment says why) */
int moe_one_down(struct kcuda_ctx *c, const struct moe_one_args *a);

/* The batch-1 MoE in one launch (moe_persist.cu): the route (a->route non-NULL) or the given ids, gate /
 * up, down and the combine, one block per SM resident through both halves with one grid barrier
 * between them; the same unit arithmetic as moe_one, sums over D grouped per block (bits differ from
 * moe_one's within the tolerance, deterministic for a given SM count). ERR_UNSUPPORTED with nothing
 * enqueued where it does not apply (off by default: TANDEM_MOE_PERSIST=1 turns it on; types other than
 * Q4_K / Q5_K, F != 256, more than MP_NP_MAX pairs, more shared memory than a block may have).
 * moe_small_ffn tries it first for one token (split 1), kcuda_moe_route_ffn1 before moe_one's route
 * fold. Measured slower in the H200 decode step than the route + gate / up + down kernels (PERFORMANCE.md,
 * session 8). */
bool moe_persist_on(void);
int moe_persist_ffn1(struct kcuda_ctx *c, const struct moe_one_args *a);
/* TANDEM_MOE_PERSIST_TRACE=1: every launch stamps its phases (%globaltimer, thread 0 of each block);
 * this prints the last launch's, min / median / max over the blocks (bench_cuda_moe one) */
void moe_persist_trace_print(struct kcuda_ctx *c);

/* The MoE decode path's L2 prefetch of expert weights, TANDEM_MOE_PF (default 0: off), a sum of:
 * MOE_PF_ROUTE: the fused router + route kernel prefetches the chosen experts' gate / up / down
 * (moe_route.cu, at most ~24 MB of them); MOE_PF_ROWS: the small path's gate / up and down blocks
 * prefetch their rows of their experts right after the wait; MOE_PF_DOWN: the gate / up blocks
 * prefetch a share of their routed experts' down matrices (<= 16 MB of them). 0: none. The
 * shared expert's prefetch before KDEP_ENTRY follows TANDEM_PREFETCH instead.
 * H200, 19:30 run (bench_cuda_moe layer chain, graph, us per layer, batch 1 / 2 / 4 / 8): mask 7
 * 113.7 / 48.6 / 78.9 / 135.9 against 29.0 / 45.9 / 75.2 / 130.2 with 0; the step at batch 1 15.4
 * against 8.98 ms. The bulk L2 prefetch goes through the issuing SM's copy engine: from the one last
 * block of the router kernel its ~21 MB took ~90 us (~250 GB/s), and inside the expert kernels the
 * blocks' own prefetches lengthened their tails. Hence off. */
#define MOE_PF_ROUTE 1
#define MOE_PF_ROWS 2
#define MOE_PF_DOWN 4
int moe_pf_mask(void);
/* the register route's experts per lane for these routing arguments, 0 where the register kernel
 * does not take them (moe_route.cu) */
int moe_route_reg_v(int E, int k, int n_group, int n_group_used);
/* The router product + route of 1..8 tokens in one launch, gemv3's product with the route in the
 * last block (moe_router_fuse.cu): kcuda_moe_router_route's contract; ERR_UNSUPPORTED with nothing
 * enqueued where it does not apply or unless TANDEM_MOE_ROUTE_FUSE=1 (moe_router_fuse_on: off by
 * default, no gain in the H200 step) */
int moe_router_fuse(struct kcuda_ctx *c, const struct kweight *router, const float *x, int64_t ldx, int64_t n,
                    float *logits, const float *bias, int E, int k, int n_group, int n_group_used, int gating,
                    bool norm, float scale, int32_t *ids, float *weights);
bool moe_router_fuse_on(void);
/* TANDEM_MOE_FAST=0 turns the path off (the pair / sorted / grouped kernels of moe_ffn.cu run) */
bool moe_mma_on(void);

#endif
