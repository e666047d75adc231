/* gguf_writer_set_sparse (used by tandem bench --synthetic): tensors at or above the threshold
 * become file holes that read back as zeros and take (almost) no disk, smaller ones are written,
 * a trailing hole still gives the file its full length, and the reader accepts the result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "kernels/kernels.h"

static int n_fail;
#define CHECK(c, ...)                                                                                        \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

int main(void)
{
	char path[256];
	const char *td = getenv("TMPDIR");
	snprintf(path, sizeof(path), "%s/test_gguf_sparse_%ld.gguf", td && *td ? td : "/tmp", (long)getpid());
	static float small[256], big1[1 << 20], big2[1 << 20]; /* 1 KiB written, 4 MiB holes */
	for (int i = 0; i < 256; i++)
		small[i] = (float)i + 0.5f;
	for (int i = 0; i < (1 << 20); i++)
		big1[i] = big2[i] = 1.0f;
	struct gguf_writer *w = gguf_writer_create(0);
	int64_t ne_s[1] = {256}, ne_b[2] = {1024, 1024};
	CHECK(w && gguf_writer_add_tensor(w, "big1", KT_F32, 2, ne_b, big1) == 0 &&
	          gguf_writer_add_tensor(w, "small", KT_F32, 1, ne_s, small) == 0 &&
	          gguf_writer_add_tensor(w, "big2", KT_F32, 2, ne_b, big2) == 0,
	      "add tensors");
	gguf_writer_set_sparse(w, (size_t)1 << 20);
	struct errbuf e = {0};
	CHECK(gguf_writer_write(w, path, &e) == 0, "write: %s", e.msg);
	gguf_writer_destroy(w);
	struct stat st;
	CHECK(stat(path, &st) == 0, "stat");
	CHECK(st.st_size > 8 * (1 << 20), "file length %lld covers both 4 MiB tensors",
	      (long long)st.st_size);
	printf("sparse file: %lld bytes long, %lld bytes allocated\n", (long long)st.st_size,
	       (long long)st.st_blocks * 512);
	CHECK((long long)st.st_blocks * 512 < 2 * (1 << 20), "holes take no disk (%lld bytes allocated)",
	      (long long)st.st_blocks * 512);
	struct gguf_ctx *g = NULL;
	CHECK(gguf_open(&g, path, &e) == 0, "reopen: %s", e.msg);
	if (g) {
		const struct gguf_tensor *ts = gguf_find_tensor(g, "small"),
		                         *tb = gguf_find_tensor(g, "big2");
		CHECK(ts && memcmp(ts->data, small, sizeof(small)) == 0, "small tensor written");
		bool zero = tb != NULL;
		for (size_t i = 0; tb && i < tb->nbytes; i++)
			zero = zero && ((const unsigned char *)tb->data)[i] == 0;
		CHECK(zero, "big tensor reads as zeros");
		gguf_close(g);
	}
	unlink(path);
	printf("%s\n", n_fail ? "FAILED" : "all passed");
	return n_fail ? 1 : 0;
}
