//! Command-line front ends. `main.rs` only dispatches; each module owns its arguments.
pub mod front;
pub use flower_addon_runtime::cli::netns;
pub mod offline;
pub mod outputs;
pub mod policy;
pub mod registration;
pub mod serve;
pub mod spoke;

pub use flower_addon_runtime::cli::{LogFormat, init_tracing, init_tracing_with};
