// Drives a running duet cluster through the official OpenAI SDK for Node
// (the pinned `openai` package): chat and completions, streamed and not, n,
// stop strings, logprobs, seeds, echo, model listing, the SDK's own error
// classes, and an AbortController abort in the middle of a stream.
//
//   node openai_sdk_check.js BASE_URL API_KEY MODEL
//
// Every check is an assertion; the script exits 1 with the failed one. On
// success its last stdout line is a JSON summary the C++ test reads
// (tests/openai_sdk_test.cc then checks, through /stats, that the aborted
// request was cancelled on the workers and its KV blocks returned).
'use strict';
const assert = require('assert/strict');
const { requirePackage } = require('./common.js');

const OpenAI = requirePackage('openai');

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// Concatenated text of choice `index` in completion or chat chunks.
function streamedText(chunks, index = 0) {
  let text = '';
  for (const c of chunks) {
    for (const ch of c.choices) {
      if (ch.index !== index) continue;
      text += ch.text !== undefined ? ch.text : (ch.delta && ch.delta.content) || '';
    }
  }
  return text;
}

function finishReason(chunks, index = 0) {
  let reason = null;
  for (const c of chunks) for (const ch of c.choices) if (ch.index === index && ch.finish_reason) reason = ch.finish_reason;
  return reason;
}

