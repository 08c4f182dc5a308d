//! Connections with a time limit (issue 22): llama-server's `--timeout` (`-to`), a socket read /
//! write timeout. [`TimedListener`] accepts TCP connections as [`TimedIo`], which closes a
//! connection (an I/O error hyper turns into a close) when a read or write it is waiting on makes
//! no progress for the timeout: an idle keep-alive connection, a client that stops sending its
//! headers or body halfway, or one that stops reading the response. A request whose handling
//! (body included) takes longer than the same limit gets 408 from [`crate::router`]'s time-limit
//! layer; a streamed response is bounded by `max_tokens` and keeps writing, so it never idles.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// A TCP listener whose connections time out ([`TimedIo`]).
pub struct TimedListener {
    pub inner: TcpListener,
    pub timeout: Duration,
}

impl axum::serve::Listener for TimedListener {
    type Io = TimedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TimedIo, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => return (TimedIo::new(io, self.timeout), addr),
                // Too many open files and the like: wait a moment instead of spinning (as axum).
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A TCP stream whose pending reads and writes fail with [`io::ErrorKind::TimedOut`] after
/// `timeout` without progress; any progress starts the time again.
pub struct TimedIo {
    io: TcpStream,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl TimedIo {
    fn new(io: TcpStream, timeout: Duration) -> TimedIo {
        TimedIo { io, timeout, deadline: Box::pin(tokio::time::sleep(timeout)) }
    }

    /// Progress: the time starts again.
    fn progress(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.timeout);
    }

    /// Waiting: an error once the time is up.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "connection timed out"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.progress();
                Poll::Ready(r)
            }
            Poll::Pending => self.check(cx),
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.progress();
                Poll::Ready(r)
            }
            Poll::Pending => self.check(cx).map_ok(|()| 0),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
