//! The transport API over either backend: TCP streams ([`crate::tcp`]) or libfabric
//! ([`crate::ofi`]), chosen by [`Config::backend`] (`WEFT_BACKEND`). The TCP types are used
//! unchanged; with `ofi`, interface selection (management interface, devices) is still the TCP
//! transport's, and the data path of every connection is libfabric's. When libfabric or a usable
//! provider is missing, `ofi` falls back to TCP and [`Transport::backend_note`] says why.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::common::{Completed, Device, MAX_RECVS, Rail, RecvBuf, RequestId};
use crate::config::{BackendKind, Config};
use crate::error::Result;
use crate::iface::Interface;
use crate::ofi;
use crate::proto::{self, ListenHandle};
use crate::tcp;

/// The transport of this host: the management interface, the data devices, and the backend.
#[derive(Debug, Clone)]
pub struct Transport {
    tcp: tcp::TcpTransport,
    ofi: Option<Arc<ofi::Backend>>,
    note: Option<String>,
}

impl Transport {
    /// Selects the interfaces named by `cfg` on this host, and opens the backend.
    pub fn new(cfg: Config) -> Result<Transport> {
        Transport::from_tcp(tcp::TcpTransport::new(cfg)?)
    }

    /// Like [`Transport::new`] over a given interface list (tests, or a host model).
    pub fn with_interfaces(cfg: Config, all: &[Interface]) -> Result<Transport> {
        Transport::from_tcp(tcp::TcpTransport::with_interfaces(cfg, all)?)
    }

    fn from_tcp(t: tcp::TcpTransport) -> Result<Transport> {
        let cfg = t.config().clone();
        let (ofi, note) = match cfg.backend {
            BackendKind::Tcp => (None, None),
            BackendKind::Ofi | BackendKind::Auto => {
                let mut c = cfg.clone();
                if cfg.backend == BackendKind::Auto && c.ofi_provider.is_none() {
                    c.ofi_provider = Some("verbs;ofi_rxm".into());
                }
                match ofi::Backend::open(&c, t.devices()) {
                    Ok(b) => (Some(Arc::new(b)), None),
                    Err(why) => (
                        None,
                        Some(format!("ofi backend unavailable, using TCP: {why}")),
                    ),
                }
            }
        };
        Ok(Transport { tcp: t, ofi, note })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        self.tcp.config()
    }

    /// The management interface and address.
    pub fn mgmt(&self) -> &Rail {
        self.tcp.mgmt()
    }

    /// The data devices.
    pub fn devices(&self) -> &[Device] {
        self.tcp.devices()
    }

    /// `"tcp"`, or `"ofi <provider>/<domain>"` of device 0.
    pub fn backend(&self) -> String {
        match &self.ofi {
            None => "tcp".into(),
            Some(b) => format!("ofi {}", b.describe(0)),
        }
    }

    /// Whether connections use libfabric.
    pub fn is_ofi(&self) -> bool {
        self.ofi.is_some()
    }

    /// Why the configured ofi backend is not in use, if it is not.
    pub fn backend_note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Opens the listener of device `dev`.
    pub fn listen(&self, dev: usize) -> Result<Listener> {
        Ok(Listener(match &self.ofi {
            None => ListenerImpl::Tcp(self.tcp.listen(dev)?),
            Some(b) => {
                let m = self.tcp.mgmt();
                ListenerImpl::Ofi(b.listen(self.config(), (m.addr, &m.iface), dev)?)
            }
        }))
    }

