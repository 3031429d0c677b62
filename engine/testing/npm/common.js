// Shared by the scripts here: finds the pinned npm packages that
// tools/setup.sh installs, and reads and writes the JSON-lines files that the
// C++ tests and benchmark exchange with them.
'use strict';
const fs = require('fs');
const path = require('path');

// $DUET_NODE_MODULES, else .deps/node/node_modules in the checkout that holds
// this script (found from its real path, so it also works from Bazel runfiles).
function nodeModulesDir() {
  const fromEnv = process.env.DUET_NODE_MODULES;
  if (fromEnv) return fromEnv;
  let dir = path.dirname(fs.realpathSync(__filename));
  for (;;) {
    const candidate = path.join(dir, '.deps', 'node', 'node_modules');
    if (fs.existsSync(candidate)) return candidate;
    const parent = path.dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new Error('cannot find the pinned npm packages (.deps/node/node_modules): run `bash tools/setup.sh` ' +
                  'in the checkout, or set DUET_NODE_MODULES');
}

// Loads a file of a package in node_modules, with an error that says how to
// install it.
function requirePackage(relativePath) {
  const full = path.join(nodeModulesDir(), relativePath);
  if (!fs.existsSync(full)) {
    throw new Error(`${full} is missing: run \`bash tools/setup.sh\` to install the pinned npm packages`);
  }
  return require(full);
}

// One JSON string per line: a record may hold line breaks of its own.
function readRecords(file) {
  const text = fs.readFileSync(file, 'utf8');
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines.map((line, i) => {
    const value = JSON.parse(line);
    if (typeof value !== 'string') throw new Error(`${file}:${i + 1}: not a JSON string`);
    return value;
  });
}

function writeIdLines(idLists) {
  const out = idLists.map((ids) => '[' + ids.join(',') + ']\n').join('');
  process.stdout.write(out);
}

function usage(text) {
  process.stderr.write(text + '\n');
  process.exit(2);
}

// The tool-calling scripts' one function and question (the C++ tests that
// serve them play a model calling it on Paris).
const weatherTools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
    },
  },
}];
const weatherQuestion = [{ role: 'user', content: 'What is the weather in Paris?' }];

module.exports = { nodeModulesDir, requirePackage, readRecords, writeIdLines, usage, weatherTools, weatherQuestion };
