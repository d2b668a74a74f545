//! One module per RPC. Each returns the CNI outcome; service.rs turns it into a reply.

pub mod add;
pub mod admin;
pub mod agent;
pub mod check;
pub mod del;
pub mod doctor;
pub mod gc;
pub mod status;

#[cfg(test)]
mod access_tests;
#[cfg(test)]
pub(crate) mod tests;
