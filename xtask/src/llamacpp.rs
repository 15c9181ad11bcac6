//! llama.cpp's `llama-server` and `ggml-rpc-server` (built with the RPC backend) for the test
//! of `weft run`'s llama.cpp recipe across namespace hosts
//! (crates/weft/tests/launch/llamacpp.rs). Neither Debian bookworm nor trixie ships them
//! (Debian has llama.cpp only in sid, for glibc 2.38), and no well-kept PyPI package does;
//! llama-cpp-python's source distribution on PyPI carries llama.cpp's pinned source
//! (vendor/llama.cpp), so it is fetched from PyPI by its hash and the two targets built with
//! cmake into target/llama.cpp/build/bin. About 10 CPU-minutes (measured: 554 s user + 41 s
//! system on this 2-core VM), so about 5 minutes on 2 idle cores; skipped when built.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// llama-cpp-python 0.3.36's sdist (llama.cpp commit 0c1e570, ggml 0.25.3).
const URL: &str = "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz";
const SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const DIR: &str = "llama_cpp_python-0.3.36";

pub fn ensure(root: &Path) -> Result<()> {
    let base = root.join("target/llama.cpp");
    let bin = base.join("build/bin");
    if bin.join("llama-server").exists() && bin.join("ggml-rpc-server").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&base).with_context(|| base.display().to_string())?;
    let tarball = base.join(format!("{DIR}.tar.gz"));
    eprintln!("xtask: fetching llama.cpp's source (llama-cpp-python 0.3.36 sdist from PyPI)");
    // python3 is there (pip installs the test packages); it fetches and checks the hash.
    let py = format!(
        "import hashlib, sys, urllib.request\n\
         d = urllib.request.urlopen('{URL}', timeout=300).read()\n\
         h = hashlib.sha256(d).hexdigest()\n\
         sys.exit(f'sha256 {{h}}, expected {SHA256}') if h != '{SHA256}' else open(sys.argv[1], 'wb').write(d)"
    );
    crate::run(Command::new("python3").args(["-c", &py]).arg(&tarball))?;
    crate::run(
        Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&base),
    )?;
    let src = base.join(DIR).join("vendor/llama.cpp");
    if !src.join("CMakeLists.txt").exists() {
        bail!("{}: no llama.cpp source in the sdist", src.display());
    }
    let build = base.join("build");
    crate::run(
        Command::new("cmake")
            .arg("-S")
            .arg(&src)
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DGGML_RPC=ON",
                "-DGGML_NATIVE=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_APP=OFF",
            ]),
    )?;
    eprintln!("xtask: building llama-server and ggml-rpc-server (about 10 CPU-minutes)");
    crate::run(Command::new("cmake").arg("--build").arg(&build).args([
        "-j2",
        "--target",
        "llama-server",
        "ggml-rpc-server",
    ]))
}
