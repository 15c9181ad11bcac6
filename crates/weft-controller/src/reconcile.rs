//! The reconcile loop: drives the fabric (observed) toward the store's desired state.
//!
//! Every trigger of work is one [`Event`]. On each, the loop reads the desired state; if
//! its generation is newer than the last one verified on the fabric, it renders the plan
//! and hands it to the [`Fabric`] (the OpenSM driver: write to every SM, reread, verify
//! the ports, roll back on failure). Success marks every pending operation up to that
//! generation applied; failure is recorded on them and retried with exponential backoff.
//!
//! Crash safety: a change is committed (desired state, operation, audit line) before any
//! delivery starts, and an operation is marked applied only after the ports verified. A
//! controller killed between the two restarts with the operation pending, says so in the
//! audit log, and delivers the same desired state again. Each SM's file is replaced
//! atomically and OpenSM acts only on a reread, so the fabric ends with the whole change,
//! verified, and the audit log says when.
//!
//! Degraded deliveries: a standby SM whose host cannot be reached does not stop a
//! delivery (the ports are verified through the master), but it keeps an older file that
//! it would program if it took over. The loop then delivers the same state again, with
//! backoff, until every SM holds it; the audit log gets one `sm`/`degraded` line when an
//! SM is first left out and one `sm`/`in-sync` line when it holds the file again. Since
//! that knowledge lives in memory, a (re)started controller delivers the last applied
//! state once, which also brings in line an SM that missed a change while it was down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use weft_fabric::conf::{self, Conf};
use weft_fabric::{FabricPlan, Removal};
use weft_opensm::{Applier, ApplyError};

use crate::metrics::Metrics;
use crate::model::{DriftState, DriftView};
use crate::store::{AuditLine, Store, StoreError, VerifiedDelivery};

/// Everything that makes the loop look at the desired state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The controller started (re-drive operations a previous run left pending).
    Started,
    /// The desired state changed.
    Changed,
    /// A retry's backoff has elapsed, or the periodic check is due.
    Tick,
}

/// What a delivery did.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// Checksum of the partitions file now on every SM.
    pub checksum: String,
    /// The file.
    pub conf: String,
    /// Ports read back and found as planned.
    pub ports_verified: usize,
    /// Milliseconds from start to verified.
    pub total_ms: f64,
    /// SMs the delivery went on without (a standby whose host could not be reached):
    /// they hold an older file. Empty when every SM holds [`Delivered::conf`].
    pub degraded: Vec<DegradedSm>,
    /// The master's file before (`None`: none).
    pub before: Option<String>,
    /// What the new file removed from it, one line each ([`weft_fabric::Removal`]).
    pub removed: Vec<String>,
    /// Port GUIDs of the plan that are not on the fabric: written to the file (a
    /// powered-off server must not block others), never verified.
    pub absent: Vec<weft_fabric::Guid>,
    /// Every port that the new file takes a P_Key table entry away from (a key, or its full
    /// membership), one line each (`port 0x... (node1 HCA-1): loses 0xffff`), whether or not
    /// the operation named the port's server: a delivery says what it takes, as `weft
    /// fabric apply` does. Empty for a fabric without ports to read.
    pub taken: Vec<String>,
}

/// A standby SM a delivery left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DegradedSm {
    /// The SM's configured name.
    pub name: String,
    /// Why it was left out (names its host).
    pub error: String,
}

/// What a delivery needs besides the plan: who writes the file, what it adopted, what
/// it last wrote (its own partitions), and whether it may replace what it did not write.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The owner named in the file's header (`controller <id>`).
    pub owner: String,
    /// Partitions adopted from the SMs (statements), kept in every file written.
    pub adopted: Option<String>,
    /// The file this controller last applied.
    pub last_applied: Option<String>,
    /// Started with `--adopt`: a master's file weft cannot parse may be replaced.
    pub adopt: bool,
    /// This delivery repairs drift (`--repair-drift`): it restores the applied state
    /// even over partitions someone else added (listed as removals in the audit).
    pub repair: bool,
    /// The delivery's stamp and what it may replace: with it, the file carries the stamp
    /// and an SM holding a newer file refuses it ([`FENCED`]).
    pub fence: Option<weft_opensm::Fence>,
    /// Records the checksum of the file about to be written, before any SM is written
    /// ([`Store::begin_delivery`]).
    pub intent: Intent,
}

/// The start of a [`Fabric::deliver`] error that is a fencing refusal: an SM holds a
/// newer file than this delivery ([`weft_opensm::Fence::admits`]); nothing was written.
pub const FENCED: &str = "fenced: ";

/// Why a [`Fabric`] could not read the fabric or deliver to it; each message is the text
/// the controller recorded before these were typed.
#[derive(Debug, thiserror::Error)]
pub enum FabricAccessError {
    /// An SM holds a newer file than this delivery ([`weft_opensm::Fence::admits`]);
    /// nothing was written. The message starts with [`FENCED`].
    #[error("{FENCED}{0}")]
    Fenced(String),
    /// The delivery was refused before anything was written: the plan breaks a rule, an
    /// adopted or foreign partition would be lost, the checksum could not be recorded.
    #[error("{0}")]
    Refused(String),
    /// The master SM the fabric names is none of the configured SMs.
    #[error("the master SM's port {0} is none of the configured SMs")]
    UnknownMaster(weft_fabric::Guid),
    /// The applied file, read back for the port check, does not parse.
    #[error("the applied file: {0}")]
    AppliedFile(#[source] weft_fabric::conf::ParseError),
    /// This fabric cannot say which SM is the master (one that only records).
    #[error("this fabric cannot name its master SM")]
    NoMaster,
    /// The checksum of the file about to be written could not be recorded
    /// ([`Context::intent`]); nothing was written.
    #[error("cannot record the delivery: {0}")]
    Record(#[source] StoreError),
    /// The file would break what [`prepare`] guards; nothing was written.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Diag(#[from] weft_opensm::DiagError),
    #[error(transparent)]
    Sm(#[from] weft_opensm::SmError),
}

/// The message, for the callers that carry errors as text (the store's failure record).
impl From<FabricAccessError> for String {
    fn from(e: FabricAccessError) -> String {
        e.to_string()
    }
}

/// What [`Intent`] calls with the checksum.
type RecordFn = dyn Fn(&str) -> Result<(), StoreError> + Send + Sync;

/// A callback that records a delivery's checksum before the first write.
#[derive(Clone, Default)]
pub struct Intent(Option<Arc<RecordFn>>);

impl std::fmt::Debug for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Intent(recorded)"
        } else {
            "Intent(none)"
        })
    }
}

