//! The keyed limiter against user code that panics, misbehaves or calls back
//! in: a key's `Hash`, `Eq`, `Clone` (its `ToOwned`) and `Drop`, the
//! algorithm's `decide` and `is_fresh_equivalent`, and the clock's `now`.
//!
//! A fault injector arms one of these sites to panic (or to run a closure)
//! at its k-th call on the current thread; a workload of inserts, relinks
//! from limbo, table growth and shrinking and frees from limbo runs with
//! every k in turn, each operation caught. After each run the limiter must
//! still hold its key bound exactly, decide exactly, and have dropped every
//! key it stored exactly once.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::collections::hash_map::DefaultHasher;
use std::fmt::Debug;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Once, PoisonError, mpsc};
use std::thread;
use std::time::Duration;

use turnstile::{
    Algorithm, Clock, Decision, KeyedBuilder, KeyedDecision, KeyedLimiter, ManualClock, Quota,
    TokenBucket,
};

// ---------------------------------------------------------------------------
// Serial runs.

/// Held by every test here, so they run one at a time: the books of keys
/// made and dropped are global (keys move between threads in some tests),
/// and each test checks them from a clean start.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    quiet_expected_panics();
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// The fault injector.

/// A place where the limiter runs user code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Site {
    Hash,
    Eq,
    Clone,
    Drop,
    IsFresh,
    Decide,
    Now,
}

const SITES: usize = 7;

/// The payload of an injected panic.
#[derive(Debug)]
struct InjectedFault(#[allow(dead_code)] Site);

/// What an armed site does at its call.
enum Action {
    /// Panic with [`InjectedFault`].
    Panic,
    /// Run user code there (to call back into a limiter).
    Call(Box<dyn FnOnce()>),
}

struct Armed {
    site: Site,
    /// Calls left before the action; it runs at the call that brings it to 0.
    countdown: u64,
    action: Action,
}

thread_local! {
    /// The site armed on this thread, until its action runs.
    static ARMED: RefCell<Option<Armed>> = const { RefCell::new(None) };
    /// Calls made at each site on this thread.
    static CALLS: [Cell<u64>; SITES] = const { [const { Cell::new(0) }; SITES] };
    /// Set while this thread expects the limiter to refuse a call back in:
    /// its panic message is not printed.
    static EXPECTING_REENTRY: Cell<bool> = const { Cell::new(false) };
}

/// Arm `site` on this thread: its `nth` call from now (1: the next) runs
/// `action`, once.
fn arm(site: Site, nth: u64, action: Action) {
    assert!(nth >= 1);
    ARMED.with(|armed| {
        *armed.borrow_mut() = Some(Armed {
            site,
            countdown: nth,
            action,
        })
    });
}

/// Disarm this thread's site; whether its action ran (it was no longer
/// armed).
fn disarm() -> bool {
    ARMED.with(|armed| armed.borrow_mut().take().is_none())
}

fn calls() -> [u64; SITES] {
    CALLS.with(|calls| core::array::from_fn(|i| calls[i].get()))
}

/// Every hook calls this: counts the call, and runs the armed action if this
/// is its call. Nothing fires while the thread unwinds (a second panic
/// would abort the process).
fn fault(site: Site) {
    CALLS.with(|calls| calls[site as usize].set(calls[site as usize].get() + 1));
    if thread::panicking() {
        return;
    }
    let action = ARMED.with(|armed| {
        let mut armed = armed.borrow_mut();
        match armed.as_mut() {
            Some(a) if a.site == site => {
                a.countdown -= 1;
                if a.countdown == 0 {
                    armed.take().map(|a| a.action)
                } else {
                    None
                }
            }
            _ => None,
        }
    });
    match action {
        Some(Action::Panic) => panic::panic_any(InjectedFault(site)),
        Some(Action::Call(f)) => f(),
        None => {}
    }
}

/// A panic payload's message, if it has one.
fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(fault) = payload.downcast_ref::<InjectedFault>() {
        format!("{fault:?}")
    } else {
        "a panic without a message".to_owned()
    }
}

/// Leave injected panics, and the refusals of calls back in that a test
/// expects, unprinted; every other panic is printed as usual.
fn quiet_expected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let expected = payload.downcast_ref::<InjectedFault>().is_some()
                || (EXPECTING_REENTRY.try_with(Cell::get).unwrap_or(false)
                    && message(payload).contains("called again"));
            if !expected {
                default(info);
            }
        }));
    });
}

// ---------------------------------------------------------------------------
// The books of keys made and dropped.

