#!/usr/bin/env bash
# The GPU checks, in two halves: build and pack here (no GPU needed), run on
# a lent GPU machine (no Bazel, no Debian packages there). See --help.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

PACK=gpu_pack
# What may travel: the device tool sends the working tree plus carried paths,
# 64 MiB in all.
LIMIT_MIB=64
# Libraries above this size are not packed; run.sh finds them on the GPU
# machine (the CUDA image there has PyTorch's cuBLAS and NCCL wheels).
BIG_LIB_MIB=${GPU_CHECK_BIG_LIB_MIB:-16}

usage() {
  cat <<'EOF'
tools/gpu_check.sh: the project's one script for a lent GPU machine.

First half, here (no GPU needed):
  tools/gpu_check.sh            (or: tools/gpu_check.sh --pack)
    1. finds the GPU tests and benchmarks:
         bazel query 'attr(tags, "\bgpu\b", tests(//...))'
         bazel query 'attr(tags, "\bgpu\b", kind(cc_binary, //tools/bench/...))'
    2. builds them: bazel build -c opt --config=cuda <targets>
    3. packs into gpu_pack/ (git-ignored): the binaries and their runfiles
       (runfiles/duet/<package>/...), the shared libraries they load (lib/,
       found with ldd; not the driver's libcuda.so* nor glibc's ld-linux, libc,
       libm, libpthread, libdl, librt), and run.sh. Libraries over 16 MiB
       (cuBLAS, cuBLASLt, NCCL: 50-550 MB each) cannot travel and are listed in
       gpu_pack/EXTERNAL; run.sh finds them on the GPU machine. Fails if the
       pack plus the working tree exceed 64 MiB, printing the biggest files.

Second half, on the GPU machine:
  bash gpu_pack/run.sh          (or: tools/gpu_check.sh --run-packed)
    sets LD_LIBRARY_PATH to gpu_pack/lib (+ the directories where it found the
    EXTERNAL libraries), runs every test and benchmark, writes
    $OUT/gpu_check.log (every binary's output) and $OUT/summary.txt, prints
    bandwidth/benchmark tables, one line per binary, then the op harness's
    every-op case under compute-sanitizer --tool racecheck (where the
    machine has it; "RACECHECK not run" where not), and a last line
    "gpu_check: N passed, M failed". Exit status 0 only if all passed.
    Without a GPU every test fails with its no-device message (that checks
    the runner).
  bash gpu_pack/run.sh --dry-run   (or: tools/gpu_check.sh --dry-run)
    what CI runs after packing: resolves every packed binary's shared
    libraries as the real run would (failing if one cannot be found) and
    lists the binaries it would run; runs none, so none counts as passed.

The device tool call (one short run; give the machine back afterwards):
  run(command="bash gpu_pack/run.sh", carry=["gpu_pack"], timeout_s=540)
gpu_pack/ is ignored by git, so it travels only because `carry` names it.
EOF
}

die() {
  echo "gpu_check: $*" >&2
  exit 1
}

# ---------------------------------------------------------------- first half

pack() {
  command -v bazel >/dev/null || die "bazel not found (the first half runs on the build machine)"
  local tests benches
  tests=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null) ||
    die "bazel query for GPU tests failed"
  benches=$(bazel query 'attr(tags, "\bgpu\b", kind("cc_binary", //tools/bench/...))' 2>/dev/null) ||
    benches=""
  [ -n "$tests$benches" ] || die "no target is tagged gpu"
  echo "gpu_check: GPU tests:" "${tests//$'\n'/ }"
  echo "gpu_check: GPU benchmarks:" "${benches:-none}"

  # shellcheck disable=SC2086
  bazel build -c opt --config=cuda $tests $benches || die "build failed"
  local bin
  bin=$(bazel info -c opt --config=cuda bazel-bin 2>/dev/null) || die "bazel info failed"

  rm -rf "$PACK"
  mkdir -p "$PACK/lib" "$PACK/runfiles"
  : >"$PACK/MANIFEST"
  : >"$PACK/EXTERNAL"
  : >"$PACK/.elves"

  local kind label pkg name manifest rel src
  for kind in test bench; do
    local labels=$tests
    [ $kind = bench ] && labels=$benches
    for label in $labels; do
      pkg=${label#//}
      pkg=${pkg%%:*}
      name=${label##*:}
      manifest="$bin/$pkg/$name.runfiles_manifest"
      [ -f "$manifest" ] || die "no runfiles manifest for $label ($manifest)"
      # Each line: "<workspace-relative path> <absolute path>". Shared
      # libraries in _solib_* dirs go to lib/ through ldd instead.
      while read -r rel src; do
        [ -n "$src" ] || continue
        case "$rel" in */_solib_*) continue ;; esac
        mkdir -p "$PACK/runfiles/$(dirname "$rel")"
        cp -L "$src" "$PACK/runfiles/$rel" || die "cannot copy $src"
        # ldd runs on the original: its RUNPATH ($ORIGIN/../_solib_k8) resolves there.
        head -c4 "$src" | grep -q ELF && echo "$src" >>"$PACK/.elves"
      done <"$manifest"
      [ -x "$PACK/runfiles/duet/$pkg/$name" ] || die "$label: binary missing from its runfiles"
      echo "$kind $label duet/$pkg/$name" >>"$PACK/MANIFEST"
    done
  done

  # Shared libraries of every ELF file packed, by the name the loader asks for.
  local elf line soname path size
  while IFS= read -r elf; do
    while IFS= read -r line; do
      case "$line" in
        *"not found"*) die "$elf: $line (install it or fix the build)" ;;
        *"=>"*) ;;
        *) continue ;;
      esac
      soname=$(echo "$line" | awk '{print $1}')
      path=$(echo "$line" | awk '{print $3}')
      case "$soname" in
        libcuda.so* | libnvidia*) continue ;;  # The GPU machine's driver.
        ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so*) continue ;;
      esac
      [ -e "$PACK/lib/$soname" ] && continue
      grep -qx "$soname" "$PACK/EXTERNAL" && continue
      size=$(stat -L -c %s "$path")
      if [ "$size" -gt $((BIG_LIB_MIB * 1024 * 1024)) ]; then
        echo "$soname" >>"$PACK/EXTERNAL"
        echo "gpu_check: not packing $soname ($((size / 1024 / 1024)) MiB > ${BIG_LIB_MIB} MiB): run.sh finds it on the GPU machine"
        continue
      fi
      cp -L "$path" "$PACK/lib/$soname" || die "cannot copy $path"
    done < <(ldd "$elf" 2>&1)
  done < <(sort -u "$PACK/.elves")
  rm -f "$PACK/.elves"

  # Smaller to send; the build has no debug info in -c opt anyway.
  find "$PACK/runfiles" "$PACK/lib" -type f -exec sh -c \
    'head -c4 "$1" | grep -q ELF && chmod u+w "$1" && strip --strip-unneeded "$1" 2>/dev/null' _ {} \;

  write_run_sh
  check_size
}

