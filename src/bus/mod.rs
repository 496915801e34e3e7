//! The message bus (contract §7): subject names and the embedded NATS-protocol broker.
//!
//! `subjects` is the one place svc's subject strings are spelled; `broker` serves the NATS
//! client protocol so stock clients (async-nats, nats-py, the nats CLI) work unmodified. The
//! server wires the broker to its listener and its API-key [`broker::Authenticator`]; this
//! module does not know about the server, the store or API keys.

pub mod broker;
pub mod monitor;
pub mod natsjwt;
pub mod subjects;

pub use broker::{
    AllowDeny, AuthRequest, Authenticator, Broker, BrokerConfig, BrokerHandle, BrokerStats,
    BrokerView, ConnectionView, NoAuth, Permissions, StaticAuth, SubjectRule, SubscriptionView,
    SENDER_HEADER,
};
