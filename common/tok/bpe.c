/* The BPE merge loop over one pre-tokenizer piece. Symbols start as one per byte (the byte's
 * byte-level token) in a doubly linked list; candidate merges of neighbours sit in a binary
 * min-heap ordered by (rank, position), so the lowest-ranked pair is merged first and ties go to
 * the leftmost, as in HF tokenizers. Stale heap entries (a side already merged away) are skipped
 * when popped. Each merge removes one symbol and pushes at most two entries, so a piece of n
 * bytes costs O(n log n) whatever its content: no quadratic rescans on long pieces. */
#include <stdlib.h>
#include <string.h>

#include "common/tok/tok_internal.h"

struct tok_bpe_sym {
	int32_t id; /* -1: merged into its left neighbour */
	int32_t prev, next;
};

struct tok_bpe_ent {
	uint32_t rank;
	uint32_t pos;
	int32_t new_id;
};

void tok_bpe_work_free(struct tok_bpe_work *w)
{
	free(w->sym);
	free(w->heap);
	memset(w, 0, sizeof(*w));
}

static bool ent_less(const struct tok_bpe_ent *a, const struct tok_bpe_ent *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_bpe_work *w, struct tok_bpe_ent x)
{
	size_t i = w->n_heap++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!ent_less(&x, &w->heap[p]))
			break;
		w->heap[i] = w->heap[p];
		i = p;
	}
	w->heap[i] = x;
}

static struct tok_bpe_ent heap_pop(struct tok_bpe_work *w)
{
	struct tok_bpe_ent top = w->heap[0];
	struct tok_bpe_ent x = w->heap[--w->n_heap];
	size_t n = w->n_heap, i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && ent_less(&w->heap[c + 1], &w->heap[c]))
			c++;
		if (!ent_less(&w->heap[c], &x))
			break;
		w->heap[i] = w->heap[c];
		i = c;
	}
	if (n > 0)
		w->heap[i] = x;
	return top;
}

static void try_pair(const struct tok *t, struct tok_bpe_work *w, int32_t pos, struct tok_stats *st)
{
	int32_t next = w->sym[pos].next;
	if (next < 0)
		return;
	uint32_t rank;
	int32_t merged;
	if (tok_merge_find(t, w->sym[pos].id, w->sym[next].id, &rank, &merged)) {
		heap_push(w, (struct tok_bpe_ent){rank, (uint32_t)pos, merged});
		if (st)
			st->n_heap_ops++;
	}
}

int tok_bpe_piece(const struct tok *t, struct tok_bpe_work *w, const uint8_t *piece, size_t len, int32_t *out,
                  size_t n_out_max, size_t *n_out, struct tok_stats *st, struct errbuf *e)
{
	if (len > INT32_MAX / 4)
		return errbuf_set(e, ERR_LIMIT, "tokenizer: a piece of %zu bytes is too long", len);
	if (len > w->cap_sym) {
		size_t cap = len < 64 ? 64 : len;
		struct tok_bpe_sym *s = realloc(w->sym, cap * sizeof(*s));
		/* every merge pushes at most two entries: n - 1 initial + 2 per merge < 3n */
		struct tok_bpe_ent *h = s ? realloc(w->heap, 3 * cap * sizeof(*h)) : NULL;
		if (s)
			w->sym = s;
		if (h)
			w->heap = h;
		if (!s || !h)
			return errbuf_set(e, -ENOMEM, "tokenizer: out of memory for a %zu-byte piece", len);
		w->cap_sym = cap;
		w->cap_heap = 3 * cap;
	}

	/* initial symbols; a byte the vocab has no symbol for is dropped (HF BPE without an
	 * unk token does the same) */
	int32_t n = 0;
	for (size_t i = 0; i < len; i++) {
		int32_t id = t->byte_sym[piece[i]];
		if (id < 0)
			continue;
		w->sym[n] = (struct tok_bpe_sym){id, n - 1, n + 1};
		n++;
	}
	if (n == 0)
		return 0;
	w->sym[n - 1].next = -1;

	w->n_heap = 0;
	for (int32_t i = 0; i + 1 < n; i++)
		try_pair(t, w, i, st);

	while (w->n_heap > 0) {
		struct tok_bpe_ent top = heap_pop(w);
		if (st)
			st->n_heap_ops++;
		int32_t pos = (int32_t)top.pos;
		struct tok_bpe_sym *a = &w->sym[pos];
		if (a->id < 0 || a->next < 0)
			continue;
		struct tok_bpe_sym *b = &w->sym[a->next];
		uint32_t rank;
		int32_t merged;
		if (!tok_merge_find(t, a->id, b->id, &rank, &merged) || merged != top.new_id)
			continue; /* stale: one side changed since this entry was pushed */
		a->id = merged;
		b->id = -1;
		a->next = b->next;
		if (a->next >= 0)
			w->sym[a->next].prev = pos;
		if (st)
			st->n_merges++;
		if (a->prev >= 0)
			try_pair(t, w, a->prev, st);
		try_pair(t, w, pos, st);
	}

	for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
		if (*n_out >= n_out_max)
			return errbuf_set(e, ERR_LIMIT, "tokenizer: more than %zu tokens", n_out_max);
		out[(*n_out)++] = w->sym[i].id;
	}
	return 0;
}
