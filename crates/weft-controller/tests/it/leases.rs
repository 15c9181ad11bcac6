//! Node leases over real HTTP with real agents (fixture hosts reporting through the
//! agent loop) and a recording fabric: refused without a quota, granted, queued with its
//! position, warned on the nodes' hosts (file and hook) while the nodes are still the
//! tenant's, moved back at the end and straight to the next tenant in the queue, released
//! early, and every decision audited. The moves on real ports, with OpenSM, are the
//! fabric tests' business (`group moves`); here the recording fabric stands for delivery.

use super::*;
use weft_controller::agent::LeaseNoticeConfig;
use weft_controller::lease::LeaseConfig;
use weft_controller::lease::model::{LeaseRequest, SetLeaseQuota};

fn ask(nodes: u32, duration_s: u64) -> LeaseRequest {
    LeaseRequest {
        nodes,
        duration_s,
        start: None,
        same_switch: false,
    }
}

async fn members(admin: &Client, group: &str) -> Vec<String> {
    admin
        .group(group)
        .await
        .map(|g| g.members)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_from_request_to_release_with_quota_queue_and_warning() {
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        recheck: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        lease: LeaseConfig {
            warn_s: 3,
            tick: Duration::from_millis(200),
            ..LeaseConfig::default()
        },
        ..ControllerConfig::default()
    };
    let ctl = Ctl::start_config(Arc::new(RecordingFabric::default()), config, false).await;
    let mut stops = Vec::new();
    for (i, name) in ["node1", "node2", "node3"].iter().enumerate() {
        let mut cfg = ctl
            .agent(name, 0x0002_c903_0000_0100 + 0x100 * i as u64, &[1])
            .await;
        let host = ctl.dir.path().join(format!("host-{name}"));
        cfg.lease_notice = Some(LeaseNoticeConfig {
            file: host.join("lease-ending"),
            hook: Some(format!(
                "echo \"$WEFT_LEASE_ID $WEFT_LEASE_END\" >> {}",
                host.join("hook-ran").display()
            )),
            hook_timeout: Duration::from_secs(5),
        });
        stops.push(spawn_agent(cfg));
    }
    servers_with_ports(&ctl.admin, 3).await;
    let admin = &ctl.admin;
    admin.create_tenant("provider").await.unwrap();
    let alice = ctl.client(Some(admin.create_tenant("alice").await.unwrap().token));
    let bob = ctl.client(Some(admin.create_tenant("bob").await.unwrap().token));
    admin.create_group("pool", "provider").await.unwrap();
    for n in ["node1", "node2", "node3"] {
        admin.add_member("pool", n).await.unwrap();
    }
    // No quota yet: refused, with the reason, and stored.
    let refused = alice.request_lease(&ask(2, 4)).await.unwrap();
    assert_eq!(refused.lease.phase, "refused");
    assert!(
        refused
            .lease
            .reason
            .as_deref()
            .unwrap()
            .contains("no lease quota"),
        "{refused:?}"
    );
    // An admin's token does not request; a tenant's does not set quotas.
    assert_eq!(
        admin.request_lease(&ask(1, 4)).await.unwrap_err().status(),
        Some(403)
    );
    let quota = SetLeaseQuota {
        max_nodes: 2,
        node_seconds: 3600,
        period_s: 86_400,
    };
    assert_eq!(
        alice
            .set_lease_quota("alice", &quota)
            .await
            .unwrap_err()
            .status(),
        Some(403)
    );
    for t in ["alice", "bob"] {
        admin.set_lease_quota(t, &quota).await.unwrap();
    }
    assert_eq!(
        admin
            .set_lease_quota("carol", &quota)
            .await
            .unwrap_err()
            .status(),
        Some(404)
    );
    // Over the quota: refused with the reason.
    let over = alice.request_lease(&ask(3, 4)).await.unwrap();
    assert!(
        over.lease
            .reason
            .as_deref()
            .unwrap()
            .contains("quota of 2 nodes"),
        "{over:?}"
    );
    // Granted: two nodes move into alice's group (created for her).
    let a = alice.request_lease(&ask(2, 4)).await.unwrap();
    assert_eq!(a.lease.phase, "active", "{a:?}");
    assert_eq!(a.lease.nodes.len(), 2);
    assert!(!a.operations.is_empty());
    for op in &a.operations {
        admin
            .wait_applied(*op, Duration::from_secs(10))
            .await
            .unwrap();
    }
    let mut got = members(admin, "alice").await;
    got.sort();
    let mut want = a.lease.nodes.clone();
    want.sort();
    assert_eq!(got, want);
    // Bob asks for two: one is free, so he waits first in the queue.
    let b = bob.request_lease(&ask(2, 60)).await.unwrap();
    assert_eq!(
        (b.lease.phase.as_str(), b.lease.position),
        ("queued", Some(1)),
        "{b:?}"
    );
    // Tenants see only their own leases.
    assert_eq!(bob.lease(a.lease.id).await.unwrap_err().status(), Some(404));
    assert_eq!(
        alice
            .leases()
            .await
            .unwrap()
            .leases
            .iter()
            .filter(|l| l.tenant != "alice")
            .count(),
        0
    );
    assert_eq!(admin.leases().await.unwrap().pool.len(), 3);
    // Before the end: the lease is ending, each node's agent wrote the file and ran the
    // hook, and the node is still alice's.
    let node = a.lease.nodes[0].clone();
    let host = ctl.dir.path().join(format!("host-{node}"));
    until(
        "the warning on the node",
        Duration::from_secs(10),
        || async { host.join("hook-ran").exists().then_some(()) },
    )
    .await;
    let file = std::fs::read_to_string(host.join("lease-ending")).unwrap();
    assert!(
        file.starts_with(&format!("lease {} ends ", a.lease.id)),
        "{file}"
    );
    assert_eq!(alice.lease(a.lease.id).await.unwrap().lease.phase, "ending");
    assert!(
        members(admin, "alice").await.contains(&node),
        "warned after the node left"
    );
    // At the end the nodes leave alice, and bob's queued lease gets two of them.
    let b_now = until("bob's lease granted", Duration::from_secs(10), || async {
        let l = bob.lease(b.lease.id).await.ok()?.lease;
        (l.phase == "active").then_some(l)
    })
    .await;
    assert_eq!(alice.lease(a.lease.id).await.unwrap().lease.phase, "ended");
    until("nodes in bob's group", Duration::from_secs(10), || async {
        let mut got = members(admin, "bob").await;
        got.sort();
        let mut want = b_now.nodes.clone();
        want.sort();
        (got == want).then_some(())
    })
    .await;
    assert!(members(admin, "alice").await.is_empty());
    // The warning file goes once no lease ends on the node.
    if !b_now.nodes.contains(&node) {
        until(
            "the warning file removed",
            Duration::from_secs(10),
            || async { (!host.join("lease-ending").exists()).then_some(()) },
        )
        .await;
    }
    // Bob releases early: his nodes go back to the pool.
    let r = bob.release_lease(b.lease.id).await.unwrap();
    assert_eq!(r.lease.phase, "released");
    for op in &r.operations {
        admin
            .wait_applied(*op, Duration::from_secs(10))
            .await
            .unwrap();
    }
    assert_eq!(members(admin, "pool").await.len(), 3);
    assert_eq!(
        bob.release_lease(b.lease.id).await.unwrap_err().status(),
        Some(409)
    );
    // Every decision is stored with the lease and audited.
    let kinds: Vec<String> = alice
        .lease(a.lease.id)
        .await
        .unwrap()
        .decisions
        .into_iter()
        .map(|d| d.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "grant", "move-in", "move-in", "warn", "move-out", "move-out"
        ]
    );
    let audit = admin.audit(500).await.unwrap();
    for action in [
        "lease.refuse",
        "lease.grant",
        "lease.queue",
        "lease.warn",
        "lease.move-out",
        "lease.release",
        "lease.quota",
    ] {
        assert!(
            audit.iter().any(|l| l.action == action),
            "no {action} in the audit"
        );
    }
    // The lease gauges on the metrics listener.
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "weft_leases{phase=\"ended\"} 1",
        "weft_leases{phase=\"released\"} 1",
        "weft_lease_queue 0",
        "weft_lease_pool_free 3",
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }
    promtool_accepts(&ctl.metrics).await;
    let quotas = bob.lease_quotas().await.unwrap();
    assert_eq!(quotas.len(), 1);
    assert_eq!(
        quotas[0].used_node_seconds,
        2 * (r.lease.end.unwrap() - r.lease.start.unwrap())
    );
    for (stop, _) in stops {
        let _ = stop.send(true);
    }
    let _ = ctl.stop.send(true);
}

