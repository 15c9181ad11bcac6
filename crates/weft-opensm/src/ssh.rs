//! An OpenSM on another machine, reached with the OpenSSH client.
//!
//! [`SshSm`] implements [`SmHost`] by running the real `ssh` program (through
//! [`run_bounded_bytes`], so every remote operation has a deadline) with key
//! authentication only and strict host-key checking against one known_hosts file that the
//! operator provides: a host whose key is not in that file is refused, never learned.
//!
//! Every remote operation is one short POSIX shell script run by the remote login shell.
//! Remote paths enter the scripts single-quoted (a path with a newline, a NUL or bytes
//! that are not UTF-8 is refused when the [`SshSm`] is made); file contents travel on
//! stdin, never on a command line.
//!
//! A write is atomic on the remote host: the bytes go to a temporary file in the target's
//! directory; the script checks their length and SHA-256 against what was sent (so a
//! client killed half way, which hands the remote script a short stdin, installs nothing);
//! then `sync` of the file, `mv -f` (rename(2)) over the target, and `sync` of the
//! directory.
//!
//! With [`SshConfig::multiplex`] (the default) the first command opens an OpenSSH control
//! master (`ControlMaster=auto`) whose socket lives in a private directory (mode 0700)
//! made for this [`SshSm`]; later commands reuse the authenticated connection, which turns
//! a remote command from a full handshake into one round trip. Dropping the [`SshSm`]
//! stops the master (`ssh -O exit`) and removes the directory; a master that outlives a
//! killed process exits by itself after [`SshConfig::control_persist`] idle.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use weft_fabric::Guid;

use crate::process::{Invocation, ProcessError, run_bounded_bytes};
use crate::sm::{
    LogPoll, SmError, SmHost, SmLock, checksum, holder_shown, lock_file_name, unique_suffix,
    wait_for_sweep_with,
};

/// How to reach one SM host with OpenSSH.
#[derive(Debug, Clone)]
pub struct SshConfig {
    /// Host name or address, as the known_hosts entry names it.
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Private key for public-key authentication (`IdentityFile`, `IdentitiesOnly=yes`).
    pub identity_file: PathBuf,
    /// The only file host keys are checked against (`UserKnownHostsFile`;
    /// `StrictHostKeyChecking=yes`, the global file is ignored). For a port other than 22,
    /// OpenSSH looks the host up as `[host]:port`.
    pub known_hosts_file: PathBuf,
    /// An OpenSSH client config file to read (`-F`); `None` reads none, so that only the
    /// settings here apply.
    pub config_file: Option<PathBuf>,
    /// `ConnectTimeout`: how long the TCP connect and the SSH handshake may take.
    pub connect_timeout: Duration,
    /// The deadline of every remote command, connection included.
    pub command_timeout: Duration,
    /// `ServerAliveInterval`; with [`SshConfig::server_alive_count_max`] it bounds how long
    /// a connection to a host that went silent stays open.
    pub server_alive_interval: Duration,
    pub server_alive_count_max: u32,
    /// Reuse one authenticated connection for all commands (OpenSSH `ControlMaster`).
    pub multiplex: bool,
    /// `ControlPersist`: how long an idle control master stays.
    pub control_persist: Duration,
    /// The client program.
    pub ssh_program: String,
}

impl SshConfig {
    /// Settings for `user@host:22` with the given key and known_hosts file; timeouts of
    /// 5 s to connect and 15 s per command, keepalives every 2 s (3 missed end the
    /// connection), multiplexing on.
    pub fn new(
        host: impl Into<String>,
        user: impl Into<String>,
        identity_file: impl Into<PathBuf>,
        known_hosts_file: impl Into<PathBuf>,
    ) -> SshConfig {
        SshConfig {
            host: host.into(),
            port: 22,
            user: user.into(),
            identity_file: identity_file.into(),
            known_hosts_file: known_hosts_file.into(),
            config_file: None,
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(15),
            server_alive_interval: Duration::from_secs(2),
            server_alive_count_max: 3,
            multiplex: true,
            control_persist: Duration::from_secs(60),
            ssh_program: "ssh".into(),
        }
    }

