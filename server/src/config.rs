//! envoyproxy/ratelimit's YAML configuration, extended with `algorithm` and
//! `burst`, loaded into a [`Config`]: the domains' descriptor trees, each
//! limit with its state from a [`Backend`].
//!
//! ```yaml
//! domain: messaging
//! descriptors:
//!   - key: message_type
//!     value: marketing
//!     descriptors:
//!       - key: to_number          # no value: a limit per distinct number
//!         rate_limit:
//!           unit: day
//!           requests_per_unit: 5
//!   - key: to_number
//!     rate_limit:
//!       unit: second
//!       requests_per_unit: 10
//!       algorithm: token_bucket   # the extension: fixed_window (default),
//!       burst: 20                 # sliding_window, token_bucket, gcra
//! ```
//!
//! A configuration error names the file and line and what to change.

use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::backend::{AlgorithmKind, Backend, LimitSpec, LimitState, Unit};
use crate::yaml::{self, Kind, Node};

/// Why a configuration could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file or directory could not be read.
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// A file's content is wrong at `line`.
    At {
        /// The file.
        file: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong, and what to change.
        message: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, message } => write!(f, "{path}: {message}"),
            ConfigError::At {
                file,
                line,
                message,
            } => write!(f, "{file}:{line}: {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A configured limit: what the descriptor's `rate_limit` says, and its
/// state.
#[derive(Debug)]
pub struct Rule {
    /// `domain.key_value.key…`, as envoyproxy/ratelimit names it in its stats.
    pub full_key: String,
    /// The `descriptor` label of its metrics series: the full key, or for a
    /// request's `limit` override `domain.limit_override`, one series per
    /// domain whatever quotas requests name (a label never takes a value
    /// from a request).
    pub series: String,
    /// `rate_limit.name`, the name `replaces` refers to.
    pub name: Option<String>,
    /// `requests_per_unit` (0 with `unlimited`).
    pub requests_per_unit: u32,
    /// `unit` (`None` with `unlimited`).
    pub unit: Option<Unit>,
    /// `unlimited: true`: always OK, never counted.
    pub unlimited: bool,
    /// `shadow_mode: true`: decided and counted, but answered OK.
    pub shadow_mode: bool,
    /// Names of the limits this one replaces in a request where both match.
    pub replaces: Vec<String>,
    /// `detailed_metric`: `/metrics` keeps series per descriptor value (a
    /// bounded number: [`metrics`](crate::metrics)).
    pub detailed_metric: bool,
    /// The limit's state; `None` for `unlimited` and for a limit of 0.
    pub state: Option<Arc<dyn LimitState>>,
}

/// One level of a descriptor tree, as envoyproxy/ratelimit keeps it: each
/// descriptor under its composite key, `key` or `key_value`.
#[derive(Debug, Default)]
struct Level {
    /// Composite key → node.
    nodes: HashMap<String, Tree>,
    /// The composite keys ending in `*` (a `value`, or a `key` without one,
    /// ending in `*`), in the configuration's order.
    wildcards: Vec<String>,
}

#[derive(Debug, Default)]
struct Tree {
    rule: Option<Arc<Rule>>,
    children: Level,
    /// `share_threshold: true` (on a wildcard): every value the wildcard
    /// matches counts as the wildcard itself.
    share_threshold: bool,
    /// The line of the descriptor, for an error naming its duplicate.
    line: usize,
    /// Its file, for the same (domains merged across files).
    file: String,
}

/// The limit a descriptor matches, and how its values key the limit's
/// state.
#[derive(Debug)]
pub struct Matched<'a> {
    /// The limit.
    pub rule: &'a Arc<Rule>,
    /// `(entry, pattern)`: the entries matched by a wildcard with
    /// `share_threshold: true`, each counted under the wildcard's value
    /// (`foo*`) instead of its own, so that every value it matches shares
    /// one count.
    pub shared: Vec<(usize, &'a str)>,
    /// The entries matched by a wildcard: their keys may differ from one
    /// request to the next (`key: user*` matches `user_id` and `userx`;
    /// `value: ba*` under `key: foo` matches the key `foo_bar` too), so
    /// the limit's key holds them, as envoyproxy/ratelimit's does.
    pub wild: Vec<usize>,
}

/// How a configuration's files are read together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Files that name one domain add their descriptors to it (in file
    /// name order), as envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true`
    /// does; a descriptor of one composite key in two of them is still an
    /// error. Off (the default): a domain in two files is an error.
    pub merge_domains: bool,
}

