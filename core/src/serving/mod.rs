//! Serving and calling: the HTTP server layer, TLS configurations, gRPC servers on Unix
//! sockets, what every daemon shares at start, periodic tasks, outgoing calls, logging and metrics.

pub mod client;
pub mod daemon;
pub mod dns;
pub mod h2_authority;
pub mod http;
pub mod periodic;
pub mod telemetry;
pub mod tls;
pub mod unix_socket;
