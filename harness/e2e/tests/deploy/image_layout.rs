//! The two image builds stay one: `deploy/image.sh` (buildah, offline, what CI runs) and
//! `deploy/Dockerfile` (for CI systems with registries) build the same binaries with the same
//! script (`deploy/build-binaries.sh`), into the same place, as the same user, with the same
//! labels; and that script builds every binary with a profile the workspace defines, copies only
//! what its builds wrote, and links every daemon the manifests call. (`harness/e2e/tests/deploy/image.rs`
//! checks the image itself.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn repo() -> PathBuf {
    athenz_testbed::bins::repo_root()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The script's lines with continuations joined and comments dropped.
fn logical_lines(text: &str) -> Vec<String> {
    text.replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// `key=value` of every `--label` in image.sh's `buildah config` (quotes removed).
fn script_labels(script: &str) -> BTreeMap<String, String> {
    let config = logical_lines(script)
        .into_iter()
        .find(|l| l.starts_with("buildah config"))
        .expect("image.sh has no buildah config");
    config
        .split("--label ")
        .skip(1)
        .map(|rest| {
            let rest = rest.trim_start();
            let value = match rest.strip_prefix('"') {
                Some(quoted) => quoted.split('"').next().unwrap(),
                None => rest.split_whitespace().next().unwrap(),
            };
            let (k, v) = value.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// `key=value` of the Dockerfile's `LABEL` (quotes removed).
fn dockerfile_labels(dockerfile: &str) -> BTreeMap<String, String> {
    let label = logical_lines(dockerfile)
        .into_iter()
        .find(|l| l.starts_with("LABEL "))
        .expect("the Dockerfile has no LABEL");
    let mut labels = BTreeMap::new();
    let mut rest = label.trim_start_matches("LABEL ").trim();
    while let Some((key, after)) = rest.split_once("=\"") {
        let (value, tail) = after.split_once('"').unwrap();
        labels.insert(key.trim().to_owned(), value.to_owned());
        rest = tail.trim();
    }
    labels
}

fn workspace_field(field: &str) -> String {
    let cargo = read("Cargo.toml");
    let section = cargo.split("[workspace.package]").nth(1).unwrap();
    section
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field} = \"")))
        .unwrap()
        .trim_end_matches('"')
        .to_owned()
}

#[test]
fn the_dockerfile_and_image_sh_build_the_same_image() {
    let script = read("deploy/image.sh");
    let dockerfile = read("deploy/Dockerfile");
    let docker_lines = logical_lines(&dockerfile);

    // the same binaries, from the same script for each platform, into the same directory, on no
    // base; an index of both platforms
    assert!(script.contains("deploy/build-binaries.sh --arch \"$arch\" \"${binaries[$arch]}\""));
    assert!(script.contains("buildah from --quiet scratch"));
    assert!(
        script.contains("buildah copy --quiet \"$ctr\" \"${binaries[$arch]}/\" /usr/local/bin/")
    );
    assert!(script.contains("arches=\"amd64,arm64\""));
    assert!(script.contains("--arch \"$arch\""));
    assert!(script.contains("buildah manifest push --quiet --all"));
    assert!(
        dockerfile.contains("--platform linux/amd64,linux/arm64"),
        "the Dockerfile's command builds both platforms"
    );
    assert!(docker_lines.contains(&"ARG TARGETARCH".to_owned()));
    let stages: Vec<&String> = docker_lines
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        stages.last().unwrap().as_str(),
        "FROM scratch",
        "{stages:?}"
    );
    assert!(
        docker_lines.iter().any(|l| l.starts_with("RUN ")
            && l.ends_with("deploy/build-binaries.sh --arch \"$TARGETARCH\" /out")),
        "the Dockerfile's build stage does not run deploy/build-binaries.sh --arch \"$TARGETARCH\" /out"
    );
    assert!(docker_lines.contains(&"COPY --from=build /out/ /usr/local/bin/".to_owned()));

    // the same user, PATH and working directory
    assert!(docker_lines.contains(&"USER 65532:65532".to_owned()));
    assert!(script.contains("--user 65532:65532"));
    assert!(docker_lines.contains(&"ENV PATH=/usr/local/bin".to_owned()));
    assert!(script.contains("--env PATH=/usr/local/bin"));
    assert!(docker_lines.contains(&"WORKDIR /".to_owned()));
    assert!(script.contains("--workingdir /"));

    // the same labels: fixed values equal, per-build values from the same sources
    let ours = script_labels(&script);
    let theirs = dockerfile_labels(&dockerfile);
    assert_eq!(
        ours.keys().collect::<BTreeSet<_>>(),
        theirs.keys().collect::<BTreeSet<_>>()
    );
    assert!(ours.len() >= 7, "{ours:?}");
    for (key, value) in &ours {
        let theirs = &theirs[key];
        match key.as_str() {
            "org.opencontainers.image.version" => {
                assert_eq!(value, "$version");
                assert_eq!(theirs, "${VERSION}");
            }
            "org.opencontainers.image.revision" => assert_eq!(theirs, "${REVISION}"),
            "org.opencontainers.image.created" => assert_eq!(theirs, "${CREATED}"),
            "org.opencontainers.image.source" => {
                assert_eq!(value, "$source_url");
                assert_eq!(theirs, &workspace_field("repository"));
            }
            _ => assert_eq!(value, theirs, "{key}"),
        }
    }
    assert!(docker_lines.contains(&format!("ARG VERSION={}", workspace_field("version"))));
    assert_eq!(
        ours["org.opencontainers.image.licenses"],
        workspace_field("license")
    );
}

