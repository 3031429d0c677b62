#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is
# missing, builds, runs every test but the GPU ones, then the engine, kernel, text,
# router and cross-component tests again under AddressSanitizer +
# LeakSanitizer, then the request-parser fuzzer, and ends with
# one line "N passed, N failed" (Catch2 test cases). Extra arguments go to
# the first `bazel test`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh || exit 1
# Where setup.sh put the npm packages the tokenizer parity tests run (.bazelrc
# passes this variable through to tests).
export DUET_NODE_MODULES="$PWD/.deps/node/node_modules"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
total_pass=0
total_fail=0
rc=0

run() {
  bazel test "$@" 2>&1 | tee "$log" | grep -avE '^INFO: From'
  local status=${PIPESTATUS[0]}
  read -r p f < <(bash tools/count_tests.sh "$log")
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
  if [ "$status" != 0 ]; then
    rc=1
    # A build failure runs no test: count it so the line cannot read green.
    if [ "$p" = 0 ] && [ "$f" = 0 ]; then total_fail=$((total_fail + 1)); fi
  fi
}

# libFuzzer on the request parser (clang, ASan + UBSan) for DUET_FUZZ_SECONDS
# (default 60) from the seed corpus; one test that fails on any finding.
fuzz() {
  local seconds="${DUET_FUZZ_SECONDS:-60}"
  echo "== libFuzzer: //router:request_fuzzer for ${seconds} s"
  if ! bazel build --config=fuzz //router:request_fuzzer 2>&1 | grep -avE '^INFO: From'; then
    echo "fuzzer build failed"
    total_fail=$((total_fail + 1))
    rc=1
    return
  fi
  local work
  work="$(mktemp -d)"
  cp router/fuzz_corpus/* "$work/"
  local bin
  bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)/router/request_fuzzer"
  if (cd "$work" && "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
        -artifact_prefix="$work/" -print_final_stats=1 "$work" >"$work/log" 2>&1); then
    echo "fuzzer: $(grep -a -m1 'Done' "$work/log"), no finding"
    total_pass=$((total_pass + 1))
  else
    tail -40 "$work/log"
    echo "fuzzer: FINDING (crash input kept in $work)"
    total_fail=$((total_fail + 1))
    rc=1
    return
  fi
  rm -rf "$work"
}

run //... --test_tag_filters=-gpu --build_tests_only "$@"
# The ASan pass leaves out the SIMT executor's tests (tag simt; the op
# harness skips its emulated CUDA backend there): their threads are
# Boost.Context fibers whose stack switches ASan is not told of (Boost
# annotates only its ucontext fibers, whose switches are system calls).
# Tests tagged no_asan are long runs of paths that others cover under ASan
# (the structured-output SDK runs over 32 schemas; the forced-model one and
# the fault tests run the same workers' grammar code under ASan).
run --config=asan --test_tag_filters=-gpu,-simt,-no_asan --build_tests_only //base/... //engine/... //kernels/... //text/... //router/... //grammar:grammar_test //tests/...
fuzz

echo "${total_pass} passed, ${total_fail} failed"
exit $rc
