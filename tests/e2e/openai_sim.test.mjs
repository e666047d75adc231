// The official OpenAI client (openai@6.49.0) against tandem-router with the simulated engine.
// Expected texts are derived here independently from the simulator's documented rule: byte
// tokens; greedy token at position i = SIM_TEXT[(fnv1a64(prompt ids) % len + i) % len].
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const BASE = process.env.ROUTER_URL;          // http://127.0.0.1:PORT
const KEY = process.env.API_KEY;
const SMALLQ = process.env.SMALLQ_URL;        // a router whose queue holds 1 request
const SIM_TEXT = 'lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor ' +
  'incididunt ut labore et dolore magna aliqua. ';
const CTX = 4096;

const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: KEY, maxRetries: 0 });

function fnv1a64(ids) {
  let h = 1469598103934665603n;
  for (const id of ids) {
    h ^= BigInt(id >>> 0);
    h = (h * 1099511628211n) & 0xffffffffffffffffn;
  }
  return h;
}
function greedy(promptText, n) {
  const ids = [...Buffer.from(promptText, 'utf8')];
  const off = Number(fnv1a64(ids) % BigInt(SIM_TEXT.length));
  let s = '';
  for (let i = 0; i < n; i++) s += SIM_TEXT[(off + i) % SIM_TEXT.length];
  return s;
}
const chatPrompt = (msgs) => msgs.map((m) => `<|${m.role}|>${m.content}\n`).join('') + '<|assistant|>';

test('models.list and retrieve', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, ['sim']);
  const m = await client.models.retrieve('sim');
  assert.equal(m.id, 'sim');
  assert.equal(m.object, 'model');
});

