//! The image's second platform: linux/arm64, cross-built on this amd64 host and run here under
//! qemu-user. The index `deploy/image.sh` writes must list both platforms with a digest and an
//! SBOM each; the arm64 binaries must be static AArch64 executables that answer as the amd64 ones
//! do; and an arm64 agent, jwt-service, callback, initializer, volume driver and SIA must issue
//! and refresh an identity against the dev ZTS, as the amd64 ones do in
//! `the_devstack_runs_on_the_images_binaries`.
//!
//! The arm64 processes the devstack starts run through the kernel's binfmt_misc entry for
//! AArch64 (`qemu-user-static`, registered by `.ci/run`: `update-binfmts --enable qemu-aarch64`);
//! the commands' own checks call `qemu-aarch64-static` by name. Without either, the tests fail
//! and name what is missing.

use super::common::Devstack;
use super::support::{
    BINARIES, DAEMONS, MAX_IMAGE_BYTES, MountedImage, VERSION, elf_machine, embedded_dependencies,
    has_interpreter, identity_through, image, names_of, one_at_a_time, platform_image, podman,
    text,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const EM_AARCH64: u16 = 183;
const EM_X86_64: u16 = 62;
const QEMU: &str = "qemu-aarch64-static";
const BINFMT_ENTRY: &str = "/proc/sys/fs/binfmt_misc/qemu-aarch64";

/// The index's archive, digest file and per-platform files, as `deploy/image.sh` names them.
fn release_file(suffix: &str) -> PathBuf {
    athenz_testbed::bins::repo_root().join(format!(
        "target/image/athenz-k8s-identity-{VERSION}{suffix}"
    ))
}

fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// {"linux/<arch>": digest} of an image index's manifests (its JSON).
fn platforms(index: &serde_json::Value) -> BTreeMap<String, String> {
    index["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("no manifests: {index}"))
        .iter()
        .map(|m| {
            let platform = &m["platform"];
            (
                format!(
                    "{}/{}",
                    platform["os"].as_str().unwrap(),
                    platform["architecture"].as_str().unwrap()
                ),
                m["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_index_lists_linux_amd64_and_linux_arm64_each_with_its_digest_and_sbom() {
    let _serial = one_at_a_time();
    let reference = image();
    let archive = release_file(".oci.tar");
    // the archive, as a registry receives it (`skopeo copy --all`)
    let out = Command::new("skopeo")
        .arg("inspect")
        .arg("--raw")
        .arg(format!("oci-archive:{}", archive.display()))
        .output()
        .expect("skopeo (apt-get install skopeo)");
    assert!(out.status.success(), "skopeo inspect --raw: {}", text(&out));
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let listed = platforms(&index);
    assert_eq!(
        listed.keys().map(String::as_str).collect::<Vec<_>>(),
        ["linux/amd64", "linux/arm64"],
        "{index}"
    );
    // the index's digest is the digest of those bytes; each platform's is in its own file
    let digest = {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(&out.stdout);
        format!(
            "sha256:{}",
            hash.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    };
    assert_eq!(read_trimmed(&release_file(".digest")), digest);
    for (platform, platform_digest) in &listed {
        let arch = platform.trim_start_matches("linux/");
        let file = release_file(&format!(".linux-{arch}.digest"));
        assert_eq!(&read_trimmed(&file), platform_digest, "{}", file.display());
        // its SBOM names that platform's manifest, and only that platform's binaries
        let sbom: serde_json::Value = serde_json::from_str(&read_trimmed(&release_file(&format!(
            ".linux-{arch}.cdx.json"
        ))))
        .unwrap();
        let component = &sbom["metadata"]["component"];
        let purl = component["purl"].as_str().unwrap();
        let encoded = platform_digest.replace(':', "%3A");
        assert!(
            purl.contains(&format!("@{encoded}?arch={arch}&")),
            "{arch}: {purl}"
        );
        assert_eq!(component["properties"][0]["value"], platform.as_str());
        let names = names_of(&sbom["components"]);
        for needed in [
            "athenz-daemons",
            "athenz-sia",
            "athenz-volume-driver",
            "aws-lc-rs",
        ] {
            assert!(names.contains(needed), "{arch}: {needed} not in its SBOM");
        }
    }
    // the same index in the local storage, under the reference
    let out = podman(&["manifest", "inspect", &reference]);
    assert!(
        out.status.success(),
        "podman manifest inspect: {}",
        text(&out)
    );
    let local: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        platforms(&local).keys().collect::<Vec<_>>(),
        ["linux/amd64", "linux/arm64"]
    );
    // each platform's image: its architecture, and within the size the release promises
    for arch in ["amd64", "arm64"] {
        let out = podman(&["image", "inspect", &platform_image(arch)]);
        assert!(out.status.success(), "{}", text(&out));
        let inspect: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(inspect[0]["Architecture"], arch);
        assert_eq!(inspect[0]["Os"], "linux");
        assert_eq!(inspect[0]["Config"]["User"], "65532:65532");
        let size = inspect[0]["Size"].as_u64().unwrap();
        assert!(
            size <= MAX_IMAGE_BYTES,
            "linux/{arch}: {size} bytes, over {MAX_IMAGE_BYTES}"
        );
        eprintln!("linux/{arch}: {size} bytes");
    }
}

#[test]
fn the_arm64_binaries_are_static_audited_aarch64_executables() {
    let _serial = one_at_a_time();
    let arm64 = MountedImage::mount_platform("arm64");
    let mut everything: Vec<String> = std::fs::read_dir(arm64.bin())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    everything.sort();
    let mut expected: Vec<String> = BINARIES
        .iter()
        .chain(DAEMONS.iter())
        .map(|b| b.to_string())
        .collect();
    expected.sort();
    assert_eq!(everything, expected, "the same layout as linux/amd64");
    let mut total = 0;
    for binary in BINARIES {
        let path = arm64.bin().join(binary);
        let elf = std::fs::read(&path).unwrap();
        total += elf.len() as u64;
        assert_eq!(elf_machine(&elf), EM_AARCH64, "{binary}");
        assert!(!has_interpreter(&elf), "{binary} is dynamically linked");
        // and as `file` says it
        let out = Command::new("file")
            .arg(&path)
            .output()
            .expect("file (apt-get install file)");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("ARM aarch64") && said.contains("statically linked"),
            "{binary}: {said}"
        );
        let deps = embedded_dependencies(&path);
        assert!(
            deps["packages"].to_string().contains("\"aws-lc-sys\""),
            "{binary}: no aws-lc-sys in its dependency list"
        );
    }
    assert!(
        total <= MAX_IMAGE_BYTES,
        "linux/arm64's binaries are {total} bytes"
    );
    // the amd64 image is still amd64
    let amd64 = MountedImage::mount_platform("amd64");
    let elf = std::fs::read(amd64.bin().join("athenz-daemons")).unwrap();
    assert_eq!(elf_machine(&elf), EM_X86_64);
}

/// `qemu-aarch64-static <binary> args`: its output.
fn under_qemu(binary: &Path, args: &[&str]) -> std::process::Output {
    Command::new(QEMU)
        .arg(binary)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{QEMU}: {e} (apt-get install qemu-user-static)"))
}

#[test]
fn every_arm64_command_answers_version_and_help_under_qemu() {
    let _serial = one_at_a_time();
    let arm64 = MountedImage::mount_platform("arm64");
    for name in BINARIES.iter().chain(DAEMONS.iter()) {
        // through the link, as the manifests call it: the multicall binary reads its name
        let path = arm64.bin().join(name);
        let out = under_qemu(&path, &["--version"]);
        assert!(out.status.success(), "{name} --version: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {VERSION}\n"),
            "{name} --version"
        );
        let out = under_qemu(&path, &["--help"]);
        assert!(out.status.success(), "{name} --help: {}", text(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        if *name == "athenz-daemons" {
            // the multicall binary's own help names every daemon it runs
            for daemon in DAEMONS {
                assert!(help.contains(daemon), "athenz-daemons --help: {help}");
            }
        } else {
            assert!(help.contains("Usage:"), "{name} --help: {help}");
        }
    }
    // a name that is no daemon is refused, as on amd64
    let out = under_qemu(&arm64.bin().join("athenz-daemons"), &["sh"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// The binfmt_misc entry that runs AArch64 executables with qemu: what lets the devstack start
/// the arm64 binaries as it starts any other.
fn assert_binfmt_registered() {
    let entry = std::fs::read_to_string(BINFMT_ENTRY).unwrap_or_default();
    assert!(
        entry.starts_with("enabled"),
        "{BINFMT_ENTRY} is not enabled ({entry:?}): mount -t binfmt_misc binfmt_misc \
         /proc/sys/fs/binfmt_misc && update-binfmts --enable qemu-aarch64 (qemu-user-static, \
         binfmt-support; .ci/run does both)"
    );
}

/// The arm64 agent, jwt-service, callback and initializer (the devstack's components, from the
/// arm64 image), the arm64 flex driver's mount and unmount, and the arm64 SIA's init and refresh:
/// an identity the dev ZTS signs, verified by openssl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// the guard only orders tests, each on its own runtime: nothing on this one contends for it
#[allow(clippy::await_holding_lock)]
async fn an_arm64_sia_gets_an_identity_from_an_arm64_agent_under_qemu() {
    let _serial = one_at_a_time();
    assert_binfmt_registered();
    let arm64 = MountedImage::mount_platform("arm64");
    let bin = arm64.bin();
    let started = Instant::now();
    let stack = Devstack::start_with(&["--components", bin.to_str().unwrap()]);
    eprintln!(
        "the stack on arm64 binaries up in {:.1?}",
        started.elapsed()
    );
    // every component is an AArch64 process: the image's binary, run by qemu
    let daemons = std::fs::canonicalize(bin.join("athenz-daemons")).unwrap();
    let info = stack.current_info();
    let mut checked = BTreeSet::new();
    for (component, pid) in &info.processes {
        for daemon in ["agent", "jwt", "callback", "initializer"] {
            if component.contains(daemon) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
                let args: Vec<String> = cmdline
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
                assert!(
                    exe.to_string_lossy().contains("qemu"),
                    "{component} is not emulated: {}",
                    exe.display()
                );
                assert!(
                    args.iter()
                        .any(|a| std::fs::canonicalize(a).ok().as_ref() == Some(&daemons)),
                    "{component} does not run the arm64 athenz-daemons: {args:?}"
                );
                checked.insert(daemon);
            }
        }
    }
    assert_eq!(checked.len(), 4, "{:?}", info.processes);
    // the driver and the SIA the tests run are the arm64 image's
    for (argv, binary) in [
        (&stack.info.volume_driver, "athenz-volume-driver"),
        (&stack.info.sia, "athenz-sia"),
    ] {
        let expected = std::fs::canonicalize(bin.join(binary)).unwrap();
        assert_eq!(
            std::fs::canonicalize(&argv[0]).ok(),
            Some(expected),
            "{binary}: {argv:?}"
        );
    }

    let timed = Instant::now();
    // the arm64 SIA's init, then the arm64 SIA as the refresh sidecar (the emulated handshakes
    // take longer: a minute for the refresh)
    identity_through(&stack, "web-arm64", "10.1.0.42", Duration::from_secs(60)).await;
    eprintln!(
        "mounted, issued, verified, refreshed and unmounted in {:.1?}",
        timed.elapsed()
    );
    drop(stack);
}
