//! Bounds on what one connection sends and takes: a request body's size and pace
//! ([`LimitedBody`]), and a client that stops taking its response ([`StallGuard`]).
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::StatusCode;
use hyper::body::{Body, Frame, SizeHint};
use prost::bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the front cut a request body off before passing all of it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyCut {
    /// It grew past the limit.
    #[error("the request body is larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// No byte of it came for the stall timeout.
    #[error("no byte of the request body came for {0:?}")]
    Stalled(Duration),
    /// It was not complete within the body timeout.
    #[error("the request body was not complete within {0:?}")]
    TooSlow(Duration),
}

impl BodyCut {
    /// The status the client is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Stalled(_) | Self::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }
}

/// A request body on its way to the SuperLink that ends in an error — which aborts the upstream
/// request — as soon as it passes `max` bytes (before the frame that would pass it goes on), goes
/// `stall` without a byte, or is not complete `total` after it was first read. The cut is also
/// recorded in the shared cell, so the caller can answer the client with its reason.
pub(super) struct LimitedBody<B> {
    inner: B,
    received: u64,
    max: u64,
    stall: Duration,
    total: Duration,
    /// Both clocks start at the first read: the time the front spends reaching the SuperLink
    /// is not the client's.
    clocks: Option<Clocks>,
    cut: Arc<OnceLock<BodyCut>>,
}

struct Clocks {
    stall: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
}

impl<B> LimitedBody<B> {
    pub(super) fn new(
        inner: B,
        max: u64,
        stall: Duration,
        total: Duration,
        cut: Arc<OnceLock<BodyCut>>,
    ) -> Self {
        Self {
            inner,
            received: 0,
            max,
            stall,
            total,
            clocks: None,
            cut,
        }
    }

    fn fail(&mut self, cut: BodyCut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let _ = self.cut.set(cut);
        Poll::Ready(Some(Err(Box::new(cut))))
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(cut) = this.cut.get() {
            return Poll::Ready(Some(Err(Box::new(*cut))));
        }
        let (stall, total) = (this.stall, this.total);
        let clocks = this.clocks.get_or_insert_with(|| {
            let now = Instant::now();
            Clocks {
                stall: Box::pin(tokio::time::sleep_until(now + stall)),
                deadline: Box::pin(tokio::time::sleep_until(now + total)),
            }
        });
        // Checked first, so a body that always has a frame ready is bounded too.
        if clocks.deadline.is_elapsed() {
            return this.fail(BodyCut::TooSlow(total));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received = this.received.saturating_add(data.len() as u64);
                    if this.received > this.max {
                        return this.fail(BodyCut::TooLarge { max: this.max });
                    }
                    clocks.stall.as_mut().reset(Instant::now() + stall);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if clocks.deadline.as_mut().poll(cx).is_ready() {
                    return this.fail(BodyCut::TooSlow(total));
                }
                if clocks.stall.as_mut().poll(cx).is_ready() {
                    return this.fail(BodyCut::Stalled(stall));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client connection whose writes fail once the client has taken no byte for `stall`: a client
/// that stops reading its response would otherwise hold its connection, and the one to the
/// SuperLink behind it, for ever.
pub(super) struct StallGuard<S> {
    inner: S,
    stall: Duration,
    /// Running while a write waits for the client.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    pub(super) fn new(inner: S, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            blocked: None,
        }
    }

    /// Passes a ready write result on, or starts/checks the stall clock for a pending one.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.blocked = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let stall = self.stall;
                let clock = self
                    .blocked
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                ready!(clock.as_mut().poll(cx));
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the client took no byte of its response for {stall:?}"),
                )))
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::io::AsyncWriteExt;
    use tokio::sync::mpsc;

    type Sent = Result<Frame<Bytes>, std::convert::Infallible>;

    /// A body fed by hand, limited as the front limits one.
    fn limited(
        max: u64,
        stall: Duration,
        total: Duration,
    ) -> (
        mpsc::UnboundedSender<Sent>,
        LimitedBody<impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin>,
        Arc<OnceLock<BodyCut>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel::<Sent>();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        let cut = Arc::new(OnceLock::new());
        let body = LimitedBody::new(StreamBody::new(stream), max, stall, total, cut.clone());
        (tx, body, cut)
    }

    fn data(n: usize) -> Sent {
        Ok(Frame::data(Bytes::from(vec![b'x'; n])))
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_body_within_the_limit_passes_whole() {
        // Exactly max bytes is allowed.
        let (tx, body, cut) = limited(10, LONG, LONG);
        tx.send(data(4)).unwrap();
        tx.send(data(6)).unwrap();
        drop(tx);
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 10);
        assert_eq!(cut.get(), None);
    }

    #[tokio::test]
    async fn the_frame_that_passes_the_limit_is_not_passed_on() {
        // What goes upstream never exceeds max: the offending frame becomes the error.
        let (tx, mut body, cut) = limited(10, LONG, LONG);
        tx.send(data(8)).unwrap();
        tx.send(data(3)).unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().map(Bytes::len), Some(8));
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(cut.get(), Some(&BodyCut::TooLarge { max: 10 }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_cut_after_the_stall_timeout() {
        // A body that stops sending is cut off stall after its last byte.
        let (tx, mut body, cut) = limited(100, Duration::from_secs(5), LONG);
        tx.send(data(1)).unwrap();
        let started = Instant::now();
        body.frame().await.unwrap().unwrap();
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(cut.get(), Some(&BodyCut::Stalled(Duration::from_secs(5))));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_at_the_body_timeout() {
        // A byte every second never stalls, but the whole body has `total` only.
        let (tx, mut body, cut) = limited(1_000, Duration::from_secs(5), Duration::from_secs(10));
        let feeder = tokio::spawn(async move {
            while tx.send(data(1)).is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        let mut frames = 0;
        while let Some(Ok(_)) = body.frame().await {
            frames += 1;
        }
        assert_eq!(cut.get(), Some(&BodyCut::TooSlow(Duration::from_secs(10))));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(frames, 10);
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_fails_the_writes_after_the_stall() {
        // Writes into a full pipe fail once the reader took nothing for the stall timeout;
        // a reader that keeps up never trips it.
        let (near, far) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(near, Duration::from_secs(3));
        guarded.write_all(&[0; 16]).await.unwrap();
        let started = Instant::now();
        let error = guarded.write_all(&[0; 16]).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        drop(far);
    }
}
