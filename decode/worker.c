/* tandem-decode, loop thread (see worker.h). A request's state here:
 *
 *   KvReserve ──▶ RESERVED ──KvReady (checks pass)──▶ RUNNING ──engine FINISH──▶ (freed)
 *                   │  └── KvRelease / Cancel / deadline / router lost ──▶ (freed)
 *                   └────────── KvReady fails a check ─────────────────────▶ (freed, Finish ERROR)
 *   RUNNING: Cancel / KvRelease / router lost set the sequence's cancelled flag; the engine hands
 *   the sequence back with a FINISH event and only then are its blocks freed (the engine may be
 *   reading them until that moment).
 *
 * Invariant: a request's blocks are returned to the pool exactly once, by blocks_return(), the
 * only caller of kv_pool_free (the pool aborts on a double free). Every request-related log line
 * carries rid=.
 *
 * LATE WRITES (quarantine). A reservation that ends before KvReady (KvRelease, Cancel, its
 * deadline, the router lost, drain) may still be the target of a prefill's puts: Cancel reaches
 * prefill and decode independently, a prefill may not have heard of it at all (router gone), and
 * puts over emulated-RMA transports are applied here whenever UCX is progressed. Reusing those
 * blocks at once would let a late put overwrite another request's KV. So such blocks go to a
 * quarantine list, not to the pool, and leave it only when
 *   - the prefill's fence is in the slot of the reservation's first block (pool.h): a prefill
 *     writes it after its last put to the request has reached remote completion (flush), so
 *     seeing it proves that nothing more comes; or
 *   - the quarantine deadline has passed: --kv-quarantine-ms (default 180 s), plus however much
 *     the reservation's prefill window (KvReserve.prefill_window_ms: the router gives a long
 *     prompt a longer prefill deadline) exceeds 120 s. A prefill never writes later than its
 *     write window (PrefillRequest.deadline_ms after it got the request: the same window; capped
 *     at 120 s by a prefill whose target does not announce per-attempt fences, see tandem.proto)
 *     and force-closes its endpoint when the window closes with puts unflushed, so the deadline
 *     is the bound for a prefill that died or lost every path to us. It is the only path that
 *     relies on a time bound and is counted and logged.
 * The router says when no writer can exist (KvRelease.no_writer: PrefillRequest never sent, or
 * PrefillDone received); then the blocks are freed at once. A reservation freed after KvReady
 * (decode ran) needs nothing: PrefillDone, hence KvReady, comes only after the prefill's flush.
 *
 * STALE FENCES. The router may prefill one reservation more than once (it lost the first prefill
 * worker and re-prefills elsewhere into the same blocks). The first attempt may still be alive and
 * fence late, while the second still writes; a fence that only named the rid would then free
 * blocks with a writer left. So each attempt has its own fence word (common/net/kvfence.h), the
 * router announces a new attempt here (KvReserve with a larger attempt, before it sends that
 * PrefillRequest), and only the latest attempt's word counts: an older attempt's word is ignored,
 * logged once and counted. If the old attempt's late fence overwrites the new one's, the blocks
 * wait for the quarantine deadline: slower, never unsafe. */
#include "decode/worker.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/gguf/gguf.h"
#include "common/model/model.h"
#include "common/net/crc32c.h"
#include "common/net/kvfence.h"
#include "common/net/kvx.h"
#include "common/net/metrics.h"
#include "common/net/runtime.h"
#include "common/net/session.h"
#include "common/net/trivial.h"
#include "common/net/wlife.h"
#include "common/tok/tok.h"
#include "decode/engine.h"
#include "decode/pool.h"

#define MAP_BUCKETS 4096
/* The write window the quarantine deadline (--kv-quarantine-ms, default 180 s) is sized for: the
 * router's default prefill deadline and the cap of a prefill worker that knows no longer ones. */
#define DC_DEFAULT_WRITE_WINDOW_MS 120000u
#define DC_WRITE_WINDOW_MAX_MS (6u * 3600u * 1000u) /* the longest any prefill honours */
#define TOKBUF_MAX 256

/* CHECKING: KvReady arrived; the received KV is being verified on a libuv pool thread (a long
 * prompt's CRCs must not stall the loop, which streams every other request's tokens). The blocks
 * are read by that thread until verify_done_cb: a Cancel meanwhile only marks the request. */
enum dreq_state { DREQ_RESERVED, DREQ_CHECKING, DREQ_RUNNING };

struct dreq {
	uint64_t rid;
	enum dreq_state state;
	uint32_t *blocks;
	uint32_t n_blocks;
	uint32_t n_prompt;
	uint32_t max_tokens;
	struct msg_sampling sampling;
	char **stop;
	uint32_t n_stop;
	uint32_t *stop_ids;
	uint32_t n_stop_ids;
	bool ignore_eos;
	uint32_t *prompt; /* optional (trivial KV check) */
	uint64_t deadline_ms; /* RESERVED: KvReady must come before this */
	uint64_t t_ready_ns;
	uint64_t quarantine_until_ms; /* in w->quarantine: free by then even without a fence */
	uint32_t attempt; /* the prefill attempt whose fence counts (STALE FENCES above) */
	uint64_t quarantine_ms; /* quarantine_ms + how much the prefill window exceeds 120 s */
	bool stale_fence_seen; /* logged once */
	/* CHECKING */
	uv_work_t verify;
	struct dc_worker *w;
	uint32_t *sums; /* owned copy of KvReady's checksums (NULL: not verified) */
	uint32_t n_sums;
	struct msg_token first;
	int verify_code; /* result (pool thread) */
	char verify_why[256];
	bool cancel_pending; /* loop: Cancel/KvRelease/lost arrived while CHECKING */
	int cancel_code;
	bool cancel_tell;
	struct dc_seq *seq; /* RUNNING: owned by the engine until its FINISH event */
	struct msg_token tokbuf[TOKBUF_MAX];
	uint32_t n_tokbuf;
	struct dreq *map_next;
};

struct dc_worker {
	const struct dc_config *c;
	uv_loop_t *loop;
	struct model *model;
	struct tok *tok;
	struct kvx *kvx;
	struct kv_pool pool;
	bool pool_pinned; /* pool.base page-locked for the model's device (model_host_pin) */
	struct dc_engine *eng;
	struct runtime *rt;
	struct metrics *reg;
	struct msg_kv_layout layout;
	uint8_t model_id[8];
	char model_name[MSG_NAME_MAX + 1];
	uint32_t max_seq_len;
	uint32_t vocab;
	struct dreq *map[MAP_BUCKETS];
	struct dreq *quarantine; /* released reservations whose blocks a prefill may still write */
	uint32_t n_quarantined_blocks;
	uint32_t n_reserved, n_running;
	struct wlife life; /* registration, readiness, drain, stop (common/net/wlife.h) */
	uv_poll_t ucx_poll;
	bool ucx_poll_on;
	uv_timer_t tick; /* reservation deadlines */
	struct metric *m_blocks_used, *m_blocks_free, *m_reserved;
	struct metric *m_fin_stop, *m_fin_length, *m_fin_cancelled, *m_fin_error;
	struct metric *m_refused, *m_released, *m_expired, *m_checksum_bad, *m_kv_rx_bytes;
	struct metric *m_ttft_decode; /* KvReady to first decode token */
	struct metric *m_quarantined, *m_fenced, *m_quarantine_expired, *m_stale_fences;
	uint32_t test_verify_delay_us, test_verify_min_tokens; /* TANDEM_TEST_VERIFY_DELAY, tests only */
	int exit_code;
};

