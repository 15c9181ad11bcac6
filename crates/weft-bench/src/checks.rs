//! The doctor's checks as a list (the name each finding carries and what the check does), so
//! that `weft doctor --help` is generated from it and names every check.

/// One check of the doctor: the name its findings carry (`check`) and what it does, for
/// `weft doctor --help` (generated from this list, so the help names every check).
#[derive(Debug, Clone, Copy)]
pub struct CheckDoc {
    pub name: &'static str,
    pub what: &'static str,
}

/// Every check, in the order the doctor runs them.
pub const CHECKS: &[CheckDoc] = &[
    CheckDoc {
        name: "reach",
        what: "weft runs on the host (through SSH, a namespace or locally) and reports its facts.",
    },
    CheckDoc {
        name: "ssh",
        what: "SSH to every other host: `ssh -o BatchMode=yes -o ConnectTimeout=--ssh-timeout-s -o StrictHostKeyChecking=yes [--ssh-config, --ssh-option] HOST true` run on the host, for every ordered pair; a FAIL names the pair, ssh's error and a fix (known_hosts entry, authorized key, sshd). Not over SSH (--via netns, local): SKIP. --no-ssh-pairs skips it.",
    },
    CheckDoc {
        name: "roles",
        what: "--mgmt-if/--data-if in the plugin's syntax (names, `=exact`, `^exclude`, subnets); by default management is the default-route interface (else the SSH session's, else the one on the other hosts' management subnet) and data the RDMA netdevs, else every up interface with an address off the management subnets.",
    },
    CheckDoc {
        name: "link",
        what: "every data interface is up.",
    },
    CheckDoc {
        name: "address",
        what: "every data interface has an IPv4 address, each on its own subnet.",
    },
    CheckDoc {
        name: "mtu",
        what: "the MTU against --expect-mtu, else the largest on the same subnet (a remedy never lowers an MTU).",
    },
    CheckDoc {
        name: "speed",
        what: "the link speed against --expect-speed, else the fastest of the same role.",
    },
    CheckDoc {
        name: "jumbo",
        what: "jumbo frames end to end: DF-bit ICMP of MTU-28 bytes between every pair (root or CAP_NET_RAW).",
    },
    CheckDoc {
        name: "throughput",
        what: "a short `weft bench p2p` of --throughput-s per ordered pair, each judged against what its links should do (--expect-speed, else the speed a physical NIC reports), else against the median of every host's best pair; a host whose every pair from (or to) it is slow fails, failed pairs count in no statistic. --no-throughput skips it.",
    },
    CheckDoc {
        name: "loss",
        what: "--loss-echoes ICMP echoes (one every 2 ms) from every host to every other host's management address; a host whose every pair loses 1% or more fails on its management interface (root or CAP_NET_RAW). --no-loss skips it.",
    },
    CheckDoc {
        name: "rdma",
        what: "RDMA ports: state, rate, link layer, netdev.",
    },
    CheckDoc {
        name: "env",
        what: "no NCCL_IB_GID_INDEX pinned in the environment.",
    },
    CheckDoc {
        name: "gpu",
        what: "GPU count and memory per GPU where there is a driver (NVML, else nvidia-smi); a WARN when hosts differ.",
    },
    CheckDoc {
        name: "clock",
        what: "clock offset from this machine against --max-skew-ms (10x fails).",
    },
];

/// The checks as help text: `* name: what`, wrapped at 92 columns.
pub fn checks_help() -> String {
    let mut s = String::new();
    for c in CHECKS {
        let mut line = format!("* {}:", c.name);
        for w in c.what.split(' ') {
            if line.len() + 1 + w.len() > 92 {
                s.push_str(&line);
                s.push('\n');
                line = format!("  {w}");
            } else {
                line.push(' ');
                line.push_str(w);
            }
        }
        s.push_str(&line);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_names_every_check_once() {
        let h = checks_help();
        for c in CHECKS {
            assert_eq!(h.matches(&format!("* {}:", c.name)).count(), 1, "{h}");
        }
        assert!(h.lines().all(|l| l.len() <= 92), "{h}");
    }
}
