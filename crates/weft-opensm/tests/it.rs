//! The OpenSM driver against the real OpenSM 3.3.23 on an ibsim simulated fabric.
//!
//! Each test starts its own fabric (private IBSIM_SOCKNAME and scratch dir), so they run
//! in parallel; the test bed kills every process it started when the fabric drops.

use std::time::Duration;

use weft_fabric::conf::{self, Conf};
use weft_fabric::{FabricPlan, Guid, Inventory, SmOptions};
use weft_opensm::{Applier, ApplyError, DiagTools, LocalSm, SmHost, VerifyScope, checksum};
use weft_testbed::{Signal, SimFabric, SmHandle, SmSpec, Topology};

/// What a fresh install has: one partition for everyone.
const OPEN: &str = "Default=0x7fff, ipoib : ALL=full ;\n";

struct Bed {
    fabric: SimFabric,
    sms: Vec<(SmHandle, std::path::PathBuf)>,
}

fn bed(topology: &Topology, standby: bool) -> Bed {
    let mut fabric = SimFabric::start(topology).expect("ibsim starts");
    let mut sms = Vec::new();
    let hosts: &[(&str, &str, u8)] = if standby {
        &[("primary", "smhost", 10), ("standby", "smhost2", 5)]
    } else {
        &[("primary", "smhost", 10)]
    };
    for (name, host, priority) in hosts {
        let etc = fabric.dir().join(format!("{name}-etc"));
        std::fs::create_dir_all(&etc).unwrap();
        let file = etc.join("partitions.conf");
        std::fs::write(&file, OPEN).unwrap();
        let h = fabric
            .start_sm(SmSpec {
                name: name.to_string(),
                sim_host: host.to_string(),
                priority: *priority,
                partitions_file: file.clone(),
                extra_config: Vec::new(),
            })
            .expect("OpenSM starts");
        sms.push((h, file));
    }
    Bed { fabric, sms }
}

impl Bed {
    fn local_sm(&self, i: usize) -> LocalSm {
        let (h, file) = &self.sms[i];
        LocalSm {
            name: h.name.clone(),
            port_guid: Guid(h.port_guid),
            partitions_file: file.clone(),
            pid_file: h.pid_file.clone(),
            log_file: h.log_file.clone(),
        }
    }

    fn applier(&self, sm_options: SmOptions) -> Applier {
        Applier {
            sms: (0..self.sms.len())
                .map(|i| Box::new(self.local_sm(i)) as Box<dyn SmHost>)
                .collect(),
            diag: DiagTools {
                env: self.fabric.client_env("node1"),
                cwd: Some(self.fabric.dir().to_path_buf()),
                timeout: Duration::from_secs(10),
                parallel: 4,
            },
            sm_options,
            verify_scope: VerifyScope::All,
            sweep_timeout: Duration::from_secs(5),
            verify_timeout: Duration::from_secs(3),
        }
    }
}

fn compile(plan: &str, inventory: &Inventory) -> Conf {
    let plan = FabricPlan::from_toml(plan).expect("plan parses");
    weft_fabric::compile(&plan, Some(inventory))
        .expect("plan is valid")
        .conf
}

const TWO_TENANTS: &str = r#"
[default]
policy = "isolate"
[[partition]]
name = "alice"
tenant = "alice"
pkey = "0x0a0a"
members = [{ node = "node1" }, { node = "node2" }]
[[partition]]
name = "bob"
tenant = "bob"
pkey = "0x0b0b"
members = [{ node = "node3" }, { node = "node4", membership = "limited" }]
"#;

fn port_of(inv: &Inventory, node: &str) -> Guid {
    inv.ports_of_node(node)[0].port_guid
}

#[test]
fn apply_programs_every_port_and_verify_agrees() {
    let bed = bed(&Topology::single_switch(4), false);
    let a = bed.applier(SmOptions::default());
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let report = a.apply(&conf, &snap).unwrap();
    assert!(report.changed);
    assert!(report.ports_verified >= 6, "{report:?}");

    let after = a.diag.snapshot().unwrap();
    let table = |node: &str| after.tables.0[&port_of(&after.inventory, node)].clone();
    assert!(table("node1").contains(&0x8a0a), "{:x?}", table("node1"));
    assert!(table("node4").contains(&0x0b0b), "{:x?}", table("node4"));
    assert!(!table("node3").contains(&0x8a0a), "{:x?}", table("node3"));
    // Isolated Default: end ports are limited members, the SM's port is full.
    assert!(table("node2").contains(&0x7fff) && !table("node2").contains(&0xffff));
    assert!(a.verify(&conf).unwrap().mismatches.is_empty());
    assert_eq!(
        std::fs::read_to_string(&bed.sms[0].1).unwrap(),
        conf::render(&conf)
    );
}

