//! One in-process limit of a combined layer ([`Limit`], [`Entry`]) and the
//! all-or-nothing walk over them.
//!
//! # The walk
//!
//! Every limit's key is found before any permit is taken, so a request
//! without one spends nothing; and on the way to an admission each key is
//! extracted once (a denial extracts the keys of the limits after the one
//! that denied again, to ask them for their waits and items, and a request
//! without a key the extractor again, for its 401). The walk
//! goes down the limits in order ([`Limit::walk`]), each frame extracting
//! its key and keeping it on its own stack frame, then handing the next
//! frame a [`Prefix`]: the takes of every limit so far, in order. The last
//! frame, every key found, runs that prefix: limit 0 takes, then its
//! [`Then`] (limit 1's take, and so on, down to [`Done`]). A refusal
//! unwinds through the takes already made, each giving its permits back.

use super::items::{Cached, Items, State};
use super::settle::{Held, Ticket, now_remaining, now_state};
use super::*;

/// How a request was decided: one byte, passed up every frame of the walk
/// in a register. Why one was not admitted is in [`Decide::why`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Admitted,
    /// Refused, or a key missing: [`Decide::why`] says which.
    NotAdmitted,
}

/// Why a request was not admitted.
pub(super) enum Why {
    /// Limit `by` refused first; `decision` carries the longest wait.
    Refused { by: usize, decision: KeyedDecision },
    /// A limit found no key, or (as [`Denial::Misconfigured`]) can never
    /// admit the request: nothing was taken anywhere.
    Missing {
        denial: Denial,
        challenge: HeaderValue,
    },
}

/// What deciding a request collects.
pub(super) struct Decide {
    /// Write the `RateLimit` items.
    pub(super) advertise: bool,
    /// Keep tickets for settling.
    pub(super) keep: bool,
    /// Remote limits decide after the in-process ones: an in-process
    /// admission is counted in its limiter's stats only once they admit
    /// too ([`Ticket::count_admission`]), not when the walk admits.
    pub(super) remote: bool,
    pub(super) items: Items,
    pub(super) tickets: Vec<Box<dyn Ticket>>,
    /// The index of the limit deciding now.
    pub(super) depth: usize,
    /// The one reading every limit decides at, when they share a clock's
    /// readings; otherwise each reads its own.
    pub(super) now: Option<u64>,
    /// Why the request was not admitted, once the walk says
    /// [`Verdict::NotAdmitted`].
    pub(super) why: Option<Why>,
}

impl Decide {
    /// Not admitted, for `why`.
    #[cold]
    #[inline(never)]
    fn not_admitted(&mut self, why: Why) -> Verdict {
        self.why = Some(why);
        Verdict::NotAdmitted
    }
}

/// The takes after one limit's: run once that limit admitted.
pub(super) trait Then {
    fn go(&mut self, cx: &mut Decide) -> Verdict;
}

/// The takes of the limits walked so far, each with its key: `with` makes
/// them in order, then runs `then`.
pub(super) trait Prefix {
    fn with(&mut self, cx: &mut Decide, then: &mut dyn Then) -> Verdict;
}

/// The prefix before the first limit: nothing to take. Every key is found
/// when it runs, so it reads the time here for all the limits when they
/// share a clock's readings (`one_reading`: the first limit's clock).
pub(super) struct First<'a> {
    pub(super) one_reading: Option<&'a dyn Limit>,
}

impl Prefix for First<'_> {
    #[inline]
    fn with(&mut self, cx: &mut Decide, then: &mut dyn Then) -> Verdict {
        if let Some(limit) = self.one_reading {
            cx.now = Some(limit.reading());
        }
        then.go(cx)
    }
}

/// What follows the last limit's take: the request is admitted.
struct Done;

impl Then for Done {
    #[inline]
    fn go(&mut self, _: &mut Decide) -> Verdict {
        Verdict::Admitted
    }
}

/// One limit of a [`Limits`] layer, its types erased.
pub(super) trait Limit: Send + Sync {
    fn name(&self) -> &str;
    /// The names its items can carry: its own, and for tiers `name.tier` for
    /// each tier.
    fn item_names(&self) -> Vec<String>;
    /// The policy item it advertises for every key, when it has no tiers.
    fn cached_item(&self) -> Option<&[u8]>;
    /// The most permits one request can get, whatever its key.
    fn capacity(&self) -> u32;
    /// Why the request has no key for this limit, if it has none.
    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial>;
    /// [`GateLimiter::shared_readings`] of its limiter.
    fn shared_readings(&self) -> Option<usize>;
    /// A reading of its limiter's clock.
    fn reading(&self) -> u64;
    /// The challenge of a 401 for a key this limit did not find.
    fn challenge(&self) -> HeaderValue;
    /// Find this limit's key and then `rest`'s; once every key is found,
    /// take from `before`'s limits, this one and `rest`, in order, all or
    /// nothing.
    fn walk(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
        before: &mut dyn Prefix,
    ) -> Verdict;
    /// The wait `n` permits would have now, if this limit would refuse them.
    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter>;
    /// Whether `n` permits are beyond what this limit can ever give the
    /// request's key now: its quota changed (a live one) below the cost.
    fn beyond(&self, head: &RequestHead<'_>, n: u32) -> bool;
    /// This limit's item as it stands now: on a denial (`refused`), with
    /// the wait for `n` permits if it would refuse them too.
    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items);
}

