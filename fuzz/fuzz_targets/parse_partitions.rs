//! Fuzzes the strict partitions.conf parser: it must never panic, and whatever it
//! accepts must render to text that parses back to the same AST.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_fabric::conf;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(c) = conf::parse(&text) {
        let again = conf::parse(&conf::render(&c));
        assert_eq!(again.as_ref(), Ok(&c));
    }
});
