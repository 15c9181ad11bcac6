use std::fs;
use std::path::{Path, PathBuf};

use weft_agent::fixtures::{HcaSpec, HostSpec, NetDevSpec, PortSpec, write_host};
use weft_agent::{
    DiscoverError, Gpu, HostReport, LinkLayer, NetDev, NodeType, OperState, PhysState, PortState,
    RdmaDevice, RdmaPort, discover,
};
use weft_fabric::Guid;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn ndr_port(guid: u64, lid: u16, netdev: &str) -> RdmaPort {
    RdmaPort {
        num: 1,
        port_guid: Guid(guid),
        lid,
        sm_lid: 1,
        state: PortState::Active,
        phys_state: PhysState::LinkUp,
        rate_gbps: Some(400.0),
        rate_text: Some("400 Gb/sec (4X NDR)".into()),
        link_layer: LinkLayer::InfiniBand,
        pkeys: vec![0xffff, 0x8a0a],
        pkey_table_len: 4,
        netdevs: vec![netdev.into()],
    }
}

fn cx7(name: &str, node: u64, sys_image: u64, host: &str, port: RdmaPort) -> RdmaDevice {
    RdmaDevice {
        name: name.into(),
        node_guid: Guid(node),
        sys_image_guid: Guid(sys_image),
        node_type: NodeType::Ca,
        node_desc: format!("{host} {name}"),
        fw_ver: Some("28.39.1002".into()),
        hca_type: Some("MT4129".into()),
        ports: vec![port],
    }
}

#[allow(clippy::too_many_arguments)]
fn netdev(
    name: &str,
    mac: &str,
    mtu: u32,
    speed: Option<u32>,
    arp_type: u16,
    pci: Option<&str>,
    rdma: Option<&str>,
    addresses: &[&str],
) -> NetDev {
    NetDev {
        name: name.into(),
        mac: mac.into(),
        mtu,
        speed_mbps: speed,
        operstate: OperState::Up,
        arp_type,
        pci: pci.map(Into::into),
        rdma_device: rdma.map(Into::into),
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
    }
}

#[test]
fn connectx7_host_discovers_to_the_expected_report() {
    let report = discover(&fixture("connectx7-host")).unwrap();
    let expected = HostReport {
        hostname: "cx7-host".into(),
        rdma: vec![
            cx7(
                "mlx5_0",
                0x0002_c903_0001_0100,
                0x0002_c903_0001_0100,
                "cx7-host",
                ndr_port(0x0002_c903_0001_0101, 3, "ib0"),
            ),
            cx7(
                "mlx5_1",
                0x0002_c903_0001_0200,
                0x0002_c903_0001_0200,
                "cx7-host",
                ndr_port(0x0002_c903_0001_0201, 4, "ib1"),
            ),
        ],
        netdevs: vec![
            // A plain directory with `device_pci`, not the symlinked layout; `bonding_masters`
            // next to it is a file and is skipped.
            netdev(
                "eno1",
                "3c:ec:ef:10:20:31",
                1500,
                Some(1000),
                1,
                Some("0000:05:00.0"),
                None,
                &["192.168.1.11/24"],
            ),
            netdev(
                "ib0",
                "00:00:10:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:01:01:01",
                4092,
                Some(400_000),
                32,
                Some("0000:01:00.0"),
                Some("mlx5_0"),
                &["10.10.1.11/24"],
            ),
            netdev(
                "ib1",
                "00:00:10:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:01:02:01",
                4092,
                Some(400_000),
                32,
                Some("0000:02:00.0"),
                Some("mlx5_1"),
                &["10.10.2.11/24"],
            ),
        ],
        gpus: vec![],
    };
    assert_eq!(report, expected);
    assert_eq!(
        report.port_guids(),
        [Guid(0x0002_c903_0001_0101), Guid(0x0002_c903_0001_0201)]
    );

    let fabric = report.fabric_ports();
    assert_eq!(fabric.len(), 2);
    assert_eq!(fabric[1].port_guid, Guid(0x0002_c903_0001_0201));
    assert_eq!(fabric[1].node_guid, Guid(0x0002_c903_0001_0200));
    assert_eq!(
        (fabric[1].port_num, fabric[1].lid, fabric[1].pkey_capacity),
        (1, 4, 4)
    );
    assert_eq!(fabric[1].node_desc, "cx7-host mlx5_1");
}

