//! Reading P_Key tables and the master SM with SMPs from one client, in this process.
//!
//! `smpquery pkeys` costs one process per port, and on a simulated fabric each process
//! builds umad2sim's fake sysfs tree first: a snapshot of 66 ports was 68 processes and
//! over a second. [`SmpReader`] sends the same subnet management packets that
//! `smpquery pkeys` and `sminfo` send (SubnGet of NodeInfo, SwitchInfo, P_KeyTable,
//! PortInfo and SMInfo) from one management agent, several in flight at once, and
//! matches the answers by transaction id. It reads what the ports hold, as smpquery
//! does: the answers come from the ports' SMAs, not from the SM's database.
//!
//! Two transports carry the packets:
//! - [`SmpPath::Umad`]: the kernel's user MAD device `/dev/infiniband/umadN` (the one
//!   libibumad opens), on real hardware; see the `umad` module.
//! - [`SmpPath::Ibsim`]: the socket protocol of an ibsim simulator (what umad2sim speaks
//!   underneath libibumad), chosen when the diagnostic tools' environment attaches them
//!   to one (`IBSIM_SOCKNAME` and `SIM_HOST`).
//!
//! Every wait is bounded by the reader's timeout.

use std::collections::BTreeMap;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::umad::UmadDevice;

/// Why the one-client reader could not open or could not read.
#[derive(Debug, thiserror::Error)]
pub enum SmpError {
    /// No device or simulator to attach to (the caller falls back to the tools).
    #[error("no SMP path: {0}")]
    Unavailable(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer within {timeout:?} to {what}")]
    Timeout { what: String, timeout: Duration },
    /// The port answered with a non-zero MAD status (or the transport gave the packet
    /// back unsent).
    #[error("{what}: refused with status {status:#06x}")]
    Refused { what: String, status: u16 },
    #[error("{0}")]
    Protocol(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SmpError {
    let what = what.into();
    move |source| SmpError::Io { what, source }
}

/// Where the reader's packets go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SmpPath {
    /// A kernel user MAD device; `None` picks the first port whose state is ACTIVE, as
    /// the diagnostic tools do without `-C`/`-P`.
    Umad { device: Option<PathBuf> },
    /// An ibsim simulator (`IBSIM_SOCKNAME`), attached at the node `host` (`SIM_HOST`).
    Ibsim { sockname: String, host: String },
}

impl SmpPath {
    /// The path the diagnostic tools with environment `env` would take: ibsim when the
    /// environment attaches them to one, the kernel device otherwise. `WEFT_SMP` in `env`
    /// overrides: `off` (no reader: the caller uses the tools), or a device path.
    pub fn from_env(env: &[(String, String)]) -> Option<SmpPath> {
        let get = |k: &str| env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v);
        match get("WEFT_SMP").map(String::as_str) {
            Some("off") => return None,
            Some(device) if !device.is_empty() => {
                return Some(SmpPath::Umad {
                    device: Some(PathBuf::from(device)),
                });
            }
            _ => {}
        }
        match (get("IBSIM_SOCKNAME"), get("SIM_HOST")) {
            (Some(sockname), Some(host)) => Some(SmpPath::Ibsim {
                sockname: sockname.clone(),
                host: host.clone(),
            }),
            _ => Some(SmpPath::Umad { device: None }),
        }
    }
}

impl std::fmt::Display for SmpPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SmpPath::Umad { device: Some(d) } => write!(f, "umad {}", d.display()),
            SmpPath::Umad { device: None } => write!(f, "umad (first active port)"),
            SmpPath::Ibsim { sockname, host } => write!(f, "ibsim {sockname} at {host}"),
        }
    }
}

/// The size of a MAD, and of the SMP data field inside it.
pub(crate) const MAD_SIZE: usize = 256;
const SMP_DATA: std::ops::Range<usize> = 64..128;

