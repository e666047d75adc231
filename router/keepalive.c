/* SSE keep-alive comments (see keepalive.h). The timer ticks at a quarter of the interval while
 * any stream is watched and is stopped otherwise, so an idle router does not wake up for it; a
 * stream therefore gets a comment after between 1 and 1.25 intervals of silence. The timer is
 * unreferenced: it never keeps the loop (and a draining router) alive on its own. */
#include "router/keepalive.h"

#include "router/http.h"

static const char comment[] = ": keep-alive\n\n";

static void tick_cb(uv_timer_t *t)
{
	struct keepalive *ka = t->data;
	uint64_t now = uv_hrtime();
	uint64_t due_ns = ka->interval_ms * 1000000u;
	struct keepalive_entry *next;
	for (struct keepalive_entry *en = ka->head; en; en = next) {
		/* a write may end the stream at once (a client that stopped reading is cut off), and
		 * with it the call that holds en: nothing of en is read after the write */
		next = en->next;
		if (!en->conn || now - en->t_last_ns < due_ns)
			continue;
		en->t_last_ns = now;
		ka->n_sent++;
		http_stream_write(en->conn, comment, sizeof(comment) - 1);
	}
}

void keepalive_init(struct keepalive *ka, uv_loop_t *loop, uint64_t interval_ms)
{
	*ka = (struct keepalive){.interval_ms = interval_ms};
	uv_timer_init(loop, &ka->timer);
	ka->timer.data = ka;
	uv_unref((uv_handle_t *)&ka->timer);
}

void keepalive_fini(struct keepalive *ka)
{
	if (!uv_is_closing((uv_handle_t *)&ka->timer))
		uv_close((uv_handle_t *)&ka->timer, NULL);
}

void keepalive_add(struct keepalive *ka, struct keepalive_entry *en, struct http_conn *c)
{
	if (!ka->interval_ms || en->ka)
		return;
	en->ka = ka;
	en->conn = c;
	en->t_last_ns = uv_hrtime();
	en->prev = NULL;
	en->next = ka->head;
	if (ka->head)
		ka->head->prev = en;
	ka->head = en;
	ka->n_entries++;
	if (!ka->timer_on) {
		uint64_t tick = ka->interval_ms / 4 ? ka->interval_ms / 4 : 1;
		uv_timer_start(&ka->timer, tick_cb, tick, tick);
		ka->timer_on = true;
	}
}

void keepalive_touch(struct keepalive_entry *en)
{
	if (en->ka)
		en->t_last_ns = uv_hrtime();
}

void keepalive_remove(struct keepalive_entry *en)
{
	struct keepalive *ka = en->ka;
	if (!ka)
		return;
	if (en->prev)
		en->prev->next = en->next;
	else
		ka->head = en->next;
	if (en->next)
		en->next->prev = en->prev;
	en->prev = en->next = NULL;
	en->ka = NULL;
	en->conn = NULL;
	if (--ka->n_entries == 0 && ka->timer_on) {
		uv_timer_stop(&ka->timer);
		ka->timer_on = false;
	}
}
