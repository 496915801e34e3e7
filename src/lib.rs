//! svc: a runtime operations control plane for Linux fleets, as one executable with many names.
//!
//! `main.rs` only hands argv to [`dispatch`]; everything else lives in the modules below, one
//! per domain or transport. See docs/ARCHITECTURE.md for the map and its invariants.

pub mod agent;
pub mod audit;
pub mod auth;
pub mod backup;
pub mod blueprint;
pub mod bootstrap;
pub mod bus;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod datadir;
pub mod dispatch;
pub mod domain;
pub mod error;
pub mod events;
pub mod facts;
pub mod files;
pub mod fleet;
pub mod identity;
pub mod ids;
pub mod metrics;
pub mod modules;
pub mod percent;
pub mod preflight;
pub mod program;
pub mod runbooks;
pub mod secrets;
pub mod server;
pub mod sort;
pub mod state;
pub mod store;
pub mod stream;
pub mod template;
pub mod tls;
pub mod version;
pub mod webhooks;
pub mod zip;

/// Code generated from proto/svc/v1 (messages, clients, servers).
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("svc.v1");

    /// The encoded descriptor set, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/svc_descriptor.bin"));
}

pub use error::{Error, Result};