impl Intent {
    /// An intent that calls `f` with the checksum.
    pub fn new(f: impl Fn(&str) -> Result<(), StoreError> + Send + Sync + 'static) -> Intent {
        Intent(Some(Arc::new(f)))
    }

    /// Records `checksum` (nothing without a callback).
    pub fn record(&self, checksum: &str) -> Result<(), FabricAccessError> {
        match &self.0 {
            Some(f) => f(checksum).map_err(FabricAccessError::Record),
            None => Ok(()),
        }
    }
}

/// Refuses ([`FENCED`]) a delivery that `ctx`'s fence does not admit over `held`, the
/// master SM's file.
fn fence_check(ctx: &Context, held: Option<&str>) -> Result<(), FabricAccessError> {
    match (&ctx.fence, held) {
        (Some(f), Some(h)) => f.admits(h.as_bytes()).map_err(|why| {
            FabricAccessError::Fenced(format!("refused by the master SM's file: {why}"))
        }),
        _ => Ok(()),
    }
}

/// The file text for `full` with `ctx`'s owner header, and its stamp when fenced; the
/// checksum recorded through [`Context::intent`] before anything is written.
fn owned_text(full: &Conf, ctx: &Context) -> Result<String, FabricAccessError> {
    let body = conf::render(full);
    let text = match &ctx.fence {
        Some(f) => weft_opensm::with_owner_stamped(&ctx.owner, f.stamp, body),
        None => weft_opensm::with_owner(Some(&ctx.owner), body),
    };
    ctx.intent.record(&weft_opensm::checksum(text.as_bytes()))?;
    Ok(text)
}

/// Why [`prepare`] refuses a delivery before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The partitions adopted from the SMs ([`Context::adopted`]) do not parse.
    #[error("the adopted partitions: {0}")]
    Adopted(#[source] weft_fabric::conf::ParseError),
    /// An adopted partition has the name or P_Key of a group's partition.
    #[error("adopted partition `{0}` collides with a group's name or P_Key")]
    Collides(String),
    /// The master's file does not parse, and neither `--adopt` nor a drift repair allows
    /// replacing it.
    #[error(
        "the master SM holds a partitions file weft cannot parse; refusing to replace what the controller did not write (start it with --adopt to take the fabric over)"
    )]
    Unparsable,
    /// The file would remove what this controller did not write, one line each.
    #[error(
        "refusing to remove from the SMs what this controller did not write:\n{}\n(start the controller with --adopt to keep those partitions as its own, or remove them from the SMs first)",
        .0.join("\n")
    )]
    Foreign(Vec<String>),
}

/// The file to write for `compiled` and what it removes from `held` (the master's file),
/// one line per removal: the adopted partitions are added, and a removal of anything the
/// controller did not write itself ([`Context::last_applied`]) is refused, since the
/// partition belongs to someone else (`--adopt` takes it over instead). The Default
/// partition is the controller's policy: its changes are listed, never refused.
pub fn prepare(
    mut compiled: Conf,
    held: Option<&str>,
    ctx: &Context,
) -> Result<(Conf, Vec<String>), PrepareError> {
    if let Some(adopted) = &ctx.adopted {
        let a = conf::parse(adopted).map_err(PrepareError::Adopted)?;
        for p in a.partitions {
            if compiled
                .partitions
                .iter()
                .any(|c| c.pkey == p.pkey || c.name == p.name)
            {
                return Err(PrepareError::Collides(p.name));
            }
            compiled.partitions.push(p);
        }
    }
    let Some(held) = held else {
        return Ok((compiled, Vec::new()));
    };
    let Ok(old) = conf::parse(held) else {
        if ctx.adopt || ctx.repair {
            return Ok((
                compiled,
                vec!["- the master's file, which weft cannot parse, is replaced".into()],
            ));
        }
        return Err(PrepareError::Unparsable);
    };
    let removed = weft_fabric::removals(&old, &compiled);
    let own = ctx
        .last_applied
        .as_deref()
        .and_then(|t| conf::parse(t).ok())
        .map(|mine| weft_fabric::removals(&mine, &compiled))
        .unwrap_or_default();
    let key = |r: &Removal| match r {
        Removal::Partition { pkey, .. } => (*pkey, None),
        Removal::Member { pkey, selector, .. } => (*pkey, Some(selector.clone())),
    };
    let foreign: Vec<&Removal> = removed
        .iter()
        .filter(|r| !own.iter().any(|o| key(o) == key(r)))
        // The Default partition is always the controller's (its policy isolates);
        // what it changes there is recorded, not refused.
        .filter(|r| !key(r).0.is_default())
        .collect();
    if !foreign.is_empty() && !ctx.repair {
        return Err(PrepareError::Foreign(
            foreign.iter().map(|r| r.to_string()).collect(),
        ));
    }
    Ok((compiled, removed.iter().map(|r| r.to_string()).collect()))
}

