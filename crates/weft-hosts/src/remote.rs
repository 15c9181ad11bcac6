//! Running weft's hidden helpers on a host through a [`HostRunner`] and reading their JSON
//! ([`Remote`]); the facts of every host at once, with each clock's offset ([`gather_all`]).

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::HostsError;
use crate::each::each_host;
use crate::facts::{self, HostFacts};
use crate::runner::HostRunner;

/// How to start `weft` on the hosts.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The `weft` binary on the hosts.
    pub exe: String,
    /// Bound on each helper.
    pub timeout: Duration,
}

impl Remote {
    /// `EXE bench ARGS`.
    pub fn argv(&self, args: &[String]) -> Vec<String> {
        let mut v = vec![self.exe.clone(), "bench".into()];
        v.extend(args.iter().cloned());
        v
    }

    /// Runs `weft bench ARGS` on `host` and parses its stdout as JSON.
    pub fn json<T: DeserializeOwned>(
        &self,
        host: &dyn HostRunner,
        args: &[String],
        timeout: Duration,
    ) -> Result<T, HostsError> {
        let o = host.run(&self.argv(args), &[], timeout)?;
        let fail = |msg: String| HostsError::Host {
            host: host.name().to_string(),
            msg,
        };
        if !o.status.success() {
            return Err(fail(format!(
                "`weft bench {}` exited with {}: {}",
                args.first().map_or("", String::as_str),
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        serde_json::from_slice(&o.stdout).map_err(|e| {
            fail(format!(
                "`weft bench {}` printed no JSON ({e}): {}",
                args.first().map_or("", String::as_str),
                String::from_utf8_lossy(&o.stdout).trim()
            ))
        })
    }
}

/// Facts of one host, and its clock's offset from ours.
#[derive(Debug, Clone)]
pub struct Gathered {
    pub facts: HostFacts,
    /// Host clock minus ours at the middle of the call, ns.
    pub offset_ns: i64,
    /// Half the call's duration: the offset is known to within this.
    pub uncertainty_ns: i64,
}

/// Gathers the facts of every host at once.
pub fn gather_all(hosts: &[Box<dyn HostRunner>], r: &Remote) -> Vec<Result<Gathered, HostsError>> {
    each_host(hosts, |h| {
        let t0 = facts::now_ns();
        let f: HostFacts = r.json(h.as_ref(), &["host-facts".into()], r.timeout)?;
        let t1 = facts::now_ns();
        let mid = (i128::from(t0) + i128::from(t1)) / 2;
        Ok(Gathered {
            offset_ns: (i128::from(f.unix_time_ns) - mid) as i64,
            uncertainty_ns: ((i128::from(t1) - i128::from(t0)) / 2) as i64,
            facts: f,
        })
    })
}
