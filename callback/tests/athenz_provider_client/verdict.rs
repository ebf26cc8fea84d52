//! The verdict on one case of `athenz_provider_client`: what each provider client concluded,
//! held to the case's written outcome ([`Want`]) and to the other client's conclusion. Kept
//! apart from the cases so that how a case can fail is read in one place.

use serde_json::Value;

/// What a client concluded: the confirmation (without the attestation data, which differs per
/// token); the refusal's code and text (`ProviderResourceException`); or a 200 whose body is no
/// `InstanceConfirmation` (an exception outside `ProviderResourceException`: ZTS answers its
/// client 403, so this is never a confirmation).
#[derive(Debug, PartialEq)]
pub enum Concluded {
    Confirmed(Value),
    Refused(u16, String),
    Unreadable(String),
}

/// The outcome a case is written to have, checked in each client's conclusion.
#[derive(Debug, Clone)]
pub enum Want {
    /// A decoded `InstanceConfirmation` equal, field by field, to this (attestation data left
    /// out).
    Confirmed(Value),
    /// The callback's refusal: `ResourceException (<status>): ` and its JSON error body, whose
    /// code is the status and whose message starts with the reason.
    Denied(u16, &'static str),
    /// A provider's answer other than 200, read as its text: `ResourceException (<status>): `
    /// and exactly this.
    Answered(u16, &'static str),
    /// A 200 neither client can read as a confirmation; each says why in its own words (these
    /// are in them).
    Unreadable {
        ours: &'static str,
        athenz: &'static str,
    },
    /// No answer from the provider (504, `GATEWAY_TIMEOUT`), each client's own words on why
    /// (these are in them): a refused handshake, or the client's read timeout.
    NoAnswer {
        ours: &'static str,
        athenz: &'static str,
    },
}

/// Where one conclusion misses the case's written outcome (`None`: it meets it), in `client`'s
/// own words where the outcome has them per client.
fn misses(want: &Want, concluded: &Concluded, client: Client) -> Option<String> {
    let resource = |code: u16| format!("ResourceException ({code}): ");
    match (want, concluded) {
        (Want::Confirmed(expected), Concluded::Confirmed(got)) => field_differences(expected, got),
        (Want::Denied(code, reason), Concluded::Refused(got, message)) if got == code => {
            let Some(body) = message.strip_prefix(&resource(*code)) else {
                return Some(format!("not a ResourceException ({code}): {message}"));
            };
            let Ok(body) = serde_json::from_str::<Value>(body) else {
                return Some(format!("not the callback's JSON refusal: {body}"));
            };
            let text = body["message"].as_str().unwrap_or_default();
            if body["code"] != *code {
                Some(format!("the body's code is {}, not {code}", body["code"]))
            } else if !text.starts_with(reason) {
                Some(format!("reason {text:?}, not {reason:?}…"))
            } else {
                None
            }
        }
        (Want::Answered(code, text), Concluded::Refused(got, message)) if got == code => {
            (message != &format!("{}{text}", resource(*code))).then(|| {
                format!(
                    "{message:?}, not {:?}",
                    format!("{}{text}", resource(*code))
                )
            })
        }
        (Want::Unreadable { ours, athenz }, Concluded::Unreadable(message)) => {
            let words = client.pick(ours, athenz);
            (!message.contains(words)).then(|| format!("{message:?} does not say {words:?}"))
        }
        (Want::NoAnswer { ours, athenz }, Concluded::Refused(504, message)) => {
            let words = client.pick(ours, athenz);
            if !message.starts_with(&resource(504)) {
                Some(format!("not a ResourceException (504): {message}"))
            } else if message.contains("\"code\":") {
                Some(format!("the provider answered: {message}"))
            } else {
                (!message.contains(words)).then(|| format!("{message:?} does not say {words:?}"))
            }
        }
        (want, got) => Some(format!("concluded {got:?}, want {want:?}")),
    }
}

/// Which provider client.
#[derive(Clone, Copy)]
enum Client {
    /// The dev ZTS's port.
    Ours,
    /// Athenz's `InstanceHttpProvider`.
    Athenz,
}

impl Client {
    fn pick<'a>(self, ours: &'a str, athenz: &'a str) -> &'a str {
        match self {
            Self::Ours => ours,
            Self::Athenz => athenz,
        }
    }
}

/// The confirmation's fields that differ from the expected ones (each named), or `None`.
fn field_differences(expected: &Value, got: &Value) -> Option<String> {
    let empty = serde_json::Map::new();
    let fields = |v: &Value| v.as_object().cloned().unwrap_or_default();
    let (want, have) = (fields(expected), fields(got));
    let mut names: Vec<&String> = want.keys().chain(have.keys()).collect();
    names.sort();
    names.dedup();
    let mut differences = Vec::new();
    for name in names {
        if name == "attributes" {
            let attributes = |m: &serde_json::Map<String, Value>| {
                m.get("attributes")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_else(|| empty.clone())
            };
            let (want, have) = (attributes(&want), attributes(&have));
            let mut keys: Vec<&String> = want.keys().chain(have.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                if want.get(key) != have.get(key) {
                    differences.push(format!(
                        "attributes.{key}: {:?}, want {:?}",
                        have.get(key),
                        want.get(key)
                    ));
                }
            }
        } else if want.get(name) != have.get(name) {
            differences.push(format!(
                "{name}: {:?}, want {:?}",
                have.get(name),
                want.get(name)
            ));
        }
    }
    (!differences.is_empty()).then(|| differences.join("; "))
}

/// Whether the two conclusions agree beyond each meeting `want`: the same confirmation, or the
/// same refusal (a denial that names the callback's clock, `(now <seconds>)`, was asked a second
/// apart). Where the outcome is no confirmation or no answer, each client says why in its own
/// words, which [`misses`] checks one by one.
fn agree(want: &Want, ours: &Concluded, theirs: &Concluded) -> bool {
    match (want, ours, theirs) {
        (Want::Unreadable { .. }, Concluded::Unreadable(_), Concluded::Unreadable(_))
        | (Want::NoAnswer { .. }, Concluded::Refused(504, _), Concluded::Refused(504, _)) => true,
        (_, Concluded::Refused(x, a), Concluded::Refused(y, b)) => {
            x == y && without_clock(a) == without_clock(b)
        }
        _ => ours == theirs,
    }
}

/// The text without the clock reading a time-check denial carries.
fn without_clock(message: &str) -> String {
    match message.find("(now ") {
        Some(at) => match message[at..].find(')') {
            Some(end) => format!("{}{}", &message[..at], &message[at + end + 1..]),
            None => message.to_owned(),
        },
        None => message.to_owned(),
    }
}

/// The verdict on one case: both clients meet `want` and agree; else what went wrong.
pub fn verdict(want: &Want, ours: &Concluded, theirs: &Concluded) -> Result<(), String> {
    let mut wrong = Vec::new();
    if let Some(why) = misses(want, ours, Client::Ours) {
        wrong.push(format!("dev ZTS's client: {why}"));
    }
    if let Some(why) = misses(want, theirs, Client::Athenz) {
        wrong.push(format!("Athenz's client: {why}"));
    }
    if !agree(want, ours, theirs) {
        wrong.push("the two clients disagree".to_owned());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\n  dev ZTS's client: {ours:?}\n  Athenz's client:  {theirs:?}",
            wrong.join("\n  ")
        ))
    }
}
