//! `weft run`: a command on every node with the job's environment; `weft run-node` and
//! `weft run-probe` (hidden): the supervisor and the version probe run on each node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use weft_launch::run::{self, LaunchOptions, Nccl, Recipe};

use crate::bench::HostArgs;
use crate::{EXIT_CHECK_FAILED, EXIT_OK};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  weft run --hosts spark1,spark2 -- torchrun --nproc-per-node=1 train.py\n  weft run --hosts spark1,spark2 --nccl weft -- vllm serve /models/Llama-3.1-70B --tensor-parallel-size 2\n  weft run --hosts spark1,spark2,spark3 -- ray python job.py\n  weft run --hosts n1,n2 --stall-timeout 120 -- python train.py\n  weft plan Qwen/Qwen3-235B-A22B --group team-a --json > plan.json\n  weft run --group team-a --plan plan.json -- vllm serve Qwen/Qwen3-235B-A22B\n  weft run --hosts n1,n2,n3 --plan plan.json -- llama-server -m /models/m.gguf --port 8080\n\nEvery node gets RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK, MASTER_ADDR (node 0's management\naddress), MASTER_PORT, GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME / VLLM_HOST_IP (its data\ninterface and address) and, per --nccl: weft (NCCL_NET_PLUGIN=weft, WEFT_MGMT_IFNAME,\nWEFT_DATA_IFNAME), ib (NCCL_IB_HCA, the node's RDMA devices) or socket (NCCL's sockets on the\ndata interface). Interfaces come from the hosts' own facts, as `weft doctor` finds them.\n\ntorchrun gets --nnodes/--node-rank/--master-addr/--master-port; `vllm serve` the same, and\n--headless on every node but the first; `ray CMD` starts a Ray head and workers, then CMD on\nthe head; `llama-server` runs ggml-rpc-server on every node but the first (on its data\naddress, port MASTER_PORT) and llama-server with --rpc on the first. --plan takes the layout\nof a saved `weft plan --json` for `vllm serve` (an uneven split as VLLM_PP_LAYER_PARTITION)\nor `llama-server` (-ngl, --tensor-split) and checks it needs as many nodes as the job has; --group takes the hosts from the controller. Before launching, Python, torch (vllm, ray when used), NCCL, the driver, the weft\nplugin build and --model's hash are compared: a difference is a FAIL naming the node, and\nnothing starts. Output lines are prefixed [host nN]. The first node that exits non-zero stops\nall others (SIGTERM, SIGKILL after --grace-s) and is named with its last lines; Ctrl-C stops\nevery node; --stall-timeout names the nodes that printed nothing for that long, and the one
that froze first: a stopped process (state T), a node that stopped answering, or the rank whose
output and CPU time stopped first (ranks waiting in a collective keep spinning).\n\nExit codes: 0 every node exited 0, 1 a node failed, stalled, was interrupted or versions\ndiffer, 2 usage or environment."
)]
pub struct RunArgs {
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    group: crate::group::GroupArgs,
    /// How NCCL moves data: weft (the plugin), ib (NCCL's IB/RoCE), socket.
    #[arg(long, default_value = "ib")]
    nccl: Nccl,
    /// MASTER_PORT (Ray: the head's port).
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// Processes per node, for WORLD_SIZE and RANK of plain commands (torchrun sets its own).
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Stop and report when a node prints nothing for this many seconds.
    #[arg(long)]
    stall_timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL when nodes are stopped.
    #[arg(long, default_value_t = 10.0)]
    grace_s: f64,
    /// A model directory whose hash must be equal on every node.
    #[arg(long)]
    model: Option<String>,
    /// A saved `weft plan --json`: its layout gives `vllm serve` its --tensor-parallel-size,
    /// --pipeline-parallel-size (and expert parallelism, max-model-len, memory fraction),
    /// and the number of hosts it must run on.
    #[arg(long, value_name = "PLAN.json")]
    plan: Option<std::path::PathBuf>,
    /// The Python whose packages are compared.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Skip the version comparison.
    #[arg(long)]
    no_version_check: bool,
    /// The command (after --).
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let sa = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let _ = sigaction(s, &sa);
        }
    }
}

