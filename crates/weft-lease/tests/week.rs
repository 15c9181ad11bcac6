//! A simulated week: a virtual clock, many tenants with their quotas, a pool under two
//! leaf switches (and nodes of unknown place), random requests (some with a later start,
//! some on one switch), extensions and releases, and a tick between them. After every
//! call the invariants are checked against the test's own model of who owns which node,
//! and at the end, with no more requests, the clock runs on until every lease is over.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use weft_lease::{Ask, Book, Decision, LeaseId, Phase, PoolNode, Quota};

const WEEK: u64 = 7 * 86_400;
const WARN_S: u64 = 300;

#[derive(Debug, Clone)]
enum Op {
    Request {
        tenant: usize,
        nodes: u32,
        duration_s: u64,
        later: Option<u64>,
        same_switch: bool,
    },
    Extend {
        pick: usize,
        by_s: u64,
        as_owner: bool,
    },
    Release {
        pick: usize,
        as_owner: bool,
    },
}

fn op(tenants: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..tenants, 1u32..6, 60u64..2 * 86_400, proptest::option::weighted(0.3, 1u64..86_400), proptest::bool::weighted(0.3))
            .prop_map(|(tenant, nodes, duration_s, later, same_switch)| Op::Request { tenant, nodes, duration_s, later, same_switch }),
        1 => (any::<usize>(), 60u64..86_400, proptest::bool::weighted(0.9))
            .prop_map(|(pick, by_s, as_owner)| Op::Extend { pick, by_s, as_owner }),
        1 => (any::<usize>(), proptest::bool::weighted(0.9))
            .prop_map(|(pick, as_owner)| Op::Release { pick, as_owner }),
    ]
}

#[derive(Debug, Clone)]
struct World {
    pool: Vec<PoolNode>,
    quotas: Vec<Quota>,
    /// (seconds since the previous step, operation or a bare tick)
    steps: Vec<(u64, Option<Op>)>,
}

fn world() -> impl Strategy<Value = World> {
    (2usize..7, 0usize..8, 0usize..8, 0usize..3).prop_flat_map(|(tenants, a, b, unknown)| {
        let pool: Vec<PoolNode> = (0..a)
            .map(|i| (format!("a{i}"), Some("leaf-a")))
            .chain((0..b).map(|i| (format!("b{i}"), Some("leaf-b"))))
            .chain((0..unknown).map(|i| (format!("x{i}"), None)))
            .map(|(name, s)| PoolNode {
                name,
                switch: s.map(str::to_string),
            })
            .collect();
        let quota = (
            1u32..8,
            1u64..200,
            prop_oneof![Just(86_400u64), Just(WEEK), Just(3_600)],
        )
            .prop_map(|(max_nodes, hours, period_s)| Quota {
                max_nodes,
                node_seconds: hours * 3600,
                period_s,
            });
        (
            Just(pool),
            proptest::collection::vec(quota, tenants),
            proptest::collection::vec(
                (1u64..3 * 3600, proptest::option::weighted(0.6, op(tenants))),
                50..250,
            ),
        )
            .prop_map(|(pool, quotas, steps)| World {
                pool,
                quotas,
                steps,
            })
    })
}

fn tenant(i: usize) -> String {
    format!("t{i}")
}

/// The test's own view: which lease owns which node, built only from the decisions.
#[derive(Default)]
struct Model {
    owner: BTreeMap<String, LeaseId>,
    warned: BTreeSet<LeaseId>,
}

/// The queue key: the lease joined the queue at its earliest start, ties by number.
fn key(book: &Book, id: LeaseId) -> (u64, LeaseId) {
    (book.leases[&id].not_before, id)
}

/// The test's own quota rule (not the crate's): nodes at once, node-seconds of the leases
/// started in `now`'s period.
fn blocked(book: &Book, id: LeaseId, now: u64) -> bool {
    let l = &book.leases[&id];
    let q = book.quotas[&l.tenant];
    let mine = book.leases.values().filter(|o| o.tenant == l.tenant);
    let held: u64 = mine
        .clone()
        .filter(|o| matches!(o.phase, Phase::Active | Phase::Ending))
        .map(|o| u64::from(o.nodes_wanted))
        .sum();
    let used: u64 = mine
        .filter(|o| o.start.is_some_and(|s| s / q.period_s == now / q.period_s))
        .map(|o| u64::from(o.nodes_wanted) * (o.end.unwrap() - o.start.unwrap()))
        .sum();
    held + u64::from(l.nodes_wanted) > u64::from(q.max_nodes)
        || used + u64::from(l.nodes_wanted) * l.duration_s > q.node_seconds
}

/// Whether the free nodes could hold lease `id`.
fn fits(book: &Book, id: LeaseId) -> bool {
    let l = &book.leases[&id];
    let free = book.free();
    let n = l.nodes_wanted as usize;
    if l.same_switch {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for f in free.iter().filter_map(|f| f.switch.as_deref()) {
            *per.entry(f).or_default() += 1;
        }
        per.values().any(|c| *c >= n)
    } else {
        free.len() >= n
    }
}

