//! Identifiers and inventory: GUIDs, P_Keys, memberships, ports.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Errors from building identifiers out of numbers or text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    /// A P_Key that is out of range or not a number.
    #[error("invalid P_Key `{text}`: {reason}")]
    PKey {
        /// The value as given.
        text: String,
        /// Why it was refused.
        reason: String,
    },
    /// A GUID that is not a number of the accepted forms.
    #[error("invalid GUID `{text}`: {reason}")]
    Guid {
        /// The value as given.
        text: String,
        /// Why it was refused.
        reason: String,
    },
    /// A membership word other than `full`, `limited` or `both`.
    #[error("invalid membership `{0}`: expected `full`, `limited` or `both`")]
    Membership(String),
    /// A node type word other than `ca`, `switch` or `router`.
    #[error("invalid node type `{0}`: expected `ca`, `switch` or `router`")]
    NodeType(String),
}

/// Parses a number the way weft accepts them in partitions.conf and plans:
/// `0x`-prefixed hex, or decimal without a leading zero (OpenSM's `strtoul(.., 0)`
/// would read `010` as octal 8, so a leading zero is refused).
pub(crate) fn parse_number(text: &str) -> Result<u64, String> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err("no hex digits after `0x`".into());
        }
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("not a hex number".into());
        }
        if hex.trim_start_matches('0').len() > 16 {
            return Err("more than 64 bits".into());
        }
        return u64::from_str_radix(hex, 16).map_err(|e| e.to_string());
    }
    if text.is_empty() {
        return Err("empty".into());
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a number (write hex with a `0x` prefix, or decimal)".into());
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err("leading zero: OpenSM would read it as octal; write hex with `0x`".into());
    }
    text.parse::<u64>().map_err(|_| "more than 64 bits".into())
}

/// A 64-bit GUID (port or node). Text form: `0x` and 16 hex digits.
///
/// [`FromStr`] accepts `0x0002c90300000101`, decimal, and the sysfs form
/// `0002:c903:0000:0101`. Zero is refused: no port has GUID 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Guid(pub u64);

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

impl FromStr for Guid {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| FabricError::Guid {
            text: s.to_string(),
            reason: reason.to_string(),
        };
        let value = if s.contains(':') {
            let groups: Vec<&str> = s.split(':').collect();
            if groups.len() != 4
                || groups
                    .iter()
                    .any(|g| g.len() != 4 || !g.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return Err(err(
                    "the sysfs form is four groups of four hex digits, `0002:c903:0000:0101`",
                ));
            }
            u64::from_str_radix(&groups.concat(), 16).map_err(|e| err(&e.to_string()))?
        } else {
            parse_number(s).map_err(|r| err(&r))?
        };
        if value == 0 {
            return Err(err("zero is not a valid GUID"));
        }
        Ok(Guid(value))
    }
}

impl Serialize for Guid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Guid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A partition key: the 15-bit base, 0x0001..=0x7fff. The membership bit (bit 15)
/// is not part of it; [`PKey::full`] and [`PKey::limited`] give the 16-bit table entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PKey(u16);

impl PKey {
    /// The Default partition, 0x7fff.
    pub const DEFAULT: PKey = PKey(0x7fff);

    /// Checks the range: 0x0000 is invalid, and any value with bit 15 set is refused
    /// (bit 15 is the membership bit, not part of the key; OpenSM would silently mask it).
    pub fn new(value: u16) -> Result<PKey, FabricError> {
        let err = |reason: &str| FabricError::PKey {
            text: format!("0x{value:04x}"),
            reason: reason.to_string(),
        };
        if value == 0 {
            return Err(err("0x0000 is not a valid P_Key"));
        }
        if value & 0x8000 != 0 {
            return Err(err(
                "bit 15 is the membership bit, not part of the key; write the 15-bit base (0x0001..=0x7fff)",
            ));
        }
        Ok(PKey(value))
    }

    /// The 15-bit base.
    pub fn base(self) -> u16 {
        self.0
    }

    /// The table entry of a full member: base | 0x8000.
    pub fn full(self) -> u16 {
        self.0 | 0x8000
    }

    /// The table entry of a limited member: the base, bit 15 clear.
    pub fn limited(self) -> u16 {
        self.0
    }

