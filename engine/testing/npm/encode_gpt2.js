// Encodes each record of a JSON-lines file (one JSON string per line) with
// gpt-3-encoder and prints one JSON array of ids per record. The parity test
// //tests:tokenizer_gpt2_test compares duet's GPT-2 tokenizer with this.
//
//   node engine/testing/npm/encode_gpt2.js corpus.jsonl > ids.jsonl
'use strict';
const { requirePackage, readRecords, writeIdLines, usage } = require('./common.js');

if (process.argv.length !== 3) usage('usage: node encode_gpt2.js RECORDS.jsonl');
const { encode } = requirePackage('gpt-3-encoder');
writeIdLines(readRecords(process.argv[2]).map((text) => encode(text)));
