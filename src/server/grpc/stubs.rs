//! Services whose RPCs later work fills in. Until then every RPC answers `Unimplemented`
//! with "not implemented yet" (the generated default methods, see build.rs), after the auth
//! layer has checked the caller's key, so clients see the real auth behaviour already.

use crate::proto;

pub struct Cluster;

impl proto::cluster_service_server::ClusterService for Cluster {}
