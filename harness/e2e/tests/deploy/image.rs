//! The release image, run with podman: what a cluster runs is what these tests run.
//!
//! The tests build the image first, once, with `deploy/image.sh` (its binaries in
//! `target/image-build`: this `cargo test` holds the lock of `target/`), or take the one named by
//! `ATHENZ_IMAGE`. They need buildah, podman, runc, binutils and cargo-auditable, which `.ci/run`
//! installs, and root; without them they fail and say what is missing, as the other tools' tests
//! do. They run one at a time: they share the image's mount and port 53.
//!
//! podman on this kind of host needs `--runtime runc` (crun 1.8 refuses a hybrid cgroup host) and
//! explicit rlimits (root here lacks CAP_SYS_RESOURCE), both as flags, no host change.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

#[path = "../stack/common/mod.rs"]
mod common;
use common::Devstack;

#[path = "image/support.rs"]
mod support;
use support::{
    BIN_DIR, BINARIES, DAEMONS, MAX_IMAGE_BYTES, MountedImage, VERSION, embedded_dependencies,
    has_interpreter, image, names_of, one_at_a_time, podman, podman_run, text,
};

#[path = "image/arm64.rs"]
mod arm64;

#[test]
fn every_binary_answers_version_with_no_network_read_only_as_65532() {
    let _serial = one_at_a_time();
    for name in BINARIES.iter().chain(DAEMONS.iter()) {
        let out = podman_run(
            &["--network", "none", "--read-only", "--user", "65532"],
            &[name, "--version"],
        );
        assert!(out.status.success(), "{name} --version: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {VERSION}\n"),
            "{name} --version"
        );
    }
    // the daemon binary names a daemon first, too; a name that is none is refused
    let out = podman_run(
        &["--network", "none", "--read-only", "--user", "65532"],
        &["athenz-daemons", "athenz-callback", "--version"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("athenz-callback {VERSION}\n")
    );
    let out = podman_run(&["--network", "none"], &["athenz-daemons", "sh"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"sh\" is not a daemon"));
}

#[test]
fn the_image_holds_static_audited_binaries_as_user_65532_with_its_labels() {
    let _serial = one_at_a_time();
    let out = podman(&["image", "inspect", &image()]);
    assert!(out.status.success(), "{}", text(&out));
    let inspect: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert!(
        config["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "PATH=/usr/local/bin"),
        "{config}"
    );
    let labels = &config["Labels"];
    let label = |key: &str| {
        labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_else(|| panic!("label org.opencontainers.image.{key} missing: {labels}"))
            .to_owned()
    };
    assert_eq!(label("version"), VERSION);
    assert_eq!(label("licenses"), "Apache-2.0");
    assert_eq!(label("title"), "athenz-k8s-identity");
    assert!(label("source").starts_with("https://github.com/"));
    let revision = label("revision");
    let commit = revision.trim_end_matches("-dirty");
    assert!(
        commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "revision {revision}"
    );
    assert!(label("created").starts_with("20"), "{}", label("created"));
    // the reference names the version
    assert!(image().ends_with(&format!(":{VERSION}")), "{}", image());

    let mounted = MountedImage::mount();
    // nothing but the binaries: no shell, no libc, no package database
    let mut everything = BTreeSet::new();
    let mut stack = vec![mounted.root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path.strip_prefix(&mounted.root).unwrap().to_owned();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
            everything.insert(relative.to_string_lossy().into_owned());
        }
    }
    let mut expected: BTreeSet<String> = ["usr", "usr/local", BIN_DIR]
        .iter()
        .map(|d| d.to_string())
        .collect();
    expected.extend(
        BINARIES
            .iter()
            .chain(DAEMONS.iter())
            .map(|b| format!("{BIN_DIR}/{b}")),
    );
    assert_eq!(everything, expected);

    for daemon in DAEMONS {
        assert_eq!(
            std::fs::read_link(mounted.bin().join(daemon)).unwrap(),
            Path::new("athenz-daemons"),
            "{daemon}"
        );
    }
    let mut total = 0;
    for binary in BINARIES {
        let path = mounted.bin().join(binary);
        let elf = std::fs::read(&path).unwrap();
        total += elf.len() as u64;
        assert!(!has_interpreter(&elf), "{binary} is dynamically linked");
        let deps = embedded_dependencies(&path);
        let names = names_of(&deps["packages"]);
        for needed in ["athenz-core", "rustls", "aws-lc-rs", "tokio"] {
            assert!(
                names.contains(needed),
                "{binary}: {needed} not in {names:?}"
            );
        }
        let root_crate = if binary == "athenz-daemons" {
            "athenz-daemons"
        } else {
            binary
        };
        assert!(names.contains(root_crate), "{binary}: {names:?}");
    }
    assert!(
        total <= MAX_IMAGE_BYTES,
        "the image's binaries are {total} bytes, over {MAX_IMAGE_BYTES}"
    );
    let size = inspect[0]["Size"].as_u64().unwrap();
    assert!(
        size <= MAX_IMAGE_BYTES,
        "the image is {size} bytes, over {MAX_IMAGE_BYTES}"
    );
    eprintln!("image: binaries {total} bytes; podman's size {size} bytes");
}

