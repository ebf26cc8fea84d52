//! A test PKI made with rcgen directly (the harness's PKI, athenz-testbed, depends on this
//! crate), and in-memory handshakes between rustls clients and servers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{CertifiedKey, ClientIdentity, InMemoryIdentity, certified_key, provider, root_store};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::{ClientConfig, ClientConnection, ServerConnection, SupportedProtocolVersion};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::sync::Arc;
use time::OffsetDateTime;

/// A root CA.
pub(crate) struct TestCa {
    /// Its certificate.
    pub(crate) cert: CertificateDer<'static>,
    /// Its certificate, PEM.
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A time as rcgen wants it.
pub(crate) fn datetime(at: UnixTime) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(i64::try_from(at.as_secs()).unwrap()).unwrap()
}

impl TestCa {
    /// A root valid a day either side of now.
    pub(crate) fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let now = OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(1);
        let cert = params.self_signed(&key).unwrap();
        Self {
            cert: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `cn` (and `dns` names), valid from `not_before` through `not_after`.
    pub(crate) fn leaf_between(
        &self,
        cn: &str,
        dns: &[&str],
        not_before: UnixTime,
        not_after: UnixTime,
    ) -> Arc<CertifiedKey> {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_before = datetime(not_before);
        params.not_after = datetime(not_after);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        certified_key(vec![cert.der().clone()], key).unwrap()
    }

    /// A leaf valid a day either side of now.
    pub(crate) fn leaf(&self, cn: &str, dns: &[&str]) -> Arc<CertifiedKey> {
        let now = UnixTime::now().as_secs();
        let day = 24 * 3600;
        self.leaf_between(cn, dns, secs(now - day), secs(now + day))
    }
}

/// `secs` after the epoch.
pub(crate) fn secs(secs: u64) -> UnixTime {
    UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs))
}

/// The server's identity: a `localhost` certificate of `ca`.
pub(crate) fn server_identity(ca: &TestCa) -> Arc<InMemoryIdentity> {
    let identity = Arc::new(InMemoryIdentity::default());
    identity.set(ca.leaf("k8s.admin.athenz-callback", &["localhost"]));
    identity
}

/// A client trusting `server_ca`, presenting `key`, speaking only `versions`; it resumes as
/// rustls clients do by default (its sessions are kept by the config, shared by every
/// connection made with it).
pub(crate) fn client_config(
    server_ca: &TestCa,
    key: Arc<CertifiedKey>,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(root_store(std::slice::from_ref(&server_ca.cert)).unwrap());
    Arc::new(super::with_identity(
        builder,
        Some(ClientIdentity::Fixed(key)),
    ))
}

/// A new client connection to `localhost`.
pub(crate) fn client(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(
        Arc::clone(config),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap()
}

/// Runs a handshake between the two ends in memory; the error is the first either side hit.
pub(crate) fn handshake(
    client: &mut ClientConnection,
    server: &mut ServerConnection,
) -> Result<(), rustls::Error> {
    let mut buf = Vec::new();
    for _ in 0..20 {
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
        buf.clear();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        let mut rd = buf.as_slice();
        while !rd.is_empty() {
            server.read_tls(&mut rd).unwrap();
        }
        server.process_new_packets()?;
        buf.clear();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        let mut rd = buf.as_slice();
        while !rd.is_empty() {
            client.read_tls(&mut rd).unwrap();
        }
        client.process_new_packets()?;
    }
    panic!("the handshake did not finish");
}
