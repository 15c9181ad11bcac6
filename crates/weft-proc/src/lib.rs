//! Running an external program with a deadline: the one bounded process runner of weft.
//!
//! Every diagnostic tool and every command weft runs on a host (ssh, `ip netns exec`,
//! `opensm`, `nvidia-smi`, weft's own helpers) goes through [`run`] or its wrappers, so no call
//! into another program can hang weft: past the deadline the child (or its whole process
//! group) is killed and the caller gets [`ProcessError::TimedOut`] naming the program. The
//! deadline bounds the pipes too: a grandchild that keeps the child's stdout open (an ssh
//! control master, a daemon started in the background) does not stretch it.
//!
//! It is for short commands whose output the caller wants whole. It is not a process
//! supervisor: long-lived children are the caller's, with [`kill_group`] and [`wait_until`]
//! to end them.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Why a bounded program run failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{program}` did not finish within {timeout:?} and was killed")]
    TimedOut { program: String, timeout: Duration },
    #[error("`{program}` exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
    #[error("`{program}`: {source}")]
    Io {
        program: String,
        source: std::io::Error,
    },
}

/// How to run one program: its environment additions and working directory.
#[derive(Debug, Clone, Default)]
pub struct Invocation<'a> {
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub timeout: Duration,
}

/// What the deadline kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// The child only; it stays in the caller's process group (a terminal's Ctrl-C reaches
    /// it as it reaches the caller).
    Child,
    /// The child's own process group (the child is started as its leader): everything it
    /// started goes with it.
    Group,
}