/// Every key made (constructed or cloned) and dropped, by serial number.
#[derive(Default)]
struct Books {
    live: HashSet<u64>,
    dropped: HashSet<u64>,
    made: u64,
    drops: u64,
    /// Drops of a serial already dropped.
    double: u64,
    /// Drops of a serial never made (a drop of memory that is no key).
    unknown: u64,
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(0);
static BOOKS: LazyLock<Mutex<Books>> = LazyLock::new(Mutex::default);

fn books() -> MutexGuard<'static, Books> {
    BOOKS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn reset_books() {
    *books() = Books::default();
}

/// Every key made since the last reset was dropped, and exactly once.
#[track_caller]
fn assert_books_balanced(context: &str) {
    let books = books();
    assert_eq!(
        (books.double, books.unknown),
        (0, 0),
        "{context}: keys dropped twice, and drops of keys never made"
    );
    assert!(
        books.live.is_empty() && books.made == books.drops,
        "{context}: {} keys made, {} dropped; never dropped: {:?}",
        books.made,
        books.drops,
        books.live.iter().take(8).collect::<Vec<_>>()
    );
}

/// A key whose `Hash`, `Eq`, `Clone` and `Drop` are fault sites. Each key
/// made takes a new serial, which its drop checks off; `Hash` and `Eq` see
/// only `id`.
struct Key {
    id: u64,
    serial: u64,
}

impl Key {
    fn new(id: u64) -> Key {
        let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
        let mut books = books();
        books.made += 1;
        books.live.insert(serial);
        Key { id, serial }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        fault(Site::Hash);
        self.id.hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        fault(Site::Eq);
        self.id == other.id
    }
}

impl Eq for Key {}

impl Clone for Key {
    fn clone(&self) -> Key {
        fault(Site::Clone);
        Key::new(self.id)
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        {
            // Checked off before the hook: a drop that panics has dropped.
            let mut books = books();
            books.drops += 1;
            if books.live.remove(&self.serial) {
                books.dropped.insert(self.serial);
            } else if books.dropped.contains(&self.serial) {
                books.double += 1;
            } else {
                books.unknown += 1;
            }
        }
        fault(Site::Drop);
    }
}

/// A token bucket whose `decide` and `is_fresh_equivalent` are fault sites.
struct FaultBucket(TokenBucket);

impl Algorithm for FaultBucket {
    fn fresh(&self) -> u64 {
        self.0.fresh()
    }

    fn capacity(&self) -> u32 {
        self.0.capacity()
    }

    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        fault(Site::Decide);
        self.0.decide(word, now, n)
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.0.remaining(word, now)
    }

    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        self.0.refund(word, written, n)
    }

    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        fault(Site::IsFresh);
        self.0.is_fresh_equivalent(word, now)
    }

    fn fresh_after_idle(&self) -> Duration {
        self.0.fresh_after_idle()
    }
}

/// A manual clock whose `now` is a fault site.
struct FaultClock(ManualClock);

impl Clock for FaultClock {
    fn now(&self) -> u64 {
        fault(Site::Now);
        self.0.now()
    }
}

/// A fixed hasher, so that every run places its keys alike.
type Fixed = BuildHasherDefault<DefaultHasher>;
type Faulty = KeyedLimiter<Key, FaultBucket, FaultClock, Fixed>;

