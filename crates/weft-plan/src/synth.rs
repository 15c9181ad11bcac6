//! Header-only checkpoints: the tensor names, shapes and dtypes a real checkpoint of an
//! architecture holds (as its Hugging Face implementation names them), written as
//! safetensors headers with no data. For tests, benchmarks, the demo and the engine
//! comparison script; never for planning a real model (that reads the real headers).

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use crate::PlanError;
use crate::arch::{Arch, Family, LayerKind, Quant};
use crate::tensor::{Dtype, Tensor, ggml_type, ggml_type_id};

fn u(c: &Value, k: &str) -> Option<u64> {
    c.get("text_config")
        .and_then(|t| t.get(k))
        .and_then(Value::as_u64)
        .or_else(|| c.get(k).and_then(Value::as_u64))
}

fn b(c: &Value, k: &str) -> Option<bool> {
    c.get("text_config")
        .and_then(|t| t.get(k))
        .and_then(Value::as_bool)
        .or_else(|| c.get(k).and_then(Value::as_bool))
}

struct Gen<'a> {
    arch: &'a Arch,
    out: Vec<Tensor>,
    wide: Dtype,
}

impl Gen<'_> {
    fn push(&mut self, name: String, dtype: Dtype, shape: Vec<u64>) {
        self.out.push(Tensor::new(name, dtype, shape));
    }
    fn wide(&mut self, name: String, shape: Vec<u64>) {
        let d = self.wide.clone();
        self.push(name, d, shape);
    }
    /// A linear layer [out, in] stored as the checkpoint's quantisation stores it.
    fn linear(&mut self, prefix: &str, out: u64, inp: u64, quantised: bool) {
        let q = if quantised {
            self.arch.quant.clone()
        } else {
            Quant::None
        };
        match q {
            // GPTQ and AWQ name the same tensors but pack qweight along other axes (GPTQ the
            // input, AWQ the output), and only GPTQ has g_idx: each arm is its format's layout.
            Quant::Gptq { bits, group_size } => {
                let g = group_size.unwrap_or(inp);
                let bits = u64::from(bits);
                self.push(
                    format!("{prefix}.qweight"),
                    Dtype::I32,
                    vec![inp * bits / 32, out],
                );
                self.push(
                    format!("{prefix}.qzeros"),
                    Dtype::I32,
                    vec![inp.div_ceil(g), out * bits / 32],
                );
                self.push(
                    format!("{prefix}.scales"),
                    Dtype::F16,
                    vec![inp.div_ceil(g), out],
                );
                self.push(format!("{prefix}.g_idx"), Dtype::I32, vec![inp]);
            }
            Quant::Awq { bits, group_size } => {
                let g = group_size.unwrap_or(inp);
                let bits = u64::from(bits);
                self.push(
                    format!("{prefix}.qweight"),
                    Dtype::I32,
                    vec![inp, out * bits / 32],
                );
                self.push(
                    format!("{prefix}.qzeros"),
                    Dtype::I32,
                    vec![inp.div_ceil(g), out * bits / 32],
                );
                self.push(
                    format!("{prefix}.scales"),
                    Dtype::F16,
                    vec![inp.div_ceil(g), out],
                );
            }
            Quant::Fp8 { block } => {
                self.push(format!("{prefix}.weight"), Dtype::F8E4M3, vec![out, inp]);
                match block {
                    Some([bn, bk]) => self.push(
                        format!("{prefix}.weight_scale_inv"),
                        Dtype::F32,
                        vec![out.div_ceil(bn), inp.div_ceil(bk)],
                    ),
                    None => self.push(format!("{prefix}.weight_scale"), Dtype::F32, vec![]),
                }
            }
            Quant::Modelopt { .. } => {
                self.push(format!("{prefix}.weight"), Dtype::U8, vec![out, inp / 2]);
                self.push(
                    format!("{prefix}.weight_scale"),
                    Dtype::F8E4M3,
                    vec![out, inp / 16],
                );
                self.push(format!("{prefix}.weight_scale_2"), Dtype::F32, vec![]);
                self.push(format!("{prefix}.input_scale"), Dtype::F32, vec![]);
            }
            _ => self.wide(format!("{prefix}.weight"), vec![out, inp]),
        }
    }
    fn mlp(&mut self, p: &str, inter: u64, quantised: bool) {
        let h = self.arch.hidden;
        self.linear(&format!("{p}.gate_proj"), inter, h, quantised);
        self.linear(&format!("{p}.up_proj"), inter, h, quantised);
        self.linear(&format!("{p}.down_proj"), h, inter, quantised);
    }
}

