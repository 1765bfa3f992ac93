//! flower-addon agent library: joining the hub (bootstrap, CSR, credentials), the work channel
//! client and the OCM addon identity. The runtimes it drives, and what it shares with the hub,
//! are in `flower_addon_runtime` (re-exported here under their old paths).
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod bootstrap;
pub mod channel;
pub mod cli;
pub mod credentials;
pub mod join;
pub mod ocm_addon;
pub use flower_addon_runtime::{
    files, guard, kube_runtime, metrics, netns, node_key, ops, process_runtime, render, runtime,
    sandbox, supervise, tls, work,
};
