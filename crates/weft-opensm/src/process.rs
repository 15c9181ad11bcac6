//! Running an external program with a deadline.
//!
//! Every diagnostic tool and every remote command goes through [`run_bounded`], so no
//! call into another program can hang weft: past the deadline the child is killed and
//! the caller gets [`ProcessError::TimedOut`] naming the program.

use std::io::Read;
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
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
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
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(ProcessError::Failed {
            program: program.to_string(),
            status: status.to_string(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
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
}
