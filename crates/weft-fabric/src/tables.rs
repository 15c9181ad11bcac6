//! What OpenSM programs into the P_Key tables, and how to compare with what a port shows.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::conf::{Conf, Selector};
use crate::types::{Guid, Inventory, Membership, NodeType, PKey};

/// OpenSM options that change the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SmOptions {
    /// `allow_both_pkeys` (`-W`): `both` members get the full and the limited entry.
    pub allow_both_pkeys: bool,
}

/// For each end port, the 16-bit entries (membership bit included) OpenSM will program.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExpectedTables(pub BTreeMap<Guid, BTreeSet<u16>>);

/// P_Key tables as read from the ports, in index order, holes (0x0000) included.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObservedTables(pub BTreeMap<Guid, Vec<u16>>);

/// One port whose table differs from the expected one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMismatch {
    /// The port.
    pub port: Guid,
    /// Entries expected but absent, ascending.
    pub missing: Vec<u16>,
    /// Entries present but not expected, ascending.
    pub unexpected: Vec<u16>,
}

impl std::fmt::Display for PortMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[u16]| {
            v.iter()
                .map(|k| format!("0x{k:04x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        write!(f, "port {}:", self.port)?;
        if !self.missing.is_empty() {
            write!(f, " missing {}", list(&self.missing))?;
        }
        if !self.unexpected.is_empty() {
            write!(f, " unexpected {}", list(&self.unexpected))?;
        }
        Ok(())
    }
}

impl ExpectedTables {
    /// Compares with what was read. Order and 0x0000 holes are ignored; a port expected
    /// but not observed is a mismatch (all its entries missing). Observed ports that
    /// are not expected (switch external ports, say) are not judged.
    pub fn compare(&self, observed: &ObservedTables) -> Vec<PortMismatch> {
        let mut out = Vec::new();
        for (port, want) in &self.0 {
            let have: BTreeSet<u16> = observed
                .0
                .get(port)
                .map(|t| t.iter().copied().filter(|&k| k != 0).collect())
                .unwrap_or_default();
            let observed_port = observed.0.contains_key(port);
            let missing: Vec<u16> = want.difference(&have).copied().collect();
            let unexpected: Vec<u16> = have.difference(want).copied().collect();
            if !missing.is_empty() || !unexpected.is_empty() || !observed_port {
                out.push(PortMismatch {
                    port: *port,
                    missing,
                    unexpected,
                });
            }
        }
        out
    }
}

#[derive(Default, Clone, Copy)]
struct Entry {
    full: bool,
    limited: bool,
}

/// Computes what OpenSM 3.3.23 programs, following `osm_prtn_make_partitions`:
/// the Default partition is first created with every port limited and the SM port
/// full; then each statement adds its members in order. Without `allow_both_pkeys`
/// the last addition of a port to a P_Key wins (full or limited); with it, full and
/// limited are kept apart and may both be present. `both` adds full, plus limited
/// only with `allow_both_pkeys`. GUIDs not in the inventory are ignored, as OpenSM does.
pub fn expected_tables(conf: &Conf, inventory: &Inventory, opts: SmOptions) -> ExpectedTables {
    let keys = conf.effective_pkeys();
    let index: BTreeMap<Guid, usize> = inventory
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| (p.port_guid, i))
        .collect();
    let sm = inventory.sm_port_guid.filter(|g| index.contains_key(g));
    let mut state: BTreeMap<u16, BTreeMap<Guid, Entry>> = BTreeMap::new();

    let add = |state: &mut BTreeMap<u16, BTreeMap<Guid, Entry>>, key: u16, g: Guid, full: bool| {
        let e = state.entry(key).or_default().entry(g).or_default();
        if opts.allow_both_pkeys {
            if full {
                e.full = true;
            } else {
                e.limited = true;
            }
        } else {
            *e = Entry {
                full,
                limited: !full,
            };
        }
    };