test('completions: greedy text, max_tokens, usage', async () => {
  const prompt = 'The capital of France is';
  const r = await client.completions.create({ model: 'sim', prompt, max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, greedy(prompt, 12));
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.deepEqual(r.usage, { prompt_tokens: Buffer.byteLength(prompt), completion_tokens: 12,
    total_tokens: Buffer.byteLength(prompt) + 12 });
});

test('completions: streaming equals non-streaming', async () => {
  const prompt = 'Once upon a time';
  const stream = await client.completions.create({ model: 'sim', prompt, max_tokens: 30, temperature: 0, stream: true });
  let text = '';
  let finish = null;
  let chunks = 0;
  for await (const c of stream) {
    chunks++;
    text += c.choices[0].text;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(text, greedy(prompt, 30));
  assert.equal(finish, 'length');
  assert.ok(chunks >= 30, `one chunk per token expected, got ${chunks}`);
});

test('chat: non-streaming and streaming with include_usage', async () => {
  const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }];
  const want = greedy(chatPrompt(messages), 20);
  const r = await client.chat.completions.create({ model: 'sim', messages, max_tokens: 20, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.usage.prompt_tokens, Buffer.byteLength(chatPrompt(messages)));
  assert.equal(r.usage.completion_tokens, 20);

  const s = await client.chat.completions.create({ model: 'sim', messages, max_completion_tokens: 20, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let role = null;
  let finish = null;
  for await (const c of s) {
    if (c.usage) { usage = c.usage; assert.deepEqual(c.choices, []); continue; }
    const d = c.choices[0].delta;
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, want);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, { prompt_tokens: r.usage.prompt_tokens, completion_tokens: 20,
    total_tokens: r.usage.prompt_tokens + 20 });
});

test('stop strings (string and array), streaming and not', async () => {
  const prompt = 'stop test prompt';
  const full = greedy(prompt, 60);
  const word = full.indexOf(' ', 1) > 0 ? full.slice(full.indexOf(' ', 1) + 1, full.indexOf(' ', 1) + 4) : 'or';
  const at = full.indexOf(word);
  assert.ok(at >= 0);
  const r = await client.completions.create({ model: 'sim', prompt, max_tokens: 60, temperature: 0, stop: word });
  assert.equal(r.choices[0].text, full.slice(0, at));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens <= at + word.length);

  const s = await client.completions.create({ model: 'sim', prompt, max_tokens: 60, temperature: 0,
    stop: ['zzzz', word], stream: true });
  let text = '';
  let finish = null;
  for await (const c of s) {
    text += c.choices[0].text;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(text, full.slice(0, at), 'a stream never shows text that a stop string cuts');
  assert.equal(finish, 'stop');
});

test('seed reproducibility and n=2', async () => {
  const q = { model: 'sim', prompt: 'random please', max_tokens: 24, temperature: 1.0 };
  const a = await client.completions.create({ ...q, seed: 1234 });
  const b = await client.completions.create({ ...q, seed: 1234 });
  const c = await client.completions.create({ ...q, seed: 4321 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);

  const n2 = await client.chat.completions.create({ model: 'sim', messages: [{ role: 'user', content: 'x' }],
    max_tokens: 16, n: 2, seed: 99, temperature: 1.0 });
  assert.equal(n2.choices.length, 2);
  assert.deepEqual(n2.choices.map((c) => c.index), [0, 1]);
  assert.notEqual(n2.choices[0].message.content, n2.choices[1].message.content);
  assert.equal(n2.usage.completion_tokens, 32);
  const again = await client.chat.completions.create({ model: 'sim', messages: [{ role: 'user', content: 'x' }],
    max_tokens: 16, n: 2, seed: 99, temperature: 1.0 });
  assert.deepEqual(again.choices.map((c) => c.message.content), n2.choices.map((c) => c.message.content));

  const s = await client.completions.create({ model: 'sim', prompt: 'two streams', max_tokens: 10, n: 2,
    temperature: 0, stream: true });
  const texts = ['', ''];
  for await (const ch of s) for (const c of ch.choices) texts[c.index] += c.text;
  assert.deepEqual(texts, [greedy('two streams', 10), greedy('two streams', 10)]);
});

test('logprobs: completions (integer) and chat (bool + top_logprobs)', async () => {
  const r = await client.completions.create({ model: 'sim', prompt: 'lp', max_tokens: 8, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 8);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.token_logprobs.length, 8);
  assert.ok(lp.token_logprobs.every((x) => x <= 0));
  assert.ok(lp.top_logprobs.every((t) => Object.keys(t).length === 2));
  assert.deepEqual(lp.text_offset, [0, 1, 2, 3, 4, 5, 6, 7]);

  const c = await client.chat.completions.create({ model: 'sim', messages: [{ role: 'user', content: 'lp' }],
    max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, 6);
  assert.equal(content.map((t) => t.token).join(''), c.choices[0].message.content);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 3);
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
  const none = await client.chat.completions.create({ model: 'sim', messages: [{ role: 'user', content: 'lp' }],
    max_tokens: 2 });
  assert.equal(none.choices[0].logprobs, null);
});

test('errors: unknown model (404), prompt over the context (400), bad API key (401)', async () => {
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, e.constructor.name);
    assert.equal(e.status, 404);
    assert.equal(e.code, 'model_not_found');
    assert.equal(e.param, 'model');
    assert.equal(e.type, 'invalid_request_error');
    return true;
  });
  await assert.rejects(client.completions.create({ model: 'sim', prompt: 'y'.repeat(CTX + 10) }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    assert.match(e.message, /maximum context length is 4096 tokens/);
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'sim', messages: [{ role: 'user', content: 'x' }],
    max_tokens: CTX }), (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  await assert.rejects(client.completions.create({ model: 'sim', prompt: 'x', temperature: 5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'temperature');
    return true;
  });
  const bad = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError);
    assert.equal(e.status, 401);
    assert.equal(e.code, 'invalid_api_key');
    return true;
  });
  await assert.rejects(bad.completions.create({ model: 'sim', prompt: 'x' }), (e) => e.status === 401);
});