check_size() {
  local pack_bytes tree_bytes total limit
  pack_bytes=$(du -sb "$PACK" | cut -f1)
  tree_bytes=$( (git ls-files -z -c -o --exclude-standard | xargs -0 stat -c %s 2>/dev/null) |
    awk '{s += $1} END {print s + 0}')
  total=$((pack_bytes + tree_bytes))
  limit=$((LIMIT_MIB * 1024 * 1024))
  echo
  echo "gpu_check: pack contents:"
  echo "  binaries: $(find "$PACK/runfiles" -type f | wc -l) files, $(du -sh "$PACK/runfiles" | cut -f1)"
  echo "  lib/:     $(find "$PACK/lib" -type f | wc -l) libraries, $(du -sh "$PACK/lib" | cut -f1)"
  echo "  EXTERNAL (found on the GPU machine): $(tr '\n' ' ' <"$PACK/EXTERNAL")"
  echo "  largest:"
  find "$PACK" -type f -printf '%s %p\n' | sort -rn | head -5 |
    awk '{printf "    %6.1f MiB  %s\n", $1 / 1048576, $2}'
  awk -v p="$pack_bytes" -v t="$tree_bytes" -v l="$LIMIT_MIB" 'BEGIN {
    printf "gpu_check: pack %.1f MiB + working tree %.1f MiB = %.1f MiB (limit %d MiB)\n",
      p / 1048576, t / 1048576, (p + t) / 1048576, l }'
  if [ "$total" -gt "$limit" ]; then
    echo "gpu_check: TOO BIG to travel to the GPU machine. Biggest files:" >&2
    find "$PACK" -type f -printf '%s %p\n' | sort -rn | head -15 |
      awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}' >&2
    echo "gpu_check: lower GPU_CHECK_BIG_LIB_MIB (now $BIG_LIB_MIB) to leave more libraries to the GPU machine, or link fewer (-Wl,--as-needed with linkstatic, see kvtransfer/testing/defs.bzl)" >&2
    exit 1
  fi
  echo "gpu_check: packed $(wc -l <"$PACK/MANIFEST") binaries into $PACK/. On the GPU machine:"
  echo '  run(command="bash gpu_pack/run.sh", carry=["gpu_pack"], timeout_s=540)'
}

