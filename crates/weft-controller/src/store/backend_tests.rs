//! The store's behaviour, run on every backend: each test runs once on SQLite (in memory)
//! and once on a real PostgreSQL (a fresh database on a server the test starts; under
//! `WEFT_TEST_REQUIRE=all` a missing PostgreSQL fails the test). What is particular to one
//! backend (files, WAL, a server's connection) is tested beside it.

use weft_fabric::Guid;

use super::*;
use crate::model::{Liveness, OpState};
use weft_lease::{Decision, Lease, Phase, Quota};

/// Runs `test` on each backend, naming the backend when it fails.
fn each_backend(name: &str, test: impl Fn(&dyn Store)) {
    test(&SqliteStore::in_memory().expect("SQLite in memory"));
    if let Err(why) = weft_testbed::Postgres::available() {
        weft_netns::require::skip(&format!("{name} on PostgreSQL"), &why);
        return;
    }
    let pg = weft_testbed::Postgres::start().expect("start PostgreSQL");
    let store =
        PgStore::open(&pg.database("weft").expect("a database"), true).expect("a PostgreSQL store");
    test(&store);
}

/// Runs `scenario` on each backend like [`each_backend`], and checks that both answered
/// the same, line for line (what the scenario returns: answers, the audit).
fn same_on_each_backend(name: &str, scenario: impl Fn(&dyn Store) -> Vec<String>) {
    let sqlite = scenario(&SqliteStore::in_memory().expect("SQLite in memory"));
    if let Err(why) = weft_testbed::Postgres::available() {
        weft_netns::require::skip(&format!("{name} on PostgreSQL"), &why);
        return;
    }
    let pg = weft_testbed::Postgres::start().expect("start PostgreSQL");
    let store =
        PgStore::open(&pg.database("weft").expect("a database"), true).expect("a PostgreSQL store");
    let postgres = scenario(&store);
    assert!(!sqlite.is_empty());
    for (i, (l, p)) in sqlite.iter().zip(&postgres).enumerate() {
        assert_eq!(
            l, p,
            "{name}: line {i} differs between SQLite and PostgreSQL"
        );
    }
    assert_eq!(sqlite.len(), postgres.len(), "{name}: {postgres:#?}");
}

/// What a scenario leaves to compare: the servers, operations, leases and the audit.
fn state_lines(s: &dyn Store, now: u64) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", s.servers(now, 60).unwrap()),
        format!("{:?}", s.operations(false).unwrap()),
        format!("{:?}", s.lease_records().unwrap()),
    ];
    out.extend(s.audit(1000).unwrap().iter().map(|a| format!("{a:?}")));
    out
}

fn port(g: u64) -> ReportedPort {
    ReportedPort {
        guid: Guid(g),
        device: "mlx5_0".into(),
        num: 1,
        lid: 3,
        state: "ACTIVE".into(),
        rate: Some("400 Gb/sec (4X NDR)".into()),
        mtu: Some(4092),
    }
}

fn enrolled(s: &dyn Store, name: &str) {
    s.create_enrollment("admin:x", &format!("e-{name}"), None, 100, 1)
        .unwrap();
    s.enroll(&format!("e-{name}"), name, &format!("s-{name}"), 2)
        .unwrap();
}

