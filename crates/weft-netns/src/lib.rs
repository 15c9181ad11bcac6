//! Test-only harness that builds a small multi-host "cluster" on one Linux machine out of
//! network namespaces, so integration tests of the NCCL net plugin and of `weft doctor` /
//! `weft bench p2p` can check that handshakes cross the *management* network and bulk data
//! crosses the *data* network(s).
//!
//! Each host is a network namespace with `lo` up, a management interface `mgmt0` and one or two
//! data interfaces `data0`/`data1` (names are stable because the plugin selects interfaces by
//! prefix). Every network is a Linux bridge inside one per-cluster *switch* namespace; every
//! host interface is one end of a veth pair whose other end is a port of that bridge. Nothing is
//! created in, and no route is added to, the root namespace. Links can be cut
//! ([`Cluster::set_link`]), shaped with `tc` ([`Cluster::shape`]), given a smaller MTU
//! ([`Cluster::set_mtu`]), and their byte counters read ([`Cluster::counters`]).
//!
//! It is **for** tests and benchmarks run as root on a Linux box with iproute2. It is **not** a
//! network emulator of real RDMA fabrics (veth has no verbs, no RoCE, no PFC), not a
//! performance reference for real NICs (veth throughput is memory-copy throughput), and must
//! never be linked into shipped binaries. Call [`available`] first and skip with its message
//! when namespaces cannot be used.
//!
//! Addressing: host `h` (0-based) on network `n` (0 = mgmt, 1 = data0, 2 = data1) gets
//! `10.(200+n).C.(h+1)/24`, where `C` (1..=250) is derived from the process id and a
//! per-process counter. Isolation does not depend on `C`: each cluster has its own switch
//! namespace, so two clusters share no L2 segment even if their addresses were equal, and
//! hosts have only connected /24 routes (no default route), so nothing can leave toward an
//! address the cluster did not create. `C` only makes addresses differ between concurrent
//! clusters, so a test that mixes up clusters fails with "network unreachable" instead of
//! silently talking to its own cluster's twin.
//!
//! Dropping a [`Cluster`] (also during unwinding after a test panic) kills processes still left
//! in its namespaces, deletes its veths and bridges by name and then its namespaces.
//! Namespaces of test processes that were killed outright (SIGKILL) are removed by
//! [`cleanup_stale`], which [`Cluster::create`] calls.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::time::Duration;
//! use weft_netns::{Cluster, ClusterSpec, Shape};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if let Err(why) = weft_netns::available() {
//!     eprintln!("skipping: {why}");
//!     return Ok(());
//! }
//! let c = Cluster::create(&ClusterSpec { hosts: 2, data_rails: 1, mtu: 9000 })?;
//! let dst = c.host(1).data_ifs[0].1;
//! c.shape(0, "data0", &Shape::rate("1gbit"))?; // host 0's egress on data0
//!
//! // A listener in host 1 and a client in host 0, both in-process.
//! let listener = c.in_host(1, || TcpListener::bind((dst, 5000)))??;
//! let before = c.counters(0, "data0")?;
//! std::thread::scope(|s| {
//!     s.spawn(|| {
//!         let (mut conn, _) = listener.accept().unwrap();
//!         let mut sink = Vec::new();
//!         conn.read_to_end(&mut sink).unwrap();
//!     });
//!     c.in_host(0, || {
//!         let mut conn = TcpStream::connect((dst, 5000)).unwrap();
//!         conn.write_all(&vec![0u8; 1 << 20]).unwrap();
//!     })
//!     .unwrap();
//! });
//! let after = c.counters(0, "data0")?;
//! assert!(after.1 - before.1 >= 1 << 20);
//!
//! let out = c.exec(0, "ip", &["-br", "addr"], Duration::from_secs(5))?;
//! println!("{}", String::from_utf8_lossy(&out.stdout));
//! # Ok(())
//! # }
//! // `c` drops here: namespaces, veths and bridges are gone.
//! ```

#![forbid(unsafe_code)]

mod cmd;
mod ping;
pub mod require;

use std::fmt;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Prefix of every namespace name this crate creates: `weftns-<pid>-<seq>-{sw,h<i>}`.
pub const NS_PREFIX: &str = "weftns-";

