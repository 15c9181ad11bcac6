//! From a plan (and an inventory, when one is known) to a checked partitions.conf.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::conf::{self, Conf, Flags, GroupOptions, Member, Partition, Selector};
use crate::plan::{DefaultPolicy, FabricPlan};
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
pub fn compile(
    plan: &FabricPlan,
    inventory: Option<&Inventory>,
) -> Result<Compiled, Vec<Violation>> {
    let mut errs = Vec::new();
    let part_subject = |name: &str| format!("partition `{name}`");

    // Names and explicit keys.
    let mut names = BTreeSet::new();
    let mut used: BTreeMap<u16, &str> = BTreeMap::new();
    for p in &plan.partitions {
        if let Err(m) = conf::validate_name(&p.name) {
            errs.push(v(part_subject(&p.name), m.to_string()));
        }
        if crate::alloc::is_reserved_name(&p.name) {
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
        check_options(&part_subject(&p.name), &p.options(), &p.mcast, &mut errs);
        check_mcast(
            &part_subject(&p.name),
            &p.mcast,
            p.scope,
            p.ipoib,
            &mut errs,
        );
    }
    check_mcast(
        "partition `Default`",
        &plan.default.mcast,
        plan.default.scope,
        plan.default.ipoib,
        &mut errs,
    );
    check_options(
        "partition `Default`",
        &plan.default.options(),
        &plan.default.mcast,
        &mut errs,
    );

    // Allocation.
    let mut next: u16 = 1;
    let mut keys = Vec::with_capacity(plan.partitions.len());
    for p in &plan.partitions {
        let key = match p.pkey {
            Some(k) => Some(k),
            None => match crate::alloc::lowest_free_pkey(next, |k| used.contains_key(&k)) {
                None => {
                    errs.push(v(
                        part_subject(&p.name),
                        "no free P_Key is left to allocate".into(),
                    ));
                    None
                }
                Some(k) => {
                    used.insert(k.base(), &p.name);
                    next = k.base() + 1;
                    Some(k)
                }
            },
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
    let d = &plan.default;
    let default_members: Vec<(Member, bool)> = match d.policy {
        DefaultPolicy::Isolate => vec![
            (
                Member {
                    selector: Selector::All,
                    membership: Some(Membership::Limited),
                },
                false,
            ),
            (
                Member {
                    selector: Selector::SelfPort,
                    membership: Some(Membership::Full),
                },
                false,
            ),
        ],
        DefaultPolicy::Open => vec![(
            Member {
                selector: Selector::All,
                membership: Some(Membership::Full),
            },
            false,
        )],
        DefaultPolicy::Custom => {
            let mut out = Vec::new();
            for m in &d.members {
                let membership = m.membership.unwrap_or(d.membership);
                match resolve(
                    m,
                    "Default",
                    plan,
                    inventory,
                    &known,
                    &node_index,
                    &mut errs,
                ) {
                    Resolved::Group(s) => out.push((
                        Member {
                            selector: s,
                            membership: Some(membership),
                        },
                        m.indx0,
                    )),
                    Resolved::Ports(gs) => out.extend(gs.into_iter().map(|g| {
                        (
                            Member {
                                selector: Selector::Guid(g),
                                membership: Some(membership),
                            },
                            m.indx0,
                        )
                    })),
                    Resolved::Error => {}
                }
            }
            out
        }
    };
    for (m, _) in &default_members {
        count_entries(&m.selector, inventory, &mut entries, true);
    }
    push_statements(
        &mut partitions,
        "Default",
        PKey::DEFAULT,
        flags_of(d.options(), d.ipoib),
        default_members,
        d.mcast.clone(),
    );

    for (p, key) in plan.partitions.iter().zip(&keys) {
        let mut members: Vec<(Member, bool)> = Vec::new();
        let mut seen: BTreeMap<Guid, Membership> = BTreeMap::new();
        for m in &p.members {
            let membership = m.membership.unwrap_or(p.membership);
            let indx0 = m.indx0 || p.indx0;
            let guids = match resolve(m, &p.name, plan, inventory, &known, &node_index, &mut errs) {
                Resolved::Group(s) => {
                    // A group is everyone of its kind, shared on purpose: not judged by
                    // the shared-port rule, but counted against table capacity.
                    count_entries(&s, inventory, &mut entries, false);
                    members.push((
                        Member {
                            selector: s,
                            membership: Some(membership),
                        },
                        indx0,
                    ));
                    continue;
                }
                Resolved::Ports(gs) => gs,
                Resolved::Error => continue,
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
                members.push((
                    Member {
                        selector: Selector::Guid(g),
                        membership: Some(membership),
                    },
                    indx0,
                ));
            }
        }
        if let Some(key) = key {
            push_statements(
                &mut partitions,
                &p.name,
                *key,
                flags_of(p.options(), p.ipoib),
                members,
                p.mcast.clone(),
            );
        }
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
    match conf::parse_all(&conf::render(&conf)) {
        Ok(back) if back == conf => {}
        Ok(_) => {
            return Err(vec![v(
                "plan".into(),
                "internal error: the rendered partitions.conf does not read back the same".into(),
            )]);
        }
        Err(es) => {
            return Err(es
                .into_iter()
                .map(|e| {
                    v(
                        "plan".into(),
                        format!(
                            "OpenSM would refuse the partitions.conf it makes: {}",
                            e.message
                        ),
                    )
                })
                .collect());
        }
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

fn flags_of(o: GroupOptions, ipoib: bool) -> Flags {
    let mut f = Flags {
        ipoib,
        ..Flags::default()
    };
    f.set_options(o);
    f
}

/// Groups OpenSM would drop without a word ([`crate::mgid_refusal`]) are refused.
fn check_mcast(
    subject: &str,
    groups: &[conf::McastGroup],
    scope: Option<u8>,
    ipoib: bool,
    errs: &mut Vec<Violation>,
) {
    for g in groups {
        if let Some(why) = crate::mgid_refusal(&g.mgid, &crate::mgid_scopes(scope, g.scope), ipoib)
        {
            errs.push(v(
                subject.to_string(),
                format!(
                    "mgid {}: OpenSM 3.3.23 does not create this group: {why}",
                    g.mgid
                ),
            ));
        }
    }
}

fn check_options(
    subject: &str,
    o: &GroupOptions,
    mcast: &[conf::McastGroup],
    errs: &mut Vec<Violation>,
) {
    let mut check = |what: &str, val: Option<u64>, min: u64, max: u64| {
        if let Some(x) = val
            && !(min..=max).contains(&x)
        {
            errs.push(v(
                subject.to_string(),
                format!("{what} must be {min}..={max}, found {x}"),
            ));
        }
    };
    let groups = std::iter::once((String::new(), *o)).chain(
        mcast
            .iter()
            .map(|g| (format!("mgid {}: ", g.mgid), g.options())),
    );
    for (prefix, o) in groups {
        check(&format!("{prefix}mtu"), o.mtu.map(u64::from), 1, 5);
        check(&format!("{prefix}rate"), o.rate.map(u64::from), 2, 18);
        check(&format!("{prefix}sl"), o.sl.map(u64::from), 0, 15);
        check(&format!("{prefix}scope"), o.scope.map(u64::from), 1, 15);
        check(
            &format!("{prefix}flow_label"),
            o.flow_label.map(u64::from),
            0,
            0xfffff,
        );
    }
}

/// Appends a partition as statements of one name and key: a new statement wherever
/// `indx0` changes between consecutive members (OpenSM applies `indx0` per statement),
/// member order kept (later entries override earlier ones there), multicast groups on
/// the first statement.
fn push_statements(
    out: &mut Vec<Partition>,
    name: &str,
    key: PKey,
    flags: Flags,
    members: Vec<(Member, bool)>,
    mcast: Vec<conf::McastGroup>,
) {
    let mut mcast = Some(mcast);
    let mut current: Option<Partition> = None;
    for (m, indx0) in members {
        match &mut current {
            Some(p) if p.flags.indx0 == indx0 => p.members.push(m),
            _ => {
                if let Some(p) = current.take() {
                    out.push(p);
                }
                current = Some(Partition {
                    name: name.to_string(),
                    pkey: Some(key),
                    flags: Flags {
                        indx0,
                        ..flags.clone()
                    },
                    members: vec![m],
                    mcast_groups: mcast.take().unwrap_or_default(),
                });
            }
        }
    }
    match current {
        Some(p) => out.push(p),
        None => out.push(Partition {
            name: name.to_string(),
            pkey: Some(key),
            flags,
            members: Vec::new(),
            mcast_groups: mcast.take().unwrap_or_default(),
        }),
    }
}

enum Resolved {
    Group(Selector),
    Ports(Vec<Guid>),
    Error,
}

/// What a plan member names: a group keyword, or ports (a node's CA ports, one GUID).
fn resolve(
    m: &crate::plan::PlanMember,
    partition: &str,
    plan: &FabricPlan,
    inventory: Option<&Inventory>,
    known: &Option<BTreeMap<Guid, usize>>,
    node_index: &Option<BTreeMap<&str, Vec<Guid>>>,
    errs: &mut Vec<Violation>,
) -> Resolved {
    match (&m.node, &m.guid, &m.group) {
        (None, None, Some(g)) => Resolved::Group(g.selector()),
        (Some(node), None, None) => match node_index {
            None => {
                errs.push(v(
                    format!("node `{node}`"),
                    format!(
                        "partition `{partition}` names a node, which needs an inventory to resolve"
                    ),
                ));
                Resolved::Error
            }
            Some(idx) => match idx.get(node.as_str()) {
                Some(gs) => Resolved::Ports(gs.clone()),
                None => {
                    errs.push(v(
                        format!("node `{node}`"),
                        format!(
                            "partition `{partition}` names a node that has no CA port in the inventory"
                        ),
                    ));
                    Resolved::Error
                }
            },
        },
        (None, Some(g), None) => {
            if let Some(k) = known
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
                        "partition `{partition}` names a GUID that is not in the inventory{hint}"
                    ),
                ));
                return Resolved::Error;
            }
            Resolved::Ports(vec![*g])
        }
        _ => {
            errs.push(v(
                format!("partition `{partition}`"),
                "each member names exactly one of `node`, `guid` or `group`".into(),
            ));
            Resolved::Error
        }
    }
}

/// Counts a group's table entries on the ports it covers (Default's are counted once
/// per port anyway, so `default` adds nothing).
fn count_entries(
    s: &Selector,
    inventory: Option<&Inventory>,
    entries: &mut BTreeMap<Guid, usize>,
    default: bool,
) {
    let Some(inv) = inventory else { return };
    if default {
        return;
    }
    for g in crate::tables::selected_ports(s, inv) {
        *entries.entry(g).or_default() += 1;
    }
}
