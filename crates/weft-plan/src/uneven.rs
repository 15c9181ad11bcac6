//! Nodes that differ (a 128 GB box beside a 24 GB one, or a slower GPU): a pipeline whose
//! stages hold as many layers as each node's memory and speed allow. Pure.
//!
//! The split balances the stages' time per step (a stage's weight bytes over its node's
//! memory bandwidth): the slowest stage sets the pace of a full pipeline, so the smallest
//! possible longest stage is sought (a binary search on it; for each bound the nodes, in
//! order, take as many layers as fit both the bound and their memory, leaving one for each
//! node after them). A node's memory must hold its layers' weights, the engine's overhead
//! and its layers' KV cache for one sequence of max-model-len. Only what cannot be split is
//! refused: a node that cannot hold one layer is named, as is a cluster whose nodes
//! together cannot hold the model.
//!
//! The costs per layer come from the planner itself (a plan with one stage per layer), so
//! the split counts what each stage really holds (the embedding with the first, the LM
//! head with the last); the result is a plan with [`crate::plan::Options::pp_partition`]
//! and each node's memory, and its speed prediction with each stage at its node's
//! bandwidth. vLLM takes the split as `VLLM_PP_LAYER_PARTITION`, llama.cpp as
//! `--tensor-split` (`weft run --plan`).

use serde::Serialize;

use crate::PlanError;
use crate::plan::{Cluster, Layout, Model, Options, Plan};

/// One node of a cluster whose nodes differ (one GPU each).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageNode {
    pub name: String,
    /// The GPU's memory.
    pub memory_bytes: u64,
    /// Its memory bandwidth, GB/s (the speed the split balances).
    pub memory_gbs: f64,
}

