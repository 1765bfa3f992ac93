//! flower-addon hub library: pure core (placement, rendering, status) and adapters.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod ca;
pub mod channel;
pub mod cli;
pub mod controller;
pub mod core;
pub mod kube_store;
pub mod kube_work;
pub mod placement;
pub mod render;
pub mod standalone;
pub mod store;
pub mod tokens;