    /// Connects device `dev` to the listener described by `handle` while accepting on
    /// `listener`: the two connections between two peers that each open one towards the
    /// other at the same time (as NCCL does, and as every weft benchmark and tool does), or a
    /// connection to one's own listener. Returns when both are up. Bounded: the connect by
    /// the configured timeout, the accept (once the connect is done) by the accept timeout.
    pub fn connect_and_accept(
        &self,
        dev: usize,
        handle: &[u8],
        listener: &mut Listener,
    ) -> Result<(SendConn, RecvConn)> {
        let mut connecting = self.connect(dev, handle)?;
        let mut rx = None;
        let tx = loop {
            if let Some(tx) = connecting.poll()? {
                break tx;
            }
            if rx.is_none() {
                rx = listener.accept()?;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        };
        let rx = match rx {
            Some(rx) => rx,
            None => listener.wait()?,
        };
        Ok((tx, rx))
    }

    /// Starts connecting device `dev` to the listener described by `handle`.
    pub fn connect(&self, dev: usize, handle: &[u8]) -> Result<Connecting> {
        Ok(Connecting(match &self.ofi {
            None => ConnectingImpl::Tcp(self.tcp.connect(dev, handle)?),
            Some(b) => {
                let m = self.tcp.mgmt();
                ConnectingImpl::Ofi(Box::new(b.connect(
                    self.config(),
                    (m.addr, &m.iface),
                    dev,
                    handle,
                )?))
            }
        }))
    }
}

/// The backend behind a [`Listener`].
#[derive(Debug)]
enum ListenerImpl {
    Tcp(tcp::Listener),
    Ofi(ofi::Listener),
}

/// The receiver's listening side of a device.
#[derive(Debug)]
pub struct Listener(ListenerImpl);

impl Listener {
    /// The handle to give the sender (128 bytes, see [`proto::HANDLE_SIZE`]).
    pub fn handle(&self) -> [u8; proto::HANDLE_SIZE] {
        match &self.0 {
            ListenerImpl::Tcp(l) => l.handle(),
            ListenerImpl::Ofi(l) => l.handle(),
        }
    }

    /// The decoded handle.
    pub fn handle_info(&self) -> &ListenHandle {
        match &self.0 {
            ListenerImpl::Tcp(l) => l.handle_info(),
            ListenerImpl::Ofi(l) => l.handle_info(),
        }
    }

    /// Accepts without blocking. `Ok(None)`: call again.
    pub fn accept(&mut self) -> Result<Option<RecvConn>> {
        Ok(match &mut self.0 {
            ListenerImpl::Tcp(l) => l.accept()?.map(|c| RecvConn(RecvImpl::Tcp(c))),
            ListenerImpl::Ofi(l) => l.accept()?.map(|c| RecvConn(RecvImpl::Ofi(Box::new(c)))),
        })
    }

    /// The connections discarded since the last call because they did not speak weft's
    /// protocol (garbage, a bare connect and close, a health probe, a stale handle, a stall),
    /// as errors naming each peer: for the caller to log (the plugin logs them at INFO).
    pub fn take_discarded(&mut self) -> Vec<crate::Error> {
        match &mut self.0 {
            ListenerImpl::Tcp(l) => l.take_discarded(),
            ListenerImpl::Ofi(l) => l.take_discarded(),
        }
    }

    /// Polls until a connection arrives or the accept timeout passes.
    pub fn wait(&mut self) -> Result<RecvConn> {
        Ok(match &mut self.0 {
            ListenerImpl::Tcp(l) => RecvConn(RecvImpl::Tcp(l.wait()?)),
            ListenerImpl::Ofi(l) => RecvConn(RecvImpl::Ofi(Box::new(l.wait()?))),
        })
    }
}

// The TCP variant stays inline: its path is unchanged, without an extra indirection.
#[allow(clippy::large_enum_variant)]
/// The backend behind a [`Connecting`].
#[derive(Debug)]
enum ConnectingImpl {
    Tcp(tcp::Connecting),
    Ofi(Box<ofi::Connecting>),
}

/// A connection being set up by the sender.
#[derive(Debug)]
pub struct Connecting(ConnectingImpl);

impl Connecting {
    /// Advances the handshake without blocking. `Ok(None)`: call again later.
    pub fn poll(&mut self) -> Result<Option<SendConn>> {
        Ok(match &mut self.0 {
            ConnectingImpl::Tcp(c) => c.poll()?.map(|s| SendConn(SendImpl::Tcp(s))),
            ConnectingImpl::Ofi(c) => c.poll()?.map(|s| SendConn(SendImpl::Ofi(Box::new(s)))),
        })
    }

