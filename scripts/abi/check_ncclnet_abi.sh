#!/usr/bin/env bash
# Checks the plugin's ncclNet structs (crates/weft-nccl-net/src/ffi.rs) against NCCL's own
# headers, every field's offset and every struct's size, with a C compiler.
#
#   scripts/abi/check_ncclnet_abi.sh V11_DIR [V12_DIR]
#
# V11_DIR: NCCL 2.28's `ext-net/example/nccl` (net.h and net_v8..v11.h), e.g. from a checkout
#          of NCCL at tag v2.28.9-1. V12_DIR: a later NCCL's `plugins/net/example/nccl`
#          (net_v12.h). The headers are read where they are; nothing is copied.
# Exit 0: every line equal. Exit 1: the layouts differ (the diff is printed). Exit 2: usage.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
cd "$(dirname "$0")/../.."
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ex() { cargo run -q -p weft-nccl-net --example abi_layout -- "$@"; }
check() { # set dir [include dirs...]
  local set=$1; shift
  ex --c "$set" > "$work/$set.c"
  cc -std=c11 -Wall -Werror $(printf -- '-I%s ' "$@") -o "$work/$set" "$work/$set.c"
  "$work/$set" > "$work/c-$set.txt"
  ex | grep -F -f <(cut -d' ' -f1 "$work/c-$set.txt" | sort -u | sed 's/$/ /') > "$work/rust-$set.txt"
  if diff -u "$work/c-$set.txt" "$work/rust-$set.txt"; then
    echo "ncclNet ABI ($set headers): $(wc -l < "$work/c-$set.txt") offsets and sizes equal"
  else
    echo "ncclNet ABI ($set headers): layouts DIFFER (- C, + Rust)"; return 1
  fi
}
check v11 "$1"
if [ $# -ge 2 ]; then check v12 "$2"; fi
