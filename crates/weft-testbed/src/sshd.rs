//! A real OpenSSH server on a loopback port, for tests of code that reaches hosts over SSH.
//!
//! [`Sshd::start`] makes a scratch dir with a throwaway host key and a throwaway user key
//! (both ed25519, from `ssh-keygen`), authorizes the user key for the current user, and
//! runs `/usr/sbin/sshd -D -e -f <config>` (Debian package `openssh-server`) on a free
//! port of 127.0.0.1. It waits (bounded) until sshd says it listens, and writes a
//! known_hosts file whose one line holds the host key for `[127.0.0.1]:<port>`. Each test
//! starts its own. Drop kills sshd and every session process it forked, by pid, and
//! removes the scratch dir.
//!
//! [`Sshd::start_with`] takes [`SshdOptions`]: run sshd inside a network namespace (one sshd
//! per simulated host of a `weft-netns` cluster), listen on another address or port,
//! authorize more user keys, and set environment variables in its sessions.
//!
//! ```no_run
//! # fn main() -> Result<(), weft_testbed::TestbedError> {
//! let sshd = weft_testbed::Sshd::start()?;
//! let out = std::process::Command::new("ssh")
//!     .args(sshd.client_args())
//!     .arg("echo hello")
//!     .output();
//! # let _ = out; Ok(()) }
//! ```

use std::fs;
use std::io::Read as _;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::TestbedError;
use crate::error::io;

/// Where Debian's `openssh-server` installs the daemon. sshd re-executes itself, so it
/// must be started by absolute path.
pub const SSHD: &str = "/usr/sbin/sshd";

/// sshd's privilege-separation directory; sshd started as root refuses to run without it
/// (systemd makes it at boot, a container may not have it).
const PRIVSEP_DIR: &str = "/run/sshd";

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how [`Sshd::start_with`] runs sshd. `SshdOptions::default()` is what
/// [`Sshd::start`] does: 127.0.0.1, a free port, in this process's network namespace.
#[derive(Debug, Clone, Default)]
pub struct SshdOptions {
    /// Run sshd inside this network namespace (`ip netns exec NS /usr/sbin/sshd ...`;
    /// needs root). Its sessions, and what they run, are in that namespace too.
    pub netns: Option<String>,
    /// The address to listen on; default 127.0.0.1.
    pub listen: Option<IpAddr>,
    /// The port; default a free port of this namespace, or 22 inside `netns`.
    pub port: Option<u16>,
    /// Public keys (`type base64 [comment]` lines) authorized besides this sshd's own
    /// user key, e.g. another sshd's [`Sshd::user_public_key`].
    pub authorized_keys: Vec<String>,
    /// Environment variables for every session (sshd's `SetEnv`), besides `SHLVL=1`;
    /// values without whitespace.
    pub set_env: Vec<(String, String)>,
}

/// A running sshd. See the module docs.
pub struct Sshd {
    dir: Option<TempDir>,
    path: PathBuf,
    child: Option<Child>,
    host: String,
    port: u16,
    user: String,
    host_public_key: String,
    user_public_key: String,
    options: SshdOptions,
}

impl Sshd {
    /// Starts an sshd on a free loopback port; waits at most 10 s until it listens.
    pub fn start() -> Result<Sshd, TestbedError> {
        Sshd::start_with(&SshdOptions::default())
    }

