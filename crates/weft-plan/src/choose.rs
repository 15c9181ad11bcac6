//! Which layout `weft plan` plans, and with which device and link figures: the policy that
//! sits between the flags and [`crate::plan`]. Pure like the rest of the core: values in, a
//! [`Report`] out (the binary reads `--links` and the model; this module reads nothing).
//!
//! - A layout the user fixed (`--tp` and/or `--pp`) is planned as it is; a missing PP is
//!   the GPUs left over, `world / (tp x dp)`, at least 1.
//! - llama.cpp has one layout: its layer split over every GPU (TP 1, PP = all GPUs).
//! - Otherwise every layout that uses all GPUs is planned and ranked
//!   ([`crate::plan::candidates`]); with EP asked for, only EP layouts (or every layout of a
//!   dense model) stay; the best that planned is the answer, or an error listing why each
//!   was refused.
//!
//! [`hardware`] turns the speed figures the user gave (a device name, overrides, a measured
//! link) into [`Hardware`], each figure with where it came from.

use serde::Serialize;

use crate::PlanError;
use crate::plan::{self, Candidate, Cluster, Engine, Layout, Model, Options, Plan};
use crate::speed::{self, Hardware, ScalePoint};

/// The layout the user asked for; `None`s are left to the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayoutRequest {
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub ep: bool,
    pub dp: u64,
}

/// What `weft plan --json` prints: the chosen plan's fields, the ranked candidates when the
/// layout was chosen by ranking, and the speed model per node count.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub plan: Plan,
    /// Present when the layout was chosen by ranking: every layout considered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<Candidate>>,
    /// The fastest layout that fits on 1, 2, ... of the cluster's nodes and its speed
    /// model: `weft bench llm compare --plan` predicts each measured run from it.
    pub scaling: Vec<ScalePoint>,
}

