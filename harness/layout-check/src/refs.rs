//! The paths a piece of non-test code names, as written: `use` trees, paths in expressions,
//! types and patterns, and `crate::`/`super::`/`self::` paths inside macro bodies.
//!
//! Resolving them to modules is [`crate::resolve`]'s job; this module only reads syntax, so the
//! two can be tested apart.

use crate::source::{self, impl_item_attrs, is_test_only, item_attrs, trait_item_attrs};
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{UseTree, spanned::Spanned};

/// A path named at a line of the file being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRef {
    /// The segments as written (`crate`, `super`, `self` included).
    pub segments: Vec<String>,
    /// The 1-based line.
    pub line: usize,
}

/// One leaf of a `use` tree: the path it imports and the name it binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseLeaf {
    /// The full path (for a glob, the path before `*`).
    pub segments: Vec<String>,
    /// The name it binds in the module (`None` for a glob or `as _`).
    pub name: Option<String>,
    /// `use path::*`.
    pub glob: bool,
    /// The 1-based line of the leaf.
    pub line: usize,
}

/// The leaves of a `use` item; empty for `use ::x` (an absolute path is never this crate's).
pub fn use_leaves(item: &syn::ItemUse) -> Vec<UseLeaf> {
    let mut out = Vec::new();
    if item.leading_colon.is_none() {
        walk_use(&item.tree, &mut Vec::new(), &mut out);
    }
    out
}

fn walk_use(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    let leaf = |prefix: &[String], ident: &syn::Ident| {
        let name = source::name(ident);
        let mut segments = prefix.to_vec();
        if name != "self" {
            segments.push(name);
        }
        segments
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(source::name(&p.ident));
            walk_use(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let segments = leaf(prefix, &n.ident);
            out.push(UseLeaf {
                name: segments.last().cloned(),
                segments,
                glob: false,
                line: source::line(n.ident.span()),
            });
        }
        UseTree::Rename(r) => {
            let rename = source::name(&r.rename);
            out.push(UseLeaf {
                segments: leaf(prefix, &r.ident),
                name: (rename != "_").then_some(rename),
                glob: false,
                line: source::line(r.ident.span()),
            });
        }
        UseTree::Glob(g) => out.push(UseLeaf {
            segments: prefix.clone(),
            name: None,
            glob: true,
            line: source::line(g.star_token.span()),
        }),
        UseTree::Group(g) => {
            for t in &g.items {
                walk_use(t, prefix, out);
            }
        }
    }
}

/// The paths named by one item's non-test code. Items nested in it that are modules are not
/// entered: a module's paths belong to that module.
pub fn collect_item(item: &syn::Item) -> Vec<RawRef> {
    let mut c = Collector::default();
    c.visit_item(item);
    c.out
}

#[derive(Default)]
struct Collector {
    out: Vec<RawRef>,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) || matches!(item, syn::Item::Mod(_)) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if !is_test_only(impl_item_attrs(item)) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        if !is_test_only(trait_item_attrs(item)) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.out
            .extend(use_leaves(item).into_iter().map(|l| RawRef {
                segments: l.segments,
                line: l.line,
            }));
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && !path.segments.is_empty() {
            self.out.push(RawRef {
                segments: path
                    .segments
                    .iter()
                    .map(|s| source::name(&s.ident))
                    .collect(),
                line: source::line(path.span()),
            });
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        scan_tokens(mac.tokens.clone(), &mut self.out);
    }

    // Attributes (derives, docs, serde options) name no module of this crate.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// Finds `crate::a::b`, `$crate::a`, `super::a`, `self::a` token runs in a macro body, which syn
/// does not parse into paths.
fn scan_tokens(tokens: TokenStream, out: &mut Vec<RawRef>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => {
                scan_tokens(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(id)
                if matches!(id.to_string().as_str(), "crate" | "super" | "self") =>
            {
                let mut segments = vec![id.to_string()];
                let mut j = i + 1;
                while let Some(next) = path_step(&trees, j) {
                    segments.push(next);
                    j += 3;
                }
                if segments.len() > 1 {
                    out.push(RawRef {
                        segments,
                        line: source::line(id.span()),
                    });
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
}

/// `:: ident` at `at`: the identifier's name.
fn path_step(trees: &[TokenTree], at: usize) -> Option<String> {
    match (trees.get(at)?, trees.get(at + 1)?, trees.get(at + 2)?) {
        (TokenTree::Punct(a), TokenTree::Punct(b), TokenTree::Ident(id))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':' =>
        {
            Some(source::name(id))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(src: &str) -> Vec<(String, Option<String>, bool)> {
        let item: syn::ItemUse = syn::parse_str(src).unwrap();
        use_leaves(&item)
            .into_iter()
            .map(|l| (l.segments.join("::"), l.name, l.glob))
            .collect()
    }

    #[test]
    fn use_trees_to_leaves() {
        let got = leaves("use crate::a::{self, b::C as D, e::*, f as _};");
        assert_eq!(
            got,
            [
                ("crate::a".to_owned(), Some("a".to_owned()), false),
                ("crate::a::b::C".to_owned(), Some("D".to_owned()), false),
                ("crate::a::e".to_owned(), None, true),
                ("crate::a::f".to_owned(), None, false),
            ]
        );
        assert!(leaves("use ::std::io;").is_empty());
    }

    #[test]
    fn paths_in_code_and_macros_but_not_tests() {
        let file: syn::File = syn::parse_str(
            "fn f() -> super::T {\n let _ = crate::x::y();\n println!(\"{}\", $crate::m::n);\n}\n\
             #[cfg(test)] fn g() { crate::hidden::z(); }\n\
             impl S { #[test] fn h() { crate::hidden::w(); } fn k() { self::q::r(); } }",
        )
        .unwrap();
        let refs: Vec<String> = file
            .items
            .iter()
            .flat_map(collect_item)
            .map(|r| format!("{}@{}", r.segments.join("::"), r.line))
            .collect();
        assert!(refs.contains(&"super::T@1".to_owned()), "{refs:?}");
        assert!(refs.contains(&"crate::x::y@2".to_owned()), "{refs:?}");
        assert!(refs.contains(&"crate::m::n@3".to_owned()), "{refs:?}");
        assert!(refs.contains(&"self::q::r@6".to_owned()), "{refs:?}");
        assert!(!refs.iter().any(|r| r.contains("hidden")), "{refs:?}");
    }
}
