//! The two rules that every maker of partitions follows, a plan ([`crate::compile`]) as
//! much as the controller's store: the name `Default` belongs to the Default partition,
//! and a partition without a key gets the lowest free P_Key base.

use crate::types::PKey;

/// The Default partition's name (P_Key 0x7fff), which no other partition may take.
pub const DEFAULT_PARTITION: &str = "Default";

/// Whether `name` is reserved: only the Default partition may be called `Default`.
pub fn is_reserved_name(name: &str) -> bool {
    name == DEFAULT_PARTITION
}

/// The lowest P_Key base at or above `from` (and above 0x0000) for which `taken` is false,
/// below the Default partition's 0x7fff; `None` when every one is taken.
///
/// ```
/// use weft_fabric::lowest_free_pkey;
/// let taken = [0x0a01, 0x0a02, 0x0a04];
/// let k = lowest_free_pkey(0x0a01, |k| taken.contains(&k)).unwrap();
/// assert_eq!(k.base(), 0x0a03);
/// assert_eq!(lowest_free_pkey(0x7ffe, |k| k == 0x7ffe), None);
/// ```
pub fn lowest_free_pkey(from: u16, taken: impl Fn(u16) -> bool) -> Option<PKey> {
    (from.max(1)..PKey::DEFAULT.base())
        .find(|&k| !taken(k))
        .and_then(|k| PKey::new(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_key_skips_taken_ones_and_never_reaches_the_default_key() {
        assert_eq!(lowest_free_pkey(0, |_| false).map(PKey::base), Some(1));
        assert_eq!(
            lowest_free_pkey(1, |k| k < 0x10).map(PKey::base),
            Some(0x10)
        );
        assert_eq!(lowest_free_pkey(1, |k| k != 0x7fff), None);
        assert!(is_reserved_name("Default"));
        assert!(!is_reserved_name("default"));
    }
}