    /// True for 0x7fff.
    pub fn is_default(self) -> bool {
        self == PKey::DEFAULT
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

impl FromStr for PKey {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| FabricError::PKey {
            text: s.to_string(),
            reason,
        };
        let value = parse_number(s).map_err(err)?;
        if value > 0xffff {
            return Err(err("more than 16 bits".into()));
        }
        // Checked just above: value fits in 16 bits.
        let value = value as u16;
        PKey::new(value).map_err(|e| match e {
            FabricError::PKey { reason, .. } => err(reason),
            other => other,
        })
    }
}

impl Serialize for PKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Reads a P_Key from text (`"0x0b0b"`) or from an integer (TOML `pkey = 0x0b0b`).
struct PKeyVisitor;

impl serde::de::Visitor<'_> for PKeyVisitor {
    type Value = PKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a P_Key, 0x0001..=0x7fff, as a string (\"0x0b0b\") or an integer (0x0b0b)")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PKey, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<PKey, E> {
        let value = u16::try_from(v).map_err(|_| {
            E::custom(FabricError::PKey {
                text: format!("{v:#x}"),
                reason: "more than 16 bits".into(),
            })
        })?;
        PKey::new(value).map_err(E::custom)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PKey, E> {
        match u64::try_from(v) {
            Ok(u) => self.visit_u64(u),
            Err(_) => Err(E::custom(FabricError::PKey {
                text: v.to_string(),
                reason: "negative".into(),
            })),
        }
    }
}

impl<'de> Deserialize<'de> for PKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PKeyVisitor)
    }
}

/// Membership of a port in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Membership {
    /// May talk to every member (bit 15 set in the table entry).
    Full,
    /// May talk to full members only.
    Limited,
    /// Full, and limited too where OpenSM runs with `allow_both_pkeys`.
    Both,
}

impl Membership {
    /// The word in partitions.conf.
    pub fn as_str(self) -> &'static str {
        match self {
            Membership::Full => "full",
            Membership::Limited => "limited",
            Membership::Both => "both",
        }
    }
}

impl fmt::Display for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Membership {
    type Err = FabricError;

    /// Exact words only: OpenSM also takes prefixes (`limi`) and treats unknown
    /// words as `limited`; weft refuses both.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full" => Ok(Membership::Full),
            "limited" => Ok(Membership::Limited),
            "both" => Ok(Membership::Both),
            _ => Err(FabricError::Membership(s.to_string())),
        }
    }
}

/// What kind of node a port belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    /// Channel adapter (HCA).
    Ca,
    /// Switch (its port 0 is the managed end port).
    Switch,
    /// Router.
    Router,
}

impl FromStr for NodeType {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ca" => Ok(NodeType::Ca),
            "switch" => Ok(NodeType::Switch),
            "router" => Ok(NodeType::Router),
            _ => Err(FabricError::NodeType(s.to_string())),
        }
    }
}

/// One end port (or switch port 0) as the fabric reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// GUID of the node (HCA or switch).
    pub node_guid: Guid,
    /// GUID of this port; what partitions.conf names.
    pub port_guid: Guid,
    /// Port number on the node (0 for a switch's management port).
    pub port_num: u8,
    /// LID assigned by the SM (0 when none yet).
    pub lid: u16,
    /// Kind of node.
    pub node_type: NodeType,
    /// NodeDescription, for example `node1 mlx5_0`.
    pub node_desc: String,
    /// Number of P_Key table entries the port has.
    pub pkey_capacity: u16,
}

/// What the fabric has.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Inventory {
    /// Every end port, CA and router ports and switch port 0.
    pub ports: Vec<Port>,
    /// Port of the MASTER SM; `SELF` in partitions.conf resolves to it.
    pub sm_port_guid: Option<Guid>,
}

impl Inventory {
    /// The port with this port GUID.
    pub fn port(&self, g: Guid) -> Option<&Port> {
        self.ports.iter().find(|p| p.port_guid == g)
    }

    /// Ports whose node description is `node_desc`, or whose first word is
    /// (`node1` matches `node1 mlx5_0`, as Linux hosts describe their HCAs).
    pub fn ports_of_node(&self, node_desc: &str) -> Vec<&Port> {
        self.ports
            .iter()
            .filter(|p| node_matches(&p.node_desc, node_desc))
            .collect()
    }
}

pub(crate) fn node_matches(desc: &str, name: &str) -> bool {
    desc == name || desc.split_whitespace().next() == Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0x10"), Ok(16));
        assert_eq!(parse_number("10"), Ok(10));
        assert_eq!(parse_number("0"), Ok(0));
        assert!(parse_number("010").unwrap_err().contains("octal"));
        assert!(parse_number("0x").is_err());
        assert!(parse_number("-1").is_err());
        assert!(parse_number("0x1ffffffffffffffff").is_err());
        assert_eq!(parse_number("0x0000000000000000001"), Ok(1));
    }

    #[test]
    fn membership_words_are_exact() {
        assert_eq!("both".parse::<Membership>(), Ok(Membership::Both));
        assert!("limi".parse::<Membership>().is_err());
        assert!("Full".parse::<Membership>().is_err());
    }

    #[test]
    fn node_names_match_first_word() {
        assert!(node_matches("node1 mlx5_0", "node1"));
        assert!(node_matches("node1", "node1"));
        assert!(!node_matches("node10 mlx5_0", "node1"));
    }
}
