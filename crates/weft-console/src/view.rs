//! What a page shows, computed from the store's answers for one viewer: the groups and
//! servers their role may see, the partitions matrix, a move's diff before it is made,
//! and the history filters. Pure functions over the controller's types, so the rules are
//! tested here and the pages only lay them out.

use std::collections::{BTreeMap, BTreeSet};

use weft_controller::auth::Principal;
use weft_controller::model::{AuditEntry, GroupView, OperationView, ServerView};
use weft_controller::render::{self, Desired, DesiredGroup, RenderError};
use weft_controller::store::rules::{self, MemberEdit};
use weft_controller::store::{Change, StoreError};
use weft_fabric::{DefaultPolicy, Membership};

/// The groups `p` may see: all for an admin, its own for a tenant.
pub fn visible_groups(groups: Vec<GroupView>, p: &Principal) -> Vec<GroupView> {
    groups
        .into_iter()
        .filter(|g| p.can_read_tenant(&g.tenant))
        .collect()
}

/// The servers `p` may see: all for an admin; for a tenant, the members of its groups.
pub fn visible_servers(
    servers: Vec<ServerView>,
    visible: &[GroupView],
    p: &Principal,
) -> Vec<ServerView> {
    if p.is_admin() {
        return servers;
    }
    let members: BTreeSet<&str> = visible
        .iter()
        .flat_map(|g| g.members.iter().map(String::as_str))
        .collect();
    servers
        .into_iter()
        .filter(|s| members.contains(s.name.as_str()))
        .collect()
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// Every port of the server is a full member.
    Full,
    /// Its ports are limited members.
    Limited,
    /// Not a member.
    None,
}

impl Cell {
    /// As shown (and as the CSS class).
    pub fn as_str(self) -> &'static str {
        match self {
            Cell::Full => "full",
            Cell::Limited => "limited",
            Cell::None => "none",
        }
    }
}

/// One group column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Group (partition) name.
    pub group: String,
    /// Its P_Key, `0x0a01`.
    pub pkey: String,
}

/// The partitions matrix: servers × groups, groups under their tenants, and the Default
/// partition's column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// Tenants in name order, each with its groups.
    pub tenants: Vec<(String, Vec<Column>)>,
    /// Server name, its cell in the Default partition, then one cell per group column
    /// (in the order of `tenants`).
    pub rows: Vec<(String, Cell, Vec<Cell>)>,
    /// The Default partition as the plan writes it.
    pub default: String,
}

/// The matrix of `desired` (as the store holds it, rendered by the same plan the
/// controller delivers) for `servers`, showing only the groups in `visible`.
pub fn matrix(
    desired: &Desired,
    servers: &[&ServerView],
    visible: &BTreeSet<String>,
) -> Result<Matrix, RenderError> {
    let plan = render::plan(desired)?;
    // Membership of each port GUID in each partition.
    let mut member: BTreeMap<(&str, u64), Membership> = BTreeMap::new();
    for p in &plan.partitions {
        for m in &p.members {
            if let Some(g) = m.guid {
                member.insert((p.name.as_str(), g.0), m.membership.unwrap_or(p.membership));
            }
        }
    }
    let mut by_tenant: BTreeMap<String, Vec<Column>> = BTreeMap::new();
    for g in desired.groups.iter().filter(|g| visible.contains(&g.name)) {
        by_tenant.entry(g.tenant.clone()).or_default().push(Column {
            group: g.name.clone(),
            pkey: format!("{:#06x}", g.pkey),
        });
    }
    for cols in by_tenant.values_mut() {
        cols.sort_by(|a, b| a.group.cmp(&b.group));
    }
    let tenants: Vec<(String, Vec<Column>)> = by_tenant.into_iter().collect();
    let default_cell = match plan.default.policy {
        DefaultPolicy::Isolate => Cell::Limited,
        DefaultPolicy::Open => Cell::Full,
        DefaultPolicy::Custom => Cell::None,
    };
    let default = match plan.default.policy {
        DefaultPolicy::Isolate => {
            "Default (0x7fff): ALL=limited, SELF=full — every port reaches the subnet manager, no port reaches another through it"
        }
        DefaultPolicy::Open => "Default (0x7fff): ALL=full — every port reaches every port",
        DefaultPolicy::Custom => "Default (0x7fff): the members an imported file listed",
    }
    .to_string();
    let rows = servers
        .iter()
        .map(|s| {
            let cells = tenants
                .iter()
                .flat_map(|(_, cols)| cols.iter())
                .map(|c| {
                    let ms: Vec<Option<&Membership>> = s
                        .ports
                        .iter()
                        .map(|p| member.get(&(c.group.as_str(), p.guid.0)))
                        .collect();
                    if ms.is_empty() || ms.iter().all(Option::is_none) {
                        Cell::None
                    } else if ms.iter().all(|m| matches!(m, Some(Membership::Full))) {
                        Cell::Full
                    } else {
                        Cell::Limited
                    }
                })
                .collect();
            (s.name.clone(), default_cell, cells)
        })
        .collect();
    Ok(Matrix {
        tenants,
        rows,
        default,
    })
}

