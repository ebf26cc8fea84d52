//! Circles among sibling modules.
//!
//! A reference from module P to module Q is an edge between the two children of their deepest
//! common ancestor that contain P and Q: `stack::keys` → `stack::start` is an edge among
//! `stack`'s children, `pod_dirs` → `stack::start` one among the crate root's. A reference to an
//! ancestor or a descendant is no edge (a parent and its children are one unit). A strongly
//! connected component of more than one sibling is a circle: those modules cannot be read, moved
//! or tested one without the others.

use crate::modules::ModuleTree;
use crate::resolve::module_of;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A circle among the children of one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The common parent (`agent`, `devstack::stack`).
    pub parent: String,
    /// The siblings in the circle, by name.
    pub members: Vec<String>,
    /// Every edge between members, each with the first place that makes it.
    pub edges: Vec<Edge>,
}

/// One edge of a circle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The sibling whose code names the other.
    pub from: String,
    /// The sibling named.
    pub to: String,
    /// A file that makes the edge.
    pub file: PathBuf,
    /// The line there.
    pub line: usize,
}

/// Among one module's children: (from child, to child) to the first (file, line) making it.
type SiblingEdges = BTreeMap<(usize, usize), (PathBuf, usize)>;

/// The circles of a module tree, ordered by parent and then first member.
pub fn circles(tree: &ModuleTree) -> Vec<Circle> {
    let mut edges: BTreeMap<usize, SiblingEdges> = BTreeMap::new();
    for (p, module) in tree.modules.iter().enumerate() {
        for (file, raw) in &module.refs {
            let Some(q) = module_of(tree, p, &raw.segments) else {
                continue;
            };
            let Some((parent, a, b)) = sibling_pair(tree, p, q) else {
                continue;
            };
            let at = (file.clone(), raw.line);
            let slot = edges
                .entry(parent)
                .or_default()
                .entry((a, b))
                .or_insert(at.clone());
            if at < *slot {
                *slot = at;
            }
        }
    }
    let mut out = Vec::new();
    for (parent, sibling_edges) in &edges {
        let nodes: Vec<usize> = tree.modules[*parent].children.values().copied().collect();
        let local = |m: usize| nodes.iter().position(|&n| n == m);
        let mut adjacency = vec![Vec::new(); nodes.len()];
        for &(a, b) in sibling_edges.keys() {
            if let (Some(a), Some(b)) = (local(a), local(b)) {
                adjacency[a].push(b);
            }
        }
        for component in sccs(&adjacency) {
            if component.len() < 2 {
                continue;
            }
            let members: Vec<usize> = component.iter().map(|&i| nodes[i]).collect();
            let mut circle_edges: Vec<Edge> = sibling_edges
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|((a, b), (file, line))| Edge {
                    from: tree.display(*a),
                    to: tree.display(*b),
                    file: file.clone(),
                    line: *line,
                })
                .collect();
            circle_edges.sort_by(|x, y| (&x.from, &x.to).cmp(&(&y.from, &y.to)));
            let mut names: Vec<String> = members.iter().map(|&m| tree.display(m)).collect();
            names.sort();
            out.push(Circle {
                parent: tree.display(*parent),
                members: names,
                edges: circle_edges,
            });
        }
    }
    out.sort_by(|x, y| (&x.parent, &x.members).cmp(&(&y.parent, &y.members)));
    out
}

/// The deepest common ancestor of `p` and `q` and its two children that contain them; `None`
/// when one contains the other.
fn sibling_pair(tree: &ModuleTree, p: usize, q: usize) -> Option<(usize, usize, usize)> {
    let chain = |mut m: usize| {
        let mut v = vec![m];
        while let Some(parent) = tree.modules.get(m).and_then(|x| x.parent) {
            v.push(parent);
            m = parent;
        }
        v.reverse();
        v
    };
    let (cp, cq) = (chain(p), chain(q));
    let common = cp.iter().zip(&cq).take_while(|(a, b)| a == b).count();
    let (a, b) = (cp.get(common)?, cq.get(common)?);
    Some((cp[common - 1], *a, *b))
}

/// Strongly connected components (Tarjan), each listing node indices.
pub fn sccs(adjacency: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adjacency: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn connect(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.adjacency[v] {
            match s.index[w] {
                None => {
                    connect(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort_unstable();
            s.out.push(component);
        }
    }
    let n = adjacency.len();
    let mut state = State {
        adjacency,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            connect(&mut state, v);
        }
    }
    state.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        let adjacency = vec![vec![1], vec![2], vec![0], vec![0], vec![4]];
        let mut got = sccs(&adjacency);
        got.sort();
        assert_eq!(got, vec![vec![0, 1, 2], vec![3], vec![4]]);
    }
}
