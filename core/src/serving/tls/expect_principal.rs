//! Client configs that accept one server principal only: the server certificate's CN is checked
//! in the handshake, before any request byte (such as an attestation token) is sent. With the
//! host name checked as well (WebPKI), or, as Athenz ZTS checks an instance provider
//! (`ProviderHostnameVerifier`), with the CN standing in for it.

use super::{ClientIdentity, TlsError, principal_of, provider, root_store, with_identity};
use rustls::{ClientConfig, SignatureScheme};
use rustls_pki_types::CertificateDer;
use std::sync::Arc;

/// A client config like [`client_config`] that also refuses, during the handshake, a server whose
/// certificate CN is not `expected_principal` — before any request byte (such as an attestation
/// token) is sent. Hostname and chain are verified as usual.
pub fn client_config_expecting(
    cas: &[CertificateDer<'static>],
    identity: Option<ClientIdentity>,
    expected_principal: &str,
) -> Result<ClientConfig, TlsError> {
    client_config_verifying(
        cas,
        identity,
        expected_principal,
        HostName::Checked,
        rustls::DEFAULT_VERSIONS,
    )
}

/// A client config that trusts `cas` and accepts a server whose certificate chains to them and
/// whose CN is `expected_principal`, whatever host names it carries: what Athenz ZTS checks of an
/// instance provider (`ProviderHostnameVerifier` replaces the host name check with the CN check;
/// the chain is still verified by ZTS's trust store), speaking only the TLS `versions` given.
pub fn client_config_expecting_cn_only(
    cas: &[CertificateDer<'static>],
    identity: Option<ClientIdentity>,
    expected_principal: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ClientConfig, TlsError> {
    client_config_verifying(
        cas,
        identity,
        expected_principal,
        HostName::Ignored,
        versions,
    )
}

fn client_config_verifying(
    cas: &[CertificateDer<'static>],
    identity: Option<ClientIdentity>,
    expected_principal: &str,
    host_name: HostName,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ClientConfig, TlsError> {
    let roots = root_store(cas)?;
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let verifier = Arc::new(ExpectedPrincipalVerifier {
        inner,
        expected: expected_principal.to_owned(),
        host_name,
    });
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    Ok(with_identity(builder, identity))
}

/// Whether a server certificate must name the host connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostName {
    /// It must (WebPKI).
    Checked,
    /// It need not: the CN check stands in for it.
    Ignored,
}

/// Verifies the server as WebPKI does (chain to the roots, name unless ignored, validity), then
/// requires its certificate CN to be one principal.
#[derive(Debug)]
struct ExpectedPrincipalVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    expected: String,
    host_name: HostName,
}

impl rustls::client::danger::ServerCertVerifier for ExpectedPrincipalVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        // WebPKI checks the name last, after the chain and validity: a name error means
        // everything else passed.
        let verified = match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) if self.host_name == HostName::Ignored => {
                rustls::client::danger::ServerCertVerified::assertion()
            }
            other => other?,
        };
        match principal_of(end_entity) {
            Some(cn) if cn == self.expected => Ok(verified),
            other => Err(rustls::Error::General(format!(
                "server certificate principal {other:?} is not the expected {:?}",
                self.expected
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
