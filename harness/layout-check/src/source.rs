//! Reading one Rust file with syn, and telling test code from the rest.
//!
//! Every rule that looks at Rust code skips test code: a `#[cfg(test)]` item, a `#[test]`
//! function. The rules are about what ships, and tests are allowed to spell things out.

use crate::error::Problem;
use proc_macro2::{Span, TokenStream, TokenTree};
use std::path::Path;
use syn::punctuated::Punctuated;
use syn::{Attribute, ImplItem, Item, Meta, Token, TraitItem};

/// Reads and parses a file; a failure names the file (and the line, for a syntax error).
pub fn parse(path: &Path) -> Result<(String, syn::File), Problem> {
    let text = std::fs::read_to_string(path).map_err(|e| Problem {
        file: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })?;
    parse_text(path, text)
}

/// Parses text read from `path` (kept apart from [`parse`] so it can be given any text).
pub fn parse_text(path: &Path, text: String) -> Result<(String, syn::File), Problem> {
    match syn::parse_file(&text) {
        Ok(file) => Ok((text, file)),
        Err(e) => {
            let at = e.span().start();
            Err(Problem {
                file: path.to_path_buf(),
                message: format!("does not parse as Rust (line {}): {e}", at.line),
            })
        }
    }
}

/// The 1-based line a span starts on.
pub fn line(span: Span) -> usize {
    span.start().line
}

/// An identifier's name without a raw prefix (`r#type` is the module `type`).
pub fn name(ident: &syn::Ident) -> String {
    let s = ident.to_string();
    match s.strip_prefix("r#") {
        Some(rest) => rest.to_owned(),
        None => s,
    }
}

/// The outer attributes of an item (empty for the kinds that have none).
pub fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item inside an `impl` block.
pub fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item inside a trait.
pub fn trait_item_attrs(item: &TraitItem) -> &[Attribute] {
    match item {
        TraitItem::Const(i) => &i.attrs,
        TraitItem::Fn(i) => &i.attrs,
        TraitItem::Type(i) => &i.attrs,
        TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// Whether these attributes make their item test-only: `#[cfg(test)]` (also inside `all(..)`,
/// or an `any(..)` of test-only predicates), `#[test]`, `#[bench]` or a `#[…::test]` such as
/// `#[tokio::test]`.
pub fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        if path.is_ident("cfg") {
            return attr
                .parse_args::<Meta>()
                .is_ok_and(|meta| cfg_implies_test(&meta));
        }
        path.segments
            .last()
            .is_some_and(|s| s.ident == "test" || s.ident == "bench")
    })
}

/// Whether a cfg predicate can only hold in a test build.
fn cfg_implies_test(meta: &Meta) -> bool {
    match meta {
        Meta::Path(p) => p.is_ident("test"),
        Meta::List(list) => {
            let Ok(nested) = list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            else {
                return false;
            };
            if list.path.is_ident("all") {
                nested.iter().any(cfg_implies_test)
            } else if list.path.is_ident("any") {
                !nested.is_empty() && nested.iter().all(cfg_implies_test)
            } else {
                false
            }
        }
        Meta::NameValue(_) => false,
    }
}

/// The first and last line any token of `tokens` touches (groups by their delimiters and
/// contents), or `None` for an empty stream.
pub fn line_range(tokens: TokenStream) -> Option<(usize, usize)> {
    let mut range: Option<(usize, usize)> = None;
    let mut widen = |first: usize, last: usize| {
        range = Some(match range {
            None => (first, last),
            Some((a, b)) => (a.min(first), b.max(last)),
        });
    };
    for tree in tokens {
        match tree {
            TokenTree::Group(g) => {
                widen(line(g.span_open()), g.span_close().end().line);
                if let Some((a, b)) = line_range(g.stream()) {
                    widen(a, b);
                }
            }
            other => {
                let span = other.span();
                widen(span.start().line, span.end().line);
            }
        }
    }
    range
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(src: &str) -> Vec<Attribute> {
        let item: syn::ItemFn = syn::parse_str(&format!("{src} fn f() {{}}")).unwrap();
        item.attrs
    }

    #[test]
    fn test_only_attributes() {
        assert!(is_test_only(&attrs("#[cfg(test)]")));
        assert!(is_test_only(&attrs("#[cfg(all(test, unix))]")));
        assert!(is_test_only(&attrs("#[cfg(any(test, all(test, unix)))]")));
        assert!(is_test_only(&attrs("#[test]")));
        assert!(is_test_only(&attrs(
            "#[tokio::test(flavor = \"current_thread\")]"
        )));
        assert!(!is_test_only(&attrs("#[cfg(any(test, feature = \"x\"))]")));
        assert!(!is_test_only(&attrs("#[cfg(not(test))]")));
        assert!(!is_test_only(&attrs("#[inline]")));
    }

    #[test]
    fn a_syntax_error_names_the_file_and_line() {
        let Err(err) = parse_text(Path::new("src/bad.rs"), "fn ok() {}\nfn (".to_owned()) else {
            panic!("parsed");
        };
        assert_eq!(err.file, Path::new("src/bad.rs"));
        assert!(err.message.contains("line 2"), "{}", err.message);
    }
}
