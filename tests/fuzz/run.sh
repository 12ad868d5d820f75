#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS - build the libFuzzer targets with clang and fuzz
# each of them for SECONDS (default 60), seeded from the shared fixtures (and
# tests/data/journal for the journal's records).
# Fails (exit 1) on any crash, sanitizer report, leak, timeout or OOM; the
# reproducer is left in $BUILD/tests/fuzz/artifacts/. Corpora persist in
# $BUILD/tests/fuzz/corpus/ between runs.
#   CKPTFS_FIXTURES  fixture tree (default: <repo>/../shared/fixtures)
#   CKPTFS_FUZZ_BUILD build dir (default: <repo>/build-fuzz)
set -euo pipefail
secs=${1:-60}
repo=$(cd "$(dirname "$0")/../.." && pwd)
fix=${CKPTFS_FIXTURES:-$repo/../shared/fixtures}
build=${CKPTFS_FUZZ_BUILD:-$repo/build-fuzz}
here=$repo/tests/fuzz

cmake -S "$repo" -B "$build" -DCMAKE_C_COMPILER=clang -DCKPTFS_FUZZ=ON -DCKPTFS_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make -C "$build" -j2 fuzz_pickle fuzz_dcp fuzz_safetensors fuzz_journal >/dev/null

out=$build/tests/fuzz
mkdir -p "$out/artifacts"
seed() { # target, files...
  local t=$1; shift
  mkdir -p "$out/corpus/$t"
  for f in "$@"; do
    [ -f "$f" ] && cp -f "$f" "$out/corpus/$t/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
  done
}
shopt -s nullglob
t2="$repo"/tests/fixtures/torch2 # real torch 2.6 / 2.14 checkpoints
pickles=("$fix"/dcp-stub/*.metadata "$fix"/dcp-torch1.13/*/.metadata "$fix"/malformed/pkl_*.metadata
         "$fix"/malformed/dcp_*.metadata "$fix"/malformed/*/.metadata "$t2"/*/*/.metadata
         "$t2"/*/*/__*.metadata)
regress=("$repo"/tests/data/fuzz-regress/*) # inputs that once crashed: replayed first
seed fuzz_pickle "${pickles[@]}" "${regress[@]}"
seed fuzz_dcp "${pickles[@]}" "${regress[@]}"
seed fuzz_safetensors "${regress[@]}" "$fix"/safetensors/*.safetensors "$fix"/safetensors/*/*.safetensors \
  "$fix"/safetensors/*/*.json "$fix"/malformed/st_*.safetensors "$t2"/*/*/*.safetensors \
  "$t2"/*/*/*/*.safetensors "$t2"/*/*/*.json "$repo"/tests/fuzz/seeds/hf-index/*.json
seed fuzz_journal "$repo"/tests/data/journal/*.rec

status=0
for t in fuzz_pickle fuzz_dcp fuzz_safetensors fuzz_journal; do
  dict=(-dict="$here/pickle.dict")
  [ $t = fuzz_safetensors ] && dict=(-dict="$here/safetensors.dict")
  [ $t = fuzz_journal ] && dict=() # a binary record format: no tokens to suggest
  echo "== $t: ${secs}s"
  if ! "$out/$t" "$out/corpus/$t" "${dict[@]}" -max_total_time="$secs" -timeout=10 \
       -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="$out/artifacts/$t-" >"$out/$t.log" 2>&1; then
    echo "FAIL: $t (see $out/$t.log)"
    grep -E "ERROR|SUMMARY|Test unit written" "$out/$t.log" | head -5 || true
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$t.log" | tr '\n' ' '
    echo " corpus=$(ls "$out/corpus/$t" | wc -l)"
  fi
done
exit $status