fn refuse(why: String) -> PlanError {
    PlanError::Layout {
        rule: "an uneven pipeline gives every node layers that fit its memory".into(),
        detail: why,
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The layers per stage for `nodes` (see the module docs); what each layer costs comes from
/// `per_layer`, a plan with one stage per layer.
fn partition(per_layer: &Plan, nodes: &[StageNode], opts: &Options) -> Result<Vec<u64>, PlanError> {
    let len = per_layer.max_model_len as u128 * per_layer.max_num_seqs.max(1) as u128;
    let w: Vec<u128> = per_layer
        .ranks
        .iter()
        .map(|r| u128::from(r.weights_bytes))
        .collect();
    let kv: Vec<u128> = per_layer
        .ranks
        .iter()
        .map(|r| u128::from(r.kv_bytes_per_token) * len)
        .collect();
    let layers = w.len();
    let n = nodes.len();
    if n > layers {
        return Err(refuse(format!(
            "{n} nodes but {layers} layers: a stage per node needs at least one layer each"
        )));
    }
    let ovh = u128::from(per_layer.overhead_bytes);
    let budget: Vec<u128> = nodes
        .iter()
        .map(|d| (d.memory_bytes as f64 * opts.gpu_memory_utilization) as u128)
        .collect();
    let fits = |j: usize, a: usize, b: usize| -> bool {
        let mem: u128 = w[a..b].iter().sum::<u128>() + kv[a..b].iter().sum::<u128>() + ovh;
        mem <= budget[j]
    };
    let time = |j: usize, a: usize, b: usize| -> f64 {
        w[a..b].iter().sum::<u128>() as f64 / (nodes[j].memory_gbs * 1e9)
    };
    // Nodes in order, each taking the most layers within the bound and its memory.
    let greedy = |bound: f64| -> Option<Vec<u64>> {
        let mut out = Vec::with_capacity(n);
        let mut pos = 0;
        for j in 0..n {
            let last = layers - (n - j - 1);
            let mut end = pos;
            while end < last && fits(j, pos, end + 1) && time(j, pos, end + 1) <= bound {
                end += 1;
            }
            if end == pos {
                return None;
            }
            out.push((end - pos) as u64);
            pos = end;
        }
        (pos == layers).then_some(out)
    };
    let Some(mut best) = greedy(f64::INFINITY) else {
        // Why not: a node that cannot hold even its cheapest layer, else too little in all.
        let weak: Vec<String> = (0..n)
            .filter(|&j| !(0..layers).any(|l| fits(j, l, l + 1)))
            .map(|j| {
                format!(
                    "{} ({} usable) cannot hold one layer with the overhead ({}) and one sequence's KV cache",
                    nodes[j].name,
                    gib(budget[j] as u64),
                    gib(per_layer.overhead_bytes)
                )
            })
            .collect();
        if !weak.is_empty() {
            return Err(refuse(weak.join("; ")));
        }
        let need: u128 = w.iter().sum::<u128>() + kv.iter().sum::<u128>() + ovh * n as u128;
        return Err(refuse(format!(
            "the nodes hold {} together ({}), the model with the overhead and one sequence's KV cache on each needs {}",
            gib(budget.iter().sum::<u128>() as u64),
            nodes
                .iter()
                .zip(&budget)
                .map(|(d, b)| format!("{} {}", d.name, gib(*b as u64)))
                .collect::<Vec<_>>()
                .join(", "),
            gib(need as u64)
        )));
    };
    let longest = |p: &[u64]| -> f64 {
        let mut a = 0usize;
        let mut t: f64 = 0.0;
        for (j, &l) in p.iter().enumerate() {
            t = t.max(time(j, a, a + l as usize));
            a += l as usize;
        }
        t
    };
    let (mut lo, mut hi) = (0.0, longest(&best));
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        match greedy(mid) {
            Some(p) => {
                hi = longest(&p).min(mid);
                best = p;
            }
            None => lo = mid,
        }
    }
    Ok(best)
}

/// The plan of `model` on `nodes` (one GPU each, in pipeline order: the first is stage 0)
/// with the layers split by memory and speed. `opts.hardware`, when given, predicts the
/// speed with each stage at its node's bandwidth.
pub fn plan_uneven(model: &Model, nodes: &[StageNode], opts: &Options) -> Result<Plan, PlanError> {
    if nodes.len() < 2 {
        return Err(refuse("an uneven pipeline needs at least 2 nodes".into()));
    }
    if let Some(d) = nodes
        .iter()
        .find(|d| d.memory_bytes == 0 || !(d.memory_gbs.is_finite() && d.memory_gbs > 0.0))
    {
        return Err(refuse(format!(
            "{}: memory {} bytes at {} GB/s is not a node",
            d.name, d.memory_bytes, d.memory_gbs
        )));
    }
    let layers = model.arch.layers;
    let big = Cluster {
        nodes: layers,
        gpus_per_node: 1,
        gpu_memory_bytes: nodes.iter().map(|d| d.memory_bytes).max().unwrap_or(0),
    };
    let probe_opts = Options {
        hardware: None,
        node_memory_bytes: None,
        pp_partition: None,
        ..opts.clone()
    };
    let one_each = Layout {
        tp: 1,
        pp: layers,
        ep: false,
        dp: 1,
    };
    let per_layer = crate::plan::plan(model, one_each, big, &probe_opts)?;
    let part = partition(&per_layer, nodes, opts)?;
    let cluster = Cluster {
        nodes: nodes.len() as u64,
        ..big
    };
    let o = Options {
        node_memory_bytes: Some(nodes.iter().map(|d| d.memory_bytes).collect()),
        pp_partition: Some(part),
        ..opts.clone()
    };
    let layout = Layout {
        tp: 1,
        pp: nodes.len() as u64,
        ep: false,
        dp: 1,
    };
    let mut plan = crate::plan::plan(model, layout, cluster, &o)?;
    if let Some(pred) = plan.speed.as_mut() {
        for (st, d) in pred.model.stages.iter_mut().zip(nodes) {
            st.memory_gbs = Some(d.memory_gbs);
        }
        let m = &pred.model;
        pred.decode = m.decode(0);
        pred.decode_at_context = m.decode(pred.context_tokens);
        pred.prompt = m.prompt(pred.prompt_tokens, 0);
    }
    Ok(plan)
}

/// A node as its agent reported it: its name, and each GPU's NVML name and memory.
pub type ReportedNode = (String, Vec<(String, Option<u64>)>);

/// Nodes that differ as a group's agents reported them (name, and each GPU's NVML name and
/// memory): `Some` when every node has one GPU of known memory and the nodes differ in
/// memory or in the device the table knows them as; `None` when the group is one the even
/// planner models (equal nodes) or one this cannot split (several GPUs a node, unknown
/// memory), which the cluster rules then accept or refuse by name. Bandwidth is the table's
/// figure for each GPU; when any GPU is not in the table, every node counts as equally fast
/// and the split follows memory alone.
pub fn from_reports(nodes: &[ReportedNode]) -> Option<Vec<StageNode>> {
    if nodes.len() < 2 || nodes.iter().any(|(_, g)| g.len() != 1 || g[0].1.is_none()) {
        return None;
    }
    let devices: Vec<Option<&crate::speed::DeviceSpec>> = nodes
        .iter()
        .map(|(_, g)| crate::speed::device_from_gpu_name(&g[0].0))
        .collect();
    let known = devices.iter().all(Option::is_some);
    let out: Vec<StageNode> = nodes
        .iter()
        .zip(&devices)
        .map(|((name, g), d)| StageNode {
            name: name.clone(),
            memory_bytes: g[0].1.unwrap_or(0),
            memory_gbs: match (known, d) {
                (true, Some(d)) => d.memory_gbs,
                _ => 1.0,
            },
        })
        .collect();
    let differ = out
        .windows(2)
        .any(|w| w[0].memory_bytes != w[1].memory_bytes || w[0].memory_gbs != w[1].memory_gbs);
    differ.then_some(out)
}

/// What the flags say beside `--gpu-memory A,B,...` (one value per node): the shape they
/// ask for, which must be the uneven planner's (one GPU a node, tp=1, no ep, dp=1), and the
/// device for all nodes or one per node (`--device a,b`; gb10 when none is named) whose
/// bandwidth `--memory-gbs` replaces.
#[derive(Debug, Clone, Default)]
pub struct NodeFlags<'a> {
    /// `--group` was given (its nodes would replace these).
    pub group: bool,
    pub nodes: Option<u64>,
    pub gpus_per_node: Option<u64>,
    pub tp: Option<u64>,
    pub ep: bool,
    pub dp: u64,
    pub device: Option<&'a str>,
    pub memory_gbs: Option<f64>,
}

