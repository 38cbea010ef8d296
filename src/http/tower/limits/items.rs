//! The `RateLimit-Policy` and `RateLimit` items a combined layer writes.

use super::*;

/// The `RateLimit-Policy` and `RateLimit` items being written, as bytes
/// (written by hand: `core::fmt` costs several times the decision itself).
pub(super) struct Items {
    pub(super) policy: Vec<u8>,
    pub(super) value: List,
    /// Items written.
    pub(super) count: usize,
    /// Whether every policy item was the limit's cached one.
    pub(super) all_cached: bool,
    /// Whether leading cached policy items may be left unwritten, to be
    /// read from the layer's [`PolicyLine`] (which then exists).
    lazy: bool,
    /// The leading policy items left unwritten: those of limits `0 ..
    /// skipped`, each its cached item; `policy` holds the items after them.
    skipped: usize,
}

impl Default for Items {
    fn default() -> Items {
        Items {
            policy: Vec::new(),
            value: List::new(),
            count: 0,
            all_cached: true,
            lazy: false,
            skipped: 0,
        }
    }
}

/// The whole `RateLimit-Policy` value of a layer whose every limit has a
/// cached item (no tiers): each limit's item in order, and where each ends.
pub(super) struct PolicyLine {
    pub(super) value: HeaderValue,
    /// `ends[i]`: the end of limit `i`'s item in `value`.
    pub(super) ends: Box<[usize]>,
}

impl PolicyLine {
    /// The line of `items`, one per limit; `None` for no limits, or a
    /// value a header cannot carry (names are validated, so never).
    pub(super) fn new(items: &[&[u8]]) -> Option<PolicyLine> {
        if items.is_empty() {
            return None;
        }
        let mut line = Vec::new();
        let mut ends = Vec::with_capacity(items.len());
        for item in items {
            if !line.is_empty() {
                line.extend_from_slice(b", ");
            }
            line.extend_from_slice(item);
            ends.push(line.len());
        }
        Some(PolicyLine {
            value: HeaderValue::from_bytes(&line).ok()?,
            ends: ends.into(),
        })
    }
}

/// A limit's `RateLimit-Policy` item, written once for the quota and window
/// it advertised when it was added (a limit without tiers).
pub(super) struct Cached {
    pub(super) quota: u32,
    pub(super) window: Duration,
    pub(super) item: Box<[u8]>,
    /// The start of its `RateLimit` item, `"name";r=`.
    pub(super) value: Box<[u8]>,
}

impl Cached {
    pub(super) fn new(name: &str, (quota, window): (u32, Duration)) -> Cached {
        let mut item = Vec::new();
        push_policy(&mut item, name, None, quota, window);
        let mut value = Vec::new();
        push_name(&mut value, name, None);
        value.extend_from_slice(b";r=");
        Cached {
            quota,
            window,
            item: item.into(),
            value: value.into(),
        }
    }

    /// Whether it is the item of what `advertised` says: no tier, the same
    /// quota and window.
    #[inline]
    fn is_for(&self, advertised: &Advertised<'_>) -> bool {
        advertised.tier.is_none()
            && (self.quota, self.window) == (advertised.quota, advertised.window)
    }
}

/// One limit's state, for its `RateLimit` item.
pub(super) enum State {
    Remaining(u32),
    Wait(RetryAfter),
}

impl Items {
    /// Items for a walk over the limits in order ([`push_at`](Self::push_at)),
    /// leaving the leading cached policy items to `line` when there is one.
    pub(super) fn leaving_to(line: Option<&PolicyLine>) -> Items {
        Items {
            lazy: line.is_some(),
            ..Items::default()
        }
    }

