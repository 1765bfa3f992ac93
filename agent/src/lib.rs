//! flower-addon agent library: registration client, work channel client and runtimes. The
//! SuperNode renderer they use is the pure one in `flower_addon_crds::render` (re-exported as
//! [`render`]), shared with the hub.
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod bootstrap;
pub mod channel;
pub mod cli;
pub mod credentials;
pub mod files;
pub mod guard;
pub mod join;
pub mod kube_runtime;
pub mod metrics;
pub mod netns;
pub mod node_key;
pub mod ocm_addon;
pub mod ops;
pub mod process_runtime;
pub use flower_addon_crds::render;
pub mod runtime;
pub mod sandbox;
pub mod supervise;
pub mod tls;
pub mod work;
