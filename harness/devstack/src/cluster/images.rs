//! Images without a registry: built here with buildah from scratch (static binaries only),
//! written as OCI archives and imported into containerd's `k8s.io` namespace, where the CRI
//! plugin finds them. Tags are never `latest` (that means pull policy `Always`, and there is
//! nothing to pull from).
//!
//! The pause image is our own: a static C program that does what Kubernetes' pause does (sleep
//! until SIGINT or SIGTERM, reap orphans when it is PID 1 of a shared PID namespace).

use super::Layout;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pause image's name (what containerd's `pinned_images.sandbox` says).
pub const PAUSE_IMAGE: &str = "localhost/athenz-devstack/pause:3.10";

/// The pause program (`pause.c`, beside this file): Kubernetes' `pause.c`, reduced to what it
/// does.
const PAUSE_C: &str = include_str!("pause.c");

/// An image to build from scratch.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// `name:tag` (not `latest`).
    pub name: String,
    /// Files to copy in: (host path, path in the image).
    pub files: Vec<(PathBuf, String)>,
    /// The entrypoint (absolute path in the image, then arguments).
    pub entrypoint: Vec<String>,
}

/// Runs a command to completion; fails with its output if it fails.
pub fn run(command: &mut Command, what: &str) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("{what}: starting {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// buildah with its storage under `images/buildah` (vfs: no mounts to leave behind, and the
/// images here are a few MiB).
fn buildah(images: &Path) -> Command {
    let mut command = Command::new("buildah");
    command
        .arg("--root")
        .arg(images.join("buildah/root"))
        .arg("--runroot")
        .arg(images.join("buildah/run"))
        .arg("--storage-driver")
        .arg("vfs");
    command
}

/// Builds `spec` into an OCI archive under `images_dir` and returns its path.
pub fn build(images_dir: &Path, spec: &ImageSpec) -> anyhow::Result<PathBuf> {
    let Some((_, tag)) = spec.name.rsplit_once(':') else {
        bail!("image {}: give it a tag (never latest)", spec.name);
    };
    if tag == "latest" || tag.contains('/') {
        bail!("image {}: give it a tag other than latest", spec.name);
    }
    let what = format!("building image {}", spec.name);
    let container = run(
        buildah(images_dir).args(["from", "--pull-never", "scratch"]),
        &what,
    )?;
    let result = (|| {
        for (source, target) in &spec.files {
            run(
                buildah(images_dir)
                    .args(["copy", "--quiet", &container])
                    .arg(source)
                    .arg(target),
                &what,
            )?;
        }
        let entrypoint =
            serde_json::to_string(&spec.entrypoint).context("encoding the entrypoint")?;
        run(
            buildah(images_dir).args([
                "config",
                "--entrypoint",
                &entrypoint,
                "--cmd",
                "",
                &container,
            ]),
            &what,
        )?;
        run(
            buildah(images_dir).args(["commit", "--quiet", &container, &spec.name]),
            &what,
        )?;
        let file_name = spec.name.replace(['/', ':'], "_");
        let archive = images_dir.join(format!("{file_name}.tar"));
        let _ = std::fs::remove_file(&archive);
        let target = format!("oci-archive:{}:{}", archive.display(), spec.name);
        run(
            buildah(images_dir).args(["push", "--quiet", &spec.name, &target]),
            &what,
        )?;
        Ok(archive)
    })();
    let _ = run(buildah(images_dir).args(["rm", &container]), &what);
    result
}

/// [`build`], unless the archive from an earlier build of the same spec (same name, entrypoint
/// and files of the same size and modification time) is still there: the image build cache
/// outlives a cluster.
pub fn build_once(images_dir: &Path, spec: &ImageSpec) -> anyhow::Result<PathBuf> {
    let file_name = spec.name.replace(['/', ':'], "_");
    let archive = images_dir.join(format!("{file_name}.tar"));
    let stamp_path = images_dir.join(format!("{file_name}.stamp"));
    let mut stamp = format!("{}\n{:?}\n", spec.name, spec.entrypoint);
    for (source, target) in &spec.files {
        let meta = std::fs::metadata(source)
            .with_context(|| format!("image {}: reading {}", spec.name, source.display()))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .unwrap_or_default();
        stamp.push_str(&format!(
            "{} {} {} {}\n",
            source.display(),
            target,
            meta.len(),
            modified.as_nanos()
        ));
    }
    if archive.is_file() && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(archive);
    }
    let _ = std::fs::remove_file(&stamp_path);
    let built = build(images_dir, spec)?;
    std::fs::write(&stamp_path, stamp)
        .with_context(|| format!("writing {}", stamp_path.display()))?;
    Ok(built)
}

