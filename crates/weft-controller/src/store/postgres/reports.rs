//! Agents' reports on PostgreSQL, committed together (group commit): a report waits in
//! [`Queue`]; the first caller that finds no commit under way commits every report
//! waiting (at most [`MAX_BATCH`], one per server) in ONE transaction under the write
//! lock, answers each caller after the commit, and hands the next commit to the first
//! report still waiting. A report is acknowledged only once it is committed, as with one
//! transaction a report; what one report does is what `servers::report`, `set_gpus` and
//! `set_links` do, so a batch commits the same rows as its reports one by one would.
//!
//! A report whose ports changed (a new host, an HCA added or gone) runs
//! `servers::report` in a savepoint of its own: its ownership, claims, operation and
//! audit lines commit with the batch or, if it fails, not at all, without failing the
//! others. The rest (ports as last reported: the heartbeat case) are a few statements
//! for the whole batch: liveness, the owners of their ports, GPUs and links.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc;

use super::{Conn, LOCK_SQL, PgStore, WRITE_LOCK, Which, guid_to_sql, servers};
use crate::model::ReportAck;
use crate::store::{AgentReport, ReportOutcome, Result, StoreError};

/// The most reports one transaction commits.
pub(super) const MAX_BATCH: usize = 256;

/// The reports waiting for a commit, and whether one is under way.
#[derive(Default)]
pub(super) struct Queue {
    waiting: VecDeque<Waiting>,
    committing: bool,
}

/// What a waiting caller is told.
enum Answer {
    /// Its report's outcome, after the commit.
    Done(Result<ReportOutcome>),
    /// It commits the next batch.
    Commit,
}

/// One agent's report as it waits, its GPUs and links already JSON.
pub(super) struct Queued {
    report: AgentReport,
    gpus: String,
    links: String,
    now: u64,
    answer: mpsc::Sender<Answer>,
    wait: mpsc::Receiver<Answer>,
}

impl Queued {
    /// `report` made ready to wait; a report whose GPUs or links do not serialize is
    /// refused here, before it waits.
    pub(super) fn new(report: AgentReport, now: u64) -> Result<Queued> {
        let server = &report.server;
        let gpus = serde_json::to_string(&report.gpus)
            .map_err(|e| StoreError::Invalid(format!("GPUs of `{server}`: {e}")))?;
        let links = serde_json::to_string(&report.links)
            .map_err(|e| StoreError::Invalid(format!("links of `{server}`: {e}")))?;
        let (answer, wait) = mpsc::channel();
        Ok(Queued {
            report,
            gpus,
            links,
            now,
            answer,
            wait,
        })
    }
}

/// Records `queued`, committed with whatever else is waiting; answers after the commit.
pub(super) fn report(store: &PgStore, queued: Queued) -> Result<ReportOutcome> {
    let Queued {
        report,
        gpus,
        links,
        now,
        answer,
        wait,
    } = queued;
    let waiting = Waiting {
        report,
        gpus,
        links,
        now,
        answer,
    };
    let commits = {
        let mut q = store.reports.lock().unwrap_or_else(|p| p.into_inner());
        q.waiting.push_back(waiting);
        !std::mem::replace(&mut q.committing, true)
    };
    if !commits {
        match wait.recv() {
            Ok(Answer::Done(outcome)) => return outcome,
            Ok(Answer::Commit) => {}
            Err(_) => return Err(store.refuse("the report's commit ended without an answer")),
        }
    }
    // This caller's report is first in line now: the batch holds it.
    commit_next(store);
    match wait.recv() {
        Ok(Answer::Done(outcome)) => outcome,
        _ => Err(store.refuse("the report's commit ended without an answer")),
    }
}

/// A report in the queue.
struct Waiting {
    report: AgentReport,
    gpus: String,
    links: String,
    now: u64,
    answer: mpsc::Sender<Answer>,
}

/// Commits the reports first in line, answers them, and hands the next commit on.
fn commit_next(store: &PgStore) {
    let batch: Vec<Waiting> = {
        let mut q = store.reports.lock().unwrap_or_else(|p| p.into_inner());
        let mut servers = HashSet::new();
        let mut batch = Vec::new();
        // One report per server a batch: a second waits for the next (its order kept).
        while batch.len() < MAX_BATCH
            && let Some(w) = q.waiting.front()
            && servers.insert(w.report.server.clone())
            && let Some(w) = q.waiting.pop_front()
        {
            batch.push(w);
        }
        batch
    };
    let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.off_runtime(|| store.with_conn(Which::Write, |conn| commit(conn, &batch)))
    }));
    for (i, w) in batch.iter().enumerate() {
        let outcome = match &outcomes {
            Ok(Ok(each)) => match each.get(i) {
                Some(Ok(o)) => Ok(o.clone()),
                Some(Err(e)) => Err(e.clone()),
                None => Err(store.refuse("the report's commit lost it")),
            },
            Ok(Err(e)) => Err(e.clone()),
            Err(_) => Err(store.refuse("the report's commit panicked")),
        };
        // A caller that is gone (it cannot be: it waits) needs no answer.
        let _ = w.answer.send(Answer::Done(outcome));
    }
    let mut q = store.reports.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(next) = q.waiting.front() {
        if next.answer.send(Answer::Commit).is_ok() {
            return;
        }
        q.waiting.pop_front();
    }
    q.committing = false;
}

