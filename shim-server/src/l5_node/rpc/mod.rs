//! One module per RPC: the Cni service's here, the Admin service's in admin/, the Agent
//! service's in agent/. Each returns its outcome; service.rs turns it into a reply.

pub mod add;
pub mod admin;
pub mod agent;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;

#[cfg(test)]
mod tests;
