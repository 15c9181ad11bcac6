//! A sender's eager bounce slots and credit (see "Eager" in the module docs): which slots are
//! free, which message each busy one carries, the queue of eager sends the provider has not
//! accepted yet, and how many messages the receiver may still take without a CTS. Pure
//! bookkeeping: the registered slots themselves are the connection's `Pool`.

use super::*;

/// One eager send not yet accepted by the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueuedEager {
    pub(super) slot: usize,
    pub(super) len: usize,
    pub(super) req: RequestId,
    pub(super) tag: i32,
    /// The caller's buffer when the message goes from it, else 0: from the bounce slot.
    pub(super) src: usize,
}

/// What one busy bounce slot carries.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The (tag, k) of its message; `None`: the slot is free.
    tk: Option<(i32, u64)>,
    /// Whether a CTS named its buffer since (its receive is posted, so its completion is
    /// timed).
    covered: bool,
    /// The request its completion completes, once `fi_send` took it.
    req: Option<RequestId>,
}

pub(super) struct EagerSlots {
    free: Vec<usize>,
    busy: usize,
    queue: VecDeque<QueuedEager>,
    slots: [Slot; EAGER_SLOTS],
    /// Messages sent without their buffer (eagerly, or early on the lane), and those the
    /// receiver reported consumed: their difference is the credit in use.
    sent: u64,
    consumed: u64,
    /// The receiver's credit: how many it takes before it reports them consumed.
    peer_slots: u64,
}

impl EagerSlots {
    pub(super) fn new(peer_slots: u32) -> EagerSlots {
        EagerSlots {
            free: (0..EAGER_SLOTS).rev().collect(),
            busy: 0,
            queue: VecDeque::new(),
            slots: [Slot::default(); EAGER_SLOTS],
            sent: 0,
            consumed: 0,
            peer_slots: u64::from(peer_slots),
        }
    }

    /// Whether the receiver can take one more message without its buffer's CTS.
    pub(super) fn has_credit(&self) -> bool {
        self.sent - self.consumed < self.peer_slots
    }

    /// A CTS reported `consumed` messages taken (they only ever grow).
    pub(super) fn on_consumed(&mut self, consumed: u64) {
        self.consumed = self.consumed.max(consumed);
    }

    /// One message went without its buffer by another way (early on the lane).
    pub(super) fn spend_credit(&mut self) {
        self.sent += 1;
    }

    /// Whether a bounce slot is free.
    pub(super) fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Takes a free slot for message `tk` of request `req` and queues it for the provider
    /// (spending credit); `None` when every slot is busy.
    pub(super) fn take(
        &mut self,
        tk: (i32, u64),
        len: usize,
        req: RequestId,
        src: usize,
    ) -> Option<usize> {
        let slot = self.free.pop()?;
        self.busy += 1;
        self.slots[slot] = Slot {
            tk: Some(tk),
            covered: false,
            req: None,
        };
        self.sent += 1;
        self.queue.push_back(QueuedEager {
            slot,
            len,
            req,
            tag: tk.0,
            src,
        });
        Some(slot)
    }

    /// The oldest eager send the provider has not accepted yet.
    pub(super) fn front(&self) -> Option<QueuedEager> {
        self.queue.front().copied()
    }

    /// The k of the message in `slot` (0 for a free one).
    pub(super) fn k(&self, slot: usize) -> u64 {
        self.slots[slot].tk.map_or(0, |x| x.1)
    }

    /// The provider took the front send: its completion completes its request.
    pub(super) fn accepted(&mut self) {
        if let Some(q) = self.queue.pop_front() {
            self.slots[q.slot].req = Some(q.req);
        }
    }