/// The P_Key (full member) of a group, from its view's base (`0x0a02` -> 0x8a02).
async fn full_key(admin: &Client, group: &str) -> u16 {
    let g = admin.group(group).await.unwrap();
    u16::from_str_radix(g.pkey.trim_start_matches("0x"), 16).unwrap() | 0x8000
}

/// Waits for every operation and checks the ports: each node of `held` carries its
/// group's key, and no other node of the fabric does.
async fn verified_on_ports(
    bed: &super::fabric::Bed,
    admin: &Client,
    ops: &[i64],
    held: &[(&str, &[String])],
) {
    for op in ops {
        admin
            .wait_applied(*op, Duration::from_secs(60))
            .await
            .unwrap();
    }
    let t = tokio::task::block_in_place(|| bed.verified());
    for (group, nodes) in held {
        let key = full_key(admin, group).await;
        for (node, keys) in &t {
            assert_eq!(
                keys.contains(&key),
                nodes.contains(node),
                "{node} and {group}'s key {key:#06x}: {t:x?}"
            );
        }
    }
}

/// The real thing: a controller with agents, primary and standby OpenSM on a simulated
/// fat tree with two leaf switches (node1, 3, 5 under leaf1; node2, 4, 6 under leaf2) and
/// three tenants. The leaf switches come from the fabric (ibnetdiscover); `same_switch`
/// leases get one leaf each; the third tenant waits in the queue; the first lease is
/// warned on its nodes (file and hook) before it ends; the controller is stopped across
/// that lease's end and a new one started on the same store finishes the boundary: the
/// nodes leave the first tenant and go to the queued one, every move verified on the
/// ports of both SMs' fabric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tenants_on_two_leaf_switches_with_a_restart_at_a_lease_boundary() {
    let topology = weft_testbed::Topology::fat_tree(2, 1, 6, 0);
    let bed = tokio::task::block_in_place(|| super::fabric::bed(&topology));
    let lease = LeaseConfig {
        warn_s: 12,
        tick: Duration::from_millis(300),
        topology_refresh: Duration::from_secs(2),
        ..LeaseConfig::default()
    };
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        recheck: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        lease: lease.clone(),
        ..ControllerConfig::default()
    };
    let ctl = Ctl::start_config(
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
        config.clone(),
        false,
    )
    .await;
    let mut agents = Vec::new();
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        let ports: Vec<u8> = h.port_guids.iter().map(|(p, _)| *p).collect();
        let mut cfg = ctl.agent(&h.name, h.node_guid, &ports).await;
        let host = ctl.dir.path().join(format!("host-{}", h.name));
        cfg.lease_notice = Some(LeaseNoticeConfig {
            file: host.join("lease-ending"),
            hook: Some(format!(
                "echo \"$WEFT_LEASE_ID\" >> {}",
                host.join("hook-ran").display()
            )),
            hook_timeout: Duration::from_secs(5),
        });
        agents.push(spawn_agent(cfg));
    }
    servers_with_ports(&ctl.admin, 6).await;
    let admin = &ctl.admin;
    admin.create_tenant("provider").await.unwrap();
    let mut tenants = Vec::new();
    for t in ["t1", "t2", "t3"] {
        tenants.push(ctl.client(Some(admin.create_tenant(t).await.unwrap().token)));
        admin
            .set_lease_quota(
                t,
                &SetLeaseQuota {
                    max_nodes: 3,
                    node_seconds: 3 * 3600,
                    period_s: 86_400,
                },
            )
            .await
            .unwrap();
    }
    admin.create_group("pool", "provider").await.unwrap();
    let mut last = 0;
    for n in 1..=6 {
        last = admin
            .add_member("pool", &format!("node{n}"))
            .await
            .unwrap()
            .operation
            .unwrap()
            .id;
    }
    let all: Vec<String> = (1..=6).map(|n| format!("node{n}")).collect();
    verified_on_ports(&bed, admin, &[last], &[("pool", &all)]).await;
    // The leaf switches, as the controller read them from the fabric.
    let leaf_of = until(
        "the leaf switches read",
        Duration::from_secs(20),
        || async {
            let pool = admin.leases().await.ok()?.pool;
            pool.iter().all(|n| n.switch.is_some()).then(|| {
                pool.into_iter()
                    .map(|n| (n.name, n.switch.unwrap()))
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
        },
    )
    .await;
    for (node, leaf) in &leaf_of {
        let n: u32 = node.trim_start_matches("node").parse().unwrap();
        assert_eq!(
            leaf,
            if n % 2 == 1 { "leaf1" } else { "leaf2" },
            "{leaf_of:?}"
        );
    }
    let same = |nodes: u32, s: u64| LeaseRequest {
        nodes,
        duration_s: s,
        start: None,
        same_switch: true,
    };
    // t1: two nodes under one leaf; t2: three under one leaf (the other one, the only one
    // with three free); t3: two anywhere, but one node is free, so it waits.
    let a1 = tenants[0].request_lease(&same(2, 40)).await.unwrap();
    let a2 = tenants[1].request_lease(&same(3, 600)).await.unwrap();
    let a3 = tenants[2].request_lease(&ask(2, 600)).await.unwrap();
    assert_eq!(a1.lease.phase, "active", "{a1:?}");
    assert_eq!(a2.lease.phase, "active", "{a2:?}");
    assert_eq!(
        (a3.lease.phase.as_str(), a3.lease.position),
        ("queued", Some(1)),
        "{a3:?}"
    );
    for l in [&a1.lease, &a2.lease] {
        let leaves: std::collections::BTreeSet<&String> =
            l.nodes.iter().map(|n| &leaf_of[n]).collect();
        assert_eq!(
            leaves.len(),
            1,
            "a same-switch lease over two leaves: {l:?}"
        );
    }
    let ops: Vec<i64> = a1
        .operations
        .iter()
        .chain(&a2.operations)
        .copied()
        .collect();
    verified_on_ports(
        &bed,
        admin,
        &ops,
        &[("t1", &a1.lease.nodes), ("t2", &a2.lease.nodes)],
    )
    .await;
    // Before t1's end: its nodes' agents were warned (file and hook) while the nodes are
    // still t1's on the ports.
    let host = ctl.dir.path().join(format!("host-{}", a1.lease.nodes[0]));
    until(
        "the warning on t1's node",
        Duration::from_secs(40),
        || async { host.join("hook-ran").exists().then_some(()) },
    )
    .await;
    assert!(
        std::fs::read_to_string(host.join("lease-ending"))
            .unwrap()
            .starts_with(&format!("lease {} ends", a1.lease.id))
    );
    let t = tokio::task::block_in_place(|| bed.verified());
    let k1 = full_key(admin, "t1").await;
    assert!(
        t[&a1.lease.nodes[0]].contains(&k1),
        "warned after the move: {t:x?}"
    );
    // The controller stops before the end and a new one starts on the same store after it.
    let end = a1.lease.end.unwrap();
    let _ = ctl.stop.send(true);
    let store: Arc<SqliteStore> =
        Arc::new(SqliteStore::open(&ctl.dir.path().join("controller.db")).unwrap());
    while weft_controller::unix_now() <= end + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = until(
        "the store's lease given back",
        Duration::from_secs(20),
        || {
            let r = Controller::start(
                store.clone(),
                Arc::new(OpenSmFabric {
                    applier: bed.applier(),
                }),
                config.clone(),
            )
            .ok();
            async move { r }
        },
    )
    .await;
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", local(&api));
    let (stop2, mut rx) = watch::channel(false);
    tokio::spawn(serve(second, api, None, async move {
        let _ = rx.wait_for(|s| *s).await;
    }));
    let admin2 = Client::new(&base, Some(Secret::new(ADMIN)), Duration::from_secs(10)).unwrap();
    // The new controller finishes the boundary: t1 ended, t3 granted.
    let l3 = until(
        "t3's lease granted after the restart",
        Duration::from_secs(30),
        || async {
            let l = admin2.lease(a3.lease.id).await.ok()?.lease;
            (l.phase == "active").then_some(l)
        },
    )
    .await;
    let detail1 = admin2.lease(a1.lease.id).await.unwrap();
    assert_eq!(detail1.lease.phase, "ended");
    let kinds: Vec<&str> = detail1.decisions.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "grant", "move-in", "move-in", "warn", "move-out", "move-out"
        ]
    );
    let pending: Vec<i64> = admin2
        .operations(true)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    verified_on_ports(
        &bed,
        &admin2,
        &pending,
        &[("t1", &[]), ("t2", &a2.lease.nodes), ("t3", &l3.nodes)],
    )
    .await;
    let _ = stop2.send(true);
    for (stop, _) in agents {
        let _ = stop.send(true);
    }
}
