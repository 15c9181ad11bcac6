#!/usr/bin/env bash
# Assembles the CARRY folder that scripts/gpu/sync_bench.sh needs on a machine without
# iproute2 or rsync (about 18 MiB): a release `weft`, the integration-test binary (both
# stripped, xz), `ip`, `tc`, `rsync` from this machine and their shared libraries (glibc
# excepted: the target's, the same or newer, is used).
# Usage (from the repository root; DIR must be a path the device tool carries, i.e. ignored
# by git inside the checkout that is sent):
#   bash scripts/gpu/sync_bench_carry.sh DIR
# then, there:  CARRY=DIR RUNS=3 MIB=256 RATE=1gbit bash DIR/sync_bench.sh
set -euo pipefail
dir=${1:?usage: sync_bench_carry.sh DIR}
mkdir -p "$dir/bin" "$dir/lib"
cargo build --release -p weft --bin weft
it=$(cargo test -p weft --test it --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\/it-[^"]*\)".*/\1/p' | tail -1)
[ -n "$it" ] || { echo "no integration-test binary found"; exit 1; }
target=${CARGO_TARGET_DIR:-target}
strip -o "$dir/weft" "$target/release/weft"
strip -o "$dir/it" "$it"
xz -T2 -6 -f "$dir/weft" "$dir/it"
for t in ip tc rsync; do
    cp -L "$(command -v "$t")" "$dir/bin/"
done
ldd "$dir"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
        *) cp -L "$lib" "$dir/lib/" ;;
    esac
done
cp "$(dirname "$0")/sync_bench.sh" "$dir/"
du -sh "$dir"
