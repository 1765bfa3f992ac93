//! The network namespace of a standalone SuperLink: the bridge is the process runtime's too
//! ([`flower_addon_runtime::netns`], which says how it works).
pub use flower_addon_runtime::netns::*;
