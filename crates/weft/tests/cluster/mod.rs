//! The fabric controller as a person runs it: `weft controller` and `weft agent` as
//! processes, `weft tenant|group|nodes|audit` against them, the real OpenSM (primary and
//! standby) on an ibsim fabric, each SM host behind its own real sshd on loopback (the
//! controller reaches both over SSH, throwaway host and user keys, strict host-key
//! checking), a kill -9 of the controller in the middle of a move, a standby host that
//! goes down and comes back, and a kill -9 of the master SM.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{ok, text, until};
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_fabric::{Guid, conf};
use weft_opensm::{Applier, DiagTools, LocalSm, SmHost, VerifyScope};
use weft_testbed::{Signal, SimFabric, SmHandle, SmSpec, Sshd, Topology};

pub(crate) const ADMIN: &str = "wfa_cluster-test-admin-0123456789abcdef";

/// A child process killed (by its pid) when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn weft_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.args(args)
        .current_dir(dir)
        .env_remove("WEFT_CONFIG")
        .env("WEFT_TOKEN", ADMIN);
    c
}

pub(crate) fn weft(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = weft_cmd(dir, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("weft runs")
}

struct Bed {
    fabric: SimFabric,
    sms: Vec<(SmHandle, PathBuf)>,
    /// The SM hosts' sshd, in the order of `sms`.
    sshd: Vec<Sshd>,
}

fn bed(topology: &Topology) -> Bed {
    let mut fabric = SimFabric::start(topology).expect("ibsim starts");
    let mut sms = Vec::new();
    for (name, host, priority) in [("primary", "smhost", 10u8), ("standby", "smhost2", 5)] {
        let etc = fabric.dir().join(format!("{name}-etc"));
        std::fs::create_dir_all(&etc).unwrap();
        let file = etc.join("partitions.conf");
        std::fs::write(&file, "Default=0x7fff, ipoib : ALL=full ;\n").unwrap();
        let h = fabric
            .start_sm(SmSpec::new(name, host, priority, &file))
            .expect("OpenSM starts");
        sms.push((h, file));
    }
    let sshd = vec![
        Sshd::start().expect("sshd starts"),
        Sshd::start().expect("sshd starts"),
    ];
    Bed { fabric, sms, sshd }
}

impl Bed {
    fn config_toml(&self) -> String {
        let mut t = String::from(
            "[fabric]\nverify_scope = \"all\"\nsweep_timeout_ms = 10000\n[fabric.diag]\n",
        );
        t.push_str(&format!(
            "cwd = \"{}\"\n[fabric.diag.env]\n",
            self.fabric.dir().display()
        ));
        for (k, v) in self.fabric.client_env("smhost") {
            t.push_str(&format!("{k} = \"{v}\"\n"));
        }
        // Each SM is reached over SSH through its own sshd; the paths are on its host.
        for ((h, file), sshd) in self.sms.iter().zip(&self.sshd) {
            t.push_str(&format!(
                "[[fabric.sm]]\nname = \"{}\"\nport_guid = \"{:#018x}\"\npartitions_file = \"{}\"\npid_file = \"{}\"\nlog_file = \"{}\"\n\
                 kind = \"ssh\"\nhost = \"{}\"\nport = {}\nuser = \"{}\"\nidentity_file = \"{}\"\nknown_hosts = \"{}\"\n\
                 connect_timeout_ms = 3000\ncommand_timeout_ms = 10000\n",
                h.name,
                h.port_guid,
                file.display(),
                h.pid_file.display(),
                h.log_file.display(),
                sshd.host(),
                sshd.port(),
                sshd.user(),
                sshd.identity_file().display(),
                sshd.known_hosts_file().display(),
            ));
        }
        t
    }

    fn applier(&self) -> Applier {
        Applier {
            sms: self
                .sms
                .iter()
                .map(|(h, file)| {
                    Box::new(LocalSm {
                        name: h.name.clone(),
                        port_guid: Guid(h.port_guid),
                        partitions_file: file.clone(),
                        pid_file: h.pid_file.clone(),
                        log_file: h.log_file.clone(),
                    }) as Box<dyn SmHost>
                })
                .collect(),
            diag: DiagTools {
                env: self.fabric.client_env("smhost"),
                cwd: Some(self.fabric.dir().to_path_buf()),
                timeout: Duration::from_secs(10),
                parallel: 4,
            },
            sm_options: Default::default(),
            verify_scope: VerifyScope::All,
            sweep_timeout: Duration::from_secs(10),
            verify_timeout: Duration::from_secs(5),
        }
    }

    /// Both SMs hold one file and every end port holds what it says; the P_Key tables
    /// of node1..node4.
    fn verified(&self) -> Vec<Vec<u16>> {
        let primary = std::fs::read_to_string(&self.sms[0].1).unwrap();
        assert_eq!(
            primary,
            std::fs::read_to_string(&self.sms[1].1).unwrap(),
            "primary and standby differ"
        );
        self.ports_hold(&primary)
    }

    /// Every end port holds what `file` says; the P_Key tables of node1..node4.
    fn ports_hold(&self, file: &str) -> Vec<Vec<u16>> {
        let a = self.applier();
        let v = a.verify(&conf::parse(file).unwrap()).unwrap();
        assert!(v.mismatches.is_empty(), "{:?}\n{file}", v.mismatches);
        let snap = a.diag.snapshot().unwrap();
        (1..=4)
            .map(|n| {
                let g = Guid(
                    self.fabric
                        .topology()
                        .port_guid(&format!("node{n}"), 1)
                        .unwrap(),
                );
                snap.tables.0.get(&g).cloned().unwrap_or_default()
            })
            .collect()
    }
}

/// A host that comes back: the sshd that `Sshd::kill` took down, started again from the
/// config `Sshd` wrote (same port, host key and authorized key). Killed with its session
/// processes, by pid, on drop.
struct SshdAgain(Child);

impl SshdAgain {
    fn start(sshd: &Sshd) -> SshdAgain {
        let log = sshd.dir().join("sshd-again.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(weft_testbed::SSHD)
            .args(["-D", "-e", "-f"])
            .arg(sshd.dir().join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("sshd starts again");
        let again = SshdAgain(child);
        let listening = format!("Server listening on 127.0.0.1 port {}.", sshd.port());
        until("sshd to listen again", Duration::from_secs(10), || {
            std::fs::read_to_string(&log)
                .ok()?
                .contains(&listening)
                .then_some(())
        });
        again
    }
}

impl Drop for SshdAgain {
    fn drop(&mut self) {
        let pid = self.0.id();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP);
        for p in descendants(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), Signal::SIGKILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every process below `root`, from /proc.
fn descendants(root: u32) -> Vec<u32> {
    let parent_of: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// Stops the controller with SIGTERM (so that it closes its SSH connections) and waits
/// for it, at most 10 s; the drop kills it otherwise.
fn stop(mut p: Proc) {
    let pid = nix::unistd::Pid::from_raw(p.0.id() as i32);
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if matches!(p.0.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(p);
}

/// The audit lines about `subject`, as (action, outcome).
fn audit_of(d: &Path, env: &[(&str, &str)], subject: &str) -> Vec<(String, String)> {
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&ok(weft(d, env, &["--json", "audit", "--limit", "1000"]))).unwrap();
    audit
        .iter()
        .filter(|e| e["subject"] == subject)
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `weft controller` and waits (bounded) for the line that says it listens.
fn start_controller(dir: &Path, port: u16) -> Proc {
    start_controller_with(dir, port, &[])
}

/// [`start_controller`] with more arguments for `weft controller`.
fn start_controller_with(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--config",
        "weft.toml",
        "controller",
        "--init",
        "--listen",
        &listen,
        "--metrics-listen",
        "127.0.0.1:0",
        "--db",
        "controller.db",
    ];
    args.extend_from_slice(extra);
    let mut child = weft_cmd(dir, &args)
        .env("WEFT_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("weft controller starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the controller says where it listens");
    assert!(line.contains(&listen), "{line}");
    Proc(child)
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn every_cluster_command_has_help_with_an_example() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["controller", "--help"][..],
        &["controller", "backup", "--help"],
        &["controller", "restore", "--help"],
        &["controller", "audit", "prune", "--help"],
        &["agent", "--help"],
        &["nodes", "--help"],
        &["nodes", "enroll", "--help"],
        &["nodes", "claims", "--help"],
        &["nodes", "approve", "--help"],
        &["group", "create", "--help"],
        &["group", "add", "--help"],
        &["group", "move", "--help"],
        &["group", "remove", "--help"],
        &["group", "list", "--help"],
        &["tenant", "create", "--help"],
        &["tenant", "list", "--help"],
        &["tenant", "token", "--help"],
        &["audit", "--help"],
        &["lease", "--help"],
        &["lease", "request", "--help"],
        &["lease", "list", "--help"],
        &["lease", "show", "--help"],
        &["lease", "extend", "--help"],
        &["lease", "release", "--help"],
        &["lease", "quota", "set", "--help"],
        &["lease", "quota", "list", "--help"],
        &["lease", "quota", "remove", "--help"],
    ] {
        let o = weft(dir.path(), &[], args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(text(&o).contains("Example"), "{args:?}: {}", text(&o));
    }
    // No controller there: an environment error, naming the address.
    let o = weft(
        dir.path(),
        &[("WEFT_CONTROLLER", "http://127.0.0.1:9")],
        &["nodes"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("127.0.0.1:9"), "{}", text(&o));
}

/// The whole story through the binary, both SMs reached over SSH: two tenants' groups;
/// a move during which the controller is killed with SIGKILL (after it wrote the move to
/// the standby SM, before it verified it) and restarted; a removal while the standby's
/// host is down (applied through the master, degraded, delivered again once the host is
/// back); kill -9 of the master SM (the standby takes over with the current file); the
/// removal of a group through the new master. The ports are checked after every step.
#[test]
fn the_controller_over_ssh_survives_kill_9_a_standby_host_down_and_a_master_sm_failover() {
    let topology = Topology::single_switch(4);
    let mut bed = bed(&topology);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), bed.config_toml()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let env = [("WEFT_CONTROLLER", url.as_str())];
    let mut controller = start_controller(d, port);

    // A wrong enrollment token: the agent is refused and exits 2.
    write_host(
        &d.join("host-x"),
        &HostSpec::new("nodex").with_hca(
            HcaSpec::new("mlx5_0", Guid(0x77_0000), "0000:01:00.0")
                .with_port(PortSpec::infiniband(1)),
        ),
    )
    .unwrap();
    let o = weft(
        d,
        &env,
        &[
            "agent",
            "--enroll-token",
            "wfe_wrong",
            "--state-file",
            "x.json",
            "--sysfs-root",
            "host-x",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("refused"), "{}", text(&o));

    // Four agents, as processes, with fixture hosts whose GUIDs are the fabric's.
    let mut agents = Vec::new();
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        let root = d.join(format!("host-{}", h.name));
        let mut hca = HcaSpec::new("mlx5_0", Guid(h.node_guid), "0000:01:00.0");
        for (p, _) in &h.port_guids {
            hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
        }
        write_host(&root, &HostSpec::new(h.name.clone()).with_hca(hca)).unwrap();
        let token = ok(weft(d, &env, &["nodes", "enroll", "--server", &h.name]))
            .trim()
            .to_string();
        let state = format!("{}.json", h.name);
        let child = weft_cmd(
            d,
            &[
                "agent",
                "--state-file",
                &state,
                "--sysfs-root",
                root.to_str().unwrap(),
                "--heartbeat-s",
                "0.5",
            ],
        )
        .env("WEFT_CONTROLLER", &url)
        .env("WEFT_ENROLL_TOKEN", token)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        agents.push(Proc(child));
    }
    until("four agents reporting", Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(weft(d, &env, &["--json", "nodes"]))).ok()?;
        let a = v.as_array()?;
        (a.len() == 4
            && a.iter()
                .all(|s| s["liveness"] == "ok" && !s["ports"].as_array().unwrap().is_empty()))
        .then_some(())
    });
    let table = ok(weft(d, &env, &["nodes"]));
    assert!(
        table.starts_with("NAME")
            && table.contains("node3")
            && table.contains("0x0002c90300000301"),
        "{table}"
    );
    // Each port with the rate its agent read from sysfs (`400G`), then its netdev's MTU
    // (`-`: these fixture ports have none).
    assert!(table.contains("0x0002c90300000301 400G/-"), "{table}");

    let alice = ok(weft(d, &env, &["tenant", "create", "alice"]))
        .trim()
        .to_string();
    ok(weft(d, &env, &["tenant", "create", "bob"]));
    // The first group makes Default isolating on a fabric that was open (`ALL=full`):
    // its output says what it takes from every port, though it named none of them.
    let out = ok(weft(
        d,
        &env,
        &["group", "create", "a", "--tenant", "alice"],
    ));
    assert!(
        out.contains("takes away")
            && out.contains("goes from full to limited in partition `Default`"),
        "{out}"
    );
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        for (_, g) in &h.port_guids {
            assert!(
                out.contains(&format!("port {}", Guid(*g))),
                "port {:#x} of {} is not named: {out}",
                g,
                h.name
            );
        }
    }
    assert!(out.contains("loses 0xffff"), "{out}");

    let v: serde_json::Value = serde_json::from_str(&ok(weft(
        d,
        &env,
        &["--json", "group", "create", "b", "--tenant", "bob"],
    )))
    .unwrap();
    assert!(
        v.get("taken").is_none(),
        "the second group takes nothing: {v}"
    );
    ok(weft(d, &env, &["group", "add", "a", "node1", "node2"]));
    let out = ok(weft(d, &env, &["group", "add", "b", "node3", "node4"]));
    assert!(out.contains("applied and verified"), "{out}");
    let t = bed.verified();
    let (ka, kb) = (0x8a01u16, 0x8a02u16);
    assert!(
        t[1].contains(&ka) && t[2].contains(&kb) && !t[1].contains(&kb),
        "{t:x?}"
    );
    // A tenant token sees its own group only.
    let seen = ok(weft(
        d,
        &[
            ("WEFT_CONTROLLER", url.as_str()),
            ("WEFT_TOKEN", alice.as_str()),
        ],
        &["group", "list"],
    ));
    assert!(seen.contains("alice") && !seen.contains("bob"), "{seen}");
    // ... and another tenant's group answers as one that does not exist.
    let as_alice = Client::new(
        &url,
        Some(Secret::new(alice.as_str())),
        Duration::from_secs(10),
    )
    .unwrap();
    let err = rt().block_on(as_alice.group("b")).unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert!(rt().block_on(as_alice.group("a")).is_ok());

    // The move; kill -9 the controller once the standby holds the new file.
    let before = std::fs::read_to_string(&bed.sms[1].1).unwrap();
    let out = ok(weft(
        d,
        &env,
        &["--json", "group", "move", "node2", "--to", "b", "--no-wait"],
    ));
    let op: serde_json::Value = serde_json::from_str(&out).unwrap();
    let op_id = op["id"].as_i64().unwrap();
    until("the move on the standby", Duration::from_secs(20), || {
        (std::fs::read_to_string(&bed.sms[1].1).ok()? != before).then_some(())
    });
    controller.0.kill().unwrap(); // SIGKILL
    controller.0.wait().unwrap();
    drop(controller);

    let controller = start_controller(d, port);
    let admin = Client::new(&url, Some(Secret::new(ADMIN)), Duration::from_secs(10)).unwrap();
    let done = rt()
        .block_on(admin.wait_applied(op_id, Duration::from_secs(30)))
        .unwrap();
    assert_eq!(done.action, "group.move node2 -> b");
    let t = bed.verified();
    assert!(
        t[1].contains(&kb) && !t[1].contains(&ka),
        "node2 fully in b: {t:x?}"
    );
    assert!(
        t[0].contains(&ka) && t[2].contains(&kb) && t[3].contains(&kb),
        "others untouched: {t:x?}"
    );

    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&ok(weft(d, &env, &["--json", "audit", "--limit", "1000"]))).unwrap();
    let subject = format!("operation {op_id}");
    let about: Vec<(&str, &str)> = audit
        .iter()
        .filter(|e| e["subject"] == subject.as_str())
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    eprintln!("audit of the interrupted move: {about:?}");
    // Either the kill came before verification (recovered, then applied) or just after
    // it (applied once); never anything else, and it ends applied.
    assert!(
        about == [("recover", "pending"), ("apply", "applied")] || about == [("apply", "applied")],
        "{about:?}"
    );
    let human = ok(weft(d, &env, &["audit", "--diff"]));
    assert!(
        human.contains("group.move") && human.contains("+b=0x0a02"),
        "{human}"
    );

    // Both SM hosts were reached over SSH with the throwaway key.
    for sshd in &bed.sshd {
        assert!(sshd.log().contains("Accepted publickey"), "{}", sshd.log());
    }

    // The standby's host goes down (sshd and its sessions killed): a removal is applied
    // and verified through the master, the standby is reported degraded and left as it
    // was; once the host is back, the controller delivers again and the standby catches up.
    let standby_before = std::fs::read_to_string(&bed.sms[1].1).unwrap();
    bed.sshd[1].kill().unwrap();
    let out = ok(weft(d, &env, &["group", "remove", "b", "node4"]));
    assert!(out.contains("applied and verified"), "{out}");
    until(
        "the standby reported degraded",
        Duration::from_secs(20),
        || {
            audit_of(d, &env, "sm standby")
                .contains(&("sm".into(), "degraded".into()))
                .then_some(())
        },
    );
    let primary_now = std::fs::read_to_string(&bed.sms[0].1).unwrap();
    assert_ne!(primary_now, standby_before);
    assert_eq!(
        std::fs::read_to_string(&bed.sms[1].1).unwrap(),
        standby_before,
        "the standby's host was down"
    );
    let t = bed.ports_hold(&primary_now);
    assert!(
        !t[3].contains(&kb) && t[2].contains(&kb),
        "node4 out of b: {t:x?}"
    );
    let detail: Vec<serde_json::Value> =
        serde_json::from_str(&ok(weft(d, &env, &["--json", "audit", "--limit", "5"]))).unwrap();
    assert!(
        detail.iter().any(|e| e["action"] == "apply"
            && e["outcome"] == "applied"
            && e["detail"].as_str().unwrap().contains("degraded")),
        "{detail:?}"
    );
    let again = SshdAgain::start(&bed.sshd[1]);
    until("the standby in sync again", Duration::from_secs(60), || {
        (audit_of(d, &env, "sm standby")
            == [
                ("sm".to_string(), "degraded".to_string()),
                ("sm".to_string(), "in-sync".to_string()),
            ])
        .then_some(())
    });
    let t = bed.verified();
    assert!(!t[3].contains(&kb) && !t[3].contains(&ka), "{t:x?}");

    // kill -9 the master SM: the standby takes over with the current file, and every
    // port holds what the controller last applied.
    bed.fabric.kill_sm("primary", Signal::SIGKILL).unwrap();
    let took = bed
        .fabric
        .wait_master("node1", "standby", Duration::from_secs(60))
        .expect("the standby takes over");
    eprintln!("failover: standby MASTER after {took:?}");
    let status = rt().block_on(admin.status()).unwrap();
    let standby_file = std::fs::read(&bed.sms[1].1).unwrap();
    assert_eq!(
        status.applied_checksum.as_deref(),
        Some(weft_opensm::checksum(&standby_file).as_str()),
        "the new master holds what the controller applied"
    );
    // `weft fabric verify` (over SSH, against the master's file) once the new master swept.
    let fabric_env = [("WEFT_CONTROLLER", url.as_str())];
    until(
        "the ports verified under the new master",
        Duration::from_secs(30),
        || {
            let o = weft(
                d,
                &fabric_env,
                &["--config", "weft.toml", "fabric", "verify"],
            );
            (o.status.code() == Some(0)).then(|| text(&o))
        },
    );
    let t = bed.verified();
    assert!(
        t[0].contains(&ka) && t[1].contains(&kb) && t[2].contains(&kb),
        "after failover: {t:x?}"
    );

    // Remove a whole group through the new master (the old master's host still takes
    // the file over SSH).
    let out = ok(weft(d, &env, &["group", "remove", "a"]));
    assert!(out.contains("applied and verified"), "{out}");
    let t = bed.verified();
    assert!(
        !t[0].contains(&ka) && !t[1].contains(&ka) && t[1].contains(&kb) && t[2].contains(&kb),
        "group a gone: {t:x?}"
    );

    stop(controller);
    drop(again);
    drop(agents);
}

/// `weft fabric apply` with both SMs over SSH and the standby's host down: the master is
/// updated and verified, the output warns that the standby was left out, and the exit
/// code is 1 (the standby would bring the old file back if it took over); run again once
/// the host is back, the apply exits 0 with both SMs holding the file.
#[test]
fn fabric_apply_over_ssh_with_the_standby_down_warns_and_exits_1_until_retried() {
    let mut bed = bed(&Topology::single_switch(4));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), bed.config_toml()).unwrap();
    std::fs::write(
        d.join("plan.toml"),
        "[default]\npolicy = \"isolate\"\n[[partition]]\nname = \"alice\"\ntenant = \"alice\"\npkey = \"0x0a0a\"\nmembers = [{ node = \"node1\" }, { node = \"node2\" }]\n",
    )
    .unwrap();
    let standby_before = std::fs::read_to_string(&bed.sms[1].1).unwrap();
    bed.sshd[1].kill().unwrap();
    // The fabric starts open (Default ALL=full); the plan isolates it: a removal.
    let apply = [
        "--config",
        "weft.toml",
        "fabric",
        "apply",
        "plan.toml",
        "--allow-removal",
    ];
    let o = weft(d, &[], &apply);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("applied: "), "{out}");
    assert!(
        out.contains("WARN SM `standby` was not updated") && out.contains("unreachable"),
        "{out}"
    );
    assert!(
        out.contains("applied and verified on the master `primary`; standby `standby` unreachable"),
        "{out}"
    );
    let primary = std::fs::read_to_string(&bed.sms[0].1).unwrap();
    assert!(primary.contains("0x0a0a"), "{primary}");
    assert_eq!(
        std::fs::read_to_string(&bed.sms[1].1).unwrap(),
        standby_before
    );
    let t = bed.ports_hold(&primary);
    assert!(t[0].contains(&0x8a0a) && !t[2].contains(&0x8a0a), "{t:x?}");
    // --json says the same, with the same exit code.
    let o = weft(d, &[], &[&["--json"][..], &apply].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["degraded"], serde_json::json!(["standby"]), "{r}");

    let _again = SshdAgain::start(&bed.sshd[1]);
    let o = weft(d, &[], &apply);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("WARN"), "{}", text(&o));
    bed.verified();
}

