//! Running external commands (`ip`, `tc`, programs inside a namespace) with a hard timeout.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::NetnsError;

/// Timeout for the harness's own `ip`/`tc` invocations.
pub(crate) const IP_TIMEOUT: Duration = Duration::from_secs(20);

/// Renders a command line for error messages.
pub(crate) fn render(program: &str, args: &[&str]) -> String {
    let mut s = String::from(program);
    for a in args {
        s.push(' ');
        if a.is_empty() || a.contains(char::is_whitespace) {
            s.push('\'');
            s.push_str(a);
            s.push('\'');
        } else {
            s.push_str(a);
        }
    }
    s
}

/// Spawns `cmd` in its own process group, feeds it `stdin` (if any), collects stdout and
/// stderr, and kills the whole process group if it has not exited after `timeout`.
///
/// `context` names what the command was for (e.g. "host 1 (weftns-…-h1)"); `line` is the
/// rendered command line. Both end up in errors.
pub(crate) fn run(
    mut cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
    context: &str,
    line: &str,
) -> Result<Output, NetnsError> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // Own process group, so a timeout can kill grandchildren too.
    .process_group(0);
    let mut child = cmd.spawn().map_err(|source| NetnsError::Spawn {
        context: context.to_string(),
        command: line.to_string(),
        source,
    })?;
    let deadline = Instant::now() + timeout;

    // Readers run on their own threads so a chatty child can never fill a pipe and stall.
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    let mut readers = 0;
    if let Some(mut out) = child.stdout.take() {
        let tx = tx.clone();
        readers += 1;
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            let _ = tx.send((true, buf));
        });
    }
    if let Some(mut err) = child.stderr.take() {
        let tx = tx.clone();
        readers += 1;
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            let _ = tx.send((false, buf));
        });
    }
    drop(tx);
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Small scripts (ip -batch) only; a write error shows up as the child's failure.
        let _ = pipe.write_all(data);
        // Dropping `pipe` closes the child's stdin.
    }

    let pid = Pid::from_raw(child.id() as i32);
    let mut sleep = Duration::from_millis(1);
    let status: ExitStatus = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                let _ = killpg(pid, Signal::SIGKILL);
                let _ = child.wait();
                return Err(NetnsError::Io {
                    context: format!("{context}: waiting for `{line}`"),
                    source,
                });
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = child.wait();
            return Err(NetnsError::Timeout {
                context: context.to_string(),
                command: line.to_string(),
                timeout,
            });
        }
        thread::sleep(sleep.min(deadline - now));
        sleep = (sleep * 2).min(Duration::from_millis(20));
    };

    // The child is gone; a daemonised grandchild might still hold the pipes open, so wait for
    // the readers only until the deadline (at least a short grace period).
    let grace = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(200));
    let reader_deadline = Instant::now() + grace;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for _ in 0..readers {
        let left = reader_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, b)) => stdout = b,
            Ok((false, b)) => stderr = b,
            Err(_) => break,
        }
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Like [`run`], but a non-zero exit status is an error carrying stderr.
pub(crate) fn run_ok(
    cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
    context: &str,
    line: &str,
) -> Result<Output, NetnsError> {
    let out = run(cmd, stdin, timeout, context, line)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(NetnsError::Command {
            context: context.to_string(),
            command: line.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Runs `program args` directly (not inside a namespace), failing on non-zero exit.
pub(crate) fn tool(
    context: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<Output, NetnsError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let line = match stdin {
        Some(s) => format!(
            "{} <<EOF\n{}EOF",
            render(program, args),
            String::from_utf8_lossy(s)
        ),
        None => render(program, args),
    };
    run_ok(cmd, stdin, IP_TIMEOUT, context, &line)
}