/// The tensors of a checkpoint of this architecture, from its config.
pub fn tensors(arch: &Arch, config: &Value) -> Result<Vec<Tensor>, PlanError> {
    let wide = if arch.dtype_bytes == 4 {
        Dtype::F32
    } else if config
        .get("torch_dtype")
        .and_then(Value::as_str)
        .is_some_and(|s| s == "float16")
    {
        Dtype::F16
    } else {
        Dtype::Bf16
    };
    let mut g = Gen {
        arch,
        out: Vec::new(),
        wide,
    };
    let h = arch.hidden;
    let v = arch.vocab;
    let hd = arch.head_dim;
    let quantised = !matches!(arch.quant, Quant::None | Quant::Mxfp4);
    if arch.family == Family::Gpt2 {
        g.wide("wte.weight".into(), vec![v, h]);
        g.wide("wpe.weight".into(), vec![arch.max_position, h]);
        for l in 0..arch.layers {
            let p = format!("h.{l}");
            for n in ["ln_1", "ln_2"] {
                g.wide(format!("{p}.{n}.weight"), vec![h]);
                g.wide(format!("{p}.{n}.bias"), vec![h]);
            }
            for (m, i, o) in [
                ("attn.c_attn", h, 3 * h),
                ("attn.c_proj", h, h),
                ("mlp.c_fc", h, arch.intermediate),
                ("mlp.c_proj", arch.intermediate, h),
            ] {
                g.wide(format!("{p}.{m}.weight"), vec![i, o]);
                g.wide(format!("{p}.{m}.bias"), vec![o]);
            }
        }
        g.wide("ln_f.weight".into(), vec![h]);
        g.wide("ln_f.bias".into(), vec![h]);
        return Ok(g.out);
    }
    let multimodal = config.get("text_config").is_some();
    // Qwen3.5 checkpoints (transformers 5) keep the text model under model.language_model
    // and the LM head at the top; older multimodal ones under language_model.model.
    let hybrid = arch.family == Family::QwenHybrid;
    let root = if multimodal && hybrid {
        "model.language_model"
    } else if multimodal {
        "language_model.model"
    } else {
        "model"
    };
    g.wide(format!("{root}.embed_tokens.weight"), vec![v, h]);
    let mtp = u(config, "num_nextn_predict_layers").unwrap_or(0);
    let dense_layers = u(config, "first_k_dense_replace").unwrap_or(0);
    let qkv_bias = b(config, "attention_bias").unwrap_or(false)
        || config
            .get("model_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t == "qwen2" || t == "qwen2_moe");
    let mlp_only: Vec<u64> = config
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    for l in 0..arch.layers + mtp {
        let p = format!("{root}.layers.{l}");
        g.wide(format!("{p}.input_layernorm.weight"), vec![h]);
        g.wide(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        if arch.family == Family::Gemma {
            g.wide(format!("{p}.pre_feedforward_layernorm.weight"), vec![h]);
            g.wide(format!("{p}.post_feedforward_layernorm.weight"), vec![h]);
        }
        // Attention.
        let kind = arch.layer_kinds.get(l as usize).copied();
        if let (Some(la), Some(LayerKind::Linear)) = (arch.linear, kind) {
            // Qwen3.5's Gated DeltaNet: four input projections, a depthwise convolution
            // over q, k and v, per-value-head decay and bias, a gated norm, out_proj.
            let a = format!("{p}.linear_attn");
            let key_dim = la.key_heads * la.key_head_dim;
            let value_dim = la.value_heads * la.value_head_dim;
            let conv_dim = 2 * key_dim + value_dim;
            g.linear(&format!("{a}.in_proj_qkv"), conv_dim, h, quantised);
            g.linear(&format!("{a}.in_proj_z"), value_dim, h, quantised);
            g.linear(&format!("{a}.in_proj_b"), la.value_heads, h, quantised);
            g.linear(&format!("{a}.in_proj_a"), la.value_heads, h, quantised);
            g.wide(
                format!("{a}.conv1d.weight"),
                vec![conv_dim, 1, la.conv_kernel],
            );
            g.push(format!("{a}.A_log"), Dtype::F32, vec![la.value_heads]);
            g.wide(format!("{a}.dt_bias"), vec![la.value_heads]);
            g.wide(format!("{a}.norm.weight"), vec![la.value_head_dim]);
            g.linear(&format!("{a}.out_proj"), h, value_dim, quantised);
        } else if let Some((kv_lora, rope)) = arch.mla {
            let nope = u(config, "qk_nope_head_dim").unwrap_or(128);
            let vh = u(config, "v_head_dim").unwrap_or(128);
            let a = format!("{p}.self_attn");
            match u(config, "q_lora_rank") {
                Some(ql) => {
                    g.linear(&format!("{a}.q_a_proj"), ql, h, quantised);
                    g.wide(format!("{a}.q_a_layernorm.weight"), vec![ql]);
                    g.linear(
                        &format!("{a}.q_b_proj"),
                        arch.heads * (nope + rope),
                        ql,
                        quantised,
                    );
                }
                None => g.linear(
                    &format!("{a}.q_proj"),
                    arch.heads * (nope + rope),
                    h,
                    quantised,
                ),
            }
            g.linear(
                &format!("{a}.kv_a_proj_with_mqa"),
                kv_lora + rope,
                h,
                quantised,
            );
            g.wide(format!("{a}.kv_a_layernorm.weight"), vec![kv_lora]);
            g.linear(
                &format!("{a}.kv_b_proj"),
                arch.heads * (nope + vh),
                kv_lora,
                quantised,
            );
            g.linear(&format!("{a}.o_proj"), h, arch.heads * vh, quantised);
        } else {
            let a = format!("{p}.self_attn");
            // Qwen3-Next / Qwen3.5's gated attention: q_proj also yields the output gate.
            let q_out = if b(config, "attn_output_gate").unwrap_or(hybrid) {
                2 * arch.heads * hd
            } else {
                arch.heads * hd
            };
            g.linear(&format!("{a}.q_proj"), q_out, h, quantised);
            g.linear(&format!("{a}.k_proj"), arch.kv_heads * hd, h, quantised);
            g.linear(&format!("{a}.v_proj"), arch.kv_heads * hd, h, quantised);
            g.linear(&format!("{a}.o_proj"), h, arch.heads * hd, quantised);
            if qkv_bias {
                g.wide(format!("{a}.q_proj.bias"), vec![arch.heads * hd]);
                g.wide(format!("{a}.k_proj.bias"), vec![arch.kv_heads * hd]);
                g.wide(format!("{a}.v_proj.bias"), vec![arch.kv_heads * hd]);
            }
            if arch.family == Family::GptOss {
                g.wide(format!("{a}.o_proj.bias"), vec![h]);
                g.wide(format!("{a}.sinks"), vec![arch.heads]);
            }
            let qk_norm = config
                .get("model_type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.starts_with("qwen3") || t.starts_with("gemma3"));
            if qk_norm {
                g.wide(format!("{a}.q_norm.weight"), vec![hd]);
                g.wide(format!("{a}.k_norm.weight"), vec![hd]);
            }
        }
        // Feed-forward.
        let e = arch.experts;
        let mi = arch.moe_intermediate;
        let moe = e > 0 && l >= dense_layers && !mlp_only.contains(&l);
        match arch.family {
            Family::GptOss => {
                let m = format!("{p}.mlp");
                g.wide(format!("{m}.router.weight"), vec![e, h]);
                g.wide(format!("{m}.router.bias"), vec![e]);
                let x = format!("{m}.experts");
                g.push(
                    format!("{x}.gate_up_proj_blocks"),
                    Dtype::U8,
                    vec![e, 2 * mi, h / 32, 16],
                );
                g.push(
                    format!("{x}.gate_up_proj_scales"),
                    Dtype::U8,
                    vec![e, 2 * mi, h / 32],
                );
                g.wide(format!("{x}.gate_up_proj_bias"), vec![e, 2 * mi]);
                g.push(
                    format!("{x}.down_proj_blocks"),
                    Dtype::U8,
                    vec![e, h, mi / 32, 16],
                );
                g.push(
                    format!("{x}.down_proj_scales"),
                    Dtype::U8,
                    vec![e, h, mi / 32],
                );
                g.wide(format!("{x}.down_proj_bias"), vec![e, h]);
            }
            Family::Mixtral => {
                let m = format!("{p}.block_sparse_moe");
                g.wide(format!("{m}.gate.weight"), vec![e, h]);
                for x in 0..e {
                    let q = format!("{m}.experts.{x}");
                    g.linear(&format!("{q}.w1"), arch.intermediate, h, quantised);
                    g.linear(&format!("{q}.w2"), h, arch.intermediate, quantised);
                    g.linear(&format!("{q}.w3"), arch.intermediate, h, quantised);
                }
            }
            _ if moe => {
                let m = format!("{p}.mlp");
                g.wide(format!("{m}.gate.weight"), vec![e, h]);
                if arch.family == Family::DeepseekMla
                    && config.get("topk_method").and_then(Value::as_str) == Some("noaux_tc")
                {
                    g.push(
                        format!("{m}.gate.e_score_correction_bias"),
                        Dtype::F32,
                        vec![e],
                    );
                }
                for x in 0..e {
                    g.mlp(&format!("{m}.experts.{x}"), mi, quantised);
                }
                if let Some(n) = u(config, "n_shared_experts").filter(|n| *n > 0) {
                    g.mlp(&format!("{m}.shared_experts"), mi * n, quantised);
                }
                if let Some(si) = u(config, "shared_expert_intermediate_size").filter(|n| *n > 0) {
                    g.mlp(&format!("{m}.shared_expert"), si, quantised);
                    g.wide(format!("{m}.shared_expert_gate.weight"), vec![1, h]);
                }
            }
            _ => g.mlp(&format!("{p}.mlp"), arch.intermediate, quantised),
        }
        if l >= arch.layers {
            // DeepSeek V3's multi-token-prediction module.
            g.wide(format!("{p}.enorm.weight"), vec![h]);
            g.wide(format!("{p}.hnorm.weight"), vec![h]);
            g.wide(format!("{p}.eh_proj.weight"), vec![h, 2 * h]);
            g.wide(format!("{p}.shared_head.norm.weight"), vec![h]);
            g.wide(format!("{p}.shared_head.head.weight"), vec![v, h]);
        }
    }
    g.wide(format!("{root}.norm.weight"), vec![h]);
    if !arch.tied {
        let head = if multimodal && !hybrid {
            "language_model.lm_head.weight"
        } else {
            "lm_head.weight"
        };
        g.wide(head.into(), vec![v, h]);
    }
    Ok(g.out)
}

/// The bytes of a header-only safetensors file: 8-byte length, JSON header padded with
/// spaces to a multiple of 8, no data.
pub fn safetensors_bytes(tensors: &[Tensor]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0u64;
    for t in tensors {
        map.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [off, off + t.bytes]}),
        );
        off += t.bytes;
    }
    let mut header = serde_json::to_vec(&Value::Object(map)).unwrap_or_default();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out
}