#[test]
fn verify_names_a_port_that_differs() {
    let bed = bed(&Topology::single_switch(4), false);
    let a = bed.applier(SmOptions::default());
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    // Nothing applied yet: the fabric still has the open Default partition.
    let v = a.verify(&conf).unwrap();
    let node1 = port_of(&snap.inventory, "node1");
    let m = v
        .mismatches
        .iter()
        .find(|m| m.port == node1)
        .expect("node1 differs");
    assert!(
        m.missing.contains(&0x8a0a) && m.unexpected.contains(&0xffff),
        "{m:?}"
    );
}

/// A real fault: the plan expects `=both` to give both keys (allow_both_pkeys), but this
/// OpenSM runs without -W and programs only the full key. Verification must fail and the
/// previous file must come back on the SM.
#[test]
fn a_failed_verification_restores_the_previous_file() {
    let bed = bed(&Topology::single_switch(4), false);
    let mut a = bed.applier(SmOptions {
        allow_both_pkeys: true,
    });
    // The faulty port is one the change touches, so the default scope must catch it.
    a.verify_scope = VerifyScope::Changed;
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(
        &TWO_TENANTS.replace(
            "{ node = \"node2\" }",
            "{ node = \"node2\", membership = \"both\" }",
        ),
        &snap.inventory,
    );
    let err = a.apply(&conf, &snap).unwrap_err();
    let ApplyError::RolledBack {
        mismatches,
        rollback,
        ..
    } = &err
    else {
        panic!("expected a rollback, got {err}");
    };
    let node2 = port_of(&snap.inventory, "node2");
    assert!(
        mismatches
            .iter()
            .any(|m| m.port == node2 && m.missing == vec![0x0a0a]),
        "{mismatches:?}"
    );
    assert!(rollback.contains("restored"), "{rollback}");
    assert_eq!(std::fs::read_to_string(&bed.sms[0].1).unwrap(), OPEN);
    // And the fabric is back to the open partition.
    let back = a.diag.snapshot().unwrap();
    assert!(back.tables.0[&node2].contains(&0xffff));
}

