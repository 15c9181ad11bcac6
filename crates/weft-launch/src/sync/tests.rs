//! The source's side of the chain against a real receiving side (`serve`) on the loopback
//! interface: chunks sent from the page cache arrive whole; a file written after the scan
//! is refused.

use super::*;

fn opts(dest: &Path) -> SyncOptions {
    SyncOptions {
        dest: dest.display().to_string(),
        remote_exe: String::new(),
        data_if: None,
        mgmt_if: None,
        timeout: Duration::from_secs(5),
        chunk_size: 64 << 10,
        rounds: 1,
    }
}

/// Passes what `serve` announces (its address) to the test.
struct Announce(Vec<u8>, mpsc::Sender<String>);

impl Write for Announce {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let line = String::from_utf8_lossy(&self.0).trim().to_string();
        let _ = self.1.send(line);
        Ok(())
    }
}

/// A real receiving side (`serve`) on the loopback interface, on its own thread.
fn node(dest: &Path) -> (Hop, std::thread::JoinHandle<Result<(), LaunchError>>) {
    let o = ServeOptions {
        dest: dest.to_path_buf(),
        listen: Some(IpAddr::from([127, 0, 0, 1])),
        data_if: None,
        mgmt_if: None,
        timeout: Duration::from_secs(5),
        accept_timeout: Duration::from_secs(5),
    };
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || serve(&o, &mut Announce(vec![], tx)));
    let line = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let addr = line.strip_prefix(LISTENING).unwrap().to_string();
    (
        Hop {
            name: "n1".into(),
            addr,
        },
        h,
    )
}

fn source(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(dir.join("big.bin"), &big).unwrap();
    std::fs::write(dir.join("sub/small"), b"hello").unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
}

/// The source sends chunks straight from its files (sendfile) without hashing them again:
/// a real node on loopback ends with every file, and its report's hashes are the source's.
#[test]
fn chunks_sent_from_the_page_cache_arrive_whole() {
    let t = tempfile::tempdir().unwrap();
    let (src, dest) = (t.path().join("src"), t.path().join("dst"));
    source(&src);
    let o = opts(&dest);
    let (m, stamps) = Manifest::scan_stamped(&src, o.chunk_size).unwrap();
    let (hop, h) = node(&dest);
    let r = drive_chain(
        &m,
        &stamps,
        &m.chunk_refs(),
        &src,
        &[hop],
        &o,
        0,
        &mut |_| {},
    )
    .unwrap();
    h.join().unwrap().unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert_eq!(r.sent, m.total_bytes());
    let hashes: Vec<Option<Hash>> = m.files.iter().map(|f| Some(f.hash)).collect();
    assert_eq!(r.nodes[0].file_hashes, hashes);
    assert_eq!(Manifest::scan(&dest, o.chunk_size).unwrap(), m);
}

/// A source file written after the scan hashed it is refused when its chunks are sent
/// (its stamp moved), not sent as if it were the scanned one.
#[test]
fn a_file_written_after_the_scan_stops_the_sync_and_is_named() {
    let t = tempfile::tempdir().unwrap();
    let (src, dest) = (t.path().join("src"), t.path().join("dst"));
    source(&src);
    let o = opts(&dest);
    let (m, stamps) = Manifest::scan_stamped(&src, o.chunk_size).unwrap();
    std::fs::write(src.join("sub/small"), b"hello, changed").unwrap();
    let (hop, h) = node(&dest);
    let e = drive_chain(
        &m,
        &stamps,
        &m.chunk_refs(),
        &src,
        &[hop],
        &o,
        0,
        &mut |_| {},
    )
    .err()
    .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("sub/small") && msg.contains("changed while it was being synced"),
        "{msg}"
    );
    // The node sees its upstream go away and stops within its bound.
    assert!(h.join().unwrap().is_err());
    assert!(!dest.join("sub/small").exists());
}
