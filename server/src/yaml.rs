//! A YAML document as a tree whose every node knows its line, for
//! configuration errors that say where they are.
//!
//! yaml-rust2's event parser reports a position with each event; this module
//! builds a small tree from those events (mappings keep their order, scalars
//! stay strings until the configuration reads them). serde_yaml's errors carry
//! a location only for syntax and type errors, and its `Value` none at all:
//! a semantic error (a duplicate descriptor, an unknown unit) could not say
//! where it is.
//!
//! The tree is what gopkg.in/yaml.v2 (envoyproxy/ratelimit's parser) reads:
//! the first document of a file (any after a `---` are not read), anchors
//! (`&a`) and aliases (`*a`) expanded, and merge keys (`<<: *a`, `<<: [*a,
//! *b]`) merged as yaml.v2 merges them, in document order, a later key
//! replacing an earlier one (of a list of merged mappings, the first wins).
//! Aliases are bounded: a document whose anchors and aliases would copy
//! more than [`MAX_ALIAS_NODES`] nodes or [`MAX_ALIAS_BYTES`] bytes of
//! scalars in all (a "billion laughs", or anchors nested in anchors), or
//! nest past [`MAX_DEPTH`], is refused, so a few kilobytes of YAML cannot
//! take gigabytes. Merge keys are applied in time linear in the entries.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The deepest nesting accepted, in mappings and sequences.
pub(crate) const MAX_DEPTH: usize = 64;

/// The most nodes anchors and aliases may copy into a document.
pub(crate) const MAX_ALIAS_NODES: usize = 100_000;

/// The most bytes of scalars anchors and aliases may copy into a document.
pub(crate) const MAX_ALIAS_BYTES: usize = 8 << 20;

/// A node of the tree.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// 1-based line where the node starts.
    pub(crate) line: usize,
    pub(crate) kind: Kind,
}

/// What a node holds.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// `~`, `null` or nothing.
    Null,
    /// A scalar, as written.
    Scalar(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order.
    Map(Vec<(Node, Node)>),
}

