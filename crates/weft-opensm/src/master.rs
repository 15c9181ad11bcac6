//! Which configured SM is the master, and whether the SMs agree: the rules behind
//! `weft fabric status` and `weft fabric verify` without a plan, so that the binary only
//! prints what they found.
//!
//! [`Applier::sync_status`] asks the fabric which port the master SM runs on (`sminfo`),
//! reads every SM's file and sorts the answer into one of four [`SyncState`]s with
//! [`classify`], a pure function. [`Applier::master_or_first`] is the SM whose file the
//! fabric runs on, for reading "the last file applied"; [`Applier::master_conf`] reads and
//! parses that file, and [`Applier::file_states`] says of each SM's file what a plan's file
//! would do to it (`weft fabric diff`).

use serde::Serialize;
use weft_fabric::conf::{self, Conf};
use weft_fabric::{Guid, Inventory};

use crate::apply::{Applier, ApplyError, SmState};
use crate::diag::FabricSnapshot;
use crate::owner::owner_of;
use crate::sm::SmHost;

/// How the configured SMs stand, one answer never given for another: an SM that cannot be
/// read is not "out of sync", and SMs that agree while none of them is master are not "in
/// sync" (the fabric runs on some other SM's file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncState {
    /// At least one SM's file could not be read.
    Unreadable,
    /// The SMs hold different files (or one holds none).
    Differ,
    /// They agree, but the master is none of them, or cannot be read.
    NoMaster,
    /// They agree and one of them is master.
    InSync,
}

impl SyncState {
    /// The name used in JSON (`in_sync`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Unreadable => "unreadable",
            SyncState::Differ => "differ",
            SyncState::NoMaster => "no_master",
            SyncState::InSync => "in_sync",
        }
    }
}

/// What [`Applier::sync_status`] found.
#[derive(Debug, Clone, Serialize)]
pub struct SyncStatus {
    /// Every configured SM: master or standby, its file's checksum or why it is unreadable.
    pub sms: Vec<SmState>,
    /// Which of them is the master, if one is.
    pub master: Option<usize>,
    /// The verdict.
    pub state: SyncState,
    /// The verdict in one line, for people.
    pub message: String,
    /// The owner the master's file names in its header (a controller), if any.
    pub owner: Option<String>,
}

/// Sorts what was read into a [`SyncState`] and its line: `states` in configured order,
/// `master` the index of the master among them, `fabric_master` what the fabric said (its
/// port GUID, or why it could not be asked).
pub fn classify(
    states: &[SmState],
    master: Option<usize>,
    fabric_master: &Result<Guid, crate::DiagError>,
) -> (SyncState, String) {
    let unreadable: Vec<String> = states
        .iter()
        .filter_map(|s| {
            s.error
                .as_ref()
                .map(|e| format!("cannot read SM `{}`: {e}", s.name))
        })
        .collect();
    let readable: Vec<_> = states.iter().filter(|s| s.error.is_none()).collect();
    let differ = readable.windows(2).any(|w| w[0].checksum != w[1].checksum)
        || readable.iter().any(|s| s.checksum.is_none());
    if !unreadable.is_empty() {
        let also = if differ {
            "; the SMs that could be read differ too"
        } else {
            ""
        };
        (
            SyncState::Unreadable,
            format!("CANNOT READ: {}{also}", unreadable.join("; ")),
        )
    } else if differ {
        (
            SyncState::Differ,
            "OUT OF SYNC: the SMs hold different partition files".to_string(),
        )
    } else if master.is_none() {
        let message = match fabric_master {
            Ok(g) => format!(
                "NO CONFIGURED MASTER: the SMs agree, but the master is {g}, none of the configured SMs"
            ),
            Err(e) => {
                format!("NO CONFIGURED MASTER: the SMs agree, but the master cannot be read: {e}")
            }
        };
        (SyncState::NoMaster, message)
    } else {
        (SyncState::InSync, "in sync".to_string())
    }
}

impl Applier {
    /// Asks the fabric for its master SM, reads every configured SM's file and says how
    /// they stand ([`classify`]) and who owns the master's file.
    pub fn sync_status(&self) -> SyncStatus {
        let fabric_master = self.diag.master_sm();
        let master = fabric_master
            .as_ref()
            .ok()
            .and_then(|g| self.sms.iter().position(|s| s.port_guid() == *g));
        let sms = self.sm_states(master);
        let (state, message) = classify(&sms, master, &fabric_master);
        let owner = master
            .and_then(|i| self.sms[i].read_partitions().ok().flatten())
            .and_then(|b| owner_of(&b));
        SyncStatus {
            sms,
            master,
            state,
            message,
            owner,
        }
    }

