/* The prefill MoE path (kernels/cuda/moe_prefill.cu: GPU sort by expert, grouped mma.sync GEMMs
 * with the expert weights dequantized on the fly) against the CPU and against the old path:
 * 1. kcuda_moe_prefill vs the CPU chain of forward.c (per expert: kcpu_matmul gate / up of its
 *    tokens, kcpu_swiglu, kcpu_matmul down, weighted sum over the slots): bf16 products, so max
 *    error <= 2e-2 * max|ref| (the old prefill path's tolerance in test_ops_moe); shapes: small ones
 *    of many weight types, E 256 k 8 (the sort), GLM-5 / DeepSeek-V3 TP=8 slices (D 6144 / 7168,
 *    F 256), odd sizes (D, F not multiples of 64; ldx, ldo > D; x not 16-byte aligned), skewed
 *    routing so some experts take several 64-pair tiles; n 64, 512 (2048 outside QUICK mode).
 * 2. Deterministic: a second run gives the same bits; a context with a small workspace (the path
 *    runs the prompt in token chunks) gives the same bits too, and so does every gate / up kernel
 *    (TANDEM_MOE_PREFILL_GU=8: 8 warps), the scalar combine
 *    (TANDEM_MOE_PREFILL_COMBINE=1) and the 4-warp down kernel
 *    (TANDEM_MOE_PREFILL_DOWN=4). The main context has the model
 *    backend's 256 MiB workspace (2048 tokens x 8 pairs of GLM-5 run as 2 chunks there too).
 * 3. Through kcuda_moe_ffn (n > 256, or any n with TANDEM_MOE_MMA_MIN=1: the hook in
 *    moe_ffn.cu) the same bits; with TANDEM_PREFILL_FAST=0 the old path (per-expert cuBLAS past
 *    256 tokens, the sorted fp32 path from 17, the pair kernels below), within the bf16 tolerance.
 * 4. An expert id out of range: counted (kcuda_ctx_take_errors), NaN in that token's row only.
 * 5. The shared expert in the same pass (kcuda_moe_ffn_shexp at prompt sizes): against the CPU's
 *    routed sum + shared expert (Fs equal to F and not), deterministic, chunked, and a mismatched
 *    shared down refused with nothing written.
 * 5. Time of new vs old path at the GLM-5 TP=8 and TP=1 expert shapes, 1 .. 2048 tokens
 *    (printed; no check).
 * Guard bytes around the outputs. TANDEM_OPS_QUICK=1: the small sweep only (a few seconds).
 * Exit 77 = no GPU (skip). */
#include <errno.h>
#include <sys/time.h>

#include "common/base/err.h"
#include "tests/ops/ops_util.h"

