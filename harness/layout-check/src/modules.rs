//! The module tree of one crate target, as the compiler would build it from `mod` items: files
//! (`foo.rs`, `foo/mod.rs`, `#[path]`) and inline `mod x { }` blocks, with what each module
//! imports and names.
//!
//! Test modules (`#[cfg(test)] mod tests;`) are left out, and their files remembered in
//! [`Inclusions`] so the per-file rules can leave them out too.

use crate::error::Problem;
use crate::refs::{self, RawRef};
use crate::source::{self, is_test_only};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::Item;

/// One crate target's modules; index 0 is the crate root.
#[derive(Debug, Clone)]
pub struct ModuleTree {
    /// How the root is shown (`agent`, `devstack[bin main]`).
    pub label: String,
    /// The modules.
    pub modules: Vec<Module>,
    /// Files that could not be read or parsed, module files that do not exist.
    pub problems: Vec<Problem>,
}

/// One module.
#[derive(Debug, Clone)]
pub struct Module {
    /// Its path below the crate root (empty for the root).
    pub path: Vec<String>,
    /// Its parent's index.
    pub parent: Option<usize>,
    /// Its child modules by name.
    pub children: BTreeMap<String, usize>,
    /// The file its items are in.
    pub file: PathBuf,
    /// The names its `use` items bind, to the paths they import (as written).
    pub uses: BTreeMap<String, Vec<String>>,
    /// The paths it glob-imports (`use path::*`).
    pub globs: Vec<Vec<String>>,
    /// The paths its non-test code names, with the file each is in.
    pub refs: Vec<(PathBuf, RawRef)>,
}

impl ModuleTree {
    /// The module's full name, `label::a::b`.
    pub fn display(&self, index: usize) -> String {
        let mut s = self.label.clone();
        for seg in self
            .modules
            .get(index)
            .map(|m| m.path.as_slice())
            .unwrap_or(&[])
        {
            s.push_str("::");
            s.push_str(seg);
        }
        s
    }
}

/// Which files the module trees reach as ordinary code and which only as test modules.
#[derive(Debug, Default, Clone)]
pub struct Inclusions {
    /// Files reached through non-test `mod` items (and the roots).
    pub live: BTreeSet<PathBuf>,
    /// Files reached only through a test-only `mod` item.
    pub test_files: BTreeSet<PathBuf>,
    /// Directories of test-only modules: every file below is test code.
    pub test_dirs: BTreeSet<PathBuf>,
}

impl Inclusions {
    /// Whether `file` is test code: included as a test module and never as a live one.
    pub fn is_test_file(&self, file: &Path) -> bool {
        if self.live.contains(file) {
            return false;
        }
        self.test_files.contains(file) || self.test_dirs.iter().any(|d| file.starts_with(d))
    }
}

/// Builds the tree whose root file is `root_file`.
pub fn build(label: &str, root_file: &Path, inclusions: &mut Inclusions) -> ModuleTree {
    let mut builder = Builder {
        tree: ModuleTree {
            label: label.to_owned(),
            modules: vec![Module::new(Vec::new(), None, root_file)],
            problems: Vec::new(),
        },
        inclusions,
        loaded: BTreeSet::new(),
    };
    let dir = root_file.parent().unwrap_or(Path::new("")).to_path_buf();
    builder.inclusions.live.insert(root_file.to_path_buf());
    builder.load_file(0, root_file, dir);
    builder.tree
}

impl Module {
    fn new(path: Vec<String>, parent: Option<usize>, file: &Path) -> Self {
        Self {
            path,
            parent,
            children: BTreeMap::new(),
            file: file.to_path_buf(),
            uses: BTreeMap::new(),
            globs: Vec::new(),
            refs: Vec::new(),
        }
    }
}

/// Where the items being read sit: the file, and the directory their `mod x;` files are in.
struct Place<'a> {
    file: &'a Path,
    child_dir: PathBuf,
    inline: bool,
}

struct Builder<'a> {
    tree: ModuleTree,
    inclusions: &'a mut Inclusions,
    loaded: BTreeSet<PathBuf>,
}

