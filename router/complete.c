/* POST /v1/completions and /v1/chat/completions: one `call` per HTTP request. It decodes the body
 * (api.c), renders and tokenizes the prompt (codec.c), checks it against the context, submits one
 * struct req per choice to the scheduler and turns the token events into the OpenAI response:
 * a JSON body, or SSE chunks as tokens arrive. Stop strings are matched here on the detokenized
 * text; while a stop string might still be completing (or a UTF-8 sequence is incomplete) the
 * matching tail is held back so a stream never shows text that is later cut.
 *
 * Lifetime: the call lives until every choice has ended and the response is finished (or the
 * client is gone). A client that disconnects cancels every choice exactly once (sched_cancel). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/log.h"
#include "common/net/metrics.h"
#include "router/api.h"
#include "router/codec.h"
#include "router/router.h"

struct lp_entry {
	int32_t id;
	float lp;
	uint32_t text_offset;
	int n_top;
	int32_t top_ids[REQ_MAX_TOP_LOGPROBS];
	float top_lps[REQ_MAX_TOP_LOGPROBS];
};

struct choice {
	struct req *r;
	char *text;
	size_t len, cap;
	size_t sent; /* bytes already streamed */
	struct lp_entry *lps;
	size_t n_lps, cap_lps, lps_sent;
	bool ended;
	bool stopped; /* a stop string matched */
	bool role_sent; /* chat stream: first delta carries the role */
	enum req_state end_state;
	enum req_finish finish;
	uint32_t n_tokens;
};

struct call {
	struct router *rt;
	struct http_conn *conn; /* NULL once the client is gone */
	struct api_request ar;
	int kind;
	char id[48];
	uint64_t created;
	uint32_t n_prompt;
	int n_choices;
	struct choice ch[API_MAX_N];
	int n_ended;
	int depth; /* re-entrancy guard: free only at depth 0 */
	bool streaming; /* SSE headers sent */
	bool responded;
	bool failed; /* an error event/response was sent */
	int fail_status;
	char fail_msg[256];
	size_t max_stop_len;
	uint64_t t_start; /* uv_hrtime at arrival */
	struct keepalive_entry ka; /* streaming: comments while nothing else is written */
};

static void call_maybe_free(struct call *cl);
static void call_try_finish(struct call *cl);

/* ---- text helpers ---------------------------------------------------------------------------- */

/* Length of the longest prefix of s that does not end inside a UTF-8 sequence. */
static size_t utf8_complete_prefix(const char *s, size_t n)
{
	size_t i = n, k = 0;
	while (i > 0 && k < 4) {
		unsigned char ch = (unsigned char)s[i - 1];
		if ((ch & 0xC0) != 0x80) {
			size_t need = ch < 0x80             ? 1
			              : (ch & 0xE0) == 0xC0 ? 2
			              : (ch & 0xF0) == 0xE0 ? 3
			              : (ch & 0xF8) == 0xF0 ? 4
			                                    : 1;
			return (k + 1 >= need) ? n : i - 1;
		}
		i--;
		k++;
	}
	return n;
}

/* JSON string from bytes that may not be valid UTF-8: invalid bytes become U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
	json_t *j = json_stringn(s, n);
	if (j)
		return j;
	char *o = malloc(n * 3 + 1);
	if (!o)
		return json_string("");
	size_t w = 0;
	for (size_t i = 0; i < n;) {
		unsigned char ch = (unsigned char)s[i];
		size_t need = ch < 0x80             ? 1
		              : (ch & 0xE0) == 0xC0 ? 2
		              : (ch & 0xF0) == 0xE0 ? 3
		              : (ch & 0xF8) == 0xF0 ? 4
		                                    : 0;
		bool ok = need > 0 && i + need <= n;
		for (size_t k = 1; ok && k < need; k++)
			ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
		if (ok && need > 1) {
			/* reject overlong forms, surrogates and code points past U+10FFFF */
			const unsigned char *u = (const unsigned char *)s + i;
			uint32_t cp = need == 2   ? (uint32_t)(u[0] & 0x1F)
			              : need == 3 ? (uint32_t)(u[0] & 0x0F)
			                          : (uint32_t)(u[0] & 0x07);
			for (size_t k = 1; k < need; k++)
				cp = (cp << 6) | (u[k] & 0x3F);
			static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
			ok = cp >= min_cp[need] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
		}
		if (ok) {
			memcpy(o + w, s + i, need);
			w += need;
			i += need;
		} else {
			memcpy(o + w, "\xEF\xBF\xBD", 3);
			w += 3;
			i++;
		}
	}
	j = json_stringn(o, w);
	free(o);
	return j ? j : json_string("");
}

