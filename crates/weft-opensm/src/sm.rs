//! Subnet-manager hosts: where an OpenSM's partitions.conf lives and how to make it reread.
//!
//! [`SmHost`] is the seam between the applier (what to do) and a host (how to do it). The
//! local implementation, [`LocalSm`], works on files and signals on this machine; the remote
//! one, [`crate::SshSm`], does the same through the OpenSSH client. The wait for a sweep
//! (which log lines count) is shared by both: `wait_for_sweep_with`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use weft_fabric::Guid;

/// What went wrong on an SM host. Every variant names the host.
#[derive(Debug, thiserror::Error)]
pub enum SmError {
    #[error("SM `{sm}`: {what} {}: {source}", path.display())]
    Io {
        sm: String,
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("SM `{sm}`: no running OpenSM: {detail}")]
    NotRunning { sm: String, detail: String },
    #[error("SM `{sm}`: no sweep finished within {timeout:?} after the reread")]
    SweepTimeout { sm: String, timeout: Duration },
    #[error("SM `{sm}` rejected the partitions file: {line}")]
    ConfigRejected { sm: String, line: String },
    #[error("SM `{sm}` exited while it was rereading")]
    DiedDuringSweep { sm: String },
    /// Another apply holds this SM's lock and did not give it back within the wait.
    #[error("SM `{sm}`: another apply holds the lock {} (waited {waited:?}): {holder}", lock.display())]
    Locked {
        sm: String,
        lock: PathBuf,
        holder: String,
        waited: Duration,
    },
    /// The SM's host could not be reached (connection refused, timed out, reset): its
    /// state is unknown, and an apply may go on without it if it is a standby.
    #[error("SM `{sm}` on {host}: host unreachable: {detail}")]
    Unreachable {
        sm: String,
        host: String,
        detail: String,
    },
    /// The host answered with a key that its known_hosts entry does not hold (or there is
    /// no entry). Never treated as unreachable: it may be someone else's machine.
    #[error("SM `{sm}` on {host}: host-key verification failed: {detail}")]
    HostKey {
        sm: String,
        host: String,
        detail: String,
    },
    /// The host was reached but the operation failed there (or authentication failed).
    #[error("SM `{sm}` on {host}: {what}: {detail}")]
    Remote {
        sm: String,
        host: String,
        what: String,
        detail: String,
    },
    /// A setting (a path, a host name) that cannot be used safely, such as a path with a
    /// newline that would end a remote shell command.
    #[error("SM `{sm}`: refusing {what}: {why}")]
    Invalid {
        sm: String,
        what: String,
        why: String,
    },
}

impl SmError {
    /// Whether the SM's host could not be reached at all, as opposed to a host that
    /// answered and refused or failed.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, SmError::Unreachable { .. })
    }
}

/// A hex SHA-256 of a config's bytes; compared between primary and standby.
pub fn checksum(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An SM's apply lock, held until dropped. Taken by [`SmHost::lock`].
pub struct SmLock {
    _held: Box<dyn Send>,
}

impl SmLock {
    /// A lock that holds `guard` (a locked file, a remote session) until dropped.
    pub fn new(guard: Box<dyn Send>) -> SmLock {
        SmLock { _held: guard }
    }
}

impl std::fmt::Debug for SmLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SmLock")
    }
}

/// The name of the lock file beside a partitions file: `.partitions.conf.weft-lock`.
pub fn lock_file_name(partitions_file: &Path) -> String {
    let file_name = partitions_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "partitions.conf".into());
    format!(".{file_name}.weft-lock")
}

