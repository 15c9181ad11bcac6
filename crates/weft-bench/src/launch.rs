//! Starting the ranks of a collectives run: each rank's interfaces from the doctor's one
//! selection ([`rank_env`], over the facts gathered on every host by
//! [`remote_rank_env`]; loopback for local ranks, [`local_rank_env`]), the environment
//! every rank inherits ([`passed_env`]), each rank's command line ([`rank_commands`]), and
//! the ranks started on their hosts and waited for, bounded ([`run_ranks`]). The binary
//! only parses flags and prints what this returns.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Instant;

use weft_hosts::remote::{Remote, gather_all};
use weft_hosts::runner::{kill_group, wait_until};
use weft_hosts::{HostFacts, HostRunner, IfChoice, Roles, roles_for};

use crate::BenchError;

/// Environment variables for one process, in order.
pub type Env = Vec<(String, String)>;

/// The port a rendezvous over SSH listens on by default, on the first host.
pub const RENDEZVOUS_PORT: u16 = 29600;

/// The rendezvous address when none is given: the first host's name at
/// [`RENDEZVOUS_PORT`] when the ranks are reached over SSH; `None` otherwise (a runner
/// like `ip netns exec` has no name that the other ranks can dial).
pub fn default_rendezvous(first: &dyn HostRunner) -> Option<String> {
    (first.kind() == "ssh").then(|| format!("{}:{RENDEZVOUS_PORT}", first.name()))
}

/// What every rank inherits from the launcher's environment: the `WEFT_*` and `NCCL_*`
/// variables, but not `WEFT_CONFIG` (the launcher's file) nor the interface variables,
/// which are each rank's own, nor the controller's tokens (`WEFT_TOKEN`, `WEFT_ADMIN_TOKEN`:
/// no rank needs them, and over SSH they would be in the remote command line; local and
/// namespace runners withhold them from the inherited environment too,
/// [`weft_hosts::runner::WITHHELD_ENV`]).
pub fn passed_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.into_iter()
        .filter(|(k, _)| k.starts_with("WEFT_") || k.starts_with("NCCL_"))
        .filter(|(k, _)| {
            !["WEFT_CONFIG", "WEFT_MGMT_IFNAME", "WEFT_DATA_IFNAME"].contains(&k.as_str())
                && !weft_hosts::runner::WITHHELD_ENV.contains(&k.as_str())
        })
        .collect()
}

/// The interfaces of `n` ranks on this machine: loopback unless `--data-if`/`--mgmt-if`
/// say otherwise (given as they are, in the plugin's syntax).
pub fn local_rank_env(
    n: usize,
    data_if: Option<&str>,
    mgmt_if: Option<&str>,
) -> Vec<Vec<(String, String)>> {
    let v = vec![
        (
            "WEFT_MGMT_IFNAME".to_string(),
            mgmt_if.unwrap_or("=lo").to_string(),
        ),
        (
            "WEFT_DATA_IFNAME".to_string(),
            data_if.unwrap_or("=lo").to_string(),
        ),
    ];
    vec![v; n]
}

/// The interfaces of each rank's host, by exact name: the facts gathered on every host
/// (through `remote`), the roles doctor and p2p find from them (`--data-if`/`--mgmt-if`
/// or the defaults), and [`rank_env`].
pub fn remote_rank_env(
    runners: &[Box<dyn HostRunner>],
    remote: &Remote,
    data_if: Option<&str>,
    mgmt_if: Option<&str>,
) -> Result<Vec<Vec<(String, String)>>, BenchError> {
    let gathered = gather_all(runners, remote)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let choice = IfChoice::parse(mgmt_if, data_if)?;
    let all: Vec<&HostFacts> = gathered.iter().map(|g| &g.facts).collect();
    let names: Vec<&str> = runners.iter().map(|r| r.name()).collect();
    rank_env(&names, roles_for(&all, &choice), mgmt_if)
}

/// What every rank runs: the `weft` binary, the worker's own flags, and its place in
/// the run.
#[derive(Debug, Clone)]
pub struct RankCommand<'a> {
    /// The `weft` binary where the ranks run.
    pub exe: &'a str,
    /// The flags of `weft bench collectives` that every rank gets (sizes, ops, ...).
    pub worker_args: Vec<String>,
    /// Rank 0's address.
    pub rendezvous: &'a str,
    /// The plugin to load, if one was found or given.
    pub plugin: Option<&'a Path>,
    /// Whether each rank is told its host's name (`--rank-name`), for the reports.
    pub named: bool,
}