#[test]
fn a_move_is_one_operation_with_its_diff_and_a_refused_change_leaves_nothing() {
    each_backend(
        "a_move_is_one_operation_with_its_diff_and_a_refused_change_leaves_nothing",
        |s| {
            s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
            s.create_tenant("admin:x", "bob", "tb", None, 1).unwrap();
            for n in ["node1", "node2"] {
                enrolled(s, n);
            }
            s.report("node1", &[port(0x101)], "h1", 3).unwrap();
            s.report("node2", &[port(0x201)], "h2", 3).unwrap();
            s.change(
                "admin:x",
                &Change::CreateGroup {
                    name: "a".into(),
                    tenant: "alice".into(),
                },
                4,
            )
            .unwrap();
            s.change(
                "admin:x",
                &Change::CreateGroup {
                    name: "b".into(),
                    tenant: "bob".into(),
                },
                4,
            )
            .unwrap();
            s.change(
                "admin:x",
                &Change::AddMember {
                    group: "a".into(),
                    server: "node1".into(),
                },
                5,
            )
            .unwrap();
            let op = s
                .change(
                    "admin:x",
                    &Change::Move {
                        server: "node1".into(),
                        to: "b".into(),
                    },
                    6,
                )
                .unwrap()
                .unwrap();
            assert_eq!(op.state, OpState::Pending);
            assert!(
                op.diff
                    .contains("-a=0x0a01,ipoib : 0x0000000000000101=full ;"),
                "{}",
                op.diff
            );
            assert!(
                op.diff
                    .contains("+b=0x0a02,ipoib : 0x0000000000000101=full ;"),
                "{}",
                op.diff
            );
            assert_eq!(s.desired().unwrap().generation, op.generation);
            // Refused changes leave nothing behind.
            let before = s.audit(100).unwrap().len();
            assert!(matches!(
                s.change(
                    "admin:x",
                    &Change::AddMember {
                        group: "a".into(),
                        server: "node1".into()
                    },
                    7
                ),
                Err(StoreError::Conflict(_))
            ));
            assert!(matches!(
                s.change(
                    "admin:x",
                    &Change::Move {
                        server: "node9".into(),
                        to: "a".into()
                    },
                    7
                ),
                Err(StoreError::NotFound(_))
            ));
            assert_eq!(s.audit(100).unwrap().len(), before);
        },
    );
}

#[test]
fn a_guid_another_server_owns_is_held_pending_until_approved() {
    each_backend(
        "a_guid_another_server_owns_is_held_pending_until_approved",
        |s| {
            enrolled(s, "node1");
            enrolled(s, "node2");
            s.report("node1", &[port(0x101)], "h1", 3).unwrap();
            let out = s
                .report("node2", &[port(0x101), port(0x201)], "h2", 3)
                .unwrap();
            assert_eq!(out.ack.pending, vec![Guid(0x101)]);
            assert_eq!(out.ack.owned, vec![Guid(0x201)]);
            let claims = s.claims().unwrap();
            assert_eq!(
                (
                    claims[0].claimant.as_str(),
                    claims[0].owner.as_str(),
                    claims[0].state.as_str()
                ),
                ("node2", "node1", "pending")
            );
            // Reporting again does not pile up claims.
            s.report("node2", &[port(0x101), port(0x201)], "h2b", 4)
                .unwrap();
            assert_eq!(s.claims().unwrap().len(), 1);
            s.change("admin:x", &Change::ApproveClaim { id: claims[0].id }, 5)
                .unwrap();
            let servers = s.servers(5, 30).unwrap();
            let node2 = servers.iter().find(|v| v.name == "node2").unwrap();
            assert_eq!(node2.ports.len(), 2);
            assert!(node2.pending_claims.is_empty());
            // Each port's rate and netdev MTU are kept as reported, and a report that
            // changes them changes them.
            assert_eq!(node2.ports[0].rate.as_deref(), Some("400 Gb/sec (4X NDR)"));
            assert_eq!(node2.ports[0].mtu, Some(4092));
            let slow = ReportedPort {
                rate: Some("200 Gb/sec (4X HDR)".into()),
                mtu: None,
                ..port(0x201)
            };
            s.report("node2", &[port(0x101), slow], "h2c", 6).unwrap();
            let servers = s.servers(6, 30).unwrap();
            let node2 = servers.iter().find(|v| v.name == "node2").unwrap();
            let p = node2.ports.iter().find(|p| p.guid == Guid(0x201)).unwrap();
            assert_eq!(
                (p.rate.as_deref(), p.mtu),
                (Some("200 Gb/sec (4X HDR)"), None)
            );
        },
    );
}

#[test]
fn enrollment_tokens_are_one_time_and_silence_makes_a_server_stale() {
    each_backend(
        "enrollment_tokens_are_one_time_and_silence_makes_a_server_stale",
        |s| {
            s.create_enrollment("admin:x", "e1", None, 100, 1).unwrap();
            s.enroll("e1", "node1", "s1", 2).unwrap();
            assert!(matches!(
                s.enroll("e1", "node9", "s9", 3),
                Err(StoreError::Refused(_))
            ));
            assert!(matches!(
                s.enroll("nope", "node9", "s9", 3),
                Err(StoreError::Refused(_))
            ));
            s.create_enrollment("admin:x", "e2", None, 10, 1).unwrap();
            assert!(matches!(
                s.enroll("e2", "node2", "s2", 11),
                Err(StoreError::Refused(_))
            ));
            assert_eq!(s.agent("s1").unwrap().as_deref(), Some("node1"));
            assert_eq!(s.servers(50, 30).unwrap()[0].liveness, Liveness::Never);
            s.heartbeat("node1", 50).unwrap();
            assert_eq!(s.servers(60, 30).unwrap()[0].liveness, Liveness::Ok);
            assert_eq!(s.servers(81, 30).unwrap()[0].liveness, Liveness::Stale);
            assert!(s.audit(100).unwrap().iter().any(|a| a.outcome == "refused"));
        },
    );
}