    /// [`push`](Self::push) for limit `index`, pushed in order: while every
    /// item before it was its limit's cached one and left to the line, its
    /// own cached item is left there too (no bytes written or allocated for
    /// it: the admitted path of a layer without tiers).
    #[inline]
    pub(super) fn push_at(
        &mut self,
        index: usize,
        name: &str,
        cached: Option<&Cached>,
        advertised: Option<Advertised<'_>>,
        state: &State,
    ) {
        if self.lazy
            && index == self.skipped
            && self.policy.is_empty()
            && let (Some(cached), Some(advertised)) = (cached, &advertised)
            && cached.is_for(advertised)
        {
            self.skipped += 1;
            self.count += 1;
            let value = &mut self.value;
            if !value.is_empty() {
                value.extend(b", ");
            }
            value.extend(&cached.value);
            push_state(value, state);
            return;
        }
        self.push(name, cached, advertised, state);
    }

    pub(super) fn push(
        &mut self,
        name: &str,
        cached: Option<&Cached>,
        advertised: Option<Advertised<'_>>,
        state: &State,
    ) {
        let Some(advertised) = advertised else {
            return;
        };
        self.count += 1;
        let (policy, value) = (&mut self.policy, &mut self.value);
        // The value has an item for every item pushed; the policy may be
        // empty after some, left to the line by `push_at`. (The first item
        // is found by one test, of the value, rather than one per list: a
        // denial writes every item through here.)
        if value.is_empty() {
            *policy = Vec::with_capacity(96);
        } else {
            value.extend(b", ");
            next_item(policy);
        }
        match cached {
            Some(cached) if cached.is_for(&advertised) => {
                policy.extend_from_slice(&cached.item);
                value.extend(&cached.value);
            }
            _ => {
                self.all_cached = false;
                push_policy(
                    policy,
                    name,
                    advertised.tier,
                    advertised.quota,
                    advertised.window,
                );
                // `"name"` or `"name.tier"`, as `push_name` writes it.
                value.extend(b"\"");
                value.extend(name.as_bytes());
                if let Some(tier) = advertised.tier {
                    value.extend(b".");
                    value.extend(tier.as_bytes());
                }
                value.extend(b"\";r=");
            }
        }
        push_state(value, state);
    }

    /// The two field values; `line` is the whole `RateLimit-Policy` value
    /// of the layer's limits, each with its cached item: shared rather than
    /// copied when every item written was that, and the source of the
    /// items left unwritten.
    #[inline]
    pub(super) fn fields(&self, line: Option<&PolicyLine>) -> Option<Fields> {
        if self.count == 0 {
            return None;
        }
        self.values(line)
    }

    /// [`fields`](Self::fields) for a list with items: out of line, so a
    /// request with nothing to advertise runs only the check above.
    #[inline(never)]
    fn values(&self, line: Option<&PolicyLine>) -> Option<Fields> {
        let policy = match line {
            Some(line) if self.all_cached && self.count == line.ends.len() => {
                Some(line.value.clone())
            }
            // Items left unwritten are the line's first `skipped`, and it
            // exists whenever any were.
            Some(line) if self.skipped > 0 => {
                let mut bytes = line.value.as_bytes()[..line.ends[self.skipped - 1]].to_vec();
                if !self.policy.is_empty() {
                    bytes.extend_from_slice(b", ");
                    bytes.extend_from_slice(&self.policy);
                }
                HeaderValue::from_bytes(&bytes).ok()
            }
            // Validated names and numbers make valid values.
            _ => HeaderValue::from_bytes(&self.policy).ok(),
        };
        Some([policy, HeaderValue::from_bytes(self.value.as_bytes()).ok()])
    }
}

/// `list` ready for its next item: allocated at once when empty (not grown
/// from nothing), the separator written otherwise.
#[inline]
fn next_item(list: &mut Vec<u8>) -> &mut Vec<u8> {
    if list.is_empty() {
        *list = Vec::with_capacity(96);
    } else {
        list.extend_from_slice(b", ");
    }
    list
}