/// Nodes that differ, from one memory per node and the flags: each node's memory and the
/// bandwidth of its device in [`crate::speed::DEVICES`]. A shape other than a pipeline of
/// one GPU a node, a device count that is neither one nor one per node, and a device the
/// table does not have are refused with the flag to change.
pub fn stage_nodes(memories: &[u64], f: &NodeFlags) -> Result<Vec<StageNode>, PlanError> {
    let n = memories.len();
    let flags = |why: String| Err(PlanError::Flags(why));
    if f.group {
        return flags(format!(
            "--gpu-memory with {n} values lists nodes that differ; with --group give one value (it replaces every GPU's)"
        ));
    }
    if f.nodes.is_some_and(|x| x != n as u64) || f.gpus_per_node.is_some_and(|g| g != 1) {
        return flags(format!(
            "--gpu-memory lists {n} nodes of one GPU each; --nodes and --gpus-per-node must agree (or be left out)"
        ));
    }
    if f.tp.is_some_and(|t| t != 1) || f.ep || f.dp != 1 {
        return flags(
            "nodes that differ are planned as a pipeline of one GPU each (tp=1, no ep, dp=1)"
                .into(),
        );
    }
    let devices: Vec<&str> = f.device.unwrap_or("gb10").split(',').collect();
    if devices.len() != 1 && devices.len() != n {
        return flags(format!(
            "--device lists {} devices for {n} nodes: give one, or one per node",
            devices.len()
        ));
    }
    let mut out = Vec::new();
    for (i, m) in memories.iter().enumerate() {
        let dev = devices[if devices.len() == 1 { 0 } else { i }];
        let Some(d) = crate::speed::device(dev) else {
            return flags(format!("--device {dev:?}: not in the table"));
        };
        out.push(StageNode {
            name: format!("node{i} ({})", d.name),
            memory_bytes: *m,
            memory_gbs: f.memory_gbs.unwrap_or(d.memory_gbs),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, gpus: &[(&str, Option<u64>)]) -> ReportedNode {
        (
            name.into(),
            gpus.iter().map(|(g, m)| (g.to_string(), *m)).collect(),
        )
    }

    #[test]
    fn a_group_of_single_gpu_nodes_that_differ_is_planned_unevenly() {
        let spark = n("spark", &[("NVIDIA GB10", Some(128 << 30))]);
        let desk = n("desk", &[("NVIDIA GeForce RTX 4090", Some(24 << 30))]);
        let u = from_reports(&[spark.clone(), desk.clone()]).unwrap();
        assert_eq!(u[0].memory_gbs, 273.0);
        assert_eq!(u[1].memory_gbs, 1008.0);
        assert_eq!(u[1].memory_bytes, 24 << 30);
        // Equal nodes, several GPUs a node, unknown memory: not this planner's.
        assert!(from_reports(&[spark.clone(), spark.clone()]).is_none());
        let two = n("two", &[("NVIDIA H200", Some(1)), ("NVIDIA H200", Some(1))]);
        assert!(from_reports(&[spark.clone(), two]).is_none());
        assert!(from_reports(&[spark.clone(), n("x", &[("NVIDIA GB10", None)])]).is_none());
        // A GPU the table does not know: memory alone decides.
        let odd = n("odd", &[("Some GPU", Some(24 << 30))]);
        let u = from_reports(&[spark, odd]).unwrap();
        assert!(u.iter().all(|s| s.memory_gbs == 1.0));
    }

    #[test]
    fn flags_name_one_device_or_one_per_node_and_a_pipeline_of_single_gpus() {
        let flags = NodeFlags {
            dp: 1,
            ..Default::default()
        };
        let mem = [128 << 30, 24 << 30];
        let u = stage_nodes(&mem, &flags).unwrap();
        assert_eq!(u[0].name, "node0 (gb10)");
        assert_eq!(u[1].memory_bytes, 24 << 30);
        assert!(u.iter().all(|s| s.memory_gbs == 273.0));
        let each = NodeFlags {
            device: Some("gb10,4090"),
            ..flags.clone()
        };
        let u = stage_nodes(&mem, &each).unwrap();
        assert_eq!(u[1].name, "node1 (rtx-4090)");
        assert_eq!(u[1].memory_gbs, 1008.0);
        let fixed = NodeFlags {
            memory_gbs: Some(500.0),
            ..each.clone()
        };
        assert!(
            stage_nodes(&mem, &fixed)
                .unwrap()
                .iter()
                .all(|s| s.memory_gbs == 500.0)
        );
        let err = |f: NodeFlags| stage_nodes(&mem, &f).unwrap_err().to_string();
        assert!(
            err(NodeFlags {
                group: true,
                ..flags.clone()
            })
            .contains("with --group give one value")
        );
        assert!(
            err(NodeFlags {
                nodes: Some(3),
                ..flags.clone()
            })
            .contains("--nodes and --gpus-per-node must agree")
        );
        assert!(
            err(NodeFlags {
                gpus_per_node: Some(2),
                ..flags.clone()
            })
            .contains("must agree")
        );
        assert!(
            err(NodeFlags {
                tp: Some(2),
                ..flags.clone()
            })
            .contains("(tp=1, no ep, dp=1)")
        );
        assert!(
            err(NodeFlags {
                ep: true,
                ..flags.clone()
            })
            .contains("(tp=1, no ep, dp=1)")
        );
        assert_eq!(
            err(NodeFlags {
                device: Some("gb10,gb10,gb10"),
                ..flags.clone()
            }),
            "--device lists 3 devices for 2 nodes: give one, or one per node"
        );
        assert_eq!(
            err(NodeFlags {
                device: Some("gb10,abacus"),
                ..flags
            }),
            "--device \"abacus\": not in the table"
        );
    }
}
