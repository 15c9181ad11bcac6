//! weft's configuration: a TOML file, then environment variables, then flags.
//!
//! The file is found at `--config`, else `$WEFT_CONFIG`, else `./weft.toml`; a missing
//! default file means the built-in defaults. Unknown keys are an error that names them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use weft_fabric::{Guid, SmOptions};
use weft_opensm::{
    Applier, DiagTools, LocalSm, RemotePaths, SmHost, SshConfig, SshSm, VerifyScope,
};

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The InfiniBand fabric: subnet managers, bounds of an apply, the diagnostic tools.
    #[serde(default)]
    pub fabric: FabricConfig,
    /// Where the controller is and how clients (the CLI, `weft agent`) trust it; and how
    /// `weft controller` itself runs.
    #[serde(default)]
    pub controller: ControllerClientConfig,
    /// How `weft agent` runs.
    #[serde(default)]
    pub agent: AgentFileConfig,
    /// Defaults for `weft bench` and `weft doctor`: the hosts and how to reach them, and
    /// each benchmark's sizes, timeouts and endpoint.
    #[serde(default)]
    // Those commands read it alone ([`BenchFileConfig::load`]); here it is checked by
    // `weft config check` and documented by the reference.
    #[allow(dead_code)]
    pub bench: BenchFileConfig,
}

/// `[controller]`: defaults for `--controller`, `--ca-file`, `--pin` and
/// `--insecure-http` (flags and `WEFT_*` variables win), and for the flags of
/// `weft controller` (`listen`, `db`, ...: the same names as the flags).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ControllerClientConfig {
    /// The controller's API, e.g. `https://ctl:7100` (or `urls`, not both).
    #[schemars(example = &"https://ctl:7100")]
    pub url: Option<String>,
    /// Every controller of one store (a leader and its followers on PostgreSQL), for the CLI
    /// and `weft agent`: a call that cannot reach one goes on to the next, and follows a
    /// follower's `421` to the leader when it is one of these (`WEFT_CONTROLLER_URLS`,
    /// comma-separated, and `--controller` win).
    #[schemars(example = &["https://ctl-a:7100", "https://ctl-b:7100"])]
    pub urls: Option<Vec<String>>,
    /// PEM CA certificates to verify the controller against.
    #[schemars(example = &"/etc/weft/ca.pem")]
    pub ca_file: Option<PathBuf>,
    /// The controller certificate's `sha256:` fingerprint.
    #[schemars(example = &"sha256:...")]
    pub pin: Option<String>,
    /// Allow `http://` off loopback (tokens in clear): for clients and for the controller.
    #[serde(default)]
    pub insecure_http: bool,
    /// `weft controller`: API listen address (default 127.0.0.1:7100).
    #[schemars(example = &"127.0.0.1:7100")]
    pub listen: Option<String>,
    /// `weft controller`: metrics listen address (default 127.0.0.1:7101).
    #[schemars(example = &"127.0.0.1:7101")]
    pub metrics_listen: Option<String>,
    /// `weft controller`: the SQLite database (default /var/lib/weft/controller.db).
    #[schemars(example = &"/var/lib/weft/controller.db")]
    pub db: Option<PathBuf>,
    /// `weft controller`: a PostgreSQL store instead of the SQLite `db`
    /// (`postgres://USER@HOST/DATABASE`; `WEFT_STORE_URL` and `--store` take precedence,
    /// `--db` selects SQLite). Back it up with pg_dump, not `weft controller backup`.
    #[schemars(example = &"postgres://weft@db.example/weft")]
    pub store_url: Option<String>,
    /// `weft controller`: the URL other controllers on the same PostgreSQL store hand out
    /// for this one while it leads (in their 421 `not_leader` answers); default: the
    /// API's listen address, unless it is unspecified (0.0.0.0).
    #[schemars(example = &"https://ctl1.example:7100")]
    pub advertise_url: Option<String>,
    /// `weft controller`: a file holding an admin API token to accept.
    #[schemars(example = &"/etc/weft/admin-token")]
    pub admin_token_file: Option<PathBuf>,
    /// `weft controller`: seconds of silence after which an agent is shown stale (30).
    #[schemars(example = 30)]
    pub stale_after_s: Option<u64>,
    /// `weft controller`: the PEM certificate chain the listeners present.
    #[schemars(example = &"/etc/weft/controller.crt")]
    pub tls_cert: Option<PathBuf>,
    /// `weft controller`: the PEM private key of `tls_cert`.
    #[schemars(example = &"/etc/weft/controller.key")]
    pub tls_key: Option<PathBuf>,
    /// `weft controller`: make a self-signed certificate on first start.
    #[serde(default)]
    pub tls_self_signed: bool,
    /// `weft controller`: extra names for the self-signed certificate.
    #[serde(default)]
    pub tls_names: Vec<String>,
    /// `weft controller`: take over partitions the SMs hold that it did not write.
    #[serde(default)]
    pub adopt: bool,
    /// `weft controller`: seconds between drift checks of the SMs' files (30).
    #[schemars(example = 30)]
    pub recheck_s: Option<u64>,
    /// `weft controller`: seconds between drift checks of every port's table (300).
    #[schemars(example = 300)]
    pub port_check_s: Option<u64>,
    /// `weft controller`: deliver the applied state again when drift is found.
    #[serde(default)]
    pub repair_drift: bool,
    /// `weft controller`: the provider's pool group, whose members tenants lease (pool).
    #[schemars(example = &"pool")]
    pub lease_pool: Option<String>,
    /// `weft controller`: seconds before a lease ends that its nodes' agents are warned (300).
    #[schemars(example = 300)]
    pub lease_warn_s: Option<u64>,
    /// `weft controller`: the speed every RDMA data link should negotiate, Gb/s; a link
    /// below it is flagged (console, `weft_link_below_expected`). Unset: links are compared
    /// with their peers only.
    #[schemars(example = 200.0)]
    pub expected_link_gbps: Option<f64>,
}

