//! `weft doctor` and `weft run` on the same hosts and flags choose the same interfaces, on a
//! namespace cluster whose hosts differ: host 0 has a default route on `mgmt0`, hosts 1 and 2
//! have none (and are reached with `ip netns exec`, so no SSH session names their management
//! interface either), host 1 has an extra interface that is up with an address (`aux0`), and
//! host 2's data NIC is named `ens5` instead of `data0`. No `--mgmt-if`/`--data-if`: the
//! defaults decide. Hosts 1 and 2 find their management interface only on the other hosts'
//! management subnet, which a decision made one host at a time cannot see.

use std::time::Duration;

use serde_json::Value;
use weft_netns::{Cluster, ClusterSpec};

use super::{need_netns, weft_in_cmd};
use crate::text;

/// `ip ARGS` inside host `i`; panics with ip's complaint when it fails.
fn ip(c: &Cluster, i: usize, args: &[&str]) {
    let o = c
        .exec(i, "ip", args, Duration::from_secs(10))
        .expect("ip runs");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn doctor_and_run_choose_the_same_interfaces_on_hosts_that_differ() {
    need_netns();
    let c = Cluster::create(&ClusterSpec::new(3, 1)).expect("cluster");
    ip(&c, 0, &["route", "add", "default", "dev", "mgmt0"]);
    // An extra interface that is up with an IPv4 address: a veth pair inside the host, so
    // that its state is "up" (a dummy's is "unknown").
    ip(
        &c,
        1,
        &[
            "link", "add", "aux0", "type", "veth", "peer", "name", "aux0p",
        ],
    );
    ip(&c, 1, &["addr", "add", "10.77.0.2/24", "dev", "aux0"]);
    ip(&c, 1, &["link", "set", "aux0p", "up"]);
    ip(&c, 1, &["link", "set", "aux0", "up"]);
    // The data NIC under another name.
    ip(&c, 2, &["link", "set", "data0", "down"]);
    ip(&c, 2, &["link", "set", "data0", "name", "ens5"]);
    ip(&c, 2, &["link", "set", "ens5", "up"]);

    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let hosts = names.join(",");
    let common = ["--hosts", &hosts, "--via", "netns", "--timeout", "60"];

    let mut d = weft_in_cmd(
        &names[0],
        &["doctor", "--json", "--no-throughput", "--no-loss"],
    );
    d.args(common);
    let o = d.output().expect("weft doctor runs");
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let report: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", text(&o)));
    let doctor: Vec<(String, String)> = names
        .iter()
        .map(|n| {
            let r = report["roles"]
                .as_array()
                .and_then(|v| v.iter().find(|r| r["host"] == n.as_str()))
                .unwrap_or_else(|| panic!("no roles for {n} in {report}"));
            let data: Vec<&str> = r["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap())
                .collect();
            (
                format!("={}", r["mgmt"].as_str().unwrap_or("(none)")),
                format!("={}", data.join(",")),
            )
        })
        .collect();
    // What the doctor decided is what the cluster is built to give.
    let want: Vec<(String, String)> = [
        ("=mgmt0", "=data0"),
        ("=mgmt0", "=aux0,data0"),
        ("=mgmt0", "=ens5"),
    ]
    .iter()
    .map(|(m, d)| (m.to_string(), d.to_string()))
    .collect();
    assert_eq!(doctor, want, "doctor's roles");

    let mut r = weft_in_cmd(
        &names[0],
        &["run", "--nccl", "weft", "--no-version-check", "--json"],
    );
    r.args(common).args([
        "--",
        "sh",
        "-c",
        "echo \"ROLES $NODE_RANK $WEFT_MGMT_IFNAME $WEFT_DATA_IFNAME\"",
    ]);
    let o = r.output().expect("weft run runs");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    let mut run: Vec<(usize, String, String)> = out
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("ROLES ")? + "ROLES ".len()..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((
                f[0].parse().ok()?,
                f.get(1)?.to_string(),
                f.get(2)?.to_string(),
            ))
        })
        .collect();
    run.sort();
    let run: Vec<(String, String)> = run.into_iter().map(|(_, m, d)| (m, d)).collect();
    assert_eq!(run, doctor, "run's interfaces against the doctor's: {out}");
}
