//! flower-addon API types: `Federation`, `Placement`, `PlacementDecision` and `ManagedCluster`
//! (group `flower-addon.io`, version `v1alpha1`), their validation and CRD generation.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

/// API group of every flower-addon resource.
pub const GROUP: &str = "flower-addon.io";
/// API version of every flower-addon resource.
pub const VERSION: &str = "v1alpha1";
