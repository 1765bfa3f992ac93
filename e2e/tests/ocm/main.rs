//! The tests against Open Cluster Management v1.2.0's own controllers (built by
//! `e2e/ocm/build.sh`), in one test binary so that they run side by side (each on a control
//! plane of its own; most of their time is waiting): [`join`] (spokes join OCM, OCM's Placement
//! places our Federations), [`placement`] (our placement against OCM's on generated fleets) and
//! [`addon`] (the agent as an OCM addon).
mod addon;
mod join;
mod placement;
