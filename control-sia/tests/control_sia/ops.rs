//! The operations endpoint of `refresh`: metrics of what it wrote, readiness, its listen
//! setting's errors.

use super::*;

/// A free loopback port (the child binds it moments later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on `addr`: the status and body; `None` while nothing answers there.
async fn get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.get(9..12)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// Polls `GET path` (bounded) until its status is `status`; returns the body.
async fn until_status(addr: std::net::SocketAddr, path: &str, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match get(addr, path).await {
            Some((s, body)) if s == status => return body,
            other => assert!(
                Instant::now() < deadline,
                "{path} never answered {status}; last: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the sample `series` (name and labels, as served) in an exposition.
fn sample(exposition: &str, series: &str) -> Option<i64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

const SERVICE_LABEL: &str = "{service=\"k8s.admin.athenz-callback\"}";

/// The operations endpoint of `refresh`: the expiry gauges are what is on disk (the certificate's
/// notAfter, the ntoken's `e=`), each ZTS call is counted, /readyz is ready with a valid
/// certificate, and the endpoint goes away with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_serves_the_expiry_of_what_it_wrote_on_metrics() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let out = f.out_dir("metrics");
    let ops: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = f
        .command("refresh", &key_dir, &out)
        .env("OPS_LISTEN", ops.to_string())
        .spawn()
        .unwrap();

    until_status(ops, "/readyz", 200).await;
    assert_eq!(until_status(ops, "/healthz", 200).await, "ok\n");
    let metrics = until_status(ops, "/metrics", 200).await;
    let cert = CertInfo::from_pem(&read(&out, "service.cert.pem")).unwrap();
    let token = NToken::parse(&read(&out, "ntoken")).unwrap();
    assert_eq!(
        sample(
            &metrics,
            &format!("athenz_control_sia_certificate_expiry_seconds{SERVICE_LABEL}")
        ),
        Some(cert.not_after.unix_timestamp()),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("athenz_control_sia_ntoken_expiry_seconds{SERVICE_LABEL}")
        ),
        Some(token.expires),
        "{metrics}"
    );
    let refreshes = |outcome: &str| {
        sample(
            &metrics,
            &format!(
                "athenz_control_sia_refreshes_total{{service=\"k8s.admin.athenz-callback\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(refreshes("ok"), Some(1), "{metrics}");
    assert_eq!(
        f.zts.requests("key_refresh"),
        1,
        "one certificate asked for"
    );
    assert_eq!(refreshes("error"), Some(0), "{metrics}");
    for kind in [
        "# TYPE athenz_control_sia_certificate_expiry_seconds gauge",
        "# TYPE athenz_control_sia_ntoken_expiry_seconds gauge",
        "# TYPE athenz_control_sia_refreshes counter",
    ] {
        assert!(metrics.contains(kind), "{kind} not in\n{metrics}");
    }

    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(
        get(ops, "/healthz").await.is_none(),
        "still served after exit"
    );
}

/// Before ZTS has issued anything (here it refuses the key version) the sidecar is alive but not
/// ready, its certificate gauge is 0 (an expiry alert fires on it) and every refusal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_without_a_certificate_is_not_ready_and_counts_errors() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v9");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let out = f.out_dir("refused");
    let ops: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = f
        .command("refresh", &key_dir, &out)
        .arg(format!("--ops-listen={ops}"))
        .spawn()
        .unwrap();

    until_status(ops, "/healthz", 200).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let metrics = loop {
        let metrics = until_status(ops, "/metrics", 200).await;
        let errors = sample(
            &metrics,
            "athenz_control_sia_refreshes_total{service=\"k8s.admin.athenz-callback\",outcome=\"error\"}",
        );
        if errors.is_some_and(|n| n >= 1) {
            break metrics;
        }
        assert!(Instant::now() < deadline, "no error counted:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        sample(
            &metrics,
            &format!("athenz_control_sia_certificate_expiry_seconds{SERVICE_LABEL}")
        ),
        Some(0),
        "{metrics}"
    );
    assert_eq!(
        get(ops, "/readyz").await.map(|(status, _)| status),
        Some(503)
    );
    assert!(!out.join("service.cert.pem").exists());

    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
}

/// A malformed --ops-listen and an address already taken stop `refresh` at start with exit 2,
/// naming the setting, before anything is asked of ZTS or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_ops_listen_is_a_startup_error() {
    let f = Fixture::new().await;
    let (name, args, _) = FORMATS[0];
    let (key_dir, public) = f.key_dir(name, args, "v1");
    f.zts.add_service_key(PRINCIPAL, "v1", &public).unwrap();
    let out = f.out_dir("bad-ops");
    let run = |cmd: &mut tokio::process::Command| {
        let fut = cmd.output();
        async move {
            let o = fut.await.unwrap();
            (
                o.status.code().unwrap(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    };

    for bad in ["9091", "localhost:9091", "0.0.0.0:99999"] {
        let (code, stderr) = run(f.command("refresh", &key_dir, &out).env("OPS_LISTEN", bad)).await;
        assert_eq!(code, 2, "{bad}: {stderr}");
        assert!(stderr.contains("--ops-listen"), "{bad}: {stderr}");
    }

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let (code, stderr) = run(f
        .command("refresh", &key_dir, &out)
        .arg(format!("--ops-listen={addr}")))
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--ops-listen (OPS_LISTEN)") && stderr.contains(&addr.to_string()),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing written on a start-up error");
    assert_eq!(f.zts.requests("key_refresh"), 0, "ZTS was called");
}
