//! The [`Limited`] service: a request decided by the in-process limits at
//! once, by the remote ones in its response future, then answered.

use super::decide::{Decide, First, Verdict, Why, with_longest};
use super::items::{Items, State};
use super::remote::{RemoteOutcome, push_remote, remote_phase};
use super::settle::{Settlement, Ticket};
use super::*;

/// A service behind a [`Limits`] layer. It must be `Clone` (axum's routers
/// and handlers are; wrap another in `tower::buffer::Buffer`): a request
/// that waits for a limit in Redis takes the readied service with it and
/// leaves a clone for the next.
pub struct Limited<Svc, R = PlainDenial> {
    pub(super) inner: Svc,
    pub(super) layer: Limits<R>,
}

impl<Svc: Clone, R: Clone> Clone for Limited<Svc, R> {
    fn clone(&self) -> Self {
        Limited {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, R> fmt::Debug for Limited<Svc, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<Svc, R, ReqBody, ResBody> Service<Request<ReqBody>> for Limited<Svc, R>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    R: DenialResponse<ResBody>,
    ReqBody: 'static,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = LimitedFuture<Svc, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.layer.shared;
        let head = RequestHead::of(&request);
        // Every key before any permit, so a request without one spends
        // nothing: the remote limits' here, the in-process limits' in the
        // walk, before its first take.
        let remote_keys: Option<Vec<Vec<u8>>> = if shared.remote.is_empty() {
            Some(Vec::new())
        } else {
            shared.remote.iter().map(|r| r.key(&head)).collect()
        };
        let Some(remote_keys) = remote_keys else {
            return self.remote_key_missing(&request, &head);
        };
        let remote = !remote_keys.is_empty();
        let mut decide = Decide {
            advertise: shared.advertise,
            // A remote limit may still refuse: the in-process admissions
            // are kept, to give them back then.
            keep: remote || shared.settles(),
            remote,
            items: Items::leaving_to(shared.policy_line.as_ref()),
            tickets: Vec::new(),
            depth: 0,
            now: None,
            why: None,
        };
        let verdict = match shared.limits.split_first() {
            None => Verdict::Admitted,
            Some((first, rest)) => {
                let mut start = First {
                    one_reading: shared.one_reading.then_some(&**first),
                };
                first.walk(&head, shared.cost, rest, &mut decide, &mut start)
            }
        };
        match verdict {
            Verdict::Admitted if remote => self.go_remote(request, remote_keys, decide.tickets),
            Verdict::Admitted => {
                shared.counts.add(ADMITTED, thread_slot());
                let (fields, settle) = if decide.keep {
                    // Told after the response is settled.
                    let settlement = Settlement {
                        shared: Arc::clone(shared),
                        tickets: decide.tickets,
                        remote: Vec::new(),
                    };
                    (None, Some(settlement))
                } else {
                    (decide.items.fields(shared.policy_line.as_ref()), None)
                };
                LimitedFuture::admitted(self.inner.call(request), fields, settle)
            }
            Verdict::NotAdmitted => match decide.why {
                Some(Why::Refused { by, decision }) => self.refused(&request, &head, by, decision),
                Some(Why::Missing { denial, challenge }) => {
                    self.missing(&request, denial, challenge)
                }
                // The walk says why whenever it does not admit; were it not
                // to, a 401, which spends nothing (every take was given back).
                None => self.unauthorized(&request),
            },
        }
    }
}

impl<Svc, R> Limited<Svc, R> {
    // The paths off an in-process admission are out of line (and the
    // denials cold), so the admitted path of `call` stays a few cache lines
    // of code: with several limits, the code a request runs through is what
    // its time depends on beyond its instructions (BENCHMARKS.md, "Several
    // limits on one request").