/// Each rank's command line and environment: `env` for all, with the rank's own
/// interfaces (`per_rank`, in rank order) added.
pub fn rank_commands(
    runners: &[Box<dyn HostRunner>],
    cmd: &RankCommand<'_>,
    env: &[(String, String)],
    per_rank: &[Vec<(String, String)>],
) -> (Vec<Vec<String>>, Vec<Env>) {
    let n = runners.len();
    let mut argvs = Vec::with_capacity(n);
    let mut envs = Vec::with_capacity(n);
    for (rank, r) in runners.iter().enumerate() {
        let mut e = env.to_vec();
        e.extend(per_rank.get(rank).into_iter().flatten().cloned());
        let mut argv = vec![cmd.exe.to_string()];
        argv.extend(cmd.worker_args.iter().cloned());
        argv.extend([
            "--rank".into(),
            rank.to_string(),
            "--nranks".into(),
            n.to_string(),
            "--rendezvous".into(),
            cmd.rendezvous.to_string(),
        ]);
        if let Some(p) = cmd.plugin {
            argv.extend(["--plugin".into(), p.display().to_string()]);
        }
        if cmd.named {
            argv.extend(["--rank-name".into(), r.name().to_string()]);
        }
        argvs.push(argv);
        envs.push(e);
    }
    (argvs, envs)
}

/// `WEFT_DATA_IFNAME` and `WEFT_MGMT_IFNAME` for each rank's host, by exact name, from the
/// roles doctor and p2p find (`roles`, one per host, in rank order). A host without a data
/// interface with an IPv4 address is an error naming it; without a management interface the
/// `--mgmt-if` given (`mgmt_flag`) is passed on as it is, else the plugin's default.
pub fn rank_env(
    names: &[&str],
    roles: Vec<Roles<'_>>,
    mgmt_flag: Option<&str>,
) -> Result<Vec<Vec<(String, String)>>, BenchError> {
    let mut out = Vec::new();
    for (name, role) in names.iter().zip(roles) {
        let data: Vec<String> = role.rails().into_iter().map(|(d, _)| d).collect();
        if data.is_empty() {
            return Err(BenchError::Host {
                host: name.to_string(),
                msg: "no data interface with an IPv4 address (see --data-if)".into(),
            });
        }
        let mut v = vec![(
            "WEFT_DATA_IFNAME".to_string(),
            format!("={}", data.join(",")),
        )];
        match (role.mgmt, mgmt_flag) {
            (Some((m, _)), _) => v.push(("WEFT_MGMT_IFNAME".into(), format!("={}", m.name))),
            (None, Some(m)) => v.push(("WEFT_MGMT_IFNAME".into(), m.to_string())),
            (None, None) => {}
        }
        out.push(v);
    }
    Ok(out)
}

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankEnd {
    /// One of weft's own exit codes (0 ok, 1 check failed, 2 usage or environment).
    Code(u8),
    /// Anything else (a signal, ssh's 255): the environment's fault.
    Other {
        status: String,
        /// Exit 255 through SSH: ssh itself could not run the rank there.
        ssh_failed: bool,
    },
    /// Still running at the deadline; killed.
    TimedOut,
}

/// Starts rank `r` with `argv[r]` and `env[r]` on `runners[r]` (rank 0's stdout to
/// `lead_out`: the launcher's own, or a pipe it reads; the others' discarded), waits for all
/// of them until `deadline`, and kills every rank's process group when one ended badly or
/// ran past it. Returns how each ended, in rank order.
pub fn run_ranks(
    runners: &[Box<dyn HostRunner>],
    argv: &[Vec<String>],
    env: &[Vec<(String, String)>],
    lead_out: Stdio,
    deadline: Instant,
) -> Result<Vec<RankEnd>, BenchError> {
    let mut kids = Vec::new();
    let mut lead_out = Some(lead_out);
    for r in runners {
        // Rank 0 comes first: it takes `lead_out`.
        let out = lead_out.take().unwrap_or_else(Stdio::null);
        let empty = Vec::new();
        let rank = kids.len();
        match r.spawn(&argv[rank], env.get(rank).unwrap_or(&empty), out) {
            Ok(k) => kids.push(k),
            Err(e) => {
                for k in &mut kids {
                    kill_group(k);
                }
                return Err(e.into());
            }
        }
    }
    let mut ends = Vec::new();
    for (rank, k) in kids.iter_mut().enumerate() {
        ends.push(match wait_until(k, deadline) {
            Some(st) => end_of(st, runners[rank].kind() == "ssh"),
            None => RankEnd::TimedOut,
        });
    }
    if ends.iter().any(|e| !matches!(e, RankEnd::Code(0..=1))) {
        for k in &mut kids {
            kill_group(k);
        }
    }
    Ok(ends)
}

