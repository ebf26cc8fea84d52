//! The volume mode's spellings as string literals.
//!
//! The three ways an identity volume is delivered are spelled on the wire (annotations, flags,
//! status) exactly once, in the core module that owns them; every other crate uses its type. A
//! second spelling is how two parts drift apart on a rename.

use crate::source::{self, impl_item_attrs, is_test_only, item_attrs, trait_item_attrs};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// The spellings. Built with `concat!` so this file does not itself hold the literals it looks
/// for (the rule covers every crate, this one too).
pub const SPELLINGS: [&str; 3] = [
    concat!("fl", "ex"),
    concat!("csi-", "socket"),
    concat!("csi-", "files"),
];

/// The one file allowed to spell them: package, then the path below the crate's directory.
pub const OWNER: (&str, &str) = ("athenz-core", "src/node/volume_mode.rs");

/// A spelling found in non-test code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spelling {
    /// Which one.
    pub value: String,
    /// The 1-based line.
    pub line: usize,
}

/// The spellings in a file's non-test code: string and byte-string literals whose whole value is
/// one of [`SPELLINGS`], in code, in macro bodies and in attribute arguments.
pub fn find(file: &syn::File) -> Vec<Spelling> {
    let mut scan = Scan::default();
    scan.visit_file(file);
    scan.found
}

#[derive(Default)]
struct Scan {
    found: Vec<Spelling>,
}

impl Scan {
    fn check(&mut self, value: &[u8], line: usize) {
        if let Some(s) = SPELLINGS.iter().find(|s| s.as_bytes() == value) {
            self.found.push(Spelling {
                value: (*s).to_owned(),
                line,
            });
        }
    }

    fn tokens(&mut self, tokens: TokenStream) {
        for tree in tokens {
            match tree {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Literal(lit) => {
                    let line = source::line(lit.span());
                    match syn::Lit::new(lit) {
                        syn::Lit::Str(s) => self.check(s.value().as_bytes(), line),
                        syn::Lit::ByteStr(b) => self.check(&b.value(), line),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Scan {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
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

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        self.check(lit.value().as_bytes(), source::line(lit.span()));
    }

    fn visit_lit_byte_str(&mut self, lit: &'ast syn::LitByteStr) {
        self.check(&lit.value(), source::line(lit.span()));
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
    }

    // `#[serde(rename = "..")]`, `#[arg(default_value = "..")]`: spellings too.
    fn visit_meta_list(&mut self, list: &'ast syn::MetaList) {
        self.tokens(list.tokens.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_literals_outside_tests() {
        let (flex, socket, files) = (SPELLINGS[0], SPELLINGS[1], SPELLINGS[2]);
        let src = format!(
            "fn a() -> &'static str {{ \"{flex}\" }}\n\
             fn b() {{ println!(\"{{}}\", \"{socket}\"); }}\n\
             #[serde(rename = \"{files}\")] struct C;\n\
             const D: &[u8] = b\"{flex}\";\n\
             const E: &str = \"volume: {flex}\";\n\
             #[cfg(test)] fn t() {{ let _ = \"{flex}\"; }}\n"
        );
        let found: Vec<(String, usize)> = find(&syn::parse_file(&src).unwrap())
            .into_iter()
            .map(|s| (s.value, s.line))
            .collect();
        assert_eq!(
            found,
            [
                (flex.to_owned(), 1),
                (socket.to_owned(), 2),
                (files.to_owned(), 3),
                (flex.to_owned(), 4)
            ]
        );
    }
}
