//! Will more nodes make it faster? A ceiling for one stream's decode and prompt speed of a
//! planned layout, with its breakdown per step. Pure: a plan, the model's architecture and
//! figures for the device and the links in, a [`Prediction`] out.
//!
//! One decode step of one sequence runs through the pipeline stages one after the other,
//! so the step time is the sum over stages of the slowest TP rank of each:
//!
//! - **memory**: bytes the rank reads / memory bandwidth. A rank reads its weights, less the
//!   routed experts a token does not use (it reads top-k of E) and the input embedding (one
//!   row), plus the KV cache of the context so far (sliding layers only their window).
//! - **compute**: 2 FLOPs per active parameter plus attention (4 x context x heads x
//!   head_dim per layer) / dense peak (FP8 peak for FP8 weights, BF16 otherwise). Memory and
//!   compute overlap: the step pays the larger of the two.
//! - **TP all-reduce**: 2 per layer, each a ring of 2(tp-1) steps: 2(tp-1) x latency +
//!   2(tp-1)/tp x bytes / bandwidth, on the node's GPU link, or the network when a TP group
//!   spans nodes.
//! - **pipeline hops**: pp-1 sends of the hidden state and residual.
//! - **expert all-to-all**: 2 per MoE layer (dispatch and combine) when EP is on.
//! - **engine overhead**: a fixed time per step (scheduling, sampling, launches), which one
//!   measured run calibrates (`weft bench llm compare --plan`).
//!
//! A prompt of n tokens is processed in chunks (vLLM's `max_num_batched_tokens`, llama.cpp's
//! micro-batch): each chunk reads the weights once and computes n_chunk tokens.
//!
//! It is a ceiling: peak figures, no kernel inefficiency, no overlap lost. What it leaves out
//! (shared experts in the FLOP count, linear-attention state reads, sampling) is small next
//! to the terms above for the models planned here; the calibration absorbs the rest.

use serde::{Deserialize, Serialize};

use crate::arch::{Arch, LayerKind, Quant};
use crate::plan::{Engine, Plan, kv_layer_bytes};

/// Published figures of a device. Bandwidths in GB/s (1e9 B/s), compute in dense TFLOPS
/// (no sparsity).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeviceSpec {
    pub name: &'static str,
    pub memory_gbs: f64,
    pub bf16_tflops: f64,
    pub fp8_tflops: f64,
    /// Between two GPUs of one node (NVLink or PCIe), per direction; 0 when the node has
    /// one device.
    pub gpu_link_gbs: f64,
    pub gpu_link_latency_us: f64,
    pub source: &'static str,
}