    /// A CTS named the buffer of message `tk`: if it is still in flight eagerly, its receive
    /// is posted, so its completion is timed from now on.
    pub(super) fn cover(&mut self, tk: (i32, u64)) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.tk == Some(tk)) {
            s.covered = true;
        }
    }

    /// `slot`'s send completed: the slot is free again; the request it completes, if the
    /// provider had taken it.
    pub(super) fn completed(&mut self, slot: usize) -> Option<RequestId> {
        self.free.push(slot);
        self.busy -= 1;
        let s = std::mem::take(&mut self.slots[slot]);
        s.req
    }

    /// Slots whose send has not completed.
    pub(super) fn busy(&self) -> usize {
        self.busy
    }

    /// Whether a send in flight is timed: one whose receive a CTS has shown posted.
    pub(super) fn timed(&self) -> bool {
        self.busy > 0 && self.slots.iter().any(|s| s.covered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<RequestId> {
        let mut s = Slab::new(n);
        (0..n).map(|_| s.insert(()).expect("room")).collect()
    }

    #[test]
    fn credit_is_what_the_receiver_has_not_reported_consumed() {
        let mut e = EagerSlots::new(2);
        let id = ids(3);
        assert!(e.has_credit());
        assert!(e.take((7, 0), 8, id[0], 0).is_some());
        e.spend_credit();
        assert!(!e.has_credit(), "two messages out against a credit of two");
        // An older report changes nothing; a newer one gives credit back.
        e.on_consumed(1);
        e.on_consumed(0);
        assert!(e.has_credit());
        assert!(e.take((7, 2), 8, id[2], 0).is_some());
        assert!(!e.has_credit());
    }

    #[test]
    fn a_slot_is_busy_from_take_to_completion_and_completes_its_request_once_accepted() {
        let mut e = EagerSlots::new(EAGER_SLOTS as u32);
        let id = ids(2);
        let a = e.take((1, 5), 100, id[0], 0xabc).expect("slot");
        let b = e.take((1, 6), 0, id[1], 0).expect("slot");
        assert_ne!(a, b);
        assert_eq!(e.busy(), 2);
        assert_eq!(e.k(a), 5);
        let f = e.front().expect("queued");
        assert_eq!(
            (f.slot, f.len, f.req, f.tag, f.src),
            (a, 100, id[0], 1, 0xabc)
        );
        // Accepted in order: the front is the next one.
        e.accepted();
        assert_eq!(e.front().map(|q| q.slot), Some(b));
        // The accepted one's completion completes its request and frees the slot.
        assert_eq!(e.completed(a), Some(id[0]));
        assert_eq!(e.busy(), 1);
        assert_eq!(e.k(a), 0);
        // A completion of a slot the provider never took completes no request.
        assert_eq!(e.completed(b), None);
        assert_eq!(e.busy(), 0);
        assert!(
            e.front().is_some(),
            "the queue is the provider's, not the completion's"
        );
    }

    #[test]
    fn every_slot_can_be_taken_once_until_it_completes() {
        let mut e = EagerSlots::new(u32::MAX);
        let mut s = Slab::new(EAGER_SLOTS + 1);
        let mut taken = Vec::new();
        for k in 0..EAGER_SLOTS as u64 {
            let id = s.insert(()).expect("room");
            taken.push(e.take((0, k), 1, id, 0).expect("a free slot"));
            e.accepted();
        }
        taken.sort_unstable();
        taken.dedup();
        assert_eq!(taken.len(), EAGER_SLOTS);
        assert!(!e.has_free());
        let id = s.insert(()).expect("room");
        assert_eq!(e.take((0, 99), 1, id, 0), None);
        e.completed(taken[3]);
        assert!(e.has_free());
        assert_eq!(e.take((0, 99), 1, id, 0), Some(taken[3]));
    }

    #[test]
    fn only_a_covered_send_in_flight_is_timed() {
        let mut e = EagerSlots::new(8);
        let id = ids(2);
        let a = e.take((3, 0), 1, id[0], 0).expect("slot");
        e.take((3, 1), 1, id[1], 0).expect("slot");
        assert!(!e.timed(), "no CTS named either buffer");
        e.cover((4, 0));
        assert!(!e.timed(), "another tag's buffer");
        e.cover((3, 0));
        assert!(e.timed());
        // Its completion ends the timing; the other is still not covered.
        e.completed(a);
        assert!(!e.timed());
    }
}