void dc_config_default(struct dc_config *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "decode-%d", (int)getpid());
	snprintf(c->router, sizeof(c->router), "127.0.0.1:9100"); /* the router's default control_addr */
	snprintf(c->metrics, sizeof(c->metrics), "127.0.0.1:0");
	snprintf(c->engine, sizeof(c->engine), "model");
	snprintf(c->kv_dtype, sizeof(c->kv_dtype), "f32");
	snprintf(c->log_level, sizeof(c->log_level), "info");
	snprintf(c->backend, sizeof(c->backend), "cpu");
	c->graphs = 1;
	c->kv_upload_step_kb = 256 * 1024;
	c->verify_checksums = true;
	c->threads = 1;
	c->tp = 1;
	c->kv_blocks = 1024;
	c->max_batch = 64;
	c->default_max_tokens = 1024;
	c->reserve_timeout_ms = 60000;
	c->quarantine_ms = 180000;
	c->heartbeat_ms = 1000;
	c->drain_timeout_ms = 30000;
}

static uint64_t now_ms(void)
{
	return uv_hrtime() / 1000000u;
}

/* ---- requests map ------------------------------------------------------------------------------ */

static struct dreq **map_slot(struct dc_worker *w, uint64_t rid)
{
	struct dreq **pp = &w->map[rid % MAP_BUCKETS];
	while (*pp && (*pp)->rid != rid)
		pp = &(*pp)->map_next;
	return pp;
}

static void update_gauges(struct dc_worker *w)
{
	metrics_set(w->m_blocks_used, w->pool.n_blocks - w->pool.n_free);
	metrics_set(w->m_blocks_free, w->pool.n_free);
	metrics_set(w->m_reserved, w->n_reserved);
	metrics_set(w->m_quarantined, w->n_quarantined_blocks);
}

/* the one place blocks go back to the pool */
static void blocks_return(struct dc_worker *w, struct dreq *d)
{
	kv_pool_free(&w->pool, d->blocks, d->n_blocks);
	free(d->blocks);
	free(d);
}

/* has the current prefill attempt fenced this reservation (stopped writing its blocks for
 * good)? A fence of an earlier attempt is ignored (STALE FENCES at the top of this file). */
static bool is_fenced(struct dc_worker *w, struct dreq *d)
{
	if (!d->n_blocks)
		return false;
	uint64_t word = *kv_pool_fence(&w->pool, d->blocks[0]);
	if (word == kvfence_word(d->rid, d->attempt))
		return true;
	uint32_t stale;
	if (!d->stale_fence_seen && kvfence_is_stale(word, d->rid, d->attempt, &stale)) {
		d->stale_fence_seen = true;
		metrics_add(w->m_stale_fences, 1);
		LOG_WARN("decode",
		         "rid=%llu ignoring the fence of stale prefill attempt %u: attempt %u may still "
		         "write these %u blocks",
		         (unsigned long long)d->rid, stale, d->attempt, d->n_blocks);
	}
	return false;
}

/* Ends a request here. maybe_writer: a prefill may still be putting into its blocks (see the top
 * of this file); then the blocks go to quarantine unless the fence is already there. */
static void dreq_end(struct dc_worker *w, struct dreq *d, bool maybe_writer)
{
	struct dreq **pp = map_slot(w, d->rid);
	TD_ASSERT(*pp == d);
	*pp = d->map_next;
	d->map_next = NULL;
	bool reserved = d->state != DREQ_RUNNING;
	if (reserved)
		w->n_reserved--;
	else
		w->n_running--;
	for (uint32_t i = 0; i < d->n_stop; i++)
		free(d->stop[i]);
	free(d->stop);
	free(d->stop_ids);
	free(d->prompt);
	free(d->sums);
	d->stop = NULL, d->stop_ids = NULL, d->prompt = NULL, d->n_stop = 0, d->sums = NULL;
	if (reserved && maybe_writer) {
		kvx_progress(w->kvx); /* apply puts (and a fence) that have arrived already */
		if (!is_fenced(w, d)) {
			d->quarantine_until_ms = now_ms() + d->quarantine_ms;
			d->map_next = w->quarantine;
			w->quarantine = d;
			w->n_quarantined_blocks += d->n_blocks;
			LOG_INFO(
			    "decode",
			    "rid=%llu %u blocks quarantined until the prefill fences them (at most %llu ms)",
			    (unsigned long long)d->rid, d->n_blocks, (unsigned long long)d->quarantine_ms);
			update_gauges(w);
			wlife_maybe_finish_drain(&w->life);
			return;
		}
		metrics_add(w->m_fenced, 1);
	}
	blocks_return(w, d);
	update_gauges(w);
	wlife_maybe_finish_drain(&w->life);
}

static void dreq_free(struct dc_worker *w, struct dreq *d)
{
	dreq_end(w, d, false);
}

/* tick: blocks whose fence has arrived (or whose quarantine deadline passed) go back */
static void quarantine_scan(struct dc_worker *w, bool all)
{
	if (!w->quarantine)
		return;
	kvx_progress(w->kvx);
	uint64_t now = now_ms();
	bool changed = false;
	for (struct dreq **pp = &w->quarantine; *pp;) {
		struct dreq *d = *pp;
		bool fenced = is_fenced(w, d);
		if (!fenced && !all && now <= d->quarantine_until_ms) {
			pp = &d->map_next;
			continue;
		}
		*pp = d->map_next;
		w->n_quarantined_blocks -= d->n_blocks;
		if (fenced) {
			metrics_add(w->m_fenced, 1);
			LOG_DEBUG("decode", "rid=%llu fenced by the prefill: %u blocks free",
			          (unsigned long long)d->rid, d->n_blocks);
		} else if (!all) {
			metrics_add(w->m_quarantine_expired, 1);
			LOG_WARN(
			    "decode",
			    "rid=%llu no fence from the prefill within %llu ms: its %u blocks are reused "
			    "(the prefill's write window is over)",
			    (unsigned long long)d->rid, (unsigned long long)d->quarantine_ms, d->n_blocks);
		}
		blocks_return(w, d);
		changed = true;
	}
	if (changed)
		update_gauges(w);
}

/* ---- sending ------------------------------------------------------------------------------------ */