/// A name unique to one write or one apply in this process: pid, a counter, nanoseconds.
pub(crate) fn unique_suffix() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// One OpenSM instance as the applier sees it.
pub trait SmHost: Send + Sync {
    /// The name the operator gave this SM; used in every message.
    fn name(&self) -> &str;
    /// The GUID of the port this SM is bound to, which `sminfo` reports for the master.
    fn port_guid(&self) -> Guid;
    /// The current partitions file, or `None` when there is none.
    fn read_partitions(&self) -> Result<Option<Vec<u8>>, SmError>;
    /// Replaces the partitions file so that a reader sees either the old or the new bytes,
    /// never a mix, even if this process is killed half way.
    fn write_partitions(&self, bytes: &[u8]) -> Result<(), SmError>;
    /// Removes the partitions file; restores the state of an SM that had none.
    fn remove_partitions(&self) -> Result<(), SmError>;
    /// Takes this SM's apply lock (a lock file beside the partitions file, locked with
    /// flock(2) on the SM's host) for `holder`, a line saying who holds it. Waits at most
    /// `wait` while another apply holds it, then fails with [`SmError::Locked`] naming
    /// that holder. The lock ends when the [`SmLock`] is dropped or its process dies.
    fn lock(&self, holder: &str, wait: Duration) -> Result<SmLock, SmError>;
    /// A position in the SM's log; [`SmHost::wait_for_sweep`] looks only after it.
    fn log_cursor(&self) -> Result<u64, SmError>;
    /// Asks OpenSM to reread its partitions file (a heavy sweep).
    fn request_reread(&self) -> Result<(), SmError>;
    /// Waits until the log shows a finished sweep after `cursor`; fails fast when the
    /// SM rejects the file or exits.
    fn wait_for_sweep(&self, cursor: u64, timeout: Duration) -> Result<(), SmError>;
}

/// An OpenSM on this machine: its partitions file, its pid file and its log.
#[derive(Debug, Clone)]
pub struct LocalSm {
    pub name: String,
    pub port_guid: Guid,
    pub partitions_file: PathBuf,
    pub pid_file: PathBuf,
    pub log_file: PathBuf,
}

/// The log line OpenSM writes when a sweep has programmed the fabric.
const SWEEP_DONE: &str = "SUBNET UP";
/// Lines OpenSM writes when it throws a partitions file away and opens the fabric.
const CONFIG_REJECTED: [&str; 2] = ["PARSE ERROR", "Partition configuration in error"];

impl LocalSm {
    fn io(&self, what: &'static str, path: &Path, source: std::io::Error) -> SmError {
        SmError::Io {
            sm: self.name.clone(),
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    fn pid(&self) -> Result<nix::unistd::Pid, SmError> {
        let text = fs::read_to_string(&self.pid_file).map_err(|e| SmError::NotRunning {
            sm: self.name.clone(),
            detail: format!("cannot read pid file {}: {e}", self.pid_file.display()),
        })?;
        let pid: i32 = text.trim().parse().map_err(|_| SmError::NotRunning {
            sm: self.name.clone(),
            detail: format!(
                "pid file {} holds `{}`, not a process id",
                self.pid_file.display(),
                text.trim()
            ),
        })?;
        Ok(nix::unistd::Pid::from_raw(pid))
    }

    fn alive(&self) -> Result<bool, SmError> {
        let pid = self.pid()?;
        // Signal 0 checks existence without delivering anything. A zombie still exists
        // for kill(2), so also look at its state.
        if nix::sys::signal::kill(pid, None).is_err() {
            return Ok(false);
        }
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        Ok(!matches!(state, Some("Z") | Some("X")))
    }

    /// A temporary file name unique to this write (`.partitions.conf.weft-<pid>-<n>-<ns>.tmp`):
    /// two writers never share one, and each removes only its own.
    fn temp_path(&self) -> PathBuf {
        let file_name = self
            .partitions_file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "partitions.conf".into());
        self.partitions_file
            .with_file_name(format!(".{file_name}.weft-{}.tmp", unique_suffix()))
    }

    /// Removes the temporary files of writers on this host that no longer run (a write
    /// killed between its temporary file and the rename). Called with the lock held, so
    /// no other apply is writing; a file whose writer's process exists is left alone.
    fn remove_dead_writers_temps(&self) {
        let file_name = self
            .partitions_file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "partitions.conf".into());
        let prefix = format!(".{file_name}.weft-");
        let Some(dir) = self.partitions_file.parent() else {
            return;
        };
        let Ok(entries) = fs::read_dir(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".tmp"))
            else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && pid != std::process::id()
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                tracing::debug!(file = %name, "removing a dead writer's temporary file");
                let _ = fs::remove_file(e.path());
            }
        }
    }

    fn lock_path(&self) -> PathBuf {
        self.partitions_file
            .with_file_name(lock_file_name(&self.partitions_file))
    }
}

