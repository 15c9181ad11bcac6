//! One owner per SM set: a file a weft controller manages names it in a header comment,
//! and `weft fabric apply` refuses to replace such a file unless told to (`--force`).
//!
//! The header is two comment lines at the top of partitions.conf, so OpenSM ignores it
//! and it travels with the file through every write, reread and rollback:
//!
//! ```text
//! # weft-owner: controller 3f2a9c0d1e4b5a6f
//! # Managed by a weft controller: change it through the controller's API; `weft fabric apply` refuses this file without --force.
//! ```

use weft_fabric::conf::Conf;

use crate::apply::{Applier, ApplyError, ApplyReport};
use crate::diag::FabricSnapshot;

/// The first line of an owned file, before the owner's name.
pub const OWNER_PREFIX: &str = "# weft-owner: ";

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
        self.apply_as(conf, before, Some(owner))
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
}
