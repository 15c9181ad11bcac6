//! regMr/deregMr through the C ABI on the libfabric backend (`WEFT_BACKEND=ofi`,
//! `tcp;ofi_rxm` on loopback), for every exported ncclNet version, with the 8-byte protocol
//! and, in re-executed children, the 4-byte one (`WEFT_OFI_CQ_DATA_BYTES=4`) and two rails
//! with the TCP lane for small messages (`WEFT_OFI_DOMAIN=lo,lo`, `WEFT_OFI_MIN_BYTES`):
//! register a region on each comm, move sub-ranges of it with the handles, deregister, free the memory, map memory
//! again at the same address with another size, register and move data again, and check every
//! byte (and nothing written past a message). Also: deregMr on a pointer that is not a comm is
//! a WARNed error, not a crash.
//!
//! `harness = false`: the environment must be set before the plugin reads it. Without
//! libfabric the test prints "skipped" and passes (the backend is optional).

use std::ffi::c_void;
use std::process::Command;
use std::time::{Duration, Instant};

use nccl_net_weft::ffi::*;
use weft_transport::proto::ListenHandle;

#[macro_use]
mod common;
use common::*;

fn map(at: Option<*mut u8>, len: usize) -> R<*mut u8> {
    // SAFETY: an anonymous private mapping; MAP_FIXED only over our own mapping, unmapped first.
    let p = unsafe {
        libc::mmap(
            at.map_or(std::ptr::null_mut(), |p| p.cast()),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | if at.is_some() { libc::MAP_FIXED } else { 0 },
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err("mmap failed".into());
    }
    Ok(p.cast())
}

fn unmap(p: *mut u8, len: usize) -> R {
    // SAFETY: a mapping of ours of `len` bytes that nothing uses any more.
    if unsafe { libc::munmap(p.cast(), len) } != 0 {
        return Err("munmap failed".into());
    }
    Ok(())
}

/// One message, both ends polled from this thread as NCCL's proxy does.
fn transfer(
    net: &Net,
    (sc, rc): (*mut c_void, *mut c_void),
    src: &[u8],
    dst: &mut [u8],
    (smh, rmh): (*mut c_void, *mut c_void),
    tag: i32,
) -> R<usize> {
    let rreq = net
        .irecv(rc, &mut [dst], &[tag], &[rmh])?
        .ok_or("irecv refused")?;
    let sreq = loop {
        if let Some(r) = net.isend(sc, src, tag, smh)? {
            break r;
        }
    };
    let (mut sd, mut rd) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sd.is_none() || rd.is_none() {
        if Instant::now() > deadline {
            return Err(format!("{}-byte transfer did not complete", src.len()));
        }
        if sd.is_none() {
            sd = net.test(sreq)?;
        }
        if rd.is_none() {
            rd = net.test(rreq)?;
        }
    }
    let (s, r) = (sd.unwrap_or_default()[0], rd.unwrap_or_default()[0]);
    if s as usize != src.len() {
        return Err(format!("send of {} bytes reported {s}", src.len()));
    }
    Ok(r as usize)
}

fn t_register_deregister_reregister(net: &Net) -> R {
    let ctx = net.init()?;
    // The plugin says which backend it uses (and its rails) in its INFO line.
    let want = match std::env::var("WEFT_OFI_DOMAIN") {
        Ok(d) => format!("backend ofi tcp;ofi_rxm/{}", d.replace(',', "+")),
        Err(_) => "backend ofi tcp;ofi_rxm/".into(),
    };
    if !LOG.lock().unwrap().iter().any(|l| l.text.contains(&want)) {
        return Err(format!("no INFO line with {want:?}"));
    }
    let mut handle = [0u8; 128];
    let lc = net.listen(ctx, &mut handle)?;
    let h = ListenHandle::decode(&handle).map_err(|e| e.to_string())?;
    if !h.data.is_empty() {
        return Err("the listen handle has data addresses: the TCP backend, not ofi".into());
    }
    net.close_listen(lc)?;
    let pair = net.connect_pair(ctx)?;
    const BIG: usize = 3 << 20;
    const SMALL: usize = 300_000;
    let mut src = pattern(BIG, 17);
    let smh = net.reg(pair.0, &mut src, NCCL_PTR_HOST)?;
    let base = map(None, BIG)?;
    // SAFETY: `base` maps BIG writable bytes, unmapped below after deregistration.
    let dst = unsafe { std::slice::from_raw_parts_mut(base, BIG) };
    let rmh = net.reg(pair.1, dst, NCCL_PTR_HOST)?;
    // Sub-ranges of the registered regions, receive larger than the send.
    for (i, &(off, n)) in [
        (0usize, BIG - 100),
        (4099, 70_000),
        (1 << 20, 8192),
        (77, 0),
    ]
    .iter()
    .enumerate()
    {
        dst.fill(0xa5);
        let room = (n + 100).min(BIG - off);
        let got = transfer(
            net,
            pair,
            &src[off..off + n],
            &mut dst[off..off + room],
            (smh, rmh),
            i as i32,
        )?;
        if got != n {
            return Err(format!("message {i}: {got} bytes reported, {n} sent"));
        }
        if dst[off..off + n] != src[off..off + n] {
            return Err(format!("message {i} ({n} bytes) corrupted"));
        }
        if dst[off + n..off + room].iter().any(|b| *b != 0xa5) {
            return Err(format!("message {i}: bytes written past the message"));
        }
    }
    net.dereg(pair.1, rmh)?;
    net.dereg(pair.0, smh)?;
    // Free the receive memory and map it again, smaller, at the same address.
    unmap(base, BIG)?;
    let again = map(Some(base), SMALL)?;
    if again != base {
        return Err("the new mapping is not at the old address".into());
    }
    // SAFETY: `again` maps SMALL writable bytes, unmapped below.
    let dst = unsafe { std::slice::from_raw_parts_mut(again, SMALL) };
    dst.fill(0x5a);
    let rmh = net.reg(pair.1, dst, NCCL_PTR_HOST)?;
    let mut src2 = pattern(SMALL, 99);
    let smh = net.reg(pair.0, &mut src2, NCCL_PTR_HOST)?;
    let got = transfer(net, pair, &src2, dst, (smh, rmh), 9)?;
    if got != SMALL || dst[..] != src2[..] {
        return Err(format!(
            "after re-registration: {got} bytes, payload differs"
        ));
    }
    // And a message without handles (NULL mhandles): the connection's cache.
    dst.fill(0);
    let got = transfer(
        net,
        pair,
        &src2[..SMALL / 2],
        &mut dst[..],
        (std::ptr::null_mut(), std::ptr::null_mut()),
        10,
    )?;
    if got != SMALL / 2 || dst[..SMALL / 2] != src2[..SMALL / 2] {
        return Err("message without handles corrupted".into());
    }
    net.dereg(pair.1, rmh)?;
    net.dereg(pair.0, smh)?;
    // deregMr with something that is not a comm: an error with a WARN, no crash.
    let mark = log_mark();
    let mut bogus = [0u64; 8];
    let mh = net.reg(pair.1, &mut [0u8; 64], NCCL_PTR_HOST)?;
    if net.dereg(bogus.as_mut_ptr().cast(), mh).is_ok() {
        return Err("deregMr on a non-comm pointer succeeded".into());
    }
    if !warns_since(mark).iter().any(|w| w.contains("deregMr")) {
        return Err("no WARN for deregMr on a non-comm pointer".into());
    }
    net.close_send(pair.0)?;
    net.close_recv(pair.1)?;
    unmap(again, SMALL)?;
    net.finalize(ctx)
}

fn run_all(lib: &'static libloading::Library, tag: &str) -> bool {
    let mut ok = true;
    for v in 8..=12u32 {
        let net = Net::load(lib, v);
        let start = Instant::now();
        let r = std::panic::catch_unwind(|| t_register_deregister_reregister(&net))
            .unwrap_or_else(|_| Err("panicked".into()));
        match r {
            Ok(()) => println!(
                "test {tag}v{v}::register_deregister_reregister ... ok ({:?})",
                start.elapsed()
            ),
            Err(e) => {
                println!("test {tag}v{v}::register_deregister_reregister ... FAILED: {e}");
                ok = false;
            }
        }
    }
    ok
}

fn main() {
    // Single-threaded here: setting the environment is sound, and the plugin reads it at init.
    for (k, v) in [
        ("WEFT_MGMT_IFNAME", "=lo"),
        ("WEFT_DATA_IFNAME", "=lo"),
        ("WEFT_TIMEOUT_MS", "5000"),
        ("WEFT_ACCEPT_TIMEOUT_MS", "20000"),
        ("WEFT_NTHREADS", "0"),
        ("WEFT_NSOCKS_PERTHREAD", "1"),
        ("WEFT_BACKEND", "ofi"),
        ("WEFT_OFI_PROVIDER", "tcp;ofi_rxm"),
        ("WEFT_OFI_DOMAIN", "lo"),
    ] {
        if std::env::var_os(k).is_none() {
            // SAFETY: no other thread exists yet (main's first statement, before any spawn).
            unsafe { std::env::set_var(k, v) };
        }
    }
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let child = args
        .iter()
        .position(|a| a == "--child")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let t = weft_transport::Transport::new(
        weft_transport::Config::from_env().expect("WEFT_* variables of this test"),
    )
    .expect("transport on lo");
    if !t.is_ofi() {
        let installed = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists();
        let note = t.backend_note().unwrap_or_default().to_string();
        if installed {
            eprintln!("libfabric is installed but tcp;ofi_rxm is unusable: {note}");
            std::process::exit(1);
        }
        weft_netns::require::skip("the registration cache test", &note);
        return;
    }
    drop(t);
    // SAFETY: loading our own plugin; its initialisers have no preconditions.
    let lib: &'static libloading::Library = Box::leak(Box::new(
        unsafe { libloading::Library::new(so_path()) }.expect("dlopen the plugin"),
    ));
    let tag = child.as_deref().map_or(String::new(), |c| format!("{c}::"));
    let mut ok = run_all(lib, &tag);
    if child.is_none() {
        // Fresh processes, since the plugin reads WEFT_* once: the 4-byte protocol, and two
        // rails with striping from 64 KiB plus the TCP lane under 64 KiB.
        let variants: [(&str, &[(&str, &str)]); 2] = [
            ("cq4", &[("WEFT_OFI_CQ_DATA_BYTES", "4")]),
            (
                "rails+lane",
                &[
                    ("WEFT_OFI_DOMAIN", "lo,lo"),
                    ("WEFT_OFI_STRIPE_BYTES", "65536"),
                    ("WEFT_OFI_MIN_BYTES", "65536"),
                ],
            ),
        ];
        for (name, env) in variants {
            let st = Command::new(std::env::current_exe().expect("own path"))
                .args(["--child", name])
                .envs(env.iter().copied())
                .status();
            ok &= st.is_ok_and(|s| s.success());
        }
    }
    if !ok {
        std::process::exit(1);
    }
    println!("test result: ok");
}
