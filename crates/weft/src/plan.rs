//! `weft plan`: will this model fit on these nodes, and what will each GPU hold.
//! Glue only: the planner is `weft-plan`.

use anyhow::{Context, Result, bail};
use clap::Args;
use weft_controller::model::NodeView;
use weft_plan::choose::{self, Figures, LayoutRequest, MeasuredLink, Report};
use weft_plan::plan::{Cluster, Engine, KvDtype, Options};
use weft_plan::source::{self, HttpOptions, ModelRef};
use weft_plan::speed::Speed;

use crate::output::table;
use crate::{EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  weft plan meta-llama/Meta-Llama-3-8B --nodes 2 --gpu-memory 24GiB\n  weft plan ./Qwen3-235B-A22B-GPTQ-Int4 --nodes 2 --gpu-memory 128GiB --tp 2 --max-model-len 32768\n  weft plan deepseek-ai/DeepSeek-V3 --nodes 2 --gpus-per-node 8 --gpu-memory 141GB --ep --json\n  weft plan ./model.gguf --engine llama.cpp --nodes 2 --gpu-memory 24GiB\n  weft plan ./Qwen2.5-7B-Instruct --nodes 4 --gpu-memory 128GB --device gb10 --links p2p.json\n  WEFT_TOKEN=... weft plan Qwen/Qwen3-235B-A22B --group team-a --controller http://10.0.0.1:7100\n\nWith --group, the nodes, their GPUs and the GPUs' memory are the group's members as their\nagents reported them to the controller (GET /v1/groups/NAME/nodes); --gpu-memory replaces\nthe reported memory. Without it, --nodes, --gpus-per-node and --gpu-memory say.\n\nMODEL is a directory (config.json and *.safetensors or model.safetensors.index.json), one\n.safetensors file with config.json beside it, a .gguf file, or a Hugging Face repo id whose\nconfig and safetensors headers are read with HTTP Range requests (HF_ENDPOINT, HF_TOKEN),\nnever the weights.\n\nWithout --tp/--pp every layout that uses all GPUs is planned and ranked (fits, then the\nfastest predicted single-stream decode, then the fewest collectives and bytes between nodes\nper token, then KV capacity); the best is shown.\n\nThe prediction is a ceiling per step: memory (bytes read / bandwidth), compute (FLOPs / dense\npeak), TP all-reduces, pipeline hops, expert all-to-all and a fixed engine overhead, from the\n--device table (sources in --json) and the link between nodes (--links: `weft bench p2p\n--json` output; or --link-gbps/--link-latency-us; default 200 Gb/s, 10 us). With --group the\ndevice is the GPU the agents report. --json also carries a speed model per node count\n(scaling) for `weft bench llm compare --plan`.\n\nExit codes: 0 it fits, 1 it does not fit, 2 usage or environment error."
)]
pub struct PlanArgs {
    /// A model directory, a .safetensors or .gguf file, or a Hugging Face repo id.
    model: String,
    /// Nodes in the cluster (default 1; with --group, the group's members).
    #[arg(long, conflicts_with = "group")]
    nodes: Option<u64>,
    /// GPUs in each node (default 1; with --group, what the agents reported).
    #[arg(long, conflicts_with = "group")]
    gpus_per_node: Option<u64>,
    /// Memory of each GPU: 128GiB, 80GB, 24GiB (required without --group; with it, it
    /// replaces what the agents reported). Nodes that differ: one per node (128GiB,24GiB),
    /// one GPU each; the layers are then split unevenly by memory and --device speed.
    #[arg(long, required_unless_present = "group")]
    gpu_memory: Option<String>,
    #[command(flatten)]
    group: crate::group::GroupArgs,
    /// Tensor-parallel size (default: rank every layout).
    #[arg(long)]
    tp: Option<u64>,
    /// Pipeline-parallel size (default: all GPUs / tp).
    #[arg(long)]
    pp: Option<u64>,
    /// Expert parallelism: experts spread over EP = TP x DP ranks instead of split by TP.
    #[arg(long)]
    ep: bool,
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    dp: u64,
    /// Fraction of each GPU's memory the engine may use (vLLM's --gpu-memory-utilization).
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// KV cache dtype: auto (the model's), fp8 or bf16.
    #[arg(long, default_value = "auto")]
    kv_dtype: String,
    /// Context one sequence must fit (default: the config's max_position_embeddings).
    #[arg(long)]
    max_model_len: Option<u64>,
    /// Concurrent sequences the max context per sequence is computed for.
    #[arg(long, default_value_t = 1)]
    max_num_seqs: u64,
    /// Engine whose rules and overhead apply: vllm, sglang or llama.cpp.
    #[arg(long, default_value = "vllm")]
    engine: String,
    /// Runtime memory per GPU besides weights and KV cache (default: the engine's figure).
    #[arg(long)]
    overhead: Option<String>,
    /// Revision of a Hugging Face repo.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Seconds each HTTP request may take.
    #[arg(long, default_value_t = 30)]
    http_timeout_s: u64,
    #[command(flatten)]
    speed: SpeedArgs,
}

