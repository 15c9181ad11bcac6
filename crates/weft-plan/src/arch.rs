//! What the planner needs to know about a model's architecture, read from its
//! `config.json` (Hugging Face) or its GGUF metadata.

use serde::Serialize;
use serde_json::Value;

use crate::PlanError;
use crate::tensor::GgufHeader;

/// The architecture families whose sharding rules weft knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Llama, Mistral, Qwen2/2.5/3 dense and their relatives: GQA attention, gated MLP.
    Llama,
    /// Qwen2-MoE, Qwen3-MoE: routed experts, optional shared expert.
    QwenMoe,
    Mixtral,
    /// DeepSeek V2/V3: multi-head latent attention, routed and shared experts.
    DeepseekMla,
    Gpt2,
    /// Gemma 2 and 3: interleaved sliding-window and global attention layers.
    Gemma,
    GptOss,
    /// Qwen3-Next and Qwen3.5: Gated DeltaNet linear-attention layers between full
    /// (gated) attention layers, routed experts with a shared expert, or dense.
    QwenHybrid,
    /// Not one weft knows: placement follows name rules only.
    Unknown,
}

/// How a layer's attention keeps its KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    Full,
    /// Attends to the last `window` tokens only.
    Sliding {
        window: u64,
    },
    /// Linear attention (Gated DeltaNet): a fixed recurrent state per sequence, no KV
    /// cache per token.
    Linear,
}

/// The Gated DeltaNet linear attention of Qwen3-Next and Qwen3.5 (`linear_*` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinearAttn {
    pub key_heads: u64,
    pub value_heads: u64,
    pub key_head_dim: u64,
    pub value_head_dim: u64,
    pub conv_kernel: u64,
}

/// Quantisation of a checkpoint, from `quantization_config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "method")]
pub enum Quant {
    None,
    Gptq {
        bits: u32,
        group_size: Option<u64>,
    },
    Awq {
        bits: u32,
        group_size: Option<u64>,
    },
    /// FP8 weights; `block` is `weight_block_size` [n, k] when the scales are per block.
    Fp8 {
        block: Option<[u64; 2]>,
    },
    /// NVIDIA ModelOpt NVFP4 (or FP8) checkpoints.
    Modelopt {
        algo: String,
    },
    Mxfp4,
    /// A GGUF file's mix of GGML types: llama.cpp's `general.file_type` name (`Q4_K_M`), or,
    /// without that key, the type that holds most of the weights (`mostly Q4_K`).
    Gguf {
        file_type: String,
    },
    Other {
        name: String,
    },
}

impl Quant {
    /// GPTQ and AWQ store linear weights transposed ([in, out]).
    pub fn transposed_weights(&self) -> bool {
        matches!(self, Quant::Gptq { .. } | Quant::Awq { .. })
    }
    pub fn label(&self) -> String {
        match self {
            Quant::None => "none".into(),
            Quant::Gptq { bits, .. } => format!("gptq int{bits}"),
            Quant::Awq { bits, .. } => format!("awq int{bits}"),
            Quant::Fp8 { block: Some(b) } => format!("fp8 blocks {}x{}", b[0], b[1]),
            Quant::Fp8 { block: None } => "fp8".into(),
            Quant::Modelopt { algo } => format!("modelopt {}", algo.to_lowercase()),
            Quant::Mxfp4 => "mxfp4".into(),
            Quant::Gguf { file_type } => format!("gguf {file_type}"),
            Quant::Other { name } => name.clone(),
        }
    }
}

