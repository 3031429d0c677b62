// Drives duet's router through the official OpenAI SDK for Node (the pinned
// `openai` package) on a tool-calling round trip: a request with tools whose
// answer is a call (streamed and not, and through the SDK's own stream
// helper, which accumulates tool_calls deltas), the follow-up that carries
// the assistant's call and the tool's result back, tool_choice "none",
// "required" and naming the function, and the SDK's error class for a
// tool_choice that names a function tools lacks.
//
//   node openai_sdk_tools_check.js BASE_URL MODEL
//
// tests/openai_sdk_tools_test.cc serves it: its worker answers with a
// Hermes-style call (continuing one the prompt opens) while the prompt has
// no tool result, and with a sentence once it has. Every check is an assertion; the script exits 1 with the
// failed one. On success its last stdout line is a JSON summary.
'use strict';
const assert = require('assert/strict');
const { requirePackage, weatherTools, weatherQuestion } = require('./common.js');

const OpenAI = requirePackage('openai');

const tools = weatherTools;
const question = weatherQuestion;
// Room for the call (duet's default max_tokens is 16, as for completions).
const max_tokens = 100;

function checkCall(call, what) {
  assert.match(call.id, /^call_[0-9a-f]{16}$/, `${what}: id`);
  assert.equal(call.type, 'function', `${what}: type`);
  assert.equal(call.function.name, 'get_weather', `${what}: name`);
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' }, `${what}: arguments`);
}

async function main() {
  const [baseURL, model] = process.argv.slice(2);
  assert.ok(baseURL && model, 'usage: openai_sdk_tools_check.js BASE_URL MODEL');
  const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const summary = {};

  // The call, whole.
  const whole = await client.chat.completions.create({ model, messages: question, tools, max_tokens, temperature: 0 });
  const choice = whole.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.role, 'assistant');
  assert.equal(choice.message.content, null, 'a reply that is only a call has no content');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  checkCall(call, 'non-stream');

  // The same call streamed, accumulated by hand: one delta per call, with
  // its index, id, name and arguments; then finish_reason tool_calls.
  const chunks = [];
  for await (const c of await client.chat.completions.create({ model, messages: question, tools, max_tokens, temperature: 0,
                                                               stream: true })) {
    chunks.push(c);
  }
  const deltas = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.delta.tool_calls || []));
  assert.equal(deltas.length, 1);
  assert.equal(deltas[0].index, 0);
  checkCall(deltas[0], 'stream');
  assert.notEqual(deltas[0].id, call.id, 'each response names its calls anew');
  const streamedContent = chunks.map((c) => c.choices.map((ch) => ch.delta.content || '').join('')).join('');
  assert.equal(streamedContent, '', 'no call text leaks into content');
  assert.equal(chunks.flatMap((c) => c.choices).filter((ch) => ch.finish_reason).pop().finish_reason, 'tool_calls');

  // The SDK's stream helper: it folds the deltas into a final message.
  const runner = client.chat.completions.stream({ model, messages: question, tools, max_tokens, temperature: 0 });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  checkCall(final.choices[0].message.tool_calls[0], 'stream helper');

  // The follow-up: the assistant's call and the tool's result go back; the
  // worker answers in words.
  const followUp = [
    ...question,
    choice.message,
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 18 }) },
  ];
  const answer = await client.chat.completions.create({ model, messages: followUp, tools, max_tokens, temperature: 0 });
  assert.equal(answer.choices[0].finish_reason, 'stop');
  assert.equal(answer.choices[0].message.content, 'It is 18 C in Paris.');
  assert.equal(answer.choices[0].message.tool_calls, undefined);
  summary.answer = answer.choices[0].message.content;

  // tool_choice none: the tools are not shown to the model and its output is
  // not parsed; the worker's call text arrives as content.
  const none = await client.chat.completions.create({ model, messages: question, tools, max_tokens, tool_choice: 'none' });
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.match(none.choices[0].message.content, /^<tool_call>\n\{"name": "get_weather"/);

  // tool_choice required, and naming the function: the prompt ends with the
  // opening of a call, which the worker's output continues.
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const what = `tool_choice ${JSON.stringify(tool_choice)}`;
    const forced = await client.chat.completions.create({ model, messages: question, tools, max_tokens, tool_choice });
    assert.equal(forced.choices[0].finish_reason, 'tool_calls', what);
    assert.equal(forced.choices[0].message.content, null, what);
    assert.equal(forced.choices[0].message.tool_calls.length, 1, what);
    checkCall(forced.choices[0].message.tool_calls[0], what);
  }

  // A function tool_choice names that tools lacks: the SDK's error class,
  // naming the parameter.
  try {
    await client.chat.completions.create({ model, messages: question, tools, max_tokens,
                                           tool_choice: { type: 'function', function: { name: 'get_time' } } });
    assert.fail('an unknown named function: no error');
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `an unknown named function: ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.param, 'tool_choice');
  }
  summary.call_id = call.id;
  console.log(JSON.stringify(summary));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