    /// Polls until connected or failed.
    pub fn wait(self) -> Result<SendConn> {
        Ok(match self.0 {
            ConnectingImpl::Tcp(c) => SendConn(SendImpl::Tcp(c.wait()?)),
            ConnectingImpl::Ofi(c) => SendConn(SendImpl::Ofi(Box::new(c.wait()?))),
        })
    }
}

/// Memory registered through a connection ([`SendConn::reg_mr`], [`RecvConn::reg_mr`]; NCCL's
/// `regMr`). TCP needs no registration: its handles only record the range. Give it back with
/// `dereg_mr` of the same connection before the memory is freed (not `Clone`: deregistering
/// consumes the one handle, so no copy can reach a later send or receive).
#[derive(Debug)]
pub struct MemHandle {
    ptr: usize,
    len: usize,
    ofi: Option<ofi::Registration>,
}

impl MemHandle {
    /// Registered address.
    pub fn addr(&self) -> usize {
        self.ptr
    }

    /// Registered length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a libfabric registration is behind it (ofi connections).
    pub fn is_registered(&self) -> bool {
        self.ofi.is_some()
    }

    fn tcp(ptr: *const u8, len: usize) -> MemHandle {
        MemHandle {
            ptr: ptr as usize,
            len,
            ofi: None,
        }
    }
}

// The TCP variant stays inline: its path is unchanged, without an extra indirection.
#[allow(clippy::large_enum_variant)]
/// The backend behind a [`SendConn`].
#[derive(Debug)]
enum SendImpl {
    Tcp(tcp::SendConn),
    Ofi(Box<ofi::SendConn>),
}

/// The sending end of a connection.
#[derive(Debug)]
pub struct SendConn(SendImpl);

/// What the backend-neutral [`SendConn`] and [`RecvConn`] answer alike, over an enum with
/// `Tcp` and `Ofi` variants (`$e`): an ofi connection has one data stream (its endpoint),
/// never shares a control stream and has no side channel but its management peer.
/// `$other` names the connection of the other direction in the docs.
macro_rules! conn_common {
    ($t:ident, $e:ident, $other:literal) => {
        impl $t {
            /// Remote address and local interface of the data path (TCP: control stream;
            /// ofi: the management peer and "interface (ofi provider/domain)").
            pub fn peer(&self) -> (SocketAddr, &str) {
                match &self.0 {
                    $e::Tcp(c) => c.peer(),
                    $e::Ofi(c) => c.peer(),
                }
            }

            /// Remote address and local interface of the management side channel.
            pub fn side_peer(&self) -> (SocketAddr, &str) {
                match &self.0 {
                    $e::Tcp(c) => c.side_peer(),
                    $e::Ofi(c) => c.peer(),
                }
            }

            /// Number of data streams (1 for ofi: one endpoint).
            pub fn nstreams(&self) -> usize {
                match &self.0 {
                    $e::Tcp(c) => c.nstreams(),
                    $e::Ofi(_) => 1,
                }
            }

            #[doc = concat!("Whether the control stream is shared with ", $other, " of the same peers (TCP backend, protocol JOIN; never for ofi).")]
            pub fn shares_control_stream(&self) -> bool {
                match &self.0 {
                    $e::Tcp(c) => c.shares_control_stream(),
                    $e::Ofi(_) => false,
                }
            }

            /// Whether this connection runs over libfabric.
            pub fn is_ofi(&self) -> bool {
                matches!(self.0, $e::Ofi(_))
            }

            /// Registration cache (hits, misses); (0, 0) for TCP.
            pub fn mr_stats(&self) -> (u64, u64) {
                match &self.0 {
                    $e::Tcp(_) => (0, 0),
                    $e::Ofi(c) => c.mr_stats(),
                }
            }

            /// Bytes of remote CQ data an ofi connection uses (4 or 8); 0 for TCP.
            pub fn cq_data_bytes(&self) -> usize {
                match &self.0 {
                    $e::Tcp(_) => 0,
                    $e::Ofi(c) => c.cq_data_bytes(),
                }
            }

            /// libfabric rails (endpoints) of an ofi connection; 0 for TCP.
            pub fn ofi_rails(&self) -> usize {
                match &self.0 {
                    $e::Tcp(_) => 0,
                    $e::Ofi(c) => c.rails(),
                }
            }

            /// Connections of this process on an ofi connection's endpoint, itself included
            /// (see "Shared endpoints" in the ofi module); `None` for TCP.
            pub fn ofi_endpoint_users(&self) -> Option<usize> {
                match &self.0 {
                    $e::Tcp(_) => None,
                    $e::Ofi(c) => Some(c.endpoint_users()),
                }
            }

            /// Registers `len` bytes at `ptr` for this connection's transfers (ofi: through
            /// its registration cache; TCP: nothing to do).
            pub fn reg_mr(&mut self, ptr: *const u8, len: usize) -> Result<MemHandle> {
                let mut h = MemHandle::tcp(ptr, len);
                if let $e::Ofi(c) = &mut self.0 {
                    h.ofi = Some(c.reg_mr(ptr, len)?);
                }
                Ok(h)
            }

            #[doc = concat!("Releases a handle of [`", stringify!($t), "::reg_mr`]: no later transfer of this connection uses a registration of that memory (it may be freed and its address reused).")]
            pub fn dereg_mr(&mut self, h: MemHandle) {
                if let ($e::Ofi(c), Some(r)) = (&mut self.0, h.ofi) {
                    c.dereg_mr(r);
                }
            }
        }
    };
}
conn_common!(SendConn, SendImpl, "a receiving connection");
conn_common!(RecvConn, RecvImpl, "a sending connection");

impl SendConn {
    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        match &self.0 {
            SendImpl::Tcp(c) => c.in_flight(),
            SendImpl::Ofi(c) => c.in_flight(),
        }
    }

