/* Hostile metadata: every integer and float key of the glm-dsa and deepseek2 tiny files is
 * rewritten to edge values (0, 1, 3, value+1, 2*value, INT32_MAX, UINT32_MAX; floats 0, -1, NaN,
 * 1e30) one at a time. model_load must either refuse with a message or load; a loaded model must
 * run a 70-token prefill and a decode step without crashing (run under `make SAN=1` to check
 * memory safety too). Counts are printed; nothing may crash or hang. */
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "kernels/kernels.h"
#include "tests/model/refs.h"

static int write_with(const struct gguf_ctx *g, int64_t kv, bool is_float, double val, const char *path)
{
	struct gguf_writer *w = gguf_writer_create(32);
	for (int64_t i = 0; i < gguf_n_kv(g); i++) {
		if (i == kv) {
			if (is_float)
				gguf_writer_set_f32(w, gguf_kv_key(g, i), (float)val);
			else
				gguf_writer_set_u32(w, gguf_kv_key(g, i), (uint32_t)(int64_t)val);
		} else if (gguf_writer_copy_kv(w, g, i)) {
			gguf_writer_destroy(w);
			return -1;
		}
	}
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
	}
	struct errbuf e = {0};
	int rc = gguf_writer_write(w, path, &e);
	gguf_writer_destroy(w);
	return rc;
}

static void fuzz(const char *stem)
{
	char src[256], path[128];
	snprintf(src, sizeof(src), DATA "/models/%s.gguf", stem);
	snprintf(path, sizeof(path), "/tmp/tandem_metafuzz.%d.gguf", (int)getpid());
	struct gguf_ctx *g;
	struct errbuf e = {0};
	if (gguf_open(&g, src, &e)) {
		CHECK(0, "open %s: %s", src, e.msg);
		return;
	}
	int n_files = 0, n_refused = 0, n_loaded = 0, n_ran = 0;
	for (int64_t kv = 0; kv < gguf_n_kv(g); kv++) {
		const char *key = gguf_kv_key(g, kv);
		enum gguf_vtype t = gguf_kv_type(g, kv);
		if (strncmp(key, "tokenizer.", 10) == 0 || strncmp(key, "general.", 8) == 0)
			continue;
		bool is_f = t == GGUF_VT_F32;
		if (!is_f && t != GGUF_VT_U32 && t != GGUF_VT_I32)
			continue;
		double orig = 0;
		if (is_f) {
			float f;
			if (gguf_get_f32(g, key, &f, NULL) == 0)
				orig = f;
		} else {
			int64_t v;
			if (gguf_get_i64(g, key, &v, NULL) == 0)
				orig = (double)v;
		}
		double ivals[] = {0, 1, 3, orig + 1, orig * 2, 2147483647.0, 4294967295.0};
		double fvals[] = {0, -1, NAN, 1e30};
		int nv = is_f ? 4 : 7;
		for (int vi = 0; vi < nv; vi++) {
			double val = is_f ? fvals[vi] : ivals[vi];
			if (write_with(g, kv, is_f, val, path)) {
				CHECK(0, "write %s", key);
				continue;
			}
			n_files++;
			struct model_opts o;
			model_opts_default(&o);
			o.quiet = true;
			struct model *m = NULL;
			memset(&e, 0, sizeof(e));
			if (model_load(&m, path, &o, &e)) {
				n_refused++;
				CHECK(e.msg[0] != 0, "%s = %g refused without a message", key, val);
				continue;
			}
			n_loaded++;
			struct model_kv kvp;
			if (model_kv_init(&kvp, m, 2, NULL, 0, &e) == 0) {
				int32_t ids[70];
				for (int i = 0; i < 70; i++)
					ids[i] = (i * 37) % 900;
				struct tseq s;
				tseq_init(&s, 0, 2, 1);
				float *lg = malloc(sizeof(float) * (size_t)model_hparams(m)->vocab);
				if (run_seq(m, &kvp, &s, ids, 70, 70, false, lg) == 0 &&
				    run_seq(m, &kvp, &s, ids, 1, 1, false, lg) == 0)
					n_ran++;
				free(lg);
				model_kv_fini(&kvp);
			}
			model_destroy(m);
		}
	}
	printf("%-20s %d edited files: %d refused with a message, %d loaded (%d ran prefill + decode)\n",
	       stem, n_files, n_refused, n_loaded, n_ran);
	CHECK(n_refused > n_files / 2, "%s: suspiciously few refusals", stem);
	remove(path);
	gguf_close(g);
}

int main(void)
{
	fuzz("glm-dsa-tiny-Q8_0");
	fuzz("deepseek2-tiny-Q8_0");
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
