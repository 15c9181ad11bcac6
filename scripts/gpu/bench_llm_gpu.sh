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
# repository root, with a weft binary built here (cargo build --release -p weft, stripped):
#
#   WHEELS=wheels WEFT=$PWD/target/release/weft PP="512 2048" TG="32 128" DEPTH="0 4096" \
#       RUNS=9 LATENCY="none api" bash scripts/gpu/bench_llm_gpu.sh
#
# The tools take turns run by run (llama-benchy's --post-run-cmd makes one weft run of the same
# test after each of its runs), once per latency mode in LATENCY ("none": nothing subtracted,
# both count exactly alike; "api": each tool's own GET /v1/models latency). It writes $OUT
# (default ./bench-llm-gpu): server.log (with the check against transformers' forward and the
# in-process generation rate), and per mode MODE/llama-benchy.json, MODE/weft-runs/*.json and
# MODE/side-by-side.md: per test, both tools' pp and tg t/s (medians), the median and range of
# the per-pair ratios and each tool's spread. SERVER_ARGS="--device cpu --layers 2" tries the
# whole script without a GPU (slowly; its figures mean nothing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
WEFT="${WEFT:?WEFT=path of a weft binary}"
OUT="${OUT:-$PWD/bench-llm-gpu}"
PORT="${PORT:-18000}"
PP="${PP:-512 2048}"
TG="${TG:-32 128}"
DEPTH="${DEPTH:-0 4096}"
RUNS="${RUNS:-9}"
LATENCY="${LATENCY:-none api}"
# SERVER_ARGS: more server.py options, e.g. "--device cpu --layers 2" to try the script without a GPU.
MODEL=qwen3-0.6b-random
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --find-links "$WHEELS" llama-benchy 2>&1 | tail -3 \
        || python3 -m pip install -q --no-index --find-links "$WHEELS" --break-system-packages llama-benchy
fi
python3 -c "import llama_benchy" || { echo "llama-benchy is not installed: give WHEELS=dir (see the header)"; exit 2; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

python3 "$here/bench_llm/server.py" --port "$PORT" --out "$OUT" \
    --words "$root/crates/weft-llmbench/data/words.txt" --model-name "$MODEL" ${SERVER_ARGS:-} > "$OUT/server.log" 2>&1 &
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
csv() { echo "$1" | tr ' ' ','; }
# Run by run in turns: after each of its runs llama-benchy calls pair.sh (--post-run-cmd), which
# makes one weft run of the same test (llama-benchy's loop order: depth, pp, tg; a warm-up run
# first, after which pair.sh makes weft's own warm-up run, not counted). Each pair is measured
# within a second or two of each other, so a drift of the server's speed moves both alike.
tests=()
for d in $DEPTH; do for p in $PP; do for t in $TG; do tests+=("$p $t $d"); done; done; done
printf '%s\n' "${tests[@]}" > "$OUT/tests.txt"
# Both tools once per latency mode: "none" subtracts nothing from the time to the first token,
# so both count exactly the same way; "api" subtracts each tool's own `GET /v1/models` latency
# (weft: the median of 3, llama-benchy: the mean), their defaults.
for mode in $LATENCY; do
o="$OUT/$mode"
mkdir -p "$o/weft-runs"
echo 0 > "$o/pair.n"
cat > "$o/pair.sh" <<SH
#!/usr/bin/env bash
set -eu
n=\$(cat "$o/pair.n"); echo \$((n + 1)) > "$o/pair.n"
t=\$((n / ($RUNS + 1))); k=\$((n % ($RUNS + 1)))
read -r pp tg depth < <(sed -n "\$((t + 1))p" "$OUT/tests.txt")
[ "\$k" = 0 ] && save="$o/weft-runs/warmup-\$t.json" || save="$o/weft-runs/t\$t-r\$k.json"
"$WEFT" bench llm --base-url "$base" --model "$MODEL" --tokenizer "$tokdir" --seed \$((n + 1)) \
    --pp \$pp --tg \$tg --depth \$depth --runs 1 --nodes 1 --latency-mode $mode \
    --label "H200, transformers random Qwen3-0.6B" --save "\$save" > "$o/weft-runs/last.md" 2>&1 \
    || { cat "$o/weft-runs/last.md"; exit 1; }
SH
chmod +x "$o/pair.sh"
# shellcheck disable=SC2086
python3 -m llama_benchy --base-url "$base" --model "$MODEL" --tokenizer "$tokdir" \
    --book-url "$url" --skip-coherence --pp $PP --tg $TG --depth $DEPTH --runs "$RUNS" \
    --latency-mode "$mode" --post-run-cmd "$o/pair.sh" \
    --format json --save-result "$o/llama-benchy.json" > "$o/llama-benchy.log" 2>&1 \
    || { tail -30 "$o/llama-benchy.log"; exit 1; }
cat "$o/weft-runs/last.md"
echo "latency mode $mode:"
python3 - "$o" "$RUNS" "$OUT/tests.txt" <<'PY' | tee "$o/side-by-side.md"
import json, statistics, sys
out, runs, tests_txt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b = json.load(open(f"{out}/llama-benchy.json"))
tests = [tuple(map(int, l.split())) for l in open(tests_txt) if l.strip()]
med = statistics.median
print("| test | weft pp t/s | llama-benchy pp t/s | pp ratio, median of pairs (range) "
      "| weft tg t/s | llama-benchy tg t/s | tg ratio, median of pairs (range) | weft pp, tg spread | llama-benchy pp, tg spread |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
spread = lambda v: (max(v) - min(v)) / med(v) * 100
ctx = None
for ti, (pp, tg, depth) in enumerate(tests):
    m = [r for r in b["benchmarks"] if r["prompt_size"] == pp and r["response_size"] == tg
         and r["context_size"] == depth and not r["is_context_prefill_phase"]]
    if not m:
        continue
    bp, bt = m[0]["pp_throughput"]["values"], m[0]["tg_throughput"]["values"]
    wp, wt = [], []
    for k in range(1, runs + 1):
        w = json.load(open(f"{out}/weft-runs/t{ti}-r{k}.json"))
        ctx = w["context"]
        r = w["results"][0]["runs"][0]
        wp.append(r["pp_tps"]); wt.append(r["tg_tps"])
    name = w["results"][0]["pp_name"] + " / " + w["results"][0]["tg_name"]
    rp = [x / y for x, y in zip(wp, bp)]
    rt = [x / y for x, y in zip(wt, bt)]
    print(f"| {name} | {med(wp):.1f} | {med(bp):.1f} | {med(rp):.3f} ({min(rp):.3f}-{max(rp):.3f}) "
          f"| {med(wt):.1f} | {med(bt):.1f} | {med(rt):.3f} ({min(rt):.3f}-{max(rt):.3f}) "
          f"| {spread(wp):.1f} %, {spread(wt):.1f} % | {spread(bp):.1f} %, {spread(bt):.1f} % |")
print()
print(f"{runs} pairs per test; spread = (max - min) / median over a tool's runs")
print("counting:", ctx["counting"] if ctx else None, "| weft latency ms:", round(ctx["latency_ms"], 3) if ctx else None,
      "| llama-benchy latency ms:", round(b["latency_ms"], 3))
PY
done
