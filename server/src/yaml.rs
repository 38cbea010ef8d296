//! A YAML document as a tree whose every node knows its line, for
//! configuration errors that say where they are.
//!
//! yaml-rust2's event parser reports a position with each event; this module
//! builds a small tree from those events (mappings keep their order, scalars
//! stay strings until the configuration reads them). serde_yaml's errors carry
//! a location only for syntax and type errors, and its `Value` none at all:
//! a semantic error (a duplicate descriptor, an unknown unit) could not say
//! where it is. Anchors and aliases are refused, so a document cannot expand
//! beyond its size.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The deepest nesting accepted, in mappings and sequences.
pub(crate) const MAX_DEPTH: usize = 64;

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

/// A container being built.
enum Open {
    Seq(usize, Vec<Node>),
    Map(usize, Vec<(Node, Node)>, Option<Node>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    error: Option<SyntaxError>,
    documents: usize,
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

    fn push(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Open::Seq(_, items)) => items.push(node),
            Some(Open::Map(_, entries, key)) => match key.take() {
                None => *key = Some(node),
                Some(k) => entries.push((k, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let line = mark.line();
        match event {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.fail(line, "a configuration file holds one YAML document");
                }
            }
            Event::Alias(_) => self.fail(line, "anchors and aliases are not supported"),
            Event::Scalar(value, style, anchor, _) => {
                if anchor != 0 {
                    return self.fail(line, "anchors and aliases are not supported");
                }
                let null = style == TScalarStyle::Plain
                    && matches!(value.as_str(), "" | "~" | "null" | "Null" | "NULL");
                let kind = if null {
                    Kind::Null
                } else {
                    Kind::Scalar(value)
                };
                self.push(Node { line, kind });
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if anchor != 0 {
                    return self.fail(line, "anchors and aliases are not supported");
                }
                if self.stack.len() >= MAX_DEPTH {
                    return self.fail(line, "nested too deeply (at most 64 levels)");
                }
                if matches!(event, Event::SequenceStart(..)) {
                    self.stack.push(Open::Seq(line, Vec::new()));
                } else {
                    self.stack.push(Open::Map(line, Vec::new(), None));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Open::Seq(line, items)) => Node {
                        line,
                        kind: Kind::Seq(items),
                    },
                    Some(Open::Map(line, entries, _)) => Node {
                        line,
                        kind: Kind::Map(entries),
                    },
                    None => return self.fail(line, "unbalanced document"),
                };
                self.push(node);
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

/// Parse `text`, one document; an empty file is `Null`.
///
/// The events are pulled one at a time, not through `Parser::load`: `load`
/// recurses once per level of nesting, so a file nested a hundred thousand
/// levels deep (`- - - … x`, a few hundred kilobytes) would overflow the
/// stack and abort the process (a reload included) before the builder could
/// refuse it at [`MAX_DEPTH`]. Pulled here, the parser's own state machine
/// keeps its stack on the heap, and parsing stops at the first error.
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
        if end || builder.error.is_some() {
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
