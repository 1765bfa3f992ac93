//! flower-addon hub library: one pure core and the adapters around it.
//!
//! The pipeline, for each Federation: [`core::problems`] (is it valid?) →
//! [`core::placement`] (which clusters, from the Placement and the clusters' labels, claims,
//! taints and resources) → [`core::work`] (what each selected cluster runs, partitions numbered
//! across them) and [`core::superlink`] + [`core::render`] (the SuperLink's arguments and
//! objects) → an adapter applies it:
//!
//! - [`kube`]: Kubernetes mode — the Federation and Placement controllers, the work source fed by
//!   reflectors, and the store of clusters as `ManagedCluster`s;
//! - [`standalone`]: no Kubernetes — manifests from files, SuperLinks as supervised processes,
//!   `status.json`.
//!
//! Both adapters share [`registration`] (CA, bootstrap tokens, the cluster store),
//! [`channel`] (the agents' gRPC join and work streams over mTLS) and [`runs`] (the one FlowerRun
//! reconcile, over each mode's [`runs::RunHost`]). [`cli`] wires them into the
//! `flower-hub` commands. No adapter imports another. [`metrics`] is what every part records
//! for `/metrics`.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod channel;
pub mod cli;
pub mod core;
pub mod flower;
pub mod kube;
pub mod metrics;
pub mod registration;
pub mod runs;
pub mod standalone;
