//! `weft doctor` when one fault sits beside another, on one 4-host namespace cluster
//! reconfigured between the cases (real sockets, real `tc`, MTUs, links and routes): every case
//! asserts exactly which hosts FAIL and for which checks, and that no helper weft started is
//! left running in any host afterwards.
//!
//! * no default route anywhere, no interface flags, host 3 at MTU 1500: only host 3 (the
//!   management network's 1500 is compared with management, not with data);
//! * default routes on hosts 1-3 only, no flags, host 3 at MTU 1500: host 0 finds its
//!   management interface from the others' subnet, roles are right, only host 3 fails;
//! * two slow hosts of four (`--data-if` as a subnet): both named;
//! * a slow host plus a down data NIC: both named, each for its own fault;
//! * a slow host plus an unreachable host: both named, the throughput check still runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use weft_netns::{Cluster, ClusterSpec, Shape};

use super::{host_list, text, weft};

/// FAIL findings of a doctor JSON report: host -> checks.
fn fails(v: &serde_json::Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in v["findings"].as_array().expect("findings") {
        if f["level"] == "FAIL" {
            m.entry(f["host"].as_str().unwrap().to_string())
                .or_default()
                .insert(f["check"].as_str().unwrap().to_string());
        }
    }
    m
}

fn want(v: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
    v.iter()
        .map(|(h, c)| (h.to_string(), c.iter().map(|c| c.to_string()).collect()))
        .collect()
}

/// Every process in the cluster's namespaces whose command line names a weft helper.
fn leftovers(c: &Cluster) -> Vec<String> {
    let mut v = Vec::new();
    for h in c.hosts() {
        let o = std::process::Command::new("ip")
            .args(["netns", "pids", &h.name])
            .output()
            .expect("ip netns pids");
        for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if [
                "p2p-serve",
                "p2p-probe",
                "df-probe",
                "host-facts",
                "loss-probe",
            ]
            .iter()
            .any(|h| cmd.contains(h))
            {
                v.push(format!("{}: {pid} {cmd}", h.name));
            }
        }
    }
    v
}

