//! A scripted instance provider: a mutual-TLS server that answers ZTS's `/instance` and `/refresh`
//! calls as told, and records exactly what it was sent (route, caller principal, body) so tests can
//! assert the dev ZTS speaks the contract of docs/design.md §4.4. The real provider is the
//! callback itself.

use crate::pki::{CertAuthority, LeafSpec, PkiError};
use athenz_core::crypto::pem_certificates;
use athenz_core::http::{Body, ConnInfo, Handler, Listener, Server, error_response, json_response};
use athenz_core::tls::{self, ReloadingIdentity, TlsError};
use athenz_core::zts::{InstanceConfirmation, attr};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::sync::{Arc, Mutex};

/// How the provider answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// 200 with the confirmation echoed, plus `certExpiryTime` if given (minutes).
    Allow {
        /// Lifetime to grant, minutes.
        cert_expiry_minutes: Option<u32>,
    },
    /// This status with `{code, message}`.
    Deny {
        /// HTTP status.
        status: u16,
        /// Message.
        message: String,
    },
    /// This status with exactly this body and no content type (a provider that answers
    /// something else).
    Raw {
        /// HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
    /// This status with exactly this body, labelled `application/json`.
    RawJson {
        /// HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
    /// Holds the call this long, then allows it as [`Decision::Allow`] without a lifetime: a
    /// provider slower than its client's read timeout, so that what the client reports is its
    /// own giving up (a confirmation if it waited).
    Stall {
        /// How long, milliseconds.
        millis: u64,
    },
}

/// One call the provider received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Request path.
    pub path: String,
    /// Principal of the client certificate.
    pub principal: Option<String>,
    /// The client's address: a new source port is a new connection.
    pub peer: Option<std::net::SocketAddr>,
    /// Raw body.
    pub body: Vec<u8>,
}

impl Recorded {
    /// The body as a confirmation.
    pub fn confirmation(&self) -> Result<InstanceConfirmation, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

#[derive(Debug)]
struct Script {
    decision: Mutex<Decision>,
    recorded: Mutex<Vec<Recorded>>,
    base_path: String,
}

impl Handler for Script {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        self.recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Recorded {
                path: path.clone(),
                principal: conn.principal.clone(),
                peer: match conn.peer {
                    athenz_core::http::Peer::Tcp(addr) => Some(addr),
                    athenz_core::http::Peer::Unix { .. } => None,
                },
                body: req.body().to_vec(),
            });
        let route = path.strip_prefix(&self.base_path).unwrap_or_default();
        if route != "/instance" && route != "/refresh" {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        }
        let decision = self
            .decision
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match decision {
            Decision::Allow {
                cert_expiry_minutes,
            } => allow(req.body(), cert_expiry_minutes),
            Decision::Stall { millis } => {
                tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
                allow(req.body(), None)
            }
            Decision::Deny { status, message } => error_response(
                StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                message,
            ),
            Decision::Raw { status, body } => {
                let mut response = Response::new(Body::from(body));
                *response.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                response
            }
            Decision::RawJson { status, body } => {
                let mut response = Response::new(Body::from(body));
                *response.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
        }
    }
}

/// The confirmation echoed, with `certExpiryTime` when given (minutes).
fn allow(body: &[u8], cert_expiry_minutes: Option<u32>) -> Response<Body> {
    match serde_json::from_slice::<InstanceConfirmation>(body) {
        Ok(mut confirmation) => {
            if let Some(minutes) = cert_expiry_minutes {
                confirmation
                    .attributes
                    .insert(attr::CERT_EXPIRY_TIME.to_owned(), minutes.to_string());
            }
            json_response(StatusCode::OK, &confirmation)
        }
        Err(e) => error_response(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// A running scripted provider.
pub struct ProviderStub {
    endpoint: String,
    script: Arc<Script>,
    _dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Why the stub could not start.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// Certificates.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// TLS.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Sockets and files.
    #[error("provider stub: {0}")]
    Io(#[from] std::io::Error),
}

impl ProviderStub {
    /// Starts provider `name` on loopback: its server certificate (CN `name`, SAN 127.0.0.1) comes
    /// from `ca`; clients must present certificates chaining to `client_root_pem`. The endpoint is
    /// `https://127.0.0.1:<port><base_path>`.
    pub async fn start(
        ca: &CertAuthority,
        name: &str,
        client_root_pem: &str,
        base_path: &str,
        decision: Decision,
    ) -> Result<Self, StubError> {
        let leaf = LeafSpec {
            ip_addresses: vec![[127, 0, 0, 1].into()],
            ..LeafSpec::service(name, &["localhost"])
        };
        Self::start_with_leaf(ca, &leaf, client_root_pem, base_path, decision).await
    }

    /// [`Self::start`] with a server certificate made from `leaf` (another CN, no host names).
    pub async fn start_with_leaf(
        ca: &CertAuthority,
        leaf: &LeafSpec,
        client_root_pem: &str,
        base_path: &str,
        decision: Decision,
    ) -> Result<Self, StubError> {
        let dir = tempfile::tempdir()?;
        let files = ca.write_service_cert(dir.path(), "provider", leaf)?;
        let identity = ReloadingIdentity::load(&files.cert, &files.key)?;
        let client_cas =
            pem_certificates(client_root_pem).map_err(|e| TlsError::BadPem(e.to_string()))?;
        let config = tls::server_config(identity, &client_cas)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let script = Arc::new(Script {
            decision: Mutex::new(decision),
            recorded: Mutex::new(Vec::new()),
            base_path: base_path.to_owned(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            Server::new(Listener::Tcp(listener), script.clone())
                .with_tls(config)
                .serve(async {
                    let _ = rx.await;
                }),
        );
        Ok(Self {
            endpoint: format!("https://127.0.0.1:{port}{base_path}"),
            script,
            _dir: dir,
            shutdown: Some(tx),
        })
    }

    /// The endpoint URL to register for the provider.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Changes how it answers.
    pub fn set_decision(&self, decision: Decision) {
        *self
            .script
            .decision
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = decision;
    }

    /// Every call received so far.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.script
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops the server (its port then refuses connections).
    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for ProviderStub {
    fn drop(&mut self) {
        self.stop();
    }
}
