/* Stop-string matcher (see stop.h). */
#include "decode/stop.h"

#include <stdlib.h>
#include <string.h>

int stop_init(struct stop_matcher *m, const struct tok *t, char **stop, uint32_t n_stop)
{
	memset(m, 0, sizeof(*m));
	if (!t || !n_stop)
		return 0;
	m->t = t;
	m->stop = stop;
	m->n_stop = n_stop;
	m->stop_len = malloc(n_stop * sizeof(size_t));
	if (!m->stop_len)
		return -ENOMEM;
	for (uint32_t i = 0; i < n_stop; i++) {
		m->stop_len[i] = strlen(stop[i]);
		if (m->stop_len[i] > m->max_len)
			m->max_len = m->stop_len[i];
	}
	tok_stream_init(&m->ts, t, TOK_DECODE_SKIP_SPECIAL);
	m->cap = m->max_len + tok_stream_max_out(t) + 8;
	m->buf = malloc(m->cap);
	if (!m->buf) {
		free(m->stop_len);
		m->stop_len = NULL;
		return -ENOMEM;
	}
	return 0;
}

void stop_fini(struct stop_matcher *m)
{
	free(m->buf);
	free(m->stop_len);
	memset(m, 0, sizeof(*m));
}

int stop_feed(struct stop_matcher *m, int32_t token)
{
	if (!m->buf)
		return -1;
	size_t n_out = 0;
	struct errbuf e;
	if (tok_stream_feed(&m->ts, token, m->buf + m->n_buf, m->cap - m->n_buf, &n_out, &e))
		return -1; /* an id the tokenizer does not know cannot complete a stop string */
	size_t old = m->n_buf;
	m->n_buf += n_out;
	int found = -1;
	size_t found_at = SIZE_MAX;
	for (uint32_t i = 0; i < m->n_stop; i++) {
		size_t L = m->stop_len[i];
		if (L == 0 || L > m->n_buf)
			continue;
		/* only occurrences that end in the new bytes are new */
		size_t from = old >= L - 1 ? old - (L - 1) : 0;
		const char *hit = memmem(m->buf + from, m->n_buf - from, m->stop[i], L);
		if (hit && (size_t)(hit - m->buf) < found_at) {
			found = (int)i;
			found_at = (size_t)(hit - m->buf);
		}
	}
	/* keep the last max_len - 1 bytes: a stop string can start in them */
	size_t keep = m->max_len > 0 ? m->max_len - 1 : 0;
	if (m->n_buf > keep) {
		memmove(m->buf, m->buf + m->n_buf - keep, keep);
		m->n_buf = keep;
	}
	return found;
}
