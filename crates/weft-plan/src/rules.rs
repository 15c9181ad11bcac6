//! The engines' sharding rules, one tensor at a time: which pipeline stage holds a tensor
//! and how much of it each tensor-parallel (or expert-parallel) rank holds.
//!
//! The rules are vLLM's (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py,
//! fused_moe/layer.py, models/llama.py, deepseek_v2.py, gpt_oss.py), name-based on the
//! Hugging Face tensor names, so an architecture weft does not know still gets a plan.

use std::borrow::Cow;

use crate::arch::{Arch, Family, Quant};
use crate::tensor::Tensor;

/// vLLM pads the vocabulary of embeddings and LM heads to a multiple of this
/// (`DEFAULT_VOCAB_PADDING_SIZE` in vocab_parallel_embedding.py).
pub const VOCAB_PADDING: u64 = 64;

/// Which pipeline stage holds a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The stage that holds this decoder layer.
    Layer(u64),
    /// The first stage (embeddings, vision encoders).
    First,
    /// The last stage (final norm, LM head).
    Last,
    /// Kept in host memory (llama.cpp's input embeddings).
    Host,
    /// Not loaded by the engine.
    Skip,
}

/// How a tensor is divided over the tensor-parallel ranks of its stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Split {
    /// Whole on every rank.
    Replicated,
    /// Dimension `dim` divided over TP ranks; the first `n % tp` ranks get one more row.
    Dim(usize),
    /// KV heads of `k_proj`/`v_proj`: each rank holds max(1, kv/tp) of `kv` heads.
    KvHeads { kv: u64 },
    /// A fused QKV projection: q heads/tp plus 2 x max(1, kv/tp) KV heads per rank.
    Qkv { heads: u64, kv: u64 },
    /// Vocab-parallel: dimension `dim` padded to a multiple of 64, then divided.
    Vocab(usize),
}

/// Which routed expert a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expert {
    /// Expert number `n` of its layer.
    One(u64),
    /// Every expert of the layer, fused along dimension 0.
    Fused,
}

/// A flag for the user: why a tensor is whole on every rank, or split unevenly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Replicated(Cow<'static, str>),
    Uneven(Cow<'static, str>),
}

/// Where a tensor lives, and what to tell the user about it.
#[derive(Debug, Clone)]
pub struct Placed {
    pub stage: Stage,
    /// The split over TP ranks (of a routed expert's tensor: without expert parallelism).
    pub split: Split,
    /// A routed expert's tensor: with expert parallelism it lives whole on the rank that
    /// holds its expert.
    pub expert: Option<Expert>,
    pub note: Option<Note>,
}

/// A Hugging Face tensor name taken apart: decoder layer, expert, module and parameter.
#[derive(Debug, Default)]
pub struct Name<'a> {
    pub layer: Option<u64>,
    pub expert: Option<u64>,
    pub fused_experts: bool,
    pub module: &'a str,
    pub param: &'a str,
    pub vision: bool,
    /// A multi-token-prediction module (`mtp.*`, Qwen3.5): not loaded without speculative
    /// decoding.
    pub mtp: bool,
}

pub fn parse_name(name: &str) -> Name<'_> {
    let mut n = Name::default();
    let mut prev = "";
    let mut first_part = "";
    for (index, p) in name.split('.').enumerate() {
        let num = if p.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            p.parse::<u64>().ok()
        } else {
            None
        };
        match (num, prev) {
            (Some(v), "layers" | "h" | "blocks" | "layer" | "blk") if n.layer.is_none() => {
                n.layer = Some(v)
            }
            (Some(v), "experts") => n.expert = Some(v),
            (None, "experts") => n.fused_experts = true,
            _ => {}
        }
        // `visual.*` or, in transformers 5 layouts, `model.visual.*`.
        if (index == 0 || (index == 1 && first_part == "model"))
            && matches!(
                p,
                "vision_tower" | "visual" | "vision_model" | "multi_modal_projector" | "vision"
            )
        {
            n.vision = true;
        }
        if index == 0 {
            first_part = p;
            n.mtp = p == "mtp";
        }
        n.module = prev;
        n.param = p;
        prev = p;
    }
    n
}