/// `[agent]`: defaults for the flags of `weft agent` (the same names as the flags).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentFileConfig {
    /// Where the agent keeps its credentials (default /var/lib/weft-agent/agent.json).
    #[schemars(example = &"/var/lib/weft-agent/agent.json")]
    pub state_file: Option<PathBuf>,
    /// Root of the sysfs tree to discover (default /).
    #[schemars(example = &"/")]
    pub sysfs_root: Option<PathBuf>,
    /// Heartbeat period, seconds (10).
    #[schemars(example = 10.0)]
    pub heartbeat_s: Option<f64>,
    /// Rediscovery period, seconds (30).
    #[schemars(example = 30.0)]
    pub rescan_s: Option<f64>,
    /// Serve Prometheus metrics on this address (`/metrics`).
    #[schemars(example = &"127.0.0.1:7102")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// While a lease on this server ends, the file kept written (/run/weft/lease-ending).
    #[schemars(example = &"/run/weft/lease-ending")]
    pub lease_notice_file: Option<PathBuf>,
    /// A command (`sh -c`) run once when a lease on this server starts ending.
    #[schemars(example = &"systemctl stop my-job")]
    pub lease_hook: Option<String>,
}

/// `[bench]`: defaults for the flags of `weft bench p2p`, `weft bench collectives` and
/// `weft doctor` (the same names as the flags; `WEFT_*` variables and flags win). Only
/// these commands read this section, and only this section.
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchFileConfig {
    /// The hosts (`--hosts`), one per entry; `netns:` before the first for namespaces.
    #[serde(default)]
    #[schemars(example = &["node1", "node2"])]
    pub hosts: Vec<String>,
    /// How to reach the hosts: ssh, netns, local (`--via`).
    #[schemars(example = &"ssh")]
    pub via: Option<String>,
    /// The weft binary on the hosts, for ssh (`--remote-weft`).
    #[schemars(example = &"weft")]
    pub remote_weft: Option<String>,
    /// Data interfaces, NCCL syntax (`--data-if`; `WEFT_DATA_IFNAME` wins).
    #[schemars(example = &"=data0")]
    pub data_if: Option<String>,
    /// Management interface, NCCL syntax (`--mgmt-if`; `WEFT_MGMT_IFNAME` wins).
    #[schemars(example = &"eth0")]
    pub mgmt_if: Option<String>,
    /// An ssh_config file for every `ssh` to the hosts (`--ssh-config`).
    #[schemars(example = &"/etc/weft/ssh_config")]
    pub ssh_config: Option<PathBuf>,
    /// Extra `-o KEY=VALUE` options for every `ssh` to the hosts (`--ssh-option`).
    #[serde(default)]
    #[schemars(example = &["ConnectTimeout=5"])]
    pub ssh_options: Vec<String>,
    /// `weft bench p2p` and `weft doctor`: bound in seconds on each helper run on a host
    /// (`--timeout`, 30).
    #[schemars(example = 30)]
    pub timeout_s: Option<u64>,
    /// `weft bench p2p`.
    #[serde(default)]
    pub p2p: BenchP2pConfig,
    /// `weft bench collectives`.
    #[serde(default)]
    pub collectives: BenchCollConfig,
    /// `weft bench llm` (not `compare`).
    #[serde(default)]
    pub llm: BenchLlmConfig,
}

/// `[bench.p2p]`: defaults for `weft bench p2p`.
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchP2pConfig {
    /// TCP streams per pair (`--streams`, 4).
    #[schemars(example = 4)]
    pub streams: Option<usize>,
    /// Seconds of bulk transfer per pair (`--duration`, 2).
    #[schemars(example = 2.0)]
    pub duration_s: Option<f64>,
    /// Ping-pong round trips per pair (`--pings`, 50).
    #[schemars(example = 50)]
    pub pings: Option<usize>,
    /// A pair below this fraction of its reference is slow (`--threshold`, 0.5).
    #[schemars(example = 0.5)]
    pub threshold: Option<f64>,
    /// Expected link speed of every data interface, Mb/s (`--expect-speed`).
    #[schemars(example = 200000)]
    pub expect_speed: Option<u32>,
}

/// `[bench.collectives]`: defaults for `weft bench collectives`.
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchCollConfig {
    /// The NCCL net plugin (`--plugin`; `WEFT_PLUGIN` wins).
    #[schemars(example = &"/usr/lib/x86_64-linux-gnu/libnccl-net-weft.so")]
    pub plugin: Option<PathBuf>,
    /// Smallest size, bytes with K, M, G suffixes (`--minbytes`, 32M).
    #[schemars(example = &"32M")]
    pub min_bytes: Option<String>,
    /// Largest size (`--maxbytes`, 32M).
    #[schemars(example = &"32M")]
    pub max_bytes: Option<String>,
    /// Timed iterations per size (`--iters`, 20).
    #[schemars(example = 20)]
    pub iters: Option<usize>,
    /// Local rank processes without hosts (`--nranks`, 2).
    #[schemars(example = 2)]
    pub nranks: Option<usize>,
    /// Fail when the average bus bandwidth is below this, GB/s (`--min-bw`;
    /// `NCCL_TESTS_MIN_BW` wins).
    #[schemars(example = 10.0)]
    pub min_bw: Option<f64>,
    /// Bound in seconds on the rendezvous, each transfer and (x4) the run (`--timeout`, 120).
    #[schemars(example = 120)]
    pub timeout_s: Option<u64>,
    /// Bytes each way of the link check before the collectives; 0 skips it
    /// (`--link-bytes`, 4M).
    #[schemars(example = &"4M")]
    pub link_bytes: Option<String>,
}

