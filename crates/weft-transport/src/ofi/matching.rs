//! A sender's matching of messages to the receiver's buffers (see "Out-of-step tags" in the
//! module docs): message (tag, k) goes into buffer (tag, k), whichever comes first, its
//! `isend` or the CTS that announces the buffer. Pure bookkeeping: the numbering per tag, the
//! sends that wait for their CTS, the CTS that came before their send, and the groups (one
//! per CTS) whose buffers do not all have their message yet.

use super::*;

/// What becomes of one buffer a CTS announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Its send waited for it: start that send now.
    Start(Waiting),
    /// Its message already went without it (eagerly, or early on the lane): nothing to
    /// write (the group counts it as assigned).
    Sent,
    /// For a later isend, which finds it with [`Matching::known`].
    Later,
}

#[derive(Default)]
pub(super) struct Matching {
    /// Per tag, the index the next isend of that tag gets (its k).
    next_k: FastMap<i32, u64>,
    /// Sends that wait for the CTS of their buffer, in isend order.
    waiting: VecDeque<Waiting>,
    /// Receives whose CTS came and that still have a buffer without its message, by a local
    /// number (`next_group`).
    groups: FastMap<u64, Group>,
    next_group: u64,
    /// Buffers whose CTS came before their message was sent: (tag, k) -> (group, buffer).
    known: FastMap<(i32, u64), (u64, usize)>,
}

impl Matching {
    /// The k the next isend of `tag` gets.
    pub(super) fn next_k(&self, tag: i32) -> u64 {
        self.next_k.get(&tag).copied().unwrap_or(0)
    }

    /// The isend of message (tag, k) is accepted: the next of `tag` is k + 1.
    pub(super) fn numbered(&mut self, tag: i32, k: u64) {
        self.next_k.insert(tag, k + 1);
    }

    /// The buffer of message `tk`, when its CTS came first: (group, buffer).
    pub(super) fn known(&self, tk: (i32, u64)) -> Option<(u64, usize)> {
        self.known.get(&tk).copied()
    }

    /// Message `tk` takes the buffer [`Matching::known`] gave it.
    pub(super) fn take_known(&mut self, tk: (i32, u64)) {
        self.known.remove(&tk);
    }

    /// A send waits for the CTS of its buffer.
    pub(super) fn wait(&mut self, w: Waiting) {
        self.waiting.push_back(w);
    }

    /// A CTS announced `n` buffers of receive `rreq`: their group's number.
    pub(super) fn add_group(&mut self, n: usize, rreq: u32, entries: [CtsEntry; MAX_RECVS]) -> u64 {
        let gid = self.next_group;
        self.next_group += 1;
        self.groups.insert(
            gid,
            Group {
                n,
                rreq,
                entries,
                assigned: 0,
            },
        );
        gid
    }

    /// What becomes of buffer `slot` of group `gid`, whose entry is `tk`.
    pub(super) fn fate(&mut self, gid: u64, slot: usize, tk: (i32, u64)) -> Fate {
        if let Some(i) = self.waiting.iter().position(|w| (w.tag, w.k) == tk)
            && let Some(w) = self.waiting.remove(i)
        {
            return Fate::Start(w);
        }
        if tk.1 < self.next_k(tk.0) {
            self.assigned(gid);
            return Fate::Sent;
        }
        self.known.insert(tk, (gid, slot));
        Fate::Later
    }

    /// Buffer `slot` of group `gid` (its CTS entry and receive index), which its message now
    /// takes; `None` when the group is gone.
    pub(super) fn assign(&mut self, gid: u64, slot: usize) -> Option<(CtsEntry, u32)> {
        let g = self.groups.get(&gid)?;
        let e = (g.entries[slot], g.rreq);
        self.assigned(gid);
        Some(e)
    }

