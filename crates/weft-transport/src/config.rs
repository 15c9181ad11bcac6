//! Configuration: which interfaces carry the handshake and the data, how many streams and
//! threads a connection uses, and how long any network wait may last.
//!
//! Everything has a default and can be set from the environment (see [`Config::from_env`]),
//! which is how the NCCL plugin is configured; a bench binary may build a [`Config`] directly.

use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// Messages up to this size go inline on the control stream, sent and read by the caller's
/// own `test`, rather than through the helper threads of the data streams, whose two thread
/// wake-ups cost more than copying such a message: a 2-16 KiB ping-pong takes 9-17 µs inline
/// against 22-38 µs through a data stream (docs/benchmarks.md, "Inline up to 16 KiB"). Larger
/// messages stay off the control stream so that one frame never overruns its CREDIT window by
/// more than half of it.
pub const DEFAULT_INLINE_BYTES: usize = 16 * 1024;
const _: () = assert!(DEFAULT_INLINE_BYTES as u64 <= crate::proto::CTRL_WINDOW / 2);

/// Most data streams a connection may use (NCCL's own socket transport caps at 64 too).
pub const MAX_STREAMS: usize = 64;
/// Most helper threads a connection may use.
pub const MAX_THREADS: usize = 16;

pub use weft_ifaddrs::{IfMatch, IfSpec, IfSpecError, in_subnet};

/// Transport configuration. `Default` gives the documented defaults; [`Config::from_env`]
/// overlays the `WEFT_*` environment variables.
#[derive(Debug, Clone)]
pub struct Config {
    /// Interface(s) for the handshake (first match is used). `None`: automatic, as NCCL does
    /// (first up interface with an address that is not `lo`, `docker*`, `virbr*`; `lo` last).
    pub mgmt_ifname: Option<IfSpec>,
    /// Interfaces that carry data; each match is one device. `None`: the management interface.
    pub data_ifname: Option<IfSpec>,
    /// Present all data interfaces as one device whose streams are striped over them.
    pub merge_rails: bool,
    /// Let a new connection share the control stream of one that runs the other way between
    /// the same two addresses (protocol JOIN), so that replies carry the acknowledgement of
    /// requests.
    pub share_ctrl: bool,
    /// Bound on every network wait: connect, handshake, a stalled message, a dead peer (see
    /// the crate docs, "Failure detection"). A receiver that has not posted its receive yet is
    /// not waiting, so it is never timed out.
    pub timeout: Duration,
    /// Bound on how long a listener waits with no peer connecting at all. Longer than `timeout`
    /// by default because a peer rank may legitimately start its side much later.
    pub accept_timeout: Duration,
    /// Helper threads per connection; 0 means the caller's `test()` moves the bytes itself.
    pub nthreads: usize,
    /// Data streams per helper thread (per connection when `nthreads` is 0).
    pub nsocks_per_thread: usize,
    /// Messages up to this size travel inline on the control stream.
    pub inline_max: usize,
    /// Smallest chunk a large message is split into across data streams.
    pub min_chunk: usize,
    /// `TCP_USER_TIMEOUT` for the data streams (zero: not set; control streams always use
    /// `timeout`). Bounds how long sent data may stay
    /// unacknowledged (a dead host while sending) but also how long a receiver may keep its window
    /// closed, so set it well above the longest pause between a peer's receives.
    pub tcp_user_timeout: Duration,
    /// Socket send/receive buffer size in bytes (0: kernel default / autotuning).
    pub sock_buf: usize,
    /// Which data path: TCP streams (default) or libfabric (`ofi`).
    pub backend: BackendKind,
    /// libfabric provider for the ofi backend (`tcp;ofi_rxm`, `shm`, `verbs;ofi_rxm`, ...).
    /// `None`: the first of [`crate::ofi::DEFAULT_PROVIDERS`] that works.
    pub ofi_provider: Option<String>,
    /// libfabric domain (`lo`, `eth1`, `mlx5_0`, ...). `None`: the one named like the device's
    /// data interface, else the provider's first. A comma-separated list (`lo,eth0`, or `lo,lo`
    /// for the same domain opened twice) gives every device that many rails (multi-rail).
    pub ofi_domain: Option<String>,
    /// Bytes of remote CQ data the ofi protocol may use: 8 or 4. `None`: what the provider
    /// offers (`verbs;ofi_rxm` 4, `tcp;ofi_rxm` and `shm` 8). 4 forces the 4-byte protocol on a
    /// provider that offers 8.
    pub ofi_cq_data_bytes: Option<usize>,
    /// ofi multi-rail: messages of at least this many bytes are striped across the rails of a
    /// connection; smaller ones go whole to one rail, round robin.
    pub ofi_stripe_bytes: usize,
    /// ofi: messages smaller than this go over a TCP stream on the data network (the TCP
    /// backend's way of moving bytes) instead of libfabric; 0 (default): all over libfabric.
    pub ofi_min_bytes: usize,
}

