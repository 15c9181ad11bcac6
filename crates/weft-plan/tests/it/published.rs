//! Published figures, each with its source.

use super::*;
use weft_plan::plan::{KvDtype, Options};

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= want * tol
}

/// Llama-3-8B, bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 B/token
/// (docs.rs kv-cache-size; research/next_features.md section 2).
#[test]
fn llama_3_8b_kv_is_131072_bytes_per_token() {
    let m = model(&fixture("llama-3-8b"));
    let p = plan(&m, layout(1, 1), cluster(1, 1, 80));
    assert_eq!(p.ranks[0].kv_bytes_per_token, 131_072);
}

/// vLLM logs "model weights took 14.96 GiB" for Llama-3-8B in bf16 on an A100-40G
/// (vllm-project/vllm issue #12330).
#[test]
fn llama_3_8b_weights_match_vllms_log() {
    let m = model(&fixture("llama-3-8b"));
    let p = plan(&m, layout(1, 1), cluster(1, 1, 40));
    let gib = p.ranks[0].weights_bytes as f64 / GIB;
    assert!(within(gib, 14.96, 0.005), "{gib} GiB");
}

/// gpt-oss-120b, bf16 KV: 73,728 B/token; 5.38 GiB of KV cache holds 78,384 tokens
/// (alvarobartt/hf-mem issue #60, quoting vLLM's log).
#[test]
fn gpt_oss_120b_kv_is_73728_bytes_per_token() {
    let m = model(&fixture("gpt-oss-120b"));
    let p = plan(&m, layout(1, 1), cluster(1, 1, 96));
    assert_eq!(p.ranks[0].kv_bytes_per_token, 73_728);
    // Give exactly 5.38 GiB to the KV cache and compare the token count.
    let w = p.ranks[0].weights_bytes;
    let opts = Options {
        gpu_memory_utilization: 1.0,
        overhead_bytes: Some(0),
        max_model_len: Some(1024),
        ..Options::default()
    };
    let kv = (5.38 * GIB) as u64;
    let c = Cluster {
        nodes: 1,
        gpus_per_node: 1,
        gpu_memory_bytes: w + kv,
    };
    let p = weft_plan::plan::plan(&m, layout(1, 1), c, &opts).unwrap();
    let t = p.ranks[0].kv_tokens as f64;
    assert!(within(t, 78_384.0, 0.005), "{t} tokens");
}

/// gpt-oss-120b "runs on a single 80GB GPU" (openai/gpt-oss-120b model card): its MXFP4
/// experts and bf16 attention must fit one 80 GB GPU with vLLM's overhead.
#[test]
fn gpt_oss_120b_fits_one_80gb_gpu() {
    let m = model(&fixture("gpt-oss-120b"));
    let opts = Options {
        max_model_len: Some(8192),
        ..Options::default()
    };
    let c = Cluster {
        nodes: 1,
        gpus_per_node: 1,
        gpu_memory_bytes: 80_000_000_000,
    };
    let p = weft_plan::plan::plan(&m, layout(1, 1), c, &opts).unwrap();
    assert!(p.fits, "{:?}", p.ranks[0]);
}

/// Qwen3-235B-A22B GPTQ-Int4 at TP=2 on two DGX Sparks: 57.64 GiB of weights per node
/// (conselara.dev/tags/qwen, quoting vLLM's "Model loading took 57.64 GiB").
#[test]
fn qwen3_235b_gptq_int4_tp2_is_57_6_gib_per_node() {
    let m = model(&fixture("qwen3-235b-a22b-gptq-int4"));
    let p = plan(&m, layout(2, 1), cluster(2, 1, 128));
    for n in &p.nodes {
        let gib = n.weights_bytes as f64 / GIB;
        assert!(within(gib, 57.64, 0.02), "node {}: {gib} GiB", n.node);
    }
}

