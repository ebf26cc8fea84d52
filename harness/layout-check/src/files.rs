//! The per-file rules, over every `src/**/*.rs` of every member: length and spellings.
//!
//! Files are walked on disk rather than through the module trees, so a file no `mod` reaches is
//! still counted; files reached only as test modules are left out.

use crate::error::{Error, Problem};
use crate::literals::{self, OWNER};
use crate::loc;
use crate::modules::Inclusions;
use crate::source;
use crate::workspace::Workspace;
use std::path::{Path, PathBuf};

/// A file and its lines of code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLoc {
    /// The file, relative to the repository root.
    pub file: String,
    /// Lines of code, tests apart.
    pub loc: usize,
}

/// A volume-mode spelling outside its module.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Located {
    /// The file, relative to the repository root.
    pub file: String,
    /// The 1-based line.
    pub line: usize,
    /// The spelling.
    pub value: String,
}

/// What the per-file rules found.
#[derive(Debug, Clone, Default)]
pub struct FileScan {
    /// Every non-test source file, longest first.
    pub files: Vec<FileLoc>,
    /// Spellings outside the owning module, by file and line.
    pub spellings: Vec<Located>,
    /// Files that could not be read or parsed.
    pub problems: Vec<Problem>,
}

/// Runs the per-file rules on every member of `ws`.
pub fn scan(ws: &Workspace, inclusions: &Inclusions) -> Result<FileScan, Error> {
    let mut out = FileScan::default();
    for krate in &ws.crates {
        let mut sources = Vec::new();
        walk(&krate.dir.join("src"), &mut sources)?;
        sources.retain(|f| !inclusions.is_test_file(f));
        let build_script = krate.dir.join("build.rs");
        let owner = (krate.name == OWNER.0).then(|| krate.dir.join(OWNER.1));
        let in_src = sources.len();
        if build_script.is_file() {
            sources.push(build_script);
        }
        for (i, path) in sources.iter().enumerate() {
            let (text, parsed) = match source::parse(path) {
                Ok(parsed) => parsed,
                Err(problem) => {
                    out.problems.push(problem);
                    continue;
                }
            };
            let file = relative(&ws.root, path);
            if i < in_src {
                out.files.push(FileLoc {
                    file: file.clone(),
                    loc: loc::count(&text, &parsed),
                });
            }
            if owner.as_deref() == Some(path.as_path()) {
                continue;
            }
            out.spellings
                .extend(literals::find(&parsed).into_iter().map(|s| Located {
                    file: file.clone(),
                    line: s.line,
                    value: s.value,
                }));
        }
    }
    out.files
        .sort_by(|a, b| b.loc.cmp(&a.loc).then_with(|| a.file.cmp(&b.file)));
    out.spellings.sort();
    Ok(out)
}

/// The `.rs` files below `dir`, sorted; a missing directory has none. Symlinks are not followed.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::io(dir, e))?;
    paths.sort();
    for path in paths {
        let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else if meta.is_file() && path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `path` relative to `root`, `/`-separated (as given when it is not below `root`).
pub fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}
