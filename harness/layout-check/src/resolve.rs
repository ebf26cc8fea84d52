//! Which module of the tree a path names: the longest module prefix of what it reaches.
//!
//! Paths start at `crate`, `super`, `self`, or a name the current module has in scope (a child
//! module or a `use`); anything else (std, another crate, a local item) names no module here.
//! Names bound by `use` are followed, so `crate::volume::X` in a crate whose root says
//! `pub use node::volume;` names `node::volume`: a re-export must not hide a dependency.

use crate::modules::ModuleTree;

/// How deep `use` chains are followed before giving up (a glob or alias loop ends there).
const MAX_DEPTH: usize = 16;

/// The module `segments`, written in module `from`, names; `None` if it names no module of
/// this tree.
pub fn module_of(tree: &ModuleTree, from: usize, segments: &[String]) -> Option<usize> {
    resolve(tree, from, segments, 0).map(|r| r.module)
}

/// Where a path led: the module, and whether the whole path was that module (rather than an
/// item inside it).
#[derive(Debug, Clone, Copy)]
struct Reached {
    module: usize,
    exact: bool,
}

fn resolve(tree: &ModuleTree, from: usize, segments: &[String], depth: usize) -> Option<Reached> {
    if depth > MAX_DEPTH {
        return None;
    }
    let first = segments.first()?;
    let (start, rest) = match first.as_str() {
        "crate" | "$crate" => (0, &segments[1..]),
        "self" => (from, &segments[1..]),
        "super" => {
            let mut module = from;
            let mut i = 0;
            while segments.get(i).is_some_and(|s| s == "super") {
                module = tree.modules.get(module)?.parent?;
                i += 1;
            }
            (module, &segments[i..])
        }
        name => {
            step(tree, from, name, depth)?;
            (from, segments)
        }
    };
    Some(walk(tree, start, rest, depth))
}

/// Follows `rest` down from `module` as far as it goes through modules.
fn walk(tree: &ModuleTree, mut module: usize, rest: &[String], depth: usize) -> Reached {
    for seg in rest {
        match step(tree, module, seg, depth) {
            Some(Reached {
                module: next,
                exact: true,
            }) => module = next,
            Some(Reached {
                module: next,
                exact: false,
            }) => {
                return Reached {
                    module: next,
                    exact: false,
                };
            }
            None => {
                return Reached {
                    module,
                    exact: false,
                };
            }
        }
    }
    Reached {
        module,
        exact: true,
    }
}

/// What `name` means inside `module`: a child module, a `use` binding, or a child module of a
/// glob-imported module.
fn step(tree: &ModuleTree, module: usize, name: &str, depth: usize) -> Option<Reached> {
    let m = tree.modules.get(module)?;
    if let Some(&child) = m.children.get(name) {
        return Some(Reached {
            module: child,
            exact: true,
        });
    }
    if let Some(target) = m.uses.get(name) {
        // A `use` of something outside this crate still binds the name: it names no module.
        return resolve(tree, module, target, depth + 1);
    }
    m.globs.iter().find_map(|glob| {
        let reached = resolve(tree, module, glob, depth + 1)?;
        if !reached.exact {
            return None;
        }
        let child = *tree.modules.get(reached.module)?.children.get(name)?;
        Some(Reached {
            module: child,
            exact: true,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::{Inclusions, build};

    fn segs(s: &str) -> Vec<String> {
        s.split("::").map(str::to_owned).collect()
    }

    #[test]
    fn crate_super_self_and_reexports() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("node")).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "pub mod node;\npub mod other;\npub use node::volume;\npub use node::volume::Layout as L;\n",
        )
        .unwrap();
        std::fs::write(src.join("node/mod.rs"), "pub mod volume;\npub mod peer;\n").unwrap();
        std::fs::write(src.join("node/volume.rs"), "pub struct Layout;\n").unwrap();
        std::fs::write(src.join("node/peer.rs"), "use super::volume::*;\n").unwrap();
        std::fs::write(src.join("other.rs"), "").unwrap();
        let tree = build("core", &src.join("lib.rs"), &mut Inclusions::default());
        let index = |name: &str| {
            (0..tree.modules.len())
                .find(|&i| tree.display(i) == name)
                .unwrap()
        };
        let (peer, other, volume) = (
            index("core::node::peer"),
            index("core::other"),
            index("core::node::volume"),
        );
        let at = |from, p: &str| module_of(&tree, from, &segs(p)).map(|m| tree.display(m));
        assert_eq!(
            at(other, "crate::volume::Layout").as_deref(),
            Some("core::node::volume")
        );
        assert_eq!(at(other, "crate::L").as_deref(), Some("core::node::volume"));
        assert_eq!(
            at(peer, "super::super::other::f").as_deref(),
            Some("core::other")
        );
        assert_eq!(at(peer, "super::peer").as_deref(), Some("core::node::peer"));
        assert_eq!(
            at(volume, "self::Layout").as_deref(),
            Some("core::node::volume")
        );
        assert_eq!(at(other, "std::fs::read").as_deref(), None);
        assert_eq!(at(0, "node::volume").as_deref(), Some("core::node::volume"));
    }
}
