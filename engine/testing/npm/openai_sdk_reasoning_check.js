// Drives duet's router through the official OpenAI SDK for Node (the pinned
// `openai` package) on a model that thinks, answers and calls a tool: the
// thinking must arrive as `reasoning` and the answer as `content`, whole and
// streamed, with the call parsed from the answer; `chat_template_kwargs:
// {"enable_thinking": false}` must render the template's no-thinking prompt
// (EXTRA_PROMPT_TOKENS more tokens: its empty think block), after which the
// model answers without thinking; an assistant turn's `reasoning_content`
// must reach the template on the way back.
//
//   node openai_sdk_reasoning_check.js BASE_URL MODEL EXTRA_PROMPT_TOKENS REASONING ANSWER
//
// tests/openai_sdk_reasoning_test.cc serves it a forced Qwen3 model: after
// the generation prompt it writes <think>REASONING</think>, then ANSWER and
// a get_weather call; after the empty think block, ANSWER and the call.
// Every check is an assertion; the script exits 1 with the failed one. On
// success its last stdout line is a JSON summary.
'use strict';
const assert = require('assert/strict');
const { requirePackage, weatherTools, weatherQuestion } = require('./common.js');

const OpenAI = requirePackage('openai');

const tools = weatherTools;
const question = weatherQuestion;
const max_tokens = 200;

function checkCall(call, what) {
  assert.equal(call.function.name, 'get_weather', `${what}: name`);
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' }, `${what}: arguments`);
}

async function main() {
  const [baseURL, model, extra, reasoning, answer] = process.argv.slice(2);
  assert.ok(baseURL && model && extra && reasoning && answer,
            'usage: openai_sdk_reasoning_check.js BASE_URL MODEL EXTRA_PROMPT_TOKENS REASONING ANSWER');
  const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const summary = {};

  // Whole: the thinking apart, the answer as content, the call parsed.
  const whole = await client.chat.completions.create({ model, messages: question, tools, max_tokens, temperature: 0 });
  const msg = whole.choices[0].message;
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.reasoning, reasoning, 'reasoning, whole');
  assert.equal(msg.reasoning_content, undefined, 'one field, the router\'s');
  assert.equal((msg.content || '').trim(), answer, 'content, whole');
  assert.doesNotMatch(msg.content, /think|tool_call/, 'no tag in the content');
  assert.equal(msg.tool_calls.length, 1);
  checkCall(msg.tool_calls[0], 'whole');
  summary.reasoning = msg.reasoning;
  summary.content = msg.content;

  // Streamed: the same split, delta by delta.
  let streamedReasoning = '', streamedContent = '';
  const calls = [];
  let finish = null;
  for await (const c of await client.chat.completions.create({ model, messages: question, tools, max_tokens,
                                                               temperature: 0, stream: true })) {
    for (const ch of c.choices) {
      streamedReasoning += ch.delta.reasoning || '';
      streamedContent += ch.delta.content || '';
      calls.push(...(ch.delta.tool_calls || []));
      finish = ch.finish_reason || finish;
    }
  }
  assert.equal(streamedReasoning, reasoning, 'reasoning, streamed');
  assert.equal(streamedContent, msg.content, 'content, streamed');
  assert.equal(calls.length, 1);
  checkCall(calls[0], 'streamed');
  assert.equal(finish, 'tool_calls');

  // enable_thinking false: the template's empty think block ends the
  // prompt; the model answers without thinking.
  const plain = await client.chat.completions.create({ model, messages: question, tools, max_tokens, temperature: 0,
                                                       chat_template_kwargs: { enable_thinking: false } });
  assert.equal(plain.usage.prompt_tokens, whole.usage.prompt_tokens + Number(extra), 'the no-thinking prompt');
  assert.equal(plain.choices[0].message.reasoning, null, 'no thinking, no reasoning');
  assert.equal((plain.choices[0].message.content || '').trim(), answer, 'content, no thinking');
  checkCall(plain.choices[0].message.tool_calls[0], 'no thinking');

  // The way back: the assistant's turn with its thinking (reasoning_content,
  // DeepSeek's and SGLang's name) reaches the template, which renders it
  // after the last user turn; without it, the prompt is shorter.
  const result = { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: JSON.stringify({ temperature: 18 }) };
  const turn = { role: 'assistant', content: msg.content, tool_calls: msg.tool_calls };
  const withThinking = await client.chat.completions.create({
    model, tools, max_tokens: 1, temperature: 0,
    messages: [...question, { ...turn, reasoning_content: msg.reasoning }, result] });
  const without = await client.chat.completions.create({
    model, tools, max_tokens: 1, temperature: 0, messages: [...question, turn, result] });
  assert.ok(withThinking.usage.prompt_tokens > without.usage.prompt_tokens + 5,
            `the thinking rendered back: ${withThinking.usage.prompt_tokens} vs ${without.usage.prompt_tokens} tokens`);
  summary.prompt_tokens = [whole.usage.prompt_tokens, plain.usage.prompt_tokens, withThinking.usage.prompt_tokens,
                           without.usage.prompt_tokens];
  console.log(JSON.stringify(summary));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