/// Directory where iproute2 keeps named network namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Errors from the harness. Messages name the host (index and namespace) and the command.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Namespaces cannot be used here (see [`available`]).
    #[error("network namespaces unavailable: {0}")]
    Unavailable(String),
    /// The [`ClusterSpec`] or an argument is out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A host index past the end of the cluster.
    #[error("host index {index} out of range: cluster has {hosts} hosts")]
    NoSuchHost {
        /// The index asked for.
        index: usize,
        /// Number of hosts in the cluster.
        hosts: usize,
    },
    /// A command could not be started.
    #[error("{context}: cannot start `{command}`: {source}")]
    Spawn {
        /// What it was for, naming the host.
        context: String,
        /// The command line.
        command: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("{context}: `{command}` failed ({status}): {stderr}")]
    Command {
        /// What it was for, naming the host.
        context: String,
        /// The command line.
        command: String,
        /// Exit status, rendered.
        status: String,
        /// Its stderr, trimmed.
        stderr: String,
    },
    /// A command ran past its timeout and was killed (with its process group).
    #[error("{context}: `{command}` timed out after {timeout:?} and was killed")]
    Timeout {
        /// What it was for, naming the host.
        context: String,
        /// The command line.
        command: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The kernel lacks a feature this request needs (e.g. `sch_netem` for delay/loss).
    #[error("{0}")]
    Unsupported(String),
    /// Any other OS-level failure (entering a namespace, reading counters, sockets).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the host.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Number of hosts, 2..=8.
    pub hosts: usize,
    /// Number of data networks (`data0`, `data1`), 1 or 2.
    pub data_rails: usize,
    /// MTU of the data interfaces (68..=65535). `mgmt0` always has 1500.
    pub mtu: u32,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            hosts: 2,
            data_rails: 1,
            mtu: 9000,
        }
    }
}

impl ClusterSpec {
    /// `hosts` hosts with `data_rails` data networks at the default MTU 9000.
    pub fn new(hosts: usize, data_rails: usize) -> Self {
        ClusterSpec {
            hosts,
            data_rails,
            ..ClusterSpec::default()
        }
    }

    fn validate(&self) -> Result<(), NetnsError> {
        if !(2..=8).contains(&self.hosts) {
            return Err(NetnsError::Invalid(format!(
                "ClusterSpec.hosts = {}, must be 2..=8",
                self.hosts
            )));
        }
        if !(1..=2).contains(&self.data_rails) {
            return Err(NetnsError::Invalid(format!(
                "ClusterSpec.data_rails = {}, must be 1 or 2",
                self.data_rails
            )));
        }
        check_mtu(self.mtu)
    }
}

fn check_mtu(mtu: u32) -> Result<(), NetnsError> {
    if (68..=65535).contains(&mtu) {
        Ok(())
    } else {
        Err(NetnsError::Invalid(format!("MTU {mtu} outside 68..=65535")))
    }
}

/// One simulated host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The network namespace name (`ip netns exec <name> …` works from a shell, too).
    pub name: String,
    /// Management interface name, always `mgmt0`.
    pub mgmt_if: String,
    /// Management address (/24).
    pub mgmt_addr: Ipv4Addr,
    /// Data interfaces `data0` (and `data1`) with their addresses (/24).
    pub data_ifs: Vec<(String, Ipv4Addr)>,
}

impl Host {
    /// Address of data rail `rail`, if the cluster has it.
    pub fn data_addr(&self, rail: usize) -> Option<Ipv4Addr> {
        self.data_ifs.get(rail).map(|(_, a)| *a)
    }

    /// Address of this host's interface `ifname` (`mgmt0`, `data0`, `data1`).
    pub fn addr_of(&self, ifname: &str) -> Option<Ipv4Addr> {
        if ifname == self.mgmt_if {
            return Some(self.mgmt_addr);
        }
        self.data_ifs
            .iter()
            .find(|(n, _)| n == ifname)
            .map(|(_, a)| *a)
    }
}

/// Egress shaping for one interface. All `None` removes any shaping.
///
/// `rate` alone uses `tbf`; `delay_ms`/`loss_pct` use `netem`, with a `tbf` child when a rate is
/// given too.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    /// `tc` rate, e.g. `"100mbit"`, `"1gbit"`, `"500kbit"`.
    pub rate: Option<String>,
    /// One-way added delay in milliseconds.
    pub delay_ms: Option<f64>,
    /// Random loss in percent (0..=100).
    pub loss_pct: Option<f64>,
}

