//! The listen handle: at most [`HANDLE_SIZE`] bytes that NCCL ships from the receiver to the
//! sender through its bootstrap. It says where the receiver's management listener and data
//! listeners are, and carries a nonce that every connection must present.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Size of NCCL's handle buffer (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;
/// First four bytes of every handle and every handshake frame.
pub const MAGIC: [u8; 4] = *b"WEFT";
/// Protocol version; a peer with another version is refused with a clear error. Version 2
/// moved the per-message control stream from the management to the data network; version 3
/// lets two one-way connections share one control stream (JOIN, JOINED, CLOSE); version 4
/// lets both ends ask PROBE on the side channel (a receiver about its sender; on ofi a sender
/// about its receiver), which a version-3 peer would neither answer nor accept.
pub const VERSION: u8 = 4;
/// Most data addresses a handle carries.
pub const MAX_DATA_ADDRS: usize = 4;

const HEADER: usize = 16;
const ADDR: usize = 19;
const CHECKSUM: usize = 4;

/// Why a byte string is not a valid handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// Fewer bytes than the smallest handle.
    #[error("{0} bytes is shorter than a handle")]
    TooShort(usize),
    /// Not a weft handle (another plugin's, or garbage).
    #[error("bad magic {0:02x?} (expected \"WEFT\"): not a weft handle")]
    BadMagic([u8; 4]),
    /// A weft handle of another protocol version.
    #[error("handle version {found}, this build speaks {supported}")]
    Version {
        /// Version in the handle.
        found: u8,
        /// Version of this build.
        supported: u8,
    },
    /// More data addresses than fit.
    #[error("{0} data addresses (at most {MAX_DATA_ADDRS})")]
    TooManyAddrs(u8),
    /// Encoded length field disagrees with the address count.
    #[error("length field {found} does not match {expected}")]
    Length {
        /// Length in the handle.
        found: u16,
        /// Length implied by the address count.
        expected: u16,
    },
    /// An address family byte that is neither 4 nor 6.
    #[error("address family {0} is neither 4 nor 6")]
    Family(u8),
    /// Port 0 in an address.
    #[error("port 0 in an address")]
    ZeroPort,
    /// The checksum does not match: the handle was corrupted on the way.
    #[error("checksum mismatch: handle corrupted")]
    Checksum,
}

/// The decoded handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenHandle {
    /// Random per listener; every hello must carry it.
    pub nonce: u64,
    /// The management listener (handshake, and the ABORT side channel).
    pub mgmt: SocketAddr,
    /// Data listeners, one per rail of the device (the first also takes the control stream);
    /// empty means "use `mgmt`" (a device on the management interface itself).
    pub data: Vec<SocketAddr>,
}

fn fnv1a32(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, x| {
        (h ^ u32::from(*x)).wrapping_mul(0x0100_0193)
    })
}

fn put_addr(out: &mut [u8], a: &SocketAddr) {
    out[1..3].copy_from_slice(&a.port().to_be_bytes());
    match a.ip() {
        IpAddr::V4(v4) => {
            out[0] = 4;
            out[3..7].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out[0] = 6;
            out[3..19].copy_from_slice(&v6.octets());
        }
    }
}

fn get_addr(b: &[u8]) -> Result<SocketAddr, HandleError> {
    let port = u16::from_be_bytes([b[1], b[2]]);
    if port == 0 {
        return Err(HandleError::ZeroPort);
    }
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[3..19]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
        6 => IpAddr::V6(Ipv6Addr::from(ip)),
        f => return Err(HandleError::Family(f)),
    };
    Ok(SocketAddr::new(ip, port))
}

impl ListenHandle {
    /// Bytes the encoding of a handle with `ndata` data addresses takes.
    pub const fn encoded_len(ndata: usize) -> usize {
        HEADER + ADDR * (1 + ndata) + CHECKSUM
    }

