//! The message bus (contract §7): subject names, the embedded NATS-protocol broker, its
//! monitoring endpoints and the NATS JWTs of an external cluster.
//!
//! `subjects` spells most of svc's subject strings (its header names the few that live
//! elsewhere); `broker` serves the NATS client protocol so stock clients (async-nats, nats-py,
//! the nats CLI) work unmodified; `monitor` answers nats-server's monitoring endpoints;
//! `natsjwt` makes and signs the claims nats-server reads in operator mode. The server wires
//! the broker to its listener and its API-key [`broker::Authenticator`]; this module does not
//! know about the server, the store or API keys.

pub mod broker;
pub mod monitor;
pub mod natsjwt;
pub mod subjects;

pub use broker::{
    AllowDeny, AuthRequest, Authenticator, Broker, BrokerConfig, BrokerHandle, BrokerStats,
    BrokerView, ConnectionView, NoAuth, Permissions, StaticAuth, SubjectRule, SubscriptionView,
    SENDER_HEADER,
};
