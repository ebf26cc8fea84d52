//! The client side of the refresher's SDS socket, for `athenz-sia status --sds-socket`: asks once
//! (`FetchSecrets`, the unary call of Envoy's Secret Discovery Service) for the service certificate
//! and the CA bundle, as a proxy in the pod would get them, so an operator or an exec probe can
//! check what the socket serves without an Envoy. One HTTP/2 request over the Unix socket, with a
//! timeout and a size limit on the answer; everything the server sends is decoded strictly.

use crate::sds::{ROOT_CA, SECRET_TYPE_URL, SERVICE_CERT};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret, secret::Type as SecretType,
};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;
use std::path::Path;
use std::time::Duration;

/// The largest answer read: a certificate chain, its key and a CA bundle.
pub const MAX_ANSWER: usize = 256 * 1024;
/// The gRPC method.
const FETCH: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";

/// What the socket served: the service certificate chain, its key and the CA bundle (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Leaf then chain.
    pub chain: String,
    /// The private key (kept in memory only for the checks).
    pub key: String,
    /// The CA bundle.
    pub ca: String,
}

/// Fetches `default` and `ROOTCA` from the SDS server on `socket` within `timeout`.
pub async fn fetch(socket: &Path, timeout: Duration) -> Result<Served, String> {
    tokio::time::timeout(timeout, fetch_inner(socket))
        .await
        .map_err(|_| format!("no answer from {} within {timeout:?}", socket.display()))?
}

async fn fetch_inner(socket: &Path) -> Result<Served, String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| format!("HTTP/2 with {}: {e}", socket.display()))?;
    let driver = tokio::spawn(connection);
    let request = DiscoveryRequest {
        resource_names: vec![SERVICE_CERT.to_owned(), ROOT_CA.to_owned()],
        type_url: SECRET_TYPE_URL.to_owned(),
        ..DiscoveryRequest::default()
    };
    let request = http::Request::post(format!("http://localhost{FETCH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(grpc_frame(&request.encode_to_vec())))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("FetchSecrets: {e}"));
    let result = match response {
        Ok(response) => read_answer(response).await,
        Err(e) => Err(e),
    };
    driver.abort();
    result
}

/// A gRPC message frame: uncompressed, its length, the message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(message);
    frame.freeze()
}

async fn read_answer(response: http::Response<hyper::body::Incoming>) -> Result<Served, String> {
    if response.status() != http::StatusCode::OK {
        return Err(format!("FetchSecrets answered HTTP {}", response.status()));
    }
    let collected = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("reading the answer (at most {MAX_ANSWER} bytes): {e}"))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = trailers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if status != "0" {
        let message = trailers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return Err(format!(
            "FetchSecrets refused (grpc-status {status:?}): {message}"
        ));
    }
    decode_answer(collected.to_bytes())
}

/// Decodes one gRPC frame holding a `DiscoveryResponse` into what it serves.
pub fn decode_answer(mut body: Bytes) -> Result<Served, String> {
    if body.len() < 5 {
        return Err("the answer is shorter than a gRPC frame".into());
    }
    if body.get_u8() != 0 {
        return Err("the answer is compressed (never asked for)".into());
    }
    let len = body.get_u32() as usize;
    if len != body.len() {
        return Err(format!(
            "the answer's frame says {len} bytes and holds {}",
            body.len()
        ));
    }
    let answer = DiscoveryResponse::decode(body).map_err(|e| format!("the answer: {e}"))?;
    let (mut chain, mut key, mut ca) = (None, None, None);
    for resource in &answer.resources {
        if resource.type_url != SECRET_TYPE_URL {
            return Err(format!("a resource of type {:?}", resource.type_url));
        }
        let secret = Secret::decode(resource.value.as_slice())
            .map_err(|e| format!("a Secret in the answer: {e}"))?;
        match (secret.name.as_str(), secret.r#type) {
            (SERVICE_CERT, Some(SecretType::TlsCertificate(tls))) => {
                chain = Some(inline("certificate_chain", tls.certificate_chain)?);
                key = Some(inline("private_key", tls.private_key)?);
            }
            (ROOT_CA, Some(SecretType::ValidationContext(context))) => {
                ca = Some(inline("trusted_ca", context.trusted_ca)?);
            }
            (name, _) => return Err(format!("an unexpected secret {name:?} in the answer")),
        }
    }
    Ok(Served {
        chain: chain.ok_or(format!("no {SERVICE_CERT:?} secret in the answer"))?,
        key: key.ok_or(format!("no {SERVICE_CERT:?} key in the answer"))?,
        ca: ca.ok_or(format!("no {ROOT_CA:?} secret in the answer"))?,
    })
}