const CLASS_SMI_LID: u8 = 0x01;
const CLASS_SMI_DR: u8 = 0x81;
const METHOD_GET: u8 = 0x01;
const METHOD_GET_RESP: u8 = 0x81;
const ATTR_NODE_INFO: u16 = 0x0011;
const ATTR_SWITCH_INFO: u16 = 0x0012;
const ATTR_PORT_INFO: u16 = 0x0015;
const ATTR_PKEY_TABLE: u16 = 0x0016;
const ATTR_SM_INFO: u16 = 0x0020;
/// The permissive LID: a directed-route SMP's address.
const PERMISSIVE_LID: u16 = 0xffff;
/// How many SMPs are in flight at once (ibsim's socket queues hold 10 datagrams).
const WINDOW: usize = 8;

/// One packet carrier: sends a MAD to a LID over QP0, hands back answers.
pub(crate) trait MadCarrier {
    fn send(&mut self, dlid: u16, mad: &[u8; MAD_SIZE]) -> Result<(), SmpError>;
    /// The next packet for this client within `wait`; `None` when none came. A packet
    /// the transport could not deliver comes back as `Err` only when it cannot say
    /// which one; otherwise as an answer with a non-zero status in [`Answer::status`].
    fn recv(&mut self, wait: Duration) -> Result<Option<Answer>, SmpError>;
}

/// A packet back from the transport: the MAD and the transport's own status (non-zero:
/// the request was not delivered or not answered, and `mad` is the request).
pub(crate) struct Answer {
    pub mad: [u8; MAD_SIZE],
    pub status: u32,
}

/// One SubnGet: where to, which attribute and modifier.
#[derive(Debug, Clone, Copy)]
struct Get {
    lid: u16,
    attr: u16,
    modifier: u32,
    /// Directed route with no hops (the local port) instead of LID-routed.
    local: bool,
}

impl Get {
    fn what(&self) -> String {
        let name = match self.attr {
            ATTR_NODE_INFO => "NodeInfo",
            ATTR_SWITCH_INFO => "SwitchInfo",
            ATTR_PORT_INFO => "PortInfo",
            ATTR_PKEY_TABLE => "P_KeyTable",
            ATTR_SM_INFO => "SMInfo",
            _ => "attribute",
        };
        if self.local {
            format!("SubnGet({name}) of the local port")
        } else {
            format!(
                "SubnGet({name}, modifier {:#x}) to LID {}",
                self.modifier, self.lid
            )
        }
    }

