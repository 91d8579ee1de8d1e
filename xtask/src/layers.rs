//! `layers`: the file-level import graph of each crate, its circles and its layer order.
//!
//! For every `.rs` file under a crate's `src/` the checker reads the paths that reach other
//! files of the same crate: `use` items (`use crate::..`, `use super::..`, `use self::..`,
//! `use child_module::..`, brace trees expanded) and paths in code (`crate::x::y`,
//! `super::z`, `child::w`). A path is resolved to the file that holds the item: through the
//! longest module prefix that has a file, then through the `use` items of that file
//! (re-exports such as `pub use error::Error` in `lib.rs` lead on to `error.rs`), so a facade
//! module is not mistaken for the file that defines the item.
//!
//! Not counted: comments and string literals; items under `#[cfg(test)]` (test modules may
//! reach anywhere) and the files of `#[cfg(test)] mod x;`; `mod x;` declarations; a `pub use`
//! whose name the file does not use itself (a pure re-export, part of the module's public face).
//!
//! The graph's strongly connected components of more than one file are the import circles.
//! A crate may also name its layers, top first (module path prefixes): no file of a layer may
//! import from a layer above it. [`RULES`] lists the crates: those in [`Mode::Fail`] fail the
//! check on any circle (but those listed as known) or layer breach; those in [`Mode::Report`]
//! are only reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::Error;

/// What a finding in a crate does to the check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Circles and layer breaches fail the check (the crate is clean and stays so).
    Fail,
    /// Circles and layer breaches are printed but do not fail the check (work in progress).
    Report,
}

/// One crate the check reads.
#[derive(Debug, Clone, Copy)]
pub struct CrateRule {
    /// The package name (for the report).
    pub name: &'static str,
    /// Its `src` directory, relative to the workspace root.
    pub src: &'static str,
    /// Whether findings fail the check.
    pub mode: Mode,
    /// The layers, top first: a name and the module path prefixes (`"cm"`, `"rdma_cm::id"`;
    /// `""` is the crate root file only) whose files belong to it. A file belongs to the
    /// topmost layer with a prefix of its module path, so a longer prefix listed above a
    /// shorter one carves an upper layer out of it (`"verbs::qp::send"` above `"verbs::qp"`
    /// above `"verbs"`). A prefix written `"=verbs"` takes the module's own file only (a
    /// `mod.rs` above its children). A file in no layer is not ordered. Empty: no order is
    /// checked.
    pub layers: &'static [(&'static str, &'static [&'static str])],
    /// Circles known and left for later (files relative to `src`): in a [`Mode::Fail`] crate,
    /// a circle within one of these is reported but does not fail the check; any other does.
    pub known_circles: &'static [&'static [&'static str]],
}

