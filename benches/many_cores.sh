#!/usr/bin/env bash
# benches/many_cores.sh build DIR
# benches/many_cores.sh run DIR OUT [quick]
#
# The figures a 2-core machine cannot settle, taken on a larger one in one
# go: `build` compiles every program once, here (fat LTO where the figures
# are compared with peers), and copies them with a `redis-server` and the
# libraries it links (from this machine's Debian packages) into DIR, so that
# the machine that runs them needs neither a toolchain nor a registry;
# `run` then writes one file per part into OUT:
#
#   machine.txt         cores, CPU model, clock source, load
#   scaling.txt         examples/scaling.rs, 1 2 4 8 16 threads, 300 ms x 3
#   rls_load.txt        the service against a no-op gRPC server, 5 rounds
#   rls_redis_load.txt  the service's Redis backends (a Redis of its own)
#   script_cost.txt     each exact-mode script against `return 1`, then the
#                       same with client and Redis on one CPU (taskset -c 3)
#   layer.txt           the criterion group `layer` (1 s warm-up, 3 s each)
#
# `quick` runs every part for a moment, to check the script. BENCHMARKS.md
# ("Many threads: 1 to 16 cores", "The service", "The service: Redis
# backends", "Exact mode on Redis: script time, counted", "Several limits on
# one request") quotes these files.
set -u
case "${1:-}" in
build)
  DIR=${2:?DIR}
  set -e
  mkdir -p "$DIR/lib"
  cargo build --locked --profile bench -p turnstile-dev --example scaling --example script_cost
  cp target/release/examples/scaling target/release/examples/script_cost "$DIR/"
  exe=$(cargo bench --locked -p turnstile-bench --bench layer --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*/layer-[^"]*"' | cut -d'"' -f4)
  cp "$exe" "$DIR/layer"
  cargo build --locked --release -p turnstile-server --example rls_load --example rls_redis_load
  cp target/release/examples/rls_load target/release/examples/rls_redis_load "$DIR/"
  rs=$(command -v redis-server)
  cp "$rs" "$DIR/"
  # Every library it links but the C and C++ runtimes, which any x86-64
  # Linux has in a version at least as new.
  ldd "$rs" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
  cp "$0" "$DIR/many_cores.sh"
  exit 0 ;;
run) ;;
*) echo "usage: $0 build DIR | run DIR OUT [quick]" >&2; exit 2 ;;
esac

D=$(cd "${2:?DIR}" && pwd)
OUT=${3:?OUT}
QUICK=${4:-}
mkdir -p "$OUT"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
if [ -n "$QUICK" ]; then
  THREADS="1 2"; MS=30; REPS=1; ROUNDS=1; RSECS=1; CALLS=500; CROUNDS=1; WT=0.2; MT=0.5
else
  THREADS="1 2 4 8 16"; MS=300; REPS=3; ROUNDS=5; RSECS=3; CALLS=5000; CROUNDS=5; WT=1; MT=3
fi

{
  log machine
  date -u; nproc; uptime
  grep -m1 "model name" /proc/cpuinfo
  cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null
  LD_LIBRARY_PATH="$D/lib" "$D/redis-server" --version
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# script_cost starts a redis-server of its own from PATH.
BIN=$(mktemp -d)
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/lib" exec "%s/redis-server" "$@"\n' "$D" "$D" > "$BIN/redis-server"
chmod +x "$BIN/redis-server"
export PATH="$BIN:$PATH"
PORT=46379
redis-server --port $PORT --save "" --appendonly no --daemonize yes --logfile "$BIN/redis.log" --pidfile "$BIN/redis.pid"

log scaling
timeout 300 "$D/scaling" $THREADS --ms $MS --reps $REPS > "$OUT/scaling.txt" 2>&1
echo "rc $?" >> "$OUT/scaling.txt"

log rls_load
timeout 120 "$D/rls_load" --rounds $ROUNDS > "$OUT/rls_load.txt" 2>&1
echo "rc $?" >> "$OUT/rls_load.txt"
tail -3 "$OUT/rls_load.txt"

log rls_redis_load
timeout 120 "$D/rls_redis_load" redis://127.0.0.1:$PORT/ $RSECS 64 > "$OUT/rls_redis_load.txt" 2>&1
echo "rc $?" >> "$OUT/rls_redis_load.txt"
tail -3 "$OUT/rls_redis_load.txt"

log script_cost
timeout 100 "$D/script_cost" --calls $CALLS --rounds $CROUNDS > "$OUT/script_cost.txt" 2>&1
echo "rc $?" >> "$OUT/script_cost.txt"
log script_cost, one CPU
timeout 100 taskset -c 3 "$D/script_cost" --calls $CALLS --rounds $CROUNDS >> "$OUT/script_cost.txt" 2>&1
echo "rc $?" >> "$OUT/script_cost.txt"

log layer
timeout 150 "$D/layer" --bench --warm-up-time $WT --measurement-time $MT > "$OUT/layer.txt" 2>&1
echo "rc $?" >> "$OUT/layer.txt"
grep -E "^layer|time:" "$OUT/layer.txt"

kill "$(cat "$BIN/redis.pid")"
log done
uptime