/// Where the rendered plan goes. The OpenSM driver in production ([`OpenSmFabric`]);
/// tests and benchmarks can record instead.
pub trait Fabric: Send + Sync + 'static {
    /// Compiles `plan` against the fabric, adds what was adopted, guards removals
    /// ([`prepare`]), delivers it with the owner header and verifies it. Blocking.
    fn deliver(&self, plan: &FabricPlan, ctx: &Context) -> Result<Delivered, FabricAccessError>;
    /// The partitions file the master SM holds now (`None`: none). Blocking.
    fn held(&self) -> Result<Option<String>, FabricAccessError> {
        Ok(None)
    }
    /// Every SM's name and file (`Ok(None)`: it has none; `Err`: it cannot be read), for
    /// the drift check. Blocking.
    fn sm_files(&self) -> Vec<(String, Result<Option<String>, FabricAccessError>)> {
        Vec::new()
    }
    /// The name of the SM (among [`Fabric::sm_files`]' names) the fabric runs on, as the
    /// fabric reports its master (`sminfo`): `Ok(None)` when the master is none of them,
    /// `Err` when it cannot be asked. Blocking.
    fn master_sm(&self) -> Result<Option<String>, FabricAccessError> {
        Err(FabricAccessError::NoMaster)
    }
    /// The ports whose P_Key tables differ from what `conf` programs, one line each;
    /// `Ok(None)` when this fabric has no ports to read. Blocking.
    fn port_drift(&self, _conf: &str) -> Result<Option<Vec<String>>, FabricAccessError> {
        Ok(None)
    }
    /// Whether a delivery reaches subnet managers and is verified on ports; `false` for a
    /// fabric that only records (`weft controller --no-fabric`), so that no message
    /// claims a verification that did not happen.
    fn delivers(&self) -> bool {
        true
    }
    /// The leaf switch each end port is cabled to (port GUID to the switch's name), for
    /// the lease loop's one-switch preference; empty for a fabric that cannot say.
    /// Blocking.
    fn leaf_switches(&self) -> Result<BTreeMap<weft_fabric::Guid, String>, FabricAccessError> {
        Ok(BTreeMap::new())
    }
}

/// The OpenSM driver: the SM hosts are injected (`LocalSm`, `SshSm`), so the controller
/// knows nothing of how an SM is reached.
pub struct OpenSmFabric {
    /// The applier, with its SM hosts and diagnostic tools.
    pub applier: Applier,
}

