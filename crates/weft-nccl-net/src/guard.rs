//! The boundary: the one error-to-`ncclResult_t` translation, the panic guard every `extern "C"`
//! body runs in, NCCL's logger, and typed helpers for the opaque pointers NCCL hands back.

use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::{self, ncclResult_t};

/// Everything that can go wrong at the boundary.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The transport failed (network, peer, configuration).
    #[error("{0}")]
    Transport(#[from] weft_transport::Error),
    /// NCCL passed a NULL where a pointer is required.
    #[error("{0} is NULL")]
    Null(&'static str),
    /// NCCL called something the plugin does not support or called it wrongly.
    #[error("{0}")]
    Usage(String),
    /// Called before `init` (or after the last `finalize`).
    #[error("plugin not initialised")]
    NotInitialised,
}

impl PluginError {
    /// The single translation to NCCL's result codes.
    pub fn code(&self) -> ncclResult_t {
        match self {
            PluginError::Transport(e) => match e {
                weft_transport::Error::Config(_) | weft_transport::Error::Handle(_) => {
                    ffi::ncclInvalidUsage
                }
                weft_transport::Error::Usage(_) => ffi::ncclInternalError,
                e if e.is_usage() => ffi::ncclInvalidUsage,
                e if e.is_remote() => ffi::ncclRemoteError,
                _ => ffi::ncclSystemError,
            },
            PluginError::Null(_) | PluginError::Usage(_) | PluginError::NotInitialised => {
                ffi::ncclInternalError
            }
        }
    }
}

pub type Result<T, E = PluginError> = std::result::Result<T, E>;

static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Remembers NCCL's logger (a NULL one turns logging off).
pub fn set_logger(l: ffi::ncclDebugLogger_t) {
    LOGGER.store(l.map_or(0, |f| f as usize), Ordering::Release);
}

/// Logs one line through NCCL's logger, as `NET/weft : <msg>` under the NET subsystem.
pub fn log(level: c_int, msg: &str) {
    log_in(level, ffi::NCCL_NET, msg);
}

/// Logs one line under the given subsystems (`NCCL_INIT | NCCL_NET`, ...). NCCL prints an INFO
/// line only when one of its subsystems is in `NCCL_DEBUG_SUBSYS`, whose default leaves NET out.
pub fn log_in(level: c_int, subsystems: std::ffi::c_ulong, msg: &str) {
    let f = LOGGER.load(Ordering::Acquire);
    if f == 0 {
        if level == ffi::NCCL_LOG_WARN {
            eprintln!("NET/weft WARN : {msg}");
        }
        return;
    }
    let text = CString::new(format!("NET/weft : {msg}").replace('\0', " ")).unwrap_or_default();
    // SAFETY: `f` was stored from a non-null `ncclDebugLogger_t` by `set_logger`, so it is a
    // function of exactly this type; NCCL keeps its logger alive while the plugin is loaded.
    let logger: unsafe extern "C" fn(
        c_int,
        std::ffi::c_ulong,
        *const c_char,
        c_int,
        *const c_char,
        ...
    ) = unsafe { std::mem::transmute(f) };
    // SAFETY: all strings are NUL-terminated and outlive the call; "%s" consumes exactly the one
    // `char*` vararg we pass.
    unsafe {
        logger(
            level,
            subsystems,
            c"weft".as_ptr(),
            0,
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}

/// Logs a warning, rate-limited (see [`Limiter`]): a caller that spins on a failing call
/// gets one line per message per [`REPEAT_WINDOW`], with the count of those left out.
pub fn warn(msg: &str) {
    let now = std::time::Instant::now();
    let line = {
        let mut l = WARNED.lock().unwrap_or_else(|p| p.into_inner());
        l.get_or_insert_with(Limiter::default).admit(msg, now)
    };
    if let Some(line) = line {
        log(ffi::NCCL_LOG_WARN, &line);
    }
}

/// How long a repeated warning stays quiet after it was logged.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
/// Identical warnings logged in one [`REPEAT_WINDOW`] before the rest are only counted (a
/// few real, separate failures still each get their line; a spinning caller gets 16 a second).
pub const REPEAT_BURST: u32 = 16;
/// Most distinct messages the limiter remembers (it forgets them all beyond: bounded memory).
const LIMITER_MAX: usize = 1024;

static WARNED: std::sync::Mutex<Option<Limiter>> = std::sync::Mutex::new(None);

/// Rate limit of repeated log lines: a message is logged the first time, then at most once
/// per [`REPEAT_WINDOW`], saying how many identical ones were left out since.
#[derive(Debug, Default)]
pub struct Limiter {
    seen: std::collections::HashMap<String, (std::time::Instant, u64, u32)>,
}

impl Limiter {
    /// The line to log for `msg` at `now`, or None to leave it out (it is counted).
    pub fn admit(&mut self, msg: &str, now: std::time::Instant) -> Option<String> {
        if let Some((last, left_out, burst)) = self.seen.get_mut(msg) {
            if now.duration_since(*last) < REPEAT_WINDOW {
                if *burst < REPEAT_BURST {
                    *burst += 1;
                    return Some(msg.to_string());
                }
                *left_out += 1;
                return None;
            }
            let n = std::mem::take(left_out);
            *burst = 1;
            *last = now;
            return Some(if n == 0 {
                msg.to_string()
            } else {
                format!("{msg} (and {n} more times since the last such line)")
            });
        }
        if self.seen.len() >= LIMITER_MAX {
            self.seen.clear();
        }
        self.seen.insert(msg.to_string(), (now, 0, 1));
        Some(msg.to_string())
    }
}

/// Logs an info line.
pub fn info(msg: &str) {
    log(ffi::NCCL_LOG_INFO, msg);
}

/// Runs one entry point: catches panics, logs every error as WARN, returns the NCCL code.
pub fn run(what: &str, f: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ffi::ncclSuccess,
        Ok(Err(e)) => {
            warn(&format!("{what} failed: {e}"));
            e.code()
        }
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            warn(&format!(
                "{what} panicked: {why} (reported as ncclInternalError)"
            ));
            ffi::ncclInternalError
        }
    }
}

/// Wraps an `extern "C"` body: `guard!("isend", { ... Ok(()) })`.
macro_rules! guard {
    ($what:expr, $body:block) => {
        $crate::guard::run($what, || $body)
    };
}
pub(crate) use guard;

/// Writes through an out-pointer NCCL gave us.
pub fn out<T>(p: *mut T, what: &'static str, v: T) -> Result<()> {
    if p.is_null() {
        return Err(PluginError::Null(what));
    }
    // SAFETY: NCCL passes valid, aligned out-pointers; we checked for NULL.
    unsafe { p.write(v) };
    Ok(())
}

/// Moves a value to the heap and hands NCCL an opaque pointer to it.
pub fn into_handle<T>(v: Box<T>) -> *mut std::ffi::c_void {
    Box::into_raw(v).cast()
}

/// Borrows the object behind an opaque pointer made by [`into_handle`] for the same `T`.
///
/// # Safety
/// `p` must come from `into_handle::<T>` and not have been passed to [`free_handle`].
pub unsafe fn handle_ref<'a, T>(p: *mut std::ffi::c_void, what: &'static str) -> Result<&'a T> {
    if p.is_null() {
        return Err(PluginError::Null(what));
    }
    // SAFETY: per the contract, `p` points at a live `T` made by `into_handle`.
    Ok(unsafe { &*p.cast::<T>() })
}

