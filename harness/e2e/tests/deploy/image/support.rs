//! What the image's tests share: the image (built once per test binary), podman, the image
//! mounted, and readers of its ELF binaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::Devstack;
use athenz_devstack::{identity, node};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const BIN_DIR: &str = "usr/local/bin";
/// The daemons, each a link to `athenz-daemons` (the manifests' commands, and the node
/// authorizer's static pod); `daemons/src/lib.rs`'s `DAEMONS`, which `image_layout` holds
/// `deploy/build-binaries.sh` to.
pub const DAEMONS: [&str; 6] = [
    "athenz-identity-agent",
    "athenz-jwt-service",
    "athenz-callback",
    "athenz-initializer",
    "athenz-control-sia",
    "athenz-node-authorizer",
];
/// The binaries of their own.
pub const BINARIES: [&str; 3] = ["athenz-daemons", "athenz-sia", "athenz-volume-driver"];
/// The bound the release promises for everything in the image, uncompressed.
pub const MAX_IMAGE_BYTES: u64 = 25 * 1024 * 1024;

/// The image under test: `ATHENZ_IMAGE`, or the one `deploy/image.sh` builds now (once).
pub fn image() -> String {
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
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .expect("podman (apt-get install podman)")
}

/// `podman run --rm` with this host's rlimits, `options`, the image and `command`.
pub fn podman_run(options: &[&str], command: &[&str]) -> Output {
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

pub fn text(out: &Output) -> String {
    format!(
        "status {}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The image's file system, mounted read-only by podman, unmounted on drop.
pub struct MountedImage {
    pub root: PathBuf,
    reference: String,
}

impl MountedImage {
    /// The image under test (this host's platform of its index).
    pub fn mount() -> Self {
        Self::mount_reference(&image())
    }

    /// One platform's image of the index: `<reference>-linux-<arch>`, as `deploy/image.sh`
    /// names each in the local storage.
    pub fn mount_platform(arch: &str) -> Self {
        Self::mount_reference(&platform_image(arch))
    }

    fn mount_reference(reference: &str) -> Self {
        let out = podman(&["image", "mount", reference]);
        assert!(
            out.status.success(),
            "podman image mount {reference}: {}",
            text(&out)
        );
        let root = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        assert!(root.join(BIN_DIR).is_dir(), "{}", root.display());
        Self {
            root,
            reference: reference.to_owned(),
        }
    }

    pub fn bin(&self) -> PathBuf {
        self.root.join(BIN_DIR)
    }
}

impl Drop for MountedImage {
    fn drop(&mut self) {
        let _ = podman(&["image", "unmount", &self.reference]);
    }
}

/// Whether an ELF executable asks for a program interpreter (a dynamic loader): PT_INTERP.
pub fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not a 64-bit ELF file");
    assert_eq!(elf[5], 1, "not a little-endian ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// The dependency list `cargo auditable` embedded (section `.dep-v0`, zlib-compressed JSON),
/// read with binutils and Python's zlib: independent of the code that wrote it. An AArch64
/// binary is read with the cross binutils (`aarch64-linux-gnu-objcopy`, which
/// gcc-aarch64-linux-gnu brings): this host's objcopy knows only its own machine.
pub fn embedded_dependencies(binary: &Path) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let section = dir.path().join("dep-v0");
    let objcopy = match elf_machine(&std::fs::read(binary).unwrap()) {
        183 => "aarch64-linux-gnu-objcopy",
        _ => "objcopy",
    };
    let out = Command::new(objcopy)
        .arg("--dump-section")
        .arg(format!(".dep-v0={}", section.display()))
        .arg(binary)
        .arg(dir.path().join("copy"))
        .output()
        .unwrap_or_else(|e| {
            panic!("{objcopy}: {e} (apt-get install binutils; for arm64 gcc-aarch64-linux-gnu)")
        });
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

/// One platform's image of the index, in the local storage as `deploy/image.sh` names it.
pub fn platform_image(arch: &str) -> String {
    format!("{}-linux-{arch}", image())
}

/// The ELF machine of an executable (e_machine): 62 x86-64, 183 AArch64.
pub fn elf_machine(elf: &[u8]) -> u16 {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    u16::from_le_bytes([elf[0x12], elf[0x13]])
}

/// A pod of `media-sports` named `pod` through the stack's binaries: the flex driver's mount, the
/// SIA's init (an identity the dev ZTS signs, its chain verified by openssl), the SIA as the
/// refresh sidecar replacing the set within `refresh_within`, and the driver's unmount.
pub async fn identity_through(stack: &Devstack, pod: &str, ip: &str, refresh_within: Duration) {
    let volume = stack.pod("media-sports", pod, ip).await;
    node::sia_init(&stack.info, &volume).await.unwrap();
    let first = identity::check(&volume.credentials_dir).unwrap();
    assert_eq!(first.common_name, "media.sports.web");
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

    let logs = stack.dir.path().join("state/logs");
    let mut sidecar = node::sia_refresh(&stack.info, &volume, "1s", &logs, &[])
        .await
        .unwrap();
    let deadline = Instant::now() + refresh_within;
    loop {
        if let Ok(now) = identity::check(&volume.credentials_dir)
            && now.serial != first.serial
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refresh within {refresh_within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sidecar.stop().await;
    assert!(sidecar.wait_exit(Duration::from_secs(10)).await.unwrap());
    node::unmount(&stack.info, &volume).await.unwrap();
    assert!(!volume.mount_dir.exists(), "the driver unmounted");
}

/// The `name`s of a JSON list of packages: `.dep-v0`'s `packages`, or an SBOM's `components`.
pub fn names_of(list: &serde_json::Value) -> BTreeSet<&str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect()
}
