//! A namespace's domain as the running daemons need it: the mapping, and, where the install
//! honours the `athenz.io/domain` annotation ([`DomainMapper::honours_annotation`]), the
//! namespace's annotation read from the Kubernetes API. The agent (what it issues) and the
//! callback (what it confirms) both ask through this, so they cannot disagree.
//!
//! An annotation read is kept [`CACHE_FOR`] (a change reaches new identities within that), at
//! most [`CACHE_ENTRIES`] namespaces (the least recently read go first). Without the annotation
//! nothing is read and nothing cached.

use super::{DOMAIN_ANNOTATION, DomainMapper, NameError};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an annotation read is used.
pub const CACHE_FOR: Duration = Duration::from_secs(30);
/// The most namespaces cached.
pub const CACHE_ENTRIES: usize = 4096;

/// Where a namespace's annotation comes from: the API (`KubeNamespaces`), or a test's table.
pub trait AnnotationSource: Send + Sync {
    /// The namespace's `athenz.io/domain` annotation; `None` when it has none or does not exist.
    fn domain_annotation<'a>(
        &'a self,
        namespace: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + 'a>>;
}

/// Why a namespace has no domain now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainLookupError {
    /// The mapping refuses it (a bad name, the admin domain, an annotation not allowed).
    #[error(transparent)]
    Refused(#[from] NameError),
    /// The annotation could not be read: try again.
    #[error("reading namespace {namespace}'s {DOMAIN_ANNOTATION} annotation: {reason}")]
    Unavailable {
        /// The namespace.
        namespace: String,
        /// What the read said.
        reason: String,
    },
}

/// The mapping, with the annotations it honours.
pub struct NamespaceDomains {
    mapper: DomainMapper,
    source: Option<Arc<dyn AnnotationSource>>,
    cache: Mutex<HashMap<String, (Instant, Option<String>)>>,
}

impl NamespaceDomains {
    /// `mapper`, reading annotations from `source` when the mapper honours them (else `source`
    /// is never asked).
    pub fn new(mapper: DomainMapper, source: Option<Arc<dyn AnnotationSource>>) -> Self {
        let source = source.filter(|_| mapper.honours_annotation());
        Self {
            mapper,
            source,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping alone.
    pub fn mapper(&self) -> &DomainMapper {
        &self.mapper
    }

    /// Whether annotations are read at all.
    pub fn reads_annotations(&self) -> bool {
        self.source.is_some()
    }

    /// The domain of `namespace` now.
    pub async fn domain_of(&self, namespace: &str) -> Result<String, DomainLookupError> {
        let Some(source) = &self.source else {
            return Ok(self.mapper.namespace_to_domain(namespace)?);
        };
        // the name is checked before it reaches the API
        super::validate_dns_label("namespace", namespace)?;
        let annotation = match self.cached(namespace) {
            Some(annotation) => annotation,
            None => {
                let read = source
                    .domain_annotation(namespace)
                    .await
                    .map_err(|reason| DomainLookupError::Unavailable {
                        namespace: namespace.to_owned(),
                        reason,
                    })?;
                self.remember(namespace, read.clone());
                read
            }
        };
        Ok(self
            .mapper
            .namespace_domain(namespace, annotation.as_deref())?)
    }

    fn cached(&self, namespace: &str) -> Option<Option<String>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(namespace)
            .filter(|(read, _)| read.elapsed() < CACHE_FOR)
            .map(|(_, annotation)| annotation.clone())
    }

    fn remember(&self, namespace: &str, annotation: Option<String>) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHE_ENTRIES && !cache.contains_key(namespace) {
            cache.retain(|_, (read, _)| read.elapsed() < CACHE_FOR);
            if cache.len() >= CACHE_ENTRIES
                && let Some(oldest) = cache
                    .iter()
                    .min_by_key(|(_, (read, _))| *read)
                    .map(|(name, _)| name.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(namespace.to_owned(), (Instant::now(), annotation));
    }
}

/// Namespaces' annotations from the Kubernetes API: `GET /api/v1/namespaces/<name>` as
/// metadata only, within `timeout`. Needs `get` on namespaces.
#[cfg(feature = "kube")]
pub struct KubeNamespaces {
    api: kube::Api<k8s_openapi::api::core::v1::Namespace>,
    timeout: Duration,
}

#[cfg(feature = "kube")]
impl KubeNamespaces {
    /// Through `client`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            api: kube::Api::all(client),
            timeout,
        }
    }
}

