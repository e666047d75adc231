/* A model file truncated after it was opened (the mapping outlives the bytes): the load reads the
 * norm vectors from the mapping, and the pages past the new end raise SIGBUS there. The loader must
 * turn that into an error naming a tensor, not die. A copy of each tiny test model is opened, cut
 * at the page holding its last norm vector (by file offset), and loaded on the CPU backend; then
 * the uncut copy loads (the guard leaves good files alone). */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf/gguf.h"
#include "tests/model/refs.h"

static struct sigaction bus_before; /* the SIGBUS disposition at start (ASan has its own) */

static int copy_file(const char *from, const char *to)
{
	int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	struct stat st;
	int rc = -1;
	if (in >= 0 && out >= 0 && fstat(in, &st) == 0) {
		char *b = malloc((size_t)st.st_size);
		if (b && read(in, b, (size_t)st.st_size) == st.st_size &&
		    write(out, b, (size_t)st.st_size) == st.st_size)
			rc = 0;
		free(b);
	}
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return rc;
}

static void test_model(const char *stem)
{
	char src[512], dst[64];
	snprintf(src, sizeof(src), DATA "/models/%s.gguf", stem);
	snprintf(dst, sizeof(dst), "/tmp/test_model_truncated_%d.gguf", (int)getpid());
	if (copy_file(src, dst)) {
		CHECK(0, "%s: cannot copy", stem);
		return;
	}
	struct gguf_ctx *g = NULL;
	struct errbuf e = {0};
	CHECK(gguf_open(&g, dst, &e) == 0, "%s: open: %s", stem, e.msg);
	if (!g)
		goto out;
	const struct gguf_tensor *last = NULL;
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor(g, i);
		if (t->n_dims == 1 && (!last || t->file_offset > last->file_offset))
			last = t;
	}
	CHECK(last != NULL, "%s: no norm vector", stem);
	if (last) {
		off_t cut = (off_t)(last->file_offset & ~(uint64_t)4095);
		CHECK(truncate(dst, cut) == 0, "truncate");
		struct model_opts o;
		model_opts_default(&o);
		o.quiet = true;
		struct model *m = NULL;
		e = (struct errbuf){0};
		int rc = model_load_gguf(&m, g, &o, &e);
		printf("%-22s cut at %lld (before %s): rc %d \"%s\"\n", stem, (long long)cut, last->name, rc,
		       e.msg);
		CHECK(rc != 0 && strstr(e.msg, "tensor ") && strstr(e.msg, "SIGBUS"),
		      "%s: the load of a truncated file should fail naming a tensor: rc %d, %s", stem, rc,
		      e.msg);
		if (!rc)
			model_destroy(m);
	}
	gguf_close(g);
	struct sigaction sa;
	sigaction(SIGBUS, NULL, &sa);
	CHECK(sa.sa_handler == bus_before.sa_handler, "the SIGBUS disposition is not back to what it was");
	/* the uncut file still loads */
	CHECK(copy_file(src, dst) == 0, "copy");
	struct model *m = NULL;
	struct model_opts o;
	model_opts_default(&o);
	o.quiet = true;
	CHECK(model_load(&m, dst, &o, &e) == 0, "%s: the uncut copy does not load: %s", stem, e.msg);
	model_destroy(m);
out:
	unlink(dst);
}

int main(void)
{
	sigaction(SIGBUS, NULL, &bus_before);
	for (int i = 0; ref_models[i]; i++)
		test_model(ref_models[i]);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
