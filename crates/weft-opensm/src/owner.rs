//! One owner per SM set: a file a weft controller manages names it in a header comment,
//! and `weft fabric apply` refuses to replace such a file unless told to (`--force`).
//!
//! The header is two comment lines at the top of partitions.conf, so OpenSM ignores it
//! and it travels with the file through every write, reread and rollback:
//!
//! ```text
//! # weft-owner: controller 3f2a9c0d1e4b5a6f
//! # weft-fence: fencing 2 generation 17
//! # Managed by a weft controller: change it through the controller's API; `weft fabric apply` refuses this file without --force.
//! ```
//!
//! The `weft-fence` line is the delivery's [`Stamp`]: the store's fencing number (raised
//! at every restore or takeover) and the desired state's generation. Under every SM's
//! apply lock, a delivery whose stamp is older than the one the SM's file holds is
//! refused ([`Fence::admits`]), naming both: a controller on a stale or restored store
//! cannot put older state back on the fabric.

use weft_fabric::conf::Conf;

use crate::apply::{Applier, ApplyError, ApplyReport};
use crate::diag::FabricSnapshot;

/// The first line of an owned file, before the owner's name.
pub const OWNER_PREFIX: &str = "# weft-owner: ";

/// The first line of a stamped file's fencing line, before the stamp.
pub const FENCE_PREFIX: &str = "# weft-fence: ";

/// Where a delivered file stands in the order of deliveries: by fencing number, then by
/// the generation of the desired state it carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Stamp {
    /// The store's fencing number: raised at every restore or takeover.
    pub fencing: u64,
    /// The generation of the desired state.
    pub generation: u64,
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fencing {} generation {}", self.fencing, self.generation)
    }
}

/// The stamp a partitions file's header carries, if it has one (a `# weft-fence:` line
/// before any statement, in the form [`Stamp`]'s `Display` writes).
pub fn stamp_of(text: &[u8]) -> Option<Stamp> {
    let text = String::from_utf8_lossy(text);
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(FENCE_PREFIX.trim_end()) {
            let words: Vec<&str> = rest.split_whitespace().collect();
            return match words.as_slice() {
                ["fencing", f, "generation", g] => Some(Stamp {
                    fencing: f.parse().ok()?,
                    generation: g.parse().ok()?,
                }),
                _ => None,
            };
        }
        if !(t.is_empty() || t.starts_with('#')) {
            return None;
        }
    }
    None
}

/// What a fenced delivery may replace. A file without a stamp (hand-written, or from a
/// controller before fencing) is the one-owner check's business, not this one's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    /// The delivery's own stamp.
    pub stamp: Stamp,
    /// The last generation the delivering store recorded as verified on the fabric.
    pub applied: u64,
    /// Checksums of the files the store began to deliver at its fencing number above
    /// `applied` (a delivery killed before it was recorded as verified).
    pub in_flight: Vec<String>,
    /// The instant (the delivering process's monotonic clock) from which the delivery may
    /// write nothing: a leader's lease, by its own clock. Checked under every SM's apply
    /// lock, after [`Fence::admits`] and before the first write ([`ApplyError::Fenced`]
    /// past it). `None`: no bound (a controller alone on its store).
    pub until: Option<std::time::Instant>,
}

