//! Who delivers: the leader among the controllers on one store.
//!
//! On a store that elects ([`Store::elects`]: PostgreSQL), every controller runs
//! [`run`]: one election round ([`Store::elect`]) every [`RENEW_EVERY`] while it leads,
//! every [`POLL_EVERY`] while it follows. The lease lasts [`TTL_S`] seconds of the
//! database's clock from each round; a follower takes it over only once it has run out
//! by that clock, raising the fencing number in the same transaction.
//!
//! The leader trusts its leadership only until [`TTL_S`] minus [`MARGIN`] after the
//! *start* of its last successful round, by its own monotonic clock ([`Leadership::delivering`]):
//! the database's `now()` of that round is no earlier than its start, so the leader's
//! last moment comes at least [`MARGIN`] before the earliest moment a follower may take
//! over (clock rates assumed equal within that margin). Past it, the reconcile loop
//! delivers nothing and the SMs' apply lock refuses the write ([`weft_opensm::Fence::until`],
//! checked under the lock before the first byte is written); the API answers writes
//! with 421 `not_leader`. A leader cut off from its database therefore stops within
//! `TTL_S - MARGIN` = 3.5 s of its last successful renewal, and no follower takes over
//! before 5 s.
//!
//! On a store that does not elect (SQLite), the one controller leads alone, for as long
//! as it runs ([`Leadership::alone`]): the store's lease keeps any other off the file.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::reconcile::Event;
use crate::store::{Election, Store};

/// Seconds a leader's lease lasts, by the database's clock, after each renewal.
pub const TTL_S: u64 = 5;
/// How much before its lease runs out (by the database's clock) the leader stops
/// delivering, measured on its own clock from the start of its last successful renewal.
/// It covers the longest write after the check under the SMs' apply lock (a local write
/// takes milliseconds; over SSH, one round trip) and the two clocks' rate difference.
pub const MARGIN: Duration = Duration::from_millis(1500);
/// How often the leader renews its lease (so that 3 renewals in a row may fail, or
/// be slow, before it stops).
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How often a follower looks whether the lease ran out.
pub const POLL_EVERY: Duration = Duration::from_millis(500);

/// What this controller may do now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// It leads: its deliveries carry `fencing` and must write before `until`
    /// (`None`: alone on its store, no bound).
    Leading {
        fencing: Option<u64>,
        until: Option<Instant>,
    },
    /// Another controller leads, at this advertised URL (`None`: unknown or none).
    Following { url: Option<String> },
}

/// A delivery's licence: the fencing number it carries (`None`: the store's own) and the
/// instant from which it may write nothing (`None`: no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Licence {
    /// The fencing number of this leadership, when elected.
    pub fencing: Option<u64>,
    /// The end of this leadership by this process's clock, when elected.
    pub until: Option<std::time::Instant>,
}

/// This controller's place among the controllers on its store.
#[derive(Debug)]
pub struct Leadership {
    /// This controller's holder id (`host .. pid .. since ..`), in the audit's takeover
    /// lines and each delivery's audit line.
    holder: String,
    /// The URL followers hand out for this controller (`--advertise-url`).
    url: Option<String>,
    /// Whether it is elected (else alone on its store).
    elected: bool,
    /// Set once it resigned: the election loop stops.
    stopped: std::sync::atomic::AtomicBool,
    role: Mutex<Role>,
    /// The end of the current leadership by the wall clock (for the log line that says
    /// when it stopped delivering).
    until_wall: Mutex<Option<std::time::SystemTime>>,
}

