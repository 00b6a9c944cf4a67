//! [`Router`]: a service's table from opcode to typed handler.
//!
//! Every RPC carries its request and reply types ([`Rpc`]), so a handler need not
//! decode its payload nor encode its answer: it is registered for its RPC and gets the
//! decoded `R::Request`, and what it returns becomes the reply. A service builds its
//! router once and sends every request through it from `Service::handle`:
//!
//! ```ignore
//! fn router() -> Router<CoordinatorService> {
//!     Router::<CoordinatorService>::new("coordinator")
//!         .route::<Enlist>(|service, request| Box::pin(service.enlist(request)))
//!         .route::<CreateTable>(|service, request| Box::pin(service.create_table(request)))
//! }
//! ```
//!
//! # Kinds of route
//! * [`route`](Router::route) — the handler returns a future of
//!   `Result<R::Reply, Reply>`: `Ok` is answered with [`Reply::ok`], `Err` is the error
//!   reply the handler built (e.g. [`Reply::error`]`(status, detail)`).
//! * [`route_reply`](Router::route_reply) — the handler returns a future of the
//!   [`Reply`] itself, for handlers that build it otherwise ([`Reply::ok_with`],
//!   [`Reply::disconnect`]).
//! * [`route_now`](Router::route_now) — a handler that never waits, answered on the
//!   connection's task ([`handle_now`](Router::handle_now), which `Service::handle_now`
//!   calls) as well as through [`handle`](Router::handle).
//! * [`route_payload`](Router::route_payload) — the handler gets the payload as it
//!   came, undecoded: for handlers that decode it themselves (a hand-written decoder)
//!   or ignore it.
//!
//! # Answers the router gives itself
//! * A payload that does not decode as `R::Request` is answered exactly as
//!   [`Reply::decode`] answers it: `MalformedRequest` with the decoder's message; the
//!   handler is not called.
//! * An opcode with no route is answered `UnknownOpcode`, "`<service>` does not serve
//!   opcode `N`" ([`unknown_opcode`](Router::unknown_opcode)); `handle_now` answers it
//!   `None`, so it goes on to `handle`.
//!
//! # Lookup
//! The routes sit in a `Vec` indexed by the opcode less the lowest one routed: a lookup
//! is a subtraction and a bounds check, no search. A service's opcodes are one range of
//! at most 100 (see the `protocol` module), so the table is that long at most.
//!
//! Routing one opcode twice is a programming error: it panics when the router is
//! built, i.e. at the service's start or in its first test.

use super::frame::Opcode;
use super::message::Rpc;
use super::server::{HandleFuture, Reply};
use crate::status::Status;
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

/// What a handler of [`Router::route`] or [`Router::route_reply`] returns: a boxed
/// future borrowing the service for `'a`, e.g. `Box::pin(service.enlist(request))`.
pub type RouteFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A handler the router awaits: payload in, reply future out.
type Later<S> = Box<dyn for<'a> Fn(&'a S, Bytes) -> HandleFuture<'a> + Send + Sync>;

/// A handler that answers at once.
type Now<S> = Box<dyn Fn(&S, &Bytes) -> Reply + Send + Sync>;

/// How a route answers.
enum Handler<S> {
    /// On the connection's task, or in `handle`.
    Now(Now<S>),
    /// In `handle` only.
    Later(Later<S>),
}

/// One opcode's entry of the table.
struct Route<S> {
    /// The RPC's name, for a duplicate's panic and for `Debug`.
    name: &'static str,
    handler: Handler<S>,
}

/// A service's handlers by opcode; see the module doc. `S` is the service the handlers
/// are methods of.
pub struct Router<S> {
    /// Names the service in the reply to an unknown opcode.
    service: &'static str,
    /// The opcode of `routes[0]`.
    first: u16,
    /// Entry `i` serves opcode `first + i`.
    routes: Vec<Option<Route<S>>>,
    /// The router holds no `S`, only functions of one: it is `Send` and `Sync` whatever
    /// `S` is.
    _service: PhantomData<fn(&S)>,
}