/// The data path a [`crate::Transport`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// TCP streams on the data interfaces.
    #[default]
    Tcp,
    /// libfabric (RDMA where the provider does it); TCP when libfabric or the provider is
    /// unavailable.
    Ofi,
    /// libfabric only with an RDMA provider (`verbs;ofi_rxm`, or `WEFT_OFI_PROVIDER`), else TCP.
    Auto,
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" | "socket" => Ok(BackendKind::Tcp),
            "ofi" | "libfabric" => Ok(BackendKind::Ofi),
            "auto" => Ok(BackendKind::Auto),
            _ => Err(Error::Config(format!(
                "WEFT_BACKEND={s:?}: expected tcp, ofi or auto"
            ))),
        }
    }
}

/// Helper threads and streams per thread of a connection when the environment says nothing:
/// four streams either way. On a host with 8 or more CPUs, one thread per stream: each thread
/// copies at most a few GB/s, and with 4 x 1 a quiet 16-core host reached 149-281% of iperf3
/// -P 4 from 4 MiB where 2 x 2 reached 72-87% from 64 MiB (docs/benchmarks.md). On smaller
/// hosts more threads than CPUs only add switches, so 2 x 2.
fn default_layout() -> (usize, usize) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 8 { (4, 1) } else { (2, 2) }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mgmt_ifname: None,
            data_ifname: None,
            merge_rails: false,
            share_ctrl: true,
            timeout: Duration::from_secs(30),
            accept_timeout: Duration::from_secs(300),
            nthreads: default_layout().0,
            nsocks_per_thread: default_layout().1,
            inline_max: DEFAULT_INLINE_BYTES,
            min_chunk: 64 * 1024,
            sock_buf: 0,
            tcp_user_timeout: Duration::ZERO,
            backend: BackendKind::Tcp,
            ofi_provider: None,
            ofi_domain: None,
            ofi_cq_data_bytes: None,
            ofi_stripe_bytes: 1 << 20,
            ofi_min_bytes: 0,
        }
    }
}

/// The environment variables [`Config::from_env`] reads, with their meaning.
pub const ENV_VARS: &[(&str, &str)] = &[
    (
        "WEFT_MGMT_IFNAME",
        "handshake interface, NCCL syntax (falls back to NCCL_SOCKET_IFNAME); default: auto",
    ),
    (
        "WEFT_DATA_IFNAME",
        "data interfaces, NCCL syntax or subnets (a.b.c.d/n); one device each; default: the management interface",
    ),
    (
        "WEFT_MERGE_RAILS",
        "1: one device striping every connection over all data interfaces; default 0",
    ),
    (
        "WEFT_SHARE_CTRL",
        "1: a connection shares the control stream of one running the other way between the same addresses; 0: one control stream each; default 1",
    ),
    (
        "WEFT_TIMEOUT_MS",
        "bound on every network wait in milliseconds; default 30000",
    ),
    (
        "WEFT_ACCEPT_TIMEOUT_MS",
        "how long a listener waits with no peer connecting at all; default 300000",
    ),
    (
        "WEFT_NTHREADS",
        "helper threads per connection (0..16; 0 = progress in test()); default 4 on hosts with 8+ CPUs, else 2",
    ),
    (
        "WEFT_NSOCKS_PERTHREAD",
        "data streams per helper thread (1..64, threads*socks <= 64); default 1 on hosts with 8+ CPUs, else 2",
    ),
    (
        "WEFT_INLINE_BYTES",
        "messages up to this size go inline on the control stream; default 16384",
    ),
    (
        "WEFT_MIN_CHUNK_BYTES",
        "smallest chunk of a message split over streams; default 65536",
    ),
    (
        "WEFT_TCP_USER_TIMEOUT_MS",
        "TCP_USER_TIMEOUT on data streams (control streams always use WEFT_TIMEOUT_MS); also bounds a receiver's closed window; default 0 (off)",
    ),
    (
        "WEFT_SOCK_BUF_BYTES",
        "SO_SNDBUF/SO_RCVBUF per socket; default 0 (kernel autotuning)",
    ),
    (
        "WEFT_BACKEND",
        "data path: tcp (default), ofi (libfabric; TCP if unavailable) or auto (ofi with an RDMA provider only)",
    ),
    (
        "WEFT_OFI_PROVIDER",
        "libfabric provider for the ofi backend, e.g. tcp;ofi_rxm or shm; default: verbs;ofi_rxm, then tcp;ofi_rxm",
    ),
    (
        "WEFT_OFI_DOMAIN",
        "libfabric domain, e.g. lo, eth1, mlx5_0, or a list for several rails (lo,eth0; lo,lo opens one twice); default: the device's data interface, else the provider's first",
    ),
    (
        "WEFT_OFI_CQ_DATA_BYTES",
        "4 or 8: bytes of remote CQ data the ofi protocol uses; 4 forces the 4-byte protocol (that of verbs;ofi_rxm) on providers that offer 8; default: what the provider offers",
    ),
    (
        "WEFT_OFI_STRIPE_BYTES",
        "ofi multi-rail (WEFT_OFI_DOMAIN=a,b): messages of at least this size are striped across the rails; default 1048576",
    ),
    (
        "WEFT_OFI_MIN_BYTES",
        "ofi: messages smaller than this go over a TCP stream on the data interface, larger ones over libfabric; default 0 (all over libfabric)",
    ),
    (
        "WEFT_OFI_LIBRARY",
        "path or name of libfabric to open at run time; default libfabric.so.1",
    ),
];

