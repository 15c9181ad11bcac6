//! Writes a header-only checkpoint (config.json and safetensors headers with real tensor
//! names, shapes and dtypes, no data) from a real model's config.json.
//!
//! `cargo run -p weft-plan --example header_only -- CONFIG.json OUT_DIR [SHARDS]`

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: header_only CONFIG.json OUT_DIR [SHARDS]");
        std::process::exit(2);
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&args[1]).expect("read config")).expect("json");
    let shards = args.get(3).map(|s| s.parse().expect("shards")).unwrap_or(1);
    let arch = weft_plan::arch::from_config(&config).expect("config");
    let tensors = weft_plan::synth::tensors(&arch, &config).expect("tensors");
    weft_plan::synth::write_checkpoint(std::path::Path::new(&args[2]), &config, &tensors, shards)
        .expect("write");
    println!(
        "{}: {} tensors in {shards} shard(s)",
        args[2],
        tensors.len()
    );
}
