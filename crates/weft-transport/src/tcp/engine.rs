//! The data-stream engine: queues of chunk tasks per data stream, moved either by the caller's
//! progress calls (`nthreads == 0`) or by helper threads that each own some streams and sleep in
//! `poll(2)` on them plus an eventfd. Threads are joined when the engine is dropped, so no thread
//! touches a user buffer after the connection is closed.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Link, Stage};

/// Progress of one request's chunks, shared with the helper threads.
#[derive(Debug, Default)]
pub(crate) struct ReqState {
    /// Chunks not yet fully moved.
    pub remaining: AtomicUsize,
}

/// One chunk to move: `len` bytes at address `ptr`.
#[derive(Debug)]
pub(crate) struct Task {
    pub ptr: usize,
    pub len: usize,
    pub done: usize,
    pub req: Arc<ReqState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Send,
    Recv,
}

/// One data stream and its queue.
#[derive(Debug)]
pub(crate) struct Stream {
    pub sock: TcpStream,
    pub link: Link,
    queue: VecDeque<Task>,
    last_progress: Instant,
}

impl Stream {
    pub fn new(sock: TcpStream, link: Link) -> Stream {
        Stream {
            sock,
            link,
            queue: VecDeque::new(),
            last_progress: Instant::now(),
        }
    }

    fn push(&mut self, now: Instant, t: Task) {
        if self.queue.is_empty() {
            self.last_progress = now;
        }
        self.queue.push_back(t);
    }

