/* The CUDA backend's threaded weight upload (common/model/upload.c) against the single-thread
 * stager it replaces (TANDEM_UPLOAD_THREADS=0), end to end on every tests/data model: the same
 * device bytes (every weight read back and compared with the file's bytes, a TP slice in its
 * compacted layout: model_backend_cuda_verify_weights) and the same forward (16 tokens of rand64,
 * chunks of 8, logits of every position) after a load with 0 (the
 * old path), 1 and 3 copy threads, with 1 MiB buffers (so even the tiny models take many batches,
 * cut inside tensors) and with pread / mapping reads, at TP=1 and as rank 0 and rank 1 of TP=2 in
 * rank-shard mode (o_proj and the expert down projections are then row slices: the compacting
 * path). The byte comparison is the upload's check; the logits are the second line (the same bytes
 * must give the same logits, within 1e-6; a failure there with the bytes verified names a compute
 * nondeterminism, not the upload). Then a copy of a model file truncated after it was opened: the load fails
 * with a message naming the tensor, and the process survives. SKIPs without CUDA or a GPU. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "common/model/model_internal.h"
#include "tests/model/refs.h"

#ifndef TANDEM_CUDA
int main(void)
{
	(void)n_fail;
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include "kernels/kernels.h"

#define N_TOK 16

static void set_upload_env(const char *threads, const char *pread)
{
	setenv("TANDEM_UPLOAD_THREADS", threads, 1);
	setenv("TANDEM_UPLOAD_PREAD", pread, 1);
	setenv("TANDEM_UPLOAD_BUF_MB", "1", 1);
}

static void cuda_opts(struct model_opts *o, int tp, int rank)
{
	model_opts_default(o);
	o->quiet = true;
	o->backend = MODEL_BACKEND_CUDA;
	o->max_tokens = 64;
	o->max_seqs = 8;
	o->max_ctx = 512;
	o->tp = tp;
	o->rank = rank;
}

static int forward16(struct model *m, const int32_t *ids, float *out)
{
	struct model_kv kv;
	struct errbuf e = {0};
	if (model_kv_init(&kv, m, 4, NULL, 0, &e)) {
		fprintf(stderr, "kv: %s\n", e.msg);
		return -1;
	}
	struct tseq s;
	tseq_init(&s, 1, 2, 2);
	int rc = run_seq(m, &kv, &s, ids, N_TOK, 8, true, out);
	model_kv_fini(&kv);
	return rc;
}

/* every weight byte on the device against the file (the first line: an upload fault shows here,
 * a compute race does not) */
static bool weights_ok(struct model *m, const char *stem, const char *what)
{
	uint64_t n = 0;
	struct errbuf e = {0};
	int rc = model_backend_cuda_verify_weights(&m->ranks[0], &n, &e);
	CHECK(rc == 0 && n > 0, "%s, %s: device weights differ from the file: %s", stem, what, e.msg);
	return rc == 0;
}

static void test_model(const char *stem)
{
	char p[512];
	snprintf(p, sizeof(p), DATA "/models/%s.gguf", stem);
	json_t *man = ref_manifest(stem);
	int32_t *ids = NULL;
	int n = 0;
	if (!man || find_prompt(man, "rand64", &ids, &n) || n < N_TOK) {
		CHECK(0, "%s: no rand64 prompt", stem);
		free(ids);
		json_decref(man);
		return;
	}
	static const int cfg[][2] = {{1, -1}, {2, 0}, {2, 1}};
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		int T = cfg[c][0], rank = cfg[c][1];
		struct model_opts o;
		cuda_opts(&o, T, rank);
		struct errbuf e = {0};
		struct model *m = NULL;
		set_upload_env("0", "1");
		if (model_load(&m, p, &o, &e)) {
			/* K-quant o_proj rows of 256 cannot be cut in two: refused before any upload */
			printf("%-22s TP=%d rank %d: refused (%s)\n", stem, T, rank, e.msg);
			CHECK(T > 1, "%s: TP=1 load failed: %s", stem, e.msg);
			continue;
		}
		char what[96];
		snprintf(what, sizeof(what), "TP=%d rank %d, old upload", T, rank);
		weights_ok(m, stem, what);
		int64_t V = model_hparams(m)->vocab;
		size_t nl = (size_t)V * N_TOK;
		float *ref = malloc(sizeof(float) * nl), *out = malloc(sizeof(float) * nl);
		CHECK(forward16(m, ids, ref) == 0, "%s: forward after the old upload failed", stem);
		model_destroy(m);
		static const char *const thr[] = {"1", "3", "3"}, *const prd[] = {"1", "1", "0"};
		for (int k = 0; k < 3; k++) {
			set_upload_env(thr[k], prd[k]);
			if (model_load(&m, p, &o, &e)) {
				CHECK(0, "%s TP=%d rank %d: load with %s threads failed: %s", stem, T, rank,
				      thr[k], e.msg);
				continue;
			}
			snprintf(what, sizeof(what), "TP=%d rank %d, %s thread(s), %s", T, rank, thr[k],
			         prd[k][0] == '1' ? "pread" : "mapping");
			bool wok = weights_ok(m, stem, what);
			CHECK(forward16(m, ids, out) == 0, "%s: forward failed", stem);
			double d = max_abs_diff(ref, out, nl);
			int same = memcmp(ref, out, sizeof(float) * nl) == 0;
			printf("%-22s %s: device weights %s the file; logits %s the old upload's (max|d| "
			       "%.3g)\n",
			       stem, what, wok ? "byte-identical to" : "DIFFER from",
			       same ? "bit-identical to" : "differ from", d);
			/* the second line: the same bytes must compute the same logits; where they do not
			 * while the weights are verified, a kernel is not deterministic (not an upload fault)
			 */
			CHECK(d <= 1e-6, "%s %s: logits differ by %g%s", stem, what, d,
			      wok ? " although the device weights equal the file byte for byte: a compute "
			            "nondeterminism, not the upload"
			          : "");
			model_destroy(m);
		}
		free(ref);
		free(out);
	}
	free(ids);
	json_decref(man);
}

