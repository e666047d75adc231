/* Hostile batches: every malformed batch (token id outside the vocab, sequence index out of range,
 * position outside the block table or negative, a block id outside the pool, positions of one
 * sequence not increasing, empty batch, missing arrays, a pool made for another model) is refused
 * with a message, before anything is computed: the pool's bytes are unchanged. A good batch after
 * them still works. */
#include "tests/model/refs.h"

int main(void)
{
	struct model *m = load_model("glm-dsa-tiny-Q8_0", 1, 2),
	             *other = load_model("deepseek2-tiny-Q8_0", 1, 1);
	if (!m || !other)
		return 1;
	struct model_kv kv, kvo;
	struct errbuf e = {0};
	if (model_kv_init(&kv, m, 4, NULL, 0, &e) || model_kv_init(&kvo, other, 4, NULL, 0, &e))
		return 1;
	size_t bytes = (size_t)kv.n_blocks * kv.layout.block_bytes;
	unsigned char *snap = malloc(bytes);
	memset(kv.base, 0x5a, bytes);
	memcpy(snap, kv.base, bytes);
	int32_t blocks[2] = {1, 2}, bad_blocks[2] = {1, 4};
	struct model_seq seqs[2] = {{.blocks = blocks, .n_blocks = 2}, {.blocks = bad_blocks, .n_blocks = 2}};
	float *lg = malloc(sizeof(float) * 1024 * 4);
	struct c {
		const char *what;
		int32_t tok[3], seq[3], pos[3];
		int n, n_seqs;
		bool other_pool, null_pos;
		const char *expect;
	} cases[] = {
	    {"token id = vocab",
	     {1, 1024, 3},
	     {0, 0, 0},
	     {0, 1, 2},
	     3,
	     1,
	     false,
	     false,
	     "outside the vocabulary"},
	    {"negative token id",
	     {-5, 1, 3},
	     {0, 0, 0},
	     {0, 1, 2},
	     3,
	     1,
	     false,
	     false,
	     "outside the vocabulary"},
	    {"sequence index", {1, 2, 3}, {0, 1, 0}, {0, 0, 1}, 3, 1, false, false, "names sequence 1 of 1"},
	    {"position past table",
	     {1, 2, 3},
	     {0, 0, 0},
	     {126, 127, 128},
	     3,
	     1,
	     false,
	     false,
	     "outside its block table"},
	    {"negative position",
	     {1, 2, 3},
	     {0, 0, 0},
	     {-1, 0, 1},
	     3,
	     1,
	     false,
	     false,
	     "outside its block table"},
	    {"block id outside pool",
	     {1, 2, 3},
	     {1, 1, 1},
	     {0, 1, 2},
	     3,
	     2,
	     false,
	     false,
	     "outside the pool"},
	    {"repeated position", {1, 2, 3}, {0, 0, 0}, {0, 1, 1}, 3, 1, false, false, "must increase"},
	    {"decreasing positions", {1, 2, 3}, {0, 0, 0}, {2, 1, 0}, 3, 1, false, false, "must increase"},
	    {"empty batch", {1, 2, 3}, {0, 0, 0}, {0, 1, 2}, 0, 1, false, false, "no tokens"},
	    {"missing positions", {1, 2, 3}, {0, 0, 0}, {0, 1, 2}, 3, 1, false, true, "missing arrays"},
	    {"pool of another model",
	     {1, 2, 3},
	     {0, 0, 0},
	     {0, 1, 2},
	     3,
	     1,
	     true,
	     false,
	     "different model layout"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct c *c = &cases[i];
		struct model_batch b = {.n_tokens = c->n,
		                        .tokens = c->tok,
		                        .seq = c->seq,
		                        .pos = c->null_pos ? NULL : c->pos,
		                        .n_seqs = c->n_seqs,
		                        .seqs = seqs};
		memset(&e, 0, sizeof(e));
		int rc = model_forward(m, c->other_pool ? &kvo : &kv, &b, lg, NULL, &e);
		printf("%-24s -> %s\n", c->what, rc ? e.msg : "accepted");
		CHECK(rc != 0 && strstr(e.msg, c->expect), "%s: rc %d '%s'", c->what, rc, e.msg);
		CHECK(memcmp(snap, kv.base, bytes) == 0, "%s: the pool was modified", c->what);
	}
	int32_t tok[3] = {1, 2, 3}, seq[3] = {0}, pos[3] = {64, 65, 66};
	struct model_batch ok = {
	    .n_tokens = 3, .tokens = tok, .seq = seq, .pos = pos, .n_seqs = 1, .seqs = seqs};
	CHECK(model_forward(m, &kv, &ok, lg, NULL, &e) == 0, "good batch after bad ones: %s", e.msg);
	CHECK(memcmp(snap, kv.base, bytes) != 0, "good batch wrote nothing");
	free(snap);
	free(lg);
	model_kv_fini(&kv);
	model_kv_fini(&kvo);
	model_destroy(m);
	model_destroy(other);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
