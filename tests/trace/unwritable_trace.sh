#!/usr/bin/env bash
# A trace asked for with TOKAMAX_TRACE that cannot be written fails the example that asked for
# it (it exited 0 with no trace: the failure was only logged, or said at exit): exit status 1
# and the reason on stderr, whether the file cannot be created at the first op call or cannot be
# renamed into place at the end. A writable path still gives a complete trace and exit 0.
# Usage: unwritable_trace.sh MOE_BLOCK TRANSFORMER_DECODER WORK_DIR
set -euo pipefail
moe=$1 layer=$2 work=$3
rm -rf "$work" && mkdir -p "$work/a_directory" && cd "$work"
export TOKAMAX_CACHE_DIR="$work/cache" TOKAMAX_LOG=error

fails() {  # fails WHAT EXPECTED_STDERR COMMAND...: exit status 1 and EXPECTED_STDERR on stderr
  local what=$1 want=$2 status=0
  shift 2
  "$@" > /dev/null 2> err.txt || status=$?
  if [ "$status" != 1 ]; then echo "$what: exit status $status, expected 1"; cat err.txt; exit 1; fi
  grep -qF -- "$want" err.txt || { echo "$what: no '$want' on stderr:"; cat err.txt; exit 1; }
}
for run in "$moe --steps 1" "$layer --prompt 4 --steps 1"; do
  name=$(basename "${run%% *}")
  # Cannot be created: its directory cannot be made.
  fails "$name, no directory" \
    "$name: TOKAMAX_TRACE: no trace written: trace path '/proc/tokamax/t.json'" \
    env TOKAMAX_TRACE=/proc/tokamax/t.json $run
  # Cannot be renamed into place at the end: a directory holds the name.
  fails "$name, a directory" \
    "$name: TOKAMAX_TRACE: no trace written: could not write trace '$work/a_directory'" \
    env TOKAMAX_TRACE="$work/a_directory" $run
  test -z "$(ls "$work"/a_directory.tmp.* 2> /dev/null)" || { echo "temporary file left"; exit 1; }
  # Written: exit 0, a complete trace.
  TOKAMAX_TRACE="$work/$name.json" $run > /dev/null
  grep -q '"ph":"X"' "$work/$name.json"
  tail -c 4 "$work/$name.json" | grep -q ']}'
done
echo "unwritable traces fail the examples"
