//! Local sources: directories (sharded and not), one safetensors file, GGUF files, and
//! headers that are malformed or lie about their length.

use super::*;
use weft_plan::plan::{Engine, Options};
use weft_plan::source::{self, ModelRef};
use weft_plan::synth::{self, Meta};

#[test]
fn a_sharded_directory_reads_back_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixture("qwen2.5-0.5b-instruct");
    let want = model(&config);
    synth::write_checkpoint(dir.path(), &config, &want.tensors, 3).unwrap();
    assert!(
        dir.path()
            .join("model-00003-of-00003.safetensors")
            .is_file()
    );
    let r = source::resolve(dir.path().to_str().unwrap()).unwrap();
    assert!(matches!(r, ModelRef::Dir(_)));
    let got = source::load_local(&r).unwrap();
    let mut a: Vec<_> = want
        .tensors
        .iter()
        .map(|t| (&t.name, &t.shape, t.bytes))
        .collect();
    a.sort();
    let b: Vec<_> = got
        .tensors
        .iter()
        .map(|t| (&t.name, &t.shape, t.bytes))
        .collect();
    assert_eq!(a, b);
    let pa = plan(&want, layout(2, 1), cluster(2, 1, 24));
    let pb = plan(&got, layout(2, 1), cluster(2, 1, 24));
    assert_eq!(
        pa.ranks.iter().map(|r| r.weights_bytes).collect::<Vec<_>>(),
        pb.ranks.iter().map(|r| r.weights_bytes).collect::<Vec<_>>()
    );
}

#[test]
fn one_safetensors_file_needs_its_config_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixture("llama-3-8b");
    let m = model(&config);
    synth::write_checkpoint(dir.path(), &config, &m.tensors, 1).unwrap();
    let f = dir.path().join("model.safetensors");
    let r = source::resolve(f.to_str().unwrap()).unwrap();
    assert!(matches!(r, ModelRef::Safetensors(_)));
    let got = source::load_local(&r).unwrap();
    assert_eq!(got.tensors.len(), m.tensors.len());
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = source::load_local(&r).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
}

fn write(path: &std::path::Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn headers_that_lie_are_clear_errors_without_huge_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.safetensors");
    // Claims a terabyte of header.
    let mut b = (1u64 << 40).to_le_bytes().to_vec();
    b.extend(b"{}");
    write(&f, &b);
    let err = source::read_safetensors_header(&f).unwrap_err().to_string();
    assert!(
        err.contains("bad.safetensors") && err.contains("limit"),
        "{err}"
    );
    // Claims 5,000 bytes in a file of 100.
    let mut b = 5000u64.to_le_bytes().to_vec();
    b.extend([b' '; 92]);
    write(&f, &b);
    let err = source::read_safetensors_header(&f).unwrap_err().to_string();
    assert!(
        err.contains("claims 5000 bytes but the file holds only 100"),
        "{err}"
    );
    // Offsets that disagree with dtype and shape.
    let json = br#"{"x.weight":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,16]}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend(json);
    write(&f, &b);
    let err = source::read_safetensors_header(&f).unwrap_err().to_string();
    assert!(
        err.contains("x.weight") && err.contains("32 bytes"),
        "{err}"
    );
    // An unknown field in a tensor entry.
    let json =
        br#"{"x.weight":{"dtype":"BF16","shape":[4],"data_offsets":[0,8],"sharding":"row"}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend(json);
    write(&f, &b);
    let err = source::read_safetensors_header(&f).unwrap_err().to_string();
    assert!(
        err.contains("x.weight") && err.contains("sharding"),
        "{err}"
    );
    // Too short to hold the length.
    write(&f, b"abc");
    assert!(source::read_safetensors_header(&f).is_err());
}

#[test]
fn names_resolve_to_paths_or_repo_ids() {
    assert_eq!(
        source::resolve("Qwen/Qwen2.5-7B-Instruct").unwrap(),
        ModelRef::Repo("Qwen/Qwen2.5-7B-Instruct".into())
    );
    for bad in ["../etc", "a/b/c", "no-slash-and-no-file", "a/.."] {
        let err = source::resolve(bad).unwrap_err().to_string();
        assert!(err.contains(bad), "{err}");
    }
}

