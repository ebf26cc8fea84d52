//! The whole check on small synthetic workspaces in temporary directories.

use crate::check;
use crate::citations::DESIGN_DOC;
use crate::graph::Circle;
use crate::report::Report;
use std::path::Path;
use std::process::Command;

/// A workspace with one product crate `x` (directory `x/`) holding `files` below `x/src/`, plus
/// `extra` files at the root, tracked by git.
fn workspace(files: &[(&str, &str)], extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |path: &Path, text: &str| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(&root.join("Cargo.toml"), "[workspace]\nmembers = [\"x\"]\n");
    write(&root.join("x/Cargo.toml"), "[package]\nname = \"x\"\n");
    for (path, text) in files {
        write(&root.join("x/src").join(path), text);
    }
    for (path, text) in extra {
        write(&root.join(path), text);
    }
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .unwrap();
        assert!(ok.status.success(), "git {args:?}: {ok:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    dir
}

/// The check on a workspace with `files` in crate `x` and a design document without sections.
fn run(files: &[(&str, &str)]) -> Report {
    let dir = workspace(files, &[(DESIGN_DOC, "# Design\n")]);
    check(dir.path()).unwrap()
}

fn circles(report: &Report) -> Vec<Circle> {
    report
        .product
        .iter()
        .flat_map(|t| t.circles.clone())
        .collect()
}

fn edges(circle: &Circle) -> Vec<String> {
    circle
        .edges
        .iter()
        .map(|e| format!("{} -> {} {}:{}", e.from, e.to, e.file.display(), e.line))
        .collect()
}

#[test]
fn a_two_module_circle_is_found_with_its_file_lines() {
    let report = run(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "//! A.\n\nuse crate::b::B;\npub struct A(B);\n"),
        (
            "b.rs",
            "pub struct B;\nimpl B {\n    fn f() { crate::a::g(); }\n}\n",
        ),
    ]);
    let found = circles(&report);
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0].parent, "x");
    assert_eq!(found[0].members, ["x::a", "x::b"]);
    assert_eq!(
        edges(&found[0]),
        ["x::a -> x::b x/src/a.rs:3", "x::b -> x::a x/src/b.rs:3"]
    );
    let text = report.to_string();
    assert!(text.contains("x::a -> x::b  (x/src/a.rs:3)"), "{text}");
    assert!(!report.is_clean());
}

#[test]
fn a_reference_only_from_test_code_is_no_edge() {
    let report = run(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "use crate::b::B;\npub fn g() {}\n"),
        (
            "b.rs",
            "pub struct B;\n\
             #[cfg(test)]\nfn helper() { crate::a::g(); }\n\
             impl B {\n    #[test]\n    fn t() { crate::a::g(); }\n}\n\
             #[cfg(test)]\nmod tests;\n\
             #[cfg(all(test, unix))]\nmod inline { use crate::a; }\n",
        ),
        ("b/tests.rs", "use crate::a::g;\n"),
    ]);
    assert!(circles(&report).is_empty(), "{report}");
    assert!(report.is_clean(), "{report}");
}

#[test]
fn super_and_crate_paths_resolve_to_their_modules() {
    let report = run(&[
        (
            "lib.rs",
            "pub mod pod_dirs;\npub mod stack;\npub use stack::start as launch;\n",
        ),
        (
            "pod_dirs.rs",
            "pub fn dirs() -> crate::stack::Info { todo() }\n",
        ),
        (
            "stack/mod.rs",
            "pub mod keys;\npub mod start;\npub struct Info;\n",
        ),
        (
            "stack/keys.rs",
            "use super::start::Started;\npub struct Keys;\n",
        ),
        (
            "stack/start.rs",
            "pub struct Started;\nfn f() {\n    crate::stack::keys::Keys;\n    crate::pod_dirs::dirs();\n}\n",
        ),
    ]);
    let found = circles(&report);
    assert_eq!(found.len(), 2, "{report}");
    // pod_dirs -> stack (an item of stack/mod.rs) and stack::start -> pod_dirs: the root's children
    assert_eq!(
        edges(&found[0]),
        [
            "x::pod_dirs -> x::stack x/src/pod_dirs.rs:1",
            "x::stack -> x::pod_dirs x/src/stack/start.rs:4"
        ]
    );
    // keys -> start through super::, start -> keys through crate::: stack's children
    assert_eq!(found[1].parent, "x::stack");
    assert_eq!(
        edges(&found[1]),
        [
            "x::stack::keys -> x::stack::start x/src/stack/keys.rs:1",
            "x::stack::start -> x::stack::keys x/src/stack/start.rs:3"
        ]
    );
}