fn io_err(path: &Path, e: std::io::Error) -> PlanError {
    PlanError::Source {
        what: path.display().to_string(),
        why: e.to_string(),
    }
}

/// Writes a header-only checkpoint into `dir`: `config.json`, and one
/// `model.safetensors` or `shards` files `model-0000N-of-0000M.safetensors` with a
/// `model.safetensors.index.json`.
pub fn write_checkpoint(
    dir: &Path,
    config: &Value,
    tensors: &[Tensor],
    shards: usize,
) -> Result<(), PlanError> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, serde_json::to_vec_pretty(config).unwrap_or_default())
        .map_err(|e| io_err(&cfg, e))?;
    if shards <= 1 {
        let p = dir.join("model.safetensors");
        return std::fs::write(&p, safetensors_bytes(tensors)).map_err(|e| io_err(&p, e));
    }
    let per = tensors.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in tensors.chunks(per.max(1)).enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards);
        for t in chunk {
            weight_map.insert(t.name.clone(), Value::String(name.clone()));
        }
        let p = dir.join(&name);
        std::fs::write(&p, safetensors_bytes(chunk)).map_err(|e| io_err(&p, e))?;
    }
    let total: u64 = tensors.iter().map(|t| t.bytes).sum();
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let p = dir.join("model.safetensors.index.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&index).unwrap_or_default())
        .map_err(|e| io_err(&p, e))
}