    /// Bytes written by RMA on each rail of an ofi connection; empty for TCP.
    pub fn ofi_rail_bytes(&self) -> Vec<u64> {
        match &self.0 {
            SendImpl::Tcp(_) => Vec::new(),
            SendImpl::Ofi(c) => c.rail_bytes(),
        }
    }

    /// Messages an ofi connection sent over its TCP lane (`WEFT_OFI_MIN_BYTES`); `None` without
    /// a lane.
    pub fn ofi_lane_msgs(&self) -> Option<u64> {
        match &self.0 {
            SendImpl::Tcp(_) => None,
            SendImpl::Ofi(c) => c.lane_msgs(),
        }
    }

    /// [`SendConn::isend`] of memory inside `mh`, whose registration it uses.
    ///
    /// # Safety
    /// As for [`SendConn::isend`].
    pub unsafe fn isend_mr(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
        mh: Option<&MemHandle>,
    ) -> Result<Option<RequestId>> {
        match &mut self.0 {
            // SAFETY: forwarded under the same contract.
            SendImpl::Tcp(c) => unsafe { c.isend(data, len, tag) },
            // SAFETY: forwarded under the same contract.
            SendImpl::Ofi(c) => unsafe {
                c.isend_mr(data, len, tag, mh.and_then(|h| h.ofi.as_ref()))
            },
        }
    }

