#![allow(clippy::unwrap_used)]
use super::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

fn queue(total: usize, warmup: usize, background: usize) -> Arc<Queue> {
    Queue::new(
        Limits::new(total, warmup, background).unwrap(),
        QueueMetrics::default(),
    )
}

type Asking = Pin<Box<dyn Future<Output = Slot> + Send>>;

fn ask(queue: &Arc<Queue>, priority: Priority) -> Asking {
    let queue = Arc::clone(queue);
    Box::pin(async move { queue.slot(priority).await })
}

/// Polls once: the slot if it was granted.
fn poll(asking: &mut Asking) -> Option<Slot> {
    match asking
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(slot) => Some(slot),
        Poll::Pending => None,
    }
}

#[test]
fn limits_that_let_lower_priorities_take_every_slot_are_refused() {
    for (total, warmup, background) in [(8, 4, 4), (8, 0, 2), (8, 2, 0), (1, 1, 1), (3, 2, 1)] {
        let err = Limits::new(total, warmup, background).unwrap_err();
        assert!(err.to_string().contains("fewer than all"), "{err}");
    }
    let limits = Limits::new(8, 2, 2).unwrap();
    assert_eq!(
        Priority::ALL.map(|p| limits.of(p)),
        [8, 2, 2],
        "real time may use every slot"
    );
}

#[test]
fn a_flood_of_warmups_leaves_real_time_requests_their_slots() {
    let q = queue(4, 1, 1);
    let mut warmups: Vec<Asking> = (0..500).map(|_| ask(&q, Priority::Warmup)).collect();
    let mut held = Vec::new();
    warmups.retain_mut(|w| match poll(w) {
        Some(slot) => {
            held.push(slot);
            false
        }
        None => true,
    });
    assert_eq!(held.len(), 1, "one warm-up at a time");
    assert_eq!(q.queued()[1], 499);
    // three real-time requests get the three other slots at once
    let mut real: Vec<Asking> = (0..3).map(|_| ask(&q, Priority::RealTime)).collect();
    let now: Vec<Slot> = real.iter_mut().filter_map(poll).collect();
    assert_eq!(now.len(), 3);
    // a fourth waits only for one of them, not for the warm-ups queued before it
    let mut fourth = ask(&q, Priority::RealTime);
    assert!(poll(&mut fourth).is_none());
    // a freed slot goes to it before any of the warm-ups queued earlier
    drop(held);
    let _fourth = poll(&mut fourth).unwrap();
    assert!(warmups.iter_mut().all(|w| poll(w).is_none()));
    assert_eq!(q.in_flight(), [4, 0, 0]);
    drop(now);
    assert_eq!(q.in_flight(), [1, 1, 0], "then one warm-up at a time again");
}

#[test]
fn released_slots_go_to_the_highest_priority_first() {
    let q = queue(3, 1, 1);
    let mut first: Vec<Asking> = (0..3).map(|_| ask(&q, Priority::RealTime)).collect();
    let mut held: Vec<Slot> = first.iter_mut().filter_map(poll).collect();
    let mut background = ask(&q, Priority::Background);
    let mut warmup = ask(&q, Priority::Warmup);
    let mut real = ask(&q, Priority::RealTime);
    assert!(poll(&mut background).is_none() && poll(&mut warmup).is_none());
    assert!(poll(&mut real).is_none(), "queued last");
    held.pop();
    let _real = poll(&mut real).expect("real time first");
    assert!(poll(&mut warmup).is_none() && poll(&mut background).is_none());
    held.pop();
    let _warmup = poll(&mut warmup).expect("then warm-up");
    assert!(poll(&mut background).is_none());
    held.pop();
    assert!(poll(&mut background).is_some());
}

#[test]
fn a_request_dropped_while_queued_leaves_the_queue_and_is_counted() {
    let q = queue(3, 1, 1);
    let mut a = ask(&q, Priority::Warmup);
    let held = poll(&mut a).unwrap();
    let mut b = ask(&q, Priority::Warmup);
    assert!(poll(&mut b).is_none());
    assert_eq!(q.queued(), [0, 1, 0]);
    drop(b);
    assert_eq!(q.queued(), [0, 0, 0]);
    let cancelled = q
        .metrics
        .cancelled
        .get_or_create(&QueueMetrics::labels(Priority::Warmup))
        .get();
    assert_eq!(cancelled, 1);
    drop(held);
    assert_eq!(q.in_flight(), [0, 0, 0]);
}

