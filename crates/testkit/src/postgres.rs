//! A private PostgreSQL server for tests: `initdb` into a temporary directory, started on a
//! free loopback port, stopped (immediately) when the guard drops. Starting one takes well
//! under a second, so each test that needs a database starts its own and nothing outlives it.
//!
//! `DURAFIBER_PG_URL` points the tests at a server that is already running instead; each
//! test still gets a fresh database of its own there. A missing PostgreSQL installation is
//! an error, never a skip: `scripts/test.sh` installs Debian's `postgresql-15`.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

/// A running PostgreSQL server that tests can create databases on.
pub struct PgServer {
    bin: PathBuf,
    /// `postgres://user@host:port`, without a database.
    base: String,
    /// The private cluster, when this guard started one.
    cluster: Option<Cluster>,
}

struct Cluster {
    dir: tempfile::TempDir,
    as_postgres: bool,
    /// The server's options (its port among them), for a start after a stop.
    options: String,
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

/// Why a private PostgreSQL server could not be had or driven.
#[derive(Debug, thiserror::Error)]
pub enum PgServerError {
    /// No PostgreSQL is installed.
    #[error("PostgreSQL is not installed (/usr/lib/postgresql: {0}); scripts/test.sh installs postgresql-15")]
    NotInstalled(#[source] std::io::Error),
    /// PostgreSQL is installed without its server programs.
    #[error("no initdb under /usr/lib/postgresql/*/bin")]
    NoInitdb,
    /// `DURAFIBER_PG_URL` names no PostgreSQL server.
    #[error("DURAFIBER_PG_URL is not a postgres:// URL: {0}")]
    BadUrl(String),
    /// The machine gave no temporary directory or free port.
    #[error("{what}: {source}")]
    Machine {
        /// What was asked for.
        what: &'static str,
        /// What the system said.
        source: std::io::Error,
    },
    /// A program did not run, or failed.
    #[error("{command}: {output}")]
    Failed {
        /// The command line.
        command: String,
        /// What it said, or why it did not run.
        output: String,
    },
    /// The server did not start in any of its tries.
    #[error("PostgreSQL did not start, {tries} tries: {failures}\nits log:\n{log}")]
    NotStarted {
        /// Tries made.
        tries: usize,
        /// Each try's failure.
        failures: String,
        /// The server's log.
        log: String,
    },
    /// A stop or a restart of a server the test kit did not start (`DURAFIBER_PG_URL`).
    #[error("not a server the test kit started")]
    NotOurs,
}

/// The directory of the newest installed PostgreSQL's programs.
fn bin_dir() -> Result<PathBuf, PgServerError> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(PgServerError::NotInstalled)?
        .filter_map(Result::ok)
        .filter_map(|d| Some((d.file_name().to_str()?.parse().ok()?, d.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or(PgServerError::NoInitdb)
}

/// How long a start waits for the server, seconds: on a loaded machine (the suite under
/// `scripts/stress-tests.sh`) a server has taken over 30 s to begin.
const START_WAIT_S: &str = "120";

fn free_port() -> Result<u16, PgServerError> {
    let no_port = |source| PgServerError::Machine { what: "no free port", source };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(no_port)?;
    listener.local_addr().map(|a| a.port()).map_err(no_port)
}

/// Runs `program` (as the `postgres` user when `as_postgres`: PostgreSQL refuses root).
fn run(as_postgres: bool, program: &Path, args: &[&str]) -> Result<String, PgServerError> {
    let mut cmd = if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let command = || format!("{} {}", program.display(), args.join(" "));
    let out = cmd
        .args(args)
        .output()
        .map_err(|e| PgServerError::Failed { command: command(), output: e.to_string() })?;
    if !out.status.success() {
        let output =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        return Err(PgServerError::Failed { command: command(), output });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl PgServer {
    /// The server of `DURAFIBER_PG_URL`, or a private one started now.
    pub fn start() -> Result<PgServer, PgServerError> {
        let bin = bin_dir()?;
        if let Ok(url) = std::env::var("DURAFIBER_PG_URL") {
            let base = url.split('?').next().unwrap_or(&url);
            let base = match base.strip_prefix("postgres://").or_else(|| base.strip_prefix("postgresql://")) {
                Some(rest) => format!("postgres://{}", rest.split('/').next().unwrap_or(rest)),
                None => return Err(PgServerError::BadUrl(url)),
            };
            return Ok(PgServer { bin, base, cluster: None });
        }
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("durafiber-pg-")
            .tempdir()
            .map_err(|source| PgServerError::Machine { what: "no temporary directory", source })?;
        if as_postgres {
            run(false, Path::new("chown"), &["postgres", &dir.path().display().to_string()])?;
        }
        let data = dir.path().join("data");
        let data_s = data.display().to_string();
        run(
            as_postgres,
            &bin.join("initdb"),
            &["-D", &data_s, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        )?;
        let log = dir.path().join("log").display().to_string();
        let sockets = dir.path().display().to_string();
        // A port found free can be taken before the server binds it: try a few. A start
        // that failed can still leave its server starting (pg_ctl gave up on it, or a
        // second one raced it for the directory): it is stopped before the next try, which
        // would otherwise find the directory locked.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port()?;
            let options =
                format!("-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c max_connections=200");
            match run(
                as_postgres,
                &bin.join("pg_ctl"),
                &["-D", &data_s, "-l", &log, "-w", "-t", START_WAIT_S, "-o", &options, "start"],
            ) {
                Ok(_) => {
                    let base = format!("postgres://postgres@127.0.0.1:{port}");
                    let cluster = Cluster { dir, as_postgres, options };
                    return Ok(PgServer { bin, base, cluster: Some(cluster) });
                }
                Err(e) => {
                    failures.push(e.to_string());
                    let _ = stop_immediately_in(as_postgres, &bin, &data_s);
                }
            }
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        Err(PgServerError::NotStarted { tries: failures.len(), failures: failures.join("\n"), log })
    }

    /// A new, empty database on the server; its URL.
    pub fn fresh_database(&self) -> Result<String, PgServerError> {
        let name = format!("durafiber_{}_{}", std::process::id(), DATABASES.fetch_add(1, Ordering::Relaxed));
        let admin = format!("{}/postgres", self.base);
        run(false, &self.bin.join("psql"), &["-q", "-d", &admin, "-c", &format!("CREATE DATABASE {name}")])?;
        Ok(format!("{}/{name}", self.base))
    }

    /// Stops the private server as a crash would (`-m immediate`: every session is cut, no
    /// checkpoint); [`PgServer::start_again`] brings it back. An error for a server the test
    /// kit did not start (`DURAFIBER_PG_URL`).
    pub fn stop_immediately(&self) -> Result<(), PgServerError> {
        let c = self.cluster.as_ref().ok_or(PgServerError::NotOurs)?;
        stop_immediately_in(c.as_postgres, &self.bin, &c.dir.path().join("data").display().to_string())
    }

    /// Starts the private server again on its port after [`PgServer::stop_immediately`]
    /// (it recovers from its log); returns once it accepts connections.
    pub fn start_again(&self) -> Result<(), PgServerError> {
        let c = self.cluster.as_ref().ok_or(PgServerError::NotOurs)?;
        let data = c.dir.path().join("data").display().to_string();
        let log = c.dir.path().join("log").display().to_string();
        let args = ["-D", &data, "-l", &log, "-w", "-t", START_WAIT_S, "-o", &c.options, "start"];
        run(c.as_postgres, &self.bin.join("pg_ctl"), &args).map(drop)
    }

    /// Runs one SQL statement on the database at `url`; its output, unaligned.
    pub fn sql(&self, url: &str, statement: &str) -> Result<String, PgServerError> {
        run(false, &self.bin.join("psql"), &["-q", "-At", "-d", url, "-c", statement])
    }
}

/// Stops the server of data directory `data`, if one runs there, as a crash would.
fn stop_immediately_in(as_postgres: bool, bin: &Path, data: &str) -> Result<(), PgServerError> {
    run(as_postgres, &bin.join("pg_ctl"), &["-D", data, "-m", "immediate", "-w", "stop"]).map(drop)
}

fn is_root() -> bool {
    // `id -u` keeps the test kit free of a libc binding for one call.
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(c) = &self.cluster {
            let data = c.dir.path().join("data").display().to_string();
            if let Err(e) = stop_immediately_in(c.as_postgres, &self.bin, &data) {
                eprintln!("could not stop the test's PostgreSQL: {e}");
            }
        }
    }
}
