//! One life of a `durafiber serve` process: spawned, listened for, killed.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Instant,
};

use anyhow::Context as _;

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) lines: mpsc::Receiver<String>,
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) log: PathBuf,
    pub(crate) born: Instant,
}

impl Server {
    /// Spawns `serve`, hosting stash version `order_version` of the order agent.
    pub(crate) fn spawn(
        exe: &Path,
        data: &Path,
        config: &Path,
        log: &Path,
        order_version: u32,
    ) -> anyhow::Result<Server> {
        let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(exe)
            .args(["--order-stash-version", &order_version.to_string(), "serve", "--data"])
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok(Server { child, lines, addr: None, log: log.to_path_buf(), born: Instant::now() })
    }

    /// The address, once the server has said it listens.
    pub(crate) fn poll_addr(&mut self) -> Option<SocketAddr> {
        if self.addr.is_none()
            && let Ok(line) = self.lines.try_recv()
        {
            self.addr = line.strip_prefix("listening on ").and_then(|a| a.parse().ok());
        }
        self.addr
    }

    /// Whether the process ended by itself.
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
