//! Hot reload: the configuration directory is read again when one of its
//! files changes (polled, about once a second) or on `SIGHUP`
//! ([`Reloader::watch`]), and swapped into the service whole.
//!
//! - **A broken configuration changes nothing**: the error (file, line, what
//!   to change) goes to stderr, is counted
//!   ([`Metrics`](crate::metrics::Metrics)), and the old configuration goes
//!   on deciding. It is reported once per broken version of the directory,
//!   not once per poll.
//! - **An unchanged limit keeps its state**: a limit whose domain, descriptor
//!   path, algorithm and quota (`requests_per_unit`, `unit`, `burst`) are the
//!   same is served by the same [`LimitState`] object, every key's count with
//!   it.
//! - **A changed quota** (`requests_per_unit`, `unit`, `burst`) keeps every
//!   key's state, whatever the algorithm, converted by turnstile's live form
//!   of it: [`LiveTokenBucket`](turnstile::LiveTokenBucket),
//!   [`LiveGcra`](turnstile::LiveGcra),
//!   [`LiveFixedWindow`](turnstile::LiveFixedWindow),
//!   [`LiveSlidingWindow`](turnstile::LiveSlidingWindow), each with its
//!   stated rule: never more available than the new quota allows, permits
//!   created only where a key was full or idle (so a key that had used up
//!   its allowance before the reload is still refused after it, whether the
//!   quota was lowered or raised, until its bucket refills or its window
//!   passes under the new quota). A quota the live form cannot take (a
//!   limit above 65,535, its ceiling) starts that limit fresh. That is the
//!   in-process backend: with Redis, the new quota reads the state Redis
//!   holds, never above the new quota (a window's count counts against the
//!   new limit, so raising it lets a key that used up the old one spend the
//!   difference in the same window; leased mode's leases under the old
//!   quota are dropped).
//! - **A changed algorithm** starts the limit fresh: every key at its full
//!   allowance (one algorithm's state says nothing about another's).
//! - **A limit dropped and brought back keeps its state**: a limit that a
//!   load drops (deleted, set to `requests_per_unit: 0`, its file removed or
//!   read half written, the directory emptied) is *retired*, its state kept
//!   aside, and a later load that brings the same limit back (domain,
//!   descriptor path and algorithm) is handed that state as an unchanged
//!   limit is, or converted as a changed quota is. An edit that drops a
//!   limit for one load does not hand its keys a fresh allowance. Bounds: a
//!   retired state is dropped once it holds nothing a fresh one would not
//!   ([`LimitState::reclaimable`]: in process, every key back at its whole
//!   allowance), looked at on every load and every poll; and at most
//!   [`DEFAULT_MAX_RETIRED`] (10,000) limits are kept retired
//!   ([`Reloader::with_max_retired`]), those retired longest ago forgotten
//!   first (each holds at most the keys a limit in force may, `--max-keys`);
//!   a limit forgotten starts fresh if it comes back.
//!
//! Polling rather than file-system events: a configuration directory holds a
//! few small files, reading them once a second costs next to nothing, and it
//! sees every way a file can change (an editor's rename, a Kubernetes
//! ConfigMap's symlink swap, a network file system) with no platform code.
//! The poll compares the files' names and contents, not their times, so an
//! edit within the file system's time resolution is not missed.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::{Backend, LimitSpec, LimitState};
use crate::config::{Config, ConfigError, LoadOptions, read_dir};
use crate::service::RateLimitService;

/// How often [`Reloader::watch`] polls the directory by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// How many limits that loads dropped a [`Reloader`] keeps the state of by
/// default ([`Reloader::with_max_retired`]).
pub const DEFAULT_MAX_RETIRED: usize = 10_000;

/// The states handed out by the last configuration that loaded, by full key.
type Issued = HashMap<String, (LimitSpec, Arc<dyn LimitState>)>;

/// Loads a configuration directory, and loads it again when it changes,
/// keeping the state of the limits that stay, and of the limits that go, for
/// a later load that brings them back (see the [module](self)).
#[derive(Debug)]
pub struct Reloader {
    dir: PathBuf,
    backend: Arc<dyn Backend>,
    options: LoadOptions,
    max_retired: usize,
    last: Mutex<Kept>,
}