/// `[bench.llm]`: defaults for `weft bench llm`.
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchLlmConfig {
    /// Base URL of the OpenAI-compatible API, ending in /v1 (`--base-url`; `WEFT_LLM_URL`
    /// wins).
    #[schemars(example = &"http://127.0.0.1:8000/v1")]
    pub base_url: Option<String>,
    /// Model name as the server lists it in /v1/models (`--model`).
    #[schemars(example = &"Qwen/Qwen3-8B")]
    pub model: Option<String>,
    /// chat or completions (`--api`, chat).
    #[schemars(example = &"chat")]
    pub api: Option<String>,
    /// A Hugging Face tokenizer.json, or its folder (`--tokenizer`).
    #[schemars(example = &"/models/qwen3/tokenizer.json")]
    pub tokenizer: Option<PathBuf>,
    /// Prompt sizes in tokens (`--pp`, 2048).
    #[serde(default)]
    #[schemars(example = &[2048])]
    pub pp: Vec<u64>,
    /// Tokens to generate (`--tg`, 32).
    #[serde(default)]
    #[schemars(example = &[32])]
    pub tg: Vec<u64>,
    /// Context depths in tokens (`--depth`, 0).
    #[serde(default)]
    #[schemars(example = &[0, 4096])]
    pub depth: Vec<u64>,
    /// Requests sent together (`--concurrency`, 1).
    #[serde(default)]
    #[schemars(example = &[1])]
    pub concurrency: Vec<u32>,
    /// Runs of each test (`--runs`, 3).
    #[schemars(example = 3)]
    pub runs: Option<u32>,
    /// Seconds to connect (`--connect-timeout`, 10).
    #[schemars(example = 10)]
    pub connect_timeout_s: Option<u64>,
    /// Seconds to the first byte of an answer (`--first-byte-timeout`, 600).
    #[schemars(example = 600)]
    pub first_byte_timeout_s: Option<u64>,
    /// Seconds between two chunks of a stream (`--chunk-timeout`, 60).
    #[schemars(example = 60)]
    pub chunk_timeout_s: Option<u64>,
    /// Retries of a request answered 429 or 5xx, or refused (`--retries`, 3).
    #[schemars(example = 3)]
    pub retries: Option<u32>,
}

impl BenchFileConfig {
    /// Every default this section gives, as (subcommand path, the flag's argument id,
    /// values): what [`BenchFileConfig::apply`] puts into the command line's defaults.
    pub fn defaults(&self) -> Vec<(&'static [&'static str], &'static str, Vec<String>)> {
        fn one<T: ToString>(v: &Option<T>) -> Option<Vec<String>> {
            v.as_ref().map(|v| vec![v.to_string()])
        }
        fn path(v: &Option<PathBuf>) -> Option<Vec<String>> {
            v.as_ref().map(|p| vec![p.display().to_string()])
        }
        fn many<T: ToString>(v: &[T]) -> Option<Vec<String>> {
            (!v.is_empty()).then(|| v.iter().map(ToString::to_string).collect())
        }
        const P2P: &[&str] = &["bench", "p2p"];
        const COLL: &[&str] = &["bench", "collectives"];
        const DOCTOR: &[&str] = &["doctor"];
        const LLM: &[&str] = &["bench", "llm"];
        let mut out = Vec::new();
        let hosts = (!self.hosts.is_empty()).then(|| vec![self.hosts.join(",")]);
        for (id, v) in [
            ("hosts", hosts),
            ("via", one(&self.via)),
            ("remote_weft", one(&self.remote_weft)),
            ("data_if", one(&self.data_if)),
            ("mgmt_if", one(&self.mgmt_if)),
            ("ssh_config", path(&self.ssh_config)),
            ("ssh_options", many(&self.ssh_options)),
        ] {
            if let Some(v) = v {
                for cmd in [P2P, COLL, DOCTOR] {
                    out.push((cmd, id, v.clone()));
                }
            }
        }
        if let Some(v) = one(&self.timeout_s) {
            out.push((P2P, "timeout", v.clone()));
            out.push((DOCTOR, "timeout", v));
        }
        let p = &self.p2p;
        let c = &self.collectives;
        let l = &self.llm;
        for (cmd, id, v) in [
            (P2P, "streams", one(&p.streams)),
            (P2P, "duration", one(&p.duration_s)),
            (P2P, "pings", one(&p.pings)),
            (P2P, "threshold", one(&p.threshold)),
            (P2P, "expect_speed", one(&p.expect_speed)),
            (COLL, "plugin", path(&c.plugin)),
            (COLL, "min_bytes", one(&c.min_bytes)),
            (COLL, "max_bytes", one(&c.max_bytes)),
            (COLL, "iters", one(&c.iters)),
            (COLL, "nranks", one(&c.nranks)),
            (COLL, "min_bw", one(&c.min_bw)),
            (COLL, "timeout", one(&c.timeout_s)),
            (COLL, "link_bytes", one(&c.link_bytes)),
            (LLM, "base_url", one(&l.base_url)),
            (LLM, "model", one(&l.model)),
            (LLM, "api", one(&l.api)),
            (LLM, "tokenizer", path(&l.tokenizer)),
            (LLM, "pp", many(&l.pp)),
            (LLM, "tg", many(&l.tg)),
            (LLM, "depth", many(&l.depth)),
            (LLM, "concurrency", many(&l.concurrency)),
            (LLM, "runs", one(&l.runs)),
            (LLM, "connect_timeout", one(&l.connect_timeout_s)),
            (LLM, "first_byte_timeout", one(&l.first_byte_timeout_s)),
            (LLM, "chunk_timeout", one(&l.chunk_timeout_s)),
            (LLM, "retries", one(&l.retries)),
        ] {
            if let Some(v) = v {
                out.push((cmd, id, v));
            }
        }
        out
    }

    /// `cmd` (weft's whole command line) with this section's values as the defaults of the
    /// flags they name: a flag or its environment variable still wins, and `--help` shows
    /// the file's value as the default.
    pub fn apply(&self, mut cmd: clap::Command) -> clap::Command {
        for (path, id, values) in self.defaults() {
            cmd = mut_arg_at(cmd, path, id, values);
        }
        cmd
    }

    /// Reads `[bench]` alone from the config file (`--config`, `$WEFT_CONFIG`, else
    /// `./weft.toml` when present): a fault elsewhere in the file does not stop a benchmark,
    /// and one in `[bench]` names the file, the line and the key.
    pub fn load(explicit: Option<&Path>) -> Result<BenchFileConfig> {
        #[derive(Deserialize)]
        struct BenchOnly {
            #[serde(default)]
            bench: BenchFileConfig,
            #[serde(flatten)]
            _rest: toml::Table,
        }
        let (path, required) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from("weft.toml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(BenchFileConfig::default());
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let b: BenchOnly =
            toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
        Ok(b.bench)
    }
}

