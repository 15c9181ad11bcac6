//! `weft bench`: collectives over the NCCL plugin's C ABI, nccl-tests style.

use std::io::IsTerminal;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use weft_bench::comm::{Algo, Coll};
use weft_bench::dtype::{DataType, RedOp};
use weft_bench::perf::{self, Average, PerfOptions, Row};
use weft_bench::{RankSpec, launch, net, p2p, probe};
use weft_hosts::remote::Remote;
use weft_hosts::runner::{Local, any_ssh, hosts_from, parse_hosts_with, remote_exe, ssh_extra};
use weft_hosts::{HostRunner, IfChoice, facts};

use crate::{EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Collectives on host memory through the NCCL net plugin (dlopen, ncclNet v8), nccl-tests style.
    #[command(
        after_help = "Examples:\n  weft bench collectives --nranks 4 -b 8 -e 64M -f 2\n  weft bench collectives all_gather reduce_scatter -d all -o all -b 1K -e 1M\n  weft bench collectives --hosts node1,node2,node3,node4 -b 64M -e 256M --min-bw 10\n  WEFT_TOKEN=wfa_... weft bench collectives --hosts node1,node2 --report-to https://ctl:7100\n\nColumns and bus bandwidth are nccl-tests': algbw = size / time (GB/s = 1e9 B/s);\nbusbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and alltoall,\n1 for broadcast, reduce and sendrecv. Exit code 1 when an element is wrong or the average\nbus bandwidth is below --min-bw.\n\nBefore the collectives every link between two ranks is timed through the plugin\n(--link-bytes each way, one pair at a time): the report lists them as `#` lines and names\na host whose every link from it (or to it) is below half the reference (`# SLOW HOST`;\n\"links\" in --json). A slow host does not change the exit code.\n\nWith --report-to (and --hosts) those per-pair link times are stored in the controller as a\n`collectives` run, one link per ordered pair of hosts (interface `plugin`); the bus bandwidth\nis one figure for the whole collective and is not stored as any link's."
    )]
    Collectives(Box<CollArgs>),
    /// Bandwidth and latency between every ordered pair of hosts on the data network (TCP).
    #[command(
        after_help = "Examples:\n  weft bench p2p --hosts node1,node2,node3,node4 --heatmap p2p.png\n  weft bench p2p --hosts ns1,ns2,ns3 --via netns --data-if =data0 --json\n  WEFT_TOKEN=wfa_... weft bench p2p --hosts node1,node2 --report-to https://ctl:7100\n\nEach pair: --streams TCP streams for --duration (bytes counted by the receiver), then an\n8-byte ping-pong (median round trip). Pairs below --threshold x the median are called out;\na host is blamed when every pair from it (or to it) is slow, or every connection with it\nhas a small TCP MSS (a smaller MTU). Exit code 1 when a pair is slow or failed."
    )]
    P2p(Box<P2pArgs>),
    /// Prompt and generation speed of an OpenAI-compatible LLM server at context depths; `compare` across node counts.
    #[command(after_help = crate::bench_llm::AFTER_HELP)]
    Llm(Box<crate::bench_llm::LlmArgs>),
    /// Internal: host facts as JSON.
    #[command(hide = true)]
    HostFacts,
    /// Internal: DF-bit ICMP probes from this host.
    #[command(hide = true)]
    DfProbe {
        #[arg(long)]
        payload: usize,
        #[arg(long)]
        to: String,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Internal: trains of ICMP echoes from this host, for packet loss.
    #[command(hide = true)]
    LossProbe {
        #[arg(long)]
        to: String,
        #[arg(long, default_value_t = 300)]
        count: u32,
        #[arg(long, default_value_t = 2000)]
        interval_us: u64,
    },
    /// Internal: the p2p server, on the given addresses, until its stdin closes.
    #[command(hide = true)]
    P2pServe {
        /// Addresses to listen on, comma-separated (the host's data addresses).
        #[arg(long)]
        bind: String,
        /// The interface of each address, comma-separated in the same order: each listener
        /// is bound to it (SO_BINDTODEVICE).
        #[arg(long)]
        dev: Option<String>,
        #[arg(long, default_value_t = 0)]
        port: u16,
        #[arg(long, default_value_t = 600)]
        lifetime: u64,
        /// Keep serving after stdin closes (until --lifetime).
        #[arg(long)]
        untethered: bool,
    },
    /// Internal: one p2p measurement from this host.
    #[command(hide = true)]
    P2pProbe {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value_t = 4)]
        streams: usize,
        #[arg(long, default_value_t = 2000)]
        duration_ms: u64,
        #[arg(long, default_value_t = 50)]
        pings: usize,
        #[arg(long, default_value_t = 30)]
        timeout: u64,
        /// This host's data interface: every connection is bound to it (SO_BINDTODEVICE).
        #[arg(long)]
        dev: Option<String>,
    },
}