    /// Encodes into NCCL's 128-byte buffer (unused tail zeroed). Data addresses past
    /// [`MAX_DATA_ADDRS`] are dropped: the caller keeps at most that many.
    pub fn encode(&self) -> [u8; HANDLE_SIZE] {
        let n = self.data.len().min(MAX_DATA_ADDRS);
        let len = Self::encoded_len(n);
        let mut out = [0u8; HANDLE_SIZE];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = n as u8;
        out[6..8].copy_from_slice(&(len as u16).to_be_bytes());
        out[8..16].copy_from_slice(&self.nonce.to_be_bytes());
        put_addr(&mut out[HEADER..HEADER + ADDR], &self.mgmt);
        for (i, a) in self.data.iter().take(n).enumerate() {
            let at = HEADER + ADDR * (1 + i);
            put_addr(&mut out[at..at + ADDR], a);
        }
        let sum = fnv1a32(&out[..len - CHECKSUM]);
        out[len - CHECKSUM..len].copy_from_slice(&sum.to_be_bytes());
        out
    }

    /// Decodes a handle from any bytes; never panics.
    pub fn decode(b: &[u8]) -> Result<ListenHandle, HandleError> {
        if b.len() < Self::encoded_len(0) {
            return Err(HandleError::TooShort(b.len()));
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(HandleError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(HandleError::Version {
                found: b[4],
                supported: VERSION,
            });
        }
        let n = b[5];
        if usize::from(n) > MAX_DATA_ADDRS {
            return Err(HandleError::TooManyAddrs(n));
        }
        let len = Self::encoded_len(usize::from(n));
        let found = u16::from_be_bytes([b[6], b[7]]);
        if usize::from(found) != len {
            return Err(HandleError::Length {
                found,
                expected: len as u16,
            });
        }
        if b.len() < len {
            return Err(HandleError::TooShort(b.len()));
        }
        let sum = u32::from_be_bytes([b[len - 4], b[len - 3], b[len - 2], b[len - 1]]);
        if sum != fnv1a32(&b[..len - CHECKSUM]) {
            return Err(HandleError::Checksum);
        }
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&b[8..16]);
        let mgmt = get_addr(&b[HEADER..HEADER + ADDR])?;
        let data = (0..usize::from(n))
            .map(|i| {
                let at = HEADER + ADDR * (1 + i);
                get_addr(&b[at..at + ADDR])
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListenHandle {
            nonce: u64::from_be_bytes(nonce),
            mgmt,
            data,
        })
    }
}

const _: () = assert!(ListenHandle::encoded_len(MAX_DATA_ADDRS) <= HANDLE_SIZE);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> ListenHandle {
        ListenHandle {
            nonce: 0x0123_4567_89ab_cdef,
            mgmt: "10.0.0.1:4000".parse().unwrap(),
            data: vec![
                "192.168.1.1:5000".parse().unwrap(),
                "[fd00::2]:5001".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(ListenHandle::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn wrong_magic_version_length_are_named() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            ListenHandle::decode(&b),
            Err(HandleError::BadMagic(_))
        ));
        let mut b = good;
        b[4] = 9;
        assert_eq!(
            ListenHandle::decode(&b),
            Err(HandleError::Version {
                found: 9,
                supported: VERSION
            })
        );
        let mut b = good;
        b[7] ^= 1;
        assert!(matches!(
            ListenHandle::decode(&b),
            Err(HandleError::Length { .. })
        ));
        assert_eq!(
            ListenHandle::decode(&good[..20]),
            Err(HandleError::TooShort(20))
        );
        let mut b = good;
        b[20] ^= 0x40;
        assert_eq!(ListenHandle::decode(&b), Err(HandleError::Checksum));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ListenHandle::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_weft_prefixed(mut bytes in proptest::collection::vec(any::<u8>(), 16..200), n in 0u8..8) {
            bytes[..4].copy_from_slice(&MAGIC);
            bytes[4] = VERSION;
            bytes[5] = n;
            let _ = ListenHandle::decode(&bytes);
        }

        #[test]
        fn any_single_bit_flip_is_detected(byte in 0usize..ListenHandle::encoded_len(2), bit in 0u8..8) {
            let h = sample();
            let mut b = h.encode();
            b[byte] ^= 1 << bit;
            prop_assert!(ListenHandle::decode(&b).is_err());
        }
    }
}