/// An SM that does not come back from the reread (stopped, so it never sweeps): the
/// apply fails within the sweep bound and the previous file is restored.
#[test]
fn an_sm_that_never_finishes_the_sweep_is_rolled_back_within_the_bound() {
    let bed = bed(&Topology::single_switch(4), false);
    let mut a = bed.applier(SmOptions::default());
    a.sweep_timeout = Duration::from_millis(700);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let pid = nix::unistd::Pid::from_raw(bed.sms[0].0.pid as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let start = std::time::Instant::now();
    let err = a.apply(&conf, &snap).unwrap_err();
    let took = start.elapsed();
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    assert!(matches!(err, ApplyError::RolledBack { .. }), "{err}");
    assert!(err.to_string().contains("primary"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(std::fs::read_to_string(&bed.sms[0].1).unwrap(), OPEN);
}

#[test]
fn primary_and_standby_hold_the_same_file_and_failover_keeps_every_pkey() {
    let mut bed = bed(&Topology::single_switch(4), true);
    let a = bed.applier(SmOptions::default());
    let snap = a.diag.snapshot().unwrap();
    assert_eq!(
        snap.inventory.sm_port_guid,
        Some(Guid(bed.sms[0].0.port_guid))
    );
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let report = a.apply(&conf, &snap).unwrap();
    let sums: Vec<_> = report.sms.iter().map(|s| s.checksum.clone()).collect();
    assert_eq!(sums[0], sums[1]);
    assert_eq!(
        sums[0].as_deref(),
        Some(checksum(conf::render(&conf).as_bytes()).as_str())
    );

    bed.fabric.kill_sm("primary", Signal::SIGKILL).unwrap();
    let (new_master, took) = a
        .wait_for_new_master(Guid(bed.sms[0].0.port_guid), Duration::from_secs(30))
        .unwrap();
    assert_eq!(new_master, 1, "the standby took over after {took:?}");
    // The new master swept with the same file: every tenant key is where it was; only
    // the Default membership of the two SM ports changes (SELF=full follows the master).
    let mut last = None;
    for _ in 0..50 {
        let v = a.verify(&conf).unwrap();
        if v.mismatches.is_empty() {
            last = None;
            break;
        }
        last = Some(v.mismatches);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(last, None, "ports differ after failover");
}

#[test]
fn a_fat_tree_with_dual_port_hcas_is_discovered_whole() {
    let topology = Topology::fat_tree(4, 2, 32, 4);
    let bed = bed(&topology, false);
    let a = bed.applier(SmOptions::default());
    let snap = a.diag.snapshot().unwrap();
    for hca in topology.hcas() {
        for (num, guid) in &hca.port_guids {
            let p = snap
                .inventory
                .port(Guid(*guid))
                .unwrap_or_else(|| panic!("{} port {num} missing", hca.name));
            assert_eq!(p.node_desc, hca.name);
            assert!(p.pkey_capacity > 0);
        }
    }
    // Dual-port HCAs: a node name resolves to both ports, and both are programmed.
    let dual = topology
        .hcas()
        .iter()
        .find(|h| h.port_guids.len() == 2)
        .expect("some HCA has two ports");
    let plan = format!(
        "[default]\npolicy = \"isolate\"\n[[partition]]\nname = \"t\"\ntenant = \"t\"\npkey = \"0x0123\"\nmembers = [{{ node = \"{}\" }}]\n",
        dual.name
    );
    let conf = compile(&plan, &snap.inventory);
    a.apply(&conf, &snap).unwrap();
    let after = a.diag.snapshot().unwrap();
    for (_, guid) in &dual.port_guids {
        assert!(after.tables.0[&Guid(*guid)].contains(&0x8123));
    }
}

/// Every shape weft renders is accepted by the real OpenSM: long member lists (one a
/// line), partition flags, multicast groups, all memberships, empty partitions. The
/// apply fails if OpenSM logs a parse error, so each apply succeeding is the proof.
#[test]
fn opensm_accepts_every_shape_weft_renders() {
    let bed = bed(&Topology::single_switch(4), false);
    let a = bed.applier(SmOptions::default());
    let snap = a.diag.snapshot().unwrap();
    let g = |node: &str| port_of(&snap.inventory, node);
    let (n1, n2, n3, n4) = (g("node1"), g("node2"), g("node3"), g("node4"));
    let sm = snap.inventory.sm_port_guid.unwrap();
    let shapes = [
        format!(
            "Default=0x7fff,ipoib : ALL=limited, SELF=full ;\n\
             long=0x0101,ipoib,mtu=4,rate=7,sl=1 : {n1}=full, {n2}=full, {n3}=full, {n4}=limited, {sm}=both ;\n"
        ),
        format!(
            "Default=0x7fff : ALL=limited, SELF=full ;\n\
             flags=0x0102,indx0,ipoib,mtu=5,rate=12,sl=2,scope=2,Q_Key=0x0b1b,TClass=4,FlowLabel=0x12345 : {n1}=full, {n2} ;\n\
             empty=0x0103 : NONE ;\n\
             cas=0x0104,defmember=full : ALL_CAS ;\n"
        ),
        format!(
            "Default=0x7fff,ipoib : ALL=limited, SELF=full ;\n\
             groups=0x0105,ipoib,rate=3,mtu=4 :\n  mgid=ff12:1234::1,sl=1\n  mgid=ff12:1234::2\n  {n1}=full, {n2}=full, {n3}=limited ;\n\
             only_groups=0x0106 :\n  mgid=ff12:1234::3\n  NONE ;\n"
        ),
    ];
    for text in &shapes {
        let conf = conf::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let rendered = conf::render(&conf);
        if let Err(e) = a.apply(&conf, &snap) {
            panic!("OpenSM did not take weft's rendering: {e}\n{rendered}");
        }
    }
}

/// The default scope reads back what a change touches (plus the SM's port and a few
/// canaries), not the whole fabric; the fabric still ends fully as planned.
#[test]
fn a_one_node_move_reads_back_only_what_it_touches() {
    let topology = Topology::fat_tree(2, 1, 12, 0);
    let bed = bed(&topology, false);
    let mut a = bed.applier(SmOptions::default());
    a.verify_scope = VerifyScope::Changed;
    let snap = a.diag.snapshot().unwrap();
    a.apply(&compile(TWO_TENANTS, &snap.inventory), &snap)
        .unwrap();
    let before = a.diag.snapshot().unwrap();
    let moved = compile(
        &TWO_TENANTS.replace("{ node = \"node2\" }", "{ node = \"node5\" }"),
        &before.inventory,
    );
    let report = a.apply(&moved, &before).unwrap();
    let end_ports = before.inventory.ports.len();
    // node2 and node5 change; plus the SM port and 4 canaries.
    assert!(report.ports_verified <= 2 + 1 + 4, "{report:?}");
    assert!(
        report.ports_verified < end_ports,
        "{report:?} of {end_ports}"
    );
    assert!(a.verify(&moved).unwrap().mismatches.is_empty());
}

mod smp;
mod ssh;

/// Regression: two `weft fabric apply` at once lost a change reported done (in 17 of 26
/// rounds one apply printed `applied` while the fabric ended on the old plan, the other
/// having rolled back to the file both had saved; in 2, primary and standby differed).
/// Now each apply holds every SM's lock from its first read to the end of any rollback:
/// 20 rounds of two applies started together, each round ending with both applies
/// `applied`, one plan whole on both SMs (the one that finished last), and the ports
/// holding it.
#[test]
fn two_applies_at_once_end_with_one_plan_whole_on_both_sms_and_the_last_one_holding() {
    let bed = bed(&Topology::single_switch(4), true);
    let probe = bed.applier(SmOptions::default());
    let inventory = probe.diag.snapshot().unwrap().inventory;
    let plans = [
        compile(TWO_TENANTS, &inventory),
        compile(
            &TWO_TENANTS.replace("0x0a0a", "0x0c0c").replace(
                "{ node = \"node4\", membership = \"limited\" }",
                "{ node = \"node4\" }",
            ),
            &inventory,
        ),
    ];
    let texts: Vec<String> = plans.iter().map(conf::render).collect();
    assert_ne!(texts[0], texts[1]);
    for round in 0..20 {
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<(Result<_, ApplyError>, std::time::Instant)> = std::thread::scope(|s| {
            let handles: Vec<_> = plans
                .iter()
                .map(|conf| {
                    let barrier = &barrier;
                    let bed = &bed;
                    s.spawn(move || {
                        // Each apply has its own SM handles, as two processes would.
                        let a = bed.applier(SmOptions::default());
                        barrier.wait();
                        let r = a
                            .diag
                            .snapshot()
                            .map_err(ApplyError::from)
                            .and_then(|snap| a.apply(conf, &snap));
                        (r, std::time::Instant::now())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, (r, _)) in results.iter().enumerate() {
            assert!(
                r.is_ok(),
                "round {round}, apply {i}: {:?}",
                r.as_ref().err()
            );
        }
        let last = if results[0].1 > results[1].1 { 0 } else { 1 };
        let files: Vec<String> = bed
            .sms
            .iter()
            .map(|(_, f)| std::fs::read_to_string(f).unwrap())
            .collect();
        assert_eq!(
            files[0], files[1],
            "round {round}: primary and standby differ"
        );
        assert_eq!(
            files[0], texts[last],
            "round {round}: the fabric is not on the plan of the apply that finished last"
        );
        let v = probe.verify(&plans[last]).unwrap();
        assert!(v.mismatches.is_empty(), "round {round}: {:?}", v.mismatches);
    }
    // No apply left a temporary file behind.
    for (_, f) in &bed.sms {
        let dir = f.parent().unwrap();
        let temps: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                n.ends_with(".tmp").then_some(n)
            })
            .collect();
        assert!(temps.is_empty(), "{temps:?}");
    }
}

/// A second apply that cannot get an SM's lock within its wait fails naming the holder,
/// and writes nothing.
#[test]
fn an_apply_that_cannot_get_the_lock_fails_naming_the_holder_and_writes_nothing() {
    let bed = bed(&Topology::single_switch(4), false);
    let mut a = bed.applier(SmOptions::default());
    a.sweep_timeout = Duration::from_millis(100);
    a.verify_timeout = Duration::from_millis(100);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let held = bed
        .local_sm(0)
        .lock(
            "weft apply test-holder on host elsewhere",
            Duration::from_secs(1),
        )
        .unwrap();
    let start = std::time::Instant::now();
    let err = a.apply(&conf, &snap).unwrap_err();
    let took = start.elapsed();
    assert!(
        err.to_string().contains("test-holder on host elsewhere"),
        "{err}"
    );
    assert!(
        took >= a.lock_wait() && took < a.lock_wait() + Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(std::fs::read_to_string(&bed.sms[0].1).unwrap(), OPEN);
    drop(held);
    a.sweep_timeout = Duration::from_secs(5);
    a.verify_timeout = Duration::from_secs(3);
    a.apply(&conf, &snap).unwrap();
}
