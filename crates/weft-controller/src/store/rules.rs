//! The decisions a change to the desired state makes, as pure functions: whether a name
//! may become a group, which P_Key a new group gets, and what adding, removing or moving
//! a server does to its membership. The store looks up what they need (inside its
//! transaction), calls them and writes what they decided; the name and key rules are
//! weft-fabric's own ([`weft_fabric::is_reserved_name`], [`weft_fabric::lowest_free_pkey`]),
//! so a plan compiled by `weft fabric` and a group made by the controller follow one rule.

use std::collections::BTreeSet;

use super::{Change, StoreError};

/// The first P_Key base handed to a group; groups get the lowest free one from here.
pub const FIRST_GROUP_PKEY: u16 = 0x0a01;

/// Whether `name` may name a new group, as far as the name alone says: valid in a
/// partitions file and not the Default partition's.
pub fn group_name(name: &str) -> Result<(), StoreError> {
    weft_fabric::conf::validate_name(name)
        .map_err(|m| StoreError::Invalid(format!("group name `{name}`: {m}")))?;
    if weft_fabric::is_reserved_name(name) {
        return Err(StoreError::Invalid(
            "`Default` is the Default partition's name".into(),
        ));
    }
    Ok(())
}

/// Refuses a group named like a partition the controller adopted from the SMs.
pub fn not_adopted<'a>(
    name: &str,
    mut adopted: impl Iterator<Item = &'a str>,
) -> Result<(), StoreError> {
    if adopted.any(|n| n == name) {
        return Err(StoreError::Conflict(format!(
            "`{name}` is a partition the controller adopted from the SMs"
        )));
    }
    Ok(())
}

/// The P_Key base of a new group: the lowest from [`FIRST_GROUP_PKEY`] that no group and
/// no adopted partition holds. A group keeps its key for life, so no change to one group
/// ever moves another tenant's key.
pub fn group_pkey(taken: &BTreeSet<u16>) -> Result<u16, StoreError> {
    weft_fabric::lowest_free_pkey(FIRST_GROUP_PKEY, |k| taken.contains(&k))
        .map(|k| k.base())
        .ok_or_else(|| StoreError::Conflict("no free P_Key".into()))
}

/// What a membership change does to a server's row in `members`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEdit<'a> {
    /// The server, in no group, joins this one.
    Insert(&'a str),
    /// The server leaves its group for this one.
    Update(&'a str),
    /// The server leaves its group.
    Delete,
}

/// What `change` (an add, remove or move of `server`) does, given the group the server is
/// in now (`current`); the group and server are known to exist. `None` for changes that
/// are not about one server's membership.
///
/// The rules: a server is in at most one group; adding one that is in a group is refused
/// (move it instead); removing takes a server out of the named group only; a move is one
/// step from any group, or none, to another group, and a move to the group it is in is
/// refused.
pub fn member_edit<'a>(
    change: &'a Change,
    current: Option<&str>,
) -> Option<Result<MemberEdit<'a>, StoreError>> {
    Some(match change {
        Change::AddMember { group, server } => match current {
            Some(g) => Err(StoreError::Conflict(format!(
                "server `{server}` is in group `{g}`; move it instead"
            ))),
            None => Ok(MemberEdit::Insert(group)),
        },
        Change::RemoveMember { group, server } => {
            if current == Some(group.as_str()) {
                Ok(MemberEdit::Delete)
            } else {
                Err(StoreError::NotFound(format!(
                    "server `{server}` is not in group `{group}`"
                )))
            }
        }
        Change::Move { server, to } => match current {
            Some(g) if g == to => Err(StoreError::Conflict(format!(
                "server `{server}` is already in group `{to}`"
            ))),
            Some(_) => Ok(MemberEdit::Update(to)),
            None => Ok(MemberEdit::Insert(to)),
        },
        Change::CreateGroup { .. } | Change::DeleteGroup { .. } | Change::ApproveClaim { .. } => {
            return None;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(server: &str, to: &str) -> Change {
        Change::Move {
            server: server.into(),
            to: to.into(),
        }
    }

    #[test]
    fn a_server_is_in_one_group_and_moves_in_one_step() {
        let add = Change::AddMember {
            group: "a".into(),
            server: "n1".into(),
        };
        let remove = Change::RemoveMember {
            group: "a".into(),
            server: "n1".into(),
        };
        assert_eq!(
            member_edit(&add, None).unwrap().unwrap(),
            MemberEdit::Insert("a")
        );
        assert!(matches!(
            member_edit(&add, Some("b")),
            Some(Err(StoreError::Conflict(m))) if m.contains("move it instead")
        ));
        assert_eq!(
            member_edit(&remove, Some("a")).unwrap().unwrap(),
            MemberEdit::Delete
        );
        assert!(matches!(
            member_edit(&remove, Some("b")),
            Some(Err(StoreError::NotFound(_)))
        ));
        assert!(matches!(
            member_edit(&remove, None),
            Some(Err(StoreError::NotFound(_)))
        ));
        let m = mv("n1", "b");
        assert_eq!(
            member_edit(&m, Some("a")).unwrap().unwrap(),
            MemberEdit::Update("b")
        );
        assert_eq!(
            member_edit(&m, None).unwrap().unwrap(),
            MemberEdit::Insert("b")
        );
        assert!(matches!(
            member_edit(&m, Some("b")),
            Some(Err(StoreError::Conflict(m))) if m.contains("already in group")
        ));
        assert!(member_edit(&Change::DeleteGroup { group: "a".into() }, None).is_none());
    }

    #[test]
    fn a_group_gets_the_lowest_free_key_and_never_a_reserved_or_adopted_name() {
        let taken: BTreeSet<u16> = [0x0a01, 0x0a03].into();
        assert_eq!(group_pkey(&taken).unwrap(), 0x0a02);
        assert_eq!(group_pkey(&BTreeSet::new()).unwrap(), FIRST_GROUP_PKEY);
        let all: BTreeSet<u16> = (FIRST_GROUP_PKEY..0x7fff).collect();
        assert!(matches!(group_pkey(&all), Err(StoreError::Conflict(_))));
        assert!(matches!(group_name("Default"), Err(StoreError::Invalid(_))));
        assert!(matches!(group_name("a b"), Err(StoreError::Invalid(_))));
        assert!(group_name("tenant-a").is_ok());
        assert!(matches!(
            not_adopted("storage", ["mgmt", "storage"].into_iter()),
            Err(StoreError::Conflict(_))
        ));
        assert!(not_adopted("a", "".split(',')).is_ok());
    }
}