fn faulty(capacity: u32, clock: &ManualClock, shards: usize, max_keys: usize) -> Faulty {
    let quota = Quota::new(capacity, 1, Duration::from_secs(1)).unwrap();
    KeyedBuilder::<Key, _>::new(FaultBucket(TokenBucket::new(quota)))
        .clock(FaultClock(clock.clone()))
        .hasher(Fixed::default())
        .shards(shards)
        .max_keys(max_keys)
        .sweep_every(4)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// The workload.

/// The key bound of the workload's limiter.
const MAX_KEYS: usize = 16;
/// Each key's capacity; it refills one permit a second.
const CAPACITY: u32 = 2;
/// Long enough for every key to be full again (sweepable).
const IDLE: Duration = Duration::from_secs(3);

/// One operation of the workload: what it returned (`None`: it panicked)
/// and the calls it made at each site.
struct Step {
    name: String,
    outcome: Option<String>,
    calls: [u64; SITES],
}

impl Step {
    fn calls(&self, site: Site) -> u64 {
        self.calls[site as usize]
    }
}

/// Run `f` on `l` with its panic caught, checking that a panic is the
/// injected one and that the key bound holds after it.
fn step<R: Debug>(
    steps: &mut Vec<Step>,
    l: &Faulty,
    name: impl Into<String>,
    f: impl FnOnce(&Faulty) -> R,
) {
    let name = name.into();
    let before = calls();
    let outcome = match panic::catch_unwind(AssertUnwindSafe(|| f(l))) {
        Ok(r) => Some(format!("{r:?}")),
        Err(payload) => {
            assert!(
                payload.downcast_ref::<InjectedFault>().is_some(),
                "{name}: a panic other than the injected one: {}",
                message(&*payload)
            );
            None
        }
    };
    let after = calls();
    assert!(
        l.len() <= MAX_KEYS,
        "{name}: {} keys held, over the bound of {MAX_KEYS}",
        l.len()
    );
    steps.push(Step {
        name,
        outcome,
        calls: core::array::from_fn(|i| after[i] - before[i]),
    });
}

/// Inserts (growing a shard's table past 3/4 of 8 and of 16 slots), a new
/// key refused at the bound, decisions on held keys, a sweep into limbo,
/// relinks from limbo, frees from limbo with the table shrinking after them,
/// and a growth that frees the idle keys waiting in limbo. `keys` (ids 0 to
/// 31) outlive the workload: every key the workload clones, and every drop
/// it sees, is the limiter's.
fn workload(l: &Faulty, clock: &ManualClock, keys: &[Key]) -> Vec<Step> {
    let mut steps = Vec::new();
    let s = &mut steps;
    for key in &keys[..16] {
        step(s, l, format!("insert {}", key.id), |l| l.try_acquire(key));
    }
    step(s, l, "refused at the bound", |l| l.try_acquire(&keys[16]));
    step(s, l, "spend", |l| l.try_acquire_n(&keys[0], 1));
    step(s, l, "peek", |l| l.remaining(&keys[1]));
    clock.advance(IDLE);
    step(s, l, "sweep into limbo", |l| l.sweep());
    step(s, l, "relink 1", |l| l.try_acquire(&keys[1]));
    step(s, l, "relink 2", |l| l.try_acquire_n(&keys[2], 2));
    step(s, l, "peek in limbo", |l| l.remaining(&keys[3]));
    step(s, l, "insert beside limbo", |l| l.try_acquire(&keys[17]));
    step(s, l, "free and shrink", |l| l.sweep());
    clock.advance(IDLE);
    step(s, l, "sweep into limbo again", |l| l.sweep());
    for key in &keys[18..32] {
        step(s, l, format!("insert {}", key.id), |l| l.try_acquire(key));
    }
    step(s, l, "back after a free", |l| l.try_acquire(&keys[1]));
    clock.advance(IDLE);
    step(s, l, "last sweep into limbo", |l| l.sweep());
    step(s, l, "last free", |l| l.sweep());
    step(s, l, "stats", |l| l.stats());
    steps
}

/// The key bound is whole: with every key idle and swept away, exactly
/// `MAX_KEYS` new keys are admitted and the next is refused for the bound,
/// with the clock standing still; each admitted key decides exactly; and,
/// idle again, all of them are swept into limbo at once (limbo's own count
/// is whole) and freed. Twice. Key ids from `first` on are new to `l`.
#[track_caller]
fn assert_bound_whole(l: &Faulty, clock: &ManualClock, first: u64, context: &str) {
    clock.advance(IDLE * 4);
    l.sweep();
    l.sweep();
    assert_eq!(
        l.len(),
        0,
        "{context}: keys still counted with every key idle and swept twice"
    );
    let mut next = first;
    for round in 0..2 {
        let fresh: Vec<Key> = (next..next + MAX_KEYS as u64).map(Key::new).collect();
        next += MAX_KEYS as u64 + 1;
        for key in &fresh {
            assert_eq!(
                l.try_acquire(key),
                KeyedDecision::Allowed {
                    remaining: CAPACITY - 1
                },
                "{context}, round {round}: new key {} under the bound",
                key.id
            );
        }
        assert_eq!(l.len(), MAX_KEYS, "{context}, round {round}");
        let over = Key::new(next - 1);
        assert!(
            l.try_acquire(&over).is_key_limit(),
            "{context}, round {round}: a key over the bound was not refused ({} held)",
            l.len()
        );
        assert_eq!(l.len(), MAX_KEYS, "{context}, round {round}");
        // Exact decisions on a held key.
        assert_eq!(
            l.try_acquire(&fresh[0]),
            KeyedDecision::Allowed { remaining: 0 },
            "{context}, round {round}"
        );
        assert!(l.try_acquire(&fresh[0]).is_denied(), "{context}");
        assert_eq!(l.remaining(&fresh[1]), CAPACITY - 1, "{context}");
        clock.advance(IDLE);
        assert_eq!(
            l.sweep(),
            MAX_KEYS,
            "{context}, round {round}: idle keys not all swept into limbo"
        );
        l.sweep();
        assert_eq!(l.len(), 0, "{context}, round {round}");
    }
}

/// One run: the workload with `site` armed to panic at its `nth` call, then
/// the checks. Returns whether the fault fired.
fn run_once(site: Site, nth: u64, shards: usize) -> bool {
    let context = format!("{site:?} fault at call {nth}, {shards} shard(s)");
    reset_books();
    let clock = ManualClock::new();
    let l = faulty(CAPACITY, &clock, shards, MAX_KEYS);
    let keys: Vec<Key> = (0..32).map(Key::new).collect();
    arm(site, nth, Action::Panic);
    let steps = workload(&l, &clock, &keys);
    let fired = disarm();
    let panicked: Vec<&str> = steps
        .iter()
        .filter(|s| s.outcome.is_none())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        panicked.len(),
        usize::from(fired),
        "{context}: the steps that panicked ({panicked:?}) are not the one fault"
    );
    assert_bound_whole(&l, &clock, 1_000, &context);
    drop(l);
    drop(keys);
    assert_books_balanced(&context);
    fired
}