#[test]
fn a_token_stops_at_its_expiry_and_a_revoked_bootstrap_token_cannot_come_back() {
    each_backend(
        "a_token_stops_at_its_expiry_and_a_revoked_bootstrap_token_cannot_come_back",
        |s| {
            s.create_tenant("admin:x", "alice", "ta", Some(100), 1)
                .unwrap();
            assert!(s.principal("ta", 99).unwrap().is_some());
            assert!(s.principal("ta", 100).unwrap().is_none());
            s.bootstrap_admin("old", 1).unwrap();
            s.bootstrap_admin("new", 2).unwrap();
            assert!(s.principal("old", 3).unwrap().is_none());
            assert!(s.principal("new", 3).unwrap().is_some());
            assert!(matches!(
                s.bootstrap_admin("old", 4),
                Err(StoreError::Refused(_))
            ));
            assert!(matches!(
                s.bootstrap_admin("ta", 4),
                Err(StoreError::Refused(_))
            ));
        },
    );
}

#[test]
fn the_fencing_number_only_rises_and_deliveries_in_flight_end_with_the_applied_one() {
    each_backend(
        "the_fencing_number_only_rises_and_deliveries_in_flight_end_with_the_applied_one",
        |s| {
            assert_eq!(
                s.fencing().unwrap(),
                Fencing {
                    number: 1,
                    in_flight: vec![]
                }
            );
            s.begin_delivery(1, "aa").unwrap();
            s.begin_delivery(1, "aa").unwrap();
            s.begin_delivery(2, "bb").unwrap();
            assert_eq!(s.fencing().unwrap().in_flight, ["aa", "bb"]);
            let d = VerifiedDelivery {
                generation: 1,
                checksum: "aa",
                conf: "x",
                detail: "",
                warning: None,
                taken: "",
            };
            s.mark_applied(&d, 2).unwrap();
            // At or below the applied generation a file is replaceable anyway.
            assert_eq!(s.fencing().unwrap().in_flight, ["bb"]);
            // Raised above what the SMs hold, never below its own.
            assert_eq!(
                s.raise_fencing("operator:x", 5, None, "", "held 5", 3)
                    .unwrap(),
                6
            );
            assert_eq!(
                s.raise_fencing("operator:x", 2, Some("held"), "-a\n+b", "held 2", 4)
                    .unwrap(),
                7
            );
            let f = s.fencing().unwrap();
            assert_eq!((f.number, f.in_flight.len()), (7, 0));
            assert_eq!(s.applied().unwrap().conf.as_deref(), Some("held"));
            let a = s.audit(10).unwrap();
            let raised: Vec<&AuditEntry> = a.iter().filter(|l| l.action == "fence").collect();
            assert_eq!(raised.len(), 2);
            assert!(
                raised[1].detail.contains("6 -> 7") && raised[1].diff == "-a\n+b",
                "{a:?}"
            );
        },
    );
}

fn lease(phase: Phase) -> Lease {
    Lease {
        id: 1,
        tenant: "alice".into(),
        nodes_wanted: 1,
        duration_s: 60,
        submitted: 10,
        not_before: 10,
        same_switch: true,
        phase,
        start: Some(10),
        end: Some(70),
        nodes: vec!["node1".into()],
        reason: None,
    }
}

