//! Each sharding rule on small configs, with the expected bytes computed by hand.
//!
//! The tiny Llama: hidden 64, 4 layers, 8 heads, 2 KV heads, head_dim 8, intermediate 128,
//! vocab 1000 (padded to 1024), bf16. Per layer: q 64x64, k 16x64, v 16x64, o 64x64,
//! gate/up 128x64, down 64x128, two norms of 64 = 34,944 elements = 69,888 B.
//! Embedding and LM head 1000x64 = 128,000 B each (1024 rows once padded: 131,072 B).

use super::*;
use serde_json::json;
use weft_plan::PlanError;
use weft_plan::plan::{KvDtype, Options};
use weft_plan::rules::{ep_experts, pp_layers};

fn tiny(extra: Value) -> Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn weights(c: &Value, tp: u64, pp: u64) -> Vec<u64> {
    let m = model(c);
    plan(&m, layout(tp, pp), cluster(1, tp * pp, 1))
        .ranks
        .iter()
        .map(|r| r.weights_bytes)
        .collect()
}

#[test]
fn column_row_vocab_and_replicated_norms_per_rank() {
    // (tp, pp, weights per rank) computed by hand.
    let cases: &[(u64, u64, &[u64])] = &[
        // TP=1: 4 x 69,888 + padded embedding 131,072 + LM head 131,072 + norm 128.
        (1, 1, &[541_824]),
        // TP=2: per layer q 2048 + k 512 + v 512 + o 2048 + 3 x 4096 + norms 128 = 17,536
        // elements = 35,072 B; x4 = 140,288; vocab 512 rows x 64 x 2 = 65,536 twice; norm 128.
        (2, 1, &[271_488, 271_488]),
        // TP=4: KV heads replicated (2 heads, 1 per rank): per layer 1024 + 512 + 512 + 1024
        // + 3 x 2048 + 128 = 9,344 el = 18,688 B; x4 = 74,752; vocab 256 rows = 32,768 twice.
        (4, 1, &[140_416; 4]),
        // PP=2: stage 0 = 2 layers + embedding; stage 1 = 2 layers + final norm + LM head.
        (1, 2, &[139_776 + 131_072, 139_776 + 131_072 + 128]),
    ];
    for (tp, pp, want) in cases {
        assert_eq!(
            weights(&tiny(json!({})), *tp, *pp),
            *want,
            "tp={tp} pp={pp}"
        );
    }
}

#[test]
fn kv_heads_replicated_when_tp_exceeds_them() {
    let m = model(&tiny(json!({})));
    let p = plan(&m, layout(4, 1), cluster(1, 4, 1));
    // 2 KV heads over 4 ranks: each rank keeps a whole head, so per token 4 layers x 1 head x
    // (8 + 8) x 2 B = 128 B, not 64.
    assert!(p.ranks.iter().all(|r| r.kv_bytes_per_token == 128));
    let flagged: Vec<&str> = p.replicated.iter().map(|f| f.tensor.as_str()).collect();
    assert!(
        flagged.contains(&"model.layers.*.self_attn.k_proj.weight"),
        "{flagged:?}"
    );
    assert!(
        flagged.contains(&"model.layers.*.self_attn.v_proj.weight"),
        "{flagged:?}"
    );
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    assert!(p.ranks.iter().all(|r| r.kv_bytes_per_token == 128));
    assert!(!p.replicated.iter().any(|f| f.tensor.contains("k_proj")));
    // Norms are flagged as replicated, with why.
    assert!(
        p.replicated
            .iter()
            .any(|f| f.tensor == "model.layers.*.input_layernorm.weight"
                && f.why.contains("norms")
                && f.count == 4)
    );
}

#[test]
fn vocab_padding_is_flagged_uneven() {
    let m = model(&tiny(json!({})));
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    let u = p
        .uneven
        .iter()
        .find(|f| f.tensor == "lm_head.weight")
        .unwrap();
    assert!(u.why.contains("1000 padded to 1024"), "{}", u.why);
}

#[test]
fn tied_embeddings_count_once_but_the_last_stage_keeps_a_copy() {
    let c = tiny(json!({"tie_word_embeddings": true}));
    // PP=1: one copy (541,824 - 131,072).
    assert_eq!(weights(&c, 1, 1), vec![410_752]);
    // PP=2: the last stage loads the embedding into its own LM head.
    assert_eq!(
        weights(&c, 1, 2),
        vec![139_776 + 131_072, 139_776 + 131_072 + 128]
    );
    let m = model(&c);
    let p = plan(&m, layout(1, 2), cluster(1, 2, 1));
    assert!(
        p.replicated
            .iter()
            .any(|f| f.tensor == "lm_head.weight" && f.why.contains("tied"))
    );
}

