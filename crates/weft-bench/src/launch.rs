//! Starting the ranks of a collectives run: each rank's interfaces from the doctor's one
//! selection ([`rank_env`]), and the ranks started on their hosts and waited for, bounded
//! ([`run_ranks`]). The binary only parses flags and prints what this returns.

use std::process::{ExitStatus, Stdio};
use std::time::Instant;

use crate::BenchError;
use crate::facts::{self, Roles};
use crate::runner::{HostRunner, kill_group, wait_until};

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
        let data: Vec<&str> = role
            .data
            .iter()
            .filter(|d| facts::ipv4(d).is_some())
            .map(|d| d.name.as_str())
            .collect();
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

/// Starts rank `r` with `argv[r]` and `env[r]` on `runners[r]` (rank 0's stdout inherited,
/// the others' discarded), waits for all of them until `deadline`, and kills every rank's
/// process group when one ended badly or ran past it. Returns how each ended, in rank order.
pub fn run_ranks(
    runners: &[Box<dyn HostRunner>],
    argv: &[Vec<String>],
    env: &[Vec<(String, String)>],
    deadline: Instant,
) -> Result<Vec<RankEnd>, BenchError> {
    let mut kids = Vec::new();
    for (rank, r) in runners.iter().enumerate() {
        let out = if rank == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let empty = Vec::new();
        match r.spawn(&argv[rank], env.get(rank).unwrap_or(&empty), out) {
            Ok(k) => kids.push(k),
            Err(e) => {
                for k in &mut kids {
                    kill_group(k);
                }
                return Err(e);
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
            Box::new(crate::runner::Local),
            Box::new(crate::runner::Local),
        ];
        let sh = |c: &str| vec!["sh".to_string(), "-c".to_string(), c.to_string()];
        let t = Instant::now();
        let ends = run_ranks(
            &runners,
            &[sh("exit 1"), sh("sleep 30")],
            &[],
            Instant::now() + std::time::Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(ends, [RankEnd::Code(1), RankEnd::TimedOut]);
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
    }
}
