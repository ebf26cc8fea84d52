//! The design lives in the repository: what code cites must be there to read.
//!
//! Three checks over the tracked files: no code names the retired design notes (files that are
//! not in the repository); every `docs/design.md §N.M` citation, in any file, names a section
//! that docs/design.md has; and no code cites a tracker issue by number, which a reader of the
//! repository alone cannot follow.

use crate::error::Error;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The design document, relative to the repository root.
pub const DESIGN_DOC: &str = "docs/design.md";

/// Names of notes that are no longer in the repository (built so this file does not hold them).
pub const RETIRED: [&str; 2] = [concat!("DESIGN", ".md"), concat!("STACK", ".md")];

/// File extensions whose text is code, where the name and issue checks apply.
pub const CODE_EXTENSIONS: [&str; 4] = ["rs", "go", "java", "sh"];

/// A line of a tracked file that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hit {
    /// The file, relative to the repository root.
    pub file: String,
    /// The 1-based line.
    pub line: usize,
    /// What was found there.
    pub text: String,
}

/// The outcome of the design checks.
#[derive(Debug, Clone, Default)]
pub struct DesignReport {
    /// docs/design.md is not tracked.
    pub design_missing: bool,
    /// The section numbers docs/design.md has.
    pub sections: BTreeSet<String>,
    /// Every citation found (the broken ones are also in `broken`).
    pub citations: Vec<Hit>,
    /// Citations of sections that do not exist.
    pub broken: Vec<Hit>,
    /// Mentions of retired notes in code.
    pub retired: Vec<Hit>,
    /// Issue-number citations in code.
    pub issues: Vec<Hit>,
}

/// The tracked files of the repository at `root`, `/`-separated, relative to it.
pub fn tracked_files(root: &Path) -> Result<Vec<String>, Error> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .map_err(|e| Error::Git {
            root: root.to_path_buf(),
            message: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Git {
            root: root.to_path_buf(),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(output
        .stdout
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect())
}

/// Runs the checks on the tracked files of `root`.
pub fn check(root: &Path) -> Result<DesignReport, Error> {
    let files = tracked_files(root)?;
    let mut texts = Vec::new();
    for file in files {
        let path = root.join(&file);
        // Regular files only: a symlink or a submodule is not text of this repository.
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if !is_file {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        texts.push((file, String::from_utf8_lossy(&bytes).into_owned()));
    }
    Ok(check_texts(&texts))
}

/// The checks over (path, text) pairs: the whole rule, without git or a disk.
pub fn check_texts(files: &[(String, String)]) -> DesignReport {
    let mut report = DesignReport::default();
    match files.iter().find(|(path, _)| path == DESIGN_DOC) {
        Some((_, text)) => report.sections = sections(text),
        None => report.design_missing = true,
    }
    for (path, text) in files {
        let code = Path::new(path)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CODE_EXTENSIONS.contains(&e));
        for (i, line) in text.lines().enumerate() {
            let hit = |text: String| Hit {
                file: path.clone(),
                line: i + 1,
                text,
            };
            for section in cited_sections(line) {
                let h = hit(format!("{DESIGN_DOC} §{section}"));
                if !report.sections.contains(&section) {
                    report.broken.push(h.clone());
                }
                report.citations.push(h);
            }
            if !code {
                continue;
            }
            for name in RETIRED.iter().filter(|n| line.contains(*n)) {
                report.retired.push(hit((*name).to_owned()));
            }
            report
                .issues
                .extend(issue_citations(line).into_iter().map(hit));
        }
    }
    report
}

/// Section numbers of the headings of the design document: `## 3. Title` is `3`, `### 3.1 Title`
/// is `3.1`, `#### 3.1.2 Title` is `3.1.2`.
pub fn sections(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start_matches('#');
            if rest.len() == line.len() || !rest.starts_with(' ') {
                return None;
            }
            let number = rest.split_whitespace().next()?;
            let number = number.trim_end_matches('.');
            is_section_number(number).then(|| number.to_owned())
        })
        .collect()
}

fn is_section_number(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// The sections cited on a line as `docs/design.md §N(.M)*` (a sentence's closing dot is not part
/// of the number).
pub fn cited_sections(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(DESIGN_DOC) {
        rest = &rest[at + DESIGN_DOC.len()..];
        let after = rest.trim_start_matches([' ', '\t']);
        let Some(number) = after.strip_prefix('§') else {
            continue;
        };
        let mut end = 0;
        let bytes = number.as_bytes();
        while end < bytes.len() {
            let digit = bytes[end].is_ascii_digit();
            let inner_dot =
                end > 0 && bytes[end] == b'.' && bytes.get(end + 1).is_some_and(u8::is_ascii_digit);
            if !digit && !inner_dot {
                break;
            }
            end += 1;
        }
        if end > 0 {
            out.push(number[..end].to_owned());
        }
    }
    out
}

/// `issue N` / `issue #N` citations on a line, case-insensitive, `issue` starting a word.
pub fn issue_citations(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = lower[from..].find("issue ") {
        let start = from + found;
        from = start + 1;
        if start > 0 && word(bytes[start - 1]) {
            continue;
        }
        let mut i = start + "issue ".len();
        if bytes.get(i) == Some(&b'#') {
            i += 1;
        }
        let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            out.push(line[start..i + digits].to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn a_citation_of_a_missing_section_is_reported() {
        let doc = "# Design\n## 1. Scope\n### 1.2 Names\n#### 1.2.3 Rules\n## 9. Later\n";
        let cite = |s: &str| format!("// see {DESIGN_DOC} §{s}.");
        let report = check_texts(&files(&[
            (DESIGN_DOC, doc),
            ("core/src/a.rs", &cite("1.2.3")),
            ("README.md", &cite("9.9")),
            ("deploy/x.sh", &cite("1")),
        ]));
        assert!(!report.design_missing);
        assert_eq!(report.citations.len(), 3);
        assert_eq!(report.broken.len(), 1);
        assert_eq!(
            (report.broken[0].file.as_str(), report.broken[0].line),
            ("README.md", 1)
        );
        assert_eq!(report.broken[0].text, format!("{DESIGN_DOC} §9.9"));
    }

    #[test]
    fn a_missing_design_doc_retired_names_and_issue_numbers() {
        let retired = format!("see {} 7", RETIRED[0]);
        // The word is built so this file does not cite an issue itself.
        let (upper, lower) = (["Is", "sue"].concat(), ["is", "sue"].concat());
        let line = format!("// {upper} #12 and t{lower} 3 and {lower} x and {lower} 4");
        let report = check_texts(&files(&[
            ("a.rs", &retired),
            ("a.md", &retired),
            ("b.go", &line),
        ]));
        assert!(report.design_missing);
        assert_eq!(report.retired.len(), 1);
        assert_eq!(report.retired[0].file, "a.rs");
        let issues: Vec<&str> = report.issues.iter().map(|h| h.text.as_str()).collect();
        assert_eq!(issues, [format!("{upper} #12"), format!("{lower} 4")]);
    }

    #[test]
    fn section_numbers() {
        assert_eq!(
            cited_sections(&format!("{DESIGN_DOC} §3.1. and {DESIGN_DOC} §x")),
            ["3.1"]
        );
        let s = sections("## 3. A\n### 3.1 B\n##4. no\n## Intro\n");
        assert_eq!(s.into_iter().collect::<Vec<_>>(), ["3", "3.1"]);
    }
}
