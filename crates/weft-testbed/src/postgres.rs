//! A real PostgreSQL server for tests: Debian's PostgreSQL 15 (package `postgresql`),
//! `initdb` into a temporary directory, listening only on a unix socket in that directory
//! (no TCP port, so parallel tests never collide), stopped and removed on drop.
//!
//! PostgreSQL refuses to run as root: run as root, the harness runs `initdb`, `pg_ctl` and
//! the client tools as `nobody` (through `runuser`), with the data directory owned by it.
//! Each [`Postgres::database`] is a fresh, empty database on the server, so that one server
//! (a second or two to start) serves many tests.
//!
//! ```no_run
//! let pg = weft_testbed::Postgres::start()?;
//! let url = pg.database("store_test")?; // postgres://postgres@%2Ftmp%2F...%2Fsock/store_test
//! # Ok::<(), weft_testbed::TestbedError>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::TestbedError;

/// Where Debian's PostgreSQL 15 keeps its server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The unprivileged user the server runs as when the tests run as root.
const RUN_AS: &str = "nobody";

/// A running PostgreSQL server, private to its owner; stopped (immediately) and its
/// directory removed on drop.
#[derive(Debug)]
pub struct Postgres {
    dir: tempfile::TempDir,
    /// Run the tools as [`RUN_AS`] (we are root).
    as_nobody: bool,
}

impl Postgres {
    /// Whether PostgreSQL's server binaries are installed: `Err` says what is missing.
    pub fn available() -> Result<(), String> {
        for tool in ["initdb", "pg_ctl", "postgres"] {
            let p = Path::new(PG_BIN).join(tool);
            if !p.exists() {
                return Err(format!(
                    "{} is missing (install Debian's `postgresql` package, PostgreSQL 15)",
                    p.display()
                ));
            }
        }
        Ok(())
    }

    /// Creates a cluster in a temporary directory and starts it on a unix socket there;
    /// returns once it accepts connections (`pg_ctl -w`, bounded by `-t 30`).
    pub fn start() -> Result<Postgres, TestbedError> {
        Self::start_with(false)
    }

    /// [`Postgres::start`], writing durably as a production server does (`fsync` and
    /// `full_page_writes` on), with `synchronous_commit` off: a commit survives a crash of
    /// the process, not of the machine, as SQLite's WAL with `synchronous=NORMAL`. For
    /// benchmarks that compare the two stores.
    pub fn start_durable() -> Result<Postgres, TestbedError> {
        Self::start_with(true)
    }

