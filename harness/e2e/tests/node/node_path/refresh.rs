//! Refreshes on the node path: the agent's checks of the pair before anything leaves the node,
//! the SIA's refresh loop (its consistent set, its timing, SIGTERM), a re-registration once the
//! certificate expired.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_checks_the_pair_before_anything_leaves_the_node() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-7", &uid(7), "10.1.2.7");
    let other = pod_with_volume(&node, "web-8", &uid(8), "10.1.2.8");
    let mine = client(&node, &id).init().await.unwrap();
    let theirs = client(&node, &other).init().await.unwrap();
    let pair = |key: &Secret, cert: &str| RefreshRequest {
        key_pem: key.clone(),
        cert_pem: cert.to_owned(),
    };
    let stranger_key = PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256)
        .unwrap()
        .to_pkcs8_pem()
        .unwrap();
    for (request, why) in [
        (pair(&Secret::new("garbage"), "garbage"), "garbage"),
        (pair(&stranger_key, &mine.cert_pem), "mismatched pair"),
        (
            pair(theirs.key_pem.as_ref().unwrap(), &theirs.cert_pem),
            "another volume's certificate",
        ),
    ] {
        let (code, message) = refused(client(&node, &id).refresh(&request).await.unwrap_err());
        assert_eq!(code, 400, "{why}: {message}");
    }
    assert_eq!(refreshes(&node).await, 0.0, "ZTS was called");
    // oversized body: 413
    let big = format!(
        "POST /v1/refresh/{id} HTTP/1.1\r\nhost: x\r\ncontent-length: 70000\r\nconnection: close\r\n\r\n{}",
        "x".repeat(70_000)
    );
    assert_eq!(raw(&node.socket, big.as_bytes()).await.0, 413);

    // the happy refresh, twice; then the first certificate again, superseded twice: refused by
    // the agent (ZTS never sees it, so it does not revoke the instance)
    let second = client(&node, &id)
        .refresh(&pair(mine.key_pem.as_ref().unwrap(), &mine.cert_pem))
        .await
        .unwrap();
    assert_ne!(second.cert_pem, mine.cert_pem);
    let third = client(&node, &id)
        .refresh(&pair(second.key_pem.as_ref().unwrap(), &second.cert_pem))
        .await
        .unwrap();
    assert_eq!(refreshes(&node).await, 2.0);
    let (code, message) = refused(
        client(&node, &id)
            .refresh(&pair(mine.key_pem.as_ref().unwrap(), &mine.cert_pem))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("superseded"), "{message}");
    assert_eq!(refreshes(&node).await, 2.0, "ZTS was called");
    // the one presented for the latest refresh is still accepted (an answer the pod never
    // wrote), as ZTS accepts its previous serial; then the one before is superseded
    let fourth = client(&node, &id)
        .refresh(&pair(second.key_pem.as_ref().unwrap(), &second.cert_pem))
        .await
        .unwrap();
    assert_ne!(fourth.cert_pem, third.cert_pem);
    let (code, message) = refused(
        client(&node, &id)
            .refresh(&pair(third.key_pem.as_ref().unwrap(), &third.cert_pem))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.contains("superseded")),
        (403, true),
        "{message}"
    );
}

