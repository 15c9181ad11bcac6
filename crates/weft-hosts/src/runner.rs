//! `HostRunner`: the seam between the tools and the hosts they look at. One implementation per
//! way of reaching a host: [`Local`] (this machine), [`Ssh`] (`ssh -o BatchMode=yes`), and
//! [`Netns`] (`ip netns exec`, how the tests put "hosts" on one machine). Everything the bench
//! and the doctor, `weft run`, `weft sync` and `weft mesh` run on a host goes through here, with
//! a deadline.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::HostsError;

/// The controller's tokens: never inherited by what runs on a host. An SSH host gets only
/// the variables a command passes; a local or namespace "host" would otherwise inherit this
/// process's whole environment, so [`Local`] and [`Netns`] remove these (a rank or a helper
/// has no use for an admin token; `--report-to` is sent by the command itself).
pub const WITHHELD_ENV: &[&str] = &["WEFT_TOKEN", "WEFT_ADMIN_TOKEN"];

/// Runs programs on one host.
pub trait HostRunner: Send + Sync {
    /// How the host is named in findings (`node2`, `weftns-…-h1`, `local`).
    fn name(&self) -> &str;
    /// How to reach it (`local`, `ssh`, `netns`).
    fn kind(&self) -> &'static str;
    /// A `Command` that runs `argv` on the host with `env` set.
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command;

    /// The extra `ssh` options (`-F FILE`, `-i KEY`, `-o K=V`) this runner reaches its host
    /// with, when it reaches it over SSH; `None` otherwise. The doctor's host-to-host SSH check
    /// passes them on, so that the hosts use the same configuration.
    fn ssh_options(&self) -> Option<Vec<String>> {
        None
    }

    /// Runs `argv` and returns its output whatever the exit status; kills it (and its process
    /// group) after `timeout`.
    fn run(
        &self,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<Output, HostsError> {
        run_bounded(self.command(argv, env), timeout).map_err(|msg| HostsError::Host {
            host: self.name().to_string(),
            msg: format!("{}: {msg}", argv.join(" ")),
        })
    }

    /// Starts `argv` in the background, stdin null, stdout as given, stderr inherited.
    fn spawn(
        &self,
        argv: &[String],
        env: &[(String, String)],
        stdout: Stdio,
    ) -> Result<Child, HostsError> {
        let mut c = self.command(argv, env);
        c.stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::inherit());
        c.process_group(0);
        c.spawn().map_err(|e| HostsError::Host {
            host: self.name().to_string(),
            msg: format!("starting {}: {e}", argv.join(" ")),
        })
    }
}

/// Starts `argv` in the background, tethered: stdin is a pipe the caller holds in the
/// returned `Child`, so that a helper that watches its stdin (`p2p-serve`) ends when the
/// caller closes it, exits, or is killed; over SSH the session's end closes it too.
pub fn spawn_tethered(
    host: &dyn HostRunner,
    argv: &[String],
    stdout: Stdio,
) -> Result<Child, HostsError> {
    let mut c = host.command(argv, &[]);
    c.stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::inherit());
    c.process_group(0);
    c.spawn().map_err(|e| HostsError::Host {
        host: host.name().to_string(),
        msg: format!("starting {}: {e}", argv.join(" ")),
    })
}

/// This machine.
#[derive(Debug, Clone)]
pub struct Local;

impl HostRunner for Local {
    fn name(&self) -> &str {
        "local"
    }
    fn kind(&self) -> &'static str {
        "local"
    }
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command {
        let mut c = Command::new(&argv[0]);
        for k in WITHHELD_ENV {
            c.env_remove(k);
        }
        c.args(&argv[1..]).envs(env.iter().map(|(k, v)| (k, v)));
        c
    }
}

/// A host reached with `ssh -o BatchMode=yes` (keys, no passwords: a prompt would hang).
#[derive(Debug, Clone)]
pub struct Ssh {
    /// `host` or `user@host`, as `ssh` takes it.
    pub host: String,
    /// Extra `ssh` arguments (`-p 2222`, `-i key`, `-o UserKnownHostsFile=...`).
    pub extra: Vec<String>,
}

/// Quotes one word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