impl Kind {
    /// What the kind is called in an error.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Kind::Null => "nothing",
            Kind::Scalar(_) => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// A syntax error: the line and what is wrong.
#[derive(Clone, Debug)]
pub(crate) struct SyntaxError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// A container being built, with its anchor (0: none).
enum Open {
    Seq {
        line: usize,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        /// The entries whose key is the merge key `<<`.
        merges: Vec<usize>,
        /// Whether the pending key is the merge key.
        merge_key: bool,
    },
}

/// An anchored node, with what copying it costs.
struct Anchored {
    node: Node,
    /// Nodes in it.
    nodes: usize,
    /// Bytes of its scalars.
    bytes: usize,
    /// Levels of mappings and sequences in it (0 for a scalar).
    height: usize,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    error: Option<SyntaxError>,
    /// The first document is read whole: stop.
    done: bool,
    anchors: HashMap<usize, Anchored>,
    /// Nodes and bytes copied by aliases so far.
    alias_nodes: usize,
    alias_bytes: usize,
}

/// `(nodes, bytes, height)` of a tree; recursion bounded by [`MAX_DEPTH`].
fn measure(node: &Node) -> (usize, usize, usize) {
    match &node.kind {
        Kind::Null => (1, 0, 0),
        Kind::Scalar(text) => (1, text.len(), 0),
        Kind::Seq(items) => items
            .iter()
            .map(measure)
            .fold((1, 0, 1), |a, m| (a.0 + m.0, a.1 + m.1, a.2.max(m.2 + 1))),
        Kind::Map(entries) => entries
            .iter()
            .flat_map(|(k, v)| [measure(k), measure(v)])
            .fold((1, 0, 1), |a, m| (a.0 + m.0, a.1 + m.1, a.2.max(m.2 + 1))),
    }
}

/// A mapping's entries with its merge keys applied as yaml.v2 applies them:
/// in document order, each entry replacing an earlier one of its key that
/// came from a merge; a merge replacing any earlier one; of a list of merged
/// mappings, the first winning. Two explicit entries of one key are kept,
/// for the configuration to refuse.
fn merged(entries: Vec<(Node, Node)>, merges: &[usize]) -> Result<Vec<(Node, Node)>, SyntaxError> {
    let mut is_merge = vec![false; entries.len()];
    for &at in merges {
        if let Some(flag) = is_merge.get_mut(at) {
            *flag = true;
        }
    }
    let mut out: Vec<(Node, Node, bool)> = Vec::with_capacity(entries.len());
    // Where each scalar key first stands in `out`: a merged entry is placed
    // only where its key is not yet, so the first place of a key is the one
    // a later entry of that key replaces, if any (in linear time: scanning
    // `out` for each entry took minutes on a file of 80,000 keys).
    let mut first: HashMap<String, usize> = HashMap::new();
    let scalar = |node: &Node| match &node.kind {
        Kind::Scalar(text) => Some(text.clone()),
        _ => None,
    };
    for (index, (key, value)) in entries.into_iter().enumerate() {
        if !is_merge[index] {
            match scalar(&key).and_then(|text| first.get(&text).copied()) {
                Some(at) if out[at].2 => out[at] = (key, value, false),
                Some(_) => out.push((key, value, false)),
                None => {
                    if let Some(text) = scalar(&key) {
                        first.insert(text, out.len());
                    }
                    out.push((key, value, false));
                }
            }
            continue;
        }
        let wrong = || SyntaxError {
            line: value.line,
            message: "a merge key (`<<`) takes a mapping or a list of mappings".to_string(),
        };
        let sources: Vec<&Vec<(Node, Node)>> = match &value.kind {
            Kind::Map(entries) => vec![entries],
            Kind::Seq(items) => items
                .iter()
                .rev()
                .map(|item| match &item.kind {
                    Kind::Map(entries) => Ok(entries),
                    _ => Err(wrong()),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(wrong()),
        };
        for source in sources {
            for (k, v) in source {
                match scalar(k).and_then(|text| first.get(&text).copied()) {
                    Some(at) => out[at] = (k.clone(), v.clone(), true),
                    None => {
                        if let Some(text) = scalar(k) {
                            first.insert(text, out.len());
                        }
                        out.push((k.clone(), v.clone(), true));
                    }
                }
            }
        }
    }
    Ok(out.into_iter().map(|(k, v, _)| (k, v)).collect())
}

impl Builder {
    fn fail(&mut self, line: usize, message: &str) {
        if self.error.is_none() {
            self.error = Some(SyntaxError {
                line,
                message: message.to_string(),
            });
        }
    }

    /// Place a finished node: the root, a list's item, a mapping's key or
    /// value. `merge_key`: the node is a plain `<<`.
    fn push(&mut self, node: Node, anchor: usize, merge_key: bool) {
        if anchor != 0 {
            let (nodes, bytes, height) = measure(&node);
            // The anchor keeps a copy: counted as an alias's is, so that
            // anchors nested in anchors (each a copy of all within) cannot
            // take gigabytes with no alias at all.
            self.alias_nodes = self.alias_nodes.saturating_add(nodes);
            self.alias_bytes = self.alias_bytes.saturating_add(bytes);
            if self.alias_nodes > MAX_ALIAS_NODES || self.alias_bytes > MAX_ALIAS_BYTES {
                return self.fail(
                    node.line,
                    "anchors and aliases copy too much (more than 100,000 nodes or 8 MiB): write the document out, or anchor less",
                );
            }
            self.anchors.insert(
                anchor,
                Anchored {
                    node: node.clone(),
                    nodes,
                    bytes,
                    height,
                },
            );
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Open::Seq { items, .. }) => items.push(node),
            Some(Open::Map {
                entries,
                key,
                merges,
                merge_key: pending_merge,
                ..
            }) => match key.take() {
                None => {
                    *key = Some(node);
                    *pending_merge = merge_key;
                }
                Some(k) => {
                    if *pending_merge {
                        merges.push(entries.len());
                    }
                    entries.push((k, node));
                }
            },
        }
    }

    fn alias(&mut self, id: usize, line: usize) {
        let Some(anchored) = self.anchors.get(&id) else {
            // yaml-rust2 refuses an alias of no anchor; an anchor not yet
            // complete is one the alias is inside of.
            return self.fail(
                line,
                "an alias inside the node it names (a recursive alias)",
            );
        };
        if self.stack.len() + anchored.height > MAX_DEPTH {
            return self.fail(line, "nested too deeply (at most 64 levels)");
        }
        self.alias_nodes = self.alias_nodes.saturating_add(anchored.nodes);
        self.alias_bytes = self.alias_bytes.saturating_add(anchored.bytes);
        if self.alias_nodes > MAX_ALIAS_NODES || self.alias_bytes > MAX_ALIAS_BYTES {
            return self.fail(
                line,
                "anchors and aliases copy too much (more than 100,000 nodes or 8 MiB): write the document out, or alias less",
            );
        }
        let node = anchored.node.clone();
        self.push(node, 0, false);
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.error.is_some() || self.done {
            return;
        }
        let line = mark.line();
        match event {
            // The first document is the configuration, as yaml.v2 reads it.
            Event::DocumentEnd => self.done = true,
            Event::Alias(id) => self.alias(id, line),
            Event::Scalar(value, style, anchor, _) => {
                let plain = style == TScalarStyle::Plain;
                let null = plain && matches!(value.as_str(), "" | "~" | "null" | "Null" | "NULL");
                let merge_key = plain && value == "<<";
                let kind = if null {
                    Kind::Null
                } else {
                    Kind::Scalar(value)
                };
                self.push(Node { line, kind }, anchor, merge_key);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.fail(line, "nested too deeply (at most 64 levels)");
                }
                if matches!(event, Event::SequenceStart(..)) {
                    self.stack.push(Open::Seq {
                        line,
                        anchor,
                        items: Vec::new(),
                    });
                } else {
                    self.stack.push(Open::Map {
                        line,
                        anchor,
                        entries: Vec::new(),
                        key: None,
                        merges: Vec::new(),
                        merge_key: false,
                    });
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Open::Seq {
                        line,
                        anchor,
                        items,
                    }) => (
                        Node {
                            line,
                            kind: Kind::Seq(items),
                        },
                        anchor,
                    ),
                    Some(Open::Map {
                        line,
                        anchor,
                        entries,
                        merges,
                        ..
                    }) => {
                        let entries = if merges.is_empty() {
                            entries
                        } else {
                            match merged(entries, &merges) {
                                Ok(entries) => entries,
                                Err(error) => return self.fail(error.line, &error.message),
                            }
                        };
                        (
                            Node {
                                line,
                                kind: Kind::Map(entries),
                            },
                            anchor,
                        )
                    }
                    None => return self.fail(line, "unbalanced document"),
                };
                self.push(node, anchor, false);
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart => {}
        }
    }
}

/// Parse `text`'s first document; an empty file is `Null`.
///
/// The events are pulled one at a time, not through `Parser::load`: `load`
/// recurses once per level of nesting, so a file nested a hundred thousand
/// levels deep (`- - - … x`, a few hundred kilobytes) would overflow the
/// stack and abort the process (a reload included) before the builder could
/// refuse it at [`MAX_DEPTH`]. Pulled here, the parser's own state machine
/// keeps its stack on the heap, and parsing stops at the first error, or at
/// the end of the first document (what follows is not read, as yaml.v2 does
/// not read it).
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|error| SyntaxError {
            line: error.marker().line(),
            message: error.info().to_string(),
        })?;
        let end = event == Event::StreamEnd;
        builder.on_event(event, mark);
        if end || builder.done || builder.error.is_some() {
            break;
        }
    }
    if let Some(error) = builder.error {
        return Err(error);
    }
    Ok(builder.root.unwrap_or(Node {
        line: 1,
        kind: Kind::Null,
    }))
}