/// Writes `bytes` to `target` through a temporary file in the same directory: write,
/// fsync, rename, fsync the directory. A crash at any point leaves `target` whole.
pub fn write_atomically(target: &Path, temp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(temp, target)?;
        File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(temp);
    }
    result
}

impl SmHost for LocalSm {
    fn name(&self) -> &str {
        &self.name
    }

    fn port_guid(&self) -> Guid {
        self.port_guid
    }

    fn read_partitions(&self) -> Result<Option<Vec<u8>>, SmError> {
        match fs::read(&self.partitions_file) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("cannot read", &self.partitions_file, e)),
        }
    }

    fn write_partitions(&self, bytes: &[u8]) -> Result<(), SmError> {
        write_atomically(&self.partitions_file, &self.temp_path(), bytes)
            .map_err(|e| self.io("cannot write", &self.partitions_file, e))
    }

    fn remove_partitions(&self) -> Result<(), SmError> {
        match fs::remove_file(&self.partitions_file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io("cannot remove", &self.partitions_file, e)),
        }
    }

    fn lock(&self, holder: &str, wait: Duration) -> Result<SmLock, SmError> {
        use nix::fcntl::{Flock, FlockArg};
        let path = self.lock_path();
        let start = Instant::now();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| self.io("cannot open the lock file", &path, e))?;
        let mut locked = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(l) => break l,
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    if start.elapsed() >= wait {
                        let holder = fs::read_to_string(&path).unwrap_or_default();
                        return Err(SmError::Locked {
                            sm: self.name.clone(),
                            lock: path,
                            holder: holder_shown(&holder),
                            waited: start.elapsed(),
                        });
                    }
                    file = f;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((_, e)) => {
                    return Err(self.io("cannot lock", &path, std::io::Error::from(e)));
                }
            }
        };
        // Who holds it, for the message of an apply that waits.
        let said = locked
            .set_len(0)
            .and_then(|_| locked.seek(SeekFrom::Start(0)))
            .and_then(|_| locked.write_all(format!("{holder}\n").as_bytes()));
        if let Err(e) = said {
            return Err(self.io("cannot write the lock file", &path, e));
        }
        self.remove_dead_writers_temps();
        Ok(SmLock::new(Box::new(locked)))
    }

    fn log_cursor(&self) -> Result<u64, SmError> {
        match fs::metadata(&self.log_file) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(self.io("cannot stat log", &self.log_file, e)),
        }
    }

    fn request_reread(&self) -> Result<(), SmError> {
        let pid = self.pid()?;
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).map_err(|e| {
            SmError::NotRunning {
                sm: self.name.clone(),
                detail: format!("cannot signal pid {pid}: {e}"),
            }
        })
    }

    fn wait_for_sweep(&self, cursor: u64, timeout: Duration) -> Result<(), SmError> {
        wait_for_sweep_with(
            &self.name,
            cursor,
            timeout,
            Duration::from_millis(2),
            |offset, _deadline| {
                let mut poll = LogPoll {
                    bytes: Vec::new(),
                    restarted: false,
                    alive: Ok(true),
                };
                if let Ok(mut f) = File::open(&self.log_file) {
                    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                    let from = if len < offset {
                        poll.restarted = true; // the log was rotated or truncated
                        0
                    } else {
                        offset
                    };
                    f.seek(SeekFrom::Start(from))
                        .and_then(|_| f.read_to_end(&mut poll.bytes))
                        .map_err(|e| self.io("cannot read log", &self.log_file, e))?;
                }
                poll.alive = self.alive();
                Ok(poll)
            },
        )
    }
}

