//! The repository keeps its house rules of layout (see the crate docs): module circles, crate
//! stacking, file length, design citations and volume-mode spellings. On failure the whole
//! report is printed: it names every violation with its file and line.

use std::path::Path;

#[test]
fn the_repository_keeps_its_house_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = match athenz_layout_check::check(&root) {
        Ok(report) => report,
        Err(e) => panic!("the layout check could not run: {e}"),
    };
    assert!(
        report.is_clean(),
        "the repository breaks its house rules of layout:\n\n{report}"
    );
}
