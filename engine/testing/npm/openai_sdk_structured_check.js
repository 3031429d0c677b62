// Structured outputs through the official OpenAI SDK for Node (the pinned
// `openai` package) against a cluster of a random tiny model: every output
// a grammar constrains must finish with `stop`, parse, and validate with ajv
// (ajv-formats; the draft-04 class where a schema says so).
//
//   node openai_sdk_structured_check.js BASE_URL MODEL SCHEMAS_JSONL
//   node openai_sdk_structured_check.js BASE_URL MODEL forced REASONING
//
// SCHEMAS_JSONL holds {"id", "schema"} per line (real schemas from
// JSONSchemaBench); each is bounded first (strings, arrays and numbers a
// random model could run on for ever get a limit), then asked for with
// response_format json_schema (strict, whole) and strict false (streamed).
// Then json_object, a regex, a choice, a GBNF and a Lark grammar (vLLM's
// structured_outputs and guided_* fields), and strict tool calls with
// tool_choice required and named. Chat requests turn Qwen3's thinking off
// (chat_template_kwargs), so each grammar starts at the first token. Every
// check is an assertion; the script exits 1 with the failed one. On success
// its last stdout line is a JSON summary.
//
// `forced` runs on a model forced to think (<think>REASONING</think>) after
// the generation prompt and to open a tool call after the no-thinking one:
// a schema applies after the thinking (which goes out as reasoning), and a
// strict tool's grammar with tool_choice auto starts at the call's opening.
'use strict';
const assert = require('assert/strict');
const fs = require('fs');
const { requirePackage } = require('./common.js');

const OpenAI = requirePackage('openai');
const Ajv = requirePackage('ajv').default;
const Ajv04 = requirePackage('ajv-draft-04');
const addFormats = requirePackage('ajv-formats');

function validator(schema) {
  const draft4 = typeof schema.$schema === 'string' && schema.$schema.includes('draft-04');
  const ajv = draft4 ? new Ajv04({ strict: false }) : new Ajv({ strict: false });
  addFormats(ajv);
  const copy = { ...schema };
  if (!draft4) delete copy.$schema;  // ajv's default class knows draft-07's meta-schema, not others'.
  return ajv.compile(copy);
}

// Limits where a schema sets none, so a random model's value ends.
function bound(s) {
  if (s === null || typeof s !== 'object' || Array.isArray(s)) return s;
  const out = { ...s };
  const map = (m) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, bound(v)]));
  for (const k of ['properties', 'patternProperties', 'definitions', '$defs']) if (out[k] && typeof out[k] === 'object') out[k] = map(out[k]);
  for (const k of ['anyOf', 'allOf', 'oneOf', 'prefixItems']) if (Array.isArray(out[k])) out[k] = out[k].map(bound);
  for (const k of ['additionalProperties', 'additionalItems', 'not']) if (out[k] && typeof out[k] === 'object') out[k] = bound(out[k]);
  if (Array.isArray(out.items)) out.items = out.items.map(bound);
  else if (out.items && typeof out.items === 'object') out.items = bound(out.items);
  const shaped = ['type', 'enum', 'const', 'properties', 'items', 'anyOf', 'allOf', 'oneOf', '$ref'].some((k) => k in out);
  if (!shaped) out.type = 'integer';  // Any value: an integer is one.
  const types = Array.isArray(out.type) ? out.type : [out.type];
  const free = !('enum' in out) && !('const' in out);
  if (free && types.includes('string') && out.maxLength === undefined) out.maxLength = 6;
  if (free && types.includes('array') && out.maxItems === undefined) out.maxItems = 2;
  if (free && (types.includes('number') || types.includes('integer'))) {
    // A number's digits are bounded by an integer's range.
    if (types.includes('number')) out.type = types.length === 1 ? 'integer' : types.map((t) => (t === 'number' ? 'integer' : t));
    if (out.maximum === undefined) out.maximum = 999;
    if (out.minimum === undefined) out.minimum = -999;
  }
  if (free && out.type === 'object' && out.additionalProperties === undefined && out.properties) {
    out.additionalProperties = false;
  }
  return out;
}

