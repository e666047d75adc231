/* The model command-line interfaces other tools script: `tandem logits` (float32 rows equal to
 * the reference logits within 1e-4; --all and last-only) and `tandem generate --ids` (the
 * reference greedy continuation), plus bad arguments / files giving exit code 2 and one line. */
#include <sys/wait.h>

#include "tests/model/refs.h"

static char tandem[256];

static int run(const char *cmd, char *out, size_t cap)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ids_csv(const int32_t *ids, int n, char *buf, size_t cap)
{
	size_t o = 0;
	for (int i = 0; i < n && o + 16 < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", ids[i]);
}

int main(void)
{
	const char *b = getenv("BUILD");
	snprintf(tandem, sizeof(tandem), "%s/tandem", b ? b : "build");
	char cmd[8192], out[8192], csv[4096];
	const char *stem = "glm-dsa-tiny-BF16";
	json_t *man = ref_manifest(stem);
	int n = 0;
	const char *name = "";
	int32_t *ids = NULL;
	for (size_t i = 0; (ids = ref_prompt(man, i, &n, &name)); i++) {
		if (strcmp(name, "rand64") == 0)
			break;
		free(ids);
	}
	ids_csv(ids, n, csv, sizeof(csv));
	snprintf(cmd, sizeof(cmd),
	         "%s logits -m " DATA
	         "/models/%s.gguf --tokens %s --all --threads 2 -o /tmp/tandem_cli_logits.%d.f32 2>&1",
	         tandem, stem, csv, (int)getpid());
	int rc = run(cmd, out, sizeof(out));
	CHECK(rc == 0, "logits --all exit %d: %s", rc, out);
	char path[128];
	snprintf(path, sizeof(path), "/tmp/tandem_cli_logits.%d.f32", (int)getpid());
	size_t nb, nr;
	float *got = NULL, *ref = ref_array(stem, "det_p64_logits.f32.bin", &nr);
	FILE *f = fopen(path, "rb");
	if (f) {
		got = malloc(nr);
		nb = fread(got, 1, nr + 1, f);
		fclose(f);
		CHECK(nb == nr, "logits --all wrote %zu bytes, want %zu", nb, nr);
		double d = max_abs_diff(got, ref, nr / 4);
		printf("tandem logits --all rand64: max|d| vs det_p64_logits = %.3g\n", d);
		CHECK(d <= 1e-4, "CLI logits differ by %g", d);
	} else {
		CHECK(0, "no output file");
	}
	remove(path);
	/* generate --ids: reference continuation of rand5 */
	int32_t *p5 = ref_prompt(man, 1, &n, &name);
	ids_csv(p5, n, csv, sizeof(csv));
	snprintf(cmd, sizeof(cmd),
	         "%s generate -m " DATA "/models/%s.gguf --tokens %s -n 24 --ids --ignore-eos", tandem, stem,
	         csv);
	rc = run(cmd, out, sizeof(out));
	json_t *cases = json_object_get(json_object_get(man, "npref"), "greedy");
	char want[1024] = "";
	for (size_t i = 0; i < json_array_size(cases); i++) {
		json_t *c = json_array_get(cases, i);
		if (strcmp(json_string_value(json_object_get(c, "prompt")), name) == 0) {
			size_t o = 0;
			for (int j = 0; j < 24; j++)
				o += (size_t)snprintf(want + o, sizeof(want) - o, "%s%lld", j ? " " : "",
				                      (long long)json_integer_value(json_array_get(
				                          json_object_get(c, "new_ids"), (size_t)j)));
			snprintf(want + o, sizeof(want) - o, "\n");
		}
	}
	printf("tandem generate --ids %s: %s", name, out);
	CHECK(rc == 0 && strcmp(out, want) == 0, "generate gave '%s' want '%s'", out, want);
	/* --chat: the model's template renders the messages; 6 ids come back */
	char chatp[128];
	snprintf(chatp, sizeof(chatp), "/tmp/tandem_cli_chat.%d.json", (int)getpid());
	FILE *cf = fopen(chatp, "w");
	if (cf) {
		fputs("[{\"role\": \"user\", \"content\": \"Hello <|user|> there\"}]", cf);
		fclose(cf);
	}
	snprintf(cmd, sizeof(cmd), "%s generate -m " DATA "/models/%s.gguf --chat %s -n 6 --ids --ignore-eos",
	         tandem, stem, chatp);
	rc = run(cmd, out, sizeof(out));
	int n_ids = 0;
	for (char *c = out; *c; c++)
		n_ids += (c == out || c[-1] == ' ') && *c >= '0' && *c <= '9';
	printf("tandem generate --chat: %s", out);
	CHECK(rc == 0 && n_ids == 6, "generate --chat: exit %d, %d ids", rc, n_ids);
	remove(chatp);
	/* errors: exit 2, one line naming the problem */
	const char *bad[] = {
	    "logits -m " DATA "/models/glm-dsa-tiny-BF16.gguf --tokens 1,x -o /dev/null",
	    "logits -m /nonexistent.gguf --tokens 1 -o /dev/null",
	    "logits -m " DATA "/models/glm-dsa-tiny-BF16.gguf --tokens 4096 -o /dev/null",
	    "logits -m " DATA "/models/glm-dsa-tiny-BF16.gguf --tokens 1 --tp 4 -o /dev/null",
	    "generate -m " DATA "/models/glm-dsa-tiny-BF16.gguf --tokens 1 -n 2 --greedy --temperature 1",
	    "generate -m " DATA "/models/glm-dsa-tiny-BF16.gguf -n 2",
	    "generate -m " DATA "/refs/glm-dsa-tiny-BF16/manifest.json --tokens 1 -n 2",
	    "generate -m " DATA "/models/glm-dsa-tiny-BF16.gguf --chat /nonexistent.json -n 2",
	    "generate -m " DATA "/models/glm-dsa-tiny-BF16.gguf --chat " DATA
	    "/models/glm-dsa-tiny.config.json -n 2",
	    NULL};
	for (int i = 0; bad[i]; i++) {
		snprintf(cmd, sizeof(cmd), "%s %s 2>&1 >/dev/null", tandem, bad[i]);
		rc = run(cmd, out, sizeof(out));
		int lines = 0;
		for (char *c = out; *c; c++)
			lines += *c == '\n';
		printf("exit %d: %s", rc, out);
		CHECK(rc == 2 && lines == 1, "'%s': exit %d, %d lines", bad[i], rc, lines);
	}
	free(got);
	free(ref);
	free(ids);
	free(p5);
	json_decref(man);
	printf("%s (%d failures)\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
