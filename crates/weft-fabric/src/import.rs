//! From an OpenSM partitions.conf to a [`FabricPlan`] that means the same to OpenSM: the same
//! P_Key set and index-0 entry on every port, the same multicast groups.
//!
//! What each construct becomes:
//!
//! * a partition: one `[[partition]]`, tenant = its name unless the tenant map says
//!   otherwise; statements that repeat a name (with its P_Key or none) are merged into
//!   it in file order, as OpenSM merges them (a note says so);
//! * a port GUID or group keyword (`ALL`, `ALL_CAS`, `ALL_SWITCHES`, `ALL_ROUTERS`,
//!   `SELF`): a member with `guid` or `group`, its membership written out (the
//!   statement's `defmember`, else limited, unless it names one); a selector listed
//!   again in a later statement keeps its last membership and moves to that place, as
//!   OpenSM overwrites it (noted);
//! * `indx0`: on the members of that statement only (or on the partition when every
//!   member has it), as OpenSM applies it per statement;
//! * `ipoib`, `mtu`, `rate`, `sl`, `scope`, `Q_Key`, `TClass`, `FlowLabel`: the
//!   partition's options; statements of one partition that give different options are
//!   refused (OpenSM creates each group with the options of the statement that makes it);
//! * `mgid=` lines: `[[partition.mcast]]` with their own options;
//! * `Default`: `policy = "open"` for exactly `ALL=full`, `"isolate"` for exactly
//!   `ALL=limited, SELF=full`, anything else `"custom"` with its members and options;
//!   no Default statement is `"isolate"` without IPoIB, which is what OpenSM does then;
//! * a partition without a P_Key: refused unless the caller says which key the master
//!   uses (read from the fabric), because a long-running OpenSM keeps keys it assigned
//!   earlier while a freshly started standby counts from 0x0001; but one that names no
//!   port and no multicast group ([`keyless_empty`]: `t_7, ipoib : NONE ;`) gets a key
//!   no other partition uses, with a note, since no port holds the key the master uses
//!   for it (an IPoIB one's broadcast group then carries the new key);
//! * a port full in partitions of two tenants: listed in `allow_shared_ports` (noted).

use std::collections::{BTreeMap, BTreeSet};

use crate::conf::{self, Conf, GroupOptions, Member, ParseError, Selector, Span};
use crate::plan::{DefaultPartition, DefaultPolicy, FabricPlan, Group, PlanMember, PlanPartition};
use crate::types::{Guid, Membership, PKey};

/// What the caller knows beyond the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Partition name to tenant; partitions not named are their own tenant.
    pub tenant_map: BTreeMap<String, String>,
    /// The P_Keys the master SM uses for partitions the file gives none, by name.
    pub keys: BTreeMap<String, PKey>,
}

/// A plan and the notes on what import merged or normalised (line and column in the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The plan.
    pub plan: FabricPlan,
    /// One note per thing merged or normalised.
    pub notes: Vec<ParseError>,
}

/// The names of the partitions (other than Default) that the file gives no P_Key, in
/// file order, once each.
pub fn auto_keyed(conf: &Conf) -> Vec<String> {
    let mut named: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for p in &conf.partitions {
        if p.pkey.is_some() {
            named.insert(&p.name);
        }
    }
    for p in &conf.partitions {
        if p.pkey.is_none()
            && p.name != "Default"
            && !named.contains(p.name.as_str())
            && !out.contains(&p.name)
        {
            out.push(p.name.clone());
        }
    }
    out
}

/// The partitions of [`auto_keyed`] that no statement gives a port or a multicast group
/// (`t_7, ipoib : NONE ;`, `beta, defmember=full : ;`): no port holds the key the master
/// uses for them, so it cannot be read from the fabric, and no port's table depends on it.
pub fn keyless_empty(conf: &Conf) -> Vec<String> {
    auto_keyed(conf)
        .into_iter()
        .filter(|n| {
            conf.partitions
                .iter()
                .filter(|p| p.name == *n)
                .all(|p| p.members.is_empty() && p.mcast_groups.is_empty())
        })
        .collect()
}

/// The partitions of [`auto_keyed`] whose keys must be read from the fabric to import the
/// file as the running master has it ([`keys_from_tables`]): those with ports or multicast
/// groups, in file order ([`keyless_empty`] ones get a free key instead).
pub fn live_keyed(conf: &Conf) -> Vec<String> {
    let empty = keyless_empty(conf);
    auto_keyed(conf)
        .into_iter()
        .filter(|n| !empty.contains(n))
        .collect()
}