fn mut_arg_at(
    cmd: clap::Command,
    path: &[&'static str],
    id: &'static str,
    values: Vec<String>,
) -> clap::Command {
    match path.split_first() {
        Some((first, rest)) => {
            let rest = rest.to_vec();
            cmd.mut_subcommand(*first, move |sub| mut_arg_at(sub, &rest, id, values))
        }
        None => cmd.mut_arg(id, move |a| a.default_values(values)),
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// How long the master may take to finish the sweep that follows a reread.
    #[serde(default = "default_sweep_ms")]
    pub sweep_timeout_ms: u64,
    /// How long ports may take to show the planned tables after that sweep.
    #[serde(default = "default_verify_ms")]
    pub verify_timeout_ms: u64,
    /// Mirrors OpenSM's `allow_both_pkeys`; it changes what `=both` programs.
    #[serde(default)]
    pub allow_both_pkeys: bool,
    /// Which ports an apply reads back: "changed" (touched ports, SM ports and
    /// canaries) or "all".
    #[serde(default)]
    #[schemars(with = "String")]
    pub verify_scope: VerifyScope,
    /// How the InfiniBand diagnostic tools run (smpquery, ibnetdiscover, sminfo).
    #[serde(default)]
    pub diag: DiagConfig,
    /// The subnet managers that share the partitions config: one master, any standbys.
    #[serde(default)]
    pub sm: Vec<SmConfig>,
}

fn default_sweep_ms() -> u64 {
    5000
}
fn default_verify_ms() -> u64 {
    5000
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            sweep_timeout_ms: default_sweep_ms(),
            verify_timeout_ms: default_verify_ms(),
            allow_both_pkeys: false,
            verify_scope: VerifyScope::default(),
            diag: DiagConfig::default(),
            sm: Vec::new(),
        }
    }
}

/// How to run the InfiniBand diagnostic tools (on a simulated fabric, with the preload).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiagConfig {
    /// Environment of every diagnostic tool (`smpquery`, `ibnetdiscover`, ...), e.g. the
    /// ibsim preload on a simulated fabric. weft's own SMP client reads it too: with
    /// `IBSIM_SOCKNAME` and `SIM_HOST` it attaches to that ibsim, else to the first active
    /// `/dev/infiniband/umadN`; `WEFT_SMP` names another device, or `off` (one `smpquery`
    /// per port instead).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of the tools.
    #[schemars(example = &"/tmp")]
    pub cwd: Option<PathBuf>,
    /// Bound on each tool's run, ms.
    #[serde(default = "default_diag_ms")]
    pub timeout_ms: u64,
    /// Tools run at once when ports are read.
    #[serde(default = "default_parallel")]
    pub parallel: usize,
}

fn default_diag_ms() -> u64 {
    10_000
}
fn default_parallel() -> usize {
    4
}

impl Default for DiagConfig {
    fn default() -> Self {
        DiagConfig {
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: default_diag_ms(),
            parallel: default_parallel(),
        }
    }
}

/// One OpenSM: on this machine (`kind = "local"`, the default) or on a host reached with
/// the OpenSSH client (`kind = "ssh"`). The three paths are on the SM's host.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SmConfig {
    /// A name for this SM in messages and `weft fabric status`.
    #[schemars(example = &"primary")]
    pub name: String,
    /// The port OpenSM is bound to (its `-g`); `sminfo` names the master by it.
    #[schemars(example = &"0x0002c90300000a01")]
    pub port_guid: String,
    /// How the SM is reached.
    #[serde(default)]
    pub kind: SmKind,
    /// OpenSM's partitions file on the SM's host.
    #[serde(default = "default_partitions_file")]
    pub partitions_file: PathBuf,
    /// OpenSM's pid file on the SM's host (weft sends it SIGHUP to reread).
    #[schemars(example = &"/run/opensm.pid")]
    pub pid_file: PathBuf,
    /// OpenSM's log on the SM's host (set `force_log_flush TRUE` in opensm.conf).
    #[serde(default = "default_log_file")]
    pub log_file: PathBuf,
    /// ssh: the host name or address, as the known_hosts file names it.
    #[schemars(example = &"sm2.example")]
    pub host: Option<String>,
    /// ssh: the TCP port (default 22).
    #[schemars(example = 22)]
    pub port: Option<u16>,
    /// ssh: the remote account.
    #[schemars(example = &"weft")]
    pub user: Option<String>,
    /// ssh: the private key (public-key authentication only).
    #[schemars(example = &"/etc/weft/id_ed25519")]
    pub identity_file: Option<PathBuf>,
    /// ssh: the only file the host's key is checked against (strict checking, always;
    /// for a port other than 22 OpenSSH looks the host up as `[host]:port`).
    #[schemars(example = &"/etc/weft/known_hosts")]
    pub known_hosts: Option<PathBuf>,
    /// ssh: reuse one authenticated connection for every command (default true).
    #[schemars(example = true)]
    pub multiplex: Option<bool>,
    /// ssh: bound on the TCP connect and the SSH handshake, ms (default 5000).
    #[schemars(example = 5000)]
    pub connect_timeout_ms: Option<u64>,
    /// ssh: bound on each remote command, connection included, ms (default 15000).
    #[schemars(example = 15000)]
    pub command_timeout_ms: Option<u64>,
}

