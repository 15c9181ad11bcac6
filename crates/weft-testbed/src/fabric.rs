//! A running ibsim plus the OpenSM instances and diag tools attached to it.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::error::io;
use crate::{TestbedError, Topology};

/// Default location of the umad2sim preload library (Debian package `libumad2sim0`).
/// Override with the environment variable `WEFT_UMAD2SIM`.
pub const DEFAULT_UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

/// Set this environment variable (to anything) to keep the scratch dir after drop; its path is
/// printed to stderr.
pub const KEEP_ENV: &str = "WEFT_TESTBED_KEEP";

/// Log line of a master SM that finished a sweep.
pub const SUBNET_UP: &str = "SUBNET UP";
/// Log line of an SM that became standby.
pub const ENTERING_STANDBY: &str = "Entering STANDBY";

const GRACE: Duration = Duration::from_secs(2);
/// How long a diag tool refused by ibsim's 10-client limit is retried.
const CLIENT_RETRY: Duration = Duration::from_secs(5);

/// How to start one OpenSM.
#[derive(Debug, Clone)]
pub struct SmSpec {
    /// Unique (per fabric) name; also the name of its directory `sm-<name>` in the scratch dir.
    pub name: String,
    /// The simulated HCA it runs on (`SIM_HOST`), e.g. `"smhost"`. One SM per HCA.
    pub sim_host: String,
    /// `sm_priority` (0–15); the higher one becomes master.
    pub priority: u8,
    /// partitions.conf path (`-P`). It need not exist (OpenSM then uses `Default=0x7fff:ALL=full`).
    pub partitions_file: PathBuf,
    /// Extra `opensm.conf` lines `key value`; a key given here replaces a default one.
    pub extra_config: Vec<(String, String)>,
}

impl SmSpec {
    /// A spec without extra config.
    pub fn new(
        name: impl Into<String>,
        sim_host: impl Into<String>,
        priority: u8,
        partitions_file: impl Into<PathBuf>,
    ) -> SmSpec {
        SmSpec {
            name: name.into(),
            sim_host: sim_host.into(),
            priority,
            partitions_file: partitions_file.into(),
            extra_config: Vec::new(),
        }
    }
}

/// A started OpenSM. The process is a direct child of the test process.
#[derive(Debug, Clone)]
pub struct SmHandle {
    /// Name from the [`SmSpec`].
    pub name: String,
    /// Process id (signal it with [`SimFabric::kill_sm`] or directly).
    pub pid: u32,
    /// OpenSM log (`-f`), flushed line by line (`force_log_flush TRUE`).
    pub log_file: PathBuf,
    /// File holding `pid` followed by a newline.
    pub pid_file: PathBuf,
    /// Its own dir: cwd, `opensm.conf`, `cache/` (OSM_CACHE_DIR: guid2lid …), dump files
    /// (`opensm-subnet.lst`), `stdout.log`.
    pub dir: PathBuf,
    /// The simulated HCA it is attached to.
    pub sim_host: String,
    /// GUID of its port (port 1 of `sim_host`).
    pub port_guid: u64,
    /// Path of the `opensm.conf` it was started with.
    pub config_file: PathBuf,
}

struct SmProc {
    handle: SmHandle,
    spec: SmSpec,
    child: Child,
}

/// A running ibsim with its own `IBSIM_SOCKNAME` and scratch dir.
///
/// Drop stops every process it started, by pid (SIGTERM, up to 2 s grace, SIGKILL), reaps
/// them, and removes the scratch dir (unless [`KEEP_ENV`] is set).
pub struct SimFabric {
    topology: Topology,
    dir: Option<TempDir>,
    path: PathBuf,
    sockname: String,
    umad2sim: PathBuf,
    ibsim: Option<Child>,
    console: Option<ChildStdin>,
    sms: BTreeMap<String, SmProc>,
    diag_seq: AtomicU64,
    diag_timeout: Duration,
    sm_timeout: Duration,
}

static FABRIC_SEQ: AtomicU64 = AtomicU64::new(0);

