//! The ofi backend's wire formats, pure: the address record of the handshake, the remote CQ
//! data of RMA writes and eager messages (8- and 4-byte protocols), and the little-endian field
//! helpers. No I/O; property-tested below.

use super::*;

/// What each side tells the other in the handshake. Version 2 adds the remote CQ data bytes
/// (the sender: what it can use; the receiver: what the connection uses, the smaller of both)
/// and, from a receiver using 4 bytes, where its size table is (address or offset, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AddrRecord {
    pub(super) provider: String,
    pub(super) addr: Vec<u8>,
    pub(super) eager_slots: u32,
    pub(super) cq_data: u8,
    pub(super) table: Option<(u64, u64)>,
    /// Addresses of rails 1.. (the sender: its rails; the receiver: those the connection uses).
    pub(super) more: Vec<Vec<u8>>,
    /// The sender: messages under this size go over a TCP lane (`WEFT_OFI_MIN_BYTES`; 0: no
    /// lane). The receiver: echoes it when it opened the lane.
    pub(super) min_bytes: u32,
    /// The receiver: where its TCP lane listens (on its data interface).
    pub(super) lane: Option<SocketAddr>,
    /// Per rail (as `addr`, then `more`): the connection's key on that rail's endpoint (the
    /// tag of messages to it) and its slot there (remote CQ data of writes to it).
    pub(super) ids: Vec<(u64, u32)>,
}

impl AddrRecord {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        p.extend_from_slice(b"WOFI");
        p.push(4);
        p.push(self.provider.len().min(255) as u8);
        p.extend_from_slice(&self.provider.as_bytes()[..self.provider.len().min(255)]);
        p.extend_from_slice(&(self.addr.len() as u16).to_be_bytes());
        p.extend_from_slice(&self.addr);
        p.extend_from_slice(&self.eager_slots.to_be_bytes());
        p.push(self.cq_data);
        let (ta, tk) = self.table.unwrap_or((0, 0));
        p.push(u8::from(self.table.is_some()));
        p.extend_from_slice(&ta.to_be_bytes());
        p.extend_from_slice(&tk.to_be_bytes());
        p.push(self.more.len() as u8);
        for a in &self.more {
            p.extend_from_slice(&(a.len() as u16).to_be_bytes());
            p.extend_from_slice(a);
        }
        p.extend_from_slice(&self.min_bytes.to_be_bytes());
        match self.lane {
            None => p.push(0),
            Some(SocketAddr::V4(a)) => {
                p.push(4);
                p.extend_from_slice(&a.ip().octets());
                p.extend_from_slice(&a.port().to_be_bytes());
            }
            Some(SocketAddr::V6(a)) => {
                p.push(6);
                p.extend_from_slice(&a.ip().octets());
                p.extend_from_slice(&a.port().to_be_bytes());
            }
        }
        p.push(self.ids.len() as u8);
        for (key, slot) in &self.ids {
            p.extend_from_slice(&key.to_be_bytes());
            p.extend_from_slice(&slot.to_be_bytes());
        }
        Frame::encode_msg(out, ADDR_TAG, Some(&p), p.len() as u64, 0);
    }

    /// Version 4 only: the tags and slots of shared endpoints (versions 1 and 2 had one
    /// endpoint per connection; version 3 matched messages to buffers by sequence ranges, not
    /// by (tag, k), and would place a peer of this version's messages in other buffers).
    pub(super) fn decode(p: &[u8]) -> Option<AddrRecord> {
        if p.len() < 6 || &p[..4] != b"WOFI" || p[4] != 4 {
            return None;
        }
        let pl = p[5] as usize;
        let provider = String::from_utf8(p.get(6..6 + pl)?.to_vec()).ok()?;
        let at = 6 + pl;
        let al = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
        let addr = p.get(at + 2..at + 2 + al)?.to_vec();
        let at = at + 2 + al;
        let eager_slots = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?);
        let at = at + 4;
        let cq_data = *p.get(at)?;
        let has = *p.get(at + 1)? != 0;
        let ta = u64::from_be_bytes(p.get(at + 2..at + 10)?.try_into().ok()?);
        let tk = u64::from_be_bytes(p.get(at + 10..at + 18)?.try_into().ok()?);
        let n = *p.get(at + 18)? as usize;
        if n >= MAX_RAILS {
            return None;
        }
        let mut at = at + 19;
        let mut more = Vec::with_capacity(n);
        for _ in 0..n {
            let l = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
            more.push(p.get(at + 2..at + 2 + l)?.to_vec());
            at += 2 + l;
        }
        let min_bytes = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?);
        let at = at + 4;
        let ip_len = match *p.get(at)? {
            0 => 0,
            4 => 4,
            6 => 16,
            _ => return None,
        };
        let mut lane = None;
        if ip_len > 0 {
            let ip: IpAddr = if ip_len == 4 {
                <[u8; 4]>::try_from(p.get(at + 1..at + 5)?).ok()?.into()
            } else {
                <[u8; 16]>::try_from(p.get(at + 1..at + 17)?).ok()?.into()
            };
            let port =
                u16::from_be_bytes(p.get(at + 1 + ip_len..at + 3 + ip_len)?.try_into().ok()?);
            lane = Some(SocketAddr::new(ip, port));
        }
        let at = at + 1 + if ip_len > 0 { ip_len + 2 } else { 0 };
        let k = *p.get(at)? as usize;
        if k != 1 + n {
            return None;
        }
        let mut ids = Vec::with_capacity(k);
        for i in 0..k {
            let o = at + 1 + 12 * i;
            let key = u64::from_be_bytes(p.get(o..o + 8)?.try_into().ok()?);
            let slot = u32::from_be_bytes(p.get(o + 8..o + 12)?.try_into().ok()?);
            ids.push((key, slot));
        }
        Some(AddrRecord {
            provider,
            addr,
            eager_slots,
            cq_data,
            table: has.then_some((ta, tk)),
            more,
            min_bytes,
            lane,
            ids,
        })
    }
}