#ifndef TANDEM_CUDA
int main(void)
{
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/cuda/moe_prefill.h"

static struct kcuda_ctx *ctx, *ctx_small;
static struct kpool *pool;

struct pcase {
	int tg, td; /* gate/up type, down type */
	int64_t E, F, D;
	int k, n;
	int64_t xpad, opad; /* ldx = D + xpad, ldo = D + opad */
	int cpu; /* check against the CPU (else only against the old path) */
	int timing;
	int64_t Fs; /* > 0 (with cpu): also the shared expert of Fs rows (kcuda_moe_ffn_shexp) */
};

static double now_s(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* max |a - b| over finite pairs, max |b|, and the count of non-finite a */
static void cmp(const float *a, const float *b, int64_t n, int64_t D, int64_t lda, int64_t ldb,
                double *maxerr, double *maxref, int64_t *nonfin)
{
	*maxerr = *maxref = 0;
	*nonfin = 0;
	for (int64_t i = 0; i < n; i++)
		for (int64_t d = 0; d < D; d++) {
			const double x = a[i * lda + d], r = b[i * ldb + d];
			if (!isfinite(x)) {
				(*nonfin)++;
				continue;
			}
			*maxref = fabs(r) > *maxref ? fabs(r) : *maxref;
			*maxerr = fabs(x - r) > *maxerr ? fabs(x - r) : *maxerr;
		}
}

/* forward.c's expert chain on the CPU, grouped by expert (kcpu_matmul over the expert's tokens) */
static void cpu_ref(const struct pcase *p, const struct kweight *g, const struct kweight *u,
                    const struct kweight *dn, const float *x, const int32_t *ids, const float *w, float *ref)
{
	const int64_t E = p->E, F = p->F, D = p->D, ldx = D + p->xpad;
	const int n = p->n, k = p->k;
	float *xs = malloc(sizeof(float) * (size_t)n * (size_t)D),
	      *t1 = malloc(sizeof(float) * (size_t)n * F), *t2 = malloc(sizeof(float) * (size_t)n * F),
	      *ys = malloc(sizeof(float) * (size_t)n * D);
	int *tok = malloc(sizeof(int) * (size_t)n), *slot = malloc(sizeof(int) * (size_t)n);
	memset(ref, 0, sizeof(float) * (size_t)n * (size_t)D);
	for (int64_t e = 0; e < E; e++) {
		int m = 0;
		for (int i = 0; i < n; i++)
			for (int j = 0; j < k; j++)
				if (ids[i * k + j] == e) {
					tok[m] = i;
					slot[m] = j;
					memcpy(xs + (int64_t)m * D, x + i * ldx, sizeof(float) * (size_t)D);
					m++;
				}
		if (!m)
			continue;
		struct kweight eg = *g, eu = *u, ed = *dn;
		eg.n_out = eu.n_out = F;
		ed.n_out = D;
		eg.data = (const uint8_t *)g->data + (size_t)e * (size_t)F * g->row_bytes;
		eu.data = (const uint8_t *)u->data + (size_t)e * (size_t)F * u->row_bytes;
		ed.data = (const uint8_t *)dn->data + (size_t)e * (size_t)D * dn->row_bytes;
		kcpu_matmul(pool, &eg, xs, D, m, t1, F);
		kcpu_matmul(pool, &eu, xs, D, m, t2, F);
		kcpu_swiglu(t1, t1, t2, (int64_t)m * F);
		kcpu_matmul(pool, &ed, t1, F, m, ys, D);
		for (int r = 0; r < m; r++)
			for (int64_t d = 0; d < D; d++)
				ref[(int64_t)tok[r] * D + d] +=
				    w[tok[r] * k + slot[r]] * ys[(int64_t)r * D + d];
	}
	free(xs);
	free(t1);
	free(t2);
	free(ys);
	free(tok);
	free(slot);
}

/* ms per call of kcuda_moe_ffn (after one warm-up), synchronised */
static double time_ffn(const float *d_x, int64_t ldx, int n, const int32_t *d_ids, const float *d_w, int k,
                       const struct kweight *dg, const struct kweight *du, const struct kweight *dd,
                       int64_t E, int64_t F, float *out, int64_t ldo, int reps)
{
	if (kcuda_moe_ffn(ctx, d_x, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, out, ldo) || kcuda_sync(ctx))
		return -1;
	double t = now_s();
	for (int r = 0; r < reps; r++)
		if (kcuda_moe_ffn(ctx, d_x, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, out, ldo))
			return -1;
	if (kcuda_sync(ctx))
		return -1;
	return 1e3 * (now_s() - t) / reps;
}

/* The shared expert (Fs rows, types tg / td) riding in the prefill pass: kcuda_moe_ffn_shexp (through
 * kcuda_moe_ffn's prefill hook) against the CPU's routed sum (ref) + the CPU shared expert, added in
 * forward.c's order; the same bits again and in token chunks; shapes the pass refuses leave out alone */
static void shared_case(const struct pcase *p, const char *name, const struct kweight *dg,
                        const struct kweight *du, const struct kweight *dd, const float *dx,
                        const void *d_ids, const void *d_w, const float *x, const float *ref,
                        struct ops_dbuf *ob)
{
	const int64_t E = p->E, F = p->F, D = p->D, Fs = p->Fs, ldx = D + p->xpad, ldo = D + p->opad;
	const int n = p->n, k = p->k;
	/* the odd-size case's shared gate / up and down are F16 (the routed ones Q8_0): launches of their own
	 */
	const int tgs = Fs == 160 ? KT_F16 : p->tg, tds = Fs == 160 ? KT_F16 : p->td;
	size_t rb_d = 0, rb_s = 0;
	if (!ktype_row_bytes(tgs, D, &rb_d) || !ktype_row_bytes(tds, Fs, &rb_s)) {
		OPS_CHECK(0, "%s: shared Fs %lld not whole blocks", name, (long long)Fs);
		return;
	}
	const size_t out_bytes = sizeof(float) * (size_t)n * (size_t)ldo;
	uint8_t *hg = malloc(rb_d * (size_t)Fs), *hu = malloc(rb_d * (size_t)Fs),
	        *hd = malloc(rb_s * (size_t)D);
	float *t1 = malloc(sizeof(float) * (size_t)n * (size_t)Fs),
	      *t2 = malloc(sizeof(float) * (size_t)n * (size_t)Fs),
	      *ys = malloc(sizeof(float) * (size_t)n * (size_t)D),
	      *want = malloc(sizeof(float) * (size_t)n * (size_t)D), *got = malloc(out_bytes),
	      *got2 = malloc(out_bytes);
	struct kweight sg = {tgs, D, Fs, rb_d, hg}, su = {tgs, D, Fs, rb_d, hu}, sd = {tds, Fs, D, rb_s, hd};
	struct kweight dsg = {0}, dsu = {0}, dsd = {0};
	if (!hg || !hu || !hd || !t1 || !t2 || !ys || !want || !got || !got2) {
		OPS_CHECK(0, "%s: shared: host allocation", name);
		goto out;
	}
	ops_fill_weight(tgs, D, Fs, rb_d, hg);
	ops_fill_weight(tgs, D, Fs, rb_d, hu);
	ops_fill_weight(tds, Fs, D, rb_s, hd);
	if (kcuda_weight_upload(ctx, &sg, &dsg) || kcuda_weight_upload(ctx, &su, &dsu) ||
	    kcuda_weight_upload(ctx, &sd, &dsd)) {
		OPS_CHECK(0, "%s: shared: device allocation", name);
		goto out;
	}
	kcpu_matmul(pool, &sg, x, ldx, n, t1, Fs);
	kcpu_matmul(pool, &su, x, ldx, n, t2, Fs);
	kcpu_swiglu(t1, t1, t2, (int64_t)n * Fs);
	kcpu_matmul(pool, &sd, t1, Fs, n, ys, D);
	for (int64_t i = 0; i < (int64_t)n * D; i++)
		want[i] = ref[i] + ys[i];
	if (n <= 256)
		setenv("TANDEM_MOE_MMA_MIN", "1", 1);
	int rc = kcuda_moe_ffn_shexp(ctx, dx, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, &dsg, &dsu, &dsd,
	                             ob->user, ldo);
	unsetenv("TANDEM_MOE_MMA_MIN");
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "%s: shared Fs %lld: rc %d", name, (long long)Fs, rc);
	size_t gb = ops_dbuf_get(ctx, ob, got);
	OPS_CHECK(gb == 0, "%s: shared: %zu guard bytes damaged", name, gb);
	int64_t gaps = 0;
	for (int i = 0; i < n; i++)
		for (int64_t d = D; d < ldo; d++)
			gaps += !ops_is_fill_f32(got[i * ldo + d]);
	OPS_CHECK(gaps == 0, "%s: shared: %lld values written past D", name, (long long)gaps);
	double maxerr, maxref;
	int64_t nf;
	cmp(got, want, n, D, ldo, D, &maxerr, &maxref, &nf);
	OPS_CHECK(nf == 0 && maxerr <= 2e-2 * maxref && maxref > 0,
	          "%s: shared Fs %lld: max err %.3g, max|ref| %.3g (tol 2e-2), %lld non-finite", name,
	          (long long)Fs, maxerr, maxref, (long long)nf);
	printf("%s: + shared Fs %lld vs CPU max|ref| %.3g max err %.3g (rel %.2g)\n", name, (long long)Fs,
	       maxref, maxerr, maxref > 0 ? maxerr / maxref : 0.0);
	/* the same bits again, and in token chunks */
	rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, &dsg, &dsu, &dsd, ob->user,
	                       ldo);
	OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, ob, got2) == 0 && memcmp(got, got2, out_bytes) == 0,
	          "%s: shared: a second run differs (rc %d)", name, rc);
	rc = kcuda_moe_prefill(ctx_small, dx, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, &dsg, &dsu, &dsd,
	                       ob->user, ldo);
	if (rc != ERR_UNSUPPORTED) {
		OPS_CHECK(rc == 0 && kcuda_sync(ctx_small) == 0, "%s: shared: chunked rc %d", name, rc);
		memset(got2, 0, out_bytes);
		OPS_CHECK(ops_dbuf_get(ctx, ob, got2) == 0 && memcmp(got, got2, out_bytes) == 0,
		          "%s: shared: the chunked run differs", name);
	}
	/* a shared expert whose down does not match its gate: refused, nothing written */
	{
		struct kweight bad = dsd;
		bad.n_in = Fs + 16;
		kcuda_upload(ctx, ob->user, got, out_bytes); /* a known output to keep */
		rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, dg, du, dd, E, F, &dsg, &dsu, &bad,
		                       ob->user, ldo);
		OPS_CHECK(rc == ERR_UNSUPPORTED && ops_dbuf_get(ctx, ob, got2) == 0 &&
		              memcmp(got, got2, out_bytes) == 0,
		          "%s: a mismatched shared down was not refused cleanly (rc %d)", name, rc);
	}
