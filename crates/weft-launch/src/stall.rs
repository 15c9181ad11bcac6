//! `weft run --stall-timeout`: which rank froze first. When one rank of a job stops (a
//! SIGSTOP, a debugger, a hung driver call), the others block in the next collective and
//! every rank goes quiet at once, so silence alone names them all. What tells the frozen one
//! apart is what its node sees of its processes:
//!
//! * on the node, `weft run-node` samples the command's processes once a second
//!   ([`sample`]: their states and CPU time from `/proc/PID/stat`) and prints one
//!   [`STATE_MARKER`] line with it ([`Sample::line`]);
//! * the launcher keeps, per rank, when it last printed, when its CPU time last grew and when
//!   its node last answered ([`Watch`]); ranks blocked in a collective keep spinning (NCCL
//!   and gloo poll), a frozen one does not;
//! * at a stall, [`suspect`] names one rank, in this order: a process stopped (state `T` or
//!   `t`), a node that stopped answering (no state line for [`SILENT_NODE`]), the rank that
//!   stopped making progress (output or CPU time) clearly before every other; else none, as
//!   the doctor names one fault among healthy peers and never guesses between equals.
//!
//! The judgement takes the time as an argument and does no I/O, so it is tested with a
//! made-up clock.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The line `weft run-node` prints once a second: `MARKER<state> <cpu ms> <pid> <comm>`.
pub const STATE_MARKER: &str = "\u{1e}weft-run-node-state=";

/// How often the node samples its processes.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// A node from which no state line came for this long has stopped answering.
pub const SILENT_NODE: Duration = Duration::from_secs(4);

/// What the node saw of the command's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The state that matters most among them: `T`/`t` (stopped, traced) before `D`
    /// (uninterruptible) before `R` before `S`; `Z` only when nothing else is left.
    pub state: char,
    /// CPU time (user + system, their waited-for children's too) of all of them, in ms.
    pub cpu_ms: u64,
    /// The process that has that state, and its name.
    pub pid: i32,
    pub comm: String,
}

impl Sample {
    /// The marker line.
    pub fn line(&self) -> String {
        format!(
            "{STATE_MARKER}{} {} {} {}",
            self.state, self.cpu_ms, self.pid, self.comm
        )
    }

    /// Reads what follows [`STATE_MARKER`]; `None` for anything else.
    pub fn parse(rest: &str) -> Option<Sample> {
        let mut it = rest.trim_end().splitn(4, ' ');
        let state = it.next()?.chars().next()?;
        let cpu_ms = it.next()?.parse().ok()?;
        let pid = it.next()?.parse().ok()?;
        let comm = it.next().unwrap_or("").to_string();
        Some(Sample {
            state,
            cpu_ms,
            pid,
            comm,
        })
    }

    /// Stopped by a signal (SIGSTOP, SIGTSTP) or by a tracer.
    pub fn stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }

    /// `T (stopped) pid 123 python3`.
    pub fn describe(&self) -> String {
        let what = match self.state {
            'T' => "stopped",
            't' => "stopped by a tracer",
            'D' => "in uninterruptible sleep",
            'R' => "running",
            'S' => "sleeping",
            'Z' => "a zombie",
            _ => "in an unknown state",
        };
        format!("{} ({what}), pid {} {}", self.state, self.pid, self.comm)
    }
}

