#!/usr/bin/env bash
# End to end, as docs/tuning.md ("Offline tuning from a trace") walks through it: run examples/moe_block traced, extract its bound
# arguments, tune them offline with a small budget, run again with the result applied, and check
# that every ragged_dot call in the second trace was configured by the scope with a tuned config.
# Usage: moe_round_trip.sh TOKAMAX_CLI MOE_BLOCK WORK_DIR
set -euo pipefail
cli=$1 moe=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export TOKAMAX_CACHE_DIR="$work/cache" TOKAMAX_LOG=error

# The traced run happens on "another kind of machine" (the kind is only a label here): the trace
# records it, the bound arguments do not carry it, and the tuning machine stamps its own kind.
TOKAMAX_DEVICE_KIND=production_box TOKAMAX_TRACE=run1.json "$moe" --steps 2 --check
grep -q '"device_kind":"production_box"' run1.json
"$cli" trace extract run1.json -o bound_args.json --op ragged_dot
if grep -q production_box bound_args.json; then exit 1; fi
# --check ran the reference implementation too: 5 keys x {native, reference} (the router, the
# experts' gate, up and down, the shared expert's down projection).
test "$(grep -c '"implementation": "native"' bound_args.json)" = 5
"$cli" autotune --bound-args bound_args.json -o result.json --budget-s 120 >/dev/null
# The traced keys benchmarked side by side: one set of rows per distinct key x {native,
# native:packed}: the example's 5 pre-packed keys (weights packed at load time) and the 5
# unpacked keys of its --check reference calls.
"$cli" bench --bound-args bound_args.json --impl native,native:packed --min-time 0.02 --json > bench.json
test "$(grep -c '"spec"' bench.json)" = 20
grep -q '"packed_rhs":true' bound_args.json || grep -q '"packed_rhs": true' bound_args.json
here=$("$cli" device --json | grep -o '"device_kind": *"[^"]*"' | head -1 | sed 's/.*: *//')
grep -q "\"device_kind\": *$here" result.json
TOKAMAX_TRACE=run2.json "$moe" --steps 2 --tuned result.json
"$cli" trace summary run2.json --json > summary.json
cat summary.json
native=$(grep -c '"op": "ragged_dot/native"' summary.json)
scope=$(grep -c '"rung": "scope"' summary.json)
test "$native" = 5 && test "$scope" = 5 || { echo "expected 5 native keys from the scope"; exit 1; }

# "%p" in TOKAMAX_TRACE becomes the process id (one trace per process of a multi-process job).
TOKAMAX_TRACE=pid_%p.json "$moe" --steps 1 > /dev/null
ls pid_[0-9]*.json > /dev/null
# Several traces (one per process) into one list, deduplicated across files.
"$cli" trace extract run1.json pid_*.json -o merged.json --op ragged_dot
test "$(grep -c '"family"' merged.json)" = "$(grep -c '"family"' bound_args.json)"

# Bad input: a file that is not a trace gives a clear message and exit status 1, and no output.
printf '\x7fELF garbage' > not_a_trace.bin
if "$cli" trace extract not_a_trace.bin -o nothing.json 2> err.txt; then exit 1; fi
grep -q 'does not look like a Chrome trace' err.txt
test ! -e nothing.json
# A trace cut in the middle keeps its complete events.
head -c $(( $(wc -c < run1.json) * 2 / 3 )) run1.json > cut.json
"$cli" trace extract cut.json -o partial.json 2> err.txt
grep -q 'scanning its text' err.txt
# Gzip-compressed traces (as trace viewers save them), whole and cut short.
gzip -c run1.json > run1.json.gz
"$cli" trace extract run1.json.gz -o from_gz.json 2> err.txt
cmp from_gz.json <("$cli" trace extract run1.json 2>/dev/null)
"$cli" trace summary run1.json.gz > /dev/null
head -c $(( $(wc -c < run1.json.gz) * 9 / 10 )) run1.json.gz > cut.json.gz
"$cli" trace extract cut.json.gz -o partial_gz.json 2> err.txt
grep -q 'gzip stream truncated' err.txt
echo "round trip ok"
