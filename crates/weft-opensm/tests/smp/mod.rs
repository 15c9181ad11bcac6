//! The one-client SMP reader ([`weft_opensm::SmpReader`]) against `smpquery pkeys` and
//! `sminfo` on the real OpenSM over ibsim: the ibsim socket path, the kernel umad device
//! path (served by umad2sim in a child process, as the diagnostic tools are), and the
//! snapshot's fallback to the tools.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use weft_opensm::{DiagTools, SmpPath, SmpReader, TableReader, parse_smpquery_pkeys};
use weft_testbed::{SimFabric, SmSpec, Topology};

/// A fat tree with tenant partitions, full and limited, `indx0` included, under one SM;
/// every cabled port and every switch's port 0.
fn fabric_with_partitions() -> (SimFabric, Vec<(u16, u8)>) {
    let topo = Topology::fat_tree(2, 2, 6, 3);
    let mut f = SimFabric::start(&topo).unwrap();
    let n1 = topo.port_guid("node1", 1).unwrap();
    let n3 = topo.port_guid("node3", 2).unwrap();
    let parts = f.dir().join("partitions.conf");
    std::fs::write(
        &parts,
        format!(
            "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n\
             a=0x0a0a, indx0 : {n1:#018x}=full, {n3:#018x} ;\n\
             b=0x0b0b : ALL_SWITCHES=full, {n1:#018x}=limited ;\n"
        ),
    )
    .unwrap();
    f.start_sm(SmSpec::new("sm1", "smhost", 10, &parts))
        .unwrap();
    let out = f.diag("node1", "ibnetdiscover", &["-p"]).unwrap();
    let mut ports: BTreeSet<(u16, u8)> = BTreeSet::new();
    for p in weft_testbed::parse_ibnetdiscover_ports(&out) {
        ports.insert((p.lid, p.port));
        if p.is_switch {
            ports.insert((p.lid, 0));
        }
    }
    assert!(ports.len() > 20, "{out}");
    (f, ports.into_iter().collect())
}

fn smpquery(f: &SimFabric, lid: u16, port: u8) -> (Vec<u16>, u16) {
    let text = f
        .diag(
            "node1",
            "smpquery",
            &["pkeys", &lid.to_string(), &port.to_string()],
        )
        .unwrap();
    parse_smpquery_pkeys(&text).unwrap()
}

fn ibsim_path(f: &SimFabric) -> SmpPath {
    SmpPath::from_env(&f.client_env("node1")).unwrap()
}

/// The reader reads, port by port, what `smpquery pkeys` reads (entries and capacity),
/// in one batch; the master is the one `sminfo` names; the client gives its ibsim slot
/// back when dropped.
#[test]
fn smp_reader_reads_what_smpquery_reads() {
    let (f, ports) = fabric_with_partitions();
    let path = ibsim_path(&f);
    assert!(matches!(path, SmpPath::Ibsim { .. }), "{path:?}");
    let mut smp = SmpReader::open(&path, Duration::from_secs(5)).unwrap();
    let got = smp.read_tables(&ports).unwrap();
    assert_eq!(got.len(), ports.len());
    let mut keys_seen = BTreeSet::new();
    for (&(lid, port), got) in ports.iter().zip(&got) {
        assert_eq!(got, &smpquery(&f, lid, port), "LID {lid} port {port}");
        keys_seen.extend(got.0.iter().copied().filter(|&k| k != 0));
    }
    // The comparison saw the partitions: full, limited, both tenant keys; and the
    // switches' external ports have their own (SwitchInfo) capacity.
    for k in [0xffff, 0x7fff, 0x8a0a, 0x0a0a, 0x8b0b, 0x0b0b] {
        assert!(keys_seen.contains(&k), "{k:#06x} not seen: {keys_seen:x?}");
    }
    let sminfo = f.diag("node1", "sminfo", &[]).unwrap();
    let master = weft_opensm::parse_sminfo(&sminfo).unwrap();
    assert_eq!(smp.master_sm().unwrap(), master.0, "{sminfo}");
    // A port number past the node's ports is refused by name, not read as empty.
    let err = smp.pkeys(ports[0].0, 200).unwrap_err().to_string();
    assert!(err.contains("port 200"), "{err}");
    drop(smp);
    for _ in 0..10 {
        let mut c = SmpReader::open(&path, Duration::from_secs(5)).unwrap();
        assert!(!c.pkeys(ports[0].0, ports[0].1).unwrap().0.is_empty());
    }
}