/// The crates of the workspace and how strictly each is held.
///
/// `softrdma` is split into rooms, `rdma_cm` above `verbs` above `provider`
/// (docs/ARCHITECTURE.md), and `verbs` into layers of its own: no import from a layer above,
/// and no circle but the known ones, each inside one room.
pub const RULES: &[CrateRule] = &[
    CrateRule {
        name: "softrdma-wire",
        src: "crates/wire/src",
        mode: Mode::Fail,
        layers: &[
            ("rdma_cm private data", &["cma"]),
            ("connection manager", &["cm"]),
            ("management datagrams", &["mad"]),
            ("captures", &["pcap"]),
            ("checksums", &["icrc"]),
            ("transport packets", &["roce"]),
            ("base transport header", &["bth"]),
            ("opcodes", &["opcode"]),
            (
                "headers",
                &[
                    "aeth",
                    "atomic_ack_eth",
                    "atomic_eth",
                    "deth",
                    "ieth",
                    "immdt",
                    "reth",
                    "ip",
                ],
            ),
            ("fields", &["field", "error", ""]),
        ],
        known_circles: &[],
    },
    CrateRule {
        name: "softrdma-proto",
        src: "crates/proto/src",
        mode: Mode::Fail,
        layers: &[
            ("device", &["device"]),
            ("connection manager", &["cm"]),
            ("transport", &["transport"]),
            ("basics", &["qp", "psn", "mtu", "timer", ""]),
        ],
        known_circles: &[],
    },
    CrateRule {
        name: "softrdma",
        src: "crates/softrdma/src",
        mode: Mode::Fail,
        layers: &[
            ("async face", &["tokio"]),
            // The rdma_cm room in its own order: the calls of an id over connect, over the
            // registry and the dispatch of the CM's events, over the objects (id, channel,
            // events), over what events say, addresses, options and QP moves.
            (
                "connection manager: calls",
                &[
                    "rdma_cm::ep",
                    "rdma_cm::helpers",
                    "rdma_cm::id",
                    "rdma_cm::multicast",
                    "rdma_cm::qp",
                    "rdma_cm::timeout",
                ],
            ),
            ("connection manager: connect", &["rdma_cm::connect"]),
            (
                "connection manager: registry, dispatch",
                &["rdma_cm::registry", "rdma_cm::dispatch"],
            ),
            ("connection manager: objects", &["rdma_cm::objects"]),
            (
                "connection manager: events, addresses, options",
                &[
                    "rdma_cm::event",
                    "rdma_cm::addrinfo",
                    "rdma_cm::qp_state",
                    "rdma_cm",
                ],
            ),
            // The verbs room in its own order: the QP verbs drive the data path, which
            // works on the QP object; under it the objects a QP holds, then memory, CQs,
            // PDs, contexts and the device state they all hold.
            (
                "verbs: QP verbs",
                &[
                    "verbs::qp::modify",
                    "verbs::qp::send",
                    "verbs::qp::recv",
                    "verbs::qp::mcast",
                ],
            ),
            ("verbs: data path", &["verbs::datapath"]),
            ("verbs: work-request records", &["verbs::records"]),
            ("verbs: the transport's view of memory", &["verbs::env"]),
            ("verbs: copy engines", &["verbs::copy"]),
            ("verbs: QP object", &["verbs::qp"]),
            ("verbs: shared receive queues", &["verbs::srq"]),
            ("verbs: work requests", &["verbs::requests"]),
            ("verbs: address handles", &["verbs::ah"]),
            ("verbs: memory windows", &["verbs::mw"]),
            ("verbs: memory regions", &["verbs::mr"]),
            ("verbs: work-request parts", &["verbs::wr"]),
            ("verbs: completion queues", &["verbs::cq"]),
            ("verbs: protection domains", &["verbs::pd"]),
            ("verbs: contexts", &["verbs::context"]),
            ("verbs: device state", &["verbs::resources"]),
            ("verbs: devices, events", &["verbs::device", "verbs::event"]),
            ("verbs: basics", &["verbs::hold", "verbs::mem", "verbs"]),
            // The provider room in its own order: the engines of the process over the
            // progress thread, over the engine that composes the parts the files below own
            // (QP 1, multicast, receive, transmit), over faults and counters, over the
            // sockets; mod.rs only declares and re-exports.
            ("provider: devices", &["provider::devices"]),
            ("provider: progress", &["provider::progress"]),
            ("provider: engine", &["provider::engine"]),
            (
                "provider: its face to the layers above",
                &["provider::port"],
            ),
            ("provider: QP 1", &["provider::gsi"]),
            ("provider: multicast", &["provider::mcast"]),
            ("provider: receive", &["provider::rx"]),
            ("provider: transmit", &["provider::tx"]),
            ("provider: same-host lanes", &["provider::lanes"]),
            (
                "provider: faults, counters",
                &["provider::faults", "provider::counters"],
            ),
            (
                "provider: sockets, sharing, capture",
                &[
                    "provider::sock",
                    "provider::fd",
                    "provider::share",
                    "provider::scm",
                    "provider::steer",
                    "provider::unix_names",
                    "provider::capture",
                ],
            ),
            ("provider", &["provider"]),
            ("base", &["error", "gid", "log", "testing", ""]),
        ],
        // No circle is left in any room (docs/ARCHITECTURE.md).
        known_circles: &[],
    },
    CrateRule {
        name: "softrdma-capi",
        src: "crates/capi/src",
        mode: Mode::Fail,
        // librdmacm's side over libibverbs' side (which reaches the CM only through the
        // hook it registers), each in its own order, over the C structs and the entry-point
        // guards. rdmacm's mod.rs (the ids, events, channels) sits under its QP calls;
        // verbs' mod.rs (ibv_open_device, the CM's helpers) tops its side.
        layers: &[
            ("librdmacm: QPs, SRQs, endpoints", &["rdmacm::qp"]),
            ("librdmacm: ids, events, channels", &["=rdmacm"]),
            ("librdmacm: getaddrinfo", &["rdmacm::addrinfo"]),
            ("librdmacm: verbs glue", &["rdmacm::glue"]),
            (
                "librdmacm: sockaddrs, rsocket",
                &["rdmacm::sa", "rdmacm::rsocket"],
            ),
            ("libibverbs: contexts' slots, the CM's helpers", &["=verbs"]),
            ("libibverbs: extended verbs", &["verbs::ex"]),
            ("libibverbs: data path", &["verbs::datapath"]),
            (
                "libibverbs: PDs, CQs, SRQs, MRs, MWs, AHs",
                &["verbs::resources"],
            ),
            ("libibverbs: QPs", &["verbs::qp"]),
            (
                "libibverbs: devices, contexts",
                &["verbs::device", "verbs::misc"],
            ),
            ("libibverbs: objects", &["verbs::objects"]),
            ("libibverbs: extended tails", &["verbs::tails"]),
            ("C structs", &["abi::ex"]),
            ("C structs: librdmacm", &["abi::rdmacm"]),
            ("C structs, guards", &["abi", "ffi", ""]),
        ],
        known_circles: &[],
    },
    CrateRule {
        name: "softrdma-cli",
        src: "crates/cli/src",
        mode: Mode::Fail,
        layers: &[],
        known_circles: &[],
    },
];

// ------------------------------------------------------------------------------------------
// Tokens
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Tok {
    kind: Kind,
    line: usize,
}

impl Tok {
    fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(s) => Some(s),
            _ => None,
        }
    }
    fn is(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }
    fn is_ident(&self, s: &str) -> bool {
        self.ident() == Some(s)
    }
}

