//! The demo's stop at the controller's web console: `weft controller` (recording only,
//! `--no-fabric`: the simulated fabric belongs to the demo's `weft fabric apply` part) with
//! two real agents reading the shipped fixtures (an InfiniBand server and a DGX Spark), a
//! tenant, two groups and a move made through the API; then the console's URL and an admin
//! login are printed. The processes stop when the returned guard is dropped (at the end of
//! the demo, after `--keep`'s wait).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The controller and its agents; killed when dropped.
pub struct Tour(Vec<Child>);

impl Drop for Tour {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the tour in `dir/console` with the `weft` binary `bin`; see the module doc.
pub fn tour(bin: &Path, dir: &Path) -> Result<Tour> {
    println!("\n\x1b[1m== the controller and its web console\x1b[0m");
    let dir = dir.join("console");
    std::fs::create_dir_all(&dir)?;
    let token: String = {
        use std::io::Read;
        let mut b = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .context("no randomness for the admin token")?;
        b.iter().map(|x| format!("{x:02x}")).collect()
    };
    let free = || -> Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let (port, mport) = (free()?, free()?);
    let url = format!("http://127.0.0.1:{port}");
    let mut ctl = Command::new(bin)
        .args(["controller", "--no-fabric", "--db", "console.db", "--init"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{mport}")])
        .env("WEFT_ADMIN_TOKEN", &token)
        .env_remove("WEFT_CONFIG")
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting weft controller")?;
    let mut line = String::new();
    BufReader::new(ctl.stdout.take().context("controller stdout")?).read_line(&mut line)?;
    print!("{line}");
    let mut guard = Tour(vec![ctl]);
    let weft = |args: &[&str]| -> Result<String> {
        println!("$ weft {}", args.join(" "));
        let o = Command::new(bin)
            .args(args)
            .current_dir(&dir)
            .env("WEFT_CONTROLLER", &url)
            .env("WEFT_TOKEN", &token)
            .env_remove("WEFT_CONFIG")
            .output()?;
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        print!("{out}");
        if !o.status.success() {
            bail!(
                "weft {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(out)
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/weft-agent/fixtures");
    for (host, fixture) in [("cx7-host", "connectx7-host"), ("spark1", "dgx-spark")] {
        let enroll = weft(&["nodes", "enroll", "--server", host])?;
        let agent = Command::new(bin)
            .args([
                "agent",
                "--enroll-token",
                enroll.trim(),
                "--state-file",
                &format!("{host}.json"),
            ])
            .arg("--sysfs-root")
            .arg(fixtures.join(fixture))
            .env("WEFT_CONTROLLER", &url)
            .env_remove("WEFT_CONFIG")
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting weft agent")?;
        guard.0.push(agent);
    }
    let start = Instant::now();
    let reporting = || {
        Command::new(bin)
            .args(["nodes", "--json"])
            .env("WEFT_CONTROLLER", &url)
            .env("WEFT_TOKEN", &token)
            .env_remove("WEFT_CONFIG")
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .matches("\"liveness\": \"ok\"")
                    .count()
                    == 2
            })
    };
    while !reporting() {
        if start.elapsed() > Duration::from_secs(20) {
            bail!("the two agents did not report within 20 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    weft(&["tenant", "create", "alice"])?;
    weft(&["group", "create", "a", "--tenant", "alice"])?;
    weft(&["group", "create", "b", "--tenant", "alice"])?;
    weft(&["group", "add", "a", "cx7-host"])?;
    weft(&["group", "move", "cx7-host", "--to", "b"])?;
    weft(&["nodes"])?;
    println!("\nthe console: {url}/console  (log in with the admin token {token})");
    Ok(guard)
}
