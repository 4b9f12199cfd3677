#!/usr/bin/env bash
# Runs a test command with the native kernels capped at one ISA (TOKAMAX_ISA), or skips with
# exit 77 when the cap selects the kernel set the uncapped suite already ran (`tokamax device`
# names the set either way).
# Usage: isa_cap.sh TOKAMAX_CLI ISA COMMAND [ARGS...]
set -euo pipefail
cli=$1 isa=$2
shift 2
set_of() { "$@" device | sed -n 's/^kernels: *\([a-z0-9_]*\).*/\1/p'; }
full=$(set_of env -u TOKAMAX_ISA "$cli")
capped=$(set_of env TOKAMAX_ISA="$isa" "$cli")
if [ -z "$full" ] || [ -z "$capped" ]; then
  echo "isa_cap.sh: '$cli device' named no kernel set" >&2
  exit 1
fi
if [ "$full" = "$capped" ]; then
  echo "TOKAMAX_ISA=$isa selects the $full kernels, as the uncapped suite: skipped"
  exit 77
fi
echo "TOKAMAX_ISA=$isa: the $capped kernels (uncapped: $full)"
TOKAMAX_ISA=$isa exec "$@"