/// Figures for the speed prediction.
#[derive(Args)]
struct SpeedArgs {
    /// The GPU whose published figures predict the speed: gb10 (DGX Spark), h100, h200,
    /// a100, l40s, rtx-4090, rtx-5090, cpu (default gb10); one per node when
    /// --gpu-memory lists nodes that differ (gb10,rtx-4090).
    #[arg(long)]
    device: Option<String>,
    /// Memory bandwidth of each GPU, GB/s (replaces the device's figure).
    #[arg(long)]
    memory_gbs: Option<f64>,
    /// Dense peak of each GPU, TFLOPS, for BF16 and FP8 alike (replaces the device's).
    #[arg(long)]
    tflops: Option<f64>,
    /// `weft bench p2p --json` output: the median pair's rate and half its round trip are
    /// the link between nodes.
    #[arg(long, conflicts_with_all = ["link_gbps", "link_latency_us"])]
    links: Option<std::path::PathBuf>,
    /// Rate of the link between nodes, Gb/s (default 200).
    #[arg(long)]
    link_gbps: Option<f64>,
    /// One-way latency of the link between nodes, microseconds (default 10).
    #[arg(long)]
    link_latency_us: Option<f64>,
    /// Fixed time of one engine step, microseconds (default: the engine's assumed figure;
    /// `weft bench llm compare --plan` fits it from a measured run).
    #[arg(long)]
    step_overhead_us: Option<f64>,
}

/// The speed figures the flags give (and the GPU the group's agents reported); `--links` is
/// read here, the rest is weft-plan's [`choose::hardware`].
fn figures(a: &SpeedArgs, reported_gpu: Option<&str>) -> Result<Figures> {
    let measured_link = match &a.links {
        None => None,
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("--links {}", path.display()))?;
            let m: weft_bench::p2p::Matrix = serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "--links {}: not the JSON of `weft bench p2p --json`",
                    path.display()
                )
            })?;
            let Some(l) = m.link_summary() else {
                bail!("--links {}: no pair was measured", path.display());
            };
            Some(MeasuredLink {
                from: path.display().to_string(),
                median_gbps: l.median_gbps,
                median_rtt_us: l.median_rtt_us,
                pairs: l.pairs,
            })
        }
    };
    Ok(Figures {
        device: a.device.clone(),
        reported_gpu: reported_gpu.map(str::to_string),
        memory_gbs: a.memory_gbs,
        tflops: a.tflops,
        measured_link,
        link_gbps: a.link_gbps,
        link_latency_us: a.link_latency_us,
        step_overhead_us: a.step_overhead_us,
    })
}

