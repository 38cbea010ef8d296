#!/usr/bin/env bash
# benches/callgrind.sh <checkout-dir> <target-dir> <out-file>
#
# Builds the cargo example `decision_cost` with the bench profile in
# <checkout-dir> (CARGO_TARGET_DIR=<target-dir>), then counts, under callgrind,
# the instructions of every callgrind mode the example offers and writes one
# line per mode to <out-file>:
#
#     MODE ARGS... N <instructions per decision, 1 decimal>
#
# (the program's arguments, N the number of decisions, then callgrind's total
# for the toggled region divided by N). A mode that fails gets FAILED in place
# of the number, and the script exits 1 at the end; a count whose region read
# the wrong clock in every try (see CALLGRIND_CLOCK_TRIES) is followed by
# WRONG-CLOCK.
#
# The binary is found from cargo's JSON messages (the artifact of the example
# named `decision_cost`), so the script does not depend on where the example's
# source or its package lives. It is copied to a temporary directory right
# after the build, so that another build into the same target directory cannot
# swap it out during the measurement.
#
# Environment:
#   CALLGRIND_FILTER=REGEX  only the modes whose line (`MODE ARGS... N`) matches
#                           the extended regex (grep -E), e.g. '^(allow|deny) '
#   CALLGRIND_NICE=N        nice level for the build and valgrind (default 10)
#   CARGO_FLAGS="..."       extra flags for cargo build (default: --locked)
#   CALLGRIND_REPEAT=K      run each mode K times, write the median (default 1)
#   CALLGRIND_CLOCK_TRIES=K runs allowed per count for a region that read the
#                           wrong clock, see below (default 5)
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 <checkout-dir> <target-dir> <out-file>" >&2
    exit 2
fi
checkout=$(cd "$1" && pwd)
mkdir -p "$2"
target=$(cd "$2" && pwd)
out=$3
nice_level=${CALLGRIND_NICE:-10}
cargo_flags=${CARGO_FLAGS:---locked}
filter=${CALLGRIND_FILTER:-}

for tool in cargo valgrind jq; do
    command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/callgrind-sh.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$(date +%s)

# --- Build -------------------------------------------------------------------
echo "building decision_cost (bench profile) in $checkout, target $target" >&2
# shellcheck disable=SC2086
(cd "$checkout" && CARGO_TARGET_DIR="$target" nice -n "$nice_level" \
    cargo build $cargo_flags --profile bench --example decision_cost \
    --message-format=json-render-diagnostics) >"$work/build.json"
bin=$(jq -r 'select(.reason == "compiler-artifact"
                     and .target.name == "decision_cost"
                     and (.target.kind | index("example")))
             | .executable // empty' "$work/build.json" | tail -n 1)
if [[ -z $bin || ! -x $bin ]]; then
    bin=$target/release/examples/decision_cost   # the documented place
fi
[[ -x $bin ]] || { echo "$0: no decision_cost binary found" >&2; exit 1; }
cp "$bin" "$work/decision_cost"
bin=$work/decision_cost
echo "binary: $bin (copied); built in $(($(date +%s) - start)) s" >&2

# --- Modes -------------------------------------------------------------------
# N per mode as BENCHMARKS.md counts them: 1,000,000 for the direct, algorithm,
# keyed-hot, leased-hot and clock modes, 200,000 for keyed-1m and keyed-new, 10,000
# requests for layer (toggled on `requests_measured`).
M=1000000
modes=()
for path in allow deny; do
    for who in turnstile turnstile-check governor; do
        for clock in precise coarse; do
            modes+=("$path $who $clock $M")
        done
    done
    modes+=("$path governor+wait precise $M")
done
for path in allow deny; do
    for alg in token-bucket live-token-bucket fixed-window sliding-window gcra warm-up warm-up-warm governor; do
        modes+=("algorithm $path $alg $M")
    done
done
for alg in token-bucket warm-up warm-up-warm; do
    modes+=("algorithm deny-check $alg $M")
done
for who in turnstile turnstile-tiered turnstile-admitted turnstile-admitted-coarse floor-admitted-coarse; do
    modes+=("keyed-hot $who $M")
done
for who in keyed held held-refresher; do
    modes+=("leased-hot $who $M")
done
for who in turnstile turnstile-tiered governor governor-ahash floor; do
    modes+=("keyed-1m $who 200000")
