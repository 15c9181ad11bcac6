//! Planning a DeepSeek-V3-shaped checkpoint (163 shards, 90,000+ tensors) from local
//! headers: read every header, place every tensor, plan TP=8 on one 8-GPU node.
//! Target (issue 17): under 100 ms, median. Exits 1 when the median misses it.
//!
//! `cargo bench -p weft-plan --bench plan_headers`

use std::time::{Duration, Instant};

use weft_plan::plan::{Cluster, Layout, Options};
use weft_plan::{arch, source, synth};

fn main() {
    let p = format!(
        "{}/fixtures/configs/deepseek-v3.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&p).expect("fixture")).expect("json");
    let a = arch::from_config(&config).expect("config");
    let tensors = synth::tensors(&a, &config).expect("tensors");
    let dir = tempfile::tempdir().expect("tempdir");
    synth::write_checkpoint(dir.path(), &config, &tensors, 163).expect("write");
    let header_bytes: u64 = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    let r = source::resolve(dir.path().to_str().expect("utf-8")).expect("resolve");
    let layout = Layout {
        tp: 8,
        pp: 1,
        ep: false,
        dp: 1,
    };
    let cluster = Cluster {
        nodes: 1,
        gpus_per_node: 8,
        gpu_memory_bytes: 141_000_000_000,
    };
    let opts = Options {
        max_model_len: Some(32_768),
        ..Options::default()
    };
    // CPU time of the process (user + system, every thread, /proc/self/stat in clock
    // ticks of 10 ms), to tell a slow machine from a loaded one: averaged over the runs.
    let cpu_ms = || -> f64 {
        std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                // Fields 14 and 15 of stat(5); `rest` starts at field 3.
                Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) * 10.0)
            })
            .unwrap_or(0.0)
    };
    let run = || {
        let t0 = Instant::now();
        let m = source::load_local(&r).expect("load");
        let t1 = Instant::now();
        let p = weft_plan::plan::plan(&m, layout, cluster, &opts).expect("plan");
        let t2 = Instant::now();
        assert!(p.fits);
        (m.tensors.len(), t1 - t0, t2 - t1, t2 - t0)
    };
    run(); // warm the page cache
    let c0 = cpu_ms();
    let mut all: Vec<(usize, Duration, Duration, Duration)> = (0..15).map(|_| run()).collect();
    let cpu_per_run = (cpu_ms() - c0) / 15.0;
    all.sort_by_key(|x| x.3);
    let (n, read, place, total) = all[all.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "plan_headers: {n} tensors in 163 shards ({:.1} MB of headers): median {:.1} ms (read {:.1} ms + plan {:.1} ms), min {:.1} ms, max {:.1} ms, CPU {:.0} ms a run (all threads), target < 100 ms",
        header_bytes as f64 / 1e6,
        ms(total),
        ms(read),
        ms(place),
        ms(all[0].3),
        ms(all[all.len() - 1].3),
        cpu_per_run,
    );
    if total >= Duration::from_millis(100) {
        eprintln!(
            "plan_headers: median {:.1} ms misses the 100 ms target",
            ms(total)
        );
        std::process::exit(1);
    }
}
