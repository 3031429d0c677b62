#!/usr/bin/env bash
# Reads the output of one `bazel test` run (file $1) and the test logs it
# names, and prints "PASSED FAILED": Catch2 test cases passed and failed. A
# test binary that failed without a Catch2 summary (a crash, a timeout)
# counts as one failed case, and so does a binary whose cases all passed
# but which failed afterwards (LeakSanitizer's report at exit).
set -euo pipefail
out="$1"
root="$(bazel info bazel-testlogs 2>/dev/null)"
passed=0
failed=0
while read -r target status; do
  pkg="${target#//}"; pkg="${pkg%%:*}"; name="${target##*:}"
  log="$root/$pkg/$name/test.log"
  summary=""
  [ -f "$log" ] && summary="$(grep -aE '^(All tests passed|test cases:)' "$log" | tail -n 1 || true)"
  if [[ "$summary" =~ ^All\ tests\ passed.*\ in\ ([0-9]+)\ test\ case ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    # Every case passed but the binary failed after them (a leak report, a
    # crash at exit): that is a failure too.
    [ "$status" = PASSED ] || failed=$((failed + 1))
  elif [[ "$summary" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[2])); failed=$((failed + BASH_REMATCH[3]))
  elif [[ "$summary" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    failed=$((failed + BASH_REMATCH[2]))
  elif [ "$status" = PASSED ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done < <(grep -aE '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$out" |
         sed -E 's/^([^ ]+) +(\(cached\) )?([A-Z ]+[A-Z]).*/\1 \3/' | sed -E 's/ in [0-9.]+s$//')
echo "$passed $failed"