/// Hyperparameters the planner uses. Built from a config, never guessed silently: what a
/// config lacks and weft must assume is listed in `assumed`.
#[derive(Debug, Clone, Serialize)]
pub struct Arch {
    /// The `architectures[0]` or GGUF `general.architecture` name.
    pub name: String,
    pub family: Family,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// Value head dim where it differs from `head_dim` (GGUF `value_length`).
    pub v_head_dim: u64,
    pub vocab: u64,
    pub tied: bool,
    pub intermediate: u64,
    pub experts: u64,
    pub experts_per_token: u64,
    pub moe_intermediate: u64,
    /// MLA: (kv_lora_rank, qk_rope_head_dim).
    pub mla: Option<(u64, u64)>,
    /// Gated DeltaNet layers' shape, for hybrid models.
    pub linear: Option<LinearAttn>,
    pub layer_kinds: Vec<LayerKind>,
    pub max_position: u64,
    /// Bytes per element of the unquantised weights and of an `auto` KV cache.
    pub dtype_bytes: u64,
    pub quant: Quant,
    pub assumed: Vec<String>,
}

fn get_u64(c: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| c.get(*k).and_then(Value::as_u64))
}

fn dtype_bytes(s: &str) -> Option<u64> {
    match s {
        "bfloat16" | "float16" | "half" | "bf16" | "fp16" => Some(2),
        "float32" | "float" | "fp32" => Some(4),
        _ => None,
    }
}

