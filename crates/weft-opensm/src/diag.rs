//! Reading the fabric through the InfiniBand diagnostic tools.
//!
//! `ibnetdiscover` gives every node, port, GUID and LID in one directed-route walk;
//! `smpquery pkeys LID PORT` reads one port's P_Key table and its capacity with SMPs;
//! `sminfo` names the master SM. SMPs are used rather than SA queries on purpose: they
//! need no SA key and read what the ports hold, not what the SM believes it wrote.
//!
//! The tables and the master are read with one in-process SMP client
//! ([`crate::SmpReader`]) when it can attach (the kernel's umad device, or the ibsim
//! that the tools' environment names), and with `smpquery` and `sminfo`, one process
//! per port, when it cannot; [`TableReader`] says which ran.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use std::time::Duration;

use weft_fabric::{Guid, Inventory, NodeType, ObservedTables, Port};

use crate::process::{Invocation, ProcessError, run_bounded};
use crate::smp::{SmpError, SmpPath, SmpReader};

/// A diagnostic tool failed, or printed something this module cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("SMP read: {0}")]
    Smp(#[from] SmpError),
    #[error("cannot read the output of `{tool}`, line {line}: {message}")]
    Parse {
        tool: &'static str,
        line: usize,
        message: String,
    },
}

/// How to run the diagnostic tools: extra environment (on a simulated fabric the
/// umad2sim preload), a working directory, a per-call timeout and a parallelism bound.
#[derive(Debug, Clone)]
pub struct DiagTools {
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub timeout: Duration,
    /// At most this many tools run at once (an ibsim fabric serves only 10 clients).
    pub parallel: usize,
}

impl Default for DiagTools {
    fn default() -> Self {
        DiagTools {
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_secs(10),
            parallel: 4,
        }
    }
}

/// The fabric as read at one moment: who is there and what their P_Key tables hold.
#[derive(Debug, Clone)]
pub struct FabricSnapshot {
    pub inventory: Inventory,
    pub tables: ObservedTables,
    /// How the tables and the master SM were read.
    pub read_by: TableReader,
}

/// How P_Key tables were read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TableReader {
    /// One in-process SMP client for every port.
    Smp { path: String },
    /// `smpquery pkeys`, one process per port, because the one-client path could not
    /// be used (`reason`).
    Smpquery { reason: String },
}

impl std::fmt::Display for TableReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableReader::Smp { path } => write!(f, "one SMP client ({path})"),
            TableReader::Smpquery { reason } => write!(f, "smpquery per port ({reason})"),
        }
    }
}

/// Tables read, with how.
#[derive(Debug, Clone)]
pub struct TablesRead {
    /// Each port's table (holes as 0x0000, up to its capacity) and capacity.
    pub tables: BTreeMap<Guid, (Vec<u16>, u16)>,
    pub read_by: TableReader,
}

impl DiagTools {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, DiagError> {
        let inv = Invocation {
            env: &self.env,
            cwd: self.cwd.as_deref(),
            timeout: self.timeout,
        };
        Ok(run_bounded(program, args, &inv)?)
    }

    /// The GUID of the master SM's port: with the SMP client (the SMInfo at the local
    /// port's MasterSMLID), or from `sminfo` when the client cannot attach or read.
    pub fn master_sm(&self) -> Result<Guid, DiagError> {
        match self.smp_reader().and_then(|mut r| r.master_sm()) {
            Ok(guid) => Ok(Guid(guid)),
            Err(e) => {
                tracing::debug!("asking sminfo for the master SM: {e}");
                self.sminfo()
            }
        }
    }

    /// The GUID of the master SM's port, from `sminfo`.
    fn sminfo(&self) -> Result<Guid, DiagError> {
        parse_sminfo(&self.run("sminfo", &[])?)
    }

    /// The one-client SMP reader for these tools' fabric, or why there is none.
    pub fn smp_reader(&self) -> Result<SmpReader, SmpError> {
        let path = SmpPath::from_env(&self.env)
            .ok_or_else(|| SmpError::Unavailable("WEFT_SMP=off".into()))?;
        SmpReader::open(&path, self.timeout)
    }

    /// The switch each end port is cabled to ([`parse_uplinks`]), from one `ibnetdiscover`.
    pub fn uplinks(&self) -> Result<std::collections::BTreeMap<Guid, String>, DiagError> {
        Ok(parse_uplinks(&self.run("ibnetdiscover", &[])?))
    }

