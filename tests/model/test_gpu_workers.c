/* The GPU workers' KV staging at model level (SKIPs without CUDA or a GPU; the e2e twin is
 * tests/e2e/test_gpu_workers.sh): the calls the GPU workers make around
 * the UCX put (model.h: model_kv_upload / model_kv_download / model_kv_wait, model_host_pin,
 * model_thread_attach), on glm-dsa-tiny-Q8_0 (latent and indexer keys in every block), through a
 * page-locked host mirror. Checks:
 *  - a byte pattern uploaded to runs and single blocks of the device pool downloads unchanged, and
 *    the other blocks stay zero; ids outside the pool are refused;
 *  - mixed pairing CPU prefill -> GPU decode: the prompt prefilled by the CPU backend into the
 *    mirror, uploaded, then decoded by the CUDA backend on another thread (model_thread_attach):
 *    every step's logits within TOL_F32 of decoding on the CPU (the same tokens fed to both; one
 *    token per forward is the fp32 GEMV path, tests/model/test_gpu_model.c);
 *  - GPU prefill -> CPU decode: the prompt prefilled by CUDA in chunks of 8 (fp32 path), downloaded:
 *    its KV within TOL_KV of the CPU's, and CPU decode steps from it within TOL_F32 of the CPU's.
 * Then it prints (no bound) the measured staging copy rates, pinned and pageable, for the docs. */
#include "tests/model/kv_stage.h"

#ifndef TANDEM_CUDA
int main(void)
{
	(void)n_fail;
	printf("SKIP: built without CUDA (make CUDA=1)\n");
	return 77;
}
#else
#include <pthread.h>
#include <time.h>

#include "kernels/kernels.h"

#define TOL_F32 2e-4
/* KV values (normed latents, roped keys, indexer keys) are of the magnitude of the logits or less and
 * come out of the same fp32 GEMV chains (summation order only): the logits' bound holds for them */
#define TOL_KV TOL_F32
#define ERRBUF_SIZE_FOR_TEST (sizeof(((struct errbuf *)0)->msg) + 1)

struct decode_job {
	struct model *m;
	struct model_kv *kv;
	struct tseq s;
	int32_t first;
	const int32_t *feed;
	float *lg;
	int rc;
	char msg[ERRBUF_SIZE_FOR_TEST];
};

