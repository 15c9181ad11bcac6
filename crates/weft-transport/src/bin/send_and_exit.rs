//! weft-send-and-exit, the sender of the "sent means delivered" tests (tests/common): connects to the listener whose handle is
//! `argv[1]` (hex), sends `argv[2]` messages of `argv[3]` bytes (message k filled with byte
//! k, tag k), all in flight at once, waits until every one is reported done, closes the
//! connection and exits at once. Configuration from the `WEFT_*` environment, as the plugin.
//! Exit status 0 only when every send was reported done. `WEFT_TEST_HOLD_MS`: first stay
//! that long without calling in (a live process whose application is busy elsewhere).
//! `WEFT_TEST_SAY_SENT=1`: print `SENT` once every send is handed over (before testing any).

use weft_transport::{Config, Transport};

fn main() {
    if let Err(e) = run() {
        eprintln!("send_and_exit: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, hex, count, size] = &args[..] else {
        return Err("usage: send_and_exit HANDLE_HEX COUNT SIZE".into());
    };
    let handle: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("handle {hex:?}: {e}"))?;
    let count: usize = count.parse().map_err(|e| format!("count {count:?}: {e}"))?;
    let size: usize = size.parse().map_err(|e| format!("size {size:?}: {e}"))?;
    let t = Transport::new(Config::from_env().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut tx = t
        .connect(0, &handle)
        .and_then(|c| c.wait())
        .map_err(|e| e.to_string())?;
    let bufs: Vec<Vec<u8>> = (0..count).map(|k| vec![k as u8; size]).collect();
    let mut ids = Vec::new();
    for (k, b) in bufs.iter().enumerate() {
        let id = loop {
            // SAFETY: `bufs` outlives `tx`, which is dropped below after every request is done.
            match unsafe { tx.isend(b.as_ptr(), b.len(), k as i32) } {
                Ok(Some(id)) => break id,
                Ok(None) => {}
                Err(e) => return Err(format!("isend {k}: {e}")),
            }
        };
        ids.push(Some(id));
    }
    if std::env::var_os("WEFT_TEST_SAY_SENT").is_some() {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "SENT").and_then(|()| out.flush());
    }
    while ids.iter().any(Option::is_some) {
        for (k, id) in ids.iter_mut().enumerate() {
            if let Some(i) = *id
                && tx.test(i).map_err(|e| format!("test {k}: {e}"))?.is_some()
            {
                *id = None;
            }
        }
    }
    if let Some(ms) = std::env::var("WEFT_TEST_HOLD_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    drop(tx);
    std::process::exit(0);
}