const noThinking = { chat_template_kwargs: { enable_thinking: false } };

async function streamed(client, body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta && c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish };
}

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', strict: true,
    parameters: {
      type: 'object', additionalProperties: false, required: ['city', 'unit'],
      properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    },
  },
};

async function forced(client, model, reasoning) {
  const summary = {};
  const schema = {
    type: 'object', additionalProperties: false, required: ['answer', 'confidence'],
    properties: { answer: { type: 'string', maxLength: 10 }, confidence: { type: 'integer', minimum: 0, maximum: 100 } },
  };
  const validate = validator(schema);
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  for (const stream of [false, true]) {
    const body = {
      model, messages, max_tokens: 200, seed: 21, response_format: { type: 'json_schema', json_schema: { name: 'a', schema, strict: true } },
    };
    let content = '', thought = '', finish;
    if (stream) {
      const s = await client.chat.completions.create({ ...body, stream: true });
      for await (const chunk of s) {
        const c = chunk.choices[0];
        if (!c) continue;
        content += (c.delta && c.delta.content) || '';
        thought += (c.delta && c.delta.reasoning) || '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    } else {
      const r = await client.chat.completions.create(body);
      content = r.choices[0].message.content;
      thought = r.choices[0].message.reasoning;
      finish = r.choices[0].finish_reason;
    }
    const where = `thinking then a schema (${stream ? 'streamed' : 'whole'}): ${JSON.stringify({ thought, content })}`;
    assert.equal(finish, 'stop', where);
    assert.equal(thought, reasoning, where);
    assert.ok(validate(JSON.parse(content)), `${where}: ${JSON.stringify(validate.errors)}`);
    summary.thinking_then_schema = (summary.thinking_then_schema || 0) + 1;
  }
  const params = validator(weatherTool.function.parameters);
  const r = await client.chat.completions.create({
    model, messages, tools: [weatherTool], tool_choice: 'auto', parallel_tool_calls: false, max_tokens: 200, seed: 22,
    ...noThinking,
  });
  const c = r.choices[0];
  const where = `auto: ${JSON.stringify(c.message)}`;
  assert.equal(c.finish_reason, 'tool_calls', where);
  assert.equal(c.message.tool_calls.length, 1, where);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather', where);
  assert.ok(params(JSON.parse(c.message.tool_calls[0].function.arguments)), `${where}: ${JSON.stringify(params.errors)}`);
  summary.auto_tool_calls = 1;
  return summary;
}

async function main() {
  const [baseURL, model, schemasFile] = process.argv.slice(2);
  if (schemasFile === 'forced') {
    const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });
    console.log(JSON.stringify(await forced(client, model, process.argv[5])));
    return;
  }
  assert.ok(baseURL && model && schemasFile, 'usage: openai_sdk_structured_check.js BASE_URL MODEL SCHEMAS_JSONL');
  const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  const summary = { schemas: 0, outputs: 0, nonempty_objects: 0 };
  const messages = [{ role: 'user', content: 'Fill in the form.' }];
  const max_tokens = 400;

  const records = fs.readFileSync(schemasFile, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  for (let i = 0; i < records.length; ++i) {
    const { id, schema } = records[i];
    const bounded = bound(schema);
    const validate = validator(bounded);
    const base = { model, messages, max_tokens, seed: 1000 + i, temperature: 1, ...noThinking };
    const whole = await client.chat.completions.create({
      ...base, response_format: { type: 'json_schema', json_schema: { name: 'form', schema: bounded, strict: true } },
    });
    const w = whole.choices[0];
    const s = await streamed(client, {
      ...base, response_format: { type: 'json_schema', json_schema: { name: 'form', schema: bounded, strict: false } },
    });
    for (const [what, text, finish] of [['whole', w.message.content, w.finish_reason], ['streamed', s.text, s.finish]]) {
      const where = `${id} (${what}): ${JSON.stringify(text).slice(0, 300)}`;
      assert.equal(finish, 'stop', where);
      let value;
      assert.doesNotThrow(() => { value = JSON.parse(text); }, where);
      assert.ok(validate(value), `${where}: ${JSON.stringify(validate.errors)}`);
      if (value && typeof value === 'object' && Object.keys(value).length > 0) summary.nonempty_objects += 1;
      summary.outputs += 1;
    }
    // The same seed and schema: the same text, whole or streamed.
    assert.equal(s.text, w.message.content, `${id}: streamed and whole differ`);
    summary.schemas += 1;
  }

  // json_object: any object.
  const obj = await client.chat.completions.create({
    model, messages, max_tokens, seed: 7, ...noThinking, response_format: { type: 'json_object' },
  });
  assert.equal(obj.choices[0].finish_reason, 'stop');
  const parsed = JSON.parse(obj.choices[0].message.content);
  assert.ok(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed), obj.choices[0].message.content);

  // vLLM's fields on completions: a regex, a choice and a GBNF grammar; n = 3
  // choices, each its own matcher.
  const regex = await client.completions.create({
    model, prompt: 'Date:', max_tokens: 40, seed: 3, n: 3, structured_outputs: { regex: '20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]' },
  });
  assert.equal(regex.choices.length, 3);
  for (const c of regex.choices) {
    assert.equal(c.finish_reason, 'stop', c.text);
    assert.match(c.text, /^20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]$/);
  }
  const choice = await client.completions.create({
    model, prompt: 'Sentiment:', max_tokens: 10, seed: 4, guided_choice: ['positive', 'negative', 'neutral'],
  });
  assert.equal(choice.choices[0].finish_reason, 'stop');
  assert.ok(['positive', 'negative', 'neutral'].includes(choice.choices[0].text), choice.choices[0].text);
  const gbnf = 'root ::= "(" expr ")"\nexpr ::= num (("+" | "*") num){0,3}\nnum ::= [1-9] [0-9]?\n';
  const g = await client.completions.create({
    model, prompt: 'Arithmetic:', max_tokens: 40, seed: 5, structured_outputs: { grammar: gbnf },
  });
  assert.equal(g.choices[0].finish_reason, 'stop', g.choices[0].text);
  assert.match(g.choices[0].text, /^\([1-9][0-9]?([+*][1-9][0-9]?){0,3}\)$/);
  // The same in vLLM's Lark dialect, told apart by syntax.
  const lark = 'start: "(" expr ")"\nexpr: NUM (("+" | "*") NUM) ~ 0..3\nNUM: /[1-9][0-9]?/\n';
  const l = await client.completions.create({
    model, prompt: 'Arithmetic:', max_tokens: 40, seed: 6, guided_grammar: lark,
  });
  assert.equal(l.choices[0].finish_reason, 'stop', l.choices[0].text);
  assert.match(l.choices[0].text, /^\([1-9][0-9]?([+*][1-9][0-9]?){0,3}\)$/);

  // Strict tools: required and named calls whose arguments validate.
  const tools = [weatherTool, {
    type: 'function',
    function: {
      name: 'get_time', strict: true,
      parameters: { type: 'object', additionalProperties: false, required: ['zone'], properties: { zone: { type: 'integer', minimum: -12, maximum: 14 } } },
    },
  }];
  const params = Object.fromEntries(tools.map((t) => [t.function.name, validator(t.function.parameters)]));
  summary.tool_calls = 0;
  for (const [k, tool_choice] of [['required', 'required'], ['named', { type: 'function', function: { name: 'get_time' } }]]) {
    for (const seed of [11, 12, 13]) {
      const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Weather or time?' }], tools, tool_choice, max_tokens: 200, seed,
        parallel_tool_calls: false,
      });
      const c = r.choices[0];
      const where = `${k} seed ${seed}: ${JSON.stringify(c.message)}`;
      assert.equal(c.finish_reason, 'tool_calls', where);
      assert.ok(c.message.tool_calls && c.message.tool_calls.length === 1, where);
      const call = c.message.tool_calls[0].function;
      if (k === 'named') assert.equal(call.name, 'get_time', where);
      assert.ok(params[call.name], where);
      assert.ok(params[call.name](JSON.parse(call.arguments)), `${where}: ${JSON.stringify(params[call.name].errors)}`);
      summary.tool_calls += 1;
    }
  }
  console.log(JSON.stringify(summary));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
