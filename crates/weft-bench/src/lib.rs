//! `weft bench` and `weft doctor` as a library: what the CLI calls.
//!
//! * [`comm`] and [`perf`]: collectives (all-reduce, all-gather, reduce-scatter, broadcast,
//!   reduce, all-to-all, send/recv; ring and tree) on host memory through the NCCL net plugin's
//!   C ABI opened with `dlopen` ([`net`]), the code path NCCL itself takes, with no GPU; ranks
//!   meet through a TCP rendezvous ([`bootstrap`]); results are checked element by element and
//!   reported the way nccl-tests reports them.
//! * [`p2p`]: bandwidth, latency and path MTU between every pair of hosts on the data network,
//!   with the pairs far below the median named, and a PNG heat map.
//! * [`doctor`]: per-host facts gathered through a [`weft_hosts::HostRunner`] (local, SSH, or a
//!   network namespace), compared across hosts into PASS / WARN / FAIL findings with remedies.
//!
//! It is not a replacement for nccl-tests on GPUs (no device memory, no NCCL), and it holds no
//! private copy of the transport: bytes move through `libnccl_net_weft.so` or plain sockets.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_bench::{bootstrap::Bootstrap, comm::{Comm, CommOptions}, net::Plugin, perf};
//!
//! # fn main() -> Result<(), weft_bench::BenchError> {
//! // In each of 2 processes (rank 0 and rank 1):
//! let rank = 0;
//! let plugin = Plugin::load(std::path::Path::new("target/debug/libnccl_net_weft.so"))?;
//! let boot = Bootstrap::join("127.0.0.1:29600".parse().unwrap(), rank, 2, Duration::from_secs(30))?;
//! let opts = perf::PerfOptions { min_bytes: 1 << 20, max_bytes: 1 << 20, ..Default::default() };
//! let mut comm = Comm::new(plugin, boot, &CommOptions { max_bytes: 1 << 20, timeout: Duration::from_secs(30), dev: 0 })?;
//! let report = perf::run(&mut comm, &opts, &mut |_, _, _| {})?;
//! assert_eq!(report.wrong, 0);
//! # Ok(())
//! # }
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod bootstrap;
pub mod checks;
pub mod comm;
pub mod doctor;
pub mod dtype;
pub mod judge;
pub mod launch;
pub mod links;
pub mod loss;
pub mod net;
pub mod p2p;
pub mod perf;
pub mod probe;
pub mod remote;

/// Errors of the bench and doctor library. Messages name the rank, peer or host at fault.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The plugin failed to load or a call returned an error.
    #[error("plugin: {0}")]
    Plugin(String),
    /// The rendezvous failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A bounded wait ran out.
    #[error("timeout: {0}")]
    Timeout(String),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// Running a command on a host failed.
    #[error("host {host}: {msg}")]
    Host { host: String, msg: String },
    /// Reaching a host, or reading what it said ([`weft_hosts`]).
    #[error(transparent)]
    Hosts(#[from] weft_hosts::HostsError),
    /// A host of a p2p run has no data interface with an address to measure.
    #[error("{host}: no data interface with an IPv4 address (see --data-if)")]
    NoRails { host: String },
    /// Other I/O.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Who this process is in a collectives run, and how it meets the others.
#[derive(Debug, Clone)]
pub struct RankSpec {
    pub rank: usize,
    pub nranks: usize,
    /// Rank 0 listens here; the others connect.
    pub rendezvous: SocketAddr,
    /// `libnccl_net_weft.so` (or any ncclNet v8 plugin).
    pub plugin: PathBuf,
    /// Bound on the rendezvous, the connections and every transfer.
    pub timeout: Duration,
    /// The plugin device to use.
    pub dev: usize,
}

/// One rank of a collectives run: load the plugin, meet the other ranks, connect, run `opts`.
pub fn run_rank(
    spec: &RankSpec,
    opts: &perf::PerfOptions,
    progress: &mut dyn FnMut(&perf::Row, usize, usize),
) -> Result<perf::Report, BenchError> {
    let me = perf::RankLine {
        rank: spec.rank,
        pid: std::process::id(),
        host: String::new(),
        name: String::new(),
        dev: spec.dev,
        what: String::new(),
    };
    run_rank_reporting(spec, opts, &me, &mut |_| {}, None, progress)
}

/// The link probe of a collectives run ([`links`]): bytes per link and the report's callback.
pub struct LinkProbe<'a> {
    /// Bytes from every rank to every other (at most the buffers' size).
    pub bytes: usize,
    /// Rounds over every pair; the best time of each link is kept.
    pub reps: usize,
    /// Called on rank 0 with the judged links, before the collectives run.
    pub on_report: &'a mut dyn FnMut(&links::LinkReport),
}