#[test]
fn dgx_spark_shows_one_port_as_two_devices() {
    let report = discover(&fixture("dgx-spark")).unwrap();
    let roce = |guid: u64, ndev: &str| RdmaPort {
        num: 1,
        port_guid: Guid(guid),
        lid: 0,
        sm_lid: 0,
        state: PortState::Active,
        phys_state: PhysState::LinkUp,
        rate_gbps: Some(200.0),
        rate_text: Some("200 Gb/sec (4X HDR)".into()),
        link_layer: LinkLayer::Ethernet,
        pkeys: vec![0xffff],
        pkey_table_len: 1,
        netdevs: vec![ndev.into()],
    };
    let expected = HostReport {
        hostname: "spark1".into(),
        rdma: vec![
            // Sorted by name: `P` sorts before `p`.
            cx7(
                "roceP2p1s0f0",
                0x0002_c903_0002_0200,
                0x0002_c903_0002_0100,
                "spark1",
                roce(0x0202_c9ff_fe02_0201, "enP2p1s0f0np0"),
            ),
            cx7(
                "rocep1s0f0",
                0x0002_c903_0002_0100,
                0x0002_c903_0002_0100,
                "spark1",
                roce(0x0202_c9ff_fe02_0101, "enp1s0f0np0"),
            ),
        ],
        netdevs: vec![
            netdev(
                "enP2p1s0f0np0",
                "00:02:c9:02:02:01",
                9000,
                Some(200_000),
                1,
                Some("0002:01:00.0"),
                Some("roceP2p1s0f0"),
                &["192.168.101.11/24"],
            ),
            netdev(
                "enP7s7",
                "48:b0:2d:00:07:07",
                1500,
                Some(1000),
                1,
                Some("0007:01:00.0"),
                None,
                &["192.168.1.21/24"],
            ),
            netdev(
                "enp1s0f0np0",
                "00:02:c9:02:01:01",
                9000,
                Some(200_000),
                1,
                Some("0000:01:00.0"),
                Some("rocep1s0f0"),
                &["192.168.100.11/24"],
            ),
            NetDev {
                operstate: OperState::Unknown,
                ..netdev(
                    "lo",
                    "00:00:00:00:00:00",
                    65536,
                    None,
                    772,
                    None,
                    None,
                    &["127.0.0.1/8", "::1/128"],
                )
            },
        ],
        gpus: vec![Gpu {
            index: 0,
            name: "NVIDIA GB10".into(),
            uuid: Some("GPU-5b7c3e1a-9f0d-4c2e-8a61-0d3f2b1c9e10".into()),
            memory_total_bytes: None,
            pci: Some("000f:01:00.0".into()),
        }],
    };
    assert_eq!(report, expected);

    // The shape a validator checks: two RDMA devices of one adapter (same sys_image_guid),
    // one port each, each with its own netdev, on different PCI domains and subnets.
    let [a, b] = &report.rdma[..] else {
        panic!("expected two RDMA devices")
    };
    assert_eq!(a.sys_image_guid, b.sys_image_guid);
    assert_ne!(a.node_guid, b.node_guid);
    assert_eq!((a.ports.len(), b.ports.len()), (1, 1));
    for d in [a, b] {
        let ndev = report.netdev(&d.ports[0].netdevs[0]).unwrap();
        assert_eq!(ndev.rdma_device.as_deref(), Some(d.name.as_str()));
        assert_eq!((ndev.speed_mbps, ndev.mtu), (Some(200_000), 9000));
    }
    // RoCE ports are not InfiniBand partition members.
    assert!(report.fabric_ports().is_empty());
    assert_eq!(
        report.port(Guid(0x0202_c9ff_fe02_0101)).unwrap().0.name,
        "rocep1s0f0"
    );
}