/// A lock file's holder line as a message shows it: one line, at most 200 characters,
/// control characters escaped.
pub(crate) fn holder_shown(text: &str) -> String {
    let line = text.trim();
    if line.is_empty() {
        return "holder unknown (the lock file is empty)".into();
    }
    line.chars()
        .take(200)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// One look at an SM's log: what it holds after the offset asked for, and whether the SM
/// process still exists.
#[derive(Debug)]
pub(crate) struct LogPoll {
    /// The log's bytes after the offset (or from its start when `restarted`).
    pub bytes: Vec<u8>,
    /// The log was shorter than the offset (rotated or truncated); `bytes` start at 0.
    pub restarted: bool,
    /// Whether the SM process was alive after the log was read; an error (no pid file)
    /// counts only when the log has no verdict.
    pub alive: Result<bool, SmError>,
}

/// What a complete log line says about a sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogVerdict {
    SweepDone,
    Rejected(String),
}

/// Judges OpenSM log text fed in arbitrary chunks, line by line: only complete lines are
/// judged; a half-written line waits for the next chunk.
#[derive(Debug, Default)]
pub(crate) struct SweepScanner {
    pending: Vec<u8>,
}

impl SweepScanner {
    pub fn feed(&mut self, chunk: &[u8]) -> Option<LogVerdict> {
        self.pending.extend_from_slice(chunk);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw);
            if CONFIG_REJECTED.iter().any(|m| line.contains(m)) {
                return Some(LogVerdict::Rejected(line.trim().to_string()));
            }
            if line.contains(SWEEP_DONE) {
                return Some(LogVerdict::SweepDone);
            }
        }
        None
    }
}

