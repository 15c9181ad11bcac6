//! "Run this on every host at once": one scoped thread per host (or at most `parallel`), the
//! results in the hosts' order. A panic in one of them is a bug and reaches the caller as one.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `f` on every item at once, one thread each; the results in the items' order.
pub fn each_host<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    each_at_most(items, items.len(), f)
}

/// `f` on every item, at most `parallel` at a time (sshd refuses a burst of connections past
/// its `MaxStartups`); the results in the items' order.
pub fn each_at_most<I: Sync, T: Send>(
    items: &[I],
    parallel: usize,
    f: impl Fn(&I) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, T)>> = Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|s| {
        for _ in 0..parallel.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(k) else { break };
                    let r = f(item);
                    done.lock().unwrap_or_else(|p| p.into_inner()).push((k, r));
                }
            });
        }
    });
    let mut v = done.into_inner().unwrap_or_else(|p| p.into_inner());
    v.sort_by_key(|(k, _)| *k);
    v.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn every_item_once_in_order_and_at_once() {
        // Each item waits (bounded) until all six have started: only if they run at once does
        // every one see the others.
        let arrived = AtomicUsize::new(0);
        let items: Vec<u64> = (0..6).collect();
        let out = each_host(&items, |&i| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while arrived.load(Ordering::SeqCst) < 6 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            (i * 10, arrived.load(Ordering::SeqCst) == 6)
        });
        assert_eq!(
            out,
            [0, 10, 20, 30, 40, 50].map(|v| (v, true)),
            "every item in order, all at once"
        );
        assert!(each_host(&[] as &[u8], |_| 1).is_empty());
    }

    #[test]
    fn at_most_bounds_the_threads() {
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let items: Vec<usize> = (0..12).collect();
        let out = each_at_most(&items, 3, |&i| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
            i
        });
        assert_eq!(out, items);
        assert!(most.load(Ordering::SeqCst) <= 3);
    }
}
