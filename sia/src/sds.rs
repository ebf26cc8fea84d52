//! Envoy's Secret Discovery Service (SDS v3, `envoy.service.secret.v3`) from the refresh sidecar:
//! a proxy in the pod asks once over a Unix socket and gets every rotation pushed, with no files
//! to watch. Served with tonic and Envoy's own API types (`envoy-types`), the resource names
//! Istio's agent uses so Envoy configurations written for it work here:
//!
//! - `default`: the service certificate chain and its key (`tls_certificate`);
//! - `ROOTCA`: the CA bundle (`validation_context.trusted_ca`).
//!
//! Every value comes from one issue (the same answer the files are written from), so a proxy never
//! pairs a key with another issue's certificate. The protocol is xDS state-of-the-world: the first
//! request names the secrets and gets them; each later request answers the last response by its
//! nonce: an ACK (its version) or a NACK (`error_detail`, logged with Envoy's reason, and the
//! previous version stays in force: nothing is re-sent until the next rotation). Unknown names end
//! the stream with `NOT_FOUND` naming them. Bounded: [`MAX_STREAMS`] streams, [`MAX_MESSAGE`]
//! bytes per request, [`MAX_NAMES`] names per request.

use athenz_core::crypto::CertInfo;
use athenz_core::secret::Secret;
use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret as SdsSecret, TlsCertificate, secret::Type as SecretType,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, watch};
use tonic::codegen::Service;
use tonic::{Request, Response, Status, Streaming};

/// The type of every resource served (and the only one a request may ask for).
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// The service certificate chain and key, by Istio's name.
pub const SERVICE_CERT: &str = "default";
/// The CA bundle as a validation context, by Istio's name.
pub const ROOT_CA: &str = "ROOTCA";
/// Streams open at once; more are refused with `RESOURCE_EXHAUSTED`.
pub const MAX_STREAMS: usize = 128;
/// Largest request accepted, bytes (a real one is a few hundred).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most secret names one request may carry.
pub const MAX_NAMES: usize = 16;
/// Connections at once (Envoy keeps one per SDS cluster).
const MAX_CONNECTIONS: usize = 16;
/// Responses queued for a slow stream before it is ended.
const STREAM_QUEUE: usize = 4;

/// One issue's credentials as SDS serves them.
pub struct Snapshot {
    version: String,
    cert_pem: String,
    key_pem: Secret,
    ca_pem: String,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// The set of one issue; its version is the leaf certificate's serial (every issue has a
    /// new one).
    pub fn new(key_pem: Secret, cert_pem: String, ca_pem: String) -> Result<Self, String> {
        let info =
            CertInfo::from_pem(&cert_pem).map_err(|e| format!("SDS: the certificate: {e}"))?;
        Ok(Self {
            version: info.serial_hex,
            cert_pem,
            key_pem,
            ca_pem,
        })
    }

    /// The version Envoy sees (the certificate serial, hex).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resource called `name`, packed as `Any`; `None` for a name not served.
    fn resource(&self, name: &str) -> Option<Any> {
        let inline = |bytes: &[u8]| {
            Some(DataSource {
                specifier: Some(Specifier::InlineBytes(bytes.to_vec())),
                ..DataSource::default()
            })
        };
        let secret_type = match name {
            SERVICE_CERT => SecretType::TlsCertificate(TlsCertificate {
                certificate_chain: inline(self.cert_pem.as_bytes()),
                private_key: inline(self.key_pem.expose().as_bytes()),
                ..TlsCertificate::default()
            }),
            ROOT_CA => SecretType::ValidationContext(CertificateValidationContext {
                trusted_ca: inline(self.ca_pem.as_bytes()),
                ..CertificateValidationContext::default()
            }),
            _ => return None,
        };
        let secret = SdsSecret {
            name: name.to_owned(),
            r#type: Some(secret_type),
        };
        Some(Any {
            type_url: SECRET_TYPE_URL.to_owned(),
            value: secret.encode_to_vec(),
        })
    }
}

/// Publishes each new issue to every open stream.
#[derive(Debug, Clone)]
pub struct Publisher(Arc<watch::Sender<Arc<Snapshot>>>);

impl Publisher {
    /// Makes `snapshot` current and pushes it to every stream that asked for its secrets.
    pub fn publish(&self, snapshot: Snapshot) {
        self.0.send_replace(Arc::new(snapshot));
    }
}

/// The SDS service (tonic implements the gRPC around it).
#[derive(Debug, Clone)]
pub struct Sds {
    current: watch::Receiver<Arc<Snapshot>>,
    streams: Arc<Semaphore>,
}

impl Sds {
    /// A service serving `initial` until something newer is published.
    pub fn new(initial: Snapshot) -> (Self, Publisher) {
        let (sender, current) = watch::channel(Arc::new(initial));
        (
            Self {
                current,
                streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            },
            Publisher(Arc::new(sender)),
        )
    }
}

