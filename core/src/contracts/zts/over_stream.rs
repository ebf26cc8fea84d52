//! ZTS's instance refresh over a byte stream the caller already has: a pod that makes its own
//! key refreshes through the node agent's `CONNECT` tunnel (docs/design.md §4.6), so the TLS
//! session (with the pod's certificate and key as the client identity) runs inside the pod and the
//! agent sees only ciphertext.

use super::{
    InstanceIdentity, InstanceRef, InstanceRefreshInformation, MAX_RESPONSE_LEN, ZtsError,
    certificate_alert, decode_answer,
};
use crate::client::error_chain;
use crate::tls::{ClientIdentity, client_config};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use rustls_pki_types::{CertificateDer, ServerName};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// `POST <base>/instance/{provider}/{domain}/{service}/{id}` over `stream` (connected to ZTS's
/// host and port of `base_url`): TLS verifying ZTS by `ca_certs` and the URL's host, `current`
/// as the client certificate, one HTTP/1.1 request, all within `timeout`. Answers and errors as
/// [`super::ZtsClient::refresh_instance`] gives them.
#[allow(clippy::too_many_arguments)]
pub async fn refresh_instance_over<S>(
    stream: S,
    base_url: &str,
    ca_certs: &[CertificateDer<'static>],
    current: ClientIdentity,
    target: &InstanceRef<'_>,
    info: &InstanceRefreshInformation,
    timeout: Duration,
) -> Result<InstanceIdentity, ZtsError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    target.validate()?;
    let base: http::Uri = base_url
        .trim_end_matches('/')
        .parse()
        .map_err(|e| ZtsError::Unreachable(format!("ZTS URL {base_url:?}: {e}")))?;
    let host = base
        .host()
        .ok_or_else(|| ZtsError::Unreachable(format!("ZTS URL {base_url:?} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let authority = base
        .authority()
        .map(ToString::to_string)
        .unwrap_or_else(|| host.clone());
    let path = format!(
        "{}{}",
        base.path().trim_end_matches('/'),
        target.refresh_path()
    );
    let body = serde_json::to_vec(info)
        .map_err(|e| ZtsError::Unreachable(format!("encoding the request: {e}")))?;
    let call = async {
        let tls = client_config(ca_certs, Some(current))
            .map_err(|e| ZtsError::Unreachable(format!("TLS setup: {e}")))?;
        let name = ServerName::try_from(host.clone())
            .map_err(|e| ZtsError::Unreachable(format!("ZTS host {host:?}: {e}")))?;
        let tls_stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, stream)
            .await
            .map_err(|e| refused_or_unreachable(&e))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls_stream))
                .await
                .map_err(|e| ZtsError::Unreachable(error_chain(&e)))?;
        let driver = tokio::spawn(connection);
        let request = http::Request::post(path.as_str())
            .header(http::header::HOST, authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ZtsError::Unreachable(format!("building the request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| refused_or_unreachable(&e))?;
        let status = response.status().as_u16();
        let answer = Limited::new(response.into_body(), MAX_RESPONSE_LEN)
            .collect()
            .await
            .map_err(|e| ZtsError::BadResponse {
                context: "instance identity",
                reason: e.to_string(),
            })?
            .to_bytes();
        driver.abort();
        decode_answer(status, &answer, 200, "instance identity")
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| ZtsError::Unreachable(format!("no answer from ZTS within {timeout:?}")))?
}

/// A TLS or HTTP failure: ZTS refusing the client certificate in the handshake, or no answer.
fn refused_or_unreachable(e: &(dyn std::error::Error + 'static)) -> ZtsError {
    if certificate_alert(e).is_some() {
        ZtsError::CertificateRefused(error_chain(e))
    } else {
        ZtsError::Unreachable(error_chain(e))
    }
}
