//! How `weft nodes` shows a server's links and GPUs in one table cell each.

/// `rocep1s0f0/1 200G ACTIVE`, space-joined; `-` for none.
pub(super) fn node_roce(s: &weft_controller::model::ServerView) -> String {
    dash_join(s.roce.iter().map(|r| {
        format!(
            "{}/{} {} {}",
            r.device,
            r.num,
            rate_text(r.rate.as_deref()),
            r.state
        )
    }))
}

/// `400G` from sysfs's `400 Gb/sec (4X NDR)`; `?` when unknown.
fn rate_text(rate: Option<&str>) -> String {
    rate.and_then(|t| t.split_whitespace().next())
        .map_or("?".to_string(), |g| format!("{g}G"))
}

/// `0x0002c90300000101 400G/4092`: each InfiniBand port's GUID, rate and its netdev's
/// MTU (`-` where it has no netdev), space-joined; `-` for none.
pub(super) fn node_ports(s: &weft_controller::model::ServerView) -> String {
    dash_join(s.ports.iter().map(|p| {
        let mtu = p.mtu.map_or("-".to_string(), |m| m.to_string());
        format!("{} {}/{mtu}", p.guid, rate_text(p.rate.as_deref()))
    }))
}

/// `enp1s0f0np0 200G/9000`: negotiated speed and MTU, space-joined; `-` for none.
pub(super) fn node_nics(s: &weft_controller::model::ServerView) -> String {
    dash_join(s.nics.iter().map(|n| {
        let speed = n.speed_mbps.map_or("?".to_string(), mbps_text);
        format!("{} {speed}/{}", n.name, n.mtu)
    }))
}

/// `NVIDIA GB10` or `NVIDIA H200 141G`, comma-joined; `-` for none.
pub(super) fn node_gpus(s: &weft_controller::model::ServerView) -> String {
    let text = s
        .gpus
        .iter()
        .map(|g| match g.memory_total_bytes {
            Some(b) => format!("{} {}G", g.name, b >> 30),
            None => g.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if text.is_empty() { "-".into() } else { text }
}

/// A speed in Mb/s as `200G`, `2.5G` or `100M`.
fn mbps_text(m: u32) -> String {
    if m >= 1000 && m.is_multiple_of(1000) {
        format!("{}G", m / 1000)
    } else if m >= 1000 {
        format!("{:.1}G", f64::from(m) / 1000.0)
    } else {
        format!("{m}M")
    }
}

fn dash_join(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(" ")
    }
}

#[cfg(test)]
mod tests {
    /// `weft nodes` on the shipped DGX Spark fixture shows its RoCE devices, NICs and GPU
    /// (it showed `-` for all of them before the agent's links reached the controller).
    #[test]
    fn nodes_table_shows_a_spark_s_roce_nics_and_gpu() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../weft-agent/fixtures/dgx-spark");
        let report = weft_agent::discover(&root).unwrap();
        let links = weft_controller::model::HostLinks::of(&report);
        let s = weft_controller::model::ServerView {
            name: report.hostname.clone(),
            liveness: weft_controller::model::Liveness::Ok,
            last_seen: Some(0),
            ports: vec![],
            group: None,
            pending_claims: vec![],
            roce: links.roce,
            nics: links.nics,
            gpus: report.gpus.clone(),
        };
        assert_eq!(
            super::node_roce(&s),
            "roceP2p1s0f0/1 200G ACTIVE rocep1s0f0/1 200G ACTIVE"
        );
        assert_eq!(
            super::node_nics(&s),
            "enP2p1s0f0np0 200G/9000 enP7s7 1G/1500 enp1s0f0np0 200G/9000"
        );
        assert_eq!(super::node_gpus(&s), "NVIDIA GB10");
        assert_eq!(super::node_ports(&s), "-");
        let ib = weft_controller::model::ServerView {
            ports: vec![
                weft_controller::model::PortView {
                    guid: weft_fabric::Guid(0x0002_c903_0000_0101),
                    device: "mlx5_0".into(),
                    num: 1,
                    lid: 3,
                    state: "ACTIVE".into(),
                    rate: Some("400 Gb/sec (4X NDR)".into()),
                    mtu: Some(4092),
                },
                weft_controller::model::PortView {
                    guid: weft_fabric::Guid(0x0002_c903_0000_0102),
                    device: "mlx5_1".into(),
                    num: 1,
                    lid: 4,
                    state: "ACTIVE".into(),
                    rate: None,
                    mtu: None,
                },
            ],
            ..s
        };
        assert_eq!(
            super::node_ports(&ib),
            "0x0002c90300000101 400G/4092 0x0002c90300000102 ?/-"
        );
        assert_eq!(super::mbps_text(2500), "2.5G");
        assert_eq!(super::mbps_text(100), "100M");
    }
}
