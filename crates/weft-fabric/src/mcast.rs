//! The multicast groups OpenSM 3.3.23 creates up front for a partitions config (the
//! IPoIB broadcast group of each `ipoib` partition and every `mgid=` line), with the
//! fields of the MCMemberRecord it stores: what weft expects OpenSM's SA to hold after a
//! reread, to compare with OpenSM's own dump.
//!
//! Followed from OpenSM's `osm_prtn_config.c` and `osm_prtn.c`: a statement with `ipoib`
//! makes the broadcast group `ff12:401b:<P_Key|0x8000>::ffff:ffff` with the statement's
//! mtu (default 4), rate (default 3), Q_Key (default 0x0b1b), TClass and FlowLabel, at
//! link-local scope whatever the statement's `scope` (OpenSM passes it no scope); an
//! `mgid=` line inherits the statement's mtu, rate, sl, Q_Key, FlowLabel and scope (not
//! its TClass) and overrides them with its own; an IP group (signature 0x401b or 0x601b)
//! gets the partition's key in bytes 4..6 and Q_Key 0x0b1b when none is given. Without
//! QoS OpenSM sets a statement's sl to 0 before the groups are made, so only an `mgid=`
//! line's own `sl=` survives. Each scope gives its own group (the scope nibble of the
//! MGID is set to it; default 2, link-local, hop limit 0, otherwise 0xff). An MGID that
//! exists already keeps the group made first. OpenSM's SA then refuses to create (and
//! the reread drops without a word) a non-IP group with reserved flag bits or with the
//! SA-assigned signature 0xa01b at link-local scope (`validate_requested_mgid`), and an
//! IP group other than the broadcast group when the broadcast group of its scope and
//! P_Key does not exist yet (OpenSM's default `ipoib_mcgroup_creation_validation`).
//! Groups of a partition that ends up with no port are deleted with it; groups made for
//! an earlier config stay while their partition exists ([`expected_mcast_after`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

use crate::conf::{Conf, Gid};
use crate::tables::{SmOptions, expected_tables};
use crate::types::{Inventory, PKey};

const DEFAULT_RATE: u8 = 3;
const DEFAULT_MTU: u8 = 4;
const DEFAULT_SCOPE: u8 = 2;
const IPOIB_QKEY: u32 = 0x0b1b;
/// OpenSM's `osm_ipoib_broadcast_mgid`, before the P_Key is put in.
const BROADCAST: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];

/// One group as OpenSM stores it (the fields of its MCMemberRecord that the config
/// decides; the MLID is allocated at run time and not part of it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct McastRecord {
    /// The MGID, scope nibble set.
    pub mgid: Gid,
    /// The partition's key with the full-member bit.
    pub pkey: u16,
    /// Q_Key.
    pub qkey: u32,
    /// MTU code (without the selector bits).
    pub mtu: u8,
    /// Rate code (without the selector bits).
    pub rate: u8,
    /// Service level.
    pub sl: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit (0 for link-local scope, 0xff otherwise).
    pub hop_limit: u8,
    /// Scope 1..=15.
    pub scope: u8,
    /// Traffic class.
    pub tclass: u8,
}

struct Params {
    mtu: u8,
    rate: u8,
    sl: u8,
    qkey: u32,
    tclass: u8,
    flow_label: u32,
    /// OpenSM's scope mask: every `scope=` of the statement and of the line; empty means
    /// the default scope.
    scopes: Vec<u8>,
}

/// The scopes an `mgid=` line's groups get: OpenSM ORs the line's `scope=` into the
/// mask it inherits from its statement, one group per scope; none given is scope 2.
pub fn mgid_scopes(statement: Option<u8>, line: Option<u8>) -> Vec<u8> {
    let mut v: Vec<u8> = statement.into_iter().chain(line).collect();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        v.push(DEFAULT_SCOPE);
    }
    v
}

fn scoped(mgid: [u8; 16], scope: u8) -> Gid {
    let mut o = mgid;
    o[1] = (o[1] & 0xf0) | (scope & 0x0f);
    Gid(Ipv6Addr::from(o))
}