/// A step of the lease loop is one transaction: when one of its moves is refused, neither
/// the lease nor its decisions nor any other move are kept, so a restarted controller never
/// finds a lease change half made; what commits reads back as written, its decisions are
/// audited, and a warning reaches the node's notices until the lease is extended.
/// Both backends answer the same and write the same audit lines.
#[test]
fn a_lease_step_commits_whole_or_not_at_all_and_reads_back_as_written() {
    same_on_each_backend(
        "a_lease_step_commits_whole_or_not_at_all_and_reads_back_as_written",
        |s| {
            s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
            let q = Quota {
                max_nodes: 2,
                node_seconds: 7200,
                period_s: 86_400,
            };
            s.set_lease_quota("admin:x", "alice", Some(&q), 2).unwrap();
            assert!(matches!(
                s.set_lease_quota("admin:x", "bob", Some(&q), 2),
                Err(StoreError::NotFound(_))
            ));
            let l = lease(Phase::Active);
            let decisions = [
                Decision::Grant {
                    lease: 1,
                    nodes: l.nodes.clone(),
                    start: 10,
                    end: 70,
                },
                Decision::MoveIn {
                    lease: 1,
                    node: "node1".into(),
                },
            ];
            let bad = [
                Change::CreateGroup {
                    name: "alice".into(),
                    tenant: "alice".into(),
                },
                // No such server: the whole step is refused.
                Change::Move {
                    server: "node1".into(),
                    to: "alice".into(),
                },
            ];
            let commit = LeaseCommit {
                actor: "controller",
                leases: std::slice::from_ref(&l),
                changes: &bad,
                decisions: &decisions,
            };
            assert!(s.lease_commit(&commit, 10).is_err());
            assert!(s.lease_records().unwrap().leases.is_empty());
            assert!(s.lease_decisions(1).unwrap().is_empty());
            assert!(s.groups().unwrap().is_empty());
            // Without the move it commits, and reads back as written.
            let commit = LeaseCommit {
                changes: &bad[..1],
                ..commit
            };
            let ops = s.lease_commit(&commit, 10).unwrap();
            assert_eq!(ops.len(), 1);
            let r = s.lease_records().unwrap();
            assert_eq!(r.leases, vec![l.clone()]);
            assert_eq!(r.quotas["alice"], q);
            let kinds: Vec<String> = s
                .lease_decisions(1)
                .unwrap()
                .into_iter()
                .map(|d| d.kind)
                .collect();
            assert_eq!(kinds, ["grant", "move-in"]);
            // A warning reaches the node's notices until the lease is extended.
            let warn = [Decision::Warn {
                lease: 1,
                nodes: vec!["node1".into()],
                end: 70,
            }];
            let ending = lease(Phase::Ending);
            let step = LeaseCommit {
                actor: "controller",
                leases: std::slice::from_ref(&ending),
                changes: &[],
                decisions: &warn,
            };
            s.lease_commit(&step, 40).unwrap();
            assert_eq!(s.lease_notices("node1").unwrap()[0].end, 70);
            let extend = [Decision::Extend { lease: 1, end: 130 }];
            s.lease_commit(
                &LeaseCommit {
                    decisions: &extend,
                    ..step
                },
                41,
            )
            .unwrap();
            assert!(s.lease_notices("node1").unwrap().is_empty());
            let audit = s.audit(100).unwrap();
            assert!(
                audit
                    .iter()
                    .any(|a| a.action == "lease.warn" && a.subject == "lease 1 (alice)"),
                "{audit:?}"
            );
            assert!(
                audit
                    .iter()
                    .any(|a| a.action == "lease.quota" && a.subject == "alice"),
                "{audit:?}"
            );
            // A quota removed: the tenant cannot lease.
            s.set_lease_quota("admin:x", "alice", None, 42).unwrap();
            assert!(s.lease_records().unwrap().quotas.is_empty());
            state_lines(s, 50)
        },
    );
}