    /// Moves bytes until the socket would block. Returns whether anything moved.
    fn progress(&mut self, dir: Dir, now: Instant, timeout: Duration) -> Result<bool, Error> {
        let mut moved = false;
        while let Some(t) = self.queue.front_mut() {
            let left = t.len - t.done;
            let r = if left == 0 {
                Ok(0)
            } else {
                let p = (t.ptr + t.done) as *mut u8;
                match dir {
                    Dir::Send => {
                        // SAFETY: the caller of isend promised `ptr..ptr+len` stays valid and
                        // unchanged until the request completes or the connection is dropped;
                        // the engine is dropped (threads joined) before the connection is.
                        let buf = unsafe { std::slice::from_raw_parts(p as *const u8, left) };
                        (&self.sock).write(buf)
                    }
                    Dir::Recv => {
                        // SAFETY: as above for irecv, and this task is the only writer of
                        // these bytes (chunks of a message never overlap).
                        let buf = unsafe { std::slice::from_raw_parts_mut(p, left) };
                        (&self.sock).read(buf)
                    }
                }
            };
            match r {
                Ok(0) if left > 0 => return Err(self.link.closed(Stage::Data)),
                Ok(n) => {
                    t.done += n;
                    moved = true;
                    self.last_progress = now;
                    if t.done == t.len
                        && let Some(t) = self.queue.pop_front()
                    {
                        t.req.remaining.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let op = if dir == Dir::Send { "send" } else { "recv" };
                    return Err(self.link.io(op, Stage::Data, &e));
                }
            }
        }
        if dir == Dir::Recv
            && !moved
            && !self.queue.is_empty()
            && now.duration_since(self.last_progress) >= timeout
        {
            return Err(self.link.timeout(Stage::Data, timeout));
        }
        Ok(moved)
    }
}

#[derive(Debug, Default)]
struct Shared {
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    stop: AtomicBool,
    /// Grows each time some stream moved bytes (a progress mark, see [`Engine::moved`]).
    moved: AtomicU64,
}

impl Shared {
    fn fail(&self, e: Error) {
        let mut g = lock(&self.error);
        if g.is_none() {
            *g = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a thread panicked while holding it; the data (queues of plain
    // values, an error slot) is still consistent, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
struct Worker {
    inbox: Arc<Mutex<Vec<(usize, Task)>>>,
    wake: Arc<OwnedFd>,
    join: Option<JoinHandle<()>>,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions; we check the result.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; failure (counter full) is harmless.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64; EAGAIN is harmless.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// The data streams of one connection.
#[derive(Debug)]
pub(crate) struct Engine {
    dir: Dir,
    timeout: Duration,
    shared: Arc<Shared>,
    /// Streams driven by the caller (all of them when there are no workers).
    local: Vec<Stream>,
    workers: Vec<Worker>,
    nstreams: usize,
}

impl Engine {
    pub fn new(
        dir: Dir,
        streams: Vec<Stream>,
        nthreads: usize,
        timeout: Duration,
    ) -> Result<Engine, Error> {
        let nstreams = streams.len();
        let shared = Arc::new(Shared::default());
        if nthreads == 0 {
            return Ok(Engine {
                dir,
                timeout,
                shared,
                local: streams,
                workers: Vec::new(),
                nstreams,
            });
        }
        let nthreads = nthreads.min(nstreams.max(1));
        let mut per: Vec<Vec<Stream>> = (0..nthreads).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            per[i % nthreads].push(s);
        }
        let mut workers = Vec::new();
        for (t, mine) in per.into_iter().enumerate() {
            let inbox = Arc::new(Mutex::new(Vec::new()));
            let wake = Arc::new(eventfd().map_err(|e| Error::local("eventfd", &e))?);
            let (inbox2, wake2, shared2) = (inbox.clone(), wake.clone(), shared.clone());
            let join = std::thread::Builder::new()
                .name(format!(
                    "weft-{}{t}",
                    if dir == Dir::Send { "tx" } else { "rx" }
                ))
                .spawn(move || worker_loop(dir, timeout, nthreads, mine, &inbox2, &wake2, &shared2))
                .map_err(|e| Error::local("spawn helper thread", &e))?;
            workers.push(Worker {
                inbox,
                wake,
                join: Some(join),
            });
        }
        Ok(Engine {
            dir,
            timeout,
            shared,
            local: Vec::new(),
            workers,
            nstreams,
        })
    }

    pub fn nstreams(&self) -> usize {
        self.nstreams
    }

    /// Queues chunk tasks, in order, each on its stream.
    pub fn push(&mut self, tasks: impl Iterator<Item = (usize, Task)>) {
        let now = Instant::now();
        if self.workers.is_empty() {
            for (s, t) in tasks {
                self.local[s].push(now, t);
            }
            return;
        }
        let n = self.workers.len();
        let mut touched = vec![false; n];
        for (s, t) in tasks {
            let w = s % n;
            lock(&self.workers[w].inbox).push((s / n, t));
            touched[w] = true;
        }
        for (w, hit) in touched.into_iter().enumerate() {
            if hit {
                signal(self.workers[w].wake.as_raw_fd());
            }
        }
    }

    /// Moves bytes on caller-driven streams; returns the connection's error if any stream failed.
    pub fn progress(&mut self) -> Result<(), Error> {
        if !self.local.is_empty() && !self.shared.failed.load(Ordering::Acquire) {
            let now = Instant::now();
            for s in &mut self.local {
                match s.progress(self.dir, now, self.timeout) {
                    Ok(true) => {
                        self.shared.moved.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.shared.fail(e);
                        break;
                    }
                }
            }
        }
        self.error()
    }

    /// A number that grows whenever a data stream moved bytes.
    pub fn moved(&self) -> u64 {
        self.shared.moved.load(Ordering::Acquire)
    }

    pub fn error(&self) -> Result<(), Error> {
        if self.shared.failed.load(Ordering::Acquire)
            && let Some(e) = lock(&self.shared.error).clone()
        {
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in &self.workers {
            signal(w.wake.as_raw_fd());
        }
        for w in &mut self.workers {
            if let Some(j) = w.join.take() {
                let _ = j.join();
            }
        }
    }
}

fn worker_loop(
    dir: Dir,
    timeout: Duration,
    _nthreads: usize,
    mut mine: Vec<Stream>,
    inbox: &Mutex<Vec<(usize, Task)>>,
    wake: &OwnedFd,
    shared: &Shared,
) {
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(mine.len() + 1);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        {
            let mut g = lock(inbox);
            for (s, t) in g.drain(..) {
                if let Some(st) = mine.get_mut(s) {
                    st.push(now, t);
                }
            }
        }
        let mut moved = false;
        if !shared.failed.load(Ordering::Acquire) {
            for s in &mut mine {
                match s.progress(dir, now, timeout) {
                    Ok(m) => moved |= m,
                    Err(e) => {
                        shared.fail(e);
                        break;
                    }
                }
            }
        }
        if moved {
            shared.moved.fetch_add(1, Ordering::AcqRel);
            continue;
        }
        pfds.clear();
        pfds.push(libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let failed = shared.failed.load(Ordering::Acquire);
        for s in &mine {
            if !failed && !s.queue.is_empty() {
                let ev = if dir == Dir::Send {
                    libc::POLLOUT
                } else {
                    libc::POLLIN
                };
                pfds.push(libc::pollfd {
                    fd: s.sock.as_raw_fd(),
                    events: ev,
                    revents: 0,
                });
            }
        }
        let ms = if pfds.len() > 1 { 100 } else { 1000 };
        // SAFETY: `pfds` is a live, correctly sized array of pollfd.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if pfds[0].revents != 0 {
            drain(wake.as_raw_fd());
        }
    }
}