/// Where the hosts are and how to reach them (bench p2p, doctor).
#[derive(Args, Clone)]
pub struct HostArgs {
    /// Hosts, comma-separated (`node1,node2`, or `netns:ns1,...`); `weft mesh`, `sync` and
    /// `run` take `--group NAME` instead.
    #[arg(long, default_value = "")]
    pub hosts: String,
    /// How to reach the hosts: ssh, netns, local.
    #[arg(long, default_value = "ssh")]
    pub via: String,
    /// The weft binary on the hosts (ssh; netns and local use this binary).
    #[arg(long, default_value = "weft")]
    pub remote_weft: String,
    /// Data interfaces, NCCL syntax (`enp1,enP2`, `=data0`); default: RDMA netdevs, else every
    /// up interface with an address but the management one.
    #[arg(long, env = "WEFT_DATA_IFNAME")]
    pub data_if: Option<String>,
    /// Management interface, NCCL syntax; default: the default-route interface.
    #[arg(long, env = "WEFT_MGMT_IFNAME")]
    pub mgmt_if: Option<String>,
    /// Bound in seconds on each helper run on a host.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// An ssh_config file for every `ssh` to the hosts (`ssh -F FILE`); the doctor's
    /// host-to-host SSH check uses it on the hosts too, so the path must be valid there.
    #[arg(long, value_name = "FILE")]
    pub ssh_config: Option<PathBuf>,
    /// An extra option for every `ssh` to the hosts (`-o KEY=VALUE`), repeatable.
    #[arg(long = "ssh-option", value_name = "KEY=VALUE")]
    pub ssh_options: Vec<String>,
    /// The hosts as a list, when they come from a controller group (`--group`) rather than
    /// `--hosts`: taken as they are, never joined and split again.
    #[arg(skip)]
    pub members: Vec<String>,
}

impl HostArgs {
    /// `--mgmt-if` and `--data-if`, parsed.
    pub fn if_choice(&self) -> Result<IfChoice> {
        Ok(IfChoice::parse(
            self.mgmt_if.as_deref(),
            self.data_if.as_deref(),
        )?)
    }

    pub fn runners(&self) -> Result<(Vec<Box<dyn HostRunner>>, Remote)> {
        let extra = ssh_extra(self.ssh_config.as_deref(), &self.ssh_options);
        let r = if !self.members.is_empty() {
            hosts_from(&self.members, &self.via, &extra)?
        } else if self.hosts.trim().is_empty() {
            bail!("--hosts is required (node1,node2 or netns:ns1,...)");
        } else {
            parse_hosts_with(&self.hosts, &self.via, &extra)?
        };
        let exe = remote_exe(&r, &self.remote_weft)?;
        Ok((
            r,
            Remote {
                exe,
                timeout: Duration::from_secs(self.timeout.max(1)),
            },
        ))
    }
}

#[derive(Args, Clone)]
pub struct P2pArgs {
    #[command(flatten)]
    hosts: HostArgs,
    /// TCP streams per pair.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Seconds of bulk transfer per pair.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Ping-pong round trips per pair.
    #[arg(long, default_value_t = 50)]
    pings: usize,
    /// A pair below this fraction of its reference is slow: what its links should do
    /// (--expect-speed, else the speed a physical NIC reports), else the median of every
    /// host's best pair.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,
    /// Expected link speed of every data interface, in Mb/s (e.g. 200000).
    #[arg(long)]
    expect_speed: Option<u32>,
    /// Write a PNG heat map of rail 0 here (rail N: the name with `.railN` before `.png`).
    #[arg(long)]
    heatmap: Option<PathBuf>,
    #[command(flatten)]
    report: crate::report_to::ReportTo,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size {s:?} (bytes, or with K, M, G)"))
}