    /// `host:port`, for messages.
    pub fn endpoint(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Where an OpenSM keeps its files on its host.
#[derive(Debug, Clone)]
pub struct RemotePaths {
    /// The partitions file OpenSM reads (`-P`).
    pub partitions_file: PathBuf,
    /// A file holding the OpenSM's process id.
    pub pid_file: PathBuf,
    /// OpenSM's log (`-f`); it should be flushed line by line (`force_log_flush TRUE`).
    pub log_file: PathBuf,
}

/// An OpenSM on a host reached over SSH.
#[derive(Debug)]
pub struct SshSm {
    name: String,
    port_guid: Guid,
    ssh: SshConfig,
    paths: RemotePaths,
    /// The paths, single-quoted for the remote shell.
    q_file: String,
    q_dir: String,
    q_temp_prefix: String,
    q_lock: String,
    q_pid: String,
    q_log: String,
    /// The private directory of the control socket, when multiplexing.
    control_dir: Option<PathBuf>,
    /// The line every remote answer starts with (unique to this SshSm).
    marker: String,
    poll_interval: Duration,
}

/// The prefix of a line `ssh` prints when it refused the host's key.
const HOST_KEY_MARKERS: [&str; 3] = [
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "No matching host key",
];

static CONTROL_SEQ: AtomicU64 = AtomicU64::new(0);

/// `s` single-quoted for a POSIX shell: every byte literal, `'` written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A value for an `ssh -o Key=value` option: refuses what OpenSSH would split or expand
/// (whitespace, quotes, a leading `~`) and doubles `%` so that no token is expanded.
fn option_value(sm: &str, what: &str, path: &Path) -> Result<String, SmError> {
    let invalid = |why: &str| SmError::Invalid {
        sm: sm.to_string(),
        what: format!("{what} {path:?}"),
        why: why.to_string(),
    };
    let s = path.to_str().ok_or_else(|| invalid("not UTF-8"))?;
    if s.is_empty() {
        return Err(invalid("empty"));
    }
    if s.chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'' || c == '\\')
    {
        return Err(invalid("OpenSSH splits option values on blanks and quotes"));
    }
    if s.starts_with('~') {
        return Err(invalid("give a path without `~`"));
    }
    Ok(s.replace('%', "%%"))
}

impl SshSm {
    /// An SM named `name`, bound to port `port_guid`, whose files are `paths` on the host
    /// `ssh` reaches. Checks the settings and the paths, and makes the private directory
    /// for the control socket; connects to nothing.
    pub fn new(
        name: impl Into<String>,
        port_guid: Guid,
        ssh: SshConfig,
        paths: RemotePaths,
    ) -> Result<SshSm, SmError> {
        let name = name.into();
        let invalid = |what: String, why: &str| SmError::Invalid {
            sm: name.clone(),
            what,
            why: why.to_string(),
        };
        for (what, value) in [("host", &ssh.host), ("user", &ssh.user)] {
            if value.is_empty()
                || value.starts_with('-')
                || value
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '@' || c == '%')
            {
                return Err(invalid(
                    format!("{what} {value:?}"),
                    "not a plain name (empty, leading `-`, blanks, `@` or `%`)",
                ));
            }
        }
        if ssh.port == 0 {
            return Err(invalid("port 0".into(), "not a TCP port"));
        }
        option_value(&name, "identity file", &ssh.identity_file)?;
        option_value(&name, "known_hosts file", &ssh.known_hosts_file)?;
        if let Some(c) = &ssh.config_file {
            c.to_str()
                .ok_or_else(|| invalid(format!("ssh config file {c:?}"), "not UTF-8"))?;
        }
        let remote = |what: &str, p: &Path| -> Result<String, SmError> {
            let s = p
                .to_str()
                .ok_or_else(|| invalid(format!("{what} {p:?}"), "not UTF-8"))?;
            if s.is_empty() || s.contains(['\n', '\r', '\0']) {
                return Err(invalid(
                    format!("{what} {p:?}"),
                    "empty, or holds a newline or NUL that would end the remote command",
                ));
            }
            Ok(s.to_string())
        };
        let file = remote("partitions file", &paths.partitions_file)?;
        let pid = remote("pid file", &paths.pid_file)?;
        let log = remote("log file", &paths.log_file)?;
        let (dir, file_name) = match file.rsplit_once('/') {
            Some(("", f)) => ("/".to_string(), f.to_string()),
            Some((d, f)) => (d.to_string(), f.to_string()),
            None => (".".to_string(), file.clone()),
        };
        if file_name.is_empty() {
            return Err(invalid(
                format!("partitions file {file:?}"),
                "names a directory",
            ));
        }
        let control_dir = if ssh.multiplex {
            make_control_dir()
        } else {
            None
        };
        Ok(SshSm {
            q_file: shell_quote(&file),
            q_dir: shell_quote(&dir),
            q_temp_prefix: shell_quote(&format!(".{file_name}.weft-")),
            q_lock: shell_quote(&format!(
                "{}/{}",
                dir.trim_end_matches('/'),
                lock_file_name(Path::new(&file_name))
            )),
            q_pid: shell_quote(&pid),
            q_log: shell_quote(&log),
            name,
            port_guid,
            ssh,
            paths,
            control_dir,
            marker: format!(
                "weft-answer-{}-{:x}-{:x}",
                std::process::id(),
                CONTROL_SEQ.fetch_add(1, Ordering::Relaxed),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ),
            poll_interval: Duration::from_millis(10),
        })
    }