impl LoadOptions {
    /// The options with [`merge_domains`](LoadOptions::merge_domains) set.
    #[must_use]
    pub fn merge_domains(mut self, merge: bool) -> LoadOptions {
        self.merge_domains = merge;
        self
    }
}

/// A loaded configuration: every domain's descriptors and their limits.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
}

/// The largest `requests_per_unit` a limit may have.
const MAX_REQUESTS_PER_UNIT: u64 = u32::MAX as u64;

impl Config {
    /// Load every `*.yaml` and `*.yml` file of `dir` (not its subdirectories,
    /// nor files whose name starts with a dot), in name order.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: a file that cannot be read (a symbolic link whose
    /// target is missing included), a syntax error, an unknown key, a
    /// missing or invalid field, a duplicate domain or descriptor.
    pub fn load_dir(dir: &Path, backend: &dyn Backend) -> Result<Config, ConfigError> {
        Config::from_files(&read_dir(dir)?, backend)
    }

    /// [`load_dir`](Config::load_dir), with `options`.
    ///
    /// # Errors
    ///
    /// As [`load_dir`](Config::load_dir).
    pub fn load_dir_with(
        dir: &Path,
        backend: &dyn Backend,
        options: LoadOptions,
    ) -> Result<Config, ConfigError> {
        Config::from_files_with(&read_dir(dir)?, backend, options)
    }

    /// Load `(file name, content)` pairs.
    ///
    /// # Errors
    ///
    /// As [`load_dir`](Config::load_dir), without the file system's.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile_server::backend::{InProcess, Unit};
    /// use turnstile_server::config::{Config, ConfigError};
    ///
    /// let yaml = "\
    /// domain: messaging
    /// descriptors:
    ///   - key: to_number
    ///     rate_limit:
    ///       unit: second
    ///       requests_per_unit: 10
    /// ";
    /// let backend = InProcess::default();
    /// let files = [("messaging.yaml".to_string(), yaml.to_string())];
    /// let config = Config::from_files(&files, &backend)?;
    /// assert_eq!(config.domains().collect::<Vec<_>>(), ["messaging"]);
    /// let rule = config.lookup("messaging", [("to_number", "+15550100")]).expect("a limit");
    /// assert_eq!(rule.full_key, "messaging.to_number");
    /// assert_eq!((rule.requests_per_unit, rule.unit), (10, Some(Unit::Second)));
    ///
    /// // An error names the file and the line, and says what to change.
    /// let files = [("messaging.yaml".to_string(), yaml.replace("second", "fortnight"))];
    /// let error = Config::from_files(&files, &backend).unwrap_err();
    /// assert!(matches!(&error, ConfigError::At { file, line: 5, .. } if file == "messaging.yaml"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "messaging.yaml:5: invalid unit 'fortnight': use second, minute, hour, day, week, month or year"
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn from_files(
        files: &[(String, String)],
        backend: &dyn Backend,
    ) -> Result<Config, ConfigError> {
        Config::from_files_with(files, backend, LoadOptions::default())
    }

