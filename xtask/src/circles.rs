//! `cargo xtask circles [CRATE_DIR...]`: import circles between a crate's
//! files.
//!
//! A crate's files are the nodes: its root (`src/lib.rs`, `src/main.rs`)
//! and every file reached from it through `mod x;` declarations (test
//! modules included; an inline `mod x { ... }` belongs to its file). File A
//! has an edge to file B when A's code names an item of B: through `use`
//! declarations and through paths in expressions, types, patterns and macro
//! bodies. A path resolves to the file of the longest module prefix that
//! exists; an item that file only imports or re-exports (`pub use
//! child::Item;`, `use super::*`) is followed to the file that defines it.
//! Declaring a child module and re-exporting its items is not depending on
//! it; a file whose own code uses an item it re-exports is.
//!
//! Files that depend on each other, directly or around a longer loop, form
//! a circle (a strongly connected component of more than one file): none
//! of them can be read, tested or moved without the others. The task prints
//! each circle with one example name per edge, then every file in layering
//! order, bottom first, and fails when a circle exists. [`circles`] serves
//! a caller that runs this as a check (`cargo xtask tidy`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::buffer::{Cursor, TokenBuffer};
use syn::ext::IdentExt;
use syn::visit::{self, Visit};

/// How many imports, re-exports and glob imports one resolution may pass
/// through (rustc rejects `use` loops; this stops them here).
const MAX_HOPS: usize = 32;

/// Files that import each other, directly or around a loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Circle {
    /// The files, relative to the crate's `src/`, sorted.
    pub(crate) files: Vec<String>,
    /// Every edge between two files of the circle, sorted by file names.
    pub(crate) edges: Vec<Edge>,
}

/// File `from` names items of file `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edge {
    /// The importing file, relative to `src/`.
    pub(crate) from: String,
    /// The file that defines what is imported, relative to `src/`.
    pub(crate) to: String,
    /// The alphabetically first item of `to` that `from` names (`*` for a
    /// glob import of which no name could be told, as for trait methods).
    pub(crate) example: String,
    /// How many different items of `to` `from` names.
    pub(crate) names: usize,
}

/// One line of the layering: a file, or the files of one circle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Component {
    /// 0 for files that use no other file of the crate, else one more than
    /// the highest level among the files they use.
    pub(crate) level: usize,
    /// The file, or the circle's files, relative to `src/`, sorted.
    pub(crate) files: Vec<String>,
}

/// Runs the task over the crate directories in `args` (every crate under
/// `crates/` when none is given); fails when any crate has a circle.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if let Some(flag) = args.iter().find(|a| a.starts_with('-')) {
        return Err(format!(
            "unknown option `{flag}`; usage: cargo xtask circles [CRATE_DIR...]"
        ));
    }
    let dirs: Vec<PathBuf> = if args.is_empty() {
        workspace_crates()?
    } else {
        args.iter().map(PathBuf::from).collect()
    };
    let mut found = 0;
    for dir in &dirs {
        let circles = circles(dir)?;
        let layers = layers(dir)?;
        println!("{}: {} import circle(s)", dir.display(), circles.len());
        for (i, circle) in circles.iter().enumerate() {
            print!("circle {}: {}", i + 1, format_circle(circle));
        }
        println!("layers, bottom first (a line uses only lines of lower levels):");
        print!("{}", format_layers(&layers, &circles));
        found += circles.len();
    }
    if found == 0 {
        Ok(())
    } else {
        Err(format!(
            "{found} import circle(s); break each by moving what both sides use into a file \
             below them, or by passing it in instead of importing it"
        ))
    }
}

/// The import circles of the crate in `crate_dir`, bottom first.
pub(crate) fn circles(crate_dir: &Path) -> Result<Vec<Circle>, String> {
    let graph = Crate::load(crate_dir)?.graph();
    Ok(graph.circles())
}

/// Every file of the crate in `crate_dir` in layering order, bottom first,
/// a circle's files as one component.
pub(crate) fn layers(crate_dir: &Path) -> Result<Vec<Component>, String> {
    let graph = Crate::load(crate_dir)?.graph();
    Ok(graph.layers())
}

/// One circle as text: its files on the first line, then one line an edge
/// with an example of what is imported (`a.rs -> b.rs: Item (+2 more)`).
pub(crate) fn format_circle(circle: &Circle) -> String {
    let mut out = format!(
        "{} ({} files)\n",
        circle.files.join(", "),
        circle.files.len()
    );
    for e in &circle.edges {
        out.push_str(&format!("    {} -> {}: {}", e.from, e.to, e.example));
        if e.names > 1 {
            out.push_str(&format!(" (+{} more)", e.names - 1));
        }
        out.push('\n');
    }
    out
}

