//! The house rules that keep the source easy to find one's way in, checked on the
//! workspace's own files (no process started):
//!
//! * no module cycle in any crate: counting every `crate::…`, `super::…` and `self::…`
//!   path, and every path through a child module (`child::Item`), in `use` declarations,
//!   code and macro bodies, no file reaches a file that reaches it back. Test code
//!   (items under `#[cfg(test)]`) is left out: a test reaches whatever it checks;
//! * no source file over [`LINES_BEFORE_TESTS_MAX`] lines before its `#[cfg(test)]`
//!   module (test files — `tests.rs`, `*_tests.rs`, `test_support.rs` — are not
//!   counted): a file that grows past it is split by role;
//! * every "docs/design.md §N" citation in the code names a section of `docs/design.md`.
//!
//! The sources are parsed with `syn`; a path resolves to the deepest module it names,
//! and that module's file is the edge's end (an item re-exported by `lib.rs` and named
//! as `crate::Item` is an edge to `lib.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The workspace's root directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// The crates' root files: every member's `src/lib.rs` and `src/main.rs`.
fn crate_roots() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find(|line| line.trim_start().starts_with("members"))
        .expect("a members line");
    let mut roots = Vec::new();
    for member in members.split('"').skip(1).step_by(2) {
        for root in ["src/lib.rs", "src/main.rs"] {
            let path = workspace().join(member).join(root);
            if path.exists() {
                roots.push(path);
            }
        }
    }
    assert!(roots.len() >= 10, "found only {roots:?}");
    roots
}

/// One crate's modules: which file holds each module path (inline modules map to the
/// file they are written in).
#[derive(Default)]
struct ModuleTree {
    file_of: BTreeMap<Vec<String>, PathBuf>,
    /// Each file's module path and parsed syntax.
    files: Vec<(Vec<String>, PathBuf, syn::File)>,
}

impl ModuleTree {
    fn load(root: &Path) -> ModuleTree {
        let mut tree = ModuleTree::default();
        tree.add_file(Vec::new(), root.to_path_buf(), true);
        tree
    }

    /// Adds the file of module `path`, and the modules it declares. `owns_dir`: its
    /// children live beside it (`lib.rs`, `main.rs`, `mod.rs`), not in a folder named
    /// after it.
    fn add_file(&mut self, path: Vec<String>, file: PathBuf, owns_dir: bool) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let syntax = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("cannot parse {}: {e}", file.display()));
        let dir = if owns_dir {
            file.parent().expect("a folder").to_path_buf()
        } else {
            file.with_extension("")
        };
        self.file_of.insert(path.clone(), file.clone());
        let mut children = Vec::new();
        self.collect_mods(&syntax.items, &path, &file, &mut children);
        self.files.push((path, file, syntax));
        for child in children {
            let name = child.last().expect("a name").clone();
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            if flat.exists() {
                self.add_file(child, flat, false);
            } else if nested.exists() {
                self.add_file(child, nested, true);
            } else {
                panic!(
                    "module {child:?} declared but no {} or {}",
                    flat.display(),
                    nested.display()
                );
            }
        }
    }

    /// Records the inline modules among `items` (under module `path`, in `file`) and
    /// pushes the paths of the modules declared there with a file of their own.
    fn collect_mods(
        &mut self,
        items: &[syn::Item],
        path: &[String],
        file: &Path,
        out_of_line: &mut Vec<Vec<String>>,
    ) {
        for item in items {
            let syn::Item::Mod(module) = item else {
                continue;
            };
            let mut child = path.to_vec();
            child.push(module.ident.to_string());
            match &module.content {
                Some((_, items)) => {
                    self.file_of.insert(child.clone(), file.to_path_buf());
                    self.collect_mods(items, &child, file, out_of_line);
                }
                None if path_attr(&module.attrs) => {
                    panic!("{}: #[path] modules are not followed", file.display())
                }
                None => out_of_line.push(child),
            }
        }
    }

    /// The deepest module that `segments`, written in module `current`, names; `None`
    /// for paths outside the crate (other crates, std, items in scope).
    fn resolve(&self, current: &[String], segments: &[String]) -> Option<Vec<String>> {
        let (mut base, rest) = match segments.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &segments[1..]),
            Some("super") => {
                let mut base = current.to_vec();
                let mut at = 0;
                while segments.get(at).map(String::as_str) == Some("super") {
                    base.pop()?;
                    at += 1;
                }
                (base, &segments[at..])
            }
            Some("self") => (current.to_vec(), &segments[1..]),
            Some(first) => {
                let mut child = current.to_vec();
                child.push(first.to_string());
                if !self.file_of.contains_key(&child) {
                    return None;
                }
                (current.to_vec(), segments)
            }
            None => return None,
        };
        for segment in rest {
            base.push(segment.clone());
            if !self.file_of.contains_key(&base) {
                base.pop();
                break;
            }
        }
        Some(base)
    }
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// The attributes of `item`, where it has any.
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(item) => &item.attrs,
        syn::Item::Enum(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Macro(item) => &item.attrs,
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Static(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Trait(item) => &item.attrs,
        syn::Item::Type(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

fn path_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| attr.path().is_ident("path"))
}

/// Every path a file writes, with the module it is written in.
struct Paths {
    module: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>)>,
}

