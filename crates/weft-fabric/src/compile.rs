//! From a plan (and an inventory, when one is known) to a checked partitions.conf.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::conf::{self, Conf, Flags, Member, Partition, Selector};
use crate::plan::{DefaultPolicy, Plan};
use crate::types::{Guid, Inventory, Membership, NodeType, PKey, node_matches};

/// The result of a successful [`compile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compiled {
    /// The partitions.conf to deliver (Default first, every P_Key explicit).
    pub conf: Conf,
    /// Which tenant owns each P_Key (Default is owned by nobody and not listed).
    pub owners: BTreeMap<PKey, String>,
}

/// One broken rule, naming what it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// What it names: "partition `tenantA`", "port 0x...", "node `node3`", "plan".
    pub subject: String,
    /// What is wrong, one sentence.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

fn v(subject: String, message: String) -> Violation {
    Violation { subject, message }
}

/// Checks a plan against an optional inventory, allocates missing P_Keys (from 0x0001
/// upward past keys in use, in plan order) and produces the conf.
///
/// Rules: names valid and unique; P_Keys in 0x0001..=0x7ffe and unique; flag values in
/// range; members resolvable (node names need an inventory; GUIDs must be in it unless
/// `allow_unknown_guids`); no port listed twice in one partition; no port a full member
/// in partitions of two tenants unless in `allow_shared_ports`; per-port table capacity
/// (Default included) respected.
pub fn compile(plan: &Plan, inventory: Option<&Inventory>) -> Result<Compiled, Vec<Violation>> {
    let mut errs = Vec::new();
    let part_subject = |name: &str| format!("partition `{name}`");

    // Names and explicit keys.
    let mut names = BTreeSet::new();
    let mut used: BTreeMap<u16, &str> = BTreeMap::new();
    for p in &plan.partitions {
        if let Err(m) = conf::validate_name(&p.name) {
            errs.push(v(part_subject(&p.name), m));
        }
        if p.name == "Default" {
            errs.push(v(
                part_subject(&p.name),
                "`Default` is set by the [default] table".into(),
            ));
        }
        if !names.insert(p.name.as_str()) {
            errs.push(v(part_subject(&p.name), "the name is used twice".into()));
        }
        if p.tenant.trim().is_empty() {
            errs.push(v(part_subject(&p.name), "the tenant is empty".into()));
        }
        if let Some(k) = p.pkey {
            if k.is_default() {
                errs.push(v(
                    part_subject(&p.name),
                    "P_Key 0x7fff is reserved for the Default partition".into(),
                ));
            } else if let Some(other) = used.insert(k.base(), &p.name) {
                errs.push(v(
                    part_subject(&p.name),
                    format!("P_Key {k} is already used by partition `{other}`"),
                ));
            }
        }
        for (what, val, min, max) in [
            ("mtu", p.mtu, 1, 5),
            ("rate", p.rate, 2, 18),
            ("sl", p.sl, 0, 15),
        ] {
            if let Some(x) = val
                && !(min..=max).contains(&x)
            {
                errs.push(v(
                    part_subject(&p.name),
                    format!("{what} must be {min}..={max}, found {x}"),
                ));
            }
        }
    }

    // Allocation.
    let mut next: u16 = 1;
    let mut keys = Vec::with_capacity(plan.partitions.len());
    for p in &plan.partitions {
        let key = match p.pkey {
            Some(k) => Some(k),
            None => {
                while next < 0x7fff && used.contains_key(&next) {
                    next += 1;
                }
                if next >= 0x7fff {
                    errs.push(v(
                        part_subject(&p.name),
                        "no free P_Key is left to allocate".into(),
                    ));
                    None
                } else {
                    used.insert(next, &p.name);
                    let k = PKey::new(next).ok();
                    next += 1;
                    k
                }
            }
        };
        keys.push(key);
    }

    // Shared-port allowances.
    let mut shared_guids = BTreeSet::new();
    let mut shared_nodes = BTreeSet::new();
    for s in &plan.allow_shared_ports {
        match s.parse::<Guid>() {
            Ok(g) => {
                shared_guids.insert(g);
            }
            Err(_) => {
                shared_nodes.insert(s.as_str());
            }
        }
    }
    let shared_ok = |g: Guid| {
        shared_guids.contains(&g)
            || inventory
                .and_then(|i| i.port(g))
                .is_some_and(|p| shared_nodes.iter().any(|n| node_matches(&p.node_desc, n)))
    };

    // Members.
    let known: Option<BTreeMap<Guid, usize>> = inventory.map(|inv| {
        inv.ports
            .iter()
            .enumerate()
            .map(|(i, p)| (p.port_guid, i))
            .collect()
    });
    let node_index: Option<BTreeMap<&str, Vec<Guid>>> = inventory.map(|inv| {
        let mut m: BTreeMap<&str, Vec<Guid>> = BTreeMap::new();
        for p in inv.ports.iter().filter(|p| p.node_type == NodeType::Ca) {
            m.entry(p.node_desc.as_str()).or_default().push(p.port_guid);
            if let Some(first) = p.node_desc.split_whitespace().next()
                && first != p.node_desc
            {
                m.entry(first).or_default().push(p.port_guid);
            }
        }
        m
    });
    let mut full_in: BTreeMap<Guid, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    let mut entries: BTreeMap<Guid, usize> = BTreeMap::new();
    let mut partitions = Vec::with_capacity(plan.partitions.len() + 1);
    let ipoib_default = plan.default.ipoib;
    partitions.push(Partition {
        name: "Default".into(),
        pkey: Some(PKey::DEFAULT),
        flags: Flags {
            ipoib: ipoib_default,
            ..Flags::default()
        },
        members: match plan.default.policy {
            DefaultPolicy::Isolate => vec![
                Member {
                    selector: Selector::All,
                    membership: Some(Membership::Limited),
                },
                Member {
                    selector: Selector::SelfPort,
                    membership: Some(Membership::Full),
                },
            ],
            DefaultPolicy::Open => vec![Member {
                selector: Selector::All,
                membership: Some(Membership::Full),
            }],
        },
        mcast_groups: Vec::new(),
    });

    for (p, key) in plan.partitions.iter().zip(&keys) {
        let mut members: Vec<Member> = Vec::new();
        let mut seen: BTreeMap<Guid, Membership> = BTreeMap::new();
        for m in &p.members {
            let membership = m.membership.unwrap_or(p.membership);
            let guids: Vec<Guid> = match (&m.node, &m.guid) {
                (Some(node), None) => {
                    match &node_index {
                        None => {
                            errs.push(v(
                            format!("node `{node}`"),
                            format!("partition `{}` names a node, which needs an inventory to resolve", p.name),
                        ));
                            continue;
                        }
                        Some(idx) => match idx.get(node.as_str()) {
                            Some(gs) => gs.clone(),
                            None => {
                                errs.push(v(
                                format!("node `{node}`"),
                                format!("partition `{}` names a node that has no CA port in the inventory", p.name),
                            ));
                                continue;
                            }
                        },
                    }
                }
                (None, Some(g)) => {
                    if let Some(k) = &known
                        && !k.contains_key(g)
                        && !plan.allow_unknown_guids
                    {
                        let hint = inventory
                            .filter(|inv| inv.ports.iter().any(|pp| pp.node_guid == *g))
                            .map_or(String::new(), |_| {
                                " (it is a node GUID; name a port GUID)".into()
                            });
                        errs.push(v(
                            format!("port {g}"),
                            format!(
                                "partition `{}` names a GUID that is not in the inventory{hint}",
                                p.name
                            ),
                        ));
                        continue;
                    }
                    vec![*g]
                }
                _ => {
                    errs.push(v(
                        part_subject(&p.name),
                        "each member names exactly one of `node` or `guid`".into(),
                    ));
                    continue;
                }
            };
            for g in guids {
                if let Some(prev) = seen.insert(g, membership) {
                    errs.push(v(
                        format!("port {g}"),
                        format!(
                            "listed twice in partition `{}` (as {prev} and as {membership})",
                            p.name
                        ),
                    ));
                    continue;
                }
                if membership != Membership::Limited {
                    full_in
                        .entry(g)
                        .or_default()
                        .entry(p.tenant.as_str())
                        .or_default()
                        .push(p.name.as_str());
                }
                *entries.entry(g).or_default() += 1;
                members.push(Member {
                    selector: Selector::Guid(g),
                    membership: Some(membership),
                });
            }
        }
        partitions.push(Partition {
            name: p.name.clone(),
            pkey: *key,
            flags: Flags {
                indx0: p.indx0,
                ipoib: p.ipoib,
                mtu: p.mtu,
                rate: p.rate,
                sl: p.sl,
                ..Flags::default()
            },
            members,
            mcast_groups: Vec::new(),
        });
    }

    for (g, tenants) in &full_in {
        if tenants.len() > 1 && !shared_ok(*g) {
            let list = tenants
                .iter()
                .map(|(t, ps)| {
                    let ps: Vec<String> = ps.iter().map(|p| format!("`{p}`")).collect();
                    format!("{t} ({})", ps.join(", "))
                })
                .collect::<Vec<_>>()
                .join(" and ");
            errs.push(v(
                port_subject(*g, inventory),
                format!("is a full member of partitions of tenants {list}; list it in allow_shared_ports to allow this"),
            ));
        }
    }

    if let Some(inv) = inventory {
        for port in &inv.ports {
            // Default is on every port.
            let n = 1 + entries.get(&port.port_guid).copied().unwrap_or(0);
            if n > usize::from(port.pkey_capacity) {
                errs.push(v(
                    port_subject(port.port_guid, inventory),
                    format!(
                        "needs {n} P_Key table entries (Default included) but has room for {}",
                        port.pkey_capacity
                    ),
                ));
            }
        }
    }

    if !errs.is_empty() {
        return Err(errs);
    }
    let conf = Conf { partitions };
    // Self-check: what we deliver must read back as itself.
    if conf::parse(&conf::render(&conf)).as_ref() != Ok(&conf) {
        return Err(vec![v(
            "plan".into(),
            "internal error: the rendered partitions.conf does not read back the same".into(),
        )]);
    }
    let owners = plan
        .partitions
        .iter()
        .zip(&keys)
        .filter_map(|(p, k)| k.map(|k| (k, p.tenant.clone())))
        .collect();
    Ok(Compiled { conf, owners })
}

fn port_subject(g: Guid, inventory: Option<&Inventory>) -> String {
    match inventory.and_then(|i| i.port(g)) {
        Some(p) if !p.node_desc.is_empty() => format!("port {g} (`{}`)", p.node_desc),
        _ => format!("port {g}"),
    }
}