/// One `/proc/PID/stat`: (state, utime + stime + cutime + cstime in clock ticks, comm).
fn stat_of(pid: i32) -> Option<(char, u64, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ...: comm may hold spaces and parentheses.
    let (open, close) = (s.find('(')?, s.rfind(')')?);
    let comm = s.get(open + 1..close)?.to_string();
    let f: Vec<&str> = s.get(close + 1..)?.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    // Fields 14-17 of stat(5): after `state` they are the 12th to 15th.
    let ticks = f
        .get(11..15)?
        .iter()
        .map(|x| x.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some((state, ticks, comm))
}

fn rank(state: char) -> u8 {
    match state {
        'T' | 't' => 5,
        'D' => 4,
        'R' => 3,
        'S' | 'I' => 2,
        'Z' | 'X' => 0,
        _ => 1,
    }
}

/// Samples `pids` (the command's processes); `None` when none could be read.
pub fn sample(pids: &[i32]) -> Option<Sample> {
    // SAFETY: sysconf takes no pointers; _SC_CLK_TCK is always defined on Linux.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut best: Option<Sample> = None;
    let mut ticks = 0u64;
    for &pid in pids {
        let Some((state, t, comm)) = stat_of(pid) else {
            continue;
        };
        ticks += t;
        if best.as_ref().is_none_or(|b| rank(state) > rank(b.state)) {
            best = Some(Sample {
                state,
                cpu_ms: 0,
                pid,
                comm,
            });
        }
    }
    best.map(|mut b| {
        b.cpu_ms = ticks * 1000 / hz;
        b
    })
}

/// What the launcher knows of one rank.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Its last line of output (or the launch).
    pub last_out: Instant,
    /// Its node's last state line, and what it said.
    pub last_heard: Option<Instant>,
    pub sample: Option<Sample>,
    /// When its CPU time last grew.
    pub last_cpu: Option<Instant>,
    /// It has exited (it is no suspect).
    pub gone: bool,
}

impl Watch {
    pub fn new(now: Instant) -> Watch {
        Watch {
            last_out: now,
            last_heard: None,
            sample: None,
            last_cpu: None,
            gone: false,
        }
    }

    /// A state line from its node.
    pub fn heard(&mut self, now: Instant, s: Sample) {
        if self.sample.as_ref().is_none_or(|o| s.cpu_ms > o.cpu_ms) {
            self.last_cpu = Some(now);
        }
        self.last_heard = Some(now);
        self.sample = Some(s);
    }

    /// Its last sign of progress: output or CPU time.
    pub fn progress(&self) -> Instant {
        self.last_cpu
            .map_or(self.last_out, |c| c.max(self.last_out))
    }
}

/// The rank named at a stall, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suspect {
    pub node_rank: usize,
    pub host: String,
    /// `stopped`, `not-answering` or `no-progress`.
    pub kind: String,
    pub why: String,
    pub last_line: Option<String>,
}

