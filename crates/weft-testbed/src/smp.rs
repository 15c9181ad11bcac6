//! A direct ibsim client for reading P_Key tables fast: one attached client sends
//! LID-routed SubnGet(P_KeyTable) SMPs over ibsim's own socket protocol (the one
//! umad2sim speaks), so a test reads forty ports in milliseconds instead of forty
//! `smpquery` processes, each of which builds umad2sim's fake sysfs tree first.
//!
//! What it reads is what the simulated ports hold (ibsim answers the SMP from the port's
//! table, as `smpquery pkeys` does); weft's own code never uses this, it reads through
//! the diagnostic tools. The test `smp_reader_reads_what_smpquery_reads` keeps the two in
//! agreement.

use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::TestbedError;
use crate::error::io;

const SIM_MAGIC: u32 = 0xdead_beef;
const CTL_ERROR: u32 = 0;
const CTL_CONNECT: u32 = 1;
const CTL_DISCONNECT: u32 = 2;
/// `struct sim_ctl`: magic, clientid, type, len, data[64].
const CTL_SIZE: usize = 16 + 64;
/// `struct sim_request`: dlid, slid, dqp, sqp, status (u32 each), padding, length (u64),
/// mad[256].
const REQ_SIZE: usize = 24 + 8 + 256;
const MAD_AT: usize = 32;
const ATTR_PKEY_TABLE: u16 = 0x0016;

static CLIENT_SEQ: AtomicU32 = AtomicU32::new(0);

/// One client attached to an ibsim fabric (it takes one of ibsim's 10 client slots until
/// dropped).
pub struct SmpClient {
    ctl: UnixDatagram,
    data: UnixDatagram,
    client: u32,
    tid: u64,
    timeout: Duration,
}

/// ibsim's abstract socket names end in one NUL byte (its `make_name` counts it in the
/// address length).
fn abstract_addr(name: &str) -> Result<SocketAddr, TestbedError> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    SocketAddr::from_abstract_name(&bytes).map_err(io(format!("socket name {name}")))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

impl SmpClient {
    /// Attaches to the ibsim whose `IBSIM_SOCKNAME` is `sockname`, at the HCA named
    /// `sim_host`; every wait for ibsim is bounded by `timeout`.
    pub fn connect(
        sockname: &str,
        sim_host: &str,
        timeout: Duration,
    ) -> Result<SmpClient, TestbedError> {
        // ibsim names the client's sockets by the id it is given (umad2sim gives its pid);
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
            .map_err(io(format!("connect to ibsim `{sockname}`")))?;
        // struct sim_client_info: id, qp, issm, nodeid[32].
        let mut info = [0u8; 44];
        info[0..4].copy_from_slice(&id.to_ne_bytes());
        let host = sim_host.as_bytes();
        let n = host.len().min(31);
        info[12..12 + n].copy_from_slice(&host[..n]);
        let reply = ctl_call(&ctl, 0, CTL_CONNECT, &info)?;
        let client = u32_at(&reply, 16);
        data.connect_addr(&abstract_addr(&format!("{sockname}:out{client}"))?)
            .map_err(io("connect the ibsim data socket"))?;
        Ok(SmpClient {
            ctl,
            data,
            client,
            tid: 1,
            timeout,
        })
    }