/// Runs `cmd` to completion or until `timeout`, with `input` fed to its stdin (then closed;
/// without it stdin is `/dev/null`), and returns its output whatever its exit status.
///
/// Output is drained on threads while waiting, so a chatty child cannot block on a full pipe
/// and turn into a false timeout; the input is written on its own thread, so a child that
/// stops reading cannot block the deadline. After the child exits, the wait for the end of
/// its output is bounded by the same deadline.
pub fn run(
    mut cmd: Command,
    input: Option<&[u8]>,
    timeout: Duration,
    kill: Kill,
) -> Result<Output, ProcessError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if kill == Kill::Group {
        cmd.process_group(0);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        program: program.clone(),
        source,
    })?;
    let feeder = match (child.stdin.take(), input) {
        (Some(mut stdin), Some(bytes)) => {
            let bytes = bytes.to_vec();
            Some(std::thread::spawn(move || {
                // EPIPE when the child exits early; its exit status tells the caller.
                let _ = stdin.write_all(&bytes);
                // Dropping `stdin` here closes the pipe: the child sees end of input.
            }))
        }
        _ => None,
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                // A read error leaves what was read so far; the exit status tells the rest.
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stop = |child: &mut Child| {
        match kill {
            Kill::Group => kill_group(child),
            Kill::Child => {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= timeout => {
                stop(&mut child);
                return Err(ProcessError::TimedOut { program, timeout });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(source) => {
                stop(&mut child);
                return Err(ProcessError::Io { program, source });
            }
        }
    };
    // The feeder is not joined: it ends when every reader of the pipe is gone, which a
    // process the child passed the pipe to (an ssh control master) may delay.
    drop(feeder);
    // The pipes reach end of file when every holder of their write ends is gone: the child
    // and whatever it left running with them. Waiting for that is bounded too.
    while !(out.is_finished() && err.is_finished()) {
        if start.elapsed() >= timeout {
            if kill == Kill::Group {
                kill_group(&child);
            }
            return Err(ProcessError::TimedOut {
                program: format!("{program} (a process it started holds its output open)"),
                timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Runs `program args` to completion or until `inv.timeout` passes; returns stdout.
pub fn run_bounded(program: &str, args: &[&str], inv: &Invocation) -> Result<String, ProcessError> {
    run_bounded_bytes(program, args, None, inv)
        .map(|out| String::from_utf8_lossy(&out).into_owned())
}

/// [`run_bounded`] with `input` fed to the child's stdin (then closed) and stdout returned
/// as bytes, unchanged; a non-zero exit is [`ProcessError::Failed`] with its stderr. Without
/// `input` the child's stdin is `/dev/null`. Only the child is killed at the deadline.
pub fn run_bounded_bytes(
    program: &str,
    args: &[&str],
    input: Option<&[u8]>,
    inv: &Invocation,
) -> Result<Vec<u8>, ProcessError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in inv.env {
        cmd.env(k, v);
    }
    if let Some(dir) = inv.cwd {
        cmd.current_dir(dir);
    }
    let o = run(cmd, input, inv.timeout, Kill::Child)?;
    if !o.status.success() {
        return Err(ProcessError::Failed {
            program: program.to_string(),
            status: o.status.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        });
    }
    Ok(o.stdout)
}

/// Kills `child`'s process group (it was started with `process_group(0)`).
pub fn kill_group(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain kill(2) on the process group the child leads; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Waits for `child` until `deadline`; kills its group and returns `None` after it.
pub fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() > deadline => {
                kill_group(child);
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hanging_program_is_killed_at_the_deadline() {
        let inv = Invocation {
            timeout: Duration::from_millis(200),
            ..Default::default()
        };
        let start = Instant::now();
        let err = run_bounded("sleep", &["30"], &inv).unwrap_err();
        assert!(matches!(err, ProcessError::TimedOut { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failing_program_reports_its_stderr() {
        let inv = Invocation {
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let err = run_bounded("sh", &["-c", "echo nope >&2; exit 3"], &inv).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nope") && text.contains('3'), "{text}");
    }

    #[test]
    fn stdout_and_env_arrive() {
        let env = [("WEFT_T".to_string(), "x7".to_string())];
        let inv = Invocation {
            env: &env,
            cwd: None,
            timeout: Duration::from_secs(5),
        };
        assert_eq!(
            run_bounded("sh", &["-c", "echo $WEFT_T"], &inv).unwrap(),
            "x7\n"
        );
    }

    #[test]
    fn input_reaches_stdin_and_bytes_come_back_unchanged() {
        let inv = Invocation {
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let input = [0xffu8, b'a', 0, b'\n'];
        let out = run_bounded_bytes("cat", &[], Some(&input), &inv).unwrap();
        assert_eq!(out, input);
    }

    #[test]
    fn a_grandchild_holding_stdout_open_cannot_stretch_the_deadline() {
        for kill in [Kill::Child, Kill::Group] {
            let mut c = Command::new("sh");
            c.args(["-c", "sleep 3 & echo started"]);
            let start = Instant::now();
            let err = run(c, None, Duration::from_millis(300), kill).unwrap_err();
            assert!(
                matches!(err, ProcessError::TimedOut { .. }),
                "{kill:?}: {err}"
            );
            assert!(start.elapsed() < Duration::from_secs(2), "{kill:?}");
        }
    }

    #[test]
    fn a_failed_exit_is_output_not_an_error_and_the_group_goes_at_the_deadline() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 4"]);
        let o = run(c, None, Duration::from_secs(5), Kill::Group).unwrap();
        assert_eq!(o.status.code(), Some(4));
        assert_eq!(
            (&o.stdout[..], &o.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
        // The group is killed: the grandchild writes its pid, then is gone.
        let d = std::env::temp_dir().join(format!("weft-proc-{}", std::process::id()));
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("sleep 30 & echo $! > {}; wait", d.display()));
        let err = run(c, None, Duration::from_millis(300), Kill::Group).unwrap_err();
        assert!(matches!(err, ProcessError::TimedOut { .. }), "{err}");
        let pid: i32 = std::fs::read_to_string(&d).unwrap().trim().parse().unwrap();
        let _ = std::fs::remove_file(&d);
        let gone = (0..100).any(|_| {
            // SAFETY: kill(2) with signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "));
            if alive {
                std::thread::sleep(Duration::from_millis(20));
            }
            !alive
        });
        assert!(gone, "grandchild {pid} outlived the deadline");
    }
}
