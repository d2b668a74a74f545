//! The transport layer: the gRPC services over the node, the socket and its activation,
//! health.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod activation;
pub mod health;
pub mod server;
pub mod service;