/// An agent's links (RoCE ports, NICs) are kept per server and shown with it; an applied
/// operation keeps what its delivery took away; ports a report drops are one audit line;
/// a removed server's links go with it.
/// Both backends answer the same and write the same audit lines.
#[test]
fn links_and_what_a_delivery_took_are_kept_and_go_with_their_server() {
    same_on_each_backend(
        "links_and_what_a_delivery_took_are_kept_and_go_with_their_server",
        |s| {
            s.create_tenant("admin:x", "alice", "ta", None, 1).unwrap();
            enrolled(s, "node1");
            s.report("node1", &[port(0x101), port(0x102)], "h1", 3)
                .unwrap();
            let links = crate::model::HostLinks {
                roce: vec![crate::model::RoceView {
                    device: "rocep1s0f0".into(),
                    num: 1,
                    guid: Guid(0x0202_c9ff_fe02_0101),
                    state: "ACTIVE".into(),
                    rate: Some("200 Gb/sec (4X HDR)".into()),
                    netdev: Some("enp1s0f0np0".into()),
                }],
                nics: vec![crate::model::NicView {
                    name: "enp1s0f0np0".into(),
                    link_layer: "Ethernet".into(),
                    speed_mbps: Some(200_000),
                    mtu: 9000,
                    operstate: "up".into(),
                    pci: Some("0000:01:00.0".into()),
                    rdma_device: Some("rocep1s0f0".into()),
                    addresses: vec!["10.0.0.1/24".into()],
                }],
            };
            s.set_links("node1", &links, 4).unwrap();
            let v = s.servers(4, 60).unwrap();
            assert_eq!((&v[0].roce, &v[0].nics), (&links.roce, &links.nics));
            // The last report wins.
            s.set_links("node1", &crate::model::HostLinks::default(), 5)
                .unwrap();
            s.set_links("node1", &links, 6).unwrap();
            assert_eq!(s.servers(6, 60).unwrap()[0].roce, links.roce);
            // An operation applied keeps what its delivery took, line by line.
            let op = s
                .change(
                    "admin:x",
                    &Change::CreateGroup {
                        name: "a".into(),
                        tenant: "alice".into(),
                    },
                    7,
                )
                .unwrap()
                .unwrap();
            let d = VerifiedDelivery {
                generation: op.generation,
                checksum: "cc",
                conf: "x",
                detail: "verified",
                warning: None,
                taken: "group b removed\n0x0000000000000101 loses 0x8001",
            };
            assert_eq!(s.mark_applied(&d, 8).unwrap(), [op.id]);
            let ops = s.operations(false).unwrap();
            assert_eq!(
                ops[0].taken,
                ["group b removed", "0x0000000000000101 loses 0x8001"]
            );
            // Two ports dropped by one report: one audit line naming both.
            s.report("node1", &[], "h2", 9).unwrap();
            let gone: Vec<AuditEntry> = s
                .audit(100)
                .unwrap()
                .into_iter()
                .filter(|a| a.action == "port.gone")
                .collect();
            assert_eq!(gone.len(), 1, "{gone:?}");
            assert_eq!(gone[0].subject, "node1");
            assert!(
                gone[0].detail.starts_with("2 port(s) no longer reported: "),
                "{gone:?}"
            );
            s.remove_server("admin:x", "node1", 10).unwrap();
            assert!(s.servers(10, 60).unwrap().is_empty());
            // Enrolled again, it starts with no links.
            s.create_enrollment("admin:x", "e-again", Some("node1"), 100, 11)
                .unwrap();
            s.enroll("e-again", "node1", "s-again", 12).unwrap();
            let v = s.servers(12, 60).unwrap();
            assert!(v[0].roce.is_empty() && v[0].nics.is_empty(), "{v:?}");
            state_lines(s, 50)
        },
    );
}

/// Runs of link measurements are stored with an audit line, listed newest first, and only
/// the newest `links::MAX_RUNS` are kept. Both backends answer the same.
#[test]
fn link_runs_are_kept_newest_first_and_bounded() {
    use crate::links::{LinkResult, LinkRunIn, LinkSource, MAX_RUNS};
    same_on_each_backend("link_runs_are_kept_newest_first_and_bounded", |s| {
        let run = |g: f64| LinkRunIn {
            source: LinkSource::P2p,
            results: vec![LinkResult {
                src: "node1".into(),
                dst: "node2".into(),
                nic: "enp1s0f0np0".into(),
                gbps: g,
                rtt_us: Some(12.5),
                error: None,
            }],
        };
        let first = s.add_link_run("admin:x", &run(100.0), 10).unwrap();
        let second = s.add_link_run("admin:x", &run(50.0), 11).unwrap();
        assert!(second.id > first.id);
        let runs = s.link_runs(10).unwrap();
        assert_eq!(runs, vec![second.clone(), first.clone()]);
        assert_eq!(runs[1].results[0].rtt_us, Some(12.5));
        // Every source is stored and read back as itself (`weft bench collectives`'s links
        // timed through the plugin: interface `plugin`, no round trip, a failed one).
        let coll = LinkRunIn {
            source: LinkSource::Collectives,
            results: vec![LinkResult {
                src: "node2".into(),
                dst: "node1".into(),
                nic: "plugin".into(),
                gbps: 0.0,
                rtt_us: None,
                error: Some("no time measured for 4194304 B through the plugin".into()),
            }],
        };
        let third = s.add_link_run("admin:x", &coll, 11).unwrap();
        let doctor = LinkRunIn {
            source: LinkSource::Doctor,
            ..run(90.0)
        };
        let fourth = s.add_link_run("admin:x", &doctor, 11).unwrap();
        let runs = s.link_runs(2).unwrap();
        assert_eq!(runs, vec![fourth.clone(), third.clone()]);
        assert_eq!(runs[1].source, LinkSource::Collectives);
        assert_eq!(runs[1].results, coll.results);
        assert_eq!(runs[0].source, LinkSource::Doctor);
        let mut out = state_lines(s, 12);
        assert!(out.iter().any(|l| l.contains("links.report")));
        for i in 0..MAX_RUNS {
            s.add_link_run("admin:x", &run(1.0), 20 + i as u64).unwrap();
        }
        let all = s.link_runs(usize::MAX).unwrap();
        assert_eq!(all.len(), MAX_RUNS as usize);
        assert!(all.iter().all(|r| r.id > second.id));
        out.push(format!("{:?}", s.link_runs(2).unwrap()));
        out
    });
}

