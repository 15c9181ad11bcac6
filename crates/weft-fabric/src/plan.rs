//! The operator's intent, from TOML: tenants own partitions, members named by node
//! name or port GUID.

use serde::{Deserialize, Serialize};

use crate::conf::{self, Selector};
use crate::types::{Guid, Membership, PKey};

/// What the Default partition (0x7fff) lets end ports do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultPolicy {
    /// `ALL=limited, SELF=full`: end ports reach only the SM through Default.
    #[default]
    Isolate,
    /// `ALL=full`: every port talks to every port through Default.
    Open,
}

/// The `[default]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultPartition {
    /// Isolating unless said otherwise.
    #[serde(default)]
    pub policy: DefaultPolicy,
    /// Create the IPoIB broadcast group of the Default partition.
    #[serde(default = "yes")]
    pub ipoib: bool,
}

fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_full(m: &Membership) -> bool {
    *m == Membership::Full
}

impl Default for DefaultPartition {
    fn default() -> Self {
        DefaultPartition {
            policy: DefaultPolicy::Isolate,
            ipoib: true,
        }
    }
}

/// One member: exactly one of `node` (all CA ports of a node) or `guid` (one port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanMember {
    /// Node name (NodeDescription, or its first word).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Port GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<Guid>,
    /// Overrides the partition's `membership`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<Membership>,
}

impl PlanMember {
    /// A member named by node.
    pub fn node(name: &str) -> Self {
        PlanMember {
            node: Some(name.to_string()),
            guid: None,
            membership: None,
        }
    }

    /// A member named by port GUID.
    pub fn guid(g: Guid) -> Self {
        PlanMember {
            node: None,
            guid: Some(g),
            membership: None,
        }
    }
}

/// One `[[partition]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanPartition {
    /// Partition name, as written in partitions.conf.
    pub name: String,
    /// Tenant that owns it.
    pub tenant: String,
    /// Its P_Key; allocated by [`crate::compile`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pkey: Option<PKey>,
    /// Create the IPoIB broadcast group.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ipoib: bool,
    /// Put the key at index 0 of the members' tables.
    #[serde(default, skip_serializing_if = "is_false")]
    pub indx0: bool,
    /// IBTA MTU code 1..=5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u8>,
    /// IBTA rate code 2..=18.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u8>,
    /// Service level 0..=15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sl: Option<u8>,
    /// Membership of members that name none; full unless said otherwise.
    #[serde(default = "full", skip_serializing_if = "is_full")]
    pub membership: Membership,
    /// The members.
    #[serde(default)]
    pub members: Vec<PlanMember>,
}

fn full() -> Membership {
    Membership::Full
}

/// The operator's intent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Accept GUIDs that the inventory does not have.
    #[serde(default)]
    pub allow_unknown_guids: bool,
    /// Port GUIDs or node names allowed to be full members in several tenants' partitions.
    #[serde(default)]
    pub allow_shared_ports: Vec<String>,
    /// The Default partition.
    #[serde(default)]
    pub default: DefaultPartition,
    /// Tenant partitions, `[[partition]]`.
    #[serde(default, rename = "partition")]
    pub partitions: Vec<PlanPartition>,
}

/// A plan that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PlanError {
    /// TOML syntax, an unknown key, or a value of the wrong type. 1-based position.
    #[error("line {line}, column {column}: {message}")]
    Toml {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// Well-formed TOML that does not make a plan.
    #[error("{0}")]
    Invalid(String),
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl Plan {
    /// Reads a plan. Unknown keys are refused, naming the key.
    pub fn from_toml(text: &str) -> Result<Plan, PlanError> {
        let plan: Plan = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
            PlanError::Toml {
                line,
                column,
                message: e.message().trim().to_string(),
            }
        })?;
        for p in &plan.partitions {
            for m in &p.members {
                match (&m.node, &m.guid) {
                    (Some(_), None) | (None, Some(_)) => {}
                    _ => {
                        return Err(PlanError::Invalid(format!(
                            "partition `{}`: each member names exactly one of `node` or `guid`",
                            p.name
                        )));
                    }
                }
            }
        }
        Ok(plan)
    }

    /// Writes the plan as TOML that [`Plan::from_toml`] reads back to the same plan.
    pub fn to_toml(&self) -> String {
        // Plain data with string keys: serialization cannot fail; fall back to a comment.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write plan: {e}\n"))
    }

    /// Imports a partitions.conf: each partition becomes its own tenant, named after it.
    /// Notes say what could not be carried over.
    pub fn from_conf(conf: &conf::Conf) -> Plan {
        Plan::from_conf_with_notes(conf).0
    }

    /// Like [`Plan::from_conf`], with one note for each thing a plan cannot express
    /// (keywords other than in Default, multicast groups, Q_Key, TClass, FlowLabel, scope).
    pub fn from_conf_with_notes(conf: &conf::Conf) -> (Plan, Vec<String>) {
        let mut notes = Vec::new();
        let mut plan = Plan::default();
        let keys = conf.effective_pkeys();
        for (p, key) in conf.partitions.iter().zip(keys) {
            if key.is_some_and(|k| k.is_default()) {
                let open = p.members.iter().any(|m| {
                    m.selector == Selector::All
                        && m.membership.or(p.flags.defmember) == Some(Membership::Full)
                });
                plan.default = DefaultPartition {
                    policy: if open {
                        DefaultPolicy::Open
                    } else {
                        DefaultPolicy::Isolate
                    },
                    ipoib: p.flags.ipoib,
                };
                continue;
            }
            let f = &p.flags;
            if f.scope.is_some() || f.qkey.is_some() || f.tclass.is_some() || f.flow_label.is_some()
            {
                notes.push(format!(
                    "partition `{}`: scope, Q_Key, TClass and FlowLabel are not carried over",
                    p.name
                ));
            }
            if !p.mcast_groups.is_empty() {
                notes.push(format!(
                    "partition `{}`: mgid lines are not carried over",
                    p.name
                ));
            }
            let default_m = f.defmember.unwrap_or(Membership::Limited);
            let mut members = Vec::new();
            for m in &p.members {
                match &m.selector {
                    Selector::Guid(g) => {
                        let ms = m.membership.unwrap_or(default_m);
                        members.push(PlanMember {
                            node: None,
                            guid: Some(*g),
                            membership: (ms != Membership::Full).then_some(ms),
                        });
                    }
                    other => notes.push(format!(
                        "partition `{}`: `{other}` is not carried over (plans name nodes or port GUIDs)",
                        p.name
                    )),
                }
            }
            plan.partitions.push(PlanPartition {
                name: p.name.clone(),
                tenant: p.name.clone(),
                pkey: key,
                ipoib: f.ipoib,
                indx0: f.indx0,
                mtu: f.mtu,
                rate: f.rate,
                sl: f.sl,
                membership: Membership::Full,
                members,
            });
        }
        (plan, notes)
    }
}
