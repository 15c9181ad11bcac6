//! weft-plan's integration tests: hand-computed rules, published figures, sources
//! (local files and a real HTTP server with Range support).

mod corners;
mod formats;
mod http;
mod published;
mod rules;
mod speed;
mod uneven;

use serde_json::Value;
use weft_plan::plan::{Cluster, Format, Layout, Model, Options, Plan};
use weft_plan::{arch, synth};

pub const GIB: f64 = (1u64 << 30) as f64;

/// A real model's config.json from fixtures/configs.
pub fn fixture(name: &str) -> Value {
    let p = format!(
        "{}/fixtures/configs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))).unwrap()
}

/// A model from a config, with the tensors its checkpoint holds (header-only).
pub fn model(config: &Value) -> Model {
    let arch = arch::from_config(config).unwrap();
    let tensors = synth::tensors(&arch, config).unwrap();
    Model {
        source: "test".into(),
        arch,
        tensors,
        format: Format::Safetensors,
        warnings: vec![],
    }
}

pub fn layout(tp: u64, pp: u64) -> Layout {
    Layout {
        tp,
        pp,
        ep: false,
        dp: 1,
    }
}

pub fn cluster(nodes: u64, gpus: u64, gib: u64) -> Cluster {
    Cluster {
        nodes,
        gpus_per_node: gpus,
        gpu_memory_bytes: gib << 30,
    }
}

pub fn plan(m: &Model, l: Layout, c: Cluster) -> Plan {
    weft_plan::plan::plan(m, l, c, &Options::default()).unwrap()
}
