//! A closed-loop HTTP load generator for the benchmarks: workers sharing one client (so one
//! keep-alive connection each) post bodies in turn and time every answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Posts `bodies[..count]` to `url` with `concurrency` workers; every answer must be 200.
/// Returns the wall time and each request's latency (unsorted).
pub async fn post_each<B>(
    client: &reqwest::Client,
    url: &str,
    bodies: Arc<Vec<B>>,
    count: usize,
    concurrency: usize,
) -> Result<(Duration, Vec<Duration>), String>
where
    B: Clone + Into<reqwest::Body> + Send + Sync + 'static,
{
    let count = count.min(bodies.len());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, bodies, next) =
            (client.clone(), url.to_owned(), bodies.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok(latencies);
                }
                let t = Instant::now();
                let response = client
                    .post(&url)
                    .body(bodies[i].clone())
                    .send()
                    .await
                    .map_err(|e| format!("POST {url}: {e}"))?;
                let status = response.status();
                let _ = response.bytes().await;
                if status != reqwest::StatusCode::OK {
                    return Err(format!("POST {url} answered {status}"));
                }
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.map_err(|e| e.to_string())??);
    }
    Ok((started.elapsed(), all))
}