/// What a [`Reloader`] keeps from one load to the next.
#[derive(Debug, Default)]
struct Kept {
    /// The last load's states: those of the configuration it made.
    issued: Issued,
    /// The states of limits that loads dropped, none of them in `issued`.
    retired: Retired,
    /// The fingerprint of the last version of the directory tried (loaded
    /// or refused).
    tried: Option<u64>,
}

impl Kept {
    /// A load made `issued`, to be put in force: the limits it brought back
    /// leave the retired ones, and the limits of the previous load it
    /// dropped join them (oldest dropped first past `max_retired`), unless a
    /// fresh state would do as well.
    fn settle(&mut self, issued: Issued, max_retired: usize) {
        let previous = std::mem::replace(&mut self.issued, issued);
        if !self.retired.is_empty() {
            for key in self.issued.keys() {
                self.retired.remove(key);
            }
        }
        let mut dropped: Vec<_> = previous
            .into_iter()
            .filter(|(key, _)| !self.issued.contains_key(key))
            .collect();
        // One load's in the order of their keys: which of them goes first
        // past the bound does not depend on a hash map's order.
        dropped.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, (spec, state)) in dropped {
            if !state.reclaimable() {
                self.retired.insert(key, spec, state);
            }
        }
        self.retired.truncate(max_retired);
    }
}

/// The states of limits that a load dropped (a limit deleted, set to
/// `requests_per_unit: 0`, its file gone or caught half written), kept so
/// that a later load that brings the same limit back hands its keys' counts
/// back rather than a fresh allowance.
#[derive(Debug, Default)]
struct Retired {
    /// By full key: when retired (a sequence number), the limit, its state.
    limits: HashMap<String, (u64, LimitSpec, Arc<dyn LimitState>)>,
    /// The full keys by when they were retired, oldest first.
    order: BTreeMap<u64, String>,
    /// The next sequence number.
    next: u64,
}

impl Retired {
    fn len(&self) -> usize {
        self.limits.len()
    }

    fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    fn get(&self, full_key: &str) -> Option<(&LimitSpec, &Arc<dyn LimitState>)> {
        self.limits
            .get(full_key)
            .map(|(_, spec, state)| (spec, state))
    }

    fn insert(&mut self, full_key: String, spec: LimitSpec, state: Arc<dyn LimitState>) {
        let at = self.next;
        self.next += 1;
        if let Some((before, _, _)) = self.limits.insert(full_key.clone(), (at, spec, state)) {
            self.order.remove(&before);
        }
        self.order.insert(at, full_key);
    }

    fn remove(&mut self, full_key: &str) {
        if let Some((at, _, _)) = self.limits.remove(full_key) {
            self.order.remove(&at);
        }
    }

    /// Drop the states that hold nothing a fresh one would not
    /// ([`LimitState::reclaimable`]: every key back at its whole allowance).
    fn reclaim(&mut self) {
        let order = &mut self.order;
        self.limits.retain(|_, (at, _, state)| {
            let keep = !state.reclaimable();
            if !keep {
                order.remove(at);
            }
            keep
        });
    }

    /// Drop the oldest until at most `most` are left.
    fn truncate(&mut self, most: usize) {
        while self.limits.len() > most {
            let Some((_, full_key)) = self.order.pop_first() else {
                break;
            };
            self.limits.remove(&full_key);
        }
    }
}

/// What [`Reloader::poll`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are as they were: nothing done.
    Unchanged,
    /// A new configuration is in force.
    Loaded,
}

impl Reloader {
    /// A reloader of `dir` (its `*.yaml` and `*.yml` files, as
    /// [`Config::load_dir`] reads them), making limits with `backend`.
    pub fn new(dir: impl Into<PathBuf>, backend: Arc<dyn Backend>) -> Reloader {
        Reloader {
            dir: dir.into(),
            backend,
            options: LoadOptions::default(),
            max_retired: DEFAULT_MAX_RETIRED,
            last: Mutex::new(Kept::default()),
        }
    }

    /// Read the files with `options` (domains merged across files, say).
    #[must_use]
    pub fn with_options(mut self, options: LoadOptions) -> Reloader {
        self.options = options;
        self
    }