const COLUMN: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "gate_up_proj",
    "w1",
    "w3",
    "c_attn",
    "c_fc",
    "q_b_proj",
    "kv_b_proj",
    "query_key_value",
    "fc1",
    "dense_h_to_4h",
    // Gated DeltaNet (Qwen3-Next: qkvz and ba fused; Qwen3.5: four projections), and its
    // depthwise convolution, all ColumnParallelLinear in vLLM.
    "in_proj_qkvz",
    "in_proj_ba",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "conv1d",
];
const ROW: &[&str] = &[
    "o_proj",
    "down_proj",
    "w2",
    "c_proj",
    "dense_4h_to_h",
    "fc2",
    "out_proj",
    "dense",
];
/// GPT-2's Conv1D layers store weights as [in, out].
const CONV1D: &[&str] = &["c_attn", "c_fc", "c_proj"];
const QUANT_PACKED: &[&str] = &["qweight", "qzeros", "scales", "g_idx"];

fn is_norm(module: &str) -> bool {
    module.contains("norm") || module.starts_with("ln_") || module == "ln_f"
}

/// Places one tensor of a Hugging Face checkpoint under vLLM's rules. `tp` matters only
/// for the notes (nothing is "replicated" at tp = 1).
pub fn place_hf(t: &Tensor, arch: &Arch, tp: u64) -> Placed {
    let n = parse_name(&t.name);
    let rep = |why: &'static str| Placed {
        stage: Stage::First,
        split: Split::Replicated,
        expert: None,
        note: (tp > 1).then_some(Note::Replicated(Cow::Borrowed(why))),
    };
    let stage = match n.layer {
        _ if n.mtp => {
            return Placed {
                stage: Stage::Skip,
                split: Split::Replicated,
                expert: None,
                note: None,
            };
        }
        Some(l) if l >= arch.layers => {
            return Placed {
                stage: Stage::Skip,
                split: Split::Replicated,
                expert: None,
                note: None,
            };
        }
        Some(l) => Stage::Layer(l),
        None => Stage::First,
    };
    let at = |mut p: Placed| {
        if p.stage == Stage::First {
            p.stage = stage;
        }
        p
    };
    if n.vision {
        return rep("vision encoder: not modelled per rank, counted whole (an upper bound)");
    }
    let numel = t.numel();
    // Embeddings and the LM head.
    if n.layer.is_none() {
        match n.module {
            "embed_tokens" | "wte" | "tok_embeddings" | "word_embeddings" | "embeddings" => {
                return Placed {
                    stage: Stage::First,
                    split: Split::Vocab(0),
                    expert: None,
                    note: vocab_note(t, tp),
                };
            }
            "lm_head" | "output" => {
                return Placed {
                    stage: Stage::Last,
                    split: Split::Vocab(0),
                    expert: None,
                    note: vocab_note(t, tp),
                };
            }
            "wpe" => {
                return rep("position embeddings: vLLM's GPT-2 keeps wpe as a plain nn.Embedding");
            }
            m if is_norm(m) => {
                let mut p = rep("norms are not parallel layers in vLLM: whole on every rank");
                p.stage = Stage::Last;
                return p;
            }
            _ => {}
        }
    }
    if numel <= 1 || t.shape.is_empty() {
        return at(rep("a per-tensor scale: one number, whole on every rank"));
    }
    if is_norm(n.module) {
        return at(rep(
            "norms are not parallel layers in vLLM: whole on every rank",
        ));
    }
    // Routed experts.
    if n.expert.is_some() || n.fused_experts {
        let proj = n
            .param
            .trim_end_matches("_blocks")
            .trim_end_matches("_scales")
            .trim_end_matches("_bias");
        let module = if n.fused_experts && n.module == "experts" {
            proj
        } else {
            n.module
        };
        let is_bias = n.param == "bias" || n.param.ends_with("_bias");
        let inner = if n.fused_experts && n.module == "experts" {
            fused_expert_split(t, arch, module, is_bias)
        } else {
            linear_split(t, arch, module, n.param)
        };
        let (tp_split, note) = match inner {
            Some((s, note)) => (s, note),
            None => (
                Split::Replicated,
                Some(Note::Replicated(Cow::Owned(format!(
                    "expert tensor {module}.{}: no rule matched; counted whole",
                    n.param
                )))),
            ),
        };
        return at(Placed {
            stage: Stage::First,
            split: tp_split,
            expert: Some(match n.expert {
                Some(e) if !n.fused_experts => Expert::One(e),
                _ => Expert::Fused,
            }),
            note: if tp > 1 { note } else { None },
        });
    }
    // Routers and MLA's down-projections are ReplicatedLinear in vLLM.
    match n.module {
        "gate" | "router" | "shared_expert_gate" => {
            return at(rep(
                "MoE router: ReplicatedLinear in vLLM, whole on every rank",
            ));
        }
        "q_a_proj" | "kv_a_proj_with_mqa" => {
            return at(rep(
                "MLA down-projection: ReplicatedLinear in vLLM, the latent is computed on every TP rank",
            ));
        }
        _ => {}
    }
    // Gated DeltaNet's per-value-head parameters: sharded along the heads
    // (sharded_weight_loader(0) in vLLM's qwen3_next.py / qwen3_5_moe.py).
    if n.module == "linear_attn" && matches!(n.param, "A_log" | "dt_bias") {
        return at(Placed {
            stage: Stage::First,
            split: Split::Dim(0),
            expert: None,
            note: None,
        });
    }
    if n.param == "sinks" {
        return at(Placed {
            stage: Stage::First,
            split: Split::Dim(0),
            expert: None,
            note: None,
        });
    }
    match linear_split(t, arch, n.module, n.param) {
        Some((split, note)) => at(Placed {
            stage: Stage::First,
            split,
            expert: None,
            note: if tp > 1 { note } else { None },
        }),
        None => at(rep(
            "no sharding rule matched this name: counted whole on every rank (an upper bound)",
        )),
    }
}