impl Fabric for OpenSmFabric {
    fn held(&self) -> Result<Option<String>, FabricAccessError> {
        let master = self.applier.diag.master_sm()?;
        let sm = self
            .applier
            .sms
            .iter()
            .find(|s| s.port_guid() == master)
            .ok_or(FabricAccessError::UnknownMaster(master))?;
        Ok(sm
            .read_partitions()?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    fn sm_files(&self) -> Vec<(String, Result<Option<String>, FabricAccessError>)> {
        self.applier
            .sms
            .iter()
            .map(|s| {
                (
                    s.name().to_string(),
                    s.read_partitions()
                        .map(|b| b.map(|b| String::from_utf8_lossy(&b).into_owned()))
                        .map_err(FabricAccessError::from),
                )
            })
            .collect()
    }

    fn leaf_switches(&self) -> Result<BTreeMap<weft_fabric::Guid, String>, FabricAccessError> {
        Ok(self.applier.diag.uplinks()?)
    }

    fn master_sm(&self) -> Result<Option<String>, FabricAccessError> {
        let master = self.applier.diag.master_sm()?;
        Ok(self
            .applier
            .sms
            .iter()
            .find(|s| s.port_guid() == master)
            .map(|s| s.name().to_string()))
    }

    fn port_drift(&self, text: &str) -> Result<Option<Vec<String>>, FabricAccessError> {
        let c = conf::parse(text).map_err(FabricAccessError::AppliedFile)?;
        let v = self.applier.verify(&c)?;
        Ok(Some(v.mismatches.iter().map(|m| m.to_string()).collect()))
    }

    fn deliver(&self, plan: &FabricPlan, ctx: &Context) -> Result<Delivered, FabricAccessError> {
        let before = self.applier.diag.snapshot()?;
        let compiled = weft_fabric::compile(plan, Some(&before.inventory)).map_err(|v| {
            FabricAccessError::Refused(
                v.iter()
                    .map(|v| format!("{}: {}", v.subject, v.message))
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        let held = self
            .applier
            .master_file(&before)?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let on_fabric: std::collections::BTreeSet<weft_fabric::Guid> =
            before.inventory.ports.iter().map(|p| p.port_guid).collect();
        let mut absent: Vec<weft_fabric::Guid> = plan
            .partitions
            .iter()
            .flat_map(|p| p.members.iter().filter_map(|m| m.guid))
            .filter(|g| !on_fabric.contains(g))
            .collect();
        absent.sort();
        absent.dedup();
        // Fenced out first: a deposed controller is told so, not what its file would
        // remove. (The check that counts is the one under the SMs' locks.)
        fence_check(ctx, held.as_deref())?;
        let (full, removed) = prepare(compiled.conf, held.as_deref(), ctx)?;
        let conf = owned_text(&full, ctx)?;
        let taken = taken_from_ports(&self.applier.compare(&full, &before).mismatches, &before);
        let applied = match &ctx.fence {
            Some(f) => self.applier.apply_fenced(&full, &before, &ctx.owner, f),
            None => self.applier.apply_owned(&full, &before, &ctx.owner),
        };
        match applied {
            Ok(r) => Ok(Delivered {
                degraded: r
                    .degraded
                    .iter()
                    .map(|name| DegradedSm {
                        name: name.clone(),
                        error: r
                            .sms
                            .iter()
                            .find(|s| &s.name == name)
                            .and_then(|s| s.error.clone())
                            .unwrap_or_else(|| "host unreachable".into()),
                    })
                    .collect(),
                checksum: r.checksum,
                conf,
                ports_verified: r.ports_verified,
                total_ms: r.total_ms,
                before: held,
                removed,
                absent,
                taken,
            }),
            Err(e @ ApplyError::Fenced { .. }) => Err(FabricAccessError::Fenced(e.to_string())),
            Err(e) => Err(e.into()),
        }
    }
}

/// The ports that lose a P_Key table entry (`unexpected`: held now, not programmed by the
/// new file), one line each, named by GUID and node description.
fn taken_from_ports(
    m: &[weft_fabric::PortMismatch],
    before: &weft_opensm::FabricSnapshot,
) -> Vec<String> {
    m.iter()
        .filter(|x| !x.unexpected.is_empty())
        .map(|x| {
            let node = before
                .inventory
                .port(x.port)
                .map(|p| format!(" ({})", p.node_desc))
                .unwrap_or_default();
            let keys: Vec<String> = x.unexpected.iter().map(|k| format!("{k:#06x}")).collect();
            format!("port {}{node}: loses {}", x.port, keys.join(" "))
        })
        .collect()
}

/// A fabric that renders and remembers each plan (API tests and the report benchmark).
/// `fail_next` makes the next deliveries fail, to exercise retries; `degrade_next` makes
/// the next ones succeed with a standby named `standby` left out. `held` plays the
/// master's file: what the last delivery wrote, or what a test put there.
#[derive(Debug, Default)]
pub struct RecordingFabric {
    /// Files delivered, in order.
    pub delivered: Mutex<Vec<String>>,
    /// The "master's file".
    pub held: Mutex<Option<String>>,
    /// Offer `held` to the drift check as the file of an SM named `master` (tests of
    /// drift); off, the drift check has nothing to read (`--no-fabric`), so it never
    /// says "in sync".
    pub plays_sm: bool,
    /// Deliveries left to fail.
    pub fail_next: Mutex<u32>,
    /// Deliveries left to report degraded.
    pub degrade_next: Mutex<u32>,
}

impl Fabric for RecordingFabric {
    fn delivers(&self) -> bool {
        false
    }

    fn held(&self) -> Result<Option<String>, FabricAccessError> {
        Ok(self.held.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn sm_files(&self) -> Vec<(String, Result<Option<String>, FabricAccessError>)> {
        if self.plays_sm {
            vec![("master".into(), self.held())]
        } else {
            Vec::new()
        }
    }

    fn master_sm(&self) -> Result<Option<String>, FabricAccessError> {
        Ok(self.plays_sm.then(|| "master".to_string()))
    }

    fn deliver(&self, plan: &FabricPlan, ctx: &Context) -> Result<Delivered, FabricAccessError> {
        let compiled = weft_fabric::compile(plan, None)
            .map_err(|v| FabricAccessError::Refused(format!("{v:?}")))?;
        let held = self.held()?;
        fence_check(ctx, held.as_deref())?;
        let (full, removed) = prepare(compiled.conf, held.as_deref(), ctx)?;
        let conf = owned_text(&full, ctx)?;
        {
            let mut fail = self.fail_next.lock().unwrap_or_else(|p| p.into_inner());
            if *fail > 0 {
                *fail -= 1;
                return Err(FabricAccessError::Refused("injected failure".into()));
            }
        }
        self.delivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conf.clone());
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(conf.clone());
        let degraded = {
            let mut n = self.degrade_next.lock().unwrap_or_else(|p| p.into_inner());
            if *n > 0 {
                *n -= 1;
                vec![DegradedSm {
                    name: "standby".into(),
                    error: "injected: host unreachable".into(),
                }]
            } else {
                Vec::new()
            }
        };
        Ok(Delivered {
            checksum: weft_opensm::checksum(conf.as_bytes()),
            conf,
            ports_verified: 0,
            total_ms: 0.0,
            degraded,
            before: held,
            removed,
            absent: Vec::new(),
            taken: Vec::new(),
        })
    }
}

/// Backoff after `failures` consecutive failures: 250 ms doubling, at most `max`.
pub fn backoff(failures: u32, max: Duration) -> Duration {
    let ms = 250u64.saturating_mul(1u64 << failures.saturating_sub(1).min(16));
    Duration::from_millis(ms).min(max)
}

fn now() -> u64 {
    crate::server::unix_now()
}

/// The loop's knobs.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// How often it looks without an event; the SMs' files are read for drift as often.
    pub recheck: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// Adopt the SMs' partitions at start ([`Context::adopt`]).
    pub adopt: bool,
    /// How often the ports' tables are read for drift (each read costs an SMP per port).
    pub port_check: Duration,
    /// Deliver the applied state again when drift is found.
    pub repair: bool,
    /// Whether this controller leads: only the leader delivers (and checks for drift).
    pub lead: Arc<crate::leader::Leadership>,
}

/// Runs the loop until `events` closes, writing the drift check's findings to `drift`.
pub async fn run(
    store: Arc<dyn Store>,
    fabric: Arc<dyn Fabric>,
    metrics: Arc<Metrics>,
    mut events: mpsc::Receiver<Event>,
    cfg: LoopConfig,
    drift: Arc<Mutex<DriftView>>,
) {
    let (recheck, max_backoff, adopt) = (cfg.recheck, cfg.max_backoff, cfg.adopt);
    let mut next_port_check = Instant::now();
    let mut next_file_check = Instant::now();
    let mut repair = false;
    let mut failures: u32 = 0;
    // Deliver the applied state again even if nothing changed: some SM may hold an
    // older file (left out of the last delivery, or unknown after a start).
    let mut resync = false;
    let mut resync_tries: u32 = 0;
    // SMs known to hold an older file, and why.
    let mut left_out: BTreeMap<String, String> = BTreeMap::new();
    // The last fencing refusal audited (audited again only when it changes).
    let mut fenced: Option<String> = None;
    let mut next_check = Instant::now();
    loop {
        let wait = next_check.saturating_duration_since(Instant::now());
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = tokio::time::sleep(wait) => Event::Tick,
        };
        // Only the leader delivers, checks for drift or recovers: a follower waits for the
        // election to wake it (`Event::Started` when it becomes the leader).
        let Some(licence) = cfg.lead.delivering() else {
            next_check = Instant::now() + recheck;
            continue;
        };
        if event == Event::Started {
            note_interrupted(&store).await;
            if adopt {
                adopt_held(&store, &fabric).await;
            }
            resync = true;
        }
        // While backing off, a change does not bypass the wait (the cause is likely the
        // fabric, not the change); the timer delivers the retry.
        if failures > 0 && event == Event::Changed && Instant::now() < next_check {
            continue;
        }
        match reconcile_once(
            &store,
            &fabric,
            &metrics,
            (resync, adopt, repair),
            (licence, cfg.lead.is_elected().then(|| cfg.lead.holder())),
            &mut fenced,
        )
        .await
        {
            Ok(Pass::Delivered(generation, degraded)) => {
                failures = 0;
                if repair {
                    repair = false;
                    metrics.drift_repairs.inc();
                    drift.lock().unwrap_or_else(|p| p.into_inner()).repairs += 1;
                }
                // What was just written and verified is in sync; the next check says.
                next_port_check = next_port_check.min(Instant::now() + recheck);
                note_left_out(&store, &mut left_out, generation, &degraded).await;
                if degraded.is_empty() {
                    resync = false;
                    resync_tries = 0;
                    // Changes may have arrived during the delivery: look again at once.
                    next_check = Instant::now();
                } else {
                    // The ports are right; the standby is retried from 1 s, doubling.
                    // A change meanwhile is delivered at once (and retries it too).
                    resync = true;
                    resync_tries += 1;
                    next_check = Instant::now() + backoff(resync_tries + 2, max_backoff);
                }
            }
            Ok(Pass::Idle) => {
                failures = 0;
                resync = false;
                next_check = Instant::now() + recheck;
                {
                    let ports = Instant::now() >= next_port_check;
                    if ports {
                        next_port_check = Instant::now() + cfg.port_check;
                    }
                    let found = check_drift(&store, &fabric, &metrics, &drift, ports).await;
                    if found && cfg.repair {
                        tracing::warn!(
                            "drift found; delivering the applied state again to repair it"
                        );
                        resync = true;
                        repair = true;
                        next_check = Instant::now();
                    }
                }
            }
            Err(()) => {
                failures += 1;
                next_check = Instant::now() + backoff(failures, max_backoff);
                // A delivery refused or failing (say, over partitions someone added while
                // the controller was down) still shows what the fabric holds now; the
                // SMs' files at most once per `recheck`, the ports on their schedule.
                if Instant::now() >= next_file_check {
                    next_file_check = Instant::now() + recheck;
                    let ports = Instant::now() >= next_port_check;
                    if ports {
                        next_port_check = Instant::now() + cfg.port_check;
                    }
                    check_drift(&store, &fabric, &metrics, &drift, ports).await;
                }
            }
        }
    }
}

/// `--adopt`: takes over the partitions the master's file holds that this controller did
/// not write (every one but Default, and those of its last applied file), so that its
/// deliveries keep them; audited. A file this controller wrote, or none, adopts nothing.
async fn adopt_held(store: &Arc<dyn Store>, fabric: &Arc<dyn Fabric>) {
    let (s, f) = (store.clone(), fabric.clone());
    let outcome = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let Some(held) = f.held()? else {
            return Ok("the master holds no partitions file: nothing to adopt".into());
        };
        let me = s.controller_id().map_err(|e| e.to_string())?;
        if weft_opensm::owner_of(held.as_bytes()).as_deref() == Some(me.as_str()) {
            return Ok(format!("the master's file is this controller's ({me}): nothing to adopt"));
        }
        let held_conf = conf::parse(&held)
            .map_err(|e| format!("cannot adopt the master's file: {e}"))?;
        let applied = s.applied().map_err(|e| e.to_string())?;
        let mine: Vec<String> = applied
            .conf
            .as_deref()
            .and_then(|t| conf::parse(t).ok())
            .map(|c| c.partitions.into_iter().map(|p| p.name).collect())
            .unwrap_or_default();
        let groups: Vec<String> = s
            .desired()
            .map_err(|e| e.to_string())?
            .groups
            .into_iter()
            .map(|g| g.name)
            .collect();
        let mut adopted = s
            .adopted()
            .map_err(|e| e.to_string())?
            .map(|t| conf::parse(&t).map_err(|e| format!("the adopted partitions: {e}")))
            .transpose()?
            .unwrap_or_default();
        let keys = held_conf.effective_pkeys();
        let mut taken = Vec::new();
        for (mut p, key) in held_conf.partitions.into_iter().zip(keys) {
            let Some(key) = key else { continue };
            if key.is_default()
                || mine.contains(&p.name)
                || groups.contains(&p.name)
                || adopted.partitions.iter().any(|a| a.name == p.name)
            {
                continue;
            }
            // Pinned, so that a fresh standby computes the same key.
            p.pkey = Some(key);
            taken.push(format!("`{}` ({key})", p.name));
            adopted.partitions.push(p);
        }
        if taken.is_empty() {
            return Ok("the master's file holds no partition to adopt".into());
        }
        let text = conf::render(&adopted);
        let pkeys: Vec<u16> = adopted
            .partitions
            .iter()
            .filter_map(|p| p.pkey.map(|k| k.base()))
            .collect();
        let names: Vec<String> = adopted.partitions.iter().map(|p| p.name.clone()).collect();
        let detail = format!(
            "adopted from the master's file (owner: {}): {}; kept in every file this controller writes",
            weft_opensm::owner_of(held.as_bytes()).unwrap_or_else(|| "none named".into()),
            taken.join(", ")
        );
        s.adopt(&text, &pkeys, &names, &detail, now())
            .map_err(|e| e.to_string())?;
        Ok(detail)
    })
    .await;
    match outcome {
        Ok(Ok(d)) => tracing::info!("adopt: {d}"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "adopt failed");
            let s = store.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let line = AuditLine {
                    actor: "controller",
                    action: "adopt",
                    subject: "fabric",
                    outcome: "failed",
                    detail: &e,
                    ..AuditLine::default()
                };
                s.audit_append(&line, now())
            })
            .await;
        }
        Err(e) => tracing::error!(error = %e, "adopt task failed"),
    }
}

