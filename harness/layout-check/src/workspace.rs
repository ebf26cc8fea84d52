//! The workspace as its Cargo.toml files describe it: members, their targets and dependencies.
//!
//! Crates are found from `[workspace] members`, never from a list of paths here: the harness is
//! moving under `harness/` and the check must follow it without an edit.

use crate::error::Error;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use toml::{Table, Value};

/// Package names that are harness wherever their directory is (before and after the move under
/// `harness/`).
pub const HARNESS_NAMES: [&str; 4] = [
    "athenz-testbed",
    "athenz-devstack",
    "athenz-e2e",
    "athenz-layout-check",
];

/// The workspace: its root and its member crates, in the order of `members`.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The directory of the workspace Cargo.toml.
    pub root: PathBuf,
    /// The members.
    pub crates: Vec<Crate>,
}

/// One member crate.
#[derive(Debug, Clone)]
pub struct Crate {
    /// Its package name.
    pub name: String,
    /// Its directory, relative to the workspace root, `/`-separated.
    pub rel_dir: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Harness (not shipped) rather than product.
    pub harness: bool,
    /// Its library and binary roots, the library first (tests, benches and examples are not).
    pub roots: Vec<Root>,
    /// Its dependencies on packages of any name (filter by workspace members as needed).
    pub deps: Vec<Dep>,
}

/// A crate root file: one module tree.
#[derive(Debug, Clone)]
pub struct Root {
    /// `lib` or the binary's name.
    pub target: String,
    /// The root file (lib.rs, main.rs, src/bin/x.rs).
    pub file: PathBuf,
}

/// The kind of a dependency section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DepKind {
    /// `[dependencies]`.
    Normal,
    /// `[build-dependencies]`.
    Build,
    /// `[dev-dependencies]`.
    Dev,
}

impl std::fmt::Display for DepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Normal => "normal",
            Self::Build => "build",
            Self::Dev => "dev",
        })
    }
}

/// A dependency: the package it names and the section it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dep {
    /// The package name (the `package` key of a renamed dependency, else the key).
    pub package: String,
    /// Its section.
    pub kind: DepKind,
}

/// Walks up from `start` to the first Cargo.toml with a `[workspace]` table.
pub fn find_root(start: &Path) -> Result<PathBuf, Error> {
    let start = start
        .canonicalize()
        .map_err(|e| Error::io(start.to_path_buf(), e))?;
    for dir in start.ancestors() {
        let manifest = dir.join("Cargo.toml");
        if manifest.is_file() && read_manifest(&manifest)?.contains_key("workspace") {
            return Ok(dir.to_path_buf());
        }
    }
    Err(Error::NoWorkspace(start))
}

impl Workspace {
    /// Reads the workspace at `root` (the directory of its Cargo.toml).
    pub fn load(root: &Path) -> Result<Self, Error> {
        let manifest_path = root.join("Cargo.toml");
        let manifest = read_manifest(&manifest_path)?;
        let workspace = manifest
            .get("workspace")
            .and_then(Value::as_table)
            .ok_or_else(|| Error::Manifest {
                path: manifest_path.clone(),
                message: "no [workspace] table".to_owned(),
            })?;
        let exclude: BTreeSet<String> = strings(workspace.get("exclude")).into_iter().collect();
        let mut dirs = Vec::new();
        if manifest.contains_key("package") {
            dirs.push(String::new());
        }
        for pattern in strings(workspace.get("members")) {
            for dir in expand_member(root, &pattern)? {
                if !exclude.contains(&dir) && !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
        let shared = workspace.get("dependencies").and_then(Value::as_table);
        let crates = dirs
            .into_iter()
            .map(|rel| load_crate(root, rel, shared))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            root: root.to_path_buf(),
            crates,
        })
    }

    /// The member called `name`, if any.
    pub fn member(&self, name: &str) -> Option<&Crate> {
        self.crates.iter().find(|c| c.name == name)
    }
}

fn read_manifest(path: &Path) -> Result<Table, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.parse::<Table>().map_err(|e| Error::Toml {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|s| s.trim_end_matches('/').to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A member entry to the directories it names: a plain path, or one with `*` wildcards in its
/// components (`harness/*`), matching directories that hold a Cargo.toml.
fn expand_member(root: &Path, pattern: &str) -> Result<Vec<String>, Error> {
    let mut found = vec![String::new()];
    for component in pattern.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let mut next = Vec::new();
        for prefix in &found {
            if !component.contains('*') {
                next.push(join(prefix, component));
                continue;
            }
            let dir = root.join(prefix);
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
            let mut names: Vec<String> = entries
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| wildcard(component, n))
                .collect();
            names.sort();
            next.extend(names.iter().map(|n| join(prefix, n)));
        }
        found = next;
    }
    Ok(found
        .into_iter()
        .filter(|d| !pattern.contains('*') || root.join(d).join("Cargo.toml").is_file())
        .collect())
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| wildcard(tail, &rest[i..]))
        }
    }
}