/// The most calls at a site one run may make: a bound on the runs.
const MAX_NTH: u64 = 5_000;

/// Run the workload with `site` panicking at its 1st call, then its 2nd,
/// and so on until a run makes fewer calls there than the count (every call
/// has been made to panic once), on one shard and on two. On a thread of its
/// own (the injector's state is the thread's), given two minutes: a panic
/// that left a lock or a pin behind fails the test instead of hanging it.
fn survives_every_fault_at(site: Site) {
    let _serial = serial();
    let fired = within(
        &format!("{site:?} faults"),
        Duration::from_secs(120),
        move || {
            let mut fired = 0;
            let mut nth = 1;
            loop {
                assert!(nth <= MAX_NTH, "{site:?}: still firing at call {MAX_NTH}");
                let mut any = false;
                for shards in [1, 2] {
                    any |= run_once(site, nth, shards);
                }
                if !any {
                    return fired;
                }
                fired += 1;
                nth += 1;
            }
        },
    );
    assert!(fired > 0, "{site:?}: the workload never reached the site");
}

/// The workload does what it says, with no fault: growth, a refusal at the
/// bound, relinks (no clone), frees (drops) and a shrink (a rehash inside
/// a sweep), and a growth that frees keys waiting in limbo.
#[test]
fn the_workload_grows_relinks_frees_and_shrinks() {
    let _serial = serial();
    reset_books();
    let clock = ManualClock::new();
    let l = faulty(CAPACITY, &clock, 1, MAX_KEYS);
    let keys: Vec<Key> = (0..32).map(Key::new).collect();
    let steps = workload(&l, &clock, &keys);
    let get = |name: &str| steps.iter().find(|s| s.name == name).unwrap();
    let outcome = |name: &str| get(name).outcome.clone().unwrap();
    let one_left = format!("{:?}", KeyedDecision::Allowed { remaining: 1 });
    for s in &steps {
        assert!(s.outcome.is_some(), "{} panicked", s.name);
    }
    for id in 0..16 {
        assert_eq!(outcome(&format!("insert {id}")), one_left, "insert {id}");
    }
    let growths = steps[..16]
        .iter()
        .filter(|s| s.calls(Site::Hash) > 1)
        .count();
    assert!(growths >= 2, "{growths} tables grew over 16 inserts");
    assert!(outcome("refused at the bound").starts_with("KeyLimit"));
    assert_eq!(outcome("sweep into limbo"), "16");
    assert_eq!(get("sweep into limbo").calls(Site::Drop), 0);
    assert_eq!(outcome("relink 1"), one_left);
    assert_eq!(
        get("relink 1").calls(Site::Clone),
        0,
        "relinked, not cloned"
    );
    assert_eq!(
        outcome("relink 2"),
        format!("{:?}", Ok::<_, ()>(KeyedDecision::Allowed { remaining: 0 }))
    );
    assert_eq!(outcome("insert beside limbo"), one_left);
    assert_eq!(get("insert beside limbo").calls(Site::Clone), 1);
    let shrink = get("free and shrink");
    assert_eq!(shrink.calls(Site::Drop), 14, "the keys left in limbo freed");
    assert!(shrink.calls(Site::Hash) > 0, "no rebuild after the frees");
    assert_eq!(outcome("sweep into limbo again"), "3");
    assert!(
        steps.iter().any(|s| s.name.starts_with("insert")
            && s.calls(Site::Hash) > 1
            && s.calls(Site::Drop) > 0),
        "no growth freed the keys waiting in limbo"
    );
    assert!(get("last free").calls(Site::Drop) > 0);
    assert_bound_whole(&l, &clock, 1_000, "no fault");
    drop(l);
    drop(keys);
    assert_books_balanced("no fault");
}

/// A key's `Hash` that panics: at a request's first hash, nothing is held;
/// in a table rebuild (growth or shrink) the copy is half done, and must
/// leave the old table whole, no key copied twice (dropped twice) or lost.
#[test]
fn panics_in_hash_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Hash);
}

/// A key's `Eq` that panics: in a lookup without the lock, under the lock,
/// or in the second lookup in limbo after a place under the bound was
/// reserved, which must be given back.
#[test]
fn panics_in_eq_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Eq);
}

