//! The agent's socket API from the pod's side (hyperlocal over the Unix socket).

use athenz_core::agent_api::{
    AttestationResponse, CertificateReport, CsrTemplate, IdentityResponse, InitRequest,
    RefreshRequest, VOLUME_HEADER, attestation_path, certificate_path, csr_path, init_path,
    refresh_path,
};
use athenz_core::http::ErrorBody;
use athenz_core::volume::VolumeId;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyperlocal::{UnixClientExt, UnixConnector};
use std::path::PathBuf;
use std::time::Duration;

/// Largest answer read from the agent.
const MAX_ANSWER: usize = 256 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent answered with an error.
    #[error("agent refused ({code}): {message}")]
    Refused {
        /// HTTP status.
        code: u16,
        /// Its message.
        message: String,
        /// Its Retry-After, seconds.
        retry_after: Option<u64>,
    },
    /// No answer, for a reason that may pass (the agent starting or restarting, a timeout).
    #[error("agent unreachable: {0}")]
    Unreachable(String),
    /// The socket cannot be reached as configured (a path too long for a Unix socket, a path
    /// through something that is not a directory): retrying cannot help.
    #[error("agent socket unusable: {0}")]
    BadEndpoint(String),
    /// An answer that is not the API's.
    #[error("agent answered something unreadable: {0}")]
    BadAnswer(String),
}

impl AgentError {
    /// Whether trying again may work: no answer (the agent may be starting), 503 and the other
    /// "try later" statuses (429, 500, 502, 504). A refusal (400, 403, 404, 413), an endpoint
    /// that cannot work and an answer that is not the API's are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Refused { code, .. } => matches!(code, 429 | 500 | 502 | 503 | 504),
            Self::Unreachable(_) => true,
            Self::BadEndpoint(_) | Self::BadAnswer(_) => false,
        }
    }
}

/// Longest path a Unix socket address holds (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Checks a socket path before any call: a path over [`MAX_SOCKET_PATH`] bytes can never be
/// connected to.
pub fn check_endpoint(socket: &std::path::Path) -> Result<(), AgentError> {
    let len = socket.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(AgentError::BadEndpoint(format!(
            "{} is {len} bytes, longer than the {MAX_SOCKET_PATH} a Unix socket path may be",
            socket.display()
        )));
    }
    Ok(())
}