/// A GGUF metadata value for [`gguf_bytes`].
pub enum Meta<'a> {
    U32(u32),
    Str(&'a str),
}

/// The header of a GGUF v3 file (no tensor data): `tensors` are (name, GGML type name,
/// shape outermost first).
pub fn gguf_bytes(
    meta: &[(&str, Meta)],
    tensors: &[(&str, &str, Vec<u64>)],
) -> Result<Vec<u8>, PlanError> {
    let mut o = Vec::new();
    let s = |o: &mut Vec<u8>, v: &str| {
        o.extend((v.len() as u64).to_le_bytes());
        o.extend(v.as_bytes());
    };
    o.extend(b"GGUF");
    o.extend(3u32.to_le_bytes());
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        s(&mut o, k);
        match v {
            Meta::U32(x) => {
                o.extend(4u32.to_le_bytes());
                o.extend(x.to_le_bytes());
            }
            Meta::Str(x) => {
                o.extend(8u32.to_le_bytes());
                s(&mut o, x);
            }
        }
    }
    let mut off = 0u64;
    for (name, ty, shape) in tensors {
        let id = ggml_type_id(ty).ok_or_else(|| PlanError::Header {
            what: (*name).to_string(),
            why: format!("GGML type {ty} unknown"),
        })?;
        s(&mut o, name);
        o.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            o.extend(d.to_le_bytes());
        }
        o.extend(id.to_le_bytes());
        o.extend(off.to_le_bytes());
        let dt = ggml_type(id).unwrap_or(Dtype::U8);
        off += dt
            .bytes_for(shape.iter().product())
            .unwrap_or(0)
            .div_ceil(32)
            * 32;
    }
    let _ = o.flush();
    Ok(o)
}