    /// Every node and port, the master SM, and every end port's P_Key table.
    pub fn snapshot(&self) -> Result<FabricSnapshot, DiagError> {
        let mut ports = parse_ibnetdiscover(&self.run("ibnetdiscover", &[])?)?;
        let by_smp = self.smp_reader().and_then(|mut reader| {
            let master = Guid(reader.master_sm()?);
            Ok((master, self.tables_by_smp(&mut reader, &ports)?))
        });
        let (sm_port_guid, read) = match by_smp {
            Ok(done) => done,
            Err(e) => (self.sminfo()?, self.tables_by_tools(&ports, e)?),
        };
        for port in &mut ports {
            if let Some((_, capacity)) = read.tables.get(&port.port_guid) {
                port.pkey_capacity = *capacity;
            }
        }
        let tables = ObservedTables(read.tables.into_iter().map(|(g, (t, _))| (g, t)).collect());
        Ok(FabricSnapshot {
            inventory: Inventory {
                ports,
                sm_port_guid: Some(sm_port_guid),
            },
            tables,
            read_by: read.read_by,
        })
    }

    /// Reads the P_Key tables (with capacities) of `ports`: with one SMP client when it
    /// attaches and reads, else with `smpquery`, a few processes at a time.
    pub fn read_tables(&self, ports: &[Port]) -> Result<TablesRead, DiagError> {
        let by_smp = self
            .smp_reader()
            .and_then(|mut reader| self.tables_by_smp(&mut reader, ports));
        match by_smp {
            Ok(read) => Ok(read),
            Err(e) => self.tables_by_tools(ports, e),
        }
    }

    fn tables_by_smp(
        &self,
        reader: &mut SmpReader,
        ports: &[Port],
    ) -> Result<TablesRead, SmpError> {
        let addrs: Vec<(u16, u8)> = ports.iter().map(|p| (p.lid, p.port_num)).collect();
        let tables = reader.read_tables(&addrs)?;
        Ok(TablesRead {
            tables: ports.iter().map(|p| p.port_guid).zip(tables).collect(),
            read_by: TableReader::Smp {
                path: reader.path().to_string(),
            },
        })
    }

    /// The fallback: `smpquery pkeys` per port; `why` is why the SMP client was not used.
    fn tables_by_tools(&self, ports: &[Port], why: SmpError) -> Result<TablesRead, DiagError> {
        if matches!(why, SmpError::Unavailable(_)) {
            tracing::debug!("reading P_Key tables with smpquery: {why}");
        } else {
            tracing::warn!("the SMP client failed ({why}); reading P_Key tables with smpquery");
        }
        let chunk = ports.len().div_ceil(self.parallel.max(1)).max(1);
        let tables = std::thread::scope(|s| {
            let workers: Vec<_> = ports
                .chunks(chunk)
                .map(|group| {
                    s.spawn(move || {
                        group
                            .iter()
                            .map(|p| {
                                let lid = p.lid.to_string();
                                let num = p.port_num.to_string();
                                let out = self.run("smpquery", &["pkeys", &lid, &num])?;
                                Ok((p.port_guid, parse_smpquery_pkeys(&out)?))
                            })
                            .collect::<Result<Vec<_>, DiagError>>()
                    })
                })
                .collect();
            let mut all = BTreeMap::new();
            for w in workers {
                let part = w.join().map_err(|_| DiagError::Parse {
                    tool: "smpquery",
                    line: 0,
                    message: "a reader thread panicked".into(),
                })??;
                all.extend(part);
            }
            Ok::<_, DiagError>(all)
        })?;
        Ok(TablesRead {
            tables,
            read_by: TableReader::Smpquery {
                reason: why.to_string(),
            },
        })
    }
}

fn parse_err(tool: &'static str, line: usize, message: impl Into<String>) -> DiagError {
    DiagError::Parse {
        tool,
        line,
        message: message.into(),
    }
}

fn hex_u64(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    u64::from_str_radix(t, 16).ok()
}

/// `sminfo: sm lid 1 sm guid 0x2c90300000a01, activity count 83 priority 10 state 3 SMINFO_MASTER`
pub fn parse_sminfo(text: &str) -> Result<Guid, DiagError> {
    let after = text
        .split_once("sm guid ")
        .map(|(_, rest)| rest)
        .ok_or_else(|| parse_err("sminfo", 1, "no `sm guid` in the output"))?;
    let word = after.split([',', ' ']).next().unwrap_or_default();
    hex_u64(word)
        .map(Guid)
        .ok_or_else(|| parse_err("sminfo", 1, format!("`{word}` is not a GUID")))
}

/// The lines of `smpquery pkeys`: `   0: 0x7fff 0x0a0a ...` and `64 pkeys capacity for this port`.
pub fn parse_smpquery_pkeys(text: &str) -> Result<(Vec<u16>, u16), DiagError> {
    let mut table = Vec::new();
    let mut capacity = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(n) = line.strip_suffix("pkeys capacity for this port") {
            capacity = Some(
                n.trim()
                    .parse::<u16>()
                    .map_err(|_| parse_err("smpquery", i + 1, format!("bad capacity `{n}`")))?,
            );
        } else if let Some((_, values)) = line.split_once(':') {
            for v in values.split_whitespace() {
                let key = hex_u64(v)
                    .and_then(|k| u16::try_from(k).ok())
                    .ok_or_else(|| parse_err("smpquery", i + 1, format!("bad P_Key `{v}`")))?;
                table.push(key);
            }
        }
    }
    let capacity = capacity.ok_or_else(|| parse_err("smpquery", 0, "no capacity line"))?;
    table.truncate(usize::from(capacity));
    Ok((table, capacity))
}