static json_t *token_json(const struct codec *cd, int32_t id, bool as_id)
{
	if (as_id) {
		char s[32];
		snprintf(s, sizeof(s), "token_id:%d", id);
		return json_string(s);
	}
	const char *b;
	size_t n;
	if (codec_token_bytes(cd, id, &b, &n) != 0)
		return json_string("");
	return json_text(b, n);
}

static json_t *token_bytes_json(const struct codec *cd, int32_t id)
{
	json_t *a = json_array();
	const char *b;
	size_t n;
	if (codec_token_bytes(cd, id, &b, &n) == 0)
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer((unsigned char)b[i]));
	return a;
}

static int append_text(struct choice *ch, const char *b, size_t n)
{
	if (ch->len + n + 1 > ch->cap) {
		size_t cap = ch->cap ? ch->cap * 2 : 256;
		while (cap < ch->len + n + 1)
			cap *= 2;
		char *nt = realloc(ch->text, cap);
		if (!nt)
			return -ENOMEM;
		ch->text = nt;
		ch->cap = cap;
	}
	memcpy(ch->text + ch->len, b, n);
	ch->len += n;
	ch->text[ch->len] = '\0';
	return 0;
}

/* Finds the earliest stop string at or after `from`; returns its offset or -1. */
static long find_stop(const struct call *cl, const struct choice *ch, size_t from)
{
	long best = -1;
	for (int i = 0; i < cl->ar.n_stop; i++) {
		const char *p =
		    memmem(ch->text + from, ch->len - from, cl->ar.stop[i], strlen(cl->ar.stop[i]));
		if (p && (best < 0 || p - ch->text < best))
			best = p - ch->text;
	}
	return best;
}

/* How many trailing bytes could still become a stop string once more text arrives. */
static size_t stop_holdback(const struct call *cl, const struct choice *ch)
{
	size_t hold = 0;
	for (int i = 0; i < cl->ar.n_stop; i++) {
		size_t sl = strlen(cl->ar.stop[i]);
		for (size_t k = sl - 1; k > hold; k--)
			if (k <= ch->len && memcmp(ch->text + ch->len - k, cl->ar.stop[i], k) == 0) {
				hold = k;
				break;
			}
	}
	return hold;
}

/* ---- JSON building --------------------------------------------------------------------------- */

static json_t *logprobs_json(const struct call *cl, const struct choice *ch, size_t from, size_t to,
                             size_t text_base)
{
	const struct codec *cd = cl->rt->codec;
	if (!cl->ar.logprobs)
		return json_null();
	if (cl->kind == API_KIND_CHAT) {
		json_t *content = json_array();
		for (size_t i = from; i < to; i++) {
			const struct lp_entry *e = &ch->lps[i];
			json_t *top = json_array();
			for (int k = 0; k < e->n_top && k < cl->ar.top_logprobs; k++)
				json_array_append_new(
				    top, json_pack("{s:o,s:f,s:o}", "token",
				                   token_json(cd, e->top_ids[k], cl->ar.tokens_as_ids),
				                   "logprob", (double)e->top_lps[k], "bytes",
				                   token_bytes_json(cd, e->top_ids[k])));
			json_array_append_new(content,
			                      json_pack("{s:o,s:f,s:o,s:o}", "token",
			                                token_json(cd, e->id, cl->ar.tokens_as_ids),
			                                "logprob", (double)e->lp, "bytes",
			                                token_bytes_json(cd, e->id), "top_logprobs", top));
		}
		return json_pack("{s:o,s:n}", "content", content, "refusal");
	}
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
	for (size_t i = from; i < to; i++) {
		const struct lp_entry *e = &ch->lps[i];
		json_array_append_new(tokens, token_json(cd, e->id, cl->ar.tokens_as_ids));
		json_array_append_new(lps, json_real(e->lp));
		json_t *t = json_object();
		for (int k = 0; k < e->n_top && k < cl->ar.top_logprobs; k++) {
			json_t *key = token_json(cd, e->top_ids[k], cl->ar.tokens_as_ids);
			json_object_set_new(t, json_string_value(key), json_real(e->top_lps[k]));
			json_decref(key);
		}
		json_array_append_new(tops, t);
		json_array_append_new(offs, json_integer((json_int_t)(text_base + e->text_offset)));
	}
	return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
	                 "text_offset", offs);
}