    /// [`from_files`](Config::from_files), with `options`.
    ///
    /// # Errors
    ///
    /// As [`from_files`](Config::from_files).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::config::{Config, LoadOptions};
    ///
    /// let files = [
    ///     ("a.yaml".to_string(), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n".to_string()),
    ///     ("b.yaml".to_string(), "domain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 9}\n".to_string()),
    /// ];
    /// let backend = InProcess::default();
    /// // One domain in two files: an error, unless merged.
    /// assert!(Config::from_files(&files, &backend).is_err());
    /// let merged = LoadOptions::default().merge_domains(true);
    /// let config = Config::from_files_with(&files, &backend, merged)?;
    /// assert_eq!(config.lookup("api", [("user", "u")]).map(|r| r.requests_per_unit), Some(5));
    /// assert_eq!(config.lookup("api", [("ip", "i")]).map(|r| r.requests_per_unit), Some(9));
    /// # Ok::<(), turnstile_server::config::ConfigError>(())
    /// ```
    pub fn from_files_with(
        files: &[(String, String)],
        backend: &dyn Backend,
        options: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut first_seen: HashMap<String, (String, usize)> = HashMap::new();
        // Across files: domain `api` with `v1` above `user` and domain
        // `api.v1` with `user` both name `api.v1.user`.
        let names = RefCell::new(HashMap::new());
        for (file, text) in files {
            let at = |line: usize, message: String| ConfigError::At {
                file: file.clone(),
                line,
                message,
            };
            // A byte order mark, as editors on Windows save one: skipped, as
            // gopkg.in/yaml.v2 skips it.
            let text = text.strip_prefix('\u{feff}').unwrap_or(text);
            let root = yaml::parse(text).map_err(|e| at(e.line, e.message))?;
            let fields = mapping(&root, &["domain", "descriptors"]).map_err(|(l, m)| at(l, m))?;
            let domain = match fields.get("domain") {
                Some(node) => scalar(node, "domain").map_err(|(l, m)| at(l, m))?,
                None => return Err(at(root.line, "the file needs a `domain`".to_string())),
            };
            if domain.is_empty() {
                return Err(at(root.line, "`domain` must not be empty".to_string()));
            }
            if let Some((other, line)) = first_seen.get(&domain)
                && !options.merge_domains
            {
                return Err(at(
                    root.line,
                    format!(
                        "duplicate domain '{domain}' (first in {other}:{line}): give each file its own domain, \
                         or merge them with --merge-domain-config (MERGE_DOMAIN_CONFIG=true)"
                    ),
                ));
            }
            first_seen
                .entry(domain.clone())
                .or_insert_with(|| (file.clone(), root.line));
            // Merged: this file's descriptors join the domain's.
            let mut level = config.domains.remove(&domain).unwrap_or_default();
            if let Some(descriptors) = fields.get("descriptors") {
                let loader = Loader {
                    backend,
                    file,
                    names: &names,
                };
                loader
                    .level(&mut level, descriptors, &domain)
                    .map_err(|(l, m)| at(l, m))?;
            }
            config.domains.insert(domain, level);
        }
        Ok(config)
    }

    /// The domains configured.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// The limit for a descriptor's entries `(key, value)` in `domain`, as
    /// envoyproxy/ratelimit matches it: each entry walks one level of the
    /// tree, trying the composite `key_value` first, then each composite key
    /// ending in `*` (in order) that prefixes it, then `key` alone; a limit
    /// applies only to a descriptor with exactly as many entries as the
    /// limit is deep.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::config::Config;
    ///
    /// let yaml = "\
    /// domain: messaging
    /// descriptors:
    ///   - key: message_type
    ///     value: marketing
    ///     descriptors:
    ///       - key: to_number
    ///         rate_limit: {unit: day, requests_per_unit: 5}
    ///   - key: to_number
    ///     rate_limit: {unit: second, requests_per_unit: 10}
    /// ";
    /// let config = Config::from_files(&[("m.yaml".to_string(), yaml.to_string())], &InProcess::default())?;
    /// let limit = |entries: &[(&'static str, &'static str)]| {
    ///     let rule = config.lookup("messaging", entries.iter().copied());
    ///     rule.map(|rule| rule.requests_per_unit)
    /// };
    /// assert_eq!(limit(&[("to_number", "1")]), Some(10));
    /// assert_eq!(limit(&[("message_type", "marketing"), ("to_number", "1")]), Some(5));
    /// // No limit at the first level of that branch, and no other value there.
    /// assert_eq!(limit(&[("message_type", "marketing")]), None);
    /// assert_eq!(limit(&[("message_type", "alerts"), ("to_number", "1")]), None);
    /// // Deeper than any limit.
    /// assert_eq!(limit(&[("to_number", "1"), ("from_number", "2")]), None);
    /// # Ok::<(), turnstile_server::config::ConfigError>(())
    /// ```
    pub fn lookup<'a, I>(&self, domain: &str, entries: I) -> Option<&Arc<Rule>>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
        I::IntoIter: ExactSizeIterator,
    {
        self.matched(domain, entries).map(|m| m.rule)
    }

