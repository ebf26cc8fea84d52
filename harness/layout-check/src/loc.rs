//! Lines of code of a source file, tests apart.
//!
//! A line counts when a token of code is on it: blank lines, comments and doc comments do not,
//! nor do the lines of `#[cfg(test)]` / `#[test]` items. The limit is about how much a reader
//! must hold at once, and a file's unit tests are read apart from it.

use crate::source::{self, impl_item_attrs, is_test_only, item_attrs, trait_item_attrs};
use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use std::collections::BTreeSet;
use std::str::FromStr;
use syn::visit::{self, Visit};

/// The lines of code of `text` (already parsed as `file`), test items excluded.
pub fn count(text: &str, file: &syn::File) -> usize {
    let mut lines = code_lines(text);
    let mut tests = TestItems::default();
    tests.visit_file(file);
    for (first, last) in tests.ranges {
        for l in first..=last {
            lines.remove(&l);
        }
    }
    lines.len()
}

/// The lines that hold a token of code (comments, doc comments included, hold none).
fn code_lines(text: &str) -> BTreeSet<usize> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // A shebang line is not Rust tokens; blank it and keep the line numbers.
    let owned;
    let text = if text.starts_with("#!") && !text.starts_with("#![") {
        let end = text.find('\n').unwrap_or(text.len());
        owned = format!("{}{}", " ".repeat(end), &text[end..]);
        owned.as_str()
    } else {
        text
    };
    let source: Vec<&str> = text.split('\n').collect();
    let mut lines = BTreeSet::new();
    if let Ok(tokens) = TokenStream::from_str(text) {
        mark(tokens, &source, &mut lines);
    }
    lines
}

fn mark(tokens: TokenStream, source: &[&str], lines: &mut BTreeSet<usize>) {
    for tree in tokens {
        let span = tree.span();
        if is_comment(source, span.start()) {
            continue;
        }
        match tree {
            TokenTree::Group(g) => {
                lines.insert(source::line(g.span_open()));
                lines.insert(source::line(g.span_close()));
                mark(g.stream(), source, lines);
            }
            _ => lines.extend(span.start().line..=span.end().line),
        }
    }
}

/// Doc comments reach the token stream as `#[doc = ".."]` whose spans are the comment's: a
/// token whose source text starts a comment is one of those.
fn is_comment(source: &[&str], at: proc_macro2::LineColumn) -> bool {
    let Some(line) = at.line.checked_sub(1).and_then(|l| source.get(l)) else {
        return false;
    };
    let rest: String = line.chars().skip(at.column).take(2).collect();
    rest == "//" || rest == "/*"
}

/// The line ranges of test-only items anywhere in a file.
#[derive(Default)]
struct TestItems {
    ranges: Vec<(usize, usize)>,
}

impl TestItems {
    fn add(&mut self, tokens: TokenStream) {
        if let Some(range) = source::line_range(tokens) {
            self.ranges.push(range);
        }
    }
}

impl<'ast> Visit<'ast> for TestItems {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            self.add(item.to_token_stream());
        } else {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if is_test_only(impl_item_attrs(item)) {
            self.add(item.to_token_stream());
        } else {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        if is_test_only(trait_item_attrs(item)) {
            self.add(item.to_token_stream());
        } else {
            visit::visit_trait_item(self, item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(src: &str) -> usize {
        count(src, &syn::parse_file(src).unwrap())
    }

    #[test]
    fn comments_blank_lines_and_tests_do_not_count() {
        let src = r#"//! Crate docs.

/// A function.
/* a block
   comment */
fn f() -> &'static str {
    // a comment
    "not // a comment" /* trailing */
}

#[derive(Debug)]
struct S;

impl S {
    #[test]
    fn in_impl() {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn t() {
        assert!(true);
    }
}
"#;
        // fn f, the string, `}`, derive, struct, impl S {, `}`
        assert_eq!(loc(src), 7);
    }

    #[test]
    fn multi_line_strings_count_every_line() {
        assert_eq!(loc("const X: &str = \"a\n\nb\";\n"), 3);
    }
}
