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
use weft_fabric::Plan;
use weft_opensm::{Applier, ApplyError};

use crate::metrics::Metrics;
use crate::store::Store;

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
}

/// A standby SM a delivery left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DegradedSm {
    /// The SM's configured name.
    pub name: String,
    /// Why it was left out (names its host).
    pub error: String,
}

/// Where the rendered plan goes. The OpenSM driver in production ([`OpenSmFabric`]);
/// tests and benchmarks can record instead.
pub trait Fabric: Send + Sync + 'static {
    /// Compiles `plan` against the fabric, delivers it and verifies it. Blocking.
    fn deliver(&self, plan: &Plan) -> Result<Delivered, String>;
    /// Whether a delivery reaches subnet managers and is verified on ports; `false` for a
    /// fabric that only records (`weft controller --no-fabric`), so that no message
    /// claims a verification that did not happen.
    fn delivers(&self) -> bool {
        true
    }
}

/// The OpenSM driver: the SM hosts are injected (`LocalSm`, `SshSm`), so the controller
/// knows nothing of how an SM is reached.
pub struct OpenSmFabric {
    /// The applier, with its SM hosts and diagnostic tools.
    pub applier: Applier,
}

impl Fabric for OpenSmFabric {
    fn deliver(&self, plan: &Plan) -> Result<Delivered, String> {
        let before = self.applier.diag.snapshot().map_err(|e| e.to_string())?;
        let compiled = weft_fabric::compile(plan, Some(&before.inventory)).map_err(|v| {
            v.iter()
                .map(|v| format!("{}: {}", v.subject, v.message))
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        let conf = weft_fabric::conf::render(&compiled.conf);
        match self.applier.apply(&compiled.conf, &before) {
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
            }),
            Err(e @ ApplyError::RolledBack { .. }) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A fabric that renders and remembers each plan (API tests and the report benchmark).
/// `fail_next` makes the next deliveries fail, to exercise retries; `degrade_next` makes
/// the next ones succeed with a standby named `standby` left out.
#[derive(Debug, Default)]
pub struct RecordingFabric {
    /// Files delivered, in order.
    pub delivered: Mutex<Vec<String>>,
    /// Deliveries left to fail.
    pub fail_next: Mutex<u32>,
    /// Deliveries left to report degraded.
    pub degrade_next: Mutex<u32>,
}

impl Fabric for RecordingFabric {
    fn delivers(&self) -> bool {
        false
    }

    fn deliver(&self, plan: &Plan) -> Result<Delivered, String> {
        let compiled = weft_fabric::compile(plan, None).map_err(|v| format!("{v:?}"))?;
        let conf = weft_fabric::conf::render(&compiled.conf);
        {
            let mut fail = self.fail_next.lock().unwrap_or_else(|p| p.into_inner());
            if *fail > 0 {
                *fail -= 1;
                return Err("injected failure".into());
            }
        }
        self.delivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conf.clone());
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

/// Runs the loop until `events` closes. `recheck` is how often it looks without an event.
pub async fn run(
    store: Arc<dyn Store>,
    fabric: Arc<dyn Fabric>,
    metrics: Arc<Metrics>,
    mut events: mpsc::Receiver<Event>,
    recheck: Duration,
    max_backoff: Duration,
) {
    let mut failures: u32 = 0;
    // Deliver the applied state again even if nothing changed: some SM may hold an
    // older file (left out of the last delivery, or unknown after a start).
    let mut resync = false;
    let mut resync_tries: u32 = 0;
    // SMs known to hold an older file, and why.
    let mut left_out: BTreeMap<String, String> = BTreeMap::new();
    let mut next_check = Instant::now();
    loop {
        let wait = next_check.saturating_duration_since(Instant::now());
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = tokio::time::sleep(wait) => Event::Tick,
        };
        if event == Event::Started {
            note_interrupted(&store).await;
            resync = true;
        }
        // While backing off, a change does not bypass the wait (the cause is likely the
        // fabric, not the change); the timer delivers the retry.
        if failures > 0 && event == Event::Changed && Instant::now() < next_check {
            continue;
        }
        match reconcile_once(&store, &fabric, &metrics, resync).await {
            Ok(Pass::Delivered(generation, degraded)) => {
                failures = 0;
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
            }
            Err(()) => {
                failures += 1;
                next_check = Instant::now() + backoff(failures, max_backoff);
            }
        }
    }
}

async fn note_interrupted(store: &Arc<dyn Store>) {
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let pending = s.operations(true)?;
        for op in pending.iter().rev() {
            s.audit_append(
                "controller",
                "recover",
                &format!("operation {}", op.id),
                "pending",
                &format!("the controller (re)started with `{}` not yet verified on the fabric; delivering generation {} again", op.action, op.generation),
                now(),
            )?;
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
            s.audit_append(
                "controller",
                "sm",
                &format!("sm {name}"),
                outcome,
                &detail,
                now(),
            )?;
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
async fn reconcile_once(
    store: &Arc<dyn Store>,
    fabric: &Arc<dyn Fabric>,
    metrics: &Arc<Metrics>,
    resync: bool,
) -> Result<Pass, ()> {
    let s = store.clone();
    let state = tokio::task::spawn_blocking(move || {
        Ok::<_, crate::store::StoreError>((s.desired()?, s.applied()?))
    })
    .await;
    let (desired, applied) = match state {
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
            record_failure(store, generation, e, metrics).await;
            return Err(());
        }
    };
    let f = fabric.clone();
    let started = Instant::now();
    let outcome = tokio::task::spawn_blocking(move || f.deliver(&plan)).await;
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
            if !d.degraded.is_empty() {
                let names: Vec<String> =
                    d.degraded.iter().map(|x| format!("`{}`", x.name)).collect();
                detail.push_str(&format!(
                    "; degraded: SM {} not updated (host unreachable), delivering again",
                    names.join(", ")
                ));
            }
            let degraded = d.degraded.clone();
            tracing::info!(generation, %detail, "applied");
            let r = tokio::task::spawn_blocking(move || {
                s.mark_applied(generation, &d.checksum, &d.conf, &detail, now())
            })
            .await;
            if !matches!(r, Ok(Ok(_))) {
                tracing::error!("cannot record an applied generation");
                return Err(());
            }
            Ok(Pass::Delivered(generation, degraded))
        }
        Ok(Err(e)) => {
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

async fn record_failure(
    store: &Arc<dyn Store>,
    generation: i64,
    error: String,
    metrics: &Arc<Metrics>,
) {
    metrics
        .applies
        .get_or_create(&crate::metrics::Outcome {
            outcome: "failed".into(),
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
}