/// A loopback TCP listener that counts connections (and closes each): proof that a name
/// resolved to it, whatever the client then makes of the closed connection.
struct CountingListener {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingListener {
    fn start(ip: &str) -> Self {
        let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `athenz-control-sia init` in the image, on the host's network, with this `/etc/hosts` and
/// `/etc/resolv.conf`, asking ZTS at `zts_url`: its output.
fn control_sia_init(files: &Path, zts_url: &str) -> Output {
    let volume = |name: &str, target: &str| format!("{}:{target}:ro", files.join(name).display());
    let (hosts, resolv, keys) = (
        volume("hosts", "/etc/hosts"),
        volume("resolv.conf", "/etc/resolv.conf"),
        volume("keys", "/keys"),
    );
    let url = format!("--zts-url={zts_url}");
    podman_run(
        &[
            "--network",
            "host",
            "--read-only",
            "--user",
            "65532",
            "-v",
            &hosts,
            "-v",
            &resolv,
            "-v",
            &keys,
            "--tmpfs",
            "/out",
        ],
        &[
            "athenz-control-sia",
            "init",
            "--key-dir=/keys",
            "--domain=k8s.admin",
            "--service=athenz-callback",
            &url,
            "--zts-ca=/keys/ca.pem",
            "--dns-suffix=athenz.cloud",
            "--out-dir=/out",
            "--init-timeout=2s",
            "--zts-timeout=1s",
        ],
    )
}

/// The image has no NSS modules and no nsswitch.conf: glibc's static resolver must still read
/// `/etc/hosts`, and `/etc/resolv.conf`'s server, search list and `ndots`, as kubelet writes them
/// for a pod (`<ns>.svc.cluster.local svc.cluster.local cluster.local`, `ndots:5`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// the guard only orders tests, each on its own runtime: nothing on this one contends for it
#[allow(clippy::await_holding_lock)]
async fn names_resolve_from_etc_hosts_and_a_dns_search_list_in_the_image() {
    let _serial = one_at_a_time();
    assert!(
        nix::unistd::geteuid().is_root(),
        "binds a DNS server on port 53"
    );
    let zts = CountingListener::start("127.0.0.1");
    let dns = athenz_testbed::dns::Dns::start_on("127.0.0.153:53".parse().unwrap())
        .await
        .unwrap();
    dns.set(
        "zts.athenz-system.svc.cluster.local",
        &["127.0.0.1".parse().unwrap()],
    );

    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(files.path().join(name), text).unwrap();
    write(
        "hosts",
        "127.0.0.1 localhost\n127.0.0.1 zts-from-hosts.test\n",
    );
    write(
        "resolv.conf",
        "nameserver 127.0.0.153\nsearch athenz-system.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:1 attempts:1\n",
    );
    let keys = files.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let key =
        athenz_core::crypto::PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256).unwrap();
    std::fs::write(
        keys.join("service.key"),
        key.to_pkcs8_pem().unwrap().expose(),
    )
    .unwrap();
    std::fs::write(keys.join("service.version"), "0").unwrap();
    let ca = athenz_testbed::pki::CertAuthority::new_root("resolution test CA").unwrap();
    std::fs::write(keys.join("ca.pem"), ca.root_pem()).unwrap();
    // user 65532 reads them: a test key, thrown away
    for entry in std::fs::read_dir(files.path())
        .unwrap()
        .chain(std::fs::read_dir(&keys).unwrap())
    {
        use std::os::unix::fs::PermissionsExt;
        let path = entry.unwrap().path();
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(
        files.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let run = |host: &str| {
        let url = format!("https://{host}:{}/zts/v1", zts.port);
        let before = zts.accepted();
        let out = tokio::task::block_in_place(|| control_sia_init(files.path(), &url));
        (zts.accepted() - before, out)
    };

    // /etc/hosts
    let (connections, out) = run("zts-from-hosts.test");
    assert!(
        connections > 0,
        "no connection by /etc/hosts: {}",
        text(&out)
    );
    // DNS, by the search list: a short name (fewer dots than ndots) tried with each suffix
    let (connections, out) = run("zts");
    assert!(connections > 0, "no connection by DNS: {}", text(&out));
    assert!(
        dns.asked()
            .contains(&"zts.athenz-system.svc.cluster.local".to_owned()),
        "{:?}",
        dns.asked()
    );
    // a name neither knows: no connection, and the failure names it (the checks above can fail)
    let (connections, out) = run("nowhere");
    assert_eq!(connections, 0, "{}", text(&out));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nowhere"), "{stderr}");
    assert!(
        dns.asked()
            .contains(&"nowhere.athenz-system.svc.cluster.local".to_owned()),
        "{:?}",
        dns.asked()
    );
}

/// The end-to-end path with the image's binaries: the devstack runs its components from the
/// image's `/usr/local/bin` (`--components`), so the driver, agent, jwt-service, callback,
/// initializer, SIA and control SIA a cluster would run are the ones issuing this identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// the guard only orders tests, each on its own runtime: nothing on this one contends for it
#[allow(clippy::await_holding_lock)]
async fn the_devstack_runs_on_the_images_binaries() {
    let _serial = one_at_a_time();
    let mounted = MountedImage::mount();
    let bin = mounted.bin();
    let stack = Devstack::start_with(&["--components", bin.to_str().unwrap()]);
    // every component process is the image's binary
    let daemons = std::fs::canonicalize(bin.join("athenz-daemons")).unwrap();
    let info = stack.current_info();
    let mut checked = BTreeSet::new();
    for (component, pid) in &info.processes {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        for daemon in ["agent", "jwt", "callback", "initializer"] {
            if component.contains(daemon) {
                assert_eq!(exe, daemons, "{component} runs {}", exe.display());
                checked.insert(daemon);
            }
        }
    }
    assert_eq!(checked.len(), 4, "{:?}", info.processes);

    support::identity_through(&stack, "web-image", "10.1.0.41", Duration::from_secs(30)).await;
    drop(stack);
}
