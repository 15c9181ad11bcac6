//! Applying a partitions config to the primary and standby SMs, verifying it on the
//! ports, and rolling back when the fabric does not match.

use std::time::{Duration, Instant};

use serde::Serialize;
use weft_fabric::conf::{self, Conf};
use weft_fabric::{Guid, Inventory, PortMismatch, SmOptions, expected_tables};

use crate::diag::{DiagError, DiagTools, FabricSnapshot, TableReader};
use crate::sm::{SmError, SmHost, SmLock, checksum, unique_suffix};

/// Why an apply or a verification did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("refusing to hand OpenSM this file: {0}")]
    Refused(String),
    /// An SM's file is newer than this delivery ([`crate::Fence::admits`]); nothing was
    /// written.
    #[error("refused at SM `{sm}`'s apply lock: {why}")]
    Fenced {
        /// The SM whose file or lock refused the delivery.
        sm: String,
        /// Why.
        why: crate::FenceRefusal,
    },
    #[error(transparent)]
    Sm(#[from] SmError),
    #[error(transparent)]
    Diag(#[from] DiagError),
    #[error("the master SM's port {master} belongs to none of the configured SMs ({configured})")]
    UnknownMaster { master: Guid, configured: String },
    #[error("no standby SM became master within {timeout:?}")]
    NoFailover { timeout: Duration },
    /// No `[[fabric.sm]]` is configured, so there is no file to read.
    #[error("no SM is configured (add [[fabric.sm]] to the config)")]
    NoSm,
    #[error("SM `{sm}` has no partitions file")]
    NoFile { sm: String },
    #[error("SM `{sm}`'s partitions file: {error}")]
    Unparsable {
        sm: String,
        error: weft_fabric::conf::ParseError,
    },
    #[error("applied config failed ({cause}); rolled back: {rollback}")]
    RolledBack {
        cause: String,
        mismatches: Vec<PortMismatch>,
        rollback: String,
    },
}

/// One SM's state after an apply.
#[derive(Debug, Clone, Serialize)]
pub struct SmState {
    pub name: String,
    pub master: bool,
    pub checksum: Option<String>,
    /// Why the SM could not be read, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What an apply did and how long each phase took.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyReport {
    pub changed: bool,
    /// Standby SMs whose hosts could not be reached ([`SmError::is_unreachable`]): the
    /// apply went on without them, so they may hold an older file. Empty when every SM
    /// has the new file; the caller retries the delivery to those listed.
    pub degraded: Vec<String>,
    pub checksum: String,
    pub sms: Vec<SmState>,
    /// Ports whose tables were read back after the reread and matched: the ports counted
    /// are the ports verified.
    pub ports_verified: usize,
    /// Reading the fabric before the apply (inventory and tables); 0 until the caller
    /// that took the snapshot adds it with [`ApplyReport::with_snapshot`].
    pub snapshot_ms: f64,
    pub write_ms: f64,
    pub sweep_ms: f64,
    pub verify_ms: f64,
    /// How the ports were read back: one SMP client, or `smpquery` per port (and why).
    pub read_by: TableReader,
    /// Everything from the start of the snapshot (once added) to the last port verified.
    pub total_ms: f64,
}

impl ApplyReport {
    /// Counts the snapshot the apply was computed from (taken by the caller before
    /// [`Applier::apply`]) in the report: `snapshot_ms`, and in `total_ms`.
    pub fn with_snapshot(mut self, snapshot: Duration) -> ApplyReport {
        self.snapshot_ms = ms(snapshot);
        self.total_ms += self.snapshot_ms;
        self
    }
}

/// The outcome of comparing the fabric with a config.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub master: Guid,
    pub ports_checked: usize,
    pub mismatches: Vec<PortMismatch>,
    /// How the tables compared were read.
    pub read_by: TableReader,
}

/// Which ports an apply reads back after the reread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyScope {
    /// The ports whose tables the change should alter, the SM ports, and a few
    /// unchanged ports as canaries (a wholesale change, such as OpenSM falling back to
    /// `ALL=full`, shows on them). Reading a port costs one SMP round trip through a
    /// diagnostic tool, so this keeps a one-node move fast on a large fabric.
    #[default]
    Changed,
    /// Every end port of the inventory.
    All,
}

/// How many unchanged ports an apply in [`VerifyScope::Changed`] reads as canaries.
const CANARIES: usize = 4;

