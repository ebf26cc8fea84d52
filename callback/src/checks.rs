//! Every check of a confirmation (docs/design.md §4.4), one named function each. A check that fails
//! returns a [`Deny`] carrying its name, which is both the metric label and the start of the 403
//! message, so an operator sees at once which rule refused a pod.

use crate::decision::{Deny, Policy, deny, split};
use crate::keys::PublicKeys;
use crate::pods::PodFacts;
use crate::replay::{ReplayCache, ReplayRefusal};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::subject::PodSubject;
use athenz_core::zts::{InstanceConfirmation, attr};
use jsonwebtoken::Validation;
use serde::Deserialize;
use std::collections::HashSet;
use std::net::IpAddr;

/// `attestationData` is there: ZTS sends a refresh with none when the instance gave none, and a
/// certificate alone proves nothing about the pod now.
pub fn check_attestation_present(c: &InstanceConfirmation) -> Result<(), Deny> {
    if c.attestation_data.is_empty() {
        Err(deny(
            "attestation_data",
            "missing: every launch and refresh must carry a fresh attestation",
        ))
    } else {
        Ok(())
    }
}

/// `provider` is ours.
pub fn check_provider(policy: &Policy, c: &InstanceConfirmation) -> Result<(), Deny> {
    if c.provider == policy.provider {
        Ok(())
    } else {
        Err(deny(
            "provider",
            format!("provider {:?} is not {:?}", c.provider, policy.provider),
        ))
    }
}

/// Claims as they arrive: every field optional so a missing one is named, not a parse error.
#[derive(Debug, Deserialize)]
pub struct ReceivedClaims {
    /// `iss`.
    pub iss: Option<String>,
    /// `aud` (a string; an array is accepted if it holds exactly one value).
    pub aud: Option<serde_json::Value>,
    /// `sub`.
    pub sub: Option<String>,
    /// `iat`.
    pub iat: Option<i64>,
    /// `nbf`.
    pub nbf: Option<i64>,
    /// `exp`.
    pub exp: Option<i64>,
    /// `jti`.
    pub jti: Option<String>,
    /// `node`: the node whose agent asked for the JWT.
    pub node: Option<String>,
}

/// The header's algorithm is allowed (never `none`, never HMAC), its `kid` is known, and the
/// algorithm is the one of that key's type; then the signature verifies. Returns the claims.
pub fn check_token_signature(
    policy: &Policy,
    keys: &PublicKeys,
    token: &str,
) -> Result<ReceivedClaims, Deny> {
    if token.is_empty() {
        return Err(deny("algorithm", "no attestation data"));
    }
    // jsonwebtoken has no `none` algorithm, so such a header fails here.
    let header = jsonwebtoken::decode_header(token)
        .map_err(|e| deny("algorithm", format!("unreadable JWT header: {e}")))?;
    if !policy.algorithms.contains(&header.alg) {
        return Err(deny(
            "algorithm",
            format!("algorithm {:?} is not allowed", header.alg),
        ));
    }
    let kid = header
        .kid
        .ok_or_else(|| deny("kid", "the JWT header has no kid"))?;
    let key = keys
        .get(&kid)
        .ok_or_else(|| deny("kid", format!("unknown key id {kid:?}")))?;
    if key.alg != header.alg {
        return Err(deny(
            "algorithm",
            format!(
                "key {kid} verifies {:?}, the token claims {:?}",
                key.alg, header.alg
            ),
        ));
    }
    // Signature only: every claim is checked by its own function below.
    let mut validation = Validation::new(key.alg);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    jsonwebtoken::decode::<ReceivedClaims>(token, &key.key, &validation)
        .map(|data| data.claims)
        .map_err(|e| deny("signature", format!("JWT does not verify: {e}")))
}

/// Every check of a pod's confirmation that needs only the request itself, in order: the
/// attestation JWT's signature and claims, then the names it asks for against the pod it names.
/// What is left (the pod through the Kubernetes API, the SANs) needs the cluster. Pure but for
/// the replay cache, so the fuzz target `callback_confirmation` drives it.
pub fn check_request(
    policy: &Policy,
    keys: &PublicKeys,
    replay: &ReplayCache,
    c: &InstanceConfirmation,
    now: i64,
) -> Result<(PodSubject, ReceivedClaims), Deny> {
    let claims = check_token_signature(policy, keys, c.attestation_data.expose())?;
    let exp = check_exp(policy, &claims, now)?;
    check_iat_nbf(policy, &claims, now)?;
    check_aud(policy, &claims)?;
    check_iss(policy, &claims)?;
    check_jti(replay, &claims, exp, now)?;
    let subject = check_subject(&claims)?;
    check_domain_service(&subject, c)?;
    check_instance_id(&subject, c)?;
    // with domains by annotation, the namespace is read first (CallbackHandler::confirm)
    if !policy.mapper.honours_annotation() {
        check_namespace(policy, &subject)?;
    }
    Ok((subject, claims))
}