/// The image reference an OCI archive names (`org.opencontainers.image.ref.name` of its one
/// manifest, as buildah and skopeo write it and `ctr images import` reads it).
pub fn archive_reference(archive: &Path) -> anyhow::Result<String> {
    let output = run(
        Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"),
        &format!("reading index.json of {}", archive.display()),
    )?;
    let index: serde_json::Value = serde_json::from_str(&output)
        .with_context(|| format!("{}: index.json is not JSON", archive.display()))?;
    let names: Vec<&str> = index["manifests"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    match names.as_slice() {
        [name] if name.contains(':') => Ok((*name).to_owned()),
        _ => bail!(
            "{}: expected one manifest named with a full reference (name:tag), found {names:?}",
            archive.display()
        ),
    }
}

/// Imports an OCI archive into every node's containerd (a DaemonSet's pods run on each).
pub fn import(layout: &Layout, archive: &Path) -> anyhow::Result<()> {
    for socket in layout.containerd_sockets() {
        import_into(layout, &socket, archive)?;
    }
    Ok(())
}

/// Imports an OCI archive into the `k8s.io` namespace of the containerd at `socket`.
pub fn import_into(layout: &Layout, socket: &Path, archive: &Path) -> anyhow::Result<()> {
    run(
        Command::new(layout.bin("ctr"))
            .arg("--address")
            .arg(socket)
            .args([
                "--namespace",
                super::CONTAINERD_NAMESPACE,
                "images",
                "import",
            ])
            .arg(archive),
        &format!("importing {}", archive.display()),
    )?;
    Ok(())
}

/// Builds `spec` and imports it into the cluster's containerd.
pub fn build_and_import(layout: &Layout, spec: &ImageSpec) -> anyhow::Result<()> {
    let archive = build(&layout.images, spec)?;
    import(layout, &archive)
}

/// Compiles `source` (C) statically into `<dir>/<name>` unless the same source was compiled
/// there before (so an image built from it stays cached); returns the binary.
pub fn compile_static(dir: &Path, name: &str, source: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let source_path = dir.join(format!("{name}.c"));
    let binary = dir.join(name);
    if binary.is_file() && std::fs::read_to_string(&source_path).is_ok_and(|s| s == source) {
        return Ok(binary);
    }
    let _ = std::fs::remove_file(&source_path);
    let _ = std::fs::remove_file(&binary);
    std::fs::write(&source_path, source)
        .with_context(|| format!("writing {}", source_path.display()))?;
    run(
        Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(&binary)
            .arg(&source_path),
        &format!("compiling {name} (gcc -static; needs libc6-dev)"),
    )?;
    Ok(binary)
}

/// Builds `source` (one Go `main` package, the standard library only) as a static binary `name`
/// in `dir` (`CGO_ENABLED=0 go build`), unless the binary there was built from the same source.
pub fn compile_go_static(dir: &Path, name: &str, source: &str) -> anyhow::Result<PathBuf> {
    let module = dir.join(format!("{name}-module"));
    std::fs::create_dir_all(&module).with_context(|| format!("creating {}", module.display()))?;
    let source_path = module.join("main.go");
    let binary = dir.join(name);
    if binary.is_file() && std::fs::read_to_string(&source_path).is_ok_and(|s| s == source) {
        return Ok(binary);
    }
    let _ = std::fs::remove_file(&source_path);
    let _ = std::fs::remove_file(&binary);
    std::fs::write(module.join("go.mod"), format!("module {name}\n\ngo 1.24\n"))
        .with_context(|| format!("writing {}", module.join("go.mod").display()))?;
    std::fs::write(&source_path, source)
        .with_context(|| format!("writing {}", source_path.display()))?;
    run(
        Command::new("go")
            .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(&module)
            .env("CGO_ENABLED", "0")
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local"),
        &format!("building {name} (go build; needs the Go toolchain)"),
    )?;
    Ok(binary)
}

/// Compiles the pause program statically and builds [`PAUSE_IMAGE`] from it (the archive, ready
/// to import once containerd runs).
pub fn build_pause(layout: &Layout) -> anyhow::Result<PathBuf> {
    let binary = compile_static(&layout.images.join("pause"), "pause", PAUSE_C)?;
    build_once(
        &layout.images,
        &ImageSpec {
            name: PAUSE_IMAGE.to_owned(),
            files: vec![(binary, "/pause".to_owned())],
            entrypoint: vec!["/pause".to_owned()],
        },
    )
}