/// The secret names `req` asks for, or why it cannot be answered: the type must be the Secret
/// type (or empty, as Envoy leaves it for SDS), the names known and few (repeats collapse).
fn check_request(req: &DiscoveryRequest) -> Result<BTreeSet<String>, Status> {
    if !req.type_url.is_empty() && req.type_url != SECRET_TYPE_URL {
        return Err(Status::invalid_argument(format!(
            "this SDS server serves {SECRET_TYPE_URL} only (asked for {})",
            req.type_url
        )));
    }
    if req.resource_names.len() > MAX_NAMES {
        return Err(Status::invalid_argument(format!(
            "{} secret names in one request; at most {MAX_NAMES}",
            req.resource_names.len()
        )));
    }
    let unknown: Vec<&str> = req
        .resource_names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != SERVICE_CERT && *n != ROOT_CA)
        .collect();
    if !unknown.is_empty() {
        let shown: Vec<String> = unknown
            .iter()
            .map(|n| format!("{:?}", n.chars().take(128).collect::<String>()))
            .collect();
        return Err(Status::not_found(format!(
            "unknown secret name(s) {}; this SDS server serves {SERVICE_CERT:?} (the service \
             certificate and key) and {ROOT_CA:?} (the CA bundle)",
            shown.join(", ")
        )));
    }
    Ok(req.resource_names.iter().cloned().collect())
}

/// The response carrying `names` from `snapshot`.
fn response(snapshot: &Snapshot, names: &BTreeSet<String>, nonce: String) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: snapshot.version.clone(),
        resources: names.iter().filter_map(|n| snapshot.resource(n)).collect(),
        type_url: SECRET_TYPE_URL.to_owned(),
        nonce,
        ..DiscoveryResponse::default()
    }
}

type ResponseStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>,
>;

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type DeltaSecretsStream = DeltaStream;
    type StreamSecretsStream = ResponseStream;

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "incremental (delta) SDS is not served; use StreamSecrets (state of the world)",
        ))
    }

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let slot = Arc::clone(&self.streams).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!("{MAX_STREAMS} SDS streams are open already"))
        })?;
        let (out, responses) = mpsc::channel(STREAM_QUEUE);
        let stream = SdsStream {
            requests: request.into_inner(),
            current: self.current.clone(),
            out,
            names: BTreeSet::new(),
            sent: None,
            nonces: 0,
        };
        tokio::spawn(async move {
            stream.run().await;
            drop(slot);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(responses),
        )))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let names = check_request(request.get_ref())?;
        if names.is_empty() {
            return Err(no_names());
        }
        let snapshot = Arc::clone(&self.current.borrow());
        Ok(Response::new(response(&snapshot, &names, String::new())))
    }
}

fn no_names() -> Status {
    Status::invalid_argument(format!(
        "name the secrets: {SERVICE_CERT:?} (the service certificate and key), {ROOT_CA:?} (the \
         CA bundle)"
    ))
}

/// One open `StreamSecrets` call.
struct SdsStream {
    requests: Streaming<DiscoveryRequest>,
    current: watch::Receiver<Arc<Snapshot>>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    /// The names subscribed to.
    names: BTreeSet<String>,
    /// The version and nonce of the last response sent.
    sent: Option<(String, String)>,
    nonces: u64,
}