#[test]
fn pipeline_stages_split_layers_as_vllm_does() {
    // vLLM get_pp_indices: the remainder goes to the stages before the last.
    let cases: &[(u64, u64, &[u64])] = &[
        (4, 3, &[1, 2, 1]),
        (61, 4, &[15, 15, 16, 15]),
        (94, 4, &[23, 24, 24, 23]),
        (32, 4, &[8, 8, 8, 8]),
        (5, 2, &[3, 2]),
    ];
    for (layers, pp, want) in cases {
        let got: Vec<u64> = (0..*pp)
            .map(|s| {
                let (a, b) = pp_layers(*layers, *pp, s);
                b - a
            })
            .collect();
        assert_eq!(got, *want, "{layers} layers, pp={pp}");
    }
    let m = model(&tiny(json!({})));
    let p = plan(&m, layout(1, 3), cluster(1, 3, 1));
    assert!(
        p.uneven
            .iter()
            .any(|f| f.tensor == "model.layers" && f.why.contains("[1, 2, 1]"))
    );
}

#[test]
fn refused_layouts_name_the_rule() {
    let m = model(&tiny(json!({})));
    let cases: &[(Layout, &str)] = &[
        (layout(3, 1), "attention heads must be divisible by tp"),
        (layout(1, 5), "each pipeline stage needs at least one layer"),
        (layout(16, 1), "tp x pp x dp GPUs"),
    ];
    for (l, rule) in cases {
        let c = cluster(1, 8, 1);
        match weft_plan::plan::plan(&m, *l, c, &Options::default()) {
            Err(PlanError::Layout { rule: r, .. }) => assert!(r.contains(rule), "{r}"),
            other => panic!("{l:?}: {other:?}"),
        }
    }
    let m = model(&tiny(
        json!({"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 48}),
    ));
    let err = weft_plan::plan::plan(&m, layout(2, 1), cluster(1, 2, 1), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("KV heads must be divisible by tp"), "{err}");
    let m = model(&tiny(
        json!({"num_attention_heads": 8, "num_key_value_heads": 4}),
    ));
    let err = weft_plan::plan::plan(&m, layout(8, 1), cluster(1, 8, 1), &Options::default());
    assert!(err.is_ok(), "tp=8 over 4 KV heads replicates: {err:?}");
}

fn tiny_moe(experts: u64) -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8,
        "num_key_value_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_experts": experts, "num_experts_per_tok": 2, "vocab_size": 1024,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
    })
}

/// Bytes of routed-expert tensors on each rank.
fn expert_bytes(c: &Value, tp: u64, ep: bool) -> Vec<u64> {
    let mut m = model(c);
    m.tensors.retain(|t| t.name.contains(".experts."));
    let l = Layout {
        tp,
        pp: 1,
        ep,
        dp: 1,
    };
    weft_plan::plan::plan(&m, l, cluster(1, tp, 1), &Options::default())
        .unwrap()
        .ranks
        .iter()
        .map(|r| r.weights_bytes)
        .collect()
}

