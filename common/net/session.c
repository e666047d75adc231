/* Worker -> router control session (see session.h for the state machine). */
#include "common/net/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/net/conn.h"
#include "common/net/frame.h"

enum sess_state { SESS_DIALING, SESS_HELLO_SENT, SESS_REGISTERED, SESS_BACKOFF, SESS_STOPPED };

struct session {
	uv_loop_t *loop;
	struct session_opts o;
	char addr[256];
	struct session_cbs cb;
	enum sess_state state;
	struct conn *c;
	uv_timer_t timer; /* backoff / hello deadline */
	uv_timer_t hb; /* heartbeat */
	uint32_t backoff_ms;
	uint32_t heartbeat_ms;
	uint32_t worker_id;
	int n_failures; /* consecutive failed dials: only the first few are logged at WARN */
	int n_refusals; /* Error answers to Hello since the last successful registration */
	bool free_on_close;
	int n_handles;
};

static void dial(struct session *s);

static void handles_closed_cb(uv_handle_t *h)
{
	struct session *s = h->data;
	if (--s->n_handles == 0)
		free(s);
}

static void maybe_free(struct session *s)
{
	if (s->state == SESS_STOPPED && !s->c && s->free_on_close) {
		s->free_on_close = false;
		uv_close((uv_handle_t *)&s->timer, handles_closed_cb);
		uv_close((uv_handle_t *)&s->hb, handles_closed_cb);
	}
}

static void backoff_cb(uv_timer_t *t)
{
	struct session *s = t->data;
	if (s->state == SESS_BACKOFF)
		dial(s);
}

static void schedule_redial(struct session *s)
{
	if (s->state == SESS_STOPPED)
		return;
	s->state = SESS_BACKOFF;
	uv_timer_stop(&s->hb);
	uv_timer_start(&s->timer, backoff_cb, s->backoff_ms, 0);
	s->backoff_ms = s->backoff_ms * 2 > s->o.backoff_max_ms ? s->o.backoff_max_ms : s->backoff_ms * 2;
}

static void send_heartbeat(struct session *s)
{
	if (s->state != SESS_REGISTERED || !s->c)
		return;
	struct msg m;
	msg_init(&m, MSG_HEARTBEAT);
	if (s->cb.fill_heartbeat_cb)
		s->cb.fill_heartbeat_cb(s->cb.ud, &m.u.heartbeat);
	struct errbuf e;
	if (conn_send(s->c, &m, &e))
		LOG_WARN("session", "heartbeat to router not sent: %s", e.msg);
}

static void hb_cb(uv_timer_t *t)
{
	send_heartbeat(t->data);
}

void session_heartbeat_now(struct session *s)
{
	send_heartbeat(s);
}

static void hello_timeout_cb(uv_timer_t *t)
{
	struct session *s = t->data;
	if (s->state == SESS_HELLO_SENT && s->c) {
		LOG_WARN("session", "router %s did not answer Hello within %u ms", s->addr,
		         s->o.hello_timeout_ms);
		conn_close(s->c, "hello timeout");
	}
}

static int on_msg(struct conn *c, struct msg *m, void *ud)
{
	struct session *s = ud;
	if (s->state == SESS_HELLO_SENT) {
		if (m->type == MSG_ERROR) {
			/* ERROR the first time; while the refusal repeats (same cause, redialing), only now
			 * and then */
			if (s->n_refusals++ % 60 == 0)
				LOG_ERROR("session",
				          "router %s refused registration: %s (%s); retrying with backoff "
				          "(up to %u ms)",
				          s->addr, m->u.error.message, msg_error_name(m->u.error.code),
				          s->o.backoff_max_ms);
			return -1;
		}
		if (m->type != MSG_HELLO_ACK) {
			conn_close_error(c, MSG_ERR_PROTOCOL, "expected HelloAck, got %s",
			                 msg_type_name(m->type));
			return 0;
		}
		if (m->u.hello_ack.protocol_version != PROTOCOL_VERSION) {
			LOG_ERROR("session", "router speaks protocol version %u, this worker %d",
			          m->u.hello_ack.protocol_version, PROTOCOL_VERSION);
			return -1;
		}
		uv_timer_stop(&s->timer);
		s->state = SESS_REGISTERED;
		s->worker_id = m->u.hello_ack.worker_id;
		s->backoff_ms = s->o.backoff_min_ms;
		s->n_failures = 0;
		s->n_refusals = 0;
		if (m->u.hello_ack.heartbeat_ms >= 10 && m->u.hello_ack.heartbeat_ms <= 60000)
			s->heartbeat_ms = m->u.hello_ack.heartbeat_ms;
		/* the router's interval rules from now on: 3 missed heartbeats (+1 s slack) = gone */
		conn_set_idle_timeout(c, 3 * s->heartbeat_ms + 1000);
		LOG_INFO("session", "registered with router %s as worker %u (heartbeat %u ms)", s->addr,
		         s->worker_id, s->heartbeat_ms);
		uv_timer_start(&s->hb, hb_cb, s->heartbeat_ms, s->heartbeat_ms);
		if (s->cb.on_registered_cb)
			s->cb.on_registered_cb(s->cb.ud, &m->u.hello_ack);
		send_heartbeat(s);
		return 0;
	}
	if (s->state != SESS_REGISTERED)
		return 0;
	if (m->type == MSG_HEARTBEAT)
		return 0; /* receiving it is what matters: it keeps the idle timeout from firing */
	if (m->type == MSG_HELLO_ACK || m->type == MSG_HELLO) {
		conn_close_error(c, MSG_ERR_PROTOCOL, "unexpected %s after registration",
		                 msg_type_name(m->type));
		return 0;
	}
	return s->cb.on_msg_cb ? s->cb.on_msg_cb(s->cb.ud, m) : 0;
}