fn load_crate(root: &Path, rel_dir: String, shared: Option<&Table>) -> Result<Crate, Error> {
    let dir = root.join(&rel_dir);
    let path = dir.join("Cargo.toml");
    let manifest = read_manifest(&path)?;
    let name = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Manifest {
            path: path.clone(),
            message: "no package.name".to_owned(),
        })?
        .to_owned();
    let harness = rel_dir.starts_with("harness/") || HARNESS_NAMES.contains(&name.as_str());
    let mut deps = Vec::new();
    collect_deps(&manifest, shared, &mut deps);
    if let Some(targets) = manifest.get("target").and_then(Value::as_table) {
        for platform in targets.values().filter_map(Value::as_table) {
            collect_deps(platform, shared, &mut deps);
        }
    }
    let roots = roots(&dir, &manifest);
    Ok(Crate {
        name,
        rel_dir,
        dir,
        harness,
        roots,
        deps,
    })
}

fn collect_deps(table: &Table, shared: Option<&Table>, out: &mut Vec<Dep>) {
    let sections = [
        ("dependencies", DepKind::Normal),
        ("build-dependencies", DepKind::Build),
        ("build_dependencies", DepKind::Build),
        ("dev-dependencies", DepKind::Dev),
        ("dev_dependencies", DepKind::Dev),
    ];
    for (section, kind) in sections {
        let Some(deps) = table.get(section).and_then(Value::as_table) else {
            continue;
        };
        for (key, spec) in deps {
            let inherited = spec.get("workspace").and_then(Value::as_bool) == Some(true);
            let package = spec
                .get("package")
                .or_else(|| {
                    inherited
                        .then(|| {
                            shared
                                .and_then(|s| s.get(key))
                                .and_then(|s| s.get("package"))
                        })
                        .flatten()
                })
                .and_then(Value::as_str)
                .unwrap_or(key);
            out.push(Dep {
                package: package.to_owned(),
                kind,
            });
        }
    }
}

/// The library root (`[lib] path` or src/lib.rs) and the binary roots (`[[bin]] path`,
/// src/main.rs, src/bin/*.rs, src/bin/*/main.rs) that exist.
fn roots(dir: &Path, manifest: &Table) -> Vec<Root> {
    let mut roots = Vec::new();
    let lib = manifest
        .get("lib")
        .and_then(|l| l.get("path"))
        .and_then(Value::as_str)
        .map_or_else(|| dir.join("src/lib.rs"), |p| dir.join(p));
    if lib.is_file() {
        roots.push(Root {
            target: "lib".to_owned(),
            file: lib,
        });
    }
    let mut bins: Vec<(String, PathBuf)> = Vec::new();
    for bin in manifest
        .get("bin")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let (Some(name), Some(path)) = (
            bin.get("name").and_then(Value::as_str),
            bin.get("path").and_then(Value::as_str),
        ) {
            bins.push((name.to_owned(), dir.join(path)));
        }
    }
    bins.push(("main".to_owned(), dir.join("src/main.rs")));
    if let Ok(entries) = std::fs::read_dir(dir.join("src/bin")) {
        let mut found: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        found.sort();
        for path in found {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if path.is_dir() {
                bins.push((stem, path.join("main.rs")));
            } else if path.extension().is_some_and(|e| e == "rs") {
                bins.push((stem, path));
            }
        }
    }
    for (target, file) in bins {
        if file.is_file() && !roots.iter().any(|r| r.file == file) {
            roots.push(Root { target, file });
        }
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard("*", "testbed"));
        assert!(wildcard("test*", "testbed"));
        assert!(wildcard("*bed", "testbed"));
        assert!(!wildcard("*x", "testbed"));
    }

    #[test]
    fn members_dependencies_and_the_harness_split() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |p: &str, s: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"core\", \"harness/*\"]\n\
             [workspace.dependencies]\nbase = { path = \"core\", package = \"x-core\" }\n",
        );
        write("core/Cargo.toml", "[package]\nname = \"x-core\"\n");
        write("core/src/lib.rs", "");
        write(
            "harness/e2e/Cargo.toml",
            "[package]\nname = \"x-e2e\"\n[dependencies]\nbase = { workspace = true }\n\
             [dev-dependencies]\nother = \"1\"\n",
        );
        write("harness/e2e/src/main.rs", "fn main() {}");
        let ws = Workspace::load(root).unwrap();
        let names: Vec<_> = ws.crates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["x-core", "x-e2e"]);
        let e2e = ws.member("x-e2e").unwrap();
        assert!(e2e.harness && !ws.crates[0].harness);
        assert_eq!(e2e.deps[0].package, "x-core");
        assert_eq!(e2e.deps[1].kind, DepKind::Dev);
        assert_eq!(e2e.roots[0].target, "main");
        assert_eq!(
            find_root(&root.join("harness/e2e")).unwrap(),
            root.canonicalize().unwrap()
        );
    }
}