static void send_msg(struct dc_worker *w, const struct msg *m, uint64_t rid)
{
	struct errbuf e;
	if (session_send(w->life.sess, m, &e))
		LOG_DEBUG("decode", "rid=%llu %s not sent: %s", (unsigned long long)rid,
		          msg_type_name(m->type), e.msg);
}

static void send_error(struct dc_worker *w, uint64_t rid, int code, const char *text)
{
	struct msg m;
	msg_init(&m, MSG_ERROR);
	m.u.error.has_rid = rid != 0;
	m.u.error.rid = rid;
	m.u.error.code = code;
	snprintf(m.u.error.message, sizeof(m.u.error.message), "%s: %s", w->c->name, text);
	send_msg(w, &m, rid);
}

static void send_finish(struct dc_worker *w, const struct dreq *d, int reason, int code, int32_t stop_index,
                        uint32_t completion, const char *text)
{
	struct msg m;
	msg_init(&m, MSG_FINISH);
	struct msg_finish_m *f = &m.u.finish;
	f->rid = d->rid;
	f->reason = reason;
	f->prompt_tokens = d->n_prompt;
	f->completion_tokens = completion;
	f->error_code = code;
	f->stop_index = stop_index;
	if (text)
		snprintf(f->error_message, sizeof(f->error_message), "%s: %s", w->c->name, text);
	send_msg(w, &m, d->rid);
	struct metric *c = reason == MSG_FINISH_STOP        ? w->m_fin_stop
	                   : reason == MSG_FINISH_LENGTH    ? w->m_fin_length
	                   : reason == MSG_FINISH_CANCELLED ? w->m_fin_cancelled
	                                                    : w->m_fin_error;
	metrics_add(c, 1);
}

static void flush_tokens(struct dc_worker *w, struct dreq *d)
{
	if (!d->n_tokbuf)
		return;
	struct msg m;
	msg_init(&m, MSG_TOKENS);
	m.u.tokens.rid = d->rid;
	m.u.tokens.n_tokens = d->n_tokbuf;
	m.u.tokens.tokens = d->tokbuf;
	LOG_DEBUG("decode", "rid=%llu sending %u tokens (last %u)", (unsigned long long)d->rid, d->n_tokbuf,
	          d->tokbuf[d->n_tokbuf - 1].id);
	send_msg(w, &m, d->rid);
	d->n_tokbuf = 0;
}

/* ---- engine events -------------------------------------------------------------------------- */

static void events_cb(const struct dc_event *ev, uint32_t n, void *ud)
{
	struct dc_worker *w = ud;
	struct dreq *touched[1024];
	uint32_t n_touched = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct dreq *d = *map_slot(w, ev[i].rid);
		TD_ASSERT(d && d->state == DREQ_RUNNING); /* running requests are freed only below */
		if (ev[i].type == DC_EV_TOKEN) {
			if (d->t_ready_ns) {
				metrics_observe(w->m_ttft_decode,
				                (double)(uv_hrtime() - d->t_ready_ns) / 1e9);
				d->t_ready_ns = 0;
			}
			if (d->n_tokbuf == 0) {
				if (n_touched == 1024) {
					for (uint32_t k = 0; k < n_touched; k++)
						flush_tokens(w, touched[k]);
					n_touched = 0;
				}
				touched[n_touched++] = d;
			}
			d->tokbuf[d->n_tokbuf++] = ev[i].tok;
			if (d->n_tokbuf == TOKBUF_MAX)
				flush_tokens(w, d);
			continue;
		}
		/* FINISH: tokens first, then Finish, then the blocks go back */
		flush_tokens(w, d);
		const struct dc_event *f = &ev[i];
		if (f->reason == MSG_FINISH_ERROR)
			LOG_WARN("decode", "rid=%llu finished with error %s after %u tokens",
			         (unsigned long long)d->rid, msg_error_name(f->error_code),
			         f->completion_tokens);
		else
			LOG_INFO("decode", "rid=%llu finished (%s) after %u tokens%s",
			         (unsigned long long)d->rid, msg_finish_name(f->reason), f->completion_tokens,
			         f->stop_index >= 0 ? " (stop string)" : "");
		send_finish(w, d, f->reason, f->error_code, f->stop_index, f->completion_tokens,
		            f->reason == MSG_FINISH_ERROR ? msg_error_name(f->error_code) : NULL);
		dc_seq_free(f->seq);
		d->seq = NULL;
		for (uint32_t k = 0; k < n_touched; k++)
			if (touched[k] == d)
				touched[k] = NULL;
		dreq_free(w, d);
	}
	for (uint32_t k = 0; k < n_touched; k++)
		if (touched[k])
			flush_tokens(w, touched[k]);
}

/* ---- control messages --------------------------------------------------------------------- */

static char *dup_str(const char *s)
{
	return s ? strdup(s) : NULL;
}