#[test]
fn reports_survive_json() {
    let report = discover(&fixture("dgx-spark")).unwrap();
    let json = serde_json::to_string(&report).unwrap();
    assert!(
        json.contains(r#""node_guid":"0x0002c90300020100""#),
        "{json}"
    );
    assert!(json.contains(r#""link_layer":"Ethernet""#), "{json}");
    assert!(json.contains(r#""state":"active""#), "{json}");
    let back: HostReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
}

/// A report (the agent's request body) with a field weft does not know is refused, at
/// the top and in every nested part, naming the field: a misspelt field is never
/// dropped without a word.
#[test]
fn a_report_with_an_unknown_field_is_refused_naming_it() {
    let report = discover(&fixture("dgx-spark")).unwrap();
    let mut v: serde_json::Value = serde_json::to_value(&report).unwrap();
    let cases: Vec<(serde_json::Value, &str)> = {
        let mut top = v.clone();
        top["hostnme"] = serde_json::json!("x");
        let mut dev = v.clone();
        dev["rdma"][0]["node_gud"] = serde_json::json!("0x1");
        let mut port = v.clone();
        port["rdma"][0]["ports"][0]["pkeys_extra"] = serde_json::json!([]);
        let mut netdev = v.clone();
        netdev["netdevs"][0]["mtuu"] = serde_json::json!(9000);
        vec![
            (top, "hostnme"),
            (dev, "node_gud"),
            (port, "pkeys_extra"),
            (netdev, "mtuu"),
        ]
    };
    for (bad, field) in cases {
        let e = serde_json::from_value::<HostReport>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field") && e.contains(field),
            "{field}: {e}"
        );
    }
    // The report itself still reads.
    v["hostname"] = serde_json::json!("spark1");
    assert_eq!(
        serde_json::from_value::<HostReport>(v).unwrap().hostname,
        "spark1"
    );
}

/// A small host written with `write_host`, to corrupt one file at a time.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let spec = HostSpec::new("node1")
        .with_hca(
            HcaSpec::new("mlx5_0", Guid(0x0002_c903_0000_0100), "0000:01:00.0").with_port(
                PortSpec::infiniband(1)
                    .with_lid(3)
                    .with_netdev(NetDevSpec::ipoib("ib0")),
            ),
        )
        .with_netdev(
            NetDevSpec::ethernet("eth0", "02:00:00:00:00:01", 1000, 1500).with_pci("0000:05:00.0"),
        );
    let dir = tempfile::tempdir().unwrap();
    write_host(dir.path(), &spec).unwrap();
    let root = dir.path().to_path_buf();
    (dir, root)
}

const PORT: &str = "sys/class/infiniband/mlx5_0/ports/1";

fn corrupt(file: &str, content: &str) -> (DiscoverError, PathBuf) {
    let (_dir, root) = scratch();
    // The scratch tree discovers cleanly before the damage.
    discover(&root).unwrap();
    let path = root.join(file);
    fs::write(&path, content).unwrap();
    (discover(&root).unwrap_err(), path)
}

fn assert_parse_error(file: &str, content: &str, reason_has: &str) {
    let (err, path) = corrupt(file, content);
    let text = err.to_string();
    assert_eq!(err.path(), Some(path.as_path()), "{text}");
    assert!(text.starts_with(&path.display().to_string()), "{text}");
    assert!(text.contains(content.trim()), "{text}");
    assert!(text.contains(reason_has), "{text}");
    assert!(matches!(err, DiscoverError::Parse { .. }), "{err:?}");
}

#[test]
fn a_bad_node_guid_names_the_file() {
    assert_parse_error(
        "sys/class/infiniband/mlx5_0/node_guid",
        "0002:c903:zzzz:0100\n",
        "four groups of four hex digits",
    );
}

#[test]
fn a_bad_port_gid_names_the_file() {
    assert_parse_error(
        &format!("{PORT}/gids/0"),
        "fe80::not-a-gid\n",
        "expected a GID",
    );
}

#[test]
fn a_bad_state_names_the_file() {
    assert_parse_error(&format!("{PORT}/state"), "ACTIVE\n", "<number>: <name>");
    assert_parse_error(&format!("{PORT}/state"), "4: DOWN\n", "code 4 is `ACTIVE`");
    assert_parse_error(
        &format!("{PORT}/phys_state"),
        "five: LinkUp\n",
        "not a number",
    );
}

#[test]
fn a_non_numeric_mtu_names_the_file() {
    assert_parse_error("sys/class/net/ib0/mtu", "nine thousand\n", "MTU");
    assert_parse_error("sys/class/net/eth0/mtu", "-1\n", "MTU");
}

#[test]
fn other_bad_values_name_their_files() {
    assert_parse_error(&format!("{PORT}/lid"), "3\n", "0x");
    assert_parse_error(&format!("{PORT}/pkeys/0"), "0xfffff\n", "hex digits");
    assert_parse_error(&format!("{PORT}/rate"), "fast\n", "Gb/sec");
    assert_parse_error(&format!("{PORT}/link_layer"), "Token Ring\n", "InfiniBand");
    assert_parse_error("sys/class/net/eth0/speed", "fast\n", "Mb/s");
    assert_parse_error("sys/class/net/eth0/operstate", "UP\n", "lowerlayerdown");
    assert_parse_error("sys/class/infiniband/mlx5_0/node_type", "CA\n", "<number>");
}

#[test]
fn an_empty_gid_on_an_infiniband_port_is_an_error() {
    assert_parse_error(
        &format!("{PORT}/gids/0"),
        "0000:0000:0000:0000:0000:0000:0000:0000\n",
        "all zeros",
    );
}

#[test]
fn a_missing_required_file_names_it() {
    let (_dir, root) = scratch();
    let path = root.join("sys/class/net/ib0/mtu");
    fs::remove_file(&path).unwrap();
    let err = discover(&root).unwrap_err();
    assert!(matches!(err, DiscoverError::Read { .. }), "{err:?}");
    assert_eq!(err.path(), Some(path.as_path()));
    assert!(err.to_string().contains("sys/class/net/ib0/mtu"), "{err}");
}

#[test]
fn a_fixture_without_hostname_is_an_error() {
    let (_dir, root) = scratch();
    fs::remove_file(root.join("etc/hostname")).unwrap();
    let err = discover(&root).unwrap_err();
    assert!(err.to_string().contains("etc/hostname"), "{err}");
}

#[test]
fn missing_optional_files_are_not_errors() {
    let (_dir, root) = scratch();
    let port = root.join(PORT);
    let dev = root.join("sys/class/infiniband/mlx5_0");
    for f in ["link_layer", "rate"] {
        fs::remove_file(port.join(f)).unwrap();
    }
    fs::remove_dir_all(port.join("pkeys")).unwrap();
    for f in ["fw_ver", "hca_type"] {
        fs::remove_file(dev.join(f)).unwrap();
    }
    // ib0 was written without a speed; eth0's becomes -1 (SPEED_UNKNOWN).
    fs::write(root.join("sys/class/net/eth0/speed"), "-1\n").unwrap();

    let report = discover(&root).unwrap();
    let d = &report.rdma[0];
    assert_eq!((d.fw_ver.as_deref(), d.hca_type.as_deref()), (None, None));
    let p = &d.ports[0];
    assert_eq!(p.link_layer, LinkLayer::InfiniBand);
    assert_eq!((p.rate_gbps, p.rate_text.as_deref()), (None, None));
    assert_eq!((p.pkeys.as_slice(), p.pkey_table_len), (&[][..], 0));
    assert_eq!(report.netdev("ib0").unwrap().speed_mbps, None);
    assert_eq!(report.netdev("eth0").unwrap().speed_mbps, None);
    assert!(report.netdev("eth0").unwrap().addresses.is_empty());
    assert!(report.gpus.is_empty());
}

#[test]
fn unreadable_volatile_files_mean_unknown() {
    // The kernel answers EINVAL for `speed` of a down interface and for `rate` of a port
    // with unknown speed; a directory in their place fails to read the same way.
    let (_dir, root) = scratch();
    let speed = root.join("sys/class/net/eth0/speed");
    fs::remove_file(&speed).unwrap();
    fs::create_dir(&speed).unwrap();
    let rate = root.join(PORT).join("rate");
    fs::remove_file(&rate).unwrap();
    fs::create_dir(&rate).unwrap();
    let report = discover(&root).unwrap();
    assert_eq!(report.netdev("eth0").unwrap().speed_mbps, None);
    assert_eq!(report.rdma[0].ports[0].rate_gbps, None);
}

#[test]
fn a_host_without_rdma_has_no_rdma_devices() {
    let dir = tempfile::tempdir().unwrap();
    let spec = HostSpec::new("mgmt").with_netdev(NetDevSpec::ethernet(
        "eth0",
        "02:00:00:00:00:09",
        10_000,
        1500,
    ));
    write_host(dir.path(), &spec).unwrap();
    let report = discover(dir.path()).unwrap();
    assert!(report.rdma.is_empty());
    assert!(report.port_guids().is_empty());
    let eth0 = report.netdev("eth0").unwrap();
    // No PCI address given: a virtual interface.
    assert_eq!((eth0.pci.as_deref(), eth0.speed_mbps), (None, Some(10_000)));
}

#[test]
fn write_host_round_trips_guids_lids_and_pkeys() {
    // The ibsim scheme: node GUID from `caguid=`, port N = node GUID + N. One dual-port HCA
    // (netdevs told apart by dev_port), one single-port HCA with an explicit port GUID, a
    // port that is down, and a port whose rate and link_layer files are absent.
    let spec = HostSpec::new("node2")
        .with_hca(
            HcaSpec::new("mlx5_0", Guid(0x0002_c903_0000_0200), "0000:3b:00.0")
                .with_port(
                    PortSpec::infiniband(1)
                        .with_lid(7)
                        .with_sm_lid(2)
                        .with_pkeys([0xffff, 0x8a0a, 0x0b0b])
                        .with_pkey_table_len(8)
                        .with_netdev(NetDevSpec::ipoib("ib0").with_addresses(["10.0.0.2/24"])),
                )
                .with_port(
                    PortSpec::infiniband(2)
                        .with_lid(8)
                        .with_state(PortState::Init, PhysState::LinkUp)
                        .with_pkeys([0x7fff])
                        .with_rate(None)
                        .with_link_layer(None)
                        .with_netdev(NetDevSpec::ipoib("ib1").with_operstate(OperState::Down)),
                ),
        )
        .with_hca(
            HcaSpec::new("mlx5_1", Guid(0x0002_c903_0000_0300), "0000:86:00.0")
                .with_node_desc("node2 HCA-2")
                .with_port(
                    PortSpec::infiniband(1)
                        .with_guid(Guid(0x0002_c903_0000_0399))
                        .with_lid(0)
                        .with_sm_lid(0)
                        .with_state(PortState::Down, PhysState::Polling)
                        .with_pkeys([0xffff]),
                ),
        );
    let dir = tempfile::tempdir().unwrap();
    write_host(dir.path(), &spec).unwrap();
    let r = discover(dir.path()).unwrap();

    assert_eq!(r.hostname, "node2");
    assert_eq!(
        r.port_guids(),
        [
            Guid(0x0002_c903_0000_0201),
            Guid(0x0002_c903_0000_0202),
            Guid(0x0002_c903_0000_0399)
        ]
    );
    for (hca, dev) in spec.hcas.iter().zip(&r.rdma) {
        assert_eq!(dev.name, hca.name);
        assert_eq!(dev.node_guid, hca.node_guid);
        assert_eq!(dev.ports.len(), hca.ports.len());
        for (ps, p) in hca.ports.iter().zip(&dev.ports) {
            assert_eq!(p.num, ps.num);
            assert_eq!(p.port_guid, ps.port_guid(hca.node_guid));
            assert_eq!((p.lid, p.sm_lid), (ps.lid, ps.sm_lid));
            assert_eq!((p.state, p.phys_state), (ps.state, ps.phys_state));
            assert_eq!(p.pkeys, ps.pkeys);
            assert_eq!(
                p.netdevs,
                ps.netdev.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
            );
        }
    }
    let p1 = &r.rdma[0].ports[0];
    assert_eq!((p1.pkey_table_len, p1.rate_gbps), (8, Some(400.0)));
    let p2 = &r.rdma[0].ports[1];
    assert_eq!((p2.rate_gbps, p2.link_layer), (None, LinkLayer::InfiniBand));
    assert_eq!(r.rdma[1].node_desc, "node2 HCA-2");
    assert_eq!(r.rdma[1].sys_image_guid, Guid(0x0002_c903_0000_0300));

    let ib1 = r.netdev("ib1").unwrap();
    assert_eq!(ib1.rdma_device.as_deref(), Some("mlx5_0"));
    assert_eq!(ib1.operstate, OperState::Down);
    assert_eq!(ib1.pci.as_deref(), Some("0000:3b:00.0"));
    assert_eq!(
        ib1.mac,
        "00:00:10:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:00:02:02"
    );
    assert_eq!(r.netdev("ib0").unwrap().addresses, ["10.0.0.2/24"]);

    let fabric = r.fabric_ports();
    assert_eq!(fabric.len(), 3);
    assert_eq!(fabric[0].pkey_capacity, 8);
    assert_eq!(fabric[2].port_guid, Guid(0x0002_c903_0000_0399));
}

#[test]
fn a_down_roce_port_gets_its_guid_from_the_mac() {
    // With the netdev down the kernel empties the RoCE GID table and gids/0 reads as zeros.
    let spec = HostSpec::new("spark2").with_hca(
        HcaSpec::new("rocep1s0f1", Guid(0x0002_c903_0002_0101), "0000:01:00.1").with_port(
            PortSpec::roce(
                1,
                NetDevSpec::ethernet("enp1s0f1np1", "00:02:c9:02:01:02", 200_000, 1500)
                    .with_speed(None)
                    .with_operstate(OperState::Down),
            )
            .with_state(PortState::Down, PhysState::Disabled),
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    write_host(dir.path(), &spec).unwrap();
    let port = dir.path().join("sys/class/infiniband/rocep1s0f1/ports/1");
    fs::write(
        port.join("gids/0"),
        "0000:0000:0000:0000:0000:0000:0000:0000\n",
    )
    .unwrap();
    // ndevs/0 is unreadable for an empty GID entry; the device/net link still maps the port.
    fs::remove_file(port.join("gid_attrs/ndevs/0")).unwrap();

    let r = discover(dir.path()).unwrap();
    let p = &r.rdma[0].ports[0];
    assert_eq!(p.port_guid, Guid(0x0202_c9ff_fe02_0102));
    assert_eq!(p.netdevs, ["enp1s0f1np1"]);
    assert_eq!(
        (p.state, p.phys_state),
        (PortState::Down, PhysState::Disabled)
    );
    assert_eq!(r.netdev("enp1s0f1np1").unwrap().speed_mbps, None);
}

#[test]
fn write_host_refuses_an_ethernet_netdev_without_mac() {
    let mut nd = NetDevSpec::ethernet("eth9", "x", 1000, 1500);
    nd.mac = None;
    let dir = tempfile::tempdir().unwrap();
    let err = write_host(dir.path(), &HostSpec::new("h").with_netdev(nd)).unwrap_err();
    assert!(err.to_string().contains("eth9"), "{err}");
}

#[test]
fn the_live_host_discovers() {
    // Whatever this machine has, discovery of `/` must succeed and name the host.
    let r = discover(Path::new("/")).unwrap();
    assert!(!r.hostname.is_empty());
    if let Some(lo) = r.netdev("lo") {
        assert_eq!(lo.arp_type, 772);
        assert_eq!(lo.pci, None);
    }
}

#[test]
fn dgx_spark_reports_roce_ports_data_nics_and_its_gpu() {
    let report = discover(&fixture("dgx-spark")).unwrap();
    let roce: Vec<_> = report
        .roce_ports()
        .iter()
        .map(|(d, p)| (d.name.as_str(), p.num, p.rate_gbps, p.netdevs.clone()))
        .collect();
    assert_eq!(
        roce,
        [
            (
                "roceP2p1s0f0",
                1,
                Some(200.0),
                vec!["enP2p1s0f0np0".to_string()]
            ),
            (
                "rocep1s0f0",
                1,
                Some(200.0),
                vec!["enp1s0f0np0".to_string()]
            ),
        ]
    );
    // No InfiniBand port: nothing for a partition, yet the host is not empty.
    assert!(report.fabric_ports().is_empty());
    let nics: Vec<_> = report
        .data_nics()
        .iter()
        .map(|n| (n.name.as_str(), n.speed_mbps, n.mtu, n.link_layer()))
        .collect();
    assert_eq!(
        nics,
        [
            ("enP2p1s0f0np0", Some(200_000), 9000, LinkLayer::Ethernet),
            ("enP7s7", Some(1000), 1500, LinkLayer::Ethernet),
            ("enp1s0f0np0", Some(200_000), 9000, LinkLayer::Ethernet),
        ],
        "loopback is not a data NIC"
    );
    assert_eq!(report.gpus.len(), 1);
    assert_eq!(report.gpus[0].name, "NVIDIA GB10");
    assert_eq!(report.gpus[0].memory_total_bytes, None);
}

#[test]
fn connectx7_host_has_no_roce_ports_and_ipoib_nics() {
    let report = discover(&fixture("connectx7-host")).unwrap();
    assert!(report.roce_ports().is_empty());
    let nics: Vec<_> = report
        .data_nics()
        .iter()
        .map(|n| (n.name.as_str(), n.link_layer()))
        .collect();
    assert_eq!(
        nics,
        [
            ("eno1", LinkLayer::Ethernet),
            ("ib0", LinkLayer::InfiniBand),
            ("ib1", LinkLayer::InfiniBand),
        ]
    );
    // Each InfiniBand port's rate as sysfs writes it, and its IPoIB netdev's MTU (the
    // nearest sysfs has to an active MTU).
    let ports: Vec<_> = report
        .rdma
        .iter()
        .flat_map(|d| d.ports.iter())
        .map(|p| (p.rate_text.as_deref(), report.port_mtu(p)))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("400 Gb/sec (4X NDR)"), Some(4092)),
            (Some("400 Gb/sec (4X NDR)"), Some(4092)),
        ]
    );
}