/// How an SM is reached.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmKind {
    /// Files and signals on this machine.
    #[default]
    Local,
    /// The OpenSSH client, key authentication, strict host-key checking.
    Ssh,
}

/// An [`SmConfig`] made into the driver's type (kept apart from the boxed trait object
/// so that the settings can be inspected).
#[derive(Debug)]
pub enum SmTarget {
    Local(LocalSm),
    Ssh(Box<SshSm>),
}

impl SmTarget {
    fn boxed(self) -> Box<dyn SmHost> {
        match self {
            SmTarget::Local(s) => Box::new(s),
            SmTarget::Ssh(s) => s,
        }
    }
}

impl SmConfig {
    /// Checks the entry and makes the SM host it describes. Errors name the SM and the key.
    pub fn target(&self) -> Result<SmTarget> {
        let name = &self.name;
        let port_guid: Guid = self.port_guid.parse().map_err(|e| {
            anyhow::anyhow!("config: SM `{name}`: port_guid `{}`: {e}", self.port_guid)
        })?;
        let ssh_keys = [
            ("host", self.host.is_some()),
            ("port", self.port.is_some()),
            ("user", self.user.is_some()),
            ("identity_file", self.identity_file.is_some()),
            ("known_hosts", self.known_hosts.is_some()),
            ("multiplex", self.multiplex.is_some()),
            ("connect_timeout_ms", self.connect_timeout_ms.is_some()),
            ("command_timeout_ms", self.command_timeout_ms.is_some()),
        ];
        match self.kind {
            SmKind::Local => {
                if let Some((key, _)) = ssh_keys.iter().find(|(_, set)| *set) {
                    anyhow::bail!(
                        "config: SM `{name}`: `{key}` is a setting of kind = \"ssh\"; add kind = \"ssh\" to reach this SM over SSH, or remove `{key}`"
                    );
                }
                Ok(SmTarget::Local(LocalSm {
                    name: name.clone(),
                    port_guid,
                    partitions_file: self.partitions_file.clone(),
                    pid_file: self.pid_file.clone(),
                    log_file: self.log_file.clone(),
                }))
            }
            SmKind::Ssh => {
                let missing = |key: &str, why: &str| {
                    anyhow::anyhow!("config: SM `{name}` (kind = \"ssh\"): missing `{key}`{why}")
                };
                let host = self.host.clone().ok_or_else(|| missing("host", ""))?;
                let user = self.user.clone().ok_or_else(|| missing("user", ""))?;
                let identity = self
                    .identity_file
                    .clone()
                    .ok_or_else(|| missing("identity_file", " (the private key to log in with)"))?;
                let known_hosts = self.known_hosts.clone().ok_or_else(|| {
                    missing(
                        "known_hosts",
                        " (host keys are always checked: name the file that holds this host's key)",
                    )
                })?;
                let mut ssh = SshConfig::new(host, user, identity, known_hosts);
                ssh.port = self.port.unwrap_or(22);
                ssh.multiplex = self.multiplex.unwrap_or(true);
                if let Some(ms) = self.connect_timeout_ms {
                    ssh.connect_timeout = Duration::from_millis(ms);
                }
                if let Some(ms) = self.command_timeout_ms {
                    ssh.command_timeout = Duration::from_millis(ms);
                }
                let paths = RemotePaths {
                    partitions_file: self.partitions_file.clone(),
                    pid_file: self.pid_file.clone(),
                    log_file: self.log_file.clone(),
                };
                let sm = SshSm::new(name.clone(), port_guid, ssh, paths)
                    .map_err(|e| anyhow::anyhow!("config: {e}"))?;
                Ok(SmTarget::Ssh(Box::new(sm)))
            }
        }
    }
}

fn default_partitions_file() -> PathBuf {
    "/etc/opensm/partitions.conf".into()
}
fn default_log_file() -> PathBuf {
    "/var/log/opensm.log".into()
}

/// The commented reference weft.toml: every section and key of [`Config`], with its doc
/// and its default (or an example), generated from the types so that it cannot drift from
/// them (`weft config reference`; `docs/weft.toml` is checked against it by a test).
pub fn reference() -> String {
    let schema = schemars::schema_for!(Config);
    let root = schema.as_value();
    let mut out = String::from(
        "# weft.toml: every setting, commented out, with its default or an example.\n\
         # Generated by `weft config reference` from weft's config types; do not edit by hand.\n\
         # Precedence: this file, then WEFT_* environment variables, then flags.\n",
    );
    reference_table(root, root, "", &mut out);
    out
}

/// `schema` with a `$ref` into `root`'s `$defs` followed, and `null` dropped from a type
/// that allows it (an `Option`).
fn resolve<'a>(
    root: &'a serde_json::Value,
    schema: &'a serde_json::Value,
) -> &'a serde_json::Value {
    let schema = schema
        .get("anyOf")
        .and_then(|a| a.as_array())
        .and_then(|a| {
            a.iter()
                .find(|s| s.get("type").and_then(|t| t.as_str()) != Some("null"))
        })
        .unwrap_or(schema);
    match schema.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|name| root.get("$defs").and_then(|d| d.get(name)))
            .unwrap_or(schema),
        None => schema,
    }
}

fn doc_lines(schema: &serde_json::Value, out: &mut String) {
    if let Some(d) = schema.get("description").and_then(|d| d.as_str()) {
        for l in d.lines() {
            out.push_str(
                &format!("# {}\n", l.trim_end())
                    .replace("#  ", "# ")
                    .replace("# \n", "#\n"),
            );
        }
    }
}

