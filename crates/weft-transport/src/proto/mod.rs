//! The weft wire protocol without any I/O: the listen handle, the frames on the handshake,
//! control and data streams, the connect/accept handshakes and the chunk plan of a message. Inputs go in
//! through `handle_*` calls, outputs come out through `poll_*` calls, time is passed in; so
//! everything here is tested with byte queues and a virtual clock, and every decoder takes
//! arbitrary bytes without panicking.

mod frame;
mod handle;
mod handshake;
mod plan;

pub use frame::{
    AbortReason, CTRL_STREAM, CTRL_WINDOW, End, FRAME_LEN, Frame, FrameDecoder, FrameError,
    MAX_INLINE, MoveStep, MsgHeader, RejectReason,
};
pub use handle::{HANDLE_SIZE, HandleError, ListenHandle, MAGIC, MAX_DATA_ADDRS, VERSION};
pub use handshake::{AcceptError, AcceptEvent, Acceptor, ConnectEvent, Connector};
pub use plan::{Chunk, chunk_size, chunks, select_slot};