/// Every invariant, after a call at `now` that returned `out`; `queued_before` is the
/// queue before the call.
fn check(book: &Book, model: &mut Model, now: u64, out: &[Decision], queued_before: &[LeaseId]) {
    let switch_of: BTreeMap<&str, Option<&str>> = book
        .pool
        .iter()
        .map(|p| (p.name.as_str(), p.switch.as_deref()))
        .collect();
    let mut granted = Vec::new();
    for d in out {
        match d {
            Decision::MoveIn { lease, node } => {
                assert!(
                    switch_of.contains_key(node.as_str()),
                    "{node} is not a pool node"
                );
                let prev = model.owner.insert(node.clone(), *lease);
                assert_eq!(
                    prev, None,
                    "{node} moved into lease {lease} while lease {prev:?} holds it"
                );
            }
            Decision::MoveOut { lease, node } => {
                assert_eq!(
                    model.owner.remove(node),
                    Some(*lease),
                    "lease {lease} moved out {node}, which it does not hold"
                );
                if book.leases[lease].phase == Phase::Ended {
                    assert!(
                        model.warned.contains(lease),
                        "lease {lease} ended without a warning"
                    );
                }
            }
            Decision::Warn { lease, nodes, end } => {
                assert!(
                    *end <= now + WARN_S,
                    "lease {lease} warned at {now} for {end}"
                );
                for n in nodes {
                    assert_eq!(model.owner.get(n), Some(lease));
                }
                model.warned.insert(*lease);
            }
            Decision::Extend { lease, .. } => {
                model.warned.remove(lease);
            }
            Decision::Grant { lease, nodes, .. } => {
                let l = &book.leases[lease];
                assert_eq!(nodes.len(), l.nodes_wanted as usize);
                if l.same_switch {
                    let s: BTreeSet<Option<&str>> =
                        nodes.iter().map(|n| switch_of[n.as_str()]).collect();
                    assert!(
                        s.len() == 1 && !s.contains(&None),
                        "same-switch lease {lease} got {nodes:?}"
                    );
                }
                granted.push(*lease);
            }
            Decision::Refuse { reason, .. } => assert!(!reason.is_empty()),
            Decision::Queue { .. } | Decision::Wait { .. } | Decision::Release { .. } => {}
        }
    }
    // Never a node in two leases, and the model agrees with the book.
    let mut live: BTreeMap<&str, LeaseId> = BTreeMap::new();
    for l in book.leases.values().filter(|l| l.phase.live()) {
        for n in &l.nodes {
            assert!(live.insert(n, l.id).is_none(), "{n} is in two live leases");
        }
    }
    let model_view: BTreeMap<&str, LeaseId> =
        model.owner.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    assert_eq!(live, model_view);
    // Never over quota.
    for (t, q) in &book.quotas {
        let mine: Vec<_> = book.leases.values().filter(|l| &l.tenant == t).collect();
        let held: u32 = mine
            .iter()
            .filter(|l| l.phase.live())
            .map(|l| l.nodes_wanted)
            .sum();
        assert!(held <= q.max_nodes, "{t} holds {held} > {}", q.max_nodes);
        let mut per_period: BTreeMap<u64, u64> = BTreeMap::new();
        for l in mine.iter().filter(|l| l.start.is_some()) {
            *per_period.entry(l.start.unwrap() / q.period_s).or_default() += l.charged();
        }
        for (p, used) in per_period {
            assert!(
                used <= q.node_seconds,
                "{t} used {used} node-seconds in period {p}, quota {}",
                q.node_seconds
            );
        }
    }
    // First come, first served: a lease granted past an earlier one still waiting was
    // only allowed because the earlier one's own quota held it back.
    for g in &granted {
        for e in queued_before.iter().chain(book.queue().iter()) {
            if book.leases[e].phase == Phase::Queued && key(book, *e) < key(book, *g) {
                assert!(
                    blocked(book, *e, now),
                    "lease {g} was granted before lease {e}, which waits and was not held back by its quota"
                );
            }
        }
    }
    // The queue never waits while the first lease its quota lets through fits.
    if let Some(first) = book.queue().into_iter().find(|q| !blocked(book, *q, now)) {
        assert!(
            !fits(book, first),
            "lease {first} waits at {now} while free nodes could hold it"
        );
    }
}