static void on_kv_reserve(struct dc_worker *w, const struct msg_kv_reserve *r)
{
	char why[256];
	int code = MSG_ERR_INVALID_REQUEST;
	struct dreq *held = *map_slot(w, r->rid);
	if (held && held->state == DREQ_RESERVED && r->attempt > held->attempt) {
		/* the router re-prefills into these blocks: from now on only that attempt's fence
		 * counts (STALE FENCES at the top of this file). Not answered. */
		LOG_INFO("decode", "rid=%llu prefill attempt %u announced (was %u)",
		         (unsigned long long)r->rid, r->attempt, held->attempt);
		held->attempt = r->attempt;
		held->stale_fence_seen = false;
		return;
	}
	if (w->life.draining) {
		code = MSG_ERR_DRAINING;
		snprintf(why, sizeof(why), "worker is draining");
		goto refuse;
	}
	if (held) {
		code = MSG_ERR_DUPLICATE;
		snprintf(why, sizeof(why), "request id already holds a reservation here");
		goto refuse;
	}
	if (r->n_prompt_tokens == 0) {
		snprintf(why, sizeof(why), "empty prompt: there is no KV to decode from");
		goto refuse;
	}
	if (r->n_prompt && r->n_prompt != r->n_prompt_tokens) {
		/* the KV check reads prompt[p] for every prompt position (msg.c refuses this too) */
		snprintf(why, sizeof(why), "%zu prompt ids for a prompt of %u tokens", r->n_prompt,
		         r->n_prompt_tokens);
		goto refuse;
	}
	if (r->n_prompt_tokens >= w->max_seq_len) {
		snprintf(why, sizeof(why), "prompt of %u tokens leaves no room in the context of %u",
		         r->n_prompt_tokens, w->max_seq_len);
		goto refuse;
	}
	for (size_t i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] >= w->vocab) {
			snprintf(why, sizeof(why), "prompt token %zu has id %u outside the vocabulary", i,
			         r->prompt[i]);
			goto refuse;
		}
	uint32_t max_tokens = r->max_tokens ? r->max_tokens : (uint32_t)w->c->default_max_tokens;
	if (max_tokens > w->max_seq_len - r->n_prompt_tokens)
		max_tokens = w->max_seq_len - r->n_prompt_tokens; /* the context limit ends it (LENGTH) */
	uint32_t bs = w->layout.block_size;
	uint32_t need = (uint32_t)(((uint64_t)r->n_prompt_tokens + max_tokens + bs - 1) / bs);
	if (need > w->pool.n_blocks) {
		code = MSG_ERR_INVALID_REQUEST;
		snprintf(why, sizeof(why), "request needs %u KV blocks, the whole pool has %u", need,
		         w->pool.n_blocks);
		goto refuse;
	}
	struct dreq *d = calloc(1, sizeof(*d));
	if (!d) {
		code = MSG_ERR_INTERNAL;
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	d->blocks = malloc(need * sizeof(uint32_t));
	d->stop = calloc(r->n_stop ? r->n_stop : 1, sizeof(char *));
	d->stop_ids = malloc((r->n_stop_token_ids ? r->n_stop_token_ids : 1) * sizeof(uint32_t));
	d->prompt = r->n_prompt ? malloc(r->n_prompt * sizeof(uint32_t)) : NULL;
	bool oom = !d->blocks || !d->stop || !d->stop_ids || (r->n_prompt && !d->prompt);
	for (size_t i = 0; !oom && i < r->n_stop; i++) {
		d->stop[i] = dup_str(r->stop[i]);
		oom = !d->stop[i];
		d->n_stop = (uint32_t)i + 1;
	}
	if (oom || kv_pool_alloc(&w->pool, need, d->blocks)) {
		if (oom) {
			code = MSG_ERR_INTERNAL;
			snprintf(why, sizeof(why), "out of memory");
		} else {
			code = MSG_ERR_NO_CAPACITY;
			snprintf(why, sizeof(why), "KV pool full: request needs %u blocks, %u of %u free",
			         need, w->pool.n_free, w->pool.n_blocks);
		}
		for (uint32_t i = 0; i < d->n_stop; i++)
			free(d->stop[i]);
		free(d->stop);
		free(d->stop_ids);
		free(d->prompt);
		free(d->blocks);
		free(d);
		goto refuse;
	}
	d->rid = r->rid;
	d->attempt = r->attempt;
	/* --kv-quarantine-ms covers the default 120 s write window; a longer window (a long prompt:
	 * the router's deadline grows with its length) extends the quarantine by the difference */
	d->quarantine_ms = (uint64_t)w->c->quarantine_ms;
	uint32_t window =
	    r->prefill_window_ms < DC_WRITE_WINDOW_MAX_MS ? r->prefill_window_ms : DC_WRITE_WINDOW_MAX_MS;
	if (window > DC_DEFAULT_WRITE_WINDOW_MS)
		d->quarantine_ms += window - DC_DEFAULT_WRITE_WINDOW_MS;
	d->state = DREQ_RESERVED;
	d->n_blocks = need;
	d->n_prompt = r->n_prompt_tokens;
	d->max_tokens = max_tokens;
	d->sampling = r->sampling;
	if (r->n_stop_token_ids)
		memcpy(d->stop_ids, r->stop_token_ids, r->n_stop_token_ids * sizeof(uint32_t));
	d->n_stop_ids = (uint32_t)r->n_stop_token_ids;
	d->ignore_eos = r->ignore_eos;
	if (d->prompt)
		memcpy(d->prompt, r->prompt, r->n_prompt * sizeof(uint32_t));
	d->deadline_ms = now_ms() + (r->deadline_ms ? r->deadline_ms : (uint32_t)w->c->reserve_timeout_ms);
	*kv_pool_fence(&w->pool, d->blocks[0]) = 0; /* a fence for an earlier user of the block is void */
	*map_slot(w, d->rid) = d;
	w->n_reserved++;
	update_gauges(w);
	struct msg m;
	msg_init(&m, MSG_KV_RESERVED);
	m.u.kv_reserved.rid = d->rid;
	m.u.kv_reserved.n_block_ids = d->n_blocks;
	m.u.kv_reserved.block_ids = d->blocks;
	send_msg(w, &m, d->rid);
	LOG_DEBUG("decode", "rid=%llu reserved %u blocks (%u prompt + %u new tokens)",
	          (unsigned long long)d->rid, need, d->n_prompt, max_tokens);
	return;
refuse:
	LOG_WARN("decode", "rid=%llu reservation refused (%s): %s", (unsigned long long)r->rid,
	         msg_error_name(code), why);
	metrics_add(w->m_refused, 1);
	send_error(w, r->rid, code, why);
}

/* pool thread: verify the received KV (CRC32C per prompt block; with the trivial engine also the
 * content of every prompt slot). Reads d's blocks, sums and prompt, which the loop leaves alone
 * while the request is CHECKING. */
static void verify_work_cb(uv_work_t *req)
{
	struct dreq *d = req->data;
	struct dc_worker *w = d->w;
	uint32_t bs = w->layout.block_size;
	uint32_t n_prompt_blocks = (d->n_prompt + bs - 1) / bs;
	if (w->test_verify_delay_us && d->n_prompt >= w->test_verify_min_tokens)
		usleep(w->test_verify_delay_us); /* tests only: a checksum that takes long */
	d->verify_code = 0;
	for (uint32_t i = 0; d->sums && i < n_prompt_blocks; i++) {
		uint32_t c = crc32c(0, kv_pool_block(&w->pool, d->blocks[i]), w->pool.block_bytes);
		if (c != d->sums[i]) {
			d->verify_code = MSG_ERR_CHECKSUM;
			snprintf(d->verify_why, sizeof(d->verify_why),
			         "KV block %u (pool block %u) checksum %08x, prefill sent %08x", i,
			         d->blocks[i], c, d->sums[i]);
			return;
		}
	}
	if (!w->model && d->prompt) {
		/* trivial engine: the KV of every prompt position must name its token and position */
		for (uint32_t p = 0; p < d->n_prompt; p++)
			if (trivial_check_slot(kv_pool_block(&w->pool, d->blocks[p / bs]), p, d->prompt[p])) {
				d->verify_code = MSG_ERR_CHECKSUM;
				snprintf(d->verify_why, sizeof(d->verify_why),
				         "KV of prompt position %u does not hold token %u", p, d->prompt[p]);
				return;
			}
	}
}

static void start_running(struct dc_worker *w, struct dreq *d);

static void kv_check_failed(struct dc_worker *w, struct dreq *d, int code, const char *why)
{
	LOG_WARN("decode", "rid=%llu KV check failed: %s", (unsigned long long)d->rid, why);
	if (code == MSG_ERR_CHECKSUM)
		metrics_add(w->m_checksum_bad, 1);
	send_finish(w, d, MSG_FINISH_ERROR, code, -1, 1, why);
	dreq_free(w, d); /* KvReady came after PrefillDone: no writer is left */
}