pub fn run(a: RunArgs, json: bool) -> Result<u8> {
    if !(a.grace_s > 0.0 && a.grace_s <= 600.0) {
        bail!("--grace-s must be in (0, 600]");
    }
    if a.nproc_per_node == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    let mut a = a;
    crate::group::fill_hosts(&mut a.hosts, &a.group)?;
    let (hs, remote) = a.hosts.runners()?;
    let mut plan_env = Vec::new();
    if let Some(p) = &a.plan {
        let what = p.display().to_string();
        let bytes = std::fs::read(p).with_context(|| format!("--plan {what}"))?;
        let saved = weft_launch::layout::SavedPlan::parse(&bytes, &what)?;
        let (cmd, notes) = weft_launch::layout::apply(&saved, &what, &a.cmd, hs.len())?;
        for n in notes {
            eprintln!("weft run: {n}");
        }
        plan_env = saved.env(&cmd);
        a.cmd = cmd;
    }
    let recipe = Recipe::of(&a.cmd);
    // Every node's network, from the facts of all of them together: the interfaces
    // `weft doctor` finds on the same hosts and flags.
    let nets = run::gather_node_nets(&hs, &remote, &a.hosts.if_choice()?)?;
    let (argvs, mut envs) = run::node_jobs(
        recipe,
        &a.cmd,
        &nets,
        a.master_port,
        a.nproc_per_node,
        a.nccl,
    )?;
    for e in &mut envs {
        e.extend(plan_env.iter().cloned());
    }
    if !a.no_version_check {
        let got = run::probe_versions(
            &hs,
            &remote.exe,
            &a.python,
            recipe,
            a.model.as_deref(),
            Duration::from_secs(180),
        );
        let mut vs = Vec::new();
        for (h, g) in hs.iter().zip(got) {
            vs.push((h.name().to_string(), g?));
        }
        let diffs = run::version_diffs(&vs);
        if !diffs.is_empty() {
            if json {
                crate::output::json(&serde_json::json!({
                    "ok": false, "launched": false, "version_diffs": diffs, "versions": vs,
                }))?;
            } else {
                for d in &diffs {
                    for (h, v) in &d.differing {
                        println!(
                            "FAIL {h} [versions]: {} {v}, the other nodes {} {}",
                            d.what, d.what, d.expected
                        );
                    }
                }
                println!("\nnothing launched: make the versions equal on every node first");
            }
            return Ok(EXIT_CHECK_FAILED);
        }
    }
    catch_interrupts();
    let o = LaunchOptions {
        remote_exe: remote.exe.clone(),
        recipe,
        grace: Duration::from_secs_f64(a.grace_s),
        stall: a.stall_timeout.map(Duration::from_secs_f64),
        tail: 20,
    };
    let r = run::launch(&hs, &argvs, &envs, &o, &INTERRUPTED, &mut |line| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    })?;
    if json {
        crate::output::json(&r)?;
    } else {
        if let Some(f) = &r.first_failure {
            println!(
                "\nFAIL node {} ({}) {} first{}; its last lines:",
                f.node_rank,
                f.host,
                f.how,
                f.code.map(|c| format!(" with {c}")).unwrap_or_default()
            );
            for l in &f.last_lines {
                println!("  {l}");
            }
        }
        for s in &r.stalled {
            println!(
                "\nSTALL node {} ({}): nothing printed for {:.0} s; last line: {}; last NCCL line: {}{}",
                s.node_rank,
                s.host,
                s.silent_s,
                s.last_line.as_deref().unwrap_or("-"),
                s.last_nccl_line.as_deref().unwrap_or("-"),
                s.state
                    .as_ref()
                    .map(|x| format!("; processes: {x}"))
                    .unwrap_or_default()
            );
        }
        if let Some(x) = &r.suspect {
            println!(
                "\nFROZEN FIRST node {} ({}): {}; last line: {}",
                x.node_rank,
                x.host,
                x.why,
                x.last_line.as_deref().unwrap_or("-")
            );
        } else if !r.stalled.is_empty() {
            println!(
                "\nno node stands out: the ranks stopped together (no stopped process, every node answering, none stopped making progress 2 s before the others)"
            );
        }
        if r.interrupted {
            println!("\ninterrupted: every node stopped");
        }
        if let Some(t) = r.stop_s {
            println!("stopped all nodes in {t:.1} s");
        }
        if r.ok {
            println!(
                "\nall {} nodes exited 0 in {:.1} s",
                r.nodes.len(),
                r.elapsed_s
            );
        }
    }
    Ok(if r.ok { EXIT_OK } else { EXIT_CHECK_FAILED })
}

#[derive(Args)]
pub struct NodeArgs {
    #[arg(long, default_value_t = 10_000)]
    grace_ms: u64,
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

pub fn node(a: NodeArgs) -> Result<u8> {
    let code = run::supervise(&a.cmd, Duration::from_millis(a.grace_ms))?;
    Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

#[derive(Args)]
pub struct ProbeArgs {
    #[arg(long, default_value = "python3")]
    python: String,
    #[arg(long, default_value = "torch")]
    modules: String,
    #[arg(long)]
    model: Option<std::path::PathBuf>,
}

pub fn probe(a: ProbeArgs) -> Result<u8> {
    let mods: Vec<String> = a
        .modules
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let v = run::probe(&a.python, &mods, a.model.as_deref());
    println!("{}", serde_json::to_string(&v)?);
    Ok(EXIT_OK)
}