impl Shape {
    /// A pure rate limit.
    pub fn rate(rate: &str) -> Shape {
        Shape {
            rate: Some(rate.to_string()),
            ..Shape::default()
        }
    }

    /// Adds a delay.
    pub fn with_delay_ms(mut self, ms: f64) -> Shape {
        self.delay_ms = Some(ms);
        self
    }

    /// Adds random loss.
    pub fn with_loss_pct(mut self, pct: f64) -> Shape {
        self.loss_pct = Some(pct);
        self
    }

    /// The `tc` command lines (arguments after `tc -n <ns>`) that install this shape on `dev`.
    fn tc_commands(&self, dev: &str) -> Result<Vec<Vec<String>>, NetnsError> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        if let Some(r) = &self.rate
            && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'))
        {
            return Err(NetnsError::Invalid(format!("bad tc rate {r:?}")));
        }
        if let Some(d) = self.delay_ms
            && !(d.is_finite() && d >= 0.0)
        {
            return Err(NetnsError::Invalid(format!("bad delay {d} ms")));
        }
        if let Some(l) = self.loss_pct
            && !(l.is_finite() && (0.0..=100.0).contains(&l))
        {
            return Err(NetnsError::Invalid(format!("bad loss {l} %")));
        }
        // A 256 KiB bucket is >= one 64 KiB GSO super-packet and a few jumbo frames, and keeps
        // the long-run average at `rate` for anything from ~1 Mbit/s to tens of Gbit/s.
        let tbf = |parent: &[&str], rate: &str| {
            let mut v = s(&["qdisc", "add", "dev", dev]);
            v.extend(s(parent));
            v.extend(s(&[
                "tbf", "rate", rate, "burst", "256kb", "latency", "100ms",
            ]));
            v
        };
        let mut cmds = Vec::new();
        if self.delay_ms.is_none() && self.loss_pct.is_none() {
            if let Some(rate) = &self.rate {
                cmds.push(tbf(&["root", "handle", "1:"], rate));
            }
            return Ok(cmds);
        }
        let mut netem = s(&[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", "100000",
        ]);
        if let Some(d) = self.delay_ms {
            netem.push("delay".into());
            netem.push(format!("{d}ms"));
        }
        if let Some(l) = self.loss_pct {
            netem.push("loss".into());
            netem.push(format!("{l}%"));
        }
        cmds.push(netem);
        if let Some(rate) = &self.rate {
            cmds.push(tbf(&["parent", "1:1", "handle", "10:"], rate));
        }
        Ok(cmds)
    }
}

/// The networks of a cluster: index 0 is management, 1.. are data rails.
fn net_ifname(net: usize) -> String {
    if net == 0 {
        "mgmt0".to_string()
    } else {
        format!("data{}", net - 1)
    }
}

fn net_bridge(net: usize) -> String {
    if net == 0 {
        "br-mgmt".to_string()
    } else {
        format!("br-data{}", net - 1)
    }
}

/// Switch-side name of host `h`'s veth on network `net`, e.g. `h7-data1` (<= 15 chars).
fn switch_port(h: usize, net: usize) -> String {
    format!("h{h}-{}", net_ifname(net))
}

fn net_addr(net: usize, cid: u8, h: usize) -> Ipv4Addr {
    // net <= 2 and h <= 7, so both octets fit.
    Ipv4Addr::new(10, 200 + net as u8, cid, h as u8 + 1)
}

/// Says why network namespaces cannot be used here (not root, no `ip`/`tc`, creating a
/// namespace fails), or `Ok(())`. The answer is computed once per process.
pub fn available() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("network namespaces need Linux".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "network namespace tests need root (CAP_SYS_ADMIN + CAP_NET_ADMIN); run as root or skip"
                .into(),
        );
    }
    for (tool, arg) in [("ip", "-V"), ("tc", "-V")] {
        cmd::tool("probe", tool, &[arg], None)
            .map_err(|e| format!("`{tool}` (iproute2) is not usable: {e}"))?;
    }
    let name = format!("{NS_PREFIX}{}-probe", std::process::id());
    cmd::tool("probe", "ip", &["netns", "add", &name], None)
        .map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let entered = enter_ns(&name, || ()).map_err(|e| format!("cannot enter a namespace: {e}"));
    let deleted = cmd::tool("probe", "ip", &["netns", "del", &name], None)
        .map_err(|e| format!("cannot delete a network namespace: {e}"));
    entered.and(deleted).map(|_| ())
}

