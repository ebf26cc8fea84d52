//! The release before this one, as CHANGELOG.md records it (its newest heading
//! `## X.Y.Z — YYYY-MM-DD (<commit>)`): that commit's `deploy/` and docs/operating.md, to
//! install it as it was installed, and its image, built once from that commit with its own
//! `deploy/image.sh` and kept in the release cache ([`release_cache`]). The upgrade tests install
//! it; `athenz-devstack cluster previous-image` builds it ahead of them (CI starts that in the
//! background, docs/development.md "CI's time").

use super::runbook;
use anyhow::{Context, bail, ensure};
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

/// `git <args>` in `repo`; its stdout, or an error with its stderr.
fn git(repo: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .context("running git (it is needed to find the previous release)")?;
    ensure!(
        out.status.success(),
        "git {args:?} in {}: {}",
        repo.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(out.stdout)
}

/// Extracts `paths` of `commit` into `into` (git archive | tar -x).
fn extract(repo: &Path, commit: &str, paths: &[&str], into: &Path) -> anyhow::Result<()> {
    let mut args = vec!["archive", commit];
    args.extend(paths);
    let archive = git(repo, &args)?;
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    let mut tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(into)
        .stdin(Stdio::piped())
        .spawn()
        .context("running tar")?;
    if let Some(mut stdin) = tar.stdin.take() {
        std::io::Write::write_all(&mut stdin, &archive).context("writing to tar")?;
    }
    ensure!(tar.wait()?.success(), "extracting {paths:?} of {commit}");
    Ok(())
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
pub fn release_cache() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ATHENZ_RELEASE_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set: set ATHENZ_RELEASE_CACHE")?;
    Ok(cache.join("athenz-k8s-identity/releases"))
}

/// The version and commit of the previous release: the newest heading of this repository's
/// CHANGELOG.md. Fails when it names none, or when this workspace still calls itself that
/// version (the two images would share a tag).
pub fn previous_version(repo: &Path) -> anyhow::Result<(String, String)> {
    let path = repo.join("CHANGELOG.md");
    let changelog =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (version, commit) = newest_release(&changelog).with_context(|| {
        format!(
            "{} names no release as `## X.Y.Z — YYYY-MM-DD (<commit>)`",
            path.display()
        )
    })?;
    ensure!(
        version != env!("CARGO_PKG_VERSION"),
        "the workspace still calls itself {version}, which CHANGELOG.md says was released at \
         {commit}: give the unreleased work the next version"
    );
    Ok((version, commit))
}

impl PreviousRelease {
    /// Finds and extracts it from the repository at `repo`; fails as [`previous_version`] does,
    /// or when it has no install steps to run.
    pub fn from_changelog(repo: &Path) -> anyhow::Result<Self> {
        let (version, commit) = previous_version(repo)?;
        let dir = tempfile::tempdir().context("a temporary directory")?;
        extract(repo, &commit, &["deploy", "docs/operating.md"], dir.path())?;
        let page = dir.path().join("docs/operating.md");
        let text = std::fs::read_to_string(&page)
            .with_context(|| format!("reading {}", page.display()))?;
        ensure!(
            !runbook::shell_blocks(&text, "Install", "kustomize").is_empty(),
            "the previous release {commit} has no install steps in its docs/operating.md, so it \
             cannot be installed as it was"
        );
        Ok(Self {
            version,
            commit,
            deploy: dir.path().join("deploy"),
            page,
            _dir: dir,
        })
    }

    /// Its image (see [`image`]).
    pub fn image(&self, repo: &Path) -> anyhow::Result<PathBuf> {
        image(repo, &self.version, &self.commit)
    }
}

/// The image of release `version`, cut from `commit` of the repository at `repo`: kept as
/// `<release cache>/<commit>/athenz-k8s-identity-<version>.oci.tar`, or built into it first —
/// its commit checked out, its image built by its own `deploy/image.sh` with the profiles it
/// shipped with (quick ones, without LTO at opt-level 1, took as long: 325 s against 330 s on
/// 2 cores, most of it compiling the dependencies once per profile). One build of a commit at a time:
/// `<release cache>/<commit>.lock` is held while it is looked for and built, so a second caller
/// (a test, while CI's background build runs) waits and then finds it.
pub fn image(repo: &Path, version: &str, commit: &str) -> anyhow::Result<PathBuf> {
    image_in(&release_cache()?, repo, version, commit)
}

/// [`image`], kept in the release cache `cache`.
pub fn image_in(cache: &Path, repo: &Path, version: &str, commit: &str) -> anyhow::Result<PathBuf> {
    use nix::fcntl::{Flock, FlockArg};
    let base = cache.join(commit);
    let name = format!("athenz-k8s-identity-{version}.oci.tar");
    let kept = base.join(&name);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let lock_path = cache.join(format!("{commit}.lock"));
    let lock_file = std::fs::File::create(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    let _lock = match Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((file, _)) => {
            eprintln!("waiting for the build of release {version}'s image under way");
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .with_context(|| format!("locking {}", lock_path.display()))?
        }
    };
    if kept.is_file() {
        return Ok(kept);
    }
    let src = base.join("src");
    if src.exists() {
        std::fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))?;
    }
    // a checkout of its own (sharing this repository's objects), so its image.sh labels the
    // image with that commit and its time, as its release did
    let (repo_arg, src_arg) = (repo.display().to_string(), src.display().to_string());
    git(
        repo,
        &[
            "clone",
            "--quiet",
            "--shared",
            "--no-checkout",
            &repo_arg,
            &src_arg,
        ],
    )?;
    git(&src, &["checkout", "--quiet", "--detach", commit])?;
    let started = std::time::Instant::now();
    let out = Command::new(src.join("deploy/image.sh"))
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", base.join("build"))
        .output()
        .context("running the previous release's deploy/image.sh")?;
    if !out.status.success() {
        bail!(
            "the previous release's deploy/image.sh ({commit}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "release {version}'s image ({commit}) built from its commit in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let built = src.join("target/image").join(&name);
    std::fs::rename(&built, &kept)
        .with_context(|| format!("moving {} to {}", built.display(), kept.display()))?;
    std::fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))?;
    // only the image is read again (a commit's image never changes); its release build is
    // gigabytes that would otherwise stay on the disk CI builds on
    let build = base.join("build");
    std::fs::remove_dir_all(&build).with_context(|| format!("removing {}", build.display()))?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository holding only a CHANGELOG.md with `text`.
    fn repo_with_changelog(text: &str) -> tempfile::TempDir {
        let repo = tempfile::tempdir().unwrap();
        std::fs::write(repo.path().join("CHANGELOG.md"), text).unwrap();
        repo
    }

    #[test]
    fn the_previous_version_is_never_this_workspace_s_own() {
        let this = env!("CARGO_PKG_VERSION");
        let repo = repo_with_changelog(&format!("## {this} — 2026-12-01 (0123abc)\n"));
        let refused = previous_version(repo.path()).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("still calls itself {this}")),
            "{refused}"
        );
        let repo = repo_with_changelog("# Changelog\n\n## Unreleased\n");
        let refused = previous_version(repo.path()).unwrap_err().to_string();
        assert!(
            refused.contains("CHANGELOG.md names no release"),
            "{refused}"
        );
        let repo = repo_with_changelog("## 0.0.1 — 2026-01-01 (0123abc)\n");
        assert_eq!(
            previous_version(repo.path()).unwrap(),
            ("0.0.1".to_owned(), "0123abc".to_owned())
        );
    }

    #[test]
    fn a_kept_image_is_found_without_building() {
        let cache = tempfile::tempdir().unwrap();
        let kept = cache
            .path()
            .join("0123abc/athenz-k8s-identity-0.0.1.oci.tar");
        std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
        std::fs::write(&kept, b"archive").unwrap();
        // no repository at all: finding the kept archive needs none
        let nowhere = cache.path().join("no-repository");
        let found = image_in(cache.path(), &nowhere, "0.0.1", "0123abc").unwrap();
        assert_eq!(found, kept);
    }

    #[test]
    fn a_second_caller_waits_for_the_build_under_way_then_finds_its_image() {
        use nix::fcntl::{Flock, FlockArg};
        let cache = tempfile::tempdir().unwrap();
        let base = cache.path().join("0123abc");
        std::fs::create_dir_all(&base).unwrap();
        // a build under way: it holds the commit's lock and writes the archive before letting go
        let lock = std::fs::File::create(cache.path().join("0123abc.lock")).unwrap();
        let held = Flock::lock(lock, FlockArg::LockExclusive).unwrap();
        let kept = base.join("athenz-k8s-identity-0.0.1.oci.tar");
        let builder = {
            let kept = kept.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                std::fs::write(&kept, b"archive").unwrap();
                drop(held);
            })
        };
        // the second caller has no repository to build from: it can only succeed by waiting
        let nowhere = cache.path().join("no-repository");
        let found = image_in(cache.path(), &nowhere, "0.0.1", "0123abc").unwrap();
        assert_eq!(found, kept);
        builder.join().unwrap();
    }

    #[test]
    fn a_missing_repository_is_named_when_there_is_no_image() {
        let cache = tempfile::tempdir().unwrap();
        let nowhere = cache.path().join("no-repository");
        let refused = image_in(cache.path(), &nowhere, "0.0.1", "0123abc")
            .unwrap_err()
            .to_string();
        assert!(refused.contains("no-repository"), "{refused}");
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
        assert_eq!(newest_release("## 0.x.0 — 2026-11-27 (b43cdd5)\n"), None);
    }
}