out:
	kcuda_weight_free(&dsg);
	kcuda_weight_free(&dsu);
	kcuda_weight_free(&dsd);
	free(hg);
	free(hu);
	free(hd);
	free(t1);
	free(t2);
	free(ys);
	free(want);
	free(got);
	free(got2);
}

static void prefill_case(const struct pcase *p)
{
	const int64_t E = p->E, F = p->F, D = p->D, ldx = D + p->xpad, ldo = D + p->opad;
	const int n = p->n, k = p->k;
	size_t rb_d = 0, rb_f = 0;
	if (!ktype_row_bytes(p->tg, D, &rb_d) || !ktype_row_bytes(p->td, F, &rb_f)) {
		OPS_CHECK(0, "case %s/%s D %lld F %lld: not whole blocks", ktype_name(p->tg),
		          ktype_name(p->td), (long long)D, (long long)F);
		return;
	}
	const size_t out_bytes = sizeof(float) * (size_t)n * (size_t)ldo;
	uint8_t *hg = malloc(rb_d * (size_t)(E * F)), *hu = malloc(rb_d * (size_t)(E * F)),
	        *hd = malloc(rb_f * (size_t)(E * D));
	/* one spare float in front so x can be misaligned on the device (xpad odd) */
	float *x = malloc(sizeof(float) * ((size_t)n * (size_t)ldx + 1)),
	      *w = malloc(sizeof(float) * (size_t)n * k);
	float *ref = malloc(sizeof(float) * (size_t)n * (size_t)D), *got = malloc(out_bytes),
	      *got2 = malloc(out_bytes), *old = malloc(out_bytes);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
	struct kweight g = {p->tg, D, E * F, rb_d, hg}, u = {p->tg, D, E * F, rb_d, hu},
	               dn = {p->td, F, E * D, rb_f, hd};
	struct kweight dg = {0}, du = {0}, dd = {0};
	void *d_x = NULL, *d_ids = NULL, *d_w = NULL;
	struct ops_dbuf ob = {0};
	char name[160];
	snprintf(name, sizeof(name), "moe prefill %s/%s E %lld k %d F %lld D %lld n %d%s", ktype_name(p->tg),
	         ktype_name(p->td), (long long)E, k, (long long)F, (long long)D, n,
	         p->xpad || p->opad ? " (ldx, ldo > D)" : "");
	if (!hg || !hu || !hd || !x || !w || !ref || !got || !got2 || !old || !ids) {
		OPS_CHECK(0, "%s: host allocation", name);
		goto out;
	}
	ops_fill_weight(p->tg, D, E * F, rb_d, hg);
	ops_fill_weight(p->tg, D, E * F, rb_d, hu);
	ops_fill_weight(p->td, F, E * D, rb_f, hd);
	for (size_t i = 0; i < (size_t)n * (size_t)ldx + 1; i++)
		x[i] = ops_rng_unif();
	for (int i = 0; i < n; i++)
		for (int j = 0; j < k; j++) {
			int32_t e;
			int dup;
			do { /* distinct experts per token; a third of the picks go to 4 hot experts */
				e = (int32_t)(ops_rng_next() % (uint64_t)E);
				if (ops_rng_next() % 3 == 0)
					e = (int32_t)(ops_rng_next() % (uint64_t)(E < 4 ? E : 4));
				dup = 0;
				for (int jj = 0; jj < j; jj++)
					dup |= ids[i * k + jj] == e;
			} while (dup);
			ids[i * k + j] = e;
			w[i * k + j] = ops_rng_unif() + 1.5f;
		}
	const size_t xb = sizeof(float) * ((size_t)n * (size_t)ldx + 1);
	if (kcuda_weight_upload(ctx, &g, &dg) || kcuda_weight_upload(ctx, &u, &du) ||
	    kcuda_weight_upload(ctx, &dn, &dd) || kcuda_alloc(xb, &d_x) ||
	    kcuda_alloc(sizeof(int32_t) * (size_t)n * k, &d_ids) ||
	    kcuda_alloc(sizeof(float) * (size_t)n * k, &d_w) || ops_dbuf_init(ctx, &ob, out_bytes)) {
		OPS_CHECK(0, "%s: device allocation", name);
		goto out;
	}
	/* x on the device starts one float in when xpad is odd (not 16-byte aligned) */
	const int xoff = p->xpad % 2;
	const float *dx = (const float *)d_x + xoff;
	kcuda_upload(ctx, d_x, x, xb);
	kcuda_upload(ctx, d_ids, ids, sizeof(int32_t) * (size_t)n * k);
	kcuda_upload(ctx, d_w, w, sizeof(float) * (size_t)n * k);

	/* 1. against the CPU */
	unsigned nbad = 0;
	int rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, NULL, NULL, NULL,
	                           ob.user, ldo);
	OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0, "%s: rc %d", name, rc);
	size_t gb = ops_dbuf_get(ctx, &ob, got);
	OPS_CHECK(gb == 0, "%s: %zu guard bytes damaged", name, gb);
	kcuda_ctx_take_errors(ctx, &nbad);
	OPS_CHECK(nbad == 0, "%s: %u bad inputs counted", name, nbad);
	int64_t gaps = 0; /* ldo > D: the columns past D are not written */
	for (int i = 0; i < n; i++)
		for (int64_t d = D; d < ldo; d++)
			gaps += !ops_is_fill_f32(got[i * ldo + d]);
	OPS_CHECK(gaps == 0, "%s: %lld values written past D", name, (long long)gaps);
	double maxerr = 0, maxref = 0;
	int64_t nf = 0;
	if (p->cpu) {
		double t = now_s();
		cpu_ref(p, &g, &u, &dn, x + xoff, ids, w, ref);
		t = now_s() - t;
		cmp(got, ref, n, D, ldo, D, &maxerr, &maxref, &nf);
		OPS_CHECK(nf == 0, "%s: %lld non-finite", name, (long long)nf);
		OPS_CHECK(maxerr <= 2e-2 * maxref && maxref > 0, "%s: max err %.3g, max|ref| %.3g (tol 2e-2)",
		          name, maxerr, maxref);
		printf("%s: vs CPU max|ref| %.3g max err %.3g (rel %.2g; CPU %.1f s)\n", name, maxref, maxerr,
		       maxref > 0 ? maxerr / maxref : 0.0, t);
	}

	/* 2. the same bits again, and in token chunks (small workspace) */
	rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, NULL, NULL, NULL, ob.user,
	                       ldo);
	OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, &ob, got2) == 0 && memcmp(got, got2, out_bytes) == 0,
	          "%s: a second run differs (rc %d)", name, rc);
	rc = kcuda_moe_prefill(ctx_small, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, NULL, NULL, NULL,
	                       ob.user, ldo);
	if (rc == ERR_UNSUPPORTED) {
		printf("%s: a 16 MB workspace is too small for 32-token chunks (not run chunked)\n", name);
	} else {
		OPS_CHECK(rc == 0 && kcuda_sync(ctx_small) == 0, "%s: chunked rc %d", name, rc);
		memset(got2, 0, out_bytes);
		OPS_CHECK(ops_dbuf_get(ctx, &ob, got2) == 0 && memcmp(got, got2, out_bytes) == 0,
		          "%s: the chunked run (small workspace) differs", name);
	}

	/* 2b. every gate / up, combine and down kernel gives the default's bits */
	{
		static const char *const alt[][3] = {
		    {"TANDEM_MOE_PREFILL_GU", "8", "the 8-warp gate / up"},
		    {"TANDEM_MOE_PREFILL_COMBINE", "1", "the scalar combine"},
		    {"TANDEM_MOE_PREFILL_DOWN", "4", "the 4-warp down"}};
		for (size_t v = 0; v < sizeof(alt) / sizeof(alt[0]); v++) {
			setenv(alt[v][0], alt[v][1], 1);
			memset(got2, 0, out_bytes);
			rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, NULL,
			                       NULL, NULL, ob.user, ldo);
			unsetenv(alt[v][0]);
			OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, &ob, got2) == 0 &&
			              memcmp(got, got2, out_bytes) == 0,
			          "%s: %s kernel differs from the default (rc %d)", name, alt[v][2], rc);
		}
	}

	/* 3. through kcuda_moe_ffn: the same bits past the batched-decode sizes (or from
	 * TANDEM_MOE_MMA_MIN tokens); the old path close */
	{
		if (n <= 256)
			setenv("TANDEM_MOE_MMA_MIN", "1", 1);
		rc = kcuda_moe_ffn(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, ob.user, ldo);
		OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, &ob, got2) == 0 && memcmp(got, got2, out_bytes) == 0,
		          "%s: kcuda_moe_ffn does not take the prefill path (rc %d)", name, rc);
		unsetenv("TANDEM_MOE_MMA_MIN");
	}
	setenv("TANDEM_PREFILL_FAST", "0", 1);
	rc = kcuda_moe_ffn(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, ob.user, ldo);
	OPS_CHECK(rc == 0 && ops_dbuf_get(ctx, &ob, old) == 0, "%s: old path rc %d", name, rc);
	cmp(got, old, n, D, ldo, ldo, &maxerr, &maxref, &nf);
	OPS_CHECK(nf == 0 && maxerr <= 2e-2 * maxref, "%s: vs the old path max err %.3g, max|old| %.3g", name,
	          maxerr, maxref);
	printf("%s: vs old path max err %.3g (rel %.2g)\n", name, maxerr, maxref > 0 ? maxerr / maxref : 0.0);
	if (p->timing) {
		const int reps = n >= 2048 ? 3 : 5;
		double t_old = time_ffn(dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, ob.user, ldo, reps);
		unsetenv("TANDEM_PREFILL_FAST");
		setenv("TANDEM_MOE_MMA_MIN", "1", 1); /* n <= 256: the new path, not the batched-decode one */
		double t_new = time_ffn(dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, ob.user, ldo, reps);
		unsetenv("TANDEM_MOE_MMA_MIN");
		const double flop = 2.0 * 3.0 * (double)n * k * (double)F * (double)D;
		printf("%s: TIME new %.3f ms (%.1f TFLOP/s), old (%s) %.3f ms (%.1f TFLOP/s): %.1fx\n", name,
		       t_new, flop / (t_new * 1e-3) / 1e12,
		       n <= 16    ? "pairs"
		       : n <= 256 ? "sorted"
		                  : "per-expert cuBLAS",
		       t_old, flop / (t_old * 1e-3) / 1e12, t_new > 0 ? t_old / t_new : 0.0);
		OPS_CHECK(t_new > 0 && t_old > 0, "%s: timing runs failed", name);
	}
	unsetenv("TANDEM_PREFILL_FAST");

	/* 5. the shared expert in the same pass (before 4, which spoils an id) */
	if (p->Fs > 0 && p->cpu)
		shared_case(p, name, &dg, &du, &dd, dx, d_ids, d_w, x + xoff, ref, &ob);

	/* 4. a bad expert id: counted, NaN in its token's row, the other rows as before */
	if (n > 5) {
		int32_t bad = (int32_t)E;
		kcuda_upload(ctx, (int32_t *)d_ids + 5 * k + (k > 1), &bad, sizeof(int32_t));
		rc = kcuda_moe_prefill(ctx, dx, ldx, n, d_ids, d_w, k, &dg, &du, &dd, E, F, NULL, NULL, NULL,
		                       ob.user, ldo);
		nbad = 0;
		OPS_CHECK(rc == 0 && kcuda_sync(ctx) == 0 && kcuda_ctx_take_errors(ctx, &nbad) == 0 &&
		              nbad > 0,
		          "%s: bad expert id not counted (rc %d)", name, rc);
		OPS_CHECK(ops_dbuf_get(ctx, &ob, got2) == 0, "%s: guard bytes (bad id)", name);
		int64_t nan5 = 0, diff = 0;
		for (int i = 0; i < n; i++)
			for (int64_t d = 0; d < D; d++) {
				const float v = got2[i * ldo + d];
				if (i == 5)
					nan5 += isnan(v);
				else
					diff += memcmp(&v, &got[i * ldo + d], 4) != 0;
			}
		OPS_CHECK(nan5 == D && diff == 0,
		          "%s: bad id: %lld of %lld NaN in its row, %lld changed elsewhere", name,
		          (long long)nan5, (long long)D, (long long)diff);
	}