/// A key's `Clone` (its `ToOwned`) that panics after a place under the bound
/// was reserved for it: the place must be given back, not leaked.
#[test]
fn panics_in_clone_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Clone);
}

/// A key's `Drop` that panics while a sweep or a rebuild frees it from
/// limbo: the key must be off the books and its slot dead first, or it is
/// dropped again later.
#[test]
fn panics_in_drop_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Drop);
}

/// The algorithm's `is_fresh_equivalent` that panics midway through a
/// sweep, a free from limbo or a rebuild: the keys unlinked so far must be
/// counted, and the counts of linked keys and keys in limbo stay exact.
#[test]
fn panics_in_is_fresh_equivalent_leave_the_limiter_whole() {
    survives_every_fault_at(Site::IsFresh);
}

/// The algorithm's `decide` that panics: on a held key without the lock, or
/// on a new key's fresh word under the lock after its place was reserved.
#[test]
fn panics_in_decide_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Decide);
}

/// The clock's `now` that panics: before a lookup, under a shard's lock
/// (with a place possibly reserved), or in a sweep between shards.
#[test]
fn panics_in_the_clock_leave_the_limiter_whole() {
    survives_every_fault_at(Site::Now);
}

// ---------------------------------------------------------------------------
// An algorithm that answers at random.

/// A token bucket whose `is_fresh_equivalent` answers at random (a broken
/// algorithm): two judgements of one word disagree. A rebuild that counted
/// the keys in limbo it keeps by one judgement and copied them by another
/// kept books of fewer used slots than the new table held; the table then
/// filled before its growth was due, and a probe of a table with no empty
/// slot never ends.
struct CoinFlip {
    bucket: TokenBucket,
    state: AtomicU64,
}

impl CoinFlip {
    fn flip(&self) -> bool {
        // xorshift64; Relaxed: any sequence of values will do.
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        x & 1 == 1
    }
}

impl Algorithm for CoinFlip {
    fn fresh(&self) -> u64 {
        self.bucket.fresh()
    }

    fn capacity(&self) -> u32 {
        self.bucket.capacity()
    }

    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.bucket.decide(word, now, n)
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.bucket.remaining(word, now)
    }

    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        self.bucket.refund(word, written, n)
    }

    fn is_fresh_equivalent(&self, _word: u64, _now: u64) -> bool {
        self.flip()
    }

    fn fresh_after_idle(&self) -> Duration {
        self.bucket.fresh_after_idle()
    }
}

/// Run `body` on its own thread and wait at most `limit` for it: a
/// deadlock or an endless loop fails the test instead of hanging it.
fn within<R: Send + 'static>(
    name: &str,
    limit: Duration,
    body: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let r = body();
            let _ = tx.send(());
            r
        })
        .unwrap();
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name}: not done after {limit:?}: it hangs")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(r) => r,
            Err(payload) => panic!("{name}: {}", message(&*payload)),
        },
    }
}

/// `requests` requests, mostly for new keys, on a limiter of `shards`
/// shards and `max_keys` keys whose algorithm answers at random from
/// `seed`, with sweeps in between and the clock moving, on its own thread
/// given `limit`. Checks the bound after every request; returns the keys
/// stored and the most held at once.
fn coin_flips(
    max_keys: usize,
    shards: usize,
    seed: u64,
    requests: u64,
    limit: Duration,
) -> (usize, usize) {
    let name = format!("coin flips: {max_keys} keys, {shards} shard(s), seed {seed:#x}");
    let context = name.clone();
    within(&name, limit, move || {
        let clock = ManualClock::new();
        let quota = Quota::new(4, 1, Duration::from_millis(10)).unwrap();
        let algorithm = CoinFlip {
            bucket: TokenBucket::new(quota),
            state: AtomicU64::new(seed),
        };
        let l = KeyedBuilder::<Key, _>::new(algorithm)
            .clock(clock.clone())
            .hasher(Fixed::default())
            .shards(shards)
            .max_keys(max_keys)
            .sweep_every(8)
            .build()
            .unwrap();
        let mut inserts = 0;
        let mut fullest = 0;
        for i in 0..requests {
            // Mostly new keys, some coming back while others wait in limbo.
            let id = if i % 3 == 0 { i % 97 } else { i };
            let before = l.len();
            let _ = l.try_acquire(&Key::new(id));
            inserts += usize::from(l.len() > before);
            fullest = fullest.max(l.len());
            assert!(
                l.len() <= max_keys,
                "{context}: {} keys held at request {i}",
                l.len()
            );
            if i % 50 == 49 {
                l.sweep();
                assert!(l.len() <= max_keys, "{context}: {} keys held", l.len());
            }
            clock.advance(Duration::from_millis(1 + i % 7));
        }
        (inserts, fullest)
    })
}

