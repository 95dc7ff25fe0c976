#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-fuzz/, writes the seed corpora and
# runs each target for SECONDS (default 60), two at a time (one per core on CI's two). Any finding (crash, sanitizer
# report, exception other than kestrel::Error, leak, timeout, out-of-memory) fails the script;
# its reproducer lands in build-fuzz/artifacts/ (replay: build-fuzz/fuzz/TARGET FILE).
#   scripts/fuzz.sh [SECONDS]
# The corpus each run grows is kept in build-fuzz/corpus/TARGET and reused by the next run.
# Logs: build-fuzz/logs/TARGET.log. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
BUILD=build-fuzz
CXX_FUZZ=${KESTREL_FUZZ_CXX:-clang++-14}

if ! command -v "$CXX_FUZZ" >/dev/null 2>&1 ||
   ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "== apt: installing clang-14 libclang-rt-14-dev (libFuzzer)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
fi

echo "== fuzz build ($CXX_FUZZ, $BUILD/)"
CXX="$CXX_FUZZ" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKESTREL_FUZZ=ON -DKESTREL_TESTS=OFF >/dev/null
cmake --build "$BUILD" --target kestrel_fuzzers

echo "== seeds"
rm -rf "$BUILD/seeds"
fuzz/make_seeds.sh "$BUILD/seeds"

mkdir -p "$BUILD/logs" "$BUILD/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
run() {  # target, seed subfolder, max_len
  local target=$1 seeds=$2 max_len=$3
  local log="$BUILD/logs/$target.log"
  mkdir -p "$BUILD/corpus/$target"
  echo "== $target: ${SECONDS_PER_TARGET}s, -max_len=$max_len"
  if "$BUILD/fuzz/$target" "$BUILD/corpus/$target" "$BUILD/seeds/$seeds" \
      -max_total_time="$SECONDS_PER_TARGET" -max_len="$max_len" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$target-" >"$log" 2>&1; then
    grep -E "^#[0-9]+" "$log" | tail -n 1 | sed 's/^/   /'  # last status line: cov, ft, corp
    grep -E "stat::number_of_executed_units|stat::average_exec_per_sec" "$log" | sed 's/^/   /'
    echo "   corpus: $(ls "$BUILD/corpus/$target" | wc -l) files"
  else
    status=1
    echo "!! $target: FINDING (log: $log)"
    { grep -E "ERROR|SUMMARY|fuzz_tokenizer:|Test unit written|terminate|what\(\)" "$log" || true; } |
      head -20 | sed 's/^/   /'
    tail -n 40 "$log"
  fi
}
# Targets two at a time, each printing into a summary file shown when it ends (a finding's
# status reaches this shell through wait).
start() {  # target, seed subfolder, max_len: runs in the background, PID in $!
  ( status=0; run "$@"; exit $status ) >"$BUILD/logs/$1.summary" 2>&1 &
}
finish() {  # pid, target
  wait "$1" || status=1
  cat "$BUILD/logs/$2.summary"
}
start fuzz_gguf gguf 1048576; gguf=$!
start fuzz_tokenizer tokenizer 4096; tokenizer=$!
finish $gguf fuzz_gguf
start fuzz_safetensors safetensors 65536; safetensors=$!
finish $tokenizer fuzz_tokenizer
start fuzz_wire_requests wire 16384; wire=$!
finish $safetensors fuzz_safetensors
finish $wire fuzz_wire_requests
exit $status
