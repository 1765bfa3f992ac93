//! flower-addon agent library: registration client, work channel client, runtimes and the
//! SuperNode renderer (the only one; the hub uses it for its own cluster).
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod bootstrap;
pub mod channel;
pub mod cli;
pub mod credentials;
pub mod join;
pub mod kube_runtime;
pub mod process_runtime;
pub mod render;
pub mod runtime;
pub mod supervise;
pub mod tls;