/// Says whether `tc` delay/loss shaping can work: the kernel needs `sch_netem`
/// (`CONFIG_NET_SCH_NETEM`). Rate limits (`tbf`) do not need it. Probed once per process in a
/// scratch namespace.
pub fn netem_available() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            available()?;
            let name = format!("{NS_PREFIX}{}-netem-probe", std::process::id());
            cmd::tool("probe", "ip", &["netns", "add", &name], None)
                .map_err(|e| format!("cannot create a network namespace: {e}"))?;
            let r = cmd::tool(
                "probe",
                "tc",
                &[
                    "-n", &name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                ],
                None,
            );
            let _ = cmd::tool("probe", "ip", &["netns", "del", &name], None);
            r.map(drop).map_err(|e| {
                format!(
                    "the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM / module sch_netem); \
                     only rate limits are available ({e})"
                )
            })
        })
        .clone()
}

/// Runs `f` on a fresh thread that has joined network namespace `ns` (by name); the thread ends
/// afterwards, so no other thread's namespace changes. A panic in `f` is resumed in the caller.
fn enter_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let path = format!("{NETNS_DIR}/{ns}");
    let file = File::open(&path).map_err(|source| NetnsError::Io {
        context: format!("namespace {ns}: opening {path}"),
        source,
    })?;
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name(format!("netns:{ns}"))
            .spawn_scoped(s, move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Io {
                    context: format!("namespace {ns}: setns"),
                    source: e.into(),
                })?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Io {
                context: format!("namespace {ns}: spawning a thread"),
                source,
            })?;
        match handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Writes `1` to the namespace's IPv6 `disable_ipv6` knobs so no link-local addresses, router
/// solicitations or MLD reports appear: counters then only show the test's own traffic.
/// Must be called on a thread inside the namespace (`/proc/sys/net` follows the caller's netns).
fn disable_ipv6_here() -> io::Result<()> {
    for knob in ["all", "default"] {
        let path = format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6");
        match std::fs::write(&path, "1") {
            Ok(()) => {}
            // Kernel without IPv6: nothing to disable.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads `(rx_bytes, tx_bytes)` of `ifname` from `/proc/thread-self/net/dev`, which reflects the
/// calling thread's network namespace.
fn read_counters_here(ifname: &str) -> io::Result<Option<(u64, u64)>> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev")?;
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() != ifname {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Receive: bytes packets errs drop fifo frame compressed multicast; Transmit: bytes …
        let parse = |i: usize| -> io::Result<u64> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| io::Error::other(format!("malformed /proc/net/dev line {line:?}")))
        };
        return Ok(Some((parse(0)?, parse(8)?)));
    }
    Ok(None)
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Kills (SIGKILL) every process still inside namespace `ns`, except this process.
fn kill_ns_processes(ns: &str) {
    let Ok(out) = cmd::tool(
        &format!("namespace {ns}"),
        "ip",
        &["netns", "pids", ns],
        None,
    ) else {
        return;
    };
    let me = std::process::id();
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        if pid != me {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// Deletes namespaces named `weftns-<pid>-…` whose creating process no longer exists (left
/// behind by a test process that was SIGKILLed). Returns how many were deleted. Best effort.
pub fn cleanup_stale() -> usize {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return 0;
    };
    let mut n = 0;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        kill_ns_processes(&name);
        if cmd::tool("cleanup", "ip", &["netns", "del", &name], None).is_ok() {
            n += 1;
        }
    }
    n
}

/// A set of hosts (network namespaces) joined by management and data networks.
///
/// `Cluster` is `Sync`: several threads may call [`Cluster::in_host`] and friends at once.
pub struct Cluster {
    prefix: String,
    switch_ns: String,
    hosts: Vec<Host>,
    rails: usize,
    /// Namespaces actually created, in creation order; Drop deletes exactly these.
    created: Vec<String>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("prefix", &self.prefix)
            .field("switch_ns", &self.switch_ns)
            .field("hosts", &self.hosts)
            .finish()
    }
}