/// Why a move cannot be previewed.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The target group does not exist.
    #[error("there is no group `{0}`")]
    NoGroup(String),
    /// The change would not move the server (it would leave its group).
    #[error("not a move")]
    NotAMove,
    /// The store's membership rule refuses it (the server is already there, ...).
    #[error(transparent)]
    Refused(StoreError),
    /// The desired state with the move does not render.
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// The partitions-file diff moving `server` to `to` would make, computed as the store
/// will (the same membership rule, the same rendering), without changing anything.
pub fn move_diff(desired: &Desired, server: &ServerView, to: &str) -> Result<String, MoveError> {
    let current = desired
        .groups
        .iter()
        .find(|g| g.members.iter().any(|(s, _)| *s == server.name))
        .map(|g| g.name.clone());
    if !desired.groups.iter().any(|g| g.name == to) {
        return Err(MoveError::NoGroup(to.to_string()));
    }
    let change = Change::Move {
        server: server.name.clone(),
        to: to.to_string(),
    };
    match rules::member_edit(&change, current.as_deref()) {
        Some(Ok(MemberEdit::Insert(_) | MemberEdit::Update(_))) => {}
        Some(Ok(MemberEdit::Delete)) | None => {
            return Err(MoveError::NotAMove);
        }
        Some(Err(e)) => return Err(MoveError::Refused(e)),
    }
    let mut after = desired.clone();
    let mut guids = server.ports.iter().map(|p| p.guid).collect::<Vec<_>>();
    for g in &mut after.groups {
        if let Some(i) = g.members.iter().position(|(s, _)| *s == server.name) {
            guids = g.members.remove(i).1;
        }
    }
    if let Some(g) = after.groups.iter_mut().find(|g| g.name == to) {
        g.members.push((server.name.clone(), guids));
        g.members.sort();
    }
    let before = render::conf_text(desired)?;
    let after = render::conf_text(&after)?;
    Ok(render::diff(&before, &after))
}

/// The group of `server` in `desired`, if any.
pub fn group_of<'a>(desired: &'a Desired, server: &str) -> Option<&'a DesiredGroup> {
    desired
        .groups
        .iter()
        .find(|g| g.members.iter().any(|(s, _)| s == server))
}

/// The History page's filters (empty: no filter).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryFilter {
    /// Only what concerns this tenant (its actor, its groups).
    #[serde(default)]
    pub tenant: String,
    /// Only what names this server.
    #[serde(default)]
    pub node: String,
    /// Only this action (`group.move`, `apply`, `console.login`...).
    #[serde(default)]
    pub action: String,
}

/// Whether `word` occurs in `text` as a whole word (names are `[A-Za-z0-9_.-]`).
fn names(text: &str, word: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)))
        .any(|w| w == word)
}

