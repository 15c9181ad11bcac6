//! The small errors of issue #34 item 5, each as the user met it: a suggested
//! `--max-model-len` above the KV capacity shown, a Q4_K_M GGUF labelled unquantised,
//! Qwen3-VL's architecture unknown, a config error that does not say which config, and a
//! default context that does not fit said only at the end.

use super::*;
use serde_json::json;
use weft_plan::plan::{Engine, Options};
use weft_plan::source;
use weft_plan::synth::{self, Meta};

/// Qwen3-VL-4B-Instruct's config.json (text and vision parts as published; the vision
/// part trimmed to the fields that say what it is).
fn qwen3_vl_4b() -> Value {
    json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": 151655,
        "text_config": {
            "model_type": "qwen3_vl_text", "dtype": "bfloat16", "head_dim": 128,
            "hidden_size": 2560, "intermediate_size": 9728, "max_position_embeddings": 262144,
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
            "rope_theta": 5000000, "tie_word_embeddings": true, "vocab_size": 151936
        },
        "tie_word_embeddings": true,
        "vision_config": {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "out_hidden_size": 2560}
    })
}

#[test]
fn qwen3_vl_is_a_known_dense_architecture() {
    let m = model(&qwen3_vl_4b());
    assert_eq!(m.arch.family, weft_plan::arch::Family::Llama);
    let p = weft_plan::plan::plan(
        &m,
        layout(1, 1),
        cluster(1, 1, 80),
        &Options {
            max_model_len: Some(32768),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(p.architecture, "Qwen3VLForConditionalGeneration");
    assert!(
        !p.warnings
            .iter()
            .any(|w| w.contains("not one weft plan knows")),
        "{:?}",
        p.warnings
    );
    // 36 layers x 8 KV heads x (128 + 128) x 2 B.
    assert_eq!(p.ranks[0].kv_bytes_per_token, 36 * 8 * 256 * 2);
    // Qwen3-VL-MoE's language model is Qwen3-MoE.
    let mut moe = qwen3_vl_4b();
    moe["architectures"] = json!(["Qwen3VLMoeForConditionalGeneration"]);
    moe["model_type"] = json!("qwen3_vl_moe");
    moe["text_config"]["model_type"] = json!("qwen3_vl_moe_text");
    let a = weft_plan::arch::from_config(&moe).unwrap();
    assert_eq!(a.family, weft_plan::arch::Family::QwenMoe);
}

#[test]
fn the_suggested_max_model_len_never_exceeds_the_kv_capacity_shown() {
    let m = model(&fixture("qwen2.5-7b-instruct"));
    let per_token = 28 * 4 * 256 * 2; // 57,344 B
    // Memory for the weights, the overhead and 1,000.5 tokens' worth of KV cache past a
    // whole number of blocks: not a multiple of 16 tokens.
    let w = plan(&m, layout(1, 1), cluster(1, 1, 80)).ranks[0].weights_bytes;
    let opts = Options {
        gpu_memory_utilization: 1.0,
        overhead_bytes: Some(0),
        max_model_len: Some(32768),
        ..Options::default()
    };
    let c = Cluster {
        nodes: 1,
        gpus_per_node: 1,
        gpu_memory_bytes: w + per_token * 1000 + per_token / 2,
    };
    let p = weft_plan::plan::plan(&m, layout(1, 1), c, &opts).unwrap();
    assert!(!p.fits);
    let r = &p.ranks[0];
    assert_eq!(r.kv_tokens, 992, "whole 16-token blocks");
    let n = p.fits_up_to.expect("the weights fit");
    assert!(n <= r.kv_tokens, "suggested {n} > capacity {}", r.kv_tokens);
    assert_eq!(n, 992);
    assert!(p.warnings.iter().any(|w| w.contains("--max-model-len 992")));
    // What is suggested fits, and one token more does not (it needs another block).
    let at = |len| {
        weft_plan::plan::plan(
            &m,
            layout(1, 1),
            c,
            &Options {
                max_model_len: Some(len),
                ..opts.clone()
            },
        )
        .unwrap()
    };
    assert!(at(n).fits);
    assert!(!at(n + 1).fits);
}

#[test]
fn a_default_context_that_does_not_fit_is_planned_at_the_longest_that_does() {
    // Qwen3-VL-4B's 262,144 tokens take 36 GiB of KV cache: not on a 24 GiB GPU, which
    // still holds the weights and a shorter context.
    let m = model(&qwen3_vl_4b());
    let p =
        weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 24), &Options::default()).unwrap();
    assert!(p.fits);
    assert_eq!(p.shortened_from, Some(262_144));
    assert!(p.max_model_len < 262_144 && p.max_model_len > 16_384);
    assert!(p.max_model_len <= p.ranks[0].kv_tokens);
    assert!(
        p.warnings[0].starts_with(&format!("fits at up to {} tokens", p.max_model_len)),
        "{:?}",
        p.warnings
    );
    // Asked for explicitly, the length stays what was asked and the plan does not fit.
    let asked = weft_plan::plan::plan(
        &m,
        layout(1, 1),
        cluster(1, 1, 24),
        &Options {
            max_model_len: Some(262_144),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(!asked.fits);
    assert_eq!(asked.shortened_from, None);
    assert_eq!(asked.fits_up_to, Some(p.max_model_len));
    // Weights that do not fit at all are not shortened into fitting.
    let none =
        weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 8), &Options::default()).unwrap();
    assert!(!none.fits && none.shortened_from.is_none());
}