fn vocab_note(t: &Tensor, tp: u64) -> Option<Note> {
    let v = t.shape.first().copied().unwrap_or(0);
    let padded = v.div_ceil(VOCAB_PADDING) * VOCAB_PADDING;
    if padded != v {
        Some(Note::Uneven(Cow::Owned(format!(
            "vocab {v} padded to {padded} (a multiple of {VOCAB_PADDING}) before the split over tp={tp}"
        ))))
    } else {
        None
    }
}

/// The split of a column- or row-parallel linear layer's parameter.
fn linear_split(
    t: &Tensor,
    arch: &Arch,
    module: &str,
    param: &str,
) -> Option<(Split, Option<Note>)> {
    let column = COLUMN.contains(&module);
    let row = ROW.contains(&module);
    if !column && !row {
        return None;
    }
    let transposed = CONV1D.contains(&module)
        || (arch.quant.transposed_weights() && QUANT_PACKED.contains(&param));
    let nd = t.shape.len();
    let (out_dim, in_dim) = if nd == 1 {
        // A bias, or GPTQ's g_idx (indexed by input channel).
        if param == "g_idx" {
            (None, Some(0))
        } else {
            (Some(0), None)
        }
    } else if transposed {
        (Some(nd - 1), Some(0))
    } else {
        (Some(0), Some(1))
    };
    if column {
        let Some(d) = out_dim else {
            return Some((
                Split::Replicated,
                Some(Note::Replicated(Cow::Borrowed(
                    "GPTQ g_idx of a column-parallel layer: indexed by input channel, whole on every rank",
                ))),
            ));
        };
        let split = match module {
            "k_proj" | "v_proj" if arch.mla.is_none() => Split::KvHeads { kv: arch.kv_heads },
            "qkv_proj" | "query_key_value" | "c_attn" => Split::Qkv {
                heads: arch.heads,
                kv: arch.kv_heads,
            },
            _ => Split::Dim(d),
        };
        return Some((split, None));
    }
    // Row-parallel.
    match in_dim {
        Some(d) if t.shape.get(d).copied().unwrap_or(1) > 1 => Some((Split::Dim(d), None)),
        _ => Some((
            Split::Replicated,
            Some(Note::Replicated(Cow::Borrowed(
                "row-parallel bias (or per-channel scale): added after the all-reduce, whole on every rank",
            ))),
        )),
    }
}

