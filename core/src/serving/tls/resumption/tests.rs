//! Resumption as the servers here allow it, with real rustls clients in memory on a clock the
//! tests move: minutes of reconnecting clients without waiting for them.

use super::*;
use crate::tls::clock::ManualClock;
use crate::tls::test_pki::{TestCa, client, client_config, handshake, secs, server_identity};
use crate::tls::{ClientAuth, ClientCas, ReloadingClientCa, ServerTls, server_config_on_clock};
use rustls::version::{TLS12, TLS13};
use rustls::{ClientConfig, SupportedProtocolVersion};
use std::time::Duration;

/// What one connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A full handshake, the client verified.
    Full,
    /// A resumed handshake whose session still verifies.
    Resumed,
    /// A resumed handshake the check refuses: the connection is closed unserved.
    ResumedRefused,
    /// A full handshake the verifier refused.
    HandshakeRefused,
}

impl Seen {
    fn accepted(self) -> bool {
        matches!(self, Seen::Full | Seen::Resumed)
    }
}

fn connect(server: &ServerTls, client_config: &Arc<ClientConfig>) -> Seen {
    let mut c = client(client_config);
    let mut s = ServerConnection::new(Arc::clone(server.config())).unwrap();
    if handshake(&mut c, &mut s).is_err() {
        return Seen::HandshakeRefused;
    }
    let resumed = s.handshake_kind() == Some(HandshakeKind::Resumed);
    match (resumed, server.resumed_sessions().check(&s)) {
        (false, _) => Seen::Full,
        (true, Ok(())) => Seen::Resumed,
        (true, Err(_)) => Seen::ResumedRefused,
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// A client whose certificate lasts 3 minutes reconnects every minute for 10 minutes: accepted
/// through its certificate's notAfter (inclusive, as webpki reads it), refused from then on,
/// whether it resumes (TLS 1.2: the session is verified again, and refused) or cannot (TLS 1.3:
/// every handshake full).
#[test]
fn a_resuming_client_is_refused_once_its_certificate_expires() {
    use Seen::{Full, HandshakeRefused as Refused, Resumed, ResumedRefused};
    // minutes 0 to 10; the certificate's notAfter is at 180 s
    let cases: [(&'static SupportedProtocolVersion, Vec<Seen>); 2] = [
        (
            &TLS12,
            // resumed from the minute-0 session until it is 300 s old, then full handshakes
            [&[Full][..], &[Resumed; 3], &[ResumedRefused], &[Refused; 6]].concat(),
        ),
        (&TLS13, [&[Full; 4][..], &[Refused; 7]].concat()),
    ];
    for (version, want) in cases {
        let clock = ManualClock::starting_now();
        let start = clock.now().as_secs();
        let not_after = start + 180;
        let ca = TestCa::new("Athenz Root");
        let server = server_config_on_clock(
            server_identity(&ca),
            ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
            clock.clone(),
        )
        .unwrap();
        let key = ca.leaf_between("sys.auth.zts", &[], secs(start - 60), secs(not_after));
        let client = client_config(&ca, key, &[version]);
        let mut seen = Vec::new();
        for minute in 0..=10 {
            clock.set(secs(start + 60 * minute));
            let now = clock.now().as_secs();
            let this = connect(&server, &client);
            assert_eq!(
                this.accepted(),
                now <= not_after,
                "{version:?} at {} s: {this:?}",
                now - start
            );
            seen.push(this);
        }
        assert_eq!(seen, want, "{version:?}");
    }
}

/// The one check that verifies no chain is the one made for a config that asks for no client
/// certificate (the admission webhook's): its clients resume without a certificate, so there is
/// nothing to verify however long they go on; and a resumed session that carries a chain all
/// the same is refused, never waved through.
#[test]
fn without_client_certificates_no_chain_is_verified_and_one_carried_is_refused() {
    let clock = ManualClock::starting_now();
    let start = clock.now().as_secs();
    let ca = TestCa::new("Athenz Root");
    let webhook =
        server_config_on_clock(server_identity(&ca), ClientCas::NotAsked, clock.clone()).unwrap();
    assert!(!webhook.resumed_sessions().verifies_chains());
    // the client holds a certificate it is never asked for
    let key = ca.leaf_between("sys.auth.zts", &[], secs(start - 60), secs(start + 100));
    let api_server = client_config(&ca, key, &[&TLS12]);
    assert_eq!(connect(&webhook, &api_server), Seen::Full);
    clock.advance(MINUTE);
    assert_eq!(connect(&webhook, &api_server), Seen::Resumed);
    clock.advance(MINUTE);
    assert_eq!(connect(&webhook, &api_server), Seen::Resumed, "no chain");

    // a session whose client presented a chain, checked by the check that verifies none
    let verifying = server_config_on_clock(
        server_identity(&ca),
        ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
        clock.clone(),
    )
    .unwrap();
    let zts = client_config(&ca, ca.leaf("sys.auth.zts", &[]), &[&TLS12]);
    assert_eq!(connect(&verifying, &zts), Seen::Full);
    let mut c = client(&zts);
    let mut s = ServerConnection::new(Arc::clone(verifying.config())).unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(s.handshake_kind(), Some(HandshakeKind::Resumed));
    assert!(verifying.resumed_sessions().check(&s).is_ok());
    assert!(matches!(
        ResumedSessionCheck::no_client_certificates(clock).check(&s),
        Err(ResumptionRefused::CertificateNotAsked)
    ));
}

/// A CA removed from a reloaded bundle is refused at once: its clients' sessions are forgotten,
/// so resuming clients fall back to a full handshake and are refused; a new client is refused;
/// and a connection resumed from a session stored under the old bundle is refused when checked.
#[test]
fn a_ca_removed_from_the_bundle_is_refused_at_once() {
    let clock = ManualClock::starting_now();
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        TestCa::new("Athenz Old Root"),
        TestCa::new("Athenz New Root"),
    );
    let bundle = dir.path().join("client-ca.pem");
    std::fs::write(&bundle, format!("{}{}", old.pem, new.pem)).unwrap();
    let client_ca = ReloadingClientCa::load(&bundle).unwrap();
    let server = server_config_on_clock(
        server_identity(&old),
        ClientCas::Reloading(client_ca.clone()),
        clock.clone(),
    )
    .unwrap();
    assert!(server.resumed_sessions().verifies_chains());
    let zts = client_config(&old, old.leaf("sys.auth.zts", &[]), &[&TLS12]);
    let agent = client_config(&old, old.leaf("k8s.nodes.node-1", &[]), &[&TLS13]);
    let renewed = client_config(&old, new.leaf("sys.auth.zts", &[]), &[&TLS12]);
    assert_eq!(connect(&server, &zts), Seen::Full);
    assert_eq!(connect(&server, &agent), Seen::Full);
    assert_eq!(connect(&server, &renewed), Seen::Full);
    clock.advance(MINUTE);
    assert_eq!(connect(&server, &zts), Seen::Resumed);
    // a connection resumed just before the change, checked just after it
    let mut c = client(&zts);
    let mut resumed_before = ServerConnection::new(Arc::clone(server.config())).unwrap();
    handshake(&mut c, &mut resumed_before).unwrap();
    assert_eq!(
        resumed_before.handshake_kind(),
        Some(HandshakeKind::Resumed)
    );
    let check = server.resumed_sessions();
    assert!(check.check(&resumed_before).is_ok());

    std::fs::write(&bundle, &new.pem).unwrap();
    assert!(client_ca.reload().unwrap());
    assert!(matches!(
        check.check(&resumed_before),
        Err(ResumptionRefused::Untrusted(_))
    ));
    // no time passes: the old CA's clients are refused now, not in 5 minutes
    assert_eq!(connect(&server, &zts), Seen::HandshakeRefused, "resuming");
    assert_eq!(connect(&server, &agent), Seen::HandshakeRefused);
    let newcomer = client_config(&old, old.leaf("sys.auth.zts", &[]), &[&TLS12]);
    assert_eq!(connect(&server, &newcomer), Seen::HandshakeRefused);
    // the new CA's client was forgotten too, and is verified again, with the new bundle
    assert_eq!(connect(&server, &renewed), Seen::Full);
    assert_eq!(connect(&server, &renewed), Seen::Resumed);
}

/// rustls stores a TLS 1.2 session once, at its full handshake: resuming it every 50 s does not
/// extend it, and the chain of resumptions ends 300 s after the full handshake.
#[test]
fn tls12_resumptions_never_extend_the_session_bound() {
    let clock = ManualClock::starting_now();
    let start = clock.now().as_secs();
    let ca = TestCa::new("Athenz Root");
    let server = server_config_on_clock(
        server_identity(&ca),
        ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
        clock.clone(),
    )
    .unwrap();
    let client = client_config(&ca, ca.leaf("sys.auth.zts", &[]), &[&TLS12]);
    let at = |offset: u64| {
        clock.set(secs(start + offset));
        connect(&server, &client)
    };
    assert_eq!(at(0), Seen::Full);
    for offset in [50, 100, 150, 200, 250, 299] {
        assert_eq!(at(offset), Seen::Resumed, "at {offset} s");
    }
    assert_eq!(at(300), Seen::Full, "300 s after the full handshake");
    assert_eq!(at(350), Seen::Resumed, "from the new full handshake");
    assert_eq!(at(599), Seen::Resumed);
    assert_eq!(at(600), Seen::Full);
}

/// No server here sends TLS 1.3 tickets, so a TLS 1.3 client never resumes.
#[test]
fn tls13_never_resumes() {
    let clock = ManualClock::starting_now();
    let ca = TestCa::new("Athenz Root");
    let server = server_config_on_clock(
        server_identity(&ca),
        ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
        clock.clone(),
    )
    .unwrap();
    let client = client_config(&ca, ca.leaf("k8s.nodes.node-1", &[]), &[&TLS13]);
    for _ in 0..3 {
        assert_eq!(connect(&server, &client), Seen::Full);
        clock.advance(Duration::from_secs(10));
    }
}

/// Every builder: no TLS 1.3 tickets, HTTP/2 then HTTP/1.1.
#[test]
fn every_server_config_sends_no_tls13_tickets() {
    let ca = TestCa::new("Athenz Root");
    let cas = std::slice::from_ref(&ca.cert);
    let configs = [
        crate::tls::server_config(server_identity(&ca), cas).unwrap(),
        crate::tls::server_config_with(server_identity(&ca), cas, ClientAuth::Optional).unwrap(),
        crate::tls::server_config_without_client_auth(server_identity(&ca)).unwrap(),
    ];
    for tls in configs {
        let config = tls.config();
        assert_eq!(config.send_tls13_tickets, 0);
        assert_eq!(config.alpn_protocols, [&b"h2"[..], &b"http/1.1"[..]]);
    }
}
