/* Files the loader must refuse, each with a message naming the problem: built from the real
 * glm-dsa-tiny-BF16.gguf with the GGUF writer, changing one thing at a time (missing tensor,
 * wrong shape, wrong type, unknown architecture, missing key, legacy attn_kv_b layout, layer 0
 * not a full indexer layer, unknown extra tensor in strict mode). Also checks that
 * model_arch_check lists every problem of a file with several, and that the unchanged copy loads. */
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "kernels/kernels.h"
#include "tests/model/refs.h"

struct edit {
	const char *what;
	const char *drop_tensor; /* leave out */
	const char *reshape; /* swap ne0/ne1 of this 2-D tensor */
	const char *retype; /* F32 -> I32 (same bytes) */
	const char *drop_key;
	const char *arch; /* replace general.architecture (and rename the arch keys) */
	const char *add_tensor; /* extra tensor (copy of output_norm) */
	bool types_shared0; /* indexer.types[0] = false */
	bool strict;
	const char *expect; /* substring of the error; NULL = must load */
};

static const struct gguf_ctx *src;

static int write_edit(const struct edit *ed, const char *path)
{
	struct gguf_writer *w = gguf_writer_create(32);
	struct errbuf e = {0};
	for (int64_t i = 0; i < gguf_n_kv(src); i++) {
		const char *k = gguf_kv_key(src, i);
		if (ed->drop_key && strcmp(k, ed->drop_key) == 0)
			continue;
		if (ed->arch && strcmp(k, "general.architecture") == 0)
			continue;
		if (ed->types_shared0 && strcmp(k, "glm-dsa.attention.indexer.types") == 0)
			continue;
		if (gguf_writer_copy_kv(w, src, i))
			return -1;
	}
	if (ed->arch && gguf_writer_set_str(w, "general.architecture", ed->arch))
		return -1;
	if (ed->types_shared0) {
		uint8_t t[3] = {0, 0, 1};
		if (gguf_writer_set_arr(w, "glm-dsa.attention.indexer.types", GGUF_VT_BOOL, t, 3))
			return -1;
	}
	for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
		const struct gguf_tensor *t = gguf_tensor(src, i);
		if (ed->drop_tensor && strcmp(t->name, ed->drop_tensor) == 0)
			continue;
		int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
		int type = t->type;
		if (ed->reshape && strcmp(t->name, ed->reshape) == 0) {
			ne[0] = t->ne[1];
			ne[1] = t->ne[0];
		}
		if (ed->retype && strcmp(t->name, ed->retype) == 0)
			type = KT_I32;
		if (gguf_writer_add_tensor(w, t->name, type, t->n_dims, ne, t->data))
			return -1;
	}
	if (ed->add_tensor) {
		const struct gguf_tensor *t = gguf_find_tensor(src, "output_norm.weight");
		if (gguf_writer_add_tensor(w, ed->add_tensor, t->type, 1, t->ne, t->data))
			return -1;
	}
	int rc = gguf_writer_write(w, path, &e);
	if (rc)
		fprintf(stderr, "write: %s\n", e.msg);
	gguf_writer_destroy(w);
	return rc;
}

int main(void)
{
	struct gguf_ctx *g;
	struct errbuf e = {0};
	if (gguf_open(&g, DATA "/models/glm-dsa-tiny-BF16.gguf", &e)) {
		printf("open: %s\n", e.msg);
		return 1;
	}
	src = g;
	const struct edit edits[] = {
	    {.what = "unchanged copy", .expect = NULL},
	    {.what = "missing tensor",
	     .drop_tensor = "blk.1.attn_k_b.weight",
	     .expect = "tensor blk.1.attn_k_b.weight is missing"},
	    {.what = "missing indexer tensor",
	     .drop_tensor = "blk.2.indexer.proj.weight",
	     .expect = "tensor blk.2.indexer.proj.weight is missing"},
	    {.what = "wrong shape",
	     .reshape = "blk.0.attn_q_b.weight",
	     .expect = "tensor blk.0.attn_q_b.weight: expected ne=[256, 192], file has ne=[192, 256]"},
	    {.what = "wrong type",
	     .retype = "blk.2.ffn_norm.weight",
	     .expect = "tensor blk.2.ffn_norm.weight: type I32"},
	    {.what = "unknown architecture", .arch = "llama", .expect = "unsupported architecture 'llama'"},
	    {.what = "missing key",
	     .drop_key = "glm-dsa.attention.kv_lora_rank",
	     .expect = "metadata key glm-dsa.attention.kv_lora_rank is missing"},
	    {.what = "legacy kv_b layout",
	     .drop_key = "glm-dsa.attention.key_length_mla",
	     .add_tensor = "blk.0.attn_kv_b.weight",
	     .expect = "legacy GGUF with blk.N.attn_kv_b"},
	    {.what = "layer 0 shared indexer",
	     .types_shared0 = true,
	     .expect = "layer 0 must have a full indexer"},
	    {.what = "unknown tensor (default)", .add_tensor = "blk.0.attn_q.weight", .expect = NULL},
	    {.what = "unknown tensor (strict)",
	     .add_tensor = "blk.0.attn_q.weight",
	     .strict = true,
	     .expect = "tensor blk.0.attn_q.weight is not part of architecture glm-dsa"},
	};
	char path[128];
	snprintf(path, sizeof(path), "/tmp/tandem_badfile.%d.gguf", (int)getpid());
	for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
		const struct edit *ed = &edits[i];
		if (write_edit(ed, path)) {
			CHECK(0, "%s: could not write the test file", ed->what);
			continue;
		}
		struct model_opts o;
		model_opts_default(&o);
		o.quiet = true;
		o.strict = ed->strict;
		struct model *m = NULL;
		memset(&e, 0, sizeof(e));
		int rc = model_load(&m, path, &o, &e);
		printf("%-26s -> %s\n", ed->what, rc ? e.msg : "loaded");
		if (ed->expect)
			CHECK(rc != 0 && strstr(e.msg, ed->expect),
			      "%s: want error containing '%s', got rc %d '%s'", ed->what, ed->expect, rc,
			      e.msg);
		else
			CHECK(rc == 0, "%s: should load: %s", ed->what, e.msg);
		model_destroy(m);
	}
	/* several problems listed by model_arch_check */
	struct edit two = {.drop_tensor = "blk.1.attn_v_b.weight", .reshape = "blk.2.attn_kv_a_mqa.weight"};
	if (write_edit(&two, path) == 0) {
		struct gguf_ctx *g2;
		if (gguf_open(&g2, path, &e) == 0) {
			char *buf = NULL;
			size_t len = 0;
			FILE *mf = open_memstream(&buf, &len);
			int np = model_arch_check(g2, mf);
			fclose(mf);
			printf("model_arch_check on a file with 2 problems -> %d:\n%s", np, buf);
			CHECK(np == 2 && strstr(buf, "blk.1.attn_v_b.weight is missing") &&
			          strstr(buf, "blk.2.attn_kv_a_mqa.weight: expected ne=[256, 288]"),
			      "arch check found %d problems", np);
			free(buf);
			gguf_close(g2);
		}
	}
	remove(path);
	gguf_close(g);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