/// A key for the keyless empty partition of statement `i`: the one a freshly started SM
/// would count out for it when no other partition uses it, else the lowest free one.
fn free_key(conf: &Conf, i: usize, used: &BTreeSet<u16>) -> Option<PKey> {
    let fresh = conf.effective_pkeys().get(i).copied().flatten();
    fresh.filter(|k| !used.contains(&k.base())).or_else(|| {
        (1..0x7fffu16)
            .find(|k| !used.contains(k))
            .and_then(|k| PKey::new(k).ok())
    })
}

fn at(line: usize, column: usize, message: String) -> ParseError {
    ParseError {
        line,
        column,
        message,
    }
}

fn to_member(m: &Member, defmember: Option<Membership>, indx0: bool) -> PlanMember {
    let ms = m.membership.or(defmember).unwrap_or(Membership::Limited);
    let mut pm = match &m.selector {
        Selector::Guid(g) => PlanMember::guid(*g),
        other => match Group::of(other) {
            Some(g) => PlanMember::group(g),
            None => PlanMember::guid(Guid(0)),
        },
    };
    pm.membership = (ms != Membership::Full).then_some(ms);
    pm.indx0 = indx0;
    pm
}

fn same_selector(a: &PlanMember, b: &PlanMember) -> bool {
    a.guid == b.guid && a.group == b.group && a.node == b.node
}

fn describe(m: &PlanMember) -> String {
    match (&m.guid, &m.group) {
        (Some(g), _) => g.to_string(),
        (_, Some(g)) => g.selector().to_string(),
        _ => m.node.clone().unwrap_or_default(),
    }
}

/// A partition being assembled from its statements.
struct Building {
    options: GroupOptions,
    options_line: usize,
    ipoib: bool,
    members: Vec<PlanMember>,
    mcast: Vec<conf::McastGroup>,
    first_line: usize,
}

impl Building {
    fn new(options: GroupOptions, line: usize) -> Building {
        Building {
            options,
            options_line: line,
            ipoib: false,
            members: Vec::new(),
            mcast: Vec::new(),
            first_line: line,
        }
    }

    /// Adds one statement, as OpenSM adds it to the partition of its key.
    fn add(
        &mut self,
        name: &str,
        p: &conf::Partition,
        span: &Span,
        notes: &mut Vec<ParseError>,
        errs: &mut Vec<ParseError>,
    ) {
        let opts = p.flags.options();
        if opts != self.options {
            errs.push(at(
                span.line,
                span.column,
                format!(
                    "partition `{name}` has other options (mtu, rate, sl, scope, Q_Key, TClass, FlowLabel) here than on line {}; OpenSM creates each multicast group with the options of the statement that makes it, which a plan cannot say: give every statement the same options",
                    self.options_line
                ),
            ));
            return;
        }
        self.ipoib |= p.flags.ipoib;
        for (i, m) in p.members.iter().enumerate() {
            let (line, column) = span
                .members
                .get(i)
                .copied()
                .unwrap_or((span.line, span.column));
            let new = to_member(m, p.flags.defmember, p.flags.indx0);
            if let Some(j) = self.members.iter().position(|o| same_selector(o, &new)) {
                let old = self.members.remove(j);
                notes.push(at(
                    line,
                    column,
                    format!(
                        "`{}` is listed again in partition `{name}`; OpenSM keeps the last membership ({}){}",
                        describe(&new),
                        new.membership.unwrap_or(Membership::Full),
                        if old.indx0 && !new.indx0 {
                            ", and drops the earlier indx0"
                        } else {
                            ""
                        }
                    ),
                ));
                self.members.push(new);
            } else {
                self.members.push(new);
            }
        }
        for g in &p.mcast_groups {
            if let Some(why) = crate::mcast::mgid_refusal(
                &g.mgid,
                &crate::mcast::mgid_scopes(p.flags.scope, g.scope),
                self.ipoib,
            ) {
                notes.push(at(
                    span.line,
                    span.column,
                    format!(
                        "mgid {} of partition `{name}` is left out: OpenSM 3.3.23 does not create it ({why})",
                        g.mgid
                    ),
                ));
                continue;
            }
            if self.mcast.iter().any(|o| o.mgid == g.mgid) {
                errs.push(at(
                    span.line,
                    span.column,
                    format!(
                        "mgid {} is given again in partition `{name}` (first near line {}); OpenSM creates it once",
                        g.mgid, self.first_line
                    ),
                ));
            } else {
                self.mcast.push(g.clone());
            }
        }
    }