    fn start_with(durable: bool) -> Result<Postgres, TestbedError> {
        Self::available().map_err(TestbedError::Missing)?;
        let dir = tempfile::Builder::new()
            .prefix("weft-pg-")
            .tempdir()
            .map_err(|e| io("creating the PostgreSQL directory", e))?;
        let as_nobody = nix::unistd::geteuid().is_root();
        let pg = Postgres { dir, as_nobody };
        if as_nobody {
            use std::os::unix::fs::PermissionsExt;
            // `nobody` must reach its data and socket directories below ours.
            std::fs::set_permissions(pg.dir.path(), std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io("opening the PostgreSQL directory to nobody", e))?;
        }
        for d in [pg.data(), pg.socket_dir()] {
            std::fs::create_dir(&d).map_err(|e| io(&format!("creating {}", d.display()), e))?;
            if as_nobody {
                let user = nix::unistd::User::from_name(RUN_AS)
                    .ok()
                    .flatten()
                    .ok_or_else(|| TestbedError::Missing(format!("the user {RUN_AS}")))?;
                nix::unistd::chown(&d, Some(user.uid), Some(user.gid)).map_err(|e| {
                    io(
                        &format!("giving {} to {RUN_AS}", d.display()),
                        std::io::Error::from(e),
                    )
                })?;
            }
        }
        let data = pg.data().display().to_string();
        pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        let log = pg.dir.path().join("server.log").display().to_string();
        let writes = if durable { "on" } else { "off" };
        let opts = format!(
            "-c listen_addresses='' -k {} -c fsync={writes} -c synchronous_commit=off -c full_page_writes={writes}",
            pg.socket_dir().display()
        );
        if pg.as_nobody {
            // The log file is written by the server's user.
            std::fs::write(&log, "").map_err(|e| io("creating the server log", e))?;
            pg.run_plain("chown", &[RUN_AS, &log])?;
        }
        pg.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &opts, "-w", "-t", "30", "start",
            ],
        )
        .map_err(|e| match e {
            TestbedError::ProcessFailed {
                program,
                status,
                stdout,
                stderr,
            } => TestbedError::ProcessFailed {
                program,
                status,
                stdout,
                stderr: format!(
                    "{stderr}; server log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            },
            other => other,
        })?;
        Ok(pg)
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of the server's unix socket (its `host` in a connection string).
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// A URL for `database` (as superuser `postgres`) on this server.
    pub fn url(&self, database: &str) -> String {
        let host: String = self
            .socket_dir()
            .display()
            .to_string()
            .replace('%', "%25")
            .replace('/', "%2F");
        format!("postgres://postgres@{host}/{database}")
    }

    /// Creates the empty database `name` and answers its URL.
    pub fn database(&self, name: &str) -> Result<String, TestbedError> {
        self.psql(&format!("CREATE DATABASE \"{name}\""))?;
        Ok(self.url(name))
    }

    /// Runs `sql` with `psql` on the `postgres` database; its output (unaligned, no headers).
    pub fn psql(&self, sql: &str) -> Result<String, TestbedError> {
        let host = self.socket_dir().display().to_string();
        self.run_in(
            &Path::new(PG_BIN).join("psql").display().to_string(),
            &[
                "-h",
                &host,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-qAt",
                "-c",
                sql,
            ],
        )
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<String, TestbedError> {
        self.run_in(&Path::new(PG_BIN).join(tool).display().to_string(), args)
    }

    fn run_in(&self, program: &str, args: &[&str]) -> Result<String, TestbedError> {
        let mut cmd = if self.as_nobody {
            let mut c = Command::new("runuser");
            c.args(["-u", RUN_AS, "--", program]);
            c
        } else {
            Command::new(program)
        };
        // `nobody` cannot read the caller's working directory (often /root).
        cmd.args(args).current_dir(self.dir.path());
        output(cmd, program, args)
    }

    fn run_plain(&self, program: &str, args: &[&str]) -> Result<String, TestbedError> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        output(cmd, program, args)
    }
}

fn output(mut cmd: Command, program: &str, args: &[&str]) -> Result<String, TestbedError> {
    let out = cmd
        .output()
        .map_err(|e| io(&format!("running {program}"), e))?;
    if !out.status.success() {
        return Err(TestbedError::ProcessFailed {
            program: format!("{program} {}", args.join(" ")),
            status: out.status.to_string(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn io(context: &str, source: std::io::Error) -> TestbedError {
    TestbedError::Io {
        context: context.to_string(),
        source,
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        // Immediate: the tests' databases are thrown away with the directory.
        let _ = self.run(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "-t", "30", "stop"],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_on_its_own_socket_serves_fresh_databases_and_stops_on_drop() {
        if let Err(why) = Postgres::available() {
            weft_netns::require::skip("PostgreSQL harness", &why);
            return;
        }
        let pg = Postgres::start().expect("start PostgreSQL");
        let url = pg.database("harness_probe").expect("create a database");
        assert!(url.ends_with("/harness_probe"), "{url}");
        assert!(url.contains("%2Fsock"), "{url}");
        let names = pg
            .psql("SELECT datname FROM pg_database ORDER BY datname")
            .expect("list databases");
        assert!(names.lines().any(|l| l == "harness_probe"), "{names}");
        let sock = pg.socket_dir().join(".s.PGSQL.5432");
        assert!(sock.exists(), "no socket at {}", sock.display());
        let dir = pg.dir.path().to_path_buf();
        drop(pg);
        assert!(!sock.exists(), "the server still listens after drop");
        assert!(!dir.exists(), "{} was not removed", dir.display());
    }
}
