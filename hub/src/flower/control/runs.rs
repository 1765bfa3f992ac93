//! Runs through the Control API: `StartRun` with a FAB and typed run config, `StopRun`, and
//! `StreamLogs` (a gRPC server stream in the classic dialects; in the HTTP ones a response body
//! of frames, each a 4-byte big-endian length and one `StreamLogsResponse`).
use super::*;
use crate::flower::fab::ConfigValue;
use http_body_util::BodyStream;
use std::collections::BTreeMap;

/// Largest log frame accepted from the SuperLink.
const MAX_LOG_FRAME: usize = 4 << 20;

/// Log text the SuperLink streamed, with its timestamp (streaming resumes after it).
#[derive(Clone, Debug, PartialEq)]
pub struct LogChunk {
    /// One or more lines of the run's log.
    pub text: String,
    /// Flower's timestamp of the newest line in `text`.
    pub timestamp: f64,
}

impl ControlClient {
    /// Starts a run of `fab` (its bytes; the SHA-256 is computed here) with `config` as
    /// Flower's `override_config`; the new Flower run id. Not idempotent: callers record that
    /// a submission is under way before calling.
    pub async fn start_run(
        &self,
        fab: &[u8],
        config: &BTreeMap<String, ConfigValue>,
    ) -> Result<u64, ControlError> {
        use sha2::Digest;
        let mut request = flwr::StartRunRequest {
            fab: Some(flwr::Fab {
                hash_str: hex::encode(sha2::Sha256::digest(fab)),
                content: fab.to_vec(),
            }),
            override_config: config.iter().map(|(k, v)| (k.clone(), scalar(v))).collect(),
            app_spec: String::new(),
            federation: String::new(),
        };
        let answer = match self.start_run_once(request.clone()).await {
            // Flower 1.25 has no default for an empty federation: its no-op federation is
            // named `default` (1.30 and later take "" as that).
            Err(ControlError::Refused { detail, .. })
                if detail.contains("Federation '' does not exist") =>
            {
                request.federation = "default".into();
                self.start_run_once(request).await?
            }
            other => other?,
        };
        answer.run_id.ok_or_else(|| ControlError::Protocol {
            method: "StartRun",
            address: self.endpoint.address.clone(),
            detail: format!(
                "no run id in the answer{}",
                answer
                    .note
                    .map(|n| format!(" (note: {n})"))
                    .unwrap_or_default()
            ),
        })
    }

    async fn start_run_once(
        &self,
        request: flwr::StartRunRequest,
    ) -> Result<flwr::StartRunResponse, ControlError> {
        match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("StartRun", c.start_run(request)).await
            }
            Transport::Http(h) => h.call("start-run", &request).await,
        }
    }

    /// Stops a run. A run that is already finished (or unknown) is success: `Ok(false)` then,
    /// `Ok(true)` when this call stopped it.
    pub async fn stop_run(&self, run_id: u64) -> Result<bool, ControlError> {
        let request = flwr::StopRunRequest { run_id };
        let answer: Result<flwr::StopRunResponse, _> = match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("StopRun", c.stop_run(request)).await
            }
            Transport::Http(h) => h.call("stop-run", &request).await,
        };
        match answer {
            Ok(r) => Ok(r.success),
            // "Run ID … is already finished" / not found: nothing left to stop.
            Err(ControlError::Refused { kind, detail, .. })
                if kind == Refusal::NotFound
                    || detail.contains("already finished")
                    || detail.contains("not found") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the log stream of a run, after Flower timestamp `after` (0 for the whole log).
    /// The SuperLink ends the stream once the run finished and its log was sent.
    pub async fn stream_logs(&self, run_id: u64, after: f64) -> Result<LogStream, ControlError> {
        let request = flwr::StreamLogsRequest {
            run_id,
            after_timestamp: after,
        };
        match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                // Only the opening is bounded; the stream lasts as long as the run.
                let stream = self.grpc("StreamLogs", c.stream_logs(request)).await?;
                Ok(LogStream {
                    inner: Inner::Grpc(stream),
                    address: self.endpoint.address.clone(),
                })
            }
            Transport::Http(h) => {
                let body = Bytes::from(request.encode_to_vec());
                let response = tokio::time::timeout(CALL_TIMEOUT, h.open_stream(body))
                    .await
                    .map_err(|_| ControlError::Connect {
                        address: h.address.clone(),
                        detail: format!("StreamLogs timed out after {} s", CALL_TIMEOUT.as_secs()),
                    })??;
                Ok(LogStream {
                    inner: Inner::Http {
                        body: BodyStream::new(response),
                        buffer: Vec::new(),
                    },
                    address: h.address.clone(),
                })
            }
        }
    }
}

fn scalar(v: &ConfigValue) -> flwr::Scalar {
    use flwr::scalar::Scalar as S;
    flwr::Scalar {
        scalar: Some(match v {
            ConfigValue::Bool(b) => S::Bool(*b),
            ConfigValue::Int(i) => S::Sint64(*i),
            ConfigValue::Float(x) => S::Double(*x),
            ConfigValue::Str(s) => S::String(s.clone()),
        }),
    }
}

/// A run-config value as text, the same for what the hub sends and what Flower lists
/// (`3`, `0.5`, `true`, `"text"`), so a submitted run can be recognised in `ListRuns`.
pub fn scalar_text(v: &flwr::Scalar) -> String {
    use flwr::scalar::Scalar as S;
    match &v.scalar {
        Some(S::Bool(b)) => b.to_string(),
        Some(S::Sint64(i)) => i.to_string(),
        Some(S::Uint64(u)) => u.to_string(),
        Some(S::Double(x)) => format!("{x:?}"),
        Some(S::String(s)) => format!("{s:?}"),
        Some(S::Bytes(b)) => format!("bytes:{}", hex::encode(b)),
        None => String::new(),
    }
}