/// Plans `model` on `cluster` with the layout the request fixes, llama.cpp's layout, or the
/// best ranked one (see the module's doc).
pub fn choose(
    model: &Model,
    cluster: Cluster,
    opts: &Options,
    req: LayoutRequest,
) -> Result<Report, PlanError> {
    let world = cluster.nodes * cluster.gpus_per_node;
    let fixed = match (req.tp, req.pp) {
        (None, None) if opts.engine == Engine::LlamaCpp => Some(Layout {
            tp: 1,
            pp: world,
            ep: false,
            dp: 1,
        }),
        (None, None) => None,
        (tp, pp) => {
            let tp = tp.unwrap_or(1);
            let pp = match pp {
                Some(p) => p,
                None => (world / (tp * req.dp)).max(1),
            };
            Some(Layout {
                tp,
                pp,
                ep: req.ep,
                dp: req.dp,
            })
        }
    };
    if let Some(layout) = fixed {
        return Ok(Report {
            plan: plan::plan(model, layout, cluster, opts)?,
            candidates: None,
            scaling: speed::scaling(model, cluster, opts),
        });
    }
    let mut cands = plan::candidates(model, cluster, opts);
    if req.ep {
        cands.retain(|(c, _)| c.layout.ep || model.arch.experts == 0);
    }
    let best = cands.iter().find_map(|(_, p)| p.clone());
    let list: Vec<Candidate> = cands.into_iter().map(|(c, _)| c).collect();
    match best {
        Some(p) => Ok(Report {
            plan: p,
            candidates: Some(list),
            scaling: speed::scaling(model, cluster, opts),
        }),
        None => Err(PlanError::NoLayout {
            gpus: world,
            why: list
                .iter()
                .filter_map(|c| c.refused.clone())
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// A link measured by `weft bench p2p --json`: the median pair's rate and round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredLink {
    /// Where it was read from, as the user named it.
    pub from: String,
    pub median_gbps: f64,
    pub median_rtt_us: f64,
    /// Pairs that were measured (at least 1).
    pub pairs: usize,
}

/// The speed figures the user gave, each `None` when not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// A device of [`speed::DEVICES`] by name (`--device`).
    pub device: Option<String>,
    /// The GPU the agents reported (`--group`), used when no device is named.
    pub reported_gpu: Option<String>,
    pub memory_gbs: Option<f64>,
    /// Dense peak, for BF16 and FP8 alike.
    pub tflops: Option<f64>,
    pub measured_link: Option<MeasuredLink>,
    pub link_gbps: Option<f64>,
    pub link_latency_us: Option<f64>,
    pub step_overhead_us: Option<f64>,
}

/// The device and link figures (or the GPU the group's agents reported), each with where it
/// came from; gb10 when nothing names a device.
pub fn hardware(f: &Figures, engine: Engine) -> Result<Hardware, PlanError> {
    let reported_gpu = f.reported_gpu.as_deref();
    let reported = reported_gpu.and_then(|g| speed::device_from_gpu_name(g).map(|d| (g, d)));
    let name = match (&f.device, reported) {
        // `--device a,b` names one per node (nodes that differ): the first speaks for all here.
        (Some(n), _) => n.split(',').next().unwrap_or(n),
        (None, Some((_, d))) => d.name,
        (None, None) => "gb10",
    };
    let d = speed::device(name).ok_or_else(|| PlanError::UnknownDevice {
        name: name.to_string(),
        known: speed::DEVICES
            .iter()
            .map(|d| d.name)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    let mut hw = Hardware::new(d, engine);
    match (&f.device, reported, reported_gpu) {
        (Some(_), _, _) => {}
        (None, Some((g, _)), _) => {
            hw.sources[0] = format!(
                "device {} from the agents' report ({g}): {}",
                d.name, d.source
            )
        }
        (None, None, Some(g)) => {
            hw.sources[0] = format!(
                "device gb10 assumed: the agents report {g:?}, which the table does not have (--device, --memory-gbs and --tflops say yours): {}",
                d.source
            )
        }
        (None, None, None) => {
            hw.sources[0] = format!("device gb10 assumed (--device names yours): {}", d.source)
        }
    }
    if let Some(v) = f.memory_gbs {
        hw.memory_gbs = v;
        hw.sources.push(format!("--memory-gbs {v}"));
    }
    if let Some(v) = f.tflops {
        hw.bf16_tflops = v;
        hw.fp8_tflops = v;
        hw.sources.push(format!("--tflops {v}"));
    }
    if let Some(m) = &f.measured_link {
        hw.link_gbps = m.median_gbps;
        hw.link_latency_us = m.median_rtt_us / 2.0;
        hw.sources[1] = format!(
            "link {:.1} Gb/s, {:.1} us: the median of {} pairs in {} (half the round trip)",
            m.median_gbps, hw.link_latency_us, m.pairs, m.from
        );
    }
    if f.link_gbps.is_some() || f.link_latency_us.is_some() {
        hw.link_gbps = f.link_gbps.unwrap_or(hw.link_gbps);
        hw.link_latency_us = f.link_latency_us.unwrap_or(hw.link_latency_us);
        hw.sources[1] = format!(
            "link {} Gb/s, {} us{}",
            hw.link_gbps,
            hw.link_latency_us,
            if f.link_gbps.is_some() && f.link_latency_us.is_some() {
                " (flags)"
            } else {
                " (flags, the rest assumed)"
            }
        );
    }
    if let Some(v) = f.step_overhead_us {
        hw.step_overhead_us = v;
        hw.sources[2] = format!("engine step overhead {v} us (--step-overhead-us)");
    }
    hw.check()?;
    Ok(hw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Format;
    use crate::{arch, synth};

    fn llama(layers: u64) -> Model {
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
            "intermediate_size": 1024, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
        });
        let arch = arch::from_config(&config).unwrap();
        Model {
            source: "test".into(),
            tensors: synth::tensors(&arch, &config).unwrap(),
            arch,
            format: Format::Safetensors,
            warnings: vec![],
        }
    }

    fn cluster(nodes: u64, gpus: u64) -> Cluster {
        Cluster {
            nodes,
            gpus_per_node: gpus,
            gpu_memory_bytes: 24 << 30,
        }
    }

    fn ask(tp: Option<u64>, pp: Option<u64>) -> LayoutRequest {
        LayoutRequest {
            tp,
            pp,
            ep: false,
            dp: 1,
        }
    }

    #[test]
    fn a_fixed_tp_gets_the_gpus_left_as_pp_and_no_ranking() {
        let r = choose(
            &llama(8),
            cluster(2, 2),
            &Options::default(),
            ask(Some(2), None),
        )
        .unwrap();
        assert_eq!((r.plan.layout.tp, r.plan.layout.pp), (2, 2));
        assert!(r.candidates.is_none());
        let r = choose(
            &llama(8),
            cluster(2, 2),
            &Options::default(),
            ask(None, Some(2)),
        )
        .unwrap();
        assert_eq!((r.plan.layout.tp, r.plan.layout.pp), (1, 2));
    }

    #[test]
    fn llama_cpp_splits_layers_over_every_gpu() {
        let opts = Options {
            engine: Engine::LlamaCpp,
            ..Options::default()
        };
        let mut m = llama(8);
        m.format = Format::Gguf;
        let r = choose(&m, cluster(3, 1), &opts, ask(None, None)).unwrap();
        assert_eq!((r.plan.layout.tp, r.plan.layout.pp), (1, 3));
        assert!(r.candidates.is_none());
    }

    #[test]
    fn unfixed_layouts_are_ranked_and_the_best_planned() {
        let r = choose(
            &llama(8),
            cluster(2, 2),
            &Options::default(),
            ask(None, None),
        )
        .unwrap();
        let c = r.candidates.unwrap();
        assert_eq!(c.len(), 3, "tp 1, 2 and 4 over 4 GPUs: {c:?}");
        assert_eq!(c[0].layout, r.plan.layout);
    }

    #[test]
    fn no_possible_layout_names_every_refusal() {
        // 8 heads over 3 GPUs: TP=3 does not divide them; 3 layouts need PP over 2 layers.
        let e = choose(
            &llama(2),
            cluster(3, 1),
            &Options::default(),
            ask(None, None),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("no layout of 3 GPUs is possible: "), "{e}");
        assert_eq!(e.matches("layout refused").count(), 2, "{e}");
    }

    #[test]
    fn figures_say_where_they_came_from() {
        let hw = hardware(&Figures::default(), Engine::Vllm).unwrap();
        assert_eq!(hw.device, "gb10");
        assert!(hw.sources[0].starts_with("device gb10 assumed (--device names yours)"));
        let f = Figures {
            reported_gpu: Some("NVIDIA H200".into()),
            measured_link: Some(MeasuredLink {
                from: "p2p.json".into(),
                median_gbps: 93.0,
                median_rtt_us: 20.0,
                pairs: 2,
            }),
            link_latency_us: Some(4.0),
            ..Figures::default()
        };
        let hw = hardware(&f, Engine::Vllm).unwrap();
        assert_eq!(hw.device, "h200");
        assert!(hw.sources[0].starts_with("device h200 from the agents' report (NVIDIA H200)"));
        assert_eq!((hw.link_gbps, hw.link_latency_us), (93.0, 4.0));
        assert_eq!(
            hw.sources[1],
            "link 93 Gb/s, 4 us (flags, the rest assumed)"
        );
        let e = hardware(
            &Figures {
                device: Some("abacus".into()),
                ..Figures::default()
            },
            Engine::Vllm,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--device \"abacus\": one of gb10, "), "{e}");
        let e = hardware(
            &Figures {
                memory_gbs: Some(0.0),
                ..Figures::default()
            },
            Engine::Vllm,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "device and link figures: memory bandwidth (GB/s) is 0: it must be a positive number"
        );
    }
}
