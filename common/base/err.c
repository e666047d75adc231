/* Error buffer helpers and names for the shared error codes (err.h). */
#include "common/base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int errbuf_set(struct errbuf *e, int code, const char *fmt, ...)
{
	if (!e)
		return code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	e->code = code;
	return code;
}

int errbuf_prefix(struct errbuf *e, const char *fmt, ...)
{
	if (!e)
		return 0;
	char pre[256], old[sizeof(e->msg)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	memcpy(old, e->msg, sizeof(old));
	size_t n = strlen(pre);
	if (n > sizeof(e->msg) - 3)
		n = sizeof(e->msg) - 3;
	memcpy(e->msg, pre, n);
	memcpy(e->msg + n, ": ", 2);
	size_t rest = sizeof(e->msg) - n - 3;
	size_t m = strnlen(old, rest);
	memcpy(e->msg + n + 2, old, m);
	e->msg[n + 2 + m] = '\0';
	return e->code;
}

const char *err_name(int code)
{
	switch (code) {
	case 0: return "ok";
	case ERR_FORMAT: return "format error";
	case ERR_LIMIT: return "limit exceeded";
	case ERR_PROTO: return "protocol error";
	case ERR_UNSUPPORTED: return "unsupported";
	case ERR_NOTFOUND: return "not found";
	case ERR_CUDA: return "CUDA error";
	case ERR_NCCL: return "NCCL error";
	case ERR_UCX: return "UCX error";
	case ERR_CANCELLED: return "cancelled";
	case ERR_TIMEOUT: return "timed out";
	case ERR_MISMATCH: return "mismatch";
	default: break;
	}
	if (code < 0 && code > -ERR_BASE)
		return strerror(-code);
	return "unknown error";
}
