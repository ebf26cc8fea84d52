//! The report: everything the rules found, the violations among it, and how it reads.
//!
//! It says more than the violations (module counts, the longest files, the harness stack) so a
//! clean run still shows how close the repository is to each limit.

use crate::citations::{DESIGN_DOC, DesignReport, RETIRED};
use crate::error::Problem;
use crate::files::{FileLoc, Located};
use crate::graph::Circle;
use crate::literals::{OWNER, SPELLINGS};
use crate::stacking::{self, Stacking};
use std::fmt::{self, Display, Formatter};
use std::path::PathBuf;

/// The most lines of code a source file may have, tests apart.
pub const MAX_LOC: usize = 600;

/// How many of the longest files the report lists.
const LONGEST: usize = 10;

/// One module tree's circles.
#[derive(Debug, Clone)]
pub struct TreeSummary {
    /// The package.
    pub krate: String,
    /// The root (`agent`, `devstack[bin main]`).
    pub label: String,
    /// Its number of modules, root and inline modules included.
    pub modules: usize,
    /// Its circles (edge files relative to the repository root).
    pub circles: Vec<Circle>,
}

/// Everything the check found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The repository root.
    pub root: PathBuf,
    /// Module trees of product crates.
    pub product: Vec<TreeSummary>,
    /// Module trees of harness crates.
    pub harness: Vec<TreeSummary>,
    /// Crate stacking.
    pub stacking: Stacking,
    /// Every non-test source file with its lines of code, longest first.
    pub files: Vec<FileLoc>,
    /// The design checks.
    pub design: DesignReport,
    /// Volume-mode spellings outside their module.
    pub spellings: Vec<Located>,
    /// Files that could not be read as Rust, modules without a file.
    pub problems: Vec<Problem>,
}

impl Report {
    /// Files over [`MAX_LOC`].
    pub fn too_long(&self) -> impl Iterator<Item = &FileLoc> {
        self.files.iter().filter(|f| f.loc > MAX_LOC)
    }

    /// The number of violations, each circle, file, line or problem counting once.
    pub fn violation_count(&self) -> usize {
        let circles: usize = self
            .product
            .iter()
            .chain(&self.harness)
            .map(|t| t.circles.len())
            .sum();
        circles
            + stacking::violations(&self.stacking)
            + self.too_long().count()
            + usize::from(self.design.design_missing)
            + self.design.broken.len()
            + self.design.retired.len()
            + self.design.issues.len()
            + self.spellings.len()
            + self.problems.len()
    }

    /// Whether the repository keeps every rule.
    pub fn is_clean(&self) -> bool {
        self.violation_count() == 0
    }
}

fn trees(f: &mut Formatter<'_>, trees: &[TreeSummary]) -> fmt::Result {
    for t in trees {
        let n = t.circles.len();
        writeln!(
            f,
            "  {} ({}): {}, {}",
            t.label,
            t.krate,
            plural(t.modules, "module"),
            plural(n, "circle")
        )?;
        for c in &t.circles {
            writeln!(
                f,
                "    circle among the children of {}: {}",
                c.parent,
                c.members.join(", ")
            )?;
            for e in &c.edges {
                writeln!(
                    f,
                    "      {} -> {}  ({}:{})",
                    e.from,
                    e.to,
                    e.file.display(),
                    e.line
                )?;
            }
        }
    }
    Ok(())
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn hits(f: &mut Formatter<'_>, title: &str, list: &[crate::citations::Hit]) -> fmt::Result {
    let files: std::collections::BTreeSet<&str> = list.iter().map(|h| h.file.as_str()).collect();
    writeln!(
        f,
        "  {title}: {} in {}",
        list.len(),
        plural(files.len(), "file")
    )?;
    for h in list {
        writeln!(f, "    {}:{}: {}", h.file, h.line, h.text)?;
    }
    Ok(())
}

impl Display for Report {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "athenz-layout-check: {}", self.root.display())?;
        writeln!(f)?;
        writeln!(f, "1. Module circles, product crates")?;
        trees(f, &self.product)?;
        writeln!(f)?;
        writeln!(f, "1b. Module circles, harness crates")?;
        trees(f, &self.harness)?;
        writeln!(f)?;
        writeln!(f, "1c. Crate stacking")?;
        let s = &self.stacking;
        writeln!(
            f,
            "  product crates depending on harness crates: {}",
            s.product_on_harness.len()
        )?;
        for (product, harness, kind) in &s.product_on_harness {
            writeln!(f, "    {product} -> {harness} ({kind} dependency)")?;
        }
        writeln!(f, "  harness stack, bottom level first:")?;
        for (i, level) in s.levels.iter().enumerate() {
            let groups: Vec<String> = level
                .iter()
                .map(|g| match g.as_slice() {
                    [one] => one.clone(),
                    many => format!("{{cycle: {}}}", many.join(", ")),
                })
                .collect();
            writeln!(f, "    {i}: {}", groups.join(", "))?;
        }
        writeln!(f, "  harness cycles: {}", s.cycles.len())?;
        for cycle in &s.cycles {
            let edges: Vec<String> = cycle
                .iter()
                .map(|(a, b, k)| format!("{a} -> {b} ({k})"))
                .collect();
            writeln!(f, "    {}", edges.join(", "))?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "2. File length (at most {MAX_LOC} lines of code, tests apart)"
        )?;
        writeln!(
            f,
            "  {} source files; the {LONGEST} longest:",
            self.files.len()
        )?;
        for file in self.files.iter().take(LONGEST) {
            writeln!(f, "    {:>5}  {}", file.loc, file.file)?;
        }
        let long: Vec<&FileLoc> = self.too_long().collect();
        writeln!(f, "  over {MAX_LOC}: {}", long.len())?;
        for file in long {
            writeln!(f, "    {:>5}  {}", file.loc, file.file)?;
        }
        writeln!(f)?;
        writeln!(f, "3. The design lives in the repository")?;
        let d = &self.design;
        if d.design_missing {
            writeln!(f, "  {DESIGN_DOC} missing")?;
        } else {
            writeln!(f, "  {DESIGN_DOC}: {} numbered sections", d.sections.len())?;
        }
        writeln!(
            f,
            "  citations of {DESIGN_DOC} §N: {}, broken: {}",
            d.citations.len(),
            d.broken.len()
        )?;
        for h in &d.broken {
            writeln!(f, "    {}:{}: {} (no such section)", h.file, h.line, h.text)?;
        }
        let by_name: Vec<String> = RETIRED
            .iter()
            .map(|name| {
                format!(
                    "{name}: {}",
                    d.retired.iter().filter(|h| h.text == *name).count()
                )
            })
            .collect();
        let title = format!(
            "mentions of {} in code ({})",
            RETIRED.join(" or "),
            by_name.join(", ")
        );
        hits(f, &title, &d.retired)?;
        hits(f, "issue-number citations in code", &d.issues)?;
        writeln!(f)?;
        let values = SPELLINGS.map(|s| format!("\"{s}\""));
        writeln!(
            f,
            "4. Volume-mode spellings ({}) outside {}'s {}: {}",
            values.join(", "),
            OWNER.0,
            OWNER.1,
            self.spellings.len()
        )?;
        for s in &self.spellings {
            writeln!(f, "    {}:{}: \"{}\"", s.file, s.line, s.value)?;
        }
        if !self.problems.is_empty() {
            writeln!(f)?;
            writeln!(f, "Files the check could not read: {}", self.problems.len())?;
            for p in &self.problems {
                writeln!(f, "    {p}")?;
            }
        }
        writeln!(f)?;
        write!(f, "{} violations", self.violation_count())
    }
}