/// A TOML value for the key: its default, else an example of its type.
fn example(root: &serde_json::Value, schema: &serde_json::Value) -> String {
    let s = resolve(root, schema);
    // An empty list says less than its example (`hosts = ["node1", "node2"]`).
    let empty_list = |d: &&serde_json::Value| {
        !(d.as_array().is_some_and(|a| a.is_empty()) && schema.get("examples").is_some())
    };
    let value = schema
        .get("default")
        .or_else(|| s.get("default"))
        .filter(empty_list)
        .cloned()
        .or_else(|| schema.get("examples").and_then(|e| e.get(0)).cloned())
        .or_else(|| s.get("enum").and_then(|e| e.get(0)).cloned())
        .or_else(|| {
            s.get("oneOf")
                .and_then(|o| o.get(0))
                .and_then(|v| v.get("const"))
                .cloned()
        });
    let value = value.unwrap_or_else(|| {
        let ty = s
            .get("type")
            .and_then(|t| t.as_array().and_then(|a| a.first()).or(Some(t)))
            .and_then(|t| t.as_str())
            .unwrap_or("string");
        match ty {
            "boolean" => serde_json::Value::Bool(false),
            "integer" | "number" => serde_json::json!(0),
            "array" => serde_json::json!([]),
            _ => serde_json::Value::String(String::new()),
        }
    });
    toml::Value::try_from(value).map_or_else(|_| "\"\"".into(), |v| v.to_string())
}

fn reference_table(
    root: &serde_json::Value,
    table: &serde_json::Value,
    path: &str,
    out: &mut String,
) {
    let Some(props) = table.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    // Sorted by key: serde_json keeps schemars' declaration order when another crate in
    // the build turns on its `preserve_order` feature (thirtyfour does, in test builds),
    // and the reference must not depend on which crates were built with it.
    let mut props: Vec<_> = props.iter().collect();
    props.sort_by_key(|(k, _)| k.as_str());
    let mut nested = Vec::new();
    let mut maps = Vec::new();
    for (key, prop) in props {
        let s = resolve(root, prop);
        let items = s.get("items").map(|i| resolve(root, i));
        if s.get("properties").is_some() {
            nested.push((key, prop, s, false));
        } else if items.is_some_and(|i| i.get("properties").is_some()) {
            nested.push((key, prop, items.unwrap_or(s), true));
        } else if s.get("additionalProperties").is_some_and(|a| a.is_object()) {
            maps.push((key, prop));
        } else {
            doc_lines(prop, out);
            out.push_str(&format!("# {key} = {}\n", example(root, prop)));
        }
    }
    // Maps and sub-tables after every plain key: in TOML a key after a table header
    // belongs to that table.
    for (key, prop) in maps {
        out.push('\n');
        doc_lines(prop, out);
        out.push_str(&format!("# [{}]\n# NAME = \"value\"\n", join(key)));
    }
    for (key, prop, s, array) in nested {
        out.push('\n');
        doc_lines(prop, out);
        if array {
            out.push_str(&format!("# [[{}]]\n", join(key)));
        } else {
            out.push_str(&format!("# [{}]\n", join(key)));
        }
        reference_table(root, s, &join(key), out);
    }
}

impl Config {
    /// Loads the file named by `explicit`, else `$WEFT_CONFIG` (the caller passes it via
    /// clap), else `./weft.toml` when it exists.
    pub fn load(explicit: Option<&Path>) -> Result<Config> {
        let (path, required) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from("weft.toml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Config::default());
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }
}

impl FabricConfig {
    pub fn diag_tools(&self) -> DiagTools {
        DiagTools {
            env: self
                .diag
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: self.diag.cwd.clone(),
            timeout: Duration::from_millis(self.diag.timeout_ms),
            parallel: self.diag.parallel.max(1),
        }
    }

    /// The applier of this config: its SM hosts, diagnostic tools, options and bounds.
    pub fn applier(&self) -> Result<Applier> {
        Ok(Applier {
            sms: self.sm_hosts()?,
            diag: self.diag_tools(),
            sm_options: SmOptions {
                allow_both_pkeys: self.allow_both_pkeys,
            },
            verify_scope: self.verify_scope,
            sweep_timeout: Duration::from_millis(self.sweep_timeout_ms),
            verify_timeout: Duration::from_millis(self.verify_timeout_ms),
        })
    }

    /// Every `[[fabric.sm]]` entry as the driver's type, in the file's order.
    pub fn sm_targets(&self) -> Result<Vec<SmTarget>> {
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.sm {
            if !seen.insert(s.name.as_str()) {
                anyhow::bail!("config: two [[fabric.sm]] entries are named `{}`", s.name);
            }
        }
        self.sm.iter().map(SmConfig::target).collect()
    }

