//! The one place this crate touches `weft-hosts`: how hosts are reached (local, SSH,
//! `ip netns exec`), bounded runs, killing a process group, the host-to-host SSH probe, and
//! the facts and interface roles of every host. Everything else in the crate goes through
//! these names.

use std::process::{Child, Command, Output};
use std::time::Duration;

pub use weft_hosts::facts::{HostFacts, ipv4};
pub use weft_hosts::remote::Remote;
pub use weft_hosts::runner::{HostRunner, parse_hosts_with, shell_quote};
pub use weft_hosts::ssh_pairs::{Outcome, PairResult, probe_all, remedy};
pub use weft_hosts::{HostsError, IfChoice, Roles, each_host, roles_for};

use crate::LaunchError;

/// Runs `argv` on `host`, bounded by `timeout`; the output whatever the exit status.
pub fn run(
    host: &dyn HostRunner,
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<Output, LaunchError> {
    Ok(host.run(argv, env, timeout)?)
}

/// Runs `sh -c SCRIPT sh ARGS...` on `host`; its stdout when it exits 0, else an error with
/// its stderr that names the host and `what`.
pub fn sh(
    host: &dyn HostRunner,
    what: &str,
    script: &str,
    args: &[String],
    timeout: Duration,
) -> Result<String, LaunchError> {
    let mut argv = vec!["sh".into(), "-c".into(), script.into(), "sh".into()];
    argv.extend(args.iter().cloned());
    let o = run(host, &argv, &[], timeout)?;
    if !o.status.success() {
        return Err(LaunchError::Host {
            host: host.name().to_string(),
            msg: format!(
                "{what}: exit {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// A `Command` that runs `argv` on `host` with `env`, in its own process group, for callers
/// that wire its stdio themselves (long-lived helpers: `sync-serve`, `run-node`).
pub fn command(host: &dyn HostRunner, argv: &[String], env: &[(String, String)]) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut c = host.command(argv, env);
    c.process_group(0);
    c
}

/// SIGKILL to `child`'s process group (it was started by [`command`]).
pub fn kill_group(child: &Child) {
    weft_hosts::runner::kill_group(child);
}

/// Runs `cmd` on this machine in its own process group, killed after `timeout`.
pub fn run_local(
    cmd: std::process::Command,
    timeout: Duration,
) -> Result<Output, weft_hosts::runner::ProcessError> {
    weft_hosts::runner::run_bounded(cmd, timeout)
}

/// The doctor's facts of this host (or namespace).
pub fn local_facts() -> Result<HostFacts, LaunchError> {
    Ok(weft_hosts::facts::gather(std::path::Path::new("/"))?)
}

/// Every host of `list` (`a,b`, `netns:ns1`, `ssh:node1`), reached `via`, with `ssh_extra`
/// on every SSH host.
pub fn parse(
    list: &str,
    via: &str,
    ssh_extra: &[String],
) -> Result<Vec<Box<dyn HostRunner>>, LaunchError> {
    Ok(parse_hosts_with(list, via, ssh_extra)?)
}

/// Gathers the doctor's facts of every host at once (`weft bench host-facts` on each).
pub fn facts_all(
    hosts: &[Box<dyn HostRunner>],
    remote: &Remote,
) -> Vec<Result<HostFacts, LaunchError>> {
    weft_hosts::remote::gather_all(hosts, remote)
        .into_iter()
        .map(|r| r.map(|g| g.facts).map_err(LaunchError::from))
        .collect()
}

/// `path` for host `name`: `{host}` replaced by the name (for hosts that share one
/// filesystem: tests on namespaces, NFS homes).
pub fn per_host(path: &str, name: &str) -> String {
    path.replace("{host}", name)
}

/// A path for a remote shell: a leading `~/` becomes `"$HOME"/`, the rest quoted.
pub fn sh_path(path: &str) -> String {
    match path.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
        None => shell_quote(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_per_host_and_for_the_shell() {
        assert_eq!(per_host("/tmp/{host}/m", "h1"), "/tmp/h1/m");
        assert_eq!(
            sh_path("~/.ssh/known hosts"),
            "\"$HOME\"/'.ssh/known hosts'"
        );
        assert_eq!(sh_path("/etc/x"), "/etc/x");
    }
}
