//! Bounds of a Federation's spec, shared by its schema ([`crate::federation`] and its hand-written
//! fragments) and the validation that names them.

/// Maximum number of SuperNode pools in one Federation.
pub const MAX_POOLS: usize = 16;
/// Maximum number of entries in one pool's `nodeConfig` (bounds the CEL cost).
pub const MAX_NODE_CONFIG_ENTRIES: usize = 64;
/// Maximum length of a `nodeConfig` key or string value (bounds the CEL cost).
pub const MAX_NODE_CONFIG_LENGTH: usize = 1024;
/// Maximum `replicas` of one pool on one cluster (pool or `clusterOverrides`): bounds how many
/// SuperNodes, and the objects the hub and agents render for them, one Federation can ask for.
pub const MAX_REPLICAS: i32 = 1000;