#[test]
fn build_binaries_ships_what_its_builds_write_and_links_every_daemon() {
    let script = read("deploy/build-binaries.sh");
    let workspace = read("Cargo.toml");
    let lines = logical_lines(&script);
    // `<arch>) target=<triple>; ...`: the Rust target of each platform the image is built for
    let targets: BTreeMap<&str, &str> = lines
        .iter()
        .filter_map(|l| {
            let (arch, rest) = l.split_once(") target=")?;
            Some((arch.trim(), rest.split(';').next()?.trim()))
        })
        .collect();
    assert_eq!(
        targets,
        BTreeMap::from([
            ("amd64", "x86_64-unknown-linux-gnu"),
            ("arm64", "aarch64-unknown-linux-gnu")
        ])
    );
    let target = targets["amd64"].to_owned();
    assert!(
        lines
            .iter()
            .any(|l| l == "export RUSTFLAGS=\"-C target-feature=+crt-static\""),
        "the binaries are not built static"
    );
    let mut built = BTreeSet::new();
    for line in lines.iter().filter(|l| l.starts_with("cargo ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..3], ["cargo", "auditable", "build"], "{line}");
        assert!(words.contains(&"--locked"), "{line}");
        assert!(words.contains(&"\"$target\""), "{line}");
        let profile = words[words.iter().position(|w| *w == "--profile").unwrap() + 1];
        assert!(
            workspace.contains(&format!("[profile.{profile}]")),
            "build-binaries.sh builds with profile {profile}, which Cargo.toml does not define"
        );
        for pair in words.windows(2).filter(|w| w[0] == "-p") {
            built.insert(format!("target/{target}/{profile}/{}", pair[1]));
        }
    }
    let install = lines
        .iter()
        .find(|l| l.starts_with("install "))
        .expect("no install step");
    let shipped: Vec<String> = install
        .split_whitespace()
        .filter(|w| w.starts_with("\"$built/"))
        .map(|w| {
            w.trim_matches('"')
                .replace("$built", "target")
                .replace("$target", &target)
        })
        .collect();
    assert_eq!(shipped.len(), 3, "{shipped:?}");
    for path in &shipped {
        assert!(
            built.contains(path),
            "{path} is shipped but no build writes it: {built:?}"
        );
    }
    assert!(
        shipped
            .iter()
            .any(|p| p.ends_with("/release-small/athenz-sia"))
    );
    assert!(shipped.iter().any(|p| p.ends_with("/dist/athenz-daemons")));

    // every command the manifests run is a shipped binary or a daemon's link
    let daemons: BTreeSet<String> = lines
        .iter()
        .find_map(|l| l.strip_prefix("daemons=("))
        .unwrap()
        .trim_end_matches(')')
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ln -s athenz-daemons \"$out/$d\""))
    );
    // a link for every daemon athenz-daemons runs, and none it does not
    let lib = read("daemons/src/lib.rs");
    let list = lib
        .split_once("pub const DAEMONS: &[&str] = &[")
        .and_then(|(_, rest)| rest.split_once("];"))
        .unwrap()
        .0;
    let dispatched: BTreeSet<String> = list
        .split(',')
        .map(|name| name.trim().trim_matches('"').to_owned())
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(
        daemons, dispatched,
        "build-binaries.sh's links vs daemons/src/lib.rs's DAEMONS"
    );
    let names: BTreeSet<String> = shipped
        .iter()
        .map(|p| p.rsplit('/').next().unwrap().to_owned())
        .chain(daemons.iter().cloned())
        .collect();
    let mut commands = BTreeSet::new();
    for entry in std::fs::read_dir(repo().join("deploy/base")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for rest in text.split("command: [").skip(1) {
            let first = rest.split([',', ']']).next().unwrap().trim().to_owned();
            if first.starts_with("athenz-") {
                commands.insert(first);
            }
        }
    }
    assert!(commands.len() >= 5, "{commands:?}");
    for command in &commands {
        assert!(
            names.contains(command),
            "the manifests run {command}, which the image lacks"
        );
    }
    // the agent copies the driver from where the image has it
    let agent = read("deploy/base/agent.yaml");
    assert!(agent.contains("value: /usr/local/bin/athenz-volume-driver"));
}
