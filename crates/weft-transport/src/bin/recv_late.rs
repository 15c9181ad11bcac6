//! weft-recv-late, the receiver of the frozen- and late-receiver tests (tests/tcp.rs): a
//! process that listens, prints `HANDLE <hex>` on stdout, accepts one connection, prints
//! `ACCEPTED`, then stays `WEFT_TEST_HOLD_MS` without calling in (a live process whose
//! application is busy elsewhere; the test may stop it with SIGSTOP instead), then receives
//! `argv[1]` messages of `argv[2]` bytes (message k: tag k, every byte k), checks them and
//! prints `OK`. Configuration from the `WEFT_*` environment, as the plugin's. Exit status 0
//! only when every message arrived intact.

use std::io::Write;
use std::time::Duration;

use weft_transport::{Config, Transport};

fn main() {
    if let Err(e) = run() {
        eprintln!("recv_late: {e}");
        std::process::exit(1);
    }
}

fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, count, size] = &args[..] else {
        return Err("usage: weft-recv-late COUNT SIZE".into());
    };
    let count: usize = count.parse().map_err(|e| format!("count {count:?}: {e}"))?;
    let size: usize = size.parse().map_err(|e| format!("size {size:?}: {e}"))?;
    let t = Transport::new(Config::from_env().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut l = t.listen(0).map_err(|e| e.to_string())?;
    let hex: String = l.handle().iter().map(|b| format!("{b:02x}")).collect();
    say(&format!("HANDLE {hex}"))?;
    let mut rx = l.wait().map_err(|e| format!("accept: {e}"))?;
    say("ACCEPTED")?;
    if let Some(ms) = std::env::var("WEFT_TEST_HOLD_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
    let mut buf = vec![0u8; size];
    for k in 0..count {
        let n = rx
            .recv(&mut buf, k as i32)
            .map_err(|e| format!("recv {k}: {e}"))?;
        if n != size || buf.iter().any(|b| *b != k as u8) {
            return Err(format!("message {k}: {n} bytes, not {size} of {k}"));
        }
    }
    say("OK")
}