/// A limit's state after its name in its `RateLimit` item: `r`, and `t` when
/// it waits.
fn push_state(value: &mut List, state: &State) {
    match state {
        State::Remaining(r) => value.extend(Digits::of((*r).into()).as_bytes()),
        State::Wait(wait) => {
            value.extend(b"0;t=");
            value.extend(Digits::of(wait.header_secs()).as_bytes());
        }
    }
}

/// The bytes a `RateLimit` value keeps on the stack: a few limits' items
/// (`"name";r=N` is 10 to 25 bytes for short names).
const INLINE: usize = 128;

/// A field value being written: on the stack while it fits, as a few
/// limits' items do, so that writing them allocates nothing; on the heap
/// past that.
pub(super) struct List {
    inline: [u8; INLINE],
    /// The bytes of `inline` written, while there is no `heap`.
    len: usize,
    /// Every byte, once they outgrew `inline`.
    heap: Option<Vec<u8>>,
}

impl List {
    fn new() -> List {
        List {
            inline: [0; INLINE],
            len: 0,
            heap: None,
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match &self.heap {
            Some(heap) => heap,
            None => &self.inline[..self.len],
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// Append `bytes`.
    #[inline]
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        if self.heap.is_none()
            && let Some(room) = self.inline.get_mut(self.len..self.len + bytes.len())
        {
            room.copy_from_slice(bytes);
            self.len += bytes.len();
            return;
        }
        self.spilled().extend_from_slice(bytes);
    }

    /// The bytes on the heap, moved there on the first call.
    #[cold]
    #[inline(never)]
    fn spilled(&mut self) -> &mut Vec<u8> {
        let (inline, len) = (&self.inline, self.len);
        self.heap.get_or_insert_with(|| {
            let mut heap = Vec::with_capacity(2 * INLINE);
            heap.extend_from_slice(&inline[..len]);
            heap
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(fields: Option<Fields>, i: usize) -> Option<String> {
        fields
            .and_then(|f| f[i].clone())
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// Every combination of what three limits advertise (nothing, their
    /// cached item's policy, another quota, a tier) and of their states:
    /// leaving the leading cached items to the line writes the same fields
    /// as writing every item.
    #[test]
    fn items_left_to_the_line_make_the_same_fields_as_items_written() {
        let windows = [
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(3_600),
        ];
        let names = ["key", "ip", "all"];
        let cached: Vec<Cached> = names
            .iter()
            .zip(windows)
            .enumerate()
            .map(|(i, (name, window))| Cached::new(name, (10 * (i as u32 + 1), window)))
            .collect();
        let items: Vec<&[u8]> = cached.iter().map(|c| &*c.item).collect();
        let line = PolicyLine::new(&items).expect("a line");
        assert_eq!(
            line.value.to_str().unwrap(),
            r#""key";q=10;w=1, "ip";q=20;w=60, "all";q=30;w=3600"#
        );
        // 0: nothing advertised; 1: the cached policy; 2: another quota; 3: a tier.
        let advertised = |i: usize, how: u32| -> Option<Advertised<'static>> {
            let (quota, window) = (cached[i].quota, cached[i].window);
            match how {
                0 => None,
                1 => Some(Advertised {
                    quota,
                    window,
                    tier: None,
                }),
                2 => Some(Advertised {
                    quota: quota + 1,
                    window,
                    tier: None,
                }),
                _ => Some(Advertised {
                    quota,
                    window,
                    tier: Some("paid"),
                }),
            }
        };
        let mut compared = 0;
        for combo in 0..4u32.pow(3) {
            let hows: Vec<u32> = (0..3).map(|i| combo / 4u32.pow(i) % 4).collect();
            let states = |i: usize| match (combo + i as u32) % 3 {
                0 => State::Remaining(0),
                1 => State::Remaining(7 + i as u32),
                _ => State::Wait(RetryAfter::from_nanos(1_500_000_000)),
            };
            let mut written = Items::default();
            let mut left = Items::leaving_to(Some(&line));
            for (i, how) in hows.iter().enumerate() {
                written.push(names[i], Some(&cached[i]), advertised(i, *how), &states(i));
                left.push_at(
                    i,
                    names[i],
                    Some(&cached[i]),
                    advertised(i, *how),
                    &states(i),
                );
            }
            let written = written.fields(Some(&line));
            let left = left.fields(Some(&line));
            assert_eq!(
                field(left.clone(), 0),
                field(written.clone(), 0),
                "{hows:?}"
            );
            assert_eq!(field(left, 1), field(written.clone(), 1), "{hows:?}");
            if written.is_some() {
                compared += 1;
            }
        }
        // All but the combination advertising nothing.
        assert_eq!(compared, 63);
    }

    /// A list written in pieces holds their bytes in order, on the stack or,
    /// past its room there, on the heap: whatever the sizes of the pieces
    /// and wherever one crosses the end of the room.
    #[test]
    fn a_list_holds_every_byte_written_across_its_room() {
        for piece in [1, 2, 3, 7, 20, 63, 64, 65, INLINE - 1, INLINE, INLINE + 1] {
            for pieces in 0..=(3 * INLINE / piece + 1) {
                let mut list = List::new();
                let mut expected = Vec::new();
                for i in 0..pieces {
                    let bytes: Vec<u8> = (0..piece).map(|j| b'a' + ((i + j) % 26) as u8).collect();
                    list.extend(&bytes);
                    expected.extend_from_slice(&bytes);
                }
                assert_eq!(list.as_bytes(), &expected[..], "{pieces} pieces of {piece}");
                assert_eq!(list.is_empty(), expected.is_empty());
                assert_eq!(list.heap.is_some(), expected.len() > INLINE);
            }
        }
    }

    /// Items too long for a list's room on the stack (three limits with
    /// names of 64 characters, one waiting) are written whole.
    #[test]
    fn items_past_the_stack_room_are_written_whole() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|c| c.repeat(64)).collect();
        let cached: Vec<Cached> = names
            .iter()
            .map(|name| Cached::new(name, (10, Duration::from_secs(1))))
            .collect();
        let items: Vec<&[u8]> = cached.iter().map(|c| &*c.item).collect();
        let line = PolicyLine::new(&items).expect("a line");
        let advertised = Some(Advertised {
            quota: 10,
            window: Duration::from_secs(1),
            tier: None,
        });
        let mut left = Items::leaving_to(Some(&line));
        let states = [
            State::Remaining(4_294_967_295),
            State::Wait(RetryAfter::from_nanos(2_500_000_000)),
            State::Remaining(0),
        ];
        for (i, state) in states.iter().enumerate() {
            left.push_at(i, &names[i], Some(&cached[i]), advertised, state);
        }
        let expected = format!(
            "\"{}\";r=4294967295, \"{}\";r=0;t=3, \"{}\";r=0",
            names[0], names[1], names[2]
        );
        assert!(expected.len() > INLINE);
        assert_eq!(field(left.fields(Some(&line)), 1), Some(expected));
        assert_eq!(
            field(left.fields(Some(&line)), 0).as_deref(),
            line.value.to_str().ok()
        );
    }

    /// The line is what writing each cached item in order would give, and
    /// each end is the end of its item.
    #[test]
    fn a_policy_line_ends_where_each_item_does() {
        let cached = [
            Cached::new("a", (5, Duration::from_secs(1))),
            Cached::new("b", (6, Duration::from_secs(2))),
        ];
        let items: Vec<&[u8]> = cached.iter().map(|c| &*c.item).collect();
        let line = PolicyLine::new(&items).expect("a line");
        let bytes = line.value.as_bytes();
        assert_eq!(&bytes[..line.ends[0]], &*cached[0].item);
        assert_eq!(line.ends[1], bytes.len());
        assert!(PolicyLine::new(&[]).is_none());
    }
}
