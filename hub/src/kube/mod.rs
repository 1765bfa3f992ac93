//! Kubernetes mode: the Federation and Placement controllers ([`controller`]), the work source
//! that turns Federations and PlacementDecisions into each cluster's work ([`work`]), and the
//! cluster store on `ManagedCluster`s and Secrets ([`store`]).
pub mod controller;
pub mod store;
pub mod work;