/// The layering as text, one component a line with its level; a circle's
/// line carries its number in `circles`.
fn format_layers(layers: &[Component], circles: &[Circle]) -> String {
    let mut out = String::new();
    for c in layers {
        let files = c.files.join(", ");
        match circles.iter().position(|k| k.files == c.files) {
            Some(i) => out.push_str(&format!("  {:>3}  circle {}: {files}\n", c.level, i + 1)),
            None => out.push_str(&format!("  {:>3}  {files}\n", c.level)),
        }
    }
    out
}

/// The directories under the workspace's `crates/` that hold a crate root.
fn workspace_crates() -> Result<Vec<PathBuf>, String> {
    let crates = crate::workspace::root().join("crates");
    let entries = std::fs::read_dir(&crates).map_err(|e| {
        format!(
            "cannot list {}: {e}; pass crate directories",
            crates.display()
        )
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|d| ROOTS.iter().any(|r| d.join("src").join(r).is_file()))
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The crate root files a crate directory's `src/` may hold.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

/// The files of a crate and the modules they hold, as parsed.
struct Crate {
    /// The directory given, to name files in errors as the caller wrote it.
    dir: PathBuf,
    /// `src/`, canonical.
    src: PathBuf,
    /// The files, canonical; a file's index is its node.
    files: Vec<PathBuf>,
    /// Every module, file or inline; each crate root's module first.
    modules: Vec<Module>,
    /// `#[macro_export]` macros, which live at the crate root: name to file.
    macro_exports: BTreeMap<String, usize>,
}

/// One module: a file's top level or an inline `mod x { ... }`.
#[derive(Default)]
struct Module {
    /// The file that holds the module's code.
    file: usize,
    /// The enclosing module; none for a crate root.
    parent: Option<usize>,
    /// The crate root module of this module's tree.
    root: usize,
    /// The directory in which this module's `mod x;` files live.
    dir: PathBuf,
    /// Child modules by name.
    children: BTreeMap<String, usize>,
    /// Names of the items the module defines, modules aside.
    items: BTreeSet<String>,
    /// Names that `use` and `extern crate` bind, to the path they bind, as
    /// written in this module.
    bindings: BTreeMap<String, Vec<String>>,
    /// The paths of the module's glob imports, as written.
    globs: Vec<Vec<String>>,
    /// Every `use` leaf of the module, fn bodies included.
    uses: Vec<UseLeaf>,
    /// Every path the module's code names, outside `use` declarations.
    refs: BTreeSet<Vec<String>>,
}

/// One leaf of a `use` tree, braces expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UseLeaf {
    /// The full path, as written (`crate`, `super`, `self` or a name first).
    path: Vec<String>,
    /// The name it binds; none for globs and `as _`.
    name: Option<String>,
    /// Whether it is a glob (`path::*`).
    glob: bool,
    /// Whether it is a re-export (`pub`, `pub(crate)`, ... `use`).
    reexport: bool,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A module of the crate.
    Module(usize),
    /// An item, by the file that defines it and its name there.
    Item(usize, String),
    /// Something outside the crate, or a local name (a variable, a generic).
    Outside,
}

impl Crate {
    /// Reads and parses every file of the crate in `crate_dir`.
    fn load(crate_dir: &Path) -> Result<Self, String> {
        let src = crate_dir.join("src");
        let roots: Vec<PathBuf> = ROOTS
            .iter()
            .map(|r| src.join(r))
            .filter(|p| p.is_file())
            .collect();
        if roots.is_empty() {
            return Err(format!(
                "{} has no src/lib.rs or src/main.rs; pass a crate's directory",
                crate_dir.display()
            ));
        }
        let src = src
            .canonicalize()
            .map_err(|e| format!("cannot read {}: {e}", src.display()))?;
        let mut krate = Self {
            dir: crate_dir.to_path_buf(),
            src: src.clone(),
            files: Vec::new(),
            modules: Vec::new(),
            macro_exports: BTreeMap::new(),
        };
        for root in roots {
            let (file, items) = krate.parse(&root)?;
            let m = krate.modules.len();
            krate.modules.push(Module {
                file,
                root: m,
                dir: src.clone(),
                ..Module::default()
            });
            krate.fill(m, &items, true)?;
        }
        Ok(krate)
    }

    /// Adds `path` as a node (once) and parses it.
    fn parse(&mut self, path: &Path) -> Result<(usize, Vec<syn::Item>), String> {
        let canonical = path
            .canonicalize()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file = match self.files.iter().position(|f| *f == canonical) {
            Some(i) => i,
            None => {
                self.files.push(canonical);
                self.files.len() - 1
            }
        };
        let shown = self.dir.join("src").join(self.name(file));
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", shown.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| {
            format!(
                "{} does not parse: {e}; fix it (`cargo check` shows where)",
                shown.display()
            )
        })?;
        Ok((file, ast.items))
    }

    /// A file's name relative to `src/`.
    fn name(&self, file: usize) -> String {
        let path = &self.files[file];
        path.strip_prefix(&self.src)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Records the items of module `m`, loading the files of its `mod x;`
    /// declarations; `top` says whether `items` are its file's top level.
    fn fill(&mut self, m: usize, items: &[syn::Item], top: bool) -> Result<(), String> {
        let mut refs = Refs::default();
        for item in items {
            match item {
                syn::Item::Mod(decl) => self.child(m, decl, top)?,
                syn::Item::Use(u) => {
                    let reexport = !matches!(u.vis, syn::Visibility::Inherited);
                    if u.leading_colon.is_none() {
                        use_leaves(&u.tree, &mut Vec::new(), reexport, &mut refs.uses);
                    }
                }
                syn::Item::ExternCrate(e) => {
                    let name = e.rename.as_ref().map_or(&e.ident, |(_, r)| r);
                    let path = if e.ident == "self" {
                        "crate".to_string()
                    } else {
                        e.ident.unraw().to_string()
                    };
                    self.modules[m]
                        .bindings
                        .entry(name.unraw().to_string())
                        .or_insert(vec![path]);
                }
                _ => {
                    let md = &mut self.modules[m];
                    md.items.extend(item_names(item));
                    if let syn::Item::Macro(mac) = item
                        && let Some(ident) = &mac.ident
                        && mac.attrs.iter().any(|a| a.path().is_ident("macro_export"))
                    {
                        self.macro_exports
                            .entry(ident.unraw().to_string())
                            .or_insert(md.file);
                    }
                    refs.visit_item(item);
                }
            }
        }
        let md = &mut self.modules[m];
        md.refs.extend(refs.paths);
        for leaf in refs.uses {
            if leaf.glob {
                md.globs.push(leaf.path.clone());
            } else if let Some(name) = &leaf.name {
                md.bindings
                    .entry(name.clone())
                    .or_insert_with(|| leaf.path.clone());
            }
            md.uses.push(leaf);
        }
        Ok(())
    }

    /// Records the child module that `decl` declares in module `m`, loading
    /// its file unless it is inline.
    fn child(&mut self, m: usize, decl: &syn::ItemMod, top: bool) -> Result<(), String> {
        let name = decl.ident.unraw().to_string();
        let known = self.modules[m].children.get(&name).copied();
        let (file, dir, loaded) = match &decl.content {
            Some(_) => {
                let parent = &self.modules[m];
                (parent.file, parent.dir.join(&name), Vec::new())
            }
            None => {
                let path = self.module_file(m, decl, &name, top)?;
                let dir = if path.file_name().is_some_and(|n| n == "mod.rs")
                    || path_attr(decl).is_some()
                {
                    path.parent().map(Path::to_path_buf).unwrap_or_default()
                } else {
                    self.modules[m].dir.join(&name)
                };
                let (file, items) = self.parse(&path)?;
                if known.is_some_and(|c| self.modules[c].file == file) {
                    // The same file declared again under another `cfg`.
                    return Ok(());
                }
                (file, dir, items)
            }
        };
        let child = match known {
            // An inline module declared again under another `cfg`.
            Some(c) if decl.content.is_some() && self.modules[c].file == file => c,
            _ => {
                let c = self.modules.len();
                let module = Module {
                    file,
                    parent: Some(m),
                    root: self.modules[m].root,
                    dir,
                    ..Module::default()
                };
                self.modules.push(module);
                self.modules[m].children.entry(name).or_insert(c);
                c
            }
        };
        let items = decl.content.as_ref().map_or(&loaded[..], |(_, i)| &i[..]);
        self.fill(child, items, decl.content.is_none())
    }

    /// The file of `mod name;` declared in module `m`: `name.rs` or
    /// `name/mod.rs` in the module's directory, or its `#[path]`.
    fn module_file(
        &self,
        m: usize,
        decl: &syn::ItemMod,
        name: &str,
        top: bool,
    ) -> Result<PathBuf, String> {
        let md = &self.modules[m];
        let declaring = self.dir.join("src").join(self.name(md.file));
        if let Some(path) = path_attr(decl) {
            let base = if top {
                self.files[md.file].parent().unwrap_or(&self.src)
            } else {
                &md.dir
            };
            let file = base.join(path);
            if file.is_file() {
                return Ok(file);
            }
            return Err(format!(
                "{}: `mod {name};` names #[path] {}, which is not a file; fix the attribute",
                declaring.display(),
                file.display()
            ));
        }
        let flat = md.dir.join(format!("{name}.rs"));
        let nested = md.dir.join(name).join("mod.rs");
        match (flat.is_file(), nested.is_file()) {
            (true, false) => Ok(flat),
            (false, true) => Ok(nested),
            (true, true) => Err(format!(
                "{}: `mod {name};` has two files, {} and {}; remove one",
                declaring.display(),
                flat.display(),
                nested.display()
            )),
            (false, false) => Err(format!(
                "{}: `mod {name};` has no file ({} or {}); create it or remove the declaration",
                declaring.display(),
                flat.display(),
                nested.display()
            )),
        }
    }

    /// What `path`, written in module `m`, names.
    fn resolve(&self, m: usize, path: &[String], hops: usize) -> Target {
        if hops > MAX_HOPS {
            return Target::Outside;
        }
        let Some(first) = path.first() else {
            return Target::Module(m);
        };
        let (mut at, rest, mut in_scope) = match first.as_str() {
            "crate" => (self.modules[m].root, &path[1..], false),
            "self" | "super" => (m, path, false),
            "Self" => return Target::Outside,
            _ => (m, path, true),
        };
        for seg in rest {
            match seg.as_str() {
                "self" => continue,
                "super" => match self.modules[at].parent {
                    Some(p) => {
                        at = p;
                        continue;
                    }
                    None => return Target::Outside,
                },
                _ => {}
            }
            match self.lookup(at, seg, hops) {
                Some(Target::Module(c)) => at = c,
                Some(target) => return target,
                // A name not of the crate: the preludes, a local variable.
                None if in_scope => return Target::Outside,
                // `crate::m::Item` where `m` defines `Item` in a way this
                // reading does not see (a macro's output, say).
                None => return Target::Item(self.modules[at].file, seg.clone()),
            }
            in_scope = false;
        }
        Target::Module(at)
    }

    /// What `name` names in module `m`: a child module, an item, an import
    /// followed to its target, or a name of a glob-imported module; none
    /// when the module has no such name.
    fn lookup(&self, m: usize, name: &str, hops: usize) -> Option<Target> {
        if hops > MAX_HOPS {
            return Some(Target::Outside);
        }
        let md = &self.modules[m];
        if let Some(&c) = md.children.get(name) {
            return Some(Target::Module(c));
        }
        if md.items.contains(name) {
            return Some(Target::Item(md.file, name.to_string()));
        }
        if let Some(path) = md.bindings.get(name) {
            // `use log;`, `extern crate foo;`: the path starts outside.
            if path.first().is_some_and(|f| f == name) {
                return Some(Target::Outside);
            }
            return Some(self.resolve(m, path, hops + 1));
        }
        if md.parent.is_none()
            && let Some(&file) = self.macro_exports.get(name)
        {
            return Some(Target::Item(file, name.to_string()));
        }
        for glob in &md.globs {
            if let Target::Module(g) = self.resolve(m, glob, hops + 1)
                && g != m
                && let Some(target) = self.lookup(g, name, hops + 1)
            {
                return Some(target);
            }
        }
        None
    }

    /// The file graph: every `use` and path resolved, edges between files.
    fn graph(&self) -> Graph {
        let mut edges: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
        for (m, md) in self.modules.iter().enumerate() {
            let from = md.file;
            let mut add = |target: Target| {
                if let Target::Item(to, name) = target
                    && to != from
                {
                    edges.entry((from, to)).or_default().insert(name);
                }
            };
            for leaf in md.uses.iter().filter(|l| !l.reexport) {
                match self.resolve(m, &leaf.path, 0) {
                    Target::Module(g) if leaf.glob => {
                        // Names used through the glob resolve as refs below;
                        // a glob none of whose names appear (trait methods)
                        // still depends on the module.
                        let used = md
                            .refs
                            .iter()
                            .any(|r| r.first().is_some_and(|n| self.lookup(g, n, 0).is_some()));
                        if !used {
                            add(Target::Item(self.modules[g].file, "*".to_string()));
                        }
                    }
                    target => add(target),
                }
            }
            for path in &md.refs {
                add(self.resolve(m, path, 0));
            }
        }
        let files = (0..self.files.len()).map(|f| self.name(f)).collect();
        Graph { files, edges }
    }
}