    /// Starts sending `len` bytes at `data` with `tag`. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// `data..data+len` must be readable and must not change until [`SendConn::test`] reports
    /// the request done or the connection is dropped.
    pub unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        match &mut self.0 {
            // SAFETY: forwarded under the same contract.
            SendImpl::Tcp(c) => unsafe { c.isend(data, len, tag) },
            // SAFETY: forwarded under the same contract.
            SendImpl::Ofi(c) => unsafe { c.isend(data, len, tag) },
        }
    }

    /// Whether request `id` is done; `Some(bytes)` once it is.
    pub fn test(&mut self, id: RequestId) -> Result<Option<usize>> {
        match &mut self.0 {
            SendImpl::Tcp(c) => c.test(id),
            SendImpl::Ofi(c) => c.test(id),
        }
    }

    /// Sends `data` and waits for completion. For tools and tests.
    pub fn send(&mut self, data: &[u8], tag: i32) -> Result<()> {
        let id = loop {
            // SAFETY: `data` is borrowed for the whole call and we wait for completion below.
            if let Some(id) = unsafe { self.isend(data.as_ptr(), data.len(), tag)? } {
                break id;
            }
        };
        while self.test(id)?.is_none() {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

// The TCP variant stays inline: its path is unchanged, without an extra indirection.
#[allow(clippy::large_enum_variant)]
/// The backend behind a [`RecvConn`].
#[derive(Debug)]
enum RecvImpl {
    Tcp(tcp::RecvConn),
    Ofi(Box<ofi::RecvConn>),
}

/// The receiving end of a connection.
#[derive(Debug)]
pub struct RecvConn(RecvImpl);

impl RecvConn {
    /// CTS with buffers an ofi connection has sent (small receives whose messages all came
    /// eagerly send none); `None` for TCP.
    pub fn ofi_cts_sent(&self) -> Option<u64> {
        match &self.0 {
            RecvImpl::Tcp(_) => None,
            RecvImpl::Ofi(c) => Some(c.cts_sent()),
        }
    }

    /// [`RecvConn::irecv`] where buffer `i` lies inside `mhs[i]` (missing or `None`: looked
    /// up).
    ///
    /// # Safety
    /// As for [`RecvConn::irecv`].
    pub unsafe fn irecv_mr(
        &mut self,
        bufs: &[RecvBuf],
        mhs: &[Option<&MemHandle>],
    ) -> Result<Option<RequestId>> {
        match &mut self.0 {
            // SAFETY: forwarded under the same contract.
            RecvImpl::Tcp(c) => unsafe { c.irecv(bufs) },
            RecvImpl::Ofi(c) => {
                let mut regs: [Option<&ofi::Registration>; MAX_RECVS] = [None; MAX_RECVS];
                for (r, h) in regs.iter_mut().zip(mhs) {
                    *r = h.and_then(|h| h.ofi.as_ref());
                }
                // SAFETY: forwarded under the same contract.
                unsafe { c.irecv_mr(bufs, &regs) }
            }
        }
    }

    /// Posts a receive of up to [`MAX_RECVS`] buffers. `Ok(None)`: busy, retry later.
    ///
    /// # Safety
    /// Every buffer must be writable for its `len` bytes and not be read or written by anyone
    /// else until [`RecvConn::test`] reports the request done or the connection is dropped.
    pub unsafe fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<RequestId>> {
        match &mut self.0 {
            // SAFETY: forwarded under the same contract.
            RecvImpl::Tcp(c) => unsafe { c.irecv(bufs) },
            // SAFETY: forwarded under the same contract.
            RecvImpl::Ofi(c) => unsafe { c.irecv(bufs) },
        }
    }

    /// Whether request `id` is done; the sizes received once it is.
    pub fn test(&mut self, id: RequestId) -> Result<Option<Completed>> {
        match &mut self.0 {
            RecvImpl::Tcp(c) => c.test(id),
            RecvImpl::Ofi(c) => c.test(id),
        }
    }

    /// Receives one message into `buf` and waits for it. For tools and tests.
    pub fn recv(&mut self, buf: &mut [u8], tag: i32) -> Result<usize> {
        let b = RecvBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            tag,
        };
        let id = loop {
            // SAFETY: `buf` is mutably borrowed for the whole call and we wait for completion.
            if let Some(id) = unsafe { self.irecv(&[b])? } {
                break id;
            }
        };
        loop {
            if let Some(c) = self.test(id)? {
                return Ok(c.sizes[0]);
            }
            std::hint::spin_loop();
        }
    }
}
