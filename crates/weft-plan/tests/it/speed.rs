//! The speed model, term by term against hand arithmetic, and the ranking it gives: TP
//! over PP for one stream on a fast link, PP over TP where every collective pays a slow
//! link's latency.

use super::*;
use weft_plan::plan::{Engine, Options};
use weft_plan::speed::{self, Hardware};

fn hw(device: &str) -> Hardware {
    Hardware::new(speed::device(device).unwrap(), Engine::Vllm)
}

fn opts(h: Hardware) -> Options {
    Options {
        max_model_len: Some(4096),
        hardware: Some(h),
        ..Options::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 + 1e-6 * b.abs()
}

#[test]
fn one_gpu_decode_is_the_bytes_read_over_the_bandwidth_plus_the_overhead() {
    let m = model(&fixture("qwen2.5-7b-instruct"));
    let h = hw("h200");
    let p = weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 141), &opts(h.clone())).unwrap();
    let r = &p.ranks[0];
    // Untied Qwen2.5-7B: the input embedding (152,064 x 3,584 x 2 B) is read one row a token.
    assert_eq!(r.lookup_bytes, 152_064 * 3_584 * 2);
    assert_eq!(r.expert_bytes, 0);
    let s = p.speed.as_ref().unwrap();
    let d = &s.decode.terms;
    let kv_one = 28.0 * 4.0 * 256.0 * 2.0; // one token of KV, all layers
    let bytes = (r.weights_bytes - r.lookup_bytes) as f64 + 3_584.0 * 2.0 + kv_one;
    assert!(
        close(d.memory_s, bytes / 4.8e12),
        "{} vs {}",
        d.memory_s,
        bytes / 4.8e12
    );
    assert_eq!(
        d.tp_latency_s + d.tp_bytes_s + d.pp_latency_s + d.ep_bytes_s,
        0.0
    );
    assert!(close(d.overhead_s, 1.5e-3));
    assert!(close(
        s.decode.tokens_per_s,
        1.0 / (d.memory_s + d.overhead_s)
    ));
    assert_eq!(s.decode.dominant, "memory");
    // At 4,096 tokens of context the cache is read too: 4,097 tokens of KV.
    let at = &s.decode_at_context.terms;
    assert!(close(at.memory_s - d.memory_s, 4_096.0 * kv_one / 4.8e12));
    // A 4,096-token prompt in one 8,192-token chunk is bound by compute on an H200.
    assert_eq!(s.prompt_chunk_tokens, 8192);
    assert_eq!(s.prompt.dominant, "compute");
    assert!(s.prompt.tokens_per_s > 10.0 * s.decode.tokens_per_s);
}

#[test]
fn tensor_parallel_halves_the_bytes_and_pays_two_rings_per_layer() {
    let m = model(&fixture("qwen2.5-7b-instruct"));
    let mut h = hw("gb10");
    h.link_gbps = 200.0;
    h.link_latency_us = 10.0;
    let one =
        weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 128), &opts(h.clone())).unwrap();
    let tp2 =
        weft_plan::plan::plan(&m, layout(2, 1), cluster(2, 1, 128), &opts(h.clone())).unwrap();
    let pp2 =
        weft_plan::plan::plan(&m, layout(1, 2), cluster(2, 1, 128), &opts(h.clone())).unwrap();
    let (a, b, c) = (
        &one.speed.as_ref().unwrap().decode,
        &tp2.speed.as_ref().unwrap().decode,
        &pp2.speed.as_ref().unwrap().decode,
    );
    // Each TP rank reads about half (norms and biases of KV heads are whole on both).
    let ratio = b.terms.memory_s / a.terms.memory_s;
    assert!((0.49..0.53).contains(&ratio), "{ratio}");
    // 28 layers x 2 all-reduces x a ring of 2 steps x 10 us.
    assert!(close(b.terms.tp_latency_s, 28.0 * 2.0 * 2.0 * 10e-6));
    // 3,584 x 2 B, 2(2-1)/2 of it, at 25 GB/s, 56 times.
    assert!(close(b.terms.tp_bytes_s, 56.0 * 7_168.0 / 25e9));
    // A pipeline reads every byte one stage after the other: no faster than one node.
    assert!(c.tokens_per_s <= a.tokens_per_s);
    assert!(close(c.terms.pp_latency_s, 10e-6));
    assert!(
        b.tokens_per_s > 1.3 * a.tokens_per_s,
        "{} vs {}",
        b.tokens_per_s,
        a.tokens_per_s
    );
}

#[test]
fn layouts_rank_by_predicted_speed_and_a_slow_link_turns_the_order() {
    let m = model(&fixture("qwen2.5-7b-instruct"));
    let rank = |gbps: f64, lat: f64| {
        let mut h = hw("rtx-4090");
        h.link_gbps = gbps;
        h.link_latency_us = lat;
        let c = weft_plan::plan::candidates(&m, cluster(4, 1, 24), &opts(h));
        c.into_iter()
            .filter(|(c, _)| c.refused.is_none())
            .map(|(c, _)| (c.layout.tp, c.layout.pp, c.dominant.unwrap()))
            .collect::<Vec<_>>()
    };
    // 200 Gb/s, 10 us: TP=4 reads a quarter each; 6 ring steps x 56 x 10 us = 3.4 ms.
    let fast = rank(200.0, 10.0);
    assert_eq!((fast[0].0, fast[0].1), (4, 1), "{fast:?}");
    // 1 Gb/s, 200 us: every all-reduce costs more than the bytes it saves.
    let slow = rank(1.0, 200.0);
    assert_eq!((slow[0].0, slow[0].1), (1, 4), "{slow:?}");
    assert_eq!(slow.last().unwrap().2, "network latency", "{slow:?}");
}

#[test]
fn a_moe_token_reads_its_top_k_experts_only() {
    // Qwen3-235B-A22B GPTQ-Int4 (128 experts, 8 a token) on two 128 GB GB10s, TP=2.
    let m = model(&fixture("qwen3-235b-a22b-gptq-int4"));
    let p = weft_plan::plan::plan(&m, layout(2, 1), cluster(2, 1, 128), &opts(hw("gb10"))).unwrap();
    let r = &p.ranks[0];
    assert!(
        r.expert_bytes > r.weights_bytes * 8 / 10,
        "experts are most of it"
    );
    let d = &p.speed.as_ref().unwrap().decode.terms;
    let dense = (r.weights_bytes - r.expert_bytes - r.lookup_bytes) as f64;
    let read = d.memory_s * 273e9;
    let experts = r.expert_bytes as f64 * 8.0 / 128.0;
    assert!(
        read > dense + experts && read < dense + experts + 2e6,
        "{read} vs {}",
        dense + experts
    );
}

#[test]
fn figures_that_cannot_be_true_are_refused_by_name() {
    let m = model(&fixture("qwen2.5-7b-instruct"));
    let mut h = hw("h100");
    h.memory_gbs = 0.0;
    let err = weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 80), &opts(h)).unwrap_err();
    assert!(err.to_string().contains("memory bandwidth"), "{err}");
    let mut h = hw("h100");
    h.link_latency_us = f64::NAN;
    let err = weft_plan::plan::plan(&m, layout(1, 1), cluster(1, 1, 80), &opts(h)).unwrap_err();
    assert!(err.to_string().contains("link latency"), "{err}");
    assert!(speed::device("DGX Spark").is_some_and(|d| d.name == "gb10"));
    assert!(speed::device("tpu").is_none());
    for d in speed::DEVICES {
        assert!(!d.source.is_empty() && d.memory_gbs > 0.0 && d.bf16_tflops > 0.0);
    }
}