    fn encode(&self, tid: u32) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        mad[0] = 1; // base version
        mad[1] = if self.local {
            CLASS_SMI_DR
        } else {
            CLASS_SMI_LID
        };
        mad[2] = 1; // class version
        mad[3] = METHOD_GET;
        // The high 32 bits of the TID belong to the transport (the kernel puts the
        // agent's id there); this client's own id is the low 32.
        mad[8..16].copy_from_slice(&u64::from(tid).to_be_bytes());
        mad[16..18].copy_from_slice(&self.attr.to_be_bytes());
        mad[20..24].copy_from_slice(&self.modifier.to_be_bytes());
        if self.local {
            // Hop pointer and hop count 0; DrSLID and DrDLID permissive.
            mad[32..34].copy_from_slice(&PERMISSIVE_LID.to_be_bytes());
            mad[34..36].copy_from_slice(&PERMISSIVE_LID.to_be_bytes());
        }
        mad
    }

    fn dlid(&self) -> u16 {
        if self.local { PERMISSIVE_LID } else { self.lid }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// One client's SMP conversation with the fabric.
pub struct SmpReader {
    transport: Box<dyn MadCarrier + Send>,
    path: SmpPath,
    timeout: Duration,
    tid: u32,
}

impl std::fmt::Debug for SmpReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmpReader")
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A port's P_Key table, holes as 0x0000, truncated to its capacity, and the capacity.
pub type PkeyTable = (Vec<u16>, u16);

impl SmpReader {
    /// Attaches one client at `path`; every wait is bounded by `timeout` (per batch of
    /// packets in flight, as `smpquery` bounds each of its packets).
    pub fn open(path: &SmpPath, timeout: Duration) -> Result<SmpReader, SmpError> {
        let transport: Box<dyn MadCarrier + Send> = match path {
            SmpPath::Umad { device } => Box::new(UmadDevice::open(device.as_deref())?),
            SmpPath::Ibsim { sockname, host } => {
                Box::new(IbsimClient::connect(sockname, host, timeout)?)
            }
        };
        Ok(SmpReader {
            transport,
            path: path.clone(),
            timeout,
            tid: 0,
        })
    }

    /// Where this reader's packets go.
    pub fn path(&self) -> &SmpPath {
        &self.path
    }

    /// Sends every request, at most [`WINDOW`] in flight, and returns the SMP data of
    /// each answer in request order (`Err` for a request refused or unanswered).
    fn batch(&mut self, gets: &[Get]) -> Result<Vec<Result<[u8; 64], SmpError>>, SmpError> {
        let mut out: Vec<Option<Result<[u8; 64], SmpError>>> =
            std::iter::repeat_with(|| None).take(gets.len()).collect();
        let mut in_flight: BTreeMap<u32, usize> = BTreeMap::new();
        let mut next = 0;
        let mut deadline = Instant::now() + self.timeout;
        while next < gets.len() || !in_flight.is_empty() {
            while next < gets.len() && in_flight.len() < WINDOW {
                self.tid = self.tid.wrapping_add(1).max(1);
                let g = &gets[next];
                self.transport.send(g.dlid(), &g.encode(self.tid))?;
                in_flight.insert(self.tid, next);
                next += 1;
            }
            let now = Instant::now();
            if now >= deadline {
                let (_, &i) = in_flight
                    .iter()
                    .next()
                    .ok_or_else(|| SmpError::Protocol("empty batch timed out".into()))?;
                return Err(SmpError::Timeout {
                    what: gets[i].what(),
                    timeout: self.timeout,
                });
            }
            let Some(answer) = self.transport.recv(deadline - now)? else {
                continue;
            };
            let mad = &answer.mad;
            let tid = u32::from_be_bytes([mad[12], mad[13], mad[14], mad[15]]);
            let is_answer = answer.status != 0 || mad[3] == METHOD_GET_RESP;
            let Some(i) = is_answer.then(|| in_flight.remove(&tid)).flatten() else {
                // Not ours (a stray or late packet): ignore it.
                continue;
            };
            // Progress: the bound is per packet, as the tools bound theirs.
            deadline = Instant::now() + self.timeout;
            let g = &gets[i];
            // A directed-route SMP's top status bit is the direction bit.
            let status = be16(mad, 4) & if g.local { 0x7fff } else { 0xffff };
            out[i] = Some(if answer.status != 0 {
                Err(SmpError::Timeout {
                    what: format!("{} (transport status {})", g.what(), answer.status),
                    timeout: self.timeout,
                })
            } else if status != 0 {
                Err(SmpError::Refused {
                    what: g.what(),
                    status,
                })
            } else {
                let mut data = [0u8; 64];
                data.copy_from_slice(&mad[SMP_DATA]);
                Ok(data)
            });
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| SmpError::Protocol("an answer went missing".into())))
            .collect()
    }

    /// The port GUID of the master SM, as `sminfo` reads it: the local port's
    /// MasterSMLID from its PortInfo, then SMInfo at that LID.
    pub fn master_sm(&mut self) -> Result<u64, SmpError> {
        let local = Get {
            lid: 0,
            attr: ATTR_PORT_INFO,
            modifier: 0,
            local: true,
        };
        let port_info = self.one(local)?;
        let sm_lid = be16(&port_info, 18);
        if sm_lid == 0 {
            return Err(SmpError::Protocol(
                "the local port knows no master SM (MasterSMLID 0)".into(),
            ));
        }
        let sm_info = self.one(Get {
            lid: sm_lid,
            attr: ATTR_SM_INFO,
            modifier: 0,
            local: false,
        })?;
        let mut guid = [0u8; 8];
        guid.copy_from_slice(&sm_info[0..8]);
        Ok(u64::from_be_bytes(guid))
    }

    fn one(&mut self, get: Get) -> Result<[u8; 64], SmpError> {
        self.batch(&[get])?
            .pop()
            .ok_or_else(|| SmpError::Protocol("an answer went missing".into()))?
    }

    /// The P_Key table of one port (`port` 0 for a switch's management port, a CA
    /// port's LID with its port number), as `smpquery pkeys LID PORT` reads it.
    pub fn pkeys(&mut self, lid: u16, port: u8) -> Result<PkeyTable, SmpError> {
        self.read_tables(&[(lid, port)])?
            .pop()
            .ok_or_else(|| SmpError::Protocol("a table went missing".into()))
    }

    /// The P_Key tables of `ports` (LID, port number), in order, as `smpquery pkeys`
    /// reads each: the capacity from NodeInfo (SwitchInfo's enforcement capacity for a
    /// switch's external port), then every 32-entry block up to it.
    pub fn read_tables(&mut self, ports: &[(u16, u8)]) -> Result<Vec<PkeyTable>, SmpError> {
        // NodeInfo once per LID.
        let mut lids: Vec<u16> = ports.iter().map(|&(lid, _)| lid).collect();
        lids.sort_unstable();
        lids.dedup();
        let node_gets: Vec<Get> = lids
            .iter()
            .map(|&lid| Get {
                lid,
                attr: ATTR_NODE_INFO,
                modifier: 0,
                local: false,
            })
            .collect();
        let mut nodes = BTreeMap::new();
        for (lid, info) in lids.iter().zip(self.batch(&node_gets)?) {
            let info = info?;
            // NodeType (2 = switch), NumPorts, PartitionCap.
            nodes.insert(*lid, (info[2], info[3], be16(&info, 28)));
        }
        let mut capacity = Vec::with_capacity(ports.len());
        let mut switch_gets = Vec::new();
        for &(lid, port) in ports {
            let &(node_type, num_ports, cap) = nodes
                .get(&lid)
                .ok_or_else(|| SmpError::Protocol(format!("no NodeInfo for LID {lid}")))?;
            if port > num_ports {
                return Err(SmpError::Protocol(format!(
                    "LID {lid} has {num_ports} ports, not port {port}"
                )));
            }
            if node_type == 2 && port != 0 {
                switch_gets.push(Get {
                    lid,
                    attr: ATTR_SWITCH_INFO,
                    modifier: 0,
                    local: false,
                });
            }
            capacity.push(cap);
        }
        // A switch's external ports enforce up to SwitchInfo's PartitionEnforcementCap.
        let mut switch_caps = BTreeMap::new();
        for (g, info) in switch_gets.iter().zip(self.batch(&switch_gets)?) {
            switch_caps.insert(g.lid, be16(&info?, 14));
        }
        for (cap, &(lid, port)) in capacity.iter_mut().zip(ports) {
            if let Some(&c) = switch_caps.get(&lid).filter(|_| port != 0) {
                *cap = c;
            }
        }
        let mut block_gets = Vec::new();
        for (&cap, &(lid, port)) in capacity.iter().zip(ports) {
            for block in 0..u32::from(cap).div_ceil(32) {
                block_gets.push(Get {
                    lid,
                    attr: ATTR_PKEY_TABLE,
                    modifier: block | (u32::from(port) << 16),
                    local: false,
                });
            }
        }
        let mut blocks = self.batch(&block_gets)?.into_iter();
        let mut tables = Vec::with_capacity(ports.len());
        for &cap in &capacity {
            let mut table = Vec::with_capacity(usize::from(cap));
            for _ in 0..u32::from(cap).div_ceil(32) {
                let data = blocks
                    .next()
                    .ok_or_else(|| SmpError::Protocol("a P_Key block went missing".into()))??;
                table.extend(data.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])));
            }
            table.truncate(usize::from(cap));
            tables.push((table, cap));
        }
        Ok(tables)
    }
}

