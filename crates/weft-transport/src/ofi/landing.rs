//! Where the message of one posted receive buffer stands: copied in whole (eager, lane), or
//! arriving by RMA in stripes whose number and size the remote CQ data (or a size record of
//! the 4-byte protocol) tells. Pure: the receiver decodes the CQ data and checks that a write
//! is for this posting of the buffer (its k); this checks the rest and says when it is
//! complete.

/// What is wrong with a write completion for a buffer: each names what a broken or confused
/// peer sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Misfit {
    /// A data write whose stripe count differs from the buffer's message's.
    Another,
    /// A second size record.
    AnotherRecord,
    /// More bytes or stripes than the buffer holds.
    TooLarge,
}

impl Misfit {
    pub(super) fn what(self) -> &'static str {
        match self {
            Misfit::Another => "write completion of another message",
            Misfit::AnotherRecord => "size record of another message",
            Misfit::TooLarge => "write larger than its buffer",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Landing {
    /// Taken by a message (its first data or eager message arrived).
    filled: bool,
    /// Data writes arrived.
    got: usize,
    /// Data writes (stripes) the message comes in (0: not known yet).
    parts: usize,
    /// Size of the message, once known.
    known: Option<usize>,
    /// All of the data and its size are there.
    complete: bool,
    /// Size of the message, once complete.
    size: usize,
}

impl Landing {
    /// A whole message of `len` bytes was copied in: complete.
    pub(super) fn placed(&mut self, len: usize) {
        self.filled = true;
        self.complete = true;
        self.size = len;
    }

    /// A data write of a message in `parts` stripes arrived, with the message's size when its
    /// CQ data carries it.
    pub(super) fn on_data(&mut self, size: Option<usize>, parts: usize) -> Result<(), Misfit> {
        if self.parts != 0 && self.parts != parts {
            return Err(Misfit::Another);
        }
        self.filled = true;
        self.got += 1;
        self.parts = parts;
        if size.is_some() {
            self.known = size;
        }
        Ok(())
    }

    /// The size record of the message arrived (4-byte protocol).
    pub(super) fn on_record(&mut self, size: usize) -> Result<(), Misfit> {
        if self.known.is_some() {
            return Err(Misfit::AnotherRecord);
        }
        self.known = Some(size);
        Ok(())
    }

    /// After a write: whether the message became complete now (every stripe and its size
    /// are there), for a buffer of `cap` bytes.
    pub(super) fn settle(&mut self, cap: usize) -> Result<bool, Misfit> {
        let Some(size) = self.known else {
            return Ok(false);
        };
        if size > cap || (self.parts != 0 && self.got > self.parts) {
            return Err(Misfit::TooLarge);
        }
        if self.parts != 0 && self.got == self.parts {
            self.complete = true;
            self.size = size;
            return Ok(true);
        }
        Ok(false)
    }

    pub(super) fn complete(&self) -> bool {
        self.complete
    }

    /// Part of a message is here (a stripe, or the data without its size record): its sender
    /// is polling and the rest is due.
    pub(super) fn partial(&self) -> bool {
        self.filled && !self.complete
    }

    /// The message's size (0 until complete).
    pub(super) fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_copied_in_whole_is_complete() {
        let mut l = Landing::default();
        assert!(!l.complete() && !l.partial());
        l.placed(12);
        assert!(l.complete() && !l.partial());
        assert_eq!(l.size(), 12);
    }

    #[test]
    fn a_striped_message_completes_with_its_last_stripe() {
        let mut l = Landing::default();
        l.on_data(Some(3000), 3).expect("first stripe");
        assert!(l.partial());
        assert_eq!(l.settle(4096), Ok(false));
        l.on_data(Some(3000), 3).expect("second");
        assert_eq!(l.settle(4096), Ok(false));
        l.on_data(Some(3000), 3).expect("third");
        assert_eq!(l.settle(4096), Ok(true));
        assert!(l.complete() && !l.partial());
        assert_eq!(l.size(), 3000);
    }

    #[test]
    fn with_a_size_record_the_message_completes_when_data_and_record_are_both_there() {
        // Record first, then the data.
        let mut l = Landing::default();
        l.on_record(70_000).expect("record");
        assert!(!l.partial(), "a record alone takes no bytes of the buffer");
        assert_eq!(l.settle(1 << 20), Ok(false));
        l.on_data(None, 1).expect("data");
        assert_eq!(l.settle(1 << 20), Ok(true));
        assert_eq!(l.size(), 70_000);
        // Data first, then the record.
        let mut l = Landing::default();
        l.on_data(None, 1).expect("data");
        assert_eq!(l.settle(1 << 20), Ok(false), "size not known yet");
        assert!(l.partial());
        l.on_record(70_000).expect("record");
        assert_eq!(l.settle(1 << 20), Ok(true));
    }

    #[test]
    fn writes_of_another_message_or_too_large_are_refused() {
        let mut l = Landing::default();
        l.on_data(Some(10), 2).expect("first stripe");
        assert_eq!(l.on_data(Some(10), 3), Err(Misfit::Another));
        let mut l = Landing::default();
        l.on_record(5).expect("record");
        assert_eq!(l.on_record(5), Err(Misfit::AnotherRecord));
        let mut l = Landing::default();
        l.on_data(Some(5000), 1).expect("data");
        assert_eq!(l.settle(4096), Err(Misfit::TooLarge));
        let mut l = Landing::default();
        l.on_data(Some(10), 1).expect("data");
        l.on_data(Some(10), 1).expect("data");
        assert_eq!(
            l.settle(4096),
            Err(Misfit::TooLarge),
            "more stripes than it has"
        );
        assert_eq!(Misfit::TooLarge.what(), "write larger than its buffer");
    }
}