/// Reads every SM's file (and, with `ports`, every port's table) and compares them with
/// the applied file; the findings go to `view`, the gauges, and (when the verdict
/// changes) the audit log. Returns whether there is drift.
async fn check_drift(
    store: &Arc<dyn Store>,
    fabric: &Arc<dyn Fabric>,
    metrics: &Arc<Metrics>,
    view: &Arc<Mutex<DriftView>>,
    ports: bool,
) -> bool {
    let (s, f) = (store.clone(), fabric.clone());
    let found = tokio::task::spawn_blocking(move || {
        let applied = s.applied().map_err(|e| e.to_string())?;
        let Some(conf_text) = applied.conf.filter(|_| applied.generation > 0) else {
            return Ok(None);
        };
        let want = weft_opensm::checksum(conf_text.as_bytes());
        let (mut files, mut unreadable) = (Vec::new(), Vec::new());
        let sms = f.sm_files();
        let any_sm = !sms.is_empty();
        let master = if any_sm { f.master_sm() } else { Ok(None) };
        let views = sm_views(&sms, &master, &want);
        for (name, file) in sms {
            match file {
                Ok(Some(t)) if weft_opensm::checksum(t.as_bytes()) == want => {}
                Ok(Some(t)) => {
                    let diff = crate::render::diff(&conf_text, &t);
                    let changed = diff.lines().count();
                    files.push(format!(
                        "SM `{name}` holds checksum {} instead of the applied {} ({changed} line(s) differ)",
                        short(&weft_opensm::checksum(t.as_bytes())),
                        short(&want)
                    ));
                }
                Ok(None) => files.push(format!("SM `{name}` has no partitions file")),
                Err(e) => unreadable.push(format!("SM `{name}`: {e}")),
            }
        }
        let port_lines = if ports {
            match f.port_drift(&conf_text) {
                Ok(p) => p,
                Err(e) => {
                    unreadable.push(format!("ports: {e}"));
                    None
                }
            }
        } else {
            None
        };
        if !any_sm && port_lines.is_none() && unreadable.is_empty() {
            // Nothing to read (no fabric): no verdict.
            return Ok(None);
        }
        Ok::<_, String>(Some((files, unreadable, port_lines, views)))
    })
    .await;
    let (files, unreadable, port_lines, sms) = match found {
        Ok(Ok(Some(v))) => v,
        Ok(Ok(None)) => return false,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "drift check failed");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "drift check task failed");
            return false;
        }
    };
    let (before, after) = {
        let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
        let before = v.clone();
        v.files_checked_at = Some(now());
        v.files = files;
        v.unreadable = unreadable;
        v.sms = sms;
        if let Some(p) = port_lines {
            v.ports_checked_at = Some(now());
            v.ports = p;
        }
        v.state = if !v.files.is_empty() || !v.ports.is_empty() {
            DriftState::Drift
        } else if v.unreadable.is_empty() {
            DriftState::InSync
        } else {
            DriftState::Unknown
        };
        (before, v.clone())
    };
    for (kind, n) in [("files", after.files.len()), ("ports", after.ports.len())] {
        metrics
            .drift
            .get_or_create(&crate::metrics::DriftKind { kind: kind.into() })
            .set(i64::from(n > 0));
    }
    let drifted = after.state == DriftState::Drift;
    let changed = before.state != after.state
        || (drifted && (before.files != after.files || before.ports != after.ports));
    if changed && (drifted || before.state == DriftState::Drift) {
        let (outcome, detail) = if drifted {
            let mut lines = after.files.clone();
            lines.extend(after.ports.iter().cloned());
            tracing::warn!(findings = %lines.join("; "), "drift: the fabric differs from what the controller applied");
            (
                "drift",
                format!(
                    "the fabric differs from the applied file: {}",
                    lines.join("; ")
                ),
            )
        } else {
            tracing::info!("drift gone: the fabric holds the applied file again");
            (
                "in-sync",
                "the SMs' files and the ports checked hold the applied file again".to_string(),
            )
        };
        let s = store.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let line = AuditLine {
                actor: "controller",
                action: "drift",
                subject: "fabric",
                outcome,
                detail: &detail,
                ..AuditLine::default()
            };
            s.audit_append(&line, now())
        })
        .await;
    }
    drifted
}