/// Reads an `Arch` from a Hugging Face `config.json`.
pub fn from_config(config: &Value) -> Result<Arch, PlanError> {
    let top = config;
    // Multimodal models (Gemma 3, Qwen-VL) keep the language model under `text_config`.
    let text = config.get("text_config").filter(|v| v.is_object());
    let c = text.unwrap_or(config);
    let field = |keys: &[&str]| get_u64(c, keys).or_else(|| get_u64(top, keys));
    let name = top
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| top.get("model_type").and_then(Value::as_str))
        .unwrap_or("unknown")
        .to_string();
    let model_type = c
        .get("model_type")
        .or_else(|| top.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let family = family_of(&name, model_type);
    let missing = |what: &str| PlanError::Config {
        field: what.to_string(),
        why: "missing or not a number".to_string(),
    };
    let mut assumed = Vec::new();
    let hidden =
        field(&["hidden_size", "n_embd", "d_model"]).ok_or_else(|| missing("hidden_size"))?;
    let layers = field(&["num_hidden_layers", "n_layer", "num_layers"])
        .ok_or_else(|| missing("num_hidden_layers"))?;
    let heads =
        field(&["num_attention_heads", "n_head"]).ok_or_else(|| missing("num_attention_heads"))?;
    if heads == 0 || layers == 0 || hidden == 0 {
        return Err(PlanError::Config {
            field: "num_attention_heads/num_hidden_layers/hidden_size".into(),
            why: "must be positive".into(),
        });
    }
    let kv_heads = match field(&["num_key_value_heads", "multi_query_group_num"]) {
        Some(k) if k > 0 => k,
        _ => {
            if family != Family::Gpt2 && family != Family::DeepseekMla {
                assumed.push(format!(
                    "num_key_value_heads absent: {heads} (one KV head per attention head)"
                ));
            }
            heads
        }
    };
    let head_dim = field(&["head_dim"]).unwrap_or(hidden / heads);
    let vocab = field(&["vocab_size"]).ok_or_else(|| missing("vocab_size"))?;
    let tied = c
        .get("tie_word_embeddings")
        .or_else(|| top.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(matches!(family, Family::Gpt2 | Family::Gemma));
    let intermediate = field(&["intermediate_size", "n_inner"]).unwrap_or(4 * hidden);
    let experts = field(&["num_experts", "num_local_experts", "n_routed_experts"]).unwrap_or(0);
    let experts_per_token =
        field(&["num_experts_per_tok", "experts_per_token", "moe_topk"]).unwrap_or(0);
    let moe_intermediate = field(&["moe_intermediate_size"]).unwrap_or(intermediate);
    let mla = match (field(&["kv_lora_rank"]), field(&["qk_rope_head_dim"])) {
        (Some(r), Some(p)) => Some((r, p)),
        _ => None,
    };
    let max_position = field(&["max_position_embeddings", "n_positions", "max_seq_len"])
        .unwrap_or_else(|| {
            assumed.push("max_position_embeddings absent: 4096".into());
            4096
        });
    let dt = c
        .get("torch_dtype")
        .or_else(|| c.get("dtype"))
        .or_else(|| top.get("torch_dtype"))
        .or_else(|| top.get("dtype"))
        .and_then(Value::as_str);
    let dtype_bytes = match dt.and_then(dtype_bytes) {
        Some(4) => {
            assumed
                .push("torch_dtype float32: loaded in 16 bits, as vLLM's --dtype auto does".into());
            2
        }
        Some(b) => b,
        None => {
            assumed.push(format!(
                "torch_dtype {}: loaded in 16 bits, 2 bytes per element",
                dt.unwrap_or("absent")
            ));
            2
        }
    };
    let quant = quant_of(
        top.get("quantization_config")
            .or_else(|| c.get("quantization_config")),
    );
    let layer_kinds = layer_kinds(c, family, layers)?;
    let linear = match (
        field(&["linear_num_key_heads"]),
        field(&["linear_num_value_heads"]),
    ) {
        (Some(k), Some(v)) if k > 0 && v > 0 => Some(LinearAttn {
            key_heads: k,
            value_heads: v,
            key_head_dim: field(&["linear_key_head_dim"]).unwrap_or(128),
            value_head_dim: field(&["linear_value_head_dim"]).unwrap_or(128),
            conv_kernel: field(&["linear_conv_kernel_dim"]).unwrap_or(4),
        }),
        _ => None,
    };
    Ok(Arch {
        name,
        family,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        v_head_dim: head_dim,
        vocab,
        tied,
        intermediate,
        experts,
        experts_per_token,
        moe_intermediate,
        mla,
        linear,
        layer_kinds,
        max_position,
        dtype_bytes,
        quant,
        assumed,
    })
}

fn family_of(name: &str, model_type: &str) -> Family {
    let n = name.to_ascii_lowercase();
    let t = model_type.to_ascii_lowercase();
    let is = |s: &str| n.starts_with(s) || t == s || t.starts_with(s);
    if is("deepseekv2") || is("deepseekv3") || t == "deepseek_v2" || t == "deepseek_v3" {
        Family::DeepseekMla
    } else if n.starts_with("qwen3_5")
        || n.starts_with("qwen3next")
        || t.starts_with("qwen3_5")
        || t.starts_with("qwen3_next")
    {
        Family::QwenHybrid
    } else if is("gptoss") || t == "gpt_oss" {
        Family::GptOss
    } else if is("mixtral") {
        Family::Mixtral
    } else if is("qwen2moe")
        || is("qwen3moe")
        || t == "qwen2_moe"
        || t == "qwen3_moe"
        // Qwen3-VL-MoE: the language model is Qwen3-MoE (`qwen3_vl_moe_text`).
        || n.starts_with("qwen3vlmoe")
        || t.starts_with("qwen3_vl_moe")
    {
        Family::QwenMoe
    } else if is("gemma2") || is("gemma3") || t.starts_with("gemma2") || t.starts_with("gemma3") {
        Family::Gemma
    } else if is("gpt2") {
        Family::Gpt2
    } else if is("llama")
        || is("mistral")
        || t == "qwen2"
        || t == "qwen3"
        || n == "qwen2forcausallm"
        || n == "qwen3forcausallm"
        // Qwen2-VL, Qwen2.5-VL and Qwen3-VL: a vision encoder beside a Qwen2/Qwen3 dense
        // language model (`text_config`, model_type `qwen3_vl_text`).
        || n.starts_with("qwen2vl")
        || n.starts_with("qwen2_5_vl")
        || n.starts_with("qwen3vl")
        || t.starts_with("qwen2_vl")
        || t.starts_with("qwen2_5_vl")
        || t.starts_with("qwen3_vl")
    {
        Family::Llama
    } else {
        Family::Unknown
    }
}

fn layer_kinds(c: &Value, family: Family, layers: u64) -> Result<Vec<LayerKind>, PlanError> {
    let window = c.get("sliding_window").and_then(Value::as_u64);
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        if types.len() as u64 != layers {
            return Err(PlanError::Config {
                field: "layer_types".into(),
                why: format!("{} entries for {layers} layers", types.len()),
            });
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerKind::Full),
                Some("linear_attention") => Ok(LayerKind::Linear),
                Some("sliding_attention") => match window {
                    Some(w) => Ok(LayerKind::Sliding { window: w }),
                    None => Err(PlanError::Config {
                        field: "sliding_window".into(),
                        why: "layer_types names sliding_attention but no window is set".into(),
                    }),
                },
                other => Err(PlanError::Config {
                    field: "layer_types".into(),
                    why: format!(
                        "{other:?}: weft knows full_attention, sliding_attention and linear_attention"
                    ),
                }),
            })
            .collect();
    }
    let name = c.get("model_type").and_then(Value::as_str).unwrap_or("");
    // Qwen3-Next / Qwen3.5 without layer_types: every `full_attention_interval`-th layer is
    // full attention, the others Gated DeltaNet (transformers' Qwen3NextConfig default).
    if family == Family::QwenHybrid {
        let every = c
            .get("full_attention_interval")
            .and_then(Value::as_u64)
            .unwrap_or(4)
            .max(1);
        return Ok((0..layers)
            .map(|i| {
                if (i + 1) % every == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Linear
                }
            })
            .collect());
    }
    Ok((0..layers)
        .map(|i| match (family, window) {
            // Gemma 2: even layers slide (transformers' Gemma2 `is_sliding = not layer_idx % 2`).
            (Family::Gemma, Some(w)) if name.starts_with("gemma2") => {
                if i % 2 == 0 {
                    LayerKind::Sliding { window: w }
                } else {
                    LayerKind::Full
                }
            }
            // Gemma 3: every `sliding_window_pattern`-th layer is global (default 6).
            (Family::Gemma, Some(w)) => {
                let p = c
                    .get("sliding_window_pattern")
                    .and_then(Value::as_u64)
                    .unwrap_or(6)
                    .max(1);
                if (i + 1) % p == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding { window: w }
                }
            }
            (_, Some(w))
                if name == "mistral"
                    || c.get("use_sliding_window").and_then(Value::as_bool) == Some(true) =>
            {
                LayerKind::Sliding { window: w }
            }
            _ => LayerKind::Full,
        })
        .collect())
}

