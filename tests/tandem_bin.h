/* Tests that run the real tandem binary (tandem mkmodel, tandem inspect): where it is, and one call of
 * it with a shell-free argument list. Header-only (each test is one binary). */
#ifndef TANDEM_TESTS_TANDEM_BIN_H
#define TANDEM_TESTS_TANDEM_BIN_H

#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* $BUILD/tandem when BUILD is set and it is there, else ../tandem next to this test binary
 * (build/tests/x -> build/tandem) */
static inline void tandem_bin_find(char *out, size_t size)
{
	const char *b = getenv("BUILD");
	if (b && *b) {
		snprintf(out, size, "%s/tandem", b);
		if (access(out, X_OK) == 0)
			return;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = '\0';
	snprintf(out, size, "%s/../tandem", dirname(exe));
}

/* Runs tandem (path) with args (NULL-terminated, at most 30) and its stderr to /dev/null; the exit
 * code, or -1 if it did not exit */
static inline int tandem_bin_run(const char *tandem, const char *const *args)
{
	pid_t pid = fork();
	if (pid == 0) {
		const char *argv[32];
		int n = 0;
		argv[n++] = tandem;
		for (; *args && n < 31; args++)
			argv[n++] = *args;
		argv[n] = NULL;
		int devnull = open("/dev/null", O_WRONLY);
		if (devnull >= 0)
			dup2(devnull, 2);
		execv(tandem, (char *const *)argv);
		_exit(127);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
