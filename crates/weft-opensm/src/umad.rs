//! The kernel's user MAD device (`/dev/infiniband/umadN`), the transport libibumad
//! uses: register a management agent for the subnet management classes with an ioctl,
//! then write and read `struct ib_user_mad` (a 64-byte header, then the MAD).
//!
//! The only unsafe code of the crate is here: the two ioctls (nix generates them as
//! unsafe functions) and wrapping the descriptor that `open` returned. The descriptor is
//! opened, read, written, polled and closed through libc's own `open`/`read`/`write`/
//! `poll`/`close`, as libibumad does, so that umad2sim (an LD_PRELOAD library that
//! stands in for the device on a simulated fabric) can serve it too.
//!
//! Waits: every read is preceded by a `poll` bounded by the caller's wait, and each
//! packet asks the kernel to time it out and retry it (`timeout_ms`, `retries`), so an
//! unanswered SMP comes back as a send failure rather than never.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::stat::Mode;

use crate::smp::{Answer, MAD_SIZE, MadCarrier, SmpError};

/// `struct ib_user_mad_reg_req`: id, method_mask[4], qpn, mgmt_class,
/// mgmt_class_version, oui[3], rmpp_version (28 bytes with padding).
#[repr(C)]
#[derive(Default)]
struct RegReq {
    id: u32,
    method_mask: [u32; 4],
    qpn: u8,
    mgmt_class: u8,
    mgmt_class_version: u8,
    oui: [u8; 3],
    rmpp_version: u8,
}

// The layout the kernel's `<rdma/ib_user_mad.h>` gives `struct ib_user_mad_reg_req`
// (the ioctl number below encodes its size too), checked at compile time.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RegReq>() == 28);
    assert!(offset_of!(RegReq, id) == 0);
    assert!(offset_of!(RegReq, method_mask) == 4);
    assert!(offset_of!(RegReq, qpn) == 20);
    assert!(offset_of!(RegReq, mgmt_class) == 21);
    assert!(offset_of!(RegReq, mgmt_class_version) == 22);
    assert!(offset_of!(RegReq, oui) == 23);
    assert!(offset_of!(RegReq, rmpp_version) == 26);
};

const IB_IOCTL_MAGIC: u8 = 0x1b;
nix::ioctl_readwrite!(register_agent, IB_IOCTL_MAGIC, 1, RegReq);

/// `struct ib_user_mad`'s header in the format every kernel speaks by default: without
/// the pkey_index field, which only `IB_USER_MAD_ENABLE_PKEY` turns on. SMPs go over
/// QP0, where the P_Key index plays no part; and umad2sim, outside a process that
/// opened the port through libibumad, speaks only this format.
const HDR: usize = 56;
/// Per packet: the kernel waits this long for the answer, this many times over.
const KERNEL_TIMEOUT_MS: u32 = 200;
const KERNEL_RETRIES: u32 = 3;

const SYS_MAD: &str = "/sys/class/infiniband_mad";
const SYS_IB: &str = "/sys/class/infiniband";

pub(crate) struct UmadDevice {
    /// Always `Some` until dropped (see `Drop`).
    fd: Option<OwnedFd>,
    /// Agent ids by management class (LID-routed, directed-route).
    lid_agent: u32,
    dr_agent: u32,
    path: PathBuf,
}

fn io_err(what: String) -> impl FnOnce(nix::errno::Errno) -> SmpError {
    move |e| SmpError::Io {
        what,
        source: std::io::Error::from(e),
    }
}

/// The first `umadN` whose port is an ACTIVE InfiniBand port, as the tools pick one
/// without `-C`/`-P`.
fn first_active_device() -> Result<PathBuf, SmpError> {
    let entries = std::fs::read_dir(SYS_MAD)
        .map_err(|e| SmpError::Unavailable(format!("{SYS_MAD}: {e} (no InfiniBand stack)")))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix("umad")
                .is_some_and(|d| d.parse::<u32>().is_ok())
        })
        .collect();
    names.sort_by_key(|n| n[4..].parse::<u32>().unwrap_or(u32::MAX));
    let read = |p: PathBuf| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    let mut seen = Vec::new();
    for name in names {
        let dir = Path::new(SYS_MAD).join(&name);
        let (Ok(dev), Ok(port)) = (read(dir.join("ibdev")), read(dir.join("port"))) else {
            continue;
        };
        let port_dir = Path::new(SYS_IB).join(&dev).join("ports").join(&port);
        let state = read(port_dir.join("state")).unwrap_or_default();
        let layer = read(port_dir.join("link_layer")).unwrap_or_else(|_| "InfiniBand".into());
        if state.contains("ACTIVE") && layer == "InfiniBand" {
            return Ok(PathBuf::from("/dev/infiniband").join(name));
        }
        seen.push(format!("{dev} port {port}: {state}"));
    }
    Err(SmpError::Unavailable(if seen.is_empty() {
        format!("no umad device under {SYS_MAD}")
    } else {
        format!("no ACTIVE InfiniBand port ({})", seen.join(", "))
    }))
}

