//! The unified dialect's Control API over HTTP (`POST /v1/control/<method>`, protobuf bodies).
use super::*;

pub(super) struct HttpTransport {
    pub(super) address: String,
    pub(super) tunnel: Option<Tunnel>,
    pub(super) tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    pub(super) idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl HttpTransport {
    pub(super) async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &'static str,
        request: &Req,
    ) -> Result<Resp, ControlError> {
        let body = Bytes::from(request.encode_to_vec());
        match tokio::time::timeout(CALL_TIMEOUT, self.call_inner(method, body)).await {
            Ok(r) => r,
            Err(_) => Err(ControlError::Connect {
                address: self.address.clone(),
                detail: format!("{method} timed out after {} s", CALL_TIMEOUT.as_secs()),
            }),
        }
    }

    pub(super) async fn call_inner<Resp: Message + Default>(
        &self,
        method: &'static str,
        body: Bytes,
    ) -> Result<Resp, ControlError> {
        // A pooled keep-alive connection the server closed meanwhile fails at once: retry the
        // call on a fresh connection then.
        let pooled = self.take_idle();
        let fresh = pooled.is_none();
        let mut sender = match pooled {
            Some(s) => s,
            None => self.open().await?,
        };
        let response = match sender
            .send_request(self.request(method, body.clone())?)
            .await
        {
            Ok(r) => r,
            Err(_) if !fresh => {
                sender = self.open().await?;
                sender
                    .send_request(self.request(method, body)?)
                    .await
                    .map_err(|e| self.connect_error(&e))?
            }
            Err(e) => return Err(self.connect_error(&e)),
        };
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| ControlError::Protocol {
                method,
                address: self.address.clone(),
                detail: e.to_string(),
            })?
            .to_bytes();
        if !sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sender);
        }
        if status.is_success() {
            return Resp::decode(bytes).map_err(|e| ControlError::Protocol {
                method,
                address: self.address.clone(),
                detail: e.to_string(),
            });
        }
        Err(http_error(method, self.address.clone(), status, &bytes))
    }

    pub(super) fn request(
        &self,
        method: &str,
        body: Bytes,
    ) -> Result<http::Request<Full<Bytes>>, ControlError> {
        http::Request::post(format!("/v1/control/{method}"))
            .header(http::header::HOST, &self.address)
            .header(http::header::CONTENT_TYPE, "application/protobuf")
            .header(http::header::ACCEPT, "application/protobuf")
            .body(Full::new(body))
            .map_err(|e| ControlError::Tls(format!("request: {e}")))
    }

    pub(super) fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    pub(super) async fn open(&self) -> Result<SendRequest<Full<Bytes>>, ControlError> {
        let io = dial_via(self.tunnel.as_ref(), &self.address, &self.tls)
            .await
            .map_err(|e| self.connect_error(&e))?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| self.connect_error(&e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    pub(super) fn connect_error(&self, e: &(dyn std::error::Error + 'static)) -> ControlError {
        ControlError::Connect {
            address: self.address.clone(),
            detail: flower_addon_runtime::tls::error_chain(e),
        }
    }
}

/// Flower's JSON error body: `{"code": 23, "detail": "Public key already in use."}`.
pub(super) fn http_error(
    method: &'static str,
    address: String,
    status: http::StatusCode,
    body: &[u8],
) -> ControlError {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let code = json
        .as_ref()
        .and_then(|j| j.get("code"))
        .and_then(serde_json::Value::as_u64);
    let detail = json
        .as_ref()
        .and_then(|j| j.get("detail"))
        .map(|d| d.as_str().map_or_else(|| d.to_string(), str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned());
    // ApiErrorCode.PUBLIC_KEY_ALREADY_IN_USE = 23, NODE_NOT_FOUND = 24 (flwr/supercore/error).
    let kind = match (code, status.as_u16()) {
        (Some(23), _) => Refusal::AlreadyExists,
        (Some(24), _) | (None, 404) => Refusal::NotFound,
        (_, 500) => Refusal::Internal,
        _ => Refusal::Other,
    };
    ControlError::Refused {
        method,
        address,
        kind,
        detail: format!("HTTP {}: {detail}", status.as_u16()),
    }
}