/* the last tensor of the file by offset, if it is a matrix (its bytes are only read by the upload:
 * the load converts the 1-D norm vectors itself, unguarded, so the cut must not reach one) */
static const struct gguf_tensor *last_matrix(const struct gguf_ctx *g)
{
	const struct gguf_tensor *last = NULL;
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		if (!last || t->file_offset > last->file_offset)
			last = t;
	}
	return last && last->n_dims >= 2 ? last : NULL;
}

static void test_truncated(const char *stem)
{
	char src[512], dst[] = "/tmp/test_gpu_upload_XXXXXX";
	snprintf(src, sizeof(src), DATA "/models/%s.gguf", stem);
	int in = open(src, O_RDONLY), out = mkstemp(dst);
	struct stat st;
	if (in < 0 || out < 0 || fstat(in, &st)) {
		CHECK(0, "copy of %s", src);
		return;
	}
	char *buf = malloc((size_t)st.st_size);
	CHECK(buf && read(in, buf, (size_t)st.st_size) == st.st_size &&
	          write(out, buf, (size_t)st.st_size) == st.st_size,
	      "copy of %s", src);
	free(buf);
	close(in);
	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	if (gguf_open(&g, dst, &e)) {
		CHECK(0, "gguf_open of the copy: %s", e.msg);
		goto out;
	}
	const struct gguf_tensor *t = last_matrix(g);
	if (!t) {
		printf("%-22s truncated file: SKIP (the last tensor is a vector)\n", stem);
		gguf_close(g);
		goto out;
	}
	char want[300];
	snprintf(want, sizeof(want), "tensor %s", t->name);
	/* cut at the last page boundary inside the tensor: the bytes after it are in a page past the
	 * end (SIGBUS on the mapping, a short pread); where the tensor crosses no page boundary, cut in
	 * its middle (the tail of a page past the end reads as zeros from the mapping: pread only) */
	uint64_t end = t->file_offset + t->nbytes, pg = (end - 1) & ~(uint64_t)4095;
	bool mapping_too = pg > t->file_offset;
	off_t cut = (off_t)(mapping_too ? pg : t->file_offset + t->nbytes / 2);
	CHECK(ftruncate(out, cut) == 0, "ftruncate");
	for (int mode = 0; mode < (mapping_too ? 2 : 1); mode++) {
		set_upload_env("3", mode ? "0" : "1");
		struct model_opts o;
		cuda_opts(&o, 1, -1);
		struct model *m = NULL;
		e = (struct errbuf){0};
		int rc = model_load_gguf(&m, g, &o, &e);
		CHECK(rc != 0 && strstr(e.msg, want),
		      "%s truncated (%s): rc %d, message \"%s\" should name %s", stem,
		      mode ? "mapping" : "pread", rc, e.msg, t->name);
		printf("%-22s truncated at %lld (%s): \"%s\"\n", stem, (long long)cut,
		       mode ? "mapping" : "pread", e.msg);
		if (rc == 0)
			model_destroy(m);
	}
	if (!mapping_too)
		printf("%-22s truncated file, mapping: SKIP (%s crosses no page boundary)\n", stem, t->name);
	gguf_close(g);
out:
	close(out);
	unlink(dst);
}

int main(int argc, char **argv)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	for (int i = 0; ref_models[i]; i++)
		if (argc < 2 || strcmp(argv[1], ref_models[i]) == 0)
			test_model(ref_models[i]);
	test_truncated("glm-dsa-tiny-Q8_0");
	test_truncated("glm-dsa-tiny-BF16");
	test_truncated("deepseek2-tiny-Q8_0");
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
#endif
