//! Ping between hosts through weft's one pinger, [`weft_icmp`] (a raw socket, so hosts need no
//! `ping(8)`). Must run on a thread that has already entered the target network namespace.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Sends one echo request with `payload` bytes of data to `dst` and waits up to `timeout` for
/// the matching reply. `Ok(Some(rtt))` on a reply; `Ok(None)` when no reply came, or when the
/// local stack refused to send (message too long for a DF packet, network unreachable,
/// interface down) — the cases where `ping(8)` reports failure too.
pub(crate) fn ping(
    dst: Ipv4Addr,
    payload: usize,
    dont_fragment: bool,
    timeout: Duration,
) -> io::Result<Option<Duration>> {
    Ok(
        match weft_icmp::echo(dst, payload, dont_fragment, timeout)? {
            weft_icmp::Echo::Reply(rtt) => Some(rtt),
            weft_icmp::Echo::TooBigHere | weft_icmp::Echo::NoReply => None,
        },
    )
}