impl SdsStream {
    async fn run(mut self) {
        loop {
            tokio::select! {
                request = self.requests.message() => match request {
                    Ok(Some(request)) => {
                        if let Err(status) = self.on_request(request).await {
                            let _ = self.out.send(Err(status)).await;
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(status) => {
                        // an oversized or malformed request, or the client gone: say why (a
                        // client that left never reads it)
                        tracing::debug!(error = %status, "SDS stream ended");
                        let refused = Status::new(
                            status.code(),
                            format!("SDS request refused: {}", status.message()),
                        );
                        let _ = self.out.send(Err(refused)).await;
                        return;
                    }
                },
                changed = self.current.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !self.names.is_empty() && !self.send_current().await {
                        return;
                    }
                }
                () = self.out.closed() => return,
            }
        }
    }

    async fn on_request(&mut self, request: DiscoveryRequest) -> Result<(), Status> {
        let names = check_request(&request)?;
        if self.sent.is_none() && request.response_nonce.is_empty() && names.is_empty() {
            return Err(no_names());
        }
        if !request.response_nonce.is_empty() {
            let Some((version, nonce)) = &self.sent else {
                // a nonce this stream never sent (a reconnect replaying the last one): as Envoy
                // does on reconnect, treat it as a fresh subscription
                return self.subscribe(names).await;
            };
            if *nonce != request.response_nonce {
                // an answer to an older response: superseded, ignored (xDS)
                return Ok(());
            }
            if let Some(error) = &request.error_detail {
                tracing::warn!(
                    rejected_version = %version,
                    kept_version = %request.version_info,
                    code = error.code,
                    error = %error.message,
                    "Envoy rejected the SDS secrets (NACK); keeping its previous version"
                );
            } else {
                tracing::debug!(version = %version, "SDS secrets acknowledged");
            }
            if names == self.names {
                return Ok(());
            }
        }
        self.subscribe(names).await
    }

    /// Subscribes to `names` and sends them (an empty set unsubscribes: nothing is sent).
    async fn subscribe(&mut self, names: BTreeSet<String>) -> Result<(), Status> {
        self.names = names;
        if !self.names.is_empty() && !self.send_current().await {
            return Err(Status::cancelled("the SDS stream closed"));
        }
        Ok(())
    }

    /// Sends the current snapshot; false once the stream is gone.
    async fn send_current(&mut self) -> bool {
        let snapshot = Arc::clone(&self.current.borrow_and_update());
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        let response = response(&snapshot, &self.names, nonce.clone());
        self.sent = Some((snapshot.version.clone(), nonce));
        self.out.send(Ok(response)).await.is_ok()
    }
}

/// Serves `sds` on the Unix socket at `socket` (mode 0600, or 0660 with `gid` as its group) until
/// `stop` completes. Binding errors are returned at once, before anything is served.
pub fn serve(
    socket: &Path,
    gid: Option<u32>,
    sds: Sds,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let access = athenz_core::unix_socket::Access {
        mode: if gid.is_some() { 0o660 } else { 0o600 },
        gid,
    };
    let listener = athenz_core::unix_socket::bind(socket, access)
        .map_err(|e| format!("--sds-socket (SDS_SOCKET): {e}"))?;
    let service = SecretDiscoveryServiceServer::new(sds)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let limits = athenz_core::unix_socket::Limits {
        connections: MAX_CONNECTIONS,
        streams_per_connection: MAX_STREAMS as u32,
        // SDS streams never end by themselves: on SIGTERM, close them promptly
        grace: Duration::from_millis(200),
        name: "SDS",
    };
    let route = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let mut service = service.clone();
        async move { service.call(req).await }
    });
    let socket = socket.to_owned();
    Ok(tokio::spawn(async move {
        athenz_core::unix_socket::serve_http2(listener, route, limits, stop).await;
        let _ = std::fs::remove_file(&socket);
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_type_url_is_envoys_name_for_secret() {
        assert_eq!(SECRET_TYPE_URL, <SdsSecret as prost::Name>::type_url());
    }

    fn request(names: &[&str], type_url: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            type_url: type_url.to_owned(),
            ..DiscoveryRequest::default()
        }
    }

    #[test]
    fn requests_are_checked_and_refusals_name_what_was_wrong() {
        assert_eq!(
            check_request(&request(&["default", "ROOTCA", "default"], SECRET_TYPE_URL)).unwrap(),
            BTreeSet::from(["default".to_owned(), "ROOTCA".to_owned()])
        );
        assert!(check_request(&request(&["ROOTCA"], "")).is_ok());
        let wrong_type = check_request(&request(
            &["default"],
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        ))
        .unwrap_err();
        assert_eq!(wrong_type.code(), tonic::Code::InvalidArgument);
        assert!(wrong_type.message().contains("Cluster"));
        let unknown =
            check_request(&request(&["default", "spiffe://x", "file-cert"], "")).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        assert!(unknown.message().contains("\"spiffe://x\", \"file-cert\""));
        let hostile = "\u{1b}[31m".repeat(1000);
        let shown = check_request(&request(&[hostile.as_str()], "")).unwrap_err();
        assert!(shown.message().len() < 1200, "an unknown name is shown cut");
        assert!(
            !shown.message().contains('\u{1b}'),
            "control characters escaped"
        );
        let many: Vec<String> = (0..=MAX_NAMES).map(|_| "default".to_owned()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            check_request(&request(&many, "")).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_snapshot_is_versioned_by_serial_and_never_shows_its_key() {
        let key =
            athenz_core::crypto::PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256)
                .unwrap();
        let cert = rcgen_self_signed(&key);
        let snapshot =
            Snapshot::new(key.to_pkcs8_pem().unwrap(), cert.clone(), cert.clone()).unwrap();
        let serial = CertInfo::from_pem(&cert).unwrap().serial_hex;
        assert_eq!(snapshot.version(), serial);
        assert!(!format!("{snapshot:?}").contains("PRIVATE KEY"));
        assert!(snapshot.resource("other").is_none());
        let err = Snapshot::new(Secret::new(""), "not a cert".into(), String::new()).unwrap_err();
        assert!(err.contains("SDS: the certificate"), "{err}");
    }

    fn rcgen_self_signed(key: &athenz_core::crypto::PrivateKey) -> String {
        rcgen::CertificateParams::new(vec!["sds.test".to_owned()])
            .unwrap()
            .self_signed(key.key_pair())
            .unwrap()
            .pem()
    }
}