    /// As [`lookup`](Config::lookup), with the entries whose value a
    /// `share_threshold` wildcard replaces in the limit's key.
    pub fn matched<'a, I>(&self, domain: &str, entries: I) -> Option<Matched<'_>>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
        I::IntoIter: ExactSizeIterator,
    {
        let mut level = self.domains.get(domain)?;
        let entries = entries.into_iter();
        let last = entries.len().checked_sub(1)?;
        let mut found = None;
        let mut shared = Vec::new();
        let mut wild = Vec::new();
        let mut composite = String::new();
        for (i, (key, value)) in entries.enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let tree = match level.nodes.get(&composite) {
                Some(tree) => tree,
                None => {
                    let wildcard = level.wildcards.iter().find(|pattern| {
                        let prefix = pattern.strip_suffix('*').unwrap_or(pattern);
                        composite.starts_with(prefix)
                    });
                    match wildcard.and_then(|w| Some((w, level.nodes.get(w)?))) {
                        Some((pattern, tree)) => {
                            wild.push(i);
                            if tree.share_threshold {
                                // The value part of `key_value*`.
                                let value = pattern
                                    .strip_prefix(key)
                                    .and_then(|rest| rest.strip_prefix('_'))
                                    .unwrap_or(pattern);
                                shared.push((i, value));
                            }
                            tree
                        }
                        None => level.nodes.get(key)?,
                    }
                }
            };
            if i == last {
                found = tree.rule.as_ref();
            }
            level = &tree.children;
        }
        found.map(|rule| Matched { rule, shared, wild })
    }
}

/// Keys a descriptor may have.
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];
/// Keys a `rate_limit` may have.
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
];

type Located<T> = Result<T, (usize, String)>;

/// A mapping's fields by name, every key checked against `allowed`.
fn mapping<'a>(node: &'a Node, allowed: &[&str]) -> Located<HashMap<&'a str, &'a Node>> {
    let Kind::Map(entries) = &node.kind else {
        return Err((
            node.line,
            format!("expected a mapping, found {}", node.kind.describe()),
        ));
    };
    let mut fields = HashMap::new();
    for (key, value) in entries {
        let Kind::Scalar(name) = &key.kind else {
            return Err((key.line, "a key must be a string".to_string()));
        };
        if !allowed.contains(&name.as_str()) {
            // A key of the format out of place: envoyproxy/ratelimit checks
            // names against one list for every level and ignores one out of
            // place, so a file moved from it may hold one that never had an
            // effect there. Say where it belongs.
            let belongs = [
                (&["domain"][..], "at the top of the file"),
                (DESCRIPTOR_KEYS, "in a descriptor"),
                (RATE_LIMIT_KEYS, "in a descriptor's `rate_limit`"),
            ]
            .into_iter()
            .filter(|(keys, _)| *keys != allowed && keys.contains(&name.as_str()))
            .map(|(_, place)| place)
            .next();
            let shown = name.escape_debug();
            return Err((
                key.line,
                match belongs {
                    Some(place) => format!(
                        "'{shown}' belongs {place}, not here (envoyproxy/ratelimit ignores it \
                         here: it had no effect); expected one of {}",
                        allowed.join(", ")
                    ),
                    None => format!(
                        "unknown key '{shown}': expected one of {}",
                        allowed.join(", ")
                    ),
                },
            ));
        }
        if fields.insert(name.as_str(), value).is_some() {
            return Err((key.line, format!("'{name}' is given twice")));
        }
    }
    Ok(fields)
}

fn scalar(node: &Node, what: &str) -> Located<String> {
    match &node.kind {
        Kind::Scalar(text) => Ok(text.clone()),
        Kind::Null => Ok(String::new()),
        other => Err((
            node.line,
            format!("`{what}` must be a string, found {}", other.describe()),
        )),
    }
}