/// The devices people cluster, with the sources of their figures.
pub const DEVICES: &[DeviceSpec] = &[
    DeviceSpec {
        name: "gb10",
        memory_gbs: 273.0,
        bf16_tflops: 125.0,
        fp8_tflops: 250.0,
        gpu_link_gbs: 0.0,
        gpu_link_latency_us: 0.0,
        source: "NVIDIA DGX Spark (GB10): 273 GB/s LPDDR5x, 1 PFLOP FP4 with sparsity, so 500 dense FP4, 250 FP8, 125 BF16 (docs.nvidia.com DGX Spark hardware guide via ai-infrastructure.net/dgx-spark; 188 FP8 TFLOPS measured, forums.developer.nvidia.com/t/359960)",
    },
    DeviceSpec {
        name: "h100",
        memory_gbs: 3350.0,
        bf16_tflops: 989.0,
        fp8_tflops: 1979.0,
        gpu_link_gbs: 450.0,
        gpu_link_latency_us: 3.0,
        source: "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 989 BF16 / 1,979 FP8 dense TFLOPS (the datasheet's 1,979 / 3,958 include sparsity), NVLink 900 GB/s both directions",
    },
    DeviceSpec {
        name: "h200",
        memory_gbs: 4800.0,
        bf16_tflops: 989.0,
        fp8_tflops: 1979.0,
        gpu_link_gbs: 450.0,
        gpu_link_latency_us: 3.0,
        source: "NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, the H100's compute (989 BF16 / 1,979 FP8 dense TFLOPS), NVLink 900 GB/s both directions (lzwjava.github.io/nvidia-h200-gpu-specs-en)",
    },
    DeviceSpec {
        name: "a100",
        memory_gbs: 2039.0,
        bf16_tflops: 312.0,
        fp8_tflops: 312.0,
        gpu_link_gbs: 300.0,
        gpu_link_latency_us: 3.0,
        source: "NVIDIA A100 80GB SXM datasheet: 2,039 GB/s HBM2e, 312 BF16 dense TFLOPS, no FP8 (FP8 weights run at BF16 rate), NVLink 600 GB/s both directions",
    },
    DeviceSpec {
        name: "l40s",
        memory_gbs: 864.0,
        bf16_tflops: 362.0,
        fp8_tflops: 733.0,
        gpu_link_gbs: 32.0,
        gpu_link_latency_us: 5.0,
        source: "NVIDIA L40S datasheet: 864 GB/s GDDR6, 362 BF16 / 733 FP8 dense TFLOPS (733 / 1,466 with sparsity), PCIe Gen4 x16 between GPUs",
    },
    DeviceSpec {
        name: "rtx-4090",
        memory_gbs: 1008.0,
        bf16_tflops: 165.0,
        fp8_tflops: 330.0,
        gpu_link_gbs: 32.0,
        gpu_link_latency_us: 5.0,
        source: "NVIDIA Ada whitepaper, RTX 4090: 1,008 GB/s GDDR6X, 165 BF16 / 330 FP8 dense TFLOPS with FP32 accumulate, PCIe Gen4 x16 between GPUs",
    },
    DeviceSpec {
        name: "rtx-5090",
        memory_gbs: 1792.0,
        bf16_tflops: 209.0,
        fp8_tflops: 419.0,
        gpu_link_gbs: 64.0,
        gpu_link_latency_us: 5.0,
        source: "NVIDIA Blackwell GeForce whitepaper, RTX 5090: 1,792 GB/s GDDR7, 209.5 BF16 / 419 FP8 dense TFLOPS, PCIe Gen5 x16 between GPUs",
    },
    DeviceSpec {
        name: "cpu",
        memory_gbs: 89.6,
        bf16_tflops: 1.0,
        fp8_tflops: 1.0,
        gpu_link_gbs: 0.0,
        gpu_link_latency_us: 0.0,
        source: "a desktop CPU: two channels of DDR5-5600 (2 x 8 B x 5.6 GT/s = 89.6 GB/s); 1 TFLOPS assumed for BF16 matrix work; pass --memory-gbs and --tflops for yours",
    },
];

/// A device by name (`gb10`, `dgx-spark`, `h100`, `rtx-4090`, ...).
pub fn device(name: &str) -> Option<&'static DeviceSpec> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    let n = match n.as_str() {
        "spark" | "dgx-spark" => "gb10",
        "4090" => "rtx-4090",
        "5090" => "rtx-5090",
        other => other,
    };
    DEVICES.iter().find(|d| d.name == n)
}

/// The device an agent's GPU name (NVML's, `NVIDIA H200`, `NVIDIA GeForce RTX 4090`,
/// `NVIDIA GB10`) is, when the table has it.
pub fn device_from_gpu_name(gpu: &str) -> Option<&'static DeviceSpec> {
    let g = gpu.to_ascii_lowercase();
    let name = if g.contains("gb10") {
        "gb10"
    } else if g.contains("h200") {
        "h200"
    } else if g.contains("h100") {
        "h100"
    } else if g.contains("a100") {
        "a100"
    } else if g.contains("l40s") {
        "l40s"
    } else if g.contains("4090") {
        "rtx-4090"
    } else if g.contains("5090") {
        "rtx-5090"
    } else {
        return None;
    };
    device(name)
}

/// Every figure the model uses, with where each came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub device: String,
    pub memory_gbs: f64,
    pub bf16_tflops: f64,
    pub fp8_tflops: f64,
    pub gpu_link_gbs: f64,
    pub gpu_link_latency_us: f64,
    /// Between nodes, Gb/s (bits) as links are quoted, one way.
    pub link_gbps: f64,
    pub link_latency_us: f64,
    /// Fixed time of one engine step.
    pub step_overhead_us: f64,
    pub sources: Vec<String>,
}

/// A device or link figure that is not a positive, finite number ([`Hardware::check`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} is {value}: it must be a positive number")]
pub struct FigureError {
    pub what: &'static str,
    pub value: f64,
}

/// The engine's fixed time per step when nothing was measured.
pub fn default_step_overhead_us(engine: Engine) -> (f64, &'static str) {
    match engine {
        Engine::Vllm | Engine::Sglang => (
            1500.0,
            "engine step overhead 1.5 ms assumed (scheduling, sampling, launches); `weft bench llm compare --plan` fits it from one measured run",
        ),
        Engine::LlamaCpp => (
            1000.0,
            "engine step overhead 1 ms assumed; `weft bench llm compare --plan` fits it from one measured run",
        ),
    }
}

