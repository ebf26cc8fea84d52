//! The callback's whole decision on a confirmation ZTS sends (docs/design.md §4.4), with the claims
//! signed by the key it trusts so every check after the signature is reached. The input is NUL
//! separated: the InstanceConfirmation JSON, the JWT claims JSON (signed into its
//! attestationData), and the pod JSON as the API would return it.
#![no_main]

use athenz_callback::checks;
use athenz_callback::replay::ReplayCache;
use athenz_core::zts::InstanceConfirmation;
use athenz_fuzz::{NOW, callback_setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (confirmation, claims, pod) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let setup = callback_setup();
    let pod = athenz_callback::pods::pod_facts(pod).ok();
    let Ok(mut c) = serde_json::from_slice::<InstanceConfirmation>(confirmation) else {
        return;
    };
    let _ = checks::check_provider(&setup.policy, &c);
    c.attestation_data = setup.sign(claims).into();
    let replay = ReplayCache::new(16);
    let Ok((subject, claims)) = checks::check_request(&setup.policy, &setup.keys, &replay, &c, NOW)
    else {
        return;
    };
    // what passing promised: the JWT's pod is the request's
    assert_eq!((&subject.domain, &subject.service), (&c.domain, &c.service));
    // the same token is refused the second time
    assert!(checks::check_request(&setup.policy, &setup.keys, &replay, &c, NOW).is_err());
    if checks::check_pod(&subject, pod.as_ref()).is_ok()
        && let Some(pod) = &pod
    {
        let _ = checks::check_pod_node(&subject, &claims, pod);
    }
    if let Ok(extra) = checks::extra_san_ips(&subject, &c) {
        let _ = checks::check_sans(&setup.policy, &subject, extra.first().copied(), &c);
        let _ = checks::check_sans(&setup.policy, &subject, None, &c);
    }
});
