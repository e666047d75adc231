/* model_load_worker: the workers' config strings become model options (kv_dtype "bf16" -> bf16 KV,
 * anything else f32; backend cpu loads, an unknown backend name is refused naming it; a failed
 * load names the file), checked on the tiny glm-dsa model. */
#include "tests/model/refs.h"

int main(void)
{
	const char *path = DATA "/models/glm-dsa-tiny-Q8_0.gguf";
	struct errbuf e = {0};
	struct model *m = NULL;
	struct model_worker_opts wo = {.backend = "cpu", .kv_dtype = "bf16", .threads = 1, .tp = 1};
	CHECK(model_load_worker(&m, path, &wo, &e) == 0 && m, "cpu, bf16: %s", e.msg);
	if (m) {
		const struct model_opts *o = model_get_opts(m);
		CHECK(o->kv_dtype == MODEL_KV_BF16, "kv_dtype bf16 gave %d", (int)o->kv_dtype);
		CHECK(o->backend == MODEL_BACKEND_CPU, "backend cpu gave %d", (int)o->backend);
		model_destroy(m);
	}
	wo.kv_dtype = "f32";
	wo.tp = 2;
	CHECK(model_load_worker(&m, path, &wo, &e) == 0 && m, "cpu, f32, tp 2: %s", e.msg);
	if (m) {
		CHECK(model_get_opts(m)->kv_dtype == MODEL_KV_F32 && model_get_opts(m)->tp == 2,
		      "f32 / tp 2 not taken");
		model_destroy(m);
	}
	wo.backend = "gpu";
	CHECK(model_load_worker(&m, path, &wo, &e) != 0 && !m && strstr(e.msg, "backend 'gpu'"),
	      "backend gpu: rc, model %p, message '%s'", (void *)m, e.msg);
	wo.backend = "cpu";
	CHECK(model_load_worker(&m, DATA "/models/no-such-file.gguf", &wo, &e) != 0 && !m &&
	          strstr(e.msg, "cannot load model:") && strstr(e.msg, "no-such-file.gguf"),
	      "missing file: message '%s'", e.msg);
	printf("test_model_worker_opts: %s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