impl SimFabric {
    /// Write the topology's `net` file into a fresh scratch dir, start `ibsim -s` on it with
    /// a unique `IBSIM_SOCKNAME`, and wait (at most 10 s) until its control socket is bound.
    /// The ibsim console is fed from a pipe (see [`SimFabric::console`]).
    pub fn start(topology: &Topology) -> Result<SimFabric, TestbedError> {
        topology.validate()?;
        let umad2sim = std::env::var_os("WEFT_UMAD2SIM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_UMAD2SIM));
        if !umad2sim.exists() {
            return Err(TestbedError::Missing(format!(
                "{} (set WEFT_UMAD2SIM)",
                umad2sim.display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("weft-testbed-")
            .tempdir()
            .map_err(io("create scratch dir"))?;
        let path = dir.path().to_path_buf();
        let tag = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("weft-testbed-"))
            .unwrap_or("x")
            .to_string();
        let sockname = format!(
            "weft-{}-{}-{tag}",
            std::process::id(),
            FABRIC_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let net = path.join("net");
        fs::write(&net, topology.render_ibsim_net()).map_err(io("write net file"))?;
        fs::create_dir(path.join("diag")).map_err(io("create diag dir"))?;
        let log = File::create(path.join("ibsim.log")).map_err(io("create ibsim.log"))?;
        let log2 = log.try_clone().map_err(io("dup ibsim.log"))?;
        let mut child = Command::new("ibsim")
            .arg("-s")
            .arg(&net)
            .current_dir(&path)
            .env("IBSIM_SOCKNAME", &sockname)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| spawn_error("ibsim", e))?;
        let console = child.stdin.take();
        let mut fabric = SimFabric {
            topology: topology.clone(),
            dir: Some(dir),
            path,
            sockname,
            umad2sim,
            ibsim: Some(child),
            console,
            sms: BTreeMap::new(),
            diag_seq: AtomicU64::new(0),
            diag_timeout: Duration::from_secs(10),
            sm_timeout: Duration::from_secs(10),
        };
        // On error, `fabric` is dropped here, which kills ibsim.
        fabric.wait_ibsim_ready(Duration::from_secs(10))?;
        Ok(fabric)
    }

    fn wait_ibsim_ready(&mut self, timeout: Duration) -> Result<(), TestbedError> {
        let want = format!("@{}:ctl", self.sockname);
        let log = self.path.join("ibsim.log");
        let start = Instant::now();
        loop {
            if let Some(child) = self.ibsim.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(TestbedError::ProcessFailed {
                    program: "ibsim".into(),
                    status: status.to_string(),
                    stdout: String::new(),
                    stderr: tail(&log, 4000),
                });
            }
            // Abstract unix sockets are listed in /proc/net/unix with a leading '@' and their
            // NUL padding shown as trailing '@'s.
            let bound = match fs::read_to_string("/proc/net/unix") {
                Ok(t) => t.lines().any(|l| {
                    l.split_whitespace()
                        .last()
                        .is_some_and(|n| n.trim_end_matches('@') == want)
                }),
                Err(_) => fs::read_to_string(&log)
                    .map(|t| t.contains("Network simulator ready"))
                    .unwrap_or(false),
            };
            if bound {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(TestbedError::Timeout {
                    what: format!("ibsim control socket {want}"),
                    timeout,
                    detail: tail(&log, 4000),
                });
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// The scratch dir (net file, `ibsim.log`, `sm-<name>/` dirs, `diag/`).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// This fabric's `IBSIM_SOCKNAME`.
    pub fn sockname(&self) -> &str {
        &self.sockname
    }

    /// The topology it was started with.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Pid of the ibsim process (None after it was stopped).
    pub fn ibsim_pid(&self) -> Option<u32> {
        self.ibsim.as_ref().map(Child::id)
    }

    /// Pids of every process this fabric currently tracks: ibsim and the SMs not yet reaped.
    pub fn pids(&self) -> Vec<u32> {
        self.ibsim_pid()
            .into_iter()
            .chain(self.sms.values().map(|s| s.handle.pid))
            .collect()
    }

    /// Bound for each [`SimFabric::diag`] call (default 10 s).
    pub fn set_diag_timeout(&mut self, timeout: Duration) {
        self.diag_timeout = timeout;
    }

    /// Bound for [`SimFabric::start_sm`] to see its readiness line (default 10 s).
    pub fn set_sm_start_timeout(&mut self, timeout: Duration) {
        self.sm_timeout = timeout;
    }

    /// Environment any client (opensm, diag tool) needs to attach to this fabric at HCA
    /// `sim_host`: `LD_PRELOAD`, `SIM_HOST`, `IBSIM_SOCKNAME`.
    ///
    /// Run such a client with a writable cwd: umad2sim writes `./sys-<pid>/` there.
    pub fn client_env(&self, sim_host: &str) -> Vec<(String, String)> {
        vec![
            (
                "LD_PRELOAD".into(),
                self.umad2sim.to_string_lossy().into_owned(),
            ),
            ("SIM_HOST".into(), sim_host.into()),
            ("IBSIM_SOCKNAME".into(), self.sockname.clone()),
        ]
    }

    /// A `Command` for `program` attached at `sim_host`: [`SimFabric::client_env`] set, cwd
    /// the scratch `diag/` dir, stdin null. The caller owns (and must reap) what it spawns.
    pub fn client_command(&self, sim_host: &str, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.client_env(sim_host))
            .current_dir(self.path.join("diag"))
            .stdin(Stdio::null());
        cmd
    }

    /// Start an OpenSM on `spec.sim_host` and wait (bounded, default 10 s) until its log shows
    /// `SUBNET UP` (master) or `Entering STANDBY`.
    ///
    /// Layout under `<scratch>/sm-<name>/`: `opensm.conf` (`force_log_flush TRUE`,
    /// `sminfo_polling_timeout 1000`, `polling_retry_number 2`, then `extra_config`),
    /// `osm.log`, `opensm.pid`, `cache/`, `stdout.log`. Command line:
    /// `opensm -F opensm.conf -e -f osm.log -P <partitions_file> -p <priority>
    /// --dump_files_dir <dir>`, env `OSM_CACHE_DIR`, `OSM_TMP_DIR` and [`SimFabric::client_env`].
    pub fn start_sm(&mut self, spec: SmSpec) -> Result<SmHandle, TestbedError> {
        check_name(&spec.name)?;
        self.reap_sms();
        if self.sms.contains_key(&spec.name) {
            return Err(TestbedError::Invalid(format!(
                "an SM named {:?} is running",
                spec.name
            )));
        }
        if let Some(other) = self
            .sms
            .values()
            .find(|s| s.handle.sim_host == spec.sim_host)
        {
            return Err(TestbedError::Invalid(format!(
                "SM {:?} already runs on {:?} (ibsim allows one SM per node)",
                other.handle.name, spec.sim_host
            )));
        }
        if spec.priority > 15 {
            return Err(TestbedError::Invalid(format!(
                "SM priority {} > 15",
                spec.priority
            )));
        }
        let port_guid = self
            .topology
            .hca(&spec.sim_host)
            .and_then(|h| h.first_port_guid())
            .ok_or_else(|| {
                TestbedError::Invalid(format!("no cabled HCA named {:?}", spec.sim_host))
            })?;
        let dir = self.path.join(format!("sm-{}", spec.name));
        let cache = dir.join("cache");
        fs::create_dir_all(&cache).map_err(io("create SM dir"))?;
        let log_file = dir.join("osm.log");
        let pid_file = dir.join("opensm.pid");
        let config_file = dir.join("opensm.conf");
        // A restarted SM must not be judged by its predecessor's log.
        for f in [&log_file, &pid_file] {
            match fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove old SM file")(e)),
            }
        }
        let mut conf: Vec<(String, String)> = vec![
            ("force_log_flush".into(), "TRUE".into()),
            ("sminfo_polling_timeout".into(), "1000".into()),
            ("polling_retry_number".into(), "2".into()),
        ];
        for (k, v) in &spec.extra_config {
            conf.retain(|(ck, _)| ck != k);
            conf.push((k.clone(), v.clone()));
        }
        let text: String = conf.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        fs::write(&config_file, text).map_err(io("write opensm.conf"))?;
        // Where each running SM's log ends now: a standby's arrival makes the master run a
        // heavy sweep, and the wait below looks for it after these offsets.
        let others: Vec<(PathBuf, u64)> = self
            .sms
            .values()
            .map(|s| {
                let len = fs::metadata(&s.handle.log_file).map_or(0, |m| m.len());
                (s.handle.log_file.clone(), len)
            })
            .collect();
        let master_spec = self
            .sms
            .values()
            .max_by_key(|s| s.spec.priority)
            .map(|s| s.spec.clone());
        let out = File::create(dir.join("stdout.log")).map_err(io("create stdout.log"))?;
        let err = out.try_clone().map_err(io("dup stdout.log"))?;
        let child = Command::new("opensm")
            .arg("-F")
            .arg(&config_file)
            .arg("-e")
            .arg("-f")
            .arg(&log_file)
            .arg("-P")
            .arg(&spec.partitions_file)
            .arg("-p")
            .arg(spec.priority.to_string())
            .arg("--dump_files_dir")
            .arg(&dir)
            .envs(self.client_env(&spec.sim_host))
            .env("OSM_CACHE_DIR", &cache)
            .env("OSM_TMP_DIR", &dir)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| spawn_error("opensm", e))?;
        let pid = child.id();
        let handle = SmHandle {
            name: spec.name.clone(),
            pid,
            log_file: log_file.clone(),
            pid_file: pid_file.clone(),
            dir: dir.clone(),
            sim_host: spec.sim_host.clone(),
            port_guid,
            config_file,
        };
        // Track it at once, so that Drop kills it even if the wait below fails.
        self.sms.insert(
            spec.name.clone(),
            SmProc {
                handle: handle.clone(),
                spec: spec.clone(),
                child,
            },
        );
        fs::write(&pid_file, format!("{pid}\n")).map_err(io("write pid file"))?;
        let timeout = self.sm_timeout;
        let start = Instant::now();
        loop {
            let text = fs::read_to_string(&log_file).unwrap_or_default();
            if text.contains(SUBNET_UP) {
                return Ok(handle);
            }
            if text.contains(ENTERING_STANDBY) {
                if !self.wait_master_sweep_after_standby(&others)
                    && let Some(master) = master_spec
                {
                    // The master is wedged on a MAD that umad2sim lost (see the wait's
                    // doc); a restart in place (same files, new pid) clears it.
                    self.stop_sm(&master.name);
                    self.start_sm(master)?;
                }
                return Ok(handle);
            }
            let exited = self
                .sms
                .get_mut(&spec.name)
                .and_then(|s| s.child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.sms.remove(&spec.name);
                return Err(TestbedError::ProcessFailed {
                    program: format!("opensm {}", spec.name),
                    status: status.to_string(),
                    stdout: tail(&dir.join("stdout.log"), 4000),
                    stderr: tail(&log_file, 4000),
                });
            }
            if start.elapsed() > timeout {
                let detail = format!(
                    "log tail: {}\nstdout: {}",
                    tail(&log_file, 3000),
                    tail(&dir.join("stdout.log"), 2000)
                );
                self.stop_sm(&spec.name);
                return Err(TestbedError::Timeout {
                    what: format!(
                        "SM {} to report {SUBNET_UP} or {ENTERING_STANDBY}",
                        spec.name
                    ),
                    timeout,
                    detail,
                });
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// The running (not yet reaped) SM with this name.
    /// Waits (at most 3 s) until one of the already running SMs logs `SUBNET UP` after
    /// its recorded offset: the heavy sweep the master runs when a standby announces
    /// itself. Under load that sweep sometimes loses one directed-route SMP (seen: the
    /// master waits forever on one tid of class 0x81); umad2sim does not emulate the
    /// kernel's MAD send timeout, so the master never recovers by itself, and the
    /// fabric is handed to the caller only once the sweep is over. Returns whether
    /// the sweep was seen.
    fn wait_master_sweep_after_standby(&self, others: &[(PathBuf, u64)]) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            let swept = others.iter().any(|(log, offset)| {
                fs::read(log).is_ok_and(|bytes| {
                    bytes
                        .get(*offset as usize..)
                        .is_some_and(|new| String::from_utf8_lossy(new).contains(SUBNET_UP))
                })
            });
            if swept {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn sm(&self, name: &str) -> Option<&SmHandle> {
        self.sms.get(name).map(|s| &s.handle)
    }

    /// Every tracked SM.
    pub fn sms(&self) -> impl Iterator<Item = &SmHandle> {
        self.sms.values().map(|s| &s.handle)
    }

    /// Whether the SM `name` is tracked and has not exited. An exited SM is reaped and
    /// forgotten.
    pub fn sm_running(&mut self, name: &str) -> bool {
        self.reap_sms();
        self.sms.contains_key(name)
    }

    /// Send `signal` to the SM `name`. For SIGKILL, SIGTERM, SIGINT and SIGQUIT, also wait
    /// (at most 5 s) until it exited, reap it and forget it (so its name and `sim_host` can
    /// be reused); other signals (SIGHUP: re-read partitions, SIGUSR1: reopen log) leave it
    /// tracked.
    pub fn kill_sm(&mut self, name: &str, signal: Signal) -> Result<(), TestbedError> {
        let proc_ = self
            .sms
            .get_mut(name)
            .ok_or_else(|| TestbedError::Invalid(format!("no SM named {name:?}")))?;
        let pid = proc_.handle.pid;
        send(pid, signal)?;
        if !matches!(
            signal,
            Signal::SIGKILL | Signal::SIGTERM | Signal::SIGINT | Signal::SIGQUIT
        ) {
            return Ok(());
        }
        let timeout = Duration::from_secs(5);
        match wait_exit(&mut proc_.child, timeout) {
            Some(_) => {
                self.sms.remove(name);
                Ok(())
            }
            None => Err(TestbedError::Timeout {
                what: format!("SM {name} (pid {pid}) to exit after {signal}"),
                timeout,
                detail: String::new(),
            }),
        }
    }

    fn stop_sm(&mut self, name: &str) {
        if let Some(mut p) = self.sms.remove(name) {
            stop_child(&mut p.child);
        }
    }

    fn reap_sms(&mut self) {
        self.sms
            .retain(|_, s| !matches!(s.child.try_wait(), Ok(Some(_))));
    }

    /// Run a diag tool (`smpquery`, `saquery`, `sminfo`, `ibnetdiscover`, `ibstat`, …) attached
    /// at `sim_host`, bounded by the diag timeout (default 10 s; the process is killed when
    /// it runs out). Returns its stdout on exit status 0; otherwise an error carrying stdout
    /// and stderr.
    ///
    /// If ibsim refuses the client because its 10 client slots are taken, the call is retried
    /// for up to 5 s more.
    pub fn diag(
        &self,
        sim_host: &str,
        program: &str,
        args: &[&str],
    ) -> Result<String, TestbedError> {
        self.diag_with_timeout(sim_host, program, args, self.diag_timeout)
    }

    /// [`SimFabric::diag`] with an explicit bound for each attempt.
    pub fn diag_with_timeout(
        &self,
        sim_host: &str,
        program: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, TestbedError> {
        let first = Instant::now();
        let what = std::iter::once(program)
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        let mut backoff = Duration::from_millis(20);
        loop {
            let seq = self.diag_seq.fetch_add(1, Ordering::Relaxed);
            let out_path = self.path.join("diag").join(format!("{seq}.out"));
            let err_path = self.path.join("diag").join(format!("{seq}.err"));
            let out = File::create(&out_path).map_err(io("create diag stdout file"))?;
            let err = File::create(&err_path).map_err(io("create diag stderr file"))?;
            let mut child = self
                .client_command(sim_host, program)
                .args(args)
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(|e| spawn_error(program, e))?;
            let status = wait_exit(&mut child, timeout);
            if status.is_none() {
                // Timed out: kill and reap.
                let _ = child.kill();
                let _ = child.wait();
            }
            let stdout = read_lossy(&out_path);
            let stderr = read_lossy(&err_path);
            let _ = fs::remove_file(&out_path);
            let _ = fs::remove_file(&err_path);
            let Some(status) = status else {
                return Err(TestbedError::Timeout {
                    what: format!("{what} (SIM_HOST={sim_host})"),
                    timeout,
                    detail: format!("stderr: {stderr}\nstdout: {stdout}"),
                });
            };
            if status.success() {
                return Ok(stdout);
            }
            if client_refused(&stderr) && first.elapsed() < CLIENT_RETRY {
                sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
            return Err(TestbedError::ProcessFailed {
                program: format!("{what} (SIM_HOST={sim_host})"),
                status: status.to_string(),
                stdout,
                stderr,
            });
        }
    }

    /// Poll `sminfo` (run from `query_from`) until the master SM is the one named `sm_name`
    /// (its port GUID and state `SMINFO_MASTER`); returns how long it took. Bounded by
    /// `timeout`. Failed `sminfo` runs (for example while no SM answers) count as "not yet".
    pub fn wait_master(
        &self,
        query_from: &str,
        sm_name: &str,
        timeout: Duration,
    ) -> Result<Duration, TestbedError> {
        let guid = self
            .sm(sm_name)
            .map(|h| h.port_guid)
            .ok_or_else(|| TestbedError::Invalid(format!("no SM named {sm_name:?}")))?;
        let start = Instant::now();
        let mut last;
        loop {
            let per_try = timeout
                .saturating_sub(start.elapsed())
                .clamp(Duration::from_millis(100), Duration::from_secs(3));
            match self.diag_with_timeout(query_from, "sminfo", &[], per_try) {
                Ok(out) => {
                    if let Some(info) = SmInfo::parse(&out)
                        && info.guid == guid
                        && info.state == 3
                    {
                        return Ok(start.elapsed());
                    }
                    last = out;
                }
                Err(e) => last = e.to_string(),
            }
            if start.elapsed() > timeout {
                return Err(TestbedError::Timeout {
                    what: format!("SM {sm_name} ({guid:#x}) to be MASTER"),
                    timeout,
                    detail: format!("last sminfo: {last}"),
                });
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Port GUID → LID of every port in the fabric, from `ibnetdiscover -p` run at
    /// `query_from` (directed-route SMPs, so not subject to the SA's P_Key filtering or
    /// truncation). Switch ports all map the switch GUID to the switch LID.
    pub fn port_lids(&self, query_from: &str) -> Result<BTreeMap<u64, u16>, TestbedError> {
        let out = self.diag(query_from, "ibnetdiscover", &["-p"])?;
        Ok(parse_ibnetdiscover_ports(&out)
            .into_iter()
            .map(|p| (p.guid, p.lid))
            .collect())
    }

    /// Send one line to the ibsim console (commands: `Unlink "node"`, `ReLink "node"`,
    /// `Clear "node"[port]`, `Link …`, `Attached`, `Dump`, …; see ibsim's `help`). Waits
    /// (at most 2 s) until ibsim printed its next prompt, i.e. processed the line. Console
    /// output goes to `<scratch>/ibsim.log`.
    pub fn console(&mut self, line: &str) -> Result<(), TestbedError> {
        let log = self.path.join("ibsim.log");
        let prompts = |p: &Path| read_lossy(p).matches("sim> ").count();
        let before = prompts(&log);
        let stdin = self
            .console
            .as_mut()
            .ok_or_else(|| TestbedError::Invalid("ibsim console closed".into()))?;
        stdin
            .write_all(format!("{}\n", line.trim_end()).as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(io("write to ibsim console"))?;
        let timeout = Duration::from_secs(2);
        let start = Instant::now();
        while prompts(&log) <= before {
            if start.elapsed() > timeout {
                return Err(TestbedError::Timeout {
                    what: format!("ibsim to process console line {line:?}"),
                    timeout,
                    detail: tail(&log, 2000),
                });
            }
            sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Disconnect every link of `node` (ibsim `Unlink "node"`). The SM notices on its next
    /// sweep (traps are not simulated for this; expect up to `sweep_interval`).
    pub fn unlink(&mut self, node: &str) -> Result<(), TestbedError> {
        check_name(node)?;
        self.console(&format!("Unlink \"{node}\""))
    }

    /// Restore the links removed by [`SimFabric::unlink`] (ibsim `ReLink "node"`).
    pub fn relink(&mut self, node: &str) -> Result<(), TestbedError> {
        check_name(node)?;
        self.console(&format!("ReLink \"{node}\""))
    }
}

impl Drop for SimFabric {
    fn drop(&mut self) {
        let mut sms: Vec<Child> = std::mem::take(&mut self.sms)
            .into_values()
            .map(|s| s.child)
            .collect();
        stop_children(&mut sms);
        self.console = None;
        if let Some(mut ibsim) = self.ibsim.take() {
            stop_children(std::slice::from_mut(&mut ibsim));
        }
        if let Some(dir) = self.dir.take()
            && std::env::var_os(KEEP_ENV).is_some()
        {
            eprintln!("weft-testbed: keeping {}", dir.keep().display());
        }
        // Otherwise TempDir's drop removes the dir.
    }
}

/// One parsed `sminfo` line, e.g.
/// `sminfo: sm lid 1 sm guid 0x2c90300000a01, activity count 118 priority 10 state 3 SMINFO_MASTER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmInfo {
    /// LID of the SM port.
    pub lid: u16,
    /// Port GUID of the SM.
    pub guid: u64,
    /// Activity counter.
    pub activity_count: u32,
    /// Priority.
    pub priority: u8,
    /// State: 0 not active, 1 discovering, 2 standby, 3 master.
    pub state: u8,
}

impl SmInfo {
    /// Parse `sminfo` output; None if it does not have the expected shape.
    pub fn parse(text: &str) -> Option<SmInfo> {
        let line = text.lines().find(|l| l.contains("sm guid"))?;
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .collect();
        let after = |key: &[&str]| -> Option<&str> {
            words
                .windows(key.len() + 1)
                .find(|w| w[..key.len()] == *key)
                .map(|w| w[key.len()])
        };
        let guid = after(&["sm", "guid"])?;
        Some(SmInfo {
            lid: after(&["sm", "lid"])?.parse().ok()?,
            guid: u64::from_str_radix(guid.trim_start_matches("0x"), 16).ok()?,
            activity_count: after(&["activity", "count"])?.parse().ok()?,
            priority: after(&["priority"])?.parse().ok()?,
            state: after(&["state"])?.parse().ok()?,
        })
    }
}

/// One line of `ibnetdiscover -p`, e.g.
/// `CA    12  1 0x0002c90300000401 4x SDR - SW     3  4 0x0002c90310000200 ( 'node4' - 'leaf2' )`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredPort {
    /// `true` for a switch port, `false` for a CA port.
    pub is_switch: bool,
    /// LID of the port (a switch's LID for every switch port).
    pub lid: u16,
    /// Port number.
    pub port: u8,
    /// Port GUID (the node GUID for switch ports).
    pub guid: u64,
}

/// Parse `ibnetdiscover -p` output (lines that do not parse are skipped).
pub fn parse_ibnetdiscover_ports(text: &str) -> Vec<DiscoveredPort> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let is_switch = match w.next()? {
                "CA" => false,
                "SW" => true,
                _ => return None,
            };
            let lid = w.next()?.parse().ok()?;
            let port = w.next()?.parse().ok()?;
            let guid = u64::from_str_radix(w.next()?.trim_start_matches("0x"), 16).ok()?;
            Some(DiscoveredPort {
                is_switch,
                lid,
                port,
                guid,
            })
        })
        .collect()
}

/// Wait until `path` contains `needle` at or after byte `offset` (use the file length taken
/// before an action, e.g. a SIGHUP, to wait for a *new* line). Returns the elapsed time.
pub fn wait_for_log(
    path: &Path,
    needle: &str,
    offset: u64,
    timeout: Duration,
) -> Result<Duration, TestbedError> {
    let start = Instant::now();
    loop {
        let bytes = fs::read(path).unwrap_or_default();
        let from = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        if String::from_utf8_lossy(&bytes[from..]).contains(needle) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            return Err(TestbedError::Timeout {
                what: format!("{needle:?} in {} after byte {offset}", path.display()),
                timeout,
                detail: tail(path, 2000),
            });
        }
        sleep(Duration::from_millis(5));
    }
}

/// Whether a diag tool's stderr says ibsim had no free client slot. Observed (ibsim 0.10,
/// 10 clients attached): exit status 255 with
/// `ibwarn: [pid] sim_ctl: ctl error` / `ibpanic: [pid] sim_init: connect failed: Success`.
fn client_refused(stderr: &str) -> bool {
    stderr.contains("sim_init: connect failed") || stderr.contains("sim_ctl: ctl error")
}

fn check_name(name: &str) -> Result<(), TestbedError> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        Ok(())
    } else {
        Err(TestbedError::Invalid(format!(
            "bad name {name:?} (use [A-Za-z0-9_.-])"
        )))
    }
}

fn spawn_error(program: &str, e: std::io::Error) -> TestbedError {
    if e.kind() == std::io::ErrorKind::NotFound {
        TestbedError::Missing(program.to_string())
    } else {
        io(format!("spawn {program}"))(e)
    }
}

fn send(pid: u32, signal: Signal) -> Result<(), TestbedError> {
    let raw = i32::try_from(pid).map_err(|_| TestbedError::Invalid(format!("pid {pid}")))?;
    kill(Pid::from_raw(raw), signal).map_err(|source| TestbedError::Signal {
        pid,
        signal: signal.to_string(),
        source,
    })
}

/// Poll `child` until it exits or `timeout` passes; polls fast at first (diag tools take ~10 ms).
fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    let mut step = Duration::from_millis(1);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() > timeout {
            return None;
        }
        sleep(step);
        step = (step * 2).min(Duration::from_millis(20));
    }
}

fn stop_child(child: &mut Child) {
    stop_children(std::slice::from_mut(child));
}

/// SIGTERM all, wait up to [`GRACE`], SIGKILL the rest, reap all.
fn stop_children(children: &mut [Child]) {
    for c in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            let _ = send(c.id(), Signal::SIGTERM);
        }
    }
    let start = Instant::now();
    for c in children.iter_mut() {
        let left = GRACE.saturating_sub(start.elapsed());
        if wait_exit(c, left).is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn read_lossy(p: &Path) -> String {
    fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `max` bytes of a file, as text.
fn tail(p: &Path, max: usize) -> String {
    let t = read_lossy(p);
    let mut cut = t.len().saturating_sub(max);
    while !t.is_char_boundary(cut) {
        cut += 1;
    }
    t[cut..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_sminfo() {
        let s = "sminfo: sm lid 1 sm guid 0x2c90300000a01, activity count 118 priority 10 state 3 SMINFO_MASTER\n";
        assert_eq!(
            SmInfo::parse(s),
            Some(SmInfo {
                lid: 1,
                guid: 0x2c90300000a01,
                activity_count: 118,
                priority: 10,
                state: 3
            })
        );
        assert_eq!(SmInfo::parse("garbage"), None);
    }

    #[test]
    fn parse_ports() {
        let t = "CA    12  1 0x0002c90300000401 4x SDR - SW     3  4 0x0002c90310000200 ( 'node4' - 'leaf2' )\n\
                 SW     2  8 0x0002c90310000100 4x SDR                                    'sw1'\n";
        let p = parse_ibnetdiscover_ports(t);
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0],
            DiscoveredPort {
                is_switch: false,
                lid: 12,
                port: 1,
                guid: 0x0002c90300000401
            }
        );
        assert!(p[1].is_switch);
    }
}
