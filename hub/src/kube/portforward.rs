//! One port-forward through the API server, for every caller: the hub's Control client
//! ([`crate::kube::control`]), the outputs client (`run fetch`, the hub's listing) and `flower-hub
//! connect`. The stream keeps its forwarder (the WebSocket) open while it is in use.
use k8s_openapi::api::core::v1::Pod;

/// Why a port-forward did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The API server refused or failed it (a 403 names the missing `pods/portforward` right).
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// It opened without a stream for the port.
    #[error("the port-forward has no stream")]
    NoStream,
}

/// A stream to `port` of pod `namespace/pod`, with `client`'s credentials (`get` and `create`
/// on `pods/portforward` in `namespace`).
pub async fn open(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
) -> Result<Forwarded, OpenError> {
    let pods = kube::Api::<Pod>::namespaced(client.clone(), namespace);
    let mut forwarder = pods.portforward(pod, &[port]).await?;
    let stream = forwarder.take_stream(port).ok_or(OpenError::NoStream)?;
    Ok(Forwarded {
        stream: Box::pin(stream),
        _forwarder: forwarder,
    })
}

/// A port-forwarded stream that keeps its forwarder open while it is in use.
pub struct Forwarded {
    stream: std::pin::Pin<Box<dyn Stream>>,
    _forwarder: kube::api::Portforwarder,
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send> Stream for T {}

impl tokio::io::AsyncRead for Forwarded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.stream.as_mut().poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Forwarded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.stream.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.stream.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.stream.as_mut().poll_shutdown(cx)
    }
}