impl HistoryFilter {
    /// Whether there is any filter.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_empty() && self.node.is_empty() && self.action.is_empty()
    }

    fn tenant_matches(&self, actor: &str, texts: &[&str], groups: &[GroupView]) -> bool {
        if self.tenant.is_empty() {
            return true;
        }
        let t = self.tenant.as_str();
        actor.starts_with(&format!("tenant:{t}:"))
            || texts.iter().any(|x| names(x, t))
            || groups
                .iter()
                .filter(|g| g.tenant == t)
                .any(|g| texts.iter().any(|x| names(x, &g.name)))
    }

    /// Whether the audit line passes.
    pub fn audit(&self, e: &AuditEntry, groups: &[GroupView]) -> bool {
        (self.action.is_empty() || e.action == self.action)
            && (self.node.is_empty()
                || names(&e.subject, &self.node)
                || names(&e.detail, &self.node))
            && self.tenant_matches(&e.actor, &[&e.subject, &e.detail, &e.diff], groups)
    }

    /// Whether the operation passes (its action text starts with the action's name).
    pub fn operation(&self, o: &OperationView, groups: &[GroupView]) -> bool {
        (self.action.is_empty() || o.action.split_whitespace().next() == Some(&self.action))
            && (self.node.is_empty() || names(&o.action, &self.node))
            && self.tenant_matches(&o.actor, &[&o.action, &o.diff], groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_controller::auth::Role;
    use weft_controller::model::{Liveness, PortView};
    use weft_fabric::Guid;

    fn server(name: &str, guid: u64) -> ServerView {
        ServerView {
            name: name.into(),
            liveness: Liveness::Ok,
            last_seen: Some(0),
            ports: vec![PortView {
                guid: Guid(guid),
                device: "mlx5_0".into(),
                num: 1,
                lid: 1,
                state: "ACTIVE".into(),
                rate: None,
                mtu: None,
            }],
            group: None,
            pending_claims: vec![],
            roce: vec![],
            nics: vec![],
            gpus: vec![],
        }
    }

    fn desired() -> Desired {
        Desired {
            generation: 1,
            groups: vec![
                DesiredGroup {
                    name: "a".into(),
                    tenant: "alice".into(),
                    pkey: 0x0a01,
                    members: vec![("n1".into(), vec![Guid(0x101)])],
                },
                DesiredGroup {
                    name: "b".into(),
                    tenant: "bob".into(),
                    pkey: 0x0a02,
                    members: vec![("n2".into(), vec![Guid(0x201)])],
                },
            ],
        }
    }

    #[test]
    fn the_matrix_shows_members_full_others_none_and_default_limited() {
        let (n1, n2, n3) = (
            server("n1", 0x101),
            server("n2", 0x201),
            server("n3", 0x301),
        );
        let all: BTreeSet<String> = ["a".into(), "b".into()].into();
        let m = matrix(&desired(), &[&n1, &n2, &n3], &all).unwrap();
        assert_eq!(m.tenants.len(), 2);
        assert_eq!(
            m.rows[0],
            ("n1".into(), Cell::Limited, vec![Cell::Full, Cell::None])
        );
        assert_eq!(m.rows[1].2, vec![Cell::None, Cell::Full]);
        assert_eq!(m.rows[2].2, vec![Cell::None, Cell::None]);
        let only_a: BTreeSet<String> = ["a".into()].into();
        let m = matrix(&desired(), &[&n1], &only_a).unwrap();
        assert_eq!(
            m.tenants,
            vec![(
                "alice".into(),
                vec![Column {
                    group: "a".into(),
                    pkey: "0x0a01".into()
                }]
            )]
        );
    }

    #[test]
    fn a_move_diff_shows_the_port_leaving_one_partition_and_joining_another() {
        let d = move_diff(&desired(), &server("n1", 0x101), "b").unwrap();
        assert!(d.contains("-a=0x0a01"), "{d}");
        assert!(d.contains("+b=0x0a02"), "{d}");
        assert!(d.contains("0x0000000000000101"), "{d}");
        let e = move_diff(&desired(), &server("n1", 0x101), "a").unwrap_err();
        assert!(matches!(e, MoveError::Refused(_)), "{e:?}");
        assert!(e.to_string().contains("already in group `a`"), "{e}");
        assert!(matches!(
            move_diff(&desired(), &server("n1", 0x101), "zz"),
            Err(MoveError::NoGroup(g)) if g == "zz"
        ));
        // A server in no group joins with the ports it reported.
        let d = move_diff(&desired(), &server("n3", 0x301), "a").unwrap();
        assert!(d.contains("0x0000000000000301=full"), "{d}");
    }

    #[test]
    fn a_tenant_sees_its_groups_and_their_members_only() {
        let groups = vec![
            GroupView {
                name: "a".into(),
                tenant: "alice".into(),
                pkey: "0x0a01".into(),
                members: vec!["n1".into()],
                ports: vec![],
            },
            GroupView {
                name: "b".into(),
                tenant: "bob".into(),
                pkey: "0x0a02".into(),
                members: vec!["n2".into()],
                ports: vec![],
            },
        ];
        let alice = Principal {
            role: Role::Tenant("alice".into()),
            actor: "tenant:alice:x".into(),
        };
        let g = visible_groups(groups, &alice);
        assert_eq!(g.len(), 1);
        let s = visible_servers(
            vec![server("n1", 1), server("n2", 2), server("n3", 3)],
            &g,
            &alice,
        );
        assert_eq!(
            s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["n1"]
        );
    }

    #[test]
    fn history_filters_by_tenant_node_and_action() {
        let groups = vec![GroupView {
            name: "a".into(),
            tenant: "alice".into(),
            pkey: "0x0a01".into(),
            members: vec![],
            ports: vec![],
        }];
        let e = AuditEntry {
            id: 1,
            at: 0,
            actor: "admin:x".into(),
            action: "group.move".into(),
            subject: "n1 -> a".into(),
            diff: String::new(),
            outcome: "accepted".into(),
            detail: String::new(),
        };
        let f = |t: &str, n: &str, a: &str| HistoryFilter {
            tenant: t.into(),
            node: n.into(),
            action: a.into(),
        };
        assert!(f("alice", "n1", "group.move").audit(&e, &groups));
        assert!(!f("bob", "", "").audit(&e, &groups));
        assert!(!f("", "n11", "").audit(&e, &groups));
        assert!(!f("", "", "apply").audit(&e, &groups));
    }
}
