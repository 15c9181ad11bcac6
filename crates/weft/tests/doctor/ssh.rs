//! `weft doctor --via ssh` with real OpenSSH: three hosts in network namespaces, a real sshd
//! in each (on its management address, port 22), one ssh_config for every `ssh` (the
//! operator's and the hosts' own: they share the filesystem), keys and known_hosts files, and
//! the real `weft` binary run on every host through SSH. The doctor itself runs inside host 0
//! (the head node an operator logs in to); the root namespace has no route to the cluster.
//!
//! Every host's sessions get `WEFT_SSH_FROM=<host>` from its sshd (`SetEnv`), and the
//! ssh_config reads `known_hosts.${WEFT_SSH_FROM}`, so each host has a known_hosts file of its
//! own (the operator's is `known_hosts.operator`). Then:
//! * all is well: every host reaches its 2 peers, the doctor exits 0;
//! * host 1's management link loses packets (netem's 5% at random, or where the kernel has
//!   no netem a two-frame tbf bucket that drops what exceeds 1 Mbit/s): exactly host 1's
//!   mgmt0 FAILs the loss check, with the loss measured;
//! * host 1's known_hosts lacks host 2: exactly the pair h1 -> h2 FAILs, with ssh's "Host key
//!   verification failed" and a known_hosts remedy, and nothing else fails;
//! * host 2's sshd is stopped: host 2 is unreachable (reach) and exactly h0 -> h2 and
//!   h1 -> h2 FAIL (connection refused, "start sshd"), in the human output.
//!
//! Also: `--via netns` on the same hosts says SKIP for the SSH check (INFO), not PASS.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use weft_netns::{Cluster, ClusterSpec};
use weft_testbed::{SSHD, Sshd, SshdOptions};

use super::text;

/// `ip netns exec NS weft ARGS` with the operator's known_hosts.
fn weft_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_weft")])
        .args(args)
        .env_remove("WEFT_CONFIG")
        .env_remove("WEFT_DATA_IFNAME")
        .env_remove("WEFT_MGMT_IFNAME")
        .env("WEFT_SSH_FROM", "operator")
        .output()
        .expect("weft runs")
}

/// Why this test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if let Err(why) = weft_netns::available() {
        return Some(why);
    }
    if !Path::new(SSHD).exists() {
        return Some(format!("{SSHD} missing (install openssh-server)"));
    }
    if Command::new("ssh").arg("-V").output().is_err() {
        return Some("no ssh client (install openssh-client)".into());
    }
    None
}