#[test]
fn experts_split_by_tp_or_spread_over_ep() {
    // One expert: gate/up 32x64 + down 64x32 = 6,144 el = 12,288 B; 2 layers.
    // 8 experts, TP=2 without EP: half of every expert on each rank = 8 x 6,144 x 2 layers.
    assert_eq!(expert_bytes(&tiny_moe(8), 2, false), vec![98_304, 98_304]);
    // With EP = TP = 2: four whole experts per rank, the same bytes.
    assert_eq!(expert_bytes(&tiny_moe(8), 2, true), vec![98_304, 98_304]);
    // 6 experts over EP=4: [2, 2, 1, 1] experts (vLLM determine_expert_map).
    assert_eq!(
        expert_bytes(&tiny_moe(6), 4, true),
        vec![49_152, 49_152, 24_576, 24_576]
    );
    assert_eq!(ep_experts(6, 4, 2), (4, 1));
    let m = model(&tiny_moe(6));
    let l = Layout {
        tp: 4,
        pp: 1,
        ep: true,
        dp: 1,
    };
    let p = weft_plan::plan::plan(&m, l, cluster(1, 4, 1), &Options::default()).unwrap();
    assert!(
        p.uneven
            .iter()
            .any(|f| f.why.contains("6 experts over EP=4"))
    );
    assert!(
        p.replicated
            .iter()
            .any(|f| f.tensor == "model.layers.*.mlp.gate.weight")
    );
    // EP spans TP x DP ranks.
    let l = Layout {
        tp: 2,
        pp: 1,
        ep: true,
        dp: 2,
    };
    let p = weft_plan::plan::plan(&m, l, cluster(1, 4, 1), &Options::default()).unwrap();
    assert_eq!(p.ep_size, 4);
    assert_eq!(
        p.ranks
            .iter()
            .map(|r| r.ep_rank.unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
}

#[test]
fn mla_latent_kv_is_whole_on_every_tp_rank() {
    let c = json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 8, "intermediate_size": 128, "moe_intermediate_size": 32,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "q_lora_rank": 48, "vocab_size": 1024,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    });
    let m = model(&c);
    for tp in [1, 2, 4] {
        let p = plan(&m, layout(tp, 1), cluster(1, tp, 1));
        // 4 layers x (32 + 8) x 2 B, whatever tp is.
        assert!(
            p.ranks.iter().all(|r| r.kv_bytes_per_token == 320),
            "tp={tp}"
        );
    }
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    // kv_a_proj_with_mqa: (32 + 8) x 64 x 2 B = 5,120 B per layer, whole on each rank.
    let mut only = m.clone();
    only.tensors
        .retain(|t| t.name.contains("kv_a_proj_with_mqa"));
    let q = plan(&only, layout(2, 1), cluster(1, 2, 1));
    assert_eq!(q.ranks[0].weights_bytes, 4 * 5_120);
    assert!(p.replicated.iter().any(|f| f.why.contains("MLA")));
}

#[test]
fn sliding_window_layers_cap_at_their_window() {
    // Gemma 2: even layers slide. 4 layers, window 16; per layer per token 2 KV heads x
    // (8 + 8) x 2 B = 64 B; full layers 1 and 3.
    let c = json!({
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 8,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024,
        "sliding_window": 16, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
    });
    let m = model(&c);
    let p = plan(&m, layout(1, 1), cluster(1, 1, 1));
    let w = p.ranks[0].weights_bytes;
    // 130,048 B for the KV cache: one sequence of n tokens costs 128 n + 2 x 64 x min(16, n).
    let opts = Options {
        gpu_memory_utilization: 1.0,
        overhead_bytes: Some(0),
        max_model_len: Some(8192),
        ..Options::default()
    };
    let c = Cluster {
        nodes: 1,
        gpus_per_node: 1,
        gpu_memory_bytes: w + 130_048,
    };
    let p = weft_plan::plan::plan(&m, layout(1, 1), c, &opts).unwrap();
    let r = &p.ranks[0];
    assert_eq!(r.kv_bytes_per_token, 256);
    // vLLM's token count divides by all layers and rounds down to 16-token blocks.
    assert_eq!(r.kv_tokens, 496);
    // One sequence is reserved in whole blocks: 128 x 992 + 128 x 16 fits, 1,000 would need 1,008.
    assert_eq!(r.max_context_per_seq, 992);
    assert!(!r.fits, "8192 tokens do not fit");
    // Gemma 3: every sixth layer is global.
    let c3 = json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 8, "head_dim": 8,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024,
        "sliding_window": 512, "sliding_window_pattern": 6, "max_position_embeddings": 8192,
    });
    let a = weft_plan::arch::from_config(&c3).unwrap();
    let full: Vec<usize> = a
        .layer_kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == weft_plan::arch::LayerKind::Full)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(full, vec![5, 11]);
}

#[test]
fn quantisation_scales_split_with_their_weights() {
    // GPTQ int4, group 32, one q_proj of 64x64: qweight [8, 64] I32 = 2,048 B,
    // qzeros [2, 8] I32 = 64 B, scales [2, 64] F16 = 256 B, g_idx [64] I32 = 256 B.
    // Column-parallel over TP=2 splits the output (last) dim: 1,024 + 32 + 128, and g_idx
    // (indexed by input) stays whole: 256. Total 1,440 per rank.
    let c =
        tiny(json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}));
    let mut m = model(&c);
    m.tensors
        .retain(|t| t.name.starts_with("model.layers.0.self_attn.q_proj"));
    assert_eq!(m.tensors.len(), 4);
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    assert_eq!(p.ranks[0].weights_bytes, 1_440);
    // Row-parallel o_proj splits the input (first) dim, g_idx with it: 1,024 + 32 + 128 + 128.
    let mut m = model(&c);
    m.tensors
        .retain(|t| t.name.starts_with("model.layers.0.self_attn.o_proj"));
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    assert_eq!(p.ranks[0].weights_bytes, 1_312);
    // FP8 with 128x128 block scales: the split per rank must be a whole number of blocks.
    let c = tiny(json!({"intermediate_size": 384, "quantization_config":
        {"quant_method": "fp8", "weight_block_size": [128, 128]}}));
    let m = model(&c);
    let err = weft_plan::plan::plan(&m, layout(2, 1), cluster(1, 2, 1), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("block_n") && err.contains("192"), "{err}");
    // FP8 down_proj [64, 128] F8 = 8,192 B + scale_inv [1, 1] F32 = 4 B; o_proj the same
    // shape [64, 64] at TP=1 counts 4,096 + 4.
    let c = tiny(
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}),
    );
    let mut m = model(&c);
    m.tensors
        .retain(|t| t.name.starts_with("model.layers.0.mlp.down_proj"));
    let p = plan(&m, layout(1, 1), cluster(1, 1, 1));
    assert_eq!(p.ranks[0].weights_bytes, 8_196);
}

