#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS_NAME SECONDS WORKDIR: runs one libFuzzer target of the sanitizer tree
# for SECONDS on a corpus started from its seeds; fails on any crash, sanitizer report, timeout
# (10 s per input) or memory blow-up (2 GiB), leaving the reproducer in WORKDIR.
set -uo pipefail
fuzzer=$1 name=$2 seconds=$3 work=$4
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work/corpus"
case $name in
  json_config)  # the repository's own run, model, DeepSpeed and transformers configs
    i=0
    while IFS= read -r f; do cp "$f" "$work/corpus/seed$((i++)).json"; done \
      < <(find "$src/configs" "$src/tests/cli/configs" "$src/tests/reference/hf_configs" -name '*.json' | sort) ;;
  *) cp "$src/tests/fuzz/seeds/$name"/* "$work/corpus/" ;;
esac
cd "$src"  # run configs name model and data files relative to the repository
# The sanitizer tree's run-time settings: leaks inside HDF5 on its error paths (a damaged file
# refused) are the library's, suppressed as in every other test of the tree.
source "$src/tests/sanitize/sanitizer_env.sh"
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^Done|ERROR|SUMMARY" "$work/log" | head -5
if [ $rc -ne 0 ]; then
  echo "FAIL: $name exited $rc; reproducer: $(ls "$work"/crash-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -1)"
  tail -40 "$work/log"
  exit 1
fi
echo "fuzz $name: 0 crashes in $seconds s"