/// Drives a set of OpenSM instances (one master, any number of standbys) that share one
/// partitions config, and the fabric they manage.
pub struct Applier {
    pub sms: Vec<Box<dyn SmHost>>,
    pub diag: DiagTools,
    pub sm_options: SmOptions,
    /// Which ports an apply reads back.
    pub verify_scope: VerifyScope,
    /// How long the master may take to finish the sweep after a reread.
    pub sweep_timeout: Duration,
    /// How long the ports may take to show the expected tables after the sweep.
    pub verify_timeout: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Applier {
    /// The file text for `conf`, proven to parse back to `conf`.
    pub fn render_checked(conf: &Conf) -> Result<String, ApplyError> {
        let text = conf::render(conf);
        match conf::parse(&text) {
            Ok(back) if &back == conf => Ok(text),
            Ok(_) => Err(ApplyError::Refused(
                "the rendered file parses to a different config".into(),
            )),
            Err(e) => Err(ApplyError::Refused(format!("the rendered file: {e}"))),
        }
    }

    pub(crate) fn master_of(&self, inventory: &Inventory) -> Result<usize, ApplyError> {
        self.master_index(inventory)
    }

    fn master_index(&self, inventory: &Inventory) -> Result<usize, ApplyError> {
        let master = inventory.sm_port_guid.unwrap_or(Guid(0));
        self.sms
            .iter()
            .position(|s| s.port_guid() == master)
            .ok_or_else(|| ApplyError::UnknownMaster {
                master,
                configured: self
                    .sms
                    .iter()
                    .map(|s| format!("{} on {}", s.name(), s.port_guid()))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Compares `conf`'s expected tables with a snapshot.
    pub fn compare(&self, conf: &Conf, snapshot: &FabricSnapshot) -> Verification {
        let expected = expected_tables(conf, &snapshot.inventory, self.sm_options);
        Verification {
            master: snapshot.inventory.sm_port_guid.unwrap_or(Guid(0)),
            ports_checked: expected.0.len(),
            mismatches: expected.compare(&snapshot.tables),
            read_by: snapshot.read_by.clone(),
        }
    }

    /// What replacing the master's current file by `conf` would remove (the removal
    /// guard, [`weft_fabric::removals`]): `Ok(None)` when the master holds a file weft
    /// cannot read, so that nothing can be said about what it loses; an empty list when
    /// it holds none.
    pub fn removals(
        &self,
        conf: &Conf,
        inventory: &Inventory,
    ) -> Result<Option<Vec<weft_fabric::Removal>>, ApplyError> {
        let master = self.master_index(inventory)?;
        let Some(bytes) = self.sms[master].read_partitions()? else {
            return Ok(Some(Vec::new()));
        };
        Ok(std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| conf::parse(t).ok())
            .map(|old| weft_fabric::removals(&old, conf)))
    }

    /// Reads the fabric once and compares it with `conf`.
    pub fn verify(&self, conf: &Conf) -> Result<Verification, ApplyError> {
        Ok(self.compare(conf, &self.diag.snapshot()?))
    }

    /// The ports an apply reads back: all of them, or those the change touches (see
    /// [`VerifyScope::Changed`]).
    fn ports_to_verify(&self, conf: &Conf, before: &FabricSnapshot) -> Vec<weft_fabric::Port> {
        let ports = &before.inventory.ports;
        if self.verify_scope == VerifyScope::All {
            return ports.clone();
        }
        let expected = expected_tables(conf, &before.inventory, self.sm_options);
        let touched = |p: &weft_fabric::Port| {
            let Some(want) = expected.0.get(&p.port_guid) else {
                return false;
            };
            let had: std::collections::BTreeSet<u16> = before
                .tables
                .0
                .get(&p.port_guid)
                .map(|t| t.iter().copied().filter(|&k| k != 0).collect())
                .unwrap_or_default();
            &had != want
        };
        let is_sm = |p: &weft_fabric::Port| self.sms.iter().any(|s| s.port_guid() == p.port_guid);
        let (mut chosen, unchanged): (Vec<_>, Vec<_>) =
            ports.iter().cloned().partition(|p| touched(p) || is_sm(p));
        let step = (unchanged.len() / CANARIES).max(1);
        chosen.extend(unchanged.into_iter().step_by(step).take(CANARIES));
        chosen
    }

    /// Polls the P_Key tables of `ports` until they match `conf` or `verify_timeout`
    /// passes.
    fn verify_until(
        &self,
        conf: &Conf,
        inventory: &Inventory,
        ports: &[weft_fabric::Port],
    ) -> Result<Verification, ApplyError> {
        let deadline = Instant::now() + self.verify_timeout;
        let mut expected = expected_tables(conf, inventory, self.sm_options);
        expected
            .0
            .retain(|g, _| ports.iter().any(|p| p.port_guid == *g));
        loop {
            let read = self.diag.read_tables(ports)?;
            let observed = weft_fabric::ObservedTables(
                read.tables.into_iter().map(|(g, (t, _))| (g, t)).collect(),
            );
            let v = Verification {
                master: inventory.sm_port_guid.unwrap_or(Guid(0)),
                ports_checked: expected.0.len(),
                mismatches: expected.compare(&observed),
                read_by: read.read_by,
            };
            if v.mismatches.is_empty() || Instant::now() >= deadline {
                return Ok(v);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Each SM's current checksum and whether it is the master.
    pub fn sm_states(&self, master: Option<usize>) -> Vec<SmState> {
        self.sm_states_skipping(master, &Degraded::default())
    }

    /// [`Applier::sm_states`] without asking the SMs in `skip` again (an unreachable host
    /// would cost another connect timeout each).
    fn sm_states_skipping(&self, master: Option<usize>, skip: &Degraded) -> Vec<SmState> {
        self.sms
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (checksum, error) = match skip.reason(i) {
                    Some(reason) => (None, Some(reason.to_string())),
                    None => match s.read_partitions() {
                        Ok(b) => (b.map(|b| checksum(&b)), None),
                        Err(e) => (None, Some(e.to_string())),
                    },
                };
                SmState {
                    name: s.name().to_string(),
                    master: Some(i) == master,
                    checksum,
                    error,
                }
            })
            .collect()
    }

    /// How long an apply waits for another apply's lock on an SM: as long as that apply
    /// may hold it (write, sweep, verify, and a rollback's sweep), plus 10 s.
    pub fn lock_wait(&self) -> Duration {
        (self.sweep_timeout * 2 + self.verify_timeout) + Duration::from_secs(10)
    }

    /// Takes every SM's lock, in the configured order (so two applies to one SM set
    /// cannot each hold a lock the other waits for). A standby whose host cannot be
    /// reached is added to `degraded`; any other failure releases what was taken.
    fn lock_all(&self, master: usize, degraded: &mut Degraded) -> Result<Vec<SmLock>, ApplyError> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let holder = format!(
            "weft apply {} on host {host}, pid {}, since unix {since}",
            unique_suffix(),
            std::process::id()
        );
        let mut locks = Vec::with_capacity(self.sms.len());
        for (i, sm) in self.sms.iter().enumerate() {
            match sm.lock(&holder, self.lock_wait()) {
                Ok(l) => locks.push(l),
                Err(e) if i != master && e.is_unreachable() => degraded.add(i, &e),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(locks)
    }

    /// Writes `bytes` to every SM, checks their checksums, and makes the master reread.
    /// A standby whose host cannot be reached is added to `degraded` and left out; each
    /// SM a write was attempted on is marked in `wrote`.
    fn deliver(
        &self,
        master: usize,
        bytes: &[u8],
        degraded: &mut Degraded,
        wrote: &mut [bool],
    ) -> Result<(Duration, Duration), ApplyError> {
        let t0 = Instant::now();
        // Standbys first: if the master dies mid-apply, its successor already has the file.
        let order = (0..self.sms.len())
            .filter(|&i| i != master)
            .chain(std::iter::once(master));
        for i in order {
            if degraded.contains(i) {
                continue;
            }
            wrote[i] = true;
            match self.sms[i].write_partitions(bytes) {
                Err(e) if i != master && e.is_unreachable() => degraded.add(i, &e),
                other => other?,
            }
        }
        let want = checksum(bytes);
        for (i, sm) in self.sms.iter().enumerate() {
            if degraded.contains(i) {
                continue;
            }
            let got = match sm.read_partitions() {
                Err(e) if i != master && e.is_unreachable() => {
                    degraded.add(i, &e);
                    continue;
                }
                other => other?.map(|b| checksum(&b)),
            };
            if got.as_deref() != Some(want.as_str()) {
                return Err(ApplyError::Refused(format!(
                    "SM `{}` holds checksum {} after the write, expected {want}",
                    sm.name(),
                    got.unwrap_or_else(|| "none".into())
                )));
            }
        }
        let written = t0.elapsed();
        let sm = &self.sms[master];
        let cursor = sm.log_cursor()?;
        sm.request_reread()?;
        sm.wait_for_sweep(cursor, self.sweep_timeout)?;
        Ok((written, t0.elapsed() - written))
    }

    /// Applies `conf` to the fabric as `before` (a fresh [`DiagTools::snapshot`]) saw
    /// it: every SM gets the same file, the master rereads it, and the ports chosen by
    /// [`Applier::verify_scope`] are read back and compared. Any failure after the first
    /// write restores the previous file on every SM this apply wrote to (and only where
    /// the file is still the one it wrote) and rereads it again.
    ///
    /// The whole apply, from reading the previous files to the end of a rollback, holds
    /// every SM's lock ([`SmHost::lock`]): a second apply to the same SMs waits for it
    /// (at most [`Applier::lock_wait`]) or fails naming the holder.
    ///
    /// A standby whose host cannot be reached ([`SmError::is_unreachable`]) does not stop
    /// the apply: the others are updated and verified, and the report lists it in
    /// [`ApplyReport::degraded`]. An unreachable master fails the apply (after rolling
    /// back whatever was written).
    pub fn apply(&self, conf: &Conf, before: &FabricSnapshot) -> Result<ApplyReport, ApplyError> {
        self.apply_as(conf, before, None, None)
    }

    /// [`Applier::apply`], with `owner`'s header in the file (see `owner.rs`), and with
    /// `fence`, its stamp in the header and every SM's file checked against it under the
    /// locks, before anything is written.
    pub(crate) fn apply_as(
        &self,
        conf: &Conf,
        before: &FabricSnapshot,
        owner: Option<&str>,
        fence: Option<&crate::owner::Fence>,
    ) -> Result<ApplyReport, ApplyError> {
        let start = Instant::now();
        let body = Self::render_checked(conf)?;
        let text = match (owner, fence) {
            (Some(o), Some(f)) => crate::owner::with_owner_stamped(o, f.stamp, body),
            _ => crate::owner::with_owner(owner, body),
        };
        let inventory = &before.inventory;
        let master = self.master_index(inventory)?;
        let ports = self.ports_to_verify(conf, before);
        let mut degraded = Degraded::default();
        let _locks = self.lock_all(master, &mut degraded)?;
        let mut previous: Vec<Option<Vec<u8>>> = Vec::with_capacity(self.sms.len());
        for (i, sm) in self.sms.iter().enumerate() {
            if degraded.contains(i) {
                previous.push(None);
                continue;
            }
            match sm.read_partitions() {
                Ok(p) => previous.push(p),
                Err(e) if i != master && e.is_unreachable() => {
                    degraded.add(i, &e);
                    previous.push(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(fence) = fence {
            for (sm, held) in self.sms.iter().zip(&previous) {
                if let Some(held) = held
                    && let Err(why) = fence.admits(held)
                {
                    return Err(ApplyError::Fenced {
                        sm: sm.name().to_string(),
                        why,
                    });
                }
            }
            if let Some(until) = fence.until
                && Instant::now() >= until
            {
                return Err(ApplyError::Fenced {
                    sm: self.sms[master].name().to_string(),
                    why: crate::FenceRefusal::Expired {
                        stamp: fence.stamp,
                        late_ms: Instant::now().saturating_duration_since(until).as_millis(),
                    },
                });
            }
        }
        let changed = previous
            .iter()
            .enumerate()
            .any(|(i, p)| !degraded.contains(i) && p.as_deref() != Some(text.as_bytes()));

        let mut wrote = vec![false; self.sms.len()];
        let outcome = self
            .deliver(master, text.as_bytes(), &mut degraded, &mut wrote)
            .and_then(|(w, s)| Ok((w, s, self.verify_until(conf, inventory, &ports)?)));
        match outcome {
            Ok((write, sweep, v)) if v.mismatches.is_empty() => Ok(ApplyReport {
                changed,
                degraded: degraded.names(&self.sms),
                checksum: checksum(text.as_bytes()),
                sms: self.sm_states_skipping(Some(master), &degraded),
                ports_verified: v.ports_checked,
                snapshot_ms: 0.0,
                write_ms: ms(write),
                sweep_ms: ms(sweep),
                verify_ms: ms(start.elapsed() - write - sweep),
                read_by: v.read_by,
                total_ms: ms(start.elapsed()),
            }),
            Ok((_, _, v)) => Err(self.roll_back(
                master,
                &previous,
                &degraded,
                (&wrote, text.as_bytes()),
                format!(
                    "{} port(s) do not hold the planned P_Keys",
                    v.mismatches.len()
                ),
                v.mismatches,
            )),
            Err(e) => Err(self.roll_back(
                master,
                &previous,
                &degraded,
                (&wrote, text.as_bytes()),
                e.to_string(),
                Vec::new(),
            )),
        }
    }

    /// Restores `previous` on each SM that `written.0` marks, if it still holds the bytes
    /// `written.1` this apply wrote: a file someone else wrote since is left as it is.
    fn roll_back(
        &self,
        master: usize,
        previous: &[Option<Vec<u8>>],
        degraded: &Degraded,
        written: (&[bool], &[u8]),
        cause: String,
        mismatches: Vec<PortMismatch>,
    ) -> ApplyError {
        let (wrote, ours) = written;
        let ours = checksum(ours);
        tracing::warn!(%cause, "rolling back the partitions config");
        let mut problems = Vec::new();
        for (i, (sm, old)) in self.sms.iter().zip(previous).enumerate() {
            if let Some(reason) = degraded.reason(i) {
                // Unreachable: not written by this apply, or (lost during its write)
                // in an unknown state; the caller's retry brings it in line.
                problems.push(format!("`{}` left as it was: {reason}", sm.name()));
                continue;
            }
            if !wrote.get(i).copied().unwrap_or(false) {
                continue;
            }
            let now = match sm.read_partitions() {
                Ok(b) => b,
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            if now.as_deref() == old.as_deref() {
                continue;
            }
            if now.as_deref().map(checksum).as_deref() != Some(ours.as_str()) {
                problems.push(format!(
                    "`{}` holds a file this apply did not write; left as it is",
                    sm.name()
                ));
                continue;
            }
            let restored = match old {
                Some(bytes) => sm.write_partitions(bytes),
                None => sm.remove_partitions(),
            };
            if let Err(e) = restored {
                problems.push(e.to_string());
            }
        }
        let sm = &self.sms[master];
        let reread = sm
            .log_cursor()
            .and_then(|c| sm.request_reread().map(|_| c))
            .and_then(|c| sm.wait_for_sweep(c, self.sweep_timeout));
        if let Err(e) = reread {
            problems.push(e.to_string());
        }
        ApplyError::RolledBack {
            cause,
            mismatches,
            rollback: if problems.is_empty() {
                "previous file restored and reread".into()
            } else {
                format!("incomplete: {}", problems.join("; "))
            },
        }
    }

    /// Waits until [`DiagTools::master_sm`] names a master among the configured SMs other than `not`;
    /// returns its index and how long it took. Used to observe a failover.
    pub fn wait_for_new_master(
        &self,
        not: Guid,
        timeout: Duration,
    ) -> Result<(usize, Duration), ApplyError> {
        let start = Instant::now();
        loop {
            if let Ok(g) = self.diag.master_sm()
                && g != not
                && let Some(i) = self.sms.iter().position(|s| s.port_guid() == g)
            {
                return Ok((i, start.elapsed()));
            }
            if start.elapsed() >= timeout {
                return Err(ApplyError::NoFailover { timeout });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The SMs an apply goes on without, with why.
#[derive(Debug, Default)]
struct Degraded(Vec<(usize, String)>);

impl Degraded {
    fn add(&mut self, i: usize, e: &SmError) {
        tracing::warn!(error = %e, "SM unreachable; applying to the others (degraded)");
        if !self.contains(i) {
            self.0.push((i, e.to_string()));
        }
    }

    fn contains(&self, i: usize) -> bool {
        self.0.iter().any(|(j, _)| *j == i)
    }

    fn reason(&self, i: usize) -> Option<&str> {
        self.0
            .iter()
            .find(|(j, _)| *j == i)
            .map(|(_, r)| r.as_str())
    }

    fn names(&self, sms: &[Box<dyn SmHost>]) -> Vec<String> {
        let mut idx: Vec<usize> = self.0.iter().map(|(i, _)| *i).collect();
        idx.sort_unstable();
        idx.into_iter()
            .filter_map(|i| sms.get(i).map(|s| s.name().to_string()))
            .collect()
    }
}
