//! `weft run --plan plan.json`: the layout `weft plan --json` chose (its stable fields
//! `layout {tp, pp, ep, dp}`, `cluster {nodes, gpus_per_node}`, `fits`, `max_model_len`,
//! `gpu_memory_utilization`, `kv_dtype`, `model`, `engine`, the ranks' `layers` and, for
//! nodes that differ, `pp_layer_partition`) turned into the flags of the vLLM recipe (and
//! `VLLM_PP_LAYER_PARTITION` for an uneven split) or of the llama.cpp recipe (`-ngl`,
//! `--tensor-split`, `--ctx-size`), checked against the hosts the job runs on and the flags
//! the user gave. Pure.

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

/// One rank of a saved plan: the layers its pipeline stage holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PlanRank {
    pub pp_stage: u64,
    pub tp_rank: u64,
    pub dp_rank: u64,
    /// First and one-past-last decoder layer.
    pub layers: [u64; 2],
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
    /// `vllm`, `sglang` or `llama_cpp` (plans saved before it was written: vLLM).
    #[serde(default)]
    pub engine: Option<String>,
    #[serde(default)]
    pub ranks: Vec<PlanRank>,
    /// Layers per pipeline stage when the plan split them unevenly (nodes that differ).
    #[serde(default)]
    pub pp_layer_partition: Option<Vec<u64>>,
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
        if let Some(part) = &p.pp_layer_partition
            && (part.len() as u64 != l.pp || part.contains(&0))
        {
            return Err(LaunchError::Usage(format!(
                "{what}: pp_layer_partition {part:?} is not {} non-empty stages",
                l.pp
            )));
        }
        Ok(p)
    }

    /// The nodes the layout occupies: tp x pp x dp GPUs, filled node by node.
    pub fn nodes_used(&self) -> u64 {
        (self.layout.tp * self.layout.pp * self.layout.dp).div_ceil(self.cluster.gpus_per_node)
    }

    /// Decoder layers per pipeline stage, in stage order: the uneven partition when the
    /// plan made one, else what its ranks hold.
    pub fn stage_layers(&self) -> Vec<u64> {
        if let Some(p) = &self.pp_layer_partition {
            return p.clone();
        }
        (0..self.layout.pp)
            .filter_map(|s| {
                self.ranks
                    .iter()
                    .find(|r| r.pp_stage == s && r.tp_rank == 0 && r.dp_rank == 0)
                    .map(|r| r.layers[1].saturating_sub(r.layers[0]))
            })
            .collect()
    }

    /// Environment the plan sets on every node: `VLLM_PP_LAYER_PARTITION` (layers per
    /// stage, comma-separated, as vLLM reads it) when the plan split the layers unevenly
    /// and the command is vLLM's.
    pub fn env(&self, cmd: &[String]) -> Vec<(String, String)> {
        match &self.pp_layer_partition {
            Some(p) if is_vllm(cmd) => vec![(
                "VLLM_PP_LAYER_PARTITION".into(),
                p.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            )],
            _ => Vec::new(),
        }
    }
}

fn is_vllm(cmd: &[String]) -> bool {
    cmd.first()
        .is_some_and(|c| c.rsplit('/').next() == Some("vllm"))
        && cmd.get(1).is_some_and(|a| a == "serve")
}