/// [`scalar_text`] of a value the hub sends.
pub fn config_text(v: &ConfigValue) -> String {
    scalar_text(&scalar(v))
}

/// An open log stream; [`LogStream::next`] yields chunks until the SuperLink ends it.
pub struct LogStream {
    inner: Inner,
    address: String,
}

enum Inner {
    Grpc(tonic::Streaming<flwr::StreamLogsResponse>),
    Http {
        body: BodyStream<hyper::body::Incoming>,
        buffer: Vec<u8>,
    },
}

impl LogStream {
    /// The next chunk; `None` when the stream ended (the run finished, or the SuperLink went
    /// away: callers check the run's status and reopen after the last timestamp).
    pub async fn next(&mut self) -> Option<Result<LogChunk, ControlError>> {
        match &mut self.inner {
            Inner::Grpc(stream) => match stream.message().await {
                Ok(Some(m)) => Some(Ok(LogChunk {
                    text: m.log_output,
                    timestamp: m.latest_timestamp,
                })),
                Ok(None) => None,
                Err(status) => Some(Err(grpc_error("StreamLogs", self.address.clone(), &status))),
            },
            Inner::Http { body, buffer } => loop {
                match take_frame(buffer) {
                    Ok(Some(payload)) => {
                        return Some(
                            flwr::StreamLogsResponse::decode(payload.as_slice())
                                .map(|m| LogChunk {
                                    text: m.log_output,
                                    timestamp: m.latest_timestamp,
                                })
                                .map_err(|e| self.protocol(e.to_string())),
                        );
                    }
                    Ok(None) => {}
                    Err(detail) => return Some(Err(self.protocol(detail))),
                }
                use futures::StreamExt;
                match body.next().await {
                    None if buffer.is_empty() => return None,
                    None => {
                        let left = buffer.len();
                        buffer.clear();
                        return Some(Err(self.protocol(format!(
                            "the stream ended inside a frame ({left} bytes left)"
                        ))));
                    }
                    Some(Err(e)) => {
                        return Some(Err(ControlError::Connect {
                            address: self.address.clone(),
                            detail: flower_addon_runtime::tls::error_chain(&e),
                        }));
                    }
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            buffer.extend_from_slice(&data);
                        }
                    }
                }
            },
        }
    }

    fn protocol(&self, detail: String) -> ControlError {
        ControlError::Protocol {
            method: "StreamLogs",
            address: self.address.clone(),
            detail,
        }
    }
}

/// Takes one complete frame (4-byte big-endian length, then the payload) off the front of
/// `buffer`; `None` until one is complete.
pub(super) fn take_frame(buffer: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    let Some(header) = buffer.first_chunk::<4>() else {
        return Ok(None);
    };
    let size = u32::from_be_bytes(*header) as usize;
    if size > MAX_LOG_FRAME {
        return Err(format!(
            "a log frame of {size} bytes is over the {MAX_LOG_FRAME}-byte limit"
        ));
    }
    if buffer.len() < 4 + size {
        return Ok(None);
    }
    let payload = buffer[4..4 + size].to_vec();
    buffer.drain(..4 + size);
    Ok(Some(payload))
}

impl HttpTransport {
    /// POSTs `stream-logs` on a connection of its own and returns the open response body.
    async fn open_stream(&self, body: Bytes) -> Result<hyper::body::Incoming, ControlError> {
        let mut sender = self.open().await?;
        let request = http::Request::post("/v1/control/stream-logs")
            .header(http::header::HOST, &self.address)
            .header(http::header::CONTENT_TYPE, "application/protobuf")
            .header(http::header::ACCEPT, "application/flower-protobuf-stream")
            .header(http::header::ACCEPT_ENCODING, "identity")
            .body(Full::new(body))
            .map_err(|e| ControlError::Tls(format!("request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| self.connect_error(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response.into_body());
        }
        let bytes = Limited::new(response.into_body(), 64 << 10)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(http_error(
            "stream-logs",
            self.address.clone(),
            status,
            &bytes,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_where_their_length_says() {
        let mut buffer = Vec::new();
        assert_eq!(take_frame(&mut buffer), Ok(None));
        buffer.extend_from_slice(&[0, 0, 0, 3, b'a', b'b']);
        assert_eq!(take_frame(&mut buffer), Ok(None), "incomplete payload");
        buffer.extend_from_slice(&[b'c', 0, 0, 0, 0, 0]);
        assert_eq!(take_frame(&mut buffer), Ok(Some(b"abc".to_vec())));
        assert_eq!(take_frame(&mut buffer), Ok(Some(Vec::new())), "empty frame");
        assert_eq!(buffer, vec![0], "a partial header stays");
        let mut huge = vec![0xff, 0xff, 0xff, 0xff];
        assert!(take_frame(&mut huge).unwrap_err().contains("limit"));
    }

    #[test]
    fn run_config_values_keep_flower_types() {
        use flwr::scalar::Scalar as S;
        assert_eq!(scalar(&ConfigValue::Int(3)).scalar, Some(S::Sint64(3)));
        assert_eq!(
            scalar(&ConfigValue::Float(0.5)).scalar,
            Some(S::Double(0.5))
        );
        assert_eq!(scalar(&ConfigValue::Bool(true)).scalar, Some(S::Bool(true)));
        assert_eq!(
            scalar(&ConfigValue::Str("x".into())).scalar,
            Some(S::String("x".into()))
        );
    }
}