/// Each SM's role, checksum and agreement with the applied file (checksum `want`), from
/// what [`Fabric::sm_files`] and [`Fabric::master_sm`] read.
pub fn sm_views(
    sms: &[(String, Result<Option<String>, FabricAccessError>)],
    master: &Result<Option<String>, FabricAccessError>,
    want: &str,
) -> Vec<crate::model::SmView> {
    sms.iter()
        .map(|(name, file)| {
            let role = match master {
                Ok(Some(m)) if m == name => "master",
                Ok(_) => "standby",
                Err(_) => "unknown",
            };
            let (checksum, file_error) = match file {
                Ok(Some(t)) => (Some(weft_opensm::checksum(t.as_bytes())), None),
                Ok(None) => (None, None),
                Err(e) => (None, Some(e.to_string())),
            };
            let error = file_error.or_else(|| {
                master
                    .as_ref()
                    .err()
                    .map(|e| format!("the master cannot be read: {e}"))
            });
            crate::model::SmView {
                name: name.clone(),
                role: role.to_string(),
                agrees: checksum.as_deref() == Some(want),
                checksum,
                error,
            }
        })
        .collect()
}

fn short(checksum: &str) -> &str {
    &checksum[..12.min(checksum.len())]
}

async fn note_interrupted(store: &Arc<dyn Store>) {
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let pending = s.operations(true)?;
        for op in pending.iter().rev() {
            let subject = format!("operation {}", op.id);
            let detail = format!(
                "the controller (re)started with `{}` not yet verified on the fabric; delivering generation {} again",
                op.action, op.generation
            );
            let line = AuditLine {
                actor: "controller",
                action: "recover",
                subject: &subject,
                outcome: "pending",
                detail: &detail,
                ..AuditLine::default()
            };
            s.audit_append(&line, now())?;
        }
        Ok::<_, crate::store::StoreError>(())
    })
    .await;
}