write_run_sh() {
  cat >"$PACK/run.sh" <<'RUN_SH'
#!/usr/bin/env bash
# Second half of tools/gpu_check.sh: runs the packed GPU tests and benchmarks.
# Written by tools/gpu_check.sh; runs anywhere (no Bazel): on a lent GPU
# machine for real, on the build machine to check the runner (every test then
# fails with its no-device message).
set -uo pipefail
PACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *)
    echo "usage: run.sh [--dry-run]" >&2
    exit 2
    ;;
esac
OUT="${OUT:-$PACK/out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/summary.txt"
TIMEOUT_S="${GPU_CHECK_TIMEOUT_S:-240}"
: >"$LOG"
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

export LD_LIBRARY_PATH="$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Libraries too big to travel (EXTERNAL): keep what the loader already finds
# (ldconfig, the binaries' RUNPATH /usr/local/cuda/lib64), else look where the
# CUDA toolkit and PyTorch's nvidia-* wheels put them.
missing() { # sonames any packed binary cannot resolve
  while read -r _ _ path; do ldd "$PACK/runfiles/$path" 2>/dev/null; done <"$PACK/MANIFEST" |
    awk '/not found/ {print $1}' | sort -u
}
candidates() {
  echo /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/lib
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - 2>/dev/null <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "*", "lib")):
        print(d)
PY
  done
}
need=$(missing)
if [ -n "$need" ]; then
  dirs=$(candidates)
  for so in $need; do
    found=""
    for d in $dirs; do
      if [ -e "$d/$so" ]; then found="$d"; break; fi
    done
    if [ -z "$found" ]; then
      found=$(find /usr /opt -xdev -name "$so" -printf '%h\n' 2>/dev/null | head -1)
    fi
    if [ -n "$found" ]; then
      say "run.sh: $so from $found"
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$found"
    else
      say "run.sh: $so NOT FOUND on this machine (binaries that need it will fail)"
    fi
  done
fi

# compute-sanitizer for the racecheck pass: on the PATH or in a CUDA toolkit.
SANITIZER=$(command -v compute-sanitizer 2>/dev/null ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)