// ---- ibsim's socket protocol ----

const SIM_MAGIC: u32 = 0xdead_beef;
const CTL_ERROR: u32 = 0;
const CTL_CONNECT: u32 = 1;
const CTL_DISCONNECT: u32 = 2;
/// `struct sim_ctl`: magic, clientid, type, len, data[64].
const CTL_SIZE: usize = 16 + 64;
/// `struct sim_request`: dlid, slid, dqp, sqp, status (u32 each), padding, length (u64),
/// mad[256].
const REQ_SIZE: usize = 24 + 8 + MAD_SIZE;
const MAD_AT: usize = 32;

static CLIENT_SEQ: AtomicU32 = AtomicU32::new(0);

/// One client attached to an ibsim fabric, as umad2sim attaches one: it takes one of
/// ibsim's 10 client slots until dropped.
struct IbsimClient {
    ctl: UnixDatagram,
    data: UnixDatagram,
    client: u32,
}

/// ibsim's abstract socket names end in one NUL byte (its `make_name` counts it in the
/// address length).
fn abstract_addr(name: &str) -> Result<SocketAddr, SmpError> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    SocketAddr::from_abstract_name(&bytes).map_err(io(format!("socket name {name}")))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl IbsimClient {
    fn connect(sockname: &str, host: &str, timeout: Duration) -> Result<IbsimClient, SmpError> {
        // ibsim names a client's sockets by the id it is given (umad2sim gives its pid);
        // this one is unique per process and client, above any pid.
        let seq = CLIENT_SEQ.fetch_add(1, Ordering::Relaxed) & 0xff;
        let id = 0x4000_0000 | ((std::process::id() & 0x3f_ffff) << 8) | seq;
        let ctl = UnixDatagram::bind_addr(&abstract_addr(&format!("{sockname}:ctl{id}"))?)
            .map_err(io("bind the ibsim ctl socket"))?;
        let data = UnixDatagram::bind_addr(&abstract_addr(&format!("{sockname}:in{id}"))?)
            .map_err(io("bind the ibsim data socket"))?;
        for s in [&ctl, &data] {
            s.set_read_timeout(Some(timeout))
                .map_err(io("socket timeout"))?;
            s.set_write_timeout(Some(timeout))
                .map_err(io("socket timeout"))?;
        }
        ctl.connect_addr(&abstract_addr(&format!("{sockname}:ctl"))?)
            .map_err(|e| SmpError::Unavailable(format!("ibsim `{sockname}`: {e}")))?;
        // struct sim_client_info: id, qp, issm, nodeid[32].
        let mut info = [0u8; 44];
        info[0..4].copy_from_slice(&id.to_ne_bytes());
        let name = host.as_bytes();
        let n = name.len().min(31);
        info[12..12 + n].copy_from_slice(&name[..n]);
        let reply = ctl_call(&ctl, 0, CTL_CONNECT, &info)?;
        let client = u32_at(&reply, 16);
        data.connect_addr(&abstract_addr(&format!("{sockname}:out{client}"))?)
            .map_err(io("connect the ibsim data socket"))?;
        Ok(IbsimClient { ctl, data, client })
    }
}

