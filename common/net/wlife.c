/* Worker life cycle shared by tandem-prefill and tandem-decode (see wlife.h): the registered
 * gauge, readiness, the ready file, drain and stop. What differs between the roles (their
 * requests, their engine) stays in their worker.c behind the callbacks. */
#include "common/net/wlife.h"

#include <stdio.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/net/metrics.h"
#include "common/net/msg.h"
#include "common/net/runtime.h"
#include "common/net/session.h"

void wlife_init(struct wlife *l, const char *role, const char *name, const char *ready_file,
                uint32_t drain_timeout_ms, const char *on_drain_deadline, struct metrics *reg,
                const struct wlife_cbs *cbs)
{
	*l = (struct wlife){.role = role,
	                    .name = name,
	                    .ready_file = ready_file,
	                    .on_drain_deadline = on_drain_deadline,
	                    .drain_timeout_ms = drain_timeout_ms,
	                    .cbs = *cbs};
	l->m_registered =
	    metrics_gauge(reg, "tandem_worker_registered", NULL, "1 while registered with the router");
}

static void drain_timeout_cb(uv_timer_t *t)
{
	struct wlife *l = t->data;
	char what[160];
	l->cbs.describe_cb(l->cbs.ud, what, sizeof(what));
	LOG_WARN(l->role, "drain deadline passed with %s: %s", what, l->on_drain_deadline);
	wlife_stop(l);
}

void wlife_start(struct wlife *l, uv_loop_t *loop, struct runtime *rt)
{
	l->rt = rt;
	uv_timer_init(loop, &l->drain_timer);
	l->drain_timer.data = l;
	l->timer_on = true;
}

void wlife_fini(struct wlife *l)
{
	if (l->ready_file && l->ready_file[0])
		unlink(l->ready_file);
}

/* Written to a temporary name and renamed, so a reader never sees half a file. */
static void write_ready_file(struct wlife *l, uint32_t worker_id)
{
	if (!l->ready_file || !l->ready_file[0])
		return;
	char tmp[1100];
	snprintf(tmp, sizeof(tmp), "%s.tmp", l->ready_file);
	FILE *f = fopen(tmp, "w");
	if (!f) {
		LOG_WARN(l->role, "cannot write ready file %s", tmp);
		return;
	}
	char extra[256] = "";
	if (l->cbs.ready_extra_cb)
		l->cbs.ready_extra_cb(l->cbs.ud, extra, sizeof(extra));
	fprintf(f, "{\"pid\": %d, \"metrics_port\": %d, \"name\": \"%s\", \"worker_id\": %u%s}\n",
	        (int)getpid(), l->rt ? runtime_metrics_port(l->rt) : 0, l->name, worker_id, extra);
	fclose(f);
	rename(tmp, l->ready_file);
}

/* ---- the session, wrapped ---- */

static void fill_hello_cb(void *ud, struct msg_hello *h)
{
	struct wlife *l = ud;
	l->role_session_cbs.fill_hello_cb(l->role_session_cbs.ud, h);
}

static void fill_heartbeat_cb(void *ud, struct msg_heartbeat *hb)
{
	struct wlife *l = ud;
	l->role_session_cbs.fill_heartbeat_cb(l->role_session_cbs.ud, hb);
	hb->draining = l->draining;
}

static void on_registered_cb(void *ud, const struct msg_hello_ack *ack)
{
	struct wlife *l = ud;
	metrics_set(l->m_registered, 1);
	runtime_notify_ready(l->rt);
	write_ready_file(l, session_worker_id(l->sess));
	if (l->role_session_cbs.on_registered_cb)
		l->role_session_cbs.on_registered_cb(l->role_session_cbs.ud, ack);
}

static int on_msg_cb(void *ud, struct msg *m)
{
	struct wlife *l = ud;
	if (m->type == MSG_DRAIN) {
		wlife_start_drain(l, m->u.drain.deadline_ms);
		return 0;
	}
	return l->role_session_cbs.on_msg_cb(l->role_session_cbs.ud, m);
}

static void on_lost_cb(void *ud, const char *why)
{
	struct wlife *l = ud;
	metrics_set(l->m_registered, 0);
	l->role_session_cbs.on_lost_cb(l->role_session_cbs.ud, why);
}

int wlife_start_session(struct wlife *l, uv_loop_t *loop, const struct session_opts *o,
                        const struct session_cbs *role_cbs, struct errbuf *e)
{
	l->role_session_cbs = *role_cbs;
	struct session_cbs sc = {.fill_hello_cb = fill_hello_cb,
	                         .fill_heartbeat_cb = fill_heartbeat_cb,
	                         .on_registered_cb = on_registered_cb,
	                         .on_msg_cb = on_msg_cb,
	                         .on_lost_cb = on_lost_cb,
	                         .ud = l};
	int rc = session_start(loop, o, &sc, &l->sess, e);
	if (rc)
		l->sess = NULL;
	return rc;
}

bool wlife_is_ready(const struct wlife *l)
{
	return l->sess && session_is_registered(l->sess) && !l->draining;
}

bool wlife_is_ready_cb(void *ud)
{
	return wlife_is_ready(ud);
}

bool wlife_is_healthy_cb(void *ud)
{
	struct wlife *l = ud;
	return l->cbs.is_healthy_cb(l->cbs.ud);
}

void wlife_on_signal_cb(void *ud, int signum)
{
	wlife_start_drain(ud, 0);
}

void wlife_stop(struct wlife *l)
{
	if (l->stopping)
		return;
	l->stopping = true;
	runtime_notify_stopping(l->rt);
	if (l->timer_on) {
		uv_timer_stop(&l->drain_timer);
		uv_close((uv_handle_t *)&l->drain_timer, NULL);
		l->timer_on = false;
	}
	l->cbs.stop_cb(l->cbs.ud);
	session_stop(l->sess);
	runtime_stop(l->rt);
}

void wlife_maybe_finish_drain(struct wlife *l)
{
	if (l->draining && !l->stopping && l->cbs.is_idle_cb(l->cbs.ud)) {
		LOG_INFO(l->role, "drained: nothing left in flight; exiting");
		wlife_stop(l);
	}
}

void wlife_start_drain(struct wlife *l, uint32_t deadline_ms)
{
	if (l->draining)
		return;
	l->draining = true;
	uint32_t ms = deadline_ms && deadline_ms < l->drain_timeout_ms ? deadline_ms : l->drain_timeout_ms;
	char what[160];
	l->cbs.describe_cb(l->cbs.ud, what, sizeof(what));
	LOG_INFO(l->role, "draining: %s, deadline %u ms", what, ms);
	struct msg m;
	msg_init(&m, MSG_DRAIN);
	m.u.drain.deadline_ms = ms;
	struct errbuf e;
	if (l->sess && session_send(l->sess, &m, &e) == 0)
		session_heartbeat_now(l->sess);
	if (l->timer_on)
		uv_timer_start(&l->drain_timer, drain_timeout_cb, ms, 0);
	wlife_maybe_finish_drain(l);
}