    /// The SSH settings.
    pub fn ssh(&self) -> &SshConfig {
        &self.ssh
    }

    /// The remote paths.
    pub fn paths(&self) -> &RemotePaths {
        &self.paths
    }

    /// Whether commands share one connection (a private control socket exists).
    pub fn multiplexed(&self) -> bool {
        self.control_dir.is_some()
    }

    /// The `ssh` arguments before the remote command.
    fn base_args(&self) -> Vec<String> {
        let s = &self.ssh;
        let secs = |d: Duration| d.as_secs_f64().ceil().max(1.0).to_string();
        // Checked in `new`; a value that fails here cannot occur, and falls back to the
        // raw path only to keep this function infallible.
        let opt = |what: &str, p: &Path| {
            option_value(&self.name, what, p).unwrap_or_else(|_| p.to_string_lossy().into())
        };
        let mut a: Vec<String> = vec![
            "-F".into(),
            s.config_file
                .as_ref()
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_else(|| "none".into()),
        ];
        let mut o = |kv: String| {
            a.push("-o".into());
            a.push(kv);
        };
        o("BatchMode=yes".into());
        o("StrictHostKeyChecking=yes".into());
        o(format!(
            "UserKnownHostsFile={}",
            opt("known_hosts file", &s.known_hosts_file)
        ));
        o("GlobalKnownHostsFile=/dev/null".into());
        o("UpdateHostKeys=no".into());
        o("CheckHostIP=no".into());
        o(format!(
            "IdentityFile={}",
            opt("identity file", &s.identity_file)
        ));
        o("IdentitiesOnly=yes".into());
        o("PreferredAuthentications=publickey".into());
        o("PasswordAuthentication=no".into());
        o("KbdInteractiveAuthentication=no".into());
        o(format!("ConnectTimeout={}", secs(s.connect_timeout)));
        o("ConnectionAttempts=1".into());
        o(format!(
            "ServerAliveInterval={}",
            secs(s.server_alive_interval)
        ));
        o(format!(
            "ServerAliveCountMax={}",
            s.server_alive_count_max.max(1)
        ));
        o("ForwardAgent=no".into());
        o("ForwardX11=no".into());
        o("ClearAllForwardings=yes".into());
        o("RequestTTY=no".into());
        o("LogLevel=ERROR".into());
        match &self.control_dir {
            Some(dir) => {
                o("ControlMaster=auto".into());
                o(format!("ControlPath={}/%C", dir.display()));
                o(format!("ControlPersist={}", secs(s.control_persist)));
            }
            None => {
                o("ControlMaster=no".into());
                o("ControlPath=none".into());
            }
        }
        a.extend([
            "-p".into(),
            s.port.to_string(),
            "-l".into(),
            s.user.clone(),
            "--".into(),
            s.host.clone(),
        ]);
        a
    }

