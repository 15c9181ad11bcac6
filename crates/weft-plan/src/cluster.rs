//! The cluster a plan is made for, from what the agents report: each node's GPUs and
//! their memory (through the controller's `GET /v1/groups/{group}/nodes`). Pure: the
//! caller fetches the reports; this decides what cluster they describe, or why they do
//! not describe one the planner can model.

use crate::PlanError;
use crate::plan::Cluster;

/// One node as its agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    pub name: String,
    /// Each GPU's total memory; `None` where the driver reports none (unified memory).
    pub memory_bytes: Vec<Option<u64>>,
    /// Whether the agent reports now (a stale node's GPUs are from its last report).
    pub live: bool,
}

fn refuse(what: &str, why: String) -> PlanError {
    PlanError::Source {
        what: what.to_string(),
        why,
    }
}

/// The cluster `nodes` (the members of group `group`) make: every node, the GPUs each
/// has (all nodes must have as many), and the smallest GPU's memory, or `gpu_memory`
/// when given (it wins over the reports, and must be given where a GPU reports none).
/// Returns the cluster and warnings that say what was assumed.
pub fn from_nodes(
    group: &str,
    nodes: &[NodeGpus],
    gpu_memory: Option<u64>,
) -> Result<(Cluster, Vec<String>), PlanError> {
    let what = format!("group {group}");
    if nodes.is_empty() {
        return Err(refuse(&what, "has no members".into()));
    }
    let none: Vec<&str> = nodes
        .iter()
        .filter(|n| n.memory_bytes.is_empty())
        .map(|n| n.name.as_str())
        .collect();
    if !none.is_empty() {
        return Err(refuse(
            &what,
            format!(
                "{} reported no GPUs (the agent reports the GPUs NVML sees); pass --nodes, --gpus-per-node and --gpu-memory instead",
                none.join(", ")
            ),
        ));
    }
    let gpus = nodes[0].memory_bytes.len();
    if nodes.iter().any(|n| n.memory_bytes.len() != gpus) {
        let counts: Vec<String> = nodes
            .iter()
            .map(|n| format!("{} has {}", n.name, n.memory_bytes.len()))
            .collect();
        return Err(refuse(
            &what,
            format!(
                "its nodes have different GPU counts ({}); weft plan models identical nodes: plan a group of equal nodes, or pass --nodes and --gpus-per-node",
                counts.join(", ")
            ),
        ));
    }
    let mut warnings = Vec::new();
    for n in nodes.iter().filter(|n| !n.live) {
        warnings.push(format!(
            "{}: its agent is not reporting; its GPUs are those of its last report",
            n.name
        ));
    }
    let memory = match gpu_memory {
        Some(m) => {
            warnings.push("GPU memory from --gpu-memory, not from the agents' reports".into());
            m
        }
        None => {
            let unknown: Vec<&str> = nodes
                .iter()
                .filter(|n| n.memory_bytes.iter().any(Option::is_none))
                .map(|n| n.name.as_str())
                .collect();
            if !unknown.is_empty() {
                return Err(refuse(
                    &what,
                    format!(
                        "{} reported GPUs without their memory (unified memory?); pass --gpu-memory",
                        unknown.join(", ")
                    ),
                ));
            }
            let all = nodes.iter().flat_map(|n| n.memory_bytes.iter().flatten());
            let min = all.clone().copied().min().unwrap_or(0);
            let max = all.copied().max().unwrap_or(0);
            if min != max {
                warnings.push(format!(
                    "GPUs of {group} differ in memory ({min} to {max} bytes): planned with the smallest"
                ));
            }
            min
        }
    };
    Ok((
        Cluster {
            nodes: nodes.len() as u64,
            gpus_per_node: gpus as u64,
            gpu_memory_bytes: memory,
        },
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, mem: &[Option<u64>]) -> NodeGpus {
        NodeGpus {
            name: name.into(),
            memory_bytes: mem.to_vec(),
            live: true,
        }
    }

    #[test]
    fn equal_nodes_make_a_cluster_and_differences_are_named() {
        let h200 = Some(150_754_820_096);
        let (c, w) =
            from_nodes("g", &[node("a", &[h200; 8]), node("b", &[h200; 8])], None).unwrap();
        assert_eq!(
            c,
            Cluster {
                nodes: 2,
                gpus_per_node: 8,
                gpu_memory_bytes: 150_754_820_096
            }
        );
        assert!(w.is_empty(), "{w:?}");
        let e = from_nodes("g", &[node("a", &[h200; 8]), node("b", &[h200; 4])], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a has 8, b has 4"), "{e}");
        let e = from_nodes("g", &[node("a", &[h200]), node("b", &[])], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("b reported no GPUs"), "{e}");
        let e = from_nodes("g", &[node("spark", &[None])], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("spark") && e.contains("--gpu-memory"), "{e}");
        let (c, w) = from_nodes("g", &[node("spark", &[None])], Some(128 << 30)).unwrap();
        assert_eq!(c.gpu_memory_bytes, 128 << 30);
        assert!(w[0].contains("--gpu-memory"), "{w:?}");
        let mut stale = node("b", &[Some(80), Some(100)]);
        stale.live = false;
        let (c, w) = from_nodes("g", &[node("a", &[Some(100), Some(100)]), stale], None).unwrap();
        assert_eq!(c.gpu_memory_bytes, 80);
        assert!(
            w.iter()
                .any(|w| w.contains("b: its agent is not reporting"))
        );
        assert!(w.iter().any(|w| w.contains("smallest")));
        assert!(from_nodes("g", &[], None).is_err());
    }
}