impl Config {
    /// Defaults overlaid with the environment (see [`ENV_VARS`]). A variable that is set but
    /// does not parse is an error naming it, never silently ignored.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_env`] with a custom lookup (tests, or a config file).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = nonempty("WEFT_MGMT_IFNAME").or_else(|| nonempty("NCCL_SOCKET_IFNAME")) {
            c.mgmt_ifname = Some(v.parse()?);
        }
        if let Some(v) = nonempty("WEFT_DATA_IFNAME") {
            c.data_ifname = Some(v.parse()?);
        }
        fn num(
            get: &dyn Fn(&str) -> Option<String>,
            k: &str,
            lo: usize,
            hi: usize,
        ) -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (lo..=hi).contains(n))
                    .map(Some)
                    .ok_or_else(|| {
                        Error::Config(format!("{k}={v:?}: expected an integer in {lo}..={hi}"))
                    }),
            }
        }
        if let Some(v) = num(&get, "WEFT_MERGE_RAILS", 0, 1)? {
            c.merge_rails = v == 1;
        }
        if let Some(v) = num(&get, "WEFT_SHARE_CTRL", 0, 1)? {
            c.share_ctrl = v == 1;
        }
        if let Some(v) = num(&get, "WEFT_TIMEOUT_MS", 1, 24 * 3600 * 1000)? {
            c.timeout = Duration::from_millis(v as u64);
        }
        if let Some(v) = num(&get, "WEFT_ACCEPT_TIMEOUT_MS", 1, 24 * 3600 * 1000)? {
            c.accept_timeout = Duration::from_millis(v as u64);
        }
        if let Some(v) = num(&get, "WEFT_NTHREADS", 0, MAX_THREADS)? {
            c.nthreads = v;
        }
        if let Some(v) = num(&get, "WEFT_NSOCKS_PERTHREAD", 1, MAX_STREAMS)? {
            c.nsocks_per_thread = v;
        }
        if let Some(v) = num(&get, "WEFT_INLINE_BYTES", 0, 1 << 20)? {
            c.inline_max = v;
        }
        if let Some(v) = num(&get, "WEFT_MIN_CHUNK_BYTES", 4096, 1 << 30)? {
            c.min_chunk = v;
        }
        if let Some(v) = num(&get, "WEFT_TCP_USER_TIMEOUT_MS", 0, 24 * 3600 * 1000)? {
            c.tcp_user_timeout = Duration::from_millis(v as u64);
        }
        if let Some(v) = num(&get, "WEFT_SOCK_BUF_BYTES", 0, 1 << 30)? {
            c.sock_buf = v;
        }
        if let Some(v) = nonempty("WEFT_BACKEND") {
            c.backend = v.parse()?;
        }
        c.ofi_provider = nonempty("WEFT_OFI_PROVIDER").map(|v| v.trim().to_string());
        c.ofi_domain = nonempty("WEFT_OFI_DOMAIN").map(|v| v.trim().to_string());
        match num(&get, "WEFT_OFI_CQ_DATA_BYTES", 4, 8)? {
            None => {}
            Some(v @ (4 | 8)) => c.ofi_cq_data_bytes = Some(v),
            Some(v) => {
                return Err(Error::Config(format!(
                    "WEFT_OFI_CQ_DATA_BYTES={v}: expected 4 or 8"
                )));
            }
        }
        if let Some(v) = num(&get, "WEFT_OFI_STRIPE_BYTES", 4096, 1 << 40)? {
            c.ofi_stripe_bytes = v;
        }
        if let Some(v) = num(&get, "WEFT_OFI_MIN_BYTES", 0, 16 << 20)? {
            c.ofi_min_bytes = v;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the limits that span several fields.
    pub fn validate(&self) -> Result<()> {
        if self.nthreads > MAX_THREADS {
            return Err(Error::Config(format!(
                "nthreads {} > {MAX_THREADS}",
                self.nthreads
            )));
        }
        if self.nsocks_per_thread == 0 || self.streams() > MAX_STREAMS {
            return Err(Error::Config(format!(
                "nthreads {} x nsocks_per_thread {} must give 1..={MAX_STREAMS} streams",
                self.nthreads, self.nsocks_per_thread
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::Config("timeout must be positive".into()));
        }
        Ok(())
    }

    /// Data streams per connection.
    pub fn streams(&self) -> usize {
        self.nthreads.max(1) * self.nsocks_per_thread
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn sel(spec: &str, name: &str, addrs: &[&str]) -> bool {
        let addrs: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        spec.parse::<IfSpec>().unwrap().matches(name, &addrs)
    }

    #[test]
    fn nccl_ifname_syntax() {
        let table: &[(&str, &str, bool)] = &[
            ("eth", "eth0", true),
            ("eth", "eth10", true),
            ("eth,ib", "ib0", true),
            ("eth", "enp1s0", false),
            ("^docker,lo", "docker0", false),
            ("^docker,lo", "lo", false),
            ("^docker,lo", "eth0", true),
            ("=eth0", "eth0", true),
            ("=eth0", "eth01", false),
            ("^=eth0", "eth01", true),
            ("^=eth0", "eth0", false),
            ("mlx5_0:1", "mlx5_0", true),
        ];
        for (spec, name, want) in table {
            assert_eq!(sel(spec, name, &[]), *want, "{spec} vs {name}");
        }
    }

    #[test]
    fn subnets() {
        assert!(sel("10.1.0.0/16", "x", &["10.1.2.3"]));
        assert!(!sel("10.1.0.0/16", "x", &["10.2.2.3"]));
        assert!(sel("^10.1.0.0/16", "x", &["192.168.0.1"]));
        assert!(sel("fd00::/64", "x", &["fd00::2"]));
        assert!(!sel("fd00::/64", "x", &["10.1.2.3"]));
        assert!(sel("0.0.0.0/0", "x", &["1.2.3.4"]));
        assert!("10.0.0.0/33".parse::<IfSpec>().is_err());
        assert!("nonsense/8".parse::<IfSpec>().is_err());
        assert!("^".parse::<IfSpec>().is_err());
    }

    #[test]
    fn env_overlay_and_errors_name_the_variable() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = Config::from_lookup(env(&[
            ("WEFT_TIMEOUT_MS", "1500"),
            ("WEFT_NTHREADS", "0"),
            ("WEFT_NSOCKS_PERTHREAD", "4"),
            ("NCCL_SOCKET_IFNAME", "=lo"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(c.streams(), 4);
        assert!(c.mgmt_ifname.unwrap().matches("lo", &[]));
        let e = Config::from_lookup(env(&[("WEFT_NTHREADS", "many")])).unwrap_err();
        assert!(e.to_string().contains("WEFT_NTHREADS"), "{e}");
        let e = Config::from_lookup(env(&[
            ("WEFT_NTHREADS", "16"),
            ("WEFT_NSOCKS_PERTHREAD", "8"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("64"), "{e}");
    }

    #[test]
    fn ofi_knobs() {
        let c = Config::from_lookup(|k| match k {
            "WEFT_OFI_CQ_DATA_BYTES" => Some("4".into()),
            "WEFT_OFI_STRIPE_BYTES" => Some("65536".into()),
            "WEFT_OFI_MIN_BYTES" => Some("4096".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.ofi_cq_data_bytes, Some(4));
        assert_eq!(c.ofi_stripe_bytes, 65536);
        assert_eq!(c.ofi_min_bytes, 4096);
        assert_eq!(
            Config::from_lookup(|_| None).unwrap().ofi_cq_data_bytes,
            None
        );
        for bad in ["5", "2", "x"] {
            let e =
                Config::from_lookup(|k| (k == "WEFT_OFI_CQ_DATA_BYTES").then(|| bad.to_string()))
                    .unwrap_err();
            assert!(e.to_string().contains("WEFT_OFI_CQ_DATA_BYTES"), "{e}");
        }
    }
}