/* loop: the verification is over */
static void verify_done_cb(uv_work_t *req, int status)
{
	struct dreq *d = req->data;
	struct dc_worker *w = d->w;
	if (d->cancel_pending) {
		int code = d->cancel_code;
		if (d->cancel_tell)
			send_finish(w, d, code == MSG_ERR_CANCELLED ? MSG_FINISH_CANCELLED : MSG_FINISH_ERROR,
			            code, -1, 0, code == MSG_ERR_CANCELLED ? NULL : msg_error_name(code));
		dreq_free(w, d);
		return;
	}
	if (status || d->verify_code) {
		kv_check_failed(w, d, status ? MSG_ERR_INTERNAL : d->verify_code,
		                status ? "KV verification could not run" : d->verify_why);
		return;
	}
	start_running(w, d);
}

/* KvReady: the prompt's KV is in our blocks; check it off the loop when there is something to
 * check, then start decoding */
static void on_kv_ready(struct dc_worker *w, const struct msg_kv_ready *r)
{
	struct dreq *d = *map_slot(w, r->rid);
	if (!d || d->state != DREQ_RESERVED) {
		send_error(w, r->rid, MSG_ERR_UNKNOWN_REQUEST,
		           d ? "KvReady for a request already running" : "no reservation for this request");
		return;
	}
	char why[256] = "";
	int code = 0;
	uint32_t bs = w->layout.block_size;
	uint32_t n_prompt_blocks = (d->n_prompt + bs - 1) / bs;
	bool verify = r->n_checksums && w->c->verify_checksums;
	if (r->n_prompt_tokens != d->n_prompt) {
		code = MSG_ERR_INVALID_REQUEST;
		snprintf(why, sizeof(why), "KvReady for %u prompt tokens, reservation was for %u",
		         r->n_prompt_tokens, d->n_prompt);
	} else if (r->first.id >= w->vocab) {
		code = MSG_ERR_INVALID_REQUEST;
		snprintf(why, sizeof(why), "first token id %u outside the vocabulary", r->first.id);
	} else if (verify && r->n_checksums != n_prompt_blocks) {
		code = MSG_ERR_CHECKSUM;
		snprintf(why, sizeof(why), "%zu block checksums for %u prompt blocks", r->n_checksums,
		         n_prompt_blocks);
	} else if (verify && !(d->sums = malloc(n_prompt_blocks * sizeof(uint32_t)))) {
		code = MSG_ERR_INTERNAL;
		snprintf(why, sizeof(why), "out of memory");
	}
	metrics_add(w->m_kv_rx_bytes, (double)n_prompt_blocks * (double)w->pool.block_bytes);
	if (code) {
		kv_check_failed(w, d, code, why);
		return;
	}
	d->first = r->first;
	if (d->sums || (!w->model && d->prompt)) {
		if (d->sums)
			memcpy(d->sums, r->checksums, n_prompt_blocks * sizeof(uint32_t));
		d->state = DREQ_CHECKING;
		d->w = w;
		d->verify.data = d;
		if (uv_queue_work(w->loop, &d->verify, verify_work_cb, verify_done_cb) == 0)
			return;
		d->state = DREQ_RESERVED;
		verify_work_cb(&d->verify); /* no pool thread: check here */
		if (d->verify_code) {
			kv_check_failed(w, d, d->verify_code, d->verify_why);
			return;
		}
	}
	start_running(w, d);
}

static void start_running(struct dc_worker *w, struct dreq *d)
{
	struct dc_seq *s = calloc(1, sizeof(*s));
	if (s) {
		s->blocks = malloc(d->n_blocks * sizeof(int32_t));
		s->stop = calloc(d->n_stop ? d->n_stop : 1, sizeof(char *));
		s->stop_ids = malloc((d->n_stop_ids ? d->n_stop_ids : 1) * sizeof(uint32_t));
	}
	bool oom = !s || !s->blocks || !s->stop || !s->stop_ids;
	for (uint32_t i = 0; !oom && i < d->n_stop; i++) {
		s->stop[i] = strdup(d->stop[i]);
		oom = !s->stop[i];
		s->n_stop = i + 1;
	}
	if (oom) {
		dc_seq_free(s);
		send_finish(w, d, MSG_FINISH_ERROR, MSG_ERR_INTERNAL, -1, 1, "out of memory");
		dreq_free(w, d);
		return;
	}
	s->rid = d->rid;
	for (uint32_t i = 0; i < d->n_blocks; i++)
		s->blocks[i] = (int32_t)d->blocks[i];
	s->n_blocks = d->n_blocks;
	s->n_prompt = d->n_prompt;
	s->max_tokens = d->max_tokens;
	s->sampling = d->sampling;
	memcpy(s->stop_ids, d->stop_ids, d->n_stop_ids * sizeof(uint32_t));
	s->n_stop_ids = d->n_stop_ids;
	s->ignore_eos = d->ignore_eos;
	s->first = d->first;
	d->state = DREQ_RUNNING;
	d->seq = s;
	d->t_ready_ns = uv_hrtime();
	w->n_reserved--;
	w->n_running++;
	update_gauges(w);
	LOG_DEBUG("decode", "rid=%llu KV ready: decoding from token %u", (unsigned long long)d->rid,
	          d->first.id);
	dc_engine_submit(w->eng, s);
}

/* Cancel / KvRelease / router lost / drain deadline */
static void cancel_req(struct dc_worker *w, struct dreq *d, int code, bool tell_router, bool maybe_writer)
{
	if (d->state == DREQ_CHECKING) { /* a pool thread reads the blocks: verify_done_cb ends it */
		if (!d->cancel_pending) {
			d->cancel_pending = true;
			d->cancel_code = code;
			d->cancel_tell = tell_router;
		}
		return;
	}
	if (d->state == DREQ_RESERVED) {
		if (tell_router)
			send_finish(w, d, code == MSG_ERR_CANCELLED ? MSG_FINISH_CANCELLED : MSG_FINISH_ERROR,
			            code, -1, 0, code == MSG_ERR_CANCELLED ? NULL : msg_error_name(code));
		dreq_end(w, d, maybe_writer);
		return;
	}
	if (d->seq && !atomic_load(&d->seq->cancelled)) {
		d->seq->cancel_code = code;
		atomic_store(&d->seq->cancelled, 1);
		dc_engine_poke(w->eng); /* FINISH comes back through events_cb, which frees */
	}
}

static void cancel_all(struct dc_worker *w, int code, bool tell_router)
{
	for (int b = 0; b < MAP_BUCKETS; b++) {
		struct dreq *d = w->map[b];
		while (d) {
			struct dreq *n = d->map_next;
			cancel_req(w, d, code, tell_router, true);
			d = n;
		}
	}
}