fn end_of(st: ExitStatus, over_ssh: bool) -> RankEnd {
    match st.code() {
        Some(c @ 0..=2) => RankEnd::Code(c as u8),
        c => RankEnd::Other {
            status: st.to_string(),
            ssh_failed: over_ssh && c == Some(255),
        },
    }
}

/// The run's exit code: rank 0's own code, raised to 2 (environment) by any rank that ended
/// otherwise than with one of weft's codes, timed out, or exited 2.
pub fn exit_code(ends: &[RankEnd]) -> u8 {
    let mut code = 0;
    for (rank, e) in ends.iter().enumerate() {
        let c = match e {
            RankEnd::Code(c) => *c,
            RankEnd::Other { .. } | RankEnd::TimedOut => 2,
        };
        if rank == 0 || c == 2 {
            code = code.max(c);
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_gets_its_place_its_interfaces_and_the_launchers_weft_and_nccl_variables() {
        let vars = [
            ("WEFT_BACKEND", "ofi"),
            ("NCCL_DEBUG", "INFO"),
            ("WEFT_CONFIG", "/etc/weft.toml"),
            ("WEFT_DATA_IFNAME", "eth9"),
            ("WEFT_TOKEN", "wfa_secret"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = passed_env(vars);
        assert_eq!(
            env,
            [
                ("WEFT_BACKEND".to_string(), "ofi".to_string()),
                ("NCCL_DEBUG".to_string(), "INFO".to_string())
            ]
        );
        let runners: Vec<Box<dyn HostRunner>> = vec![
            Box::new(weft_hosts::runner::Local),
            Box::new(weft_hosts::runner::Local),
        ];
        assert_eq!(default_rendezvous(runners[0].as_ref()), None);
        let per_rank = local_rank_env(2, Some("=veth1"), None);
        assert_eq!(
            per_rank[1],
            [
                ("WEFT_MGMT_IFNAME".to_string(), "=lo".to_string()),
                ("WEFT_DATA_IFNAME".to_string(), "=veth1".to_string())
            ]
        );
        let plugin = Path::new("/opt/libnccl-net-weft.so");
        let cmd = RankCommand {
            exe: "/usr/bin/weft",
            worker_args: vec!["bench".into(), "collectives".into()],
            rendezvous: "10.0.0.1:29600",
            plugin: Some(plugin),
            named: true,
        };
        let (argvs, envs) = rank_commands(&runners, &cmd, &env, &per_rank);
        assert_eq!(
            argvs[1].join(" "),
            "/usr/bin/weft bench collectives --rank 1 --nranks 2 --rendezvous 10.0.0.1:29600 \
             --plugin /opt/libnccl-net-weft.so --rank-name local"
        );
        assert_eq!(envs[0].len(), 4);
        assert_eq!(envs[0][3].1, "=veth1");
    }

    #[test]
    fn rank_zero_decides_unless_a_rank_failed_its_environment() {
        assert_eq!(exit_code(&[RankEnd::Code(0), RankEnd::Code(0)]), 0);
        assert_eq!(exit_code(&[RankEnd::Code(1), RankEnd::Code(0)]), 1);
        // Only rank 0 judges the results; another rank's 1 is not the run's.
        assert_eq!(exit_code(&[RankEnd::Code(0), RankEnd::Code(1)]), 0);
        assert_eq!(exit_code(&[RankEnd::Code(0), RankEnd::TimedOut]), 2);
        let ssh = RankEnd::Other {
            status: "exit status: 255".into(),
            ssh_failed: true,
        };
        assert_eq!(exit_code(&[RankEnd::Code(1), ssh]), 2);
    }

    #[test]
    fn ranks_run_locally_and_a_late_one_is_killed() {
        let runners: Vec<Box<dyn HostRunner>> = vec![
            Box::new(weft_hosts::runner::Local),
            Box::new(weft_hosts::runner::Local),
        ];
        let sh = |c: &str| vec!["sh".to_string(), "-c".to_string(), c.to_string()];
        let t = Instant::now();
        let ends = run_ranks(
            &runners,
            &[sh("exit 1"), sh("sleep 30")],
            &[],
            Stdio::inherit(),
            Instant::now() + std::time::Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(ends, [RankEnd::Code(1), RankEnd::TimedOut]);
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
    }
}