impl Builder<'_> {
    fn load_file(&mut self, module: usize, file: &Path, child_dir: PathBuf) {
        if !self.loaded.insert(file.to_path_buf()) {
            self.problem(
                file,
                "included twice as a module (a #[path] loop?)".to_owned(),
            );
            return;
        }
        let parsed = match source::parse(file) {
            Ok((_, parsed)) => parsed,
            Err(p) => {
                self.tree.problems.push(p);
                return;
            }
        };
        if is_test_only(&parsed.attrs) {
            return;
        }
        let place = Place {
            file,
            child_dir,
            inline: false,
        };
        self.items(module, &place, &parsed.items);
    }

    fn items(&mut self, module: usize, place: &Place<'_>, items: &[Item]) {
        for item in items {
            if is_test_only(source::item_attrs(item)) {
                if let Item::Mod(m) = item {
                    self.mark_test(place, m);
                }
                continue;
            }
            match item {
                Item::Mod(m) => self.child(module, place, m),
                Item::Use(u) => {
                    for leaf in refs::use_leaves(u) {
                        let m = &mut self.tree.modules[module];
                        if leaf.glob {
                            m.globs.push(leaf.segments.clone());
                        } else if let Some(name) = &leaf.name {
                            m.uses.insert(name.clone(), leaf.segments.clone());
                        }
                        let raw = RawRef {
                            segments: leaf.segments,
                            line: leaf.line,
                        };
                        m.refs.push((place.file.to_path_buf(), raw));
                    }
                }
                other => {
                    let found = refs::collect_item(other);
                    let m = &mut self.tree.modules[module];
                    m.refs
                        .extend(found.into_iter().map(|r| (place.file.to_path_buf(), r)));
                }
            }
        }
    }

    fn child(&mut self, parent: usize, place: &Place<'_>, m: &syn::ItemMod) {
        let name = source::name(&m.ident);
        let mut path = self.tree.modules[parent].path.clone();
        path.push(name.clone());
        let index = self.tree.modules.len();
        self.tree
            .modules
            .push(Module::new(path, Some(parent), place.file));
        self.tree.modules[parent]
            .children
            .insert(name.clone(), index);
        if let Some((_, items)) = &m.content {
            let inner = Place {
                file: place.file,
                child_dir: place.child_dir.join(&name),
                inline: true,
            };
            self.items(index, &inner, items);
            return;
        }
        match locate(place, m, &name) {
            Some((file, child_dir)) => {
                self.inclusions.live.insert(file.clone());
                self.tree.modules[index].file = file.clone();
                self.load_file(index, &file, child_dir);
            }
            None => self.problem(
                place.file,
                format!(
                    "line {}: module `{name}` has no file ({name}.rs or {name}/mod.rs)",
                    source::line(m.ident.span())
                ),
            ),
        }
    }

    fn mark_test(&mut self, place: &Place<'_>, m: &syn::ItemMod) {
        let name = source::name(&m.ident);
        if m.content.is_some() {
            self.inclusions
                .test_dirs
                .insert(place.child_dir.join(&name));
        } else if let Some((file, child_dir)) = locate(place, m, &name) {
            self.inclusions.test_files.insert(file);
            self.inclusions.test_dirs.insert(child_dir);
        }
    }

    fn problem(&mut self, file: &Path, message: String) {
        self.tree.problems.push(Problem {
            file: file.to_path_buf(),
            message,
        });
    }
}

/// The file of `mod name;` and the directory its own `mod` items look in.
fn locate(place: &Place<'_>, m: &syn::ItemMod, name: &str) -> Option<(PathBuf, PathBuf)> {
    let explicit = m.attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    });
    if let Some(explicit) = explicit {
        let base = if place.inline {
            place.child_dir.clone()
        } else {
            place.file.parent().unwrap_or(Path::new("")).to_path_buf()
        };
        let file = base.join(explicit);
        let child_dir = if file.file_name().is_some_and(|f| f == "mod.rs") {
            file.parent().unwrap_or(Path::new("")).to_path_buf()
        } else {
            file.with_extension("")
        };
        return file.is_file().then_some((file, child_dir));
    }
    let flat = place.child_dir.join(format!("{name}.rs"));
    let nested = place.child_dir.join(name).join("mod.rs");
    let child_dir = place.child_dir.join(name);
    if flat.is_file() {
        Some((flat, child_dir))
    } else if nested.is_file() {
        Some((nested, child_dir))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_inline_modules_and_test_modules() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("a/deep")).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "mod a;\nmod b { pub mod c { pub fn f() {} } }\n#[cfg(test)]\nmod tests;\n",
        )
        .unwrap();
        std::fs::write(src.join("a.rs"), "pub mod deep;\nuse crate::b::c as cc;\n").unwrap();
        std::fs::write(
            src.join("a/deep/mod.rs"),
            "pub fn g() { super::super::b::c::f() }",
        )
        .unwrap();
        std::fs::write(src.join("tests.rs"), "this is not rust").unwrap();
        let mut inc = Inclusions::default();
        let tree = build("x", &src.join("lib.rs"), &mut inc);
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
        let names: Vec<String> = (0..tree.modules.len()).map(|i| tree.display(i)).collect();
        assert_eq!(names, ["x", "x::a", "x::a::deep", "x::b", "x::b::c"]);
        assert_eq!(tree.modules[1].uses["cc"], ["crate", "b", "c"]);
        assert!(inc.is_test_file(&src.join("tests.rs")));
        assert!(!inc.is_test_file(&src.join("a/deep/mod.rs")));
    }
}
