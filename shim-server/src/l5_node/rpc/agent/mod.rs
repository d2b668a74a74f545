//! The agent's RPCs (the Agent service): one module per RPC.

pub mod claim;
pub mod list;
pub mod set_role;
pub mod watch;