#[test]
fn a_slot_granted_to_a_request_dropped_before_it_looked_is_handed_on() {
    let q = queue(3, 1, 1);
    let mut a = ask(&q, Priority::Warmup);
    let held = poll(&mut a).unwrap();
    let mut b = ask(&q, Priority::Warmup);
    let mut c = ask(&q, Priority::Warmup);
    assert!(poll(&mut b).is_none() && poll(&mut c).is_none());
    drop(held); // granted to b, which never polls again
    assert_eq!(q.in_flight(), [0, 1, 0]);
    drop(b);
    assert_eq!(q.in_flight(), [0, 1, 0], "handed to c");
    assert!(poll(&mut c).is_some());
}

#[test]
fn lower_priorities_capped_apart_do_not_block_each_other() {
    let q = queue(4, 1, 2);
    let mut w1 = ask(&q, Priority::Warmup);
    let _w = poll(&mut w1).unwrap();
    let mut w2 = ask(&q, Priority::Warmup);
    assert!(poll(&mut w2).is_none());
    let mut b = ask(&q, Priority::Background);
    assert!(
        poll(&mut b).is_some(),
        "a warm-up at its cap holds back no background work"
    );
}

mod property {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Ask(Priority),
        /// Drop the n-th request still asking (granted or not).
        Cancel(usize),
        /// Drop the n-th slot held.
        Release(usize),
        /// Every request looks at its answer.
        Poll,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop_oneof![
                Just(Priority::RealTime),
                Just(Priority::Warmup),
                Just(Priority::Background)
            ]
            .prop_map(Op::Ask),
            2 => any::<usize>().prop_map(Op::Cancel),
            3 => any::<usize>().prop_map(Op::Release),
            3 => Just(Op::Poll),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Under any interleaving of requests, cancellations and releases: no priority holds
        /// more slots than its limit, nor all of them more than the total; no request waits
        /// while a slot is free for it; a real-time request waits only while real-time work
        /// holds every slot lower priorities cannot take; every slot is accounted for.
        #[test]
        fn the_limits_hold_under_any_interleaving(
            (total, warmup, background) in (3usize..8).prop_flat_map(|t| (Just(t), 1..t - 1))
                .prop_flat_map(|(t, w)| (Just(t), Just(w), 1..t - w)),
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let q = queue(total, warmup, background);
            let limits = q.limits();
            let mut asking: Vec<(Priority, Asking)> = Vec::new();
            let mut held: Vec<Slot> = Vec::new();
            for op in ops {
                match op {
                    Op::Ask(p) => {
                        let mut a = ask(&q, p);
                        match poll(&mut a) {
                            Some(slot) => held.push(slot),
                            None => asking.push((p, a)),
                        }
                    }
                    Op::Cancel(n) if !asking.is_empty() => {
                        let n = n % asking.len();
                        drop(asking.swap_remove(n));
                    }
                    Op::Release(n) if !held.is_empty() => {
                        let n = n % held.len();
                        held.swap_remove(n);
                    }
                    Op::Poll => {
                        let mut still = Vec::new();
                        for (p, mut a) in asking.drain(..) {
                            match poll(&mut a) {
                                Some(slot) => held.push(slot),
                                None => still.push((p, a)),
                            }
                        }
                        asking = still;
                    }
                    Op::Cancel(_) | Op::Release(_) => {}
                }
                let in_flight = q.in_flight();
                let queued = q.queued();
                for p in Priority::ALL {
                    prop_assert!(in_flight[p.index()] <= limits.of(p), "{p:?}: {in_flight:?}");
                    let free = in_flight.iter().sum::<usize>() < limits.total()
                        && in_flight[p.index()] < limits.of(p);
                    prop_assert!(queued[p.index()] == 0 || !free, "{p:?} waits with room: {in_flight:?} {queued:?}");
                }
                prop_assert!(in_flight.iter().sum::<usize>() <= limits.total());
                if queued[0] > 0 {
                    prop_assert!(
                        in_flight[0] >= limits.total() - limits.of(Priority::Warmup) - limits.of(Priority::Background),
                        "real time waits behind lower priorities: {in_flight:?}"
                    );
                }
                // slots granted = slots held + those granted to requests that did not look yet
                let waiting: usize = queued.iter().sum();
                let granted_unseen = asking.len() - waiting;
                prop_assert_eq!(in_flight.iter().sum::<usize>(), held.len() + granted_unseen);
            }
            drop(asking);
            drop(held);
            prop_assert_eq!(q.in_flight(), [0, 0, 0]);
            prop_assert_eq!(q.queued(), [0, 0, 0]);
        }
    }
}
