//! `weft run --plan plan.json`: the layout `weft plan --json` chose (its stable fields
//! `layout {tp, pp, ep, dp}`, `cluster {nodes, gpus_per_node}`, `fits`, `max_model_len`,
//! `gpu_memory_utilization`, `kv_dtype`, `model`) turned into the flags of the vLLM recipe,
//! checked against the hosts the job runs on and the flags the user gave. Pure.

use serde::Deserialize;

use crate::LaunchError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PlanLayout {
    pub tp: u64,
    pub pp: u64,
    pub ep: bool,
    pub dp: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PlanCluster {
    pub nodes: u64,
    pub gpus_per_node: u64,
}

/// What a saved plan says about the launch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SavedPlan {
    pub model: String,
    pub layout: PlanLayout,
    pub cluster: PlanCluster,
    pub fits: bool,
    pub max_model_len: u64,
    pub gpu_memory_utilization: f64,
    pub kv_dtype: String,
}

impl SavedPlan {
    /// Reads `weft plan --json` output; `what` names the file in errors.
    pub fn parse(bytes: &[u8], what: &str) -> Result<SavedPlan, LaunchError> {
        let p: SavedPlan = serde_json::from_slice(bytes).map_err(|e| {
            LaunchError::Usage(format!(
                "{what}: not the output of `weft plan --json` ({e})"
            ))
        })?;
        let l = p.layout;
        if l.tp == 0 || l.pp == 0 || l.dp == 0 || p.cluster.gpus_per_node == 0 {
            return Err(LaunchError::Usage(format!(
                "{what}: layout tp={} pp={} dp={} on {} GPU(s) per node is not a layout",
                l.tp, l.pp, l.dp, p.cluster.gpus_per_node
            )));
        }
        Ok(p)
    }

    /// The nodes the layout occupies: tp x pp x dp GPUs, filled node by node.
    pub fn nodes_used(&self) -> u64 {
        (self.layout.tp * self.layout.pp * self.layout.dp).div_ceil(self.cluster.gpus_per_node)
    }
}

/// The value of `--flag V`, `--flag=V` or one of its short spellings in `args`.
fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    for (i, a) in args.iter().enumerate() {
        for n in names {
            if a == n {
                return args.get(i + 1).map(String::as_str);
            }
            if let Some(v) = a.strip_prefix(&format!("{n}=")) {
                return Some(v);
            }
        }
    }
    None
}

