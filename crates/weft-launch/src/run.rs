//! `weft run`: one command on every node, with the environment a multi-node job needs.
//!
//! * [`NodeNet`] and [`job_env`]: from the doctor's facts of each node (its management and
//!   data interfaces), the variables every engine reads: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `NODE_RANK`, `MASTER_ADDR` (node 0's management address: rendezvous is control
//!   traffic), `MASTER_PORT`, and the interfaces: `GLOO_SOCKET_IFNAME`, `TP_SOCKET_IFNAME`
//!   and `VLLM_HOST_IP` on the data interface (gloo moves CPU tensors; Ray and vLLM bind the
//!   node's address there), and per `--nccl`: `weft` (`NCCL_NET_PLUGIN=weft`,
//!   `WEFT_MGMT_IFNAME`, `WEFT_DATA_IFNAME`, NCCL's bootstrap on management), `ib`
//!   (`NCCL_IB_HCA` = the node's RDMA devices, bootstrap on management) or `socket` (NCCL's
//!   sockets on the data interface, IB off).
//! * [`Recipe`]: `torchrun ...` gets `--nnodes/--node_rank/--master_addr/--master_port`;
//!   `vllm serve ...` gets `--nnodes/--node-rank/--master-addr/--master-port` and
//!   `--headless` on every node but the head; `ray CMD...` starts a Ray head on node 0 and
//!   workers on the others, then runs CMD on the head.
//! * [`version_diffs`]: the pre-launch check. Every node's Python, torch, NCCL, vLLM / Ray
//!   (when used), driver, weft plugin build and model hash must be equal; a difference is a
//!   FAIL naming the nodes.
//! * [`launch`]: starts [`supervise`] (the hidden `weft run-node`) on every node; prefixes
//!   each line with the node and rank; the first rank that exits non-zero stops all the
//!   others within a bound and is named with its last lines; an interrupt stops every node;
//!   `stall` names the ranks that stopped printing (and their last NCCL line), and the one
//!   that froze first ([`crate::stall`]: a stopped process, a node that stopped answering,
//!   or the rank whose output and CPU time stopped first).
//! * [`supervise`]: on the node, runs the command in its own process group as a child
//!   subreaper, and when its stdin closes (the launcher stopped it, died, or lost the
//!   connection) sends SIGTERM to every process it started, then SIGKILL after a grace
//!   period, so that nothing is left behind.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::LaunchError;
use crate::hosts::{self, HostFacts, HostRunner, IfChoice, Roles};
use crate::stall::{self, STATE_MARKER, Sample, Suspect, Watch};

/// The last line `weft run-node` prints: `MARKER<exit code>` (or `MARKER<signal>s`).
pub const EXIT_MARKER: &str = "\u{1e}weft-run-node-exit=";

/// How NCCL is to move data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Nccl {
    /// weft's NCCL net plugin.
    Weft,
    /// NCCL's own InfiniBand / RoCE transport.
    Ib,
    /// NCCL's sockets, on the data interface.
    Socket,
}

impl std::str::FromStr for Nccl {
    type Err = String;
    fn from_str(s: &str) -> Result<Nccl, String> {
        match s {
            "weft" => Ok(Nccl::Weft),
            "ib" => Ok(Nccl::Ib),
            "socket" => Ok(Nccl::Socket),
            o => Err(format!("--nccl {o:?}: one of weft, ib, socket")),
        }
    }
}

/// A node's network, from its facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeNet {
    pub host: String,
    pub mgmt_if: String,
    pub mgmt_addr: Ipv4Addr,
    /// Data interfaces with an IPv4 address, first is the one gloo and vLLM use.
    pub data_ifs: Vec<String>,
    pub data_addr: Ipv4Addr,
    /// RDMA devices behind the data interfaces (`mlx5_0`).
    pub rdma_devs: Vec<String>,
}

/// Every node's network by the doctor's rules (`--mgmt-if`, `--data-if`, NCCL syntax),
/// decided for all the nodes together ([`hosts::roles_for`]): on the same hosts and flags,
/// the interfaces `weft doctor` finds. `names` and `facts` are in node order.
pub fn node_nets(
    names: &[&str],
    facts: &[HostFacts],
    choice: &IfChoice,
) -> Result<Vec<NodeNet>, LaunchError> {
    let all: Vec<&HostFacts> = facts.iter().collect();
    names
        .iter()
        .zip(hosts::roles_for(&all, choice))
        .map(|(host, role)| node_net(host, &role))
        .collect()
}

/// [`node_nets`] over the facts gathered on every host of `hs` at once.
pub fn gather_node_nets(
    hs: &[Box<dyn HostRunner>],
    remote: &hosts::Remote,
    choice: &IfChoice,
) -> Result<Vec<NodeNet>, LaunchError> {
    let facts = hosts::facts_all(hs, remote)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<&str> = hs.iter().map(|h| h.name()).collect();
    node_nets(&names, &facts, choice)
}

