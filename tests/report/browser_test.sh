#!/usr/bin/env bash
# `tokamax report` end to end, in a real browser: tune and benchmark the ragged_dot smoke specs,
# trace examples/moe_block, render a report of them (plus one malformed input, which must be
# skipped and named), check that it is well-formed XML, then load it in headless Chromium: no
# console message at all (the page has no scripts, and its Content-Security-Policy turns any
# attempt to fetch something into a console error), a screenshot of the expected size that is
# not blank and shows the page's colours, and a DOM that holds the charts in reading order with
# every plotted median within its whisker (dom_check.py).
#
# Usage: browser_test.sh TOKAMAX_CLI MOE_BLOCK WORK_DIR
# Exit 77 (skipped) when Chromium, xmllint or python3 is missing, except under CI=true, where
# that is a failure: scripts/install-deps installs them.
set -euo pipefail
cli=$1 moe=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)

chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
missing=()
[ -n "$chromium" ] || missing+=(chromium)
command -v xmllint > /dev/null || missing+=("xmllint (libxml2-utils)")
command -v python3 > /dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${CI:-}" = true ]; then
    echo "FAIL: missing ${missing[*]}; scripts/install-deps installs them"
    exit 1
  fi
  echo "SKIP: missing ${missing[*]}; scripts/install-deps installs them"
  exit 77
fi

rm -rf "$work" && mkdir -p "$work" && cd "$work"
export TOKAMAX_CACHE_DIR="$work/cache" TOKAMAX_LOG=error

"$cli" autotune --op ragged_dot --tag smoke -o result.json --budget-s 120 > /dev/null
"$cli" bench --op ragged_dot --tag smoke --min-time 0.02 -o bench.json > /dev/null
TOKAMAX_TRACE=trace.json "$moe" --steps 1 > /dev/null
printf '{"device_kind": "x", "data": [' > truncated.json
"$cli" report result.json truncated.json --bench bench.json --trace trace.json -o report.html \
  2> report_err.txt
cat report_err.txt
grep -q "warning: skipped 'truncated.json': malformed JSON" report_err.txt
grep -q 'Skipped inputs' report.html

# Well-formed (the page is XHTML-compatible HTML5).
xmllint --noout report.html

# Headless Chromium with its own profile; console messages go to stderr as "...:CONSOLE...".
browse() {  # browse PAGE OUTPUT_PREFIX EXTRA_FLAGS...
  local page=$1 out=$2
  shift 2
  timeout 120 "$chromium" --headless --disable-gpu --no-sandbox --no-first-run \
    --hide-scrollbars --user-data-dir="$work/profile" --enable-logging=stderr --v=0 \
    "$@" "file://$work/$page" > "$out.stdout" 2> "$out.stderr"
}

# The console check must be able to fail: a page with a script that logs an error and an image
# it may not fetch, under the report's policy, shows up in the console log.
cat > control.html << 'EOF'
<!DOCTYPE html>
<html><head><meta http-equiv="Content-Security-Policy"
content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"/>
<title>control</title></head>
<body><script>console.error("control error")</script><img src="https://example.com/x.png"/></body></html>
EOF
browse control.html control --dump-dom
grep -q 'CONSOLE.*control error' control.stderr || {
  echo "FAIL: console messages of this Chromium are not captured"; cat control.stderr; exit 1; }
grep -q 'CONSOLE.*example.com' control.stderr || {
  echo "FAIL: blocked fetches are not reported"; cat control.stderr; exit 1; }

width=1200 height=1600
browse report.html shot --screenshot="$work/report.png" --window-size=$width,$height
if grep ':CONSOLE' shot.stderr; then
  echo "FAIL: the report logged console messages"
  exit 1
fi
test -s report.png
# The screenshot: its size, not blank, and the page's navy (rules, native markers) and the
# warning box's border (the skipped input) drawn.
python3 "$here/png_check.py" report.png $width $height --colour 1b2a5c --colour 8e1b3d

browse report.html dom --dump-dom
if grep ':CONSOLE' dom.stderr; then
  echo "FAIL: the report logged console messages"
  exit 1
fi
grep -q '<h1>tokamax report</h1>' dom.stdout
# A roofline chart, a chart per tuned key (6: native and blas of 3 specs) and the trace's.
test "$(grep -o '<svg ' dom.stdout | wc -l)" -ge 8
grep -q 'Roofline of bench.json' dom.stdout
grep -q 'Time per op and key in trace.json' dom.stdout
# The headline names the ceiling each percentage is of, and says the smoke shapes are too small
# to conclude anything from.
grep -q 'Per spec: the fastest implementation of bench.json' dom.stdout
grep -Eq '% of (f32_fma|bf16_dot|bf16_amx|mem_read|mem_copy) [0-9.]+ (GFLOP|GB)/s' dom.stdout
grep -q 'Shapes too small for conclusions' dom.stdout
# The parts in reading order, every candidate's median within its whisker (figures and pixels),
# a line style per roof.
python3 "$here/dom_check.py" dom.stdout
echo "browser test ok"
