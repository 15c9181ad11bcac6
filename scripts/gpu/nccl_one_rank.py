"""One-rank NCCL communicator through torch.distributed: enough for NCCL to load,
initialise and select a network plugin on a machine with a single GPU.

Run by scripts/gpu/plugin_smoke.sh, which sets NCCL_NET_PLUGIN / NCCL_NET and checks
NCCL's own log."""
import os

import torch
import torch.distributed as dist

dist.init_process_group(
    backend="nccl",
    init_method="tcp://127.0.0.1:29531",
    world_size=1,
    rank=0,
    device_id=torch.device("cuda:0"),
)
x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
expected = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
assert torch.equal(x, expected), "all_reduce over one rank changed the data"
print(f"one-rank all_reduce ok: torch {torch.__version__}, nccl {torch.cuda.nccl.version()}")
dist.destroy_process_group()