fn quant_of(q: Option<&Value>) -> Quant {
    let Some(q) = q else { return Quant::None };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase();
    let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(4) as u32;
    let group = q
        .get("group_size")
        .and_then(Value::as_i64)
        .and_then(|g| u64::try_from(g).ok());
    match method.as_str() {
        "gptq" => Quant::Gptq {
            bits,
            group_size: group,
        },
        "awq" => Quant::Awq {
            bits,
            group_size: group,
        },
        "fp8" => Quant::Fp8 {
            block: q
                .get("weight_block_size")
                .and_then(Value::as_array)
                .and_then(|a| Some([a.first()?.as_u64()?, a.get(1)?.as_u64()?])),
        },
        "modelopt" => Quant::Modelopt {
            algo: q
                .get("quant_algo")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
        },
        "mxfp4" => Quant::Mxfp4,
        "" => Quant::None,
        other => Quant::Other {
            name: other.to_string(),
        },
    }
}

/// llama.cpp's `llama_ftype` names by value (llama.h; 4-6 and 33-35 are removed types).
const LLAMA_FTYPES: &[(u64, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
];

/// The quantisation a GGUF file declares (`general.file_type`), or else the GGML type of
/// most of its matrix bytes. A file of F16/BF16/F32 matrices is unquantised.
fn gguf_quant(h: &GgufHeader) -> Quant {
    let declared = h
        .get_u64("general.file_type")
        .and_then(|v| LLAMA_FTYPES.iter().find(|(n, _)| *n == v))
        .map(|(_, name)| name.to_string());
    let file_type = match declared {
        Some(name) => name,
        None => {
            let mut by_type: Vec<(String, u64)> = Vec::new();
            for t in h.tensors.iter().filter(|t| t.shape.len() >= 2) {
                let name = t.dtype.name().to_string();
                match by_type.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, b)) => *b += t.bytes,
                    None => by_type.push((name, t.bytes)),
                }
            }
            match by_type.into_iter().max_by_key(|(_, b)| *b) {
                Some((name, _)) => format!("mostly {name}"),
                None => return Quant::None,
            }
        }
    };
    if matches!(
        file_type.as_str(),
        "F32" | "F16" | "BF16" | "mostly F32" | "mostly F16" | "mostly BF16"
    ) {
        return Quant::None;
    }
    Quant::Gguf { file_type }
}

