//! Command-line front ends. `main.rs` only dispatches; each module owns its arguments. The
//! plumbing both binaries share is `flower_addon_runtime::cli`'s.
pub mod join;
pub mod run;

pub use flower_addon_runtime::cli::{
    GlobalArgs, LogFormat, init_tracing, init_tracing_with, netns, print_completions,
    shutdown_signal,
};
