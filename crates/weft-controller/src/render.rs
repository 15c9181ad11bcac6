//! From the desired state to a [`FabricPlan`] and a partitions.conf text, and line diffs between
//! two such texts. Pure functions: the store calls them inside its transactions, the
//! reconcile loop before delivery.

use weft_fabric::{
    DefaultPartition, DefaultPolicy, FabricPlan, Guid, PKey, PlanMember, PlanPartition,
};

/// The desired state as the store holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Bumped by every change.
    pub generation: i64,
    /// Every group, by name.
    pub groups: Vec<DesiredGroup>,
}

/// One group of the desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredGroup {
    /// Partition name.
    pub name: String,
    /// Owning tenant.
    pub tenant: String,
    /// Its P_Key base, fixed when the group was created, so that no change to one group
    /// ever moves another tenant's key.
    pub pkey: u16,
    /// Member servers and the port GUIDs each owns.
    pub members: Vec<(String, Vec<Guid>)>,
}

/// Why the desired state could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A group whose P_Key base is not a valid P_Key.
    #[error("group `{group}`: {source}")]
    PKey {
        group: String,
        #[source]
        source: weft_fabric::FabricError,
    },
    /// The plan breaks a rule that needs no fabric: every violation, `subject: message`,
    /// joined by `; `.
    #[error("{}", .0.iter().map(|v| format!("{}: {}", v.subject, v.message)).collect::<Vec<_>>().join("; "))]
    Violations(Vec<weft_fabric::Violation>),
}

/// The message, for the callers (stores, the console's views, the reconcile loop's
/// failure record) that carry errors as text.
impl From<RenderError> for String {
    fn from(e: RenderError) -> String {
        e.to_string()
    }
}

/// The controller's Default partition policy, in words: what it states when it starts (log
/// and `GET /v1/status`). It is the policy of [`plan`].
pub const DEFAULT_POLICY: &str = "isolate: Default=0x7fff : ALL=limited, SELF=full (every end port reaches the SM; two ports talk only through a group both are in); the first delivery takes full membership of Default away from every port that had it";

/// The plan for `desired`: an isolating Default partition (end ports reach only the SM
/// through it), one partition per group, full members = its servers' ports.
///
/// GUIDs not in the fabric are accepted (a powered-off server must not block changes to
/// other tenants); OpenSM ignores them and verification covers the ports that exist.
pub fn plan(desired: &Desired) -> Result<FabricPlan, RenderError> {
    let mut partitions = Vec::new();
    for g in &desired.groups {
        let pkey = PKey::new(g.pkey).map_err(|source| RenderError::PKey {
            group: g.name.clone(),
            source,
        })?;
        let mut members: Vec<PlanMember> = g
            .members
            .iter()
            .flat_map(|(_, guids)| guids.iter().copied().map(PlanMember::guid))
            .collect();
        members.sort_by_key(|m| m.guid);
        let mut p = PlanPartition::new(&g.name, &g.tenant);
        p.pkey = Some(pkey);
        p.ipoib = true;
        p.members = members;
        partitions.push(p);
    }
    Ok(FabricPlan {
        allow_unknown_guids: true,
        allow_shared_ports: Vec::new(),
        default: DefaultPartition {
            policy: DefaultPolicy::Isolate,
            ipoib: true,
            ..DefaultPartition::default()
        },
        partitions,
    })
}

/// The partitions.conf text for `desired`, compiled without an inventory (every rule
/// that does not need the fabric is checked).
pub fn conf_text(desired: &Desired) -> Result<String, RenderError> {
    let plan = plan(desired)?;
    let compiled = weft_fabric::compile(&plan, None).map_err(RenderError::Violations)?;
    Ok(weft_fabric::conf::render(&compiled.conf))
}

/// A line diff: `-` for lines only in `before`, `+` for lines only in `after`, in the
/// order of the files (a longest-common-subsequence diff; partitions files are short).
pub fn diff(before: &str, after: &str) -> String {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("-{}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+{}\n", b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, tenant: &str, pkey: u16, members: &[(&str, u64)]) -> DesiredGroup {
        DesiredGroup {
            name: name.into(),
            tenant: tenant.into(),
            pkey,
            members: members
                .iter()
                .map(|(s, g)| (s.to_string(), vec![Guid(*g)]))
                .collect(),
        }
    }

    #[test]
    fn each_group_is_one_partition_of_its_servers_ports() {
        let d = Desired {
            generation: 3,
            groups: vec![
                group("a", "alice", 0x0a01, &[("node1", 0x101), ("node2", 0x201)]),
                group("b", "bob", 0x0a02, &[]),
            ],
        };
        let text = conf_text(&d).unwrap();
        assert!(
            text.contains("Default=0x7fff,ipoib : ALL=limited, SELF=full ;"),
            "{text}"
        );
        assert!(
            text.contains("a=0x0a01,ipoib : 0x0000000000000101=full, 0x0000000000000201=full ;"),
            "{text}"
        );
        assert!(text.contains("b=0x0a02,ipoib"), "{text}");
    }

    #[test]
    fn diff_marks_only_changed_lines() {
        assert_eq!(diff("x\na\ny\n", "x\nb\ny\n"), "-a\n+b\n");
        assert_eq!(diff("", "a\n"), "+a\n");
        assert_eq!(diff("a\n", "a\n"), "");
    }

    #[test]
    fn a_bad_key_and_broken_rules_name_the_group_and_each_violation() {
        let bad_key = Desired {
            generation: 1,
            groups: vec![group("a", "alice", 0, &[])],
        };
        let e = conf_text(&bad_key).unwrap_err();
        assert!(matches!(&e, RenderError::PKey { group, .. } if group == "a"));
        assert!(e.to_string().starts_with("group `a`: "), "{e}");
        let twice = Desired {
            generation: 1,
            groups: vec![
                group("a", "alice", 0x0a01, &[]),
                group("b", "bob", 0x0a01, &[]),
            ],
        };
        let e = conf_text(&twice).unwrap_err();
        let RenderError::Violations(v) = &e else {
            panic!("{e}")
        };
        let joined: Vec<String> = v
            .iter()
            .map(|v| format!("{}: {}", v.subject, v.message))
            .collect();
        assert_eq!(e.to_string(), joined.join("; "));
        assert_eq!(String::from(e), joined.join("; "));
    }
}