/// Console sessions outlive the process (they are rows), end at logout, are bounded (the
/// oldest live one ends first) and forgotten after their life.
#[test]
fn console_sessions_are_kept_ended_bounded_and_forgotten_after_their_life() {
    each_backend(
        "console_sessions_are_kept_ended_bounded_and_forgotten_after_their_life",
        |s| {
            let session = |id: &str, created: u64| ConsoleSession {
                id_hash: format!("h-{id}"),
                token_hash: "t".into(),
                csrf: format!("c-{id}"),
                actor: "admin:x".into(),
                created,
                ended: None,
            };
            s.console_session_create(&session("a", 100), 1000, 2)
                .unwrap();
            assert_eq!(s.console_session("h-a").unwrap(), Some(session("a", 100)));
            assert_eq!(s.console_session("h-zz").unwrap(), None);
            assert!(s.console_session_end("h-a", 150).unwrap());
            assert!(!s.console_session_end("h-a", 160).unwrap());
            assert_eq!(s.console_session("h-a").unwrap().unwrap().ended, Some(150));
            // Two live at most: the third ends the oldest.
            s.console_session_create(&session("b", 200), 1000, 2)
                .unwrap();
            s.console_session_create(&session("c", 300), 1000, 2)
                .unwrap();
            s.console_session_create(&session("d", 400), 1000, 2)
                .unwrap();
            assert_eq!(s.console_session("h-b").unwrap().unwrap().ended, Some(400));
            assert_eq!(s.console_session("h-c").unwrap().unwrap().ended, None);
            assert_eq!(s.console_session("h-d").unwrap().unwrap().ended, None);
            // Past their life (1000 s), they are forgotten at the next login.
            s.console_session_create(&session("e", 1250), 1000, 2)
                .unwrap();
            assert_eq!(s.console_session("h-a").unwrap(), None);
            assert_eq!(s.console_session("h-b").unwrap(), None);
            assert!(s.console_session("h-c").unwrap().is_some());
        },
    );
}

