/* One line per event: time, role, rank, pid, level, module, message. The level is checked before
 * the arguments are evaluated. Request-related lines carry `rid=<id>` in the message. */
#ifndef TANDEM_BASE_LOG_H
#define TANDEM_BASE_LOG_H

#include "common/base/err.h"

enum log_level { LOG_LVL_ERROR = 0, LOG_LVL_WARN = 1, LOG_LVL_INFO = 2, LOG_LVL_DEBUG = 3 };

extern int log_level_max; /* global log config (allowed by STYLE.md) */

void log_init(const char *role, int rank);
int log_parse_level(const char *s); /* "error|warn|info|debug" -> level, -1 if unknown */
void log_write(int level, const char *module, const char *fmt, ...) TD_PRINTF(3, 4);

#define LOG_AT(lvl, mod, ...)                                                                                \
	do {                                                                                                 \
		if ((lvl) <= log_level_max)                                                                  \
			log_write((lvl), (mod), __VA_ARGS__);                                                \
	} while (0)
#define LOG_ERROR(mod, ...) LOG_AT(LOG_LVL_ERROR, mod, __VA_ARGS__)
#define LOG_WARN(mod, ...) LOG_AT(LOG_LVL_WARN, mod, __VA_ARGS__)
#define LOG_INFO(mod, ...) LOG_AT(LOG_LVL_INFO, mod, __VA_ARGS__)
#define LOG_DEBUG(mod, ...) LOG_AT(LOG_LVL_DEBUG, mod, __VA_ARGS__)

/* Broken invariant: print file:line and abort. Always on (not compiled out). */
#define TD_ASSERT(cond)                                                                                      \
	do {                                                                                                 \
		if (!(cond))                                                                                 \
			td_assert_fail(#cond, __FILE__, __LINE__);                                           \
	} while (0)
__attribute__((noreturn)) void td_assert_fail(const char *what, const char *file, int line);

#endif