impl Paths {
    fn push(&mut self, segments: Vec<String>) {
        self.found.push((self.module.clone(), segments));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                full.push(name.ident.to_string());
                self.push(full);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                full.push(rename.ident.to_string());
                self.push(full);
            }
            syn::UseTree::Glob(_) => self.push(prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside a macro's tokens: `crate::a::b`, `$crate::a`, `super::…`, `self::…`.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        let mut at = 0;
        while at < tokens.len() {
            match &tokens[at] {
                proc_macro2::TokenTree::Group(group) => self.tokens(group.stream()),
                proc_macro2::TokenTree::Ident(ident)
                    if ["crate", "super", "self"].contains(&ident.to_string().as_str())
                        && !preceded_by_colons(&tokens, at) =>
                {
                    let mut segments = vec![ident.to_string()];
                    let mut next = at + 1;
                    while let (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                        Some(proc_macro2::TokenTree::Ident(name)),
                    ) = (tokens.get(next), tokens.get(next + 1), tokens.get(next + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(name.to_string());
                        next += 3;
                    }
                    if segments.len() > 1 {
                        self.push(segments);
                    }
                    at = next;
                    continue;
                }
                _ => {}
            }
            at += 1;
        }
    }
}

/// Whether the token at `at` follows `::` (the `crate` of `$crate` does not: `$` is
/// no colon).
fn preceded_by_colons(tokens: &[proc_macro2::TokenTree], at: usize) -> bool {
    at >= 1 && matches!(&tokens[at - 1], proc_macro2::TokenTree::Punct(p) if p.as_char() == ':')
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !cfg_test(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !cfg_test(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        self.module.push(module.ident.to_string());
        syn::visit::visit_item_mod(self, module);
        self.module.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        // One segment in code names a value or a type in scope, never a module.
        if path.segments.len() > 1 {
            self.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// Every edge between two files of the crate at `root`: (from, to) → an example path.
fn edges(root: &Path) -> BTreeMap<(PathBuf, PathBuf), String> {
    let tree = ModuleTree::load(root);
    let mut edges = BTreeMap::new();
    for (module, file, syntax) in &tree.files {
        let mut paths = Paths {
            module: module.clone(),
            found: Vec::new(),
        };
        paths.visit_file(syntax);
        for (written_in, segments) in paths.found {
            let Some(target) = tree.resolve(&written_in, &segments) else {
                continue;
            };
            let to = &tree.file_of[&target];
            if to != file {
                edges
                    .entry((file.clone(), to.clone()))
                    .or_insert_with(|| segments.join("::"));
            }
        }
    }
    edges
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<(PathBuf, PathBuf), String>) -> Vec<Vec<PathBuf>> {
    struct Search<'a> {
        next: BTreeMap<&'a PathBuf, Vec<&'a PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a PathBuf) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.next.get(node).cloned().unwrap_or_default() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.clone());
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for (from, to) in edges.keys() {
        search.next.entry(from).or_default().push(to);
    }
    let nodes: Vec<&PathBuf> = search.next.keys().copied().collect();
    for node in nodes {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut report = Vec::new();
    for root in crate_roots() {
        let edges = edges(&root);
        for cycle in cycles(&edges) {
            report.push(format!("cycle in {}:", relative(&root)));
            for ((from, to), example) in &edges {
                if cycle.contains(from) && cycle.contains(to) {
                    report.push(format!(
                        "  {} -> {} ({example})",
                        relative(from),
                        relative(to)
                    ));
                }
            }
        }
    }
    assert!(
        report.is_empty(),
        "module cycles (a file that reaches a file that reaches it back):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_cycle_check_sees_paths_in_uses_code_and_macros() {
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("a folder");
        std::fs::write(path, text).expect("a file");
    };
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\npub use a::Thing;\npub struct Root;\n",
    );
    write(
        "a.rs",
        "pub struct Thing;\nfn f() { let _ = crate::b::g(); }\n",
    );
    write(
        "b.rs",
        "pub fn g() -> super::Root { m!() }\nmacro_rules! m { () => { $crate::Root }; }\n",
    );
    write(
        "c.rs",
        "#[cfg(test)]\nmod tests {\n    use super::*;\n    fn h() { crate::a::f(); }\n}\npub fn k() {}\n",
    );
    let edges = edges(&dir.path().join("lib.rs"));
    let has =
        |from: &str, to: &str| edges.contains_key(&(dir.path().join(from), dir.path().join(to)));
    assert!(has("lib.rs", "a.rs"), "a re-export: {edges:?}");
    assert!(has("a.rs", "b.rs"), "a path in code");
    assert!(
        has("b.rs", "lib.rs"),
        "super:: and $crate:: in a macro body"
    );
    assert!(
        !edges
            .keys()
            .any(|(from, _)| from == &dir.path().join("c.rs")),
        "within one file"
    );
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3, "lib -> a -> b -> lib: {found:?}");
}

/// Most lines a source file may have before its `#[cfg(test)]` module.
const LINES_BEFORE_TESTS_MAX: usize = 1_200;

/// Every `.rs` file under the crates' `src/` folders that is not a test file.
fn source_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for root in crate_roots() {
        files.extend(walk_rs(root.parent().expect("src/")));
    }
    files.sort();
    files.dedup();
    files.retain(|file| {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        !(name == "tests.rs" || name.ends_with("_tests.rs") || name == "test_support.rs")
    });
    files
}

/// Lines of `text` before its test module (`#[cfg(test)]` followed by `mod`).
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .find(|(at, line)| {
            line.trim() == "#[cfg(test)]"
                && lines[at + 1..]
                    .iter()
                    .find(|next| {
                        let next = next.trim_start();
                        !(next.starts_with("#[") || next.starts_with("//"))
                    })
                    .is_some_and(|next| next.trim_start().starts_with("mod "))
        })
        .map_or(lines.len(), |(at, _)| at)
}

