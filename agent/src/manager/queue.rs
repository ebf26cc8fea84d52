//! The order in which this node's identities are issued (docs/design.md §4.2, "One
//! identity manager"): every issuance, from the JWT to ZTS's answer, holds a [`Slot`], and slots are
//! handed out by [`Priority`], first come first served within one.
//!
//! - At most `total` issuances at once: the bound on connections to the jwt-service and ZTS
//!   (and their TLS buffers here) however many pods start together.
//! - Warm-up (issuing before the kubelet asks) and background (re-issuing before a
//!   certificate's refresh time) have limits of their own that together stay below `total`
//!   ([`Limits::new`] refuses otherwise): whatever they have queued, a real-time request (a
//!   kubelet's publish, a pod's init or refresh) finds a slot free unless other real-time work
//!   holds them all. A tenant who floods a node with pods it deletes at once costs the node at
//!   most `warmup` issuances at a time; its kubelet's real requests do not wait behind them.
//! - A request that is dropped while queued (its pod went, its caller gave up) leaves the
//!   queue at once and is counted; a slot dropped in flight is free for the next.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use tokio::sync::oneshot;

/// Who an issuance is for, in the order slots go to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Someone is waiting now: a kubelet's publish, a pod's init, refresh or attestation.
    RealTime,
    /// Ahead of a request that will come: a files-mode pod's identity issued when the API
    /// server binds the pod to this node (early issuance).
    Warmup,
    /// Before it is needed: a files-mode volume re-issued at its refresh time.
    Background,
}

impl Priority {
    /// Every priority, highest first.
    pub const ALL: [Priority; 3] = [Self::RealTime, Self::Warmup, Self::Background];

    fn index(self) -> usize {
        match self {
            Self::RealTime => 0,
            Self::Warmup => 1,
            Self::Background => 2,
        }
    }

    /// Its metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::RealTime => "real_time",
            Self::Warmup => "warmup",
            Self::Background => "background",
        }
    }
}

/// How many issuances run at once, in all and of each lower priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    total: usize,
    warmup: usize,
    background: usize,
}

/// Limits that would let lower priorities take every slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "warm-up ({warmup}) and background ({background}) issuances must each be at least 1 and \
     together fewer than all issuances at once ({total}), so that a real-time request always \
     finds a slot they cannot take"
)]
pub struct LimitsError {
    total: usize,
    warmup: usize,
    background: usize,
}

impl Limits {
    /// `total` at once, of which at most `warmup` warm-up and `background` background ones.
    pub fn new(total: usize, warmup: usize, background: usize) -> Result<Self, LimitsError> {
        if warmup == 0 || background == 0 || warmup.saturating_add(background) >= total {
            return Err(LimitsError {
                total,
                warmup,
                background,
            });
        }
        Ok(Self {
            total,
            warmup,
            background,
        })
    }

    /// The most of `priority` in flight at once.
    pub fn of(&self, priority: Priority) -> usize {
        match priority {
            Priority::RealTime => self.total,
            Priority::Warmup => self.warmup,
            Priority::Background => self.background,
        }
    }

    /// The most in flight at once.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// Labels of the queue's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PriorityLabels {
    /// `real_time`, `warmup` or `background`.
    pub priority: &'static str,
}

/// What the queue exports.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    /// Requests waiting for a slot.
    pub queued: Family<PriorityLabels, Gauge>,
    /// Issuances holding a slot.
    pub in_flight: Family<PriorityLabels, Gauge>,
    /// Time from a request to its slot.
    pub waits: Family<PriorityLabels, Histogram>,
    /// Requests dropped while waiting (their pod went, their caller gave up).
    pub cancelled: Family<PriorityLabels, Counter>,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            queued: Family::default(),
            in_flight: Family::default(),
            waits: Family::new_with_constructor(|| {
                Histogram::new([
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ])
            }),
            cancelled: Family::default(),
        }
    }
}

impl QueueMetrics {
    /// Registers them under `issuance_*`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        registry.register(
            "issuance_queued",
            "Identity issuances waiting for a slot, by priority",
            m.queued.clone(),
        );
        registry.register(
            "issuance_in_flight",
            "Identity issuances holding a slot (JWT to ZTS's answer), by priority",
            m.in_flight.clone(),
        );
        registry.register(
            "issuance_wait_seconds",
            "Time an identity issuance waited for its slot, by priority",
            m.waits.clone(),
        );
        registry.register(
            "issuance_cancelled",
            "Identity issuances dropped before they got a slot, by priority",
            m.cancelled.clone(),
        );
        m
    }

    fn labels(priority: Priority) -> PriorityLabels {
        PriorityLabels {
            priority: priority.name(),
        }
    }
}

struct Waiter {
    id: u64,
    granted: oneshot::Sender<()>,
}

#[derive(Default)]
struct State {
    in_flight: [usize; 3],
    waiting: [VecDeque<Waiter>; 3],
    next_id: u64,
}

/// The slots, shared by every issuance of the agent.
pub struct Queue {
    limits: Limits,
    state: Mutex<State>,
    metrics: QueueMetrics,
}

