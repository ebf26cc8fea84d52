//! What the upgrade test reads in logs and errors: the refreshes the dev ZTS refused, and which
//! refusals and failed creations are a previous release's known defects rather than judgements.

use super::*;

/// The dev ZTS's log so far.
pub(super) fn zts_log(layout: &Layout) -> String {
    std::fs::read_to_string(layout.logs.join(format!("{}.log", install::ZTS))).unwrap_or_default()
}

/// The instance refreshes a dev ZTS log refused, each line without its terminal colours: its
/// refusals of `POST /zts/v1/instance/<provider>/<domain>/<service>/<id>` (registrations are
/// `/zts/v1/instance` alone). Any status counts: a refresh ZTS could not serve (its provider
/// unreachable, say) is as refused to the pod as one it judged.
pub(super) fn refresh_refusals(log: &str) -> Vec<String> {
    const REFRESH: &str = "/zts/v1/instance/";
    log.lines()
        .map(without_colours)
        .filter(|l| l.contains("dev ZTS refused"))
        .filter(|l| {
            l.match_indices(REFRESH).any(|(at, _)| {
                let path = l[at + REFRESH.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default();
                path.split('/').count() == 4
            })
        })
        .collect()
}

/// The pod a callback's "cannot tell now" names (`pod <namespace>/<name>:`), if in the test's
/// namespace.
pub(super) fn refused_pod(line: &str) -> Option<&str> {
    let prefix = format!("pod {RESTRICTED_NAMESPACE}/");
    let at = line.find(&prefix)? + prefix.len();
    line[at..].split(':').next().filter(|name| !name.is_empty())
}

/// A previous release's callback whose call to the Kubernetes API was ended under it on a
/// pooled connection ([`ENDS_CALLS_ON_IDLE_API_CONNECTIONS`]), not a judgement.
pub(super) fn is_idle_api_connection_ended(line: &str) -> bool {
    line.contains("unable to verify attestation data")
        && line.contains("cannot tell now (kubernetes_api)")
        && line.contains("client error (SendRequest)")
}

/// The previous release's callback refusing a refresh without an IP for a pod that has one.
pub(super) fn is_ip_less_refresh_refused(line: &str) -> bool {
    line.contains("unable to verify attestation data")
        && line.contains("an identity without an IP is only for a pod that has none yet")
}

/// An agent the roll is replacing, refreshing its node identity after its pod was marked for
/// deletion (before the kubelet's SIGTERM reached it): the callback refuses a terminating
/// agent, as it must, and the agent that replaces it on the node registers its own.
pub(super) fn is_replaced_agent_refused(line: &str) -> bool {
    line.contains("/athenz-agent/")
        && line.contains("unable to verify attestation data")
        && line.contains("node_pod: the agent pod ")
        && line.contains(" is being deleted")
}

/// Whether a refused refresh is ZTS failing to connect to the callback (`Connection refused`),
/// not a judgement.
pub(super) fn is_callback_connection_refused(line: &str) -> bool {
    line.contains("unable to verify attestation data")
        && line.contains("athenz-callback.")
        && line.contains("Connection refused")
}

/// Whether a pod's creation failed because the API server could not connect to the injection
/// webhook (`connection refused`) or did not trust its certificate, not because the webhook
/// judged the pod.
pub(super) fn is_webhook_connection_refused(error: &str) -> bool {
    error.contains("failed calling webhook \"initializer.athenz.io\"")
        && (error.contains("connect: connection refused")
            || error.contains("certificate signed by unknown authority"))
}

/// `line` without its ANSI escape sequences (`ESC [ … letter`).
pub(super) fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn refused_refreshes_are_counted_and_registrations_are_not() {
    // lines as the dev ZTS writes them, colours and all
    let refresh = "\u{1b}[2m2026-11-27T19:26:34Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m dev ZTS refused \
                   \u{1b}[3mpath\u{1b}[0m\u{1b}[2m=\u{1b}[0m/zts/v1/instance/k8s.admin.athenz-callback/\
                   bank.vault/reader/0b6f5d1e-1f0e-4f5e-9d3e-2b7e5c1d9a10 \u{1b}[3mstatus\u{1b}[0m\
                   \u{1b}[2m=\u{1b}[0m403 Forbidden pod_exists";
    let register = "dev ZTS refused \u{1b}[3mpath\u{1b}[0m\u{1b}[2m=\u{1b}[0m/zts/v1/instance \
                    \u{1b}[3mstatus\u{1b}[0m\u{1b}[2m=\u{1b}[0m504 Gateway Timeout";
    let served = "dev ZTS served path=/zts/v1/instance/p/d/s/i status=200";
    let log = [refresh, register, served, refresh].join("\n");
    let refused = refresh_refusals(&log);
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert!(
        refused[0].contains("403 Forbidden pod_exists") && !refused[0].contains('\u{1b}'),
        "{}",
        refused[0]
    );
    assert!(refresh_refusals(register).is_empty());
    assert!(!is_callback_connection_refused(&refused[0]));
    let unreachable = "dev ZTS refused path=/zts/v1/instance/p/d/s/i status=504 Gateway Timeout \
                       unable to verify attestation data: ResourceException (504): error sending \
                       request for url (https://athenz-callback.k8s-admin.svc.cluster.local/refresh): \
                       client error (Connect): tcp connect error: Connection refused (os error 111)";
    assert!(is_callback_connection_refused(unreachable));
    assert!(!is_idle_api_connection_ended(unreachable));
    // as the three-node rollback to 0.2.0 met it
    let idle_ended = "INFO athenz_testbed::zts::server: dev ZTS refused \
                      path=/zts/v1/instance/k8s.admin.athenz-callback/bank.vault/steady-files/\
                      734d9d2c-8707-4cec-a643-992cf1553b57 status=504 Gateway Timeout unable to \
                      verify attestation data: ResourceException (504): {\"code\":504,\"message\":\
                      \"cannot tell now (kubernetes_api): Kubernetes API: pod bank-vault/upgrade-17: \
                      ServiceError: client error (SendRequest)\"} client: null clientIP: 192.0.2.2";
    assert_eq!(refresh_refusals(idle_ended).len(), 1);
    assert!(is_idle_api_connection_ended(idle_ended));
    assert_eq!(refused_pod(idle_ended), Some("upgrade-17"));
    assert!(!is_callback_connection_refused(idle_ended));
    // the API answering, or not reachable at all, is not the idle connection's end
    let api_down = idle_ended.replace("client error (SendRequest)", "client error (Connect)");
    assert!(!is_idle_api_connection_ended(&api_down));
    let judged = idle_ended.replace("cannot tell now (kubernetes_api)", "pod_exists");
    assert!(!is_idle_api_connection_ended(&judged));
    // as a rollback met it: an agent being replaced refreshing its node identity
    let replaced = "INFO athenz_testbed::zts::server: dev ZTS refused \
                    path=/zts/v1/instance/k8s.admin.athenz-callback/k8s.admin/athenz-agent/vm \
                    status=403 Forbidden unable to verify attestation data: ResourceException \
                    (403): {\"code\":403,\"message\":\"node_pod: the agent pod \
                    athenz-system/athenz-agent-fn5sk is being deleted\"} client: null";
    assert_eq!(refresh_refusals(replaced).len(), 1);
    assert!(is_replaced_agent_refused(replaced));
    // a tenant pod's refusal, or an agent refused for another reason, is not
    assert!(!is_replaced_agent_refused(&judged));
    let other = replaced.replace("is being deleted", "does not exist");
    assert!(!is_replaced_agent_refused(&other));
    assert_eq!(refused_pod("pod other-ns/upgrade-17: x"), None);
}

#[test]
fn only_a_refused_connection_to_the_webhook_is_tried_again() {
    // as kubectl printed it while a 0.2.0 webhook pod was being replaced
    let refused = "applying pod upgrade-12 failed (exit status: 1): Error from server \
                   (InternalError): error when creating \"STDIN\": Internal error occurred: \
                   failed calling webhook \"initializer.athenz.io\": failed to call webhook: Post \
                   \"https://athenz-initializer.k8s-admin.svc:443/mutate?timeout=5s\": dial tcp \
                   10.244.1.2:8443: connect: connection refused";
    assert!(is_webhook_connection_refused(refused));
    let judged = "applying pod upgrade-12 failed (exit status: 1): Error from server \
                  (Forbidden): admission webhook \"initializer.athenz.io\" denied the request: \
                  athenz.io/ip-san is for csi-files volumes only";
    assert!(!is_webhook_connection_refused(judged));
    let timed_out = "failed calling webhook \"initializer.athenz.io\": failed to call webhook: \
                     Post \"https://athenz-initializer.k8s-admin.svc:443/mutate?timeout=5s\": \
                     context deadline exceeded";
    assert!(!is_webhook_connection_refused(timed_out));
}
