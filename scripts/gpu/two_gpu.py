"""NCCL across GPUs through weft, against NCCL's own Socket transport, and a training step.

One call does everything the issue asks for and prints a table last:

  python3 scripts/gpu/two_gpu.py --plugin dist/libnccl_net_weft.so [--ifname eth0] [--out DIR]

1. all_reduce, all_gather and reduce_scatter from 8 B to 1 GiB through torch.distributed on
   every visible GPU (2 on the target machine), with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
   NCCL_NVLS_ENABLE=0 so the bytes go through the network plugin; results checked; bus
   bandwidth per size (nccl-tests formulas), median of --reps runs.
2. The same with NCCL_NET=Socket, with its defaults and with its best stream/thread settings,
   over the same interface; weft / Socket-best as a ratio per size.
3. GPT-2 124M from random initialisation on synthetic tokens, bf16 autocast, AdamW, one global
   batch: one GPU, then all GPUs with DDP through weft and through Socket; median step times
   and the speed-up.

With one GPU (--smoke, or when fewer than two are visible) every phase runs with one rank so
the code paths are exercised, and the table says that two GPUs are needed for real figures.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

MIB = 1 << 20


def pick_ifname():
    """The first interface other than lo that has an IPv4 address (SIOCGIFADDR)."""
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                return name
            except OSError:
                continue
    return "lo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transport_env(kind, plugin, ifname):
    """The NCCL environment of one transport. Always: no P2P, no SHM, no NVLS."""
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
           "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"), "NCCL_SOCKET_IFNAME": ifname}
    if kind == "weft":
        env.update({"NCCL_NET_PLUGIN": plugin, "NCCL_NET": "weft",
                    "WEFT_MGMT_IFNAME": "=" + ifname, "WEFT_DATA_IFNAME": "=" + ifname})
    elif kind == "socket":
        env.update({"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket"})
    elif kind == "socket-best":
        # NCCL caps NTHREADS x NSOCKS_PERTHREAD at 64; 4 x 4 is the usual best on one link.
        env.update({"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket",
                    "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"})
    else:
        raise ValueError(kind)
    return env


def busbw_factor(op, n):
    # nccl-tests: all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n.
    if n == 1:
        return 1.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sizes(max_bytes):
    s = 8
    while s <= max_bytes:
        yield s
        s *= 2


def collectives_worker(rank, world, port, env, args, result_file):
    os.environ.update(env)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=world,
                            rank=rank, device_id=dev)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for nbytes in sizes(args.max_bytes):
            count = max(nbytes // 4, world)
            count -= count % world
            if op == "all_reduce":
                x = torch.full((count,), float(rank + 1), device=dev)
                run = lambda: dist.all_reduce(x)
                def check():
                    want = world * (world + 1) / 2
                    return int((x != want).sum().item())
                reset = lambda: x.fill_(float(rank + 1))
            elif op == "all_gather":
                x = torch.full((count // world,), float(rank + 1), device=dev)
                out = torch.empty(count, device=dev)
                run = lambda: dist.all_gather_into_tensor(out, x)
                expect = torch.arange(1, world + 1, device=dev, dtype=torch.float32).repeat_interleave(count // world)
                check = lambda: int((out != expect).sum().item())
                reset = lambda: None
            else:
                x = torch.full((count,), float(rank + 1), device=dev)
                out = torch.empty(count // world, device=dev)
                run = lambda: dist.reduce_scatter_tensor(out, x)
                check = lambda: int((out != world * (world + 1) / 2).sum().item())
                reset = lambda: None
            reset()
            run()
            torch.cuda.synchronize()
            wrong = check()
            iters = 20 if nbytes <= 64 * MIB else 5
            times = []
            for _ in range(args.reps):
                dist.barrier()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    run()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / iters / 1e3)
            t = statistics.median(times)
            size = count * 4
            algbw = size / t / 1e9
            rows.append({"op": op, "bytes": size, "time_us": t * 1e6, "algbw": algbw,
                         "busbw": algbw * busbw_factor(op, world), "wrong": wrong})
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


# --- GPT-2 124M (the nanoGPT layout), written here so nothing is downloaded ---------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, vocab=50304, block=1024, layers=12, d=768, heads=12):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_worker(rank, world, port, env, args, result_file):
    if env is not None:
        os.environ.update(env)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    if world > 1 or env is not None:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=world,
                                rank=rank, device_id=dev)
    model = GPT2().to(dev)
    params = sum(p.numel() for p in model.parameters())
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    micro = args.global_batch // world
    gen = torch.Generator(device=dev).manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, 50257, (micro, args.seq + 1), device=dev, generator=gen)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    if not math.isfinite(loss.item()):
        raise RuntimeError(f"loss is {loss.item()}")
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump({"params": params, "step_s": statistics.median(times), "loss": loss.item()}, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(fn, world, env, args, out, name):
    result = os.path.join(out, name + ".json")
    mp.spawn(fn, args=(world, free_port(), env, args, result), nprocs=world, join=True)
    with open(result) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plugin", required=True, help="libnccl_net_weft.so")
    p.add_argument("--ifname", default=None, help="the interface both transports use")
    p.add_argument("--out", default=os.environ.get("OUT", "two_gpu_out"))
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--smoke", action="store_true", help="one rank per phase, small sizes")
    p.add_argument("--weft-only", action="store_true",
                   help="collectives through weft alone (no Socket, no training): to compare weft's "
                        "own settings, e.g. WEFT_BACKEND=ofi, against a full run")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    plugin = os.path.abspath(args.plugin)
    ifname = args.ifname or pick_ifname()
    gpus = torch.cuda.device_count()
    world = 1 if args.smoke or gpus < 2 else 2
    if args.smoke:
        args.max_bytes, args.reps, args.steps, args.warmup = min(args.max_bytes, 4 * MIB), 2, 3, 1

    results = {}
    for kind in ("weft",) if args.weft_only else ("weft", "socket", "socket-best"):
        print(f"== collectives through {kind}, {world} rank(s), {ifname}", flush=True)
        results[kind] = spawn(collectives_worker, world, transport_env(kind, plugin, ifname), args, args.out, "coll-" + kind)
    wrong = sum(r["wrong"] for k in results for r in results[k])
    if args.weft_only:
        print(f"# {'op':<15}{'bytes':>12}{'weft busbw':>12}{'time us':>10}")
        for r in results["weft"]:
            print(f"  {r['op']:<15}{r['bytes']:>12}{r['busbw']:>12.2f}{r['time_us']:>10.1f}")
        print(f"# wrong elements: {wrong}")
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump({"world": world, "collectives": results}, f)
        sys.exit(1 if wrong else 0)

    print("== training: GPT-2 124M, bf16, AdamW, global batch", args.global_batch, flush=True)
    one = spawn(train_worker, 1, None, args, args.out, "train-1gpu")
    ddp = {k: spawn(train_worker, world, transport_env(k, plugin, ifname), args, args.out, "train-" + k)
           for k in ("weft", "socket-best")}

    print()
    print(f"# {world} rank(s) on {gpus} visible GPU(s); NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; interface {ifname}")
    print(f"# {'op':<15}{'bytes':>12}{'weft busbw':>12}{'Socket':>10}{'Socket best':>13}{'weft/best':>11}")
    for i, r in enumerate(results["weft"]):
        s, b = results["socket"][i], results["socket-best"][i]
        print(f"  {r['op']:<15}{r['bytes']:>12}{r['busbw']:>12.2f}{s['busbw']:>10.2f}{b['busbw']:>13.2f}{r['busbw'] / b['busbw']:>10.2f}x")
    big = [r["busbw"] / b["busbw"] for r, b in zip(results["weft"], results["socket-best"]) if r["bytes"] >= 64 * MIB]
    if big:
        print(f"# weft / Socket best from 64 MiB: median {statistics.median(big):.2f}x (target >= 1.2x)")
    print(f"# wrong elements: {wrong}")
    print()
    print(f"| model | one GPU | {world} GPUs through Socket | {world} GPUs through weft | speed-up (weft) |")
    print("|---|---:|---:|---:|---:|")
    sp = one["step_s"] / ddp["weft"]["step_s"]  # same global batch: time per step
    print(f"| GPT-2 {one['params'] / 1e6:.0f}M, bf16, AdamW, batch {args.global_batch}x{args.seq} | "
          f"{one['step_s'] * 1e3:.0f} ms | {ddp['socket-best']['step_s'] * 1e3:.0f} ms | "
          f"{ddp['weft']['step_s'] * 1e3:.0f} ms | {sp:.2f}x |")
    if world < 2:
        print("# one rank only: these figures exercise the code; two GPUs are needed for real ones")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"world": world, "collectives": results, "train": {"one": one, **ddp}}, f)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
