/* In-process simulated workers (see engine_sim.h). Each request a simulated worker holds is a
 * `simseq` with its own timer; the decode side owns the sequence from reservation to release, the
 * prefill side only while it "computes" (it then hands the KV over by starting the decode side's
 * transfer timer), so a cancelled request never leaves a timer pointing at freed memory. */
#include "router/engine_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"

static const char sim_text[] =
    "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua. ";

enum sim_phase { SIM_RESERVED, SIM_PREFILL, SIM_TRANSFER, SIM_RUNNING };

struct simw;

struct simseq {
	uv_timer_t timer;
	struct simw *w;
	struct req *r;
	enum sim_phase phase;
	uint64_t hash;
	uint64_t rng;
	uint32_t pos;
	struct simseq *prev, *next;
};

struct simw {
	struct worker w;
	struct engine_sim *es;
	struct simseq *seqs;
	uint32_t n_seqs;
	uv_timer_t step;
	bool step_running;
};

struct engine_sim {
	uv_loop_t *loop;
	struct sched *sched;
	struct sim_config cfg;
	struct simw *workers;
	int n_workers;
	int n_open_steps; /* step timers not yet closed: the engine is freed when this reaches 0 */
};

uint64_t engine_sim_prompt_hash(const int32_t *ids, uint32_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (uint32_t i = 0; i < n; i++) {
		h ^= (uint32_t)ids[i];
		h *= 1099511628211ull;
	}
	return h;
}

int32_t engine_sim_greedy_token(uint64_t prompt_hash, uint32_t pos)
{
	uint64_t len = sizeof(sim_text) - 1;
	return (unsigned char)sim_text[(prompt_hash % len + pos) % len];
}

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: small, seedable, good enough for a simulator */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void make_token(struct simseq *q, struct req_token *t)
{
	const struct req_sampling *sp = &q->r->sampling;
	memset(t, 0, sizeof(*t));
	if (sp->temperature <= 0) {
		t->id = engine_sim_greedy_token(q->hash, q->pos);
	} else {
		uint64_t x = rng_next(&q->rng);
		t->id = (unsigned char)sim_text[x % (sizeof(sim_text) - 1)];
	}
	t->logprob = -0.01f * (float)(1 + (q->hash + q->pos) % 50);
	if (sp->want_logprobs) {
		int n = sp->n_top_logprobs > REQ_MAX_TOP_LOGPROBS ? REQ_MAX_TOP_LOGPROBS : sp->n_top_logprobs;
		for (int i = 0; i < n; i++) {
			t->top_ids[i] = i == 0 ? t->id : 'a' + (t->id + i) % 26;
			if (i > 0 && t->top_ids[i] == t->id)
				t->top_ids[i] = 'A' + i;
			t->top_logprobs[i] = t->logprob - 1.5f * (float)i;
		}
		t->n_top = n;
	}
	q->pos++;
}

static struct simseq *find_seq(struct simw *w, const struct req *r)
{
	for (struct simseq *q = w->seqs; q; q = q->next)
		if (q->r == r)
			return q;
	return NULL;
}

static void seq_closed_cb(uv_handle_t *h)
{
	free(h->data);
}

static void seq_free(struct simseq *q)
{
	struct simw *w = q->w;
	if (q->prev)
		q->prev->next = q->next;
	else
		w->seqs = q->next;
	if (q->next)
		q->next->prev = q->prev;
	w->n_seqs--;
	uv_timer_stop(&q->timer);
	uv_close((uv_handle_t *)&q->timer, seq_closed_cb);
}

static struct simseq *seq_new(struct simw *w, struct req *r)
{
	struct simseq *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->w = w;
	q->r = r;
	q->hash = engine_sim_prompt_hash(r->prompt, r->n_prompt);
	q->rng = r->sampling.has_seed ? r->sampling.seed : q->hash ^ uv_hrtime();
	uv_timer_init(w->es->loop, &q->timer);
	q->timer.data = q;
	q->next = w->seqs;
	if (w->seqs)
		w->seqs->prev = q;
	w->seqs = q;
	w->n_seqs++;
	return q;
}