/// Files and the names each file uses of another.
struct Graph {
    /// File names relative to `src/`; a name's index is its node.
    files: Vec<String>,
    /// (from, to) to the names of `to` that `from` uses.
    edges: BTreeMap<(usize, usize), BTreeSet<String>>,
}

impl Graph {
    /// Strongly connected components (Tarjan's, iterative), each sorted by
    /// file name, in the order Tarjan's finds them: a component after every
    /// component it uses, so bottom first.
    fn components(&self) -> Vec<Vec<usize>> {
        let n = self.files.len();
        let mut adj = vec![Vec::new(); n];
        for &(from, to) in self.edges.keys() {
            adj[from].push(to);
        }
        let unseen = usize::MAX;
        let mut index = vec![unseen; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut found = Vec::new();
        let mut next = 0;
        for start in 0..n {
            if index[start] != unseen {
                continue;
            }
            index[start] = next;
            low[start] = next;
            next += 1;
            stack.push(start);
            on_stack[start] = true;
            let mut calls = vec![(start, 0)];
            while let Some(top) = calls.last_mut() {
                let v = top.0;
                if let Some(&w) = adj[v].get(top.1) {
                    top.1 += 1;
                    if index[w] == unseen {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        calls.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                calls.pop();
                if let Some(&(u, _)) = calls.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    component.sort_by(|a, b| self.files[*a].cmp(&self.files[*b]));
                    found.push(component);
                }
            }
        }
        found
    }

    /// Every component with its level, sorted by level then first file
    /// name: a topological order of the components, bottom first.
    fn levelled(&self) -> Vec<(usize, Vec<usize>)> {
        let components = self.components();
        let mut of = vec![0; self.files.len()];
        for (c, files) in components.iter().enumerate() {
            for &f in files {
                of[f] = c;
            }
        }
        let mut level = vec![0; components.len()];
        for (c, files) in components.iter().enumerate() {
            // Components come after every component they use.
            let below = self
                .edges
                .keys()
                .filter(|(from, to)| files.contains(from) && of[*to] != c)
                .map(|&(_, to)| level[of[to]] + 1)
                .max();
            level[c] = below.unwrap_or(0);
        }
        let mut out: Vec<(usize, Vec<usize>)> = components
            .into_iter()
            .enumerate()
            .map(|(c, files)| (level[c], files))
            .collect();
        out.sort_by(|a, b| (a.0, &self.files[a.1[0]]).cmp(&(b.0, &self.files[b.1[0]])));
        out
    }

    /// The components as file names, bottom first.
    fn layers(&self) -> Vec<Component> {
        self.levelled()
            .into_iter()
            .map(|(level, files)| Component {
                level,
                files: files.iter().map(|&f| self.files[f].clone()).collect(),
            })
            .collect()
    }

    /// The components of more than one file, bottom first, with their
    /// edges.
    fn circles(&self) -> Vec<Circle> {
        self.levelled()
            .into_iter()
            .filter(|(_, files)| files.len() > 1)
            .map(|(_, files)| {
                let mut edges: Vec<Edge> = self
                    .edges
                    .iter()
                    .filter(|((from, to), _)| files.contains(from) && files.contains(to))
                    .filter_map(|(&(from, to), names)| {
                        Some(Edge {
                            from: self.files[from].clone(),
                            to: self.files[to].clone(),
                            example: names.first()?.clone(),
                            names: names.len(),
                        })
                    })
                    .collect();
                edges.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
                Circle {
                    files: files.iter().map(|&f| self.files[f].clone()).collect(),
                    edges,
                }
            })
            .collect()
    }
}

/// Collects the paths a module's code names and the `use` leaves of fn
/// bodies and other blocks.
#[derive(Default)]
struct Refs {
    /// Paths, as written, `::`-rooted ones aside.
    paths: BTreeSet<Vec<String>>,
    /// `use` leaves, braces expanded.
    uses: Vec<UseLeaf>,
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.paths.insert(
                path.segments
                    .iter()
                    .map(|s| s.ident.unraw().to_string())
                    .collect(),
            );
        }
        visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() {
            use_leaves(&item.tree, &mut Vec::new(), false, &mut self.uses);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        let buffer = TokenBuffer::new2(mac.tokens.clone());
        macro_paths(buffer.begin(), &mut self.paths);
    }
}

/// The paths in a macro's tokens, which syn leaves unparsed: runs of
/// names joined by `::` (`$crate` read as `crate`), lone names included.
fn macro_paths(mut cursor: Cursor<'_>, out: &mut BTreeSet<Vec<String>>) {
    let mut path: Vec<String> = Vec::new();
    let mut joined = false;
    while !cursor.eof() {
        if let Some((inner, _, _, next)) = cursor.any_group() {
            flush(&mut path, out);
            macro_paths(inner, out);
            cursor = next;
        } else if let Some((ident, next)) = cursor.ident() {
            if !joined {
                flush(&mut path, out);
            }
            path.push(ident.unraw().to_string());
            joined = false;
            cursor = next;
        } else if let Some((punct, next)) = cursor.punct() {
            let colons =
                punct.as_char() == ':' && next.punct().is_some_and(|(p, _)| p.as_char() == ':');
            let dollar_crate =
                punct.as_char() == '$' && next.ident().is_some_and(|(i, _)| i == "crate");
            if colons && !path.is_empty() && !joined {
                joined = true;
                cursor = next.punct().map_or(next, |(_, after)| after);
            } else if dollar_crate {
                flush(&mut path, out);
                joined = true;
                cursor = next;
            } else {
                flush(&mut path, out);
                joined = false;
                cursor = next;
            }
        } else if let Some((_, next)) = cursor.token_tree() {
            flush(&mut path, out);
            joined = false;
            cursor = next;
        } else {
            break;
        }
    }
    flush(&mut path, out);
}

/// Moves a finished path into `out`.
fn flush(path: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
    if !path.is_empty() {
        out.insert(std::mem::take(path));
    }
}

/// Expands a `use` tree under `prefix` into its leaves.
fn use_leaves(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    reexport: bool,
    out: &mut Vec<UseLeaf>,
) {
    let leaf = |path: Vec<String>, name: Option<String>, glob: bool| UseLeaf {
        path,
        name,
        glob,
        reexport,
    };
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.unraw().to_string());
            use_leaves(&p.tree, prefix, reexport, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push(leaf(prefix.clone(), prefix.last().cloned(), false));
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.unraw().to_string();
            let mut path = prefix.clone();
            path.push(name.clone());
            out.push(leaf(path, Some(name), false));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.unraw().to_string());
            }
            let name = Some(r.rename.unraw().to_string()).filter(|n| n != "_");
            out.push(leaf(path, name, false));
        }
        syn::UseTree::Glob(_) => out.push(leaf(prefix.clone(), None, true)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix, reexport, out);
            }
        }
    }
}