/// `exp` is present and not passed (allowing the skew).
pub fn check_exp(policy: &Policy, claims: &ReceivedClaims, now: i64) -> Result<i64, Deny> {
    let exp = claims
        .exp
        .ok_or_else(|| deny("exp", "the JWT has no exp"))?;
    if exp + policy.skew_secs < now {
        return Err(deny("exp", format!("the JWT expired at {exp} (now {now})")));
    }
    if exp > now + policy.max_lifetime_secs + policy.skew_secs {
        return Err(deny(
            "exp",
            format!(
                "the JWT is valid until {exp}, more than {}s from now",
                policy.max_lifetime_secs
            ),
        ));
    }
    Ok(exp)
}

/// `iat` and `nbf`, when present, are not in the future beyond the skew.
pub fn check_iat_nbf(policy: &Policy, claims: &ReceivedClaims, now: i64) -> Result<(), Deny> {
    for (name, value) in [("iat", claims.iat), ("nbf", claims.nbf)] {
        if let Some(t) = value
            && t > now + policy.skew_secs
        {
            return Err(deny(
                "iat_nbf",
                format!(
                    "{name} {t} is in the future (now {now}, skew {}s)",
                    policy.skew_secs
                ),
            ));
        }
    }
    Ok(())
}

/// `aud` is ours.
pub fn check_aud(policy: &Policy, claims: &ReceivedClaims) -> Result<(), Deny> {
    let aud = match &claims.aud {
        Some(serde_json::Value::String(s)) => Some(s.as_str()),
        Some(serde_json::Value::Array(items)) if items.len() == 1 => items[0].as_str(),
        _ => None,
    };
    match aud {
        Some(a) if a == policy.audience => Ok(()),
        Some(a) => Err(deny(
            "aud",
            format!("audience {a:?} is not {:?}", policy.audience),
        )),
        None => Err(deny("aud", "the JWT has no single aud")),
    }
}

/// `iss` is the configured issuer, when one is configured.
pub fn check_iss(policy: &Policy, claims: &ReceivedClaims) -> Result<(), Deny> {
    match (&policy.issuer, &claims.iss) {
        (None, _) => Ok(()),
        (Some(want), Some(got)) if want == got => Ok(()),
        (Some(want), got) => Err(deny("iss", format!("issuer {got:?} is not {want:?}"))),
    }
}

/// `jti` is present and not seen before; it is remembered until `exp`.
pub fn check_jti(
    replay: &ReplayCache,
    claims: &ReceivedClaims,
    exp: i64,
    now: i64,
) -> Result<(), Deny> {
    let jti = claims
        .jti
        .as_deref()
        .filter(|j| !j.is_empty() && j.len() <= 256)
        .ok_or_else(|| deny("jti", "the JWT has no usable jti"))?;
    replay
        .check_and_record(jti, exp, now)
        .map_err(|refusal| match refusal {
            ReplayRefusal::Replayed => deny("jti", "the JWT was already used"),
            ReplayRefusal::Full => deny("jti", "the replay cache is full; try again later"),
        })
}

/// `sub` is a valid pod subject.
pub fn check_subject(claims: &ReceivedClaims) -> Result<PodSubject, Deny> {
    let sub = claims
        .sub
        .as_deref()
        .ok_or_else(|| deny("subject", "the JWT has no sub"))?;
    PodSubject::parse_uri(sub).map_err(|e| deny("subject", e.to_string()))
}

/// The subject's domain and service are the request's.
pub fn check_domain_service(subject: &PodSubject, c: &InstanceConfirmation) -> Result<(), Deny> {
    if subject.domain == c.domain && subject.service == c.service {
        Ok(())
    } else {
        Err(deny(
            "domain_service",
            format!(
                "the JWT is for {}.{}, the request for {}.{}",
                subject.domain, subject.service, c.domain, c.service
            ),
        ))
    }
}

/// `attributes.instanceId` is the subject's uid.
pub fn check_instance_id(subject: &PodSubject, c: &InstanceConfirmation) -> Result<(), Deny> {
    match c.attributes.get(attr::INSTANCE_ID) {
        Some(id) if *id == subject.uid => Ok(()),
        other => Err(deny(
            "instance_id",
            format!("instanceId {other:?} is not the pod uid {}", subject.uid),
        )),
    }
}

/// The subject's namespace maps to its domain.
pub fn check_namespace(policy: &Policy, subject: &PodSubject) -> Result<(), Deny> {
    let mapped = policy
        .mapper
        .namespace_to_domain(&subject.namespace)
        .map_err(|e| deny("namespace", e.to_string()))?;
    check_mapped_domain(subject, &mapped)
}

/// The subject's domain is `mapped`, its namespace's (by the mapping or its annotation).
pub fn check_mapped_domain(subject: &PodSubject, mapped: &str) -> Result<(), Deny> {
    if mapped == subject.domain {
        Ok(())
    } else {
        Err(deny(
            "namespace",
            format!(
                "namespace {} maps to domain {mapped}, not {}",
                subject.namespace, subject.domain
            ),
        ))
    }
}