/* ---- decode side ----------------------------------------------------------------------------- */

static void reserve_answer_cb(uv_timer_t *t)
{
	struct simseq *q = t->data;
	sched_on_reserved(q->r, 0, NULL);
}

static int sim_reserve(struct worker *wk, struct req *r, uint32_t n_blocks)
{
	struct simw *w = (struct simw *)wk;
	(void)n_blocks; /* the scheduler already debited our pool; the simulator trusts it */
	struct simseq *q = seq_new(w, r);
	if (!q)
		return -ENOMEM;
	q->phase = SIM_RESERVED;
	uv_timer_start(&q->timer, reserve_answer_cb, 0, 0);
	return 0;
}

static void step_cb(uv_timer_t *t);

static void ensure_stepping(struct simw *w)
{
	if (!w->step_running) {
		w->step_running = true;
		uv_timer_start(&w->step, step_cb, (uint64_t)w->es->cfg.step_ms,
		               (uint64_t)(w->es->cfg.step_ms > 0 ? w->es->cfg.step_ms : 1));
	}
}

static void transfer_done_cb(uv_timer_t *t)
{
	struct simseq *q = t->data;
	q->phase = SIM_RUNNING;
	struct req_token tok;
	make_token(q, &tok);
	struct req *r = q->r;
	ensure_stepping(q->w);
	sched_on_decode_started(r, &tok);
	/* q may be gone now (a 1-token request ends inside the callback chain) */
	if (!r->ended && r->n_generated >= r->n_max_new)
		sched_on_finished(r, REQ_FINISH_LENGTH);
}

/* One decode step: every running sequence gets a token. Callbacks may release sequences, so the
 * next pointer is read before each delivery and the list re-checked. */
static void step_cb(uv_timer_t *t)
{
	struct simw *w = t->data;
	struct req *batch[1024];
	int n = 0;
	for (struct simseq *q = w->seqs; q && n < 1024; q = q->next)
		if (q->phase == SIM_RUNNING)
			batch[n++] = q->r;
	if (n == 0) {
		uv_timer_stop(&w->step);
		w->step_running = false;
		return;
	}
	for (int i = 0; i < n; i++) {
		struct simseq *q = find_seq(w, batch[i]);
		if (!q || q->phase != SIM_RUNNING)
			continue;
		struct req *r = q->r;
		struct req_token tok;
		make_token(q, &tok);
		sched_on_token(r, &tok);
		if (!r->ended && r->n_generated >= r->n_max_new)
			sched_on_finished(r, REQ_FINISH_LENGTH);
	}
}

/* ---- prefill side ---------------------------------------------------------------------------- */

static void prefill_done_cb(uv_timer_t *t)
{
	struct simseq *q = t->data;
	struct req *r = q->r;
	struct simw *dw = r->decode ? (struct simw *)r->decode : NULL;
	seq_free(q); /* the prefill worker holds nothing after the push */
	sched_on_prefill_done(r);
	if (r->ended || !dw)
		return;
	struct simseq *dq = find_seq(dw, r);
	if (!dq) {
		sched_on_failed(r, 502, "simulated decode worker lost the reservation");
		return;
	}
	dq->phase = SIM_TRANSFER;
	uv_timer_start(&dq->timer, transfer_done_cb, (uint64_t)dw->es->cfg.transfer_ms, 0);
}

static int sim_prefill(struct worker *wk, struct req *r)
{
	struct simw *w = (struct simw *)wk;
	struct simseq *q = seq_new(w, r);
	if (!q)
		return -ENOMEM;
	q->phase = SIM_PREFILL;
	double ms = w->es->cfg.prefill_us_per_token * r->n_prompt / 1000.0;
	uv_timer_start(&q->timer, prefill_done_cb, (uint64_t)ms, 0);
	return 0;
}

static void sim_release(struct worker *wk, struct req *r)
{
	struct simw *w = (struct simw *)wk;
	struct simseq *q = find_seq(w, r);
	if (q)
		seq_free(q);
}

static const struct worker_ops sim_ops = {sim_reserve, sim_prefill, sim_release};