/// A Llama-shaped GGUF header (llama.cpp's tensor names), Q4_K weights, no data.
fn gguf_llama(path: &std::path::Path) {
    let (h, layers, ff, vocab) = (256u64, 4u64, 512u64, 1000u64);
    let mut t: Vec<(String, &str, Vec<u64>)> = vec![
        ("token_embd.weight".into(), "Q4_K", vec![vocab, h]),
        ("output_norm.weight".into(), "F32", vec![h]),
        ("output.weight".into(), "Q6_K", vec![vocab, h]),
    ];
    for l in 0..layers {
        for (n, ty, s) in [
            ("attn_norm.weight", "F32", vec![h]),
            ("attn_q.weight", "Q4_K", vec![h, h]),
            ("attn_k.weight", "Q4_K", vec![64, h]),
            ("attn_v.weight", "Q6_K", vec![64, h]),
            ("attn_output.weight", "Q4_K", vec![h, h]),
            ("ffn_norm.weight", "F32", vec![h]),
            ("ffn_gate.weight", "Q4_K", vec![ff, h]),
            ("ffn_up.weight", "Q4_K", vec![ff, h]),
            ("ffn_down.weight", "Q6_K", vec![h, ff]),
        ] {
            t.push((format!("blk.{l}.{n}"), ty, s));
        }
    }
    let meta = [
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(layers as u32)),
        ("llama.embedding_length", Meta::U32(h as u32)),
        ("llama.feed_forward_length", Meta::U32(ff as u32)),
        ("llama.attention.head_count", Meta::U32(8)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.context_length", Meta::U32(4096)),
    ];
    let refs: Vec<(&str, &str, Vec<u64>)> = t
        .iter()
        .map(|(a, b, c)| (a.as_str(), *b, c.clone()))
        .collect();
    std::fs::write(path, synth::gguf_bytes(&meta, &refs).unwrap()).unwrap();
}

#[test]
fn gguf_files_plan_under_llama_cpps_layer_split() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("tiny.gguf");
    gguf_llama(&f);
    let r = source::resolve(f.to_str().unwrap()).unwrap();
    let m = source::load_local(&r).unwrap();
    assert_eq!(m.arch.layers, 4);
    assert_eq!(m.arch.kv_heads, 2);
    assert_eq!(m.arch.head_dim, 32);
    let opts = Options {
        engine: Engine::LlamaCpp,
        max_model_len: Some(1024),
        ..Options::default()
    };
    let p = weft_plan::plan::plan(&m, layout(1, 2), cluster(2, 1, 1), &opts).unwrap();
    // Q4_K: 144 bytes per 256 elements; Q6_K: 210; F32: 4 per element.
    let q4 = |n: u64| n / 256 * 144;
    let q6 = |n: u64| n / 256 * 210;
    let layer = 256 * 4
        + q4(256 * 256) * 2
        + q4(64 * 256)
        + q6(64 * 256)
        + 256 * 4
        + q4(512 * 256) * 2
        + q6(256 * 512);
    // Device 0: layers 0-1; device 1: layers 2-3, the output norm and output; the input
    // embeddings stay in host memory.
    assert_eq!(p.ranks[0].weights_bytes, 2 * layer);
    assert_eq!(
        p.ranks[1].weights_bytes,
        2 * layer + 256 * 4 + q6(1000 * 256)
    );
    assert!(p.skipped.iter().any(|s| s.tensor == "token_embd.weight"));
    // f16 KV: 2 layers x 2 heads x (32 + 32) x 2 B per stage.
    assert_eq!(p.ranks[0].kv_bytes_per_token, 512);
    let err = weft_plan::plan::plan(&m, layout(2, 1), cluster(2, 1, 1), &opts).unwrap_err();
    assert!(err.to_string().contains("llama.cpp splits layers"), "{err}");
    let err =
        weft_plan::plan::plan(&m, layout(1, 2), cluster(2, 1, 1), &Options::default()).unwrap_err();
    assert!(err.to_string().contains("--engine llama.cpp"), "{err}");
    // A truncated GGUF is an error naming the file, not a hang or a panic.
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let err = source::load_local(&r).unwrap_err().to_string();
    assert!(err.contains("tiny.gguf"), "{err}");
}