    /// Runs `script` on the host with `input` on its stdin, bounded by `timeout`.
    fn run(
        &self,
        what: &str,
        script: &str,
        input: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>, SmError> {
        let mut args = self.base_args();
        // The answer starts after a marker line: whatever a shell startup file of the
        // remote account prints before the script runs is skipped, never taken for data.
        args.push(format!("printf '%s\\n' {}\n{script}", self.marker));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let inv = Invocation {
            env: &[],
            cwd: None,
            timeout,
        };
        let start = Instant::now();
        let out = run_bounded_bytes(&self.ssh.ssh_program, &args, input, &inv);
        tracing::trace!(sm = %self.name, what, ms = start.elapsed().as_secs_f64() * 1e3, ok = out.is_ok(), "ssh");
        let out = out.map_err(|e| self.classify(what, e))?;
        let head = format!("{}\n", self.marker);
        let Some(at) = out.windows(head.len()).position(|w| w == head.as_bytes()) else {
            return Err(self.unexpected(what, &out));
        };
        if at > 0 {
            tracing::debug!(sm = %self.name, bytes = at, "skipped output of the remote shell's startup files");
        }
        Ok(out[at + head.len()..].to_vec())
    }

    /// Turns a failed `ssh` run into the [`SmError`] that says what happened: the host
    /// refused by its key, the host not reached, or the command failed there.
    fn classify(&self, what: &str, e: ProcessError) -> SmError {
        let host = self.ssh.endpoint();
        let sm = self.name.clone();
        match e {
            ProcessError::TimedOut { timeout, .. } => SmError::Unreachable {
                sm,
                host,
                detail: format!("{what}: no answer within {timeout:?}"),
            },
            ProcessError::Failed { status, stderr, .. } => {
                let code_255 = status.ends_with(" 255");
                if HOST_KEY_MARKERS.iter().any(|m| stderr.contains(m)) {
                    SmError::HostKey {
                        sm,
                        host,
                        detail: format!(
                            "the key it offered is not the one in {}: {}",
                            self.ssh.known_hosts_file.display(),
                            last_line(&stderr)
                        ),
                    }
                } else if code_255 && stderr.contains("Permission denied") {
                    SmError::Remote {
                        sm,
                        host,
                        what: format!("{what}: authentication failed"),
                        detail: last_line(&stderr),
                    }
                } else if code_255 {
                    SmError::Unreachable {
                        sm,
                        host,
                        detail: format!("{what}: {}", last_line(&stderr)),
                    }
                } else {
                    SmError::Remote {
                        sm,
                        host,
                        what: what.to_string(),
                        detail: format!("{status}: {}", stderr.trim()),
                    }
                }
            }
            ProcessError::Spawn { program, source } => SmError::Remote {
                sm,
                host,
                what: format!("{what}: cannot start the SSH client `{program}`"),
                detail: source.to_string(),
            },
            ProcessError::Io { source, .. } => SmError::Remote {
                sm,
                host,
                what: what.to_string(),
                detail: source.to_string(),
            },
        }
    }

    fn unexpected(&self, what: &str, out: &[u8]) -> SmError {
        let shown: String = String::from_utf8_lossy(out).chars().take(200).collect();
        SmError::Remote {
            sm: self.name.clone(),
            host: self.ssh.endpoint(),
            what: what.to_string(),
            detail: format!("unexpected answer {shown:?}"),
        }
    }

    /// The script for one poll of the log after `offset`: a header (`K` the bytes after
    /// `offset` follow, `R` the log shrank and it follows whole), the bytes, and one
    /// trailing byte: `A` the SM is alive, `D` it is not, `P` its pid file is unreadable.
    /// While the log does not change, the script waits there (up to about 200 ms) before
    /// it answers, which saves round trips while a sweep runs.
    fn poll_script(&self, offset: u64) -> String {
        format!(
            r#"l={log}; pf={pid}
i=0
while [ $i -lt 20 ]; do
  s=$(stat -c %s -- "$l" 2>/dev/null) || s=0
  [ "$s" -eq {offset} ] || break
  sleep 0.01 || break
  i=$((i + 1))
done
if [ -e "$l" ]; then
  s=$(stat -c %s -- "$l") || exit 1
  if [ "$s" -lt {offset} ]; then printf 'R\n'; cat -- "$l" || exit 1
  else printf 'K\n'; tail -c +{from} -- "$l" || exit 1; fi
else printf 'K\n'; fi
p=$(cat -- "$pf" 2>/dev/null | tr -d '[:space:]')
case $p in ''|*[!0-9]*) printf P; exit 0;; esac
if kill -0 "$p" 2>/dev/null; then
  st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)
  case $st in Z|X) printf D;; *) printf A;; esac
