//! Socket options of the TCP backend's streams, by role: the handshake stream (then the side
//! channel) on the management network, the control stream and the data streams on the data
//! network.

use std::io;
use std::time::Duration;

use socket2::{Socket, TcpKeepalive};

use crate::config::Config;
use crate::proto::CTRL_WINDOW;

/// Options of every socket before its role is known (data streams keep these; see
/// [`tune_side`] and [`tune_ctrl`] for the others).
pub(super) fn tune(s: &Socket, cfg: &Config) -> io::Result<()> {
    s.set_tcp_nodelay(true)?;
    s.set_keepalive(true)?;
    let idle = (cfg.timeout / 3).max(Duration::from_secs(1));
    let ka = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    s.set_tcp_keepalive(&ka)?;
    // Off by default on data streams: Linux applies TCP_USER_TIMEOUT to zero-window probing
    // too, so it would also kill a live receiver that is slow to post receives (legitimate in
    // NCCL). Data-stream failures are found by the receiver's stall timer instead, and reported
    // to the sender by ABORT (see `tune_ctrl`).
    if !cfg.tcp_user_timeout.is_zero() {
        s.set_tcp_user_timeout(Some(cfg.tcp_user_timeout))?;
    }
    if cfg.sock_buf > 0 {
        s.set_send_buffer_size(cfg.sock_buf)?;
        s.set_recv_buffer_size(cfg.sock_buf)?;
    }
    Ok(())
}

/// The handshake stream once the connection is up: the management side channel. No keepalive
/// and no user timeout: it is silent (zero bytes) unless a side gives up, and its death alone is
/// not a failure of the connection (the control stream on the data network decides that).
pub(super) fn tune_side(s: socket2::SockRef<'_>) -> io::Result<()> {
    s.set_keepalive(false)?;
    s.set_tcp_user_timeout(None)
}

/// The control stream's liveness watch (on the data network, so a cut data link is found
/// even while no message is due), done by the kernel so that it works while the
/// application is not calling in: keepalive probes every second once idle, and
/// `TCP_USER_TIMEOUT = timeout`, which ends the connection when sent bytes or probes stay
/// unacknowledged that long (a dead host, a cut management link). It cannot fire on a live but
/// slow peer: the receiver's kernel acknowledges whether or not its application reads, and
/// CREDIT flow control ([`CTRL_WINDOW`]) keeps the control stream's window from ever closing.
pub(super) fn tune_ctrl(s: socket2::SockRef<'_>, cfg: &Config) -> io::Result<()> {
    let secs = u32::try_from(cfg.timeout.as_secs()).unwrap_or(u32::MAX);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(1))
        .with_interval(Duration::from_secs(1))
        .with_retries(secs.clamp(1, 127));
    s.set_tcp_keepalive(&ka)?;
    s.set_tcp_user_timeout(Some(cfg.timeout))?;
    let min_buf = 4 * CTRL_WINDOW as usize;
    if cfg.sock_buf > 0 && cfg.sock_buf < min_buf {
        s.set_recv_buffer_size(min_buf)?;
    }
    Ok(())
}

/// Management network: handshake, then the ABORT side channel.
pub(super) fn tune_handshake(s: &Socket, cfg: &Config) -> io::Result<()> {
    tune(s, cfg)?;
    tune_side(socket2::SockRef::from(s))
}

/// Data network: message headers, inline payloads, CREDIT, ABORT.
pub(super) fn tune_ctrl_stream(s: &Socket, cfg: &Config) -> io::Result<()> {
    tune(s, cfg)?;
    tune_ctrl(socket2::SockRef::from(s), cfg)
}

/// Data network: chunks.
pub(super) fn tune_data_stream(s: &Socket, cfg: &Config) -> io::Result<()> {
    tune(s, cfg)
}
