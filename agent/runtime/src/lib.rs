//! flower-addon runtime: what runs SuperNodes and what the two binaries share. The agent runs its
//! clusters' pools with it; the hub runs its own pools (Federations without a Placement) and its
//! standalone SuperLinks with the same code:
//!
//! - the runtimes: [`kube_runtime`] (StatefulSets/DaemonSets and their Secrets), and
//!   [`process_runtime`] (supervised processes, optionally sandboxed in network namespaces);
//! - the work decoder ([`work`]) and the runtime interface ([`runtime`]);
//! - supervision ([`supervise`], [`guard`]), the sandbox ([`sandbox`], [`netns`]), SuperNode keys
//!   ([`node_key`]), files, TLS helpers, the ops endpoints and metrics;
//! - command-line plumbing ([`cli`]).
//!
//! The SuperNode renderer they use is the pure one in `flower_addon_crds::render` (re-exported
//! as [`render`]).
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod cli;
pub mod files;
pub mod guard;
pub mod kube_runtime;
pub mod metrics;
pub mod netns;
pub mod node_key;
pub mod ops;
pub mod process_runtime;
pub use flower_addon_crds::render;
pub mod runtime;
pub mod sandbox;
pub mod supervise;
pub mod tls;
pub mod work;