impl MadCarrier for IbsimClient {
    fn send(&mut self, dlid: u16, mad: &[u8; MAD_SIZE]) -> Result<(), SmpError> {
        let mut req = [0u8; REQ_SIZE];
        // dlid and slid are network-order 16-bit values in host-order u32 fields; a
        // directed-route packet goes from and to the permissive LID.
        req[0..2].copy_from_slice(&dlid.to_be_bytes());
        if dlid == PERMISSIVE_LID {
            req[4..6].copy_from_slice(&PERMISSIVE_LID.to_be_bytes());
        }
        req[24..32].copy_from_slice(&(MAD_SIZE as u64).to_be_bytes());
        req[MAD_AT..].copy_from_slice(mad);
        self.data
            .send(&req)
            .map_err(io(format!("send an SMP to LID {dlid} through ibsim")))?;
        Ok(())
    }

    fn recv(&mut self, wait: Duration) -> Result<Option<Answer>, SmpError> {
        self.data
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .map_err(io("socket timeout"))?;
        let mut buf = [0u8; 512];
        let n = match self.data.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(io("wait for an SMP answer from ibsim")(e)),
        };
        if n != REQ_SIZE {
            return Ok(None);
        }
        let mut mad = [0u8; MAD_SIZE];
        mad.copy_from_slice(&buf[MAD_AT..REQ_SIZE]);
        Ok(Some(Answer {
            mad,
            status: u32::from_be(u32_at(&buf, 16)),
        }))
    }
}

