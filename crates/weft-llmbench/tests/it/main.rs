//! Integration tests. `scripted`: weft's error paths and counting against the scripted
//! stand-in server (it measures weft itself; no engine is imitated). `llamacpp`: a real
//! llama.cpp server (llama-cpp-python) serving a tiny random-weights GGUF the test writes, and
//! llama-benchy side by side on it.

mod llamacpp;
mod predicted;
mod scripted;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use weft_llmbench::client::{Api, Client, Endpoint, Limits};
use weft_llmbench::runner::{Labels, LatencyMode, Sweep};

pub fn client(base_url: &str, model: &str, api: Api, limits: Limits) -> Client {
    Client::new(
        Endpoint {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            api,
            extra_body: Default::default(),
        },
        limits,
    )
    .unwrap()
}

pub fn quick_limits() -> Limits {
    Limits {
        connect: Duration::from_secs(2),
        first_byte: Duration::from_secs(20),
        between_chunks: Duration::from_secs(5),
        request: Duration::from_secs(60),
        retries: 2,
        backoff: Duration::from_millis(50),
    }
}

pub fn sweep(prompt_sizes: &[u64], tg: &[u64], depth: &[u64], c: &[u32], runs: u32) -> Sweep {
    Sweep {
        prompt_sizes: prompt_sizes.to_vec(),
        tg: tg.to_vec(),
        depth: depth.to_vec(),
        concurrency: c.to_vec(),
        runs,
        prefix_cache: false,
        latency_mode: LatencyMode::Api,
        adapt_prompt: true,
        seed: 3,
    }
}

pub fn labels() -> Labels {
    Labels {
        weft_version: "test".into(),
        ..Default::default()
    }
}

/// The `--book-url` the tests give llama-benchy: a local address nothing answers on, whose
/// book [`llama_benchy_home`] has already put in llama-benchy's cache.
pub const BENCHY_BOOK_URL: &str = "http://127.0.0.1:9/weft-prompt-text.txt";

/// Makes `home` a HOME in which llama-benchy finds the book of [`BENCHY_BOOK_URL`] in its
/// cache (`~/.cache/llama-benchy/<md5 of the URL>.txt`: `words` words of weft's prompt
/// text). Otherwise it downloads its book on every start, and no host is reachable here.
pub fn llama_benchy_home(home: &Path, words: usize) {
    let md5 = Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.md5(sys.argv[1].encode()).hexdigest())",
            BENCHY_BOOK_URL,
        ])
        .output()
        .expect("python3");
    let md5 = String::from_utf8(md5.stdout).unwrap().trim().to_string();
    let cache = home.join(".cache/llama-benchy");
    std::fs::create_dir_all(&cache).unwrap();
    let book =
        weft_llmbench::prompt::Corpus::words().text(&mut weft_llmbench::prompt::Rng::new(5), words);
    std::fs::write(cache.join(format!("{md5}.txt")), book).unwrap();
}