static const char *finish_name(const struct choice *ch)
{
	if (ch->stopped || ch->finish == REQ_FINISH_EOS || ch->finish == REQ_FINISH_STOP)
		return "stop";
	return "length";
}

static json_t *usage_json(const struct call *cl)
{
	uint32_t gen = 0;
	for (int i = 0; i < cl->n_choices; i++)
		gen += cl->ch[i].n_tokens;
	return json_pack("{s:i,s:i,s:i}", "prompt_tokens", (json_int_t)cl->n_prompt, "completion_tokens",
	                 (json_int_t)gen, "total_tokens", (json_int_t)(cl->n_prompt + gen));
}

static json_t *envelope(const struct call *cl, bool chunk)
{
	const char *object = cl->kind == API_KIND_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
	                                               : "text_completion";
	return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", cl->id, "object", object, "created",
	                 (json_int_t)cl->created, "model", cl->ar.model, "system_fingerprint", "tandem");
}

/* ---- streaming ------------------------------------------------------------------------------- */

static void sse_send(struct call *cl, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s || !cl->conn)
		goto out;
	size_t n = strlen(s);
	char *buf = malloc(n + 8);
	if (buf) {
		memcpy(buf, "data: ", 6);
		memcpy(buf + 6, s, n);
		memcpy(buf + 6 + n, "\n\n", 2);
		keepalive_touch(&cl->ka);
		http_stream_write(cl->conn, buf, n + 8);
		free(buf);
	}
out:
	free(s);
}

/* Sends the stream-safe part of choice i (and, when final, the rest and its finish reason). */
static void stream_flush(struct call *cl, int i, bool final)
{
	struct choice *ch = &cl->ch[i];
	size_t safe = ch->len;
	if (!final) {
		size_t hold = stop_holdback(cl, ch);
		safe = ch->len - hold;
		safe = utf8_complete_prefix(ch->text, safe);
	}
	if (safe < ch->sent)
		safe = ch->sent;
	size_t lp_to = ch->lps_sent;
	while (lp_to < ch->n_lps && (ch->lps[lp_to].text_offset < safe || (final && !ch->stopped)))
		lp_to++;
	bool have_text = safe > ch->sent;
	bool first_chat = cl->kind == API_KIND_CHAT && !ch->role_sent;
	if (!have_text && !final && !first_chat && lp_to == ch->lps_sent)
		return;
	json_t *c;
	json_t *txt = json_text(ch->text + ch->sent, safe - ch->sent);
	json_t *lp = logprobs_json(cl, ch, ch->lps_sent, lp_to, 0);
	json_t *fin = final ? json_string(finish_name(ch)) : json_null();
	if (cl->kind == API_KIND_CHAT) {
		json_t *delta = json_object();
		if (first_chat)
			json_object_set_new(delta, "role", json_string("assistant"));
		if (have_text || !final)
			json_object_set_new(delta, "content", txt);
		else
			json_decref(txt);
		ch->role_sent = true;
		c = json_pack("{s:i,s:o,s:o,s:o}", "index", i, "delta", delta, "logprobs", lp,
		              "finish_reason", fin);
	} else {
		c = json_pack("{s:i,s:o,s:o,s:o}", "index", i, "text", txt, "logprobs", lp, "finish_reason",
		              fin);
	}
	ch->sent = safe;
	ch->lps_sent = lp_to;
	json_t *env = envelope(cl, true);
	json_object_set_new(env, "choices", json_pack("[o]", c));
	sse_send(cl, env);
}

static void stream_error(struct call *cl, int status, const char *msg)
{
	struct api_error err;
	api_error_set(&err, status, status >= 500 ? "server_error" : "invalid_request_error", NULL, NULL,
	              "%s", msg);
	char *body = api_error_json(&err, NULL);
	if (body && cl->conn) {
		size_t n = strlen(body);
		char *buf = malloc(n + 16);
		if (buf) {
			int k = snprintf(buf, n + 16, "data: %s\n\n", body);
			http_stream_write(cl->conn, buf, (size_t)k);
			free(buf);
		}
	}
	free(body);
}