/// Runs the doctor with `args` (plus the host list and JSON); checks it exits 1 and leaves
/// nothing behind; returns the report.
fn doctor(c: &Cluster, hosts: &str, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["doctor", "--hosts", hosts, "--via", "netns", "--json"];
    a.extend(args);
    let o = weft(&a);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
    assert_eq!(leftovers(c), Vec::<String>::new(), "{args:?}");
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// Adds (or deletes) a default route through mgmt0 in host `i`.
fn route_default(c: &Cluster, i: usize, add: bool) {
    let verb = if add { "add" } else { "del" };
    let o = c
        .exec(
            i,
            "ip",
            &["route", verb, "default", "dev", "mgmt0"],
            Duration::from_secs(10),
        )
        .expect("ip route");
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn doctor_names_every_fault_when_two_come_together() {
    if let Err(why) = weft_netns::available() {
        panic!("network namespaces are needed (run as root with iproute2): {why}");
    }
    let c = Cluster::create(&ClusterSpec::new(4, 1)).expect("cluster");
    let name = |i: usize| c.host(i).name.clone();
    let hosts = host_list(&c);
    for i in 0..4 {
        c.shape(i, "data0", &Shape::rate("400mbit")).expect("tc");
    }
    let quick = ["--no-throughput", "--no-ssh-pairs", "--timeout", "20"];

    // No default route anywhere and no flags: management is unknown, so mgmt0 counts as data,
    // but it is compared with the other hosts' mgmt0 (its own subnet), not with data0.
    c.set_mtu(3, "data0", 1500).expect("mtu");
    let v = doctor(&c, &hosts, &quick);
    assert_eq!(fails(&v), want(&[(&name(3), &["jumbo", "mtu"])]), "{v:#}");

    // Default routes on hosts 1-3, none on host 0: host 0's management interface is found
    // on the others' management subnet, and data is data0 everywhere.
    for i in 1..4 {
        route_default(&c, i, true);
    }
    let v = doctor(&c, &hosts, &quick);
    assert_eq!(fails(&v), want(&[(&name(3), &["jumbo", "mtu"])]), "{v:#}");
    let findings = v["findings"].as_array().unwrap();
    let roles: BTreeSet<(String, String)> = findings
        .iter()
        .filter(|f| f["check"] == "roles" && f["level"] == "PASS")
        .map(|f| {
            (
                f["host"].as_str().unwrap().to_string(),
                f["subject"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        (0..4).map(|i| (name(i), "mgmt0".to_string())).collect(),
        "{v:#}"
    );
    assert!(
        findings.iter().any(|f| f["host"] == name(0).as_str()
            && f["check"] == "roles"
            && f["message"]
                .as_str()
                .unwrap()
                .contains("other hosts' management subnet")),
        "{v:#}"
    );
    let links: Vec<&str> = findings
        .iter()
        .filter(|f| f["check"] == "link")
        .map(|f| f["subject"].as_str().unwrap())
        .collect();
    assert_eq!(links, ["data0"; 4], "{v:#}");
    let env: Vec<(String, String)> = serde_json::from_value(v["env"].clone()).unwrap();
    assert!(env.contains(&("WEFT_DATA_IFNAME".into(), "=data0".into())));
    assert!(env.contains(&("NCCL_SOCKET_IFNAME".into(), "=mgmt0".into())));
    c.set_mtu(3, "data0", 9000).expect("mtu");
    // Without the routes again: a host whose data NIC is down would otherwise reach the data
    // addresses through its default route (the management link).
    for i in 1..4 {
        route_default(&c, i, false);
    }

    // Two slow hosts of four, the data interfaces named by subnet (the plugin's syntax).
    let a = c.host(0).data_addr(0).unwrap().octets();
    let subnet = format!("{}.{}.{}.0/24", a[0], a[1], a[2]);
    let measured = [
        "--mgmt-if",
        "=mgmt0",
        "--data-if",
        &subnet,
        "--no-ssh-pairs",
        "--throughput-s",
        "0.5",
        "--timeout",
        "8",
    ];
    for i in [1, 2] {
        c.shape(i, "data0", &Shape::rate("80mbit")).expect("tc");
    }
    let v = doctor(&c, &hosts, &measured);
    assert_eq!(
        fails(&v),
        want(&[(&name(1), &["throughput"]), (&name(2), &["throughput"])]),
        "{v:#}"
    );

    // A slow host and a down data NIC: each named for its own fault; the failed pairs do not
    // lower the reference, so host 2 still fails.
    c.shape(1, "data0", &Shape::rate("400mbit")).expect("tc");
    c.set_link(1, "data0", false).expect("link down");
    let v = doctor(&c, &hosts, &measured);
    let f = fails(&v);
    assert_eq!(
        f.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([name(1), name(2)]),
        "{v:#}"
    );
    assert_eq!(
        f[&name(2)],
        BTreeSet::from(["throughput".to_string()]),
        "{v:#}"
    );
    assert!(f[&name(1)].contains("link"), "{v:#}");
    c.set_link(1, "data0", true).expect("link up");

    // A slow host and a host that cannot be reached at all.
    let bogus = format!("{}-gone", c.prefix());
    let with_bogus = format!("{hosts},{bogus}");
    let v = doctor(&c, &with_bogus, &measured);
    assert_eq!(
        fails(&v),
        want(&[(&bogus, &["reach"]), (&name(2), &["throughput"])]),
        "{v:#}"
    );
}

/// With a default route through the management network on every host and host 1's data NIC
/// down, `bench p2p` fails exactly the pairs with host 1 and names it unreachable: its probes
/// and servers are bound to the data interface (SO_BINDTODEVICE), so no byte takes the
/// default route over mgmt0 instead (which the kernel would otherwise pick, the data subnet's
/// route being gone with the interface).
#[test]
fn p2p_never_takes_the_management_route_when_a_data_nic_is_down() {
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip("p2p with a data NIC down", &why);
        return;
    }
    let c = Cluster::create(&ClusterSpec::new(3, 1)).expect("cluster");
    let name = |i: usize| c.host(i).name.clone();
    let hosts = host_list(&c);
    for i in 0..3 {
        route_default(&c, i, true);
    }
    c.set_link(1, "data0", false).expect("link down");
    let before = c.counters(1, "mgmt0").expect("counters");
    let o = weft(&[
        "bench",
        "p2p",
        "--hosts",
        &hosts,
        "--via",
        "netns",
        "--mgmt-if",
        "=mgmt0",
        "--data-if",
        "=data0",
        "--duration",
        "0.5",
        "--streams",
        "2",
        "--pings",
        "5",
        "--timeout",
        "5",
        "--json",
    ]);
    let after = c.counters(1, "mgmt0").expect("counters");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(leftovers(&c), Vec::<String>::new());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let m = &v["matrix"];
    let pairs = m["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 6, "{m:#}");
    for p in pairs {
        let with_1 = p["src"] == name(1).as_str() || p["dst"] == name(1).as_str();
        assert_eq!(p["error"].is_string(), with_1, "{p:#}");
    }
    // Host 1's own probes fail at once, naming the interface they are bound to.
    assert!(
        pairs
            .iter()
            .filter(|p| p["src"] == name(1).as_str())
            .all(|p| p["error"].as_str().unwrap().contains("from data0")),
        "{m:#}"
    );
    let blamed: BTreeSet<(String, String)> = m["blamed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["host"].as_str().unwrap().to_string(),
                b["what"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        blamed,
        BTreeSet::from([(name(1), "unreachable".to_string())]),
        "{m:#}"
    );
    // Nothing bulk crossed host 1's management link (half a second of two streams would be
    // hundreds of megabytes on a veth).
    let moved = (after.0 - before.0) + (after.1 - before.1);
    assert!(
        moved < 1 << 20,
        "{moved} bytes crossed mgmt0 of {}",
        name(1)
    );
}