/// Link figures when neither `--links` nor the link flags say: DGX Spark's ConnectX-7.
pub const DEFAULT_LINK: (f64, f64, &str) = (
    200.0,
    10.0,
    "link 200 Gb/s, 10 us assumed (DGX Spark's ConnectX-7 RoCE); pass --links p2p.json or --link-gbps/--link-latency-us",
);

impl Hardware {
    /// A device's figures with the default link and the engine's default overhead.
    pub fn new(d: &DeviceSpec, engine: Engine) -> Hardware {
        let (ov, ov_src) = default_step_overhead_us(engine);
        Hardware {
            device: d.name.to_string(),
            memory_gbs: d.memory_gbs,
            bf16_tflops: d.bf16_tflops,
            fp8_tflops: d.fp8_tflops,
            gpu_link_gbs: d.gpu_link_gbs,
            gpu_link_latency_us: d.gpu_link_latency_us,
            link_gbps: DEFAULT_LINK.0,
            link_latency_us: DEFAULT_LINK.1,
            step_overhead_us: ov,
            sources: vec![
                d.source.to_string(),
                DEFAULT_LINK.2.to_string(),
                ov_src.to_string(),
            ],
        }
    }

    /// Every figure positive and finite, or the one that is not.
    pub fn check(&self) -> Result<(), FigureError> {
        for (what, v, zero_ok) in [
            ("memory bandwidth (GB/s)", self.memory_gbs, false),
            ("BF16 TFLOPS", self.bf16_tflops, false),
            ("FP8 TFLOPS", self.fp8_tflops, false),
            ("GPU link GB/s", self.gpu_link_gbs, true),
            ("GPU link latency (us)", self.gpu_link_latency_us, true),
            ("link Gb/s", self.link_gbps, false),
            ("link latency (us)", self.link_latency_us, true),
            ("step overhead (us)", self.step_overhead_us, true),
        ] {
            if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
                return Err(FigureError { what, value: v });
            }
        }
        Ok(())
    }
}

/// The time of one step, by term, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Terms {
    pub memory_s: f64,
    pub compute_s: f64,
    pub tp_latency_s: f64,
    pub tp_bytes_s: f64,
    pub pp_latency_s: f64,
    pub pp_bytes_s: f64,
    pub ep_latency_s: f64,
    pub ep_bytes_s: f64,
    pub overhead_s: f64,
}

impl Terms {
    /// Memory and compute overlap; the rest adds.
    pub fn total_s(&self) -> f64 {
        self.memory_s.max(self.compute_s)
            + self.tp_latency_s
            + self.tp_bytes_s
            + self.pp_latency_s
            + self.pp_bytes_s
            + self.ep_latency_s
            + self.ep_bytes_s
            + self.overhead_s
    }

    /// The largest term, named for a person.
    pub fn dominant(&self) -> &'static str {
        let latency = self.tp_latency_s + self.pp_latency_s + self.ep_latency_s;
        let bytes = self.tp_bytes_s + self.pp_bytes_s + self.ep_bytes_s;
        let all = [
            (self.memory_s, "memory"),
            (self.compute_s, "compute"),
            (latency, "network latency"),
            (bytes, "network bandwidth"),
            (self.overhead_s, "engine overhead"),
        ];
        all.iter()
            .fold((f64::MIN, "memory"), |a, b| if b.0 > a.0 { *b } else { a })
            .1
    }

    fn add(&mut self, o: &Terms) {
        self.memory_s += o.memory_s;
        self.compute_s += o.compute_s;
        self.tp_latency_s += o.tp_latency_s;
        self.tp_bytes_s += o.tp_bytes_s;
        self.pp_latency_s += o.pp_latency_s;
        self.pp_bytes_s += o.pp_bytes_s;
        self.ep_latency_s += o.ep_latency_s;
        self.ep_bytes_s += o.ep_bytes_s;
        self.overhead_s += o.overhead_s;
    }
}

/// A predicted speed with its breakdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    pub tokens_per_s: f64,
    /// Decode: one step. Prompt: all chunks of the prompt together.
    pub terms: Terms,
    pub dominant: String,
}