#[test]
fn a_reexport_at_the_root_does_not_hide_a_circle() {
    let report = run(&[
        (
            "lib.rs",
            "pub mod node;\npub mod serving;\npub use node::volume;\n",
        ),
        ("node/mod.rs", "pub mod volume;\n"),
        ("node/volume.rs", "pub fn v() { crate::serving::s() }\n"),
        ("serving.rs", "use crate::volume::v;\npub fn s() {}\n"),
    ]);
    let found = circles(&report);
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0].members, ["x::node", "x::serving"]);
}

#[test]
fn a_circle_through_inline_modules() {
    let report = run(&[(
        "lib.rs",
        "mod outer {\n    mod a {\n        pub fn f() { super::b::g() }\n    }\n    \
         mod b {\n        pub fn g() { crate::outer::a::f() }\n    }\n}\n",
    )]);
    let found = circles(&report);
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0].parent, "x::outer");
    assert_eq!(
        edges(&found[0]),
        [
            "x::outer::a -> x::outer::b x/src/lib.rs:3",
            "x::outer::b -> x::outer::a x/src/lib.rs:6"
        ]
    );
    assert_eq!(report.product[0].modules, 4);
}

#[test]
fn long_files_are_counted_without_comments_blank_lines_or_tests() {
    let body: String = (0..601)
        .map(|i| format!("pub const C{i}: u32 = {i};\n"))
        .collect();
    let padded: String = (0..600)
        .map(|i| format!("// note\n\npub const D{i}: u32 = {i};\n"))
        .collect::<String>()
        + "#[cfg(test)]\nmod tests {\n    const T: u32 = 1;\n}\n";
    let report = run(&[
        ("lib.rs", "mod long;\nmod padded;\n"),
        ("long.rs", &body),
        ("padded.rs", &padded),
    ]);
    let long: Vec<(String, usize)> = report.too_long().map(|f| (f.file.clone(), f.loc)).collect();
    assert_eq!(long, [("x/src/long.rs".to_owned(), 601)]);
    assert!(
        report
            .files
            .iter()
            .any(|f| f.file == "x/src/padded.rs" && f.loc == 600)
    );
}

#[test]
fn a_citation_of_a_missing_section_is_reported() {
    let doc = "# Design\n\n## 1. Scope\n### 1.1 Pods\n";
    let code = format!("//! See {DESIGN_DOC} §1.1 and {DESIGN_DOC} §9.9.\n");
    let dir = workspace(&[("lib.rs", &code)], &[(DESIGN_DOC, doc)]);
    let report = check(dir.path()).unwrap();
    assert_eq!(report.design.citations.len(), 2);
    let broken: Vec<String> = report
        .design
        .broken
        .iter()
        .map(|h| format!("{}:{} {}", h.file, h.line, h.text))
        .collect();
    assert_eq!(broken, [format!("x/src/lib.rs:1 {DESIGN_DOC} §9.9")]);
    assert!(report.to_string().contains("§9.9 (no such section)"));
}

#[test]
fn a_file_that_does_not_parse_is_reported_by_name() {
    let report = run(&[
        ("lib.rs", "pub mod good;\npub mod bad;\npub mod gone;\n"),
        ("good.rs", "pub fn ok() {}\n"),
        ("bad.rs", "pub fn broken( {\n"),
    ]);
    let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("x/src/bad.rs: does not parse")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("module `gone` has no file")),
        "{problems:?}"
    );
    assert_eq!(
        report
            .problems
            .iter()
            .filter(|p| p.file.ends_with("bad.rs"))
            .count(),
        1
    );
    assert!(!report.is_clean());
    assert!(report.to_string().contains("x/src/bad.rs"));
}

#[test]
fn not_a_workspace_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[package\n").unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(err.to_string().contains("Cargo.toml"), "{err}");
}