    /// Starts an sshd as `options` say; waits at most 10 s until it listens.
    pub fn start_with(options: &SshdOptions) -> Result<Sshd, TestbedError> {
        if !Path::new(SSHD).exists() {
            return Err(TestbedError::Missing(format!(
                "{SSHD} (install openssh-server)"
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("weft-sshd-")
            .tempdir()
            .map_err(io("create sshd scratch dir"))?;
        let path = dir.path().to_path_buf();
        let root = fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        if root && !Path::new(PRIVSEP_DIR).exists() {
            use std::os::unix::fs::DirBuilderExt as _;
            match fs::DirBuilder::new().mode(0o755).create(PRIVSEP_DIR) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("create {PRIVSEP_DIR}"))(e)),
            }
        }
        let user = run_quick("id", &["-un"])?.trim().to_string();
        keygen(&path.join("host_key"), "weft-testbed-host")?;
        keygen(&path.join("user_key"), "weft-testbed-user")?;
        let user_public_key = key_of(&read(&path.join("user_key.pub"))?);
        let mut authorized = format!("{user_public_key}\n");
        for k in &options.authorized_keys {
            authorized.push_str(k.trim());
            authorized.push('\n');
        }
        fs::write(path.join("authorized_keys"), authorized).map_err(io("write authorized_keys"))?;
        let host_public_key = key_of(&read(&path.join("host_key.pub"))?);

        let mut sshd = Sshd {
            dir: Some(dir),
            path,
            child: None,
            host: options
                .listen
                .map_or_else(|| "127.0.0.1".to_string(), |a| a.to_string()),
            port: 0,
            user,
            host_public_key,
            user_public_key,
            options: options.clone(),
        };
        // Another process may take the free port between the probe and sshd's bind; then
        // sshd exits at once and another port is tried (only when the port is ours to pick).
        let fixed = options.port.or_else(|| options.netns.as_ref().map(|_| 22));
        let tries = if fixed.is_some() { 1 } else { 5 };
        let mut last = String::new();
        for _ in 0..tries {
            let port = match fixed {
                Some(p) => p,
                None => free_port()?,
            };
            match sshd.spawn(port) {
                Ok(()) => {
                    sshd.write_known_hosts(&sshd.known_hosts_file(), &sshd.host_public_key)?;
                    return Ok(sshd);
                }
                Err(SpawnFailure::PortTaken(log)) => last = log,
                Err(SpawnFailure::Other(e)) => return Err(e),
            }
        }
        Err(TestbedError::ProcessFailed {
            program: SSHD.into(),
            status: format!("no free port after {tries} tries"),
            stdout: String::new(),
            stderr: last,
        })
    }

    fn spawn(&mut self, port: u16) -> Result<(), SpawnFailure> {
        let p = &self.path;
        let listen = match self.options.listen {
            Some(IpAddr::V6(a)) => format!("[{a}]:{port}"),
            _ => format!("{}:{port}", self.host),
        };
        // sshd takes the first SetEnv line only: every variable goes on one line.
        let mut set_env = "SHLVL=1".to_string();
        for (k, v) in &self.options.set_env {
            set_env.push(' ');
            set_env.push_str(&format!("{k}={v}"));
        }
        let config = format!(
            "ListenAddress {listen}\n\
             HostKey {host_key}\n\
             PidFile {pid}\n\
             AuthorizedKeysFile {auth}\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             StrictModes no\n\
             AllowTcpForwarding no\n\
             AllowAgentForwarding no\n\
             X11Forwarding no\n\
             PrintMotd no\n\
             PrintLastLog no\n\
             MaxStartups 64\n\
             MaxSessions 64\n\
             SetEnv {set_env}\n\
             LogLevel VERBOSE\n",
            host_key = p.join("host_key").display(),
            pid = p.join("sshd.pid").display(),
            auth = p.join("authorized_keys").display(),
        );
        // `SetEnv SHLVL=1`: bash (Debian's, built with SSH_SOURCE_BASHRC) sources the
        // account's ~/.bashrc for every command sshd starts, unless SHLVL says it is a
        // nested shell. This keeps the developer's ~/.bashrc (a pyenv init costs 150 ms a
        // command) out of the tests, as on a clean SM host.
        let config_file = p.join("sshd_config");
        fs::write(&config_file, config)
            .map_err(|e| SpawnFailure::Other(io("write sshd_config")(e)))?;
        let log = p.join("sshd.log");
        let out =
            fs::File::create(&log).map_err(|e| SpawnFailure::Other(io("create sshd.log")(e)))?;
        let err = out
            .try_clone()
            .map_err(|e| SpawnFailure::Other(io("dup sshd.log")(e)))?;
        let mut command = match &self.options.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns.as_str(), SSHD]);
                c
            }
            None => Command::new(SSHD),
        };
        let child = command
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config_file)
            .current_dir(p)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                SpawnFailure::Other(TestbedError::Io {
                    context: format!("spawn {SSHD}"),
                    source: e,
                })
            })?;
        self.child = Some(child);
        let listening = format!("Server listening on {} port {port}.", self.host);
        let start = Instant::now();
        loop {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                if text.contains("Address already in use") || text.contains("Cannot bind") {
                    return Err(SpawnFailure::PortTaken(text));
                }
                return Err(SpawnFailure::Other(TestbedError::ProcessFailed {
                    program: format!("{SSHD} -D -e -f {}", config_file.display()),
                    status: status.to_string(),
                    stdout: String::new(),
                    stderr: text,
                }));
            }
            if text.contains(&listening) {
                self.port = port;
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                self.stop();
                return Err(SpawnFailure::Other(TestbedError::Timeout {
                    what: format!("sshd to listen on {listen}"),
                    timeout: START_TIMEOUT,
                    detail: text,
                }));
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// The address sshd listens on (127.0.0.1 unless [`SshdOptions::listen`] says).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user the key is authorized for: the user running the tests.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The private user key (no passphrase) that sshd accepts.
    pub fn identity_file(&self) -> PathBuf {
        self.path.join("user_key")
    }

    /// `type base64` of the user key that sshd accepts (to authorize it on another sshd).
    pub fn user_public_key(&self) -> &str {
        &self.user_public_key
    }

    /// How known_hosts names this sshd: `[host]:port`, or `host` alone on port 22 (ssh
    /// looks the plain name up for the default port).
    fn known_hosts_name(&self) -> String {
        if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        }
    }

    /// A known_hosts file with exactly one line: this sshd's host key for
    /// `[<host>]:<port>`.
    pub fn known_hosts_file(&self) -> PathBuf {
        self.path.join("known_hosts")
    }

    /// The known_hosts line for this sshd.
    pub fn known_hosts_line(&self) -> String {
        format!("{} {}\n", self.known_hosts_name(), self.host_public_key)
    }

    /// `type base64` of the host key.
    pub fn host_public_key(&self) -> &str {
        &self.host_public_key
    }

    /// Writes a known_hosts file at `path` that names this sshd's address with `key`
    /// (`type base64`); with another key than [`Sshd::host_public_key`] it is the file of
    /// a client that expects a different host.
    pub fn write_known_hosts(&self, path: &Path, key: &str) -> Result<(), TestbedError> {
        fs::write(path, format!("{} {key}\n", self.known_hosts_name()))
            .map_err(io(format!("write {}", path.display())))
    }

    /// A fresh throwaway ed25519 public key (`type base64`) that is not this sshd's.
    pub fn other_host_key(&self) -> Result<String, TestbedError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let stem = self
            .path
            .join(format!("other_key_{}", SEQ.fetch_add(1, Ordering::Relaxed)));
        keygen(&stem, "weft-testbed-other")?;
        Ok(key_of(&read(Path::new(&format!(
            "{}.pub",
            stem.display()
        )))?))
    }

    /// Arguments for `ssh` that reach this sshd with strict host-key checking:
    /// `-F none -o BatchMode=yes ... -p <port> -l <user> -- 127.0.0.1`; append a command.
    pub fn client_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["-F".into(), "none".into()];
        for o in [
            "BatchMode=yes".to_string(),
            "StrictHostKeyChecking=yes".into(),
            format!("UserKnownHostsFile={}", self.known_hosts_file().display()),
            "GlobalKnownHostsFile=/dev/null".into(),
            format!("IdentityFile={}", self.identity_file().display()),
            "IdentitiesOnly=yes".into(),
            "ConnectTimeout=5".into(),
            "LogLevel=ERROR".into(),
        ] {
            a.push("-o".into());
            a.push(o);
        }
        a.extend([
            "-p".into(),
            self.port.to_string(),
            "-l".into(),
            self.user.clone(),
            "--".into(),
            self.host().into(),
        ]);
        a
    }

    /// The scratch dir (keys, `sshd_config`, `sshd.log`, `known_hosts`).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// sshd's log (its stderr), for messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.path.join("sshd.log")).unwrap_or_default()
    }

    /// The listening sshd's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the listener is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Takes the host down: SIGKILL to the listener and to every session process it
    /// forked (their commands included), so that established connections break too, as
    /// when a machine dies. Waits (at most 5 s) for the listener to exit.
    pub fn kill(&mut self) -> Result<(), TestbedError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = child.id();
        // Stop the listener first so it forks no new session while its tree is collected.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        for p in descendants(pid) {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
        let _ = child.kill();
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if start.elapsed() < Duration::from_secs(5) => {
                    sleep(Duration::from_millis(5))
                }
                _ => {
                    return Err(TestbedError::Timeout {
                        what: format!("sshd (pid {pid}) to exit after SIGKILL"),
                        timeout: Duration::from_secs(5),
                        detail: String::new(),
                    });
                }
            }
        }
    }

    fn stop(&mut self) {
        let _ = self.kill();
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os(crate::KEEP_ENV).is_some()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("weft-testbed: kept sshd dir {}", kept.display());
        }
    }
}