    /// Keep the state of at most `most` limits that loads dropped (default
    /// [`DEFAULT_MAX_RETIRED`]); past it, the ones dropped longest ago are
    /// forgotten, and start fresh if a load brings them back. 0 keeps none.
    #[must_use]
    pub fn with_max_retired(mut self, most: usize) -> Reloader {
        self.max_retired = most;
        self
    }

    /// How many limits that loads dropped this reloader holds the state of,
    /// for a later load that brings them back (see the [module](self)).
    pub fn retired(&self) -> usize {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retired
            .len()
    }

    /// Load the directory as it is now, reusing the state of every limit
    /// the last load made, or an earlier load dropped, that is unchanged
    /// (see the [module](self)).
    ///
    /// # Errors
    ///
    /// [`ConfigError`]; nothing is changed, and the same files will not be
    /// tried again by [`poll`](Reloader::poll).
    pub fn load(&self) -> Result<Config, ConfigError> {
        let files = read_dir(&self.dir)?;
        let fingerprint = fingerprint(&files);
        // A poisoned lock: a load panicked; its data is a map of states, still whole.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.tried = Some(fingerprint);
        last.retired.reclaim();
        // First pass: validate, with side effects on nothing that serves
        // (the retired states included: read, never converted or taken).
        let dry = Reusing::new(&*self.backend, &last.issued, &last.retired, false);
        let config = Config::from_files_with(&files, &dry, self.options)?;
        let (config, issued) = if dry.wants_requota() {
            // Second pass, on the same text, which the first has accepted:
            // change the quotas of the limits that can keep their state.
            let commit = Reusing::new(&*self.backend, &last.issued, &last.retired, true);
            let config = Config::from_files_with(&files, &commit, self.options)?;
            (config, commit.into_issued())
        } else {
            (config, dry.into_issued())
        };
        last.settle(issued, self.max_retired);
        Ok(config)
    }

    /// Load the directory if its files changed since the last load tried,
    /// and put the new configuration in force in `service`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: the service keeps its configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::reload::{Reload, Reloader};
    /// use turnstile_server::service::{Bounds, RateLimitService};
    ///
    /// let dir = std::env::temp_dir().join(format!("turnstile-poll-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let file = dir.join("api.yaml");
    /// let limit = |n: u32| {
    ///     format!("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n")
    /// };
    /// std::fs::write(&file, limit(5))?;
    ///
    /// let reloader = Reloader::new(&dir, Arc::new(InProcess::default()));
    /// let service = RateLimitService::new(reloader.load()?, Bounds::default(), false);
    /// let in_force = || service.config().lookup("api", [("user", "alice")]).map(|r| r.requests_per_unit);
    /// assert_eq!(reloader.poll(&service)?, Reload::Unchanged);
    ///
    /// std::fs::write(&file, limit(10))?;
    /// assert_eq!(reloader.poll(&service)?, Reload::Loaded);
    /// assert_eq!(in_force(), Some(10));
    ///
    /// // A broken file changes nothing; it is counted, and reported once.
    /// std::fs::write(&file, "domain: api\ndescriptors: [")?;
    /// assert!(reloader.poll(&service).is_err());
    /// assert_eq!(reloader.poll(&service)?, Reload::Unchanged);
    /// assert_eq!(in_force(), Some(10));
    /// assert_eq!(service.metrics().reloads(), (1, 1));
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn poll(&self, service: &RateLimitService) -> Result<Reload, ConfigError> {
        let read = read_dir(&self.dir);
        let now = match &read {
            Ok(files) => fingerprint(files),
            // An unreadable directory is a version of its own: reported
            // and counted once, not on every poll.
            Err(error) => fingerprint(&[(String::new(), error.to_string())]),
        };
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.tried == Some(now) {
            // No load to do it: a retired limit whose keys have all refilled
            // since is dropped at the poll.
            last.retired.reclaim();
            return Ok(Reload::Unchanged);
        }
        if let Err(error) = read {
            last.tried = Some(now);
            last.retired.reclaim();
            service.metrics().reload_failed();
            return Err(error);
        }
        drop(last);
        self.reload(service)?;
        Ok(Reload::Loaded)
    }

    /// Load the directory now and put it in force in `service`, counting the
    /// reload or its error in the service's metrics.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: the service keeps its configuration.
    pub fn reload(&self, service: &RateLimitService) -> Result<(), ConfigError> {
        match self.load() {
            Ok(config) => {
                service.set_config(config);
                service.metrics().reloaded();
                Ok(())
            }
            Err(error) => {
                service.metrics().reload_failed();
                Err(error)
            }
        }
    }