static int on_msg(void *ud, struct msg *m)
{
	struct dc_worker *w = ud;
	switch (m->type) {
	case MSG_KV_RESERVE: on_kv_reserve(w, &m->u.kv_reserve); return 0;
	case MSG_KV_READY:
		/* the prefill's puts have completed remotely; progress UCX anyway so that emulated-RMA
		 * transports have applied everything before we look at the blocks */
		kvx_progress(w->kvx);
		on_kv_ready(w, &m->u.kv_ready);
		return 0;
	case MSG_KV_RELEASE: {
		struct dreq *d = *map_slot(w, m->u.kv_release.rid);
		if (d) {
			metrics_add(w->m_released, 1);
			if (d->state == DREQ_RUNNING)
				LOG_WARN("decode", "rid=%llu KvRelease for a running request: cancelling it",
				         (unsigned long long)d->rid);
			cancel_req(w, d, MSG_ERR_CANCELLED, false, !m->u.kv_release.no_writer);
		}
		return 0;
	}
	case MSG_CANCEL: {
		struct dreq *d = *map_slot(w, m->u.cancel.rid);
		if (d) {
			LOG_INFO("decode", "rid=%llu cancelled by the router (%s)",
			         (unsigned long long)d->rid, msg_error_name(m->u.cancel.reason));
			cancel_req(w, d, MSG_ERR_CANCELLED, true, true);
		}
		return 0;
	}
	case MSG_ERROR:
		LOG_WARN("decode", "router reports%s%llu: %s (%s)", m->u.error.has_rid ? " rid=" : " ",
		         (unsigned long long)m->u.error.rid, m->u.error.message,
		         msg_error_name(m->u.error.code));
		return 0;
	default:
		LOG_WARN("decode", "ignoring %s: not a decode message", msg_type_name(m->type));
		send_error(w, 0, MSG_ERR_PROTOCOL, "message type not handled by a decode worker");
		return 0;
	}
}

/* ---- timers and UCX progress ------------------------------------------------------------------ */

static void tick_cb(uv_timer_t *t)
{
	struct dc_worker *w = t->data;
	quarantine_scan(w, false);
	uint64_t now = now_ms();
	for (int b = 0; b < MAP_BUCKETS; b++) {
		struct dreq *d = w->map[b];
		while (d) {
			struct dreq *n = d->map_next;
			if (d->state == DREQ_RESERVED && now > d->deadline_ms) {
				LOG_WARN("decode",
				         "rid=%llu reservation expired: KV not ready in time; blocks freed",
				         (unsigned long long)d->rid);
				metrics_add(w->m_expired, 1);
				send_error(w, d->rid, MSG_ERR_TIMEOUT, "reservation expired before KvReady");
				dreq_end(w, d, true); /* a slow prefill may still be writing */
			}
			d = n;
		}
	}
}

static void ucx_rearm(struct dc_worker *w)
{
	for (int i = 0; i < 100; i++) {
		kvx_progress(w->kvx);
		if (kvx_arm(w->kvx) != 1)
			return;
	}
}

static void ucx_poll_cb(uv_poll_t *p, int status, int events)
{
	ucx_rearm(p->data);
}

/* ---- session ------------------------------------------------------------------------------------ */

static void fill_hello(void *ud, struct msg_hello *h)
{
	struct dc_worker *w = ud;
	h->role = MSG_ROLE_DECODE;
	snprintf(h->name, sizeof(h->name), "%s", w->c->name);
	memcpy(h->model_id, w->model_id, 8);
	h->model_id_len = 8;
	snprintf(h->model_name, sizeof(h->model_name), "%s", w->model_name);
	h->kv_layout = w->layout;
	h->tp_degree = (uint32_t)w->c->tp;
	h->max_batch = (uint32_t)w->c->max_batch;
	h->max_seq_len = w->max_seq_len;
	h->n_blocks_total = w->pool.n_blocks;
	kvx_worker_address(w->kvx, &h->ucx_address, &h->ucx_address_len);
	h->has_kv_region = true;
	h->kv_region.base_addr = (uint64_t)(uintptr_t)w->pool.base;
	h->kv_region.block_stride = w->pool.block_bytes;
	h->kv_region.n_segments = 1;
	h->kv_region.segment_stride = 0;
	h->kv_region.segment_bytes = w->pool.block_bytes;
	h->kv_region.n_blocks = w->pool.n_blocks;
	kvx_region_rkey(w->pool.region, &h->kv_region.rkey, &h->kv_region.rkey_len);
	h->kv_region.fence_addr = (uint64_t)(uintptr_t)kv_pool_fence(&w->pool, 0);
	h->fence_attempts = true;
	snprintf(h->auth_token, sizeof(h->auth_token), "%s", w->c->auth_token);
	h->metrics_port = (uint32_t)runtime_metrics_port(w->rt);
	snprintf(h->ucx_transports, sizeof(h->ucx_transports), "%s", kvx_transports(w->kvx));
	h->pid = (uint32_t)getpid();
}

static void fill_heartbeat(void *ud, struct msg_heartbeat *hb)
{
	struct dc_worker *w = ud;
	hb->free_blocks = w->pool.n_free;
	hb->used_blocks = w->pool.n_blocks - w->pool.n_free;
	hb->running_seqs = w->n_running;
	hb->queued_requests = w->n_reserved;
}

/* the ready file also says how large the pool is (tests size their requests by it) */
static void ready_extra(void *ud, char *buf, size_t n)
{
	struct dc_worker *w = ud;
	snprintf(buf, n, ", \"kv_blocks\": %u", w->pool.n_blocks);
}

static void on_lost(void *ud, const char *why)
{
	struct dc_worker *w = ud;
	/* the router failed every request it had placed here: free what we hold for them */
	cancel_all(w, MSG_ERR_CANCELLED, false);
}

/* ---- drain / stop ---------------------------------------------------------------------------- */

/* wlife callbacks (common/net/wlife.h) */
static bool is_idle(void *ud)
{
	struct dc_worker *w = ud;
	return w->n_reserved == 0 && w->n_running == 0;
}

static void describe(void *ud, char *buf, size_t n)
{
	struct dc_worker *w = ud;
	snprintf(buf, n, "%u running and %u reserved requests", w->n_running, w->n_reserved);
}

static void stop_engine(void *ud)
{
	struct dc_worker *w = ud;
	uv_close((uv_handle_t *)&w->tick, NULL);
	/* running sequences come back as FINISH(ERROR, DRAINING) and are reported and freed */
	dc_engine_destroy(w->eng);
	w->eng = NULL;
	cancel_all(w, MSG_ERR_DRAINING, true); /* reservations still waiting for KV */
	if (w->ucx_poll_on)
		uv_close((uv_handle_t *)&w->ucx_poll, NULL);
}

static bool is_healthy(void *ud)
{
	struct dc_worker *w = ud;
	return w->eng && dc_engine_stall_seconds(w->eng) < 60;
}

/* ---- run ----------------------------------------------------------------------------------------- */