if [ "$DRY_RUN" = 1 ]; then
  # Each binary's libraries as the loader resolves them with the path set
  # above: what the real run would load, or the reason it could not start.
  unresolved=0
  n=0
  while read -r kind label path; do
    n=$((n + 1))
    bad=$(ldd "$PACK/runfiles/$path" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
    if [ -n "$bad" ]; then
      unresolved=$((unresolved + 1))
      say "WOULD FAIL TO START $kind $label: $bad not found"
    else
      libs=$(ldd "$PACK/runfiles/$path" 2>/dev/null | grep -c '=>')
      say "would run $kind $label ($path, $libs shared libraries resolved)"
    fi
  done <"$PACK/MANIFEST"
  say "would run racecheck on //kernels:backend_ops_gpu_test: ${SANITIZER:-compute-sanitizer not found here}"
  say "gpu_check: dry run: $n binaries listed, $unresolved with unresolved libraries; none run, none counted as passed"
  [ "$unresolved" = 0 ]
  exit
fi

{
  echo "== machine"
  uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >>"$LOG" 2>&1
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | sed 's/^/run.sh: /' | tee -a "$SUMMARY"

export TEST_SRCDIR="$PACK/runfiles" TEST_WORKSPACE=duet
pass=0
fail=0
while read -r kind label path; do
  one="$OUT/.one.log"
  start_ns=$(date +%s%N)
  (cd "$PACK/runfiles/duet" && TEST_TMPDIR=$(mktemp -d) timeout "$TIMEOUT_S" "$PACK/runfiles/$path") >"$one" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - start_ns) / 1000000))
  {
    echo
    echo "== $kind $label (exit $rc, $ms ms)"
    # Cap each binary's share so the log comes back (16 MiB per file).
    if [ "$(stat -c %s "$one")" -gt 2000000 ]; then
      head -c 1000000 "$one"
      echo "... [cut] ..."
      tail -c 1000000 "$one"
    else
      cat "$one"
    fi
  } >>"$LOG"
  # Benchmark and bandwidth tables go to the output too.
  grep -a '^|' "$one" || true
  detail=$(grep -aE '^(test cases:|All tests passed)' "$one" | tail -1)
  [ "$rc" = 124 ] && detail="timed out after ${TIMEOUT_S} s"
  [ -n "$detail" ] || detail=$(tail -n 3 "$one" | tr '\n' ' ' | cut -c1-200)
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    say "PASS $label: $detail"
  else
    fail=$((fail + 1))
    # The first failure's message says why (no device, needs 2 GPUs, ...).
    why=$(awk '/with message:/ {m = 1; next} m && /^ *$/ {exit} m {printf "%s ", $0}' "$one" |
      tr -s ' ' | cut -c1-300)
    say "FAIL $label (exit $rc): $detail${why:+ -- $why}"
  fi
  rm -f "$one"
done <"$PACK/MANIFEST"

# Racecheck: the op harness's every-op case on the GPU under compute-sanitizer
# (shared memory hazards between a block's threads); counted as one more
# binary when the sanitizer is here, said otherwise.
ops=$(awk '$2 == "//kernels:backend_ops_gpu_test" {print $3}' "$PACK/MANIFEST")
if [ -z "$SANITIZER" ]; then
  say "RACECHECK not run: compute-sanitizer not found on this machine"
elif [ -n "$ops" ]; then
  one="$OUT/.racecheck.log"
  (cd "$PACK/runfiles/duet" && TEST_TMPDIR=$(mktemp -d) timeout "$TIMEOUT_S" "$SANITIZER" --tool racecheck \
    --error-exitcode 1 "$PACK/runfiles/$ops" "every op matches the reference*") >"$one" 2>&1
  rc=$?
  { echo; echo "== racecheck $ops (exit $rc)"; tail -c 1000000 "$one"; } >>"$LOG"
  summary=$(grep -aE 'RACECHECK SUMMARY|ERROR SUMMARY' "$one" | tail -1)
  [ "$rc" = 124 ] && summary="timed out after ${TIMEOUT_S} s"
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    say "PASS racecheck: ${summary:-clean}"
  else
    fail=$((fail + 1))
    say "FAIL racecheck (exit $rc): ${summary:-$(tail -n 3 "$one" | tr '\n' ' ' | cut -c1-200)}"
  fi
  rm -f "$one"
fi

say "gpu_check: $pass passed, $fail failed (of $((pass + fail)) binaries); logs: $LOG"
[ "$fail" = 0 ]
RUN_SH
  chmod +x "$PACK/run.sh"
}

case "${1:-}" in
  -h | --help) usage ;;
  --run-packed | --dry-run)
    [ -x "$PACK/run.sh" ] || die "no $PACK/run.sh: run tools/gpu_check.sh (the first half) first"
    [ "$1" = --dry-run ] && exec bash "$PACK/run.sh" --dry-run
    exec bash "$PACK/run.sh"
    ;;
  "" | --pack) pack ;;
  *)
    usage >&2
    exit 2
    ;;
esac
