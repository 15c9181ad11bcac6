#!/usr/bin/env bash
# weft bench llm and llama-benchy side by side on one H200, against a Qwen3-0.6B-shaped model
# with random weights (no download) served by scripts/gpu/bench_llm/server.py, a minimal
# OpenAI-compatible server on transformers (`transformers serve` needs fastapi and uvicorn, which
# the GPU machine lacks, and nothing can be installed there from outside).
#
# Wheels: llama-benchy with its dependencies, fetched on the build machine for the GPU
# machine's Python 3.12, less what the GPU machine already has (torch, transformers and theirs):
#
#   pip download -d wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#       llama-benchy
#   cd wheels && rm -f numpy* transformers* tokenizers* huggingface_hub* hf_xet* safetensors* \
#       regex* pyyaml* fsspec* filelock* tqdm* packaging* rich* pygments* markdown_it* mdurl* \
#       typer* click* shellingham*
#
# (30 wheels, 9.5 MB; llama-benchy wants transformers>=5.2.) Then, from the
# repository root, with a weft binary built here (cargo build --release -p weft):
#
#   WHEELS=wheels WEFT=target/release/weft bash scripts/gpu/bench_llm_gpu.sh
#
# It writes $OUT (default ./bench-llm-gpu) with weft's RUN.json and table, llama-benchy's JSON,
# and side-by-side.md: per test, both tools' pp and tg t/s (medians over runs) and the ratio.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
WEFT="${WEFT:?WEFT=path of a weft binary}"
OUT="${OUT:-$PWD/bench-llm-gpu}"
PORT="${PORT:-18000}"
PP="${PP:-512 2048}"
TG="${TG:-32 128}"
DEPTH="${DEPTH:-0 4096}"
RUNS="${RUNS:-5}"
MODEL=qwen3-0.6b-random
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --find-links "$WHEELS" llama-benchy 2>&1 | tail -3 \
        || python3 -m pip install -q --no-index --find-links "$WHEELS" --break-system-packages llama-benchy
fi
python3 -c "import llama_benchy" || { echo "llama-benchy is not installed: give WHEELS=dir (see the header)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

python3 "$here/bench_llm/server.py" --port "$PORT" --out "$OUT" \
    --words "$root/crates/weft-llmbench/data/words.txt" --model-name "$MODEL" > "$OUT/server.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null 2>&1 && break
    kill -0 $srv 2>/dev/null || { cat "$OUT/server.log"; exit 2; }
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "server did not start in 300 s"; cat "$OUT/server.log"; exit 2; }
cat "$OUT/server.log"

# llama-benchy downloads a book unless it is cached under the md5 of --book-url; no host is
# reachable from here, so the cache gets text made from weft's word list. Random weights never
# answer its coherence question ("Paris"), hence --skip-coherence.
export HOME="$OUT/home"
url="http://127.0.0.1:9/weft-prompt-text.txt"
mkdir -p "$HOME/.cache/llama-benchy"
python3 - "$url" "$root/crates/weft-llmbench/data/words.txt" "$HOME/.cache/llama-benchy" <<'PY'
import hashlib, random, sys, os
url, words, d = sys.argv[1:]
w = open(words).read().split()
r = random.Random(5)
s = []
for _ in range(6000):
    t = " ".join(r.choice(w) for _ in range(r.randint(6, 15)))
    s.append(t[0].upper() + t[1:] + ".")
open(os.path.join(d, hashlib.md5(url.encode()).hexdigest() + ".txt"), "w").write(" ".join(s))
PY

base="http://127.0.0.1:$PORT/v1"
tokdir="$OUT/tokenizer"
# shellcheck disable=SC2086
python3 -m llama_benchy --base-url "$base" --model "$MODEL" --tokenizer "$tokdir" \
    --book-url "$url" --skip-coherence --pp $PP --tg $TG --depth $DEPTH --runs "$RUNS" \
    --format json --save-result "$OUT/llama-benchy.json" > "$OUT/llama-benchy.log" 2>&1 \
    || { tail -30 "$OUT/llama-benchy.log"; exit 1; }
csv() { echo "$1" | tr ' ' ','; }
"$WEFT" bench llm --base-url "$base" --model "$MODEL" --tokenizer "$tokdir" \
    --pp "$(csv "$PP")" --tg "$(csv "$TG")" --depth "$(csv "$DEPTH")" --runs "$RUNS" \
    --nodes 1 --label "H200, transformers random Qwen3-0.6B" --save "$OUT/weft.json" | tee "$OUT/weft.md"

python3 - "$OUT" <<'PY' | tee "$OUT/side-by-side.md"
import json, statistics, sys
out = sys.argv[1]
b = json.load(open(f"{out}/llama-benchy.json"))
w = json.load(open(f"{out}/weft.json"))
print("| test | weft pp t/s | llama-benchy pp t/s | ratio | weft tg t/s | llama-benchy tg t/s | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
for t in w["results"]:
    m = [r for r in b["benchmarks"] if r["prompt_size"] == t["pp"] and r["response_size"] == t["tg"]
         and r["context_size"] == t["depth"] and not r["is_context_prefill_phase"]]
    if not m:
        continue
    r = m[0]
    wp = statistics.median([x["pp_tps"] for x in t["runs"] if x["pp_tps"]])
    wt = statistics.median([x["tg_tps"] for x in t["runs"] if x["tg_tps"]])
    bp = statistics.median(r["pp_throughput"]["values"])
    bt = statistics.median(r["tg_throughput"]["values"])
    print(f"| {t['pp_name']} / {t['tg_name']} | {wp:.1f} | {bp:.1f} | {wp/bp:.3f} | {wt:.1f} | {bt:.1f} | {wt/bt:.3f} |")
print()
print("counting:", w["context"]["counting"], "| latency ms:", round(w["context"]["latency_ms"], 2),
      "| llama-benchy latency ms:", round(b["latency_ms"], 2))
PY