fn run(w: &World) {
    let mut book = Book::new(w.pool.clone(), WARN_S);
    for (i, q) in w.quotas.iter().enumerate() {
        book.quotas.insert(tenant(i), *q);
    }
    let mut model = Model::default();
    let mut now = 1_000_000_000 - 1_000_000_000 % WEEK;
    for (dt, op) in &w.steps {
        now += dt;
        let before = book.queue();
        let out = book.tick(now);
        check(&book, &mut model, now, &out, &before);
        let ids: Vec<LeaseId> = book.leases.keys().copied().collect();
        let before = book.queue();
        let out = match op {
            None => continue,
            Some(Op::Request {
                tenant: t,
                nodes,
                duration_s,
                later,
                same_switch,
            }) => {
                let ask = Ask {
                    tenant: tenant(*t),
                    nodes: *nodes,
                    duration_s: *duration_s,
                    start: later.map(|l| now + l),
                    same_switch: *same_switch,
                };
                let (id, out) = book.request(now, ask);
                let answers: Vec<&Decision> = out
                    .iter()
                    .filter(|d| {
                        d.lease() == id
                            && matches!(
                                d,
                                Decision::Grant { .. }
                                    | Decision::Queue { .. }
                                    | Decision::Wait { .. }
                                    | Decision::Refuse { .. }
                            )
                    })
                    .collect();
                assert_eq!(answers.len(), 1, "request {id} got {out:?}");
                if let Decision::Queue { position, .. } = answers[0] {
                    assert_eq!(book.position(id), Some(*position));
                }
                out
            }
            Some(Op::Extend {
                pick,
                by_s,
                as_owner,
            }) if !ids.is_empty() => {
                let id = ids[pick % ids.len()];
                let owner = book.leases[&id].tenant.clone();
                let who = if *as_owner {
                    owner
                } else {
                    format!("{owner}-other")
                };
                let end_before = book.leases[&id].end;
                match book.extend(now, id, Some(&who), *by_s) {
                    Ok(out) => {
                        assert!(*as_owner);
                        assert_eq!(book.leases[&id].end, end_before.map(|e| e + by_s));
                        out
                    }
                    Err(_) => {
                        assert_eq!(
                            book.leases[&id].end, end_before,
                            "a refused extension changed lease {id}"
                        );
                        Vec::new()
                    }
                }
            }
            Some(Op::Release { pick, as_owner }) if !ids.is_empty() => {
                let id = ids[pick % ids.len()];
                let owner = book.leases[&id].tenant.clone();
                let who = if *as_owner {
                    owner
                } else {
                    format!("{owner}-other")
                };
                let phase = book.leases[&id].phase;
                match book.release(now, id, Some(&who)) {
                    Ok(out) => {
                        assert!(*as_owner && !phase.closed());
                        assert_eq!(book.leases[&id].phase, Phase::Released);
                        out
                    }
                    Err(_) => {
                        assert!(!*as_owner || phase.closed());
                        assert_eq!(book.leases[&id].phase, phase);
                        Vec::new()
                    }
                }
            }
            Some(_) => continue,
        };
        check(&book, &mut model, now, &out, &before);
    }
    // No more requests: the clock runs on, from one moment that can change something
    // (an end, a warning, a start, a new quota period) to the next, until every lease is
    // over. Nothing waits forever, and nothing is refused that was once accepted (the
    // pool and the quotas did not change).
    for _ in 0..100_000 {
        let open: Vec<&weft_lease::Lease> =
            book.leases.values().filter(|l| !l.phase.closed()).collect();
        if open.is_empty() {
            break;
        }
        let mut next = u64::MAX;
        for l in &open {
            match l.phase {
                Phase::Waiting => next = next.min(l.not_before),
                Phase::Active => next = next.min(l.end.unwrap() - WARN_S.min(l.end.unwrap() - now)),
                Phase::Ending => next = next.min(l.end.unwrap()),
                _ => {}
            }
        }
        for q in book.quotas.values() {
            next = next.min((now / q.period_s + 1) * q.period_s);
        }
        now = next.max(now + 1);
        let before = book.queue();
        let out = book.tick(now);
        assert!(
            !out.iter().any(|d| matches!(d, Decision::Refuse { .. })),
            "{out:?}"
        );
        check(&book, &mut model, now, &out, &before);
    }
    assert!(
        book.leases.values().all(|l| l.phase.closed()),
        "{:?}",
        book.leases
            .values()
            .filter(|l| !l.phase.closed())
            .collect::<Vec<_>>()
    );
    assert!(model.owner.is_empty());
    assert_eq!(book.free().len(), book.pool.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_week_of_leases_keeps_every_rule(w in world()) {
        run(&w);
    }
}

/// Regression: a pool of nothing refuses every request, and the week still ends.
#[test]
fn an_empty_pool_refuses_with_the_reason() {
    let mut book = Book::new(Vec::new(), WARN_S);
    book.quotas.insert(
        "t0".into(),
        Quota {
            max_nodes: 4,
            node_seconds: 36_000,
            period_s: WEEK,
        },
    );
    let (_, out) = book.request(
        10,
        Ask {
            tenant: "t0".into(),
            nodes: 1,
            duration_s: 60,
            start: None,
            same_switch: false,
        },
    );
    assert!(
        matches!(&out[..], [Decision::Refuse { reason, .. }] if reason.contains("pool's 0 nodes")),
        "{out:?}"
    );
}
