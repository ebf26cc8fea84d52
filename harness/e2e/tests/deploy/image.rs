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

use athenz_devstack::identity;
use athenz_devstack::node;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[path = "../stack/common/mod.rs"]
mod common;
use common::Devstack;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const BIN_DIR: &str = "usr/local/bin";
/// The daemons, each a link to `athenz-daemons` (the manifests' commands, and the node
/// authorizer's static pod); `daemons/src/lib.rs`'s `DAEMONS`, which `image_layout` holds
/// `deploy/build-binaries.sh` to.
const DAEMONS: [&str; 6] = [
    "athenz-identity-agent",
    "athenz-jwt-service",
    "athenz-callback",
    "athenz-initializer",
    "athenz-control-sia",
    "athenz-node-authorizer",
];
/// The binaries of their own.
const BINARIES: [&str; 3] = ["athenz-daemons", "athenz-sia", "athenz-volume-driver"];
/// The bound the release promises for everything in the image, uncompressed.
const MAX_IMAGE_BYTES: u64 = 25 * 1024 * 1024;

/// The image under test: `ATHENZ_IMAGE`, or the one `deploy/image.sh` builds now (once).
fn image() -> String {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if let Ok(image) = std::env::var("ATHENZ_IMAGE") {
                return image;
            }
            let repo = athenz_testbed::bins::repo_root();
            let started = Instant::now();
            let out = Command::new(repo.join("deploy/image.sh"))
                .env("CARGO_TARGET_DIR", repo.join("target/image-build"))
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("deploy/image.sh");
            assert!(
                out.status.success(),
                "deploy/image.sh failed (it needs buildah, binutils and cargo-auditable: \
                 apt-get install buildah podman runc binutils; cargo install cargo-auditable \
                 --locked --version 0.7.7): {}",
                text(&out)
            );
            let stdout = String::from_utf8(out.stdout).unwrap();
            let image = stdout.lines().last().unwrap().trim().to_owned();
            eprintln!("built {image} in {:.0?}", started.elapsed());
            image
        })
        .clone()
}

/// Held by each test: they share the image's mount (one test's unmount would pull it from
/// under another) and the DNS port.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .expect("podman (apt-get install podman)")
}

/// `podman run --rm` with this host's rlimits, `options`, the image and `command`.
fn podman_run(options: &[&str], command: &[&str]) -> Output {
    let image = image();
    let mut args = vec![
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1000:1000",
    ];
    args.extend_from_slice(options);
    args.push(&image);
    args.extend_from_slice(command);
    podman(&args)
}

fn text(out: &Output) -> String {
    format!(
        "status {}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The image's file system, mounted read-only by podman, unmounted on drop.
struct MountedImage {
    root: PathBuf,
}

impl MountedImage {
    fn mount() -> Self {
        let out = podman(&["image", "mount", &image()]);
        assert!(out.status.success(), "podman image mount: {}", text(&out));
        let root = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        assert!(root.join(BIN_DIR).is_dir(), "{}", root.display());
        Self { root }
    }

    fn bin(&self) -> PathBuf {
        self.root.join(BIN_DIR)
    }
}

impl Drop for MountedImage {
    fn drop(&mut self) {
        let _ = podman(&["image", "unmount", &image()]);
    }
}

/// Whether an ELF executable asks for a program interpreter (a dynamic loader): PT_INTERP.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not a 64-bit ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// The dependency list `cargo auditable` embedded (section `.dep-v0`, zlib-compressed JSON),
/// read with binutils and Python's zlib: independent of the code that wrote it.
fn embedded_dependencies(binary: &Path) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let section = dir.path().join("dep-v0");
    let out = Command::new("objcopy")
        .arg("--dump-section")
        .arg(format!(".dep-v0={}", section.display()))
        .arg(binary)
        .arg(dir.path().join("copy"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: no .dep-v0 section: {}",
        binary.display(),
        text(&out)
    );
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, zlib; sys.stdout.write(zlib.decompress(open(sys.argv[1], 'rb').read()).decode())",
        ])
        .arg(&section)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

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
        let names: BTreeSet<&str> = deps["packages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
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

    let volume = stack.pod("media-sports", "web-image", "10.1.0.41").await;
    node::sia_init(&stack.info, &volume).await.unwrap();
    let first = identity::check(&volume.credentials_dir).unwrap();
    let chain = std::fs::read_to_string(volume.credentials_dir.join("service.cert.pem")).unwrap();
    let certs = athenz_core::crypto::pem_certificates(&chain).unwrap();
    let intermediates: String = certs[1..]
        .iter()
        .map(|c| athenz_core::crypto::der_to_pem(c))
        .collect();
    let root = std::fs::read_to_string(&stack.info.zts.ca).unwrap();
    athenz_testbed::openssl::verify(
        &root,
        &intermediates,
        &athenz_core::crypto::der_to_pem(&certs[0]),
    )
    .unwrap();

    // the image's SIA as the refresh sidecar replaces the set
    let logs = stack.dir.path().join("state/logs");
    let mut sidecar = node::sia_refresh(&stack.info, &volume, "1s", &logs, &[])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(now) = identity::check(&volume.credentials_dir)
            && now.serial != first.serial
        {
            break;
        }
        assert!(Instant::now() < deadline, "no refresh within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sidecar.stop().await;
    assert!(sidecar.wait_exit(Duration::from_secs(5)).await.unwrap());
    node::unmount(&stack.info, &volume).await.unwrap();
    drop(stack);
}