/// A boolean as YAML 1.1 spells one (gopkg.in/yaml.v2, envoyproxy/ratelimit's
/// parser): `true`, `yes`, `on`, `y` and `false`, `no`, `off`, `n`, each
/// lower case, capitalised or upper case; nothing is false.
fn boolean(node: &Node, what: &str) -> Located<bool> {
    const TRUE: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
    ];
    const FALSE: &[&str] = &[
        "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
    ];
    match &node.kind {
        Kind::Scalar(text) if TRUE.contains(&text.as_str()) => Ok(true),
        Kind::Scalar(text) if FALSE.contains(&text.as_str()) => Ok(false),
        Kind::Null => Ok(false),
        _ => Err((
            node.line,
            format!("`{what}` must be true or false (or yes/no, on/off)"),
        )),
    }
}

/// An integer as YAML 1.1 reads one (gopkg.in/yaml.v2): an optional sign,
/// `_` anywhere after the first character, and `0x` (hex), `0o` or a
/// leading `0` (octal), `0b` (binary) or decimal digits.
fn yaml_int(text: &str) -> Option<i128> {
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
        return None;
    }
    let plain: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match plain.as_bytes().first() {
        Some(b'-') => (true, &plain[1..]),
        Some(b'+') => (false, &plain[1..]),
        _ => (false, plain.as_str()),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, digits) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    // `from_str_radix` takes a sign of its own: refuse a second one.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    // Over 128 bits: far out of any bound, refused as such.
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

fn number(node: &Node, what: &str, max: u64) -> Located<u64> {
    match &node.kind {
        Kind::Scalar(text) => match yaml_int(text).map(u64::try_from) {
            Some(Ok(n)) if n <= max => Ok(n),
            _ => Err((
                node.line,
                format!("`{what}` must be a whole number from 0 to {max}, found '{text}'"),
            )),
        },
        // Nothing: the field's zero, as envoyproxy/ratelimit reads it.
        Kind::Null => Ok(0),
        other => Err((
            node.line,
            format!("`{what}` must be a number, found {}", other.describe()),
        )),
    }
}

struct Loader<'b> {
    backend: &'b dyn Backend,
    /// Each limit's name (`domain.key_value...`), with the line of its
    /// descriptor. The name is a limit's identity beyond the file: its
    /// Redis keys, its state kept across a reload, its metrics series. Two
    /// different descriptors can spell one name (`key: a, value: b_c` and
    /// `key: a_b, value: c`; `key: a.b` and `a` above `b`; domain `a` with
    /// `b` above `c` and domain `a.b` with `c`), and would then share one
    /// state: refused instead. Kept across the configuration's files, with
    /// the file.
    names: &'b RefCell<HashMap<String, (String, usize)>>,
    /// The file being loaded.
    file: &'b str,
}

