#!/usr/bin/env bash
# The README's trace -> extract -> tune -> apply round trip on examples/transformer_decoder,
# which calls five families (layer_norm as rms_norm, ragged_dot, dot_product_attention,
# gated_linear_unit, linear_softmax_cross_entropy_loss):
# every native key of every family the traced run used must come back configured by the
# AutotuningScope in the second run.
# Usage: transformer_round_trip.sh TOKAMAX_CLI TRANSFORMER_DECODER WORK_DIR
set -euo pipefail
cli=$1 layer=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export TOKAMAX_CACHE_DIR="$work/cache" TOKAMAX_LOG=error

families="layer_norm ragged_dot dot_product_attention gated_linear_unit linear_softmax_cross_entropy_loss"
TOKAMAX_TRACE=run1.json "$layer" --prompt 16 --steps 2 --check
"$cli" trace extract run1.json -o bound_args.json
for family in $families; do
  grep -q "\"family\": \"$family\"" bound_args.json || { echo "no $family in the trace"; exit 1; }
done
# Every key must be tuned (about 70 s alone here): the budget only guards against a hang.
"$cli" autotune --bound-args bound_args.json -o result.json --budget-s 400 >/dev/null
TOKAMAX_TRACE=run2.json "$layer" --prompt 16 --steps 2 --tuned result.json
"$cli" trace summary run2.json --json > summary.json
for family in $families; do
  keys=$(grep -c "\"op\": \"$family/native\"" summary.json || true)
  test "$keys" -ge 1 || { echo "expected native keys of $family, got none"; exit 1; }
done
native=$(grep -c '"op": "[a-z_]*/native"' summary.json)
scope=$(grep -c '"rung": "scope"' summary.json)
test "$native" = "$scope" || { echo "$scope of $native native keys from the scope"; exit 1; }
echo "round trip ok: $native native keys over five families, all from the tuned result"