/// The names an item defines (a `macro_rules!` its macro's, a foreign
/// block its functions' and statics'); modules and imports aside.
fn item_names(item: &syn::Item) -> Vec<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(syn::ItemMacro {
            ident: Some(ident), ..
        }) => ident,
        syn::Item::ForeignMod(f) => {
            return f
                .items
                .iter()
                .filter_map(|i| match i {
                    syn::ForeignItem::Fn(f) => Some(f.sig.ident.unraw().to_string()),
                    syn::ForeignItem::Static(s) => Some(s.ident.unraw().to_string()),
                    syn::ForeignItem::Type(t) => Some(t.ident.unraw().to_string()),
                    _ => None,
                })
                .collect();
        }
        _ => return Vec::new(),
    };
    vec![ident.unraw().to_string()]
}

/// The file a `#[path = "..."]` attribute names.
fn path_attr(decl: &syn::ItemMod) -> Option<String> {
    decl.attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate written under the system's temporary directory, removed
    /// when dropped.
    struct TempCrate(PathBuf);

    impl TempCrate {
        /// Writes `files` (paths relative to `src/`, and their text) to a
        /// directory named after `name` and this process.
        fn new(name: &str, files: &[(&str, &str)]) -> Self {
            let dir =
                std::env::temp_dir().join(format!("xtask-circles-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for (path, text) in files {
                let path = dir.join("src").join(path);
                let parent = path.parent().expect("a file has a directory");
                std::fs::create_dir_all(parent).expect("temporary directory");
                std::fs::write(&path, text).expect("temporary file");
            }
            Self(dir)
        }

        /// The crate's circles.
        fn circles(&self) -> Vec<Circle> {
            circles(&self.0).expect("the crate parses")
        }

        /// Every edge of the crate as (from, to, names).
        fn edges(&self) -> Vec<(String, String, Vec<String>)> {
            let graph = Crate::load(&self.0).expect("the crate parses").graph();
            graph
                .edges
                .iter()
                .map(|(&(from, to), names)| {
                    let names = names.iter().cloned().collect();
                    (graph.files[from].clone(), graph.files[to].clone(), names)
                })
                .collect()
        }
    }

    impl Drop for TempCrate {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A crate whose `lib.rs` declares `a` and `b`, with their texts.
    fn a_and_b(name: &str, a: &str, b: &str) -> TempCrate {
        TempCrate::new(
            name,
            &[("lib.rs", "mod a;\nmod b;\n"), ("a.rs", a), ("b.rs", b)],
        )
    }

    /// An edge as the tests write it.
    fn edge(from: &str, to: &str, example: &str, names: usize) -> Edge {
        Edge {
            from: from.into(),
            to: to.into(),
            example: example.into(),
            names,
        }
    }

    /// Owned strings from literals.
    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_two_file_circle_through_use_crate_is_found_with_its_names() {
        let k = a_and_b(
            "use-crate",
            "use crate::b::B;\npub struct A;\npub fn f(_: B) {}\n",
            "use crate::a::{A, f};\npub struct B;\npub fn g() { f(B) }\n",
        );
        let found = k.circles();
        assert_eq!(
            found,
            vec![Circle {
                files: strings(&["a.rs", "b.rs"]),
                edges: vec![edge("a.rs", "b.rs", "B", 1), edge("b.rs", "a.rs", "A", 2)],
            }]
        );
        assert_eq!(
            format_circle(&found[0]),
            "a.rs, b.rs (2 files)\n    a.rs -> b.rs: B\n    b.rs -> a.rs: A (+1 more)\n"
        );
    }

    #[test]
    fn a_circle_through_an_inline_path_in_an_expression_is_found() {
        let k = a_and_b(
            "inline-path",
            "pub const X: u32 = 1;\npub fn f() -> u32 { crate::b::g() }\n",
            "pub fn g() -> u32 { crate::a::X + 1 }\n",
        );
        assert_eq!(
            k.circles()[0].edges,
            vec![edge("a.rs", "b.rs", "g", 1), edge("b.rs", "a.rs", "X", 1)]
        );
    }

    #[test]
    fn paths_in_macro_bodies_count() {
        let k = a_and_b(
            "macro-body",
            "pub const X: u32 = 1;\npub fn f() { assert!(crate::b::ok()); }\n",
            "pub fn ok() -> bool { matches!(super::a::X, 1) }\n\
             macro_rules! m { () => { $crate::a::f() }; }\n",
        );
        assert_eq!(
            k.circles()[0].edges,
            vec![edge("a.rs", "b.rs", "ok", 1), edge("b.rs", "a.rs", "X", 2)]
        );
    }

    #[test]
    fn a_reexport_in_lib_rs_resolves_to_the_defining_file() {
        let k = TempCrate::new(
            "reexport",
            &[
                ("lib.rs", "mod a;\nmod b;\npub use a::X;\n"),
                ("a.rs", "pub struct X;\npub fn f() { crate::b::g() }\n"),
                ("b.rs", "use crate::X;\npub fn g() { let _ = X; }\n"),
            ],
        );
        assert_eq!(
            k.edges(),
            vec![
                ("a.rs".into(), "b.rs".into(), strings(&["g"])),
                ("b.rs".into(), "a.rs".into(), strings(&["X"])),
            ]
        );
        assert_eq!(k.circles()[0].files, strings(&["a.rs", "b.rs"]));
    }

    #[test]
    fn a_mod_rs_declaring_and_reexporting_its_children_is_not_in_a_circle() {
        let k = TempCrate::new(
            "mod-rs",
            &[
                ("lib.rs", "mod m;\npub use m::{X, Y};\n"),
                (
                    "m/mod.rs",
                    "mod x;\nmod y;\npub use x::X;\npub(crate) use self::y::*;\n",
                ),
                ("m/x.rs", "pub struct X;\n"),
                ("m/y.rs", "use super::X;\npub struct Y(pub X);\n"),
            ],
        );
        assert!(k.circles().is_empty());
        assert_eq!(
            k.edges(),
            vec![("m/y.rs".into(), "m/x.rs".into(), strings(&["X"]))]
        );
    }

    #[test]
    fn a_child_using_its_parents_item_is_not_a_circle_until_the_parent_uses_the_child() {
        let files = |parent: &'static str| {
            [
                ("lib.rs", "mod m;\n"),
                ("m/mod.rs", parent),
                ("m/c.rs", "use super::LIMIT;\npub struct C([u8; LIMIT]);\n"),
            ]
        };
        let declares = TempCrate::new(
            "parent-declares",
            &files("mod c;\npub use c::C;\npub const LIMIT: usize = 3;\n"),
        );
        assert!(declares.circles().is_empty());
        assert_eq!(
            declares.edges(),
            vec![("m/c.rs".into(), "m/mod.rs".into(), strings(&["LIMIT"]))]
        );
        let uses = TempCrate::new(
            "parent-uses",
            &files("mod c;\npub use c::C;\npub const LIMIT: usize = 3;\npub fn f(_: C) {}\n"),
        );
        assert_eq!(
            uses.circles()[0].edges,
            vec![
                edge("m/c.rs", "m/mod.rs", "LIMIT", 1),
                edge("m/mod.rs", "m/c.rs", "C", 1)
            ]
        );
    }

    #[test]
    fn a_nested_use_tree_is_expanded() {
        let k = TempCrate::new(
            "nested-use",
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
                (
                    "a.rs",
                    "use crate::{b::{X, Y as Z}, c::*};\npub fn g() { let _ = (X, Z, W); }\n",
                ),
                (
                    "b.rs",
                    "pub struct X;\npub struct Y;\npub fn f() { crate::a::g() }\n",
                ),
                ("c.rs", "pub struct W;\npub fn h() { crate::a::g() }\n"),
            ],
        );
        assert_eq!(
            k.circles(),
            vec![Circle {
                files: strings(&["a.rs", "b.rs", "c.rs"]),
                edges: vec![
                    edge("a.rs", "b.rs", "X", 2),
                    edge("a.rs", "c.rs", "W", 1),
                    edge("b.rs", "a.rs", "g", 1),
                    edge("c.rs", "a.rs", "g", 1),
                ],
            }]
        );
    }

    #[test]
    fn a_glob_import_of_trait_methods_still_depends_on_its_module() {
        let k = TempCrate::new(
            "glob-trait",
            &[
                ("lib.rs", "mod a;\nmod ext;\n"),
                (
                    "a.rs",
                    "use crate::ext::*;\npub fn f() -> u32 { 1u32.twice() }\n",
                ),
                (
                    "ext.rs",
                    "pub trait Twice { fn twice(self) -> u32; }\n\
                     impl Twice for u32 { fn twice(self) -> u32 { self * 2 } }\n",
                ),
            ],
        );
        assert_eq!(
            k.edges(),
            vec![("a.rs".into(), "ext.rs".into(), strings(&["*"]))]
        );
    }

    #[test]
    fn a_non_mod_rs_file_declares_its_children_in_its_own_directory() {
        let k = TempCrate::new(
            "non-mod-rs",
            &[
                ("lib.rs", "mod t;\n"),
                (
                    "t.rs",
                    "mod tcp;\npub struct Op;\npub fn g() { tcp::f(Op) }\n",
                ),
                ("t/tcp.rs", "use super::Op;\npub fn f(_: Op) {}\n"),
            ],
        );
        assert_eq!(k.circles()[0].files, strings(&["t.rs", "t/tcp.rs"]));
    }

    #[test]
    fn layers_list_every_file_bottom_first() {
        let k = TempCrate::new(
            "layers",
            &[
                ("main.rs", "mod a;\nmod b;\nmod c;\nfn main() { a::f() }\n"),
                ("a.rs", "pub fn f() { crate::b::g() }\n"),
                ("b.rs", "pub fn g() { crate::c::h() }\n"),
                ("c.rs", "pub fn h() {}\n"),
            ],
        );
        let layers = layers(&k.0).expect("the crate parses");
        let line = |level, file: &str| Component {
            level,
            files: strings(&[file]),
        };
        assert_eq!(
            layers,
            vec![
                line(0, "c.rs"),
                line(1, "b.rs"),
                line(2, "a.rs"),
                line(3, "main.rs")
            ]
        );
    }

    #[test]
    fn a_file_that_does_not_parse_is_named() {
        let k = TempCrate::new(
            "no-parse",
            &[
                ("lib.rs", "mod a;\nmod b;\n"),
                ("a.rs", ""),
                ("b.rs", "fn broken( {\n"),
            ],
        );
        let err = circles(&k.0).expect_err("b.rs does not parse");
        let b = k.0.join("src").join("b.rs");
        assert!(
            err.starts_with(&format!("{} does not parse: ", b.display())),
            "{err}"
        );
    }

    #[test]
    fn a_module_without_a_file_is_named_with_where_it_was_looked_for() {
        let k = TempCrate::new("no-file", &[("lib.rs", "mod gone;\n")]);
        let err = circles(&k.0).expect_err("gone.rs is missing");
        assert!(err.contains("`mod gone;` has no file"), "{err}");
        assert!(err.contains("gone.rs"), "{err}");
    }
}