fn ctl_call(
    ctl: &UnixDatagram,
    client: u32,
    kind: u32,
    data: &[u8],
) -> Result<[u8; CTL_SIZE], SmpError> {
    let mut msg = [0u8; CTL_SIZE];
    msg[0..4].copy_from_slice(&SIM_MAGIC.to_ne_bytes());
    msg[4..8].copy_from_slice(&client.to_ne_bytes());
    msg[8..12].copy_from_slice(&kind.to_ne_bytes());
    let len = data.len().min(64);
    msg[12..16].copy_from_slice(&(len as u32).to_ne_bytes());
    msg[16..16 + len].copy_from_slice(&data[..len]);
    ctl.send(&msg).map_err(io("send to ibsim's ctl socket"))?;
    let mut reply = [0u8; CTL_SIZE];
    let n = ctl
        .recv(&mut reply)
        .map_err(io("wait for ibsim's ctl answer"))?;
    if n != CTL_SIZE || u32_at(&reply, 8) == CTL_ERROR {
        return Err(SmpError::Unavailable(format!(
            "ibsim refused the client request {kind} (all 10 client slots taken, or an unknown host)"
        )));
    }
    Ok(reply)
}

impl Drop for IbsimClient {
    fn drop(&mut self) {
        // Frees the client slot; ibsim answers, and a lost answer changes nothing here.
        let _ = ctl_call(&self.ctl, self.client, CTL_DISCONNECT, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_path_follows_the_tools_environment() {
        assert_eq!(
            SmpPath::from_env(&env(&[("IBSIM_SOCKNAME", "s1"), ("SIM_HOST", "node1")])),
            Some(SmpPath::Ibsim {
                sockname: "s1".into(),
                host: "node1".into()
            })
        );
        assert_eq!(SmpPath::from_env(&[]), Some(SmpPath::Umad { device: None }));
        assert_eq!(
            SmpPath::from_env(&env(&[("IBSIM_SOCKNAME", "s1"), ("WEFT_SMP", "off")])),
            None
        );
        assert_eq!(
            SmpPath::from_env(&env(&[("WEFT_SMP", "/dev/infiniband/umad1")])),
            Some(SmpPath::Umad {
                device: Some("/dev/infiniband/umad1".into())
            })
        );
    }

    #[test]
    fn a_lid_routed_get_carries_attribute_modifier_and_tid() {
        let g = Get {
            lid: 7,
            attr: ATTR_PKEY_TABLE,
            modifier: (2 << 16) | 1,
            local: false,
        };
        let mad = g.encode(0x1234_5678);
        assert_eq!(&mad[0..4], &[1, CLASS_SMI_LID, 1, METHOD_GET]);
        assert_eq!(&mad[8..16], &[0, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
        assert_eq!(be16(&mad, 16), ATTR_PKEY_TABLE);
        assert_eq!(&mad[20..24], &[0, 2, 0, 1]);
        assert_eq!(g.dlid(), 7);
        let local = Get {
            lid: 0,
            attr: ATTR_PORT_INFO,
            modifier: 0,
            local: true,
        };
        let mad = local.encode(1);
        assert_eq!(mad[1], CLASS_SMI_DR);
        assert_eq!((mad[6], mad[7]), (0, 0));
        assert_eq!(be16(&mad, 32), PERMISSIVE_LID);
        assert_eq!(local.dlid(), PERMISSIVE_LID);
    }

    /// A scripted stand-in for a fabric, to measure the reader's own matching: every CA
    /// has 2 ports and a capacity of 40 (two blocks), a block's first entry says whose
    /// block it is, answers come back last-sent first, each after a stray packet.
    struct ScriptedFabric {
        pending: Vec<[u8; MAD_SIZE]>,
        stray_next: bool,
        answer: bool,
    }

    impl MadCarrier for ScriptedFabric {
        fn send(&mut self, dlid: u16, mad: &[u8; MAD_SIZE]) -> Result<(), SmpError> {
            let mut resp = *mad;
            resp[3] = METHOD_GET_RESP;
            let data = &mut resp[SMP_DATA];
            match be16(mad, 16) {
                ATTR_NODE_INFO => {
                    data[2] = 1;
                    data[3] = 2;
                    data[28..30].copy_from_slice(&40u16.to_be_bytes());
                }
                ATTR_PKEY_TABLE => {
                    let block = u16::from_be_bytes([mad[22], mad[23]]);
                    let port = u16::from(mad[21]);
                    let tag = (dlid << 8) | (port << 4) | block;
                    data[0..2].copy_from_slice(&tag.to_be_bytes());
                }
                _ => resp[5] = 0x1c, // unsupported attribute
            }
            if self.answer {
                self.pending.push(resp);
            }
            Ok(())
        }

        fn recv(&mut self, wait: Duration) -> Result<Option<Answer>, SmpError> {
            self.stray_next = !self.stray_next;
            if self.stray_next {
                let mut stray = [0u8; MAD_SIZE];
                stray[3] = METHOD_GET_RESP;
                stray[12..16].copy_from_slice(&0xdead_0000u32.to_be_bytes());
                return Ok(Some(Answer {
                    mad: stray,
                    status: 0,
                }));
            }
            match self.pending.pop() {
                Some(mad) => Ok(Some(Answer { mad, status: 0 })),
                None => {
                    std::thread::sleep(wait.min(Duration::from_millis(20)));
                    Ok(None)
                }
            }
        }
    }

    fn scripted(answer: bool, timeout: Duration) -> SmpReader {
        SmpReader {
            transport: Box::new(ScriptedFabric {
                pending: Vec::new(),
                stray_next: false,
                answer,
            }),
            path: SmpPath::Umad { device: None },
            timeout,
            tid: 0,
        }
    }

    #[test]
    fn scripted_fabric_answers_out_of_order_with_strays_and_each_lands_on_its_request() {
        let mut r = scripted(true, Duration::from_secs(2));
        let ports = [(3u16, 1u8), (3, 2), (9, 1), (4, 2), (12, 1)];
        let tables = r.read_tables(&ports).unwrap();
        assert_eq!(tables.len(), ports.len());
        for ((lid, port), (table, cap)) in ports.iter().zip(&tables) {
            assert_eq!(*cap, 40);
            assert_eq!(table.len(), 40, "truncated to the capacity");
            let tag = |block: u16| (lid << 8) | (u16::from(*port) << 4) | block;
            assert_eq!(
                (table[0], table[32]),
                (tag(0), tag(1)),
                "LID {lid} port {port}"
            );
        }
        // An attribute the port refuses is an error naming it, not an empty answer.
        let err = r.master_sm().unwrap_err();
        assert!(
            matches!(&err, SmpError::Refused { what, status: 0x1c } if what.contains("PortInfo")),
            "{err}"
        );
    }

    #[test]
    fn scripted_fabric_that_never_answers_times_out_within_the_bound() {
        let mut r = scripted(false, Duration::from_millis(300));
        let t0 = Instant::now();
        let err = r.read_tables(&[(3, 1), (4, 1)]).unwrap_err();
        assert!(matches!(err, SmpError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("NodeInfo"), "{err}");
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    #[test]
    fn a_missing_umad_device_is_unavailable_and_named() {
        let device = PathBuf::from("/dev/infiniband/umad-weft-test-none");
        let err = SmpReader::open(
            &SmpPath::Umad {
                device: Some(device.clone()),
            },
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(err, SmpError::Unavailable(_)), "{err}");
        assert!(
            err.to_string().contains(&device.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn an_absent_simulator_is_unavailable_not_a_hang() {
        let t0 = Instant::now();
        let err = SmpReader::open(
            &SmpPath::Ibsim {
                sockname: format!("weft-no-such-ibsim-{}", std::process::id()),
                host: "node1".into(),
            },
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(matches!(err, SmpError::Unavailable(_)), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
