/* Log line writer (see log.h). Lines go to stderr, written with one write() so that lines from
 * several threads or processes sharing a terminal or journal do not interleave. */
#include "common/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int log_level_max = LOG_LVL_INFO;
static char log_role[32] = "tandem";
static int log_rank = -1;

void log_init(const char *role, int rank)
{
	snprintf(log_role, sizeof(log_role), "%s", role ? role : "tandem");
	log_rank = rank;
	const char *env = getenv("TANDEM_LOG");
	if (env && log_parse_level(env) >= 0)
		log_level_max = log_parse_level(env);
}

int log_parse_level(const char *s)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	for (int i = 0; i < 4; i++)
		if (s && strcmp(s, names[i]) == 0)
			return i;
	return -1;
}

void log_write(int level, const char *module, const char *fmt, ...)
{
	static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
	char line[2048];
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s", tm.tm_year + 1900,
	                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	                 (int)(tv.tv_usec / 1000), log_role);
	if (log_rank >= 0)
		n += snprintf(line + n, sizeof(line) - (size_t)n, "/%d", log_rank);
	n += snprintf(line + n, sizeof(line) - (size_t)n, " %d %s %s: ", (int)getpid(),
	              tags[level < 0   ? 0
	                   : level > 3 ? 3
	                               : level],
	              module);
	va_list ap;
	va_start(ap, fmt);
	if (n < (int)sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}

void td_assert_fail(const char *what, const char *file, int line)
{
	fprintf(stderr, "tandem: assertion failed at %s:%d: %s\n", file, line, what);
	abort();
}