#[cfg(feature = "kube")]
impl AnnotationSource for KubeNamespaces {
    fn domain_annotation<'a>(
        &'a self,
        namespace: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + 'a>> {
        Box::pin(async move {
            let read = tokio::time::timeout(self.timeout, self.api.get_metadata_opt(namespace))
                .await
                .map_err(|_| format!("no answer within {} s", self.timeout.as_secs()))?
                .map_err(|e| e.to_string())?;
            Ok(read.and_then(|ns| ns.metadata.annotations?.remove(DOMAIN_ANNOTATION)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Annotations from a table, counting reads; `fail` makes every read fail.
    struct Table {
        annotations: HashMap<String, String>,
        reads: AtomicUsize,
        fail: bool,
    }

    impl AnnotationSource for Table {
        fn domain_annotation<'a>(
            &'a self,
            namespace: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + 'a>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if self.fail {
                    return Err("connection refused".into());
                }
                Ok(self.annotations.get(namespace).cloned())
            })
        }
    }

    fn table(fail: bool) -> Arc<Table> {
        Arc::new(Table {
            annotations: [
                ("payments-prod".to_owned(), "acme.payments".to_owned()),
                ("sneaky".to_owned(), "bank.vault".to_owned()),
            ]
            .into(),
            reads: AtomicUsize::new(0),
            fail,
        })
    }

    fn allowing() -> DomainMapper {
        DomainMapper::new("k8s.admin", ["athenz-system"])
            .unwrap()
            .with_annotation_allow(["acme.*"])
            .unwrap()
    }

    #[tokio::test]
    async fn the_annotation_names_the_domain_once_read_and_is_cached() {
        let source = table(false);
        let domains = NamespaceDomains::new(allowing(), Some(source.clone()));
        assert!(domains.reads_annotations());
        assert_eq!(
            domains.domain_of("payments-prod").await.unwrap(),
            "acme.payments"
        );
        assert_eq!(
            domains.domain_of("payments-prod").await.unwrap(),
            "acme.payments"
        );
        assert_eq!(source.reads.load(Ordering::SeqCst), 1, "cached");
        assert_eq!(
            domains.domain_of("media-sports").await.unwrap(),
            "media.sports"
        );
        let err = domains.domain_of("sneaky").await.unwrap_err();
        assert!(err.to_string().contains("does not allow"), "{err}");
        assert!(matches!(err, DomainLookupError::Refused(_)));
        // a hostile name never reaches the API
        let before = source.reads.load(Ordering::SeqCst);
        assert!(domains.domain_of("../etc").await.is_err());
        assert_eq!(source.reads.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn without_an_allow_list_nothing_is_read() {
        let source = table(false);
        let domains = NamespaceDomains::new(
            DomainMapper::new("k8s.admin", ["athenz-system"]).unwrap(),
            Some(source.clone()),
        );
        assert!(!domains.reads_annotations());
        assert_eq!(
            domains.domain_of("payments-prod").await.unwrap(),
            "payments.prod"
        );
        assert_eq!(source.reads.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_unreadable_namespace_is_unavailable_not_refused() {
        let domains = NamespaceDomains::new(allowing(), Some(table(true)));
        let err = domains.domain_of("payments-prod").await.unwrap_err();
        assert!(
            matches!(err, DomainLookupError::Unavailable { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("connection refused"), "{err}");
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let domains = NamespaceDomains::new(allowing(), Some(table(false)));
        for n in 0..CACHE_ENTRIES + 10 {
            domains.domain_of(&format!("ns{n}")).await.unwrap();
        }
        let held = domains.cache.lock().unwrap().len();
        assert_eq!(held, CACHE_ENTRIES);
    }
}