async function expectError(promise, cls, status, what) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e}`);
    assert.equal(e.status, status, `${what}: status`);
    return e;
  }
  assert.fail(`${what}: no error`);
}

async function main() {
  const [baseURL, apiKey, model] = process.argv.slice(2);
  assert.ok(baseURL && apiKey && model, 'usage: openai_sdk_check.js BASE_URL API_KEY MODEL');
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const summary = {};

  // Models.
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [model]);
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
  assert.equal(one.object, 'model');
  const missing = await expectError(client.models.retrieve('no/such-model'), OpenAI.NotFoundError, 404, 'unknown model');
  assert.equal(missing.code, 'model_not_found');

  // Completions: the stream and the body say the same, greedy.
  const prompt = 'Once upon a time';
  const base = { model, prompt, max_tokens: 24, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(base);
  assert.match(whole.id, /^cmpl-/);
  assert.equal(whole.object, 'text_completion');
  assert.equal(typeof whole.system_fingerprint, 'string');
  assert.equal(whole.choices.length, 1);
  const text = whole.choices[0].text;
  assert.ok(text.length > 0, 'completion text');
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 24);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + 24);
  const streamed = await collect(await client.completions.create({ ...base, stream: true,
                                                                   stream_options: { include_usage: true } }));
  assert.equal(streamedText(streamed), text, 'streamed completion = non-stream completion');
  assert.equal(finishReason(streamed), 'length');
  const usageChunk = streamed[streamed.length - 1];
  assert.equal(usageChunk.choices.length, 0);
  assert.equal(usageChunk.usage.completion_tokens, 24);
  summary.completion_tokens = whole.usage.completion_tokens;

  // A prompt batch: prompt i's choice j is choice i x n + j, each the text
  // its prompt gets alone; usage sums the prompts.
  const other = { ...base, prompt: 'The sky is' };
  const otherText = (await client.completions.create(other)).choices[0].text;
  const otherUsage = (await client.completions.create(other)).usage;
  const batch = await client.completions.create({ ...base, prompt: [prompt, other.prompt], n: 2 });
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(batch.choices.map((c) => c.text), [text, text, otherText, otherText]);
  assert.equal(batch.usage.prompt_tokens, whole.usage.prompt_tokens + otherUsage.prompt_tokens);
  assert.equal(batch.usage.completion_tokens, 4 * 24);
  const batchStream = await collect(await client.completions.create({ ...base, prompt: [prompt, other.prompt],
                                                                      stream: true }));
  const byIndex = ['', ''];
  for (const chunk of batchStream) for (const c of chunk.choices) byIndex[c.index] += c.text;
  assert.deepEqual(byIndex, [text, otherText], 'a streamed batch');
  summary.batch = batch.choices.length;

  // Echo.
  const echoed = await client.completions.create({ ...base, echo: true });
  assert.equal(echoed.choices[0].text, prompt + text);

  // Stop strings: cut where the greedy text first shows the stop string,
  // which never appears in the output, streamed or not.
  const cutAt = Math.max(1, Math.floor(text.length / 2));
  let stop = text.slice(cutAt, cutAt + 3);
  if (stop.trim().length === 0) stop = text.slice(cutAt - 1, cutAt + 3);
  const expect = text.slice(0, text.indexOf(stop));
  const stopped = await client.completions.create({ ...base, stop: [stop, '\u0000never'] });
  assert.equal(stopped.choices[0].text, expect, `stop ${JSON.stringify(stop)}`);
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  assert.ok(stopped.usage.completion_tokens < 24);
  const stoppedStream = await collect(await client.completions.create({ ...base, stop, stream: true }));
  assert.equal(streamedText(stoppedStream), expect);
  assert.equal(finishReason(stoppedStream), 'stop');
  summary.stop = stop;

  // Logprobs (completions): one entry per token, best alternatives first.
  const lp = await client.completions.create({ ...base, max_tokens: 6, logprobs: 3 });
  const l = lp.choices[0].logprobs;
  assert.equal(l.tokens.length, 6);
  assert.equal(l.token_logprobs.length, 6);
  for (let i = 0; i < 6; i++) {
    assert.ok(l.token_logprobs[i] <= 0);
    const top = Object.values(l.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 3);
    // Greedy: the chosen token is the best alternative.
    assert.ok(Math.abs(Math.max(...top) - l.token_logprobs[i]) < 1e-5);
  }

  // Chat, stream = body.
  const messages = [{ role: 'system', content: 'You are terse.' },
                    { role: 'user', content: [{ type: 'text', text: 'Say something.' }] }];
  const chatBase = { model, messages, max_completion_tokens: 16, temperature: 0 };
  const chat = await client.chat.completions.create(chatBase);
  assert.equal(chat.object, 'chat.completion');
  assert.match(chat.id, /^chatcmpl-/);
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(typeof chat.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
  const chatStream = await collect(await client.chat.completions.create({ ...chatBase, stream: true }));
  assert.equal(chatStream[0].object, 'chat.completion.chunk');
  assert.equal(chatStream[0].choices[0].delta.role, 'assistant');
  assert.equal(streamedText(chatStream), chat.choices[0].message.content);
  assert.equal(finishReason(chatStream), chat.choices[0].finish_reason);

  // Chat logprobs.
  const chatLp = await client.chat.completions.create({ ...chatBase, max_completion_tokens: 5, ignore_eos: true,
                                                        logprobs: true, top_logprobs: 2 });
  const content = chatLp.choices[0].logprobs.content;
  assert.equal(content.length, chatLp.usage.completion_tokens);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(e.top_logprobs.length >= 1 && e.top_logprobs.length <= 2);
    assert.ok(Array.isArray(e.bytes));
  }

  // n = 2, and seeds: the same seed samples the same text, choices differ by index.
  const sampled = { model, prompt, max_tokens: 16, temperature: 1.0, ignore_eos: true };
  const n2 = await client.completions.create({ ...sampled, n: 2, seed: 1234 });
  assert.equal(n2.choices.length, 2);
  assert.deepEqual(n2.choices.map((c) => c.index).sort(), [0, 1]);
  assert.equal(n2.usage.completion_tokens, 32);
  const again = await client.completions.create({ ...sampled, n: 2, seed: 1234 });
  for (let i = 0; i < 2; i++) {
    const a = n2.choices.find((c) => c.index === i).text;
    const b = again.choices.find((c) => c.index === i).text;
    assert.equal(a, b, `seeded choice ${i} reproduces`);
  }
  const seeds = [];
  for (const seed of [1, 2, 3]) seeds.push((await client.completions.create({ ...sampled, seed })).choices[0].text);
  assert.ok(new Set(seeds).size > 1, 'different seeds sample different texts');
  const chatN = await client.chat.completions.create({ ...chatBase, n: 2, temperature: 1, seed: 5 });
  assert.equal(chatN.choices.length, 2);
  summary.n2 = n2.choices.map((c) => c.text);

  // The SDK's error classes.
  const bad = await expectError(client.completions.create({ ...base, max_tokens: -1 }), OpenAI.BadRequestError, 400,
                                'max_tokens -1');
  assert.equal(bad.param, 'max_tokens');
  await expectError(client.chat.completions.create({ ...chatBase, temperature: 'hot' }), OpenAI.BadRequestError, 400,
                    'temperature "hot"');
  const nf = await expectError(client.completions.create({ ...base, model: 'no-such-model' }), OpenAI.NotFoundError,
                               404, 'unknown model');
  assert.equal(nf.code, 'model_not_found');
  const wrong = new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
  const auth = await expectError(wrong.completions.create(base), OpenAI.AuthenticationError, 401, 'wrong key');
  assert.equal(auth.code, 'invalid_api_key');
  await expectError(wrong.models.list(), OpenAI.AuthenticationError, 401, 'wrong key, models');

  // Abort a long stream after a few chunks: the router must cancel it on
  // the workers (the C++ test checks their pools afterwards).
  const controller = new AbortController();
  const long = await client.completions.create({ model, prompt: 'A long story:', max_tokens: 4000, ignore_eos: true,
                                                 temperature: 0, stream: true }, { signal: controller.signal });
  let seen = 0;
  try {
    for await (const chunk of long) {
      if (chunk.choices.length) seen++;
      if (seen === 3) controller.abort();
    }
    // The SDK ends an aborted stream's iteration quietly...
  } catch (e) {
    // ...or with its abort error.
    if (!(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError')) throw e;
  }
  assert.ok(controller.signal.aborted, 'the stream ended by the abort');
  assert.ok(seen >= 3 && seen < 4000);
  summary.aborted_after_chunks = seen;

  console.log(JSON.stringify(summary));
}

main().catch((e) => {
  console.error(`openai_sdk_check: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
