//! flower-addon hub library: pure core (placement, rendering, status) and adapters.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod ca;
pub mod channel;
pub mod controller;
pub mod cli;
pub mod render;
pub mod store;
pub mod tokens;
pub mod placement;
pub mod work;
pub mod standalone;
