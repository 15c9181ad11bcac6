//! The fabric controller as a person runs it: `weft controller` and `weft agent` as
//! processes, `weft tenant|group|nodes|audit` against them, the real OpenSM (primary and
//! standby) on an ibsim fabric, and a kill -9 of the controller in the middle of a move.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_fabric::{Guid, conf};
use weft_opensm::{Applier, DiagTools, LocalSm, SmHost, VerifyScope};
use weft_testbed::{SimFabric, SmHandle, SmSpec, Topology};

const ADMIN: &str = "wfa_cluster-test-admin";

/// A child process killed (by its pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn weft_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.args(args)
        .current_dir(dir)
        .env_remove("WEFT_CONFIG")
        .env("WEFT_TOKEN", ADMIN);
    c
}

fn weft(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = weft_cmd(dir, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("weft runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> String {
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Bed {
    fabric: SimFabric,
    sms: Vec<(SmHandle, PathBuf)>,
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
    Bed { fabric, sms }
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
        for (h, file) in &self.sms {
            t.push_str(&format!(
                "[[fabric.sm]]\nname = \"{}\"\nport_guid = \"{:#018x}\"\npartitions_file = \"{}\"\npid_file = \"{}\"\nlog_file = \"{}\"\n",
                h.name,
                h.port_guid,
                file.display(),
                h.pid_file.display(),
                h.log_file.display()
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
        let a = self.applier();
        let v = a.verify(&conf::parse(&primary).unwrap()).unwrap();
        assert!(v.mismatches.is_empty(), "{:?}\n{primary}", v.mismatches);
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `weft controller` and waits (bounded) for the line that says it listens.
fn start_controller(dir: &Path, port: u16) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut child = weft_cmd(
        dir,
        &[
            "--config",
            "weft.toml",
            "controller",
            "--listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--db",
            "controller.db",
        ],
    )
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

fn until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn rt() -> tokio::runtime::Runtime {
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

/// The whole story through the binary; the controller is killed with SIGKILL after it
/// wrote the move to the standby SM and before it verified it, then restarted.
#[test]
fn a_move_survives_kill_9_of_the_controller_and_the_audit_says_how_it_ended() {
    let topology = Topology::single_switch(4);
    let bed = bed(&topology);
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

    let alice = ok(weft(d, &env, &["tenant", "create", "alice"]))
        .trim()
        .to_string();
    ok(weft(d, &env, &["tenant", "create", "bob"]));
    ok(weft(
        d,
        &env,
        &["group", "create", "a", "--tenant", "alice"],
    ));
    ok(weft(d, &env, &["group", "create", "b", "--tenant", "bob"]));
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
    drop(controller);
    drop(agents);
}