/// A flood of new keys on an algorithm whose `is_fresh_equivalent` answers
/// at random (two judgements of one word disagree), with sweeps in between
/// and the clock moving: it finishes (a rebuild that counted the keys it
/// keeps by one judgement and copied them by another filled its table past
/// what its books said, and a probe of the full table never ended), never
/// holds more keys than the bound, and drops every key it stored exactly
/// once. One shard of 64 keys; then small tables, which such a miscount
/// fills soonest: 64 keys over 16 shards, and one shard of 8 keys.
#[test]
fn an_algorithm_that_answers_at_random_cannot_hang_a_rebuild() {
    let _serial = serial();
    reset_books();
    let limit = Duration::from_secs(60);
    for (max_keys, shards, seed) in [
        (64, 1, 0x9E37_79B9_7F4A_7C15),
        (64, 16, 0x2545_F491_4F6C_DD1D),
        (8, 1, 0x3C6E_F372_FE94_F82A),
    ] {
        let (inserts, fullest) = coin_flips(max_keys, shards, seed, 6_000, limit);
        // The flood did go through the limiter: thousands of keys stored
        // (and so swept and freed), the bound reached.
        let context = format!("{max_keys} keys, {shards} shard(s)");
        assert!(inserts > 1_000, "{context}: {inserts} keys stored");
        assert_eq!(fullest, max_keys, "{context}: the bound never reached");
    }
    assert_books_balanced("coin flips");
}

// ---------------------------------------------------------------------------
// Calls back into the limiter.

/// Run `outer` with `site` armed to run `inner` at its `nth` call on this
/// thread. Returns what `outer` returned or its panic's message, and whether
/// `inner` ran.
fn with_hook<R>(
    site: Site,
    nth: u64,
    inner: impl FnOnce() + 'static,
    outer: impl FnOnce() -> R,
) -> (Result<R, String>, bool) {
    arm(site, nth, Action::Call(Box::new(inner)));
    EXPECTING_REENTRY.with(|e| e.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(outer));
    EXPECTING_REENTRY.with(|e| e.set(false));
    let ran = disarm();
    (result.map_err(|payload| message(&*payload)), ran)
}

/// `outer` was refused for calling back into its limiter: it panicked with
/// the limiter's message, from within `inner`.
#[track_caller]
fn assert_refused<R: Debug>(result: (Result<R, String>, bool), what: &str) {
    let (result, ran) = result;
    assert!(ran, "{what}: the hook never ran");
    match result {
        Err(message) => assert!(
            message.contains("called again"),
            "{what}: panicked with {message:?}"
        ),
        Ok(r) => panic!("{what}: the call back in was let through ({r:?})"),
    }
}

const REENTRY_CAPACITY: u32 = 3;

fn shared_limiter() -> (Arc<Faulty>, ManualClock) {
    let clock = ManualClock::new();
    let l = Arc::new(faulty(REENTRY_CAPACITY, &clock, 1, 64));
    (l, clock)
}

/// `inner`: a closure that asks `l` for key `id` and notes the decision.
fn ask(l: &Arc<Faulty>, id: u64) -> (impl FnOnce() + 'static, Arc<Mutex<Option<KeyedDecision>>>) {
    let l = Arc::clone(l);
    let seen = Arc::new(Mutex::new(None));
    let note = Arc::clone(&seen);
    let inner = move || {
        let decision = l.try_acquire(&Key::new(id));
        *note.lock().unwrap() = Some(decision);
    };
    (inner, seen)
}

fn allowed(remaining: u32) -> KeyedDecision {
    KeyedDecision::Allowed { remaining }
}

/// After a refused call back in, the limiter is not stuck: on this thread
/// and on another, held keys decide exactly (`held`: each one's permits
/// left), new keys are stored, and a sweep takes every shard's lock.
#[track_caller]
fn assert_still_works(l: &Arc<Faulty>, clock: &ManualClock, held: &[(u64, u32)], what: &str) {
    for &(id, left) in held {
        assert_eq!(l.remaining(&Key::new(id)), left, "{what}: key {id}");
    }
    let new_here = 500;
    assert_eq!(l.try_acquire(&Key::new(new_here)), allowed(2), "{what}");
    let other = Arc::clone(l);
    let held = held.to_vec();
    let what_there = format!("{what}, on another thread");
    thread::spawn(move || {
        for (id, left) in held {
            let key = Key::new(id);
            for n in (0..left).rev() {
                assert_eq!(other.try_acquire(&key), allowed(n), "{what_there}: {id}");
            }
            assert!(other.try_acquire(&key).is_denied(), "{what_there}: {id}");
        }
        assert_eq!(
            other.try_acquire(&Key::new(501)),
            allowed(2),
            "{what_there}"
        );
        other.sweep();
        other.stats();
    })
    .join()
    .unwrap_or_else(|payload| panic!("{}", message(&*payload)));
    clock.advance(Duration::from_secs(10));
    assert!(l.sweep() > 0, "{what}: nothing swept");
    l.sweep();
    assert_eq!(l.len(), 0, "{what}: keys left counted");
}

