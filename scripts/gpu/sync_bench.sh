#!/usr/bin/env bash
# The `weft sync` benchmark of docs/benchmarks.md (issue 19) on a many-core machine, so that
# each of the 5 namespace hosts has CPUs of its own: weft to 1 host, weft to 4 hosts, rsync
# one by one and rsync to all 4 at once, every data link limited with tc, medians of RUNS.
#
# It needs what the test needs: root, network namespaces, iproute2 (`ip`, `tc`) and rsync.
# Where they are not installed, CARRY holds them, built elsewhere:
#   CARRY/bin/{ip,tc,rsync}   CARRY/lib/*.so* (their shared libraries)
#   CARRY/weft                a release `weft` (cargo build --release -p weft --bin weft)
#   CARRY/it                  the weft integration-test binary
#                             (cargo test -p weft --test it --no-run; the path it prints)
# Usage (from the repository root):
#   CARRY=gpu-carry/sync RUNS=3 MIB=256 RATE=1gbit bash scripts/gpu/sync_bench.sh
# Prints the per-run and median lines (BENCH ...); OUT, when set, gets the log.
set -u
CARRY=${CARRY:-gpu-carry/sync}
RUNS=${RUNS:-3}
MIB=${MIB:-256}
RATE=${RATE:-1gbit}
CARRY=$(cd "$CARRY" && pwd) || { echo "no CARRY dir"; exit 2; }
for f in "$CARRY"/*.xz; do
    [ -e "$f" ] && xz -dkf "$f"
done
chmod +x "$CARRY"/weft "$CARRY"/it "$CARRY"/bin/* 2>/dev/null
export PATH="$CARRY/bin:$PATH"
export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test looks for rsync at its usual path.
[ -x /usr/bin/rsync ] || cp "$CARRY/bin/rsync" /usr/bin/rsync || exit 2
echo "machine: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
ip -V && tc -V && rsync --version | head -1 || exit 2
ip netns add wsb-probe && tc -n wsb-probe qdisc add dev lo root tbf rate 1gbit burst 256kb latency 100ms \
    && echo "netns and tbf: ok"
ip netns del wsb-probe 2>/dev/null
log=${OUT:-/tmp}/sync_bench.log
set -o pipefail
WEFT_SYNC_BENCH_WEFT="$CARRY/weft" WEFT_SYNC_BENCH_RUNS=$RUNS WEFT_SYNC_BENCH_MIB=$MIB \
    WEFT_SYNC_BENCH_RATE=$RATE RUST_BACKTRACE=0 \
    "$CARRY/it" launch::sync::sync_benchmark --ignored --nocapture --test-threads 1 2>&1 \
    | tee -a "$log" | grep -E "^(BENCH|weft sync|test |thread|machine)|panicked|FAILED|error"
