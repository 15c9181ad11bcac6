//! Worker processes inside namespace hosts, for the cluster tests: the parent side.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use weft_netns::Cluster;

use super::R;

/// A worker process in a host, with its output as a channel of lines. Killed on drop.
pub struct Worker {
    pub host: usize,
    pub child: Child,
    stdin: ChildStdin,
    pub lines: Receiver<String>,
}

impl Worker {
    pub fn spawn(c: &Cluster, host: usize, args: &[&str], env: &[(&str, &str)]) -> R<Worker> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = c
            .command(host, &exe.to_string_lossy())
            .map_err(|e| e.to_string())?;
        cmd.arg("--worker")
            .args(args)
            .env("WEFT_MGMT_IFNAME", "mgmt0")
            .env("WEFT_DATA_IFNAME", "data")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            host,
            child,
            stdin,
            lines,
        })
    }

    /// The next line starting with `prefix` (other lines are skipped; `ERR` fails).
    pub fn expect(&mut self, prefix: &str, within: Duration) -> R<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(l) if l.starts_with("ERR") => {
                    return Err(format!("host {}: {l}", self.host));
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "host {}: no {prefix:?} within {within:?}",
                        self.host
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("host {}: exited before {prefix:?}", self.host));
                }
            }
        }
    }

    pub fn send(&mut self, line: &str) -> R {
        writeln!(self.stdin, "{line}").map_err(|e| format!("host {}: {e}", self.host))
    }
}

impl Drop for Worker {
    /// Kills the worker, waits for it, and removes the shared-memory regions it left.
    ///
    /// libfabric's `shm` provider names its region after the creating process
    /// (`/dev/shm/<pid>:<n>:<m>`) and removes it only when the endpoint is closed, so a worker
    /// killed by a fault test leaves it behind. With `pid_max` at 32768 a later worker that
    /// gets the same pid then fails to enable its `shm` endpoint ("Device or resource busy").
    /// A job launcher cleans up after the processes it kills; so does this harness.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_shm_regions_of(self.child.id());
    }
}

/// Removes `/dev/shm/<pid>:*`, the `shm` provider's regions of the ended process `pid`.
fn remove_shm_regions_of(pid: u32) {
    let prefix = format!("{pid}:");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub fn counters(c: &Cluster, host: usize, ifname: &str) -> R<u64> {
    let (rx, tx) = c.counters(host, ifname).map_err(|e| e.to_string())?;
    Ok(rx + tx)
}