/// Milliseconds since the epoch of `t`.
fn unix_ms(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

impl Leadership {
    /// The one controller of a store that does not elect: it always leads, at the store's
    /// fencing number, with no deadline.
    pub fn alone(holder: &str) -> Arc<Leadership> {
        Arc::new(Leadership {
            holder: holder.to_string(),
            url: None,
            elected: false,
            stopped: std::sync::atomic::AtomicBool::new(false),
            role: Mutex::new(Role::Leading {
                fencing: None,
                until: None,
            }),
            until_wall: Mutex::new(None),
        })
    }

    /// A controller that must be elected first: it follows (no known leader) until
    /// [`run`] says otherwise.
    pub fn elected(holder: &str, url: Option<&str>) -> Arc<Leadership> {
        Arc::new(Leadership {
            holder: holder.to_string(),
            url: url.map(str::to_owned),
            elected: true,
            stopped: std::sync::atomic::AtomicBool::new(false),
            role: Mutex::new(Role::Following { url: None }),
            until_wall: Mutex::new(None),
        })
    }

    fn role(&self) -> Role {
        self.role.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This controller's holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether this controller is elected (else alone on its store).
    pub fn is_elected(&self) -> bool {
        self.elected
    }

    /// The licence to deliver now: `None` when this controller does not lead, or its
    /// leadership ran out by its own clock.
    pub fn delivering(&self) -> Option<Licence> {
        match self.role() {
            Role::Leading { fencing, until } => {
                if until.is_some_and(|u| Instant::now() >= u) {
                    return None;
                }
                Some(Licence {
                    fencing,
                    until: until.map(Instant::into_std),
                })
            }
            Role::Following { .. } => None,
        }
    }

    /// `None` while this controller takes writes; else the URL of the leader to send
    /// them to (`Some(None)`: no leader known now).
    pub fn refuses_writes(&self) -> Option<Option<String>> {
        match self.role() {
            Role::Leading { .. } if self.delivering().is_some() => None,
            Role::Leading { .. } => Some(None),
            Role::Following { url } => Some(url),
        }
    }

    /// The first election round, before the controller serves (so that a controller alone
    /// on its database takes writes from its first request); whether it leads.
    pub(crate) fn first_round(&self, store: &dyn Store) -> Result<bool, crate::store::StoreError> {
        let started = Instant::now();
        let round = store.elect(
            &self.holder,
            self.url.as_deref(),
            TTL_S,
            crate::server::unix_now(),
        )?;
        tracing::info!(holder = %self.holder, ?round, "first election round");
        self.apply(&round, started);
        Ok(matches!(round, Election::Leader { .. }))
    }

    /// Applies one election round that started at `started`; whether this controller
    /// just became the leader.
    fn apply(&self, round: &Election, started: Instant) -> bool {
        let mut role = self.role.lock().unwrap_or_else(|p| p.into_inner());
        let was_leading =
            matches!(*role, Role::Leading { until: Some(u), .. } if Instant::now() < u);
        match round {
            Election::Leader { fencing, .. } => {
                let lasts = Duration::from_secs(TTL_S) - MARGIN;
                *role = Role::Leading {
                    fencing: Some(*fencing),
                    until: Some(started + lasts),
                };
                *self.until_wall.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(std::time::SystemTime::now() - started.elapsed() + lasts);
                !was_leading
            }
            Election::Follower { url, .. } => {
                *role = Role::Following { url: url.clone() };
                let mut wall = self.until_wall.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(w) = *wall {
                    *wall = Some(w.min(std::time::SystemTime::now()));
                }
                false
            }
        }
    }
}

/// The election loop, while `lead` is alive: renews or takes the lease, and wakes the
/// reconcile loop (`events`) when this controller becomes the leader, so that it first
/// re-drives what the last leader left pending. Gives the lease up when `lead` is dropped.
pub async fn run(
    store: Arc<dyn Store>,
    lead: std::sync::Weak<Leadership>,
    events: mpsc::Sender<Event>,
) {
    let mut was_delivering = false;
    loop {
        let Some(l) = lead.upgrade() else {
            return;
        };
        if l.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (holder, url) = (l.holder.clone(), l.url.clone());
        let started = Instant::now();
        let started_wall = std::time::SystemTime::now();
        let s = store.clone();
        let h = holder.clone();
        let round = tokio::task::spawn_blocking(move || {
            s.elect(&h, url.as_deref(), TTL_S, crate::server::unix_now())
        })
        .await;
        let leading = match round {
            Ok(Ok(round)) => {
                if let Election::Leader {
                    fencing,
                    took_over: true,
                } = &round
                {
                    tracing::warn!(
                        fencing,
                        holder = %holder,
                        round_start_unix_ms = unix_ms(started_wall) as u64,
                        "took over as the leader"
                    );
                }
                let was = l.role();
                if l.apply(&round, started) {
                    tracing::info!(holder = %holder, ?round, "leading: delivering to the SMs");
                    let _ = events.try_send(Event::Started);
                } else if matches!(was, Role::Leading { .. })
                    && matches!(round, Election::Follower { .. })
                {
                    tracing::error!(?round, "another controller leads now; delivering nothing");
                }
                matches!(round, Election::Leader { .. })
            }
            Ok(Err(e)) => {
                // The leadership runs out by itself (its `until`); nothing to undo here.
                let leading = l.delivering().is_some();
                tracing::warn!(error = %e, leading, "election round failed");
                leading
            }
            Err(e) => {
                tracing::warn!(error = %e, "election task");
                false
            }
        };
        let delivering = l.delivering().is_some();
        if was_delivering && !delivering {
            let until = *l.until_wall.lock().unwrap_or_else(|p| p.into_inner());
            tracing::error!(
                until_unix_ms = until.map_or(0, unix_ms) as u64,
                "stopped delivering: this controller's leadership ran out by its own clock (its lease was not renewed in time) or another controller leads"
            );
        }
        was_delivering = delivering;
        drop(l);
        tokio::time::sleep(if leading { RENEW_EVERY } else { POLL_EVERY }).await;
    }
}

/// Gives `lead`'s lease up at once (a controller stopping), so that a follower takes over
/// at its next round instead of after the TTL.
pub(crate) fn resign(store: &dyn Store, lead: &Leadership) {
    if !lead.is_elected() {
        return;
    }
    lead.stopped
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *lead.role.lock().unwrap_or_else(|p| p.into_inner()) = Role::Following { url: None };
    if let Err(e) = store.resign(&lead.holder) {
        tracing::warn!(error = %e, "cannot give the leader's lease back; it runs out by itself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_delivers_only_until_ttl_minus_margin_after_its_round_started_and_a_follower_names_the_leader()
     {
        let alone = Leadership::alone("host h pid 1 since 0 #0");
        assert!(!alone.is_elected());
        assert_eq!(
            alone.delivering(),
            Some(Licence {
                fencing: None,
                until: None
            })
        );
        assert_eq!(alone.refuses_writes(), None);

        let l = Leadership::elected("host h pid 2 since 0 #0", Some("http://me"));
        assert!(l.is_elected());
        assert_eq!(l.delivering(), None, "no round yet: it follows");
        assert_eq!(l.refuses_writes(), Some(None), "and knows no leader");

        let lead = Election::Leader {
            fencing: 7,
            took_over: true,
        };
        let started = Instant::now();
        assert!(l.apply(&lead, started), "it just became the leader");
        let licence = l.delivering().expect("it leads");
        assert_eq!(licence.fencing, Some(7));
        let lasts = licence.until.unwrap() - started.into_std();
        assert_eq!(lasts, Duration::from_secs(TTL_S) - MARGIN);
        assert_eq!(lasts, Duration::from_millis(3500));
        assert_eq!(l.refuses_writes(), None);
        assert!(
            !l.apply(&lead, Instant::now()),
            "a renewal is no new leadership"
        );

        // A round that started 3.5 s ago licenses nothing any more, whatever it answered.
        let old = Instant::now() - Duration::from_millis(3500);
        l.apply(&lead, old);
        assert_eq!(l.delivering(), None);
        assert_eq!(l.refuses_writes(), Some(None));
        assert!(
            l.apply(&lead, Instant::now()),
            "renewed in time again: it leads again"
        );

        let other = Election::Follower {
            holder: Some("host k pid 3 since 0 #0".into()),
            url: Some("http://other".into()),
        };
        assert!(!l.apply(&other, Instant::now()));
        assert_eq!(l.delivering(), None);
        assert_eq!(l.refuses_writes(), Some(Some("http://other".into())));
    }
}
