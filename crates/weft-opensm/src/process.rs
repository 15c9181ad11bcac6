//! Running an external program with a deadline.
//!
//! Every diagnostic tool and every remote command goes through [`run_bounded`], so no
//! call into another program can hang weft: past the deadline the child is killed and
//! the caller gets [`ProcessError::TimedOut`] naming the program.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
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

/// Runs `program args` to completion or until `inv.timeout` passes; returns stdout.
///
/// Output is drained on threads while waiting, so a chatty child cannot block on a full
/// pipe and turn into a false timeout.
pub fn run_bounded(program: &str, args: &[&str], inv: &Invocation) -> Result<String, ProcessError> {
    run_bounded_bytes(program, args, None, inv)
        .map(|out| String::from_utf8_lossy(&out).into_owned())
}

/// [`run_bounded`] with `input` fed to the child's stdin (then closed) and stdout returned
/// as bytes, unchanged. Without `input` the child's stdin is `/dev/null`.
///
/// The input is written on its own thread, so a child that stops reading cannot block the
/// deadline; a child that exits before reading everything only shows in its exit status.
/// The deadline also bounds the wait for the end of the child's output.
pub fn run_bounded_bytes(
    program: &str,
    args: &[&str],
    input: Option<&[u8]>,
    inv: &Invocation,
) -> Result<Vec<u8>, ProcessError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in inv.env {
        cmd.env(k, v);
    }
    if let Some(dir) = inv.cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        program: program.to_string(),
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
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= inv.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProcessError::TimedOut {
                    program: program.to_string(),
                    timeout: inv.timeout,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(source) => {
                return Err(ProcessError::Io {
                    program: program.to_string(),
                    source,
                });
            }
        }
    };
    // The feeder is not joined: it ends when every reader of the pipe is gone, which a
    // process the child passed the pipe to (an ssh control master) may delay.
    drop(feeder);
    // The pipes reach end of file when every holder of their write ends is gone: the child
    // and whatever it left running with them. Waiting for that is bounded too.
    while !(out.is_finished() && err.is_finished()) {
        if start.elapsed() >= inv.timeout {
            return Err(ProcessError::TimedOut {
                program: format!("{program} (a process it started holds its output open)"),
                timeout: inv.timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(ProcessError::Failed {
            program: program.to_string(),
            status: status.to_string(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    Ok(stdout)
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
        let inv = Invocation {
            timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let start = Instant::now();
        let err = run_bounded("sh", &["-c", "sleep 3 & echo started"], &inv).unwrap_err();
        assert!(matches!(err, ProcessError::TimedOut { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
