//! A DF-bit ICMP probe that needs no `ping(8)`: does a jumbo frame cross the path to a peer
//! whole? Runs on the host, through the hidden `weft bench df-probe`.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one DF-bit probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probe {
    /// An echo reply came back.
    Reply,
    /// The local stack refused to send a DF packet that large (interface MTU too small).
    TooBigHere,
    /// No reply within the bound (dropped on the way: a smaller MTU further on).
    NoReply,
}

/// One probe result, as the hidden `df-probe` command prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    pub dst: Ipv4Addr,
    /// Small (56-byte) echo: is the peer reachable at all?
    pub small: Probe,
    /// The `payload`-byte echo with DF set.
    pub jumbo: Probe,
    pub payload: usize,
}

/// One DF-bit probe through [`weft_icmp::echo`], as a [`Probe`].
pub fn icmp_echo(dst: Ipv4Addr, payload: usize, df: bool, timeout: Duration) -> io::Result<Probe> {
    Ok(match weft_icmp::echo(dst, payload, df, timeout)? {
        weft_icmp::Echo::Reply(_) => Probe::Reply,
        weft_icmp::Echo::TooBigHere => Probe::TooBigHere,
        weft_icmp::Echo::NoReply => Probe::NoReply,
    })
}

/// Probes each of `dsts`: a small echo, then a DF echo of `payload` bytes (two tries).
pub fn df_probe(
    dsts: &[Ipv4Addr],
    payload: usize,
    timeout: Duration,
) -> io::Result<Vec<ProbeResult>> {
    let mut out = Vec::new();
    for &dst in dsts {
        let small = icmp_echo(dst, 56, false, timeout)?;
        let mut jumbo = icmp_echo(dst, payload, true, timeout)?;
        if jumbo == Probe::NoReply {
            jumbo = icmp_echo(dst, payload, true, timeout)?;
        }
        out.push(ProbeResult {
            dst,
            small,
            jumbo,
            payload,
        });
    }
    Ok(out)
}