#[test]
fn no_source_file_is_over_the_limit_before_its_tests() {
    let mut over = Vec::new();
    for file in source_files() {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let lines = lines_before_tests(&text);
        if lines > LINES_BEFORE_TESTS_MAX {
            over.push(format!(
                "{}: {lines} lines before its tests",
                relative(&file)
            ));
        }
    }
    assert!(
        over.is_empty(),
        "over {LINES_BEFORE_TESTS_MAX} lines: split these by role:\n{}",
        over.join("\n")
    );
}

/// Whether the code of `text` (comments aside: the rule's own argument names it) asks
/// for a port shared between listeners.
fn shares_ports(text: &str) -> bool {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .any(|line| line.to_lowercase().contains("reuseport"))
}

/// A refused connection, or another server at a crashed server's address, is proof
/// that it no longer listens only if a port has one listener: no listener may share
/// its port (`SO_REUSEPORT`; `coordinator::proof_of_death`, rule 3).
#[test]
fn no_listener_shares_its_port() {
    let sharing: Vec<String> = source_files()
        .into_iter()
        .filter(|file| shares_ports(&std::fs::read_to_string(file).expect("a source file")))
        .map(|file| relative(&file))
        .collect();
    assert!(
        sharing.is_empty(),
        "SO_REUSEPORT would make a refusal no proof of death: {sharing:?}"
    );
    assert!(shares_ports("socket.set_reuseport(true)?;"));
    assert!(shares_ports("fn f() {\n    libc::SO_REUSEPORT\n}"));
    assert!(!shares_ports("socket.set_reuseaddr(true)?;"));
    assert!(!shares_ports(
        "//! 3. No `SO_REUSEPORT`: a port has one listener."
    ));
}