impl HostRunner for Ssh {
    fn name(&self) -> &str {
        &self.host
    }
    fn kind(&self) -> &'static str {
        "ssh"
    }
    fn ssh_options(&self) -> Option<Vec<String>> {
        Some(self.extra.clone())
    }
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command {
        let mut line = String::new();
        if !env.is_empty() {
            line.push_str("env");
            for (k, v) in env {
                line.push(' ');
                line.push_str(&shell_quote(&format!("{k}={v}")));
            }
            line.push(' ');
        }
        line.push_str(
            &argv
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        );
        let mut c = Command::new("ssh");
        c.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])
            .args(&self.extra)
            .arg(&self.host)
            .arg("--")
            .arg(line);
        c
    }
}

/// A network namespace on this machine, as a host (`ip netns exec NAME ...`).
#[derive(Debug, Clone)]
pub struct Netns {
    pub ns: String,
}

impl HostRunner for Netns {
    fn name(&self) -> &str {
        &self.ns
    }
    fn kind(&self) -> &'static str {
        "netns"
    }
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command {
        let mut c = Command::new("ip");
        for k in WITHHELD_ENV {
            c.env_remove(k);
        }
        c.args(["netns", "exec", &self.ns])
            .args(argv)
            .envs(env.iter().map(|(k, v)| (k, v)));
        c
    }
}

/// Parses a host list: `a,b,c` reached `via` (`ssh`, `netns`, `local`), or entries with their
/// own prefix (`ssh:node1`, `netns:ns1`, `local`).
pub fn parse_hosts(list: &str, via: &str) -> Result<Vec<Box<dyn HostRunner>>, HostsError> {
    parse_hosts_with(list, via, &[])
}

/// [`parse_hosts`], with `ssh_extra` (`-F FILE`, `-o K=V`, ...) on every host reached by SSH.
pub fn parse_hosts_with(
    list: &str,
    via: &str,
    ssh_extra: &[String],
) -> Result<Vec<Box<dyn HostRunner>>, HostsError> {
    let items: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    hosts_from(&items, via, ssh_extra)
}

/// Hosts from a list already split (a controller group's member names, or the entries of
/// [`parse_hosts_with`]): each reached `via`, unless it carries its own prefix (`ssh:node1`,
/// `netns:ns1`, `local`).
pub fn hosts_from<S: AsRef<str>>(
    items: &[S],
    via: &str,
    ssh_extra: &[String],
) -> Result<Vec<Box<dyn HostRunner>>, HostsError> {
    let mut v: Vec<Box<dyn HostRunner>> = Vec::new();
    for item in items.iter().map(AsRef::as_ref) {
        let (kind, name) = match item.split_once(':') {
            Some((k @ ("ssh" | "netns" | "local"), n)) => (k, n),
            _ if item == "local" => ("local", item),
            _ => (via, item),
        };
        if name.is_empty() {
            return Err(HostsError::Usage(format!("host {item:?} has no name")));
        }
        v.push(match kind {
            "ssh" => Box::new(Ssh {
                host: name.to_string(),
                extra: ssh_extra.to_vec(),
            }),
            "netns" => Box::new(Netns {
                ns: name.to_string(),
            }),
            "local" => Box::new(Local),
            other => {
                return Err(HostsError::Usage(format!(
                    "unknown way to reach hosts {other:?} (ssh, netns, local)"
                )));
            }
        });
    }
    if v.is_empty() {
        return Err(HostsError::Usage("empty host list".into()));
    }
    Ok(v)
}

/// The `ssh` options of `--ssh-config FILE` (`-F FILE`) and each `--ssh-option K=V`
/// (`-o K=V`), for [`parse_hosts_with`].
pub fn ssh_extra(config: Option<&std::path::Path>, options: &[String]) -> Vec<String> {
    let mut extra: Vec<String> = Vec::new();
    if let Some(f) = config {
        extra.extend(["-F".to_string(), f.display().to_string()]);
    }
    for o in options {
        extra.extend(["-o".to_string(), o.clone()]);
    }
    extra
}

/// Whether any of `hosts` is reached over SSH: then weft runs there from the hosts' own
/// install (`--remote-weft`); namespace and local hosts share this machine's files and run
/// this very binary.
pub fn any_ssh(hosts: &[Box<dyn HostRunner>]) -> bool {
    hosts.iter().any(|h| h.kind() == "ssh")
}

/// The `weft` binary to start on `hosts`: `remote` when [`any_ssh`], else this process's own
/// executable.
pub fn remote_exe(hosts: &[Box<dyn HostRunner>], remote: &str) -> std::io::Result<String> {
    if any_ssh(hosts) {
        Ok(remote.to_string())
    } else {
        Ok(std::env::current_exe()?.display().to_string())
    }
}