/// A limit's name, extractor and limiter.
pub(super) struct Entry<X, L> {
    pub(super) name: String,
    pub(super) extractor: X,
    pub(super) limiter: Arc<L>,
    /// The policy item, for a limit without tiers.
    pub(super) cached: Option<Cached>,
}

impl<X, L> Limit for Entry<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn item_names(&self) -> Vec<String> {
        let tiers = self.limiter.tier_names();
        let mut names = Vec::with_capacity(1 + tiers.len());
        names.push(self.name.clone());
        names.extend(tiers.iter().map(|tier| format!("{}.{tier}", self.name)));
        names
    }

    fn cached_item(&self) -> Option<&[u8]> {
        self.cached.as_ref().map(|c| &*c.item)
    }

    fn capacity(&self) -> u32 {
        self.limiter.min_capacity()
    }

    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial> {
        if self.extractor.extract(head).is_some() {
            return None;
        }
        Some(match self.extractor.misconfiguration(head) {
            Some(problem) => Denial::Misconfigured(problem),
            None => Denial::Refused(Outcome::Unauthorized),
        })
    }

    fn challenge(&self) -> HeaderValue {
        self.extractor.challenge()
    }

    fn shared_readings(&self) -> Option<usize> {
        self.limiter.shared_readings()
    }

    #[inline]
    fn reading(&self) -> u64 {
        self.limiter.reading()
    }

    #[inline]
    fn walk(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
        before: &mut dyn Prefix,
    ) -> Verdict {
        let Some(key) = self.extractor.extract(head) else {
            return cx.not_admitted(missing(&self.extractor, head));
        };
        let mut staged = Staged {
            entry: self,
            key: &*key,
            head,
            n,
            rest,
            before,
        };
        match rest.split_first() {
            None => staged.with(cx, &mut Done),
            Some((next, rest)) => next.walk(head, n, rest, cx, &mut staged),
        }
    }

    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter> {
        let key = self.extractor.extract(head)?;
        self.limiter.stage_peek(&key, n).retry_after()
    }

    fn beyond(&self, head: &RequestHead<'_>, n: u32) -> bool {
        self.extractor
            .extract(head)
            .is_some_and(|key| n > self.limiter.capacity_for(&key))
    }

    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items) {
        let Some(key) = self.extractor.extract(head) else {
            return;
        };
        let state = if refused {
            now_state(&*self.limiter, &key, n)
        } else {
            State::Remaining(now_remaining(&*self.limiter, &key))
        };
        items.push(
            &self.name,
            self.cached.as_ref(),
            self.limiter.advertise_for(&key),
            &state,
        );
    }
}

/// One limit with its key found: the prefix of the walk through it.
struct Staged<'a, 'h, X: KeyExtractor, L> {
    entry: &'a Entry<X, L>,
    key: &'a X::Lookup,
    head: &'a RequestHead<'h>,
    n: u32,
    /// The limits after this one.
    rest: &'a [Box<dyn Limit>],
    before: &'a mut dyn Prefix,
}

impl<X, L> Prefix for Staged<'_, '_, X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    #[inline]
    fn with(&mut self, cx: &mut Decide, then: &mut dyn Then) -> Verdict {
        let mut take = Take {
            entry: self.entry,
            key: self.key,
            head: self.head,
            n: self.n,
            rest: self.rest,
            then,
        };
        self.before.with(cx, &mut take)
    }
}

/// One limit's take, then `then`; given back if `then` is not admitted.
struct Take<'a, 'h, X: KeyExtractor, L> {
    entry: &'a Entry<X, L>,
    key: &'a X::Lookup,
    head: &'a RequestHead<'h>,
    n: u32,
    rest: &'a [Box<dyn Limit>],
    then: &'a mut dyn Then,
}