static void register_metrics(struct dc_worker *w, struct dc_metrics *em)
{
	char labels[160];
	snprintf(labels, sizeof(labels), "role=\"decode\",worker=\"%s\"", w->c->name);
	struct metrics *r = w->reg = metrics_create(labels);
	w->m_blocks_used = metrics_gauge(r, "tandem_kv_blocks_used", NULL, "KV blocks reserved or in use");
	w->m_blocks_free = metrics_gauge(r, "tandem_kv_blocks_free", NULL, "KV blocks free");
	w->m_reserved = metrics_gauge(r, "tandem_decode_reserved_requests", NULL,
	                              "Requests holding blocks, waiting for their KV");
	w->m_fin_stop = metrics_counter(r, "tandem_decode_requests_total", "outcome=\"stop\"",
	                                "Decoded requests by outcome");
	w->m_fin_length = metrics_counter(r, "tandem_decode_requests_total", "outcome=\"length\"", NULL);
	w->m_fin_cancelled =
	    metrics_counter(r, "tandem_decode_requests_total", "outcome=\"cancelled\"", NULL);
	w->m_fin_error = metrics_counter(r, "tandem_decode_requests_total", "outcome=\"error\"", NULL);
	w->m_refused = metrics_counter(r, "tandem_kv_reservations_refused_total", NULL,
	                               "Reservations refused (pool full, draining, invalid)");
	w->m_released = metrics_counter(r, "tandem_kv_reservations_released_total", NULL,
	                                "Reservations released by the router");
	w->m_expired = metrics_counter(r, "tandem_kv_reservations_expired_total", NULL,
	                               "Reservations freed because KV never became ready");
	w->m_checksum_bad = metrics_counter(r, "tandem_kv_check_failures_total", NULL,
	                                    "Received KV that failed its checksum/content check");
	w->m_kv_rx_bytes = metrics_counter(r, "tandem_kv_received_bytes_total", NULL,
	                                   "Prompt KV bytes received from prefill workers");
	struct wlife_cbs lc = {.is_idle_cb = is_idle,
	                       .is_healthy_cb = is_healthy,
	                       .describe_cb = describe,
	                       .stop_cb = stop_engine,
	                       .ready_extra_cb = ready_extra,
	                       .ud = w};
	wlife_init(&w->life, "decode", w->c->name, w->c->ready_file, (uint32_t)w->c->drain_timeout_ms,
	           "failing them", r, &lc);
	w->m_quarantined =
	    metrics_gauge(r, "tandem_kv_blocks_quarantined", NULL,
	                  "KV blocks of released reservations waiting for the prefill's fence");
	w->m_fenced = metrics_counter(r, "tandem_kv_quarantine_fenced_total", NULL,
	                              "Quarantined reservations freed by the prefill's fence");
	w->m_quarantine_expired =
	    metrics_counter(r, "tandem_kv_quarantine_expired_total", NULL,
	                    "Quarantined reservations freed by the deadline, without a fence");
	w->m_stale_fences =
	    metrics_counter(r, "tandem_kv_stale_fences_total", NULL,
	                    "Fences of an earlier prefill attempt, ignored (a newer attempt writes)");
	w->m_ttft_decode = metrics_histogram(r, "tandem_decode_first_step_seconds", NULL,
	                                     "KvReady to the first decoded token", metrics_latency_bounds,
	                                     metrics_n_latency_bounds);
	em->tokens =
	    metrics_counter(r, "tandem_decode_tokens_total", NULL, "Tokens generated by decode steps");
	em->step_seconds = metrics_histogram(r, "tandem_decode_step_seconds", NULL, "Decode step time",
	                                     metrics_latency_bounds, metrics_n_latency_bounds);
	em->running =
	    metrics_gauge(r, "tandem_decode_running_sequences", NULL, "Sequences in the decode batch");
	static const double bs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
	em->batch_size =
	    metrics_histogram(r, "tandem_decode_batch_size", NULL, "Sequences per decode step", bs, 11);
}