else printf D; fi"#,
            log = self.q_log,
            pid = self.q_pid,
            from = offset.saturating_add(1),
        )
    }

    fn poll_log(&self, offset: u64, deadline: Instant) -> Result<LogPoll, SmError> {
        // Each poll is bounded by what is left of the wait (at least 500 ms, so a poll
        // near the end still gets a chance) and by the command timeout.
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = left
            .max(Duration::from_millis(500))
            .min(self.ssh.command_timeout);
        let out = self.run("read the log", &self.poll_script(offset), None, timeout)?;
        let (Some(&head), Some(&tail)) = (out.first(), out.last()) else {
            return Err(self.unexpected("read the log", &out));
        };
        if out.len() < 3 || out[1] != b'\n' || !matches!(head, b'K' | b'R') {
            return Err(self.unexpected("read the log", &out));
        }
        let alive = match tail {
            b'A' => Ok(true),
            b'D' => Ok(false),
            b'P' => Err(SmError::NotRunning {
                sm: self.name.clone(),
                detail: format!(
                    "on {}: pid file {} is missing or holds no process id",
                    self.ssh.endpoint(),
                    self.paths.pid_file.display()
                ),
            }),
            _ => return Err(self.unexpected("read the log", &out)),
        };
        Ok(LogPoll {
            bytes: out[2..out.len() - 1].to_vec(),
            restarted: head == b'R',
            alive,
        })
    }
}

/// The SSH session that holds a remote lock. Dropping it closes the session's stdin, so
/// the remote script ends and flock(2) lets go; a session that does not end within 3 s is
/// killed (the remote side sees the connection close, which ends it too).
struct RemoteLock(std::process::Child);

impl Drop for RemoteLock {
    fn drop(&mut self) {
        let _ = stop_child(&mut self.0, Duration::from_secs(3));
    }
}

