//! Child processes with a deadline. `Command::output` waits for ever: a child that hangs
//! holds its test, and the whole suite, until CI gives up on it with nothing said. A child
//! run through [`OutputWithin::output_within`] that is still running at its deadline is
//! killed, and the test fails there with what the child had written.

use std::{
    io::Read,
    process::{Child, Command, Output, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// A deadline for a child the suites run: minutes more than any takes on two loaded cores,
/// far less than CI waits for the whole suite.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(300);

/// How often a running child is looked at.
const POLL: Duration = Duration::from_millis(10);

/// `Command::output` with a deadline.
pub trait OutputWithin {
    /// Runs the command to its end with its stdout and stderr captured, as `output` does;
    /// a child still running after `within` is killed, and the error (`TimedOut`) says so
    /// with the command and what it had written.
    fn output_within(&mut self, within: Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, within: Duration) -> std::io::Result<Output> {
        let mut child = self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        // Read while it runs: a child whose pipe is full would otherwise never end.
        let stdout = Drained::start(child.stdout.take());
        let stderr = Drained::start(child.stderr.take());
        match wait_until(&mut child, Instant::now() + within)? {
            Some(status) => Ok(Output { status, stdout: stdout.join(), stderr: stderr.join() }),
            // Not joined: a process the child started may still hold its pipes open.
            None => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{self:?} was still running after {within:?} and was killed; it wrote:\n{}{}",
                    String::from_utf8_lossy(&stdout.so_far()),
                    String::from_utf8_lossy(&stderr.so_far())
                ),
            )),
        }
    }
}

/// The child's exit status, or `None` once it was killed at `deadline`.
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<std::process::ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// A pipe read to its end on a thread of its own.
struct Drained {
    bytes: Arc<Mutex<Vec<u8>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Drained {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Drained {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let into = bytes.clone();
        let thread = std::thread::spawn(move || {
            let Some(mut pipe) = pipe else { return };
            let mut chunk = [0u8; 8192];
            // A read that fails ends it: what came before is kept for the test's message.
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                into.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(&chunk[..n]);
            }
        });
        Drained { bytes, thread }
    }

    /// Everything, once the pipe is closed.
    fn join(self) -> Vec<u8> {
        let Drained { bytes, thread } = self;
        let _ = thread.join();
        std::mem::take(&mut *bytes.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ends_in_time_gives_its_output_and_one_that_hangs_is_killed() {
        let out = Command::new("sh")
            .args(["-c", "echo said; echo told >&2; exit 3"])
            .output_within(Duration::from_secs(30));
        let out = out.expect("sh ran");
        assert_eq!(
            (out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()),
            (Some(3), &b"said\n"[..], &b"told\n"[..])
        );
        let began = Instant::now();
        let hung = Command::new("sh")
            .args(["-c", "echo waiting; exec sleep 600"])
            .output_within(Duration::from_millis(300));
        let e = hung.expect_err("killed at its deadline");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("waiting"), "{e}");
        assert!(began.elapsed() < Duration::from_secs(60), "{:?}", began.elapsed());
    }
}
