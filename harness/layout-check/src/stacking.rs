//! Crate stacking: what ships never needs the harness, and the harness is a stack.
//!
//! A product crate may use a harness crate only to test itself (a dev-dependency). Among harness
//! crates every dependency counts, dev-dependencies too: Cargo allows a dev-dependency cycle, but
//! a cycle means no crate of it can be built, read or moved on its own, which the stack is for.

use crate::graph::sccs;
use crate::workspace::{DepKind, Workspace};

/// The stacking outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stacking {
    /// Product crates that need a harness crate to build: (product, harness, kind).
    pub product_on_harness: Vec<(String, String, DepKind)>,
    /// The harness crates in levels from the bottom (no harness dependency) up: a level's
    /// groups depend only on lower levels. A group is one crate, or the crates of one cycle (also
    /// in `cycles`), which can only be placed together.
    pub levels: Vec<Vec<Vec<String>>>,
    /// Cycles among harness crates, each as its edges (from, to, kind).
    pub cycles: Vec<Vec<(String, String, DepKind)>>,
}

/// Checks the workspace's crate stacking.
pub fn check(ws: &Workspace) -> Stacking {
    let mut out = Stacking::default();
    for krate in ws.crates.iter().filter(|c| !c.harness) {
        for dep in &krate.deps {
            let on_harness = ws.member(&dep.package).is_some_and(|d| d.harness);
            if on_harness && dep.kind != DepKind::Dev {
                out.product_on_harness
                    .push((krate.name.clone(), dep.package.clone(), dep.kind));
            }
        }
    }
    let harness: Vec<&str> = ws
        .crates
        .iter()
        .filter(|c| c.harness)
        .map(|c| c.name.as_str())
        .collect();
    let index = |name: &str| harness.iter().position(|h| *h == name);
    // edges: (from, to, kinds) with from depending on to
    let mut edges: Vec<(usize, usize, DepKind)> = Vec::new();
    for (i, name) in harness.iter().enumerate() {
        let Some(krate) = ws.member(name) else {
            continue;
        };
        for dep in &krate.deps {
            // one edge per pair, of its strongest kind (normal before build before dev)
            if let Some(j) = index(&dep.package)
                && !edges
                    .iter()
                    .any(|&(a, b, k)| a == i && b == j && k <= dep.kind)
            {
                edges.retain(|&(a, b, _)| !(a == i && b == j));
                edges.push((i, j, dep.kind));
            }
        }
    }
    let mut adjacency = vec![Vec::new(); harness.len()];
    for &(a, b, _) in &edges {
        adjacency[a].push(b);
    }
    let components = sccs(&adjacency);
    let mut component_of = vec![0; harness.len()];
    for (c, members) in components.iter().enumerate() {
        for &m in members {
            component_of[m] = c;
        }
        let self_loop = members.len() == 1 && adjacency[members[0]].contains(&members[0]);
        if members.len() < 2 && !self_loop {
            continue;
        }
        let mut cycle: Vec<(String, String, DepKind)> = edges
            .iter()
            .filter(|(a, b, _)| members.contains(a) && members.contains(b))
            .map(|&(a, b, k)| (harness[a].to_owned(), harness[b].to_owned(), k))
            .collect();
        cycle.sort();
        out.cycles.push(cycle);
    }
    // Bottom-up: repeatedly place the groups (a crate, or a cycle's crates together) whose
    // dependencies outside the group are all placed; ties by name.
    let mut placed = vec![false; components.len()];
    loop {
        let mut ready: Vec<(Vec<String>, usize)> = Vec::new();
        for (c, members) in components.iter().enumerate() {
            let below_placed = members
                .iter()
                .flat_map(|&m| &adjacency[m])
                .all(|&d| component_of[d] == c || placed[component_of[d]]);
            if !placed[c] && below_placed {
                let mut names: Vec<String> =
                    members.iter().map(|&m| harness[m].to_owned()).collect();
                names.sort();
                ready.push((names, c));
            }
        }
        if ready.is_empty() {
            break;
        }
        ready.sort();
        let mut level = Vec::new();
        for (group, c) in ready {
            placed[c] = true;
            level.push(group);
        }
        out.levels.push(level);
    }
    out
}

/// Whether the stacking breaks a rule.
pub fn violations(s: &Stacking) -> usize {
    s.product_on_harness.len() + s.cycles.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::{Crate, Dep};

    fn krate(name: &str, harness: bool, deps: &[(&str, DepKind)]) -> Crate {
        Crate {
            name: name.to_owned(),
            rel_dir: name.to_owned(),
            dir: name.into(),
            harness,
            roots: Vec::new(),
            deps: deps
                .iter()
                .map(|(p, kind)| Dep {
                    package: (*p).to_owned(),
                    kind: *kind,
                })
                .collect(),
        }
    }

    #[test]
    fn product_on_harness_and_harness_cycles() {
        let ws = Workspace {
            root: ".".into(),
            crates: vec![
                krate("core", false, &[("testbed", DepKind::Dev)]),
                krate(
                    "agent",
                    false,
                    &[("core", DepKind::Normal), ("testbed", DepKind::Build)],
                ),
                krate(
                    "testbed",
                    true,
                    &[("core", DepKind::Normal), ("devstack", DepKind::Dev)],
                ),
                krate("devstack", true, &[("testbed", DepKind::Normal)]),
                krate("check", true, &[]),
            ],
        };
        let s = check(&ws);
        assert_eq!(
            s.product_on_harness,
            [("agent".to_owned(), "testbed".to_owned(), DepKind::Build)]
        );
        assert_eq!(s.cycles.len(), 1);
        assert_eq!(s.levels, [[vec!["check"], vec!["devstack", "testbed"]]]);
    }

    #[test]
    fn a_stack_is_ordered_bottom_up() {
        let ws = Workspace {
            root: ".".into(),
            crates: vec![
                krate("e2e", true, &[("devstack", DepKind::Dev)]),
                krate("devstack", true, &[("testbed", DepKind::Normal)]),
                krate("testbed", true, &[]),
            ],
        };
        let s = check(&ws);
        assert!(s.cycles.is_empty());
        assert_eq!(s.levels, [[["testbed"]], [["devstack"]], [["e2e"]]]);
    }
}