/// Why OpenSM 3.3.23 would create no group for an `mgid=` line (its MGID as written,
/// `scopes` from [`mgid_scopes`]), read after an `ipoib` header of its partition or not
/// (`broadcast`: the partition's broadcast group exists then); `None` when it creates
/// one at some scope. OpenSM drops such a line without a word.
pub fn mgid_refusal(mgid: &Gid, scopes: &[u8], broadcast: bool) -> Option<String> {
    let mut why = None;
    for &scope in scopes {
        match refusal_at(mgid, scope, broadcast) {
            None => return None,
            Some(w) => why = Some(w),
        }
    }
    why
}

fn refusal_at(mgid: &Gid, scope: u8, broadcast: bool) -> Option<String> {
    let o = mgid.0.octets();
    if mgid.is_ip() {
        let is_bcast = o[2] == 0x40 && o[6..12] == [0; 6] && o[12..16] == [0xff; 4];
        if is_bcast {
            return None;
        }
        if scope != DEFAULT_SCOPE {
            return Some(format!(
                "an IP group at scope {scope} needs the IPoIB broadcast group of that scope, and OpenSM makes a partition's broadcast group at scope {DEFAULT_SCOPE} only"
            ));
        }
        if !broadcast {
            return Some(
                "an IP group needs its partition's IPoIB broadcast group, which OpenSM has not made when it reads this line (no `ipoib` on this or an earlier statement of the partition)"
                    .into(),
            );
        }
        return None;
    }
    if o[1] & 0xe0 != 0 {
        return Some("its flag bits (the high three of byte 1) are reserved".into());
    }
    if o[2] == 0xa0 && o[3] == 0x1b && scope == DEFAULT_SCOPE {
        return Some(
            "signature 0xa01b (SA-assigned) at link-local scope 2 is refused by OpenSM's SA; give it scope=5 or another"
                .into(),
        );
    }
    None
}

/// Whether OpenSM's SA accepts creating the group `gid` now.
fn creatable(out: &BTreeMap<Gid, (PKey, McastRecord)>, gid: Gid) -> bool {
    let o = gid.0.octets();
    if gid.is_ip() {
        let mut bcast = BROADCAST;
        bcast[1] = (bcast[1] & 0xf0) | (o[1] & 0x0f);
        bcast[4..6].copy_from_slice(&o[4..6]);
        return o == bcast || out.contains_key(&Gid(Ipv6Addr::from(bcast)));
    }
    let reserved_flags = o[1] & 0xe0 != 0;
    let sa_signature_link_local = o[2] == 0xa0 && o[3] == 0x1b && o[1] & 0x0f == DEFAULT_SCOPE;
    !reserved_flags && !sa_signature_link_local
}

fn create(out: &mut BTreeMap<Gid, (PKey, McastRecord)>, key: PKey, mgid: [u8; 16], p: &Params) {
    let scopes = if p.scopes.is_empty() {
        vec![DEFAULT_SCOPE]
    } else {
        p.scopes.clone()
    };
    for scope in scopes {
        create_one(out, key, mgid, p, scope);
    }
}

fn create_one(
    out: &mut BTreeMap<Gid, (PKey, McastRecord)>,
    key: PKey,
    mgid: [u8; 16],
    p: &Params,
    scope: u8,
) {
    let gid = scoped(mgid, scope);
    if out.contains_key(&gid) || !creatable(out, gid) {
        return;
    }
    out.entry(gid).or_insert_with(|| {
        (
            key,
            McastRecord {
                mgid: gid,
                pkey: key.base() | 0x8000,
                qkey: p.qkey,
                mtu: p.mtu,
                rate: p.rate,
                sl: p.sl,
                flow_label: p.flow_label,
                hop_limit: if scope == DEFAULT_SCOPE { 0 } else { 0xff },
                scope,
                tclass: p.tclass,
            },
        )
    });
}

