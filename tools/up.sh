#!/usr/bin/env bash
# Quick start: installs what is missing, builds duet, and runs it on the
# embedded tiny model. (Until the serving cluster lands, this generates from
# a prompt of token ids in one process: `duet generate`.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh
bazel build -c opt //tools:duet
echo "duet generate on the embedded tiny model (made on first use in ${XDG_CACHE_HOME:-$HOME/.cache}/duet):" >&2
exec bazel-bin/tools/duet generate --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 16 --temperature 0 \
  --logprobs 2 --json "$@"
