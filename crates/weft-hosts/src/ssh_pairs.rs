//! SSH reachability between every ordered pair of hosts: from host `i` (through its
//! [`HostRunner`]), `ssh -o BatchMode=yes -o ConnectTimeout=N -o StrictHostKeyChecking=yes
//! <the runner's own ssh options> -- <host j> true`. What a job launcher (mpirun, a Slurm
//! prolog, torchrun's SSH launchers) needs: no password, no prompt, no unknown host key.
//!
//! The probe runs under `sh -c` on the source host, which prints the inner ssh's exit status on
//! a marker line, so that "could not reach host i" (the outer runner failed) and "host i could
//! not reach host j" (the probe failed) are told apart: both are exit status 255 otherwise.

use std::time::Duration;

use crate::each::each_at_most;
use crate::runner::HostRunner;

/// The marker line the probe prints with the inner ssh's exit status.
const MARKER: &str = "weft-ssh-probe-rc=";

/// Probes in flight at once (sshd's default MaxStartups begins refusing at 10 unauthenticated
/// connections to one host).
const PARALLEL: usize = 8;

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `ssh ... dst true` exited 0.
    Reached,
    /// ssh ran on the source and failed: its exit status and what it said.
    Failed { status: i32, error: String },
    /// The probe could not be run on the source host at all.
    NotRun(String),
}

/// One ordered pair (indexes into the host list) and its outcome.
#[derive(Debug, Clone)]
pub struct PairResult {
    pub src: usize,
    pub dst: usize,
    pub outcome: Outcome,
}

/// The command run on the source host: `sh -c 'ssh "$@" </dev/null; echo MARKER$?' sh
/// OPTIONS -- DST true`.
pub fn probe_argv(dst: &str, ssh_options: &[String], connect_timeout: Duration) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        format!("ssh \"$@\" </dev/null; echo {MARKER}$?"),
        "sh".into(),
    ];
    for o in [
        "BatchMode=yes".to_string(),
        format!("ConnectTimeout={}", connect_timeout.as_secs().max(1)),
        "StrictHostKeyChecking=yes".into(),
    ] {
        v.push("-o".into());
        v.push(o);
    }
    v.extend(ssh_options.iter().cloned());
    v.extend(["--".into(), dst.to_string(), "true".into()]);
    v
}

/// Reads a probe's outcome from what the source host printed.
pub fn outcome(stdout: &str, stderr: &str) -> Option<Outcome> {
    let status: i32 = stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(MARKER))?
        .parse()
        .ok()?;
    if status == 0 {
        return Some(Outcome::Reached);
    }
    Some(Outcome::Failed {
        status,
        error: ssh_error(stderr),
    })
}

/// ssh's complaint, on one line: its non-empty stderr lines (the "Warning: Permanently
/// added" chatter left out), joined, at most 300 characters.
pub fn ssh_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
        .collect();
    let mut s = lines.join(" / ");
    if s.is_empty() {
        return "ssh failed and said nothing".into();
    }
    if s.chars().count() > 300 {
        s = s.chars().take(297).collect::<String>() + "...";
    }
    s
}

/// What to do about a failed probe from `src` to `dst`.
pub fn remedy(src: &str, dst: &str, status: i32, error: &str) -> String {
    let e = error.to_ascii_lowercase();
    if status == 127 || e.contains("ssh: not found") || e.contains("command not found") {
        format!("install the OpenSSH client on {src} (Debian: openssh-client)")
    } else if e.contains("host key verification failed")
        || e.contains("host key is known")
        || e.contains("remote host identification has changed")
    {
        format!(
            "add {dst}'s host key to {src}'s known_hosts: on {src}, `ssh-keyscan {dst} >> ~/.ssh/known_hosts` and compare the fingerprint with {dst}'s `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` (or distribute one known_hosts file to every host)"
        )
    } else if e.contains("permission denied") || e.contains("too many authentication failures") {
        format!(
            "authorize {src}'s key on {dst}: on {src}, `ssh-copy-id {dst}` (or append {src}'s ~/.ssh/id_ed25519.pub to {dst}'s ~/.ssh/authorized_keys); BatchMode allows no password"
        )
    } else if e.contains("connection refused") {
        format!(
            "start sshd on {dst} (`systemctl enable --now ssh`) and check the port it listens on"
        )
    } else if e.contains("could not resolve") || e.contains("name or service not known") {
        format!("make {dst} resolvable on {src} (/etc/hosts or DNS), or use its address")
    } else if e.contains("timed out") || e.contains("no route") || e.contains("unreachable") {
        format!(
            "check the management network between {src} and {dst}, and firewalls on port 22 (or the configured port)"
        )
    } else {
        format!(
            "run `ssh -v {dst} true` on {src} to see why; keys, known_hosts and sshd must allow it without a prompt"
        )
    }
}