/// The wait every [`SmHost::wait_for_sweep`] shares: polls the log after `cursor` with
/// `poll(offset, deadline)` until a line shows the sweep finished (Ok), a line shows the
/// file rejected, the SM is gone, or `timeout` passes; sleeps `interval` between polls.
pub(crate) fn wait_for_sweep_with(
    sm: &str,
    cursor: u64,
    timeout: Duration,
    interval: Duration,
    mut poll: impl FnMut(u64, Instant) -> Result<LogPoll, SmError>,
) -> Result<(), SmError> {
    let deadline = Instant::now() + timeout;
    let mut offset = cursor;
    let mut scanner = SweepScanner::default();
    loop {
        let p = poll(offset, deadline)?;
        if p.restarted {
            offset = 0;
            scanner = SweepScanner::default();
        }
        offset += p.bytes.len() as u64;
        match scanner.feed(&p.bytes) {
            Some(LogVerdict::Rejected(line)) => {
                tracing::warn!(sm, %line, "OpenSM rejected the file");
                return Err(SmError::ConfigRejected {
                    sm: sm.to_string(),
                    line,
                });
            }
            Some(LogVerdict::SweepDone) => return Ok(()),
            None => {}
        }
        if !p.alive? {
            return Err(SmError::DiedDuringSweep { sm: sm.to_string() });
        }
        if Instant::now() >= deadline {
            return Err(SmError::SweepTimeout {
                sm: sm.to_string(),
                timeout,
            });
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sm_in(dir: &Path) -> LocalSm {
        LocalSm {
            name: "t".into(),
            port_guid: Guid(1),
            partitions_file: dir.join("partitions.conf"),
            pid_file: dir.join("opensm.pid"),
            log_file: dir.join("osm.log"),
        }
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        sm.write_partitions(b"one").unwrap();
        sm.write_partitions(b"two").unwrap();
        assert_eq!(sm.read_partitions().unwrap().unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("partitions.conf")]);
    }

    /// Regression: each write deleted every `.partitions.conf.weft-*.tmp`, another
    /// writer's too, and two writers of one process shared one temporary name.
    #[test]
    fn a_write_removes_only_its_own_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        let other = dir.path().join(".partitions.conf.weft-99999.tmp");
        fs::write(&other, "another writer's").unwrap();
        sm.write_partitions(b"whole").unwrap();
        assert_eq!(fs::read(&other).unwrap(), b"another writer's");
        assert_ne!(sm.temp_path(), sm.temp_path());
        std::thread::scope(|s| {
            for i in 0..8 {
                let sm = &sm;
                s.spawn(move || {
                    for _ in 0..20 {
                        sm.write_partitions(format!("writer {i}").as_bytes())
                            .unwrap();
                    }
                });
            }
        });
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".partitions.conf.weft-99999.tmp", "partitions.conf"]
        );
    }

    #[test]
    fn a_second_lock_waits_then_fails_naming_the_holder_and_the_first_drop_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        let first = sm
            .lock("weft apply 1 on host a pid 7", Duration::from_secs(1))
            .unwrap();
        let start = Instant::now();
        let err = sm
            .lock("weft apply 2", Duration::from_millis(200))
            .unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(&err, SmError::Locked { holder, .. } if holder == "weft apply 1 on host a pid 7"),
            "{err}"
        );
        // A waiter gets the lock as soon as the holder lets go.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| sm.lock("weft apply 3", Duration::from_secs(5)));
            std::thread::sleep(Duration::from_millis(100));
            drop(first);
            waiter.join().unwrap().unwrap();
        });
        assert!(dir.path().join(".partitions.conf.weft-lock").exists());
    }

    #[test]
    fn the_lock_clears_only_temp_files_of_writers_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let gone = dir
            .path()
            .join(format!(".partitions.conf.weft-{dead}-0-1.tmp"));
        let alive = dir.path().join(format!(
            ".partitions.conf.weft-{}-0-1.tmp",
            std::process::id()
        ));
        fs::write(&gone, "half").unwrap();
        fs::write(&alive, "being written").unwrap();
        let _lock = sm.lock("t", Duration::from_secs(1)).unwrap();
        assert!(!gone.exists());
        assert!(alive.exists());
    }

    #[test]
    fn sweep_wait_sees_only_lines_after_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        fs::write(&sm.pid_file, std::process::id().to_string()).unwrap();
        fs::write(&sm.log_file, "x 0x02 -> SUBNET UP\n").unwrap();
        let cursor = sm.log_cursor().unwrap();
        let err = sm
            .wait_for_sweep(cursor, Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(err, SmError::SweepTimeout { .. }), "{err}");
        let mut f = OpenOptions::new().append(true).open(&sm.log_file).unwrap();
        writeln!(f, "y 0x02 -> SUBNET UP").unwrap();
        sm.wait_for_sweep(cursor, Duration::from_secs(2)).unwrap();
    }

    #[test]
    fn sweep_wait_reports_a_rejected_file() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        fs::write(&sm.pid_file, std::process::id().to_string()).unwrap();
        fs::write(
            &sm.log_file,
            "PARSE ERROR: line 3: bad PortGUID\nSUBNET UP\n",
        )
        .unwrap();
        let err = sm.wait_for_sweep(0, Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(&err, SmError::ConfigRejected { line, .. } if line.contains("line 3")),
            "{err}"
        );
    }

    #[test]
    fn a_dead_sm_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let sm = sm_in(dir.path());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        fs::write(&sm.pid_file, pid.to_string()).unwrap();
        let err = sm.wait_for_sweep(0, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, SmError::DiedDuringSweep { .. }), "{err}");
    }

    #[test]
    fn checksum_is_sha256_hex() {
        assert_eq!(
            checksum(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_scanner_judges_only_complete_lines_across_chunks() {
        let mut s = SweepScanner::default();
        assert_eq!(s.feed(b"x 0x02 -> SUBNET"), None);
        assert_eq!(s.feed(b" UP"), None);
        assert_eq!(s.feed(b"\n"), Some(LogVerdict::SweepDone));
        let mut s = SweepScanner::default();
        assert_eq!(
            s.feed(b"ok\nPartition configuration in error\nSUBNET UP\n"),
            Some(LogVerdict::Rejected(
                "Partition configuration in error".into()
            ))
        );
        // Bytes that are not UTF-8 are judged, not an error.
        let mut s = SweepScanner::default();
        assert_eq!(s.feed(b"\xff\xfe SUBNET UP\n"), Some(LogVerdict::SweepDone));
    }
}