#[test]
fn a_config_error_names_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fixture("qwen2.5-0.5b-instruct");
    let tensors = model(&config).tensors;
    config
        .as_object_mut()
        .unwrap()
        .remove("num_attention_heads");
    synth::write_checkpoint(dir.path(), &config, &tensors, 1).unwrap();
    let r = source::resolve(dir.path().to_str().unwrap()).unwrap();
    let err = source::load_local(&r).unwrap_err().to_string();
    let cfg = dir.path().join("config.json");
    assert!(
        err.contains(&cfg.display().to_string()) && err.contains("num_attention_heads"),
        "{err}"
    );
}

fn gguf(path: &std::path::Path, file_type: Option<u32>) {
    let (h, ff, layers) = (256u64, 512u64, 2);
    let mut t: Vec<(String, &str, Vec<u64>)> = vec![
        ("token_embd.weight".into(), "Q4_K", vec![1000, h]),
        ("output.weight".into(), "Q6_K", vec![1000, h]),
        ("output_norm.weight".into(), "F32", vec![h]),
    ];
    for l in 0..layers {
        for (n, ty, s) in [
            ("attn_norm.weight", "F32", vec![h]),
            ("attn_q.weight", "Q4_K", vec![h, h]),
            ("attn_k.weight", "Q4_K", vec![64, h]),
            ("attn_v.weight", "Q6_K", vec![64, h]),
            ("attn_output.weight", "Q4_K", vec![h, h]),
            ("ffn_gate.weight", "Q4_K", vec![ff, h]),
            ("ffn_up.weight", "Q4_K", vec![ff, h]),
            ("ffn_down.weight", "Q6_K", vec![h, ff]),
        ] {
            t.push((format!("blk.{l}.{n}"), ty, s));
        }
    }
    let mut meta = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(layers as u32)),
        ("llama.embedding_length", Meta::U32(h as u32)),
        ("llama.feed_forward_length", Meta::U32(ff as u32)),
        ("llama.attention.head_count", Meta::U32(8)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
    ];
    if let Some(f) = file_type {
        meta.push(("general.file_type", Meta::U32(f)));
    }
    let refs: Vec<(&str, &str, Vec<u64>)> = t
        .iter()
        .map(|(a, b, c)| (a.as_str(), *b, c.clone()))
        .collect();
    std::fs::write(path, synth::gguf_bytes(&meta, &refs).unwrap()).unwrap();
}

#[test]
fn a_q4_k_m_gguf_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        engine: Engine::LlamaCpp,
        max_model_len: Some(1024),
        ..Options::default()
    };
    for (file_type, label) in [(Some(15), "gguf Q4_K_M"), (None, "gguf mostly Q4_K")] {
        let f = dir.path().join("m.gguf");
        gguf(&f, file_type);
        let m = source::load_local(&source::resolve(f.to_str().unwrap()).unwrap()).unwrap();
        let p = weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 1), &opts).unwrap();
        assert_eq!(p.quantization, label);
    }
    // An F16 file is not quantised.
    let f = dir.path().join("f16.gguf");
    gguf(&f, Some(1));
    let m = source::load_local(&source::resolve(f.to_str().unwrap()).unwrap()).unwrap();
    assert_eq!(m.arch.quant.label(), "none");
}