    /// A 429 from in-process limit `by`, with every limit's state after it
    /// (the refunds made).
    #[cold]
    #[inline(never)]
    fn refused<ReqBody, B, E>(
        &self,
        request: &Request<ReqBody>,
        head: &RequestHead<'_>,
        by: usize,
        decision: KeyedDecision,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
        R: DenialResponse<B>,
    {
        let shared = &self.layer.shared;
        shared.count_denial(by, decision);
        // An earlier limit whose give-back declined may refuse now too.
        let decision = with_longest(
            decision,
            shared
                .limits
                .iter()
                .filter_map(|l| l.wait(head, shared.cost)),
        );
        let mut items = Items::default();
        shared.report(head, true, &mut items);
        let outcome = Outcome::from_decision(Some(decision));
        let response = deny(
            &self.layer.respond,
            &Denial::Refused(outcome),
            shared.challenge.as_ref(),
            || HeaderValue::from_static("ApiKey"),
            items.fields(shared.policy_line.as_ref()),
        );
        LimitedFuture::denied(closing(request, response))
    }

    /// Every in-process limit admitted: on to the remote limits, with the
    /// in-process admissions kept (`tickets`) to give back if one refuses.
    #[inline(never)]
    fn go_remote<ReqBody, B, E>(
        &mut self,
        request: Request<ReqBody>,
        remote_keys: Vec<Vec<u8>>,
        tickets: Vec<Box<dyn Ticket>>,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E> + Clone,
        R: DenialResponse<B>,
        ReqBody: 'static,
    {
        let shared = &self.layer.shared;
        // `poll_ready` readied `inner`: that one goes with the request, a
        // clone stays for the next.
        let clone = self.inner.clone();
        let inner = core::mem::replace(&mut self.inner, clone);
        let decided = remote_phase(Arc::clone(shared), remote_keys, shared.cost);
        let layer = self.layer.clone();
        LimitedFuture::deciding(
            decided,
            Waiting {
                inner,
                request,
                tickets: Unsettled(tickets),
                finish: Box::new(move |outcome, request, tickets| {
                    layer.finish_remote(outcome, request, tickets)
                }),
            },
        )
    }

    /// A remote limit found no key: the first limit without one answers,
    /// in-process ones first.
    #[cold]
    #[inline(never)]
    fn remote_key_missing<ReqBody, B, E>(
        &self,
        request: &Request<ReqBody>,
        head: &RequestHead<'_>,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
        R: DenialResponse<B>,
    {
        let shared = &self.layer.shared;
        let missing = shared
            .limits
            .iter()
            .find_map(|l| l.missing(head).map(|d| (d, l.challenge())))
            .or_else(|| {
                let mut remote = shared.remote.iter();
                remote.find_map(|r| r.missing(head).map(|d| (d, r.challenge())))
            });
        match missing {
            Some((denial, challenge)) => self.missing(request, denial, challenge),
            // An extractor that found a key once and not again.
            None => self.unauthorized(request),
        }
    }

    /// A 401 (or a misconfiguration's 500) for a limit that found no key.
    #[cold]
    #[inline(never)]
    fn missing<ReqBody, B, E>(
        &self,
        request: &Request<ReqBody>,
        denial: Denial,
        challenge: HeaderValue,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
        R: DenialResponse<B>,
    {
        let shared = &self.layer.shared;
        match denial {
            Denial::Misconfigured(problem) => shared.reported.report(problem),
            _ => shared.counts.add(UNAUTHORIZED, thread_slot()),
        }
        let response = deny(
            &self.layer.respond,
            &denial,
            shared.challenge.as_ref(),
            || challenge,
            None,
        );
        LimitedFuture::denied(closing(request, response))
    }

    /// A 401 for a key that an extractor found once and not again.
    #[cold]
    #[inline(never)]
    pub(super) fn unauthorized<ReqBody, B, E>(
        &self,
        request: &Request<ReqBody>,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
        R: DenialResponse<B>,
    {
        let shared = &self.layer.shared;
        shared.counts.add(UNAUTHORIZED, thread_slot());
        let response = deny(
            &self.layer.respond,
            &Denial::Refused(Outcome::Unauthorized),
            shared.challenge.as_ref(),
            || HeaderValue::from_static("ApiKey"),
            None,
        );
        LimitedFuture::denied(closing(request, response))
    }
}

impl<R> Limits<R> {
    /// How to go on once the remote limits have decided a request every
    /// in-process limit admitted (`tickets`).
    pub(super) fn finish_remote<ReqBody, B>(
        &self,
        outcome: RemoteOutcome,
        request: &Request<ReqBody>,
        tickets: Vec<Box<dyn Ticket>>,
    ) -> Finish<B>
    where
        R: DenialResponse<B>,
    {
        let shared = &self.shared;
        let head = RequestHead::of(request);
        match outcome {
            RemoteOutcome::Admitted(taken) => {
                shared.counts.add(ADMITTED, thread_slot());
                // Every limit admitted: now the in-process ones count it.
                for ticket in &tickets {
                    ticket.count_admission();
                }
                let settlement = Settlement {
                    shared: Arc::clone(shared),
                    tickets,
                    remote: taken,
                };
                if shared.settles() {
                    return Finish::Admit(None, Some(settlement));
                }
                // Nothing to settle: the permits stay spent, and each limit
                // is told as it stands.
                let mut items = Items::default();
                shared.report(&head, false, &mut items);
                settlement.report_remote(&mut items, |_| 0);
                Finish::Admit(items.fields(shared.policy_line.as_ref()), None)
            }
            RemoteOutcome::Refused {
                by,
                decision,
                taken,
            } => {
                // The in-process admissions go back, the last first; the
                // answer is the same denial whether each refund is exact.
                for ticket in tickets.into_iter().rev() {
                    let _ = ticket.give_back();
                }
                let decision = KeyedDecision::from(decision);
                let own_wait = decision.retry_after();
                shared.count_denial(shared.limits.len() + by, decision);
                // A give-back declined (a busy word changed during the round
                // trip) keeps an in-process permit spent: that limit may
                // refuse now too, and the wait is never shorter than its. So
                // does a limit in Redis that kept its permits and would now
                // refuse the same request (its peek's wait).
                let decision = with_longest(
                    decision,
                    shared
                        .limits
                        .iter()
                        .filter_map(|l| l.wait(&head, shared.cost))
                        .chain(taken.iter().filter_map(|(_, state)| match state {
                            State::Wait(wait) => Some(*wait),
                            State::Remaining(_) => None,
                        })),
                );
                let mut items = Items::default();
                shared.report(&head, true, &mut items);
                if shared.advertise {
                    for (index, state) in &taken {
                        push_remote(&mut items, shared, *index, state);
                    }
                    if let Some(wait) = own_wait {
                        push_remote(&mut items, shared, by, &State::Wait(wait));
                    }
                }
                let outcome = Outcome::from_decision(Some(decision));
                let response = deny(
                    &self.respond,
                    &Denial::Refused(outcome),
                    shared.challenge.as_ref(),
                    || HeaderValue::from_static("ApiKey"),
                    items.fields(None),
                );
                Finish::Deny(response)
            }
        }
    }
}

/// `response` to a denied `request`, telling the client to reconnect when
/// the request's body was left unread (see [`close_if_body_unread`]).
pub(super) fn closing<ReqBody, B>(
    request: &Request<ReqBody>,
    mut response: Response<B>,
) -> Response<B> {
    close_if_body_unread(request.version(), request.headers(), response.headers_mut());
    response
}

/// How a request goes on once its remote limits decided.
pub(super) enum Finish<B> {
    Admit(Option<Fields>, Option<Settlement>),
    Deny(Response<B>),
}

/// Builds how a request goes on from its remote limits' answer.
pub(super) type FinishWith<ReqBody, B> =
    Box<dyn FnOnce(RemoteOutcome, &Request<ReqBody>, Vec<Box<dyn Ticket>>) -> Finish<B> + Send>;

/// A request waiting for its remote limits.
pub(super) struct Waiting<Svc, ReqBody, B> {
    pub(super) inner: Svc,
    pub(super) request: Request<ReqBody>,
    pub(super) tickets: Unsettled,
    pub(super) finish: FinishWith<ReqBody, B>,
}

/// The in-process admissions of a request waiting for its remote limits:
/// given back (exactly or not at all) if the request is dropped before they
/// answer (a timeout around the service, a client gone), as a refusal
/// would give them back; the request never reached the service.
pub(super) struct Unsettled(pub(super) Vec<Box<dyn Ticket>>);

impl Unsettled {
    /// The admissions, for the remote limits' answer to settle.
    fn into_inner(mut self) -> Vec<Box<dyn Ticket>> {
        core::mem::take(&mut self.0)
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        for ticket in self.0.drain(..).rev() {
            let _ = ticket.give_back();
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Limited`] service's response: the remote limits'
    /// decision first, when there are any, then the inner service's response
    /// or the denial.
    pub struct LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>>,
    {
        // The inner future alone in its variant, the fields and the
        // settlement beside the enum: the inner service's future is then
        // written where it stays, not copied through a temporary.
        #[pin]
        state: Phase<Svc, ReqBody, B>,
        fields: Option<Fields>,
        settle: Option<Settlement>,
    }
}

pin_project_lite::pin_project! {
    #[project = PhaseProj]
    enum Phase<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>>,
    {
        Deciding {
            decided: BoxFuture<RemoteOutcome>,
            waiting: Option<Waiting<Svc, ReqBody, B>>,
        },
        Admitted {
            #[pin]
            future: Svc::Future,
        },
        Denied {
            response: Option<Response<B>>,
        },
    }
}

impl<Svc, ReqBody, B> LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    #[inline(always)]
    pub(super) fn admitted(
        future: Svc::Future,
        fields: Option<Fields>,
        settle: Option<Settlement>,
    ) -> Self {
        LimitedFuture {
            state: Phase::Admitted { future },
            fields,
            settle,
        }
    }

    pub(super) fn denied(response: Response<B>) -> Self {
        LimitedFuture {
            state: Phase::Denied {
                response: Some(response),
            },
            fields: None,
            settle: None,
        }
    }

    pub(super) fn deciding(
        decided: BoxFuture<RemoteOutcome>,
        waiting: Waiting<Svc, ReqBody, B>,
    ) -> Self {
        LimitedFuture {
            state: Phase::Deciding {
                decided,
                waiting: Some(waiting),
            },
            fields: None,
            settle: None,
        }
    }
}

impl<Svc, ReqBody, B, E> Future for LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
{
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.state.project() {
                PhaseProj::Deciding { decided, waiting } => {
                    let outcome = match decided.as_mut().poll(cx) {
                        Poll::Ready(outcome) => outcome,
                        Poll::Pending => return Poll::Pending,
                    };
                    // Polled again after completing: stay pending rather
                    // than panic.
                    let Some(Waiting {
                        mut inner,
                        request,
                        tickets,
                        finish,
                    }) = waiting.take()
                    else {
                        return Poll::Pending;
                    };
                    match finish(outcome, &request, tickets.into_inner()) {
                        Finish::Admit(fields, settle) => {
                            *this.fields = fields;
                            *this.settle = settle;
                            Phase::Admitted {
                                future: inner.call(request),
                            }
                        }
                        Finish::Deny(response) => Phase::Denied {
                            response: Some(closing(&request, response)),
                        },
                    }
                }
                PhaseProj::Admitted { future } => {
                    return match future.poll(cx) {
                        Poll::Ready(Ok(response)) => {
                            let (mut parts, body) = response.into_parts();
                            let fields = match this.settle.take() {
                                Some(settlement) => settlement.settle(&parts),
                                None => this.fields.take(),
                            };
                            if let Some([Some(policy), Some(value)]) = fields {
                                append_items(&mut parts.headers, policy, value);
                            }
                            Poll::Ready(Ok(Response::from_parts(parts, body)))
                        }
                        // An error from the service: the permits stay spent.
                        other => other,
                    };
                }
                // Polled again after completing: stay pending rather than
                // panic.
                PhaseProj::Denied { response } => {
                    return match response.take() {
                        Some(response) => Poll::Ready(Ok(response)),
                        None => Poll::Pending,
                    };
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<Svc, ReqBody, B> fmt::Debug for LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedFuture").finish_non_exhaustive()
    }
}
