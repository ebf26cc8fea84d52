//! The server side of one mutual-TLS handshake, measured: what the callback cannot avoid for each
//! call ZTS makes on a new connection. ZTS speaks TLS 1.2 from one `SSLContext` whose session
//! cache resumes (docs/design.md §4.4), so the least a confirmation costs the callback is a
//! resumed handshake (key schedule, Finished messages); a full one adds the key exchange, its
//! signature and checking ZTS's chain. Both ends run in memory with the configuration the
//! callback serves (`athenz_core::tls::server_config`, P-256 certificates from one CA) and the
//! dev ZTS's client (TLS 1.2, ZTS's CN check); only the server's calls are timed.

use anyhow::{Context, bail};
use athenz_core::crypto::{KeyAlgorithm, pem_certificates};
use athenz_core::tls::{self, ClientIdentity, ReloadingIdentity};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use rustls::client::Resumption;
use rustls::{ClientConnection, HandshakeKind, ServerConnection};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Mean microseconds the server spends on one handshake of `kind`, over `runs` handshakes.
pub fn server_side_us(kind: HandshakeKind, runs: u32) -> anyhow::Result<f64> {
    athenz_core::install_crypto_provider();
    let ca = CertAuthority::new_root("bench handshake CA")?;
    let server = ca.issue(
        &LeafSpec::service("athenz.callback", &["callback.bench"]),
        KeyAlgorithm::P256,
    )?;
    let client = ca.issue(
        &LeafSpec::service("sys.auth.zts", &["zts.bench"]),
        KeyAlgorithm::P256,
    )?;
    let dir = tempfile::tempdir().context("a directory for the handshake's certificates")?;
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, &server.chain_pem).context("writing the server certificate")?;
    std::fs::write(&key_path, server.key_pem.expose()).context("writing the server key")?;
    let cas = pem_certificates(ca.root_pem())?;
    let server_config = tls::server_config(ReloadingIdentity::load(&cert_path, &key_path)?, &cas)?;
    let mut client_config = tls::client_config_expecting_cn_only(
        &cas,
        Some(ClientIdentity::Fixed(tls::certified_key_from_pem(
            &client.chain_pem,
            client.key_pem.expose(),
        )?)),
        "athenz.callback",
        &[&rustls::version::TLS12],
    )?;
    if kind != HandshakeKind::Resumed {
        client_config.resumption = Resumption::disabled();
    }
    let client_config = Arc::new(client_config);
    let name = rustls_pki_types::ServerName::try_from("callback.bench")?;
    let connect = || -> anyhow::Result<(Duration, Option<HandshakeKind>)> {
        let mut client = ClientConnection::new(client_config.clone(), name.clone())?;
        let mut server = ServerConnection::new(Arc::clone(server_config.config()))?;
        let time = handshake(&mut client, &mut server)?;
        Ok((time, server.handshake_kind()))
    };
    // a resuming client's first handshake is full: it makes the session
    connect()?;
    let mut server_time = Duration::ZERO;
    for _ in 0..runs {
        let (time, made) = connect()?;
        if made != Some(kind) {
            bail!("a {kind:?} handshake was asked for, the server made {made:?}");
        }
        server_time += time;
    }
    Ok(server_time.as_secs_f64() * 1e6 / f64::from(runs))
}

/// Runs one handshake to completion (tickets included); returns the server's share of the time.
fn handshake(
    client: &mut ClientConnection,
    server: &mut ServerConnection,
) -> anyhow::Result<Duration> {
    let mut server_time = Duration::ZERO;
    for _ in 0..16 {
        let mut to_server = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut to_server)?;
        }
        let t = Instant::now();
        let mut incoming = to_server.as_slice();
        while !incoming.is_empty() {
            server.read_tls(&mut incoming)?;
            server.process_new_packets()?;
        }
        let mut to_client = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut to_client)?;
        }
        server_time += t.elapsed();
        let mut incoming = to_client.as_slice();
        while !incoming.is_empty() {
            client.read_tls(&mut incoming)?;
            client.process_new_packets()?;
        }
        if !client.is_handshaking() && !server.is_handshaking() && !client.wants_write() {
            return Ok(server_time);
        }
    }
    bail!("the in-memory handshake did not finish")
}

#[cfg(test)]
mod tests {
    use rustls::HandshakeKind;

    #[test]
    fn both_kinds_are_measured_as_asked() {
        for kind in [HandshakeKind::Full, HandshakeKind::Resumed] {
            let us = super::server_side_us(kind, 3).unwrap();
            assert!(us > 0.0 && us.is_finite(), "{kind:?}: {us}");
        }
        let refused = super::server_side_us(HandshakeKind::FullWithHelloRetryRequest, 1);
        assert!(
            refused.is_err(),
            "no retry was asked of the server: {refused:?}"
        );
    }
}