/// Runs `cmd` in its own process group with piped output; kills the group after `timeout`,
/// which also bounds the wait for its pipes ([`weft_proc::run`]).
pub fn run_bounded(cmd: Command, timeout: Duration) -> Result<Output, ProcessError> {
    weft_proc::run(cmd, None, timeout, weft_proc::Kill::Group)
}

pub use weft_proc::{ProcessError, kill_group, wait_until};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_namespace_hosts_do_not_inherit_the_controllers_tokens() {
        let argv = ["weft".to_string(), "bench".into()];
        let env = [("WEFT_PLUGIN".to_string(), "/p.so".to_string())];
        let ns = Netns { ns: "ns1".into() };
        for c in [Local.command(&argv, &env), ns.command(&argv, &env)] {
            let envs: Vec<(String, Option<String>)> = c
                .get_envs()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.map(|v| v.to_string_lossy().into_owned()),
                    )
                })
                .collect();
            for k in WITHHELD_ENV {
                assert!(envs.contains(&(k.to_string(), None)), "{k}: {envs:?}");
            }
            assert!(envs.contains(&("WEFT_PLUGIN".into(), Some("/p.so".into()))));
        }
    }

    #[test]
    fn ssh_command_line_quotes_arguments_and_env() {
        let s = Ssh {
            host: "node1".into(),
            extra: vec![],
        };
        let c = s.command(
            &["weft".into(), "doctor".into(), "it's".into()],
            &[("WEFT_DATA_IFNAME".into(), "^docker,lo".into())],
        );
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(
            args.last().unwrap(),
            "env 'WEFT_DATA_IFNAME=^docker,lo' weft doctor 'it'\\''s'"
        );
        assert!(args.contains(&"BatchMode=yes".to_string()));
    }

    #[test]
    fn host_lists_take_prefixes() {
        let h = parse_hosts("a, netns:ns1,local", "ssh").unwrap();
        let kinds: Vec<_> = h.iter().map(|h| (h.kind(), h.name().to_string())).collect();
        assert_eq!(
            kinds,
            [
                ("ssh", "a".into()),
                ("netns", "ns1".into()),
                ("local", "local".into())
            ]
        );
        assert!(parse_hosts("", "ssh").is_err());
        let h = parse_hosts_with("a,netns:b", "ssh", &["-F".into(), "cfg".into()]).unwrap();
        assert_eq!(h[0].ssh_options(), Some(vec!["-F".into(), "cfg".into()]));
        assert_eq!(h[1].ssh_options(), None);
        // A group's member names, taken as they are (no second split on commas).
        let g = hosts_from(&["node1", "netns:ns2"], "ssh", &[]).unwrap();
        assert_eq!((g[0].kind(), g[0].name()), ("ssh", "node1"));
        assert_eq!((g[1].kind(), g[1].name()), ("netns", "ns2"));
        assert!(hosts_from(&["ssh:"], "ssh", &[]).is_err());
        assert!(hosts_from::<&str>(&[], "ssh", &[]).is_err());
        assert_eq!(
            ssh_extra(Some(std::path::Path::new("cfg")), &["Port=2222".into()]),
            ["-F", "cfg", "-o", "Port=2222"]
        );
        assert_eq!(remote_exe(&h, "/opt/weft").unwrap(), "/opt/weft");
        let ns = parse_hosts("netns:a,local", "ssh").unwrap();
        assert!(!any_ssh(&ns));
        assert_eq!(
            remote_exe(&ns, "/opt/weft").unwrap(),
            std::env::current_exe().unwrap().display().to_string()
        );
    }

    #[test]
    fn bounded_run_is_bounded_including_its_pipes() {
        // A grandchild holding stdout (an ssh control master) does not stretch the deadline.
        let t0 = std::time::Instant::now();
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 5 & echo started"]);
        let r = run_bounded(c, Duration::from_millis(300));
        assert!(r.unwrap_err().to_string().contains("killed"));
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn bounded_run_kills_a_hung_command() {
        use std::time::Instant;
        let t0 = Instant::now();
        let mut c = Command::new("sleep");
        c.arg("30");
        let r = run_bounded(c, Duration::from_millis(200));
        assert!(r.unwrap_err().to_string().contains("killed"));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