#[derive(Args, Clone)]
pub struct CollArgs {
    /// Collectives: all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv, or all.
    #[arg(default_value = "all_reduce")]
    colls: Vec<String>,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2.0)]
    step_factor: f64,
    /// Add this many bytes between steps (instead of -f).
    #[arg(short = 'i', long = "stepbytes", default_value = "0", value_parser = parse_size)]
    step_bytes: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations (at the largest size).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    warmup: usize,
    /// Checked runs per size (0: no check, #wrong N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: usize,
    /// Reduction: sum, prod, min, max, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Type: uint8 int32 int64 half bfloat16 float double (or f32, bf16, ...), or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Time reported: 0 rank 0, 1 average over ranks, 2 minimum, 3 maximum.
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    average: u8,
    /// Algorithm: ring or tree.
    #[arg(short = 'A', long = "algo", env = "NCCL_ALGO", default_value = "ring")]
    algo: String,
    /// Number of local rank processes (without --hosts).
    #[arg(long, default_value_t = 2)]
    nranks: usize,
    /// One rank per host: comma-separated (`node1,node2`, or `netns:ns1,...`).
    #[arg(long)]
    hosts: Option<String>,
    /// How to reach the hosts: ssh, netns, local.
    #[arg(long, default_value = "ssh")]
    via: String,
    /// Where rank 0 listens for the others (HOST:PORT); default: the first host, port 29600.
    #[arg(long)]
    rendezvous: Option<String>,
    /// The plugin (.so); default $WEFT_PLUGIN, or next to the weft binary.
    #[arg(long, env = "WEFT_PLUGIN")]
    plugin: Option<PathBuf>,
    /// The weft binary on the hosts (ssh).
    #[arg(long, default_value = "weft")]
    remote_weft: String,
    /// Data interfaces of the ranks with --hosts (the plugin's syntax: `=data0`, `enp1`,
    /// `10.1.0.0/16`); default, as doctor and p2p: RDMA netdevs, else every up interface with
    /// an address but the management one.
    #[arg(long, env = "WEFT_DATA_IFNAME")]
    data_if: Option<String>,
    /// Management interface of the ranks with --hosts; default: the default-route interface.
    #[arg(long, env = "WEFT_MGMT_IFNAME")]
    mgmt_if: Option<String>,
    /// An ssh_config file for every `ssh` to the hosts (`ssh -F FILE`).
    #[arg(long, value_name = "FILE")]
    ssh_config: Option<PathBuf>,
    /// An extra option for every `ssh` to the hosts (`-o KEY=VALUE`), repeatable.
    #[arg(long = "ssh-option", value_name = "KEY=VALUE")]
    ssh_options: Vec<String>,
    /// Fail (exit 1) when the average bus bandwidth is below this, in GB/s.
    #[arg(long, env = "NCCL_TESTS_MIN_BW")]
    min_bw: Option<f64>,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Also write nccl-tests' JSON output (its format version 3) to this file, one file per
    /// collective; an existing file is never overwritten: FILE.0, FILE.1, ... as nccl-tests.
    #[arg(short = 'J', long = "output-file", alias = "output_file")]
    json_file: Option<PathBuf>,
    /// Per-iteration timing (nccl-tests' -I): 1 adds i_min, i_max, i_p99 and i_cv% columns
    /// and every rank's iteration times to the JSON.
    #[arg(short = 'I', long = "per_iter_timing", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    per_iter: u8,
    /// Bound, in seconds, on the rendezvous, each transfer, and (x4) the whole run.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Plugin device.
    #[arg(long, default_value_t = 0)]
    dev: usize,
    /// Before the collectives, time every link (each rank sends this many bytes to every
    /// other, one pair at a time, best of two) and name the hosts whose links are slow; 0
    /// skips it.
    #[arg(long = "link-bytes", default_value = "4M", value_parser = parse_size)]
    link_bytes: usize,
    /// Internal: this process is rank N of a run started by weft.
    #[arg(long, hide = true)]
    rank: Option<usize>,
    /// Internal: the name the rank's host was given by (its --hosts entry).
    #[arg(long, hide = true)]
    rank_name: Option<String>,
    /// Internal: rank 0 also prints its link report as one JSON line ([`LINKS_TAG`]) for
    /// the launcher's --report-to.
    #[arg(long, hide = true)]
    links_line: bool,
    #[command(flatten)]
    report: crate::report_to::ReportTo,
}

/// How rank 0 starts the line that carries its link report to the launcher (a `#` line,
/// so a reader of nccl-tests output skips it should one ever get through).
const LINKS_TAG: &str = "# weft-links-json ";

fn list<T: std::str::FromStr<Err = String> + Copy>(s: &str, all: &[T]) -> Result<Vec<T>> {
    if s == "all" {
        return Ok(all.to_vec());
    }
    s.split(',')
        .map(|x| x.trim().parse::<T>().map_err(|e| anyhow!(e)))
        .collect()
}

impl CollArgs {
    fn options(&self) -> Result<PerfOptions> {
        let mut colls = Vec::new();
        for c in &self.colls {
            colls.extend(list(c, &Coll::ALL)?);
        }
        Ok(PerfOptions {
            colls,
            types: list(&self.dtype, &DataType::ALL)?,
            ops: list(&self.op, &RedOp::ALL)?,
            min_bytes: self.min_bytes,
            max_bytes: self.max_bytes.max(self.min_bytes),
            step_factor: self.step_factor,
            step_bytes: self.step_bytes,
            iters: self.iters,
            warmup: self.warmup,
            check: self.check,
            root: self.root,
            algo: self.algo.parse::<Algo>().map_err(|e| anyhow!(e))?,
            average: Average::from_flag(self.average)
                .ok_or_else(|| anyhow!("-a {}: must be 0..=3", self.average))?,
            per_iter: self.per_iter == 1,
        })
    }