impl<S> fmt::Debug for Router<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: Vec<(u16, &str)> = self
            .opcodes_and_routes()
            .map(|(opcode, route)| (opcode.0, route.name))
            .collect();
        f.debug_struct("Router")
            .field("service", &self.service)
            .field("routes", &routes)
            .finish()
    }
}

/// Boxes an awaited handler (passing the closure through this bound gives it the
/// higher-ranked signature).
fn later<S, F>(handler: F) -> Handler<S>
where
    F: for<'a> Fn(&'a S, Bytes) -> HandleFuture<'a> + Send + Sync + 'static,
{
    Handler::Later(Box::new(handler))
}

/// Boxes an immediate handler.
fn now<S, F>(handler: F) -> Handler<S>
where
    F: Fn(&S, &Bytes) -> Reply + Send + Sync + 'static,
{
    Handler::Now(Box::new(handler))
}

impl<S: Sync + 'static> Router<S> {
    /// A router with no routes yet; `service` names the service in the reply to an
    /// opcode it does not serve ("backup does not serve opcode 299").
    pub fn new(service: &'static str) -> Router<S> {
        Router {
            service,
            first: 0,
            routes: Vec::new(),
            _service: PhantomData,
        }
    }

    /// Routes `R` to `handler`, which gets the decoded request and returns a future of
    /// its reply message (answered with [`Reply::ok`]) or of the error reply it built.
    ///
    /// # Panics
    /// If `R`'s opcode is routed already.
    pub fn route<R: Rpc + 'static>(
        self,
        handler: impl for<'a> Fn(&'a S, R::Request) -> RouteFuture<'a, Result<R::Reply, Reply>>
            + Send
            + Sync
            + 'static,
    ) -> Router<S> {
        self.add::<R>(later(move |service, payload| {
            match Reply::decode::<R::Request>(payload) {
                Ok(request) => {
                    let answer = handler(service, request);
                    Box::pin(async move {
                        match answer.await {
                            Ok(message) => Reply::ok(&message),
                            Err(error) => error,
                        }
                    })
                }
                Err(malformed) => Box::pin(std::future::ready(malformed)),
            }
        }))
    }

    /// Routes `R` to `handler`, which gets the decoded request and returns a future of
    /// the whole [`Reply`] (for replies built with [`Reply::ok_with`] or
    /// [`Reply::disconnect`]).
    ///
    /// # Panics
    /// If `R`'s opcode is routed already.
    pub fn route_reply<R: Rpc + 'static>(
        self,
        handler: impl for<'a> Fn(&'a S, R::Request) -> RouteFuture<'a, Reply> + Send + Sync + 'static,
    ) -> Router<S> {
        self.add::<R>(later(move |service, payload| {
            match Reply::decode::<R::Request>(payload) {
                Ok(request) => handler(service, request),
                Err(malformed) => Box::pin(std::future::ready(malformed)),
            }
        }))
    }

    /// Routes `R` to `handler`, which answers at once, without waiting: it runs on the
    /// connection's task when the service's `handle_now` asks
    /// [`handle_now`](Self::handle_now), and in the request's task through
    /// [`handle`](Self::handle). It must not block.
    ///
    /// # Panics
    /// If `R`'s opcode is routed already.
    pub fn route_now<R: Rpc + 'static>(
        self,
        handler: impl Fn(&S, R::Request) -> Result<R::Reply, Reply> + Send + Sync + 'static,
    ) -> Router<S> {
        self.add::<R>(now(
            move |service: &S, payload: &Bytes| match Reply::decode::<R::Request>(payload.clone()) {
                Ok(request) => match handler(service, request) {
                    Ok(message) => Reply::ok(&message),
                    Err(error) => error,
                },
                Err(malformed) => malformed,
            },
        ))
    }

    /// Routes `R` to `handler`, which gets the payload undecoded: it decodes the request
    /// itself (a hand-written decoder, a handler that decodes as its first step) or
    /// reads none.
    ///
    /// # Panics
    /// If `R`'s opcode is routed already.
    pub fn route_payload<R: Rpc + 'static>(
        self,
        handler: impl for<'a> Fn(&'a S, Bytes) -> RouteFuture<'a, Reply> + Send + Sync + 'static,
    ) -> Router<S> {
        self.add::<R>(later(handler))
    }

    /// Puts `handler` in `R`'s entry, growing the table (down or up) to reach it.
    fn add<R: Rpc>(mut self, handler: Handler<S>) -> Router<S> {
        let opcode = R::OPCODE.0;
        if self.routes.is_empty() {
            self.first = opcode;
        } else if opcode < self.first {
            let below = usize::from(self.first - opcode);
            self.routes
                .splice(0..0, std::iter::repeat_with(|| None).take(below));
            self.first = opcode;
        }
        let index = usize::from(opcode - self.first);
        if index >= self.routes.len() {
            self.routes.resize_with(index + 1, || None);
        }
        if let Some(routed) = &self.routes[index] {
            panic!(
                "{} routed twice in the {} router: opcode {opcode} goes to {} already",
                R::NAME,
                self.service,
                routed.name
            );
        }
        self.routes[index] = Some(Route {
            name: R::NAME,
            handler,
        });
        self
    }

    /// Answers one request: decodes its payload and runs its handler, or answers a
    /// malformed payload or an unknown opcode itself (module doc). Nothing runs before
    /// the future is first polled but the payload's decoding.
    pub fn handle<'a>(
        &'a self,
        service: &'a S,
        opcode: Opcode,
        payload: Bytes,
    ) -> HandleFuture<'a> {
        match self.find(opcode) {
            Some(Route {
                handler: Handler::Later(handler),
                ..
            }) => handler(service, payload),
            Some(Route {
                handler: Handler::Now(handler),
                ..
            }) => Box::pin(async move { handler(service, &payload) }),
            None => Box::pin(std::future::ready(self.unknown_opcode(opcode))),
        }
    }

    /// Answers a request of a [`route_now`](Self::route_now) route at once; `None` for
    /// every other opcode, routed or not (`handle` answers those).
    pub fn handle_now(&self, service: &S, opcode: Opcode, payload: &Bytes) -> Option<Reply> {
        match self.find(opcode) {
            Some(Route {
                handler: Handler::Now(handler),
                ..
            }) => Some(handler(service, payload)),
            _ => None,
        }
    }
}

