#!/usr/bin/env bash
# Quick start: installs what is missing, builds duet, and starts a local
# cluster (router + 1 prefill + 1 decode worker) serving the OpenAI API on the
# embedded tiny model at http://127.0.0.1:8000/v1. Ctrl-C stops it. Extra
# arguments go to `duet up` (see `duet up --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh
bazel build -c opt //tools:duet
exec bazel-bin/tools/duet up "$@"
