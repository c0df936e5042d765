//! Concurrent calls gathered into the requests of an AWS batch API.
//!
//! sqs-once runs many records at once, and each makes calls of its own: its
//! claim and completion in DynamoDB, its messages' sends. A [`Batcher`] lets
//! every such call wait for its own answer while the requests themselves go
//! out together (`BatchExecuteStatement`, `SendMessageBatch`), as a database
//! groups commits: a window of requests is on the wire at once, and the
//! calls that arrive meanwhile gather for the next one, up to
//! [`BatchCall::LIMIT`] per request (and [`BatchCall::MAX_BYTES`]).
//!
//! How many requests go out at once follows what the service answers, as TCP
//! Vegas sizes a connection's window: one more while answers come as fast as
//! the fastest seen and calls are waiting for a slot, one fewer when answers
//! slow down (requests queue inside the service), half when the service
//! throttles or fails. A service on the other side of the world gets many
//! requests at once; one that is busy gets few, and fuller ones.
//!
//! Nothing waits on a timer. A lone call on a quiet batcher is sent at once;
//! batches grow exactly as far as the load makes them.
//!
//! No call waits behind a request that is slow: a request still out after
//! [`BatchCall::SLOW_AFTER`] (held back, or being retried) gives up its slot,
//! so the calls behind it go out in the next request. And when an answer is
//! due ([`Batcher::expedite`]), calls go out at once, slot or no slot.

use parking_lot::Mutex;
use std::{collections::VecDeque, sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use self::window::{Signal, Slot, Window};

mod window;

/// One kind of batch request.
#[async_trait]
pub trait BatchCall: Send + Sync + 'static {
    /// What one caller asks for.
    type Input: Send + 'static;
    /// What one caller gets back.
    type Output: Send + 'static;
    /// Why a caller got no output.
    type Error: Send + 'static;
    /// Most inputs in one request.
    const LIMIT: usize;
    /// Most bytes of inputs in one request, as [`bytes`](Self::bytes) counts
    /// them: an input larger alone goes in a request of its own.
    const MAX_BYTES: usize = usize::MAX;
    /// Requests on the wire at once before the first answers say more,
    /// counting only those answered within
    /// [`SLOW_AFTER`](Self::SLOW_AFTER) so far.
    const IN_FLIGHT: usize;
    /// Most requests on the wire at once, however fast the service answers.
    const MAX_IN_FLIGHT: usize = 16;
    /// How long a request may be out before the calls behind it stop waiting
    /// for it: well above a healthy answer.
    const SLOW_AFTER: Duration = Duration::from_millis(500);

    /// The item an input is about: a request never holds two inputs about
    /// the same item (DynamoDB refuses such a batch as a whole).
    fn item(input: &Self::Input) -> &str;

    /// An input's size towards [`MAX_BYTES`](Self::MAX_BYTES).
    fn bytes(_input: &Self::Input) -> usize {
        0
    }

    /// Sends one request for `inputs` and answers each, in order. An error of
    /// the request as a whole is every input's answer.
    async fn call(&self, inputs: Vec<Self::Input>) -> Vec<Result<Self::Output, Self::Error>>;

    /// The answer of a call whose request ended without answering it (its
    /// task was dropped, or the service answered fewer inputs): `reason`.
    fn unanswered(reason: String) -> Self::Error;

    /// Whether an answer says the service is overloaded (it throttled the
    /// input, or could not be reached): fewer requests go out at once.
    fn congested(result: &Result<Self::Output, Self::Error>) -> bool;
}

type Reply<C> = oneshot::Sender<Result<<C as BatchCall>::Output, <C as BatchCall>::Error>>;
type Waiting<C> = (<C as BatchCall>::Input, Reply<C>);

/// Calls waiting for a request, and whether a task is sending them.
struct Queue<C: BatchCall> {
    waiting: VecDeque<Waiting<C>>,
    flushing: bool,
}

impl<C: BatchCall> Queue<C> {
    /// The next request: up to `C::LIMIT` waiting calls about distinct
    /// items within `C::MAX_BYTES`, oldest first; the others keep their
    /// place.
    fn next_request(&mut self) -> Vec<Waiting<C>> {
        let mut request: Vec<Waiting<C>> = Vec::with_capacity(C::LIMIT.min(self.waiting.len()));
        let mut skipped = VecDeque::new();
        let mut bytes = 0;
        while request.len() < C::LIMIT {
            let Some(entry) = self.waiting.pop_front() else { break };
            // A scan of at most `LIMIT` items costs less than a set's copies and hashes.
            let item = C::item(&entry.0);
            let size = C::bytes(&entry.0);
            let too_large = !request.is_empty() && bytes + size > C::MAX_BYTES;
            if too_large || request.iter().any(|(input, _)| C::item(input) == item) {
                skipped.push_back(entry);
            } else {
                bytes += size;
                request.push(entry);
            }
        }
        skipped.append(&mut self.waiting);
        self.waiting = skipped;
        request
    }
}