/// The pod read from the API is the subject: exists with that uid, is not terminating, is Pending or
/// Running, runs as the subject's service account, and has the subject's IP.
pub fn check_pod(subject: &PodSubject, pod: Option<&PodFacts>) -> Result<(), Deny> {
    let pod = pod.ok_or_else(|| {
        deny(
            "pod_exists",
            format!("pod {}/{} does not exist", subject.namespace, subject.name),
        )
    })?;
    if pod.metadata.uid.as_deref() != Some(subject.uid.as_str()) {
        return Err(deny(
            "pod_uid",
            format!(
                "pod {}/{} has uid {:?}, not {}",
                subject.namespace, subject.name, pod.metadata.uid, subject.uid
            ),
        ));
    }
    if pod.metadata.deletion_timestamp {
        return Err(deny("pod_terminating", "the pod is being deleted"));
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    if phase != "Pending" && phase != "Running" {
        return Err(deny("pod_phase", format!("the pod is in phase {phase:?}")));
    }
    let account = pod.service_account();
    if account != subject.service {
        return Err(deny(
            "service_account",
            format!("the pod runs as {account:?}, not {:?}", subject.service),
        ));
    }
    let mut ips: HashSet<IpAddr> = HashSet::new();
    if let Some(s) = status {
        ips.extend(s.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()));
        ips.extend(
            s.pod_ips
                .iter()
                .flatten()
                .filter_map(|p| p.ip.parse::<IpAddr>().ok()),
        );
    }
    // An identity without an IP makes no claim about the pod's network, so there is nothing
    // to confirm: a CSI files-mode volume is published before the sandbox has an IP, and one
    // without `ipSAN` keeps no IP SAN for life (docs/design.md §4.10). `check_sans` still
    // allows a pod IP SAN only when the subject names that IP.
    match subject.ip {
        Some(ip) if !ips.contains(&ip) => {
            Err(deny("pod_ip", format!("the pod does not have IP {ip}")))
        }
        _ => Ok(()),
    }
}

/// The pod is scheduled on the node whose agent asked for the JWT (`spec.nodeName` equals the
/// JWT's `node`): a node's agent obtains identities only for its own pods
/// (docs/design.md §4.4, §4.9).
pub fn check_pod_node(
    subject: &PodSubject,
    claims: &ReceivedClaims,
    pod: &PodFacts,
) -> Result<(), Deny> {
    let node = claims
        .node
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| deny("pod_node", "the JWT names no node"))?;
    let scheduled = pod.node_name();
    if scheduled == Some(node) {
        Ok(())
    } else {
        Err(deny(
            "pod_node",
            format!(
                "pod {}/{} is scheduled on {}, but the identity was asked for by node {node}",
                subject.namespace,
                subject.name,
                scheduled.map_or_else(|| "no node".to_owned(), |n| format!("{n:?}"))
            ),
        ))
    }
}

/// The IPs in `sanIP` other than the pod's own (if any, the service's cluster IP is looked up).
pub fn extra_san_ips(subject: &PodSubject, c: &InstanceConfirmation) -> Result<Vec<IpAddr>, Deny> {
    let mut extra = Vec::new();
    for item in split(c.attributes.get(attr::SAN_IP)) {
        let ip: IpAddr = item
            .parse()
            .map_err(|_| deny("san_ip", format!("{item:?} is not an IP address")))?;
        if Some(ip) != subject.ip {
            extra.push(ip);
        }
    }
    Ok(extra)
}

/// Every `sanDNS`, `sanIP` and `sanURI` entry is one the pod is entitled to, as computed by the
/// identity builder every part shares (with the service IP only if the Service exists).
pub fn check_sans(
    policy: &Policy,
    subject: &PodSubject,
    service_ip: Option<IpAddr>,
    c: &InstanceConfirmation,
) -> Result<(), Deny> {
    let entitled = CsrIdentity::for_pod(&PodIdentityInput {
        domain: &subject.domain,
        service: &subject.service,
        provider: &policy.provider,
        dns_suffix: &policy.dns_suffix,
        instance_id: &subject.uid,
        pod_ip: subject.ip,
        service_ip,
    })
    .map_err(|e| deny("san_dns", format!("cannot compute the pod's names: {e}")))?;
    for dns in split(c.attributes.get(attr::SAN_DNS)) {
        if !entitled.dns_names.iter().any(|d| d == dns) {
            return Err(deny(
                "san_dns",
                format!("{dns} is not one of the pod's names"),
            ));
        }
    }
    for ip in split(c.attributes.get(attr::SAN_IP)) {
        let parsed: IpAddr = ip
            .parse()
            .map_err(|_| deny("san_ip", format!("{ip:?} is not an IP address")))?;
        if !entitled.ip_addresses.contains(&parsed) {
            return Err(deny(
                "san_ip",
                format!("{ip} is not one of the pod's addresses"),
            ));
        }
    }
    for uri in split(c.attributes.get(attr::SAN_URI)) {
        if !entitled.uris.iter().any(|u| u == uri) {
            return Err(deny(
                "san_uri",
                format!("{uri} is not one of the pod's URIs"),
            ));
        }
    }
    Ok(())
}