impl<X, L> Then for Take<'_, '_, X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    #[inline]
    fn go(&mut self, cx: &mut Decide) -> Verdict {
        let (entry, key, head, n, rest) = (self.entry, self.key, self.head, self.n, self.rest);
        let by = cx.depth;
        // The key's limiter (its tier's, for tiers: the tier function is
        // called once, and the request is decided, given back, counted and
        // advertised in that one tier).
        let (limiter, tier) = entry.limiter.decider(key);
        let (decision, receipt) = match cx.now {
            Some(now) => limiter.stage_take_at(key, n, now),
            None => limiter.stage_take(key, n),
        };
        let KeyedDecision::Allowed { remaining } = decision else {
            if n > limiter.capacity_for(key) {
                return cx.not_admitted(beyond_capacity());
            }
            return cx.not_admitted(refused(by, decision, rest, head, n));
        };
        if cx.advertise && !cx.keep {
            cx.items.push_at(
                by,
                &entry.name,
                entry.cached.as_ref(),
                limiter.advertise_for(key).map(|a| a.in_tier(tier)),
                &State::Remaining(remaining),
            );
        }
        cx.depth += 1;
        // Given back should a later limit's user code (a key's `Hash`, an
        // extractor asked again for a refusal's wait) panic: the request is
        // then admitted by none, as by a refusal.
        let mut unwinding = GiveBackOnUnwind::<X, L> {
            limiter,
            key,
            receipt,
        };
        let verdict = self.then.go(cx);
        let receipt = unwinding.receipt.take();
        // Counted in the limiter's stats only when the request is admitted
        // (the take counted a denial, and nothing else): one a later limit
        // refuses is not, as its permits go back.
        if matches!(verdict, Verdict::Admitted) && !cx.remote {
            limiter.stage_count_admission(key);
        }
        match (&verdict, receipt) {
            // Kept even when the admission wrote nothing (so took nothing):
            // its limit is still told after the response.
            (Verdict::Admitted, receipt) if cx.keep => keep(cx, entry, key, receipt, n),
            (Verdict::Admitted, _) => {}
            (_, Some(receipt)) => give_back::<X, L>(limiter, key, receipt),
            (_, None) => {}
        }
        verdict
    }
}

/// An admission's receipt while the limits after it decide: given back if
/// they panic (taken out, so left alone, once they return).
struct GiveBackOnUnwind<'a, X: KeyExtractor, L>
where
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    /// The key's limiter (its tier's), which took the receipt.
    limiter: &'a L::Decider,
    key: &'a X::Lookup,
    receipt: Option<Receipt>,
}

impl<X, L> Drop for GiveBackOnUnwind<'_, X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            give_back::<X, L>(self.limiter, self.key, receipt);
        }
    }
}

/// What a request gets when a limit can never admit its cost: a live
/// quota was changed below it after the layer was built (which refuses
/// such a cost). A 429 would name a wait after which the request is refused
/// again, forever.
#[cold]
#[inline(never)]
fn beyond_capacity() -> Why {
    Why::Missing {
        denial: Denial::Misconfigured(BEYOND_CAPACITY),
        challenge: HeaderValue::from_static("ApiKey"),
    }
}

/// The problem [`beyond_capacity`] reports.
pub(super) const BEYOND_CAPACITY: &str =
    "a limit's quota was changed below the layer's cost: no request can be admitted";

/// A refusal by limit `by`, with the longest wait of its decision and of
/// every later limit that would refuse too (those are asked without taking
/// anything). Out of line and cold, as every path off an admission is here:
/// the admitted walk stays a few cache lines of code per limit.
#[cold]
#[inline(never)]
fn refused(
    by: usize,
    decision: KeyedDecision,
    rest: &[Box<dyn Limit>],
    head: &RequestHead<'_>,
    n: u32,
) -> Why {
    if rest.iter().any(|later| later.beyond(head, n)) {
        return beyond_capacity();
    }
    let decision = with_longest(
        decision,
        rest.iter().filter_map(|later| later.wait(head, n)),
    );
    Why::Refused { by, decision }
}

/// `decision`, a denial, with the longest of its retry-after and `waits`.
pub(super) fn with_longest(
    decision: KeyedDecision,
    waits: impl Iterator<Item = RetryAfter>,
) -> KeyedDecision {
    let longest = waits.chain(decision.retry_after()).max();
    match (decision, longest) {
        (KeyedDecision::KeyLimit { .. }, Some(retry_after)) => {
            KeyedDecision::KeyLimit { retry_after }
        }
        (_, Some(retry_after)) => KeyedDecision::Denied { retry_after },
        (other, None) => other,
    }
}

/// Keep an admission's ticket, to settle it after the response (or give it
/// back if a remote limit refuses). Kept even when the admission wrote
/// nothing (so took nothing): its limit is still told after the response.
#[inline(never)]
fn keep<X, L>(
    cx: &mut Decide,
    entry: &Entry<X, L>,
    key: &X::Lookup,
    receipt: Option<Receipt>,
    n: u32,
) where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    cx.tickets.push(Box::new(Held::<X, L> {
        name: entry.name.clone(),
        limiter: Arc::clone(&entry.limiter),
        key: key.to_owned(),
        receipt,
        n,
    }));
}

/// Give an admission back after a later limit refused. Declined or not, the
/// answer is the same denial.
#[cold]
#[inline(never)]
fn give_back<X, L>(limiter: &L::Decider, key: &X::Lookup, receipt: Receipt)
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    let _ = limiter.stage_give_back(key, receipt);
}

/// Why a request without `extractor`'s key is not admitted: nothing was
/// taken.
#[cold]
#[inline(never)]
fn missing<X: KeyExtractor>(extractor: &X, head: &RequestHead<'_>) -> Why {
    Why::Missing {
        denial: match extractor.misconfiguration(head) {
            Some(problem) => Denial::Misconfigured(problem),
            None => Denial::Refused(Outcome::Unauthorized),
        },
        challenge: extractor.challenge(),
    }
}
