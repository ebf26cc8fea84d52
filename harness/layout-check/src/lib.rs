//! `athenz-layout-check`: the repository's house rules of layout, checked.
//!
//! The rules keep the code easy to read and change in pieces, and each is cheap to break by
//! accident, so a test holds them (tests/house_rules.rs):
//!
//! 1. no import circles among sibling modules ([`graph`]), in product crates and, reported
//!    apart, in the harness; no product crate builds on a harness crate, and the harness crates
//!    form a stack ([`stacking`]);
//! 2. no source file over [`report::MAX_LOC`] lines of code, tests apart ([`loc`]);
//! 3. the design lives in the repository: no mention of retired design notes, every design
//!    citation names a section that exists, no tracker issue numbers in code ([`citations`]);
//! 4. the volume mode's spellings in one module ([`literals`]).
//!
//! Crates come from the workspace's `members` ([`workspace`]): product or harness by where they
//! live (`harness/`) or by name.

pub mod citations;
pub mod error;
pub mod files;
pub mod graph;
pub mod literals;
pub mod loc;
pub mod modules;
pub mod refs;
pub mod report;
pub mod resolve;
pub mod source;
pub mod stacking;
pub mod workspace;

#[cfg(test)]
mod tests;

pub use error::{Error, Problem};
pub use report::Report;

use files::relative;
use modules::Inclusions;
use report::TreeSummary;
use std::path::{Path, PathBuf};
use workspace::Workspace;

/// Checks the repository whose workspace Cargo.toml is in `root`.
pub fn check(root: &Path) -> Result<Report, Error> {
    let root = root.canonicalize().map_err(|e| Error::io(root, e))?;
    let ws = Workspace::load(&root)?;
    let mut inclusions = Inclusions::default();
    let mut product = Vec::new();
    let mut harness = Vec::new();
    let mut problems = Vec::new();
    for krate in &ws.crates {
        let short = krate.rel_dir.rsplit('/').next().filter(|s| !s.is_empty());
        let short = short.unwrap_or(&krate.name);
        for target in &krate.roots {
            let label = if target.target == "lib" {
                short.to_owned()
            } else {
                format!("{short}[bin {}]", target.target)
            };
            let tree = modules::build(&label, &target.file, &mut inclusions);
            let mut circles = graph::circles(&tree);
            for edge in circles.iter_mut().flat_map(|c| c.edges.iter_mut()) {
                edge.file = PathBuf::from(relative(&root, &edge.file));
            }
            problems.extend(tree.problems);
            let summary = TreeSummary {
                krate: krate.name.clone(),
                label,
                modules: tree.modules.len(),
                circles,
            };
            if krate.harness {
                harness.push(summary);
            } else {
                product.push(summary);
            }
        }
    }
    let scan = files::scan(&ws, &inclusions)?;
    problems.extend(scan.problems);
    for p in &mut problems {
        p.file = PathBuf::from(relative(&root, &p.file));
    }
    problems.sort();
    problems.dedup();
    Ok(Report {
        stacking: stacking::check(&ws),
        design: citations::check(&root)?,
        root,
        product,
        harness,
        files: scan.files,
        spellings: scan.spellings,
        problems,
    })
}