/* ---- completion ------------------------------------------------------------------------------ */

static void respond_json(struct call *cl, int status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (cl->conn) {
		if (s)
			http_respond(cl->conn, status, "application/json", "", s, strlen(s));
		else
			router_send_error(cl->rt, cl->conn, 500, "server_error", NULL, NULL,
			                  "could not render the response");
	}
	free(s);
}

static void finish_nonstream(struct call *cl)
{
	json_t *env = envelope(cl, false);
	json_t *choices = json_array();
	for (int i = 0; i < cl->n_choices; i++) {
		struct choice *ch = &cl->ch[i];
		size_t n_lp = ch->n_lps;
		if (ch->stopped)
			while (n_lp > 0 && ch->lps[n_lp - 1].text_offset >= ch->len)
				n_lp--;
		json_t *txt = json_text(ch->text ? ch->text : "", ch->len);
		json_t *lp = logprobs_json(cl, ch, 0, n_lp, 0);
		json_t *c;
		if (cl->kind == API_KIND_CHAT)
			c = json_pack("{s:i,s:{s:s,s:o,s:n},s:o,s:s}", "index", i, "message", "role",
			              "assistant", "content", txt, "refusal", "logprobs", lp, "finish_reason",
			              finish_name(ch));
		else
			c = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "text", txt, "logprobs", lp,
			              "finish_reason", finish_name(ch));
		json_array_append_new(choices, c);
	}
	json_object_set_new(env, "choices", choices);
	json_object_set_new(env, "usage", usage_json(cl));
	respond_json(cl, 200, env);
}

static void call_try_finish(struct call *cl)
{
	if (cl->n_ended < cl->n_choices || cl->responded)
		return;
	cl->responded = true;
	if (log_level_max >= LOG_LVL_INFO) {
		uint32_t gen = 0;
		for (int i = 0; i < cl->n_choices; i++)
			gen += cl->ch[i].n_tokens;
		LOG_INFO("complete", "rid=%s %s %s%s: %s, %u prompt + %u generated tokens, %.1f ms",
		         cl->n_choices && cl->ch[0].r ? cl->ch[0].r->rid : "-", cl->id,
		         cl->kind == API_KIND_CHAT ? "chat" : "completion", cl->streaming ? " (stream)" : "",
		         !cl->conn    ? "client gone"
		         : cl->failed ? cl->fail_msg
		                      : "ok",
		         cl->n_prompt, gen, (double)(uv_hrtime() - cl->t_start) / 1e6);
	}
	if (!cl->conn)
		return;
	if (cl->failed && !cl->streaming) {
		router_send_error(cl->rt, cl->conn, cl->fail_status,
		                  cl->fail_status >= 500 ? "server_error" : "invalid_request_error", NULL,
		                  NULL, cl->fail_msg);
		return;
	}
	if (!cl->streaming) {
		finish_nonstream(cl);
		return;
	}
	if (!cl->failed && cl->ar.include_usage) {
		json_t *env = envelope(cl, true);
		json_object_set_new(env, "choices", json_array());
		json_object_set_new(env, "usage", usage_json(cl));
		sse_send(cl, env);
	}
	keepalive_remove(&cl->ka);
	if (!cl->failed)
		http_stream_write(cl->conn, "data: [DONE]\n\n", 14);
	http_stream_end(cl->conn);
	metrics_add(cl->rt->rm.streams_active, -1);
}

static void call_free(struct call *cl)
{
	keepalive_remove(&cl->ka);
	for (int i = 0; i < cl->n_choices; i++) {
		req_destroy(cl->ch[i].r);
		free(cl->ch[i].text);
		free(cl->ch[i].lps);
	}
	/* the connection cleared our abort callback when the response finished (or it died) */
	cl->rt->n_calls--;
	api_request_fini(&cl->ar);
	free(cl);
}

static void call_maybe_free(struct call *cl)
{
	if (cl->depth == 0 && cl->n_ended == cl->n_choices && (cl->responded || !cl->conn))
		call_free(cl);
}