/// `llama-server ...` with the plan's pipeline placed ([`crate::llamacpp::placement`]) and
/// its context (`--ctx-size`), each unless the user set the same value.
fn apply_llama(
    plan: &SavedPlan,
    what: &str,
    cmd: &[String],
) -> Result<(Vec<String>, Vec<String>), LaunchError> {
    let engine = plan.engine.as_deref().unwrap_or("vllm");
    // `weft plan --json` writes the engine as `llama_cpp`.
    if !matches!(engine, "llama.cpp" | "llama_cpp") {
        return Err(LaunchError::Usage(format!(
            "--plan {what} was made for {engine}, the command is llama-server: plan with --engine llama.cpp"
        )));
    }
    let args = &cmd[1..];
    if let Some(v) = flag_value(args, &["-ngl", "--n-gpu-layers", "--gpu-layers"])
        .or_else(|| flag_value(args, &["-ts", "--tensor-split"]))
    {
        return Err(LaunchError::Usage(format!(
            "-ngl/--tensor-split {v} in the command, but --plan {what} places the layers itself; leave them out"
        )));
    }
    let stages = plan.stage_layers();
    if stages.len() as u64 != plan.layout.pp {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: its ranks do not say the layers of each of its {} stages",
            plan.layout.pp
        )));
    }
    let mut out = cmd.to_vec();
    out.extend(crate::llamacpp::placement(&stages)?);
    let ctx = plan.max_model_len.to_string();
    match flag_value(args, &["-c", "--ctx-size"]) {
        Some(v) if v == ctx => {}
        Some(v) => {
            return Err(LaunchError::Usage(format!(
                "--ctx-size {v} in the command, but --plan {what} says {ctx}; leave it out or make them agree"
            )));
        }
        None => out.extend(["--ctx-size".to_string(), ctx]),
    }
    Ok((out, Vec::new()))
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
    let llama = crate::llamacpp::is_llama_server(cmd);
    if !is_vllm(cmd) && !llama {
        return Err(LaunchError::Usage(format!(
            "--plan {what}: a plan drives the vLLM and llama.cpp recipes (`weft run --plan {what} -- vllm serve MODEL`, `-- llama-server -m MODEL.gguf`); for other commands pass the layout yourself"
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
    if llama {
        return apply_llama(plan, what, cmd);
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

    fn llama_plan(stages: &[(u64, u64)], partition: Option<Vec<u64>>) -> SavedPlan {
        let ranks: Vec<_> = stages
            .iter()
            .enumerate()
            .map(|(i, (a, b))| serde_json::json!({"rank": i, "pp_stage": i, "tp_rank": 0, "dp_rank": 0, "layers": [a, b], "weights_bytes": 1}))
            .collect();
        let j = serde_json::json!({
            "model": "tiny.gguf", "engine": "llama_cpp",
            "layout": {"tp": 1, "pp": stages.len(), "ep": false, "dp": 1},
            "cluster": {"nodes": stages.len(), "gpus_per_node": 1},
            "fits": true, "max_model_len": 2048, "gpu_memory_utilization": 0.9,
            "kv_dtype": "auto", "ranks": ranks, "pp_layer_partition": partition,
        });
        SavedPlan::parse(j.to_string().as_bytes(), "plan.json").unwrap()
    }

    #[test]
    fn a_llama_cpp_plan_places_its_stages_and_an_uneven_vllm_plan_sets_the_partition() {
        let cmd = s(&["/b/llama-server", "-m", "tiny.gguf"]);
        let p = llama_plan(&[(0, 2), (2, 4), (4, 6)], None);
        assert_eq!(p.stage_layers(), vec![2, 2, 2]);
        let (v, _) = apply(&p, "plan.json", &cmd, 3).unwrap();
        assert_eq!(
            v.join(" "),
            "/b/llama-server -m tiny.gguf --n-gpu-layers 5 --tensor-split 2,3 --ctx-size 2048"
        );
        assert!(p.env(&cmd).is_empty());
        let e = apply(&p, "plan.json", &cmd, 2).unwrap_err();
        assert!(e.to_string().contains("but the job has 2"), "{e}");
        let mine = s(&["llama-server", "-m", "x", "-ngl", "99"]);
        let e = apply(&p, "plan.json", &mine, 3).unwrap_err();
        assert!(e.to_string().contains("places the layers itself"), "{e}");
        // A vLLM plan is not a llama.cpp one.
        let e = apply(&plan(1, 2, false, 1), "plan.json", &cmd, 2).unwrap_err();
        assert!(e.to_string().contains("--engine llama.cpp"), "{e}");
        // An uneven partition: vLLM gets it as VLLM_PP_LAYER_PARTITION, llama.cpp as the split.
        let p = llama_plan(&[(0, 5), (5, 6)], Some(vec![5, 1]));
        let (v, _) = apply(&p, "plan.json", &cmd, 2).unwrap();
        assert!(
            v.join(" ").contains("--n-gpu-layers 2 --tensor-split 2"),
            "{v:?}"
        );
        let vllm = s(&["vllm", "serve", "m"]);
        assert_eq!(
            p.env(&vllm),
            vec![("VLLM_PP_LAYER_PARTITION".to_string(), "5,1".to_string())]
        );
        let j = serde_json::json!({
            "model": "m", "layout": {"tp": 1, "pp": 2, "ep": false, "dp": 1},
            "cluster": {"nodes": 2, "gpus_per_node": 1}, "fits": true, "max_model_len": 1,
            "gpu_memory_utilization": 0.9, "kv_dtype": "auto", "pp_layer_partition": [6, 0],
        });
        let e = SavedPlan::parse(j.to_string().as_bytes(), "p.json").unwrap_err();
        assert!(e.to_string().contains("p.json: pp_layer_partition"), "{e}");
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
        assert!(e.to_string().contains("vLLM and llama.cpp recipes"), "{e}");
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