/// A key's `Eq`, run during a lookup, calls the same limiter: it must be
/// refused with a panic rather than wait for itself (a rebuild waiting for
/// the lookup that called it), and leave nothing pinned, locked or counted.
#[test]
fn an_eq_that_calls_back_in_is_refused() {
    let _serial = serial();
    reset_books();
    within("eq calls back in", Duration::from_secs(20), || {
        let (l, clock) = shared_limiter();
        let one = Key::new(1);
        assert_eq!(l.try_acquire(&one), allowed(2));
        // Without the lock: the lookup of a held key.
        let (inner, seen) = ask(&l, 2);
        assert_refused(
            with_hook(Site::Eq, 1, inner, || l.try_acquire(&one)),
            "a lookup",
        );
        assert_eq!(*seen.lock().unwrap(), None);
        // Under the lock: key 1 swept into limbo, where its second lookup
        // finds it.
        clock.advance(Duration::from_secs(10));
        assert_eq!(l.sweep(), 1);
        for nth in [1, 2] {
            // The first lookup in limbo, then the second, made after a
            // place under the bound was reserved for the key.
            let (inner, _) = ask(&l, 2);
            assert_refused(
                with_hook(Site::Eq, nth, inner, || l.try_acquire(&one)),
                &format!("lookup {nth} in limbo"),
            );
            assert_eq!(l.len(), 0, "the place reserved for the key leaked");
        }
        assert_still_works(&l, &clock, &[(1, 3)], "after Eq");
    });
    assert_books_balanced("Eq");
}

/// The clock's `now`, called under a shard's lock for a new key, calls the
/// same limiter: refused rather than waiting for the lock its own thread
/// holds. Its first reading of a request, before any lookup, may call in.
#[test]
fn a_clock_that_calls_back_in_under_the_lock_is_refused() {
    let _serial = serial();
    reset_books();
    within("now calls back in", Duration::from_secs(20), || {
        let (l, clock) = shared_limiter();
        // The first reading, outside: the call back in is served.
        let (inner, seen) = ask(&l, 2);
        let (outer, ran) = with_hook(Site::Now, 1, inner, || l.try_acquire(&Key::new(1)));
        assert!(ran);
        assert_eq!(outer, Ok(allowed(2)));
        assert_eq!(*seen.lock().unwrap(), Some(allowed(2)));
        assert_eq!(l.len(), 2);
        // The second reading, under the lock of a new key's shard.
        let (inner, seen) = ask(&l, 4);
        assert_refused(
            with_hook(Site::Now, 2, inner, || l.try_acquire(&Key::new(3))),
            "a new key",
        );
        assert_eq!(*seen.lock().unwrap(), None);
        assert_eq!(l.len(), 2, "a key stored, or a place leaked");
        // A sweep reads the clock under each shard's lock.
        let (inner, _) = ask(&l, 4);
        assert_refused(with_hook(Site::Now, 1, inner, || l.sweep()), "a sweep");
        assert_still_works(&l, &clock, &[(1, 2), (2, 2), (3, 3)], "after now");
    });
    assert_books_balanced("now");
}

/// The algorithm's `decide` calls the same limiter: on a held key (without
/// the lock, pinned) and on a new key (under the lock); both refused, and
/// neither decision taken.
#[test]
fn an_algorithm_that_calls_back_in_is_refused() {
    let _serial = serial();
    reset_books();
    within("decide calls back in", Duration::from_secs(20), || {
        let (l, clock) = shared_limiter();
        let one = Key::new(1);
        assert_eq!(l.try_acquire(&one), allowed(2));
        let (inner, _) = ask(&l, 2);
        assert_refused(
            with_hook(Site::Decide, 1, inner, || l.try_acquire(&one)),
            "a held key",
        );
        let (inner, _) = ask(&l, 2);
        assert_refused(
            with_hook(Site::Decide, 1, inner, || l.try_acquire(&Key::new(3))),
            "a new key",
        );
        assert_eq!(l.len(), 1, "a key stored, or a place leaked");
        // A sweep judges words under the lock.
        clock.advance(Duration::from_secs(10));
        let (inner, _) = ask(&l, 2);
        assert_refused(
            with_hook(Site::IsFresh, 1, inner, || l.sweep()),
            "is_fresh_equivalent in a sweep",
        );
        assert_still_works(&l, &clock, &[(1, 3)], "after decide");
    });
    assert_books_balanced("decide");
}