/// Names the rank that froze first among `w` (by index), or none when no rank stands out.
/// `hosts` and `last_lines` are by index too.
pub fn suspect(
    now: Instant,
    w: &[Watch],
    hosts: &[String],
    last_lines: &[Option<String>],
) -> Option<Suspect> {
    let live: Vec<usize> = (0..w.len()).filter(|&i| !w[i].gone).collect();
    let name = |i: usize, kind: &str, why: String| Suspect {
        node_rank: i,
        host: hosts.get(i).cloned().unwrap_or_default(),
        kind: kind.into(),
        why,
        last_line: last_lines.get(i).cloned().flatten(),
    };
    let secs = |t: Instant| now.saturating_duration_since(t).as_secs_f64();
    // A stopped process: the earliest to stop making progress among them.
    let stopped = live
        .iter()
        .copied()
        .filter(|&i| w[i].sample.as_ref().is_some_and(Sample::stopped))
        .min_by_key(|&i| w[i].progress());
    if let Some(i) = stopped {
        let s = w[i]
            .sample
            .as_ref()
            .map(Sample::describe)
            .unwrap_or_default();
        return Some(name(
            i,
            "stopped",
            format!(
                "its process is stopped: {s} (state T in /proc/PID/stat: SIGSTOP, Ctrl-Z or a debugger); no output or CPU time for {:.0} s, and the others wait for it",
                secs(w[i].progress())
            ),
        ));
    }
    // A node that stopped answering while others answer.
    let heard_recently = |i: usize| {
        w[i].last_heard
            .is_some_and(|t| now.saturating_duration_since(t) < SILENT_NODE)
    };
    let mute: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| w[i].last_heard.is_some() && !heard_recently(i))
        .collect();
    if mute.len() == 1 && live.iter().any(|&i| heard_recently(i)) {
        let i = mute[0];
        return Some(name(
            i,
            "not-answering",
            format!(
                "its node stopped answering: no word from `weft run-node` there for {:.0} s while the others' come every {} s",
                w[i].last_heard.map_or(0.0, secs),
                SAMPLE_EVERY.as_secs()
            ),
        ));
    }
    // The one whose progress stopped clearly before every other's.
    let mut by: Vec<usize> = live.clone();
    by.sort_by_key(|&i| w[i].progress());
    if let [first, second, ..] = by[..] {
        let gap = w[second]
            .progress()
            .saturating_duration_since(w[first].progress());
        if gap >= 2 * SAMPLE_EVERY {
            return Some(name(
                first,
                "no-progress",
                format!(
                    "it stopped making progress first: no output or CPU time for {:.0} s, the next rank for {:.0} s",
                    secs(w[first].progress()),
                    secs(w[second].progress())
                ),
            ));
        }
    } else if let [only] = by[..] {
        return Some(name(
            only,
            "no-progress",
            format!(
                "no output or CPU time for {:.0} s",
                secs(w[only].progress())
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(state: char, cpu_ms: u64) -> Sample {
        Sample {
            state,
            cpu_ms,
            pid: 100,
            comm: "python3".into(),
        }
    }

    #[test]
    fn the_marker_line_reads_back() {
        let x = Sample {
            state: 'T',
            cpu_ms: 1234,
            pid: 77,
            comm: "my (odd) name".into(),
        };
        let l = x.line();
        assert_eq!(
            Sample::parse(l.strip_prefix(STATE_MARKER).unwrap()),
            Some(x)
        );
        assert_eq!(Sample::parse("garbage"), None);
    }

    #[test]
    fn this_process_samples_as_running_with_cpu_time() {
        let me = std::process::id() as i32;
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        let smp = sample(&[me, -1]).unwrap();
        assert_eq!(smp.pid, me);
        assert!(matches!(smp.state, 'R' | 'S'), "{smp:?}");
        assert_eq!(sample(&[-1]), None);
    }

    /// Three ranks blocked in a collective: two spin (CPU grows), one is stopped. Silence
    /// alone would name all three.
    #[test]
    fn a_stopped_rank_is_named_among_spinning_peers() {
        let t0 = Instant::now();
        let sec = |k: u64| t0 + Duration::from_secs(k);
        let mut w = vec![Watch::new(t0); 3];
        for k in 1..=10 {
            for (i, x) in w.iter_mut().enumerate() {
                let frozen = i == 1 && k > 3;
                let st = if frozen { 'T' } else { 'R' };
                let cpu = if frozen { 300 } else { k * 100 };
                x.heard(sec(k), s(st, cpu));
            }
        }
        for x in &mut w {
            x.last_out = sec(3);
        }
        let hosts: Vec<String> = (0..3).map(|i| format!("h{i}")).collect();
        let lines = vec![None, Some("step 4".to_string()), None];
        let got = suspect(sec(10), &w, &hosts, &lines).unwrap();
        assert_eq!((got.node_rank, got.kind.as_str()), (1, "stopped"));
        assert!(got.why.contains("T (stopped)"), "{}", got.why);
        assert_eq!(got.last_line.as_deref(), Some("step 4"));
        // Not stopped but frozen all the same (a hung driver call): CPU time stops growing.
        for x in &mut w {
            if let Some(smp) = &mut x.sample {
                smp.state = 'S';
            }
        }
        let got = suspect(sec(10), &w, &hosts, &lines).unwrap();
        assert_eq!((got.node_rank, got.kind.as_str()), (1, "no-progress"));
        // A node whose supervisor went quiet while the others answer.
        let mut w2 = w.clone();
        w2[2].last_heard = Some(sec(2));
        w2[1].sample = w2[0].sample.clone();
        w2[1].last_cpu = w2[0].last_cpu;
        let got = suspect(sec(10), &w2, &hosts, &lines).unwrap();
        assert_eq!((got.node_rank, got.kind.as_str()), (2, "not-answering"));
    }

    #[test]
    fn equals_are_not_told_apart() {
        let t0 = Instant::now();
        let mut w = vec![Watch::new(t0); 3];
        for x in &mut w {
            x.heard(t0 + Duration::from_secs(5), s('S', 10));
        }
        let hosts = vec![String::new(); 3];
        assert_eq!(suspect(t0 + Duration::from_secs(6), &w, &hosts, &[]), None);
    }
}