/// Closes `child`'s stdin, waits up to `grace` for it to exit, then kills it; answers its
/// exit status when it exited by itself.
fn stop_child(
    child: &mut std::process::Child,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    drop(child.stdin.take());
    let until = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The last non-empty line of `text` (ssh's own message after any banner).
fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// A fresh private directory (mode 0700) for a control socket, or `None` (no
/// multiplexing) when none can be made or its path is too long for a socket address.
fn make_control_dir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    // A socket path must fit in sockaddr_un (108 bytes); `%C` expands to 40 characters.
    let mut bases = vec![std::env::temp_dir(), PathBuf::from("/tmp")];
    bases.dedup();
    for base in bases {
        for _ in 0..8 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let dir = base.join(format!(
                "weft-ssh-{}-{}-{nanos:x}",
                std::process::id(),
                CONTROL_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            if dir.as_os_str().len() + 42 > 100 || dir.to_str().is_none() {
                break;
            }
            if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() {
                return Some(dir);
            }
        }
    }
    tracing::warn!("no private directory for an SSH control socket; not multiplexing");
    None
}

impl Drop for SshSm {
    fn drop(&mut self) {
        let Some(dir) = self.control_dir.clone() else {
            return;
        };
        let has_socket = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
        if has_socket {
            // Stop the control master; its ControlPersist bounds it if this fails.
            let mut args = self.base_args();
            // `base_args` ends with `--` and the host; the control command goes before.
            let at = args.len().saturating_sub(2);
            args.splice(at..at, ["-O".to_string(), "exit".to_string()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let inv = Invocation {
                env: &[],
                cwd: None,
                timeout: Duration::from_secs(3),
            };
            let _ = run_bounded_bytes(&self.ssh.ssh_program, &args, None, &inv);
        }
        let _ = std::fs::remove_dir_all(&dir);
        self.control_dir = None;
    }
}

impl SmHost for SshSm {
    fn name(&self) -> &str {
        &self.name
    }

    fn port_guid(&self) -> Guid {
        self.port_guid
    }

    fn read_partitions(&self) -> Result<Option<Vec<u8>>, SmError> {
        let script = format!(
            "f={}; if [ -e \"$f\" ]; then printf F && exec cat -- \"$f\"; else printf N; fi",
            self.q_file
        );
        let what = format!("read {}", self.paths.partitions_file.display());
        let out = self.run(&what, &script, None, self.ssh.command_timeout)?;
        match out.split_first() {
            Some((b'F', rest)) => Ok(Some(rest.to_vec())),
            Some((b'N', [])) => Ok(None),
            _ => Err(self.unexpected(&what, &out)),
        }
    }

    fn write_partitions(&self, bytes: &[u8]) -> Result<(), SmError> {
        let script = format!(
            r#"set -e
f={file}; d={dir}
t="$d"/{prefix}"$$"-{unique}.tmp
trap 'rm -f -- "$t"' EXIT
trap 'rm -f -- "$t"; exit 1' HUP INT PIPE TERM
cat > "$t"
n=$(wc -c < "$t")
if [ "$n" -ne {len} ]; then echo "received $n of {len} bytes; file left unchanged" >&2; exit 1; fi
h=$(sha256sum < "$t"); h=${{h%% *}}
if [ "$h" != {sum} ]; then echo "received bytes with SHA-256 $h; file left unchanged" >&2; exit 1; fi
sync -- "$t"
mv -f -- "$t" "$f"
trap - EXIT HUP INT PIPE TERM
sync -- "$d""#,
            file = self.q_file,
            dir = self.q_dir,
            prefix = self.q_temp_prefix,
            unique = unique_suffix(),
            len = bytes.len(),
            sum = checksum(bytes),
        );
        let what = format!("write {}", self.paths.partitions_file.display());
        self.run(&what, &script, Some(bytes), self.ssh.command_timeout)
            .map(|_| ())
    }

    fn remove_partitions(&self) -> Result<(), SmError> {
        let script = format!("set -e; rm -f -- {}; sync -- {}", self.q_file, self.q_dir);
        let what = format!("remove {}", self.paths.partitions_file.display());
        self.run(&what, &script, None, self.ssh.command_timeout)
            .map(|_| ())
    }

    /// One remote session holds the lock: the script takes flock(2) on the lock file
    /// (waiting at most `wait`), says `LOCKED`, and keeps it until its stdin closes, which
    /// happens when the [`SmLock`] is dropped or this process dies (the SSH client then
    /// closes the session).
    fn lock(&self, holder: &str, wait: Duration) -> Result<SmLock, SmError> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let line: String = holder
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let script = format!(
            r#"l={lock}
exec 9>>"$l" || exit 3
if flock -x -w {wait_s:.3} 9; then
  printf '%s\n' {holder} > "$l"
  printf 'LOCKED\n'
  cat > /dev/null
  exit 0
fi
printf 'BUSY '; head -c 400 -- "$l" | tr -d '\n'; printf '\n'"#,
            lock = self.q_lock,
            wait_s = wait.as_secs_f64(),
            holder = shell_quote(&line),
        );
        let what = format!("lock {}", self.q_lock);
        let mut args = self.base_args();
        args.push(format!("printf '%s\\n' {}\n{script}", self.marker));
        let start = Instant::now();
        let mut child = Command::new(&self.ssh.ssh_program)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                self.classify(
                    &what,
                    ProcessError::Spawn {
                        program: self.ssh.ssh_program.clone(),
                        source: e,
                    },
                )
            })?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for l in std::io::BufReader::new(out).lines() {
                    let Ok(l) = l else { return };
                    if tx.send(l).is_err() {
                        return;
                    }
                }
            });
        }
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let buf = stderr.clone();
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut err, &mut text);
                if let Ok(mut b) = buf.lock() {
                    *b = text;
                }
            });
        }
        let deadline = start + wait + self.ssh.connect_timeout + self.ssh.command_timeout;
        let mut after_marker = false;
        let verdict = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) if !after_marker => after_marker = l == self.marker,
                Ok(l) if l == "LOCKED" => break Ok(()),
                Ok(l) if l.starts_with("BUSY") => break Err(Some(l)),
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break Err(None),
                // The session ended before an answer: ssh failed; its status says why.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break Err(None),
            }
            if Instant::now() >= deadline {
                break Err(None);
            }
        };
        match verdict {
            Ok(()) => Ok(SmLock::new(Box::new(RemoteLock(child)))),
            Err(busy) => {
                let status = stop_child(&mut child, Duration::from_millis(500));
                if let Some(b) = busy {
                    return Err(SmError::Locked {
                        sm: self.name.clone(),
                        lock: PathBuf::from(format!(
                            "{}:{}",
                            self.ssh.endpoint(),
                            self.q_lock.trim_matches('\'')
                        )),
                        holder: holder_shown(b.trim_start_matches("BUSY")),
                        waited: start.elapsed(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
                let stderr = stderr.lock().map(|s| s.clone()).unwrap_or_default();
                Err(match status {
                    Some(st) if !st.success() => self.classify(
                        &what,
                        ProcessError::Failed {
                            program: self.ssh.ssh_program.clone(),
                            status: st.to_string(),
                            stderr,
                        },
                    ),
                    _ => self.classify(
                        &what,
                        ProcessError::TimedOut {
                            program: self.ssh.ssh_program.clone(),
                            timeout: start.elapsed(),
                        },
                    ),
                })
            }
        }
    }

    fn log_cursor(&self) -> Result<u64, SmError> {
        let script = format!(
            "l={}; if [ -e \"$l\" ]; then stat -c %s -- \"$l\"; else echo 0; fi",
            self.q_log
        );
        let what = format!("stat log {}", self.paths.log_file.display());
        let out = self.run(&what, &script, None, self.ssh.command_timeout)?;
        String::from_utf8_lossy(&out)
            .trim()
            .parse()
            .map_err(|_| self.unexpected(&what, &out))
    }

    fn request_reread(&self) -> Result<(), SmError> {
        let script = format!(
            r#"pf={pid}
p=$(cat -- "$pf" | tr -d '[:space:]') || exit 3
case $p in ''|*[!0-9]*) echo "pid file holds '$p', not a process id" >&2; exit 3;; esac
kill -HUP "$p""#,
            pid = self.q_pid
        );
        match self.run("signal OpenSM", &script, None, self.ssh.command_timeout) {
            Ok(_) => Ok(()),
            Err(SmError::Remote { host, detail, .. }) => Err(SmError::NotRunning {
                sm: self.name.clone(),
                detail: format!(
                    "on {host}, with pid file {}: {detail}",
                    self.paths.pid_file.display()
                ),
            }),
            Err(e) => Err(e),
        }
    }

    fn wait_for_sweep(&self, cursor: u64, timeout: Duration) -> Result<(), SmError> {
        wait_for_sweep_with(
            &self.name,
            cursor,
            timeout,
            self.poll_interval,
            |offset, deadline| match self.poll_log(offset, deadline) {
                // A poll cut short by the end of the wait is the wait running out.
                Err(SmError::Unreachable { .. }) if Instant::now() >= deadline => {
                    Err(SmError::SweepTimeout {
                        sm: self.name.clone(),
                        timeout,
                    })
                }
                other => other,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(file: &str) -> RemotePaths {
        RemotePaths {
            partitions_file: file.into(),
            pid_file: "/run/opensm.pid".into(),
            log_file: "/var/log/opensm.log".into(),
        }
    }

    fn config() -> SshConfig {
        let mut c = SshConfig::new("sm1.example", "root", "/k/id", "/k/known_hosts");
        c.multiplex = false;
        c
    }

    #[test]
    fn quoting_survives_the_shell() {
        for s in ["plain", "it's", "a b", "$(rm -rf /)", "'", "`x`", "\\", "*"] {
            let out = std::process::Command::new("sh")
                .args(["-c", &format!("printf %s {}", shell_quote(s))])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    #[test]
    fn a_path_with_a_newline_is_refused() {
        let err = SshSm::new("sm1", Guid(1), config(), paths("/etc/x\ntouch /tmp/p")).unwrap_err();
        assert!(
            matches!(&err, SmError::Invalid { sm, .. } if sm == "sm1"),
            "{err}"
        );
        assert!(err.to_string().contains("newline"), "{err}");
    }

    #[test]
    fn a_host_that_looks_like_an_option_is_refused() {
        let mut c = config();
        c.host = "-oProxyCommand=touch /tmp/p".into();
        let err = SshSm::new("sm1", Guid(1), c, paths("/etc/opensm/partitions.conf")).unwrap_err();
        assert!(matches!(err, SmError::Invalid { .. }), "{err}");
    }

    #[test]
    fn host_keys_are_checked_strictly_against_the_given_file_only() {
        let sm = SshSm::new(
            "sm1",
            Guid(1),
            config(),
            paths("/etc/opensm/partitions.conf"),
        )
        .unwrap();
        let args = sm.base_args().join(" ");
        for want in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=/k/known_hosts",
            "GlobalKnownHostsFile=/dev/null",
            "IdentityFile=/k/id",
            "IdentitiesOnly=yes",
            "-F none",
            "-- sm1.example",
        ] {
            assert!(args.contains(want), "{want} missing from {args}");
        }
        assert!(args.ends_with("-- sm1.example"), "{args}");
    }

    #[test]
    fn a_percent_in_a_path_is_not_expanded_by_ssh() {
        let mut c = config();
        c.known_hosts_file = "/k/100%h".into();
        let sm = SshSm::new("sm1", Guid(1), c, paths("/etc/p.conf")).unwrap();
        assert!(
            sm.base_args()
                .iter()
                .any(|a| a == "UserKnownHostsFile=/k/100%%h")
        );
    }

    #[test]
    fn the_control_dir_is_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let mut c = config();
        c.multiplex = true;
        let sm = SshSm::new("sm1", Guid(1), c, paths("/etc/p.conf")).unwrap();
        let dir = sm.control_dir.clone().expect("a control dir");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(sm);
        assert!(!dir.exists());
    }
}
