#!/usr/bin/env bash
# Shows in NCCL's own log that NCCL loads libnccl-net-weft.so, initialises it and
# selects it for a one-rank communicator. Needs a GPU machine with PyTorch.
#   scripts/gpu/plugin_smoke.sh path/to/libnccl_net_weft.so
# Exit 0 only when every expected log line is there.
set -euo pipefail
so=${1:?usage: plugin_smoke.sh path/to/libnccl_net_weft.so}
dir=$(mktemp -d)
cp "$so" "$dir/libnccl-net-weft.so"
log=${OUT:-$dir}/nccl_one_rank.log
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"
export NCCL_NET_PLUGIN=weft NCCL_NET=weft NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
python3 "$here/nccl_one_rank.py" 2>&1 | tee "$log"
fail=0
check() {
  if grep -Eq "$1" "$log"; then echo "PASS $2"; else echo "FAIL $2 (no line matching: $1)"; fail=1; fi
}
check 'NET/Plugin.*(Loaded|loaded).*weft|Loaded net plugin weft' "NCCL loaded the weft plugin"
check 'weft.*(initiali[sz]ed|init)|NET/weft' "the plugin initialised and logged through NCCL's logger"
check 'Using network weft' "NCCL selected the weft network"
check 'one-rank all_reduce ok' "the communicator ran a collective"
exit $fail