    /// The SM hosts the applier writes to: the one place `[[fabric.sm]]` becomes
    /// [`SmHost`]s (`weft fabric` and `weft controller` both use it).
    pub fn sm_hosts(&self) -> Result<Vec<Box<dyn SmHost>>> {
        Ok(self
            .sm_targets()?
            .into_iter()
            .map(SmTarget::boxed)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/weft.toml` is what `weft config reference` prints (regenerate it with
    /// `cargo run -p weft -- config reference > docs/weft.toml`), and with every line
    /// uncommented it is a valid config: every key it shows exists, every key exists in it.
    #[test]
    fn the_reference_weft_toml_is_generated_and_valid() {
        let checked_in = include_str!("../../../docs/weft.toml");
        assert!(
            checked_in == reference(),
            "docs/weft.toml is stale: run `cargo run -p weft -- config reference > docs/weft.toml`"
        );
        let uncommented: String = checked_in
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.starts_with('[') || l.contains(" = "))
            .map(|l| format!("{l}\n"))
            .collect();
        let cfg: Config = toml::from_str(&uncommented)
            .unwrap_or_else(|e| panic!("the reference does not parse: {e}\n{uncommented}"));
        assert_eq!(cfg.fabric.sm.len(), 1);
        assert_eq!(cfg.agent.heartbeat_s, Some(10.0));
        assert_eq!(cfg.controller.listen.as_deref(), Some("127.0.0.1:7100"));
        // Every field of every section is in the reference.
        for key in [
            "sweep_timeout_ms",
            "verify_scope",
            "known_hosts",
            "tls_names",
            "rescan_s",
        ] {
            assert!(checked_in.contains(&format!("# {key} = ")), "{key}");
        }
    }

    const BENCH: &str = r#"
[fabric]
sweep_timeout = "a fault [bench] readers never see"

[bench]
hosts = ["netns:ns1", "ns2"]
via = "netns"
remote_weft = "/opt/weft/bin/weft"
data_if = "=data0"
mgmt_if = "mgmt0"
ssh_config = "/etc/weft/ssh_config"
ssh_options = ["ConnectTimeout=5", "BatchMode=yes"]
timeout_s = 7

[bench.p2p]
streams = 2
duration_s = 0.5
pings = 9
threshold = 0.25
expect_speed = 100000

[bench.collectives]
plugin = "/usr/lib/libnccl-net-weft.so"
min_bytes = "1K"
max_bytes = "1M"
iters = 3
nranks = 4
min_bw = 1.5
timeout_s = 60
link_bytes = "0"

[bench.llm]
base_url = "http://127.0.0.1:9/v1"
model = "tiny"
api = "completions"
tokenizer = "/models/tok.json"
pp = [128, 256]
tg = [8]
depth = [0, 1024]
concurrency = [1, 2]
runs = 2
connect_timeout_s = 3
first_byte_timeout_s = 30
chunk_timeout_s = 5
retries = 1
"#;

    fn bench_section() -> BenchFileConfig {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("weft.toml");
        std::fs::write(&file, BENCH).unwrap();
        BenchFileConfig::load(Some(&file)).unwrap()
    }

    fn matches_of(section: &BenchFileConfig, argv: &[&str]) -> clap::ArgMatches {
        let cmd = section.apply(<crate::Cli as clap::CommandFactory>::command());
        cmd.try_get_matches_from(argv).unwrap()
    }

    fn raw(m: &clap::ArgMatches, path: &[&str], id: &str) -> Vec<String> {
        let mut m = m;
        for p in path {
            m = m.subcommand_matches(p).unwrap();
        }
        m.get_raw(id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    /// Every key of `[bench]` becomes the default of the flag it names on each command it
    /// is for (an id that no longer exists in bench.rs or doctor.rs panics here), and
    /// the command then parses into weft's own argument types with those values; a fault
    /// in another section does not stop `[bench]` from being read.
    #[test]
    fn every_bench_key_is_the_default_of_its_flag() {
        let section = bench_section();
        let defaults = section.defaults();
        assert_eq!(defaults.len(), 7 * 3 + 2 + 5 + 8 + 13, "{defaults:#?}");
        for (path, id, values) in &defaults {
            let mut argv = vec!["weft"];
            argv.extend(path.iter());
            let m = matches_of(&section, &argv);
            assert_eq!(&raw(&m, path, id), values, "{path:?} {id}");
        }
        let m = matches_of(&section, &["weft", "bench", "p2p"]);
        assert_eq!(raw(&m, &["bench", "p2p"], "hosts"), ["netns:ns1,ns2"]);
        let m = matches_of(&section, &["weft", "bench", "collectives"]);
        let sub = m.subcommand_matches("bench").unwrap();
        let coll = sub.subcommand_matches("collectives").unwrap();
        assert_eq!(coll.get_one::<usize>("min_bytes"), Some(&1024));
        assert_eq!(coll.get_one::<u64>("timeout"), Some(&60));
        // The whole command line parses into weft's types with the file's defaults.
        for argv in [
            &["weft", "bench", "p2p"][..],
            &["weft", "bench", "collectives"],
            &["weft", "bench", "llm"],
            &["weft", "doctor"],
        ] {
            let m = matches_of(&section, argv);
            <crate::Cli as clap::FromArgMatches>::from_arg_matches(&m)
                .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
    }

    /// A flag on the command line wins over the file.
    #[test]
    fn a_flag_wins_over_bench_in_the_file() {
        let section = bench_section();
        let m = matches_of(
            &section,
            &["weft", "bench", "p2p", "--streams", "8", "--hosts", "a,b"],
        );
        assert_eq!(raw(&m, &["bench", "p2p"], "streams"), ["8"]);
        assert_eq!(raw(&m, &["bench", "p2p"], "hosts"), ["a,b"]);
        assert_eq!(raw(&m, &["bench", "p2p"], "pings"), ["9"]);
        let m = matches_of(&section, &["weft", "bench", "llm", "--pp", "64"]);
        assert_eq!(raw(&m, &["bench", "llm"], "pp"), ["64"]);
        assert_eq!(raw(&m, &["bench", "llm"], "depth"), ["0", "1024"]);
    }

    /// A fault in `[bench]` names the file, the line and the key; no file, no section.
    #[test]
    fn a_bad_bench_key_names_the_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("weft.toml");
        std::fs::write(&file, "[bench]\nvia = \"ssh\"\n\n[bench.p2p]\nstream = 2\n").unwrap();
        let err = format!("{:#}", BenchFileConfig::load(Some(&file)).unwrap_err());
        assert!(
            err.contains(&file.display().to_string())
                && err.contains("stream")
                && err.contains("line 5"),
            "{err}"
        );
        std::fs::write(&file, "[bench.p2p]\nstreams = \"two\"\n").unwrap();
        let err = format!("{:#}", BenchFileConfig::load(Some(&file)).unwrap_err());
        assert!(err.contains("streams") && err.contains("line 2"), "{err}");
        std::fs::write(&file, "[fabric]\n").unwrap();
        assert!(
            BenchFileConfig::load(Some(&file))
                .unwrap()
                .defaults()
                .is_empty()
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = toml::from_str::<Config>("[fabric]\nsweep_timeout = 3\n").unwrap_err();
        assert!(err.to_string().contains("sweep_timeout"), "{err}");
    }

    fn fabric(toml: &str) -> FabricConfig {
        toml::from_str::<Config>(toml).unwrap().fabric
    }

    fn err_of(toml: &str) -> String {
        match toml::from_str::<Config>(toml) {
            Err(e) => e.to_string(),
            Ok(c) => format!("{:#}", c.fabric.sm_targets().unwrap_err()),
        }
    }

    const SSH: &str = "[[fabric.sm]]\nname = \"standby\"\nport_guid = \"0x0002c90300000a02\"\npid_file = \"/run/opensm.pid\"\nkind = \"ssh\"\nhost = \"sm2.example\"\nuser = \"weft\"\nidentity_file = \"/etc/weft/id_ed25519\"\nknown_hosts = \"/etc/weft/known_hosts\"\n";

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let c = fabric(
            "[[fabric.sm]]\nname = \"primary\"\nport_guid = \"0x0002c90300000a01\"\npid_file = \"/run/opensm.pid\"\n",
        );
        assert_eq!(c.sweep_timeout_ms, 5000);
        let sms = c.sm_targets().unwrap();
        let [SmTarget::Local(sm)] = &sms[..] else {
            panic!("{sms:?}")
        };
        assert_eq!(sm.port_guid, Guid(0x0002c90300000a01));
        assert_eq!(
            sm.partitions_file,
            PathBuf::from("/etc/opensm/partitions.conf")
        );
        let hosts = c.sm_hosts().unwrap();
        assert_eq!(hosts[0].name(), "primary");
    }

    #[test]
    fn a_bad_guid_names_the_sm() {
        let err =
            err_of("[[fabric.sm]]\nname = \"primary\"\nport_guid = \"node3\"\npid_file = \"/p\"\n");
        assert!(err.contains("primary") && err.contains("node3"), "{err}");
    }

    #[test]
    fn an_ssh_entry_takes_its_defaults_and_its_remote_paths() {
        let c = fabric(SSH);
        let sms = c.sm_targets().unwrap();
        let [SmTarget::Ssh(sm)] = &sms[..] else {
            panic!("{sms:?}")
        };
        let ssh = sm.ssh();
        assert_eq!(
            (
                ssh.host.as_str(),
                ssh.port,
                ssh.user.as_str(),
                ssh.multiplex
            ),
            ("sm2.example", 22, "weft", true)
        );
        assert_eq!(ssh.identity_file, PathBuf::from("/etc/weft/id_ed25519"));
        assert_eq!(ssh.known_hosts_file, PathBuf::from("/etc/weft/known_hosts"));
        assert_eq!(ssh.connect_timeout, Duration::from_secs(5));
        assert_eq!(sm.port_guid(), Guid(0x0002c90300000a02));
        assert!(sm.multiplexed());
        let p = sm.paths();
        assert_eq!(
            p.partitions_file,
            PathBuf::from("/etc/opensm/partitions.conf")
        );
        assert_eq!(p.pid_file, PathBuf::from("/run/opensm.pid"));
        assert_eq!(p.log_file, PathBuf::from("/var/log/opensm.log"));
    }

    #[test]
    fn an_ssh_entry_takes_what_the_file_gives() {
        let c = fabric(&format!(
            "{SSH}port = 2222\nmultiplex = false\nconnect_timeout_ms = 1500\ncommand_timeout_ms = 4000\npartitions_file = \"/srv/sm/p.conf\"\nlog_file = \"/srv/sm/osm.log\"\n"
        ));
        let sms = c.sm_targets().unwrap();
        let [SmTarget::Ssh(sm)] = &sms[..] else {
            panic!("{sms:?}")
        };
        assert_eq!((sm.ssh().port, sm.ssh().multiplex), (2222, false));
        assert!(!sm.multiplexed());
        assert_eq!(sm.ssh().connect_timeout, Duration::from_millis(1500));
        assert_eq!(sm.ssh().command_timeout, Duration::from_millis(4000));
        assert_eq!(sm.paths().partitions_file, PathBuf::from("/srv/sm/p.conf"));
        assert_eq!(sm.paths().log_file, PathBuf::from("/srv/sm/osm.log"));
    }

    #[test]
    fn an_ssh_entry_without_a_required_key_names_the_sm_and_the_key() {
        for key in ["host", "user", "identity_file", "known_hosts"] {
            let toml: String = SSH
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} =")))
                .map(|l| format!("{l}\n"))
                .collect();
            let err = err_of(&toml);
            assert!(
                err.contains("`standby`") && err.contains(&format!("missing `{key}`")),
                "{key}: {err}"
            );
        }
    }

    #[test]
    fn ssh_keys_on_a_local_entry_and_unknown_keys_are_errors_naming_them() {
        let local = SSH.replace("kind = \"ssh\"\n", "");
        let err = err_of(&local);
        assert!(
            err.contains("`standby`") && err.contains("`host`") && err.contains("kind = \"ssh\""),
            "{err}"
        );
        let err = err_of(&format!("{SSH}known_host = \"/x\"\n"));
        assert!(err.contains("known_host"), "{err}");
        let err = err_of(&SSH.replace("\"ssh\"", "\"telnet\""));
        assert!(err.contains("telnet"), "{err}");
        let err = err_of(&format!("{SSH}port = 0\n"));
        assert!(err.contains("standby") && err.contains("port"), "{err}");
        let err = err_of(&format!(
            "{SSH}{}",
            SSH.replace("0x0002c90300000a02", "0x1")
        ));
        assert!(err.contains("two") && err.contains("`standby`"), "{err}");
    }
}