static void on_token(void *ud, struct req *r, const struct req_token *t)
{
	struct call *cl = ud;
	struct choice *ch = &cl->ch[r->choice];
	if (ch->ended || ch->stopped)
		return;
	cl->depth++;
	ch->n_tokens++;
	const char *b;
	size_t n;
	size_t before = ch->len;
	if (!cl->ar.ignore_eos && codec_is_eog(cl->rt->codec, t->id)) {
		sched_finish(r, REQ_FINISH_EOS);
		goto out;
	}
	if (codec_token_bytes(cl->rt->codec, t->id, &b, &n) != 0) {
		sched_on_failed(r, 502, "worker returned a token id outside the vocabulary");
		goto out;
	}
	if (append_text(ch, b, n) != 0) {
		sched_on_failed(r, 503, "out of memory");
		goto out;
	}
	if (cl->ar.logprobs) {
		if (ch->n_lps == ch->cap_lps) {
			size_t cap = ch->cap_lps ? ch->cap_lps * 2 : 64;
			struct lp_entry *nl = realloc(ch->lps, cap * sizeof(*nl));
			if (!nl) {
				sched_on_failed(r, 503, "out of memory");
				goto out;
			}
			ch->lps = nl;
			ch->cap_lps = cap;
		}
		struct lp_entry *e = &ch->lps[ch->n_lps++];
		e->id = t->id;
		e->lp = t->logprob;
		e->text_offset = (uint32_t)before;
		e->n_top = t->n_top;
		memcpy(e->top_ids, t->top_ids, sizeof(e->top_ids));
		memcpy(e->top_lps, t->top_logprobs, sizeof(e->top_lps));
	}
	if (cl->ar.n_stop) {
		size_t from = before >= cl->max_stop_len ? before - cl->max_stop_len + 1 : 0;
		long at = find_stop(cl, ch, from);
		if (at >= 0) {
			ch->len = (size_t)at;
			ch->text[ch->len] = '\0';
			ch->stopped = true;
			sched_finish(r, REQ_FINISH_STOP);
			goto out;
		}
	}
	if (cl->streaming && cl->conn)
		stream_flush(cl, r->choice, false);
out:
	cl->depth--;
	call_maybe_free(cl);
}

static void on_end(void *ud, struct req *r, enum req_state state, enum req_finish finish, int status,
                   const char *message)
{
	struct call *cl = ud;
	struct choice *ch = &cl->ch[r->choice];
	if (ch->ended)
		return;
	cl->depth++;
	ch->ended = true;
	ch->end_state = state;
	ch->finish = finish;
	cl->n_ended++;
	if (state == REQ_STATE_FAILED && !cl->failed) {
		cl->failed = true;
		cl->fail_status = status;
		snprintf(cl->fail_msg, sizeof(cl->fail_msg), "%s", message ? message : "request failed");
		if (cl->streaming && cl->conn)
			stream_error(cl, status, cl->fail_msg);
		/* one failed choice fails the call: stop the others */
		for (int i = 0; i < cl->n_choices; i++)
			if (!cl->ch[i].ended && cl->ch[i].r)
				sched_cancel(cl->ch[i].r);
	} else if (state == REQ_STATE_DONE && cl->streaming && cl->conn && !cl->failed) {
		stream_flush(cl, r->choice, true);
	}
	call_try_finish(cl);
	cl->depth--;
	call_maybe_free(cl);
}

static const struct req_sink call_sink = {on_token, on_end};

static void on_abort(struct http_conn *c, void *ud)
{
	struct call *cl = ud;
	(void)c;
	cl->conn = NULL;
	keepalive_remove(&cl->ka);
	if (cl->streaming)
		metrics_add(cl->rt->rm.streams_active, -1);
	cl->depth++;
	LOG_INFO("complete", "rid=%s client disconnected (%s); cancelling %d choice(s)",
	         cl->ch[0].r ? cl->ch[0].r->rid : "-", cl->id, cl->n_choices - cl->n_ended);
	for (int i = 0; i < cl->n_choices; i++)
		if (!cl->ch[i].ended && cl->ch[i].r)
			sched_cancel(cl->ch[i].r);
	cl->depth--;
	call_maybe_free(cl);
}

/* ---- entry ----------------------------------------------------------------------------------- */

