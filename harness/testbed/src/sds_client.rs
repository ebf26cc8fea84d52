//! Envoy's side of SDS, for the tests: a client built from the same Envoy API bindings the SIA
//! serves with (Envoy itself is in none of the registries this machine reaches), and every pushed
//! `Secret` decoded back into the PEM it carries, field by field.

use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret, secret::Type as SecretType,
};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use std::path::Path;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// The type of every SDS resource (Envoy's name).
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// A connected SDS client.
pub type SdsClient = SecretDiscoveryServiceClient<Channel>;

/// Connects to the SDS server on `socket`.
pub async fn connect(socket: &Path) -> Result<SdsClient, tonic::transport::Error> {
    Ok(SecretDiscoveryServiceClient::new(
        crate::grpc::dial_unix(socket, None).await?,
    ))
}

/// A request as Envoy sends it: the names, the Secret type, and (after the first) the version and
/// nonce it answers, with `error` for a NACK.
pub fn request(
    names: &[&str],
    answered: Option<&DiscoveryResponse>,
    error: Option<&str>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
        type_url: SECRET_TYPE_URL.to_owned(),
        version_info: answered.map(|r| r.version_info.clone()).unwrap_or_default(),
        response_nonce: answered.map(|r| r.nonce.clone()).unwrap_or_default(),
        error_detail: error.map(|message| RpcStatus {
            code: 3, // INVALID_ARGUMENT, as Envoy reports a rejected update
            message: message.to_owned(),
            details: Vec::new(),
        }),
        ..DiscoveryRequest::default()
    }
}

/// One open `StreamSecrets` call: requests go in through `send`, responses come out of `next`.
pub struct SdsStream {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
}

impl SdsStream {
    /// Opens a stream and sends `first`.
    pub async fn open(
        client: &mut SdsClient,
        first: DiscoveryRequest,
    ) -> Result<Self, tonic::Status> {
        let (requests, outbound) = mpsc::channel(8);
        requests
            .send(first)
            .await
            .map_err(|_| tonic::Status::internal("request channel closed"))?;
        let responses = client
            .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(outbound))
            .await?
            .into_inner();
        Ok(Self {
            requests,
            responses,
        })
    }

    /// Sends a follow-up request (ACK, NACK or a new subscription).
    pub async fn send(&self, request: DiscoveryRequest) -> Result<(), tonic::Status> {
        self.requests
            .send(request)
            .await
            .map_err(|_| tonic::Status::internal("request channel closed"))
    }

    /// The next response; `Ok(None)` when the server ended the stream cleanly.
    pub async fn next(&mut self) -> Result<Option<DiscoveryResponse>, tonic::Status> {
        self.responses.message().await
    }
}

/// A decoded SDS secret: what Envoy would load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// `tls_certificate`: the chain and key, PEM.
    Certificate {
        /// Secret name.
        name: String,
        /// `certificate_chain` inline bytes.
        chain: String,
        /// `private_key` inline bytes.
        key: String,
    },
    /// `validation_context`: the trusted CAs, PEM.
    Validation {
        /// Secret name.
        name: String,
        /// `trusted_ca` inline bytes.
        trusted_ca: String,
    },
}

/// Decodes every resource of `response`; an error names what is not as Envoy expects.
pub fn decode(response: &DiscoveryResponse) -> Result<Vec<Decoded>, String> {
    if response.type_url != SECRET_TYPE_URL {
        return Err(format!("response type {}", response.type_url));
    }
    let inline = |source: &Option<envoy_types::pb::envoy::config::core::v3::DataSource>,
                  what: &str| {
        match source.as_ref().and_then(|s| s.specifier.as_ref()) {
            Some(Specifier::InlineBytes(bytes)) => {
                String::from_utf8(bytes.clone()).map_err(|_| format!("{what} is not UTF-8"))
            }
            other => Err(format!("{what} is not inline bytes: {other:?}")),
        }
    };
    response
        .resources
        .iter()
        .map(|any| {
            if any.type_url != SECRET_TYPE_URL {
                return Err(format!("resource type {}", any.type_url));
            }
            let secret = Secret::decode(any.value.as_slice()).map_err(|e| e.to_string())?;
            match secret.r#type {
                Some(SecretType::TlsCertificate(tls)) => Ok(Decoded::Certificate {
                    chain: inline(&tls.certificate_chain, "certificate_chain")?,
                    key: inline(&tls.private_key, "private_key")?,
                    name: secret.name,
                }),
                Some(SecretType::ValidationContext(v)) => Ok(Decoded::Validation {
                    trusted_ca: inline(&v.trusted_ca, "trusted_ca")?,
                    name: secret.name,
                }),
                _ => Err(format!(
                    "secret {} has no certificate or validation context",
                    secret.name
                )),
            }
        })
        .collect()
}