impl UmadDevice {
    /// Opens `device` (or the first active one) and registers one agent per subnet
    /// management class on it.
    pub(crate) fn open(device: Option<&Path>) -> Result<UmadDevice, SmpError> {
        let path = match device {
            Some(d) => d.to_path_buf(),
            None => first_active_device()?,
        };
        let flags = OFlag::O_RDWR | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let raw = nix::fcntl::open(&path, flags, Mode::empty())
            .map_err(|e| SmpError::Unavailable(format!("open {}: {e}", path.display())))?;
        // SAFETY: `open` just returned `raw` as a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let agent = |class: u8| -> Result<u32, SmpError> {
            let mut req = RegReq {
                qpn: 0,
                mgmt_class: class,
                mgmt_class_version: 1,
                ..RegReq::default()
            };
            // SAFETY: `req` is a live, properly laid out `ib_user_mad_reg_req` that the
            // kernel reads and writes (the id) for the duration of the call only.
            unsafe { register_agent(fd.as_raw_fd(), &mut req) }.map_err(|e| {
                SmpError::Unavailable(format!(
                    "register an SMP agent (class {class:#04x}) on {}: {e}",
                    path.display()
                ))
            })?;
            Ok(req.id)
        };
        let lid_agent = agent(0x01)?;
        let dr_agent = agent(0x81)?;
        Ok(UmadDevice {
            fd: Some(fd),
            lid_agent,
            dr_agent,
            path,
        })
    }
}

impl UmadDevice {
    fn fd(&self) -> Result<&OwnedFd, SmpError> {
        self.fd
            .as_ref()
            .ok_or_else(|| SmpError::Protocol("the umad device is closed".into()))
    }
}

impl Drop for UmadDevice {
    fn drop(&mut self) {
        // Closed through libc's `close` by number (as libibumad closes it), so that the
        // stand-in library sees it; the kernel unregisters the agents with the file.
        if let Some(fd) = self.fd.take() {
            let _ = nix::unistd::close(fd.into_raw_fd());
        }
    }
}

impl MadCarrier for UmadDevice {
    fn send(&mut self, dlid: u16, mad: &[u8; MAD_SIZE]) -> Result<(), SmpError> {
        let mut buf = vec![0u8; HDR + MAD_SIZE];
        let agent = if mad[1] == 0x81 {
            self.dr_agent
        } else {
            self.lid_agent
        };
        buf[0..4].copy_from_slice(&agent.to_ne_bytes());
        buf[8..12].copy_from_slice(&KERNEL_TIMEOUT_MS.to_ne_bytes());
        buf[12..16].copy_from_slice(&KERNEL_RETRIES.to_ne_bytes());
        buf[16..20].copy_from_slice(&((HDR + MAD_SIZE) as u32).to_ne_bytes());
        // ib_mad_addr: qpn 0 (be32) and qkey 0, then the LID (be16); sl, path bits, no GRH.
        buf[28..30].copy_from_slice(&dlid.to_be_bytes());
        buf[HDR..].copy_from_slice(mad);
        let n = nix::unistd::write(self.fd()?.as_fd(), &buf).map_err(io_err(format!(
            "write an SMP for LID {dlid} to {}",
            self.path.display()
        )))?;
        if n != buf.len() {
            return Err(SmpError::Protocol(format!(
                "{} took {n} of {} bytes",
                self.path.display(),
                buf.len()
            )));
        }
        Ok(())
    }

    fn recv(&mut self, wait: Duration) -> Result<Option<Answer>, SmpError> {
        let ms = u16::try_from(wait.as_millis().clamp(1, 10_000)).unwrap_or(10_000);
        let fd = self.fd()?;
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let ready = nix::poll::poll(&mut fds, PollTimeout::from(ms))
            .map_err(io_err(format!("poll {}", self.path.display())))?;
        if ready == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; HDR + MAD_SIZE];
        let n = match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(io_err(format!("read {}", self.path.display()))(e)),
        };
        // Shorter than a header and a MAD header, or (umad2sim's way of saying "empty")
        // a negative count: nothing to take.
        if n < HDR + 24 || n > buf.len() {
            return Ok(None);
        }
        let status = u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let mut mad = [0u8; MAD_SIZE];
        let len = (n - HDR).min(MAD_SIZE);
        mad[..len].copy_from_slice(&buf[HDR..HDR + len]);
        Ok(Some(Answer { mad, status }))
    }
}