static void fill_sampling(const struct api_request *ar, int choice, struct req_sampling *s)
{
	memset(s, 0, sizeof(*s));
	s->temperature = (float)ar->temperature;
	s->top_p = (float)ar->top_p;
	s->top_k = ar->top_k;
	s->min_p = (float)ar->min_p;
	s->has_seed = ar->has_seed;
	s->seed = ar->seed + (uint64_t)choice; /* distinct but reproducible choices */
	s->frequency_penalty = (float)ar->frequency_penalty;
	s->presence_penalty = (float)ar->presence_penalty;
	s->want_logprobs = ar->logprobs;
	s->n_top_logprobs = ar->top_logprobs;
	s->ignore_eos = ar->ignore_eos;
}

void complete_handle(struct router *rt, struct http_conn *c, struct http_request *hr, int kind)
{
	struct call *cl = calloc(1, sizeof(*cl));
	if (!cl) {
		router_send_error(rt, c, 503, "server_error", NULL, NULL, "out of memory");
		return;
	}
	cl->rt = rt;
	cl->kind = kind;
	cl->t_start = uv_hrtime();
	rt->n_calls++;
	struct api_error aerr;
	if (api_request_decode((enum api_kind)kind, hr->body, hr->body_len, &cl->ar, &aerr) != 0) {
		router_send_error(rt, c, aerr.status, aerr.type, aerr.code, aerr.param[0] ? aerr.param : NULL,
		                  aerr.message);
		goto free_call;
	}
	if (strcmp(cl->ar.model, rt->cfg.model_name) != 0) {
		char msg[400];
		snprintf(msg, sizeof(msg), "The model '%.200s' does not exist; this server serves '%.150s'",
		         cl->ar.model, rt->cfg.model_name);
		router_send_error(rt, c, 404, "invalid_request_error", "model_not_found", "model", msg);
		goto free_call;
	}
	cl->created = (uint64_t)time(NULL);
	uint64_t seq = ++rt->next_req_id;
	snprintf(cl->id, sizeof(cl->id), "%s-%llx%08llx", kind == API_KIND_CHAT ? "chatcmpl" : "cmpl",
	         (unsigned long long)rt->created, (unsigned long long)seq);

	/* prompt -> ids */
	struct errbuf e = {0};
	int32_t *ids = NULL;
	uint32_t n_ids = 0;
	int rc;
	if (kind == API_KIND_CHAT) {
		rc = codec_chat(rt->codec, &cl->ar, &ids, &n_ids, &e);
	} else if (cl->ar.prompt) {
		rc = codec_encode(rt->codec, cl->ar.prompt, strlen(cl->ar.prompt), &ids, &n_ids, &e);
	} else {
		rc = 0;
		ids = malloc(cl->ar.n_prompt_ids * sizeof(int32_t));
		if (!ids)
			rc = errbuf_set(&e, -ENOMEM, "out of memory");
		else
			memcpy(ids, cl->ar.prompt_ids, cl->ar.n_prompt_ids * sizeof(int32_t));
		n_ids = (uint32_t)cl->ar.n_prompt_ids;
		for (uint32_t i = 0; rc == 0 && i < n_ids; i++)
			if ((uint32_t)ids[i] >= codec_n_vocab(rt->codec))
				rc = errbuf_set(&e, -EINVAL,
				                "prompt token id %d is outside the vocabulary (size %u)",
				                ids[i], codec_n_vocab(rt->codec));
	}
	if (rc != 0) {
		free(ids);
		router_send_error(rt, c, rc == -ENOMEM ? 503 : 400,
		                  rc == -ENOMEM ? "server_error" : "invalid_request_error", NULL, "prompt",
		                  e.msg);
		goto free_call;
	}
	if (n_ids == 0) {
		free(ids);
		router_send_error(rt, c, 400, "invalid_request_error", NULL, "prompt", "the prompt is empty");
		goto free_call;
	}
	uint32_t n_ctx = rt->cfg.n_ctx;
	int64_t want = cl->ar.max_tokens;
	if (n_ids >= n_ctx || (want > 0 && (uint64_t)n_ids + (uint64_t)want > n_ctx)) {
		char msg[300];
		snprintf(
		    msg, sizeof(msg),
		    "This model's maximum context length is %u tokens. However, you requested %llu tokens "
		    "(%u in the prompt, %lld for the completion). Please reduce the prompt or the completion "
		    "length.",
		    n_ctx, (unsigned long long)n_ids + (unsigned long long)(want > 0 ? want : 0), n_ids,
		    (long long)(want > 0 ? want : 0));
		free(ids);
		router_send_error(rt, c, 400, "invalid_request_error", "context_length_exceeded", "messages",
		                  msg);
		goto free_call;
	}
	uint32_t n_new = want > 0 ? (uint32_t)want : n_ctx - n_ids;
	if (want <= 0 && rt->cfg.n_max_tokens_default && rt->cfg.n_max_tokens_default < n_new)
		n_new = rt->cfg.n_max_tokens_default; /* KV blocks are reserved up front: do not reserve the
		                                         whole context */
	cl->n_prompt = n_ids;
	for (int i = 0; i < cl->ar.n_stop; i++)
		if (strlen(cl->ar.stop[i]) > cl->max_stop_len)
			cl->max_stop_len = strlen(cl->ar.stop[i]);

	/* admission is all-or-nothing for the call's choices */
	if (rt->draining || !sched_is_ready(rt->sched)) {
		free(ids);
		router_send_error(rt, c, 503, "server_error", "unavailable", NULL,
		                  rt->draining ? "server is shutting down"
		                               : "no prefill/decode workers are ready");
		goto free_call;
	}
	if (sched_n_queued(rt->sched) + (uint32_t)cl->ar.n > rt->cfg.sched.n_queue_max) {
		free(ids);
		metrics_add(rt->rm.http_rejected_429, 1);
		router_send_error(rt, c, 429, "rate_limit_error", "queue_full", NULL,
		                  "the server's request queue is full; retry later");
		goto free_call;
	}
	cl->n_choices = cl->ar.n;
	for (int i = 0; i < cl->n_choices; i++) {
		int32_t *p = ids;
		if (i + 1 < cl->n_choices) {
			p = malloc(n_ids * sizeof(int32_t));
			if (!p) {
				cl->n_choices = i;
				break;
			}
			memcpy(p, ids, n_ids * sizeof(int32_t));
		}
		struct req_sampling sp;
		fill_sampling(&cl->ar, i, &sp);
		cl->ch[i].r = req_create(rt->loop, seq * API_MAX_N + (uint64_t)i, p, n_ids, n_new, n_ctx, &sp,
		                         &call_sink, cl);
		if (!cl->ch[i].r) {
			if (p != ids)
				free(p);
			cl->n_choices = i;
			break;
		}
		cl->ch[i].r->choice = i;
	}
	if (cl->n_choices < cl->ar.n) {
		/* ids was handed to the last choice only when all were created */
		router_send_error(rt, c, 503, "server_error", NULL, NULL, "out of memory");
		goto free_call;
	}
	cl->conn = c;
	http_conn_set_abort_cb(c, on_abort, cl);
	if (cl->ar.stream) {
		http_stream_begin(c, 200, "text/event-stream", "");
		cl->streaming = true;
		keepalive_add(&rt->keepalive, &cl->ka, c);
		metrics_add(rt->rm.streams_active, 1);
	}
	cl->depth++;
	for (int i = 0; i < cl->n_choices; i++) {
		if (cl->failed) {
			/* an earlier choice failed synchronously: end this one without submitting */
			cl->ch[i].ended = true;
			cl->n_ended++;
			continue;
		}
		rc = sched_submit(rt->sched, cl->ch[i].r);
		if (rc != 0) {
			cl->ch[i].ended = true;
			cl->n_ended++;
			cl->failed = true;
			cl->fail_status = rc == ERR_LIMIT ? 429 : 503;
			snprintf(cl->fail_msg, sizeof(cl->fail_msg), "%s",
			         rc == ERR_LIMIT ? "the server's request queue is full; retry later"
			                         : "no workers are ready");
			if (cl->streaming)
				stream_error(cl, cl->fail_status, cl->fail_msg);
			for (int k = 0; k < i; k++)
				if (!cl->ch[k].ended)
					sched_cancel(cl->ch[k].r);
		}
	}
	cl->depth--;
	call_try_finish(cl);
	call_maybe_free(cl);
	return;

free_call:
	cl->n_choices = 0;
	cl->conn = NULL;
	call_free(cl);
}