/// DeepSeek-V3's MLA cache: 512 + 64 = 576 elements per layer, K only
/// (ik_llama.cpp PR #235; TensorRT-LLM PR #16707): 61 x 576 x 2 = 70,272 B/token in bf16,
/// the same on every TP rank (kaito-project/kaito PR #2139).
#[test]
fn deepseek_v3_mla_kv_is_replicated_per_tp_rank() {
    let m = model(&fixture("deepseek-v3"));
    let p = plan(&m, layout(8, 1), cluster(1, 8, 141));
    for r in &p.ranks {
        assert_eq!(r.kv_bytes_per_token, 61 * 576 * 2);
    }
    let opts = Options {
        kv_dtype: KvDtype::Fp8,
        ..Options::default()
    };
    let p = weft_plan::plan::plan(&m, layout(8, 1), cluster(1, 8, 141), &opts).unwrap();
    assert_eq!(p.ranks[0].kv_bytes_per_token, 61 * 576);
    assert!(
        p.replicated
            .iter()
            .any(|f| f.tensor.ends_with("kv_a_proj_with_mqa.weight"))
    );
    // The checkpoint's multi-token-prediction layer (model.layers.61) is not loaded.
    assert!(
        p.skipped
            .iter()
            .any(|f| f.tensor.starts_with("model.layers.*"))
    );
}

/// DeepSeek-V3: 671B parameters in the main model plus 14B in the multi-token-prediction
/// module, 685B in all (deepseek-ai/DeepSeek-V3 README), in 90,000+ tensors. At TP=8 on
/// 8 x H200 (141 GB) its FP8 checkpoint fits, as vLLM's DeepSeek deployment guides run it.
#[test]
fn deepseek_v3_has_685b_parameters_and_fits_8_h200_at_tp8() {
    let m = model(&fixture("deepseek-v3"));
    assert!(m.tensors.len() > 90_000, "{} tensors", m.tensors.len());
    let params: u64 = m
        .tensors
        .iter()
        .filter(|t| !t.name.ends_with("weight_scale_inv"))
        .map(|t| t.numel())
        .sum();
    let b = params as f64 / 1e9;
    assert!(within(b, 685.0, 0.01), "{b}B parameters");
    let opts = Options {
        max_model_len: Some(32_768),
        ..Options::default()
    };
    let c = Cluster {
        nodes: 1,
        gpus_per_node: 8,
        gpu_memory_bytes: 141_000_000_000,
    };
    let p = weft_plan::plan::plan(&m, layout(8, 1), c, &opts).unwrap();
    assert!(p.fits, "{:?}", p.nodes);
}

/// Qwen3.5-397B-A17B in bf16 at TP=4 on 4 nodes: about 199 GB of weights on each node
/// (397 B parameters, "Total Parameters: 397B" on the model card and NVIDIA's NVFP4 card of
/// it, x 2 bytes / 4 ranks = 198.5 GB; the header-only fixture holds the text model, the
/// vision tower being counted whole per rank when present). Its hybrid layout is the
/// card's: 45 Gated DeltaNet layers without KV cache and 15 gated-attention layers whose 2
/// KV heads are replicated over TP=4 (vLLM: max(1, 2/4) = 1 head per rank), so one token
/// costs 15 x 1 x (256 + 256) x 2 = 15,360 bytes per rank.
#[test]
fn qwen3_5_397b_tp4_is_about_199_gb_per_node() {
    let config = fixture("qwen3.5-397b-a17b");
    let m = model(&config);
    assert_eq!(m.arch.family, weft_plan::arch::Family::QwenHybrid);
    let params: u64 = m.tensors.iter().map(|t| t.numel()).sum();
    assert!(
        (390e9..400e9).contains(&(params as f64)),
        "{params} parameters in the text model"
    );
    let p = plan(&m, layout(4, 1), cluster(4, 1, 288));
    assert_eq!(p.nodes.len(), 4);
    for n in &p.nodes {
        let gb = n.weights_bytes as f64 / 1e9;
        assert!(within(gb, 199.0, 0.01), "node {}: {gb} GB", n.node);
    }
    assert_eq!(p.ranks[0].kv_bytes_per_token, 15_360);
    assert!(
        p.replicated
            .iter()
            .any(|f| f.why.contains("KV heads replicated")),
        "{:?}",
        p.replicated
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("45 Gated DeltaNet layers")),
        "{:?}",
        p.warnings
    );
    // Nothing fell back to "no rule matched": every tensor has its rule.
    assert!(
        !p.replicated
            .iter()
            .any(|f| f.why.contains("no sharding rule")),
        "{:?}",
        p.replicated
    );
    // TP=8 breaks no rule either (16 QK and 64 value heads divide by 8); TP=3 does.
    let e = weft_plan::plan::plan(&m, layout(3, 1), cluster(3, 1, 288), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("heads"), "{e}");
}