/// Why a fenced delivery may not replace an SM's file; names both stamps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceRefusal {
    /// The file carries a higher fencing number: this delivery's store is deposed.
    #[error(
        "it holds {held}, and this delivery carries {mine}: a controller with a higher fencing number (a restored or newer store) has delivered since; this store is deposed"
    )]
    Deposed {
        /// The stamp of the file the SM holds.
        held: Stamp,
        /// This delivery's stamp.
        mine: Stamp,
    },
    /// The same fencing number, a newer generation than the store verified, and a file
    /// the store did not begin to write: the store is older than the fabric.
    #[error(
        "it holds {held}, and this delivery carries {mine} from a store that verified generation {applied} last and never wrote that file: the store is older than the fabric (a stale copy or a restore); run `weft controller restore` on it to raise its fencing number, or stop it"
    )]
    Stale {
        /// The stamp of the file the SM holds.
        held: Stamp,
        /// This delivery's stamp.
        mine: Stamp,
        /// The last generation the store verified.
        applied: u64,
    },
    /// The delivery's [`Fence::until`] has passed: the leadership it was made under ran
    /// out by this process's clock.
    #[error(
        "the delivery of {stamp} comes {late_ms} ms after this controller's leadership ran out by its own clock; it writes nothing (a new leader may take over)"
    )]
    Expired {
        /// This delivery's stamp.
        stamp: Stamp,
        /// How long after the bound the check ran, in milliseconds.
        late_ms: u128,
    },
}

impl Fence {
    /// Whether this delivery may replace `held` (an SM's file): refused when the file's
    /// stamp has a higher fencing number, or the same fencing number and a generation
    /// above what this store verified that the store did not write itself (another
    /// controller on a copy of this store delivered it). The error names both stamps.
    pub fn admits(&self, held: &[u8]) -> Result<(), FenceRefusal> {
        let Some(h) = stamp_of(held) else {
            return Ok(());
        };
        let mine = self.stamp;
        if h.fencing > mine.fencing {
            return Err(FenceRefusal::Deposed { held: h, mine });
        }
        if h.fencing < mine.fencing || h.generation <= self.applied {
            return Ok(());
        }
        let sum = crate::sm::checksum(held);
        if self.in_flight.contains(&sum) {
            return Ok(());
        }
        Err(FenceRefusal::Stale {
            held: h,
            mine,
            applied: self.applied,
        })
    }
}

/// `body` with the owner header for `owner` and the fencing line for `stamp`.
pub fn with_owner_stamped(owner: &str, stamp: Stamp, body: String) -> String {
    format!(
        "{OWNER_PREFIX}{owner}\n{FENCE_PREFIX}{stamp}\n# Managed by a weft controller: change it through the controller's API; `weft fabric apply` refuses this file without --force.\n{body}"
    )
}

/// The owner a partitions file names in its header, if it has one (the first
/// `# weft-owner:` line before any statement).
pub fn owner_of(text: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(text);
    for line in text.lines() {
        let t = line.trim();
        if let Some(owner) = t.strip_prefix(OWNER_PREFIX.trim_end()) {
            let owner = owner.trim();
            return (!owner.is_empty()).then(|| owner.to_string());
        }
        if !(t.is_empty() || t.starts_with('#')) {
            return None;
        }
    }
    None
}

/// `body` with the owner header for `owner` in front (none when `owner` is `None`).
pub fn with_owner(owner: Option<&str>, body: String) -> String {
    match owner {
        None => body,
        Some(o) => format!(
            "{OWNER_PREFIX}{o}\n# Managed by a weft controller: change it through the controller's API; `weft fabric apply` refuses this file without --force.\n{body}"
        ),
    }
}

impl Applier {
    /// [`Applier::apply`], writing the file with `owner`'s header ([`with_owner`]), so
    /// that `weft fabric apply` knows the file is managed.
    pub fn apply_owned(
        &self,
        conf: &Conf,
        before: &FabricSnapshot,
        owner: &str,
    ) -> Result<ApplyReport, ApplyError> {
        self.apply_as(conf, before, Some(owner), None)
    }

    /// [`Applier::apply_owned`] with the fencing line of `fence`'s stamp, refused without
    /// writing anything when an SM's file is newer ([`Fence::admits`], checked under
    /// every SM's apply lock: [`ApplyError::Fenced`]).
    pub fn apply_fenced(
        &self,
        conf: &Conf,
        before: &FabricSnapshot,
        owner: &str,
        fence: &Fence,
    ) -> Result<ApplyReport, ApplyError> {
        self.apply_as(conf, before, Some(owner), Some(fence))
    }

