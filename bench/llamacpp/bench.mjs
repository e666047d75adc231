// llama.cpp CPU prefill/decode throughput on a GGUF, shaped like `tandem bench` (same prompt length,
// generated tokens, threads; seeded random prompt ids; median of --reps runs after one warm-up).
//   node bench.mjs MODEL [--prompt N] [--gen N] [--threads T] [--reps R] [--seed S]
// Prints one JSON line.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const args = process.argv.slice(2);
const model = args[0];
const opt = (name, def) => {
	const i = args.indexOf(name);
	return i >= 0 ? Number(args[i + 1]) : def;
};
const P = opt("--prompt", 128), G = opt("--gen", 32), T = opt("--threads", 2), R = opt("--reps", 3);
let x = BigInt(opt("--seed", 1)) * 0x9E3779B97F4A7C15n + 1n;
const mask = (1n << 64n) - 1n;
const rnd = (n) => {
	x ^= (x << 13n) & mask; x ^= x >> 7n; x ^= (x << 17n) & mask;
	return Number(x % BigInt(n));
};

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const m = await llama.loadModel({modelPath: model, gpuLayers: 0});
const ctx = await m.createContext({contextSize: Math.max(256, P + G + 8), threads: T, batchSize: Math.max(P, 1),
	flashAttention: false});
const V = Number(m.fileInfo.metadata?.[m.fileInfo.metadata.general.architecture]?.vocab_size ?? 1000);
const median = (a) => { const s = [...a].sort((p, q) => p - q); const k = s.length >> 1; return s.length % 2 ? s[k] : (s[k - 1] + s[k]) / 2; };

async function once() {
	const seq = ctx.getSequence();
	const prompt = Array.from({length: P}, () => rnd(Math.min(V, 988)));
	const t0 = performance.now();
	await seq.evaluateWithoutGeneratingNewTokens(prompt);
	const t1 = performance.now();
	// decode: one token per forward, like a decode step (no sampling in the timed loop, as in
	// `tandem bench`)
	for (let i = 0; i < G; i++)
		await seq.evaluateWithoutGeneratingNewTokens([rnd(Math.min(V, 988))]);
	const t2 = performance.now();
	seq.dispose();
	return {prefill: (t1 - t0) / 1000, decode: (t2 - t1) / 1000};
}
await once();
const pf = [], dc = [];
for (let r = 0; r < R; r++) {
	const o = await once();
	pf.push(o.prefill); dc.push(o.decode);
}
console.log(JSON.stringify({engine: "llama.cpp (node-llama-cpp 3.21.1, CPU)", model, threads: T, prompt: P, gen: G,
	prefill_tok_s: P / median(pf), decode_tok_s: G / median(dc), decode_step_ms: 1000 * median(dc) / G}));
process.exit(0);