/// Reads an `Arch` from GGUF metadata (`general.architecture` and `{arch}.*` keys).
pub fn from_gguf(h: &GgufHeader) -> Result<Arch, PlanError> {
    let arch = h
        .get_str("general.architecture")
        .ok_or_else(|| PlanError::Config {
            field: "general.architecture".into(),
            why: "missing from the GGUF metadata".into(),
        })?
        .to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| {
        h.get_u64(&key(k)).ok_or_else(|| PlanError::Config {
            field: key(k),
            why: "missing from the GGUF metadata".into(),
        })
    };
    let hidden = need("embedding_length")?;
    let layers = need("block_count")?;
    let heads = need("attention.head_count")?;
    let kv_heads = h.get_u64(&key("attention.head_count_kv")).unwrap_or(heads);
    let head_dim = h
        .get_u64(&key("attention.key_length"))
        .unwrap_or(hidden / heads.max(1));
    let v_head_dim = h
        .get_u64(&key("attention.value_length"))
        .unwrap_or(head_dim);
    let vocab = h
        .get_u64(&key("vocab_size"))
        .or_else(|| match h.get("tokenizer.ggml.tokens") {
            Some(crate::tensor::GgufValue::Array(_, n)) => Some(*n),
            _ => None,
        })
        .or_else(|| {
            h.tensors
                .iter()
                .find(|t| t.name == "token_embd.weight")
                .and_then(|t| t.shape.first().copied())
        })
        .unwrap_or(0);
    let tied = !h.tensors.iter().any(|t| t.name == "output.weight");
    let window = h.get_u64(&key("attention.sliding_window"));
    let family = match arch.as_str() {
        "llama" | "qwen2" | "qwen3" | "mistral" => Family::Llama,
        "qwen2moe" | "qwen3moe" => Family::QwenMoe,
        "deepseek2" => Family::DeepseekMla,
        "gpt2" => Family::Gpt2,
        "gemma2" | "gemma3" => Family::Gemma,
        "gpt-oss" | "gptoss" => Family::GptOss,
        _ => Family::Unknown,
    };
    let layer_kinds = (0..layers)
        .map(|i| match (arch.as_str(), window) {
            ("gemma2", Some(w)) if i % 2 == 0 => LayerKind::Sliding { window: w },
            ("gemma3", Some(w)) if (i + 1) % 6 != 0 => LayerKind::Sliding { window: w },
            ("gpt-oss", Some(w)) if i % 2 == 0 => LayerKind::Sliding { window: w },
            _ => LayerKind::Full,
        })
        .collect();
    let mla = match (
        h.get_u64(&key("attention.kv_lora_rank")),
        h.get_u64(&key("rope.dimension_count")),
    ) {
        (Some(r), Some(p)) if family == Family::DeepseekMla => Some((r, p)),
        _ => None,
    };
    Ok(Arch {
        name: arch.clone(),
        family,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        v_head_dim,
        vocab,
        tied,
        intermediate: h.get_u64(&key("feed_forward_length")).unwrap_or(4 * hidden),
        experts: h.get_u64(&key("expert_count")).unwrap_or(0),
        experts_per_token: h.get_u64(&key("expert_used_count")).unwrap_or(0),
        moe_intermediate: h.get_u64(&key("expert_feed_forward_length")).unwrap_or(0),
        mla,
        linear: None,
        layer_kinds,
        max_position: h.get_u64(&key("context_length")).unwrap_or(4096),
        dtype_bytes: 2,
        quant: gguf_quant(h),
        assumed: Vec::new(),
    })
}