    /// Poll every `every` and reload on `SIGHUP` (Unix), until `stop`
    /// completes; each reload and each error is reported on stderr.
    pub async fn watch<F>(self: Arc<Self>, service: Arc<RateLimitService>, every: Duration, stop: F)
    where
        F: std::future::Future<Output = ()>,
    {
        let report = |result: Result<Reload, ConfigError>| match result {
            Ok(Reload::Loaded) => {
                eprintln!(
                    "turnstile-server: configuration reloaded from {}",
                    self.dir.display()
                );
            }
            Ok(Reload::Unchanged) => {}
            Err(error) => eprintln!(
                "turnstile-server: configuration not reloaded (the previous one stays in force): {error}"
            ),
        };
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        tokio::pin!(stop);
        loop {
            #[cfg(unix)]
            let hup = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {
                    let (this, shared) = (Arc::clone(&self), Arc::clone(&service));
                    // File reads and limiter conversions: off the runtime's workers.
                    let result = tokio::task::spawn_blocking(move || this.poll(&shared)).await;
                    match result {
                        Ok(result) => report(result),
                        Err(failed) => crashed(&service, &failed),
                    }
                }
                _ = hup => {
                    let (this, shared) = (Arc::clone(&self), Arc::clone(&service));
                    let result = tokio::task::spawn_blocking(move || this.reload(&shared)).await;
                    match result {
                        Ok(result) => report(result.map(|()| Reload::Loaded)),
                        Err(failed) => crashed(&service, &failed),
                    }
                }
            }
        }
    }
}

/// A reload that panicked (a defect: no configuration should make one): the
/// configuration in force stays, and the failure is reported and counted as
/// a reload error rather than lost with its task.
fn crashed(service: &RateLimitService, failed: &tokio::task::JoinError) {
    service.metrics().reload_failed();
    eprintln!(
        "turnstile-server: configuration not reloaded (the previous one stays in force): the reload failed: {failed}"
    );
}

fn fingerprint(files: &[(String, String)]) -> u64 {
    let mut hasher = DefaultHasher::new();
    files.hash(&mut hasher);
    hasher.finish()
}

/// A backend that hands out the previous load's state, or a retired one,
/// for an unchanged limit and, when `commit`, converts a limit whose quota
/// changed. It only reads `previous` and `retired`: what a load keeps is
/// settled once its configuration is made ([`Kept::settle`]).
#[derive(Debug)]
struct Reusing<'a> {
    inner: &'a dyn Backend,
    previous: &'a Issued,
    retired: &'a Retired,
    commit: bool,
    issued: Mutex<Issued>,
    requota: Mutex<bool>,
}

impl<'a> Reusing<'a> {
    fn new(
        inner: &'a dyn Backend,
        previous: &'a Issued,
        retired: &'a Retired,
        commit: bool,
    ) -> Reusing<'a> {
        Reusing {
            inner,
            previous,
            retired,
            commit,
            issued: Mutex::new(HashMap::new()),
            requota: Mutex::new(false),
        }
    }

    fn wants_requota(&self) -> bool {
        *self.requota.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn into_issued(self) -> Issued {
        self.issued
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Backend for Reusing<'_> {
    fn limit(&self, spec: &LimitSpec) -> Result<Arc<dyn LimitState>, String> {
        let found = match self.previous.get(&spec.full_key) {
            Some((old, state)) => Some((old, state)),
            None => self.retired.get(&spec.full_key),
        };
        let state = match found {
            Some((old, state)) if old == spec => Arc::clone(state),
            Some((old, state)) if old.algorithm == spec.algorithm => {
                *self.requota.lock().unwrap_or_else(PoisonError::into_inner) = true;
                let kept = if self.commit {
                    state.requota(spec)
                } else {
                    None
                };
                match kept {
                    Some(state) => state,
                    None => self.inner.limit(spec)?,
                }
            }
            _ => self.inner.limit(spec)?,
        };
        self.issued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(spec.full_key.clone(), (spec.clone(), Arc::clone(&state)));
        Ok(state)
    }
}
