#!/usr/bin/env python3
"""weft plan against PyTorch itself, on the GPU machine (PyTorch + transformers, no network).

vLLM cannot run on the machine where weft is built (no GPU; its CPU build is not installed
there), so this compares the planner with what PyTorch allocates for the same model:

1. TP=1 on the GPU: a model built from a real config (Qwen/Qwen2.5-0.5B-Instruct's
   config.json, crates/weft-plan/fixtures/configs/) with random bf16 weights. Its weight
   memory (torch.cuda.memory_allocated after building) against the plan's weights_bytes;
   the KV cache transformers' DynamicCache holds after a prefill of N tokens, divided by N,
   against the plan's kv_bytes_per_token.
2. TP=2 with PyTorch's own tensor parallelism (torch.distributed.tensor.parallel:
   ColwiseParallel for q/k/v/gate/up, RowwiseParallel for o/down and the vocab-parallel
   embedding), two processes over gloo on the CPU (NCCL refuses two ranks on one GPU):
   the bytes of each rank's local shards against the plan's per-rank weights_bytes.

The plans were produced by `weft plan ... --json` where weft is built and are carried in
scripts/gpu/plan_vs_torch/. Targets (issue 17): weights within 2 %, KV within 5 %.
Writes $OUT/plan_vs_torch.json; exits 1 when a figure misses its target.

Run from the repository root:  python3 scripts/gpu/plan_vs_torch.py
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "crates/weft-plan/fixtures/configs/qwen2.5-0.5b-instruct.json")
PLANS = os.path.join(ROOT, "scripts/gpu/plan_vs_torch")
OUT = os.environ.get("OUT", "/tmp")
PREFILL = 2048


def build(device):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in json.load(open(CONFIG)).items()
                                  if k not in ("architectures", "transformers_version")})
    cfg.architectures = ["Qwen2ForCausalLM"]
    with torch.device(device):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    return m.eval()


def unique_bytes(model):
    seen, total = set(), 0
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def tp_rank(rank, world, port, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    m = build("cpu")
    plan = {"model.embed_tokens": RowwiseParallel()}
    for i in range(m.config.num_hidden_layers):
        p = f"model.layers.{i}"
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "mlp.gate_proj", "mlp.up_proj"):
            plan[f"{p}.{n}"] = ColwiseParallel()
        for n in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{p}.{n}"] = RowwiseParallel()
    parallelize_module(m, mesh, plan)
    # Tied embeddings: the LM head is the (now sharded) embedding, as in vLLM.
    if m.config.tie_word_embeddings:
        m.lm_head.weight = m.model.embed_tokens.weight
    q.put((rank, unique_bytes(m)))
    dist.barrier()
    dist.destroy_process_group()


def main():
    results, failed = {}, False
    plan1 = json.load(open(os.path.join(PLANS, "qwen2.5-0.5b-tp1.json")))
    plan2 = json.load(open(os.path.join(PLANS, "qwen2.5-0.5b-tp2.json")))

    # 1. TP=1 on the GPU.
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    m = build("cuda")
    weights = torch.cuda.memory_allocated() - before
    want = plan1["ranks"][0]["weights_bytes"]
    ids = torch.randint(0, m.config.vocab_size, (1, PREFILL), device="cuda")
    with torch.no_grad():
        out = m(ids, use_cache=True)
    cache = out.past_key_values
    kv_bytes = 0
    for layer in getattr(cache, "layers", []):
        for t in (layer.keys, layer.values):
            kv_bytes += t.numel() * t.element_size()
    if kv_bytes == 0:  # older transformers: key_cache / value_cache lists
        for t in list(cache.key_cache) + list(cache.value_cache):
            kv_bytes += t.numel() * t.element_size()
    kv_per_token = kv_bytes / PREFILL
    kv_want = plan1["ranks"][0]["kv_bytes_per_token"]
    results["tp1"] = {
        "torch_weights_bytes": weights, "plan_weights_bytes": want,
        "weights_ratio": weights / want,
        "torch_kv_bytes_per_token": kv_per_token, "plan_kv_bytes_per_token": kv_want,
        "kv_ratio": kv_per_token / kv_want,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
    }
    failed |= abs(weights / want - 1) > 0.02 or abs(kv_per_token / kv_want - 1) > 0.05
    del m, out, cache
    torch.cuda.empty_cache()

    # 2. TP=2 with PyTorch's tensor parallelism, two CPU processes over gloo.
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=tp_rank, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=120)
    results["tp2"] = []
    for r in plan2["ranks"]:
        t = got[r["rank"]]
        ratio = t / r["weights_bytes"]
        results["tp2"].append({"rank": r["rank"], "torch_local_bytes": t,
                               "plan_weights_bytes": r["weights_bytes"], "ratio": ratio})
        failed |= abs(ratio - 1) > 0.02

    results["ok"] = not failed
    print(json.dumps(results, indent=2))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "plan_vs_torch.json"), "w") as f:
        json.dump(results, f, indent=2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