done
for who in turnstile governor governor-ahash; do
    modes+=("keyed-new $who 200000")
done
for what in read decide; do
    for clock in tsc real monotonic coarse; do
        modes+=("clock $what $clock $M")
    done
done
for case in bare turnstile-admitted turnstile-denied turnstile-fields-admitted combined3-admitted combined3-denied \
    combined3-nofields-admitted combined1-nofields-admitted stacked3-admitted stacked3-denied tower_governor-admitted \
    tower_governor-denied; do
    modes+=("layer $case 10000")
done

# Warn about choices the program lists (its usage text, lines for modes that
# take N) that this script does not measure: a mode added by a later change.
known=" ${modes[*]} "
"$bin" 2>/dev/null | grep -E '^ +[a-z].* N:' | sed -E 's/ N:.*//' | tr ' |' '\n\n' |
    grep -E '^[a-z][a-z0-9+_-]*$' | sort -u | while read -r word; do
        [[ $known == *" $word "* ]] ||
            echo "warning: decision_cost lists '$word', which this script does not measure" >&2
    done

# --- Measure -----------------------------------------------------------------
# One callgrind run of "$@" (the program's arguments); sets `total` (the Ir
# collected in the toggled region) and `os_clock` (1 when the region read the
# OS clock: std's `Timespec::now` or `clock_gettime` ran inside it).
run_once() {
    local toggle='*measured*'
    [[ $1 == layer ]] && toggle='*requests_measured*'
    local cg=$work/callgrind.out
    rm -f "$cg"
    total=
    os_clock=0
    nice -n "$nice_level" valgrind --tool=callgrind --callgrind-out-file="$cg" \
        --toggle-collect="$toggle" "$bin" "$@" >"$work/stdout" 2>"$work/stderr" || return 1
    total=$(awk '/^totals:/ { print $2; found = 1 } END { exit !found }' "$cg") || return 1
    if grep -Eq '^c?fn=.*(Timespec>::now|clock_gettime)' "$cg"; then
        os_clock=1
    fi
}

# Every mode but the monotonic clock's is meant to read no OS clock. The
# precise modes read `RealClock`, whose start-up check (the TSC's rate against
# the OS clock's across a 2 ms sleep) can fail under callgrind on a loaded
# machine; the process then reads the OS clock (about 70 more instructions a
# decision). Such a run is repeated, up to CALLGRIND_CLOCK_TRIES times in all.
clock_tries=${CALLGRIND_CLOCK_TRIES:-5}
# Runs per mode (CALLGRIND_REPEAT, default 1); the line gives their median.
repeat=${CALLGRIND_REPEAT:-1}

failed=0
: >"$out"
for mode in "${modes[@]}"; do
    if [[ -n $filter ]] && ! grep -Eq -- "$filter" <<<"$mode"; then
        continue
    fi
    read -r -a argv <<<"$mode"
    n=${argv[-1]}
    expect_os=0
    [[ $mode == "clock "*" monotonic "* ]] && expect_os=1
    pers=()
    marker=
    for ((r = 0; r < repeat; r++)); do
        t0=$(date +%s)
        ok=0
        for ((try = 1; try <= clock_tries; try++)); do
            if ! run_once "${argv[@]}"; then
                break
            fi
            ok=1
            if ((os_clock == expect_os)); then
                break
            fi
            echo "$mode: the measured region read the $( ((os_clock)) && echo OS || echo TSC) clock (try $try)" >&2
        done
        if ((!ok)); then
            pers=()
            break
        fi
        ((os_clock == expect_os)) || marker=" WRONG-CLOCK"
        per=$(awk -v t="$total" -v n="$n" 'BEGIN { printf "%.1f", t / n }')
        pers+=("$per")
        echo "$mode $per  (total $total, $(($(date +%s) - t0)) s)" >&2
    done
    if ((${#pers[@]} == 0)); then
        failed=1
        echo "$mode FAILED" >>"$out"
        echo "$mode FAILED; stderr:" >&2
        tail -n 5 "$work/stderr" >&2
        continue
    fi
    median=$(printf '%s\n' "${pers[@]}" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f", m }')
    echo "$mode $median$marker" >>"$out"
    if ((repeat > 1)); then
        echo "$mode: median $median of ${pers[*]}" >&2
    fi
done

echo "done in $(($(date +%s) - start)) s; results in $out" >&2
exit "$failed"