    /// The arguments a rank process gets (everything but where the ranks run).
    fn worker_args(&self, json: bool) -> Vec<String> {
        let mut v: Vec<String> = vec!["bench".into(), "collectives".into()];
        v.extend(self.colls.iter().cloned());
        let pairs: [(&str, String); 16] = [
            ("-b", self.min_bytes.to_string()),
            ("-e", self.max_bytes.to_string()),
            ("-f", self.step_factor.to_string()),
            ("-i", self.step_bytes.to_string()),
            ("-n", self.iters.to_string()),
            ("-w", self.warmup.to_string()),
            ("-c", self.check.to_string()),
            ("-o", self.op.clone()),
            ("-d", self.dtype.clone()),
            ("-r", self.root.to_string()),
            ("-a", self.average.to_string()),
            ("-A", self.algo.clone()),
            ("--timeout", self.timeout.to_string()),
            ("--dev", self.dev.to_string()),
            ("--link-bytes", self.link_bytes.to_string()),
            ("-I", self.per_iter.to_string()),
        ];
        for (k, val) in pairs {
            v.push(k.into());
            v.push(val);
        }
        if let Some(m) = self.min_bw {
            v.extend(["--min-bw".into(), m.to_string()]);
        }
        if let Some(p) = &self.csv {
            v.extend(["--csv".into(), p.display().to_string()]);
        }
        if let Some(p) = &self.json_file {
            v.extend(["-J".into(), p.display().to_string()]);
        }
        if json {
            v.push("--json".into());
        }
        // The launcher stores the links; the ranks never see the URL nor the token.
        if self.report.report_to.is_some() {
            v.push("--links-line".into());
        }
        v
    }

