//! The flower-addon work channel (`flower.addon.v1`): Join, Renew and the Connect stream.
//!
//! The `.proto` files under `proto/flower/addon/v1/` are the source of truth; this crate only
//! includes the code generated from them by `build.rs` (protox + tonic-prost-build).
#![forbid(unsafe_code)]

/// Generated messages and services of package `flower.addon.v1`.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("flower.addon.v1");
}

pub use v1::*;

/// Well-known protobuf types (`google.protobuf.Timestamp`) used by the messages.
pub use prost_types;
