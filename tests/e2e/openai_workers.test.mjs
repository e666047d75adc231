// The official OpenAI client against tandem-router in front of real tandem-prefill and
// tandem-decode processes (tiny GLM-DSA model, CPU, KV over UCX). Greedy output is compared token
// for token with `tandem generate --greedy --ids` (REFS: a JSON file the shell script wrote).
// PHASE selects what runs: "greedy" (the per-transport check), "full" (everything else),
// "killdecode" / "killprefill" (worker deaths: use DECODE_PIDS / PREFILL_PIDS).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const BASE = process.env.ROUTER_URL;
const MODEL = process.env.MODEL_ID;
const PHASE = process.env.PHASE;
const refs = JSON.parse(fs.readFileSync(process.env.REFS, 'utf8')); // [{prompt:[ids], n, expect:[ids]}]
const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

const idsOf = (lp) => lp.tokens.map((t) => Number(t.slice('token_id:'.length)));

async function greedyIds(ref, stream) {
  const q = { model: MODEL, prompt: ref.prompt, max_tokens: ref.n, temperature: 0, logprobs: 0,
    return_tokens_as_token_ids: true };
  if (!stream) {
    const r = await client.completions.create(q);
    return { ids: idsOf(r.choices[0].logprobs), finish: r.choices[0].finish_reason };
  }
  const s = await client.completions.create({ ...q, stream: true });
  const ids = [];
  let finish = null;
  for await (const c of s) {
    if (c.choices[0].logprobs) ids.push(...idsOf(c.choices[0].logprobs));
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  return { ids, finish };
}

function sameAsReference(ref, got, what) {
  // the reference stops at an end-of-generation token; the server reports finish_reason "stop"
  if (got.finish === 'length') assert.deepEqual(got.ids, ref.expect, `${what}: greedy ids differ`);
  else assert.deepEqual(got.ids, ref.expect.slice(0, got.ids.length), `${what}: greedy prefix differs`);
}

async function metric(url, name) {
  const t = await (await fetch(`${url}/metrics`)).text();
  const line = t.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line ? Number(line.split(' ').pop()) : NaN;
}

test('greedy output equals tandem generate (2 prefill x 2 decode)', { skip: PHASE !== 'greedy' }, async () => {
  const jobs = refs.slice(0, 8).map((ref, i) => greedyIds(ref, i % 2 === 1).then((g) => sameAsReference(ref, g, `prompt ${i}`)));
  await Promise.all(jobs);
});

test('64 concurrent streams complete with correct output', { skip: PHASE !== 'full' }, async () => {
  assert.ok(refs.length >= 64);
  await Promise.all(refs.slice(0, 64).map((ref, i) =>
    greedyIds(ref, true).then((g) => sameAsReference(ref, g, `stream ${i}`))));
  for (let i = 0; i < 50 && (await metric(BASE, 'tandem_router_running_sequences')) !== 0; i++)
    await new Promise((r) => setTimeout(r, 100));
  assert.equal(await metric(BASE, 'tandem_router_running_sequences'), 0);
});

test('OpenAI client: chat and completions, stream and not, stop, n, seed, logprobs, usage', { skip: PHASE !== 'full' }, async () => {
  const ref = refs[0];
  // text round trip: non-streaming text equals the concatenated stream
  const a = await client.completions.create({ model: MODEL, prompt: ref.prompt, max_tokens: 12, temperature: 0 });
  const s = await client.completions.create({ model: MODEL, prompt: ref.prompt, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    else text += c.choices[0].text;
  }
  assert.equal(text, a.choices[0].text);
  assert.deepEqual(usage, a.usage);
  assert.equal(a.usage.prompt_tokens, ref.prompt.length);
  assert.equal(a.usage.completion_tokens, 12);

  // stop string: cut at the first occurrence of a piece of the greedy text
  const full = a.choices[0].text;
  const cut = [...full].findIndex((ch, i) => i > 2 && ch.trim() !== '' && !ch.includes('\ufffd'));
  if (cut > 0) {
    const stop = [...full][cut];
    const b = await client.completions.create({ model: MODEL, prompt: ref.prompt, max_tokens: 12, temperature: 0, stop });
    assert.equal(b.choices[0].text, full.slice(0, full.indexOf(stop)));
    assert.equal(b.choices[0].finish_reason, 'stop');
  }

  // chat through the model's chat template, streaming and not
  const messages = [{ role: 'user', content: 'Hello there' }];
  const c1 = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
  const c2 = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, stream: true });
  let ctext = '';
  for await (const c of c2) ctext += c.choices[0]?.delta?.content ?? '';
  assert.equal(ctext, c1.choices[0].message.content);
  assert.equal(c1.usage.completion_tokens, 8);

  // sampling with a seed is reproducible; n=2 gives two choices
  const q = { model: MODEL, prompt: ref.prompt, max_tokens: 10, temperature: 1.0, seed: 77, logprobs: 0,
    return_tokens_as_token_ids: true };
  const x = await client.completions.create(q);
  const y = await client.completions.create(q);
  assert.deepEqual(idsOf(x.choices[0].logprobs), idsOf(y.choices[0].logprobs));
  const n2 = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, n: 2, seed: 5,
    temperature: 1.0, logprobs: true, top_logprobs: 2 });
  assert.equal(n2.choices.length, 2);
  for (const ch of n2.choices) {
    assert.ok(ch.logprobs.content.length >= 1);
    for (const t of ch.logprobs.content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
    }
  }

  // errors come back OpenAI-shaped
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e) => e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.completions.create({ model: MODEL, prompt: Array(600).fill(5) }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

const decodeUrls = () => (process.env.DECODE_MPORTS || '').split(' ').filter(Boolean).map((p) => `http://127.0.0.1:${p}`);
async function workerBlocksUsed() {
  let sum = 0;
  for (const u of decodeUrls()) sum += await metric(u, 'tandem_kv_blocks_used');
  return sum;
}

test('a client that disconnects mid-stream gets its blocks freed', { skip: PHASE !== 'full' }, async () => {
  const base = await metric(BASE, 'tandem_router_kv_blocks_used');
  const workerBase = await workerBlocksUsed();
  const ac = new AbortController();
  const s = await client.completions.create({ model: MODEL, prompt: refs[1].prompt, max_tokens: 400, temperature: 0,
    stream: true }, { signal: ac.signal });
  let n = 0;
  let during = NaN;
  try {
    for await (const c of s) {
      if (++n === 3) during = await metric(BASE, 'tandem_router_kv_blocks_used');
      if (n === 5) ac.abort();
    }
  } catch (e) { assert.equal(e.name, 'AbortError'); }
  assert.ok(during > base, `blocks in use while streaming (${during} > ${base})`);
  let after = NaN;
  for (let i = 0; i < 60; i++) { // the gauge follows the decode workers' heartbeats (1 s)
    after = await metric(BASE, 'tandem_router_kv_blocks_used');
    if (after === base) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(after, base, 'KV-blocks-used gauge back to its baseline');
  // and on the decode workers themselves
  let wafter = NaN;
  for (let i = 0; i < 60; i++) {
    wafter = await workerBlocksUsed();
    if (wafter === workerBase) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(wafter, workerBase, 'decode workers freed the blocks');
});

test('a decode worker killed mid-stream: its requests end with an error event, the others complete', { skip: PHASE !== 'killdecode' }, async () => {
  const decodePids = process.env.DECODE_PIDS.split(' ').map(Number);
  const ref = refs[2];
  const results = [];
  let killed = false;
  const jobs = [];
  for (let i = 0; i < 6; i++) {
    jobs.push((async () => {
      const s = await client.completions.create({ model: MODEL, prompt: refs[i].prompt, max_tokens: 300, temperature: 0,
        stream: true });
      let n = 0;
      let finish = null;
      try {
        for await (const c of s) {
          n++;
          if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
          if (n === 20 && !killed) { killed = true; process.kill(decodePids[0], 'SIGKILL'); }
        }
        results.push({ ok: true, n, finish });
      } catch (e) {
        results.push({ ok: false, n, status: e.status, message: String(e.message) });
      }
    })());
  }
  await Promise.all(jobs);
  assert.ok(killed);
  const failed = results.filter((r) => !r.ok);
  const ok = results.filter((r) => r.ok);
  assert.ok(failed.length >= 1, `some streams on the killed worker fail: ${JSON.stringify(results)}`);
  assert.ok(ok.length >= 1, `streams on the other worker complete: ${JSON.stringify(results)}`);
  for (const f of failed) assert.match(f.message, /decode worker lost/);
  for (const r of ok) assert.ok(r.finish === 'length' || r.finish === 'stop', `completed stream ends normally: ${r.finish}`);
  // the survivor still serves
  const g = await greedyIds(ref, false);
  sameAsReference(ref, g, 'after the kill');
});

test('a prefill worker killed with work queued: its requests go to the other one', { skip: PHASE !== 'killprefill' }, async () => {
  const prefillPids = process.env.PREFILL_PIDS.split(' ').map(Number);
  const long = refs.find((r) => r.prompt.length >= 300);
  assert.ok(long, 'a long prompt in the references');
  const before = await metric(BASE, 'tandem_router_prefill_retries_total');
  const jobs = [];
  const p0 = `http://127.0.0.1:${process.env.PREFILL_MPORTS.split(' ')[0]}`;
  for (let i = 0; i < 24; i++) jobs.push(greedyIds(long, false));
  // kill prefill-0 once it holds a running prompt and at least one queued behind it
  let inflight = 0;
  for (let i = 0; i < 200 && inflight < 2; i++) {
    inflight = await metric(p0, 'tandem_prefill_requests_in_flight');
    if (inflight < 2) await new Promise((r) => setTimeout(r, 10));
  }
  assert.ok(inflight >= 2, `prefill-0 had work queued before the kill (${inflight})`);
  process.kill(prefillPids[0], 'SIGKILL');
  const got = await Promise.all(jobs);
  for (const g of got) sameAsReference(long, g, 'request re-prefilled after the kill');
  const after = await metric(BASE, 'tandem_router_prefill_retries_total');
  assert.ok(after > before, `requests were re-prefilled (${before} -> ${after})`);
});