impl Speed {
    fn of(terms: Terms, tokens: u64) -> Speed {
        let t = terms.total_s();
        Speed {
            tokens_per_s: if t > 0.0 { tokens as f64 / t } else { 0.0 },
            dominant: terms.dominant().to_string(),
            terms,
        }
    }
}

/// What the plan predicts for one sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Decode at an empty context.
    pub decode: Speed,
    /// Decode with `context_tokens` of context (the plan's max-model-len).
    pub decode_at_context: Speed,
    pub context_tokens: u64,
    /// A prompt of `prompt_tokens` (the plan's max-model-len) from an empty cache.
    pub prompt: Speed,
    pub prompt_tokens: u64,
    /// Tokens per engine step while processing a prompt.
    pub prompt_chunk_tokens: u64,
    pub hardware: Hardware,
    /// What the figures above were computed from: any other test can be predicted from it.
    pub model: StepModel,
}

/// Prompt tokens per step: vLLM's default `max_num_batched_tokens` for online serving
/// (8,192), llama.cpp's default micro-batch (`--ubatch-size` 512).
pub fn prompt_chunk(engine: Engine) -> u64 {
    match engine {
        Engine::Vllm | Engine::Sglang => 8192,
        Engine::LlamaCpp => 512,
    }
}

/// Parameters of one layer a token multiplies by (routed: its top-k experts only), and
/// the LM head's.
fn active_params(arch: &Arch) -> (f64, f64) {
    let h = arch.hidden as f64;
    let q = (arch.heads * arch.head_dim) as f64;
    let kv = (arch.kv_heads * (arch.head_dim + arch.v_head_dim)) as f64;
    let attn = h * (2.0 * q + kv);
    let gated = if arch.family == crate::arch::Family::Gpt2 {
        2.0
    } else {
        3.0
    };
    let mlp = if arch.experts > 0 {
        gated * h * arch.moe_intermediate as f64 * arch.experts_per_token as f64
    } else {
        gated * h * arch.intermediate as f64
    };
    (attn + mlp, h * arch.vocab as f64)
}

/// The plan's FLOP rate: FP8 weights run at the FP8 peak.
fn peak_flops(arch: &Arch, hw: &Hardware) -> f64 {
    let fp8 = matches!(arch.quant, Quant::Fp8 { .. })
        || matches!(&arch.quant, Quant::Modelopt { algo } if algo.to_ascii_lowercase().contains("fp8"));
    (if fp8 { hw.fp8_tflops } else { hw.bf16_tflops }) * 1e12
}

/// One ring all-reduce of `bytes` over `n` ranks: (latency, transfer) seconds.
fn allreduce(n: u64, bytes: f64, gbs: f64, latency_us: f64) -> (f64, f64) {
    if n <= 1 {
        return (0.0, 0.0);
    }
    let steps = 2.0 * (n - 1) as f64;
    (
        steps * latency_us * 1e-6,
        steps / n as f64 * bytes / (gbs * 1e9),
    )
}

/// One link a collective crosses: its ranks, rate (GB/s) and one-way latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkUse {
    pub ranks: u64,
    pub gbs: f64,
    pub latency_us: f64,
}

/// One pipeline stage as the speed model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageModel {
    /// Per TP rank: [dense weight bytes, routed expert bytes, input embedding bytes].
    pub ranks: Vec<[f64; 3]>,
    /// Per attention layer: KV bytes per token on one rank, and its window (none: full).
    pub kv_layers: Vec<(f64, Option<u64>)>,
    pub layers: u64,
    /// The last stage runs the LM head.
    pub lm_head: bool,
    /// TP all-reduces (two per layer), EP all-to-alls (two per MoE layer), the hop to the
    /// next stage.
    pub tp: Option<LinkUse>,
    pub ep: Option<LinkUse>,
    pub next: Option<LinkUse>,
    /// This stage's node's memory bandwidth (GB/s) when the nodes differ; else the
    /// model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gbs: Option<f64>,
}

/// Everything the speed of one layout depends on, so that a saved plan can predict any
/// test (prompt size, depth) later (`weft bench llm compare --plan`) without the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepModel {
    pub stages: Vec<StageModel>,
    pub hidden: u64,
    pub vocab: u64,
    pub experts: u64,
    pub experts_per_token: u64,
    /// Attention heads and head dim on one TP rank.
    pub heads_per_rank: u64,
    pub head_dim: u64,
    /// Parameters one token multiplies by per layer and in the LM head, on one TP rank.
    pub layer_params_per_rank: f64,
    pub head_params_per_rank: f64,
    pub memory_gbs: f64,
    pub peak_tflops: f64,
    pub step_overhead_us: f64,
    /// Prompt tokens per step.
    pub prompt_chunk_tokens: u64,
}