static CLUSTER_SEQ: AtomicU32 = AtomicU32::new(0);

impl Cluster {
    /// Builds the cluster. All or nothing: on any failure, whatever was created is removed
    /// before the error is returned.
    pub fn create(spec: &ClusterSpec) -> Result<Cluster, NetnsError> {
        spec.validate()?;
        available().map_err(NetnsError::Unavailable)?;
        cleanup_stale();

        let pid = std::process::id();
        let seq = CLUSTER_SEQ.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{NS_PREFIX}{pid}-{seq}");
        // 1..=250: (x % 250) < 250, so the cast and +1 cannot overflow a u8.
        let cid = ((u64::from(pid) * 7 + u64::from(seq)) % 250) as u8 + 1;
        let nets = 1 + spec.data_rails;

        let hosts: Vec<Host> = (0..spec.hosts)
            .map(|h| Host {
                name: format!("{prefix}-h{h}"),
                mgmt_if: net_ifname(0),
                mgmt_addr: net_addr(0, cid, h),
                data_ifs: (1..nets)
                    .map(|n| (net_ifname(n), net_addr(n, cid, h)))
                    .collect(),
            })
            .collect();
        // From here on, `cluster` owns whatever exists; an early return drops it, cleaning up.
        let mut cluster = Cluster {
            switch_ns: format!("{prefix}-sw"),
            prefix,
            hosts,
            rails: spec.data_rails,
            created: Vec::new(),
        };
        let sw = cluster.switch_ns.clone();

        // Switch namespace with one bridge per network.
        cluster.add_ns(&sw)?;
        let mut script = String::from("link set lo up\n");
        for n in 0..nets {
            let br = net_bridge(n);
            script.push_str(&format!(
                "link add {br} type bridge stp_state 0 mcast_snooping 0\nlink set {br} up\n"
            ));
        }
        ip_batch(&format!("switch namespace {sw}"), &sw, &script)?;

        // Hosts: namespace, lo, veths (peer moved straight into the switch), addresses.
        for h in 0..spec.hosts {
            let ns = cluster.hosts[h].name.clone();
            cluster.add_ns(&ns)?;
            let mut script = String::from("link set lo up\n");
            for n in 0..nets {
                let ifname = net_ifname(n);
                let mtu = if n == 0 { 1500 } else { spec.mtu };
                let peer = switch_port(h, n);
                let addr = net_addr(n, cid, h);
                script.push_str(&format!(
                    "link add {ifname} mtu {mtu} type veth peer name {peer} netns {sw} mtu {mtu}\n\
                     addr add {addr}/24 dev {ifname}\n\
                     link set {ifname} up\n"
                ));
            }
            ip_batch(&format!("host {h} ({ns})"), &ns, &script)?;
        }

        // Plug the switch-side ends into their bridges.
        let mut script = String::new();
        for h in 0..spec.hosts {
            for n in 0..nets {
                script.push_str(&format!(
                    "link set {} master {} up\n",
                    switch_port(h, n),
                    net_bridge(n)
                ));
            }
        }
        ip_batch(&format!("switch namespace {sw}"), &sw, &script)?;
        Ok(cluster)
    }

    /// Creates namespace `ns`, records it for cleanup, and disables IPv6 in it.
    fn add_ns(&mut self, ns: &str) -> Result<(), NetnsError> {
        cmd::tool(
            &format!("namespace {ns}"),
            "ip",
            &["netns", "add", ns],
            None,
        )?;
        self.created.push(ns.to_string());
        enter_ns(ns, disable_ipv6_here)?.map_err(|source| NetnsError::Io {
            context: format!("namespace {ns}: disabling IPv6"),
            source,
        })
    }

