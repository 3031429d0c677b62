#!/usr/bin/env bash
# Installs what duet needs on Debian 12: the Debian packages for building and
# testing, and the pinned npm packages that tests use (into .deps/node, ignored).
# Idempotent; prints nothing when everything is already there.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java
  g++ libboost1.74-dev libboost-context1.74-dev libprotobuf-dev protobuf-compiler libabsl-dev
  libucx-dev ucx-utils libopenblas-dev libopenblas0-pthread prometheus-cpp-dev
  catch2 nlohmann-json3-dev libicu-dev libpcre2-dev zlib1g-dev libssl-dev
  mbw python3 python3-jinja2 python3-jsonschema
  prometheus
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Pinned npm packages used only by tests, kept inside the checkout (ignored).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_dir="$root/.deps/node"
if [ -f "$root/engine/testing/npm/package.json" ]; then
  if ! cmp -s "$root/engine/testing/npm/package.json" "$node_dir/package.json" 2>/dev/null || [ ! -d "$node_dir/node_modules" ]; then
    echo "setup: installing pinned npm packages into .deps/node" >&2
    mkdir -p "$node_dir"
    cp "$root/engine/testing/npm/package.json" "$node_dir/package.json"
    [ -f "$root/engine/testing/npm/package-lock.json" ] && cp "$root/engine/testing/npm/package-lock.json" "$node_dir/"
    (cd "$node_dir" && npm install --no-audit --no-fund --silent >/dev/null)
  fi
fi