/// Probes every ordered pair of `hosts` (`sources` run probes; every host of `targets` is
/// probed from each source but itself), at most [`PARALLEL`] at once, each bounded by
/// `connect_timeout` for ssh's connection and `bound` for the whole run on the source.
/// Results in (src, dst) order.
pub fn probe_all(
    hosts: &[Box<dyn HostRunner>],
    sources: &[usize],
    targets: &[usize],
    connect_timeout: Duration,
    bound: Duration,
) -> Vec<PairResult> {
    let pairs: Vec<(usize, usize)> = sources
        .iter()
        .flat_map(|&s| {
            targets
                .iter()
                .filter(move |&&d| d != s)
                .map(move |&d| (s, d))
        })
        .collect();
    let mut r: Vec<PairResult> = each_at_most(&pairs, PARALLEL, |&(s, d)| PairResult {
        src: s,
        dst: d,
        outcome: probe_one(hosts[s].as_ref(), hosts[d].name(), connect_timeout, bound),
    });
    r.sort_by_key(|p| (p.src, p.dst));
    r
}

/// One probe from `src` to `dst`.
pub fn probe_one(
    src: &dyn HostRunner,
    dst: &str,
    connect_timeout: Duration,
    bound: Duration,
) -> Outcome {
    let opts = src.ssh_options().unwrap_or_default();
    let argv = probe_argv(dst, &opts, connect_timeout);
    match src.run(&argv, &[], bound) {
        Err(e) => Outcome::NotRun(e.to_string()),
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout);
            let err = String::from_utf8_lossy(&o.stderr);
            outcome(&out, &err).unwrap_or_else(|| {
                Outcome::NotRun(format!(
                    "the probe did not run (exit {}): {}",
                    o.status,
                    ssh_error(&err)
                ))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Local;

    #[test]
    fn the_probe_is_strict_and_keeps_the_runners_options() {
        let v = probe_argv(
            "node2",
            &["-F".into(), "/etc/weft/ssh_config".into()],
            Duration::from_millis(2500),
        );
        let line = v.join(" ");
        assert!(line.contains("-o BatchMode=yes"), "{line}");
        assert!(line.contains("-o ConnectTimeout=2"), "{line}");
        assert!(line.contains("-o StrictHostKeyChecking=yes"), "{line}");
        assert!(
            line.ends_with("-F /etc/weft/ssh_config -- node2 true"),
            "{line}"
        );
    }

    #[test]
    fn outcomes_tell_the_inner_ssh_from_the_runner() {
        assert_eq!(outcome("weft-ssh-probe-rc=0\n", ""), Some(Outcome::Reached));
        assert_eq!(
            outcome(
                "weft-ssh-probe-rc=255\n",
                "No ED25519 host key is known for 10.0.0.2 and you have requested strict checking.\nHost key verification failed.\n"
            ),
            Some(Outcome::Failed {
                status: 255,
                error: "No ED25519 host key is known for 10.0.0.2 and you have requested strict checking. / Host key verification failed.".into()
            })
        );
        assert_eq!(outcome("", "ssh: connect to host n1: refused"), None);
    }

    #[test]
    fn remedies_follow_the_error() {
        assert!(remedy("a", "b", 255, "Host key verification failed.").contains("known_hosts"));
        assert!(
            remedy("a", "b", 255, "root@b: Permission denied (publickey).")
                .contains("ssh-copy-id b")
        );
        assert!(
            remedy(
                "a",
                "b",
                255,
                "ssh: connect to host b port 22: Connection refused"
            )
            .contains("start sshd on b")
        );
        assert!(remedy("a", "b", 127, "sh: 1: ssh: not found").contains("openssh-client"));
    }

    /// Through the local runner: a target that refuses connections fails with ssh's own
    /// message; the bound holds.
    #[test]
    fn a_refused_connection_is_a_failed_pair() {
        if std::process::Command::new("ssh")
            .arg("-V")
            .output()
            .is_err()
        {
            weft_netns::require::skip("a_refused_connection_is_a_failed_pair", "no ssh client");
            return;
        }
        // A port nobody listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let o = probe_one(
            &Local,
            &format!("ssh://127.0.0.1:{port}"),
            Duration::from_secs(2),
            Duration::from_secs(10),
        );
        match o {
            Outcome::Failed { status, error } => {
                assert_eq!(status, 255);
                assert!(error.contains("Connection refused"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
}