enum SpawnFailure {
    PortTaken(String),
    Other(TestbedError),
}

/// Every process below `root` in the process tree, from /proc (children before their
/// own children are listed; order does not matter for SIGKILL).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, TestbedError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("bind a probe port"))?;
    Ok(l.local_addr().map_err(io("probe port address"))?.port())
}

/// `ssh-keygen -q -t ed25519 -N '' -f <stem> -C <comment>`.
fn keygen(stem: &Path, comment: &str) -> Result<(), TestbedError> {
    let stem = stem.to_string_lossy().into_owned();
    run_quick(
        "ssh-keygen",
        &["-q", "-t", "ed25519", "-N", "", "-f", &stem, "-C", comment],
    )
    .map(|_| ())
}

fn read(path: &Path) -> Result<String, TestbedError> {
    fs::read_to_string(path).map_err(io(format!("read {}", path.display())))
}

/// `type base64` of a `.pub` line (`type base64 comment`).
fn key_of(public: &str) -> String {
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a short program (at most 10 s); its stdout.
fn run_quick(program: &str, args: &[&str]) -> Result<String, TestbedError> {
    let what = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                TestbedError::Missing(format!("{program} (install openssh-client)"))
            }
            _ => io(format!("spawn {what}"))(e),
        })?;
    let timeout = Duration::from_secs(10);
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < timeout => sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestbedError::Timeout {
                    what,
                    timeout,
                    detail: String::new(),
                });
            }
        }
    };
    // The child has exited and started nothing that keeps its pipes, so these reads end.
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    if !status.success() {
        return Err(TestbedError::ProcessFailed {
            program: what,
            status: status.to_string(),
            stdout,
            stderr,
        });
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ssh` with `args` running `cmd`.
    fn ssh(args: &[String], cmd: &str) -> std::process::Output {
        Command::new("ssh")
            .args(args)
            .arg(cmd)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The output of `cmd` run by `ssh` with `args` into `sshd`, which must succeed.
    fn ssh_ok(sshd: &Sshd, args: &[String], cmd: &str) -> String {
        let out = ssh(args, cmd);
        assert!(
            out.status.success(),
            "{}\nsshd log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            sshd.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_client_with_the_known_host_key_gets_in_and_one_with_another_is_refused() {
        let sshd = Sshd::start().unwrap();
        assert_eq!(ssh_ok(&sshd, &sshd.client_args(), "echo in"), "in\n");

        let other = sshd.other_host_key().unwrap();
        assert_ne!(other, sshd.host_public_key());
        sshd.write_known_hosts(&sshd.known_hosts_file(), &other)
            .unwrap();
        let out = ssh(&sshd.client_args(), "echo in");
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Host key verification failed"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn options_authorize_another_key_and_set_session_variables() {
        let a = Sshd::start().unwrap();
        let b = Sshd::start_with(&SshdOptions {
            authorized_keys: vec![a.user_public_key().to_string()],
            set_env: vec![("WEFT_SSH_FROM".into(), "node-b".into())],
            ..SshdOptions::default()
        })
        .unwrap();
        assert_ne!(a.port(), b.port());
        // b's own arguments, with a's identity instead of b's.
        let args: Vec<String> = b
            .client_args()
            .into_iter()
            .map(|x| {
                if x.starts_with("IdentityFile=") {
                    format!("IdentityFile={}", a.identity_file().display())
                } else {
                    x
                }
            })
            .collect();
        assert_eq!(
            ssh_ok(&b, &args, "echo from=$WEFT_SSH_FROM"),
            "from=node-b\n"
        );
        assert!(
            b.known_hosts_line()
                .starts_with(&format!("[127.0.0.1]:{} ", b.port()))
        );
    }

    #[test]
    fn kill_takes_the_host_down_and_drop_cleans_up() {
        let mut sshd = Sshd::start().unwrap();
        let port = sshd.port();
        let dir = sshd.dir().to_path_buf();
        assert!(sshd.running());
        sshd.kill().unwrap();
        assert!(!sshd.running());
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
        drop(sshd);
        assert!(!dir.exists());
    }
}