    /// The partitions file the master SM holds (`None`: it has none).
    pub fn master_file(&self, snapshot: &FabricSnapshot) -> Result<Option<Vec<u8>>, ApplyError> {
        let master = self.master_of(&snapshot.inventory)?;
        Ok(self.sms[master].read_partitions()?)
    }

    /// The owner named by the master's file, with the SM's name: what `weft fabric
    /// apply` refuses to overwrite without `--force`.
    pub fn held_owner(
        &self,
        snapshot: &FabricSnapshot,
    ) -> Result<Option<(String, String)>, ApplyError> {
        let master = self.master_of(&snapshot.inventory)?;
        Ok(self.sms[master]
            .read_partitions()?
            .and_then(|b| owner_of(&b))
            .map(|o| (self.sms[master].name().to_string(), o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_its_owner_and_a_plain_file_has_none() {
        let owned = with_owner(
            Some("controller abc"),
            "Default=0x7fff : ALL=full ;\n".into(),
        );
        assert_eq!(
            owner_of(owned.as_bytes()).as_deref(),
            Some("controller abc")
        );
        weft_fabric::conf::parse(&owned).unwrap();
        assert_eq!(owner_of(b"Default=0x7fff : ALL=full ;\n"), None);
        // Only a header counts: the line after a statement is not one.
        assert_eq!(
            owner_of(b"# hand-kept\nDefault=0x7fff : ALL=full ;\n# weft-owner: x\n"),
            None
        );
        assert_eq!(with_owner(None, "x".into()), "x");
    }

    fn file(f: u64, g: u64) -> String {
        let stamp = Stamp {
            fencing: f,
            generation: g,
        };
        with_owner_stamped(
            "controller abc",
            stamp,
            "Default=0x7fff : ALL=full ;\n".into(),
        )
    }

    #[test]
    fn a_stamp_reads_back_and_an_older_delivery_is_refused_naming_both() {
        let held = file(2, 9);
        assert_eq!(owner_of(held.as_bytes()).as_deref(), Some("controller abc"));
        assert_eq!(
            stamp_of(held.as_bytes()),
            Some(Stamp {
                fencing: 2,
                generation: 9
            })
        );
        weft_fabric::conf::parse(&held).unwrap();
        assert_eq!(stamp_of(b"# weft-fence: fencing x generation 1\n"), None);
        let fence = |f, g, applied, in_flight: Vec<String>| Fence {
            stamp: Stamp {
                fencing: f,
                generation: g,
            },
            applied,
            in_flight,
            until: None,
        };
        // A lower fencing number is refused whatever its generation.
        let e = fence(1, 50, 50, vec![])
            .admits(held.as_bytes())
            .unwrap_err();
        assert!(matches!(e, FenceRefusal::Deposed { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("fencing 2 generation 9") && e.contains("fencing 1 generation 50"),
            "{e}"
        );
        // A higher one replaces anything.
        fence(3, 1, 0, vec![]).admits(held.as_bytes()).unwrap();
        // Same fencing: what the store verified, or older, is replaced...
        fence(2, 10, 9, vec![]).admits(held.as_bytes()).unwrap();
        // ...newer is refused unless the store began that very delivery itself.
        let e = fence(2, 12, 5, vec![]).admits(held.as_bytes()).unwrap_err();
        assert!(matches!(e, FenceRefusal::Stale { applied: 5, .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("restore") && e.contains("generation 5"), "{e}");
        let sum = crate::sm::checksum(held.as_bytes());
        fence(2, 12, 5, vec![sum]).admits(held.as_bytes()).unwrap();
        // Unstamped files are left to the one-owner check.
        fence(0, 0, 0, vec![])
            .admits(b"Default=0x7fff : ALL=full ;\n")
            .unwrap();
    }
}
