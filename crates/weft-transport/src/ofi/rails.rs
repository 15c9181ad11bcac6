//! How a sender spreads its RMA writes over its rails (see "Rails" in the module docs): a
//! message of at least the stripe size is cut into one stripe per rail, a smaller one goes
//! whole to the rails in turn; and the bytes written per rail. Pure: the endpoints are the
//! connection's.

use super::*;

/// One write of a message: on `rail`, `len` bytes from `off` into the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stripe {
    pub(super) rail: usize,
    pub(super) off: usize,
    pub(super) len: usize,
}

pub(super) struct Rails {
    /// Rails of the connection (at least 1, at most [`MAX_RAILS`]).
    n: usize,
    /// Messages of at least this size are striped across the rails.
    stripe: usize,
    /// Rail of the latest unstriped message (round robin).
    next: usize,
    /// Bytes written per rail (statistics).
    bytes: [u64; MAX_RAILS],
}

impl Rails {
    /// `n` rails striping from `stripe` bytes on (never under 4 KiB).
    pub(super) fn new(n: usize, stripe: usize) -> Rails {
        Rails {
            n,
            stripe: stripe.max(4096),
            next: 0,
            bytes: [0; MAX_RAILS],
        }
    }

    /// The writes of a message of `len` bytes, in order (the receiver learns their number
    /// from the CQ data): one stripe per rail from the threshold on, else the whole message
    /// on the next rail in turn.
    pub(super) fn split(&mut self, len: usize) -> impl ExactSizeIterator<Item = Stripe> + use<> {
        let n = self.n;
        let parts = if n > 1 && len >= self.stripe { n } else { 1 };
        let chunk = len.div_ceil(parts);
        let rail0 = if parts == 1 {
            self.next = (self.next + 1) % n;
            self.next
        } else {
            0
        };
        (0..parts).map(move |k| {
            let off = (k * chunk).min(len);
            Stripe {
                rail: if parts == 1 { rail0 } else { k },
                off,
                len: chunk.min(len - off),
            }
        })
    }

    /// `len` bytes of message data went out on `rail`.
    pub(super) fn wrote(&mut self, rail: usize, len: usize) {
        self.bytes[rail] += len as u64;
    }

    /// Bytes of message data written on each rail so far.
    pub(super) fn bytes(&self) -> Vec<u64> {
        self.bytes[..self.n].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_go_whole_to_the_rails_in_turn() {
        let mut r = Rails::new(3, 1 << 20);
        let rails: Vec<usize> = (0..6)
            .map(|_| {
                let s: Vec<Stripe> = r.split(1000).collect();
                assert_eq!(s.len(), 1);
                assert_eq!((s[0].off, s[0].len), (0, 1000));
                s[0].rail
            })
            .collect();
        assert_eq!(rails, [1, 2, 0, 1, 2, 0]);
        // One rail: always rail 0, however large.
        let mut one = Rails::new(1, 4096);
        let s: Vec<Stripe> = one.split(10 << 20).collect();
        assert_eq!(
            s,
            [Stripe {
                rail: 0,
                off: 0,
                len: 10 << 20
            }]
        );
    }

    #[test]
    fn large_messages_are_cut_into_one_stripe_per_rail_covering_every_byte() {
        let mut r = Rails::new(3, 8192);
        for len in [8192usize, 8193, 100_000, 3 << 20] {
            let s: Vec<Stripe> = r.split(len).collect();
            assert_eq!(s.len(), 3, "{len}");
            let mut at = 0;
            for (k, p) in s.iter().enumerate() {
                assert_eq!(p.rail, k);
                assert_eq!(p.off, at, "stripes are contiguous");
                at += p.len;
            }
            assert_eq!(at, len, "{len}: every byte once");
        }
        // Striping does not move the round robin of small messages.
        assert_eq!(r.split(10).next().map(|s| s.rail), Some(1));
        // The stripe threshold is at least 4 KiB.
        let mut low = Rails::new(2, 0);
        assert_eq!(low.split(4095).count(), 1);
        assert_eq!(low.split(4096).count(), 2);
    }

    #[test]
    fn an_empty_message_is_one_write_of_nothing() {
        let mut r = Rails::new(2, 4096);
        let s: Vec<Stripe> = r.split(0).collect();
        assert_eq!(
            s,
            [Stripe {
                rail: 1,
                off: 0,
                len: 0
            }]
        );
    }

    #[test]
    fn bytes_are_counted_per_rail_of_the_connection() {
        let mut r = Rails::new(2, 4096);
        r.wrote(0, 10);
        r.wrote(1, 5);
        r.wrote(0, 1);
        assert_eq!(r.bytes(), [11, 5]);
    }
}