    let default = PKey::DEFAULT.base();
    for p in &inventory.ports {
        add(&mut state, default, p.port_guid, false);
    }
    if let Some(g) = sm {
        if let Some(e) = state.get_mut(&default).and_then(|m| m.get_mut(&g)) {
            e.limited = false;
        }
        add(&mut state, default, g, true);
    }

    for (part, key) in conf.partitions.iter().zip(keys) {
        let Some(key) = key else { continue };
        for m in &part.members {
            let membership = m
                .membership
                .or(part.flags.defmember)
                .unwrap_or(Membership::Limited);
            // Only ports of the inventory: a GUID it does not hold, or an SM port it does
            // not list, is programmed nowhere.
            let ports = selected_ports(&m.selector, inventory)
                .into_iter()
                .filter(|g| index.contains_key(g));
            for g in ports {
                if membership != Membership::Limited {
                    add(&mut state, key.base(), g, true);
                }
                if membership == Membership::Limited
                    || (membership == Membership::Both && opts.allow_both_pkeys)
                {
                    add(&mut state, key.base(), g, false);
                }
            }
        }
    }

    let mut out: BTreeMap<Guid, BTreeSet<u16>> = inventory
        .ports
        .iter()
        .map(|p| (p.port_guid, BTreeSet::new()))
        .collect();
    for (key, ports) in state {
        for (g, e) in ports {
            let set = out.entry(g).or_default();
            if e.full {
                set.insert(key | 0x8000);
            }
            if e.limited {
                set.insert(key);
            }
        }
    }
    ExpectedTables(out)
}

/// The ports `selector` names, by `inventory`: a GUID as it is, `SELF` the master SM's
/// port, `ALL` every port and the other keywords every port of their node type.
pub(crate) fn selected_ports(selector: &Selector, inventory: &Inventory) -> Vec<Guid> {
    match selector {
        Selector::Guid(g) => vec![*g],
        Selector::SelfPort => inventory.sm_port_guid.into_iter().collect(),
        Selector::All => inventory.ports.iter().map(|p| p.port_guid).collect(),
        Selector::AllCas => of_type(inventory, NodeType::Ca),
        Selector::AllSwitches => of_type(inventory, NodeType::Switch),
        Selector::AllRouters => of_type(inventory, NodeType::Router),
    }
}

fn of_type(inv: &Inventory, t: NodeType) -> Vec<Guid> {
    inv.ports
        .iter()
        .filter(|p| p.node_type == t)
        .map(|p| p.port_guid)
        .collect()
}

/// The entry OpenSM 3.3.23 puts at index 0 of each end port's table: the key of the
/// last `indx0` statement that adds the port (cleared when a later statement of the same
/// partition adds the port again without `indx0`), else the Default key; full or limited as the port
/// ends up in that partition. Seen with the real OpenSM: `indx0` applies to the
/// members of its own statement only.
pub fn expected_index0(conf: &Conf, inventory: &Inventory, opts: SmOptions) -> BTreeMap<Guid, u16> {
    let tables = expected_tables(conf, inventory, opts);
    let keys = conf.effective_pkeys();
    let index: BTreeSet<Guid> = inventory.ports.iter().map(|p| p.port_guid).collect();
    let mut idx0: BTreeMap<Guid, u16> = BTreeMap::new();
    for (part, key) in conf.partitions.iter().zip(keys) {
        let Some(key) = key else { continue };
        for m in &part.members {
            let ports = selected_ports(&m.selector, inventory)
                .into_iter()
                .filter(|g| index.contains(g));
            for g in ports {
                if part.flags.indx0 {
                    idx0.insert(g, key.base());
                } else if idx0.get(&g) == Some(&key.base()) {
                    // `osm_prtn_add_port`: the same partition adding the port again
                    // without indx0 clears it.
                    idx0.remove(&g);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (g, set) in &tables.0 {
        let base = idx0.get(g).copied().unwrap_or(PKey::DEFAULT.base());
        let entry = if set.contains(&(base | 0x8000)) {
            base | 0x8000
        } else {
            base
        };
        out.insert(*g, entry);
    }
    out
}