/// Splits Rust source into identifiers, `::` and single punctuation, dropping comments,
/// string/char literals, lifetimes and numbers. Never fails (odd input gives odd tokens).
fn tokenize(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let n = b.len();
    // Skips a quoted string starting at the opening quote `b[i]`; handles escapes.
    fn skip_str(b: &[char], mut i: usize, line: &mut usize) -> usize {
        i += 1;
        while i < b.len() {
            match b[i] {
                '\\' => i += 2,
                '"' => return i + 1,
                c => {
                    if c == '\n' {
                        *line += 1;
                    }
                    i += 1;
                }
            }
        }
        i
    }
    while i < n {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && i + 1 < n && b[i + 1] == '/' {
            while i < n && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && i + 1 < n && b[i + 1] == '*' {
            let mut depth = 0;
            while i < n {
                if b[i] == '/' && i + 1 < n && b[i + 1] == '*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && i + 1 < n && b[i + 1] == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_str(&b, i, &mut line);
        } else if (c == 'r' || c == 'b')
            && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
            && raw_string_start(&b, i).is_some()
        {
            let (hashes, open) = raw_string_start(&b, i).unwrap_or((0, i));
            i = open + 1;
            'raw: while i < n {
                if b[i] == '\n' {
                    line += 1;
                }
                if b[i] == '"' && (0..hashes).all(|k| b.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break 'raw;
                }
                i += 1;
            }
        } else if c == 'b' && i + 1 < n && b[i + 1] == '"' {
            i = skip_str(&b, i + 1, &mut line);
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 2 < n && b[i + 1] == '\\' {
                i += 2;
                while i < n && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if i + 2 < n && b[i + 2] == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < n && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                // `0..n`: stop before a range.
                if b[i] == '.' && b.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let mut word: String = b[s..i].iter().collect();
            if let Some(raw) = word.strip_prefix("r#") {
                word = raw.to_string();
            }
            out.push(Tok {
                kind: Kind::Ident(word),
                line,
            });
        } else if c == ':' && i + 1 < n && b[i + 1] == ':' {
            out.push(Tok {
                kind: Kind::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                kind: Kind::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// `r"`, `r#"`, `br"`, `br#"` at `i`: the number of hashes and the index of the quote.
fn raw_string_start(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&'"')).then_some((hashes, j))
}

/// Index just past the item that starts at `i` (after its attributes): the `;` that ends it
/// or the `}` that closes its body, whichever comes first at nesting depth 0.
fn item_end(t: &[Tok], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match t[i].kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']') => depth -= 1,
            Kind::Punct('}') => {
                depth -= 1;
                if depth <= 0 {
                    return i + 1;
                }
            }
            Kind::Punct(';') if depth <= 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Whether `t[i..]` starts with `#[cfg(test)]`.
fn is_cfg_test(t: &[Tok], i: usize) -> bool {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    want.iter().enumerate().all(|(k, w)| {
        t.get(i + k).is_some_and(|tok| match &tok.kind {
            Kind::Ident(s) => s == w,
            Kind::Punct(c) => w.len() == 1 && w.starts_with(*c),
            Kind::PathSep => false,
        })
    })
}

/// Removes `#[cfg(test)]` items; returns the remaining tokens and the names of the
/// `#[cfg(test)] mod name;` declarations (test-only files).
fn strip_cfg_test(t: Vec<Tok>) -> (Vec<Tok>, BTreeSet<String>) {
    let mut out = Vec::with_capacity(t.len());
    let mut test_mods = BTreeSet::new();
    let mut i = 0;
    while i < t.len() {
        if is_cfg_test(&t, i) {
            let mut j = i + 7;
            // Further attributes of the same item.
            while j < t.len() && t[j].is('#') && t.get(j + 1).is_some_and(|x| x.is('[')) {
                j = item_end_bracket(&t, j + 1);
            }
            let end = item_end(&t, j);
            if t.get(j).is_some_and(|x| x.is_ident("mod"))
                && t.get(j + 2).is_some_and(|x| x.is(';'))
            {
                if let Some(name) = t.get(j + 1).and_then(Tok::ident) {
                    test_mods.insert(name.to_string());
                }
            }
            i = end;
        } else {
            out.push(t[i].clone());
            i += 1;
        }
    }
    (out, test_mods)
}

/// Index just past the `]` matching the `[` at `i`.
fn item_end_bracket(t: &[Tok], mut i: usize) -> usize {
    let mut depth = 0;
    while i < t.len() {
        if t[i].is('[') {
            depth += 1;
        } else if t[i].is(']') {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    i
}

// ------------------------------------------------------------------------------------------
// Per-file facts
// ------------------------------------------------------------------------------------------

/// One path of a `use` item, brace trees expanded.
#[derive(Debug, Clone)]
struct UseEntry {
    /// Path segments as written (`crate`, `super`, names), without the final `*` of a glob.
    path: Vec<String>,
    /// The name it brings in (the alias or the last segment); `None` for a glob.
    name: Option<String>,
    /// `pub`/`pub(crate)`/... use.
    public: bool,
    /// The inline-module suffix the item sits in (relative to the file's module).
    inline: Vec<String>,
    line: usize,
}

/// A path in code (not in a `use` item).
#[derive(Debug, Clone)]
struct CodePath {
    segs: Vec<String>,
    inline: Vec<String>,
    line: usize,
}

#[derive(Debug, Clone, Default)]
struct FileFacts {
    uses: Vec<UseEntry>,
    paths: Vec<CodePath>,
    /// Names of items defined at the file's top level (inline modules included).
    defined: BTreeSet<String>,
    /// Child modules declared with `mod name;`.
    child_mods: BTreeSet<String>,
    /// Child modules declared `#[cfg(test)] mod name;`.
    test_mods: BTreeSet<String>,
    /// How often each identifier occurs outside `use` items.
    idents_outside_use: BTreeMap<String, usize>,
}

/// Parses a use tree at `t[*i..]` with `prefix`, pushing expanded entries.
fn parse_use_tree(
    t: &[Tok],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    if t.get(*i).is_some_and(|x| x.kind == Kind::PathSep) {
        *i += 1;
    }
    loop {
        let Some(tok) = t.get(*i) else { return };
        match &tok.kind {
            Kind::Punct('*') => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Kind::Punct('{') => {
                *i += 1;
                loop {
                    match t.get(*i) {
                        None => return,
                        Some(x) if x.is('}') => {
                            *i += 1;
                            return;
                        }
                        Some(x) if x.is(',') => *i += 1,
                        Some(_) => {
                            let before = *i;
                            parse_use_tree(t, i, path.clone(), out);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
            }
            Kind::Ident(name) => {
                *i += 1;
                if t.get(*i).is_some_and(|x| x.kind == Kind::PathSep) {
                    *i += 1;
                    path.push(name.clone());
                    continue;
                }
                let mut bound = name.clone();
                if name == "self" {
                    bound = path.last().cloned().unwrap_or_default();
                } else {
                    path.push(name.clone());
                }
                if t.get(*i).is_some_and(|x| x.is_ident("as")) {
                    if let Some(alias) = t.get(*i + 1).and_then(Tok::ident) {
                        bound = alias.to_string();
                    }
                    *i += 2;
                }
                out.push((path, Some(bound)));
                return;
            }
            _ => return,
        }
    }
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "const", "static", "trait", "type", "mod", "union",
];

fn file_facts(src: &str) -> FileFacts {
    let (t, test_mods) = strip_cfg_test(tokenize(src));
    let mut f = FileFacts {
        test_mods,
        ..FileFacts::default()
    };
    // Inline module stack: (name, brace depth inside it).
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    while i < t.len() {
        let tok = &t[i];
        match &tok.kind {
            Kind::Punct('{') => {
                depth += 1;
                i += 1;
                continue;
            }
            Kind::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| depth < *d) {
                    inline.pop();
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        let suffix: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        let prev_sep = i > 0 && t[i - 1].kind == Kind::PathSep;
        if tok.is_ident("use") && !prev_sep {
            // Visibility: `pub use` or `pub(...) use`.
            let public = (i >= 1 && t[i - 1].is_ident("pub"))
                || (i >= 1 && t[i - 1].is(')') && {
                    let mut k = i - 1;
                    while k > 0 && !t[k].is('(') {
                        k -= 1;
                    }
                    k >= 1 && t[k - 1].is_ident("pub")
                });
            let line = tok.line;
            let mut j = i + 1;
            let mut entries = Vec::new();
            parse_use_tree(&t, &mut j, Vec::new(), &mut entries);
            while j < t.len() && !t[j].is(';') {
                j += 1;
            }
            for (path, name) in entries {
                f.uses.push(UseEntry {
                    path,
                    name,
                    public,
                    inline: suffix.clone(),
                    line,
                });
            }
            i = j + 1;
            continue;
        }
        if let Some(word) = tok.ident() {
            *f.idents_outside_use.entry(word.to_string()).or_default() += 1;
            if word == "mod" && !prev_sep {
                if let Some(name) = t.get(i + 1).and_then(Tok::ident) {
                    if t.get(i + 2).is_some_and(|x| x.is(';')) {
                        if inline.is_empty() {
                            f.child_mods.insert(name.to_string());
                        }
                    } else if t.get(i + 2).is_some_and(|x| x.is('{')) {
                        if inline.is_empty() {
                            f.defined.insert(name.to_string());
                        }
                        inline.push((name.to_string(), depth + 1));
                    }
                }
            } else if depth == 0 && ITEM_KEYWORDS.contains(&word) && !prev_sep {
                if let Some(name) = t.get(i + 1).and_then(Tok::ident) {
                    if !ITEM_KEYWORDS.contains(&name) && name != "unsafe" && name != "extern" {
                        f.defined.insert(name.to_string());
                    }
                }
            } else if word == "macro_rules" && t.get(i + 1).is_some_and(|x| x.is('!')) {
                if let Some(name) = t.get(i + 2).and_then(Tok::ident) {
                    f.defined.insert(name.to_string());
                }
            }
            // A path: ident (:: ident)+, not itself the tail of a longer path.
            if !prev_sep
                && t.get(i + 1).is_some_and(|x| x.kind == Kind::PathSep)
                && !(i >= 1 && t[i - 1].is_ident("in"))
            {
                let mut segs = vec![word.to_string()];
                let mut j = i + 1;
                while t.get(j).is_some_and(|x| x.kind == Kind::PathSep) {
                    match t.get(j + 1).and_then(Tok::ident) {
                        Some(s) => segs.push(s.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                if segs.len() > 1 {
                    f.paths.push(CodePath {
                        segs,
                        inline: suffix,
                        line: tok.line,
                    });
                }
            }
        }
        i += 1;
    }
    f
}

// ------------------------------------------------------------------------------------------
// The graph
// ------------------------------------------------------------------------------------------

/// One file of a crate.
#[derive(Debug, Clone)]
pub struct FileNode {
    /// Its path relative to the crate's `src`.
    pub rel: String,
    /// Its module path (empty for the crate root).
    pub module: Vec<String>,
}

/// One import: `from` uses an item of `to` first at `line` of `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// Index of the importing file.
    pub from: usize,
    /// Index of the imported file.
    pub to: usize,
    /// The first line of `from` that reaches `to`.
    pub line: usize,
}

/// The file-level import graph of one crate.
#[derive(Debug, Clone)]
pub struct Graph {
    /// The files, sorted by path.
    pub files: Vec<FileNode>,
    /// The imports, one per pair of files, sorted.
    pub edges: Vec<Edge>,
}

struct Resolver<'a> {
    files: &'a [FileNode],
    facts: &'a [FileFacts],
    by_module: BTreeMap<Vec<String>, usize>,
}

impl Resolver<'_> {
    /// The file whose module is the longest prefix of `abs`, and the rest of `abs`.
    fn owner<'p>(&self, abs: &'p [String]) -> (usize, &'p [String]) {
        for k in (0..=abs.len()).rev() {
            if let Some(&f) = self.by_module.get(&abs[..k]) {
                return (f, &abs[k..]);
            }
        }
        // The root always exists (checked by the caller).
        (self.by_module[&Vec::new()], abs)
    }

    /// The file that holds the item at crate-absolute path `abs`.
    fn resolve(&self, abs: &[String], budget: u32) -> usize {
        let (f, rest) = self.owner(abs);
        let Some(name) = rest.first() else { return f };
        if budget == 0 || self.facts[f].defined.contains(name) {
            return f;
        }
        let base = &self.files[f].module;
        // A name the file imports (re-exports included).
        for u in self.facts[f].uses.iter().filter(|u| u.inline.is_empty()) {
            if u.name.as_deref() == Some(name.as_str()) {
                return match self.absolute(base, &u.path, f, false) {
                    Some(mut p) => {
                        p.extend_from_slice(&rest[1..]);
                        self.resolve(&p, budget - 1)
                    }
                    None => f,
                };
            }
        }
        // A glob import whose module defines or imports the name.
        for u in self.facts[f].uses.iter().filter(|u| u.inline.is_empty()) {
            if u.name.is_none() {
                if let Some(mut p) = self.absolute(base, &u.path, f, false) {
                    let (g, grest) = self.owner(&p);
                    let g_has = grest.is_empty()
                        && (self.facts[g].defined.contains(name)
                            || self.facts[g]
                                .uses
                                .iter()
                                .any(|x| x.name.as_deref() == Some(name.as_str())));
                    if g_has && g != f {
                        p.extend_from_slice(rest);
                        return self.resolve(&p, budget - 1);
                    }
                }
            }
        }
        f
    }

    /// The crate-absolute form of `segs` written in module `base` of file `file`; `None` for
    /// a path outside the crate (std, another crate, a local item).
    fn absolute(
        &self,
        base: &[String],
        segs: &[String],
        file: usize,
        via_imports: bool,
    ) -> Option<Vec<String>> {
        let first = segs.first()?;
        match first.as_str() {
            "crate" => Some(segs[1..].to_vec()),
            "self" => {
                let mut p = base.to_vec();
                p.extend_from_slice(&segs[1..]);
                Some(p)
            }
            "super" => {
                let mut p = base.to_vec();
                let mut k = 0;
                while segs.get(k).is_some_and(|s| s == "super") {
                    p.pop()?;
                    k += 1;
                }
                p.extend_from_slice(&segs[k..]);
                Some(p)
            }
            _ => {
                let mut child = base.to_vec();
                child.push(first.clone());
                if self.by_module.contains_key(&child) {
                    let mut p = base.to_vec();
                    p.extend_from_slice(segs);
                    return Some(p);
                }
                if via_imports {
                    let fbase = &self.files[file].module;
                    for u in self.facts[file].uses.iter().filter(|u| u.inline.is_empty()) {
                        if u.name.as_deref() == Some(first.as_str())
                            && u.path.first() != segs.first()
                        {
                            let mut p = self.absolute(fbase, &u.path, file, false)?;
                            p.extend_from_slice(&segs[1..]);
                            return Some(p);
                        }
                    }
                }
                None
            }
        }
    }
}

/// The module path of a file at `rel` (relative to `src`, `/`-separated).
fn module_of(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return Vec::new();
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn rs_files(dir: &Path, root: &Path, out: &mut Vec<String>) -> Result<(), Error> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Error(format!("cannot read the directory {}: {e}", dir.display())))?;
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            // src/bin/* are separate crates.
            if p.strip_prefix(root).is_ok_and(|r| r == Path::new("bin")) {
                continue;
            }
            rs_files(&p, root, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// Builds the import graph of the crate whose sources are in `src` from `(path, text)` pairs
/// (paths relative to `src`). Fails when there is no `lib.rs` or `main.rs`.
pub fn graph_of(sources: &[(String, String)]) -> Result<Graph, Error> {
    let mut files: Vec<FileNode> = sources
        .iter()
        .map(|(rel, _)| FileNode {
            rel: rel.clone(),
            module: module_of(rel),
        })
        .collect();
    let mut facts: Vec<FileFacts> = sources.iter().map(|(_, s)| file_facts(s)).collect();
    // Drop test-only files (and everything under them).
    let test_roots: Vec<Vec<String>> = files
        .iter()
        .zip(&facts)
        .flat_map(|(f, x)| {
            x.test_mods.iter().map(|m| {
                let mut p = f.module.clone();
                p.push(m.clone());
                p
            })
        })
        .collect();
    let keep: Vec<bool> = files
        .iter()
        .map(|f| !test_roots.iter().any(|t| f.module.starts_with(t)))
        .collect();
    let mut k = keep.iter();
    files.retain(|_| *k.next().unwrap_or(&true));
    let mut k = keep.iter();
    facts.retain(|_| *k.next().unwrap_or(&true));

    let by_module: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    if !by_module.contains_key(&Vec::new()) {
        return Err(Error("no lib.rs or main.rs".into()));
    }
    let r = Resolver {
        files: &files,
        facts: &facts,
        by_module,
    };
    let mut edges: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut add = |from: usize, to: usize, line: usize| {
        if from != to {
            let e = edges.entry((from, to)).or_insert(line);
            *e = (*e).min(line);
        }
    };
    for (fi, (file, x)) in files.iter().zip(&facts).enumerate() {
        for u in &x.uses {
            if u.public {
                // A pure re-export is the module's public face, not a dependency.
                let used = u
                    .name
                    .as_ref()
                    .is_some_and(|n| x.idents_outside_use.get(n).copied().unwrap_or(0) > 0);
                if !used {
                    continue;
                }
            }
            let mut base = file.module.clone();
            base.extend(u.inline.iter().cloned());
            let Some(abs) = r.absolute(&base, &u.path, fi, true) else {
                continue;
            };
            let to = if u.name.is_none() {
                r.owner(&abs).0
            } else {
                r.resolve(&abs, 16)
            };
            add(fi, to, u.line);
        }
        for p in &x.paths {
            let mut base = file.module.clone();
            base.extend(p.inline.iter().cloned());
            let Some(abs) = r.absolute(&base, &p.segs, fi, p.inline.is_empty()) else {
                continue;
            };
            add(fi, r.resolve(&abs, 16), p.line);
        }
    }
    let edges = edges
        .into_iter()
        .map(|((from, to), line)| Edge { from, to, line })
        .collect();
    Ok(Graph { files, edges })
}

/// Reads every `.rs` file under `src` (but `src/bin`) and builds its import graph.
pub fn graph(src: &Path) -> Result<Graph, Error> {
    let mut rels = Vec::new();
    rs_files(src, src, &mut rels)?;
    let sources = rels
        .into_iter()
        .map(|rel| {
            let text = crate::read(&src.join(&rel), "source file")?;
            Ok((rel, text))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    graph_of(&sources)
}

/// The strongly connected components of more than one file (the import circles), each sorted,
/// in order of their first file.
pub fn circles(g: &Graph) -> Vec<Vec<usize>> {
    let n = g.files.len();
    let mut adj = vec![Vec::new(); n];
    for e in &g.edges {
        adj[e.from].push(e.to);
    }
    // Tarjan's algorithm.
    struct St {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(v: usize, adj: &[Vec<usize>], s: &mut St) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &adj[v] {
            match s.index[w] {
                None => {
                    visit(w, adj, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort_unstable();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(v, &adj, &mut s);
        }
    }
    s.out.sort();
    s.out
}

/// The layer index (0 = top) of a module path, if it is in one.
fn layer_of(module: &[String], layers: &[(&str, &[&str])]) -> Option<usize> {
    let joined = module.join("::");
    layers.iter().position(|(_, prefixes)| {
        prefixes.iter().any(|p| {
            if p.is_empty() {
                module.is_empty()
            } else if let Some(own) = p.strip_prefix('=') {
                joined == own
            } else {
                joined == *p || joined.starts_with(&format!("{p}::"))
            }
        })
    })
}

/// The imports from a file of a layer to a file of a layer above it.
pub fn layer_breaches(g: &Graph, layers: &[(&str, &[&str])]) -> Vec<Edge> {
    g.edges
        .iter()
        .filter(|e| {
            match (
                layer_of(&g.files[e.from].module, layers),
                layer_of(&g.files[e.to].module, layers),
            ) {
                (Some(a), Some(b)) => b < a,
                _ => false,
            }
        })
        .copied()
        .collect()
}

/// Checks every crate of `rules` under the workspace `root`, writing the report to `out`.
/// Returns whether the check passed (no finding in a [`Mode::Fail`] crate); fails when a
/// crate's sources cannot be read.
pub fn check(
    root: &Path,
    rules: &[CrateRule],
    verbose: bool,
    out: &mut String,
) -> Result<bool, Error> {
    let mut ok = true;
    for rule in rules {
        let g = graph(&root.join(rule.src))?;
        let circles = circles(&g);
        let breaches = layer_breaches(&g, rule.layers);
        let mode = match rule.mode {
            Mode::Fail => "must be clean",
            Mode::Report => "report only",
        };
        let _ = writeln!(
            out,
            "{} ({}, {mode}): {} files, {} imports, {} circle(s), {} layer breach(es)",
            rule.name,
            rule.src,
            g.files.len(),
            g.edges.len(),
            circles.len(),
            breaches.len()
        );
        if verbose {
            for e in &g.edges {
                let _ = writeln!(
                    out,
                    "  {} -> {} (line {})",
                    g.files[e.from].rel, g.files[e.to].rel, e.line
                );
            }
        }
        let mut new_circles = 0;
        for c in &circles {
            let names: Vec<&str> = c.iter().map(|&f| g.files[f].rel.as_str()).collect();
            let known = rule
                .known_circles
                .iter()
                .any(|k| names.iter().all(|n| k.contains(n)));
            if !known {
                new_circles += 1;
            }
            let tag = if known {
                " (known, left for later)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  circle of {} files{tag}: {}",
                c.len(),
                names.join(" ")
            );
            for e in g
                .edges
                .iter()
                .filter(|e| c.contains(&e.from) && c.contains(&e.to))
            {
                let _ = writeln!(
                    out,
                    "    {} -> {} (line {})",
                    g.files[e.from].rel, g.files[e.to].rel, e.line
                );
            }
        }
        for e in &breaches {
            let _ = writeln!(
                out,
                "  layer breach: {} -> {} (line {})",
                g.files[e.from].rel, g.files[e.to].rel, e.line
            );
        }
        if rule.mode == Mode::Fail && (new_circles > 0 || !breaches.is_empty()) {
            ok = false;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(files: &[(&str, &str)]) -> Graph {
        let s: Vec<(String, String)> = files
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        graph_of(&s).unwrap()
    }

    fn edges(g: &Graph) -> Vec<(String, String)> {
        g.edges
            .iter()
            .map(|e| (g.files[e.from].rel.clone(), g.files[e.to].rel.clone()))
            .collect()
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_string(), b.to_string())
    }

    #[test]
    fn use_trees_code_paths_and_reexports_resolve_to_the_defining_file() {
        let gr = g(&[
            (
                "lib.rs",
                "mod error; pub mod a; pub mod b; pub mod c; pub use error::{Error, Result};",
            ),
            (
                "error.rs",
                "pub enum Error {} pub type Result<T> = core::result::Result<T, Error>;",
            ),
            (
                "a.rs",
                "use crate::{Error, b::{self, X as Y}}; // use crate::c;\n fn f() {}",
            ),
            (
                "b.rs",
                "pub struct X; fn g() { let s = \"crate::c::Z\"; crate::c::h(); }",
            ),
            ("c.rs", "/* use crate::a; */ pub fn h() {}"),
        ]);
        assert_eq!(
            edges(&gr),
            vec![
                pair("a.rs", "error.rs"),
                pair("a.rs", "b.rs"),
                pair("b.rs", "c.rs")
            ]
        );
        assert!(circles(&gr).is_empty());
    }

    #[test]
    fn finds_circles_and_ignores_cfg_test_and_pure_reexports() {
        let gr = g(&[
            (
                "lib.rs",
                "mod m; mod n; mod o; pub use m::M; #[cfg(test)] mod t;",
            ),
            ("m.rs", "use super::n::N; pub struct M;"),
            (
                "n.rs",
                "pub struct N(crate::m::M); #[cfg(test)] mod tests { use crate::o::O; }",
            ),
            ("o.rs", "pub struct O; fn f() { super::m::M; }"),
            ("t.rs", "use crate::o::O;"),
        ]);
        assert_eq!(circles(&gr), vec![vec![1, 2]]);
        assert_eq!(
            edges(&gr),
            vec![
                pair("m.rs", "n.rs"),
                pair("n.rs", "m.rs"),
                pair("o.rs", "m.rs")
            ]
        );
    }

    #[test]
    fn mod_rs_children_super_and_inline_modules() {
        let gr = g(&[
            ("lib.rs", "pub mod cm; pub fn top() {}"),
            (
                "cm/mod.rs",
                "mod req; mod bits; pub use req::Req; pub(crate) use bits::get;",
            ),
            (
                "cm/req.rs",
                "use super::bits; pub struct Req; fn f() { bits::get(); }",
            ),
            (
                "cm/bits.rs",
                "pub fn get() {} mod inner { fn g() { super::get(); } } fn h() { crate::top(); }",
            ),
        ]);
        assert_eq!(
            edges(&gr),
            vec![
                pair("cm/req.rs", "cm/bits.rs"),
                pair("cm/bits.rs", "lib.rs")
            ]
        );
    }

    #[test]
    fn layers_order_imports_downward_only() {
        let gr = g(&[
            (
                "lib.rs",
                "pub mod rdma_cm; pub mod verbs; pub mod provider;",
            ),
            ("rdma_cm.rs", "use crate::verbs::Qp;"),
            (
                "verbs.rs",
                "pub struct Qp; use crate::provider::Dev; fn f() { crate::rdma_cm::x(); }",
            ),
            ("provider.rs", "pub struct Dev;"),
        ]);
        let layers: &[(&str, &[&str])] = &[
            ("rdma_cm", &["rdma_cm"]),
            // The verbs room in its own order: the QP verbs drive the data path, which
            // works on the QP object; under it the objects a QP holds, then memory, CQs,
            // PDs, contexts and the device state they all hold.
            (
                "verbs: QP verbs",
                &[
                    "verbs::qp::modify",
                    "verbs::qp::send",
                    "verbs::qp::recv",
                    "verbs::qp::mcast",
                ],
            ),
            ("verbs: data path", &["verbs::datapath"]),
            ("verbs: work-request records", &["verbs::records"]),
            ("verbs: the transport's view of memory", &["verbs::env"]),
            ("verbs: copy engines", &["verbs::copy"]),
            ("verbs: QP object", &["verbs::qp"]),
            ("verbs: shared receive queues", &["verbs::srq"]),
            ("verbs: work requests", &["verbs::requests"]),
            ("verbs: address handles", &["verbs::ah"]),
            ("verbs: memory windows", &["verbs::mw"]),
            ("verbs: memory regions", &["verbs::mr"]),
            ("verbs: work-request parts", &["verbs::wr"]),
            ("verbs: completion queues", &["verbs::cq"]),
            ("verbs: protection domains", &["verbs::pd"]),
            ("verbs: contexts", &["verbs::context"]),
            ("verbs: device state", &["verbs::resources"]),
            ("verbs: devices, events", &["verbs::device", "verbs::event"]),
            ("verbs: basics", &["verbs::hold", "verbs::mem", "verbs"]),
            ("provider", &["provider"]),
        ];
        let b = layer_breaches(&gr, layers);
        assert_eq!(b.len(), 1);
        assert_eq!(gr.files[b[0].from].rel, "verbs.rs");
        assert_eq!(gr.files[b[0].to].rel, "rdma_cm.rs");
    }

    #[test]
    fn a_longer_prefix_listed_higher_carves_a_sublayer() {
        let gr = g(&[
            ("lib.rs", "pub mod verbs;"),
            ("verbs/mod.rs", "pub mod qp; pub mod datapath; pub mod pd;"),
            (
                "verbs/qp/mod.rs",
                "mod send; pub struct Qp; use crate::verbs::pd::Pd;",
            ),
            (
                "verbs/qp/send.rs",
                "use crate::verbs::datapath::drive; use super::Qp;",
            ),
            (
                "verbs/datapath.rs",
                "pub fn drive() {} use crate::verbs::qp::Qp; fn f() { crate::verbs::qp::x(); }",
            ),
            (
                "verbs/pd.rs",
                "pub struct Pd; use crate::verbs::datapath::drive;",
            ),
        ]);
        let layers: &[(&str, &[&str])] = &[
            ("qp verbs", &["verbs::qp::send"]),
            ("data path", &["verbs::datapath"]),
            ("qp object", &["verbs::qp"]),
            ("rest", &["verbs"]),
        ];
        let b: Vec<(String, String)> = layer_breaches(&gr, layers)
            .iter()
            .map(|e| (gr.files[e.from].rel.clone(), gr.files[e.to].rel.clone()))
            .collect();
        assert_eq!(b, vec![pair("verbs/pd.rs", "verbs/datapath.rs")]);
    }

    #[test]
    fn an_exact_prefix_takes_the_module_file_only() {
        let gr = g(&[
            ("lib.rs", "pub mod verbs;"),
            (
                "verbs/mod.rs",
                "pub mod qp; pub mod pd; fn f() { qp::make(); }",
            ),
            ("verbs/qp.rs", "pub fn make() {} use crate::verbs::pd::Pd;"),
            (
                "verbs/pd.rs",
                "pub struct Pd; fn f() { crate::verbs::top(); }",
            ),
        ]);
        let layers: &[(&str, &[&str])] = &[
            ("top", &["=verbs"]),
            ("qp", &["verbs::qp"]),
            ("pd", &["verbs::pd"]),
        ];
        let b: Vec<(String, String)> = layer_breaches(&gr, layers)
            .iter()
            .map(|e| (gr.files[e.from].rel.clone(), gr.files[e.to].rel.clone()))
            .collect();
        assert_eq!(b, vec![pair("verbs/pd.rs", "verbs/mod.rs")]);
        assert_eq!(layer_of(&["verbs".to_string()], layers), Some(0));
        assert_eq!(
            layer_of(&["verbs".to_string(), "x".to_string()], layers),
            None
        );
    }

    #[test]
    fn known_circles_are_reported_without_failing_and_new_ones_fail() {
        let dir = std::env::temp_dir().join(format!("xtask-layers-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("lib.rs"), "mod a; mod b;").unwrap();
        std::fs::write(src.join("a.rs"), "use crate::b::B; pub struct A;").unwrap();
        std::fs::write(src.join("b.rs"), "use crate::a::A; pub struct B;").unwrap();
        let rule = |known: &'static [&'static [&'static str]]| CrateRule {
            name: "t",
            src: "src",
            mode: Mode::Fail,
            layers: &[],
            known_circles: known,
        };
        let mut out = String::new();
        assert!(!check(&dir, &[rule(&[])], false, &mut out).unwrap());
        assert!(out.contains("circle of 2 files: a.rs b.rs"), "{out}");
        let mut out = String::new();
        assert!(check(&dir, &[rule(&[&["a.rs", "b.rs"]])], false, &mut out).unwrap());
        assert!(out.contains("(known, left for later)"), "{out}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The workspace itself passes: `cargo test` catches a new circle before CI does.
    #[test]
    fn workspace_passes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut out = String::new();
        assert!(check(&root, RULES, false, &mut out).unwrap(), "{out}");
    }

    #[test]
    fn tokenizer_skips_literals_lifetimes_and_raw_strings() {
        let t =
            tokenize("fn f<'a>(x: &'a str) { let c = '\"'; let r = r#\"crate::x\"#; crate::y; }");
        let idents: Vec<&str> = t.iter().filter_map(Tok::ident).collect();
        assert_eq!(
            idents,
            vec!["fn", "f", "x", "str", "let", "c", "let", "r", "crate", "y"]
        );
    }
}