#[test]
fn an_audit_prune_deletes_the_older_lines_under_a_line_that_records_it() {
    same_on_each_backend(
        "an_audit_prune_deletes_the_older_lines_under_a_line_that_records_it",
        |s| {
            let line = |subject| AuditLine {
                actor: "admin:x",
                action: "test",
                subject,
                outcome: "ok",
                ..AuditLine::default()
            };
            for (at, subject) in [(10, "a"), (20, "b"), (30, "c")] {
                s.audit_append(&line(subject), at).unwrap();
            }
            // A cut-off after now is refused, and nothing changes.
            let err = s.audit_prune("operator:root", 41, 40).unwrap_err();
            assert!(
                matches!(&err, StoreError::Invalid(m) if m.contains("after now")),
                "{err}"
            );
            assert_eq!(s.audit(100).unwrap().len(), 3);

            let p = s.audit_prune("operator:root", 25, 40).unwrap();
            assert_eq!(
                (p.before, p.count, p.oldest, p.newest),
                (25, 2, Some(10), Some(20))
            );
            let lines = s.audit(100).unwrap();
            let got: Vec<(&str, &str, &str)> = lines
                .iter()
                .map(|l| (l.actor.as_str(), l.action.as_str(), l.subject.as_str()))
                .collect();
            assert_eq!(
                got,
                [
                    ("admin:x", "test", "c"),
                    ("operator:root", "audit.prune", "2 lines written before 25")
                ]
            );
            assert_eq!(lines[1].id, p.line);
            assert_eq!(lines[1].at, 40);
            let detail: serde_json::Value = serde_json::from_str(&lines[1].detail).unwrap();
            assert_eq!(
                detail,
                serde_json::json!({"before": 25, "count": 2, "oldest": 10, "newest": 20})
            );
            // Nothing left to delete: the prune is still recorded.
            let q = s.audit_prune("admin:y", 25, 50).unwrap();
            assert_eq!((q.count, q.oldest), (0, None));
            // A later prune takes an earlier prune's line with the rest.
            let r = s.audit_prune("admin:y", 45, 60).unwrap();
            assert_eq!((r.count, r.oldest, r.newest), (2, Some(30), Some(40)));
            let left: Vec<(u64, String)> = s
                .audit(100)
                .unwrap()
                .into_iter()
                .map(|l| (l.at, l.subject))
                .collect();
            assert_eq!(
                left,
                [
                    (50, "0 lines written before 25".to_string()),
                    (60, "2 lines written before 45".to_string())
                ]
            );
            // Ids go on rising after a prune (no line takes a deleted line's id).
            s.audit_append(&line("d"), 70).unwrap();
            let all = s.audit(100).unwrap();
            assert!(all.windows(2).all(|w| w[0].id < w[1].id));
            assert!(all[2].id > r.line);
            state_lines(s, 70)
        },
    );
}

/// An agent's whole report for `name`: ports `guids`, one GPU named `gpu`.
fn host(name: &str, guids: &[u64], gpu: &str) -> AgentReport {
    AgentReport {
        server: name.into(),
        ports: guids.iter().map(|g| port(*g)).collect(),
        report_hash: format!("{guids:?}"),
        gpus: vec![weft_agent::Gpu {
            index: 0,
            name: gpu.into(),
            uuid: None,
            memory_total_bytes: None,
            pci: None,
        }],
        links: crate::model::HostLinks::default(),
    }
}

#[test]
fn many_agents_reporting_at_once_are_answered_as_one_by_one() {
    same_on_each_backend(
        "many_agents_reporting_at_once_are_answered_as_one_by_one",
        |s| {
            let mut seen = Vec::new();
            for i in 0..40 {
                enrolled(s, &format!("h{i}"));
            }
            s.create_tenant("admin:x", "t", &"t".repeat(64), None, 3)
                .unwrap();
            s.change(
                "admin:x",
                &Change::CreateGroup {
                    name: "g".into(),
                    tenant: "t".into(),
                },
                3,
            )
            .unwrap();
            // Forty agents at once (PostgreSQL commits them together): first reports,
            // the same again (the heartbeat case), then each with a new GPU.
            for (pass, gpu) in [(0u64, "A"), (1, "A"), (2, "B")] {
                let acks: Vec<String> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..40u64)
                        .map(|i| {
                            scope.spawn(move || {
                                let r = host(&format!("h{i}"), &[0x100 + i], gpu);
                                format!("{:?}", s.report_host(r, 10 + pass))
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                seen.extend(acks);
            }
            // One by one: a member's new port is an operation; another's port is a claim;
            // an unknown server is refused and leaves nothing.
            s.change(
                "admin:x",
                &Change::AddMember {
                    group: "g".into(),
                    server: "h0".into(),
                },
                20,
            )
            .unwrap();
            let o = s.report_host(host("h0", &[0x100, 0x200], "B"), 21).unwrap();
            assert!(o.desired_changed, "{o:?}");
            seen.push(format!("{o:?}"));
            let o = s.report_host(host("h1", &[0x101, 0x102], "B"), 22).unwrap();
            assert_eq!(o.ack.pending, [Guid(0x102)], "{o:?}");
            seen.push(format!("{o:?}"));
            assert!(s.report_host(host("nobody", &[0x300], "B"), 23).is_err());
            let servers = s.servers(30, 60).unwrap();
            assert_eq!(servers.len(), 40);
            assert!(servers.iter().all(|v| v.gpus[0].name == "B"), "{servers:?}");
            assert_eq!(s.claims().unwrap().len(), 1);
            seen.extend(state_lines(s, 30));
            seen
        },
    );
}