static void on_close(struct conn *c, int err, const char *why, void *ud)
{
	struct session *s = ud;
	bool was_registered = s->state == SESS_REGISTERED;
	s->c = NULL;
	uv_timer_stop(&s->hb);
	if (was_registered) {
		LOG_WARN("session", "lost the router %s: %s", s->addr, why);
		if (s->cb.on_lost_cb)
			s->cb.on_lost_cb(s->cb.ud, why);
	} else if (s->state != SESS_STOPPED) {
		s->n_failures++;
		if (s->n_failures <= 3 || s->n_failures % 50 == 0)
			LOG_WARN("session", "router %s not reachable (%s); retrying in %u ms", s->addr, why,
			         s->backoff_ms);
	}
	if (s->state == SESS_STOPPED) {
		maybe_free(s);
		return;
	}
	schedule_redial(s);
}

static void on_connect(struct conn *c, int status, void *ud)
{
	struct session *s = ud;
	if (status)
		return; /* on_close follows */
	struct msg m;
	msg_init(&m, MSG_HELLO);
	m.u.hello.protocol_version = PROTOCOL_VERSION;
	if (s->cb.fill_hello_cb)
		s->cb.fill_hello_cb(s->cb.ud, &m.u.hello);
	struct errbuf e;
	if (conn_send(c, &m, &e)) {
		LOG_ERROR("session", "cannot send Hello: %s", e.msg);
		conn_close(c, "hello not sent");
		return;
	}
	s->state = SESS_HELLO_SENT;
	uv_timer_start(&s->timer, hello_timeout_cb, s->o.hello_timeout_ms, 0);
}

static void dial(struct session *s)
{
	struct conn_opts co = {.max_frame = s->o.max_frame,
	                       .idle_timeout_ms = 3 * s->heartbeat_ms + 1000,
	                       .connect_timeout_ms = s->o.hello_timeout_ms,
	                       .on_msg_cb = on_msg,
	                       .on_close_cb = on_close,
	                       .on_connect_cb = on_connect,
	                       .ud = s};
	struct errbuf e;
	s->state = SESS_DIALING;
	if (conn_connect(s->loop, s->addr, &co, &s->c, &e)) {
		s->c = NULL;
		LOG_WARN("session", "cannot dial router %s: %s", s->addr, e.msg);
		schedule_redial(s);
	}
}

int session_start(uv_loop_t *loop, const struct session_opts *o, const struct session_cbs *cbs,
                  struct session **out, struct errbuf *e)
{
	char host[256];
	int port;
	bool is_unix;
	int rc = conn_parse_addr(o->router_addr, host, sizeof(host), &port, &is_unix, e);
	if (rc)
		return errbuf_prefix(e, "router address");
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return errbuf_set(e, -ENOMEM, "out of memory");
	s->loop = loop;
	s->o = *o;
	snprintf(s->addr, sizeof(s->addr), "%s", o->router_addr);
	s->o.router_addr = s->addr;
	if (!s->o.heartbeat_ms)
		s->o.heartbeat_ms = 1000;
	if (!s->o.hello_timeout_ms)
		s->o.hello_timeout_ms = 5000;
	if (!s->o.backoff_min_ms)
		s->o.backoff_min_ms = 100;
	if (!s->o.backoff_max_ms)
		s->o.backoff_max_ms = 5000;
	if (!s->o.max_frame)
		s->o.max_frame = FRAME_MAX_DEFAULT;
	s->cb = *cbs;
	s->heartbeat_ms = s->o.heartbeat_ms;
	s->backoff_ms = s->o.backoff_min_ms;
	uv_timer_init(loop, &s->timer);
	uv_timer_init(loop, &s->hb);
	s->timer.data = s;
	s->hb.data = s;
	s->n_handles = 2;
	s->free_on_close = true;
	dial(s);
	*out = s;
	return 0;
}

int session_send(struct session *s, const struct msg *m, struct errbuf *e)
{
	if (s->state != SESS_REGISTERED || !s->c)
		return errbuf_set(e, -ENOTCONN, "not registered with the router");
	int rc = conn_send(s->c, m, e);
	if (rc == ERR_LIMIT) {
		/* A router that stopped reading: dropping this message (a token, a Finish) would leave the
		 * request inconsistent, so treat the router as lost instead (on_lost frees everything). */
		LOG_WARN("session", "router %s is not reading (%s); dropping the connection", s->addr,
		         e ? e->msg : "");
		conn_close(s->c, "router not reading");
	}
	return rc;
}

bool session_is_registered(const struct session *s)
{
	return s->state == SESS_REGISTERED;
}
uint32_t session_worker_id(const struct session *s)
{
	return s->worker_id;
}

void session_stop(struct session *s)
{
	if (!s || s->state == SESS_STOPPED)
		return;
	s->state = SESS_STOPPED;
	uv_timer_stop(&s->timer);
	uv_timer_stop(&s->hb);
	if (s->c)
		conn_close(s->c, "worker stopping"); /* on_close frees */
	else
		maybe_free(s);
}
