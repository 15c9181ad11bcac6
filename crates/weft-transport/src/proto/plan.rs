//! How a message maps onto the data streams, and which buffer of a grouped receive it lands in.
//! Both sides compute the same plan from the message header and a rotating start stream, so no
//! per-chunk metadata travels.

/// One piece of a message: `len` bytes at `offset`, carried by data stream `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Data stream index.
    pub stream: usize,
    /// Byte offset in the message.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Chunk size the sender picks: the message split evenly over the streams, but never below
/// `min_chunk`, rounded up to 4 KiB.
pub fn chunk_size(size: u64, nstreams: usize, min_chunk: u64) -> u64 {
    let even = size.div_ceil(nstreams.max(1) as u64);
    even.max(min_chunk).max(1).next_multiple_of(4096)
}

/// The chunks of a `size`-byte message cut into `chunk`-byte pieces, round-robin over
/// `nstreams` streams starting at `start`. Lazy, so a huge count from a peer costs nothing.
pub fn chunks(size: u64, chunk: u64, nstreams: usize, start: usize) -> impl Iterator<Item = Chunk> {
    let chunk = chunk.max(1);
    let n = size.div_ceil(chunk);
    let nstreams = nstreams.max(1);
    (0..n).map(move |i| {
        let offset = i * chunk;
        Chunk {
            stream: ((start as u64 + i) % nstreams as u64) as usize,
            offset,
            len: chunk.min(size - offset),
        }
    })
}

/// Which buffer of a grouped receive a message with `tag` goes to: the first buffer with that
/// tag that is still empty. `None` if no buffer matches.
pub fn select_slot(tags: &[i32], filled: &[bool], tag: i32) -> Option<usize> {
    tags.iter().zip(filled).position(|(t, f)| *t == tag && !*f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(chunk_size(0, 4, 65536), 65536);
        assert_eq!(chunk_size(1 << 20, 4, 65536), 1 << 18);
        assert_eq!(chunk_size(100_000, 4, 1), 28672);
        let c: Vec<_> = chunks(10, 4, 2, 1).collect();
        assert_eq!(
            c,
            [
                Chunk {
                    stream: 1,
                    offset: 0,
                    len: 4
                },
                Chunk {
                    stream: 0,
                    offset: 4,
                    len: 4
                },
                Chunk {
                    stream: 1,
                    offset: 8,
                    len: 2
                }
            ]
        );
        assert_eq!(chunks(0, 4, 2, 0).count(), 0);
        assert_eq!(select_slot(&[1, 2, 2], &[false, true, false], 2), Some(2));
        assert_eq!(select_slot(&[1], &[false], 3), None);
    }

    proptest! {
        #[test]
        fn chunks_tile_the_message(size in 0u64..10_000_000, n in 1usize..64, start in 0usize..64, min in 1u64..200_000) {
            let c = chunk_size(size, n, min);
            let mut next = 0;
            for ch in chunks(size, c, n, start) {
                prop_assert_eq!(ch.offset, next);
                prop_assert!(ch.len > 0 && ch.len <= c);
                prop_assert!(ch.stream < n);
                next += ch.len;
            }
            prop_assert_eq!(next, size);
        }
    }
}
