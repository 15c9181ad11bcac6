//! What callers send, checked before anything is stored or audited, and a per-source rate
//! limit for the endpoints that answer without a token.
//!
//! Every check answers with a message that is safe to store, log and print: a value that
//! failed is shown shortened and with its control characters escaped ([`shown`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// The most characters of a refused value a message shows.
const SHOWN: usize = 40;

/// `s` with every control or bidirectional-formatting character written as `\u{..}`, so
/// that printing it cannot move the cursor, ring the bell, end a line or reorder text.
pub fn escape_control(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(u32::from(c), 0x200b..=0x200f | 0x2028..=0x202e | 0x2066..=0x2069 | 0xfeff)
}

/// A refused value as a message may show it: at most 40 characters, control characters
/// escaped, and its full length when it was cut.
pub fn shown(s: &str) -> String {
    let n = s.chars().count();
    let head: String = s.chars().take(SHOWN).collect();
    if n > SHOWN {
        format!("`{}…` ({} bytes)", escape_control(&head), s.len())
    } else {
        format!("`{}`", escape_control(&head))
    }
}

/// A value a caller sent that the controller refuses; the message names the field (`what`)
/// and shows the value as [`shown`] does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A name that is empty.
    #[error("{what}: empty")]
    Empty {
        /// The field, as the caller knows it ("host name", "tenant").
        what: &'static str,
    },
    /// A name longer than partitions.conf allows.
    #[error("{what} {shown}: longer than {max} characters")]
    TooLong {
        /// The field.
        what: &'static str,
        /// The value as [`shown`] writes it.
        shown: String,
        /// The most characters allowed.
        max: usize,
    },
    /// A name with a character partitions.conf refuses, or a bad first character.
    #[error(
        "{what} {shown}: must start with a letter or `_` and hold only letters, digits, `_`, `-` and `.`"
    )]
    BadName {
        /// The field.
        what: &'static str,
        /// The value as [`shown`] writes it.
        shown: String,
    },
    /// A number of seconds outside its range.
    #[error("{what} = {value}: must be between {min} and {max} seconds")]
    Seconds {
        /// The field.
        what: &'static str,
        /// The value sent.
        value: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed.
        max: u64,
    },
}

/// Checks a name (a host, a tenant, a group) the way partitions.conf names are checked:
/// 1 to 31 characters, a letter or `_` first, then letters, digits, `_`, `-`, `.`.
pub fn name(what: &'static str, value: &str) -> Result<(), InputError> {
    let max = weft_fabric::conf::MAX_NAME_LEN;
    if value.is_empty() {
        return Err(InputError::Empty { what });
    }
    if value.len() > max {
        return Err(InputError::TooLong {
            what,
            shown: shown(value),
            max,
        });
    }
    weft_fabric::conf::validate_name(value).map_err(|_| InputError::BadName {
        what,
        shown: shown(value),
    })
}

/// Checks that `value` seconds lie in `min..=max`.
pub fn seconds(what: &'static str, value: u64, min: u64, max: u64) -> Result<u64, InputError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(InputError::Seconds {
            what,
            value,
            min,
            max,
        })
    }
}

/// How many requests one source may make to the endpoints without a token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests a second, sustained.
    pub per_s: f64,
    /// Requests at once after a quiet spell.
    pub burst: f64,
}

impl Default for RateLimit {
    /// 5 a second, bursts of 30: enough to enroll a rack at once from one address.
    fn default() -> Self {
        RateLimit {
            per_s: 5.0,
            burst: 30.0,
        }
    }
}

/// The most sources a [`Limiter`] remembers; past it, sources whose bucket has refilled
/// are forgotten first.
const MAX_SOURCES: usize = 10_000;