static void *decode_thread(void *arg)
{
	struct decode_job *j = arg;
	struct errbuf e = {0};
	j->rc = model_thread_attach(j->m, &e);
	if (j->rc)
		snprintf(j->msg, sizeof(j->msg), "%s", e.msg);
	else
		j->rc = ks_decode(j->m, j->kv, &j->s, j->first, j->feed, j->lg);
	return NULL;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Measured, printed only: the staging copy rate of a 256-block pool (host mirror page-locked and
 * not), whole runs (one copy) and every other block (one copy per block). */
static void bench_staging(struct model *mg, size_t bb)
{
	enum { NB = 256 };
	struct model_kv kv;
	struct errbuf e = {0};
	size_t bytes = (size_t)NB * bb, al = (bytes + 4095) & ~(size_t)4095;
	unsigned char *h = aligned_alloc(4096, al);
	int32_t all[NB], odd[NB / 2];
	for (int i = 0; i < NB; i++)
		all[i] = i;
	for (int i = 0; i < NB / 2; i++)
		odd[i] = 2 * i + 1;
	if (!h || model_kv_init(&kv, mg, NB, NULL, 0, &e)) {
		CHECK(0, "bench setup: %s", e.msg);
		free(h);
		return;
	}
	memset(h, 1, al);
	for (int pin = 1; pin >= 0; pin--) {
		if (pin && model_host_pin(mg, h, al, &e)) {
			CHECK(0, "bench pin: %s", e.msg);
			continue;
		}
		for (int scat = 0; scat < 2; scat++) {
			const int32_t *ids = scat ? odd : all;
			int n = scat ? NB / 2 : NB, reps = 5;
			double up = 1e30, dn = 1e30;
			for (int r = 0; r < reps; r++) {
				double t0 = now_s();
				int rc = model_kv_upload(&kv, h, ids, n, &e);
				rc = rc ? rc : model_kv_wait(&kv, &e);
				double t1 = now_s();
				rc = rc ? rc : model_kv_download(&kv, h, ids, n, &e);
				double t2 = now_s();
				CHECK(rc == 0, "bench copy: %s", e.msg);
				up = t1 - t0 < up ? t1 - t0 : up;
				dn = t2 - t1 < dn ? t2 - t1 : dn;
			}
			double gb = (double)n * (double)bb / 1e9;
			printf("staging %s host, %3d blocks of %zu bytes (%s): host->device %.1f GB/s, "
			       "device->host %.1f "
			       "GB/s (best of %d)\n",
			       pin ? "pinned  " : "pageable", n, bb, scat ? "every other block" : "one run",
			       gb / up, gb / dn, reps);
		}
		if (pin)
			model_host_unpin(mg, h);
	}
	model_kv_fini(&kv);
	free(h);
}

int main(void)
{
	if (kcuda_device_count() < 1) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	o.backend = MODEL_BACKEND_CUDA;
	o.max_tokens = 8;
	o.max_seqs = 4;
	o.max_ctx = 512;
	struct errbuf e = {0};
	struct model *mc = load_model("glm-dsa-tiny-Q8_0", 1, 2), *mg = NULL;
	if (model_load(&mg, DATA "/models/glm-dsa-tiny-Q8_0.gguf", &o, &e) || !mc) {
		printf("load: %s\n", e.msg);
		return 1;
	}
	CHECK(model_kv_on_device(mg) && !model_kv_on_device(mc), "on_device flags");
	struct model_kv_layout L;
	model_kv_layout_get(mg, &L);
	const int NB = 8;
	size_t bb = L.block_bytes, bytes = (size_t)NB * bb;
	unsigned char *mirror = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095), *back = NULL;
	back = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
	struct model_kv dev, cpu_own, cpu_mir;
	if (!mirror || !back || model_kv_init(&dev, mg, NB, NULL, 0, &e) ||
	    model_kv_init(&cpu_mir, mc, NB, mirror, bytes, &e) ||
	    model_kv_init(&cpu_own, mc, NB, NULL, 0, &e)) {
		printf("setup: %s\n", e.msg);
		return 1;
	}
	CHECK(dev.on_device, "CUDA pool not on the device");
	int rc = model_host_pin(mg, mirror, bytes, &e);
	CHECK(rc == 0, "pin: %s", e.msg);
	bool pinned = rc == 0;
	CHECK(model_host_pin(mg, back, bytes, &e) == 0, "pin back: %s", e.msg);

	/* pattern round trip */
	for (size_t i = 0; i < bytes; i++)
		mirror[i] = (unsigned char)(i * 13 + i / 777);
	memset(back, 0xee, bytes);
	int32_t bad[2] = {0, NB};
	CHECK(model_kv_upload(&dev, mirror, bad, 2, &e) == ERR_FORMAT, "id %d of %d accepted", NB, NB);
	int32_t ids[5] = {5, 6, 7, 2, 0}, rest[3] = {1, 3, 4};
	CHECK(model_kv_upload(&dev, mirror, ids, 5, &e) == 0 && model_kv_wait(&dev, &e) == 0, "upload: %s",
	      e.msg);
	CHECK(model_kv_download(&dev, back, ids, 5, &e) == 0 &&
	          model_kv_download(&dev, back, rest, 3, &e) == 0,
	      "download: %s", e.msg);
	int n_same = 0, n_zero = 0;
	for (int b = 0; b < NB; b++) {
		bool staged = b == 0 || b == 2 || b >= 5;
		if (staged)
			n_same += memcmp(back + (size_t)b * bb, mirror + (size_t)b * bb, bb) == 0;
		else {
			bool z = true;
			for (size_t i = 0; i < bb; i++)
				z &= back[(size_t)b * bb + i] == 0;
			n_zero += z;
		}
	}
	printf("device round trip: %d of 5 staged blocks equal, %d of 3 others zero\n", n_same, n_zero);
	CHECK(n_same == 5 && n_zero == 3, "device round trip");

	/* CPU prefill -> upload -> CUDA decode (on another thread), vs CPU decode */
	int64_t V = model_hparams(mc)->vocab;
	int32_t prompt[KS_PROMPT];
	ks_prompt(prompt, KS_PROMPT, V);
	float *lp = malloc(sizeof(float) * (size_t)V), *la = malloc(sizeof(float) * (size_t)V * KS_STEPS),
	      *lb = malloc(sizeof(float) * (size_t)V * KS_STEPS);
	int32_t feed[KS_STEPS];
	memset(mirror, 0, bytes);
	struct tseq s1;
	tseq_init(&s1, 1, 3, 2); /* blocks 1 3 5 */
	CHECK(run_seq(mc, &cpu_mir, &s1, prompt, KS_PROMPT, 64, false, lp) == 0, "cpu prefill");
	int32_t first = (int32_t)argmax(lp, V);
	/* the CPU decode below writes into the mirror: the upload must have landed (model.h) */
	CHECK(model_kv_upload(&dev, mirror, s1.blocks, 2, &e) == 0 && model_kv_wait(&dev, &e) == 0,
	      "upload: %s", e.msg);
	struct tseq s2 = s1;
	CHECK(ks_decode(mc, &cpu_mir, &s1, first, NULL, la) == 0, "cpu decode");
	for (int t = 0; t < KS_STEPS; t++)
		feed[t] = (int32_t)argmax(la + (size_t)t * (size_t)V, V);
	struct decode_job j = {.m = mg, .kv = &dev, .s = s2, .first = first, .feed = feed, .lg = lb};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, decode_thread, &j) == 0, "thread");
	pthread_join(th, NULL);
	CHECK(j.rc == 0, "cuda decode on a second thread: %d %s", j.rc, j.msg);
	double d = max_abs_diff(la, lb, (size_t)V * KS_STEPS);
	printf("cpu prefill -> upload -> cuda decode (second thread), %d steps: max|d| vs cpu = %.3g (tol "
	       "%.g)\n",
	       KS_STEPS, d, TOL_F32);
	CHECK(d <= TOL_F32, "mixed pairing cpu->cuda differs by %g", d);

	/* CUDA prefill (chunks of 8) -> download -> CPU decode, vs all-CPU */
	memset(mirror, 0, bytes);
	memset(back, 0, bytes);
	int32_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7}; /* the device pool zeroed: slots past the prompt compare */
	CHECK(model_kv_upload(&dev, back, all, NB, &e) == 0, "zero upload: %s", e.msg);
	tseq_init(&s1, 4, 2, -3); /* blocks 4 1 */
	s2 = s1;
	float *lpg = malloc(sizeof(float) * (size_t)V);
	CHECK(run_seq(mg, &dev, &s1, prompt, KS_PROMPT, 8, false, lpg) == 0, "cuda prefill");
	CHECK(model_kv_download(&dev, back, s1.blocks, 2, &e) == 0, "download: %s", e.msg);
	CHECK(run_seq(mc, &cpu_mir, &s2, prompt, KS_PROMPT, 64, false, lp) == 0, "cpu prefill");
	double dkv = ks_block_diff(back, mirror, s1.blocks, 2, bb);
	printf("cuda prefill (fp32 chunks of 8) -> download: KV max|d| vs cpu = %.3g (tol %.g); first-token "
	       "logits max|d| %.3g\n",
	       dkv, TOL_KV, max_abs_diff(lp, lpg, (size_t)V));
	CHECK(dkv <= TOL_KV, "downloaded KV differs from the cpu's by %g", dkv);
	/* decode on the CPU from the downloaded blocks (in a pool of their own) and from the CPU's */
	memcpy(cpu_own.base, back, bytes);
	first = (int32_t)argmax(lp, V);
	struct tseq s3 = s1;
	CHECK(ks_decode(mc, &cpu_mir, &s2, first, NULL, la) == 0, "cpu decode");
	for (int t = 0; t < KS_STEPS; t++)
		feed[t] = (int32_t)argmax(la + (size_t)t * (size_t)V, V);
	CHECK(ks_decode(mc, &cpu_own, &s3, first, feed, lb) == 0, "cpu decode from gpu kv");
	d = max_abs_diff(la, lb, (size_t)V * KS_STEPS);
	printf("cuda prefill -> download -> cpu decode, %d steps: max|d| vs cpu = %.3g (tol %.g)\n", KS_STEPS,
	       d, TOL_F32);
	CHECK(d <= TOL_F32, "mixed pairing cuda->cpu differs by %g", d);

	bench_staging(mg, bb);

	if (pinned)
		model_host_unpin(mg, mirror);
	model_host_unpin(mg, back);
	model_kv_fini(&dev);
	model_kv_fini(&cpu_own);
	model_kv_fini(&cpu_mir);
	free(mirror);
	free(back);
	free(lp);
	free(lpg);
	free(la);
	free(lb);
	model_destroy(mg);
	model_destroy(mc);
	printf("%s\n", n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
#endif