/// Gathers concurrent calls into requests of a [`BatchCall`]. It runs on a
/// Tokio runtime with timers (see [`BatchCall::SLOW_AFTER`]).
pub struct Batcher<C: BatchCall> {
    shared: Arc<Shared<C>>,
}

/// What a batcher and its flushing task share.
struct Shared<C: BatchCall> {
    call: Arc<C>,
    queue: Mutex<Queue<C>>,
    window: Arc<Window>,
    /// Until this instant, requests go out without waiting for a slot.
    urgent_until: Mutex<Option<Instant>>,
    /// Wakes a flush waiting for a slot when the batcher turns urgent.
    expedited: Notify,
}

impl<C: BatchCall> Shared<C> {
    fn urgent(&self) -> bool {
        self.urgent_until.lock().is_some_and(|until| Instant::now() < until)
    }
}

impl<C: BatchCall> Batcher<C> {
    /// A batcher sending its requests through `call`.
    pub fn new(call: Arc<C>) -> Self {
        let queue = Queue { waiting: VecDeque::new(), flushing: false };
        let shared = Shared {
            call,
            queue: Mutex::new(queue),
            window: Window::new(C::IN_FLIGHT, C::MAX_IN_FLIGHT),
            urgent_until: Mutex::new(None),
            expedited: Notify::new(),
        };
        Self { shared: Arc::new(shared) }
    }

    /// Sends `input` with whatever else is waiting, and waits for its answer.
    ///
    /// Requests run in tasks of their own, so a caller that stops waiting
    /// never takes the other inputs of its request down with it.
    pub async fn submit(&self, input: C::Input) -> Result<C::Output, C::Error> {
        let (answer, answered) = oneshot::channel();
        let start_flushing = {
            let mut queue = self.shared.queue.lock();
            queue.waiting.push_back((input, answer));
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start_flushing {
            tokio::spawn(flush(Arc::clone(&self.shared)));
        }
        answered.await.unwrap_or_else(|_| Err(C::unanswered("a batch request ended without an answer".to_owned())))
    }

    /// Whether calls go out without waiting for a slot now.
    pub fn urgent(&self) -> bool {
        self.shared.urgent()
    }

    /// An answer is due by `until`: what is waiting goes out now, and until
    /// then every call goes out without waiting for a free slot (requests
    /// still hold at most [`BatchCall::LIMIT`] calls).
    pub fn expedite(&self, until: Instant) {
        *self.shared.urgent_until.lock() = Some(until);
        self.shared.expedited.notify_waiters();
    }
}

impl<C: BatchCall> std::fmt::Debug for Batcher<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("waiting", &self.shared.queue.lock().waiting.len())
            .field("in_flight", &self.shared.window.limit())
            .finish()
    }
}

/// Sends requests while calls are waiting, each once a slot is free (or at
/// once, while the batcher is urgent).
async fn flush<C: BatchCall>(shared: Arc<Shared<C>>) {
    let window = &shared.window;
    loop {
        let slot = if shared.urgent() {
            window.try_slot().unwrap_or_else(|| Slot::outside(window))
        } else {
            // Registered before the check below, so an expedite in between still wakes it.
            let expedited = shared.expedited.notified();
            tokio::select! {
                slot = window.slot() => slot,
                () = expedited => window.try_slot().unwrap_or_else(|| Slot::outside(window)),
            }
        };
        // Callers that are ready to run join this request instead of the next.
        tokio::task::yield_now().await;
        let (request, more) = {
            let mut queue = shared.queue.lock();
            let request = queue.next_request();
            queue.flushing = !queue.waiting.is_empty();
            (request, queue.flushing)
        };
        if !request.is_empty() {
            tokio::spawn(send(Arc::clone(&shared.call), request, slot, more));
        }
        if !more {
            return;
        }
    }
}

