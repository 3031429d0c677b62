// Encodes each record of a JSON-lines file (one JSON string per line) with
// llama3-tokenizer-js, without BOS and EOS, and prints one JSON array of ids
// per record. The parity test //tests:tokenizer_llama3_test compares duet's
// tokenizer (on the tokenizer.json that export_llama3_vocab.js writes) with this.
//
//   node engine/testing/npm/encode_llama3.js corpus.jsonl > ids.jsonl
'use strict';
const { requirePackage, readRecords, writeIdLines, usage } = require('./common.js');

if (process.argv.length !== 3) usage('usage: node encode_llama3.js RECORDS.jsonl');
// The package's main entry is an ES module; it ships the same code as CommonJS.
const { llama3Tokenizer } =
    requirePackage('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs');
writeIdLines(readRecords(process.argv[2]).map((text) => llama3Tokenizer.encode(text, { bos: false, eos: false })));