/// Honest messages: under `--no-fabric` a change is "recorded, no fabric", never
/// "verified"; a change that is not applied within the wait says it stays pending (and
/// exits 1); the controller does not start without a strong admin token, nor a second
/// time on one store.
#[test]
fn the_cli_never_claims_a_verification_that_did_not_happen() {
    let scratch = tempfile::tempdir().unwrap();
    let d = scratch.path();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let env = [("WEFT_CONTROLLER", url.as_str())];
    {
        let _ctl = start_controller_with(d, port, &["--no-fabric"]);
        ok(weft(d, &env, &["tenant", "create", "alice"]));
        let out = ok(weft(
            d,
            &env,
            &["group", "create", "a", "--tenant", "alice"],
        ));
        assert!(out.contains("recorded, no fabric"), "{out}");
        assert!(!out.contains("applied and verified"), "{out}");
        // A second controller on the same store refuses to start.
        let second = weft_cmd(
            d,
            &[
                "--config",
                "weft.toml",
                "controller",
                "--init",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--db",
                "controller.db",
                "--no-fabric",
            ],
        )
        .env("WEFT_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
        assert_ne!(second.status.code(), Some(0), "{}", text(&second));
        assert!(
            text(&second).contains("another controller uses this store"),
            "{}",
            text(&second)
        );
    }
    // A weak admin token: no start.
    let weak = weft_cmd(
        d,
        &[
            "controller",
            "--init",
            "--no-fabric",
            "--db",
            "other.db",
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .env("WEFT_ADMIN_TOKEN", "short")
    .output()
    .unwrap();
    assert_ne!(weak.status.code(), Some(0), "{}", text(&weak));
    assert!(text(&weak).contains("128 bits"), "{}", text(&weak));

    // An SM that cannot be reached: the change stays pending, and the CLI says so.
    std::fs::write(
        d.join("weft.toml"),
        format!(
            "[fabric]\n[fabric.diag]\ncwd = \"{dir}\"\n[fabric.diag.env]\nIBSIM_SOCKNAME = \"weft-no-such-sim\"\n\
             [[fabric.sm]]\nname = \"nowhere\"\nport_guid = \"0x0002c90300000001\"\n\
             partitions_file = \"{dir}/partitions.conf\"\npid_file = \"{dir}/no-opensm.pid\"\nlog_file = \"{dir}/osm.log\"\n",
            dir = d.display()
        ),
    )
    .unwrap();
    let _ctl = start_controller(d, port);
    let o = weft(
        d,
        &env,
        &["group", "create", "b", "--tenant", "alice", "--wait-s", "2"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("stays pending"), "{}", text(&o));
    assert!(!text(&o).contains("applied and verified"), "{}", text(&o));
}

/// Starts `weft controller` with `args` (after `--config weft.toml controller`) and
/// returns it with its stdout lines so far (up to the one that says where it listens).
fn start_controller_args(dir: &Path, args: &[&str]) -> (Proc, String) {
    let mut all = vec!["--config", "weft.toml", "controller", "--init"];
    all.extend_from_slice(args);
    let mut child = weft_cmd(dir, &all)
        .env("WEFT_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("weft controller starts");
    let stdout = child.stdout.take().unwrap();
    // Killed (by pid) on drop, also when the wait below fails.
    let child = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut text = String::new();
        // The listen line, and with TLS the certificate's line after it.
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            text.push_str(&line);
            if line.contains("TLS certificate") || line.contains("api http://") {
                break;
            }
        }
        let _ = tx.send(text);
        // Keep draining so the controller never blocks on a full pipe.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let text = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the controller says where it listens");
    (child, text)
}

/// The store's commands as an operator runs them: no store without `--init` (exit 2, naming
/// the file and the flag); `backup` while the controller runs (JSON, a new 0600 file, never
/// over an existing one); `restore --from` refused while it runs, naming the holder, and
/// done once it is stopped (killed: its lease is taken over on this host), raising the
/// fencing number.
#[test]
fn backup_while_running_and_restore_only_once_stopped_through_the_cli() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let run = [
        "--no-fabric",
        "--db",
        "controller.db",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let o = weft_cmd(d, &[&["controller"][..], &run].concat())
        .env("WEFT_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("controller.db") && text(&o).contains("--init"),
        "{}",
        text(&o)
    );
    assert!(!d.join("controller.db").exists());

    let (ctl, _) = start_controller_args(d, &run);
    let backup = [
        "--json",
        "controller",
        "backup",
        "--db",
        "controller.db",
        "b.db",
    ];
    let o = weft(d, &[], &backup);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["path"] == "b.db" && v["bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
    let mode = std::fs::metadata(d.join("b.db"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let o = weft(d, &[], &backup);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exists already"), "{}", text(&o));

    let restore = [
        "controller",
        "restore",
        "--from",
        "b.db",
        "--db",
        "controller.db",
        "--no-fabric",
    ];
    let o = weft(d, &[], &restore);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("another controller uses this store"),
        "{}",
        text(&o)
    );
    drop(ctl);
    let o = weft(d, &[], &restore);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("fencing number 1 -> 2"), "{}", text(&o));
}

/// `weft controller audit prune` on a running controller's SQLite store: a cut-off after
/// now is refused (exit 2, JSON error naming it, nothing deleted); a cut-off of now deletes
/// every older line in one go under an `audit.prune` line that the API's audit shows (who,
/// the count), and the controller goes on serving and auditing. (The store's side, both
/// backends and the trigger, is in weft-controller's store tests.)
#[test]
fn the_audit_is_pruned_through_the_cli_under_a_line_that_records_it_while_the_controller_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let run = [
        "--no-fabric",
        "--db",
        "controller.db",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let (_ctl, listen) = start_controller_args(d, &run);
    let base = listen
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let api = [("WEFT_CONTROLLER", base.as_str())];
    for tenant in ["alice", "bob"] {
        let o = weft(d, &api, &["tenant", "create", tenant]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let audit = || -> Vec<serde_json::Value> {
        let o = weft(d, &api, &["--json", "audit", "--limit", "1000"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let before_prune = audit();
    assert!(before_prune.len() >= 2, "{before_prune:?}");
    // Every line so far is at least a second old at the cut-off.
    std::thread::sleep(Duration::from_millis(1100));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();

    let future = (now + 3600).to_string();
    let prune = [
        "--json",
        "controller",
        "audit",
        "prune",
        "--db",
        "controller.db",
    ];
    let o = weft(d, &[], &[&prune[..], &["--before", &future]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let msg = err.to_string();
    assert!(msg.contains(&future) && msg.contains("after now"), "{msg}");
    assert_eq!(audit().len(), before_prune.len());

    let cut = now.to_string();
    let o = weft(d, &[], &[&prune[..], &["--before", &cut]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["before"], now, "{r}");
    assert_eq!(r["count"], before_prune.len() as u64, "{r}");
    let after = audit();
    assert_eq!(after.len(), 1, "{after:?}");
    let line = &after[0];
    assert_eq!(line["action"], "audit.prune", "{line}");
    assert_eq!(line["id"], r["line"], "{line}");
    assert!(
        line["actor"].as_str().unwrap().starts_with("operator:"),
        "{line}"
    );
    assert!(
        line["subject"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{} lines", before_prune.len())),
        "{line}"
    );
    // The controller goes on: a change is served and audited after the prune line.
    let o = weft(d, &api, &["tenant", "create", "carol"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last = audit();
    assert!(
        last.len() > 1 && last[0]["action"] == "audit.prune",
        "{last:?}"
    );
}

/// `weft controller --store URL` on a real PostgreSQL (weft_testbed::Postgres): an empty
/// database is refused without `--init`, naming the store and the flag; with it the
/// controller serves from PostgreSQL (`weft tenants create` lands there); `backup` while it
/// runs writes a new 0600 pg_dump archive (JSON report) and never over a file (exit 2);
/// `restore --from` over a database with tables is refused (exit 2); `restore` is refused
/// while the controller runs and raises the fencing number once it is stopped; `restore
/// --from` into a fresh database brings the tenant back and raises its fencing number.
#[test]
fn a_controller_on_postgresql_through_the_cli_backed_up_with_pg_dump_and_restored_fresh() {
    if let Err(why) = weft_testbed::Postgres::available() {
        weft_netns::require::skip("weft controller --store postgres", &why);
        return;
    }
    let pg = weft_testbed::Postgres::start().expect("start PostgreSQL");
    let url = pg.database("weft").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let run = [
        "--no-fabric",
        "--store",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let o = weft_cmd(d, &[&["controller"][..], &run].concat())
        .env("WEFT_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&url) && text(&o).contains("--init"),
        "{}",
        text(&o)
    );

    let (ctl, listen) = start_controller_args(d, &run);
    let base = listen
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let o = weft(
        d,
        &[("WEFT_CONTROLLER", &base)],
        &["tenant", "create", "bob"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let psql = Command::new(std::path::Path::new(weft_testbed::PG_BIN).join("psql"))
        .args([&url, "-qAt", "-c", "SELECT name FROM tenants"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&psql.stdout).trim(),
        "bob",
        "{psql:?}"
    );

    // A backup while it runs: pg_dump of one snapshot, a new 0600 file, never over one.
    let o = weft(
        d,
        &[("WEFT_STORE_URL", &url)],
        &["--json", "controller", "backup", "b.pgdump"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["bytes"].as_u64().unwrap() > 0 && v["audit_lines"].as_u64().unwrap() >= 1,
        "{v}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join("b.pgdump"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let o = weft(
        d,
        &[("WEFT_STORE_URL", &url)],
        &["controller", "backup", "b.pgdump"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exists already"), "{}", text(&o));
    let restore = ["controller", "restore", "--store", &url, "--no-fabric"];
    // Never over a store: the live database holds tables.
    let o = weft(d, &[], &[&restore[..], &["--from", "b.pgdump"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("fresh, empty database"), "{}", text(&o));
    let o = weft(d, &[], &restore);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("another controller uses this store"),
        "{}",
        text(&o)
    );
    drop(ctl);
    let o = weft(d, &[], &restore);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The controller took the leader's lease at start (fencing 1 -> 2); the restore goes
    // above that.
    assert!(text(&o).contains("fencing number 2 -> 3"), "{}", text(&o));
    // Into a fresh database: bob is there, and the fencing number rose past the backup's.
    let fresh = pg.database("fresh").unwrap();
    let o = weft(
        d,
        &[],
        &[
            "controller",
            "restore",
            "--store",
            &fresh,
            "--no-fabric",
            "--from",
            "b.pgdump",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("fencing number 2 -> 3"), "{}", text(&o));
    let psql = Command::new(std::path::Path::new(weft_testbed::PG_BIN).join("psql"))
        .args([&fresh, "-qAt", "-c", "SELECT name FROM tenants"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&psql.stdout).trim(),
        "bob",
        "{psql:?}"
    );
}

/// TLS through the binary: plain HTTP off loopback is refused (controller and client)
/// unless `--insecure-http`; `--tls-self-signed` prints the fingerprint, keeps it across
/// restarts, and the CLI and an agent process speak https with `--pin` (or the
/// certificate as `--ca-file`); a wrong pin exits 2 naming both fingerprints.
#[test]
fn tls_end_to_end_through_the_cli_and_an_agent_and_plain_http_only_on_loopback() {
    let scratch = tempfile::tempdir().unwrap();
    let d = scratch.path();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let port = free_port();
    let wildcard = format!("0.0.0.0:{port}");
    let base = [
        "--no-fabric",
        "--db",
        "controller.db",
        "--metrics-listen",
        "127.0.0.1:0",
        "--listen",
    ];
    // Plain HTTP on every address: refused, naming the flag.
    let o = weft_cmd(
        d,
        &[
            &["--config", "weft.toml", "controller", "--init"][..],
            &base,
            &[&wildcard],
        ]
        .concat(),
    )
    .env("WEFT_ADMIN_TOKEN", ADMIN)
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--insecure-http") && text(&o).contains(&wildcard),
        "{}",
        text(&o)
    );
    // A client refuses http:// off loopback before sending its token.
    let o = weft(
        d,
        &[("WEFT_CONTROLLER", "http://192.0.2.1:7100")],
        &["nodes"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--insecure-http"), "{}", text(&o));

    let fingerprint = {
        let (_ctl, out) =
            start_controller_args(d, &[&base[..], &[&wildcard, "--tls-self-signed"]].concat());
        assert!(out.contains(&format!("api https://{wildcard}")), "{out}");
        let fp = out
            .split_whitespace()
            .find(|w| w.starts_with("sha256:"))
            .unwrap_or_else(|| panic!("a fingerprint in {out}"))
            .to_string();
        let url = format!("https://127.0.0.1:{port}");
        let env = [("WEFT_CONTROLLER", url.as_str()), ("WEFT_PIN", fp.as_str())];
        ok(weft(d, &env, &["tenant", "create", "alice"]));
        // The certificate as a CA file works too (its names include 127.0.0.1).
        let o = weft(
            d,
            &[("WEFT_CONTROLLER", url.as_str())],
            &["tenant", "list", "--ca-file", "weft-controller.crt"],
        );
        assert!(ok(o).contains("alice"));
        // An agent process over https with the pin.
        write_host(
            &d.join("host-x"),
            &HostSpec::new("nodex").with_hca(
                HcaSpec::new("mlx5_0", Guid(0x77_0000), "0000:01:00.0")
                    .with_port(PortSpec::infiniband(1)),
            ),
        )
        .unwrap();
        let token = ok(weft(d, &env, &["nodes", "enroll", "--server", "nodex"]))
            .trim()
            .to_string();
        let _agent = Proc(
            weft_cmd(
                d,
                &[
                    "agent",
                    "--state-file",
                    "x.json",
                    "--sysfs-root",
                    "host-x",
                    "--pin",
                    &fp,
                ],
            )
            .env("WEFT_CONTROLLER", &url)
            .env("WEFT_ENROLL_TOKEN", &token)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
        );
        until(
            "the agent to report over https",
            Duration::from_secs(20),
            || {
                let v: serde_json::Value =
                    serde_json::from_str(&ok(weft(d, &env, &["--json", "nodes"]))).ok()?;
                (v.as_array()?.len() == 1 && v[0]["liveness"] == "ok").then_some(())
            },
        );
        // A wrong pin: exit 2, both fingerprints named, for the CLI and for an agent.
        let wrong = format!("sha256:{}", "ab".repeat(32));
        let o = weft(
            d,
            &[
                ("WEFT_CONTROLLER", url.as_str()),
                ("WEFT_PIN", wrong.as_str()),
            ],
            &["nodes"],
        );
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains(&fp) && text(&o).contains("not the pinned one"),
            "{}",
            text(&o)
        );
        let o = weft_cmd(
            d,
            &[
                "agent",
                "--state-file",
                "y.json",
                "--sysfs-root",
                "host-x",
                "--pin",
                &wrong,
            ],
        )
        .env("WEFT_CONTROLLER", &url)
        .env("WEFT_ENROLL_TOKEN", &token)
        .output()
        .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("not the pinned one"), "{}", text(&o));
        fp
    };
    // A restart keeps the certificate, so the pin still holds; the plain listener on
    // loopback needs no flag, and --insecure-http allows the wildcard.
    let (_ctl, out) =
        start_controller_args(d, &[&base[..], &[&wildcard, "--tls-self-signed"]].concat());
    assert!(out.contains(&fingerprint), "{out}");
}

/// One owner and drift, through the binary with the real OpenSM: a file written by
/// `weft fabric apply` is adopted by `weft controller --adopt` (its partition kept on the
/// ports); `weft fabric apply` then refuses the owned file without `--force`; editing the
/// master's file and changing the ports behind weft's back (another file, SIGHUP, the
/// applied file put back) are each drift in `weft fabric status`, `weft fabric verify`
/// (no plan: against what the controller applied) and the audit log.
#[test]
fn the_controller_adopts_what_fabric_apply_wrote_owns_the_file_and_sees_drift() {
    let topology = Topology::single_switch(4);
    let bed = bed(&topology);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    std::fs::write(
        d.join("weft.toml"),
        format!("{}[controller]\nurl = \"{url}\"\n", bed.config_toml()),
    )
    .unwrap();
    std::fs::write(
        d.join("plan.toml"),
        "[default]\npolicy = \"isolate\"\n[[partition]]\nname = \"legacy\"\ntenant = \"ops\"\npkey = \"0x0b0b\"\nmembers = [{ node = \"node1\" }, { node = \"node2\" }]\n",
    )
    .unwrap();
    let apply = [
        "--config",
        "weft.toml",
        "fabric",
        "apply",
        "plan.toml",
        "--allow-removal",
    ];
    ok(weft(d, &[], &apply));
    let (_ctl, _) = start_controller_args(
        d,
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--db",
            "controller.db",
            "--adopt",
            "--recheck-s",
            "1",
            "--port-check-s",
            "1",
        ],
    );
    let cfg = ["--config", "weft.toml"];
    ok(weft(
        d,
        &[],
        &[&cfg[..], &["tenant", "create", "alice"]].concat(),
    ));
    let out = ok(weft(
        d,
        &[],
        &[&cfg[..], &["group", "create", "a", "--tenant", "alice"]].concat(),
    ));
    assert!(out.contains("applied and verified"), "{out}");
    // Refusals are usage errors (exit 2, as the README says), in the one JSON shape with
    // the HTTP status: a name that does not exist (404), one that exists already (409).
    for (args, status) in [
        (&["group", "remove", "nosuch"][..], 404),
        (&["group", "create", "a", "--tenant", "alice"][..], 409),
    ] {
        let o = weft(d, &[], &[&cfg[..], &["--json"], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["http_status"], status, "{args:?}: {v}");
        assert_eq!(v["exit"], 2, "{args:?}: {v}");
    }
    let primary = std::fs::read_to_string(&bed.sms[0].1).unwrap();
    assert!(
        primary.starts_with("# weft-owner: controller "),
        "{primary}"
    );
    assert!(primary.contains("legacy=0x0b0b"), "adopted: {primary}");
    let t = bed.verified();
    assert!(
        t[0].contains(&0x8b0b) && t[1].contains(&0x8b0b) && !t[2].contains(&0x8b0b),
        "{t:x?}"
    );

    // The owned file: `weft fabric apply` refuses it, naming the owner; nothing written.
    let o = weft(d, &[], &apply);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("managed by controller ") && text(&o).contains("--force"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read_to_string(&bed.sms[0].1).unwrap(), primary);
    let status = [&cfg[..], &["fabric", "status"]].concat();
    until("status in sync", Duration::from_secs(20), || {
        let o = weft(d, &[], &status);
        (o.status.code() == Some(0) && text(&o).contains("controller drift check: in sync"))
            .then_some(())
    });

    // Drift 1: the master's file edited behind the controller's back.
    let edited = format!("{primary}intruder=0x0c0c : ALL=full ;\n");
    std::fs::write(&bed.sms[0].1, &edited).unwrap();
    let o = until(
        "status to show the file drift",
        Duration::from_secs(20),
        || {
            let o = weft(d, &[], &status);
            text(&o).contains("DRIFT").then_some(o)
        },
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("SM `primary` holds checksum"),
        "{}",
        text(&o)
    );
    let o = weft(d, &[], &[&cfg[..], &["fabric", "verify"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not the one controller "), "{}", text(&o));
    std::fs::write(&bed.sms[0].1, &primary).unwrap();
    until("in sync again", Duration::from_secs(20), || {
        text(&weft(d, &[], &status))
            .contains("controller drift check: in sync")
            .then_some(())
    });

    // Drift 2: the ports changed behind weft's back. Another file is read by the master
    // (SIGHUP), then the applied file is put back without a reread: the files agree
    // with the controller, the ports do not.
    let stolen = primary.replace("legacy=0x0b0b", "legacy=0x0b0c");
    std::fs::write(&bed.sms[0].1, &stolen).unwrap();
    let a = bed.applier();
    let cursor = a.sms[0].log_cursor().unwrap();
    a.sms[0].request_reread().unwrap();
    a.sms[0]
        .wait_for_sweep(cursor, Duration::from_secs(10))
        .unwrap();
    std::fs::write(&bed.sms[0].1, &primary).unwrap();
    let o = until(
        "status to show the port drift",
        Duration::from_secs(30),
        || {
            let o = weft(d, &[], &status);
            (text(&o).contains("DRIFT") && text(&o).contains("0x8b0b")).then_some(o)
        },
    );
    assert!(
        !text(&o).contains("holds checksum"),
        "the files agree: {}",
        text(&o)
    );
    let o = weft(d, &[], &[&cfg[..], &["fabric", "verify"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("what controller "), "{}", text(&o));
    let audit = ok(weft(
        d,
        &[],
        &[&cfg[..], &["--json", "audit", "--limit", "200"]].concat(),
    ));
    let v: serde_json::Value = serde_json::from_str(&audit).unwrap();
    let drift: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "drift")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert!(
        drift.len() >= 3 && drift[0] == "drift" && drift[1] == "in-sync",
        "{drift:?}"
    );
    // --force replaces the owned file: the file no longer names the controller, and
    // `weft fabric status` still says what the controller's drift check found (exit 1).
    let o = weft(d, &[], &[&apply[..], &["--force"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = until(
        "status to show the drift after --force",
        Duration::from_secs(20),
        || {
            let o = weft(d, &[], &status);
            text(&o).contains("drift check: DRIFT").then_some(o)
        },
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains("owner: controller"), "{}", text(&o));
}

/// `weft lease` through the binaries, both SMs over SSH: a tenant leases the pool's two
/// nodes for a few seconds; the agents (processes) are warned before the end; the
/// controller is killed with SIGKILL the moment the lease is seen ended (its step
/// committed, the moves back to the pool delivered or not yet) and restarted: the moves
/// end verified on the ports (the tenant's key gone, the pool's back), each decision
/// recorded once.
#[test]
fn a_lease_ends_verified_after_kill_9_at_its_boundary() {
    let topology = Topology::single_switch(2);
    let bed = bed(&topology);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("weft.toml"), bed.config_toml()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let env = [("WEFT_CONTROLLER", url.as_str())];
    let lease_flags = ["--lease-warn-s", "6"];
    let controller = start_controller_with(d, port, &lease_flags);
    let mut agents = Vec::new();
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        let root = d.join(format!("host-{}", h.name));
        let mut hca = HcaSpec::new("mlx5_0", Guid(h.node_guid), "0000:01:00.0");
        for (p, _) in &h.port_guids {
            hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
        }
        write_host(&root, &HostSpec::new(h.name.clone()).with_hca(hca)).unwrap();
        let token = ok(weft(d, &env, &["nodes", "enroll", "--server", &h.name]))
            .trim()
            .to_string();
        let state = format!("{}.json", h.name);
        let notice = root.join("lease-ending");
        let hook = format!("echo $WEFT_LEASE_ID > {}", root.join("hook-ran").display());
        let child = weft_cmd(
            d,
            &[
                "agent",
                "--state-file",
                &state,
                "--sysfs-root",
                root.to_str().unwrap(),
                "--heartbeat-s",
                "0.5",
                "--lease-notice-file",
                notice.to_str().unwrap(),
                "--lease-hook",
                &hook,
            ],
        )
        .env("WEFT_CONTROLLER", &url)
        .env("WEFT_ENROLL_TOKEN", token)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        agents.push(Proc(child));
    }
    until("two agents reporting", Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(weft(d, &env, &["--json", "nodes"]))).ok()?;
        let a = v.as_array()?;
        (a.len() == 2 && a.iter().all(|s| s["liveness"] == "ok")).then_some(())
    });
    ok(weft(d, &env, &["tenant", "create", "provider"]));
    ok(weft(
        d,
        &env,
        &["group", "create", "pool", "--tenant", "provider"],
    ));
    ok(weft(d, &env, &["group", "add", "pool", "node1"]));
    ok(weft(d, &env, &["group", "add", "pool", "node2"]));
    let alice = ok(weft(d, &env, &["tenant", "create", "alice"]))
        .trim()
        .to_string();
    ok(weft(
        d,
        &env,
        &[
            "lease",
            "quota",
            "set",
            "alice",
            "--nodes",
            "2",
            "--node-hours",
            "1",
            "--period",
            "1d",
        ],
    ));
    let as_alice = [
        ("WEFT_CONTROLLER", url.as_str()),
        ("WEFT_TOKEN", alice.as_str()),
    ];
    // Refused over the quota: exit 1 with the reason.
    let o = weft(
        d,
        &as_alice,
        &["lease", "request", "--nodes", "3", "--for", "10s"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("quota of 2 nodes"), "{}", text(&o));
    let granted: serde_json::Value = serde_json::from_str(&ok(weft(
        d,
        &as_alice,
        &["--json", "lease", "request", "--nodes", "2", "--for", "20s"],
    )))
    .unwrap();
    assert_eq!(granted["lease"]["phase"], "active", "{granted}");
    let id = granted["lease"]["id"].as_u64().unwrap().to_string();
    let show = |env: &[(&str, &str)]| -> serde_json::Value {
        serde_json::from_str(&ok(weft(d, env, &["--json", "lease", "show", &id]))).unwrap()
    };
    // The ports: node1 and node2 carry `key` and not `not`.
    let ports_hold = |key: u16, not: u16| {
        let snap = bed.applier().diag.snapshot().ok()?;
        topology
            .end_nodes()
            .filter(|h| h.name.starts_with("node"))
            .all(|h| {
                let t = snap.tables.0.get(&Guid(h.first_port_guid().unwrap()));
                t.is_some_and(|t| t.contains(&key) && !t.contains(&not))
            })
            .then_some(())
    };
    let (pool_key, alice_key) = (0x8a01u16, 0x8a02u16);
    until(
        "the nodes in alice's partition",
        Duration::from_secs(60),
        || ports_hold(alice_key, pool_key),
    );
    // Warned on the nodes before the end, the lease `ending`.
    until("the hook on node1", Duration::from_secs(30), || {
        d.join("host-node1/hook-ran").exists().then_some(())
    });
    assert_eq!(show(&as_alice)["lease"]["phase"], "ending");
    assert!(
        std::fs::read_to_string(d.join("host-node1/lease-ending"))
            .unwrap()
            .starts_with(&format!("lease {id} ends"))
    );
    // kill -9 as soon as the end is committed.
    until("the lease ended", Duration::from_secs(30), || {
        (show(&as_alice)["lease"]["phase"] == "ended").then_some(())
    });
    let pid = nix::unistd::Pid::from_raw(controller.0.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGKILL).unwrap();
    drop(controller);
    let _controller = start_controller_with(d, port, &lease_flags);
    until(
        "the nodes back in the pool's partition",
        Duration::from_secs(60),
        || ports_hold(pool_key, alice_key),
    );
    let after = show(&as_alice);
    assert_eq!(after["lease"]["phase"], "ended");
    let kinds: Vec<&str> = after["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "grant", "move-in", "move-in", "warn", "move-out", "move-out"
        ]
    );
    let groups = ok(weft(d, &env, &["--json", "group", "list"]));
    let groups: serde_json::Value = serde_json::from_str(&groups).unwrap();
    let pool = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "pool")
        .unwrap();
    assert_eq!(pool["members"].as_array().unwrap().len(), 2, "{groups}");
}

/// A list of controller URLs through the CLI and `weft agent`: two SQLite controllers, the
/// one at the first URL stopped (killed), the second running. `WEFT_CONTROLLER_URLS` and
/// `[controller] urls` both reach the second (a write made once, a read that sees it), an
/// agent process given both URLs enrolls and reports there; with every URL dead the error
/// names each URL and what it said (exit 2); `url` and `urls` together in weft.toml are
/// refused, naming both.
#[test]
fn the_cli_and_an_agent_go_on_to_the_second_controller_when_the_first_is_dead() {
    let first_dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let d = scratch.path();
    std::fs::write(first_dir.path().join("weft.toml"), "").unwrap();
    std::fs::write(d.join("weft.toml"), "").unwrap();
    let (p1, p2) = (free_port(), free_port());
    let (u1, u2) = (
        format!("http://127.0.0.1:{p1}"),
        format!("http://127.0.0.1:{p2}"),
    );
    // The first controller ran, and died.
    stop(start_controller_with(
        first_dir.path(),
        p1,
        &["--no-fabric"],
    ));
    let _second = start_controller_with(d, p2, &["--no-fabric"]);

    let list = format!("{u1},{u2}");
    let env = [("WEFT_CONTROLLER_URLS", list.as_str())];
    ok(weft(d, &env, &["tenant", "create", "bob"]));
    std::fs::write(
        d.join("weft.toml"),
        format!("[controller]\nurls = [\"{u1}\", \"{u2}\"]\n"),
    )
    .unwrap();
    let listed = ok(weft(
        d,
        &[],
        &["--config", "weft.toml", "--json", "tenant", "list"],
    ));
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .filter(|t| t["name"] == "bob")
            .count(),
        1,
        "{v}"
    );

    // An agent with both URLs (from weft.toml) enrolls and reports at the second.
    write_host(
        &d.join("host-y"),
        &HostSpec::new("nodey").with_hca(
            HcaSpec::new("mlx5_0", Guid(0x78_0000), "0000:01:00.0")
                .with_port(PortSpec::infiniband(1)),
        ),
    )
    .unwrap();
    let token = ok(weft(d, &env, &["nodes", "enroll", "--server", "nodey"]))
        .trim()
        .to_string();
    let _agent = Proc(
        weft_cmd(
            d,
            &[
                "--config",
                "weft.toml",
                "agent",
                "--state-file",
                "y.json",
                "--sysfs-root",
                "host-y",
                "--heartbeat-s",
                "0.5",
            ],
        )
        .env_remove("WEFT_CONTROLLER")
        .env("WEFT_ENROLL_TOKEN", &token)
        .stdout(Stdio::null())
        .spawn()
        .unwrap(),
    );
    until(
        "the agent to report at the second URL",
        Duration::from_secs(20),
        || {
            let v: serde_json::Value =
                serde_json::from_str(&ok(weft(d, &env, &["--json", "nodes"]))).ok()?;
            (v.as_array()?.len() == 1 && v[0]["liveness"] == "ok").then_some(())
        },
    );

    // Every URL dead: exit 2 within the bound, each URL named with what it said.
    let u3 = format!("http://127.0.0.1:{}", free_port());
    let dead = format!("{u1},{u3}");
    let t = Instant::now();
    let o = weft(
        d,
        &[("WEFT_CONTROLLER_URLS", dead.as_str())],
        &["--json", "tenant", "list", "--timeout-s", "2"],
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let all = text(&o);
    assert!(
        all.contains(&u1) && all.contains(&u3) && all.contains("refused"),
        "{all}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tried: Vec<&str> = v["tried"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["url"].as_str().unwrap())
        .collect();
    assert!(
        tried.len() == 2 && tried[0].starts_with(&u1) && tried[1].starts_with(&u3),
        "{v}"
    );

    // `url` and `urls` together: refused, naming both.
    std::fs::write(
        d.join("weft.toml"),
        format!("[controller]\nurl = \"{u2}\"\nurls = [\"{u1}\", \"{u2}\"]\n"),
    )
    .unwrap();
    let o = weft(d, &[], &["--config", "weft.toml", "tenant", "list"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("`url` and `urls`"), "{}", text(&o));
}