/// Takes back ownership of an opaque pointer made by [`into_handle`].
///
/// # Safety
/// As for [`handle_ref`]; afterwards `p` is dangling.
pub unsafe fn free_handle<T>(p: *mut std::ffi::c_void, what: &'static str) -> Result<Box<T>> {
    if p.is_null() {
        return Err(PluginError::Null(what));
    }
    // SAFETY: per the contract, `p` came from `Box::into_raw` of a `Box<T>` and is freed once.
    Ok(unsafe { Box::from_raw(p.cast::<T>()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// 24.9 million identical warnings from a spinning caller become one line per second,
    /// the next one carrying the count; a different message is never held back by another.
    #[test]
    fn repeated_warnings_are_rate_limited_with_a_count() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        assert_eq!(
            l.admit("isend failed: x", t0).as_deref(),
            Some("isend failed: x")
        );
        for i in 1..REPEAT_BURST {
            assert_eq!(
                l.admit("isend failed: x", t0 + Duration::from_micros(u64::from(i)))
                    .as_deref(),
                Some("isend failed: x")
            );
        }
        for i in 0..1000u32 {
            assert_eq!(
                l.admit("isend failed: x", t0 + Duration::from_micros(u64::from(i))),
                None
            );
        }
        assert_eq!(
            l.admit("test failed: y", t0).as_deref(),
            Some("test failed: y")
        );
        let later = l.admit("isend failed: x", t0 + REPEAT_WINDOW).unwrap();
        assert_eq!(
            later,
            "isend failed: x (and 1000 more times since the last such line)"
        );
        for _ in 1..REPEAT_BURST {
            assert!(l.admit("isend failed: x", t0 + REPEAT_WINDOW).is_some());
        }
        assert_eq!(l.admit("isend failed: x", t0 + REPEAT_WINDOW), None);
        let quiet = t0 + 3 * REPEAT_WINDOW;
        assert_eq!(
            l.admit("isend failed: x", quiet).as_deref(),
            Some("isend failed: x (and 1 more times since the last such line)")
        );
    }
}