/// Writes the audit lines of SMs that a delivery of `generation` left out for the first
/// time, and of SMs that hold the file again; `left_out` becomes `degraded`.
async fn note_left_out(
    store: &Arc<dyn Store>,
    left_out: &mut BTreeMap<String, String>,
    generation: i64,
    degraded: &[DegradedSm],
) {
    let now_out: BTreeMap<String, String> = degraded
        .iter()
        .map(|d| (d.name.clone(), d.error.clone()))
        .collect();
    let mut lines = Vec::new();
    for (name, error) in &now_out {
        if !left_out.contains_key(name) {
            tracing::warn!(sm = %name, %error, generation, "SM left out of the delivery; will deliver again");
            lines.push((
                name.clone(),
                "degraded",
                format!("generation {generation} verified on the ports through the master, but SM `{name}` was not updated ({error}); it holds an older file and would program it if it took over; delivering again until it holds this one"),
            ));
        }
    }
    for name in left_out.keys() {
        if !now_out.contains_key(name) {
            tracing::info!(sm = %name, generation, "SM holds the applied file again");
            lines.push((
                name.clone(),
                "in-sync",
                format!("SM `{name}` holds the file of generation {generation} again"),
            ));
        }
    }
    *left_out = now_out;
    if lines.is_empty() {
        return;
    }
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for (name, outcome, detail) in lines {
            let subject = format!("sm {name}");
            let line = AuditLine {
                actor: "controller",
                action: "sm",
                subject: &subject,
                outcome,
                detail: &detail,
                ..AuditLine::default()
            };
            s.audit_append(&line, now())?;
        }
        Ok::<_, crate::store::StoreError>(())
    })
    .await;
}

/// What a pass did.
#[derive(Debug)]
enum Pass {
    /// Nothing to deliver.
    Idle,
    /// This generation was delivered and verified, with these SMs left out.
    Delivered(i64, Vec<DegradedSm>),
}

/// One pass: delivers the desired state if it is newer than the applied one, or (with
/// `resync`) the applied state again. `Err`: the delivery failed (recorded).
/// `licence`: the fencing number (else the store's) and the deadline of this leadership,
/// with the leader's holder id when elected (named in the delivery's audit line).
async fn reconcile_once(
    store: &Arc<dyn Store>,
    fabric: &Arc<dyn Fabric>,
    metrics: &Arc<Metrics>,
    (resync, adopt, repair): (bool, bool, bool),
    (licence, leader): (crate::leader::Licence, Option<&str>),
    fenced: &mut Option<String>,
) -> Result<Pass, ()> {
    let s = store.clone();
    let state = tokio::task::spawn_blocking(move || {
        Ok::<_, crate::store::StoreError>((
            s.desired()?,
            s.applied()?,
            s.controller_id()?,
            s.adopted()?,
            s.fencing()?,
        ))
    })
    .await;
    let (desired, applied, owner, adopted, fencing) = match state {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "reconcile cannot read the store");
            return Err(());
        }
        Err(e) => {
            tracing::error!(error = %e, "reconcile task failed");
            return Err(());
        }
    };
    let again = resync && applied.generation > 0;
    if desired.generation <= applied.generation && !again {
        return Ok(Pass::Idle);
    }
    let generation = desired.generation;
    let plan = match crate::render::plan(&desired) {
        Ok(p) => p,
        Err(e) => {
            record_failure(store, generation, e.into(), metrics).await;
            return Err(());
        }
    };
    let s = store.clone();
    let number = licence.fencing.unwrap_or(fencing.number);
    let ctx = Context {
        owner,
        adopted,
        last_applied: applied.conf.clone(),
        adopt,
        repair,
        fence: Some(weft_opensm::Fence {
            stamp: weft_opensm::Stamp {
                fencing: number,
                generation: u64::try_from(generation).unwrap_or(0),
            },
            applied: u64::try_from(applied.generation).unwrap_or(0),
            in_flight: fencing.in_flight,
            until: licence.until,
        }),
        intent: Intent::new(move |sum| s.begin_delivery(generation, sum)),
    };
    let f = fabric.clone();
    let started = Instant::now();
    let outcome = tokio::task::spawn_blocking(move || f.deliver(&plan, &ctx)).await;
    metrics
        .apply_seconds
        .observe(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(d)) => {
            metrics
                .applies
                .get_or_create(&crate::metrics::Outcome {
                    outcome: if d.degraded.is_empty() {
                        "applied"
                    } else {
                        "degraded"
                    }
                    .into(),
                })
                .inc();
            let s = store.clone();
            let mut detail = if fabric.delivers() {
                format!(
                    "verified on the ports: checksum {}, {} ports verified in {:.0} ms",
                    &d.checksum[..12.min(d.checksum.len())],
                    d.ports_verified,
                    d.total_ms
                )
            } else {
                format!(
                    "recorded, no fabric: checksum {}; delivered to no SM and verified on no port",
                    &d.checksum[..12.min(d.checksum.len())]
                )
            };
            if let Some(holder) = leader {
                detail.push_str(&format!(
                    "; delivered by the leader {holder} at fencing number {number}"
                ));
            }
            if !d.degraded.is_empty() {
                let names: Vec<String> =
                    d.degraded.iter().map(|x| format!("`{}`", x.name)).collect();
                detail.push_str(&format!(
                    "; degraded: SM {} not updated (host unreachable), delivering again",
                    names.join(", ")
                ));
            }
            // What it took from what the SMs held, for the operation's output: the removals
            // in words, then every port that loses a key.
            let taken: String = d
                .removed
                .iter()
                .chain(&d.taken)
                .map(|l| format!("{l}\n"))
                .collect();
            if !d.taken.is_empty() {
                tracing::info!(
                    generation,
                    ports = d.taken.len(),
                    "the delivery takes keys away from ports: {}",
                    d.taken.join("; ")
                );
            }
            let warning = (!d.absent.is_empty()).then(|| {
                let guids: Vec<String> = d.absent.iter().map(|g| g.to_string()).collect();
                format!(
                    "WARN: {} port(s) not on the fabric, written to the file but not verified: {}",
                    guids.len(),
                    guids.join(", ")
                )
            });
            if let Some(w) = &warning {
                tracing::warn!(generation, "{w}");
                detail.push_str("; ");
                detail.push_str(w);
            }
            let degraded = d.degraded.clone();
            tracing::info!(generation, %detail, "applied");
            // What the file did to the master's: the line diff, removals included, and
            // the removals in words (none when the file was already there).
            let before = d.before.clone().unwrap_or_default();
            if before != d.conf {
                let diff = crate::render::diff(&before, &d.conf);
                let removed = if d.removed.is_empty() {
                    "removes nothing".to_string()
                } else {
                    format!("removes:\n{}", d.removed.join("\n"))
                };
                let s2 = store.clone();
                let line =
                    format!("generation {generation} written over the master's file; it {removed}");
                let _ = tokio::task::spawn_blocking(move || {
                    let subject = format!("generation {generation}");
                    let line = AuditLine {
                        actor: "controller",
                        action: "deliver",
                        subject: &subject,
                        diff: &diff,
                        outcome: "written",
                        detail: &line,
                    };
                    s2.audit_append(&line, now())
                })
                .await;
            }
            let r = tokio::task::spawn_blocking(move || {
                let delivered = VerifiedDelivery {
                    generation,
                    checksum: &d.checksum,
                    conf: &d.conf,
                    detail: &detail,
                    warning: warning.as_deref(),
                    taken: &taken,
                };
                s.mark_applied(&delivered, now())
            })
            .await;
            if !matches!(r, Ok(Ok(_))) {
                tracing::error!("cannot record an applied generation");
                return Err(());
            }
            *fenced = None;
            Ok(Pass::Delivered(generation, degraded))
        }
        Ok(Err(e)) => {
            let fenced_out = matches!(e, FabricAccessError::Fenced(_));
            let e = e.to_string();
            if fenced_out {
                note_fenced(store, generation, &e, fenced).await;
            }
            record_failure(store, generation, e, metrics).await;
            Err(())
        }
        Err(e) => {
            record_failure(
                store,
                generation,
                format!("delivery task failed: {e}"),
                metrics,
            )
            .await;
            Err(())
        }
    }
}

