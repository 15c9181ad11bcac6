//! Nodes that differ: the pipeline split by memory (a 128 GB box beside a 24 GB one holds
//! what the even split cannot) and by speed (a node twice as fast takes about twice the
//! layers), and only what cannot be split refused, naming the node.

use super::*;
use weft_plan::plan::{Engine, Options};
use weft_plan::speed::{self, Hardware};
use weft_plan::uneven::{StageNode, plan_uneven};

fn node(name: &str, gib: u64, gbs: f64) -> StageNode {
    StageNode {
        name: name.into(),
        memory_bytes: gib << 30,
        memory_gbs: gbs,
    }
}

fn opts() -> Options {
    Options {
        max_model_len: Some(4096),
        hardware: Some(Hardware::new(speed::device("gb10").unwrap(), Engine::Vllm)),
        ..Options::default()
    }
}

#[test]
fn a_small_node_beside_a_big_one_takes_what_its_memory_holds() {
    let m = model(&fixture("mixtral-8x7b-v0.1"));
    let nodes = [node("spark", 128, 273.0), node("rtx4090", 24, 1008.0)];
    // The even split (16 + 16 layers) does not fit the 24 GB node.
    let even = weft_plan::plan::plan(&m, layout(1, 2), cluster(2, 1, 24), &opts()).unwrap();
    assert!(!even.fits);
    let p = plan_uneven(&m, &nodes, &opts()).unwrap();
    let part = p.pp_layer_partition.clone().unwrap();
    assert_eq!(part.iter().sum::<u64>(), 32, "{part:?}");
    assert!(p.fits, "{:?}", p.nodes);
    assert!(part[1] < part[0] && part[1] >= 1, "{part:?}");
    assert_eq!(p.ranks[1].layers, [part[0], 32]);
    assert_eq!(p.nodes[0].memory_bytes, 128 << 30);
    assert_eq!(p.nodes[1].memory_bytes, 24 << 30);
    // The fast node is memory-bound: one more layer would not fit it.
    let layer = (p.ranks[1].weights_bytes as f64 / part[1] as f64) as i64;
    assert!(p.ranks[1].headroom_bytes < layer, "{:?}", p.ranks[1]);
    // The speed model reads each stage at its node's bandwidth.
    let st = &p.speed.as_ref().unwrap().model.stages;
    assert_eq!(st[0].memory_gbs, Some(273.0));
    assert_eq!(st[1].memory_gbs, Some(1008.0));
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["pp_layer_partition"], serde_json::json!(part));
}

#[test]
fn a_node_twice_as_fast_takes_about_twice_the_layers() {
    let m = model(&fixture("llama-3-8b"));
    let nodes = [node("slow", 128, 500.0), node("fast", 128, 1000.0)];
    let p = plan_uneven(&m, &nodes, &opts()).unwrap();
    let part = p.pp_layer_partition.clone().unwrap();
    assert_eq!(part.iter().sum::<u64>(), 32);
    // 32 layers at 1:2 are 10.7 : 21.3; the first stage also holds the embedding.
    assert!((10..=12).contains(&part[0]), "{part:?}");
    // Equal nodes split evenly.
    let same = [node("a", 128, 500.0), node("b", 128, 500.0)];
    let p = plan_uneven(&m, &same, &opts()).unwrap();
    let part = p.pp_layer_partition.unwrap();
    assert!(part[0].abs_diff(part[1]) <= 2, "{part:?}");
}

#[test]
fn only_what_cannot_be_split_is_refused_and_the_node_is_named() {
    let m = model(&fixture("mixtral-8x7b-v0.1"));
    let e = plan_uneven(
        &m,
        &[node("spark", 128, 273.0), node("pi", 2, 10.0)],
        &opts(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pi (") && e.contains("cannot hold one layer"),
        "{e}"
    );
    let e = plan_uneven(&m, &[node("a", 24, 1000.0), node("b", 24, 1000.0)], &opts())
        .unwrap_err()
        .to_string();
    assert!(e.contains("together (a 21.60 GiB, b 21.60 GiB)"), "{e}");
    let e = plan_uneven(&m, &[node("a", 128, 1000.0)], &opts())
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least 2 nodes"), "{e}");
}