#[test]
fn lines_before_tests_stop_at_the_test_module_only() {
    let text =
        "fn a() {}\n#[cfg(test)]\nfn helper() {}\n\n#[cfg(test)]\n// why\n#[allow(x)]\nmod tests {\n}\n";
    assert_eq!(lines_before_tests(text), 4);
    assert_eq!(lines_before_tests("fn a() {}\nfn b() {}\n"), 2);
}

/// Every "design.md §N" citation (any case; "DESIGN.md" means docs/design.md), with an
/// optional quoted section name after it, in `text`: (N, name).
fn citations(text: &str) -> Vec<(String, Option<String>)> {
    // Comment markers dropped and lines joined, so that a citation wrapped over two
    // comment lines is one.
    let joined: String = text
        .lines()
        .map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix("//!")
                .or_else(|| line.strip_prefix("///"))
                .or_else(|| line.strip_prefix("//"))
                .unwrap_or(line);
            format!("{} ", line.trim())
        })
        .collect();
    let lower = joined.to_lowercase();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("design.md") {
        let after = &joined[from + at + "design.md".len()..];
        from += at + "design.md".len();
        let Some(rest) = after.trim_start().strip_prefix('§') else {
            continue;
        };
        let number: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if number.is_empty() {
            continue;
        }
        let rest = rest[number.len()..].trim_start_matches([',', ' ']);
        let name = rest
            .strip_prefix('"')
            .and_then(|quoted| quoted.split_once('"'))
            .map(|(name, _)| name.to_string());
        found.push((number, name));
    }
    found
}

#[test]
fn every_design_citation_names_a_section_of_the_design() {
    let design = std::fs::read_to_string(workspace().join("docs/design.md"))
        .expect("docs/design.md, the design of record");
    let headings: Vec<&str> = design
        .lines()
        .filter(|line| line.starts_with('#'))
        .map(|line| line.trim_start_matches('#').trim())
        .collect();
    let mut unresolved = Vec::new();
    let mut count = 0;
    for file in source_files().into_iter().chain(test_files()) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (number, name) in citations(&text) {
            count += 1;
            let section = format!("{number}. ");
            if !headings.iter().any(|h| h.starts_with(&section)) {
                unresolved.push(format!("{}: §{number}", relative(&file)));
            }
            if let Some(name) = name {
                if !headings.iter().any(|h| h.starts_with(name.as_str())) {
                    unresolved.push(format!("{}: §{number} \"{name}\"", relative(&file)));
                }
            }
        }
    }
    assert!(
        count > 50,
        "found only {count} citations: is the pattern right?"
    );
    assert!(
        unresolved.is_empty(),
        "citations that name no heading of docs/design.md:\n{}",
        unresolved.join("\n")
    );
}

/// The test files that [`source_files`] leaves out.
fn test_files() -> Vec<PathBuf> {
    let kept = source_files();
    let mut all = Vec::new();
    for root in crate_roots() {
        let files = walk_rs(root.parent().expect("src/"));
        all.extend(files.into_iter().filter(|file| !kept.contains(file)));
    }
    all.sort();
    all.dedup();
    all
}

fn walk_rs(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk_rs(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn citations_are_found_wrapped_and_with_their_section_names() {
    let text = "//! See docs/design.md §5 \"Backups\", \"Fencing\" and\n/// the rest (DESIGN.md\n/// §6, step 2); docs/design.md §10.\n";
    assert_eq!(
        citations(text),
        [
            ("5".to_string(), Some("Backups".to_string())),
            ("6".to_string(), None),
            ("10".to_string(), None),
        ]
    );
}