/// A size with its unit: `128GiB`, `80GB`, `512MiB`.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .with_context(|| format!("{s:?}: not a size (e.g. 128GiB, 80GB)"))?;
    let mult: f64 = match unit.trim() {
        "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => (1u64 << 20) as f64,
        "GiB" | "G" => (1u64 << 30) as f64,
        "TiB" => (1u64 << 40) as f64,
        "" => bail!("{s:?}: a size needs a unit (B, GB, GiB, ...)"),
        u => bail!("{s:?}: unknown unit {u:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"),
    };
    let v = n * mult;
    if !(v.is_finite() && (0.0..1e18).contains(&v)) {
        bail!("{s:?}: out of range");
    }
    Ok(v as u64)
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn signed_gib(b: i64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn tokens(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn run(a: PlanArgs, json: bool) -> Result<u8> {
    match plan_report(&a) {
        Ok(r) => {
            let code = if r.plan.fits {
                EXIT_OK
            } else {
                EXIT_CHECK_FAILED
            };
            if json {
                crate::output::json(&r)?;
            } else {
                print_human(&r);
            }
            Ok(code)
        }
        Err(e) if json => {
            crate::output::anyhow_error(true, EXIT_ENVIRONMENT, &e);
            Ok(EXIT_ENVIRONMENT)
        }
        Err(e) => Err(e),
    }
}

fn plan_report(a: &PlanArgs) -> Result<Report> {
    let engine = Engine::parse(&a.engine)
        .with_context(|| format!("--engine {:?}: one of vllm, sglang, llama.cpp", a.engine))?;
    let kv_dtype = match a.kv_dtype.as_str() {
        "auto" => KvDtype::Auto,
        "fp8" => KvDtype::Fp8,
        "bf16" | "fp16" => KvDtype::Bf16,
        o => bail!("--kv-dtype {o:?}: one of auto, fp8, bf16"),
    };
    let memories: Vec<u64> = match a.gpu_memory.as_deref() {
        Some(s) => s
            .split(',')
            .map(|x| parse_size(x.trim()))
            .collect::<Result<_>>()
            .context("--gpu-memory")?,
        None => Vec::new(),
    };
    let gpu_memory = memories.iter().copied().max();
    let mut uneven = if memories.len() > 1 {
        let flags = weft_plan::uneven::NodeFlags {
            group: a.group.group.is_some(),
            nodes: a.nodes,
            gpus_per_node: a.gpus_per_node,
            tp: a.tp,
            ep: a.ep,
            dp: a.dp,
            device: a.speed.device.as_deref(),
            memory_gbs: a.speed.memory_gbs,
        };
        Some(weft_plan::uneven::stage_nodes(&memories, &flags)?)
    } else {
        None
    };
    let mut cluster_warnings = Vec::new();
    let mut reported_gpu = None;
    let cluster = match &a.group.group {
        Some(name) => {
            let nodes = crate::group::nodes(&a.group, name)?;
            reported_gpu = nodes
                .iter()
                .find_map(|n| n.gpus.first())
                .map(|g| g.name.clone());
            let reported: Vec<_> = nodes.iter().map(NodeView::plan_node).collect();
            if gpu_memory.is_none() {
                // Single-GPU nodes that differ: an uneven pipeline (weft_plan::uneven).
                let gpus: Vec<_> = nodes.iter().map(NodeView::reported).collect();
                uneven = weft_plan::uneven::from_reports(&gpus);
            }
            let (c, w) = weft_plan::cluster::from_nodes(name, &reported, gpu_memory)?;
            let w: Vec<String> = w
                .into_iter()
                .filter(|x| uneven.is_none() || !x.contains("planned with the smallest"))
                .collect();
            cluster_warnings.push(format!(
                "cluster from group {name}: {} node(s) ({}) x {} GPU(s) of {}",
                c.nodes,
                nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                c.gpus_per_node,
                gib(c.gpu_memory_bytes)
            ));
            cluster_warnings.extend(w);
            c
        }
        None => {
            let (nodes, gpus) = (
                a.nodes.unwrap_or(memories.len().max(1) as u64),
                a.gpus_per_node.unwrap_or(1),
            );
            if nodes == 0 || gpus == 0 {
                bail!("--nodes and --gpus-per-node must be at least 1");
            }
            Cluster {
                nodes,
                gpus_per_node: gpus,
                gpu_memory_bytes: gpu_memory.context("--gpu-memory is required without --group")?,
            }
        }
    };
    let opts = Options {
        engine,
        gpu_memory_utilization: a.gpu_memory_utilization,
        kv_dtype,
        max_model_len: a.max_model_len,
        max_num_seqs: a.max_num_seqs,
        overhead_bytes: a
            .overhead
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--overhead")?,
        hardware: Some(choose::hardware(
            &figures(&a.speed, reported_gpu.as_deref())?,
            engine,
        )?),
        ..Options::default()
    };
    let model = match source::resolve(&a.model)? {
        ModelRef::Repo(id) => {
            let mut http = HttpOptions::from_env();
            http.revision = a.revision.clone();
            http.timeout = std::time::Duration::from_secs(a.http_timeout_s.clamp(1, 600));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(source::load_repo(&id, http))?.0
        }
        local => source::load_local(&local)?,
    };
    let mut model = model;
    model.warnings.splice(0..0, cluster_warnings);
    if let Some(nodes) = &uneven {
        return Ok(Report {
            plan: weft_plan::uneven::plan_uneven(&model, nodes, &opts)?,
            candidates: None,
            scaling: Vec::new(),
        });
    }
    let request = LayoutRequest {
        tp: a.tp,
        pp: a.pp,
        ep: a.ep,
        dp: a.dp,
    };
    Ok(choose::choose(&model, cluster, &opts, request)?)
}

fn print_human(r: &Report) {
    let p = &r.plan;
    if let Some(asked) = p.shortened_from {
        println!(
            "fits at up to {} tokens: the config's context of {} does not fit; planned for --max-model-len {}\n",
            tokens(p.max_model_len),
            tokens(asked),
            p.max_model_len
        );
    }
    println!(
        "model   {}: {} ({:?}), quantization {}, {} tensors, {} in the checkpoint",
        p.model,
        p.architecture,
        p.family,
        p.quantization,
        p.tensors,
        gib(p.checkpoint_bytes)
    );
    println!(
        "layout  tp={} pp={} ep={} dp={} on {} node(s) x {} GPU(s) of {}; {}, {:.0}% usable, overhead {}/GPU",
        p.layout.tp,
        p.layout.pp,
        if p.layout.ep {
            format!("on ({})", p.ep_size)
        } else {
            "off".into()
        },
        p.layout.dp,
        p.cluster.nodes,
        p.cluster.gpus_per_node,
        gib(p.cluster.gpu_memory_bytes),
        p.engine.name(),
        p.gpu_memory_utilization * 100.0,
        gib(p.overhead_bytes)
    );
    if let Some(part) = &p.pp_layer_partition {
        let list: Vec<String> = part.iter().map(u64::to_string).collect();
        println!(
            "        nodes differ: layers split {} by each node's memory and speed (vLLM: VLLM_PP_LAYER_PARTITION={}; weft run --plan sets it)",
            list.join(" + "),
            list.join(",")
        );
    }
    println!(
        "        overhead: {}\n        KV cache {} B/element, max-model-len {}, max-num-seqs {}",
        p.overhead_source,
        p.kv_bytes_per_element,
        tokens(p.max_model_len),
        p.max_num_seqs
    );
    println!();
    println!(
        "{}",
        table(
            [
                "NODE",
                "GPUS",
                "MEMORY",
                "WEIGHTS",
                "KV TOKENS",
                "HEADROOM",
                "FITS"
            ],
            p.nodes.iter().map(|n| [
                n.node.to_string(),
                n.gpus.to_string(),
                gib(n.memory_bytes),
                gib(n.weights_bytes),
                tokens(n.kv_tokens),
                signed_gib(n.headroom_bytes),
                if n.fits { "yes" } else { "NO" }.into(),
            ])
        )
    );
    println!();
    println!(
        "{}",
        table(
            [
                "RANK",
                "NODE",
                "TP",
                "PP",
                "LAYERS",
                "WEIGHTS",
                "KV B/TOKEN",
                "KV TOKENS",
                "MAX CTX/SEQ",
                "HEADROOM",
            ],
            p.ranks.iter().map(|x| [
                x.rank.to_string(),
                x.node.to_string(),
                x.tp_rank.to_string(),
                x.pp_stage.to_string(),
                format!("{}-{}", x.layers[0], x.layers[1].saturating_sub(1)),
                gib(x.weights_bytes),
                tokens(x.kv_bytes_per_token),
                tokens(x.kv_tokens),
                tokens(x.max_context_per_seq),
                signed_gib(x.headroom_bytes),
            ])
        )
    );
    println!(
        "\nper token between nodes: {} B in {} collectives (TP all-reduce {} B, PP {} B, EP {} B per rank)",
        tokens(p.comm.internode_bytes_per_token),
        p.comm.internode_collectives_per_token,
        tokens(p.comm.tp_allreduce_bytes_per_token),
        tokens(p.comm.pp_bytes_per_token),
        tokens(p.comm.ep_bytes_per_token)
    );
    if let Some(sp) = &p.speed {
        let hw = &sp.hardware;
        println!(
            "\none sequence, predicted ceiling on {} ({} GB/s, {} TFLOPS BF16, {} FP8), link {} Gb/s {} us, step overhead {} us:",
            hw.device,
            hw.memory_gbs,
            hw.bf16_tflops,
            hw.fp8_tflops,
            hw.link_gbps,
            hw.link_latency_us,
            hw.step_overhead_us
        );
        println!("  decode               {}", speed_line(&sp.decode, "step"));
        println!(
            "  decode at {:<10} {}",
            tokens(sp.context_tokens),
            speed_line(&sp.decode_at_context, "step")
        );
        println!(
            "  prompt of {:<10} {}",
            tokens(sp.prompt_tokens),
            speed_line(&sp.prompt, "prompt")
        );
        println!("  figures:");
        for src in &hw.sources {
            println!("    {src}");
        }
    }
    for (title, list) in [
        ("replicated", &p.replicated),
        ("uneven", &p.uneven),
        ("not on any GPU", &p.skipped),
    ] {
        if !list.is_empty() {
            println!("\n{title}:");
            for f in list.iter() {
                println!("  {} (x{}): {}", f.tensor, f.count, f.why);
            }
        }
    }
    if !p.warnings.is_empty() {
        println!("\nwarnings:");
        for w in &p.warnings {
            println!("  {w}");
        }
    }
    if let Some(c) = &r.candidates {
        println!(
            "\nlayouts of {} GPUs, best first:",
            p.cluster.nodes * p.cluster.gpus_per_node
        );
        println!(
            "{}",
            table(
                [
                    "TP",
                    "PP",
                    "EP",
                    "FITS",
                    "MAX WEIGHTS/GPU",
                    "MIN KV TOKENS",
                    "DECODE T/S",
                    "PROMPT T/S",
                    "BOUND BY",
                    "BETWEEN NODES/TOKEN"
                ],
                c.iter().map(|c| [
                    c.layout.tp.to_string(),
                    c.layout.pp.to_string(),
                    if c.layout.ep { "on" } else { "off" }.into(),
                    match &c.refused {
                        Some(_) => "refused".into(),
                        None if c.fits => "yes".into(),
                        None => "no".into(),
                    },
                    if c.refused.is_some() {
                        "-".into()
                    } else {
                        gib(c.max_rank_weights_bytes)
                    },
                    if c.refused.is_some() {
                        "-".into()
                    } else {
                        tokens(c.min_kv_tokens)
                    },
                    c.decode_tokens_per_s
                        .map_or("-".into(), |v| format!("{v:.1}")),
                    c.prompt_tokens_per_s
                        .map_or("-".into(), |v| format!("{v:.0}")),
                    c.dominant.clone().unwrap_or_else(|| "-".into()),
                    match &c.refused {
                        Some(why) => why.clone(),
                        None => format!(
                            "{} B, {} collectives",
                            tokens(c.internode_bytes_per_token),
                            c.internode_collectives_per_token
                        ),
                    },
                ])
            )
        );
    }
    println!(
        "\n{}",
        if p.fits {
            "fits: every node holds its weights, the overhead and one sequence of max-model-len"
        } else {
            "does NOT fit: see HEADROOM above"
        }
    );
}

/// `45.1 t/s: memory 14.10 ms, TP latency 3.36 ms, overhead 1.50 ms per step; memory`:
/// the terms that are not zero.
fn speed_line(s: &Speed, per: &str) -> String {
    let t = &s.terms;
    let terms = [
        ("memory", t.memory_s),
        ("compute", t.compute_s),
        ("TP latency", t.tp_latency_s),
        ("TP bytes", t.tp_bytes_s),
        ("PP latency", t.pp_latency_s),
        ("PP bytes", t.pp_bytes_s),
        ("EP latency", t.ep_latency_s),
        ("EP bytes", t.ep_bytes_s),
        ("overhead", t.overhead_s),
    ];
    let parts: Vec<String> = terms
        .iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(n, v)| format!("{n} {:.2} ms", v * 1e3))
        .collect();
    format!(
        "{:.1} t/s ({} per {per}; bound by {})",
        s.tokens_per_s,
        parts.join(", "),
        s.dominant
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_need_units() {
        assert_eq!(parse_size("128GiB").unwrap(), 128 << 30);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert!(parse_size("80").unwrap_err().to_string().contains("unit"));
        assert!(parse_size("80 parsecs").is_err());
        assert_eq!(tokens(1_234_567), "1,234,567");
    }
}