test('raw HTTP errors: malformed JSON, wrong method, unknown route, body too large', async () => {
  const h = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
  let r = await fetch(`${BASE}/v1/completions`, { method: 'POST', headers: h, body: '{"model": "sim", "prompt": ' });
  assert.equal(r.status, 400);
  let j = await r.json();
  assert.deepEqual(Object.keys(j.error).sort(), ['code', 'message', 'param', 'type']);
  assert.match(j.error.message, /not valid JSON/);
  r = await fetch(`${BASE}/v1/completions`, { headers: h });
  assert.equal(r.status, 405);
  assert.equal(r.headers.get('allow'), 'POST');
  await r.json();
  r = await fetch(`${BASE}/v2/nothing`, { headers: h });
  assert.equal(r.status, 404);
  j = await r.json();
  assert.equal(j.error.type, 'invalid_request_error');
  r = await fetch(`${BASE}/v1/completions`, { method: 'POST', headers: h, body: 'x'.repeat(2 * 1024 * 1024) });
  assert.equal(r.status, 413);
  r = await fetch(`${BASE}/health`);
  assert.equal(r.status, 200);
  r = await fetch(`${BASE}/ready`);
  assert.equal(r.status, 200);
});

test('429 with Retry-After when the admission queue is full', { skip: !SMALLQ }, async () => {
  const small = new OpenAI({ baseURL: `${SMALLQ}/v1`, apiKey: 'none', maxRetries: 0 });
  // the small router's decode pool fits one request at a time and its queue holds one more
  const long = { model: 'sim', prompt: 'occupy', max_tokens: 400, temperature: 0 };
  const p1 = small.completions.create(long);
  await new Promise((r) => setTimeout(r, 100));
  const p2 = small.completions.create(long);
  await new Promise((r) => setTimeout(r, 100));
  await assert.rejects(small.completions.create(long), (e) => {
    assert.ok(e instanceof OpenAI.RateLimitError, e.constructor.name);
    assert.equal(e.status, 429);
    assert.equal(e.headers.get('retry-after'), '1');
    assert.equal(e.code, 'queue_full');
    return true;
  });
  const [a, b] = await Promise.all([p1, p2]);
  assert.equal(a.choices[0].text, greedy('occupy', 400));
  assert.equal(b.choices[0].text, greedy('occupy', 400));
});

async function metric(name) {
  const t = await (await fetch(`${BASE}/metrics`)).text();
  const line = t.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

test('64 concurrent streams complete with correct output', async () => {
  const jobs = [];
  for (let i = 0; i < 64; i++) {
    const prompt = `concurrent request number ${i}`;
    jobs.push((async () => {
      const s = await client.completions.create({ model: 'sim', prompt, max_tokens: 40, temperature: 0, stream: true });
      let text = '';
      for await (const c of s) text += c.choices[0].text;
      assert.equal(text, greedy(prompt, 40), `stream ${i}`);
    })());
  }
  await Promise.all(jobs);
  assert.equal(await metric('tandem_router_kv_blocks_used'), 0);
  assert.equal(await metric('tandem_router_running_sequences'), 0);
});

test('a client that disconnects mid-stream gets its blocks freed', async () => {
  const base = await metric('tandem_router_kv_blocks_used');
  const cancelledBefore = await metric('tandem_router_requests_total{outcome="cancelled"}');
  const ac = new AbortController();
  const s = await client.completions.create({ model: 'sim', prompt: 'walk away', max_tokens: 3000, temperature: 0,
    stream: true }, { signal: ac.signal });
  let n = 0;
  let during = 0;
  // the client ends the iteration quietly (or with an AbortError) once aborted
  try {
    for await (const c of s) {
      n += c.choices[0].text.length;
      if (n === 5) during = await metric('tandem_router_kv_blocks_used');
      if (n >= 10) ac.abort();
    }
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  assert.ok(n >= 10 && n < 3000, `stream cut short by the client (${n} chars)`);
  assert.ok(during > base, `blocks in use while streaming (${during} > ${base})`);
  let after = NaN;
  for (let i = 0; i < 50; i++) {
    after = await metric('tandem_router_kv_blocks_used');
    if (after === base) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(after, base, 'KV-blocks-used gauge back to its baseline');
  assert.equal(await metric('tandem_router_requests_total{outcome="cancelled"}'), cancelledBefore + 1);
});
