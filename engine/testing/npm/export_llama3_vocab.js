// Writes a Hugging Face tokenizer.json for Llama 3 from the vocabulary and
// merges that llama3-tokenizer-js ships (base64 text and 17-bit packed pairs),
// laid out as Meta's own file: byte-level vocab {token: id}, merges in rank
// order, the Llama-3 Split regex + ByteLevel pre-tokenizer, ByteLevel decoder,
// and the 256 special tokens from id 128000 as added tokens.
//
//   node engine/testing/npm/export_llama3_vocab.js OUT/tokenizer.json
'use strict';
const fs = require('fs');
const { requirePackage, usage } = require('./common.js');

if (process.argv.length !== 3) usage('usage: node export_llama3_vocab.js OUT/tokenizer.json');
const { llama3Tokenizer: tok } =
    requirePackage('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs');

const kNumBaseTokens = 128000;
const kNumSpecialTokens = 256;
const kSplitRegex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function check(condition, message) {
  if (!condition) throw new Error('export_llama3_vocab: ' + message);
}

// vocabById: the base vocabulary (ids 0..127999), then the special tokens.
const vocab = tok.vocabById;
check(vocab.length === kNumBaseTokens + kNumSpecialTokens,
      `expected ${kNumBaseTokens + kNumSpecialTokens} tokens, the package has ${vocab.length}`);
check(new Set(vocab).size === vocab.length, 'the vocabulary has duplicate tokens');

// merges: Map "left right" -> priority (2 * rank + 1); sort by priority so the
// order does not rest on the Map's insertion order.
const merges = [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
for (const pair of merges) {
  const parts = pair.split(' ');
  check(parts.length === 2 && tok.vocabByString.has(parts[0]) && tok.vocabByString.has(parts[1]) &&
            tok.vocabByString.get(parts[0] + parts[1]) < kNumBaseTokens,
        `merge ${JSON.stringify(pair)} is not two tokens that join into a third`);
}

const specials = vocab.slice(kNumBaseTokens).map((content, i) => ({
  id: kNumBaseTokens + i,
  content,
  single_word: false,
  lstrip: false,
  rstrip: false,
  normalized: false,
  special: true,
}));
check(specials[0].content === '<|begin_of_text|>' && specials[9].content === '<|eot_id|>',
      'unexpected special token order');

const head = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: specials,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: kSplitRegex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'Sequence',
    processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: 'TemplateProcessing',
        single: [
          { SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
          { Sequence: { id: 'A', type_id: 0 } },
        ],
        pair: [
          { SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
          { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } },
          { Sequence: { id: 'B', type_id: 1 } },
        ],
        special_tokens: {
          '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [kNumBaseTokens], tokens: ['<|begin_of_text|>'] },
        },
      },
    ],
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
};

// The model is written by hand: JSON.stringify on a {token: id} object would
// move integer-like keys ("0", "12") to the front instead of keeping id order.
const model = [
  '"type": "BPE"', '"dropout": null', '"unk_token": null', '"continuing_subword_prefix": null',
  '"end_of_word_suffix": null', '"fuse_unk": false', '"byte_fallback": false', '"ignore_merges": true',
  '"vocab": {\n' + vocab.slice(0, kNumBaseTokens).map((t, id) => `      ${JSON.stringify(t)}: ${id}`).join(',\n') +
      '\n    }',
  '"merges": [\n' + merges.map((m) => '      ' + JSON.stringify(m)).join(',\n') + '\n    ]',
];
const headText = JSON.stringify(head, null, 2);
const text = headText.slice(0, headText.length - 2) + ',\n  "model": {\n    ' + model.join(',\n    ') + '\n  }\n}\n';
JSON.parse(text);  // Fails loudly if the hand-written part is malformed.
fs.writeFileSync(process.argv[2], text);
process.stderr.write(`wrote ${process.argv[2]}: ${kNumBaseTokens} tokens, ${merges.length} merges, ` +
                     `${specials.length} added tokens\n`);
