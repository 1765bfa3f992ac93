use super::*;

#[test]
fn http_errors_map_to_refusals() {
    let e = http_error(
        "register-node",
        "a:1".into(),
        http::StatusCode::PRECONDITION_FAILED,
        br#"{"code": 23, "detail": "Public key already in use."}"#,
    );
    assert!(matches!(
        e,
        ControlError::Refused {
            kind: Refusal::AlreadyExists,
            ..
        }
    ));
    assert!(
        e.to_string()
            .contains("HTTP 412: Public key already in use."),
        "{e}"
    );
    let e = http_error(
        "unregister-node",
        "a:1".into(),
        http::StatusCode::NOT_FOUND,
        b"x",
    );
    assert!(matches!(
        e,
        ControlError::Refused {
            kind: Refusal::NotFound,
            ..
        }
    ));
    let e = http_error(
        "list-nodes",
        "a:1".into(),
        http::StatusCode::UNAUTHORIZED,
        b"{}",
    );
    assert!(matches!(
        e,
        ControlError::Refused {
            kind: Refusal::Other,
            ..
        }
    ));
    assert!(!e.is_internal());
    // Flower hides every unexpected failure (a full database) behind this answer.
    let e = http_error(
        "register-node",
        "a:1".into(),
        http::StatusCode::INTERNAL_SERVER_ERROR,
        br#"{"detail": "Internal server error"}"#,
    );
    assert!(e.is_internal(), "{e:?}");
    assert!(
        e.to_string().contains("HTTP 500: Internal server error"),
        "{e}"
    );
}

#[test]
fn grpc_errors_map_to_refusals() {
    let s = tonic::Status::failed_precondition("Public key already in use");
    assert!(matches!(
        grpc_error("RegisterNode", "a:1".into(), &s),
        ControlError::Refused {
            kind: Refusal::AlreadyExists,
            ..
        }
    ));
    let s = tonic::Status::not_found("Node ID not found for account");
    assert!(matches!(
        grpc_error("UnregisterNode", "a:1".into(), &s),
        ControlError::Refused {
            kind: Refusal::NotFound,
            ..
        }
    ));
    let s = tonic::Status::unknown("Exception calling application: database or disk is full");
    assert!(grpc_error("RegisterNode", "a:1".into(), &s).is_internal());
    let s = tonic::Status::unavailable("tcp connect error");
    assert!(matches!(
        grpc_error("ListNodes", "a:1".into(), &s),
        ControlError::Connect { .. }
    ));
}

#[test]
fn a_bad_ca_is_named() {
    let endpoint = ControlEndpoint {
        dialect: FlowerDialect::Unified,
        address: "127.0.0.1:1".into(),
        server_name: "127.0.0.1".into(),
        ca_pem: Some("not a pem".into()),
        tunnel: None,
    };
    let err = ControlClient::new(endpoint).err().unwrap();
    assert!(err.to_string().contains("CA bundle"), "{err}");
}
