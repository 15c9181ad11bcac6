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