/// [`run_rank`], and once every rank is connected, `on_ranks` gets every rank's `me` (in rank
/// order, on every rank): who runs where, on which interfaces, for nccl-tests'
/// `# Using devices` block. With `links`, every link is timed before the collectives
/// ([`comm::Comm::probe_links`]) and judged on rank 0 ([`links::judge`]), by the ranks'
/// `name`s.
pub fn run_rank_reporting(
    spec: &RankSpec,
    opts: &perf::PerfOptions,
    me: &perf::RankLine,
    on_ranks: &mut dyn FnMut(&[perf::RankLine]),
    links: Option<LinkProbe<'_>>,
    progress: &mut dyn FnMut(&perf::Row, usize, usize),
) -> Result<perf::Report, BenchError> {
    let plugin = net::Plugin::load(&spec.plugin)?;
    let boot = bootstrap::Bootstrap::join(spec.rendezvous, spec.rank, spec.nranks, spec.timeout)?;
    let mut comm = comm::Comm::new(
        plugin,
        boot,
        &comm::CommOptions {
            max_bytes: opts.max_bytes.max(links.as_ref().map_or(0, |l| l.bytes)),
            timeout: spec.timeout,
            dev: spec.dev,
        },
    )?;
    let mine =
        serde_json::to_vec(me).map_err(|e| BenchError::Bootstrap(format!("rank line: {e}")))?;
    let all = comm.bootstrap().allgather(&mine)?;
    let ranks = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice::<perf::RankLine>(b)
                .map_err(|e| BenchError::Bootstrap(format!("rank {r} sent a bad rank line: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    on_ranks(&ranks);
    if let Some(l) = links
        && spec.nranks > 1
    {
        let mine = comm.probe_links(l.bytes, l.reps)?;
        let times = comm.bootstrap().allgather_f64s(&mine)?;
        if spec.rank == 0 {
            let names: Vec<String> = ranks
                .iter()
                .map(|r| {
                    if r.name.is_empty() {
                        r.host.clone()
                    } else {
                        r.name.clone()
                    }
                })
                .collect();
            (l.on_report)(&links::judge(&names, l.bytes, &times));
        }
    }
    perf::run(&mut comm, opts, progress)
}

/// The interfaces the plugin picks in this process, from its own settings
/// (`WEFT_MGMT_IFNAME`, `WEFT_DATA_IFNAME`) and selection rules, for the `# Using devices`
/// block: `data data0 10.1.0.2, mgmt mgmt0 10.0.0.2`.
pub fn plugin_interfaces() -> String {
    let cfg = match weft_transport::Config::from_env() {
        Ok(c) => c,
        Err(e) => return format!("(bad settings: {e})"),
    };
    let all = match weft_transport::iface::list() {
        Ok(a) => a,
        Err(e) => return format!("(interfaces unreadable: {e})"),
    };
    let show = |v: &[weft_transport::iface::Interface]| {
        v.iter()
            .map(|i| {
                i.best_addr()
                    .map_or_else(|| i.name.clone(), |a| format!("{} {a}", i.name))
            })
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let mgmt: Vec<_> = weft_transport::iface::select(&all, cfg.mgmt_ifname.as_ref())
        .into_iter()
        .take(1)
        .collect();
    // As the plugin does: without WEFT_DATA_IFNAME, data goes over the management interface.
    let data = match &cfg.data_ifname {
        None => mgmt.clone(),
        Some(spec) => weft_transport::iface::select(&all, Some(spec)),
    };
    format!("data {}, mgmt {}", show(&data), show(&mgmt))
}