pub(super) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(super) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(super) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
pub(super) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// What one remote CQ data says.
#[derive(Debug, Clone, Copy)]
pub(super) enum WriteEvent {
    /// One of `parts` stripes of data for buffer `slot` of request `idx`, with the message
    /// size if it came along.
    Data {
        idx: usize,
        slot: usize,
        parts: usize,
        size: Option<usize>,
        check: Option<u64>,
    },
    /// The size record of buffer `slot` of request `idx` is in the size table.
    Record { idx: usize, slot: usize, check: u64 },
}

/// The per-tag index k whose low [`EAGER_SEQ_BITS`] are `low`, nearest to `next` (the
/// receiver's next buffer of that tag): within `next - 2048 .. next + 2048` (from 0 while
/// `next` is smaller).
pub(super) fn eager_seq(low: u64, next: u64) -> u64 {
    nearest(low, EAGER_SEQ_BITS, next)
}

/// The number whose low `bits` are `low`, nearest to `next`: within `next - 2^(bits-1) ..
/// next + 2^(bits-1)` (from 0 while `next` is smaller).
pub(super) fn nearest(low: u64, bits: u32, next: u64) -> u64 {
    let mask = (1u64 << bits) - 1;
    let base = next.saturating_sub(1 << (bits - 1));
    base + (low.wrapping_sub(base) & mask)
}