    /// Partition-level indx0 when every member has it.
    fn indx0(&mut self) -> bool {
        let all = !self.members.is_empty() && self.members.iter().all(|m| m.indx0);
        if all {
            for m in &mut self.members {
                m.indx0 = false;
            }
        }
        all
    }
}

impl FabricPlan {
    /// Imports partitions.conf text (see the module documentation of `import`): every
    /// fault the parser finds, and everything a plan cannot say, is an error with line
    /// and column; what was merged or normalised comes back as notes.
    pub fn import(text: &str, opts: &ImportOptions) -> Result<Imported, Vec<ParseError>> {
        let (conf, spans) = conf::parse_spanned(text)?;
        import_conf(&conf, &spans, opts)
    }

    /// Imports a parsed config; positions in notes and errors are those of its
    /// canonical rendering ([`conf::render`]).
    pub fn from_conf_with_notes(
        conf: &Conf,
        opts: &ImportOptions,
    ) -> Result<Imported, Vec<ParseError>> {
        FabricPlan::import(&conf::render(conf), opts)
    }
}

fn import_conf(
    conf: &Conf,
    spans: &[Span],
    opts: &ImportOptions,
) -> Result<Imported, Vec<ParseError>> {
    let mut errs = Vec::new();
    let mut notes = Vec::new();
    let fallback = Span {
        line: 1,
        column: 1,
        members: Vec::new(),
    };
    // Partitions by key, in the order of their first statement.
    let mut order: Vec<(PKey, String)> = Vec::new();
    let mut parts: BTreeMap<PKey, Building> = BTreeMap::new();
    let mut by_name: BTreeMap<&str, PKey> = BTreeMap::new();
    let mut default: Option<Building> = None;
    let mut default_stmts = 0usize;
    let mut default_first: Option<(&conf::Partition, usize)> = None;
    let empty = keyless_empty(conf);
    // Keys a free key must not be: every written one, Default, those the caller read.
    let mut used: BTreeSet<u16> = conf
        .partitions
        .iter()
        .filter_map(|p| p.pkey.map(PKey::base))
        .chain(opts.keys.values().map(|k| k.base()))
        .chain([PKey::DEFAULT.base()])
        .collect();
    for (i, p) in conf.partitions.iter().enumerate() {
        let span = spans.get(i).unwrap_or(&fallback);
        let key = match p.pkey {
            Some(k) => k,
            None if p.name == "Default" => PKey::DEFAULT,
            None => match by_name
                .get(p.name.as_str())
                .or_else(|| opts.keys.get(&p.name))
            {
                Some(k) => *k,
                None if empty.contains(&p.name) => match free_key(conf, i, &used) {
                    Some(k) => {
                        used.insert(k.base());
                        notes.push(at(
                            span.line,
                            span.column,
                            format!(
                                "partition `{}` has no P_Key and no port or multicast group: no port holds the key the master uses for it, so that key cannot be read; the plan pins {k}, a key no other partition uses{}",
                                p.name,
                                if conf.partitions.iter().any(|q| q.name == p.name && q.flags.ipoib) {
                                    format!(
                                        ". Its IPoIB broadcast group is ff12:401b:{:04x}::ffff:ffff under that key; if the master used another key, applying the plan replaces that group with this one, which no host has joined (no port is a member)",
                                        k.base() | 0x8000
                                    )
                                } else {
                                    String::new()
                                }
                            ),
                        ));
                        by_name.insert(p.name.as_str(), k);
                        k
                    }
                    None => {
                        errs.push(at(
                            span.line,
                            span.column,
                            format!(
                                "partition `{}` has no P_Key and every P_Key is taken",
                                p.name
                            ),
                        ));
                        continue;
                    }
                },
                None => {
                    errs.push(at(
                        span.line,
                        span.column,
                        format!(
                            "partition `{}` has no P_Key: OpenSM assigns one at run time, a long-running master keeps keys it assigned earlier and a freshly started standby counts from 0x0001, so the key in use cannot be read from the file; import with --live to read it from the fabric, or write the key",
                            p.name
                        ),
                    ));
                    continue;
                }
            },
        };
        if p.pkey.is_none()
            && p.name != "Default"
            && !by_name.contains_key(p.name.as_str())
            && !empty.contains(&p.name)
        {
            notes.push(at(
                span.line,
                span.column,
                format!(
                    "partition `{}` has no P_Key in the file; the plan pins {key}, the key the master uses",
                    p.name
                ),
            ));
        }
        by_name.entry(p.name.as_str()).or_insert(key);
        if key.is_default() {
            default_stmts += 1;
            if default_first.is_none() {
                default_first = Some((p, i));
            }
            let b = default.get_or_insert_with(|| Building::new(p.flags.options(), span.line));
            if default_stmts > 1 {
                notes.push(at(
                    span.line,
                    span.column,
                    format!(
                        "statement repeats partition `Default` (first on line {}); merged as OpenSM merges it",
                        b.first_line
                    ),
                ));
            }
            b.add("Default", p, span, &mut notes, &mut errs);
            continue;
        }
        match parts.get_mut(&key) {
            Some(b) => {
                notes.push(at(
                    span.line,
                    span.column,
                    format!(
                        "statement repeats partition `{}` (first on line {}); merged as OpenSM merges it",
                        p.name, b.first_line
                    ),
                ));
                b.add(&p.name, p, span, &mut notes, &mut errs);
            }
            None => {
                let mut b = Building::new(p.flags.options(), span.line);
                b.add(&p.name, p, span, &mut notes, &mut errs);
                parts.insert(key, b);
                order.push((key, p.name.clone()));
            }
        }
    }

    for name in opts.tenant_map.keys() {
        if !order.iter().any(|(_, n)| n == name) {
            errs.push(at(
                1,
                1,
                format!("the tenant map names partition `{name}`, which the file does not have"),
            ));
        }
    }

    let default = match default {
        None => DefaultPartition {
            ipoib: false,
            ..DefaultPartition::default()
        },
        Some(mut b) => {
            let standard = |want: &[(Selector, Membership)]| {
                default_stmts == 1
                    && b.members.len() == want.len()
                    && b.members.iter().zip(want).all(|(m, (s, ms))| {
                        !m.indx0
                            && m.group.map(Group::selector).as_ref() == Some(s)
                            && m.membership.unwrap_or(Membership::Full) == *ms
                    })
            };
            let policy = if standard(&[(Selector::All, Membership::Full)]) {
                DefaultPolicy::Open
            } else if standard(&[
                (Selector::All, Membership::Limited),
                (Selector::SelfPort, Membership::Full),
            ]) {
                DefaultPolicy::Isolate
            } else {
                DefaultPolicy::Custom
            };
            if policy == DefaultPolicy::Custom
                && let Some((p, i)) = default_first
            {
                let span = spans.get(i).unwrap_or(&fallback);
                notes.push(at(
                    span.line,
                    span.column,
                    format!(
                        "partition `{}` is neither `ALL=full` nor `ALL=limited, SELF=full`; imported as policy = \"custom\" with its members",
                        p.name
                    ),
                ));
            }
            let custom = policy == DefaultPolicy::Custom;
            let mut d = DefaultPartition {
                policy,
                ipoib: b.ipoib,
                members: if custom {
                    std::mem::take(&mut b.members)
                } else {
                    Vec::new()
                },
                membership: Membership::Full,
                mcast: std::mem::take(&mut b.mcast),
                ..DefaultPartition::default()
            };
            d.set_options(b.options);
            d
        }
    };

    let mut plan = FabricPlan {
        default,
        ..FabricPlan::default()
    };
    for (key, name) in &order {
        let Some(mut b) = parts.remove(key) else {
            continue;
        };
        let tenant = opts.tenant_map.get(name).unwrap_or(name);
        let indx0 = b.indx0();
        let mut p = PlanPartition::new(name, tenant);
        p.pkey = Some(*key);
        p.ipoib = b.ipoib;
        p.indx0 = indx0;
        p.set_options(b.options);
        p.members = b.members;
        p.mcast = b.mcast;
        plan.partitions.push(p);
    }

    // Ports full in partitions of two tenants, as the file has them.
    let mut full_in: BTreeMap<Guid, BTreeSet<&str>> = BTreeMap::new();
    for p in &plan.partitions {
        for m in &p.members {
            if let Some(g) = m.guid
                && m.membership.unwrap_or(p.membership) != Membership::Limited
            {
                full_in.entry(g).or_default().insert(p.tenant.as_str());
            }
        }
    }
    let mut shared = Vec::new();
    for (g, tenants) in &full_in {
        if tenants.len() > 1 {
            shared.push(g.to_string());
            notes.push(at(
                1,
                1,
                format!(
                    "port {g} is a full member of partitions of tenants {}, as in the file; listed in allow_shared_ports",
                    tenants.iter().copied().collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
    }
    plan.allow_shared_ports = shared;

    if errs.is_empty() {
        Ok(Imported { plan, notes })
    } else {
        errs.sort_by_key(|e| (e.line, e.column));
        errs.truncate(conf::MAX_ERRORS);
        Err(errs)
    }
}

/// Why [`keys_from_tables`] found no unique key for every unkeyed partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// Every P_Key is on the fabric or named in the file: none is left to compute with.
    #[error("no free P_Key to compute with")]
    NoFreeKey,
    /// No key on the fabric is held by exactly the partition's members.
    #[error("no P_Key on the fabric has exactly the members of partition `{0}`")]
    NoMatch(String),
    /// Several keys on the fabric are held by exactly the partition's members.
    #[error(
        "partition `{partition}`: several P_Keys on the fabric have exactly its members ({}); the key it uses cannot be told apart",
        hex_list(.keys)
    )]
    Ambiguous {
        /// The partition's name.
        partition: String,
        /// The keys (bases) that fit it.
        keys: Vec<u16>,
    },
    /// A key read from the ports is not a valid P_Key.
    #[error(transparent)]
    Key(#[from] crate::FabricError),
    /// The file with the keys found does not give the ports the tables they show.
    #[error(
        "with the keys read from the ports, the file does not give every port the table it shows"
    )]
    Mismatch,
}