/// A certificate of this volume's exact names that Athenz did not issue now — self-signed, from
/// another CA, or expired — is refused by the agent with the reason, and ZTS is never called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_refuses_certificates_athenz_did_not_issue_without_asking_zts() {
    use athenz_testbed::pki::{CertAuthority, LeafSpec};
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-12", &uid(12), "10.1.2.12");
    let mine = client(&node, &id).init().await.unwrap();
    let info = CertInfo::from_pem(&mine.cert_pem).unwrap();
    let key = PrivateKey::from_pem(mine.key_pem.as_ref().unwrap().expose()).unwrap();
    let spec = |validity: time::Duration, backdate: time::Duration| LeafSpec {
        common_name: info.common_name.clone(),
        organizational_units: info.organizational_units.clone(),
        dns_names: info.dns_names.clone(),
        ip_addresses: info.ip_addresses.clone(),
        uris: info.uris.clone(),
        emails: Vec::new(),
        validity,
        backdate,
    };
    let day = time::Duration::days(1);
    // the right CA, the right names and key, but expired
    let expired = node
        .zts
        .ca()
        .issue_for_key(&spec(-day, day * 2), &key.public_key_der())
        .unwrap();
    // the right names and key under a CA Athenz does not use
    let other_ca = CertAuthority::new_root("Not Athenz")
        .unwrap()
        .issue_for_key(
            &spec(day, time::Duration::minutes(1)),
            &key.public_key_der(),
        )
        .unwrap();
    // self-signed by the pod's own key, made by openssl
    let uri_sans: Vec<String> = info.uris.iter().map(|u| format!("URI:{u}")).collect();
    let self_signed = openssl::run(
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "/dev/stdin",
            "-days",
            "1",
            "-subj",
            &format!("/CN={}", info.common_name),
            "-addext",
            &format!("subjectAltName={}", uri_sans.join(",")),
        ],
        mine.key_pem.as_ref().unwrap().expose().as_bytes(),
    )
    .unwrap();
    let self_signed =
        self_signed[self_signed.find("-----BEGIN CERTIFICATE-----").unwrap()..].to_owned();
    for (cert, why) in [
        (expired.chain_pem.as_str(), "expired"),
        (other_ca.chain_pem.as_str(), "not issued by the Athenz CA"),
        (self_signed.as_str(), "not issued by the Athenz CA"),
    ] {
        let request = RefreshRequest {
            key_pem: mine.key_pem.clone().unwrap(),
            cert_pem: cert.to_owned(),
        };
        let (code, message) = refused(client(&node, &id).refresh(&request).await.unwrap_err());
        assert_eq!(code, 403, "{why}: {message}");
        assert!(message.contains(why), "{why}: {message}");
    }
    assert_eq!(refreshes(&node).await, 0.0, "ZTS was called");
    // and the real one still refreshes
    let request = RefreshRequest {
        key_pem: mine.key_pem.clone().unwrap(),
        cert_pem: mine.cert_pem.clone(),
    };
    client(&node, &id).refresh(&request).await.unwrap();
    assert_eq!(refreshes(&node).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_keeps_a_consistent_set_and_stops_on_sigterm() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-12", &uid(12), "10.1.2.12");
    let out = node.dir.path().join("out12");
    let output = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // refresh as often as allowed, while a reader checks every pair it reads
    let mut child = sia(&node, "refresh", &id, &out, &[("REFRESH_INTERVAL", "50ms")])
        .await
        .spawn()
        .unwrap();
    let set = athenz_core::files::FileSet::new(&out);
    let first = read(&out, CERT_FILE);
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} refreshes seen",
            seen.len()
        );
        let files = set.read(&[KEY_FILE, CERT_FILE]).unwrap();
        let key = PrivateKey::from_pem(std::str::from_utf8(&files[0]).unwrap()).unwrap();
        let cert = CertInfo::from_pem(std::str::from_utf8(&files[1]).unwrap()).unwrap();
        assert!(
            key_matches_cert(&key, &cert),
            "a reader saw a key and certificate of different issues"
        );
        seen.insert(cert.serial_hex);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_ne!(read(&out, CERT_FILE), first);
    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_without_files_or_id_says_why() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-13", &uid(13), "10.1.2.13");
    let out = node.dir.path().join("empty");
    let output = sia(&node, "refresh", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no current identity"));
    let output = sia(&node, "init", &id, &out, &[("ID_FILE", "/nonexistent/id")])
        .await
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--id-file (ID_FILE)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_timing_follows_the_certificate_lifetime() {
    // one-minute certificates, not backdated: the refresh is due at 70 % of the lifetime, minus
    // up to 10 % jitter — between 36 s and 42 s after issue
    let node = node_with(
        "p256",
        athenz_testbed::zts::DevZtsConfig {
            max_cert_lifetime_minutes: 1,
            cert_backdate_secs: 0,
            ..Default::default()
        },
    )
    .await;
    let id = pod_with_volume(&node, "web-14", &uid(14), "10.1.2.14");
    let out = node.dir.path().join("out14");
    let output = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let first = CertInfo::from_pem(&read(&out, CERT_FILE)).unwrap();
    assert_eq!((first.not_after - first.not_before).whole_seconds(), 60);
    let _child = sia(&node, "refresh", &id, &out, &[]).await.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(70);
    let refreshed_at = loop {
        let now = time::OffsetDateTime::now_utc();
        if CertInfo::from_pem(&read(&out, CERT_FILE))
            .is_ok_and(|c| c.serial_hex != first.serial_hex)
        {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the certificate was never refreshed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = (refreshed_at - first.not_before).whole_seconds();
    assert!(
        (34..=46).contains(&after),
        "refreshed {after} s into a 60 s certificate"
    );
}

/// The refresh sidecar whose certificate expired (ZTS or the agent away longer than it lived)
/// registers anew instead of asking to refresh a certificate no one refreshes, and the pod is
/// whole again; before, the agent refused the refresh, the sidecar exited, and a restart of it
/// could never heal (found by `athenz-devstack chaos`, fault zts-stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_registers_anew_once_the_certificate_expired() {
    use athenz_core::files::{Credentials, FileSet, write_credentials};
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-30", &uid(30), "10.1.2.30");
    let out = node.dir.path().join("out");
    let init = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    // the set now holds an expired certificate of the same key
    let key_pem = read(&out, KEY_FILE);
    let expired = athenz_testbed::pki::expired_self_signed(&key_pem, "media.sports.web").unwrap();
    write_credentials(
        &FileSet::new(&out),
        &Credentials {
            key_pem: Some(&Secret::new(key_pem)),
            cert_pem: &expired,
            ca_pem: &read(&out, CA_FILE),
            ntoken: &Secret::new(read(&out, NTOKEN_FILE)),
        },
        None,
    )
    .unwrap();
    let mut refresher = sia(&node, "refresh", &id, &out, &[]).await.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let renewed = loop {
        let cert = read(&out, CERT_FILE);
        if cert != expired {
            break cert;
        }
        assert!(
            refresher.try_wait().unwrap().is_none(),
            "the refresher exited instead of registering anew"
        );
        assert!(Instant::now() < deadline, "no new certificate within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let info = CertInfo::from_pem(&renewed).unwrap();
    assert!(info.not_after > time::OffsetDateTime::now_utc());
    assert_eq!(info.common_name, "media.sports.web");
    assert!(key_matches_cert(
        &PrivateKey::from_pem(&read(&out, KEY_FILE)).unwrap(),
        &info
    ));
    let chain = pem_certificates(&renewed).unwrap();
    openssl::verify(
        node.zts.root_pem(),
        &athenz_core::crypto::der_to_pem(&chain[1]),
        &athenz_core::crypto::der_to_pem(&chain[0]),
    )
    .unwrap();
    // and it keeps running, refreshing as usual from here
    assert!(refresher.try_wait().unwrap().is_none());
    refresher.kill().await.unwrap();
}