/// One node's network from its roles.
fn node_net(host: &str, role: &Roles<'_>) -> Result<NodeNet, LaunchError> {
    let err = |msg: String| LaunchError::Host {
        host: host.into(),
        msg,
    };
    let (mgmt, _) = role.mgmt.ok_or_else(|| {
        err("no management interface (no default route, no SSH session, no other host's management subnet; name it with --mgmt-if)".into())
    })?;
    let (_, mgmt_addr) = role.mgmt_addr().ok_or_else(|| {
        err(format!(
            "management interface {} has no IPv4 address",
            mgmt.name
        ))
    })?;
    let data: Vec<_> = role
        .data
        .iter()
        .filter(|n| hosts::ipv4(n).is_some())
        .collect();
    let first = data.first().ok_or_else(|| {
        err("no data interface with an IPv4 address (name them with --data-if)".into())
    })?;
    let data_addr = hosts::ipv4(first).map(|(a, _)| a).unwrap_or(mgmt_addr);
    let mut rdma_devs: Vec<String> = data.iter().filter_map(|n| n.rdma_device.clone()).collect();
    rdma_devs.sort();
    rdma_devs.dedup();
    Ok(NodeNet {
        host: host.into(),
        mgmt_if: mgmt.name.clone(),
        mgmt_addr,
        data_ifs: data.iter().map(|n| n.name.clone()).collect(),
        data_addr,
        rdma_devs,
    })
}

/// The environment of node `rank` of `nodes` (see the module docs).
pub fn job_env(
    nodes: &[NodeNet],
    rank: usize,
    nproc_per_node: usize,
    master_port: u16,
    nccl: Nccl,
) -> Vec<(String, String)> {
    let n = &nodes[rank];
    let mut v: Vec<(String, String)> = vec![
        ("NODE_RANK".into(), rank.to_string()),
        ("RANK".into(), (rank * nproc_per_node).to_string()),
        ("LOCAL_RANK".into(), "0".into()),
        ("LOCAL_WORLD_SIZE".into(), nproc_per_node.to_string()),
        (
            "WORLD_SIZE".into(),
            (nodes.len() * nproc_per_node).to_string(),
        ),
        ("NNODES".into(), nodes.len().to_string()),
        ("MASTER_ADDR".into(), nodes[0].mgmt_addr.to_string()),
        ("MASTER_PORT".into(), master_port.to_string()),
        ("GLOO_SOCKET_IFNAME".into(), n.data_ifs[0].clone()),
        ("TP_SOCKET_IFNAME".into(), n.data_ifs[0].clone()),
        ("VLLM_HOST_IP".into(), n.data_addr.to_string()),
    ];
    match nccl {
        Nccl::Weft => {
            v.push(("NCCL_NET_PLUGIN".into(), "weft".into()));
            v.push(("WEFT_MGMT_IFNAME".into(), format!("={}", n.mgmt_if)));
            v.push((
                "WEFT_DATA_IFNAME".into(),
                format!("={}", n.data_ifs.join(",")),
            ));
            v.push(("NCCL_SOCKET_IFNAME".into(), format!("={}", n.mgmt_if)));
        }
        Nccl::Ib => {
            v.push(("NCCL_SOCKET_IFNAME".into(), format!("={}", n.mgmt_if)));
            if !n.rdma_devs.is_empty() {
                v.push(("NCCL_IB_HCA".into(), format!("={}", n.rdma_devs.join(","))));
            }
        }
        Nccl::Socket => {
            v.push(("NCCL_SOCKET_IFNAME".into(), format!("={}", n.data_ifs[0])));
            v.push(("NCCL_IB_DISABLE".into(), "1".into()));
        }
    }
    v
}

/// Which engine a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recipe {
    /// Any command: run as it is on every node, with the environment.
    Plain,
    Torchrun,
    /// `vllm serve`: head plus headless workers; runs until stopped.
    Vllm,
    /// `ray CMD...`: a Ray head and workers, then CMD on the head.
    Ray,
    /// `llama-server ...`: llama.cpp's RPC backend ([`crate::llamacpp`]): rpc-server on every
    /// node but the first, llama-server with `--rpc` on the first; runs until stopped.
    LlamaCpp,
}

impl Recipe {
    /// By the command's first word (its file name).
    pub fn of(cmd: &[String]) -> Recipe {
        let base = cmd
            .first()
            .map(|c| c.rsplit('/').next().unwrap_or(c))
            .unwrap_or("");
        match base {
            "torchrun" => Recipe::Torchrun,
            "vllm" if cmd.get(1).is_some_and(|a| a == "serve") => Recipe::Vllm,
            "ray" => Recipe::Ray,
            "llama-server" => Recipe::LlamaCpp,
            _ => Recipe::Plain,
        }
    }

    /// Whether the job is over when the head (node 0) exits, the others being stopped then.
    pub fn head_decides(self) -> bool {
        matches!(self, Recipe::Vllm | Recipe::Ray | Recipe::LlamaCpp)
    }

    /// The Python modules the version check compares for this recipe.
    pub fn modules(self) -> Vec<&'static str> {
        match self {
            Recipe::Vllm => vec!["torch", "vllm"],
            Recipe::Ray => vec!["torch", "ray"],
            // Not Python: ggml's RPC handshake refuses a server of another protocol version.
            Recipe::LlamaCpp => vec![],
            _ => vec!["torch"],
        }
    }
}