/// (level, host, check, subject) of every finding at `level`.
fn at(v: &serde_json::Value, level: &str) -> BTreeSet<(String, String, String)> {
    v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["level"] == level)
        .map(|f| {
            (
                f["host"].as_str().unwrap_or("").to_string(),
                f["check"].as_str().unwrap_or("").to_string(),
                f["subject"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn set(v: &[(&str, &str, &str)]) -> BTreeSet<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[test]
fn doctor_over_ssh_checks_every_pair_and_names_exactly_the_broken_ones() {
    if let Some(why) = unavailable() {
        weft_netns::require::skip("doctor over ssh", &why);
        return;
    }
    let c = Cluster::create(&ClusterSpec::new(3, 1)).expect("cluster");
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    // One sshd per host, on its management address; all accept host 0's user key.
    let mut sshds: Vec<Sshd> = Vec::new();
    for (i, h) in c.hosts().iter().enumerate() {
        let o = SshdOptions {
            netns: Some(h.name.clone()),
            listen: Some(h.mgmt_addr.into()),
            port: None,
            authorized_keys: sshds
                .first()
                .map(|s| vec![s.user_public_key().to_string()])
                .unwrap_or_default(),
            set_env: vec![("WEFT_SSH_FROM".into(), h.name.clone())],
        };
        match Sshd::start_with(&o) {
            Ok(s) => sshds.push(s),
            Err(weft_testbed::TestbedError::Missing(m)) if i == 0 => {
                weft_netns::require::skip("doctor over ssh", &m);
                return;
            }
            Err(e) => panic!("sshd in {}: {e}", h.name),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cfg = String::new();
    for h in c.hosts() {
        cfg.push_str(&format!("Host {}\n    HostName {}\n", h.name, h.mgmt_addr));
    }
    cfg.push_str(&format!(
        "Host *\n    User {user}\n    IdentityFile {id}\n    IdentitiesOnly yes\n    \
         UserKnownHostsFile {d}/known_hosts.${{WEFT_SSH_FROM}}\n    GlobalKnownHostsFile /dev/null\n    \
         StrictHostKeyChecking yes\n    BatchMode yes\n    ConnectTimeout 5\n    LogLevel ERROR\n",
        user = sshds[0].user(),
        id = sshds[0].identity_file().display(),
        d = d.display(),
    ));
    let cfg_path = d.join("ssh_config");
    std::fs::write(&cfg_path, cfg).unwrap();
    let all_keys: String = sshds.iter().map(Sshd::known_hosts_line).collect();
    let write_known = |except: Option<(usize, usize)>| {
        for from in std::iter::once("operator".to_string()).chain(names.iter().cloned()) {
            let lines: String = sshds
                .iter()
                .enumerate()
                .filter(|(j, _)| except.is_none_or(|(s, t)| !(names[s] == from && *j == t)))
                .map(|(_, s)| s.known_hosts_line())
                .collect();
            std::fs::write(d.join(format!("known_hosts.{from}")), lines).unwrap();
        }
    };
    write_known(None);
    assert_eq!(
        std::fs::read_to_string(d.join("known_hosts.operator")).unwrap(),
        all_keys
    );

    let hosts = names.join(",");
    let cfg_s = cfg_path.display().to_string();
    let common = [
        "doctor",
        "--hosts",
        &hosts,
        "--via",
        "ssh",
        "--ssh-config",
        &cfg_s,
        "--remote-weft",
        env!("CARGO_BIN_EXE_weft"),
        "--mgmt-if",
        "=mgmt0",
        "--data-if",
        "=data0",
        "--no-throughput",
        "--ssh-timeout-s",
        "3",
        "--timeout",
        "30",
    ];
    let run = |json: bool| {
        let mut a: Vec<&str> = common.to_vec();
        if json {
            a.push("--json");
        }
        weft_in(&names[0], &a)
    };

    // All is well: every host reaches its two peers; nothing fails.
    let o = run(true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(at(&v, "FAIL"), BTreeSet::new(), "{v:#}");
    let ssh_pass: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "ssh" && f["level"] == "PASS")
        .collect();
    assert_eq!(ssh_pass.len(), 3, "{v:#}");
    assert!(
        ssh_pass
            .iter()
            .all(|f| f["message"].as_str().unwrap().contains("its 2 peers")),
        "{v:#}"
    );
    // The facts came from the hosts themselves: each one's own mgmt0 address.
    let roles: BTreeSet<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "roles" && f["level"] == "PASS")
        .map(|f| f["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(roles, names.iter().cloned().collect(), "{v:#}");

    // Host 1's management link loses packets: 5% at random with netem; on a kernel without
    // netem, a token bucket of two frames at 1 Mbit/s drops what exceeds its rate (the
    // echo trains through it are faster). The loss check names exactly that host and link;
    // everything else (SSH over the lossy link included) passes.
    let netem = weft_netns::netem_available().is_ok();
    let lossy = |on: bool| {
        if netem {
            let shape = if on {
                weft_netns::Shape::default().with_loss_pct(5.0)
            } else {
                weft_netns::Shape::default()
            };
            c.shape(1, "mgmt0", &shape).expect("netem");
        } else {
            let args: &[&str] = if on {
                &[
                    "qdisc", "replace", "dev", "mgmt0", "root", "tbf", "rate", "1mbit", "burst",
                    "3000", "limit", "3000",
                ]
            } else {
                &["qdisc", "del", "dev", "mgmt0", "root"]
            };
            let o = c
                .exec(1, "tc", args, std::time::Duration::from_secs(10))
                .expect("tc");
            assert!(o.status.success(), "tc {args:?}: {o:?}");
        }
    };
    lossy(true);
    let o = run(true);
    lossy(false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(
        at(&v, "FAIL"),
        set(&[(&names[1], "loss", "mgmt0")]),
        "{v:#}"
    );
    assert_eq!(at(&v, "WARN"), BTreeSet::new(), "{v:#}");
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["level"] == "FAIL")
        .unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!("management link mgmt0 of {} loses ", names[1])),
        "{msg}"
    );
    let pct: f64 = msg
        .split(" loses ")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|x| x.parse().ok())
        .unwrap();
    eprintln!("loss finding: {msg}");
    // netem's 5%: about that; the bucket's: some, never everything.
    let range = if netem { 1.5..12.0 } else { 1.0..95.0 };
    assert!(range.contains(&pct), "{msg}");
    assert!(
        f["remedy"]
            .as_str()
            .unwrap()
            .contains("ip -s link show mgmt0")
    );
    let loss_pass: BTreeSet<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "loss" && f["level"] == "PASS")
        .map(|f| f["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        loss_pass,
        BTreeSet::from([names[0].clone(), names[2].clone()]),
        "{v:#}"
    );

    // Host 1 does not know host 2's key: exactly that pair fails.
    write_known(Some((1, 2)));
    let o = run(true);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(
        at(&v, "FAIL"),
        set(&[(&names[1], "ssh", &names[2])]),
        "{v:#}"
    );
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["level"] == "FAIL")
        .unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{} -> {}", names[1], names[2])),
        "{msg}"
    );
    assert!(msg.contains("Host key verification failed"), "{msg}");
    assert!(
        f["remedy"].as_str().unwrap().contains("known_hosts"),
        "{f:#}"
    );
    // The others still pass the SSH check.
    let ssh_pass: BTreeSet<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "ssh" && f["level"] == "PASS")
        .map(|f| f["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ssh_pass,
        BTreeSet::from([names[0].clone(), names[2].clone()]),
        "{v:#}"
    );

    // Host 2's sshd is down: it cannot be reached, and every pair towards it fails; human
    // output, FAIL lines with their fixes.
    write_known(None);
    sshds[2].kill().unwrap();
    let o = run(false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    let fails: BTreeSet<&str> = t.lines().filter(|l| l.starts_with("FAIL ")).collect();
    let want_pairs = [
        format!(
            "FAIL {} {} [ssh]: {} -> {}: ",
            names[0], names[2], names[0], names[2]
        ),
        format!(
            "FAIL {} {} [ssh]: {} -> {}: ",
            names[1], names[2], names[1], names[2]
        ),
    ];
    let want_reach = format!("FAIL {} [reach]: ", names[2]);
    assert_eq!(fails.len(), 3, "{t}");
    for w in want_pairs.iter().chain([&want_reach]) {
        assert!(fails.iter().any(|l| l.starts_with(w.as_str())), "{w}\n{t}");
    }
    assert!(
        fails
            .iter()
            .filter(|l| l.contains("[ssh]"))
            .all(|l| l.contains("Connection refused")),
        "{t}"
    );
    assert!(
        t.contains(&format!("fix: start sshd on {}", names[2])),
        "{t}"
    );

    // Through namespaces there is no SSH to check: an explicit SKIP (INFO), no PASS.
    let ns_hosts = names[..2].join(",");
    let o = weft_in(
        &names[0],
        &[
            "doctor",
            "--hosts",
            &ns_hosts,
            "--via",
            "netns",
            "--mgmt-if",
            "=mgmt0",
            "--data-if",
            "=data0",
            "--no-throughput",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let ssh: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "ssh")
        .collect();
    assert_eq!(ssh.len(), 1, "{v:#}");
    assert_eq!(ssh[0]["level"], "INFO");
    assert!(
        ssh[0]["message"].as_str().unwrap().contains("SKIP"),
        "{v:#}"
    );
}
