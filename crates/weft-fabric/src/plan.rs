//! The operator's intent, from TOML: tenants own partitions, members named by node
//! name or port GUID.

use serde::{Deserialize, Serialize};

use crate::conf::{McastGroup, Selector, with_group_options};
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
    /// The members listed in `[default] members`, as an imported file had them.
    Custom,
}

with_group_options! {
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
        /// With `policy = "custom"` only: the members, in order (later entries override
        /// earlier ones for the ports they share, as in OpenSM).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub members: Vec<PlanMember>,
        /// Membership of custom members that name none; full unless said otherwise.
        #[serde(default = "full", skip_serializing_if = "is_full")]
        pub membership: Membership,
        ..GroupOptions #[serde(default, skip_serializing_if = "Option::is_none")],
        /// Multicast groups OpenSM creates up front (`mgid=` lines).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub mcast: Vec<McastGroup>,
    }
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
            members: Vec::new(),
            membership: Membership::Full,
            mtu: None,
            rate: None,
            sl: None,
            scope: None,
            qkey: None,
            tclass: None,
            flow_label: None,
            mcast: Vec::new(),
        }
    }
}

/// The groups of ports partitions.conf can name with a keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Group {
    /// `ALL`: every end port (CA and router ports, switch port 0).
    #[serde(rename = "all")]
    All,
    /// `ALL_CAS`: every CA port.
    #[serde(rename = "all_cas")]
    AllCas,
    /// `ALL_SWITCHES`: every switch's port 0.
    #[serde(rename = "all_switches")]
    AllSwitches,
    /// `ALL_ROUTERS`: every router port.
    #[serde(rename = "all_routers")]
    AllRouters,
    /// `SELF`: the port of the SM that reads the file.
    #[serde(rename = "self")]
    SelfPort,
}

impl Group {
    /// The selector of partitions.conf.
    pub fn selector(self) -> Selector {
        match self {
            Group::All => Selector::All,
            Group::AllCas => Selector::AllCas,
            Group::AllSwitches => Selector::AllSwitches,
            Group::AllRouters => Selector::AllRouters,
            Group::SelfPort => Selector::SelfPort,
        }
    }

    /// The group a keyword selector names; `None` for a GUID.
    pub fn of(s: &Selector) -> Option<Group> {
        match s {
            Selector::Guid(_) => None,
            Selector::All => Some(Group::All),
            Selector::AllCas => Some(Group::AllCas),
            Selector::AllSwitches => Some(Group::AllSwitches),
            Selector::AllRouters => Some(Group::AllRouters),
            Selector::SelfPort => Some(Group::SelfPort),
        }
    }
}

/// One member: exactly one of `node` (all CA ports of a node), `guid` (one port) or
/// `group` (`all`, `all_cas`, `all_switches`, `all_routers`, `self`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanMember {
    /// Node name (NodeDescription, or its first word).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Port GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<Guid>,
    /// A group of ports named by keyword.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Group>,
    /// Overrides the partition's `membership`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<Membership>,
    /// Put this partition's key at index 0 of this member's table (OpenSM's `indx0`,
    /// which it applies per statement).
    #[serde(default, skip_serializing_if = "is_false")]
    pub indx0: bool,
}

impl PlanMember {
    /// A member named by node.
    pub fn node(name: &str) -> Self {
        PlanMember {
            node: Some(name.to_string()),
            guid: None,
            group: None,
            membership: None,
            indx0: false,
        }
    }

    /// A member named by port GUID.
    pub fn guid(g: Guid) -> Self {
        PlanMember {
            node: None,
            guid: Some(g),
            group: None,
            membership: None,
            indx0: false,
        }
    }

    /// A member named by group keyword.
    pub fn group(g: Group) -> Self {
        PlanMember {
            node: None,
            guid: None,
            group: Some(g),
            membership: None,
            indx0: false,
        }
    }

    fn names_one(&self) -> bool {
        usize::from(self.node.is_some())
            + usize::from(self.guid.is_some())
            + usize::from(self.group.is_some())
            == 1
    }
}

with_group_options! {
    /// One `[[partition]]`.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct PlanPartition {
        /// Partition name, as written in partitions.conf.
        pub name: String,
        /// Tenant that owns it.
        pub tenant: String,
        /// Its P_Key (`"0x0b0b"` or `0x0b0b`); allocated by [`crate::compile`] when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pkey: Option<PKey>,
        /// Create the IPoIB broadcast group.
        #[serde(default, skip_serializing_if = "is_false")]
        pub ipoib: bool,
        /// Put the key at index 0 of every member's table (see also [`PlanMember::indx0`]).
        #[serde(default, skip_serializing_if = "is_false")]
        pub indx0: bool,
        ..GroupOptions #[serde(default, skip_serializing_if = "Option::is_none")],
        /// Membership of members that name none (OpenSM's `defmember`); full unless said otherwise.
        #[serde(default = "full", skip_serializing_if = "is_full")]
        pub membership: Membership,
        /// The members, in order (later entries override earlier ones for the ports they
        /// share, as in OpenSM).
        #[serde(default)]
        pub members: Vec<PlanMember>,
        /// Multicast groups OpenSM creates up front (`mgid=` lines), `[[partition.mcast]]`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub mcast: Vec<McastGroup>,
    }
}

impl PlanPartition {
    /// A partition with no members, options or key.
    pub fn new(name: &str, tenant: &str) -> Self {
        PlanPartition {
            name: name.to_string(),
            tenant: tenant.to_string(),
            pkey: None,
            ipoib: false,
            indx0: false,
            mtu: None,
            rate: None,
            sl: None,
            scope: None,
            qkey: None,
            tclass: None,
            flow_label: None,
            membership: Membership::Full,
            members: Vec::new(),
            mcast: Vec::new(),
        }
    }
}

fn full() -> Membership {
    Membership::Full
}

/// The operator's intent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPlan {
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

impl FabricPlan {
    /// Reads a plan. Unknown keys are refused, naming the key.
    pub fn from_toml(text: &str) -> Result<FabricPlan, PlanError> {
        let plan: FabricPlan = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
            PlanError::Toml {
                line,
                column,
                message: e.message().trim().to_string(),
            }
        })?;
        let mut bad = Vec::new();
        for (name, members) in plan
            .partitions
            .iter()
            .map(|p| (p.name.as_str(), &p.members))
            .chain(std::iter::once(("Default", &plan.default.members)))
        {
            if members.iter().any(|m| !m.names_one()) {
                bad.push(format!("partition `{name}`"));
            }
        }
        if !bad.is_empty() {
            return Err(PlanError::Invalid(format!(
                "{}: each member names exactly one of `node`, `guid` or `group`",
                bad.join(", ")
            )));
        }
        // A custom Default may be empty: OpenSM then gives every port the limited key
        // and the SM port the full one, as it does with no Default statement.
        if plan.default.policy != DefaultPolicy::Custom && !plan.default.members.is_empty() {
            return Err(PlanError::Invalid(
                "[default]: `members` is only for policy = \"custom\"".into(),
            ));
        }
        Ok(plan)
    }

    /// Writes the plan as TOML that [`FabricPlan::from_toml`] reads back to the same plan.
    pub fn to_toml(&self) -> String {
        // Plain data with string keys: serialization cannot fail; fall back to a comment.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write plan: {e}\n"))
    }
}
