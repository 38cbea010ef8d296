#!/usr/bin/env bash
# benches/script_instructions.sh [N]
#
# Redis' instructions per call of each exact-mode script and of the minimal
# script of the same algorithm, counted by callgrind: a figure that repeats
# on a shared machine, where `INFO commandstats` times do not
# (BENCHMARKS.md, "Exact mode on Redis: script time").
#
# The scripts and their arguments are those of `script_cost --body`, written
# out by `script_cost --dump`. For each, a `redis-server` (the one on PATH)
# runs under `valgrind --tool=callgrind`; the script is loaded, then N and
# 2N EVALSHAs on one key are sent through `redis-cli --pipe` (raw protocol,
# so the crate's empty first argument, "read Redis' TIME", is sent as it is),
# each on a fresh server; the instructions per call are the difference of
# the two totals over N, which leaves out the server's start and shutdown.
# Prints one line per case: name, then instructions per call.
#
# Needs valgrind, redis-server and redis-cli. N defaults to 5,000;
# SCRIPT_FILTER=REGEX keeps the cases whose name matches (grep -E).
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:-5000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --release --locked -q -p turnstile-dev --example script_cost
"${CARGO_TARGET_DIR:-target}"/release/examples/script_cost --dump "$work/cases"

port=46479

# The total instructions of a fresh server that loads the script in "$1",
# then answers "$3" EVALSHAs of it with the arguments in file "$2".
total() {
    local script=$1 args=$2 calls=$3 out="$work/callgrind.out" pid sha
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        redis-server --port "$port" --save "" --appendonly no >"$work/valgrind.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
        redis-cli -p "$port" PING >/dev/null 2>&1 && break
        sleep 0.1
    done
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
    # One EVALSHA in the protocol: the command, the hash, one key, the
    # arguments (an empty one as a zero-length bulk string).
    local -a argv=(EVALSHA "$sha" 1 bk)
    mapfile -t -O 4 argv <"$args"
    local command part arg
    printf -v command '*%d\r\n' "${#argv[@]}"
    for arg in "${argv[@]}"; do
        printf -v part '$%d\r\n%s\r\n' "${#arg}" "$arg"
        command+=$part
    done
    for ((i = 0; i < calls; i++)); do printf '%s' "$command"; done >"$work/pipe"
    local reply
    reply=$(redis-cli -p "$port" --pipe <"$work/pipe" 2>&1 | tail -1)
    if [[ $reply != *"errors: 0, replies: $calls"* ]]; then
        echo "script $script: $reply" >&2
        exit 1
    fi
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$pid" || true
    awk '/^(summary|totals):/ { print $2; exit }' "$out"
}

# One run left uncounted: in one run of this script the first case counted
# twice what it counted in every later run, alone or not.
total "$work/cases/00.lua" "$work/cases/00.args" 100 >/dev/null
for name_file in "$work"/cases/*.name; do
    case=${name_file%.name}
    if ! grep -Eq -- "${SCRIPT_FILTER:-.}" "$name_file"; then
        continue
    fi
    once=$(total "$case.lua" "$case.args" "$n")
    twice=$(total "$case.lua" "$case.args" $((2 * n)))
    printf '%s\t%d\n' "$(cat "$name_file")" $(((twice - once) / n))
done