    /// The SM whose file the fabric runs on, by the inventory's master port: that SM if it
    /// is configured, else the first configured one; `None` when none is configured.
    pub fn master_or_first(&self, inventory: &Inventory) -> Option<&dyn SmHost> {
        self.sms
            .iter()
            .find(|s| Some(s.port_guid()) == inventory.sm_port_guid)
            .or(self.sms.first())
            .map(|s| s.as_ref())
    }

    /// The config the master SM ([`Applier::master_or_first`]) holds now, parsed strictly.
    pub fn master_conf(&self, snapshot: &FabricSnapshot) -> Result<Conf, ApplyError> {
        let sm = self
            .master_or_first(&snapshot.inventory)
            .ok_or(ApplyError::NoSm)?;
        let bytes = sm.read_partitions()?.ok_or_else(|| ApplyError::NoFile {
            sm: sm.name().to_string(),
        })?;
        conf::parse(&String::from_utf8_lossy(&bytes)).map_err(|error| ApplyError::Unparsable {
            sm: sm.name().to_string(),
            error,
        })
    }

    /// What writing `planned` would do to each configured SM's file, in their order.
    pub fn file_states(&self, planned: &str) -> Vec<FileState> {
        self.sms
            .iter()
            .map(|s| FileState::of(s.as_ref(), planned))
            .collect()
    }
}

/// One SM's file beside the file a plan renders: current, would change (lines before and
/// after), would be created, or unreadable (and why).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileState {
    pub sm: String,
    pub state: String,
}

impl FileState {
    pub fn of(sm: &dyn SmHost, planned: &str) -> FileState {
        let state = match sm.read_partitions() {
            Ok(Some(b)) if b == planned.as_bytes() => "file already current".to_string(),
            Ok(Some(b)) => format!(
                "file would change ({} -> {} lines)",
                String::from_utf8_lossy(&b).lines().count(),
                planned.lines().count()
            ),
            Ok(None) => "no file yet; it would be created".to_string(),
            Err(e) => format!("unreadable: {e}"),
        };
        FileState {
            sm: sm.name().to_string(),
            state,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sm(name: &str, checksum: Option<&str>, error: Option<&str>) -> SmState {
        SmState {
            name: name.into(),
            master: false,
            checksum: checksum.map(Into::into),
            error: error.map(Into::into),
        }
    }

    #[test]
    fn each_of_the_four_answers_is_given_only_for_its_own_case() {
        let fabric = Ok(Guid(0x10));
        let same = [sm("a", Some("x"), None), sm("b", Some("x"), None)];
        assert_eq!(classify(&same, Some(0), &fabric).0, SyncState::InSync);
        let (state, message) = classify(&same, None, &fabric);
        assert_eq!(state, SyncState::NoMaster);
        assert!(message.contains("0x0000000000000010"), "{message}");
        let timed_out = crate::DiagError::Parse {
            tool: "sminfo",
            line: 1,
            message: "timed out".into(),
        };
        let (_, message) = classify(&same, None, &Err(timed_out));
        assert!(
            message.contains("cannot be read: cannot read the output of `sminfo`"),
            "{message}"
        );
        let differ = [sm("a", Some("x"), None), sm("b", Some("y"), None)];
        assert_eq!(classify(&differ, Some(0), &fabric).0, SyncState::Differ);
        let missing = [sm("a", Some("x"), None), sm("b", None, None)];
        assert_eq!(classify(&missing, Some(0), &fabric).0, SyncState::Differ);
        // An unreadable SM is never reported as out of sync, even beside differing ones.
        let lost = [
            sm("a", Some("x"), None),
            sm("b", Some("y"), None),
            sm("c", None, Some("ssh: refused")),
        ];
        let (state, message) = classify(&lost, Some(0), &fabric);
        assert_eq!(state, SyncState::Unreadable);
        assert_eq!(
            message,
            "CANNOT READ: cannot read SM `c`: ssh: refused; the SMs that could be read differ too"
        );
        assert_eq!(SyncState::NoMaster.as_str(), "no_master");
    }

    #[test]
    fn a_file_is_current_changed_new_or_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let sm = |file: &str| crate::LocalSm {
            name: "sm1".into(),
            port_guid: Guid(1),
            partitions_file: dir.path().join(file),
            pid_file: dir.path().join("opensm.pid"),
            log_file: dir.path().join("osm.log"),
        };
        let planned = "a\nb\nc\n";
        let state = |file: &str| FileState::of(&sm(file), planned).state;
        assert_eq!(state("none.conf"), "no file yet; it would be created");
        std::fs::write(dir.path().join("same.conf"), planned).unwrap();
        assert_eq!(state("same.conf"), "file already current");
        std::fs::write(dir.path().join("old.conf"), "a\n").unwrap();
        assert_eq!(state("old.conf"), "file would change (1 -> 3 lines)");
        std::fs::create_dir(dir.path().join("dir.conf")).unwrap();
        assert!(state("dir.conf").starts_with("unreadable: "));
        assert_eq!(FileState::of(&sm("none.conf"), planned).sm, "sm1");
    }
}