impl StepModel {
    /// The model of a planned layout on `hw`.
    pub fn new(plan: &Plan, arch: &Arch, hw: &Hardware) -> StepModel {
        let Plan { layout, .. } = plan;
        let (tp, pp) = (layout.tp, layout.pp);
        let g = plan.cluster.gpus_per_node;
        let (layer_params, head_params) = active_params(arch);
        let layer_kv = kv_layer_bytes(arch, tp, plan.kv_bytes_per_element) as f64;
        let net = |n: u64, crosses: bool| LinkUse {
            ranks: n,
            gbs: if crosses || hw.gpu_link_gbs == 0.0 {
                hw.link_gbps / 8.0
            } else {
                hw.gpu_link_gbs
            },
            latency_us: if crosses || hw.gpu_link_gbs == 0.0 {
                hw.link_latency_us
            } else {
                hw.gpu_link_latency_us
            },
        };
        let ep = layout.ep_size();
        let stages = (0..pp)
            .map(|s| {
                let ranks: Vec<_> = plan
                    .ranks
                    .iter()
                    .filter(|r| r.pp_stage == s && r.dp_rank == 0)
                    .collect();
                let (l0, l1) = ranks.first().map_or((0, 0), |r| (r.layers[0], r.layers[1]));
                let kv_layers = (l0..l1)
                    .filter_map(|l| {
                        match arch
                            .layer_kinds
                            .get(l as usize)
                            .copied()
                            .unwrap_or(LayerKind::Full)
                        {
                            LayerKind::Full => Some((layer_kv, None)),
                            LayerKind::Sliding { window } => Some((layer_kv, Some(window))),
                            LayerKind::Linear => None,
                        }
                    })
                    .collect();
                StageModel {
                    ranks: ranks
                        .iter()
                        .map(|r| {
                            [
                                (r.weights_bytes - r.expert_bytes - r.lookup_bytes) as f64,
                                r.expert_bytes as f64,
                                r.lookup_bytes as f64,
                            ]
                        })
                        .collect(),
                    kv_layers,
                    layers: l1 - l0,
                    lm_head: s == pp - 1,
                    tp: (tp > 1).then(|| net(tp, tp > g)),
                    ep: (ep > 1 && arch.experts > 0).then(|| net(ep, ep > g)),
                    next: (s + 1 < pp).then(|| net(2, (s * tp) / g != ((s + 1) * tp) / g)),
                    memory_gbs: None,
                }
            })
            .collect();
        StepModel {
            stages,
            hidden: arch.hidden,
            vocab: arch.vocab,
            experts: arch.experts,
            experts_per_token: arch.experts_per_token,
            heads_per_rank: (arch.heads / tp).max(1),
            head_dim: arch.head_dim,
            layer_params_per_rank: layer_params / tp as f64,
            head_params_per_rank: head_params / tp as f64,
            memory_gbs: hw.memory_gbs,
            peak_tflops: peak_flops(arch, hw) / 1e12,
            step_overhead_us: hw.step_overhead_us,
            prompt_chunk_tokens: prompt_chunk(plan.engine),
        }
    }

