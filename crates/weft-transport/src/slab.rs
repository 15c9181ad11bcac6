//! The request table of a connection, for both backends: fixed-capacity slots whose ids carry
//! a generation, so that an id of a request already released never reaches a later one in
//! the same slot. The index part of an id stays below the capacity, as NCCL's plugin API
//! needs (it sizes its own tables by the in-flight limit).

use crate::common::RequestId;
use crate::error::{Error, Result};

#[derive(Debug)]
pub(crate) struct Slab<T> {
    /// Per slot: its generation and what it holds.
    slots: Vec<(u32, Option<T>)>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    pub(crate) fn new(cap: usize) -> Slab<T> {
        Slab {
            slots: (0..cap).map(|_| (0, None)).collect(),
            free: (0..cap).rev().collect(),
        }
    }

    /// Stores `v`; `None` when every slot is taken.
    pub(crate) fn insert(&mut self, v: T) -> Option<RequestId> {
        let i = self.free.pop()?;
        let slot = &mut self.slots[i];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(v);
        Some(RequestId::from_raw((u64::from(slot.0) << 32) | i as u64))
    }

    /// Whether `id` is the request its slot holds now (not an earlier one's).
    fn current(&self, id: RequestId) -> bool {
        self.slots
            .get(id.index())
            .is_some_and(|(g, _)| u64::from(*g) == id.raw() >> 32)
    }

    pub(crate) fn get(&self, id: RequestId) -> Option<&T> {
        if !self.current(id) {
            return None;
        }
        self.slots[id.index()].1.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: RequestId) -> Option<&mut T> {
        if !self.current(id) {
            return None;
        }
        self.slots[id.index()].1.as_mut()
    }

    /// The request `id` that a `test` asks about: a usage error naming it when it is not in
    /// flight (`what`: "send" or "receive").
    pub(crate) fn tested(&mut self, id: RequestId, what: &str) -> Result<&mut T> {
        self.get_mut(id)
            .ok_or_else(|| Error::Usage(format!("unknown {what} request {id:?}")))
    }

    /// What slot `i` holds, whatever its generation.
    pub(crate) fn at(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i)?.1.as_mut()
    }

    pub(crate) fn remove(&mut self, id: RequestId) -> Option<T> {
        if !self.current(id) {
            return None;
        }
        let out = self.slots[id.index()].1.take();
        if out.is_some() {
            self.free.push(id.index());
        }
        out
    }

    /// Slots taken.
    pub(crate) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|(_, v)| v.as_ref())
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|(_, v)| v.as_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testing_an_id_not_in_flight_is_a_usage_error_naming_it() {
        let mut s = Slab::new(1);
        let a = s.insert(7).unwrap();
        assert_eq!(s.tested(a, "send").map(|v| *v).ok(), Some(7));
        s.remove(a);
        match s.tested(a, "receive") {
            Err(Error::Usage(m)) => assert_eq!(m, format!("unknown receive request {a:?}")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_released_id_does_not_reach_the_next_request_in_its_slot() {
        let mut s = Slab::new(2);
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert!(s.insert("c").is_none(), "capacity 2");
        assert_eq!(s.live(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None, "removed twice");
        let c = s.insert("c").unwrap();
        assert_eq!(c.index(), a.index(), "the freed slot is reused");
        assert_ne!(c, a);
        assert_eq!(s.get(a), None, "stale id");
        assert_eq!(s.get_mut(a), None, "stale id");
        assert_eq!(s.remove(a), None, "stale id");
        assert_eq!(s.get(c), Some(&"c"));
        assert_eq!(s.at(c.index()), Some(&mut "c"));
        assert_eq!(s.values().count(), 2);
        assert!(b.index() < 2 && c.index() < 2);
    }
}