/// The old report hash of each server of `$1` that exists.
const PREVIOUS_SQL: &str = "SELECT name, report_hash FROM servers WHERE name = ANY($1)";
/// Liveness of the servers `$1` at the times `$2`.
const SEEN_SQL: &str = "UPDATE servers SET last_seen = v.at FROM unnest($1::text[], $2::bigint[]) AS v(name, at) WHERE servers.name = v.name";
/// The owners of the ports `$1`.
const OWNERS_SQL: &str = "SELECT guid, server FROM ports WHERE guid = ANY($1)";
/// The GPUs of the servers `$1` (JSON `$2`, at `$3`): the last report wins.
const GPUS_SQL: &str = "INSERT INTO server_gpus (server, gpus, reported) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) ON CONFLICT (server) DO UPDATE SET gpus = excluded.gpus, reported = excluded.reported";
/// The links of the servers `$1` (JSON `$2`, at `$3`): the last report wins.
const LINKS_SQL: &str = "INSERT INTO server_links (server, links, reported) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) ON CONFLICT (server) DO UPDATE SET links = excluded.links, reported = excluded.reported";

/// The batch's transaction: each report's outcome in order; `Err` when the transaction
/// failed (nothing of the batch committed).
fn commit(conn: &mut Conn, batch: &[Waiting]) -> Result<Vec<Result<ReportOutcome>>> {
    let [lock, previous, seen, owners, gpus, links] = conn.statements([
        LOCK_SQL,
        PREVIOUS_SQL,
        SEEN_SQL,
        OWNERS_SQL,
        GPUS_SQL,
        LINKS_SQL,
    ])?;
    let mut tx = conn.client.transaction()?;
    tx.execute(&lock, &[&WRITE_LOCK])?;
    let names: Vec<&str> = batch.iter().map(|w| w.report.server.as_str()).collect();
    let known: HashMap<String, Option<String>> = tx
        .query(&previous, &[&names])?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
    let mut out: Vec<Option<Result<ReportOutcome>>> = Vec::with_capacity(batch.len());
    for w in batch {
        let r = &w.report;
        let outcome = match known.get(&r.server) {
            None => Some(Err(StoreError::NotFound(format!(
                "no server `{}`",
                r.server
            )))),
            // As last reported: together below.
            Some(prev) if prev.as_deref() == Some(r.report_hash.as_str()) => None,
            Some(_) => {
                let mut sp = tx.transaction()?;
                match servers::report(&mut sp, &r.server, &r.ports, &r.report_hash, w.now) {
                    Ok(o) => {
                        sp.commit()?;
                        Some(Ok(o))
                    }
                    Err(e @ StoreError::Storage(_)) => return Err(e),
                    Err(e) => {
                        sp.rollback()?;
                        Some(Err(e))
                    }
                }
            }
        };
        out.push(outcome);
    }
    // Reports as last reported: the server is seen; its ports' owners answer the ack. A
    // port's owner changes only by its owner's report (not in this batch: one report a
    // server) or another transaction, so this order answers as report by report would.
    let same: Vec<usize> = (0..batch.len()).filter(|i| out[*i].is_none()).collect();
    if !same.is_empty() {
        let names: Vec<&str> = same
            .iter()
            .map(|i| batch[*i].report.server.as_str())
            .collect();
        let at: Vec<i64> = same.iter().map(|i| batch[*i].now as i64).collect();
        tx.execute(&seen, &[&names, &at])?;
        let guids: Vec<i64> = same
            .iter()
            .flat_map(|i| batch[*i].report.ports.iter().map(|p| guid_to_sql(p.guid)))
            .collect();
        let owner: HashMap<i64, String> = tx
            .query(&owners, &[&guids])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_>>()?;
        for i in same {
            let r = &batch[i].report;
            let (mut owned, mut pending) = (Vec::new(), Vec::new());
            for p in &r.ports {
                if owner.get(&guid_to_sql(p.guid)) == Some(&r.server) {
                    owned.push(p.guid);
                } else {
                    pending.push(p.guid);
                }
            }
            out[i] = Some(Ok(ReportOutcome {
                ack: ReportAck {
                    server: r.server.clone(),
                    owned,
                    pending,
                },
                desired_changed: false,
            }));
        }
    }
    // GPUs and links of every report that was recorded.
    let ok: Vec<&Waiting> = batch
        .iter()
        .zip(&out)
        .filter(|(_, o)| matches!(o, Some(Ok(_))))
        .map(|(w, _)| w)
        .collect();
    if !ok.is_empty() {
        let names: Vec<&str> = ok.iter().map(|w| w.report.server.as_str()).collect();
        let at: Vec<i64> = ok.iter().map(|w| w.now as i64).collect();
        let g: Vec<&str> = ok.iter().map(|w| w.gpus.as_str()).collect();
        let l: Vec<&str> = ok.iter().map(|w| w.links.as_str()).collect();
        tx.execute(&gpus, &[&names, &g, &at])?;
        tx.execute(&links, &[&names, &l, &at])?;
    }
    tx.commit()?;
    Ok(out
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(StoreError::Db("a report was left out".into()))))
        .collect())
}