impl<S> Router<S> {
    /// The reply to an opcode this router does not serve.
    pub fn unknown_opcode(&self, opcode: Opcode) -> Reply {
        Reply::error(
            Status::UnknownOpcode,
            format!("{} does not serve {opcode}", self.service),
        )
    }

    /// Whether `opcode` has a route.
    pub fn serves(&self, opcode: Opcode) -> bool {
        self.find(opcode).is_some()
    }

    /// The opcodes routed, lowest first.
    pub fn opcodes(&self) -> impl Iterator<Item = Opcode> + '_ {
        self.opcodes_and_routes().map(|(opcode, _)| opcode)
    }

    fn opcodes_and_routes(&self) -> impl Iterator<Item = (Opcode, &Route<S>)> + '_ {
        // `first + index` fits: each entry stands for an opcode routed, or one below it.
        self.routes.iter().enumerate().filter_map(|(index, route)| {
            let opcode = Opcode(self.first + index as u16);
            Some((opcode, route.as_ref()?))
        })
    }

    /// `opcode`'s route: an index into the table, no search.
    fn find(&self, opcode: Opcode) -> Option<&Route<S>> {
        let index = opcode.0.checked_sub(self.first)?;
        self.routes.get(usize::from(index))?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::message::WireMessage;
    use bytes::BytesMut;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::LazyLock;

    /// A number as a message (bincode: 8 bytes, little-endian).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    struct Number(u64);
    crate::bincode_message!(Number);

    macro_rules! test_rpcs {
        ($($name:ident = $code:literal: $request:ty => $reply:ty;)*) => {
            $(
                struct $name;
                impl Rpc for $name {
                    const OPCODE: Opcode = Opcode($code);
                    const NAME: &'static str = stringify!($name);
                    type Request = $request;
                    type Reply = $reply;
                }
            )*
        };
    }

    test_rpcs! {
        Double = 7105: Number => Number;
        Refuse = 7103: Number => Number;
        Raw = 7107: Number => Number;
        Count = 7110: () => Number;
        Next = 7108: Number => Number;
        Twin = 7105: () => ();
    }

    /// The service the handlers are methods of: counts the calls it got.
    #[derive(Debug, Default)]
    struct Calculator {
        calls: AtomicU64,
    }

    impl Calculator {
        async fn double(&self, request: Number) -> Result<Number, Reply> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Ok(Number(request.0 * 2))
        }

        async fn refuse(&self, request: Number) -> Reply {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Reply::error(Status::InvalidArgument, format!("{} refused", request.0))
        }

        async fn raw(&self, payload: Bytes) -> Reply {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Reply::ok_with(|out| out.extend_from_slice(&payload))
        }

        fn count(&self) -> Result<Number, Reply> {
            Ok(Number(self.calls.fetch_add(1, Ordering::Relaxed) + 1))
        }

        fn next(&self, request: Number) -> Result<Number, Reply> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            match request.0 {
                0 => Err(Reply::error(Status::InvalidArgument, "zero")),
                n => Ok(Number(n + 1)),
            }
        }
    }

    fn router() -> Router<Calculator> {
        Router::<Calculator>::new("calculator")
            .route::<Double>(|calc, request| Box::pin(calc.double(request)))
            .route_reply::<Refuse>(|calc, request| Box::pin(calc.refuse(request)))
            .route_payload::<Raw>(|calc, payload| Box::pin(calc.raw(payload)))
            .route_now::<Count>(|calc, ()| calc.count())
            .route_now::<Next>(Calculator::next)
    }

    /// Built once, as a service builds its own: a router is `Send` and `Sync`.
    static ROUTER: LazyLock<Router<Calculator>> = LazyLock::new(router);

    fn encoded<M: WireMessage>(message: &M) -> Bytes {
        let mut out = BytesMut::new();
        message.encode(&mut out);
        out.freeze()
    }

    fn number(reply: &Reply) -> Number {
        assert_eq!(reply.status(), Status::Ok, "{reply:?}");
        Number::decode(Bytes::copy_from_slice(reply.payload())).expect("a number")
    }

    fn detail(reply: &Reply) -> String {
        String::from_utf8(reply.payload().to_vec()).expect("utf-8 detail")
    }

    #[tokio::test]
    async fn a_typed_request_round_trips_through_its_handler() {
        let calc = Calculator::default();
        let reply = ROUTER
            .handle(&calc, Double::OPCODE, encoded(&Number(21)))
            .await;
        assert_eq!(number(&reply), Number(42));
        assert_eq!(calc.calls.load(Ordering::Relaxed), 1);
        // Only `route_now` routes answer on the connection's task.
        assert!(ROUTER
            .handle_now(&calc, Double::OPCODE, &encoded(&Number(21)))
            .is_none());
        assert_eq!(calc.calls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_handlers_own_reply_is_answered_as_built() {
        let calc = Calculator::default();
        let reply = ROUTER
            .handle(&calc, Refuse::OPCODE, encoded(&Number(5)))
            .await;
        assert_eq!(reply.status(), Status::InvalidArgument);
        assert_eq!(detail(&reply), "5 refused");
        let reply = ROUTER
            .handle(&calc, Next::OPCODE, encoded(&Number(0)))
            .await;
        assert_eq!(reply.status(), Status::InvalidArgument);
        assert_eq!(detail(&reply), "zero");
    }

    #[tokio::test]
    async fn an_immediate_route_answers_now_and_through_handle() {
        let calc = Calculator::default();
        let reply = ROUTER
            .handle_now(&calc, Next::OPCODE, &encoded(&Number(1)))
            .expect("answered now");
        assert_eq!(number(&reply), Number(2));
        let reply = ROUTER
            .handle(&calc, Next::OPCODE, encoded(&Number(2)))
            .await;
        assert_eq!(number(&reply), Number(3));
        let reply = ROUTER
            .handle_now(&calc, Count::OPCODE, &Bytes::new())
            .expect("answered now");
        assert_eq!(number(&reply), Number(3));
        // `handle` runs nothing but the decoding before its future is polled.
        let pending = ROUTER.handle(&calc, Count::OPCODE, Bytes::new());
        assert_eq!(calc.calls.load(Ordering::Relaxed), 3);
        assert_eq!(number(&pending.await), Number(4));
    }

    #[tokio::test]
    async fn a_raw_route_gets_the_payload_undecoded() {
        let calc = Calculator::default();
        let reply = ROUTER
            .handle(&calc, Raw::OPCODE, Bytes::from_static(b"not a number"))
            .await;
        assert_eq!(reply.status(), Status::Ok);
        assert_eq!(reply.payload(), b"not a number");
    }

    #[tokio::test]
    async fn an_undecodable_payload_is_malformed_as_reply_decode_says() {
        let calc = Calculator::default();
        for payload in [&b""[..], &[0xFF; 3], &[0x01; 9]] {
            let payload = Bytes::copy_from_slice(payload);
            let expected = match Reply::decode::<Number>(payload.clone()) {
                Err(reply) => reply,
                Ok(number) => panic!("{payload:?} decodes as {number:?}"),
            };
            for opcode in [Double::OPCODE, Refuse::OPCODE, Next::OPCODE] {
                let reply = ROUTER.handle(&calc, opcode, payload.clone()).await;
                assert_eq!(reply.status(), Status::MalformedRequest, "{opcode}");
                assert_eq!(reply.payload(), expected.payload(), "{opcode}");
            }
            let reply = ROUTER
                .handle_now(&calc, Next::OPCODE, &payload)
                .expect("answered now");
            assert_eq!(reply.status(), Status::MalformedRequest);
            assert_eq!(reply.payload(), expected.payload());
        }
        let reply = ROUTER
            .handle(&calc, Count::OPCODE, Bytes::from_static(b"x"))
            .await;
        assert_eq!(reply.status(), Status::MalformedRequest);
        // No handler ran.
        assert_eq!(calc.calls.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn an_opcode_without_a_route_is_unknown() {
        let calc = Calculator::default();
        // Below the table, in one of its gaps, past its end, and far away.
        for code in [0, 7102, 7104, 7106, 7109, 7111, u16::MAX] {
            let opcode = Opcode(code);
            assert!(!ROUTER.serves(opcode), "{opcode}");
            let reply = ROUTER.handle(&calc, opcode, Bytes::new()).await;
            assert_eq!(reply.status(), Status::UnknownOpcode);
            assert_eq!(
                detail(&reply),
                format!("calculator does not serve opcode {code}")
            );
            assert!(ROUTER.handle_now(&calc, opcode, &Bytes::new()).is_none());
        }
        assert_eq!(calc.calls.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn routes_in_any_order_are_found_by_opcode() {
        let opcodes: Vec<u16> = ROUTER.opcodes().map(|opcode| opcode.0).collect();
        assert_eq!(opcodes, [7103, 7105, 7107, 7108, 7110]);
        assert!(format!("{:?}", *ROUTER).contains("(7103, \"Refuse\")"));
        assert_eq!(ROUTER.routes.len(), 8, "the span of the opcodes, no more");
    }

    #[test]
    #[should_panic(
        expected = "Twin routed twice in the calculator router: opcode 7105 goes to Double already"
    )]
    fn routing_an_opcode_twice_panics() {
        let _ = router().route_now::<Twin>(|_, ()| Ok(()));
    }
}