fn hex_list(keys: &[u16]) -> String {
    keys.iter()
        .map(|k| format!("0x{k:04x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The P_Keys a running master uses for the partitions `conf` gives none
/// ([`auto_keyed`]), read from the ports: each such partition's key is the one key whose
/// members on the fabric are exactly the partition's (full and limited as the file says),
/// and the whole file with those keys must then give every port the table it shows. A
/// long-running OpenSM keeps a key it assigned by name across rereads, so these are not
/// always the keys a freshly started SM would count out. `Err` says why no unique answer
/// was found.
pub fn keys_from_tables(
    conf: &Conf,
    inventory: &crate::types::Inventory,
    observed: &crate::tables::ObservedTables,
    opts: crate::tables::SmOptions,
) -> Result<BTreeMap<String, PKey>, KeysError> {
    use crate::tables::expected_tables;
    // A partition without ports is in no table: its key is not on the fabric to read
    // (import gives it a free one).
    let auto = live_keyed(conf);
    let with_keys = |keys: &BTreeMap<String, PKey>| {
        let mut c = conf.clone();
        for p in &mut c.partitions {
            if p.pkey.is_none()
                && let Some(k) = keys.get(&p.name)
            {
                p.pkey = Some(*k);
            }
        }
        c
    };
    let matches = |c: &Conf| {
        expected_tables(c, inventory, opts)
            .compare(observed)
            .is_empty()
    };
    // Keys on the fabric that no explicit statement claims.
    let explicit: BTreeSet<u16> = conf
        .partitions
        .iter()
        .filter_map(|p| p.pkey.map(PKey::base))
        .collect();
    let seen: BTreeSet<u16> = observed
        .0
        .values()
        .flat_map(|t| t.iter().map(|&e| e & 0x7fff))
        .filter(|&k| k != 0 && k != PKey::DEFAULT.base() && !explicit.contains(&k))
        .collect();
    // Who holds key `k`, and how: (port, entries with the membership bit).
    let holders = |k: u16, tables: &BTreeMap<Guid, Vec<u16>>| -> BTreeSet<(Guid, u16)> {
        tables
            .iter()
            .flat_map(|(g, t)| {
                t.iter()
                    .filter(move |&&e| e & 0x7fff == k)
                    .map(move |&e| (*g, e))
            })
            .collect()
    };
    let observed_tables: BTreeMap<Guid, Vec<u16>> = observed.0.clone();
    let placeholder = (1..0x7fffu16)
        .rev()
        .find(|k| !seen.contains(k) && !explicit.contains(k))
        .and_then(|k| PKey::new(k).ok())
        .ok_or(KeysError::NoFreeKey)?;
    let mut keys = BTreeMap::new();
    let mut taken = BTreeSet::new();
    for name in &auto {
        let mut trial = BTreeMap::new();
        trial.insert(name.clone(), placeholder);
        let mut only = with_keys(&trial);
        only.partitions
            .retain(|p| p.name == *name || p.name == "Default");
        let want: BTreeMap<Guid, Vec<u16>> = expected_tables(&only, inventory, opts)
            .0
            .into_iter()
            .map(|(g, s)| (g, s.into_iter().collect()))
            .collect();
        let want = holders(placeholder.base(), &want);
        let shape = |set: &BTreeSet<(Guid, u16)>| -> BTreeSet<(Guid, bool)> {
            set.iter().map(|(g, e)| (*g, e & 0x8000 != 0)).collect()
        };
        let candidates: Vec<u16> = seen
            .iter()
            .copied()
            .filter(|&k| shape(&holders(k, &observed_tables)) == shape(&want))
            .collect();
        match candidates.as_slice() {
            [k] if !taken.contains(k) => {
                taken.insert(*k);
                keys.insert(name.clone(), PKey::new(*k)?);
            }
            [] => return Err(KeysError::NoMatch(name.clone())),
            _ => {
                return Err(KeysError::Ambiguous {
                    partition: name.clone(),
                    keys: candidates,
                });
            }
        }
    }
    if !matches(&with_keys(&keys)) {
        return Err(KeysError::Mismatch);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unkeyed_partitions_with_ports_or_groups_need_their_keys_read_live() {
        let text = "Default=0x7fff : ALL=full ;\nk=0x0001 : ALL=limited ;\nb : 0x0002c903000a0001=full ;\nempty : NONE ;\nm, ipoib : ;\nm : ALL=limited ;\n";
        let c = conf::parse(text).unwrap();
        assert_eq!(auto_keyed(&c), ["b", "empty", "m"]);
        assert_eq!(keyless_empty(&c), ["empty"]);
        assert_eq!(live_keyed(&c), ["b", "m"]);
    }

    #[test]
    fn keyless_empty_partitions_get_a_free_key_with_a_note() {
        let text = "Default=0x7fff, ipoib : ALL=full ;\nk=0x0001 : ALL=limited ;\nt_7,ipoib : NONE ;\nbeta,defmember=full : ;\n";
        let i = FabricPlan::import(text, &ImportOptions::default()).unwrap();
        let key = |n: &str| {
            i.plan
                .partitions
                .iter()
                .find(|p| p.name == n)
                .and_then(|p| p.pkey)
                .map(PKey::base)
        };
        // The keys a fresh SM counts out, past k's.
        assert_eq!(key("t_7"), Some(0x0002));
        assert_eq!(key("beta"), Some(0x0003));
        assert_eq!(i.notes.len(), 2, "{:?}", i.notes);
        assert!(
            i.notes[0].message.contains("`t_7`")
                && i.notes[0].message.contains("no port holds the key")
                && i.notes[0].message.contains("ff12:401b:8002::ffff:ffff"),
            "{}",
            i.notes[0].message
        );
        assert!(
            i.notes[1].message.contains("`beta`") && !i.notes[1].message.contains("IPoIB"),
            "{}",
            i.notes[1].message
        );
        assert_eq!(i.notes[0].line, 3);
        // Taken keys are skipped: the caller read 0x0002 for another partition.
        let mut opts = ImportOptions::default();
        opts.keys.insert("other".into(), PKey::new(0x0002).unwrap());
        let i = FabricPlan::import(text, &opts).unwrap();
        let t7 = i.plan.partitions.iter().find(|p| p.name == "t_7").unwrap();
        assert_eq!(t7.pkey.map(PKey::base), Some(0x0003));
        // A keyless partition with ports is still refused without the master's keys.
        let e = FabricPlan::import("g : ALL=full ;\n", &ImportOptions::default()).unwrap_err();
        assert!(e[0].message.contains("import with --live"), "{e:?}");
        assert_eq!(
            keyless_empty(&conf::parse(text).unwrap()),
            ["t_7".to_string(), "beta".to_string()]
        );
    }
}