int dc_worker_run(const struct dc_config *c)
{
	struct dc_worker w = {.c = c, .exit_code = 1};
	struct errbuf e = {0};
	struct dc_metrics em = {0};
	w.loop = uv_default_loop();
	register_metrics(&w, &em);
	bool trivial = strcmp(c->engine, "trivial") == 0;
	if (!trivial && strcmp(c->engine, "model") != 0) {
		LOG_ERROR("decode", "engine '%s': expected \"model\" or \"trivial\"", c->engine);
		w.exit_code = 2;
		goto out_model;
	}
	size_t block_bytes;
	if (!trivial) {
		if (!c->model[0]) {
			LOG_ERROR("decode", "no model given (--model PATH.gguf, or --engine trivial)");
			w.exit_code = 2;
			goto out_model;
		}
		/* every device buffer is sized from the limits, never per request: a step has at most
		 * max_batch tokens of max_batch sequences, positions below max_seq_len */
		const struct model_worker_opts wo = {.backend = c->backend,
		                                     .kv_dtype = c->kv_dtype,
		                                     .threads = c->threads,
		                                     .tp = c->tp,
		                                     .device = c->device,
		                                     .graphs = c->graphs,
		                                     .mem_fraction = c->mem_fraction,
		                                     .max_tokens = c->max_batch,
		                                     .max_seqs = c->max_batch,
		                                     .max_ctx = c->max_seq_len};
		if (model_load_worker(&w.model, c->model, &wo, &e)) {
			LOG_ERROR("decode", "%s", e.msg);
			w.exit_code = 2;
			goto out_model;
		}
		if (tok_load(&w.tok, model_gguf(w.model), &e)) {
			LOG_ERROR("decode", "cannot load the tokenizer of %s: %s", c->model, e.msg);
			goto out_model;
		}
		const struct model_hparams *hp = model_hparams(w.model);
		struct model_kv_layout L;
		model_kv_layout_get(w.model, &L);
		struct msg_kv_layout *l = &w.layout;
		snprintf(l->arch, sizeof(l->arch), "%s", model_arch_name(hp->arch));
		l->n_layers = (uint32_t)L.n_layers;
		l->block_size = (uint32_t)L.block_tokens;
		l->latent_dim = (uint32_t)hp->C;
		l->rope_dim = (uint32_t)hp->R;
		l->n_indexer_layers = (uint32_t)L.n_idx;
		l->indexer_dim = (uint32_t)L.idx_dim;
		l->dtype = L.dtype == MODEL_KV_BF16 ? MSG_KV_BF16 : MSG_KV_F32;
		l->indexer_dtype = L.n_idx ? l->dtype : MSG_KV_NONE;
		l->block_bytes = L.block_bytes;
		l->fingerprint = model_kv_fingerprint_hash(w.model);
		block_bytes = L.block_bytes;
		w.vocab = (uint32_t)hp->vocab;
		w.max_seq_len =
		    (uint32_t)(hp->n_ctx_train > 0 && hp->n_ctx_train < INT32_MAX ? hp->n_ctx_train
		                                                                  : INT32_MAX);
		uint64_t h = model_identity_hash(w.model);
		for (int i = 0; i < 8; i++)
			w.model_id[i] = (uint8_t)(h >> (56 - 8 * i));
		const char *base = strrchr(c->model, '/');
		snprintf(w.model_name, sizeof(w.model_name), "%.64s", base ? base + 1 : c->model);
	} else {
		trivial_layout(&w.layout);
		block_bytes = TRIVIAL_BLOCK_BYTES;
		w.vocab = TRIVIAL_VOCAB;
		w.max_seq_len = 1u << 20;
		snprintf(w.model_name, sizeof(w.model_name), "trivial");
		memcpy(w.model_id, "trivial", 8);
	}
	const char *tvd = getenv("TANDEM_TEST_VERIFY_DELAY"); /* "us:min_tokens", tests only */
	if (tvd && sscanf(tvd, "%u:%u", &w.test_verify_delay_us, &w.test_verify_min_tokens) == 2)
		LOG_WARN("decode", "TEST: KV verification of prompts of >= %u tokens is slowed by %u us",
		         w.test_verify_min_tokens, w.test_verify_delay_us);
	else
		w.test_verify_delay_us = 0;
	if (c->max_seq_len > 0 && (uint32_t)c->max_seq_len < w.max_seq_len)
		w.max_seq_len = (uint32_t)c->max_seq_len;
	if (w.model && model_get_opts(w.model)->backend == MODEL_BACKEND_CUDA &&
	    (uint32_t)model_get_opts(w.model)->max_ctx < w.max_seq_len)
		w.max_seq_len = (uint32_t)model_get_opts(w.model)->max_ctx; /* what the workspaces hold */
	struct kvx_opts ko = {
	    .tls = c->ucx_tls, .net_devices = c->ucx_net_devices, .want_rdma = c->ucx_want_rdma};
	if (kvx_create(&w.kvx, &ko, &e)) {
		LOG_ERROR("decode", "%s", e.msg);
		goto out_model;
	}
	LOG_INFO("decode", "UCX transports available: %s", kvx_transports(w.kvx));
	if (kv_pool_init(&w.pool, (uint32_t)c->kv_blocks, block_bytes, w.kvx, &e)) {
		LOG_ERROR("decode", "%s", e.msg);
		goto out_kvx;
	}
	if (w.model && model_kv_on_device(w.model)) {
		/* prefill writes into the UCX pool (host); page-locked, its blocks reach the device pool
		 * by DMA when a sequence joins */
		size_t bytes = (size_t)w.pool.n_blocks * w.pool.block_bytes;
		if (model_host_pin(w.model, w.pool.base, bytes, &e))
			LOG_WARN("decode", "%s: KV uploads to the device will be slower", e.msg);
		else
			w.pool_pinned = true;
	}
	update_gauges(&w);
	if (w.model && (c->kv_staged || model_kv_on_device(w.model)))
		em.staged_bytes =
		    metrics_counter(w.reg, "tandem_decode_kv_staged_bytes_total", NULL,
		                    "Staged KV: prompt bytes copied from the UCX pool into the model's pool");
	struct dc_engine_opts eo = {.model = w.model,
	                            .kv_staged = c->kv_staged,
	                            .upload_step_bytes = (size_t)c->kv_upload_step_kb * 1024,
	                            .tok = w.tok,
	                            .pool = &w.pool,
	                            .max_batch = (uint32_t)c->max_batch,
	                            .max_seq_len = w.max_seq_len,
	                            .trivial_step_us = (uint32_t)c->trivial_step_us,
	                            .metrics = em,
	                            .loop = w.loop,
	                            .events_cb = events_cb,
	                            .ud = &w};
	if (dc_engine_create(&eo, &w.eng, &e)) {
		LOG_ERROR("decode", "cannot start the engine: %s", e.msg);
		goto out_pool;
	}
	struct runtime_opts ro = {.metrics_addr = c->metrics,
	                          .metrics = w.reg,
	                          .is_ready_cb = wlife_is_ready_cb,
	                          .is_healthy_cb = wlife_is_healthy_cb,
	                          .on_signal_cb = wlife_on_signal_cb,
	                          .ud = &w.life};
	if (runtime_start(w.loop, &ro, &w.rt, &e)) {
		LOG_ERROR("decode", "%s", e.msg);
		dc_engine_destroy(w.eng);
		goto out_pool;
	}
	uv_timer_init(w.loop, &w.tick);
	w.tick.data = &w;
	uv_timer_start(&w.tick, tick_cb, 100, 100);
	wlife_start(&w.life, w.loop, w.rt);
	if (uv_poll_init(w.loop, &w.ucx_poll, kvx_efd(w.kvx)) == 0) {
		w.ucx_poll.data = &w;
		uv_poll_start(&w.ucx_poll, UV_READABLE, ucx_poll_cb);
		w.ucx_poll_on = true;
		ucx_rearm(&w);
	}
	struct session_opts so = {.router_addr = c->router, .heartbeat_ms = (uint32_t)c->heartbeat_ms};
	struct session_cbs sc = {.fill_hello_cb = fill_hello,
	                         .fill_heartbeat_cb = fill_heartbeat,
	                         .on_msg_cb = on_msg,
	                         .on_lost_cb = on_lost,
	                         .ud = &w};
	if (wlife_start_session(&w.life, w.loop, &so, &sc, &e)) {
		LOG_ERROR("decode", "%s", e.msg);
		w.life.draining = true;
		wlife_stop(&w.life);
		uv_run(w.loop, UV_RUN_DEFAULT);
		goto out_pool;
	}
	LOG_INFO(
	    "decode",
	    "%s: engine %s (backend %s), KV pool %u blocks x %zu bytes (%.1f MiB), layout %s fingerprint "
	    "%016llx, metrics on port %d, router %s",
	    c->name, c->engine, trivial ? "none" : c->backend, w.pool.n_blocks, w.pool.block_bytes,
	    (double)w.pool.n_blocks * (double)w.pool.block_bytes / 1048576.0, w.layout.arch,
	    (unsigned long long)w.layout.fingerprint, runtime_metrics_port(w.rt), c->router);
	uv_run(w.loop, UV_RUN_DEFAULT);
	w.exit_code = 0;
out_pool:
	uv_run(w.loop, UV_RUN_NOWAIT);
	quarantine_scan(&w, true); /* exiting: the pool goes away with its blocks */
	if (w.pool_pinned)
		model_host_unpin(w.model, w.pool.base);
	kv_pool_fini(&w.pool, w.kvx);
out_kvx:
	kvx_destroy(w.kvx);
out_model:
	tok_destroy(w.tok);
	model_destroy(w.model);
	metrics_destroy(w.reg);
	wlife_fini(&w.life);
	return w.exit_code;
}