impl Loader<'_> {
    fn level(&self, level: &mut Level, node: &Node, parent: &str) -> Located<()> {
        let items = match &node.kind {
            Kind::Seq(items) => items.as_slice(),
            Kind::Null => &[],
            other => {
                return Err((
                    node.line,
                    format!("`descriptors` must be a list, found {}", other.describe()),
                ));
            }
        };
        for item in items {
            let fields = mapping(item, DESCRIPTOR_KEYS)?;
            let key = match fields.get("key") {
                Some(node) => scalar(node, "key")?,
                None => String::new(),
            };
            if key.is_empty() {
                return Err((item.line, "descriptor has an empty `key`".to_string()));
            }
            let value = match fields.get("value") {
                Some(node) => scalar(node, "value")?,
                None => String::new(),
            };
            let path = if value.is_empty() {
                format!("{parent}.{key}")
            } else {
                format!("{parent}.{key}_{value}")
            };
            let shadow_mode = match fields.get("shadow_mode") {
                Some(node) => boolean(node, "shadow_mode")?,
                None => false,
            };
            let detailed_metric = match fields.get("detailed_metric") {
                Some(node) => boolean(node, "detailed_metric")?,
                None => false,
            };
            // envoyproxy/ratelimit names a metric with the request's value
            // where this is set; the series here are per limit (and per
            // request value with `detailed_metric`): read, and not used.
            if let Some(node) = fields.get("value_to_metric") {
                boolean(node, "value_to_metric")?;
            }
            // As envoyproxy/ratelimit keys its descriptors: `key`, or
            // `key_value`.
            let composite = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let share_threshold = match fields.get("share_threshold") {
                Some(node) => boolean(node, "share_threshold")?,
                None => false,
            };
            if share_threshold && !composite.ends_with('*') {
                return Err((
                    fields.get("share_threshold").map_or(item.line, |n| n.line),
                    format!(
                        "`share_threshold` applies to a wildcard (a value, or a key without one, ending in `*`), not to '{composite}'"
                    ),
                ));
            }
            let mut tree = Tree {
                share_threshold,
                line: item.line,
                file: self.file.to_owned(),
                ..Tree::default()
            };
            if let Some(node) = fields.get("rate_limit")
                && !matches!(node.kind, Kind::Null)
            {
                // An empty `rate_limit:` is no limit, as envoyproxy/ratelimit
                // reads it.
                tree.rule = Some(Arc::new(self.rule(
                    node,
                    &path,
                    shadow_mode,
                    detailed_metric,
                )?));
            }
            if let Some(children) = fields.get("descriptors") {
                self.level(&mut tree.children, children, &path)?;
            }
            let named = tree.rule.is_some();
            match level.nodes.entry(composite.clone()) {
                MapEntry::Occupied(first) => {
                    let first = first.get();
                    let at = if first.file == self.file {
                        format!("line {}", first.line)
                    } else {
                        format!("{}:{}", first.file, first.line)
                    };
                    return Err((
                        item.line,
                        format!(
                            "duplicate descriptor composite key '{path}' (first at {at}): a descriptor is known by its `key` and `value` joined with `_`, as envoyproxy/ratelimit keys it, so merge the two or rename one"
                        ),
                    ));
                }
                MapEntry::Vacant(slot) => {
                    slot.insert(tree);
                }
            }
            if composite.ends_with('*') {
                level.wildcards.push(composite);
            }
            if named
                && let Some((file, first)) = self
                    .names
                    .borrow_mut()
                    .insert(path.clone(), (self.file.to_owned(), item.line))
            {
                let at = if file == self.file {
                    format!("line {first}")
                } else {
                    format!("{file}:{first}")
                };
                return Err((
                    item.line,
                    format!(
                        "the limit '{path}' has the name of the limit at {at}: a limit's name keys its state (its Redis keys, its metrics series), so rename a key or value of one"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn rule(
        &self,
        node: &Node,
        path: &str,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Located<Rule> {
        let fields = mapping(node, RATE_LIMIT_KEYS)?;
        let unlimited = match fields.get("unlimited") {
            Some(node) => boolean(node, "unlimited")?,
            None => false,
        };
        let name = match fields.get("name") {
            Some(node) => Some(scalar(node, "name")?).filter(|n| !n.is_empty()),
            None => None,
        };
        let mut replaces = Vec::new();
        if let Some(list) = fields.get("replaces") {
            let Kind::Seq(items) = &list.kind else {
                return Err((
                    list.line,
                    "`replaces` must be a list of `- name: …`".to_string(),
                ));
            };
            for item in items {
                let entry = mapping(item, &["name"])?;
                let replaced = match entry.get("name") {
                    Some(node) => scalar(node, "name")?,
                    None => String::new(),
                };
                if replaced.is_empty() {
                    return Err((item.line, "a `replaces` entry needs a `name`".to_string()));
                }
                if name.as_deref() == Some(replaced.as_str()) {
                    return Err((
                        item.line,
                        format!("a limit cannot replace itself ('{replaced}')"),
                    ));
                }
                replaces.push(replaced);
            }
        }
        let unit = match fields.get("unit") {
            Some(node) => {
                let text = scalar(node, "unit")?;
                match Unit::parse(&text) {
                    Some(unit) => Some((unit, node.line)),
                    // envoyproxy/ratelimit reads the unit of an unlimited
                    // limit only to refuse a valid one.
                    None if unlimited => None,
                    None => {
                        return Err((
                            node.line,
                            format!(
                                "invalid unit '{text}': use second, minute, hour, day, week, month or year"
                            ),
                        ));
                    }
                }
            }
            None => None,
        };
        let requests_per_unit = match fields.get("requests_per_unit") {
            Some(node) => u32::try_from(number(node, "requests_per_unit", MAX_REQUESTS_PER_UNIT)?)
                .unwrap_or(u32::MAX),
            None => 0,
        };
        let rule = |requests_per_unit, unit, state| Rule {
            full_key: path.to_string(),
            series: path.to_string(),
            name: name.clone(),
            requests_per_unit,
            unit,
            unlimited,
            shadow_mode,
            replaces: replaces.clone(),
            detailed_metric,
            state,
        };
        if unlimited {
            if let Some((_, line)) = unit {
                return Err((line, "an unlimited limit takes no `unit`".to_string()));
            }
            // `requests_per_unit` is read and ignored, as envoyproxy/ratelimit
            // does; this service's own keys have no meaning here.
            for field in ["algorithm", "burst"] {
                if let Some(given) = fields.get(field) {
                    return Err((given.line, format!("an unlimited limit takes no `{field}`")));
                }
            }
            return Ok(rule(0, None, None));
        }
        let unit = unit.map(|(unit, _)| unit);
        let Some(unit) = unit else {
            return Err((
                node.line,
                "`rate_limit` needs a `unit` (second, minute, hour, day, week, month or year) or `unlimited: true`"
                    .to_string(),
            ));
        };
        let algorithm = match fields.get("algorithm") {
            Some(node) => {
                let text = scalar(node, "algorithm")?;
                AlgorithmKind::parse(&text).ok_or_else(|| {
                    (node.line, format!("unknown algorithm '{text}': use fixed_window, sliding_window, token_bucket or gcra"))
                })?
            }
            None => AlgorithmKind::default(),
        };
        let burst = match fields.get("burst") {
            Some(node) => Some(
                u32::try_from(number(node, "burst", MAX_REQUESTS_PER_UNIT)?).unwrap_or(u32::MAX),
            ),
            None => None,
        };
        if let Some(given) = fields.get("burst") {
            if burst == Some(0) {
                return Err((given.line, "`burst` must be at least 1".to_string()));
            }
            if matches!(
                algorithm,
                AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
            ) {
                return Err((
                    given.line,
                    "`burst` applies to `token_bucket` and `gcra`; a window's burst is its `requests_per_unit`".to_string(),
                ));
            }
        }
        if requests_per_unit == 0 {
            // envoyproxy/ratelimit's way to deny everything: no state needed.
            return Ok(rule(0, Some(unit), None));
        }
        let spec = LimitSpec {
            full_key: path.to_string(),
            requests_per_unit,
            unit,
            algorithm,
            burst,
        };
        let state = self
            .backend
            .limit(&spec)
            .map_err(|message| (node.line, message))?;
        Ok(rule(requests_per_unit, Some(unit), Some(state)))
    }
}

/// The YAML files of `dir` (`.yaml`/`.yml`, not hidden), by name, with their
/// text: what [`Config::load_dir`] and the reloader read. A directory so
/// named is passed over; a symbolic link so named whose target cannot be
/// read (dangling, a loop) is an error, as a file that cannot be read is.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let io = |path: &Path, error: std::io::Error| ConfigError::Io {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if !yaml || name.starts_with('.') {
            continue;
        }
        if path.is_file() {
            paths.push(path);
        } else if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            // A link whose target cannot be read is a file meant to be read,
            // as one whose permissions refuse it is: an error, not a
            // configuration loaded without its limits.
            if let Err(error) = std::fs::metadata(&path) {
                let target = std::fs::read_link(&path)
                    .map(|t| format!(" to {}", t.display()))
                    .unwrap_or_default();
                return Err(ConfigError::Io {
                    path: path.display().to_string(),
                    message: format!(
                        "a symbolic link{target} whose target cannot be read ({error}): restore the target or remove the link"
                    ),
                });
            }
        }
    }
    paths.sort();
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
        files.push((path.display().to_string(), text));
    }
    Ok(files)
}
