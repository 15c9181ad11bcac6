"""Issue 35's GPU validation: `weft plan`'s speed ceiling against `weft bench llm` on one GPU.

One call on the GPU machine, tables last:

  python3 scripts/gpu/llm_validate.py --weft dist/bin/weft [--models llama-3.2-1b,llama-3-8b]
      [--pp 512,2048] [--tg 128] [--runs 3] [--out DIR]

1. The GPU's memory bandwidth, measured: a device-to-device copy of 4 GiB (bytes read plus
   bytes written, over the median of 20 copies timed with CUDA events), and a read-only
   reduction of the same buffer.
2. Per model (a real config from crates/weft-plan/fixtures/configs, random weights): `weft plan`
   on a header-only checkpoint built from the model's real tensor names and shapes (no data:
   the planner reads headers only), with `--device h200 --memory-gbs <measured copy figure>`;
   the model served by scripts/gpu/serve_hf.py (transformers, eager PyTorch, bf16); `weft bench
   llm` against it; `weft bench llm compare --plan` puts predicted beside measured and fits the
   engine's fixed time per step.
Everything goes to --out (default $OUT): plan-*.json, run-*.json, *.log, summary.md.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CONFIGS = os.path.join(ROOT, "crates", "weft-plan", "fixtures", "configs")


def bandwidth(gib=4, reps=20):
    import torch
    n = gib << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    for _ in range(3):
        b.copy_(a)
    copy, read = [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        copy.append(2 * n / (s.elapsed_time(e) / 1e3) / 1e9)
    f = a.view(torch.float32)
    for _ in range(3):
        f.sum()
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f.sum()
        e.record()
        e.synchronize()
        read.append(n / (s.elapsed_time(e) / 1e3) / 1e9)
    del a, b, f
    torch.cuda.empty_cache()
    return {"gpu": torch.cuda.get_device_name(), "bytes": n,
            "copy_gbs_median": statistics.median(copy), "read_gbs_median": statistics.median(read),
            "copy_gbs": copy, "read_gbs": read}


def header_only_checkpoint(config_path, dest):
    """config.json and a model.safetensors holding the real header and no data (sparse)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    os.makedirs(dest, exist_ok=True)
    shutil.copy(config_path, os.path.join(dest, "config.json"))
    cfg = AutoConfig.from_pretrained(dest)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    header, off = {}, 0
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False):
            continue
        size = t.numel() * t.element_size()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = os.path.join(dest, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)
    return off


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, log, timeout):
    print("$ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, timeout=timeout, text=True)
    return p.returncode, p.stdout


def serve(config_dir, name, log, limit_s=300):
    port = free_port()
    f = open(log, "w")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "serve_hf.py"), "--config", config_dir,
                          "--port", str(port), "--name", name], stdout=f, stderr=subprocess.STDOUT)
    end = time.time() + limit_s
    while time.time() < end:
        if p.poll() is not None:
            raise RuntimeError(f"serve_hf exited with {p.returncode}: see {log}")
        with open(log) as r:
            if "listening" in r.read():
                return p, port
        time.sleep(0.5)
    p.kill()
    raise RuntimeError(f"serve_hf not listening after {limit_s} s: see {log}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", required=True)
    ap.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    ap.add_argument("--pp", default="512,2048")
    ap.add_argument("--tg", default="128")
    ap.add_argument("--runs", default="3")
    ap.add_argument("--out", default=os.environ.get("OUT", "llm_validate_out"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    bw = bandwidth()
    json.dump(bw, open(os.path.join(a.out, "bandwidth.json"), "w"), indent=1)
    print(f"== bandwidth: copy {bw['copy_gbs_median']:.0f} GB/s, read {bw['read_gbs_median']:.0f} GB/s "
          f"on {bw['gpu']}", flush=True)
    summary = [f"# issue 35 GPU validation ({bw['gpu']})", "",
               f"memory bandwidth: copy {bw['copy_gbs_median']:.0f} GB/s (read + write, median of 20 "
               f"x 4 GiB), read-only {bw['read_gbs_median']:.0f} GB/s; `weft plan --memory-gbs "
               f"{bw['copy_gbs_median']:.0f}`", ""]
    for m in a.models.split(","):
        d = os.path.join("/tmp/llm_validate", m)
        nbytes = header_only_checkpoint(os.path.join(CONFIGS, m + ".json"), d)
        print(f"== {m}: {nbytes / 1e9:.2f} GB of bf16 weights", flush=True)
        rc, plan = run([a.weft, "plan", d, "--nodes", "1", "--gpu-memory", "141GB", "--tp", "1",
                        "--device", "h200", "--memory-gbs", f"{bw['copy_gbs_median']:.0f}",
                        "--max-model-len", "8192", "--json"],
                       os.path.join(a.out, f"plan-{m}.log"), 120)
        open(os.path.join(a.out, f"plan-{m}.json"), "w").write(plan)
        rc2, human = run([a.weft, "plan", d, "--nodes", "1", "--gpu-memory", "141GB", "--tp", "1",
                          "--device", "h200", "--memory-gbs", f"{bw['copy_gbs_median']:.0f}",
                          "--max-model-len", "8192"], os.path.join(a.out, f"plan-{m}-human.log"), 120)
        print(human, flush=True)
        srv, port = serve(d, m, os.path.join(a.out, f"serve-{m}.log"))
        try:
            rc3, bench = run([a.weft, "bench", "llm", "--base-url", f"http://127.0.0.1:{port}/v1",
                              "--model", m, "--api", "completions", "--pp", a.pp, "--tg", a.tg,
                              "--runs", a.runs, "--nodes", "1", "--layout", "tp1pp1",
                              "--label", "transformers eager bf16",
                              "--save", os.path.join(a.out, f"run-{m}.json")],
                             os.path.join(a.out, f"bench-{m}.log"), 300)
            print(bench, flush=True)
        finally:
            srv.kill()
            srv.wait()
        rc4, cmp = run([a.weft, "bench", "llm", "compare", "--no-plot", "--plan",
                        os.path.join(a.out, f"plan-{m}.json"), os.path.join(a.out, f"run-{m}.json")],
                       os.path.join(a.out, f"compare-{m}.log"), 60)
        print(cmp, flush=True)
        summary += [f"## {m} ({nbytes / 1e9:.2f} GB bf16)", "", "plan rc %d, bench rc %d, compare rc %d"
                    % (rc, rc3, rc4), "", "```", human.strip(), "```", "", "```", bench.strip(), "```",
                    "", "```", cmp.strip(), "```", ""]
    summary.append(f"total {time.time() - t0:.0f} s")
    open(os.path.join(a.out, "summary.md"), "w").write("\n".join(summary) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