/// gpt-oss keeps all experts of a layer in one tensor: [E, out, ...] for `gate_up_proj`
/// (MXFP4 `_blocks`/`_scales`, or bf16 [E, hidden, 2I]) and [E, hidden, I/32, 16] for
/// `down_proj`. The TP split runs along the intermediate dimension, found by its size.
fn fused_expert_split(
    t: &Tensor,
    arch: &Arch,
    proj: &str,
    is_bias: bool,
) -> Option<(Split, Option<Note>)> {
    let i = arch.moe_intermediate;
    let column = matches!(proj, "gate_up_proj" | "gate_proj" | "up_proj");
    let row = proj == "down_proj";
    if !column && !row {
        return None;
    }
    if row && is_bias {
        return Some((
            Split::Replicated,
            Some(Note::Replicated(Cow::Borrowed(
                "row-parallel expert bias: added after the all-reduce, whole on every rank",
            ))),
        ));
    }
    let wanted: Vec<u64> = if column {
        vec![2 * i, i]
    } else {
        vec![i, i / 32, i / 16]
    };
    let dim = (1..t.shape.len()).find(|&d| wanted.contains(&t.shape[d]))?;
    Some((Split::Dim(dim), None))
}

/// The layer range [start, end) of pipeline stage `stage` of `pp`, as vLLM's
/// `get_pp_indices` computes it: L/pp layers each, the remainder given one each to the
/// stages before the last, counting back from the second-to-last.
pub fn pp_layers(layers: u64, pp: u64, stage: u64) -> (u64, u64) {
    let base = layers / pp;
    let rem = layers % pp;
    let mut parts = vec![base; pp as usize];
    for i in 2..rem + 2 {
        let idx = pp as i64 - i as i64;
        if idx >= 0 {
            parts[idx as usize] += 1;
        }
    }
    let start: u64 = parts[..stage as usize].iter().sum();
    (start, start + parts[stage as usize])
}

/// The experts an expert-parallel rank holds: [start, start + count), as vLLM's
/// `determine_expert_map` gives them (the first E % ep ranks get one more).
pub fn ep_experts(experts: u64, ep: u64, ep_rank: u64) -> (u64, u64) {
    let base = experts / ep;
    let rem = experts % ep;
    let count = base + u64::from(ep_rank < rem);
    let start = ep_rank * base + ep_rank.min(rem);
    (start, count)
}

/// The expert-parallel rank that holds expert `e` of `experts` over `ep` ranks (the
/// inverse of [`ep_experts`]).
pub fn ep_owner(experts: u64, ep: u64, e: u64) -> u64 {
    let base = experts / ep;
    let rem = experts % ep;
    let big = rem * (base + 1);
    if e < big {
        e / (base + 1)
    } else {
        // With more ranks than experts (base 0), experts past the first `rem` do not exist.
        (e - big).checked_div(base).map_or(ep, |q| rem + q)
    }
}

/// Bytes of a routed expert's tensor on expert-parallel rank `ep_rank` of `ep`.
pub fn ep_rank_bytes(
    t: &Tensor,
    bytes: u64,
    expert: Expert,
    experts: u64,
    ep: u64,
    ep_rank: u64,
) -> u64 {
    let (start, count) = ep_experts(experts, ep, ep_rank);
    match expert {
        Expert::One(e) => {
            if (start..start + count).contains(&e) {
                bytes
            } else {
                0
            }
        }
        Expert::Fused => {
            let n = t.shape.first().copied().unwrap_or(experts).max(1);
            (u128::from(bytes) * u128::from(count) / u128::from(n)) as u64
        }
    }
}

/// Whether every TP rank holds the same bytes of `t` under `split` (then one rank's
/// figure stands for all).
pub fn uniform(t: &Tensor, split: &Split, tp: u64) -> bool {
    match split {
        Split::Dim(d) => t.shape.get(*d).copied().unwrap_or(1).is_multiple_of(tp),
        _ => true,
    }
}