    /// All hosts, index = host number.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `i`.
    ///
    /// # Panics
    /// If `i` is out of range (test code; use [`Cluster::hosts`] to check).
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Name prefix shared by every namespace of this cluster (`weftns-<pid>-<seq>`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Name of the switch namespace holding the bridges `br-mgmt`, `br-data0`, `br-data1` and
    /// the switch-side veth ends `h<i>-<ifname>`.
    pub fn switch_ns(&self) -> &str {
        &self.switch_ns
    }

    /// Names of all namespaces this cluster created (switch first).
    pub fn namespaces(&self) -> &[String] {
        &self.created
    }

    fn checked(&self, i: usize) -> Result<&Host, NetnsError> {
        self.hosts.get(i).ok_or(NetnsError::NoSuchHost {
            index: i,
            hosts: self.hosts.len(),
        })
    }

    fn ctx(&self, i: usize) -> String {
        match self.hosts.get(i) {
            Some(h) => format!("host {i} ({})", h.name),
            None => format!("host {i}"),
        }
    }

    /// Network index of one of our interface names (0 mgmt, 1 data0, 2 data1).
    fn net_of(&self, i: usize, ifname: &str) -> Result<usize, NetnsError> {
        (0..=self.rails)
            .find(|&n| net_ifname(n) == ifname)
            .ok_or_else(|| {
                NetnsError::Invalid(format!(
                    "{}: no interface {ifname:?} (have mgmt0{})",
                    self.ctx(i),
                    (0..self.rails)
                        .map(|r| format!(", data{r}"))
                        .collect::<String>()
                ))
            })
    }

    /// A `Command` that runs `program` inside host `i` (`ip netns exec <ns> program`), for
    /// callers who want to set stdio, env or cwd themselves.
    pub fn command(&self, i: usize, program: &str) -> Result<Command, NetnsError> {
        let host = self.checked(i)?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.name, program]);
        Ok(c)
    }

    /// Runs `program args` inside host `i` and returns its output (whatever the exit status).
    /// After `timeout` the command and its process group are killed and
    /// [`NetnsError::Timeout`] is returned.
    pub fn exec(
        &self,
        i: usize,
        program: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Output, NetnsError> {
        let mut c = self.command(i, program)?;
        c.args(args);
        cmd::run(c, None, timeout, &self.ctx(i), &cmd::render(program, args))
    }

    /// Spawns a long-running `program args` inside host `i` with extra environment `env`.
    /// stdin is `/dev/null`; stdout and stderr are inherited (so a chatty child can never block
    /// on a full pipe; use [`Cluster::command`] to capture them). The returned child is the
    /// program itself (`ip netns exec` execs it), so `kill()`/`wait()` act on it directly. Any
    /// process still in the namespace when the cluster drops is killed.
    pub fn spawn(
        &self,
        i: usize,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Child, NetnsError> {
        let mut c = self.command(i, program)?;
        c.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        c.spawn().map_err(|source| NetnsError::Spawn {
            context: self.ctx(i),
            command: cmd::render(program, args),
            source,
        })
    }

    /// Runs `f` on a thread that has entered host `i`'s network namespace: sockets created in
    /// `f` belong to that host (they keep working after `f` returns, from any thread). Blocks
    /// until `f` returns; a panic in `f` propagates.
    pub fn in_host<T: Send>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, NetnsError> {
        let host = self.checked(i)?;
        enter_ns(&host.name, f).map_err(|e| match e {
            NetnsError::Io { context, source } => NetnsError::Io {
                context: format!("host {i}: {context}"),
                source,
            },
            other => other,
        })
    }

    /// `(rx_bytes, tx_bytes)` of interface `ifname` inside host `i`, read from the namespace's
    /// `/proc/net/dev` (same numbers as `/sys/class/net/<if>/statistics`).
    pub fn counters(&self, i: usize, ifname: &str) -> Result<(u64, u64), NetnsError> {
        let r = self.in_host(i, || read_counters_here(ifname))?;
        match r {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(NetnsError::Invalid(format!(
                "{}: no interface {ifname:?}",
                self.ctx(i)
            ))),
            Err(source) => Err(NetnsError::Io {
                context: format!("{}: reading /proc/net/dev", self.ctx(i)),
                source,
            }),
        }
    }

    /// Like [`Cluster::counters`] for the switch-side end of host `i`'s `ifname` link, i.e. what
    /// the switch received from / sent to host `i`.
    pub fn switch_counters(&self, i: usize, ifname: &str) -> Result<(u64, u64), NetnsError> {
        let port = switch_port(i, self.net_of(i, ifname)?);
        let r = enter_ns(&self.switch_ns, || read_counters_here(&port))?;
        match r {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(NetnsError::Invalid(format!("switch: no port {port:?}"))),
            Err(source) => Err(NetnsError::Io {
                context: format!("switch {}: reading /proc/net/dev", self.switch_ns),
                source,
            }),
        }
    }

    fn ip_in(&self, i: usize, ns: &str, args: &[&str]) -> Result<(), NetnsError> {
        let mut full = vec!["-n", ns];
        full.extend_from_slice(args);
        cmd::tool(&self.ctx(i), "ip", &full, None).map(drop)
    }

    fn tc_in(&self, i: usize, ns: &str, args: &[&str]) -> Result<Output, NetnsError> {
        let mut full = vec!["-n", ns];
        full.extend_from_slice(args);
        cmd::tool(&self.ctx(i), "tc", &full, None)
    }

    /// Sets host `i`'s interface up or down (`ip link set dev <if> up|down`). Down also drops
    /// the carrier of the switch-side end, like pulling a cable.
    pub fn set_link(&self, i: usize, ifname: &str, up: bool) -> Result<(), NetnsError> {
        let host = self.checked(i)?;
        self.ip_in(
            i,
            &host.name,
            &["link", "set", "dev", ifname, if up { "up" } else { "down" }],
        )
    }

    /// Shapes the **egress** of host `i`'s `ifname` (traffic host `i` sends on it): replaces any
    /// previous shape. `Shape::default()` removes shaping. To shape traffic *to* host `i`, use
    /// [`Cluster::shape_ingress`].
    pub fn shape(&self, i: usize, ifname: &str, shape: &Shape) -> Result<(), NetnsError> {
        let host = self.checked(i)?;
        self.apply_shape(i, &host.name, ifname, shape)
    }

    /// Shapes traffic **to** host `i` on `ifname`, by shaping the egress of the switch-side end
    /// of that link.
    pub fn shape_ingress(&self, i: usize, ifname: &str, shape: &Shape) -> Result<(), NetnsError> {
        self.checked(i)?;
        let port = switch_port(i, self.net_of(i, ifname)?);
        self.apply_shape(i, &self.switch_ns, &port, shape)
    }

    fn apply_shape(&self, i: usize, ns: &str, dev: &str, shape: &Shape) -> Result<(), NetnsError> {
        let cmds = shape.tc_commands(dev)?;
        if shape.delay_ms.is_some() || shape.loss_pct.is_some() {
            netem_available().map_err(|why| {
                NetnsError::Unsupported(format!("{}: cannot add delay/loss: {why}", self.ctx(i)))
            })?;
        }
        self.clear_qdisc(i, ns, dev)?;
        for c in &cmds {
            let args: Vec<&str> = c.iter().map(String::as_str).collect();
            self.tc_in(i, ns, &args)?;
        }
        Ok(())
    }

    fn clear_qdisc(&self, i: usize, ns: &str, dev: &str) -> Result<(), NetnsError> {
        let shown = self.tc_in(i, ns, &["qdisc", "show", "dev", dev])?;
        let text = String::from_utf8_lossy(&shown.stdout);
        if text.contains("netem") || text.contains("tbf") {
            self.tc_in(i, ns, &["qdisc", "del", "dev", dev, "root"])?;
        }
        Ok(())
    }

    /// Sets the MTU of host `i`'s `ifname` and of the switch-side end of the same link (both
    /// ends of the cable), so frames larger than `mtu` are dropped in either direction. Other
    /// hosts keep their MTU; the bridge forwards up to each port's MTU.
    pub fn set_mtu(&self, i: usize, ifname: &str, mtu: u32) -> Result<(), NetnsError> {
        let host = self.checked(i)?;
        check_mtu(mtu)?;
        let m = mtu.to_string();
        self.ip_in(i, &host.name, &["link", "set", "dev", ifname, "mtu", &m])?;
        if let Ok(n) = self.net_of(i, ifname) {
            let port = switch_port(i, n);
            self.ip_in(
                i,
                &self.switch_ns,
                &["link", "set", "dev", &port, "mtu", &m],
            )?;
        }
        Ok(())
    }

    /// Sends one ICMP echo request from host `i` to `dst` with `payload` data bytes (like
    /// `ping -c1 -s <payload> [-M do]`), over a raw socket so `ping(8)` need not be installed.
    /// `Some(rtt)` on a reply; `None` if no reply came within `timeout` or the local stack
    /// refused to send (e.g. DF packet larger than the interface MTU, network unreachable).
    pub fn ping(
        &self,
        i: usize,
        dst: Ipv4Addr,
        payload: usize,
        dont_fragment: bool,
        timeout: Duration,
    ) -> Result<Option<Duration>, NetnsError> {
        let r = self.in_host(i, || ping::ping(dst, payload, dont_fragment, timeout))?;
        r.map_err(|source| NetnsError::Io {
            context: format!("{}: ping {dst}", self.ctx(i)),
            source,
        })
    }

    /// Tears the cluster down now and reports problems (Drop does the same, silently except
    /// for a message on stderr).
    pub fn destroy(mut self) -> Result<(), NetnsError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), NetnsError> {
        let created = std::mem::take(&mut self.created);
        if created.is_empty() {
            return Ok(());
        }
        for ns in &created {
            kill_ns_processes(ns);
        }
        // Delete veths and bridges by name (deleting one veth end removes its peer), so they
        // go away even if something still pins a namespace. -force: continue past names that
        // were never created (partial creation).
        if created.contains(&self.switch_ns) {
            let mut script = String::new();
            for h in 0..self.hosts.len() {
                for n in 0..=self.rails {
                    script.push_str(&format!("link del {}\n", switch_port(h, n)));
                }
            }
            for n in 0..=self.rails {
                script.push_str(&format!("link del {}\n", net_bridge(n)));
            }
            let _ = cmd::tool(
                "teardown",
                "ip",
                &["-n", &self.switch_ns, "-force", "-batch", "-"],
                Some(script.as_bytes()),
            );
        }
        let mut first_err = None;
        for ns in created.iter().rev() {
            if let Err(e) = cmd::tool("teardown", "ip", &["netns", "del", ns], None) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("weft-netns: teardown of {} incomplete: {e}", self.prefix);
        }
    }
}

