//! `weft mesh` on 4 namespace hosts with a real sshd each: from nothing (only the operator
//! reaches the hosts) to all 12 ordered pairs proven; a second run adds nothing; a host
//! key changed on one host (its sshd restarted with a new key) is refused and named, and
//! nothing is written; unconfirmed keys are refused.

use super::SshCluster;
use crate::text;

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {}", text(o)))
}

#[test]
fn mesh_from_nothing_to_every_pair_proven_and_a_changed_host_key_refused() {
    let mut sc = SshCluster::start(4, vec![]);
    let d = sc.dir.path().display().to_string();
    let paths = [
        "--identity".to_string(),
        format!("{d}/id.{{host}}"),
        "--known-hosts".into(),
        format!("{d}/known_hosts.{{host}}"),
        "--authorized-keys".into(),
        format!("{d}/auth.{{host}}"),
        "--ssh-timeout-s".into(),
        "3".into(),
    ];
    let fingerprints = |sc: &SshCluster| -> String {
        sc.sshds
            .iter()
            .zip(&sc.names)
            .map(|(s, n)| {
                let f = sc.path(&format!("hk.{n}.pub"));
                std::fs::write(&f, format!("{}\n", s.host_public_key())).unwrap();
                let o = std::process::Command::new("ssh-keygen")
                    .arg("-lf")
                    .arg(&f)
                    .output()
                    .unwrap();
                let fp = String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(1)
                    .unwrap()
                    .to_string();
                format!("{n} {fp}\n")
            })
            .collect()
    };
    std::fs::write(sc.path("expect"), fingerprints(&sc)).unwrap();
    let host_args = sc.host_args(&sc.names);
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["mesh".to_string()];
        a.extend(host_args.iter().cloned());
        a.extend(paths.iter().cloned());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let expect = sc.path("expect").display().to_string();

    // Before: nothing between the hosts; --check reports it and writes nothing.
    let o = sc.weft(&args(&["--check", "--json"])).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["missing"], 12, "{v:#}");
    assert!(
        v["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ok"] == false),
        "{v:#}"
    );
    assert!(!sc.path(&format!("known_hosts.{}", sc.names[1])).exists());

    // Without confirmation nothing is written.
    let o = sc.weft(&args(&[])).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("confirm these host keys"), "{}", text(&o));
    let o = sc.weft(&args(&["--yes"])).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // The mesh: 12 pairs proven.
    let o = sc
        .weft(&args(&[
            "--yes",
            "--expect-fingerprints",
            &expect,
            "--json",
        ]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(v["pairs"].as_array().unwrap().len(), 12, "{v:#}");
    assert!(
        v["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ok"] == true),
        "{v:#}"
    );
    assert_eq!(v["generated"].as_array().unwrap().len(), 4, "{v:#}");
    assert_eq!(v["authorized_added"], 12, "{v:#}");
    assert_eq!(v["known_added"], 12, "{v:#}");

    // Again: nothing to add, still 12 pairs; --check agrees.
    let o = sc
        .weft(&args(&[
            "--yes",
            "--expect-fingerprints",
            &expect,
            "--json",
        ]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    assert_eq!(
        (v["authorized_added"].as_u64(), v["known_added"].as_u64()),
        (Some(0), Some(0)),
        "{v:#}"
    );
    assert_eq!(v["generated"].as_array().unwrap().len(), 0, "{v:#}");
    let o = sc.weft(&args(&["--check"])).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("12 of 12 ordered pairs proven"),
        "{}",
        text(&o)
    );

    // Host 2 gets a new host key (the operator learns it; the hosts still hold the old).
    sc.sshds[2].kill().unwrap();
    let fresh = sc.sshd_for(2);
    sc.sshds[2] = fresh;
    sc.write_operator_known_hosts();
    // Its new sshd authorizes only the operator: the hosts' keys would have to be re-added.
    std::fs::write(sc.path("expect"), fingerprints(&sc)).unwrap();
    let before = std::fs::read_to_string(sc.path(&format!("known_hosts.{}", sc.names[1]))).unwrap();
    let o = sc
        .weft(&args(&["--yes", "--expect-fingerprints", &expect]))
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    for on in [&sc.names[0], &sc.names[1], &sc.names[3]] {
        assert!(
            t.contains(&format!(
                "REFUSED {} [host key changed]: {on}'s known_hosts holds SHA256:",
                sc.names[2]
            )),
            "{t}"
        );
    }
    assert!(t.contains("nothing written"), "{t}");
    assert_eq!(
        std::fs::read_to_string(sc.path(&format!("known_hosts.{}", sc.names[1]))).unwrap(),
        before
    );
    // A key the expected fingerprints do not list is refused too.
    std::fs::write(sc.path("expect"), "").unwrap();
    let o = sc
        .weft(&args(&["--yes", "--expect-fingerprints", &expect]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("which the expected fingerprints do not list"),
        "{}",
        text(&o)
    );
}
