//! Prints what `weft_agent::discover` finds, as JSON.
//!
//! `cargo run -p weft-agent --example discover [ROOT]` (ROOT defaults to `/`; try
//! `crates/weft-agent/fixtures/dgx-spark`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("/"), PathBuf::from);
    match weft_agent::discover(&root) {
        Ok(report) => match serde_json::to_string_pretty(&report) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
