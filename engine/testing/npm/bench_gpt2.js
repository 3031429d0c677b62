// The JavaScript side of //tools/bench:tokenizer: encodes every record of a
// JSON-lines file with gpt-3-encoder, once to warm up (JIT and the package's
// BPE cache), then three timed passes, and prints the best as JSON:
// {"records": N, "bytes": B, "tokens": T, "seconds": S, "mb_per_s": R,
//  "package": "gpt-3-encoder 1.1.4", "node": "v20..."}
// (MB = 1e6 bytes of UTF-8 text). Only the encode loop is timed.
//
//   node engine/testing/npm/bench_gpt2.js corpus.jsonl
'use strict';
const { requirePackage, readRecords, usage } = require('./common.js');

if (process.argv.length !== 3) usage('usage: node bench_gpt2.js RECORDS.jsonl');
const { encode } = requirePackage('gpt-3-encoder');
const { version } = requirePackage('gpt-3-encoder/package.json');
const records = readRecords(process.argv[2]);
const bytes = records.reduce((n, r) => n + Buffer.byteLength(r, 'utf8'), 0);

function pass() {
  let tokens = 0;
  for (const r of records) tokens += encode(r).length;
  return tokens;
}

const tokens = pass();
let best = Infinity;
for (let i = 0; i < 3; ++i) {
  const start = process.hrtime.bigint();
  const t = pass();
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  if (t !== tokens) throw new Error('gpt-3-encoder gave a different token count on a repeat pass');
  best = Math.min(best, seconds);
}
process.stdout.write(JSON.stringify({ records: records.length, bytes, tokens, seconds: best,
                                      mb_per_s: bytes / 1e6 / best, package: `gpt-3-encoder ${version}`,
                                      node: process.version }) + '\n');