/// A snapshot reads the tables and the master with the one client; with `WEFT_SMP=off`
/// it reads them with `smpquery` and `sminfo`, and both see the same fabric.
#[test]
fn the_snapshot_reads_with_one_client_and_the_tools_fallback_agrees() {
    let (f, _) = fabric_with_partitions();
    let mut diag = DiagTools {
        env: f.client_env("node1"),
        cwd: Some(f.dir().to_path_buf()),
        ..DiagTools::default()
    };
    let smp = diag.snapshot().unwrap();
    assert!(
        matches!(&smp.read_by, TableReader::Smp { path } if path.starts_with("ibsim")),
        "{:?}",
        smp.read_by
    );
    diag.env.push(("WEFT_SMP".into(), "off".into()));
    let tools = diag.snapshot().unwrap();
    assert!(
        matches!(&tools.read_by, TableReader::Smpquery { reason } if reason.contains("WEFT_SMP=off")),
        "{:?}",
        tools.read_by
    );
    assert!(smp.tables.0.len() > 10);
    assert_eq!(smp.tables.0, tools.tables.0);
    assert_eq!(smp.inventory.sm_port_guid, tools.inventory.sm_port_guid);
    let caps = |s: &weft_opensm::FabricSnapshot| -> Vec<u16> {
        s.inventory.ports.iter().map(|p| p.pkey_capacity).collect()
    };
    assert_eq!(caps(&smp), caps(&tools));
    assert!(caps(&smp).iter().all(|&c| c > 0));
}

/// The kernel-device path (what runs on real hardware): the same reader code over
/// `/dev/infiniband/umad0`, in a child process that umad2sim serves as it serves the
/// diagnostic tools (it stands in for the kernel's open/ioctl/read/write/poll). It reads
/// what the ibsim path reads.
#[test]
fn the_umad_device_path_reads_what_the_ibsim_path_reads() {
    let (f, ports) = fabric_with_partitions();
    let want = SmpReader::open(&ibsim_path(&f), Duration::from_secs(5))
        .unwrap()
        .read_tables(&ports)
        .unwrap();
    let list: Vec<String> = ports.iter().map(|(l, p)| format!("{l}:{p}")).collect();
    let scratch = f.dir().join("umad-child");
    std::fs::create_dir_all(&scratch).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "smp::umad_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(f.client_env("node1"))
        .env("WEFT_UMAD_CHILD_PORTS", list.join(","))
        .current_dir(&scratch)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(str::to_string)
        .collect();
    let want: Vec<String> = want
        .iter()
        .map(|(t, cap)| format!("{cap} {t:x?}"))
        .collect();
    assert_eq!(got, want, "{stdout}");
    let sminfo = f.diag("node1", "sminfo", &[]).unwrap();
    let master = weft_opensm::parse_sminfo(&sminfo).unwrap();
    assert!(
        stdout.contains(&format!("master {:#x}", master.0)),
        "{stdout}"
    );
}

/// The child of [`the_umad_device_path_reads_what_the_ibsim_path_reads`]: runs only
/// under umad2sim's preload, which that test sets up.
#[test]
#[ignore = "the child process of the_umad_device_path_reads_what_the_ibsim_path_reads, run by it under umad2sim"]
fn umad_child() {
    let ports: Vec<(u16, u8)> = std::env::var("WEFT_UMAD_CHILD_PORTS")
        .unwrap()
        .split(',')
        .map(|s| {
            let (l, p) = s.split_once(':').unwrap();
            (l.parse().unwrap(), p.parse().unwrap())
        })
        .collect();
    let path = SmpPath::Umad {
        device: Some(PathBuf::from("/dev/infiniband/umad0")),
    };
    let mut smp = SmpReader::open(&path, Duration::from_secs(5)).unwrap();
    // The harness has printed `test ... ` without a newline.
    println!();
    for (t, cap) in smp.read_tables(&ports).unwrap() {
        println!("table {cap} {t:x?}");
    }
    println!("master {:#x}", smp.master_sm().unwrap());
}