/// Sends one request and answers its callers. The request gives its slot
/// up once it has been out [`BatchCall::SLOW_AFTER`], and tells the window
/// how the store answered; `pressed` when calls were left waiting as it went.
async fn send<C: BatchCall>(call: Arc<C>, waiting: Vec<Waiting<C>>, mut slot: Slot, pressed: bool) {
    let (inputs, answers): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
    let count = inputs.len();
    slot.sent(count);
    tracing::trace!(calls = count, in_flight = slot.limit(), "batch request");
    let request = call.call(inputs);
    tokio::pin!(request);
    let results = tokio::select! {
        results = &mut request => {
            slot.done(signal::<C>(&results, pressed));
            results
        }
        () = tokio::time::sleep(C::SLOW_AFTER) => {
            slot.done(Signal::Congested);
            tracing::debug!(calls = count, "batch request slow: the calls behind it go on without it");
            request.await
        }
    };
    let mut results = results.into_iter();
    for answer in answers {
        let result = results
            .next()
            .unwrap_or_else(|| Err(C::unanswered(format!("a batch request of {count} answered fewer inputs"))));
        // A caller that stopped waiting no longer needs its answer.
        let _ = answer.send(result);
    }
}

/// What a request's answers say about the service.
fn signal<C: BatchCall>(results: &[Result<C::Output, C::Error>], pressed: bool) -> Signal {
    let congested = results.iter().any(C::congested);
    if congested { Signal::Congested } else { Signal::Answered { pressed } }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Echoes its inputs, recording each request's inputs.
    #[derive(Default)]
    struct Echo(Mutex<Vec<Vec<String>>>);

    #[async_trait]
    impl BatchCall for Echo {
        type Input = String;
        type Output = String;
        type Error = String;
        const LIMIT: usize = 3;
        const IN_FLIGHT: usize = 2;

        fn item(input: &String) -> &str {
            input.split('#').next().unwrap_or(input)
        }

        fn unanswered(reason: String) -> String {
            reason
        }

        fn congested(result: &Result<Self::Output, String>) -> bool {
            result.is_err()
        }

        async fn call(&self, inputs: Vec<String>) -> Vec<Result<String, String>> {
            self.0.lock().push(inputs.clone());
            tokio::task::yield_now().await;
            inputs.into_iter().map(|input| if input.ends_with('!') { Err(input) } else { Ok(input) }).collect()
        }
    }

    #[tokio::test]
    async fn each_caller_gets_its_own_answer_and_requests_stay_within_the_limit() {
        let echo = Arc::new(Echo::default());
        let batcher = Batcher::new(Arc::clone(&echo));
        let inputs = ["a", "b", "c!", "d", "e", "f", "g"];
        let answers = futures::future::join_all(inputs.iter().map(|input| batcher.submit((*input).to_owned()))).await;
        for (input, answer) in inputs.iter().zip(answers) {
            match answer {
                Ok(echoed) => assert_eq!(&echoed, input),
                Err(error) => assert!(input.ends_with('!') && error.to_string().contains(input)),
            }
        }
        let requests = echo.0.lock().clone();
        assert_eq!(requests.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    }

    #[tokio::test]
    async fn inputs_about_one_item_go_in_separate_requests() {
        let echo = Arc::new(Echo::default());
        let batcher = Batcher::new(Arc::clone(&echo));
        let inputs = ["k#1", "k#2", "j#1", "k#3"];
        let answers = futures::future::join_all(inputs.iter().map(|input| batcher.submit((*input).to_owned()))).await;
        assert!(answers.iter().all(Result::is_ok));
        for request in echo.0.lock().iter() {
            let items: HashSet<&str> = request.iter().map(Echo::item).collect();
            assert_eq!(items.len(), request.len(), "{request:?}");
        }
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_leaves_the_others_answered() {
        let echo = Arc::new(Echo::default());
        let batcher = Batcher::new(Arc::clone(&echo));
        let abandoned = batcher.submit("gone".to_owned());
        let kept = batcher.submit("kept".to_owned());
        // Polling the first call once queues it; dropping it must not cancel the flush.
        let mut abandoned = Box::pin(abandoned);
        assert!(futures::poll!(abandoned.as_mut()).is_pending());
        drop(abandoned);
        assert_eq!(kept.await.unwrap(), "kept");
        assert_eq!(*echo.0.lock(), [vec!["gone".to_owned(), "kept".to_owned()]]);
    }

    /// Answers at once, but never answers a request with an input ending in
    /// `~`; its requests are slow after `SLOW_MS`.
    #[derive(Default)]
    struct Hanging<const SLOW_MS: u64>(Mutex<Vec<Vec<String>>>);

    #[async_trait]
    impl<const SLOW_MS: u64> BatchCall for Hanging<SLOW_MS> {
        type Input = String;
        type Output = String;
        type Error = String;
        const LIMIT: usize = 3;
        const IN_FLIGHT: usize = 2;
        const SLOW_AFTER: Duration = Duration::from_millis(SLOW_MS);

        fn item(input: &String) -> &str {
            input
        }

        fn unanswered(reason: String) -> String {
            reason
        }

        fn congested(result: &Result<Self::Output, String>) -> bool {
            result.is_err()
        }

        async fn call(&self, inputs: Vec<String>) -> Vec<Result<String, String>> {
            self.0.lock().push(inputs.clone());
            if inputs.iter().any(|input| input.ends_with('~')) {
                std::future::pending::<()>().await;
            }
            inputs.into_iter().map(Ok).collect()
        }
    }

    /// Sends two calls that never answer, each in a request of its own, so
    /// that both slots are taken.
    async fn take_both_slots<const SLOW_MS: u64>(batcher: &Arc<Batcher<Hanging<SLOW_MS>>>, hanging: &Hanging<SLOW_MS>) {
        for input in ["a~", "b~"] {
            let requests = hanging.0.lock().len();
            let submitting = Arc::clone(batcher);
            tokio::spawn(async move { submitting.submit(input.to_owned()).await });
            while hanging.0.lock().len() == requests {
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test]
    async fn calls_do_not_wait_behind_requests_that_are_slow() {
        let hanging = Arc::new(Hanging::<20>::default());
        let batcher = Arc::new(Batcher::new(Arc::clone(&hanging)));
        // Both slots are taken by requests that never answer; they give them up after 20 ms.
        take_both_slots(&batcher, &hanging).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), batcher.submit("c".to_owned())).await;
        assert_eq!(answer.expect("the call waited behind the slow requests").unwrap(), "c");
    }

    #[tokio::test]
    async fn an_expedited_batcher_sends_at_once_though_every_slot_is_taken() {
        // Slow only after a minute: without expediting, the third call waits behind the two hanging requests.
        let hanging = Arc::new(Hanging::<60_000>::default());
        let batcher = Arc::new(Batcher::new(Arc::clone(&hanging)));
        take_both_slots(&batcher, &hanging).await;
        let waiting = tokio::spawn({
            let batcher = Arc::clone(&batcher);
            async move { batcher.submit("c".to_owned()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "no slot is free yet");
        batcher.expedite(Instant::now() + Duration::from_secs(10));
        let answer = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        assert_eq!(answer.expect("the call went out at once").unwrap().unwrap(), "c");
        // And calls made while it is urgent do not wait either.
        let later = tokio::time::timeout(Duration::from_secs(10), batcher.submit("d".to_owned())).await;
        assert_eq!(later.expect("no wait while urgent").unwrap(), "d");
    }

    #[tokio::test]
    async fn calls_arriving_during_a_request_gather_for_the_next() {
        let echo = Arc::new(Echo::default());
        let batcher = Arc::new(Batcher::new(Arc::clone(&echo)));
        let first = tokio::spawn({
            let batcher = Arc::clone(&batcher);
            async move { batcher.submit("x".to_owned()).await }
        });
        // Let the first request go out alone before the others arrive.
        while echo.0.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        let later = futures::future::join_all(["y", "z"].map(|input| batcher.submit(input.to_owned()))).await;
        assert_eq!(first.await.unwrap().unwrap(), "x");
        assert!(later.iter().all(Result::is_ok));
        assert_eq!(echo.0.lock().iter().map(Vec::len).collect::<Vec<_>>(), [1, 2]);
    }

    /// A store `ROUND_TRIP_MS` away with room for every request, counting
    /// requests out at once; it throttles every input when `THROTTLES`.
    #[derive(Default)]
    struct Far<const ROUND_TRIP_MS: u64, const THROTTLES: bool> {
        out: std::sync::atomic::AtomicUsize,
        most_out: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl<const ROUND_TRIP_MS: u64, const THROTTLES: bool> BatchCall for Far<ROUND_TRIP_MS, THROTTLES> {
        type Input = String;
        type Output = ();
        type Error = String;
        const LIMIT: usize = 5;
        const IN_FLIGHT: usize = 4;

        fn item(input: &String) -> &str {
            input
        }

        fn unanswered(reason: String) -> String {
            reason
        }

        fn congested(result: &Result<(), String>) -> bool {
            THROTTLES || result.is_err()
        }

        async fn call(&self, inputs: Vec<String>) -> Vec<Result<(), String>> {
            use std::sync::atomic::Ordering::SeqCst;
            let out = self.out.fetch_add(1, SeqCst) + 1;
            self.most_out.fetch_max(out, SeqCst);
            tokio::time::sleep(Duration::from_millis(ROUND_TRIP_MS)).await;
            self.out.fetch_sub(1, SeqCst);
            inputs.iter().map(|_| Ok(())).collect()
        }
    }

    async fn submit_many<C: BatchCall<Input = String>>(batcher: &Batcher<C>, calls: usize) {
        let answers = futures::future::join_all((0..calls).map(|n| batcher.submit(n.to_string()))).await;
        assert!(answers.iter().all(Result::is_ok));
    }

    #[tokio::test(start_paused = true)]
    async fn a_far_store_with_calls_waiting_gets_more_requests_at_once() {
        let far = Arc::new(Far::<20, false>::default());
        let batcher = Batcher::new(Arc::clone(&far));
        submit_many(&batcher, 400).await;
        assert_eq!(far.most_out.load(std::sync::atomic::Ordering::SeqCst), Far::<20, false>::MAX_IN_FLIGHT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttling_store_gets_two_requests_at_a_time() {
        let throttling = Arc::new(Far::<20, true>::default());
        let batcher = Batcher::new(Arc::clone(&throttling));
        submit_many(&batcher, 400).await;
        assert_eq!(batcher.shared.window.limit(), 2);
        throttling.most_out.store(0, std::sync::atomic::Ordering::SeqCst);
        submit_many(&batcher, 100).await;
        assert_eq!(throttling.most_out.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_calls_share_requests_of_at_most_the_limit() {
        // `tokio::test` runs on one thread, so that all 30 calls are waiting
        // before the first request goes.

        /// Doubles numbers, remembering how many were sent in each request.
        #[derive(Default)]
        struct Double(Mutex<Vec<usize>>);

        #[async_trait::async_trait]
        impl BatchCall for Double {
            type Input = String;
            type Output = u64;
            type Error = String;
            const LIMIT: usize = 25;
            const IN_FLIGHT: usize = 4;
            fn item(input: &String) -> &str {
                input
            }

            fn unanswered(reason: String) -> String {
                reason
            }

            fn congested(result: &Result<Self::Output, String>) -> bool {
                result.is_err()
            }
            async fn call(&self, inputs: Vec<String>) -> Vec<Result<u64, String>> {
                self.0.lock().push(inputs.len());
                inputs.iter().map(|input| Ok(input.parse::<u64>().unwrap() * 2)).collect()
            }
        }

        let double = Arc::new(Double::default());
        let batcher = Batcher::new(Arc::clone(&double));
        let answers = futures::future::join_all((0..30).map(|n| batcher.submit(n.to_string()))).await;
        assert_eq!(answers[29].as_ref().unwrap(), &58);
        assert_eq!(*double.0.lock(), [25, 5]); // 30 calls, 2 requests
    }

    #[tokio::test]
    async fn a_request_holds_inputs_within_its_bytes_and_one_larger_alone() {
        /// Counts each input's length as its bytes, ten at most a request.
        #[derive(Default)]
        struct Sized(Mutex<Vec<Vec<String>>>);

        #[async_trait::async_trait]
        impl BatchCall for Sized {
            type Input = String;
            type Output = ();
            type Error = String;
            const LIMIT: usize = 10;
            const MAX_BYTES: usize = 10;
            const IN_FLIGHT: usize = 1;
            fn item(input: &String) -> &str {
                input
            }
            fn bytes(input: &String) -> usize {
                input.len()
            }
            async fn call(&self, inputs: Vec<String>) -> Vec<Result<(), String>> {
                let answers = inputs.iter().map(|_| Ok(())).collect();
                self.0.lock().push(inputs);
                answers
            }
            fn unanswered(reason: String) -> String {
                reason
            }
            fn congested(result: &Result<(), String>) -> bool {
                result.is_err()
            }
        }

        let sized = Arc::new(Sized::default());
        let batcher = Batcher::new(Arc::clone(&sized));
        let inputs = ["aaaa", "bbbb", "cccc", "dddddddddddd", "e"];
        let answers = futures::future::join_all(inputs.iter().map(|input| batcher.submit((*input).to_owned()))).await;
        assert!(answers.iter().all(Result::is_ok));
        let requests: Vec<Vec<String>> = sized.0.lock().clone();
        let sizes: Vec<usize> = requests.iter().map(|request| request.iter().map(String::len).sum()).collect();
        // The first request is full at 9 bytes of 10: `cccc` waits for the next, `e` fits; the 12 bytes go alone.
        assert_eq!(sizes, [9, 4, 12], "{requests:?}");
    }
}