pub(super) fn decode_cq_data(cq4: bool, data: u64) -> Option<WriteEvent> {
    if !cq4 {
        let parts = ((data >> W8_PARTS_SHIFT) & 0x7) as usize;
        if parts > MAX_RAILS {
            return None;
        }
        return Some(WriteEvent::Data {
            idx: ((data >> W8_REQ_SHIFT) & 0x3f) as usize,
            slot: (data & 0x7) as usize,
            parts: parts.max(1),
            size: Some((data >> 32) as usize),
            check: None,
        });
    }
    let idx = (data & ((1 << IMM_SLOT_SHIFT) - 1)) as usize;
    let slot = ((data >> IMM_SLOT_SHIFT) & 0x7) as usize;
    let check = (data >> IMM_CHECK_SHIFT) & IMM_CHECK_MASK;
    match (data >> IMM_KIND_SHIFT) & 0x3 {
        IMM_SIZED => Some(WriteEvent::Data {
            idx,
            slot,
            parts: 1,
            size: Some(((data >> IMM_SIZE_SHIFT) & 0xffff) as usize),
            check: Some(check),
        }),
        IMM_DATA if (data >> IMM_SIZE_SHIFT) as usize <= MAX_RAILS => Some(WriteEvent::Data {
            idx,
            slot,
            parts: ((data >> IMM_SIZE_SHIFT) as usize).max(1),
            size: None,
            check: Some(check),
        }),
        IMM_RECORD if data >> IMM_SIZE_SHIFT == 0 => Some(WriteEvent::Record { idx, slot, check }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_payload(r: &AddrRecord) -> Vec<u8> {
        let mut v = Vec::new();
        r.encode(&mut v);
        let mut d = FrameDecoder::new();
        d.handle_bytes(&v);
        match d.poll_frame() {
            Ok(Some(Frame::Msg(h))) => h.inline.unwrap_or_default(),
            f => panic!("not a MSG frame: {f:?}"),
        }
    }

    #[test]
    fn address_records_round_trip_and_need_version_3() {
        let r = AddrRecord {
            provider: "verbs;ofi_rxm".into(),
            addr: vec![1, 2, 3, 4],
            eager_slots: 64,
            cq_data: 4,
            table: Some((0xdead_beef_0000, 42)),
            more: vec![vec![5, 6, 7], vec![8; 40]],
            min_bytes: 65536,
            lane: Some("[fd00::2]:4321".parse().unwrap()),
            ids: vec![(7, 0), (u64::MAX, 0xf_ffff), (1 << 40, 3)],
        };
        let p = record_payload(&r);
        assert_eq!(AddrRecord::decode(&p), Some(r.clone()));
        let v4 = AddrRecord {
            lane: Some("10.1.2.3:999".parse().unwrap()),
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&v4)), Some(v4));
        // More rails than MAX_RAILS: refused.
        let many = AddrRecord {
            more: vec![vec![1]; MAX_RAILS],
            ids: vec![(1, 1); MAX_RAILS + 1],
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&many)), None);
        // Not one id per rail: refused.
        let short = AddrRecord {
            ids: vec![(1, 1)],
            ..r.clone()
        };
        assert_eq!(AddrRecord::decode(&record_payload(&short)), None);
        let one = AddrRecord {
            more: Vec::new(),
            min_bytes: 0,
            lane: None,
            ids: vec![(9, 2)],
            ..r
        };
        let p = record_payload(&one);
        assert_eq!(AddrRecord::decode(&p), Some(one));
        // Truncated records are refused, not misread; so are versions 1 and 2 (an endpoint
        // per connection, untagged messages), 3 (matching by sequence ranges) and unknown ones.
        assert_eq!(AddrRecord::decode(&p[..p.len() - 1]), None);
        for v in [1, 2, 3, 5] {
            let mut other = p.clone();
            other[4] = v;
            assert_eq!(AddrRecord::decode(&other), None, "version {v}");
        }
    }

    #[test]
    fn per_tag_indexes_come_back_from_their_low_bits() {
        // An eager message's k is at most the sender's requests plus its eager credit ahead of
        // the receiver's next buffer of its tag, and at most the posted buffers behind it.
        let ahead = (MAX_SEND_REQUESTS + EAGER_SLOTS) as u64;
        let behind = (MAX_RECV_REQUESTS * MAX_RECVS) as u64;
        for next in [0u64, 1, 500, 2047, 2048, 4095, 4096, 4097, 10_000, 1 << 40] {
            for seq in next.saturating_sub(behind)..next + ahead {
                assert_eq!(eager_seq(seq & EAGER_SEQ_MASK, next), seq, "next {next}");
            }
        }
    }

    #[test]
    fn four_byte_cq_data_encodes_request_buffer_kind_stripes_and_check() {
        let base = 63 | (7 << IMM_SLOT_SHIFT) | (0x15 << IMM_CHECK_SHIFT);
        let sized = base | (IMM_SIZED << IMM_KIND_SHIFT) | (0xffff << IMM_SIZE_SHIFT);
        assert!(sized <= u64::from(u32::MAX));
        match decode_cq_data(true, sized) {
            Some(WriteEvent::Data {
                idx: 63,
                slot: 7,
                parts: 1,
                size: Some(0xffff),
                check: Some(0x15),
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(true, base | (IMM_DATA << IMM_KIND_SHIFT)) {
            Some(WriteEvent::Data {
                parts: 1,
                size: None,
                check: Some(0x15),
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        let striped = base | (IMM_DATA << IMM_KIND_SHIFT) | (3 << IMM_SIZE_SHIFT);
        match decode_cq_data(true, striped) {
            Some(WriteEvent::Data {
                parts: 3,
                size: None,
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(true, base | (IMM_RECORD << IMM_KIND_SHIFT)) {
            Some(WriteEvent::Record {
                idx: 63,
                slot: 7,
                check: 0x15,
            }) => {}
            e => panic!("{e:?}"),
        }
        // Kind 3, too many stripes, and bits on a record are protocol errors.
        assert!(decode_cq_data(true, base | (3 << IMM_KIND_SHIFT)).is_none());
        let too_many = (MAX_RAILS as u64 + 1) << IMM_SIZE_SHIFT;
        assert!(decode_cq_data(true, base | (IMM_DATA << IMM_KIND_SHIFT) | too_many).is_none());
        let rec = base | (IMM_RECORD << IMM_KIND_SHIFT) | (1 << IMM_SIZE_SHIFT);
        assert!(decode_cq_data(true, rec).is_none());
        // The 8-byte layout: size << 32 | receiver's slot << 12 | stripes << 9 | request << 3
        // | buffer; the slot routes the completion (shared.rs) and is no part of the event.
        let slot_bits = 0xf_ffff << shared::SLOT_SHIFT;
        match decode_cq_data(false, (5 << 32) | slot_bits | (3 << W8_REQ_SHIFT) | 2) {
            Some(WriteEvent::Data {
                idx: 3,
                slot: 2,
                parts: 1,
                size: Some(5),
                check: None,
            }) => {}
            e => panic!("{e:?}"),
        }
        match decode_cq_data(
            false,
            (1 << 40) | (2 << W8_PARTS_SHIFT) | (63 << W8_REQ_SHIFT) | 7,
        ) {
            Some(WriteEvent::Data {
                idx: 63,
                slot: 7,
                parts: 2,
                size: Some(0x100),
                ..
            }) => {}
            e => panic!("{e:?}"),
        }
        assert!(decode_cq_data(false, (MAX_RAILS as u64 + 1) << W8_PARTS_SHIFT).is_none());
    }

    proptest::proptest! {
        /// Any record round-trips through encode and decode, and every strict prefix of its
        /// payload is refused (never misread).
        #[test]
        fn any_address_record_round_trips_and_its_prefixes_are_refused(
            provider in "[a-z;_]{0,40}",
            addr in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            eager_slots in proptest::num::u32::ANY,
            cq_data in proptest::num::u8::ANY,
            table in proptest::option::of((proptest::num::u64::ANY, proptest::num::u64::ANY)),
            more in proptest::collection::vec(
                proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..MAX_RAILS),
            min_bytes in proptest::num::u32::ANY,
            lane in proptest::option::of((proptest::num::u32::ANY, proptest::num::u16::ANY, proptest::bool::ANY)),
            id_seed in proptest::num::u64::ANY,
        ) {
            let lane = lane.map(|(ip, port, v6)| {
                if v6 {
                    SocketAddr::new(std::net::Ipv6Addr::from(u128::from(ip) << 64 | 1).into(), port)
                } else {
                    SocketAddr::new(std::net::Ipv4Addr::from(ip).into(), port)
                }
            });
            let ids = (0..=more.len() as u64)
                .map(|k| (id_seed.rotate_left(k as u32 * 7), (id_seed >> k) as u32))
                .collect();
            let r = AddrRecord { provider, addr, eager_slots, cq_data, table, more, min_bytes, lane, ids };
            let p = record_payload(&r);
            proptest::prop_assert_eq!(AddrRecord::decode(&p), Some(r));
            for cut in 0..p.len() {
                proptest::prop_assert_eq!(AddrRecord::decode(&p[..cut]), None, "prefix {}", cut);
            }
        }

        /// Decoding remote CQ data never panics and yields indexes within the request and
        /// buffer limits, whatever the 64 bits (a peer's garbage is refused or bounded).
        #[test]
        fn any_cq_data_decodes_within_the_limits(data in proptest::num::u64::ANY, cq4 in proptest::bool::ANY) {
            let data = if cq4 { data & u64::from(u32::MAX) } else { data };
            match decode_cq_data(cq4, data) {
                None => {}
                Some(WriteEvent::Data { idx, slot, parts, .. }) => {
                    proptest::prop_assert!(slot < MAX_RECVS);
                    proptest::prop_assert!(!cq4 || idx < MAX_RECV_REQUESTS);
                    proptest::prop_assert!(parts >= 1);
                }
                Some(WriteEvent::Record { idx, slot, .. }) => {
                    proptest::prop_assert!(cq4 && idx < MAX_RECV_REQUESTS && slot < MAX_RECVS);
                }
            }
        }

        /// A per-tag index comes back from its low bits anywhere in the window the protocol
        /// keeps it in: for an eager message's 12 bits, the sender's requests and eager credit
        /// ahead of the receiver's next buffer of the tag, the posted buffers behind it; for a
        /// CTS entry's 32 bits, the same around the sender's next send of the tag.
        #[test]
        fn any_per_tag_index_in_the_window_comes_back(
            next in 0u64..(1 << 50),
            back in 0u64..=(MAX_RECV_REQUESTS * MAX_RECVS) as u64,
            ahead in 0u64..(MAX_SEND_REQUESTS + EAGER_SLOTS) as u64,
            forward in proptest::bool::ANY,
        ) {
            let k = if forward { next + ahead } else { next.saturating_sub(back) };
            proptest::prop_assert_eq!(eager_seq(k & EAGER_SEQ_MASK, next), k);
            proptest::prop_assert_eq!(nearest(k & u64::from(u32::MAX), 32, next), k);
        }
    }
}