    /// One more buffer of group `gid` has its message; the group goes once all have.
    fn assigned(&mut self, gid: u64) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.assigned += 1;
            if g.assigned >= g.n {
                self.groups.remove(&gid);
            }
        }
    }

    /// Whether a send waits for the CTS of one of the buffers `tks`.
    pub(super) fn waits_for_any(&self, tks: &[(i32, u64)]) -> bool {
        self.waiting.iter().any(|w| tks.contains(&(w.tag, w.k)))
    }

    /// Whether message `tk` was handed over (numbered, and not waiting for its CTS).
    pub(super) fn handed_over(&self, tk: (i32, u64)) -> bool {
        tk.1 < self.next_k(tk.0) && !self.waiting.iter().any(|w| (w.tag, w.k) == tk)
    }

    /// Groups still open (tests).
    #[cfg(test)]
    fn open_groups(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: i32, k: u64) -> CtsEntry {
        CtsEntry {
            addr: [0; MAX_RAILS],
            key: [0; MAX_RAILS],
            len: 100,
            tag,
            k,
        }
    }

    fn cts(m: &mut Matching, tks: &[(i32, u64)]) -> (u64, Vec<Fate>) {
        let mut entries = [entry(0, 0); MAX_RECVS];
        for (e, tk) in entries.iter_mut().zip(tks) {
            *e = entry(tk.0, tk.1);
        }
        let gid = m.add_group(tks.len(), 3, entries);
        let fates = tks
            .iter()
            .enumerate()
            .map(|(slot, tk)| m.fate(gid, slot, *tk))
            .collect();
        (gid, fates)
    }

    fn waiting(tag: i32, k: u64, req: RequestId) -> Waiting {
        Waiting {
            tag,
            k,
            ptr: 0,
            len: 10,
            req,
            lane: false,
        }
    }

    #[test]
    fn messages_are_numbered_per_tag() {
        let mut m = Matching::default();
        assert_eq!((m.next_k(1), m.next_k(2)), (0, 0));
        m.numbered(1, 0);
        m.numbered(1, 1);
        m.numbered(2, 0);
        assert_eq!((m.next_k(1), m.next_k(2), m.next_k(3)), (2, 1, 0));
    }

    #[test]
    fn a_cts_starts_the_send_that_waited_for_it_and_keeps_the_rest_for_later_sends() {
        let mut m = Matching::default();
        let mut s = Slab::new(2);
        let id = s.insert(()).expect("room");
        // Message (5, 0) waits; (5, 1) is not sent yet.
        m.numbered(5, 0);
        m.wait(waiting(5, 0, id));
        assert!(m.waits_for_any(&[(9, 9), (5, 0)]));
        assert!(!m.handed_over((5, 0)), "waiting is not handed over");
        let (gid, fates) = cts(&mut m, &[(5, 0), (5, 1)]);
        assert_eq!(fates, [Fate::Start(waiting(5, 0, id)), Fate::Later]);
        assert!(!m.waits_for_any(&[(5, 0)]));
        // The started send takes its buffer; the later isend of (5, 1) finds its.
        assert_eq!(
            m.assign(gid, 0).map(|(e, r)| (e.tag, e.k, r)),
            Some((5, 0, 3))
        );
        assert_eq!(m.known((5, 1)), Some((gid, 1)));
        m.take_known((5, 1));
        assert_eq!(m.known((5, 1)), None);
        assert_eq!(m.open_groups(), 1);
        assert!(m.assign(gid, 1).is_some());
        assert_eq!(
            m.open_groups(),
            0,
            "a group goes once every buffer has its message"
        );
        assert!(m.assign(gid, 1).is_none());
    }

    #[test]
    fn a_buffer_whose_message_went_eagerly_counts_as_assigned() {
        let mut m = Matching::default();
        // (7, 0) and (7, 1) went eagerly before any CTS.
        m.numbered(7, 0);
        m.numbered(7, 1);
        assert!(m.handed_over((7, 1)));
        assert!(!m.handed_over((7, 2)), "not numbered yet");
        let (_, fates) = cts(&mut m, &[(7, 0), (7, 1)]);
        assert_eq!(fates, [Fate::Sent, Fate::Sent]);
        assert_eq!(m.open_groups(), 0);
    }
}
