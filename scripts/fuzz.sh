#!/usr/bin/env bash
# make fuzz: runs every libFuzzer target of host/fuzz for FUZZ_SECONDS each (default 60).
#   scripts/fuzz.sh BUILD_DIR [SECONDS] [TARGET...]
# New inputs go to BUILD_DIR/fuzz-corpus/<target> (the committed seeds in
# host/fuzz/corpus/<target> are read, not written); a crash is written to
# BUILD_DIR/fuzz-crashes/<target>-crash-<sha1>. Fix it, then keep the input as a regression
# case: cp it to host/fuzz/regressions/<target>/ (make test replays those under ASan).
set -uo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
src=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(url amqp_msg cli_args json_lua http_serve)
failed=()
for t in "${targets[@]}"; do
  bin="$build/host/fuzz/fuzz_$t"
  [[ -x "$bin" ]] || { echo "fuzz: $bin is not built (make fuzz builds it)" >&2; exit 2; }
  mkdir -p "$build/fuzz-corpus/$t" "$build/fuzz-crashes"
  echo "fuzz: $t for ${seconds}s" >&2
  # -close_fd_mask=1: the targets' stdout is noise; stderr keeps sanitizer reports
  if ! "$bin" -max_total_time="$seconds" -close_fd_mask=1 -print_final_stats=1 \
       -artifact_prefix="$build/fuzz-crashes/$t-" "$build/fuzz-corpus/$t" "$src/host/fuzz/corpus/$t" \
       2> "$build/fuzz-$t.log"; then
    failed+=("$t")
    echo "fuzz: $t found a crash: $(ls -t "$build/fuzz-crashes/$t-"* 2>/dev/null | head -1) (log: $build/fuzz-$t.log)" >&2
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/fuzz-$t.log" | sed "s/^/fuzz: $t /" >&2
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash in ${targets[*]}" >&2