#[test]
fn gpt2_conv1d_fused_qkv_and_float32_checkpoints() {
    let m = model(&fixture("gpt2"));
    // GPT-2 small: 124,439,808 parameters (wte 38.6M + wpe 0.79M + 12 blocks), loaded in
    // 16 bits by vLLM's dtype auto.
    let params: u64 = m.tensors.iter().map(|t| t.numel()).sum();
    assert_eq!(params, 124_439_808);
    let p = plan(&m, layout(1, 1), cluster(1, 1, 1));
    // Tied: wte once, padded from 50,257 to 50,304 rows.
    assert_eq!(p.ranks[0].weights_bytes, (params + 47 * 768) * 2);
    // TP=2 splits c_attn [768, 2304] on its output (last) dim: 1,152 columns per rank.
    let mut only = m.clone();
    only.tensors.retain(|t| t.name == "h.0.attn.c_attn.weight");
    let q = plan(&only, layout(2, 1), cluster(1, 2, 1));
    assert_eq!(q.ranks[0].weights_bytes, 768 * 1152 * 2);
    assert!(
        p.warnings.iter().any(|w| w.contains("16 bits")),
        "{:?}",
        p.warnings
    );
}

#[test]
fn kv_dtype_and_fits_per_node_with_headroom() {
    let m = model(&fixture("llama-3-8b"));
    let opts = Options {
        kv_dtype: KvDtype::Fp8,
        ..Options::default()
    };
    let p = weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 24), &opts).unwrap();
    assert_eq!(p.ranks[0].kv_bytes_per_token, 65_536);
    // 24 GiB x 0.9 - 14.96 GiB - 5.5 GiB overhead = 1.14 GiB: not 8,192 x 64 KiB = 0.5 GiB short.
    assert!(p.nodes[0].fits, "{:?}", p.nodes[0]);
    let p = plan(&m, layout(1, 1), cluster(1, 1, 16));
    assert!(!p.nodes[0].fits);
    assert!(p.nodes[0].headroom_bytes < 0);
}

#[test]
fn layouts_rank_pp_over_tp_across_slow_links() {
    let m = model(&fixture("llama-3-8b"));
    let opts = Options {
        max_model_len: Some(8192),
        ..Options::default()
    };
    // Two nodes of 1 GPU: TP=2 puts 2 all-reduces per layer on the link, PP=2 one transfer.
    let c = cluster(2, 1, 16);
    let cands = weft_plan::plan::candidates(&m, c, &opts);
    let first = &cands[0].0;
    assert_eq!((first.layout.tp, first.layout.pp), (1, 2), "{cands:?}");
    let tp2 = cands.iter().find(|(c, _)| c.layout.tp == 2).unwrap();
    assert_eq!(tp2.0.internode_collectives_per_token, 64);
    assert_eq!(tp2.0.internode_bytes_per_token, 32 * 2 * 4096 * 2);
    assert_eq!(first.internode_bytes_per_token, 2 * 4096 * 2);
    // One node of 2 GPUs: TP stays inside the node and costs nothing between nodes.
    let c = cluster(1, 2, 16);
    let cands = weft_plan::plan::candidates(&m, c, &opts);
    assert!(cands.iter().all(|(c, _)| c.internode_bytes_per_token == 0));
}

#[test]
fn unknown_architectures_fall_back_to_name_rules_with_a_warning() {
    let c = tiny(json!({"architectures": ["FrobnicatorForCausalLM"], "model_type": "frob"}));
    let m = model(&c);
    let p = plan(&m, layout(2, 1), cluster(1, 2, 1));
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("FrobnicatorForCausalLM") && w.contains("name rules"))
    );
    assert_eq!(p.ranks[0].weights_bytes, 271_488);
}
