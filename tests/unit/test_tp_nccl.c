/* What of the NCCL communicator (common/model/tp_nccl.c) can be checked without GPUs: the device
 * count check (the seam: the visible count is an argument), the messages when libnccl cannot be
 * loaded or is not NCCL, the deadline setting, argument checks of group creation, and model_load's
 * refusal of --backend cuda --tp 2 on a machine without two GPUs (with the reason). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model.h"
#include "common/model/tp.h"
#include "kernels/kernels.h"

static int n_fail;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

static void test_devices(void)
{
	static const struct {
		int size, first, visible, want;
		const char *msg1, *msg2;
	} cases[] = {
	    {2, 0, 2, 0, NULL, NULL},
	    {8, 0, 8, 0, NULL, NULL},
	    {2, 6, 8, 0, NULL, NULL},
	    {2, 0, 1, ERR_UNSUPPORTED, "needs 2 GPUs (devices 0..1", "1 visible"},
	    {8, 0, 4, ERR_UNSUPPORTED, "needs 8 GPUs (devices 0..7", "4 visible"},
	    {2, 1, 2, ERR_UNSUPPORTED, "devices 1..2", "2 visible"},
	    {4, 0, 0, ERR_UNSUPPORTED, "needs 4 GPUs", "no CUDA device is visible"},
	    {1, 0, 8, -EINVAL, "degree 1 out of range", NULL},
	    {300, 0, 8, -EINVAL, "degree 300", NULL},
	    {2, -1, 8, -EINVAL, "first device -1", NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct errbuf e = {0};
		int rc = tp_nccl_check_devices(cases[i].size, cases[i].first, cases[i].visible, &e);
		CHECK(rc == cases[i].want, "devices case %zu: rc %d, want %d (%s)", i, rc, cases[i].want,
		      e.msg);
		if (cases[i].msg1)
			CHECK(strstr(e.msg, cases[i].msg1), "devices case %zu: message '%s' lacks '%s'", i,
			      e.msg, cases[i].msg1);
		if (cases[i].msg2)
			CHECK(strstr(e.msg, cases[i].msg2), "devices case %zu: message '%s' lacks '%s'", i,
			      e.msg, cases[i].msg2);
	}
}

static void test_dlopen(void)
{
	struct errbuf e = {0};
	setenv("TANDEM_NCCL_LIB", "/nonexistent/libnccl-for-test.so.2", 1);
	int rc = tp_nccl_available(&e);
	printf("missing library: %s\n", e.msg);
	CHECK(rc == ERR_NCCL, "missing library: rc %d", rc);
	CHECK(strstr(e.msg, "/nonexistent/libnccl-for-test.so.2"), "message does not name the file: %s",
	      e.msg);
	CHECK(strstr(e.msg, "--tp > 1") && strstr(e.msg, "TANDEM_NCCL_LIB"),
	      "message does not say what needs NCCL and how to point at it: %s", e.msg);
	CHECK(tp_nccl_version() == 0, "a version without a library");

	/* a real shared library that is not NCCL */
	setenv("TANDEM_NCCL_LIB", "libm.so.6", 1);
	e = (struct errbuf){0};
	rc = tp_nccl_available(&e);
	printf("not NCCL: %s\n", e.msg);
	CHECK(rc == ERR_NCCL && strstr(e.msg, "libm.so.6 has no ncclGetVersion"), "libm: rc %d, %s", rc,
	      e.msg);
	unsetenv("TANDEM_NCCL_LIB");

	/* the real one, where installed: the symbols resolve and the version is new enough */
	e = (struct errbuf){0};
	if (tp_nccl_available(&e) == 0) {
		int v = tp_nccl_version();
		printf("libnccl.so.2 loaded: version %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
		CHECK(v >= 21400, "version code %d below 2.14 was accepted", v);
	} else {
		printf(
		    "libnccl.so.2 not loadable here (%s): the success path is checked on the GPU machine\n",
		    e.msg);
	}
}

static void test_timeout(void)
{
	unsetenv("TANDEM_NCCL_TIMEOUT_S");
	CHECK(tp_nccl_timeout_s() == 120.0, "default deadline %g", tp_nccl_timeout_s());
	setenv("TANDEM_NCCL_TIMEOUT_S", "7.5", 1);
	CHECK(tp_nccl_timeout_s() == 7.5, "deadline 7.5: got %g", tp_nccl_timeout_s());
	setenv("TANDEM_NCCL_TIMEOUT_S", "soon", 1); /* warns, falls back */
	CHECK(tp_nccl_timeout_s() == 120.0, "bad deadline: got %g", tp_nccl_timeout_s());
	setenv("TANDEM_NCCL_TIMEOUT_S", "-3", 1);
	CHECK(tp_nccl_timeout_s() == 120.0, "negative deadline: got %g", tp_nccl_timeout_s());
	unsetenv("TANDEM_NCCL_TIMEOUT_S");
}

static void test_group_args(void)
{
	struct tp_nccl_group *g = (struct tp_nccl_group *)1;
	struct tp_comm comms[2];
	struct errbuf e = {0};
	int rc = tp_nccl_group_create(&g, 1, NULL, comms, &e);
	CHECK(rc != 0 && g == NULL, "group of 1: rc %d", rc);
	printf("group of 1: %s\n", e.msg);
	tp_nccl_group_destroy(NULL); /* accepts NULL */
}

/* --backend cuda --tp 2 without two GPUs (or without CUDA) is refused before any weight moves */
static void test_load(void)
{
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	o.backend = MODEL_BACKEND_CUDA;
	o.tp = 2;
	struct errbuf e = {0};
	struct model *m = NULL;
	int rc = model_load(&m, "tests/data/models/glm-dsa-tiny-BF16.gguf", &o, &e);
	printf("load --backend cuda --tp 2: rc %d: %s\n", rc, rc ? e.msg : "loaded");
#ifndef TANDEM_CUDA
	CHECK(rc == ERR_UNSUPPORTED && strstr(e.msg, "no CUDA"), "no-CUDA build: rc %d, %s", rc, e.msg);
#else
	int n = kcuda_device_count();
	if (n < 2)
		CHECK(rc == ERR_UNSUPPORTED && strstr(e.msg, "needs 2 GPUs"),
		      "%d GPU(s): rc %d, message '%s' does not say 2 GPUs are needed", n, rc, e.msg);
	else
		CHECK(rc == 0 || rc == ERR_NCCL, "%d GPUs: rc %d (%s)", n, rc, e.msg);
#endif
	model_destroy(m);
	/* rank-shard mode stays allowed in the argument checks: an out-of-range rank is refused */
	o.rank = 2;
	e = (struct errbuf){0};
	rc = model_load(&m, "tests/data/models/glm-dsa-tiny-BF16.gguf", &o, &e);
	CHECK(rc == -EINVAL && strstr(e.msg, "rank 2 out of range"), "rank 2 of 2: rc %d, %s", rc, e.msg);
	model_destroy(m);
}

int main(void)
{
	test_devices();
	test_dlopen();
	test_timeout();
	test_group_args();
	test_load();
	printf("%s\n", n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