/// The groups OpenSM 3.3.23 (QoS off) creates for `conf` on a fabric of `inventory`,
/// by MGID, as a freshly started SM would: groups made for an earlier config survive a
/// reread while their partition exists, which only the SM's own state shows.
pub fn expected_mcast(
    conf: &Conf,
    inventory: &Inventory,
    opts: SmOptions,
) -> BTreeMap<Gid, McastRecord> {
    expected_mcast_after(&BTreeMap::new(), conf, inventory, opts)
}

/// [`expected_mcast`] for an SM that held the groups `before` (from the config it read
/// last): those of partitions that `conf` keeps stay as they were made, and a group
/// `conf` describes again is not remade.
pub fn expected_mcast_after(
    before: &BTreeMap<Gid, McastRecord>,
    conf: &Conf,
    inventory: &Inventory,
    opts: SmOptions,
) -> BTreeMap<Gid, McastRecord> {
    let keys = conf.effective_pkeys();
    let kept: BTreeSet<u16> = keys.iter().flatten().map(|k| k.base()).collect();
    let mut out: BTreeMap<Gid, (PKey, McastRecord)> = before
        .iter()
        .filter_map(|(g, r)| {
            let k = PKey::new(r.pkey & 0x7fff).ok()?;
            (k.is_default() || kept.contains(&k.base())).then(|| (*g, (k, r.clone())))
        })
        .collect();
    for (part, key) in conf.partitions.iter().zip(keys) {
        let Some(key) = key else { continue };
        let f = &part.flags;
        let full = (key.base() | 0x8000).to_be_bytes();
        if f.ipoib {
            let mut mgid = BROADCAST;
            mgid[4..6].copy_from_slice(&full);
            let p = Params {
                mtu: f.mtu.unwrap_or(DEFAULT_MTU),
                rate: f.rate.unwrap_or(DEFAULT_RATE),
                sl: 0,
                qkey: f.qkey.unwrap_or(IPOIB_QKEY),
                tclass: f.tclass.unwrap_or(0),
                flow_label: f.flow_label.unwrap_or(0),
                // `partition_create` gives the broadcast group no scope mask.
                scopes: Vec::new(),
            };
            create(&mut out, key, mgid, &p);
        }
        for g in &part.mcast_groups {
            let mut mgid = g.mgid.0.octets();
            let ip = g.mgid.is_ip();
            if ip {
                mgid[4..6].copy_from_slice(&full);
            }
            let qkey = g.qkey.or(f.qkey).unwrap_or(0);
            let p = Params {
                mtu: g.mtu.or(f.mtu).unwrap_or(DEFAULT_MTU),
                rate: g.rate.or(f.rate).unwrap_or(DEFAULT_RATE),
                sl: g.sl.unwrap_or(0),
                qkey: if ip && qkey == 0 { IPOIB_QKEY } else { qkey },
                tclass: g.tclass.unwrap_or(0),
                flow_label: g.flow_label.or(f.flow_label).unwrap_or(0),
                scopes: mgid_scopes(f.scope, g.scope),
            };
            // OpenSM skips an mgid line whose MGID (as written, scope not yet set) exists.
            if out.contains_key(&Gid(Ipv6Addr::from(mgid))) {
                continue;
            }
            create(&mut out, key, mgid, &p);
        }
    }
    // Partitions left without a port are deleted, and their groups with them.
    let tables = expected_tables(conf, inventory, opts);
    let populated = |k: PKey| {
        k.is_default()
            || tables
                .0
                .values()
                .any(|set| set.iter().any(|&e| e & 0x7fff == k.base()))
    };
    out.into_iter()
        .filter(|(_, (k, _))| populated(*k))
        .map(|(g, (_, r))| (g, r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::parse;
    use crate::types::{Guid, NodeType, Port};

    fn inv() -> Inventory {
        Inventory {
            ports: vec![Port {
                node_guid: Guid(0x100),
                port_guid: Guid(0x101),
                port_num: 1,
                lid: 1,
                node_type: NodeType::Ca,
                node_desc: "n1".into(),
                pkey_capacity: 64,
            }],
            sm_port_guid: Some(Guid(0x101)),
        }
    }

    #[test]
    fn broadcast_and_mgid_groups_with_inherited_and_own_options() {
        let c = parse(
            "Default=0x7fff, ipoib, mtu=5, rate=6 : ALL=full ;\n\
             a=0x0a0a, ipoib, sl=3, Q_Key=0x11, TClass=7, scope=5 :\n    mgid=ff12:a01b::1,sl=4\n    mgid=ff12:601b::2\n    0x101=full ;\n\
             empty=0x0b0b, ipoib : NONE ;\n",
        )
        .unwrap();
        let g = expected_mcast(&c, &inv(), SmOptions::default());
        let keys: Vec<String> = g.keys().map(|k| k.to_string()).collect();
        assert_eq!(
            keys,
            [
                "ff12:401b:8a0a::ffff:ffff",
                "ff12:401b:ffff::ffff:ffff",
                "ff15:a01b::1"
            ]
        );
        let d = &g[&"ff12:401b:ffff::ffff:ffff".parse().unwrap()];
        assert_eq!((d.mtu, d.rate, d.qkey, d.hop_limit), (5, 6, 0x0b1b, 0));
        let b = &g[&"ff12:401b:8a0a::ffff:ffff".parse().unwrap()];
        // Without QoS the statement's sl is 0; its TClass and Q_Key are the group's.
        assert_eq!((b.sl, b.qkey, b.tclass, b.hop_limit), (0, 0x11, 7, 0));
        let m = &g[&"ff15:a01b::1".parse().unwrap()];
        // An mgid line keeps its own sl, inherits Q_Key, not TClass.
        assert_eq!((m.sl, m.qkey, m.tclass, m.pkey), (4, 0x11, 0, 0x8a0a));
        // The IP group takes the statement's scope 5, and no broadcast group of scope 5
        // exists: the SA refuses it.
        assert!(!g.contains_key(&"ff15:601b:8a0a::2".parse().unwrap()));
    }

    #[test]
    fn groups_the_sa_refuses_are_not_expected() {
        let c = parse(
            "a=0x0a0a : \n    mgid=ff12:a01b::9\n    mgid=ff12:601b::1\n    mgid=ff15:a01b::7\n    mgid=ff12:a01b::8,scope=5\n    0x101=full ;\n",
        )
        .unwrap();
        let g = expected_mcast(&c, &inv(), SmOptions::default());
        // Link-local 0xa01b is refused (the written scope nibble is replaced by the
        // scope flag, default 2), an IP group needs its broadcast group first.
        let keys: Vec<String> = g.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["ff15:a01b::8"]);
    }

    #[test]
    fn groups_of_an_earlier_config_stay_while_their_partition_does() {
        let base =
            parse("Default=0x7fff, ipoib : ALL=full ;\nold=0x0b0b, ipoib : 0x101 ;\n").unwrap();
        let before = expected_mcast(&base, &inv(), SmOptions::default());
        assert_eq!(before.len(), 2);
        let c = parse("Default=0x7fff, ipoib, mtu=5 : ALL=full ;\n").unwrap();
        let g = expected_mcast_after(&before, &c, &inv(), SmOptions::default());
        assert_eq!(g.len(), 1);
        // Default's broadcast group is the one made first, mtu 4.
        assert_eq!(g.values().next().unwrap().mtu, 4);
    }

    #[test]
    fn a_line_scope_adds_to_the_statement_scope() {
        let c = parse("a=0x0a0a, scope=8 :\n    mgid=ff12:a01b::1,scope=14\n    0x101=full ;\n")
            .unwrap();
        let g = expected_mcast(&c, &inv(), SmOptions::default());
        let keys: Vec<String> = g.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["ff18:a01b::1", "ff1e:a01b::1"]);
    }

    #[test]
    fn the_first_statement_to_make_a_group_decides_it() {
        let c =
            parse("a=0x0a0a, ipoib, mtu=3 : 0x101=full ;\na=0x0a0a, ipoib, mtu=5 : 0x101=full ;\n")
                .unwrap();
        let g = expected_mcast(&c, &inv(), SmOptions::default());
        assert_eq!(g[&"ff12:401b:8a0a::ffff:ffff".parse().unwrap()].mtu, 3);
    }
}