/* ---- lifecycle ------------------------------------------------------------------------------- */

int engine_sim_create(struct engine_sim **out, uv_loop_t *loop, struct sched *s, const struct sim_config *cfg,
                      struct errbuf *e)
{
	struct engine_sim *es = calloc(1, sizeof(*es));
	if (!es)
		return errbuf_set(e, -ENOMEM, "sim: out of memory");
	es->loop = loop;
	es->sched = s;
	es->cfg = *cfg;
	es->n_workers = cfg->n_prefill + cfg->n_decode;
	es->workers = calloc((size_t)es->n_workers, sizeof(*es->workers));
	if (!es->workers) {
		free(es);
		return errbuf_set(e, -ENOMEM, "sim: out of memory");
	}
	for (int i = 0; i < es->n_workers; i++) {
		struct simw *w = &es->workers[i];
		bool pre = i < cfg->n_prefill;
		w->es = es;
		w->w.id = i;
		w->w.role = pre ? WORKER_ROLE_PREFILL : WORKER_ROLE_DECODE;
		snprintf(w->w.name, sizeof(w->w.name), "sim-%s-%d", pre ? "prefill" : "decode",
		         pre ? i : i - cfg->n_prefill);
		snprintf(w->w.model_id, sizeof(w->w.model_id), "%s", cfg->model_id ? cfg->model_id : "sim");
		snprintf(w->w.layout.arch, sizeof(w->w.layout.arch), "sim");
		snprintf(w->w.layout.dtype, sizeof(w->w.layout.dtype), "bf16");
		w->w.layout.block_size = cfg->block_size ? cfg->block_size : 64;
		w->w.layout.n_layers = 1;
		w->w.tp = 1;
		w->w.ops = &sim_ops;
		w->w.impl = w;
		if (!pre) {
			w->w.n_blocks_total = cfg->n_blocks;
			w->w.n_blocks_free = cfg->n_blocks;
			w->w.n_running_max = cfg->n_running_max;
		}
		uv_timer_init(loop, &w->step);
		w->step.data = w;
		es->n_open_steps++;
	}
	for (int i = 0; i < es->n_workers; i++) {
		int rc = sched_worker_add(s, &es->workers[i].w, e);
		if (rc) {
			engine_sim_destroy(es);
			return rc;
		}
	}
	*out = es;
	return 0;
}

int engine_sim_kill(struct engine_sim *es, enum worker_role role, int index)
{
	int k = 0;
	for (int i = 0; i < es->n_workers; i++) {
		struct simw *w = &es->workers[i];
		if (w->w.role != role || k++ != index)
			continue;
		if (!w->w.alive)
			return -ENOENT;
		sched_worker_lost(es->sched, &w->w, "simulated crash");
		uv_timer_stop(&w->step);
		w->step_running = false;
		/* hand every request over; the worker's memory is gone with it */
		while (w->seqs) {
			struct simseq *q = w->seqs;
			struct req *r = q->r;
			seq_free(q);
			sched_on_worker_lost_req(r, &w->w);
		}
		return 0;
	}
	return -ENOENT;
}

uint32_t engine_sim_n_held(const struct engine_sim *es)
{
	uint32_t n = 0;
	for (int i = 0; i < es->n_workers; i++)
		n += es->workers[i].n_seqs;
	return n;
}

static void sim_step_closed_cb(uv_handle_t *h)
{
	struct simw *w = h->data;
	struct engine_sim *es = w->es;
	if (--es->n_open_steps == 0) {
		free(es->workers);
		free(es);
	}
}

void engine_sim_destroy(struct engine_sim *es)
{
	if (!es)
		return;
	for (int i = 0; i < es->n_workers; i++) {
		struct simw *w = &es->workers[i];
		if (w->w.alive)
			sched_worker_lost(es->sched, &w->w, "shutting down");
		while (w->seqs) {
			struct simseq *q = w->seqs;
			struct req *r = q->r;
			seq_free(q);
			sched_on_worker_lost_req(r, &w->w);
		}
		uv_close((uv_handle_t *)&w->step, sim_step_closed_cb);
	}
}