/// `cmd` (`vllm serve MODEL ...`) with the plan's layout added: tensor and pipeline
/// parallel sizes, expert parallelism, and the max-model-len, memory fraction and KV dtype
/// the plan was checked with, each unless the user set it to the same value (a different
/// value is an error naming both). `hosts` is the number of nodes the job runs on; it must
/// be the number the layout occupies. Returns the command and notes for the user.
pub fn apply(
    plan: &SavedPlan,
    what: &str,
    cmd: &[String],
    hosts: usize,
) -> Result<(Vec<String>, Vec<String>), LaunchError> {
    let is_vllm = cmd
        .first()
        .is_some_and(|c| c.rsplit('/').next() == Some("vllm"))
        && cmd.get(1).is_some_and(|a| a == "serve");
    if !is_vllm {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: a plan drives the vLLM recipe (`weft run --plan {what} -- vllm serve MODEL`); for other commands pass the layout yourself"
        )));
    }
    if !plan.fits {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: the plan says the model does NOT fit (tp={} pp={}); nothing launched: plan again with more nodes, a smaller --max-model-len or quantised weights",
            plan.layout.tp, plan.layout.pp
        )));
    }
    if plan.layout.dp > 1 {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: dp={}: weft run's vLLM recipe launches one engine (tp x pp); run data-parallel replicas as separate jobs",
            plan.layout.dp
        )));
    }
    let used = plan.nodes_used();
    if used != hosts as u64 {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: the layout tp={} x pp={} on {} GPU(s) per node takes {used} node(s), but the job has {hosts} host(s)",
            plan.layout.tp, plan.layout.pp, plan.cluster.gpus_per_node
        )));
    }
    let mut notes = Vec::new();
    if let Some(m) = cmd.get(2)
        && !m.starts_with('-')
        && *m != plan.model
    {
        notes.push(format!(
            "--plan {what} was made for {}, the command serves {m}: the layout is applied as planned",
            plan.model
        ));
    }
    let mut out = cmd.to_vec();
    let args = &cmd[2..];
    let want = |out: &mut Vec<String>,
                names: &[&str],
                value: String,
                flag: &str|
     -> Result<(), LaunchError> {
        match flag_value(args, names) {
            Some(v) if v == value => Ok(()),
            Some(v) => Err(LaunchError::Usage(format!(
                "{flag} {v} in the command, but --plan {what} says {value}; leave it out or make them agree"
            ))),
            None => {
                out.push(flag.to_string());
                out.push(value);
                Ok(())
            }
        }
    };
    want(
        &mut out,
        &["--tensor-parallel-size", "-tp"],
        plan.layout.tp.to_string(),
        "--tensor-parallel-size",
    )?;
    want(
        &mut out,
        &["--pipeline-parallel-size", "-pp"],
        plan.layout.pp.to_string(),
        "--pipeline-parallel-size",
    )?;
    want(
        &mut out,
        &["--max-model-len"],
        plan.max_model_len.to_string(),
        "--max-model-len",
    )?;
    if flag_value(args, &["--gpu-memory-utilization"]).is_none() {
        out.push("--gpu-memory-utilization".into());
        out.push(format!("{}", plan.gpu_memory_utilization));
    }
    if plan.kv_dtype == "fp8" {
        want(
            &mut out,
            &["--kv-cache-dtype"],
            "fp8".into(),
            "--kv-cache-dtype",
        )?;
    }
    let has_ep = args
        .iter()
        .any(|a| a == "--enable-expert-parallel" || a == "-ep");
    if plan.layout.ep && !has_ep {
        out.push("--enable-expert-parallel".into());
    } else if !plan.layout.ep && has_ep {
        return Err(LaunchError::Usage(format!(
            "--enable-expert-parallel in the command, but --plan {what} was planned without expert parallelism (its per-GPU memory differs); plan with --ep"
        )));
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn plan(tp: u64, pp: u64, ep: bool, gpus: u64) -> SavedPlan {
        let j = serde_json::json!({
            "model": "Qwen/Qwen3-235B-A22B", "layout": {"tp": tp, "pp": pp, "ep": ep, "dp": 1},
            "cluster": {"nodes": 4, "gpus_per_node": gpus, "gpu_memory_bytes": 1},
            "fits": true, "max_model_len": 32768, "gpu_memory_utilization": 0.9,
            "kv_dtype": "auto", "ranks": [],
        });
        SavedPlan::parse(j.to_string().as_bytes(), "plan.json").unwrap()
    }

    #[test]
    fn the_plan_sets_the_vllm_layout_and_refuses_what_disagrees() {
        let cmd = s(&["vllm", "serve", "Qwen/Qwen3-235B-A22B"]);
        let (v, notes) = apply(&plan(2, 2, false, 1), "plan.json", &cmd, 4).unwrap();
        assert_eq!(
            v.join(" "),
            "vllm serve Qwen/Qwen3-235B-A22B --tensor-parallel-size 2 --pipeline-parallel-size 2 --max-model-len 32768 --gpu-memory-utilization 0.9"
        );
        assert!(notes.is_empty());
        // 8 GPUs per node: tp=8 pp=2 takes 2 nodes, not 4.
        let e = apply(&plan(8, 2, true, 8), "plan.json", &cmd, 4).unwrap_err();
        assert!(
            e.to_string().contains("takes 2 node(s), but the job has 4"),
            "{e}"
        );
        let (v, _) = apply(&plan(8, 2, true, 8), "plan.json", &cmd, 2).unwrap();
        assert!(v.contains(&"--enable-expert-parallel".to_string()), "{v:?}");
        // The user's own equal value stays once; a different one is refused.
        let mine = s(&["vllm", "serve", "m", "-tp", "2"]);
        let (v, notes) = apply(&plan(2, 2, false, 1), "plan.json", &mine, 4).unwrap();
        assert_eq!(
            v.iter()
                .filter(|a| a.contains("tensor-parallel") || *a == "-tp")
                .count(),
            1
        );
        assert!(
            notes[0].contains("made for Qwen/Qwen3-235B-A22B"),
            "{notes:?}"
        );
        let bad = s(&["vllm", "serve", "m", "--tensor-parallel-size=4"]);
        let e = apply(&plan(2, 2, false, 1), "plan.json", &bad, 4).unwrap_err();
        assert!(
            e.to_string()
                .contains("--tensor-parallel-size 4 in the command"),
            "{e}"
        );
        let e = apply(
            &plan(2, 2, false, 1),
            "plan.json",
            &s(&["torchrun", "t.py"]),
            4,
        )
        .unwrap_err();
        assert!(e.to_string().contains("vLLM recipe"), "{e}");
        let mut no = plan(2, 2, false, 1);
        no.fits = false;
        assert!(
            apply(&no, "plan.json", &cmd, 4)
                .unwrap_err()
                .to_string()
                .contains("NOT fit")
        );
        assert!(
            SavedPlan::parse(b"{}", "x.json")
                .unwrap_err()
                .to_string()
                .contains("x.json")
        );
    }
}
