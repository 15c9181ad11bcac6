//! Integration tests against a real ibsim + OpenSM (Debian packages opensm, ibsim-utils,
//! infiniband-diags must be installed). They run in parallel; each fabric is isolated by its
//! own IBSIM_SOCKNAME.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use weft_testbed::{Signal, SimFabric, SmInfo, SmSpec, Topology};

fn write_partitions(f: &SimFabric, text: &str) -> PathBuf {
    let p = f.dir().join("partitions.conf");
    std::fs::write(&p, text).unwrap();
    p
}

fn pid_alive(pid: u32) -> bool {
    // Signal 0: existence check. A reaped child is gone (ESRCH).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[test]
fn single_switch_master_and_tenant_pkey() {
    let topo = Topology::single_switch(4);
    let mut f = SimFabric::start(&topo).unwrap();
    let n1 = topo.port_guid("node1", 1).unwrap();
    let parts = write_partitions(
        &f,
        &format!(
            "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n\
             tenantA=0x0a0a, ipoib : {n1:#018x}=full ;\n"
        ),
    );
    let sm = f
        .start_sm(SmSpec::new("sm1", "smhost", 10, &parts))
        .unwrap();
    assert_eq!(sm.port_guid, topo.port_guid("smhost", 1).unwrap());
    assert_eq!(
        std::fs::read_to_string(&sm.pid_file).unwrap().trim(),
        sm.pid.to_string()
    );

    let out = f.diag("node1", "sminfo", &[]).unwrap();
    assert!(out.contains("SMINFO_MASTER"), "{out}");
    let info = SmInfo::parse(&out).unwrap();
    assert_eq!(
        (info.guid, info.state, info.priority),
        (sm.port_guid, 3, 10)
    );

    let member = f
        .diag(
            "smhost",
            "smpquery",
            &["-G", "pkeys", &format!("{n1:#x}"), "1"],
        )
        .unwrap();
    assert!(member.contains("0x8a0a"), "{member}");
    assert!(member.contains("0x7fff"), "{member}");
    let n2 = topo.port_guid("node2", 1).unwrap();
    let other = f
        .diag(
            "smhost",
            "smpquery",
            &["-G", "pkeys", &format!("{n2:#x}"), "1"],
        )
        .unwrap();
    assert!(
        !other.contains("0x8a0a") && other.contains("0x7fff"),
        "{other}"
    );
}

#[test]
fn fat_tree_sa_lists_every_hca_port() {
    let topo = Topology::fat_tree(4, 2, 36, 4);
    assert!(topo.end_nodes().count() >= 32);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff, ipoib : ALL=full ;\n");
    let sm = f
        .start_sm(SmSpec::new("sm1", "smhost", 10, &parts))
        .unwrap();
    let log = std::fs::read_to_string(&sm.log_file).unwrap();
    assert!(log.contains("SUBNET UP"));

    // umad2sim truncates multi-record SA answers, so ask the SA one LID at a time.
    let lids = f.port_lids("smhost").unwrap();
    let mut seen = BTreeSet::new();
    let mut lids_of_dual = BTreeSet::new();
    for hca in topo.hcas() {
        for &(port, guid) in &hca.port_guids {
            let lid = *lids
                .get(&guid)
                .unwrap_or_else(|| panic!("{} port {port} ({guid:#x}) has no LID", hca.name));
            let nr = f
                .diag("smhost", "saquery", &["NR", &lid.to_string()])
                .unwrap();
            assert!(
                nr.contains(&format!("port_guid...............{guid:#018x}")),
                "{}: {nr}",
                hca.name
            );
            assert!(nr.contains(&format!("NodeDescription.........{}", hca.name)));
            seen.insert(guid);
            if hca.port_guids.len() == 2 {
                lids_of_dual.insert((hca.name.clone(), lid));
            }
        }
    }
    let expected: usize = topo.hcas().iter().map(|h| h.port_guids.len()).sum();
    assert_eq!(seen.len(), expected);
    // Every port of a dual-port HCA has its own LID.
    let duals = topo
        .hcas()
        .iter()
        .filter(|h| h.port_guids.len() == 2)
        .count();
    assert!(duals >= 9);
    assert_eq!(lids_of_dual.len(), 2 * duals);
}

#[test]
fn concurrent_fabrics_are_isolated() {
    let topo = Topology::single_switch(2);
    let (mut a, mut b) = std::thread::scope(|s| {
        let ha = s.spawn(|| SimFabric::start(&topo).unwrap());
        let hb = s.spawn(|| SimFabric::start(&topo).unwrap());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_ne!(a.sockname(), b.sockname());
    // Same GUIDs in both, same SM host: if they shared a fabric, ibsim would refuse the
    // second SM ("SM already exists") or one would become standby.
    let pa = write_partitions(&a, "Default=0x7fff : ALL=full ;\n");
    let pb = write_partitions(&b, "Default=0x7fff : ALL=full ;\n");
    a.start_sm(SmSpec::new("sm", "smhost", 10, &pa)).unwrap();
    // Before b has an SM, nothing answers there.
    assert!(b.diag("node1", "sminfo", &[]).is_err());
    b.start_sm(SmSpec::new("sm", "smhost", 3, &pb)).unwrap();
    let ia = SmInfo::parse(&a.diag("node1", "sminfo", &[]).unwrap()).unwrap();
    let ib = SmInfo::parse(&b.diag("node1", "sminfo", &[]).unwrap()).unwrap();
    assert_eq!((ia.priority, ia.state), (10, 3));
    assert_eq!((ib.priority, ib.state), (3, 3));
}

#[test]
fn standby_takes_over_after_kill_9() {
    let topo = Topology::single_switch(2);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n");
    f.start_sm(SmSpec::new("primary", "smhost", 10, &parts))
        .unwrap();
    let standby = f
        .start_sm(SmSpec::new("standby", "smhost2", 5, &parts))
        .unwrap();
    assert!(
        std::fs::read_to_string(&standby.log_file)
            .unwrap()
            .contains("Entering STANDBY")
    );
    f.wait_master("node1", "primary", Duration::from_secs(5))
        .unwrap();

    let t0 = Instant::now();
    f.kill_sm("primary", Signal::SIGKILL).unwrap();
    assert!(f.sm("primary").is_none());
    let took = f
        .wait_master("node1", "standby", Duration::from_secs(15))
        .unwrap();
    eprintln!(
        "failover: standby MASTER {:?} after kill -9 ({took:?} polling)",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(15));
}

#[test]
fn drop_stops_every_process_and_removes_dir() {
    let topo = Topology::single_switch(2);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff : ALL=full ;\n");
    f.start_sm(SmSpec::new("a", "smhost", 10, &parts)).unwrap();
    f.start_sm(SmSpec::new("b", "smhost2", 1, &parts)).unwrap();
    let pids = f.pids();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&p| pid_alive(p)));
    let dir = f.dir().to_path_buf();
    assert!(dir.exists());
    drop(f);
    for p in pids {
        assert!(!pid_alive(p), "pid {p} still exists after drop");
    }
    assert!(!dir.exists());
}

#[test]
fn sm_signals_and_restart() {
    let topo = Topology::single_switch(2);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff : ALL=full ;\n");
    let sm = f.start_sm(SmSpec::new("sm", "smhost", 10, &parts)).unwrap();
    // A second SM on the same HCA is refused up front.
    assert!(f.start_sm(SmSpec::new("dup", "smhost", 1, &parts)).is_err());
    // SIGHUP: heavy sweep, a new SUBNET UP after the offset.
    let off = std::fs::metadata(&sm.log_file).unwrap().len();
    f.kill_sm("sm", Signal::SIGHUP).unwrap();
    weft_testbed::wait_for_log(&sm.log_file, "SUBNET UP", off, Duration::from_secs(5)).unwrap();
    assert!(f.sm_running("sm"));
    f.kill_sm("sm", Signal::SIGTERM).unwrap();
    assert!(!f.sm_running("sm"));
    // Same name and host can be reused.
    f.start_sm(SmSpec::new("sm", "smhost", 10, &parts)).unwrap();
    f.wait_master("node2", "sm", Duration::from_secs(5))
        .unwrap();
}

#[test]
fn link_faults_via_console() {
    let topo = Topology::single_switch(2);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff : ALL=full ;\n");
    f.start_sm(SmSpec::new("sm", "smhost", 10, &parts)).unwrap();
    assert!(f.diag("node2", "sminfo", &[]).is_ok());
    f.unlink("node2").unwrap();
    // node2 is cut off: its SMPs go nowhere.
    assert!(
        f.diag_with_timeout("node2", "sminfo", &[], Duration::from_secs(5))
            .is_err()
    );
    f.relink("node2").unwrap();
    // The SM brings the port back to Active on a later sweep (poll up to 20 s).
    let start = Instant::now();
    while f.diag("node2", "sminfo", &[]).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "node2 never came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn diag_retries_when_ibsim_client_slots_are_full() {
    // 10 SMs = ibsim's 10 client slots.
    let topo = Topology::single_switch(9);
    let mut f = SimFabric::start(&topo).unwrap();
    let parts = write_partitions(&f, "Default=0x7fff : ALL=full ;\n");
    f.start_sm(SmSpec::new("master", "smhost", 10, &parts))
        .unwrap();
    for i in 1..=9 {
        f.start_sm(SmSpec::new(format!("s{i}"), format!("node{i}"), 0, &parts))
            .unwrap();
    }
    let victim = f.sm("s9").unwrap().pid;
    let f = &f;
    let t0 = Instant::now();
    let out = std::thread::scope(|s| {
        let h = s.spawn(move || f.diag("smhost2", "sminfo", &[]));
        std::thread::sleep(Duration::from_millis(500));
        // SIGTERM makes opensm detach cleanly, freeing a slot.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(victim as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        h.join().unwrap()
    });
    let out = out.unwrap();
    assert!(out.contains("SMINFO_MASTER"), "{out}");
    // It can only have succeeded after the slot was freed, i.e. it was refused and retried.
    assert!(
        t0.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t0.elapsed()
    );
}
