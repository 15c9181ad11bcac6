//! Start a simulated fabric with one SM and keep it up for manual poking.
//!
//! `cargo run -p weft-testbed --example sim_shell -- [single N | fat LEAVES SPINES HCAS DUAL] [SECS]`
//!
//! Prints the scratch dir, socket name and an `env` line to attach diag tools, e.g.
//! `env LD_PRELOAD=… SIM_HOST=smhost IBSIM_SOCKNAME=… saquery NR 3` (run it from a writable
//! dir). Stops everything after SECS seconds (default 120) or on Ctrl-C.

use std::error::Error;
use std::time::Duration;

use weft_testbed::{SimFabric, SmSpec, Topology};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num =
        |i: usize, d: usize| -> usize { args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d) };
    let (topo, secs) = match args.first().map(String::as_str) {
        Some("fat") => (
            Topology::fat_tree(num(1, 4), num(2, 2), num(3, 36), num(4, 4)),
            num(5, 120),
        ),
        _ => (Topology::single_switch(num(1, 4)), num(2, 120)),
    };
    let mut f = SimFabric::start(&topo)?;
    let parts = f.dir().join("partitions.conf");
    if !parts.exists() {
        std::fs::write(&parts, "Default=0x7fff, ipoib : ALL=full ;\n")?;
    }
    let sm = f.start_sm(SmSpec::new("sm1", "smhost", 10, &parts))?;
    let env: Vec<String> = f
        .client_env("smhost")
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("dir {}", f.dir().display());
    println!("sockname {}", f.sockname());
    println!("sm pid {} log {}", sm.pid, sm.log_file.display());
    println!("env {}", env.join(" "));
    std::thread::sleep(Duration::from_secs(secs as u64));
    Ok(())
}