/// Runs `ip -n <ns> -batch -` with `script` on stdin.
fn ip_batch(context: &str, ns: &str, script: &str) -> Result<(), NetnsError> {
    cmd::tool(
        context,
        "ip",
        &["-n", ns, "-batch", "-"],
        Some(script.as_bytes()),
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz() {
        for h in 0..8 {
            for n in 0..3 {
                assert!(switch_port(h, n).len() <= 15);
                assert!(net_bridge(n).len() <= 15);
                assert!(net_ifname(n).len() <= 15);
            }
        }
    }

    #[test]
    fn spec_validation() {
        assert!(ClusterSpec::new(1, 1).validate().is_err());
        assert!(ClusterSpec::new(9, 1).validate().is_err());
        assert!(ClusterSpec::new(2, 3).validate().is_err());
        assert!(ClusterSpec::new(8, 2).validate().is_ok());
        let s = ClusterSpec {
            mtu: 10,
            ..ClusterSpec::default()
        };
        assert!(s.validate().is_err());
    }

    #[test]
    fn shape_commands() {
        let join = |v: Vec<Vec<String>>| v.iter().map(|c| c.join(" ")).collect::<Vec<_>>();
        assert_eq!(
            join(Shape::rate("100mbit").tc_commands("data0").unwrap()),
            ["qdisc add dev data0 root handle 1: tbf rate 100mbit burst 256kb latency 100ms"]
        );
        assert_eq!(
            join(
                Shape::rate("1gbit")
                    .with_delay_ms(2.5)
                    .with_loss_pct(1.0)
                    .tc_commands("d")
                    .unwrap()
            ),
            [
                "qdisc add dev d root handle 1: netem limit 100000 delay 2.5ms loss 1%",
                "qdisc add dev d parent 1:1 handle 10: tbf rate 1gbit burst 256kb latency 100ms"
            ]
        );
        assert!(Shape::default().tc_commands("d").unwrap().is_empty());
        assert!(Shape::rate("1 gbit").tc_commands("d").is_err());
        assert!(
            Shape::default()
                .with_loss_pct(200.0)
                .tc_commands("d")
                .is_err()
        );
    }

    #[test]
    fn addresses() {
        assert_eq!(net_addr(0, 5, 0), Ipv4Addr::new(10, 200, 5, 1));
        assert_eq!(net_addr(2, 250, 7), Ipv4Addr::new(10, 202, 250, 8));
    }
}