/// The quoted description after `#` on a node line: `Ca 2 "H-..."  # "node2"`.
fn comment_desc(line: &str) -> Option<String> {
    let (_, comment) = line.split_once('#')?;
    let start = comment.find('"')? + 1;
    let len = comment[start..].find('"')?;
    Some(comment[start..start + len].to_string())
}

/// The number after `key` in a whitespace-separated comment: `lid 4` gives 4.
fn comment_number(line: &str, key: &str) -> Option<u16> {
    let (_, comment) = line.split_once('#')?;
    let mut words = comment.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// The switch each CA and router port is cabled to, from `ibnetdiscover` output: port
/// GUID to the switch's node description (its `S-<guid>` name when it has none). A port
/// cabled to something other than a switch is left out.
pub fn parse_uplinks(text: &str) -> std::collections::BTreeMap<Guid, String> {
    let mut names: std::collections::BTreeMap<String, String> = Default::default();
    let mut links: Vec<(Guid, String)> = Vec::new();
    let mut in_end_node = false;
    for raw in text.lines() {
        let line = raw.trim();
        let first = line.split_whitespace().next().unwrap_or_default();
        match first {
            "Switch" => {
                in_end_node = false;
                if let Some(id) = line.split('"').nth(1) {
                    let desc = comment_desc(line).unwrap_or_else(|| id.to_string());
                    names.insert(id.to_string(), desc);
                }
                continue;
            }
            "Ca" | "Rt" => {
                in_end_node = true;
                continue;
            }
            _ => {}
        }
        if !in_end_node || !line.starts_with('[') {
            continue;
        }
        // `[1](2c90300000201) 	"S-0002c90300001000"[4] # lid 4 ...`
        let Some(rest) = line.split_once(']').map(|(_, r)| r) else {
            continue;
        };
        let Some((guid, after)) = rest.strip_prefix('(').and_then(|r| r.split_once(')')) else {
            continue;
        };
        let (Some(g), Some(peer)) = (hex_u64(guid), after.split('"').nth(1)) else {
            continue;
        };
        if peer.starts_with("S-") {
            links.push((Guid(g), peer.to_string()));
        }
    }
    links
        .into_iter()
        .map(|(g, peer)| {
            let name = names.get(&peer).cloned().unwrap_or(peer);
            (g, name)
        })
        .collect()
}

/// Every CA and router port, and every switch's port 0, from `ibnetdiscover` output.
///
/// Capacities are not in this output; they are left at 0 until the tables are read.
pub fn parse_ibnetdiscover(text: &str) -> Result<Vec<Port>, DiagError> {
    const TOOL: &str = "ibnetdiscover";
    let mut ports = Vec::new();
    // The node whose port lines follow: its GUID, type and description.
    let mut current: Option<(Guid, NodeType, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let first = line.split_whitespace().next().unwrap_or_default();
        let node_type = match first {
            "Switch" => Some(NodeType::Switch),
            "Ca" => Some(NodeType::Ca),
            "Rt" => Some(NodeType::Router),
            _ => None,
        };
        if let Some(node_type) = node_type {
            let quoted = line
                .split('"')
                .nth(1)
                .ok_or_else(|| parse_err(TOOL, i + 1, "node line without a name"))?;
            let guid = quoted
                .get(2..)
                .and_then(hex_u64)
                .ok_or_else(|| parse_err(TOOL, i + 1, format!("bad node name `{quoted}`")))?;
            let desc = comment_desc(line).unwrap_or_else(|| quoted.to_string());
            if node_type == NodeType::Switch {
                let lid = comment_number(line, "lid")
                    .ok_or_else(|| parse_err(TOOL, i + 1, "switch line without a lid"))?;
                ports.push(Port {
                    node_guid: Guid(guid),
                    port_guid: Guid(guid),
                    port_num: 0,
                    lid,
                    node_type,
                    node_desc: desc.clone(),
                    pkey_capacity: 0,
                });
            }
            current = Some((Guid(guid), node_type, desc));
            continue;
        }
        if line.is_empty() {
            current = None;
            continue;
        }
        // A CA or router port: `[1](2c90300000201)  "S-..."[4]  # lid 4 lmc 0 ...`
        let Some((node_guid, node_type, desc)) = &current else {
            continue;
        };
        if *node_type == NodeType::Switch || !line.starts_with('[') {
            continue;
        }
        let close = line
            .find(']')
            .ok_or_else(|| parse_err(TOOL, i + 1, "port line without `]`"))?;
        let port_num: u8 = line[1..close]
            .parse()
            .map_err(|_| parse_err(TOOL, i + 1, "bad port number"))?;
        let rest = &line[close + 1..];
        let guid_text = rest
            .strip_prefix('(')
            .and_then(|r| r.split_once(')'))
            .map(|(g, _)| g)
            .ok_or_else(|| parse_err(TOOL, i + 1, "port line without a port GUID"))?;
        let port_guid = hex_u64(guid_text)
            .ok_or_else(|| parse_err(TOOL, i + 1, format!("bad port GUID `{guid_text}`")))?;
        let lid = comment_number(line, "lid")
            .ok_or_else(|| parse_err(TOOL, i + 1, "port line without a lid"))?;
        ports.push(Port {
            node_guid: *node_guid,
            port_guid: Guid(port_guid),
            port_num,
            lid,
            node_type: *node_type,
            node_desc: desc.clone(),
            pkey_capacity: 0,
        });
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    const IBNETDISCOVER: &str = r#"#
# Topology file: generated on Sun Nov 29 07:10:33 2026
#
vendid=0x0
devid=0x0
sysimgguid=0x2c90300001000
switchguid=0x2c90300001000(2c90300001000)
Switch	8 "S-0002c90300001000"		# "sw1" base port 0 lid 2 lmc 0
[1]	"H-0002c90300000a00"[1](2c90300000a01) 		# "smhost" lid 1 4xSDR
[4]	"H-0002c90300000200"[1](2c90300000201) 		# "node2" lid 4 4xSDR

vendid=0x0
devid=0x0
sysimgguid=0x2c90300000200
caguid=0x2c90300000200
Ca	2 "H-0002c90300000200"		# "node2"
[1](2c90300000201) 	"S-0002c90300001000"[4]		# lid 4 lmc 0 "sw1" lid 2 4xSDR
[2](2c90300000202) 	"S-0002c90300001000"[5]		# lid 5 lmc 0 "sw1" lid 2 4xSDR

caguid=0x2c90300000a00
Ca	1 "H-0002c90300000a00"		# "smhost"
[1](2c90300000a01) 	"S-0002c90300001000"[1]		# lid 1 lmc 0 "sw1" lid 2 4xSDR
"#;

    #[test]
    fn each_end_port_names_the_switch_it_is_cabled_to() {
        let up = parse_uplinks(IBNETDISCOVER);
        assert_eq!(
            up.into_iter().collect::<Vec<_>>(),
            vec![
                (Guid(0x2c90300000201), "sw1".to_string()),
                (Guid(0x2c90300000202), "sw1".to_string()),
                (Guid(0x2c90300000a01), "sw1".to_string()),
            ]
        );
    }

    #[test]
    fn ibnetdiscover_gives_switch_port_zero_and_every_ca_port() {
        let ports = parse_ibnetdiscover(IBNETDISCOVER).unwrap();
        let seen: Vec<_> = ports
            .iter()
            .map(|p| (p.port_guid.0, p.port_num, p.lid, p.node_desc.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (0x2c90300001000, 0, 2, "sw1"),
                (0x2c90300000201, 1, 4, "node2"),
                (0x2c90300000202, 2, 5, "node2"),
                (0x2c90300000a01, 1, 1, "smhost"),
            ]
        );
        assert_eq!(ports[1].node_guid, Guid(0x2c90300000200));
        assert_eq!(ports[0].node_type, NodeType::Switch);
    }

    #[test]
    fn smpquery_pkeys_reads_table_and_capacity() {
        let text = "   0: 0x7fff 0x0a0a 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000\n\
                    8 pkeys capacity for this port\n";
        let (table, cap) = parse_smpquery_pkeys(text).unwrap();
        assert_eq!(cap, 8);
        assert_eq!(table, vec![0x7fff, 0x0a0a, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn smpquery_pkeys_refuses_garbage_with_the_line() {
        let err =
            parse_smpquery_pkeys("   0: 0x7fff zz\n8 pkeys capacity for this port\n").unwrap_err();
        assert!(err.to_string().contains("line 1") && err.to_string().contains("zz"));
        assert!(parse_smpquery_pkeys("   0: 0x7fff\n").is_err());
    }

    #[test]
    fn sminfo_names_the_master_port() {
        let text = "sminfo: sm lid 1 sm guid 0x2c90300000a01, activity count 83 priority 10 state 3 SMINFO_MASTER\n";
        assert_eq!(parse_sminfo(text).unwrap(), Guid(0x2c90300000a01));
        assert!(parse_sminfo("ibwarn: no SM\n").is_err());
    }
}
