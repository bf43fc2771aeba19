//! Request heads too large for the HTTP parser are refused as JSON, like every other refusal.
//!
//! hyper answers a request line over 64 KiB or a head past its buffer with its own 414 or 431
//! and no body, before any middleware sees the request. This wrapper of a connection counts
//! the bytes of each request head as they are read (a head begins the connection and follows
//! each response hyper writes); past [`HEAD_BYTES_MAX`] it writes the API's JSON refusal
//! itself and ends the connection, so hyper never reaches its own. Heads within the limit pass
//! untouched, and `guard::size_limits` refuses the ones above the API's own, smaller limits.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes of one request head (request line and headers) read before refusing it: above
/// the API's own limits on the target and the headers, below hyper's.
pub const HEAD_BYTES_MAX: usize = 48 * 1024;

/// Where the connection is.
#[derive(Debug)]
enum Phase {
    /// Reading a request head: its bytes so far, the last three, whether its line ended.
    Head { bytes: usize, tail: [u8; 3], line_ended: bool },
    /// The head is complete: a body, or the wait for the response.
    Past,
    /// Refused: the JSON answer, and how much of it is written.
    Refusing { answer: Vec<u8>, written: usize },
    /// The refusal is written: the connection ends.
    Done,
}

/// A connection whose request heads are counted (see the module's doc).
pub struct HeadGuard<S> {
    inner: S,
    phase: Phase,
}

impl<S> HeadGuard<S> {
    /// Guards `inner` from its first byte, which begins a request head.
    pub fn new(inner: S) -> Self {
        HeadGuard { inner, phase: Phase::Head { bytes: 0, tail: [0; 3], line_ended: false } }
    }
}

/// The API's JSON refusal of a head too large, as a whole HTTP response.
fn refusal(line_ended: bool) -> Vec<u8> {
    let (status, kind, what) = if line_ended {
        ("431 Request Header Fields Too Large", "HeadersTooLarge", "the request headers are")
    } else {
        ("414 URI Too Long", "UriTooLong", "the request line is")
    };
    let body =
        serde_json::json!({"error": format!("{what} over {HEAD_BYTES_MAX} bytes"), "kind": kind}).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl<S: AsyncRead + AsyncWrite + Unpin> HeadGuard<S> {
    /// Writes what is left of a refusal; ready once all of it is written (or the peer left).
    fn poll_refusal(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while let Phase::Refusing { answer, written } = &mut self.phase {
            if *written >= answer.len() {
                self.phase = Phase::Done;
                break;
            }
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &answer[*written..])) {
                Ok(0) | Err(_) => self.phase = Phase::Done,
                Ok(n) => *written += n,
            }
        }
        let _ = Pin::new(&mut self.inner).poll_flush(cx);
        Poll::Ready(())
    }

    /// Counts `read` into the head being read.
    fn observe(&mut self, read: &[u8]) {
        let Phase::Head { bytes, tail, line_ended } = &mut self.phase else { return };
        let mut window = tail.to_vec();
        window.extend_from_slice(read);
        // The request line ends within the limit: a head too large is its headers' fault.
        // (The window starts three bytes before what was just read.)
        if let Some(at) = window.windows(2).position(|w| w == b"\r\n")
            && (*bytes + at).saturating_sub(3) <= HEAD_BYTES_MAX
        {
            *line_ended = true;
        }
        if window.windows(4).any(|w| w == b"\r\n\r\n") {
            self.phase = Phase::Past;
            return;
        }
        *bytes = bytes.saturating_add(read.len());
        // The window is the three bytes kept and what was read: never shorter than three.
        tail.copy_from_slice(&window[window.len() - 3..]);
        if *bytes > HEAD_BYTES_MAX {
            tracing::debug!(bytes = *bytes, "a request head over the limit; refused as JSON");
            self.phase = Phase::Refusing { answer: refusal(*line_ended), written: 0 };
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if matches!(this.phase, Phase::Refusing { .. } | Phase::Done) {
            // The parser sees the connection end; the refusal goes out first.
            ready!(this.poll_refusal(cx));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = buf.filled()[before..].to_vec();
        this.observe(&read);
        if matches!(this.phase, Phase::Refusing { .. }) {
            // None of it reaches the parser: it would answer with its own refusal.
            buf.set_filled(before);
            ready!(this.poll_refusal(cx));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for HeadGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if matches!(this.phase, Phase::Refusing { .. } | Phase::Done) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "refused")));
        }
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, data))?;
        // A final response is going out: the next bytes read begin the next request's head.
        // An informational one (`100 Continue`) is answered with the body of the same request.
        let informational = data.starts_with(b"HTTP/1.1 1") || data.starts_with(b"HTTP/1.0 1");
        if written > 0 && !informational && matches!(this.phase, Phase::Past) {
            this.phase = Phase::Head { bytes: 0, tail: [0; 3], line_ended: false };
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn a_head_past_the_limit_is_answered_as_json_and_ends_the_connection() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let mut guarded = HeadGuard::new(server);
        let (mut reader, mut writer) = tokio::io::split(client);
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(HEAD_BYTES_MAX + 10));
        writer.write_all(long.as_bytes()).await.expect("send");
        let mut seen = vec![0u8; 1 << 16];
        // What the parser reads: the connection's end, with nothing of the long line.
        let mut total = 0;
        loop {
            let n = guarded.read(&mut seen).await.expect("read");
            if n == 0 {
                break;
            }
            total += n;
        }
        assert!(total <= HEAD_BYTES_MAX, "{total} bytes reached the parser");
        drop(guarded);
        let mut answer = String::new();
        reader.read_to_string(&mut answer).await.expect("answer");
        assert!(answer.starts_with("HTTP/1.1 414"), "{answer}");
        assert!(answer.contains(r#""kind":"UriTooLong""#), "{answer}");
    }

    #[tokio::test]
    async fn a_large_body_after_100_continue_is_no_head() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let mut guarded = HeadGuard::new(server);
        let (_reader, mut writer) = tokio::io::split(client);
        let head = "POST /runs HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 200000\r\n\r\n";
        writer.write_all(head.as_bytes()).await.expect("send");
        let mut seen = vec![0u8; head.len()];
        guarded.read_exact(&mut seen).await.expect("read the head");
        guarded.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.expect("continue");
        let body = vec![b'x'; 200_000];
        writer.write_all(&body).await.expect("send the body");
        let mut read = vec![0u8; body.len()];
        guarded.read_exact(&mut read).await.expect("the whole body reaches the parser");
        assert_eq!(read, body);
    }

    #[tokio::test]
    async fn heads_within_the_limit_pass_untouched_one_after_another() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut guarded = HeadGuard::new(server);
        let (_reader, mut writer) = tokio::io::split(client);
        let head = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "b".repeat(1000));
        writer.write_all(head.as_bytes()).await.expect("send");
        let mut seen = vec![0u8; head.len()];
        guarded.read_exact(&mut seen).await.expect("read");
        assert_eq!(seen, head.as_bytes());
        guarded.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.expect("respond");
        writer.write_all(head.as_bytes()).await.expect("send again");
        guarded.read_exact(&mut seen).await.expect("read again");
        assert_eq!(seen, head.as_bytes());
    }
}