    /// Refuses, before anything starts, a --report-to whose links would not be between
    /// nodes or would not be measured: local ranks, `--link-bytes 0`, a host named twice.
    fn check_report(&self, runners: &[Box<dyn HostRunner>]) -> Result<()> {
        self.report.check()?;
        let Some(url) = &self.report.report_to else {
            return Ok(());
        };
        if self.hosts.is_none() {
            bail!(
                "--report-to {url} stores links between hosts; it needs --hosts (local ranks are processes on this machine)"
            );
        }
        if self.link_bytes == 0 {
            bail!(
                "--report-to {url} stores the link times measured before the collectives; it cannot go with --link-bytes 0"
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for r in runners {
            if !seen.insert(r.name()) {
                bail!(
                    "--report-to {url}: {} is named twice in --hosts; its links could not be told apart",
                    r.name()
                );
            }
        }
        Ok(())
    }
}

pub fn run(cmd: BenchCommand, json: bool) -> Result<u8> {
    match cmd {
        BenchCommand::Collectives(a) => match a.rank {
            Some(rank) => worker(&a, rank, json),
            None => launch(&a, json),
        },
        BenchCommand::P2p(a) => p2p(&a, json),
        BenchCommand::Llm(a) => crate::bench_llm::run(*a, json),
        BenchCommand::HostFacts => {
            let f = facts::gather(std::path::Path::new("/"))?;
            println!("{}", serde_json::to_string(&f)?);
            Ok(EXIT_OK)
        }
        BenchCommand::DfProbe {
            payload,
            to,
            timeout_ms,
        } => {
            let dsts = ipv4_list("address", &to)?;
            let r = probe::df_probe(&dsts, payload, Duration::from_millis(timeout_ms))
                .context("DF probe (needs root or CAP_NET_RAW)")?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(EXIT_OK)
        }
        BenchCommand::LossProbe {
            to,
            count,
            interval_us,
        } => {
            let dsts = ipv4_list("address", &to)?;
            let r = weft_bench::loss::probe(
                &dsts,
                count,
                Duration::from_micros(interval_us.max(100)),
                Duration::from_secs(1),
            )
            .context("loss probe (needs root or CAP_NET_RAW)")?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(EXIT_OK)
        }
        BenchCommand::P2pServe {
            bind,
            dev,
            port,
            lifetime,
            untethered,
        } => {
            let addrs = ipv4_list("--bind address", &bind)?;
            let devs: Vec<Option<String>> = match &dev {
                None => vec![None; addrs.len()],
                Some(d) => d.split(',').map(|x| Some(x.trim().to_string())).collect(),
            };
            if devs.len() != addrs.len() {
                bail!(
                    "--dev names {} interfaces for {} --bind addresses",
                    devs.len(),
                    addrs.len()
                );
            }
            let binds: Vec<_> = addrs.into_iter().zip(devs).collect();
            p2p::serve(&binds, port, Duration::from_secs(lifetime), !untethered)
                .context("p2p server")?;
            Ok(EXIT_OK)
        }
        BenchCommand::P2pProbe {
            to,
            streams,
            duration_ms,
            pings,
            timeout,
            dev,
        } => {
            let r = p2p::probe(
                to,
                &p2p::ProbeOptions {
                    streams,
                    duration: Duration::from_millis(duration_ms),
                    pings,
                    timeout: Duration::from_secs(timeout),
                    dev,
                },
            )
            .with_context(|| format!("p2p probe to {to}"))?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(EXIT_OK)
        }
    }
}

/// A comma-separated list of IPv4 addresses; an error names the one that is not
/// (`what` says which flag it came from).
fn ipv4_list(what: &str, list: &str) -> Result<Vec<std::net::Ipv4Addr>> {
    list.split(',')
        .map(|a| a.trim().parse().with_context(|| format!("{what} {a:?}")))
        .collect()
}

/// Runs the p2p matrix: facts, servers, every ordered pair, analysis, table or JSON.
fn p2p(a: &P2pArgs, json: bool) -> Result<u8> {
    if !(a.duration > 0.0 && a.duration <= 600.0) || a.streams == 0 {
        bail!("--duration must be in (0, 600] seconds and --streams at least 1");
    }
    a.report.check()?;
    let (hosts, remote) = a.hosts.runners()?;
    if hosts.len() < 2 {
        bail!("--hosts needs at least two hosts");
    }
    let choice = a.hosts.if_choice()?;
    let (info, expected) =
        match weft_bench::remote::p2p_hosts(&hosts, &remote, &choice, a.expect_speed) {
            Ok(x) => x,
            Err(e @ weft_bench::BenchError::NoRails { .. }) => {
                eprintln!("weft: {e}");
                return Ok(EXIT_ENVIRONMENT);
            }
            Err(e) => return Err(e.into()),
        };
    let opts = weft_bench::remote::P2pOptions {
        streams: a.streams,
        duration: Duration::from_secs_f64(a.duration),
        pings: a.pings,
    };
    let refs: Vec<&dyn HostRunner> = hosts.iter().map(|h| h.as_ref()).collect();
    let rails = info.iter().map(|h| h.rails.len()).max().unwrap_or(0);
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let n = info.len();
        let b = indicatif::ProgressBar::new((n * n.saturating_sub(1) * rails) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} pairs {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let pairs = weft_bench::remote::p2p_matrix(&refs, &info, &remote, &opts, &mut |p| {
        if json {
            return;
        }
        let line = format!(
            "  {} -> {} ({}): {}",
            p.src,
            p.dst,
            p.src_if,
            match &p.error {
                Some(e) => format!("failed: {e}"),
                None => format!("{:.3} Gb/s, rtt {:.0} us", p.gbps, p.rtt_us),
            }
        );
        match &bar {
            Some(b) => {
                b.inc(1);
                b.set_message(format!("{} -> {}", p.src, p.dst));
                b.suspend(|| eprintln!("{line}"));
            }
            None => eprintln!("{line}"),
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let pairs = pairs?;
    let names = info.iter().map(|h| h.name.clone()).collect();
    let m = p2p::analyse_with(names, pairs, a.threshold, &expected);
    let mut maps = Vec::new();
    if let Some(path) = &a.heatmap {
        for rail in 0..rails {
            let p = if rail == 0 {
                path.clone()
            } else {
                path.with_extension(format!("rail{rail}.png"))
            };
            p2p::heatmap(&m, rail, &p)?;
            maps.push(p);
        }
    }
    let bad =
        !m.slow.is_empty() || !m.blamed.is_empty() || m.pairs.iter().any(|p| p.error.is_some());
    let (reported, report_error) = crate::report_to::outcome(a.report.send(
        weft_controller::links::LinkSource::P2p,
        crate::report_to::pair_results(&m.pairs),
    ));
    if json {
        crate::output::json(&serde_json::json!({
            "matrix": &m,
            "heatmaps": maps,
            "passed": !bad,
            "reported": reported,
            "report_error": report_error,
        }))?;
    } else {
        println!(
            "{}",
            crate::output::table(
                [
                    "FROM", "TO", "IF", "GBIT/S", "% REF", "RTT US", "MSS", "NOTE"
                ],
                m.pairs.iter().map(|p| {
                    let slow = m
                        .slow
                        .iter()
                        .any(|s| s.src == p.src && s.dst == p.dst && s.rail == p.rail);
                    [
                        p.src.clone(),
                        p.dst.clone(),
                        p.src_if.clone(),
                        format!("{:.3}", p.gbps),
                        m.slow
                            .iter()
                            .find(|s| s.src == p.src && s.dst == p.dst && s.rail == p.rail)
                            .map_or_else(|| "-".into(), |s| format!("{:.0}", s.pct_of_reference)),
                        format!("{:.0}", p.rtt_us),
                        p.mss.to_string(),
                        match (&p.error, slow) {
                            (Some(e), _) => format!("FAILED: {e}"),
                            (None, true) => "SLOW".into(),
                            _ => String::new(),
                        },
                    ]
                })
            )
        );
        println!(
            "\nmedian {:.3} Gb/s, rtt {:.0} us; slow: below {:.0}% of the reference (what the links should do, else the median of every host's best pair)",
            m.median_gbps,
            m.median_rtt_us,
            m.threshold * 100.0
        );
        for b in &m.blamed {
            println!(
                "BLAME {} ({}, {}): {}",
                b.host, b.what, b.direction, b.message
            );
        }
        for p in &maps {
            println!(
                "heat map {}: rows = senders, columns = receivers, in the order {}; green = fastest pair ({:.3} Gb/s), red = 0, grey = diagonal, black = failed",
                p.display(),
                m.hosts.join(", "),
                m.pairs.iter().map(|p| p.gbps).fold(0.0, f64::max)
            );
        }
        if !bad {
            println!(
                "all {} pairs within {:.0}% of their reference",
                m.pairs.len(),
                m.threshold * 100.0
            );
        }
        if let (Some(r), Some(url)) = (&reported, &a.report.report_to) {
            println!("{}", crate::report_to::stored_line(url, r));
        }
    }
    if let Some(e) = &report_error {
        eprintln!("weft: {e}");
        return Ok(EXIT_ENVIRONMENT);
    }
    Ok(if bad { EXIT_CHECK_FAILED } else { EXIT_OK })
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts one rank per host (or `--nranks` local processes) and waits for them, bounded.
fn launch(a: &CollArgs, json: bool) -> Result<u8> {
    a.options()?; // usage errors before anything starts
    let timeout = Duration::from_secs(a.timeout);
    let (runners, rendezvous, exe, plugin): (
        Vec<Box<dyn HostRunner>>,
        String,
        String,
        Option<PathBuf>,
    ) = match &a.hosts {
        Some(h) => {
            let r = parse_hosts_with(
                h,
                &a.via,
                &ssh_extra(a.ssh_config.as_deref(), &a.ssh_options),
            )?;
            let rdv = match a
                .rendezvous
                .clone()
                .or_else(|| launch::default_rendezvous(r[0].as_ref()))
            {
                Some(x) => x,
                None => bail!(
                    "--rendezvous HOST:PORT is needed with --via {}",
                    r[0].kind()
                ),
            };
            // On SSH hosts the plugin is theirs (--plugin or the remote weft's own search);
            // namespace and local hosts share this machine's build.
            let plugin = if any_ssh(&r) {
                a.plugin.clone()
            } else {
                a.plugin.clone().or_else(net::find_plugin)
            };
            let exe = remote_exe(&r, &a.remote_weft)?;
            (r, rdv, exe, plugin)
        }
        None => {
            if a.nranks == 0 {
                bail!("--nranks must be at least 1");
            }
            let r: Vec<Box<dyn HostRunner>> = (0..a.nranks)
                .map(|_| Box::new(Local) as Box<dyn HostRunner>)
                .collect();
            (
                r,
                a.rendezvous
                    .clone()
                    .unwrap_or(format!("127.0.0.1:{}", free_port()?)),
                std::env::current_exe()?.display().to_string(),
                a.plugin.clone().or_else(net::find_plugin),
            )
        }
    };
    a.check_report(&runners)?;
    // Never WEFT_TOKEN: the launcher alone reports (see `passed_env`).
    let env = launch::passed_env(std::env::vars());
    // Each rank's interfaces: with --hosts the same selection as doctor and p2p, by name
    // on each host; local ranks use loopback unless told otherwise.
    let per_rank = if a.hosts.is_some() {
        let remote = Remote {
            exe: exe.clone(),
            timeout: Duration::from_secs(a.timeout.clamp(1, 60)),
        };
        launch::remote_rank_env(
            &runners,
            &remote,
            a.data_if.as_deref(),
            a.mgmt_if.as_deref(),
        )?
    } else {
        launch::local_rank_env(runners.len(), a.data_if.as_deref(), a.mgmt_if.as_deref())
    };
    let cmd = launch::RankCommand {
        exe: &exe,
        worker_args: a.worker_args(json),
        rendezvous: &rendezvous,
        plugin: plugin.as_deref(),
        named: a.hosts.is_some(),
    };
    let (argvs, envs) = launch::rank_commands(&runners, &cmd, &env, &per_rank);
    // With --report-to, rank 0's stdout comes through a pipe that takes its link report out.
    let (lead_out, lead) = match &a.report.report_to {
        Some(_) => {
            let (out, rx) = read_lead(json)?;
            (out, Some(rx))
        }
        None => (std::process::Stdio::inherit(), None),
    };
    let ends = launch::run_ranks(
        &runners,
        &argvs,
        &envs,
        lead_out,
        Instant::now() + timeout * 4,
    )?;
    for (rank, e) in ends.iter().enumerate() {
        let who = runners[rank].name();
        match e {
            launch::RankEnd::Code(_) => {}
            launch::RankEnd::Other { status, ssh_failed } => eprintln!(
                "weft: rank {rank} ({who}) ended with {status}{}",
                if *ssh_failed {
                    ": ssh could not run it there (check --ssh-config, keys and --remote-weft)"
                } else {
                    ""
                }
            ),
            launch::RankEnd::TimedOut => eprintln!(
                "weft: rank {rank} ({who}) still running after {:?}; killed",
                timeout * 4
            ),
        }
    }
    let code = launch::exit_code(&ends);
    match (lead, &a.report.report_to) {
        (Some(rx), Some(url)) => report_links(a, url, rx, json, code),
        _ => Ok(code),
    }
}

/// What rank 0 printed, with its link report taken out.
#[derive(Default)]
struct LeadOutput {
    /// The link report ([`LINKS_TAG`] line), if rank 0 got that far.
    links: Option<weft_bench::links::LinkReport>,
    /// With --json, the rest (rank 0's JSON document), held to add what was stored; in
    /// the human form every other line is printed as it comes.
    held: String,
}

/// A pipe for rank 0's stdout and a thread that reads it to its end (rank 0's exit, or
/// its kill at the run's deadline), printing or holding each line ([`LeadOutput`]).
fn read_lead(json: bool) -> Result<(std::process::Stdio, std::sync::mpsc::Receiver<LeadOutput>)> {
    use std::io::{BufRead, Write};
    let (r, w) = std::io::pipe().context("a pipe for rank 0's output")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = LeadOutput::default();
        let mut r = std::io::BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf);
            if let Some(j) = line.strip_prefix(LINKS_TAG) {
                out.links = serde_json::from_str(j.trim_end()).ok();
            } else if json {
                out.held.push_str(&line);
            } else {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(line.as_bytes());
                let _ = o.flush();
            }
        }
        let _ = tx.send(out);
    });
    Ok((std::process::Stdio::from(w), rx))
}

/// --report-to after the ranks ended: the links rank 0 timed, stored as a `collectives`
/// run ([`crate::report_to::collective_results`]); with --json, what was stored (or why
/// not) added to rank 0's document. A report that was not stored makes the exit code 2,
/// as `bench p2p` does.
fn report_links(
    a: &CollArgs,
    url: &str,
    rx: std::sync::mpsc::Receiver<LeadOutput>,
    json: bool,
    code: u8,
) -> Result<u8> {
    // Rank 0 has ended (or was killed): its pipe is at its end, or about to be.
    let out = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    let sent = match &out.links {
        Some(l) => a.report.send(
            weft_controller::links::LinkSource::Collectives,
            crate::report_to::collective_results(l),
        ),
        None => Err(anyhow!(
            "--report-to {url}: rank 0 reported no link times (it ended before the link check); nothing is stored"
        )),
    };
    let (reported, report_error) = crate::report_to::outcome(sent);
    if json {
        match serde_json::from_str::<serde_json::Value>(&out.held) {
            Ok(serde_json::Value::Object(mut o)) => {
                o.insert("reported".into(), serde_json::to_value(&reported)?);
                o.insert("report_error".into(), serde_json::to_value(&report_error)?);
                crate::output::json(&o)?;
            }
            // Rank 0 printed no document (it failed): what it printed, as it was.
            _ => print!("{}", out.held),
        }
    } else if let Some(r) = &reported {
        println!(
            "# {} (the link times above, through the plugin; the bus bandwidth is not a link's)",
            crate::report_to::stored_line(url, r)
        );
    }
    if let Some(e) = &report_error {
        eprintln!("weft: {e}");
        return Ok(EXIT_ENVIRONMENT);
    }
    Ok(code)
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("rendezvous address {addr}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| anyhow!("rendezvous address {addr} has no IPv4 address"))
}

/// One rank. Rank 0 prints the report.
fn worker(a: &CollArgs, rank: usize, json: bool) -> Result<u8> {
    let opts = a.options()?;
    let start_time = perf::local_time_string();
    let rdv = a
        .rendezvous
        .as_deref()
        .ok_or_else(|| anyhow!("--rank needs --rendezvous"))?;
    let plugin = a.plugin.clone().or_else(net::find_plugin).ok_or_else(|| {
        anyhow!("libnccl_net_weft.so not found: pass --plugin or set WEFT_PLUGIN")
    })?;
    let spec = RankSpec {
        rank,
        nranks: a.nranks,
        rendezvous: resolve(rdv)?,
        plugin: plugin.clone(),
        timeout: Duration::from_secs(a.timeout),
        dev: a.dev,
    };
    let lead = rank == 0;
    let test_of = |c: Coll| format!("{}_perf", c.name());
    if lead && !json {
        println!(
            "# weft bench collectives: nranks {} algo {:?} plugin {}",
            a.nranks,
            opts.algo,
            plugin.display()
        );
    }
    let bar = (lead && std::io::stderr().is_terminal() && opts.rows() > 4).then(|| {
        let b = indicatif::ProgressBar::new(opts.rows() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let say = |text: &str| match &bar {
        Some(b) => b.suspend(|| print!("{text}")),
        None => print!("{text}"),
    };
    let me = perf::RankLine {
        rank,
        pid: std::process::id(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
        name: a.rank_name.clone().unwrap_or_default(),
        dev: a.dev,
        what: format!("weft net plugin, {}", weft_bench::plugin_interfaces()),
    };
    let ranks = std::cell::RefCell::new(Vec::new());
    let mut on_ranks = |r: &[perf::RankLine]| *ranks.borrow_mut() = r.to_vec();
    // nccl-tests' output, one block per collective: preamble, header, rows, footer.
    let mut rows: Vec<Row> = Vec::new();
    let mut on_row = |row: &Row, done: usize, _total: usize| {
        if lead && !json {
            let mut text = String::new();
            if rows.last().map(|r| r.collective) != Some(row.collective) {
                if let Some(prev) = rows.last().map(|r| r.collective) {
                    let mine: Vec<&Row> = rows.iter().filter(|r| r.collective == prev).collect();
                    text.push_str(&perf::footer_of(&mine, &test_of(prev), a.min_bw));
                }
                text.push_str(&perf::preamble(
                    &test_of(row.collective),
                    &opts,
                    &ranks.borrow(),
                ));
                text.push_str(&if opts.per_iter {
                    perf::header_per_iter()
                } else {
                    perf::header()
                });
            }
            text.push_str(&perf::format_row(row));
            text.push('\n');
            say(&text);
            rows.push(row.clone());
        }
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    };
    let link_report = std::cell::RefCell::new(None);
    let mut on_links = |l: &weft_bench::links::LinkReport| {
        if !json {
            say(&weft_bench::links::comment_lines(l));
        }
        if a.links_line
            && let Ok(line) = serde_json::to_string(l)
        {
            say(&format!("{LINKS_TAG}{line}\n"));
        }
        *link_report.borrow_mut() = Some(l.clone());
    };
    let probe = (a.link_bytes > 0).then_some(weft_bench::LinkProbe {
        bytes: a.link_bytes,
        reps: 2,
        on_report: &mut on_links,
    });
    let report = match weft_bench::run_rank_reporting(
        &spec,
        &opts,
        &me,
        &mut on_ranks,
        probe,
        &mut on_row,
    ) {
        Ok(r) => r,
        Err(e) => {
            if let Some(b) = &bar {
                b.abandon();
            }
            eprintln!("weft: rank {rank}: {e}");
            return Ok(EXIT_ENVIRONMENT);
        }
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if !lead {
        return Ok(EXIT_OK);
    }
    let below = a.min_bw.filter(|m| report.avg_busbw < *m);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "report": &report,
                "links": &*link_report.borrow(),
                "min_bw": a.min_bw,
                "passed": report.wrong == 0 && below.is_none(),
            }))?
        );
    } else {
        if let Some(last) = report.rows.last().map(|r| r.collective) {
            let mine: Vec<&Row> = report
                .rows
                .iter()
                .filter(|r| r.collective == last)
                .collect();
            print!("{}", perf::footer_of(&mine, &test_of(last), a.min_bw));
        }
        if let Some(m) = below {
            println!(
                "# FAILED: average bus bandwidth {:.4} GB/s is below the minimum {m} GB/s",
                report.avg_busbw
            );
        }
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, perf::to_csv(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.json_file {
        // nccl-tests writes one file per run of one collective: one file per collective.
        let args: Vec<String> = std::env::args().collect();
        let env: Vec<String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("WEFT_") || k.starts_with("NCCL_"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let end_time = perf::local_time_string();
        let mut colls: Vec<Coll> = Vec::new();
        for r in &report.rows {
            if !colls.contains(&r.collective) {
                colls.push(r.collective);
            }
        }
        for c in colls {
            let mine: Vec<&Row> = report.rows.iter().filter(|r| r.collective == c).collect();
            let v = perf::nccl_tests_json(
                &opts,
                &ranks.borrow(),
                &mine,
                &perf::JsonContext {
                    args: &args,
                    env: &env,
                    start_time: &start_time,
                    end_time: &end_time,
                    min_bw: a.min_bw,
                },
            );
            let path = perf::free_json_path(p);
            std::fs::write(&path, serde_json::to_string_pretty(&v)?)
                .with_context(|| format!("writing {}", path.display()))?;
            if !json {
                println!(
                    "# {}: JSON output written to {}",
                    test_of(c),
                    path.display()
                );
            }
        }
    }
    Ok(if report.wrong > 0 || below.is_some() {
        EXIT_CHECK_FAILED
    } else {
        EXIT_OK
    })
}