/// The inline text of a data source (the SIA serves nothing else).
fn inline(field: &str, source: Option<DataSource>) -> Result<String, String> {
    match source.and_then(|s| s.specifier) {
        Some(Specifier::InlineBytes(bytes)) => {
            String::from_utf8(bytes).map_err(|_| format!("{field} is not UTF-8 PEM"))
        }
        Some(Specifier::InlineString(text)) => Ok(text),
        Some(_) => Err(format!("{field} is not inline")),
        None => Err(format!("{field} is missing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, TlsCertificate,
    };
    use envoy_types::pb::google::protobuf::Any;

    fn secret(name: &str, kind: SecretType) -> Any {
        Any {
            type_url: SECRET_TYPE_URL.to_owned(),
            value: Secret {
                name: name.to_owned(),
                r#type: Some(kind),
            }
            .encode_to_vec(),
        }
    }

    fn text(t: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(Specifier::InlineBytes(t.as_bytes().to_vec())),
            ..DataSource::default()
        })
    }

    fn answer(resources: Vec<Any>) -> Bytes {
        grpc_frame(
            &DiscoveryResponse {
                resources,
                ..DiscoveryResponse::default()
            }
            .encode_to_vec(),
        )
    }

    fn both() -> Vec<Any> {
        vec![
            secret(
                SERVICE_CERT,
                SecretType::TlsCertificate(TlsCertificate {
                    certificate_chain: text("CHAIN"),
                    private_key: text("KEY"),
                    ..TlsCertificate::default()
                }),
            ),
            secret(
                ROOT_CA,
                SecretType::ValidationContext(CertificateValidationContext {
                    trusted_ca: text("CA"),
                    ..CertificateValidationContext::default()
                }),
            ),
        ]
    }

    #[test]
    fn decodes_what_the_refresher_serves() {
        assert_eq!(
            decode_answer(answer(both())).unwrap(),
            Served {
                chain: "CHAIN".into(),
                key: "KEY".into(),
                ca: "CA".into()
            }
        );
    }

    #[test]
    fn malformed_and_hostile_answers_are_refused_naming_what_is_wrong() {
        let good = answer(both());
        let mut compressed = good.to_vec();
        compressed[0] = 1;
        let mut long = good.to_vec();
        long.extend_from_slice(b"trailing");
        let mut other = both();
        other[1].type_url = "type.googleapis.com/other".into();
        let mut unknown = both();
        unknown.push(secret(
            "stranger",
            SecretType::ValidationContext(CertificateValidationContext::default()),
        ));
        let not_inline = vec![secret(
            SERVICE_CERT,
            SecretType::TlsCertificate(TlsCertificate {
                certificate_chain: Some(DataSource {
                    specifier: Some(Specifier::Filename("/etc/passwd".into())),
                    ..DataSource::default()
                }),
                private_key: text("KEY"),
                ..TlsCertificate::default()
            }),
        )];
        for (body, named) in [
            (Bytes::from_static(b"\0\0"), "shorter"),
            (Bytes::from(compressed), "compressed"),
            (Bytes::from(long), "holds"),
            (
                grpc_frame(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
                "answer",
            ),
            (answer(other), "type"),
            (answer(unknown), "stranger"),
            (answer(both()[..1].to_vec()), "ROOTCA"),
            (answer(both()[1..].to_vec()), "default"),
            (answer(not_inline), "not inline"),
            (answer(Vec::new()), "default"),
        ] {
            let err = decode_answer(body).unwrap_err();
            assert!(err.contains(named), "{named}: {err}");
        }
    }

    #[tokio::test]
    async fn a_socket_that_is_not_there_or_silent_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sds.sock");
        let err = fetch(&socket, Duration::from_secs(1)).await.unwrap_err();
        assert!(err.contains("sds.sock"), "{err}");
        // a listener that never answers the HTTP/2 handshake
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let err = fetch(&socket, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.contains("within"), "{err}");
    }
}
