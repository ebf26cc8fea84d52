//! The release before this one, as CHANGELOG.md records it (its newest heading
//! `## X.Y.Z — YYYY-MM-DD (<commit>)`): that commit's `deploy/` and docs/operating.md, to
//! install it as it was installed, and its image, built from that commit with its own
//! `deploy/image.sh` (once: the archive is kept in the release cache, [`release_cache`]).

use athenz_devstack::cluster::runbook;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The previous release, extracted.
pub struct PreviousRelease {
    /// Its version (`0.2.0`).
    pub version: String,
    /// The commit it was cut from, as the CHANGELOG names it.
    pub commit: String,
    _dir: tempfile::TempDir,
    /// Its `deploy/`.
    pub deploy: PathBuf,
    /// Its docs/operating.md.
    pub page: PathBuf,
}

/// `git <args>` in the repository; its stdout, failing with its stderr.
fn git(repo: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .expect("git is needed to find the previous release");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Extracts `paths` of `commit` into `into` (git archive | tar -x).
fn extract(repo: &Path, commit: &str, paths: &[&str], into: &Path) {
    let mut args = vec!["archive", commit];
    args.extend(paths);
    let archive = git(repo, &args);
    std::fs::create_dir_all(into).unwrap();
    let mut tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(into)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &archive).unwrap();
    drop(tar.stdin.take());
    assert!(tar.wait().unwrap().success(), "extracting {commit}");
}

/// The version and commit of the newest released heading of `changelog`.
pub fn newest_release(changelog: &str) -> Option<(String, String)> {
    changelog.lines().find_map(|line| {
        let rest = line.strip_prefix("## ")?;
        let (version, rest) = rest.split_once(" — ")?;
        let (_date, commit) = rest.split_once(" (")?;
        let commit = commit.strip_suffix(')')?;
        let is_version =
            version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok());
        let is_commit =
            (7..=40).contains(&commit.len()) && commit.chars().all(|c| c.is_ascii_hexdigit());
        (is_version && is_commit).then(|| (version.to_owned(), commit.to_owned()))
    })
}

/// Where released images built from their commits are kept:
/// `$ATHENZ_RELEASE_CACHE`, else `${XDG_CACHE_HOME:-$HOME/.cache}/athenz-k8s-identity/releases`.
/// A commit's image never changes, so like Go's and cargo's caches this one outlives a clone
/// (CI's clean clones reuse it); deleting it only costs the build again.
fn release_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("ATHENZ_RELEASE_CACHE") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set: set ATHENZ_RELEASE_CACHE");
    cache.join("athenz-k8s-identity/releases")
}

impl PreviousRelease {
    /// Finds and extracts it; fails when the CHANGELOG names none, when this workspace still
    /// calls itself that version (the two images would share a tag), or when it has no install
    /// steps to run.
    pub fn from_changelog() -> Self {
        let repo = athenz_testbed::bins::repo_root();
        let changelog = std::fs::read_to_string(repo.join("CHANGELOG.md")).unwrap();
        let (version, commit) = newest_release(&changelog)
            .expect("CHANGELOG.md names no release as `## X.Y.Z — YYYY-MM-DD (<commit>)`");
        assert_ne!(
            version,
            env!("CARGO_PKG_VERSION"),
            "the workspace still calls itself {version}, which CHANGELOG.md says was released at \
             {commit}: give the unreleased work the next version"
        );
        let dir = tempfile::tempdir().unwrap();
        extract(&repo, &commit, &["deploy", "docs/operating.md"], dir.path());
        let page = dir.path().join("docs/operating.md");
        let text = std::fs::read_to_string(&page).unwrap();
        assert!(
            !runbook::shell_blocks(&text, "Install", "kustomize").is_empty(),
            "the previous release {commit} has no install steps in its docs/operating.md, so it \
             cannot be installed as it was"
        );
        Self {
            version,
            commit,
            deploy: dir.path().join("deploy"),
            page,
            _dir: dir,
        }
    }

    /// Its image: its commit checked out and built with its own `deploy/image.sh` (release builds
    /// of every binary, about 12 minutes cold on 2 cores), kept as
    /// `<release cache>/<commit>/athenz-k8s-identity-<version>.oci.tar` (see [`release_cache`]).
    pub fn image(&self) -> PathBuf {
        let repo = athenz_testbed::bins::repo_root();
        let base = release_cache().join(&self.commit);
        let name = format!("athenz-k8s-identity-{}.oci.tar", self.version);
        let kept = base.join(&name);
        if kept.is_file() {
            return kept;
        }
        std::fs::create_dir_all(&base).unwrap();
        let src = base.join("src");
        if src.exists() {
            std::fs::remove_dir_all(&src).unwrap();
        }
        // a checkout of its own (sharing this repository's objects), so its image.sh labels the
        // image with that commit and its time, as its release did
        let repo_arg = repo.display().to_string();
        let src_arg = src.display().to_string();
        git(
            &repo,
            &[
                "clone",
                "--quiet",
                "--shared",
                "--no-checkout",
                &repo_arg,
                &src_arg,
            ],
        );
        git(&src, &["checkout", "--quiet", "--detach", &self.commit]);
        let started = std::time::Instant::now();
        let out = Command::new(src.join("deploy/image.sh"))
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", base.join("build"))
            .output()
            .expect("the previous release's deploy/image.sh");
        assert!(
            out.status.success(),
            "the previous release's deploy/image.sh ({}) failed: {}",
            self.commit,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "the previous release's image ({}) built from its commit in {:.0} s",
            self.commit,
            started.elapsed().as_secs_f64()
        );
        std::fs::rename(src.join("target/image").join(&name), &kept).unwrap();
        std::fs::remove_dir_all(&src).unwrap();
        // only the image is read again (a commit's image never changes); its release build is
        // 1.4 GiB that would otherwise stay on the disk CI builds on
        std::fs::remove_dir_all(base.join("build")).unwrap();
        kept
    }
}

#[test]
fn the_newest_released_heading_names_version_and_commit() {
    let changelog = "# Changelog\n\n## Unreleased (0.3.0)\n\n## 0.2.0 — 2026-11-27 (b43cdd5)\n\
                     \n## 0.1.0 — 2026-10-01 (0123abc)\n";
    assert_eq!(
        newest_release(changelog),
        Some(("0.2.0".to_owned(), "b43cdd5".to_owned()))
    );
    assert_eq!(newest_release("## 0.2.0 — 2026-11-27\n"), None);
    assert_eq!(newest_release("## 0.2.0 — 2026-11-27 (not-hex)\n"), None);
}
