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
//!
//! Polling rather than file-system events: a configuration directory holds a
//! few small files, reading them once a second costs next to nothing, and it
//! sees every way a file can change (an editor's rename, a Kubernetes
//! ConfigMap's symlink swap, a network file system) with no platform code.
//! The poll compares the files' names and contents, not their times, so an
//! edit within the file system's time resolution is not missed.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::{Backend, LimitSpec, LimitState};
use crate::config::{Config, ConfigError, LoadOptions, read_dir};
use crate::service::RateLimitService;

/// How often [`Reloader::watch`] polls the directory by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// The states handed out by the last configuration that loaded, by full key.
type Issued = HashMap<String, (LimitSpec, Arc<dyn LimitState>)>;

/// Loads a configuration directory, and loads it again when it changes,
/// keeping the state of the limits that stay.
#[derive(Debug)]
pub struct Reloader {
    dir: PathBuf,
    backend: Arc<dyn Backend>,
    options: LoadOptions,
    /// The last load's states, and the fingerprint of the last version of
    /// the directory tried (loaded or refused).
    last: Mutex<(Issued, Option<u64>)>,
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
            last: Mutex::new((HashMap::new(), None)),
        }
    }

    /// Read the files with `options` (domains merged across files, say).
    #[must_use]
    pub fn with_options(mut self, options: LoadOptions) -> Reloader {
        self.options = options;
        self
    }

    /// Load the directory as it is now, reusing the state of every limit
    /// the last load made that is unchanged (see the [module](self)).
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
        last.1 = Some(fingerprint);
        // First pass: validate, with side effects on nothing that serves.
        let dry = Reusing::new(&*self.backend, &last.0, false);
        let config = Config::from_files_with(&files, &dry, self.options)?;
        let config = if dry.wants_requota() {
            // Second pass, on the same text, which the first has accepted:
            // change the quotas of the limits that can keep their state.
            let commit = Reusing::new(&*self.backend, &last.0, true);
            let config = Config::from_files_with(&files, &commit, self.options)?;
            last.0 = commit.into_issued();
            config
        } else {
            last.0 = dry.into_issued();
            config
        };
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
        if last.1 == Some(now) {
            return Ok(Reload::Unchanged);
        }
        if let Err(error) = read {
            last.1 = Some(now);
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

/// A backend that hands out the previous load's state for an unchanged
/// limit and, when `commit`, converts a limit whose quota changed.
#[derive(Debug)]
struct Reusing<'a> {
    inner: &'a dyn Backend,
    previous: &'a Issued,
    commit: bool,
    issued: Mutex<Issued>,
    requota: Mutex<bool>,
}

impl<'a> Reusing<'a> {
    fn new(inner: &'a dyn Backend, previous: &'a Issued, commit: bool) -> Reusing<'a> {
        Reusing {
            inner,
            previous,
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
        let state = match self.previous.get(&spec.full_key) {
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