impl Queue {
    /// A queue handing out slots within `limits`.
    pub fn new(limits: Limits, metrics: QueueMetrics) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::default(),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for an issuance of `priority`, once one is free for it and every request of the
    /// same priority asked before has one (released slots go to higher priorities first). Dropping the future leaves the queue.
    pub async fn slot(self: &Arc<Self>, priority: Priority) -> Slot {
        let asked = Instant::now();
        let pending = {
            let mut state = self.lock();
            // No waiter ever has room ([`Queue::dispatch`] keeps it so): one of a higher
            // priority waits for a slot this request cannot have either, or for its own cap.
            if state.waiting[priority.index()].is_empty() && self.has_room(&state, priority) {
                self.grant(&mut state, priority);
                drop(state);
                return self.granted(priority, asked);
            }
            let (granted, wait) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.waiting[priority.index()].push_back(Waiter { id, granted });
            self.publish_queued(&state, priority);
            Pending {
                queue: Arc::clone(self),
                priority,
                id,
                wait,
                done: false,
            }
        };
        pending.await
    }

    fn has_room(&self, state: &State, priority: Priority) -> bool {
        state.in_flight.iter().sum::<usize>() < self.limits.total
            && state.in_flight[priority.index()] < self.limits.of(priority)
    }

    fn grant(&self, state: &mut State, priority: Priority) {
        state.in_flight[priority.index()] += 1;
        self.metrics
            .in_flight
            .get_or_create(&QueueMetrics::labels(priority))
            .set(gauge_value(state.in_flight[priority.index()]));
    }

    fn granted(self: &Arc<Self>, priority: Priority, asked: Instant) -> Slot {
        self.metrics
            .waits
            .get_or_create(&QueueMetrics::labels(priority))
            .observe(asked.elapsed().as_secs_f64());
        Slot {
            queue: Arc::clone(self),
            priority,
        }
    }

    fn publish_queued(&self, state: &State, priority: Priority) {
        self.metrics
            .queued
            .get_or_create(&QueueMetrics::labels(priority))
            .set(gauge_value(state.waiting[priority.index()].len()));
    }

    /// Gives free slots to the first waiters, highest priority first.
    fn dispatch(&self, state: &mut State) {
        for priority in Priority::ALL {
            let mut changed = false;
            while self.has_room(state, priority) {
                let Some(waiter) = state.waiting[priority.index()].pop_front() else {
                    break;
                };
                changed = true;
                // a waiter that has gone removes itself first, so this send reaches a
                // future that is still waiting
                if waiter.granted.send(()).is_ok() {
                    self.grant(state, priority);
                }
            }
            if changed {
                self.publish_queued(state, priority);
            }
        }
    }

    fn release(&self, priority: Priority) {
        let mut state = self.lock();
        let i = priority.index();
        state.in_flight[i] = state.in_flight[i].saturating_sub(1);
        self.metrics
            .in_flight
            .get_or_create(&QueueMetrics::labels(priority))
            .set(gauge_value(state.in_flight[i]));
        self.dispatch(&mut state);
    }

    /// In flight now, by priority (tests and the property test).
    pub fn in_flight(&self) -> [usize; 3] {
        self.lock().in_flight
    }

    /// Waiting now, by priority.
    pub fn queued(&self) -> [usize; 3] {
        let state = self.lock();
        [0, 1, 2].map(|i| state.waiting[i].len())
    }

    /// The limits it keeps.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A request waiting for its slot; dropped, it leaves the queue (or gives back the slot it was
/// just granted).
struct Pending {
    queue: Arc<Queue>,
    priority: Priority,
    id: u64,
    wait: oneshot::Receiver<()>,
    done: bool,
}

impl std::future::Future for Pending {
    type Output = Slot;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Slot> {
        match std::pin::Pin::new(&mut self.wait).poll(cx) {
            std::task::Poll::Ready(Ok(())) => {
                self.done = true;
                std::task::Poll::Ready(Slot {
                    queue: Arc::clone(&self.queue),
                    priority: self.priority,
                })
            }
            // the queue never drops a waiter's sender without sending, except with the queue
            std::task::Poll::Ready(Err(_)) => std::task::Poll::Pending,
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.queue.lock();
        let waiting = &mut state.waiting[self.priority.index()];
        if let Some(at) = waiting.iter().position(|w| w.id == self.id) {
            waiting.remove(at);
            self.queue.publish_queued(&state, self.priority);
            self.queue
                .metrics
                .cancelled
                .get_or_create(&QueueMetrics::labels(self.priority))
                .inc();
            return;
        }
        drop(state);
        // granted while it was being dropped: the slot is handed on
        if self.wait.try_recv().is_ok() {
            self.queue.release(self.priority);
        }
    }
}

/// One issuance's place among those running; dropped, the next waiter gets it.
pub struct Slot {
    queue: Arc<Queue>,
    priority: Priority,
}

impl Slot {
    /// The priority it was granted for.
    pub fn priority(&self) -> Priority {
        self.priority
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("priority", &self.priority)
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queue.release(self.priority);
    }
}

#[cfg(test)]
mod tests;
