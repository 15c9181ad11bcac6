//! What a change of partitions.conf takes away: the pure half of the removal guard.
//! The CLI's `apply` and the controller call [`removals`] on the file the master holds
//! and the one about to replace it, and refuse (or record) what it lists.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::conf::{Conf, Selector};
use crate::types::{Membership, PKey};

/// One thing the new file takes away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Removal {
    /// A partition (by P_Key) that the new file no longer has.
    Partition {
        /// Its name in the old file.
        name: String,
        /// Its P_Key.
        pkey: PKey,
    },
    /// A member that the new file drops from a partition, or lowers from full to limited.
    Member {
        /// The partition's name in the old file.
        partition: String,
        /// Its P_Key.
        pkey: PKey,
        /// The port or group.
        selector: Selector,
        /// Its membership before.
        was: Membership,
        /// Its membership after; `None` when it is gone.
        now: Option<Membership>,
    },
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Removal::Partition { name, pkey } => {
                write!(f, "- partition `{name}` ({pkey}) is removed")
            }
            Removal::Member {
                partition,
                pkey,
                selector,
                was,
                now: None,
            } => write!(
                f,
                "- {selector} ({was}) leaves partition `{partition}` ({pkey})"
            ),
            Removal::Member {
                partition,
                pkey,
                selector,
                was,
                now: Some(now),
            } => write!(
                f,
                "- {selector} goes from {was} to {now} in partition `{partition}` ({pkey})"
            ),
        }
    }
}

type Members = BTreeMap<PKey, (String, BTreeMap<Selector, Membership>)>;

/// Each partition's members as OpenSM ends up with them: statements merged by key, the
/// last membership of a selector winning.
fn members(conf: &Conf) -> Members {
    let mut out: Members = BTreeMap::new();
    for (p, key) in conf.partitions.iter().zip(conf.effective_pkeys()) {
        let Some(key) = key else { continue };
        let entry = out
            .entry(key)
            .or_insert_with(|| (p.name.clone(), BTreeMap::new()));
        for m in &p.members {
            let ms = m
                .membership
                .or(p.flags.defmember)
                .unwrap_or(Membership::Limited);
            entry.1.insert(m.selector.clone(), ms);
        }
    }
    out
}

fn rank(m: Membership) -> u8 {
    match m {
        Membership::Limited => 0,
        Membership::Full => 1,
        Membership::Both => 2,
    }
}

/// What going from `old` to `new` removes: partitions whose P_Key is gone, members gone
/// from a partition, members lowered from full (or both) to limited or from both to full.
/// Selectors are compared as written: a port that a new group keyword covers instead
/// still counts as removed, so the guard errs on the side of asking.
pub fn removals(old: &Conf, new: &Conf) -> Vec<Removal> {
    let (old, new) = (members(old), members(new));
    let mut out = Vec::new();
    for (key, (name, was)) in &old {
        let Some((_, now)) = new.get(key) else {
            out.push(Removal::Partition {
                name: name.clone(),
                pkey: *key,
            });
            continue;
        };
        for (s, ms) in was {
            let after = now.get(s).copied();
            if after.is_none_or(|a| rank(a) < rank(*ms)) {
                out.push(Removal::Member {
                    partition: name.clone(),
                    pkey: *key,
                    selector: s.clone(),
                    was: *ms,
                    now: after,
                });
            }
        }
    }
    out
}
