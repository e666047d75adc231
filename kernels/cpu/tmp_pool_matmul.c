/* TEMPORARY stand-in for kernels/cpu/pool.c and matmul.c (owned by the `quant` helper) so the
 * model builds and runs before those land: a single-threaded pool and a row-loop matmul.
 * Delete this file when merging the quant branch's pool/matmul. */
#include <stdlib.h>

#include "kernels/kernels.h"

struct kpool {
	int n;
};

struct kpool *kpool_create(int n_threads)
{
	(void)n_threads;
	struct kpool *p = calloc(1, sizeof(*p));
	if (p)
		p->n = 1;
	return p;
}

void kpool_destroy(struct kpool *p)
{
	free(p);
}

int kpool_n_threads(const struct kpool *p)
{
	return p->n;
}

void kpool_for(struct kpool *p, int64_t n, int64_t grain, kpool_fn fn, void *user)
{
	(void)p, (void)grain;
	if (n > 0)
		fn(user, 0, n, 0);
}

void kcpu_matmul(struct kpool *p, const struct kweight *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
		 int64_t ldy)
{
	(void)p;
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t r = 0; r < w->n_out; r++)
			y[t * ldy + r] = kcpu_dot_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, x + t * ldx,
						      w->n_in);
}