/// Audits a fencing refusal (`fence`/`refused`, naming the SM and both stamps) once per
/// distinct refusal; `last` remembers the one audited.
async fn note_fenced(
    store: &Arc<dyn Store>,
    generation: i64,
    error: &str,
    last: &mut Option<String>,
) {
    let why = error.trim_start_matches(FENCED).to_string();
    if last.as_deref() == Some(why.as_str()) {
        return;
    }
    tracing::error!(generation, error = %why, "delivery refused by fencing; delivering nothing until `weft controller restore`");
    *last = Some(why.clone());
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let subject = format!("generation {generation}");
        let line = AuditLine {
            actor: "controller",
            action: "fence",
            subject: &subject,
            outcome: "refused",
            detail: &why,
            ..AuditLine::default()
        };
        s.audit_append(&line, now())
    })
    .await;
}

async fn record_failure(
    store: &Arc<dyn Store>,
    generation: i64,
    error: String,
    metrics: &Arc<Metrics>,
) {
    // A fencing refusal is its own outcome: this store is out of date, not the fabric.
    let outcome = if error.starts_with(FENCED) {
        "fenced"
    } else {
        "failed"
    };
    metrics
        .applies
        .get_or_create(&crate::metrics::Outcome {
            outcome: outcome.into(),
        })
        .inc();
    tracing::warn!(generation, %error, "delivery failed; will retry");
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || s.mark_failed(generation, &error, now())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_bound() {
        let max = Duration::from_secs(5);
        assert_eq!(backoff(1, max), Duration::from_millis(250));
        assert_eq!(backoff(2, max), Duration::from_millis(500));
        assert_eq!(backoff(3, max), Duration::from_millis(1000));
        assert_eq!(backoff(40, max), max);
    }

    #[test]
    fn each_sm_gets_its_role_checksum_and_agreement() {
        let want = weft_opensm::checksum(b"a");
        let sms = vec![
            ("sm-a".to_string(), Ok(Some("a".to_string()))),
            ("sm-b".to_string(), Ok(Some("b".to_string()))),
            (
                "sm-c".to_string(),
                Err(FabricAccessError::Refused("host unreachable".to_string())),
            ),
            ("sm-d".to_string(), Ok(None)),
        ];
        let v = sm_views(&sms, &Ok(Some("sm-b".into())), &want);
        let roles: Vec<&str> = v.iter().map(|s| s.role.as_str()).collect();
        assert_eq!(roles, ["standby", "master", "standby", "standby"]);
        let agrees: Vec<bool> = v.iter().map(|s| s.agrees).collect();
        assert_eq!(agrees, [true, false, false, false]);
        assert_eq!(v[0].checksum.as_deref(), Some(want.as_str()));
        assert_eq!(v[2].error.as_deref(), Some("host unreachable"));
        assert_eq!(v[3].checksum, None);
        let v = sm_views(&sms[..1], &Err(FabricAccessError::NoMaster), &want);
        assert_eq!(v[0].role, "unknown");
        assert!(
            v[0].error
                .as_deref()
                .unwrap()
                .contains("cannot name its master"),
            "{:?}",
            v[0].error
        );
    }

    #[test]
    fn a_fencing_refusal_is_its_own_variant_and_keeps_the_fenced_prefix() {
        let e = FabricAccessError::Fenced("refused by the master SM's file: newer".into());
        assert!(e.to_string().starts_with(FENCED));
        let e = FabricAccessError::UnknownMaster(weft_fabric::Guid(0x10));
        assert_eq!(
            String::from(e),
            "the master SM's port 0x0000000000000010 is none of the configured SMs"
        );
        let e = FabricAccessError::AppliedFile(conf::parse("x").unwrap_err());
        assert!(e.to_string().starts_with("the applied file: line 1"), "{e}");
    }
}
