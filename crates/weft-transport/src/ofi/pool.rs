//! Registered memory: message pools (eager bounce buffers, CTS, size records) and the
//! registrations the plugin's regMr/deregMr hand out.

use super::*;

/// Registered memory of `n` slots of `size` bytes; message pools (eager bounce buffers, CTS)
/// start each slot with the receiving connection's key ([`shared::KEY_BYTES`]).
pub(super) struct Pool {
    pub(super) buf: Box<[u8]>,
    pub(super) mr: Mr,
    /// Bytes per slot, key included.
    pub(super) stride: usize,
    /// Bytes in front of each slot's contents (the key, or none).
    pub(super) prefix: usize,
}

impl Pool {
    pub(super) fn new(ep: &Port, n: usize, size: usize) -> FiResult<Pool> {
        let buf = vec![0u8; n * size].into_boxed_slice();
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        Ok(Pool {
            buf,
            mr,
            stride: size,
            prefix: 0,
        })
    }

    /// Slots of `size` bytes for messages to the connection `key`.
    pub(super) fn messages(ep: &Port, n: usize, size: usize, key: u64) -> FiResult<Pool> {
        let stride = shared::KEY_BYTES + size;
        let mut buf = vec![0u8; n * stride].into_boxed_slice();
        for s in buf.chunks_mut(stride) {
            s[..shared::KEY_BYTES].copy_from_slice(&key.to_le_bytes());
        }
        let mr = ep.register(buf.as_ptr(), buf.len())?;
        Ok(Pool {
            buf,
            mr,
            stride,
            prefix: shared::KEY_BYTES,
        })
    }

    /// The contents of slot `i` (after the key).
    pub(super) fn slot(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * self.stride + self.prefix..(i + 1) * self.stride]
    }

    /// Where slot `i` starts (its key), for sending it: [`Pool::wire`] bytes of `len`.
    pub(super) fn ptr(&mut self, i: usize) -> *mut u8 {
        self.buf[i * self.stride..].as_mut_ptr()
    }

    /// Bytes on the wire of a message with `len` bytes of contents.
    pub(super) fn wire(&self, len: usize) -> usize {
        self.prefix + len
    }

    /// Gives the memory up for good: the provider may still read it.
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.buf));
    }
}

/// Memory registered through a connection ([`SendConn::reg_mr`], [`RecvConn::reg_mr`]): the
/// plugin's `regMr` handle. Sends and receives that pass it use its registration without a
/// cache lookup; [`SendConn::dereg_mr`] drops it and every cache entry over its range, so no
/// later operation of the connection uses a registration of memory that was deregistered.
/// Not `Clone`: deregistering consumes the one handle.
#[derive(Debug)]
pub struct Registration {
    pub(super) ptr: usize,
    pub(super) len: usize,
    /// One registration per rail.
    pub(super) mrs: Vec<Arc<Mr>>,
    /// The connection that made it (registrations may be bound to its endpoint).
    pub(super) owner: u64,
}

impl Registration {
    /// This registration, if it is one of connection `owner` covering `ptr..ptr+len`.
    pub(super) fn covering(
        reg: Option<&Registration>,
        owner: u64,
        ptr: usize,
        len: usize,
    ) -> Option<&Registration> {
        reg.filter(|r| r.owner == owner && r.mrs.iter().all(|m| m.covers(ptr, len)))
    }

    /// Registered address.
    pub fn addr(&self) -> usize {
        self.ptr
    }

    /// Registered length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the registration is of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

pub(super) fn register(
    caches: &mut [MrCache],
    eps: &[Port],
    owner: u64,
    ptr: usize,
    len: usize,
) -> FiResult<Registration> {
    let mut mrs = Vec::with_capacity(eps.len());
    for (cache, ep) in caches.iter_mut().zip(eps) {
        // Anything cached over this range may be of memory freed since without a
        // deregistration (the transport's own callers do not register): register afresh.
        cache.invalidate(ptr, len);
        mrs.push(cache.get(ep.endpoint(), ptr, len)?);
    }
    Ok(Registration {
        ptr,
        len,
        mrs,
        owner,
    })
}

pub(super) fn stats(caches: &[MrCache]) -> (u64, u64) {
    caches
        .iter()
        .fold((0, 0), |(h, m), c| (h + c.hits, m + c.misses))
}