/// A token bucket per source address.
#[derive(Debug)]
pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl Limiter {
    /// A limiter with `limit` for every source.
    pub fn new(limit: RateLimit) -> Limiter {
        Limiter {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `source` may make one more request at `now` (and counts it).
    pub fn allow(&self, source: IpAddr, now: Instant) -> bool {
        let source = match source {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(source, IpAddr::V4),
            v4 => v4,
        };
        let RateLimit { per_s, burst } = self.limit;
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if b.len() >= MAX_SOURCES && !b.contains_key(&source) {
            b.retain(|_, (tokens, at)| {
                *tokens + now.saturating_duration_since(*at).as_secs_f64() * per_s < burst
            });
            if b.len() >= MAX_SOURCES {
                return false;
            }
        }
        let (tokens, at) = b.entry(source).or_insert((burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * per_s).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn control_characters_are_escaped_and_long_values_cut() {
        assert_eq!(
            escape_control("a\x1b[2Jb\x07\nc"),
            "a\\u{1b}[2Jb\\u{7}\\u{a}c"
        );
        assert_eq!(escape_control("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(escape_control("plain-name.ok ü"), "plain-name.ok ü");
        let long = "n".repeat(2_000_000);
        let s = shown(&long);
        assert!(s.len() < 80 && s.contains("2000000 bytes"), "{s}");
    }

    #[test]
    fn names_are_checked_without_echoing_what_was_refused() {
        assert!(name("host name", "node7").is_ok());
        let e = name("host name", &format!("a{}", "x".repeat(100)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 31") && e.len() < 120, "{e}");
        let e = name("host name", "evil\x1b]0;x\x07")
            .unwrap_err()
            .to_string();
        assert!(!e.chars().any(|c| c.is_control()), "{e}");
        assert_eq!(
            name("host name", ""),
            Err(InputError::Empty { what: "host name" })
        );
        assert!(matches!(
            name("host name", "7up"),
            Err(InputError::BadName {
                what: "host name",
                ..
            })
        ));
    }

    #[test]
    fn seconds_are_range_checked() {
        assert_eq!(seconds("ttl_s", 60, 60, 100), Ok(60));
        assert!(seconds("ttl_s", u64::MAX, 60, 100).is_err());
        assert!(seconds("ttl_s", 0, 60, 100).is_err());
    }

    #[test]
    fn a_source_past_its_burst_waits_for_the_refill_and_others_are_not_slowed() {
        let l = Limiter::new(RateLimit {
            per_s: 10.0,
            burst: 3.0,
        });
        let t = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!((0..3).all(|_| l.allow(a, t)));
        assert!(!l.allow(a, t));
        assert!(l.allow(b, t));
        assert!(!l.allow(a, t + Duration::from_millis(50)));
        assert!(l.allow(a, t + Duration::from_millis(160)));
        // An IPv4 address seen through an IPv6 socket is the same source.
        assert!(!l.allow(
            "::ffff:10.0.0.1".parse().unwrap(),
            t + Duration::from_millis(160)
        ));
    }
}

/// Ports one agent's report may name (the ports the controller stores for the host): a
/// server has a handful; a report over this is refused whole (400).
pub const MAX_REPORT_PORTS: usize = 64;
/// GPUs one agent's report may name.
pub const MAX_REPORT_GPUS: usize = 64;
/// How often one agent's reports may change what the controller holds: 5 changes at once,
/// then one every 10 s. A report that says what the agent's last one said is free (it only
/// marks the agent alive), so only a host that keeps changing, or a stolen agent secret,
/// meets the limit; the agent retries later with what it then sees.
pub const REPORT_CHANGES: RateLimit = RateLimit {
    per_s: 0.1,
    burst: 5.0,
};

/// Per agent (by its server's name): the last report it was allowed to make, and what is
/// left of its budget of changes ([`REPORT_CHANGES`]). One entry per enrolled server that
/// reported, so it is bounded by the servers an admin enrolled.
#[derive(Debug)]
pub struct ReportLimiter {
    limit: RateLimit,
    servers: Mutex<HashMap<String, (String, f64, Instant)>>,
}

impl Default for ReportLimiter {
    fn default() -> Self {
        ReportLimiter::new(REPORT_CHANGES)
    }
}

impl ReportLimiter {
    /// A limiter with `limit` changes for every agent.
    pub fn new(limit: RateLimit) -> ReportLimiter {
        ReportLimiter {
            limit,
            servers: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `server`'s report whose content hashes to `hash` may be taken at `now`: one
    /// equal to its last allowed report always is; another counts against its budget.
    pub fn allow(&self, server: &str, hash: &str, now: Instant) -> bool {
        let RateLimit { per_s, burst } = self.limit;
        let mut m = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        let (last, tokens, at) = m
            .entry(server.to_string())
            .or_insert_with(|| (String::new(), burst, now));
        if last == hash {
            return true;
        }
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * per_s).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            *last = hash.to_string();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod report_limiter_tests {
    use super::*;

    #[test]
    fn an_unchanged_report_is_free_and_changes_are_bounded() {
        let l = ReportLimiter::new(RateLimit {
            per_s: 1.0,
            burst: 2.0,
        });
        let t0 = Instant::now();
        assert!(l.allow("n1", "a", t0));
        for _ in 0..100 {
            assert!(l.allow("n1", "a", t0), "the same report again");
        }
        assert!(l.allow("n1", "b", t0));
        assert!(!l.allow("n1", "a", t0), "a third change at once");
        assert!(l.allow("n2", "a", t0), "another agent has its own budget");
        assert!(l.allow("n1", "a", t0 + std::time::Duration::from_secs(1)));
    }
}