/// A connection failure, sorted: the kinds of error a starting or restarting agent causes
/// (nothing listening yet, no socket file yet, reset, timeout, not yet accessible) are worth
/// retrying; any other (an invalid path, a component that is not a directory) is not.
fn connect_error(e: &(dyn std::error::Error + 'static)) -> AgentError {
    use std::io::ErrorKind as K;
    let text = athenz_core::client::error_chain(e);
    let kind = athenz_core::client::causes(e)
        .find_map(|cause| cause.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    match kind {
        None
        | Some(
            K::ConnectionRefused
            | K::NotFound
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::TimedOut
            | K::Interrupted
            | K::WouldBlock
            | K::PermissionDenied
            | K::UnexpectedEof,
        ) => AgentError::Unreachable(text),
        Some(_) => AgentError::BadEndpoint(text),
    }
}

/// A `{"certPEM"}` body.
fn report_body(cert_pem: &str) -> Result<Vec<u8>, AgentError> {
    serde_json::to_vec(&CertificateReport {
        cert_pem: cert_pem.to_owned(),
    })
    .map_err(|e| AgentError::BadAnswer(e.to_string()))
}

/// An answer's `Retry-After`, in seconds.
fn retry_after<B>(response: &http::Response<B>) -> Option<u64> {
    response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The agent's refusal: its `{code,message}`, or the body as text.
fn refusal(code: u16, body: &[u8], retry_after: Option<u64>) -> AgentError {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .map(|e| e.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).into_owned());
    AgentError::Refused {
        code,
        message,
        retry_after,
    }
}

/// A client of one volume's identity.
pub struct AgentClient {
    socket: PathBuf,
    id: VolumeId,
    timeout: Duration,
    client: Client<UnixConnector, Full<Bytes>>,
}

impl AgentClient {
    /// A client for volume `id` through `socket`.
    pub fn new(socket: PathBuf, id: VolumeId, timeout: Duration) -> Self {
        Self {
            socket,
            id,
            timeout,
            client: Client::unix(),
        }
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, AgentError> {
        self.call(http::Method::POST, path, body).await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, AgentError> {
        check_endpoint(&self.socket)?;
        let uri: hyper::Uri = hyperlocal::Uri::new(&self.socket, path).into();
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| AgentError::BadAnswer(e.to_string()))?;
        let call = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| connect_error(&e))?;
            let status = resp.status().as_u16();
            let retry_after = retry_after(&resp);
            let body = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| AgentError::Unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, AgentError>((status, retry_after, body))
        };
        let (status, retry_after, body) =
            tokio::time::timeout(self.timeout, call)
                .await
                .map_err(|_| {
                    AgentError::Unreachable(format!("no answer within {:?}", self.timeout))
                })??;
        if status != 200 {
            return Err(refusal(status, &body, retry_after));
        }
        serde_json::from_slice(&body).map_err(|e| AgentError::BadAnswer(e.to_string()))
    }

    /// `POST /v1/init/{id}` with no CSR: the agent makes the key (`--key-source agent`).
    pub async fn init(&self) -> Result<IdentityResponse, AgentError> {
        self.post(&init_path(&self.id), b"{}".to_vec()).await
    }

    /// `POST /v1/init/{id}` with the pod's CSR: the answer carries no key.
    pub async fn init_with_csr(&self, csr: String) -> Result<IdentityResponse, AgentError> {
        let body = serde_json::to_vec(&InitRequest { csr: Some(csr) })
            .map_err(|e| AgentError::BadAnswer(e.to_string()))?;
        self.post(&init_path(&self.id), body).await
    }

    /// `GET /v1/csr/{id}`: what this pod's CSR must say.
    pub async fn csr_template(&self) -> Result<CsrTemplate, AgentError> {
        self.call(http::Method::GET, &csr_path(&self.id), Vec::new())
            .await
    }

    /// `POST /v1/attestation/{id}` with the certificate the pod holds.
    pub async fn attestation(&self, cert_pem: &str) -> Result<AttestationResponse, AgentError> {
        self.post(&attestation_path(&self.id), report_body(cert_pem)?)
            .await
    }

    /// `POST /v1/certificate/{id}`: tells the agent the certificate the pod holds now.
    pub async fn report_certificate(&self, cert_pem: &str) -> Result<(), AgentError> {
        let _: serde_json::Value = self
            .post(&certificate_path(&self.id), report_body(cert_pem)?)
            .await?;
        Ok(())
    }

    /// `CONNECT <authority>` on the agent socket: a byte stream to ZTS, spliced by the agent.
    pub async fn tunnel(
        &self,
        authority: &str,
    ) -> Result<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>, AgentError> {
        check_endpoint(&self.socket)?;
        let open = async {
            let stream = tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(|e| connect_error(&e))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| AgentError::Unreachable(e.to_string()))?;
            tokio::spawn(connection.with_upgrades());
            let request = http::Request::builder()
                .method(http::Method::CONNECT)
                .uri(authority)
                .header(http::header::HOST, authority)
                .header(VOLUME_HEADER, self.id.to_string())
                .body(Full::new(Bytes::new()))
                .map_err(|e| AgentError::BadAnswer(format!("CONNECT {authority}: {e}")))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| AgentError::Unreachable(e.to_string()))?;
            if response.status() != http::StatusCode::OK {
                let code = response.status().as_u16();
                let retry_after = retry_after(&response);
                let body = Limited::new(response.into_body(), MAX_ANSWER)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                return Err(refusal(code, &body, retry_after));
            }
            hyper::upgrade::on(response)
                .await
                .map(hyper_util::rt::TokioIo::new)
                .map_err(|e| AgentError::Unreachable(format!("CONNECT {authority}: {e}")))
        };
        tokio::time::timeout(self.timeout, open)
            .await
            .map_err(|_| AgentError::Unreachable(format!("no tunnel within {:?}", self.timeout)))?
    }

    /// `POST /v1/refresh/{id}` with the current pair.
    pub async fn refresh(&self, current: &RefreshRequest) -> Result<IdentityResponse, AgentError> {
        let body = serde_json::to_vec(current).map_err(|e| AgentError::BadAnswer(e.to_string()))?;
        self.post(&refresh_path(&self.id), body).await
    }
}