/// Bytes of `t` (loaded size `bytes`) that TP rank `tp_rank` of `tp` holds under `split`.
pub fn rank_bytes(t: &Tensor, bytes: u64, split: &Split, tp: u64, tp_rank: u64) -> u64 {
    let total = u128::from(bytes);
    let frac = |num: u64, den: u64| -> u64 {
        if den == 0 {
            return bytes;
        }
        (total * u128::from(num) / u128::from(den)) as u64
    };
    match split {
        Split::Replicated => bytes,
        Split::Dim(d) => {
            let n = t.shape.get(*d).copied().unwrap_or(1);
            let rows = n / tp + u64::from(tp_rank < n % tp);
            frac(rows, n)
        }
        Split::KvHeads { kv } => frac((kv / tp).max(1), *kv),
        Split::Qkv { heads, kv } => {
            let per = heads / tp + 2 * (kv / tp).max(1);
            frac(per, heads + 2 * kv)
        }
        Split::Vocab(d) => {
            let n = t.shape.get(*d).copied().unwrap_or(1);
            let padded = n.div_ceil(VOCAB_PADDING) * VOCAB_PADDING;
            frac(padded / tp, n)
        }
    }
}

/// Places one tensor of a GGUF file under llama.cpp's layer split: decoder layers go to
/// the device that holds them, the output layer to the last, and the input embeddings stay
/// in host memory (llama.cpp's `llama_model::load_tensors` keeps the input layer on the CPU).
pub fn place_gguf(t: &Tensor, arch: &Arch) -> Placed {
    let n = parse_name(&t.name);
    let stage = match n.layer {
        Some(l) if l < arch.layers => Stage::Layer(l),
        Some(_) => Stage::Skip,
        None if t.name.starts_with("token_embd") => Stage::Host,
        None if t.name.starts_with("output") => Stage::Last,
        None => Stage::First,
    };
    Placed {
        stage,
        split: Split::Replicated,
        expert: None,
        note: None,
    }
}

/// Whether an architecture's family is one whose rules weft knows.
pub fn known(arch: &Arch) -> bool {
    arch.family != Family::Unknown
}

/// The quantisation's group or block constraints on a TP split, as vLLM enforces them.
pub fn quant_rule(arch: &Arch, tp: u64) -> Result<(), (String, String)> {
    let check = |size: u64, what: &str, block: u64, rule: &str| -> Result<(), (String, String)> {
        if block == 0 || size == 0 {
            return Ok(());
        }
        let per = size / tp;
        if !per.is_multiple_of(block) {
            return Err((
                rule.to_string(),
                format!("{what} per rank = {size}/{tp} = {per} is not divisible by {block}"),
            ));
        }
        Ok(())
    };
    let inter = if arch.experts > 0 {
        arch.moe_intermediate
    } else {
        arch.intermediate
    };
    match &arch.quant {
        Quant::Gptq {
            group_size: Some(g),
            ..
        }
        | Quant::Awq {
            group_size: Some(g),
            ..
        } => check(
            inter,
            "intermediate_size (input of the row-parallel down_proj)",
            *g,
            "quantization group_size must divide the row-parallel input per rank",
        ),
        Quant::Fp8 {
            block: Some([n, k]),
        } => {
            check(
                inter,
                "intermediate_size (output of column-parallel gate/up)",
                *n,
                "fp8 weight_block_size block_n must divide the column-parallel output per rank",
            )?;
            check(
                inter,
                "intermediate_size (input of row-parallel down_proj)",
                *k,
                "fp8 weight_block_size block_k must divide the row-parallel input per rank",
            )
        }
        _ => Ok(()),
    }
}

/// Bytes a tensor takes once the engine has loaded it: unquantised weights and biases are
/// cast to the model's dtype (vLLM's `--dtype auto` loads a float32 checkpoint in 16 bits);
/// quantised data and scales stay as stored.
pub fn loaded_bytes(t: &Tensor, dtype_bytes: u64) -> u64 {
    let param = t.name.rsplit('.').next().unwrap_or("");
    let cast = t.dtype.is_wide_float()
        && (param == "weight" || param == "bias" || param == "sinks" || param.ends_with("_bias"));
    if cast {
        t.numel() * dtype_bytes
    } else {
        t.bytes
    }
}