    /// The time of one step that processes `tokens` tokens of one sequence whose cache
    /// holds `past` tokens before it.
    pub fn step(&self, tokens: u64, past: u64) -> Terms {
        let n = tokens as f64;
        let mem_bps = self.memory_gbs * 1e9;
        let flops = self.peak_tflops * 1e12;
        // Share of routed experts a step touches: top-k of E for one token, nearly all for
        // many.
        let expert_share = if self.experts > 0 {
            let k = self.experts_per_token as f64 / self.experts as f64;
            1.0 - (1.0 - k.min(1.0)).powf(n)
        } else {
            0.0
        };
        let act = n * self.hidden as f64 * 2.0;
        let mut t = Terms::default();
        for st in &self.stages {
            let mut kv_read = 0.0;
            let mut attn_flops = 0.0;
            for (bytes, window) in &st.kv_layers {
                let cap = window.map_or(f64::MAX, |w| w as f64);
                // The cache is read once for the step; each token attends to the tokens
                // before it (on average past + (n+1)/2), up to the window.
                kv_read += bytes * (past as f64 + n).min(cap);
                let avg = (past as f64 + (n + 1.0) / 2.0).min(cap);
                attn_flops += 4.0 * n * avg * self.heads_per_rank as f64 * self.head_dim as f64;
            }
            let mem_bps = st.memory_gbs.map_or(mem_bps, |g| g * 1e9);
            let memory = st
                .ranks
                .iter()
                .map(|[dense, expert, lookup]| {
                    let row = (lookup / self.vocab.max(1) as f64 * n).min(*lookup);
                    dense + expert * expert_share + row + kv_read
                })
                .fold(0.0, f64::max)
                / mem_bps;
            let mut compute = 2.0 * n * st.layers as f64 * self.layer_params_per_rank + attn_flops;
            if st.lm_head {
                // The LM head runs for the last token of the step only.
                compute += 2.0 * self.head_params_per_rank;
            }
            t.memory_s += memory;
            t.compute_s += compute / flops;
            let layers = st.layers as f64;
            if let Some(l) = st.tp {
                let (lat, bytes) = allreduce(l.ranks, act, l.gbs, l.latency_us);
                t.tp_latency_s += 2.0 * layers * lat;
                t.tp_bytes_s += 2.0 * layers * bytes;
            }
            if let Some(l) = st.ep {
                let bytes =
                    act * self.experts_per_token as f64 * (l.ranks - 1) as f64 / l.ranks as f64;
                t.ep_latency_s += 2.0 * layers * l.latency_us * 1e-6;
                t.ep_bytes_s += 2.0 * layers * bytes / (l.gbs * 1e9);
            }
            if let Some(l) = st.next {
                // The hidden state and the residual.
                t.pp_latency_s += l.latency_us * 1e-6;
                t.pp_bytes_s += 2.0 * act / (l.gbs * 1e9);
            }
        }
        t.overhead_s = self.step_overhead_us * 1e-6;
        t
    }

    /// Decode speed of one sequence with `context` tokens already in its cache.
    pub fn decode(&self, context: u64) -> Speed {
        Speed::of(self.step(1, context), 1)
    }

    /// Prompt speed of one sequence: `tokens` prompt tokens after `depth` cached ones.
    pub fn prompt(&self, tokens: u64, depth: u64) -> Speed {
        let chunk = self.prompt_chunk_tokens.max(1);
        let mut total = Terms::default();
        let mut done = 0;
        while done < tokens {
            let c = chunk.min(tokens - done);
            total.add(&self.step(c, depth + done));
            done += c;
        }
        Speed::of(total, tokens)
    }
}

/// The plan's prediction: decode empty and at max-model-len, a prompt of max-model-len.
pub fn predict(plan: &Plan, arch: &Arch, hw: &Hardware) -> Prediction {
    let len = plan.max_model_len.max(1);
    let model = StepModel::new(plan, arch, hw);
    Prediction {
        decode: model.decode(0),
        decode_at_context: model.decode(len),
        context_tokens: len,
        prompt: model.prompt(len, 0),
        prompt_tokens: len,
        prompt_chunk_tokens: model.prompt_chunk_tokens,
        hardware: hw.clone(),
        model,
    }
}

/// The best layout at one node count and its speed model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalePoint {
    pub nodes: u64,
    pub layout: crate::plan::Layout,
    pub max_model_len: u64,
    pub decode_tokens_per_s: f64,
    pub model: StepModel,
}

/// For 1 to `cluster.nodes` nodes, the fastest layout that fits and its model (node
/// counts where none fits are left out): what `weft bench llm compare --plan` predicts
/// each measured run from.
pub fn scaling(
    model: &crate::plan::Model,
    cluster: crate::plan::Cluster,
    opts: &crate::plan::Options,
) -> Vec<ScalePoint> {
    if opts.hardware.is_none() {
        return Vec::new();
    }
    (1..=cluster.nodes)
        .filter_map(|nodes| {
            let c = crate::plan::Cluster { nodes, ..cluster };
            crate::plan::candidates(model, c, opts)
                .into_iter()
                .find_map(|(cand, p)| {
                    let p = p.filter(|p| p.fits)?;
                    let s = p.speed?;
                    Some(ScalePoint {
                        nodes,
                        layout: cand.layout,
                        max_model_len: p.max_model_len,
                        decode_tokens_per_s: s.decode.tokens_per_s,
                        model: s.model,
                    })
                })
        })
        .collect()
}
