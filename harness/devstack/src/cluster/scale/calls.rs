//! Many calls of one kind, made the two ways the scale run makes them: at most so many in
//! flight (filling the cluster), or each on time at a steady rate whatever the earlier ones
//! take (an open arrival process, as a cluster's controllers create pods).

use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// `call` on every item, at most `parallel` in flight; every answer (the first failure fails).
pub async fn bounded<I, T, Fut>(
    items: impl IntoIterator<Item = I>,
    parallel: usize,
    call: impl Fn(I) -> Fut,
) -> anyhow::Result<Vec<T>>
where
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut calls = tokio::task::JoinSet::new();
    for item in items {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .context("the calls' semaphore")?;
        let answer = call(item);
        calls.spawn(async move {
            let answer = answer.await;
            drop(permit);
            answer
        });
    }
    join_all(calls).await
}

/// `call` on each item at `per_second`, each on time whatever the earlier ones take; every
/// answer (the first failure fails).
pub async fn at_rate<I, T, Fut>(
    items: impl IntoIterator<Item = I>,
    per_second: f64,
    call: impl Fn(I) -> Fut,
) -> anyhow::Result<Vec<T>>
where
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    anyhow::ensure!(
        per_second.is_finite() && per_second > 0.0,
        "a call rate must be above zero (got {per_second})"
    );
    let started = tokio::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for (i, item) in items.into_iter().enumerate() {
        tokio::time::sleep_until(started + Duration::from_secs_f64(i as f64 / per_second)).await;
        calls.spawn(call(item));
    }
    join_all(calls).await
}

async fn join_all<T: 'static>(
    mut calls: tokio::task::JoinSet<anyhow::Result<T>>,
) -> anyhow::Result<Vec<T>> {
    let mut answers = Vec::new();
    while let Some(joined) = calls.join_next().await {
        answers.push(joined.context("a call's task")??);
    }
    Ok(answers)
}