    /// The P_Key table of port `port` at `lid` (a switch's LID with its port number, or a
    /// CA port's LID), in index order, holes as 0x0000, every block up to the port's
    /// capacity.
    pub fn pkeys(&mut self, lid: u16, port: u8) -> Result<Vec<u16>, TestbedError> {
        let mut table = Vec::new();
        for block in 0u32..64 {
            match self.get(lid, ATTR_PKEY_TABLE, block | (u32::from(port) << 16))? {
                Some(data) => {
                    table.extend(data.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])))
                }
                // ibsim answers a block past the port's capacity with a bad-parameter status.
                None if block > 0 => break,
                None => {
                    return Err(TestbedError::Invalid(format!(
                        "LID {lid} port {port}: the P_KeyTable SMP was refused"
                    )));
                }
            }
        }
        Ok(table)
    }

    /// One SubnGet; `None` when the answer carries a non-zero MAD status.
    fn get(&mut self, lid: u16, attr: u16, modifier: u32) -> Result<Option<Vec<u8>>, TestbedError> {
        self.tid = (self.tid + 1) & 0xffff_ffff_ffff;
        let tid = self.tid;
        let mut req = [0u8; REQ_SIZE];
        // dlid and slid are network-order 16-bit values in host-order u32 fields.
        req[0..2].copy_from_slice(&lid.to_be_bytes());
        req[24..32].copy_from_slice(&256u64.to_be_bytes());
        let mad = &mut req[MAD_AT..];
        mad[0] = 1; // base version
        mad[1] = 0x01; // LID-routed SM class
        mad[2] = 1; // class version
        mad[3] = 0x01; // SubnGet
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        mad[16..18].copy_from_slice(&attr.to_be_bytes());
        mad[20..24].copy_from_slice(&modifier.to_be_bytes());
        self.data
            .send(&req)
            .map_err(io(format!("send an SMP to LID {lid}")))?;
        let deadline = Instant::now() + self.timeout;
        let mut buf = [0u8; 512];
        loop {
            let n = self
                .data
                .recv(&mut buf)
                .map_err(io(format!("wait for the SMP answer from LID {lid}")))?;
            if n == REQ_SIZE {
                let mad = &buf[MAD_AT..REQ_SIZE];
                let got = u64::from_be_bytes(mad[8..16].try_into().unwrap_or([0; 8]));
                if got & 0xffff_ffff_ffff == tid && mad[3] == 0x81 {
                    let status = u32_at(&buf, 16);
                    if status != 0 {
                        return Err(TestbedError::Invalid(format!(
                            "ibsim dropped the SMP to LID {lid} (status {})",
                            u32::from_be(status)
                        )));
                    }
                    let mad_status = u16::from_be_bytes([mad[4], mad[5]]);
                    return Ok((mad_status == 0).then(|| mad[64..128].to_vec()));
                }
            }
            if Instant::now() >= deadline {
                return Err(TestbedError::Timeout {
                    what: format!("the SMP answer from LID {lid}"),
                    timeout: self.timeout,
                    detail: "stray packets only".into(),
                });
            }
        }
    }
}

fn ctl_call(
    ctl: &UnixDatagram,
    client: u32,
    kind: u32,
    data: &[u8],
) -> Result<[u8; CTL_SIZE], TestbedError> {
    let mut msg = [0u8; CTL_SIZE];
    msg[0..4].copy_from_slice(&SIM_MAGIC.to_ne_bytes());
    msg[4..8].copy_from_slice(&client.to_ne_bytes());
    msg[8..12].copy_from_slice(&kind.to_ne_bytes());
    msg[12..16].copy_from_slice(&(data.len() as u32).to_ne_bytes());
    msg[16..16 + data.len()].copy_from_slice(data);
    ctl.send(&msg).map_err(io("send to ibsim's ctl socket"))?;
    let mut reply = [0u8; CTL_SIZE];
    let n = ctl
        .recv(&mut reply)
        .map_err(io("wait for ibsim's ctl answer"))?;
    if n != CTL_SIZE || u32_at(&reply, 8) == CTL_ERROR {
        return Err(TestbedError::Invalid(format!(
            "ibsim refused the client request {kind} (all 10 client slots taken, or an unknown host)"
        )));
    }
    Ok(reply)
}

impl Drop for SmpClient {
    fn drop(&mut self) {
        // Frees the client slot; ibsim answers, and a lost answer changes nothing here.
        let _ = ctl_call(&self.ctl, self.client, CTL_DISCONNECT, &[]);
    }
}
