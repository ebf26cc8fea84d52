//! Periodic background tasks: the one timer every reloader uses (TLS pairs in [`crate::tls`],
//! signing and public keys in the daemons). Below both `tls` and `daemon`, which use it.

use std::time::Duration;

/// Runs `tick` every `interval` on a background task, first at once (missed ticks are delayed,
/// never bunched). Every reloader here — TLS pairs, signing keys, public keys — runs on this.
pub fn every(
    interval: Duration,
    mut tick: impl FnMut() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            tick();
        }
    })
}