/// Flags weft sets itself and refuses to find in the user's command.
const OWN_FLAGS: &[&str] = &[
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-backend",
    "--rdzv_backend",
    "--headless",
    "--address",
    "--head",
];

/// The command node `rank` runs for `recipe`.
pub fn node_argv(
    recipe: Recipe,
    cmd: &[String],
    nodes: &[NodeNet],
    rank: usize,
    master_port: u16,
) -> Result<Vec<String>, LaunchError> {
    if cmd.is_empty() {
        return Err(LaunchError::Usage(
            "no command to run (weft run ... -- CMD ARGS)".into(),
        ));
    }
    let own = |args: &[String]| -> Result<(), LaunchError> {
        if let Some(a) = args.iter().find(|a| {
            OWN_FLAGS
                .iter()
                .any(|f| a.as_str() == *f || a.starts_with(&format!("{f}=")))
        }) {
            return Err(LaunchError::Usage(format!(
                "{a}: weft run sets the node layout itself (--nnodes, --node-rank, --master-addr, --master-port{}); leave it out",
                if recipe == Recipe::Vllm {
                    ", --headless"
                } else {
                    ""
                }
            )));
        }
        Ok(())
    };
    let n = nodes.len();
    let master = nodes[0].mgmt_addr.to_string();
    Ok(match recipe {
        Recipe::Plain => cmd.to_vec(),
        Recipe::LlamaCpp => crate::llamacpp::node_argv(cmd, nodes, rank, master_port)?,
        Recipe::Torchrun => {
            // Only torchrun's own options (before the script) are checked.
            let script_at = cmd[1..]
                .iter()
                .position(|a| !a.starts_with('-'))
                .map_or(cmd.len(), |p| p + 1);
            own(&cmd[1..script_at])?;
            let mut v = vec![cmd[0].clone()];
            v.push(format!("--nnodes={n}"));
            // The underscore spellings: torchrun 1.x knows only those, 2.x both.
            v.push(format!("--node_rank={rank}"));
            v.push(format!("--master_addr={master}"));
            v.push(format!("--master_port={master_port}"));
            if !cmd[1..script_at]
                .iter()
                .any(|a| a.starts_with("--nproc-per-node") || a.starts_with("--nproc_per_node"))
            {
                v.push("--nproc_per_node=1".into());
            }
            v.extend(cmd[1..].iter().cloned());
            v
        }
        Recipe::Vllm => {
            own(&cmd[2..])?;
            let mut v = cmd.to_vec();
            v.extend([
                "--nnodes".into(),
                n.to_string(),
                "--node-rank".into(),
                rank.to_string(),
                "--master-addr".into(),
                master,
                "--master-port".into(),
                master_port.to_string(),
            ]);
            if rank > 0 {
                v.push("--headless".into());
            }
            v
        }
        Recipe::Ray => {
            let job = &cmd[1..];
            if job.is_empty() {
                return Err(LaunchError::Usage(
                    "weft run ray CMD ARGS: the command to run on the head is missing".into(),
                ));
            }
            let ip = nodes[rank].data_addr.to_string();
            let head = format!("{}:{master_port}", nodes[0].data_addr);
            if rank == 0 {
                let line = job
                    .iter()
                    .map(|a| hosts::shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" ");
                vec![
                    "sh".into(),
                    "-c".into(),
                    format!(
                        "ray start --head --node-ip-address={ip} --port={master_port} --disable-usage-stats || exit $?; RAY_ADDRESS={head} {line}; rc=$?; ray stop --force >/dev/null 2>&1; exit $rc"
                    ),
                ]
            } else {
                vec![
                    "ray".into(),
                    "start".into(),
                    format!("--address={head}"),
                    format!("--node-ip-address={ip}"),
                    "--block".into(),
                    "--disable-usage-stats".into(),
                ]
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// The pre-launch version check.

/// What `weft run-probe` reports of a node: name -> version (`absent` when missing).
pub type Versions = BTreeMap<String, String>;

/// The Python that `weft run-probe` runs to read versions.
pub const PY_PROBE: &str = r#"
import json, platform, sys
r = {"python": platform.python_version()}
for m in sys.argv[1].split(","):
    if not m:
        continue
    try:
        mod = __import__(m)
        r[m] = str(getattr(mod, "__version__", "unknown"))
    except Exception as e:
        r[m] = "absent"
    if m == "torch" and r[m] != "absent":
        try:
            v = mod.cuda.nccl.version()
            r["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            r["nccl"] = "absent"
print(json.dumps(r))
"#;

/// One process's environment, in order.
pub type Env = Vec<(String, String)>;

/// Every node's command line and environment for `cmd` run as `recipe` on `nodes`, in node
/// order ([`node_argv`] and [`job_env`]).
pub fn node_jobs(
    recipe: Recipe,
    cmd: &[String],
    nodes: &[NodeNet],
    master_port: u16,
    nproc_per_node: usize,
    nccl: Nccl,
) -> Result<(Vec<Vec<String>>, Vec<Env>), LaunchError> {
    let mut argvs = Vec::with_capacity(nodes.len());
    let mut envs = Vec::with_capacity(nodes.len());
    for i in 0..nodes.len() {
        argvs.push(node_argv(recipe, cmd, nodes, i, master_port)?);
        envs.push(job_env(nodes, i, nproc_per_node, master_port, nccl));
    }
    Ok((argvs, envs))
}

/// Every node's versions, probed on all of them at once by the hidden `EXE run-probe`
/// (`python`'s packages: `recipe`'s modules; `model`'s hash when given), each bounded by
/// `timeout`; in node order.
pub fn probe_versions(
    hs: &[Box<dyn HostRunner>],
    exe: &str,
    python: &str,
    recipe: Recipe,
    model: Option<&str>,
    timeout: Duration,
) -> Vec<Result<Versions, LaunchError>> {
    let mut args = vec![
        exe.to_string(),
        "run-probe".to_string(),
        "--python".into(),
        python.to_string(),
        "--modules".into(),
        recipe.modules().join(","),
    ];
    if let Some(m) = model {
        args.extend(["--model".into(), m.to_string()]);
    }
    hosts::each_host(hs, |h| {
        let o = hosts::run(h.as_ref(), &args, &[], timeout)?;
        serde_json::from_slice::<Versions>(&o.stdout).map_err(|e| LaunchError::Host {
            host: h.name().into(),
            msg: format!(
                "the version probe printed no JSON ({e}): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        })
    })
}

/// One difference between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionDiff {
    /// `torch`, `python`, `driver`, `plugin`, `model`...
    pub what: String,
    /// The value most nodes have (node 0's on a tie).
    pub expected: String,
    /// The nodes that differ, with their value.
    pub differing: Vec<(String, String)>,
}

/// Compares every node's versions; a key missing on a node counts as `absent`.
pub fn version_diffs(nodes: &[(String, Versions)]) -> Vec<VersionDiff> {
    let mut keys: Vec<&String> = nodes.iter().flat_map(|(_, v)| v.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        let val = |v: &Versions| v.get(k).cloned().unwrap_or_else(|| "absent".into());
        let mut count: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, (_, v)) in nodes.iter().enumerate() {
            let e = count.entry(val(v)).or_insert((0, i));
            e.0 += 1;
        }
        if count.len() <= 1 {
            continue;
        }
        let expected = count
            .iter()
            .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.1.1.cmp(&a.1.1)))
            .map(|(v, _)| v.clone())
            .unwrap_or_default();
        let differing = nodes
            .iter()
            .filter(|(_, v)| val(v) != expected)
            .map(|(h, v)| (h.clone(), val(v)))
            .collect();
        out.push(VersionDiff {
            what: k.clone(),
            expected,
            differing,
        });
    }
    out
}

/// On the node: the versions of `modules` (via `python`), the driver, the weft plugin build
/// (blake3 of the `libnccl-net-weft.so` NCCL would load) and the hash of `model`.
pub fn probe(python: &str, modules: &[String], model: Option<&std::path::Path>) -> Versions {
    let mut v = Versions::new();
    let mut c = std::process::Command::new(python);
    c.args(["-c", PY_PROBE, &modules.join(",")]);
    match crate::hosts::run_local(c, Duration::from_secs(120)) {
        Ok(o) if o.status.success() => {
            if let Ok(m) = serde_json::from_slice::<BTreeMap<String, String>>(&o.stdout) {
                v.extend(m);
            } else {
                v.insert("python".into(), "probe printed no JSON".into());
            }
        }
        Ok(o) => {
            v.insert(
                "python".into(),
                format!(
                    "probe failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
            );
        }
        Err(e) => {
            v.insert("python".into(), format!("{python}: {e}"));
        }
    }
    v.insert(
        "driver".into(),
        std::fs::read_to_string("/sys/module/nvidia/version")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "none".into()),
    );
    v.insert("plugin".into(), plugin_build());
    if let Some(m) = model {
        v.insert(
            "model".into(),
            match crate::manifest::Manifest::scan(m, crate::manifest::CHUNK) {
                Ok(man) => {
                    let hs: Vec<crate::manifest::Hash> = man
                        .files
                        .iter()
                        .map(|f| {
                            crate::manifest::Hash::of(
                                format!("{}\0{}", f.path, f.hash.hex()).as_bytes(),
                            )
                        })
                        .collect();
                    format!("blake3:{}", crate::manifest::file_hash(&hs).short())
                }
                Err(e) => format!("unreadable: {e}"),
            },
        );
    }
    v
}

/// blake3 of the `libnccl-net-weft.so` that NCCL would find first (LD_LIBRARY_PATH, then
/// the usual library directories), or `none`.
fn plugin_build() -> String {
    let mut dirs: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    dirs.extend(
        [
            "/usr/local/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib",
        ]
        .map(String::from),
    );
    for d in dirs {
        let p = std::path::Path::new(&d).join("libnccl-net-weft.so");
        if let Ok(b) = std::fs::read(&p) {
            return format!("blake3:{}", crate::manifest::Hash::of(&b).short());
        }
    }
    "none".into()
}

// ---------------------------------------------------------------------------------------
// Launching.

/// How a job is launched.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The `weft` binary on the nodes.
    pub remote_exe: String,
    pub recipe: Recipe,
    /// How long a stopped node's processes get between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Report and stop when a rank prints nothing for this long.
    pub stall: Option<Duration>,
    /// Lines kept per node for the report.
    pub tail: usize,
}

/// A node's part in the job.
#[derive(Debug, Clone, Serialize)]
pub struct NodeExit {
    pub host: String,
    pub node_rank: usize,
    /// Exit code, `None` when it was stopped or lost.
    pub code: Option<i32>,
    /// `exited`, `stopped` (by weft), `lost` (the connection ended without an exit status).
    pub how: String,
}

/// The first rank that failed.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub host: String,
    pub node_rank: usize,
    pub code: Option<i32>,
    pub how: String,
    pub last_lines: Vec<String>,
}

/// A rank that stopped printing.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    pub host: String,
    pub node_rank: usize,
    pub silent_s: f64,
    pub last_line: Option<String>,
    pub last_nccl_line: Option<String>,
    /// Its processes as its node last saw them (`T (stopped), pid 123 python3`).
    pub state: Option<String>,
}

/// What a launch did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub ok: bool,
    pub nodes: Vec<NodeExit>,
    pub first_failure: Option<Failure>,
    pub stalled: Vec<Stall>,
    /// At a stall, the rank that froze first, when one stands out ([`stall::suspect`]).
    pub suspect: Option<Suspect>,
    pub interrupted: bool,
    /// Seconds from the stop request to the last node gone.
    pub stop_s: Option<f64>,
    pub elapsed_s: f64,
}

enum Ev {
    Line(usize, String),
    State(usize, Sample),
    Gone(usize, Option<i32>),
}

/// Runs `argvs[i]` with `envs[i]` on `hosts[i]` under `weft run-node`. `print` gets every
/// line already prefixed with `[host nN]`. See the module docs.
pub fn launch(
    hosts_: &[Box<dyn HostRunner>],
    argvs: &[Vec<String>],
    envs: &[Vec<(String, String)>],
    o: &LaunchOptions,
    interrupted: &AtomicBool,
    print: &mut dyn FnMut(&str),
) -> Result<RunReport, LaunchError> {
    let t0 = Instant::now();
    let n = hosts_.len();
    let (tx, rx) = mpsc::channel::<Ev>();
    let mut children = Vec::with_capacity(n);
    let mut stdins = Vec::with_capacity(n);
    for (i, h) in hosts_.iter().enumerate() {
        let mut argv = vec![
            o.remote_exe.clone(),
            "run-node".into(),
            "--grace-ms".into(),
            o.grace.as_millis().to_string(),
            "--".into(),
        ];
        argv.extend(argvs[i].iter().cloned());
        let mut c = hosts::command(h.as_ref(), &argv, &envs[i]);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match c.spawn() {
            Ok(c) => c,
            Err(e) => {
                for (c, s) in children.iter_mut().zip(stdins.iter_mut()) {
                    drop(Option::<std::process::ChildStdin>::take(s));
                    hosts::kill_group(c);
                }
                return Err(LaunchError::Host {
                    host: h.name().into(),
                    msg: format!("cannot start: {e}"),
                });
            }
        };
        stdins.push(child.stdin.take());
        let marker_seen = std::sync::Arc::new(std::sync::Mutex::new(None::<i32>));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            let (tx, ms) = (tx.clone(), marker_seen.clone());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(code) = line.strip_prefix(EXIT_MARKER) {
                        if let Ok(mut m) = ms.lock() {
                            *m = code.trim().parse().ok();
                        }
                        continue;
                    }
                    if let Some(rest) = line.strip_prefix(STATE_MARKER) {
                        if let Some(s) = Sample::parse(rest) {
                            let _ = tx.send(Ev::State(i, s));
                        }
                        continue;
                    }
                    let _ = tx.send(Ev::Line(i, line));
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = tx.send(Ev::Line(i, line));
                }
            }));
        }
        children.push(child);
        // A waiter per node: the supervisor's exit code (from its marker), after its output.
        let tx = tx.clone();
        let child_ref = children.len() - 1;
        let _ = child_ref;
        let ms = marker_seen;
        let pid = children[i].id();
        std::thread::spawn(move || {
            for r in readers {
                let _ = r.join();
            }
            let code = ms.lock().ok().and_then(|m| *m);
            let _ = pid;
            let _ = tx.send(Ev::Gone(i, code));
        });
    }
    drop(tx);
    let mut tails: Vec<VecDeque<String>> = vec![VecDeque::new(); n];
    let mut nccl_line: Vec<Option<String>> = vec![None; n];
    let mut watch: Vec<Watch> = vec![Watch::new(Instant::now()); n];
    let mut suspect: Option<Suspect> = None;
    let mut exits: Vec<Option<NodeExit>> = vec![None; n];
    let mut first_failure: Option<Failure> = None;
    let mut stalled = Vec::new();
    let mut stop_at: Option<Instant> = None;
    let mut was_interrupted = false;
    let label = |i: usize| format!("[{} n{i}]", hosts_[i].name());
    let stop_bound = o.grace + Duration::from_secs(10);
    loop {
        if exits.iter().all(Option::is_some) {
            break;
        }
        let ev = rx.recv_timeout(Duration::from_millis(100));
        match ev {
            Ok(Ev::Line(i, line)) => {
                print(&format!("{} {line}", label(i)));
                watch[i].last_out = Instant::now();
                if line.contains("NCCL") {
                    nccl_line[i] = Some(line.clone());
                }
                tails[i].push_back(line);
                if tails[i].len() > o.tail {
                    tails[i].pop_front();
                }
            }
            Ok(Ev::State(i, s)) => watch[i].heard(Instant::now(), s),
            Ok(Ev::Gone(i, code)) => {
                watch[i].gone = true;
                let _ = children[i].wait();
                let how = match code {
                    Some(_)
                        if stop_at.is_some()
                            && first_failure.as_ref().is_none_or(|f| f.node_rank != i) =>
                    {
                        if code == Some(0) { "exited" } else { "stopped" }
                    }
                    Some(_) => "exited",
                    None if stop_at.is_some() => "stopped",
                    None => "lost",
                };
                let e = NodeExit {
                    host: hosts_[i].name().into(),
                    node_rank: i,
                    code,
                    how: how.into(),
                };
                let failed = code != Some(0) && stop_at.is_none();
                if failed && first_failure.is_none() {
                    first_failure = Some(Failure {
                        host: e.host.clone(),
                        node_rank: i,
                        code,
                        how: if code.is_none() {
                            "the connection to the host ended without an exit status".into()
                        } else {
                            "exited".into()
                        },
                        last_lines: tails[i].iter().cloned().collect(),
                    });
                }
                let head_done = i == 0 && o.recipe.head_decides();
                exits[i] = Some(e);
                if (failed || head_done) && stop_at.is_none() {
                    stop_at = Some(Instant::now());
                    stdins.iter_mut().for_each(|s| drop(s.take()));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if stop_at.is_none() && interrupted.load(Ordering::SeqCst) {
            was_interrupted = true;
            stop_at = Some(Instant::now());
            stdins.iter_mut().for_each(|s| drop(s.take()));
        }
        if stop_at.is_none()
            && let Some(limit) = o.stall
        {
            let silent: Vec<usize> = (0..n)
                .filter(|&i| exits[i].is_none() && watch[i].last_out.elapsed() > limit)
                .collect();
            if !silent.is_empty() {
                for i in silent {
                    stalled.push(Stall {
                        host: hosts_[i].name().into(),
                        node_rank: i,
                        silent_s: watch[i].last_out.elapsed().as_secs_f64(),
                        last_line: tails[i].back().cloned(),
                        last_nccl_line: nccl_line[i].clone(),
                        state: watch[i].sample.as_ref().map(Sample::describe),
                    });
                }
                // Every rank, not only those past the limit: the frozen one may have
                // printed last.
                let names: Vec<String> = hosts_.iter().map(|h| h.name().to_string()).collect();
                let last: Vec<Option<String>> = tails.iter().map(|t| t.back().cloned()).collect();
                suspect = stall::suspect(Instant::now(), &watch, &names, &last);
                stop_at = Some(Instant::now());
                stdins.iter_mut().for_each(|s| drop(s.take()));
            }
        }
        if let Some(t) = stop_at
            && t.elapsed() > stop_bound
        {
            // The supervisors did not go in time: cut the connections.
            for (i, c) in children.iter().enumerate() {
                if exits[i].is_none() {
                    hosts::kill_group(c);
                }
            }
        }
    }
    let stop_s = stop_at.map(|t| t.elapsed().as_secs_f64());
    let nodes: Vec<NodeExit> = exits
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            e.unwrap_or(NodeExit {
                host: hosts_[i].name().into(),
                node_rank: i,
                code: None,
                how: "lost".into(),
            })
        })
        .collect();
    let ok = !was_interrupted
        && stalled.is_empty()
        && first_failure.is_none()
        && if o.recipe.head_decides() {
            nodes[0].code == Some(0)
        } else {
            nodes.iter().all(|e| e.code == Some(0))
        };
    Ok(RunReport {
        ok,
        nodes,
        first_failure,
        stalled,
        suspect,
        interrupted: was_interrupted,
        stop_s,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------------------
// The node side.

/// Pids of every descendant of `root` (by the parent links in /proc).
pub fn descendants(root: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|p| &stat[p + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            parent.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

fn signal_all(pgid: i32, sig: nix::sys::signal::Signal) {
    use nix::sys::signal::{kill, killpg};
    use nix::unistd::Pid;
    let _ = killpg(Pid::from_raw(pgid), sig);
    for p in descendants(std::process::id() as i32) {
        let _ = kill(Pid::from_raw(p), sig);
    }
    // A stopped process acts on SIGTERM only once it runs again.
    if sig == nix::sys::signal::Signal::SIGTERM {
        let _ = killpg(Pid::from_raw(pgid), nix::sys::signal::Signal::SIGCONT);
        for p in descendants(std::process::id() as i32) {
            let _ = kill(Pid::from_raw(p), nix::sys::signal::Signal::SIGCONT);
        }
    }
}

/// On the node: runs `argv` (stdin null, output passed through line by line), and stops it
/// and everything it started when stdin closes; SIGTERM, then SIGKILL after `grace`. Prints
/// [`EXIT_MARKER`] with the exit code (or 128 + signal) last, and returns it.
pub fn supervise(argv: &[String], grace: Duration) -> Result<i32, LaunchError> {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    if argv.is_empty() {
        return Err(LaunchError::Usage("run-node: no command".into()));
    }
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers and only changes how
    // orphaned descendants are re-parented (to us, so that we can find and stop them).
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| LaunchError::Usage(format!("cannot start {}: {e}", argv[0])))?;
    let pgid = child.id() as i32;
    let out = child.stdout.take();
    let err = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        if let Some(o) = out {
            let stdout = std::io::stdout();
            for line in BufReader::new(o).lines().map_while(Result::ok) {
                let mut l = stdout.lock();
                let _ = writeln!(l, "{line}");
                let _ = l.flush();
            }
        }
    });
    let t_err = std::thread::spawn(move || {
        if let Some(e) = err {
            for line in BufReader::new(e).lines().map_while(Result::ok) {
                eprintln!("{line}");
            }
        }
    });
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin();
        while let Ok(k) = std::io::Read::read(&mut stdin, &mut sink) {
            if k == 0 {
                break;
            }
        }
        let _ = stop_tx.send(());
    });
    let mut stopping: Option<Instant> = None;
    let mut sampled = Instant::now();
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        // What the launcher needs to tell a frozen rank from ranks waiting for it.
        if sampled.elapsed() >= stall::SAMPLE_EVERY {
            sampled = Instant::now();
            if let Some(s) = stall::sample(&descendants(std::process::id() as i32)) {
                let so = std::io::stdout();
                let mut l = so.lock();
                let _ = writeln!(l, "{}", s.line());
                let _ = l.flush();
            }
        }
        if stopping.is_none() && stop_rx.try_recv().is_ok() {
            signal_all(pgid, nix::sys::signal::Signal::SIGTERM);
            stopping = Some(Instant::now());
        }
        if let Some(t) = stopping
            && t.elapsed() > grace
        {
            signal_all(pgid, nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever the command left behind (background processes, orphans re-parented to us).
    let deadline = Instant::now() + grace;
    let mut sig = nix::sys::signal::Signal::SIGTERM;
    loop {
        let left = descendants(std::process::id() as i32);
        let group_alive = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_ok();
        if left.is_empty() && !group_alive {
            break;
        }
        if Instant::now() > deadline {
            sig = nix::sys::signal::Signal::SIGKILL;
        }
        signal_all(pgid, sig);
        // Reap re-parented orphans.
        loop {
            match nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        if Instant::now() > deadline + Duration::from_secs(5) {
            break;
        }
    }
    let _ = t_out.join();
    let _ = t_err.join();
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let mut so = std::io::stdout();
    let _ = writeln!(so, "{EXIT_MARKER}{code}");
    let _ = so.flush();
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeNet> {
        (0..3)
            .map(|i| NodeNet {
                host: format!("n{i}"),
                mgmt_if: "eno1".into(),
                mgmt_addr: Ipv4Addr::new(10, 0, 0, i + 1),
                data_ifs: vec!["enp1s0f1np1".into(), "enP2p1s0f1np1".into()],
                data_addr: Ipv4Addr::new(192, 168, 100, i + 1),
                rdma_devs: vec!["rocep1s0f1".into(), "roceP2p1s0f1".into()],
            })
            .collect()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_environment_puts_rendezvous_on_management_and_bulk_on_data() {
        let ns = nodes();
        let e = job_env(&ns, 2, 1, 29500, Nccl::Weft);
        assert_eq!(get(&e, "RANK"), Some("2"));
        assert_eq!(get(&e, "NODE_RANK"), Some("2"));
        assert_eq!(get(&e, "WORLD_SIZE"), Some("3"));
        assert_eq!(get(&e, "LOCAL_RANK"), Some("0"));
        assert_eq!(get(&e, "MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get(&e, "GLOO_SOCKET_IFNAME"), Some("enp1s0f1np1"));
        assert_eq!(get(&e, "VLLM_HOST_IP"), Some("192.168.100.3"));
        assert_eq!(get(&e, "NCCL_NET_PLUGIN"), Some("weft"));
        assert_eq!(
            get(&e, "WEFT_DATA_IFNAME"),
            Some("=enp1s0f1np1,enP2p1s0f1np1")
        );
        assert_eq!(get(&e, "WEFT_MGMT_IFNAME"), Some("=eno1"));
        let e = job_env(&ns, 0, 8, 29500, Nccl::Ib);
        assert_eq!(get(&e, "NCCL_IB_HCA"), Some("=rocep1s0f1,roceP2p1s0f1"));
        assert_eq!(get(&e, "NCCL_SOCKET_IFNAME"), Some("=eno1"));
        assert_eq!(get(&e, "WORLD_SIZE"), Some("24"));
        assert_eq!(get(&e, "NCCL_NET_PLUGIN"), None);
        let e = job_env(&ns, 1, 1, 29500, Nccl::Socket);
        assert_eq!(get(&e, "NCCL_SOCKET_IFNAME"), Some("=enp1s0f1np1"));
        assert_eq!(get(&e, "NCCL_IB_DISABLE"), Some("1"));
    }

    #[test]
    fn torchrun_gets_the_node_layout_and_refuses_its_own() {
        let ns = nodes();
        let cmd = s(&[
            "torchrun",
            "--nproc-per-node=2",
            "train.py",
            "--nnodes",
            "7",
        ]);
        assert_eq!(Recipe::of(&cmd), Recipe::Torchrun);
        let v = node_argv(Recipe::Torchrun, &cmd, &ns, 1, 29400).unwrap();
        assert_eq!(
            v,
            s(&[
                "torchrun",
                "--nnodes=3",
                "--node_rank=1",
                "--master_addr=10.0.0.1",
                "--master_port=29400",
                "--nproc-per-node=2",
                "train.py",
                "--nnodes",
                "7"
            ])
        );
        let bad = s(&["torchrun", "--master_addr=1.2.3.4", "t.py"]);
        let e = node_argv(Recipe::Torchrun, &bad, &ns, 0, 1).unwrap_err();
        assert!(e.to_string().contains("--master_addr=1.2.3.4"), "{e}");
    }

    #[test]
    fn vllm_has_one_head_and_headless_workers() {
        let ns = nodes();
        let cmd = s(&[
            "vllm",
            "serve",
            "meta-llama/Llama-3.1-70B",
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "3",
        ]);
        assert_eq!(Recipe::of(&cmd), Recipe::Vllm);
        let head = node_argv(Recipe::Vllm, &cmd, &ns, 0, 29501)
            .unwrap()
            .join(" ");
        assert!(
            head.ends_with("--nnodes 3 --node-rank 0 --master-addr 10.0.0.1 --master-port 29501"),
            "{head}"
        );
        let w = node_argv(Recipe::Vllm, &cmd, &ns, 2, 29501)
            .unwrap()
            .join(" ");
        assert!(
            w.ends_with("--node-rank 2 --master-addr 10.0.0.1 --master-port 29501 --headless"),
            "{w}"
        );
        assert!(
            node_argv(
                Recipe::Vllm,
                &s(&["vllm", "serve", "m", "--headless"]),
                &ns,
                0,
                1
            )
            .is_err()
        );
        assert!(Recipe::Vllm.head_decides());
    }

    #[test]
    fn ray_starts_a_head_and_workers_on_the_data_addresses() {
        let ns = nodes();
        let cmd = s(&["ray", "python", "job.py"]);
        assert_eq!(Recipe::of(&cmd), Recipe::Ray);
        let head = node_argv(Recipe::Ray, &cmd, &ns, 0, 6379).unwrap();
        assert!(
            head[2].contains("ray start --head --node-ip-address=192.168.100.1 --port=6379"),
            "{head:?}"
        );
        assert!(
            head[2].contains("RAY_ADDRESS=192.168.100.1:6379 python job.py"),
            "{head:?}"
        );
        let w = node_argv(Recipe::Ray, &cmd, &ns, 1, 6379).unwrap();
        assert_eq!(w[2], "--address=192.168.100.1:6379");
        assert_eq!(w[3], "--node-ip-address=192.168.100.2");
        assert!(node_argv(Recipe::Ray, &s(&["ray"]), &ns, 0, 1).is_err());
    }

    #[test]
    fn a_version_difference_names_the_odd_node() {
        let v = |t: &str, p: &str| -> Versions {
            [("torch", t), ("python", p)]
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect()
        };
        let d = version_diffs(&[
            ("a".into(), v("2.6.0", "3.11.2")),
            ("b".into(), v("2.6.0", "3.11.2")),
            ("c".into(), v("2.0.0", "3.11.2")),
        ]);
        assert_eq!(
            d,
            [VersionDiff {
                what: "torch".into(),
                expected: "2.6.0".into(),
                differing: vec![("c".into(), "2.0.0".into())]
            }]
        );
        let mut only = v("2.6.0", "3.11.2");
        only.insert("vllm".into(), "0.11.0".into());
        let d = version_diffs(&[("a".into(), v("2.6.0", "3.11.2")), ("b".into(), only)]);
        assert_eq!(d[0].what, "vllm");
        assert_eq!(d[0].expected, "absent");
        assert!(version_diffs(&[("a".into(), v("1", "2"))]).is_empty());
    }
}