out:
	kcuda_weight_free(&dg);
	kcuda_weight_free(&du);
	kcuda_weight_free(&dd);
	kcuda_free(d_x);
	kcuda_free(d_ids);
	kcuda_free(d_w);
	ops_dbuf_fini(&ob);
	free(hg);
	free(hu);
	free(hd);
	free(x);
	free(w);
	free(ref);
	free(got);
	free(got2);
	free(old);
	free(ids);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	const int quick = getenv("TANDEM_OPS_QUICK") != NULL;
	ops_seed_init();
	if (kcuda_ctx_create(0, 256u << 20, &ctx) || kcuda_ctx_create(0, 16u << 20, &ctx_small)) {
		printf("FAIL: no CUDA context\n");
		return 1;
	}
	pool = kpool_create(8);
	/* many types, small shapes */
	static const int types[][2] = {{KT_Q8_0, KT_Q8_0},     {KT_Q4_K, KT_Q6_K},   {KT_Q4_K, KT_Q4_K},
	                               {KT_Q5_K, KT_Q5_K},     {KT_Q6_K, KT_Q6_K},   {KT_BF16, KT_BF16},
	                               {KT_F32, KT_F16},       {KT_IQ4_XS, KT_Q8_0}, {KT_Q2_K, KT_Q3_K},
	                               {KT_IQ2_XXS, KT_IQ3_S}, {KT_IQ1_M, KT_IQ2_S}, {KT_IQ1_S, KT_IQ3_XXS},
	                               {KT_IQ2_XS, KT_Q4_K}};
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		const struct pcase c = {types[t][0], types[t][1], 12, 256, 512, 4, 64, 0, 0, 1, 0, 256};
		prefill_case(&c);
	}
	const struct pcase cases[] = {
	    /* odd sizes: D 544 (17 Q8_0 blocks), F 96 (3); ldx, ldo > D; x misaligned; every expert's tiles
	     */
	    {KT_Q8_0, KT_Q8_0, 5, 96, 544, 3, 70, 3, 5, 1, 0, 160},
	    {KT_Q8_0, KT_Q8_0, 5, 96, 544, 3, 300, 4, 1, 1, 0, 0},
	    /* E 256, k 8: the sort over many experts (GLM-5 / DeepSeek-V3 routing counts) */
	    {KT_Q4_K, KT_Q6_K, 256, 256, 512, 8, 512, 0, 0, 1, 0, 512},
	    /* GLM-5 TP=8 rank slice: D 6144, F 2048 / 8 (32 of the 256 experts, memory of the CPU test) */
	    {KT_Q4_K, KT_Q4_K, 32, 256, 6144, 8, 64, 0, 0, 1, 0, 256},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		prefill_case(&cases[i]);
	if (!quick) {
		const struct pcase big[] = {
		    /* GLM-5 / DeepSeek-V3 TP=8 slices at prompt sizes */
		    {KT_Q4_K, KT_Q4_K, 32, 256, 6144, 8, 512, 0, 0, 1, 1, 256},
		    {KT_Q4_K, KT_Q6_K, 32, 256, 7168, 8, 512, 0, 0, 1, 0, 0},
		    /* all 256 experts of the GLM-5 rank at 2048 tokens: against the old path, timed */
		    {KT_Q4_K, KT_Q4_K, 256, 256, 6144, 8, 2048, 0, 0, 0, 1, 0},
		    /* the same at decode sizes: against the sorted / pair kernels (TANDEM_MOE_MMA_MIN=1) */
		    {KT_Q4_K, KT_Q4_K, 256, 256, 6144, 8, 128, 0, 0, 0, 1, 0},
		    {KT_Q4_K, KT_Q4_K, 256, 256, 6144, 8, 32, 0, 0, 0, 1, 0},
		    {KT_Q4_K, KT_Q4_K, 256, 256, 6144, 8, 8, 0, 0, 0, 1, 0},
		    {KT_Q4_K, KT_Q4_K, 256, 256, 6144, 8, 1, 0, 0, 0, 1, 0},
		    /* GLM-5 TP=1 expert dims (F 2048), 32 experts: against the old path, timed */
		    {KT_Q4_K, KT_Q4_K, 32, 2048, 6144, 8, 512, 0, 0, 0, 1, 0},
		};
		for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
			prefill_case(&big[i]);
	}
	kpool_destroy(pool);
	kcuda_ctx_destroy(ctx_small);
	kcuda_ctx_destroy(ctx);
	printf("%d checks, %d failed\n", ops_n_check, ops_n_fail);
	return ops_n_fail ? 1 : 0;
}
#endif