/// A key's `Hash`: the first of a request runs before anything is held and
/// may call in; one in a table rebuild runs under the lock, and is refused,
/// leaving the old table whole and the rebuild to the next writer. A key's
/// `Drop` as a sweep frees it, also under the lock, is refused as well.
#[test]
fn hash_and_drop_that_call_back_in_under_the_lock_are_refused() {
    let _serial = serial();
    reset_books();
    within(
        "hash and drop call back in",
        Duration::from_secs(20),
        || {
            let (l, clock) = shared_limiter();
            let (inner, seen) = ask(&l, 1);
            let (outer, ran) = with_hook(Site::Hash, 1, inner, || l.try_acquire(&Key::new(2)));
            assert!(ran);
            assert_eq!(outer, Ok(allowed(2)));
            assert_eq!(*seen.lock().unwrap(), Some(allowed(2)));
            for id in 3..7 {
                assert_eq!(l.try_acquire(&Key::new(id)), allowed(2));
            }
            // The seventh key grows the table: the request's hash, then the
            // rebuild's first.
            let (inner, _) = ask(&l, 100);
            assert_refused(
                with_hook(Site::Hash, 2, inner, || l.try_acquire(&Key::new(7))),
                "a rebuild",
            );
            assert_eq!(l.len(), 6);
            let held: Vec<(u64, u32)> = (1..7).map(|id| (id, 2)).collect();
            for &(id, left) in &held {
                assert_eq!(
                    l.remaining(&Key::new(id)),
                    left,
                    "key {id} after the rebuild"
                );
            }
            assert_eq!(l.try_acquire(&Key::new(7)), allowed(2));
            // Idle, swept into limbo, then freed: the first drop calls in.
            clock.advance(Duration::from_secs(10));
            assert_eq!(l.sweep(), 7);
            let (inner, _) = ask(&l, 100);
            assert_refused(with_hook(Site::Drop, 1, inner, || l.sweep()), "a free");
            let before = books().drops;
            l.sweep();
            assert_eq!(books().drops - before, 6, "the other keys in limbo freed");
            assert_still_works(&l, &clock, &[], "after Hash and Drop");
        },
    );
    assert_books_balanced("Hash and Drop");
}

/// Code run by one limiter may use another: a key's `Eq` in a lookup, and
/// the algorithm's `decide` on a new key under the first limiter's lock,
/// each calling a second limiter, are served.
#[test]
fn calls_into_a_different_limiter_are_served() {
    let _serial = serial();
    reset_books();
    within("calls elsewhere", Duration::from_secs(20), || {
        let (first, clock) = shared_limiter();
        let (second, _) = shared_limiter();
        let one = Key::new(1);
        assert_eq!(first.try_acquire(&one), allowed(2));
        let (inner, seen) = ask(&second, 1);
        let (outer, ran) = with_hook(Site::Eq, 1, inner, || first.try_acquire(&one));
        assert!(ran);
        assert_eq!(outer, Ok(allowed(1)));
        assert_eq!(*seen.lock().unwrap(), Some(allowed(2)));
        let (inner, seen) = ask(&second, 2);
        let (outer, ran) = with_hook(Site::Decide, 1, inner, || first.try_acquire(&Key::new(2)));
        assert!(ran);
        assert_eq!(outer, Ok(allowed(2)));
        assert_eq!(*seen.lock().unwrap(), Some(allowed(2)));
        assert_eq!((first.len(), second.len()), (2, 2));
        assert_still_works(&first, &clock, &[(1, 1), (2, 2)], "the first");
    });
    assert_books_balanced("calls elsewhere");
}

/// The hooks themselves: an armed site fires at its n-th call and only
/// once, and a key's serial is checked off at its drop (so the other tests'
/// checks can fail).
#[test]
fn the_injector_fires_once_and_the_books_catch_a_double_drop() {
    let _serial = serial();
    reset_books();
    let key = Key::new(1);
    let same = Key::new(1);
    arm(Site::Eq, 2, Action::Panic);
    assert!(key == same);
    let second = panic::catch_unwind(AssertUnwindSafe(|| key == same));
    assert!(second.is_err());
    assert!(key == same, "fired twice");
    assert!(disarm());
    let fired = Arc::new(AtomicBool::new(false));
    let note = Arc::clone(&fired);
    arm(
        Site::Clone,
        1,
        Action::Call(Box::new(move || note.store(true, Ordering::Relaxed))),
    );
    let copy = key.clone();
    assert!(fired.load(Ordering::Relaxed) && disarm());
    // A bitwise copy dropped beside the original: a double drop.
    let twin = Key {
        id: copy.id,
        serial: copy.serial,
    };
    drop(copy);
    drop(twin);
    assert_eq!(books().double, 1);
    drop((key, same));
    reset_books();
}
