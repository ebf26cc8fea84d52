//! Athenz's own ZTS's answers to every row of the table, recorded once against ZTS built from
//! Athenz's source (`harness/peers/athenz/zts/record` writes `harness/testbed/data/zts-recorded.json`),
//! so that every run, which cannot build ZTS, still holds the dev ZTS and the table to what real
//! ZTS said: the status, the whole message, what Athenz's Java client decoded from a success,
//! and the certificate it issued (subject, names, key usages, lifetime). A place where the dev
//! ZTS cannot say the same thing is listed, with its reason, in
//! `harness/testbed/data/zts-recorded-differences.tsv`; a listed row that agrees fails too, so
//! the list cannot go stale.

use super::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use x509_parser::prelude::*;

/// The whole record.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Record {
    /// The Athenz version of the ZTS that answered.
    pub(super) athenz: String,
    /// When (UTC date) and from which commit of this repository.
    pub(super) recorded: String,
    pub(super) commit: String,
    /// The command that wrote it.
    pub(super) command: String,
    pub(super) rows: BTreeMap<String, Answer>,
}

/// One row's answer, its varying parts written as `{instance}` and `{port}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) message: String,
    /// The certificate a success carried (`x509Certificate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) certificate: Option<Certificate>,
    /// What Athenz's Java client decoded from the same request's success (absent when it
    /// cannot send the row).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) decoded: BTreeMap<String, String>,
}

/// What of an issued certificate a relying party reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Certificate {
    pub(super) subject: String,
    pub(super) dns_names: Vec<String>,
    pub(super) uris: Vec<String>,
    pub(super) ip_addresses: Vec<String>,
    pub(super) emails: Vec<String>,
    pub(super) key_usage: String,
    pub(super) extended_key_usage: Vec<String>,
    pub(super) is_ca: bool,
    /// notAfter - notBefore, whole minutes.
    pub(super) lifetime_minutes: i64,
}

/// The varying parts of a text: the instance the row was about, any other UUID (a row may name
/// a second instance), loopback ports.
pub(super) fn normalized(text: &str, instance: &str) -> String {
    let mut out = if instance.is_empty() {
        text.to_owned()
    } else {
        text.replace(instance, "{instance}")
    };
    out = replace_uuids(&out);
    let marker = "127.0.0.1:";
    let mut from = 0;
    while let Some(at) = out[from..].find(marker) {
        let start = from + at + marker.len();
        let digits = out[start..].bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            out.replace_range(start..start + digits, "{port}");
        }
        from = start;
    }
    out
}

/// Every UUID (8-4-4-4-12 hex digits) in `text` as `{uuid}`.
fn replace_uuids(text: &str) -> String {
    let is_uuid = |s: &[u8]| {
        s.len() == 36
            && s.iter().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => *b == b'-',
                _ => b.is_ascii_hexdigit(),
            })
    };
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + 36 <= bytes.len() && is_uuid(&bytes[i..i + 36]) {
            out.push_str("{uuid}");
            i += 36;
        } else {
            let ch = text[i..].chars().next().unwrap_or_default();
            out.push(ch);
            i += ch.len_utf8().max(1);
        }
    }
    out
}

/// A row's answer as sent with reqwest, and decoded by Athenz's Java client when `java` got the
/// same status.
pub(super) fn answer_of(sent: &Sent, java: Option<&Sent>) -> Answer {
    let reply = &sent.reply;
    let certificate = reply
        .body
        .as_ref()
        .and_then(|b| b["x509Certificate"].as_str())
        .filter(|_| reply.status < 300)
        .map(|pem| certificate_of(pem, &sent.instance));
    let decoded = java
        .filter(|j| j.reply.status == reply.status && reply.status < 300)
        .and_then(|j| Some((j.reply.decoded.as_ref()?, j.instance.as_str())))
        .and_then(|(decoded, instance)| {
            let fields = decoded.as_object()?.keys().filter_map(|name| {
                let value = field_text(decoded, name)?;
                Some((name.clone(), normalized(&value, instance)))
            });
            Some(fields.collect())
        })
        .unwrap_or_default();
    Answer {
        status: reply.status,
        message: normalized(&reply.message, &sent.instance),
        certificate,
        decoded,
    }
}

fn certificate_of(pem: &str, instance: &str) -> Certificate {
    let (_, block) = parse_x509_pem(pem.as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(&block.contents).unwrap();
    let mut dns_names = Vec::new();
    let mut uris = Vec::new();
    let mut ip_addresses = Vec::new();
    let mut emails = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns_names.push(normalized(d, instance)),
                GeneralName::URI(u) => uris.push(normalized(u, instance)),
                GeneralName::IPAddress(ip) => ip_addresses.push(format!("{ip:?}")),
                GeneralName::RFC822Name(e) => emails.push(normalized(e, instance)),
                other => dns_names.push(format!("other: {other:?}")),
            }
        }
    }
    let key_usage = cert
        .key_usage()
        .ok()
        .flatten()
        .map(|k| k.value.to_string())
        .unwrap_or_default();
    let extended_key_usage = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .map(|e| {
            let e = e.value;
            let mut v = Vec::new();
            if e.server_auth {
                v.push("serverAuth".to_owned());
            }
            if e.client_auth {
                v.push("clientAuth".to_owned());
            }
            v.extend(e.other.iter().map(|o| o.to_id_string()));
            v
        })
        .unwrap_or_default();
    let validity = cert.validity();
    Certificate {
        subject: normalized(&cert.subject().to_string(), instance),
        dns_names,
        uris,
        ip_addresses,
        emails,
        key_usage,
        extended_key_usage,
        is_ca: cert.is_ca(),
        lifetime_minutes: (validity.not_after.timestamp() - validity.not_before.timestamp()) / 60,
    }
}

/// Where `got` (the dev ZTS) says something else than `want` (real ZTS), field by field.
pub(super) fn differences(want: &Answer, got: &Answer) -> Vec<String> {
    let mut out = Vec::new();
    if want.status != got.status {
        out.push(format!("status {} (real ZTS {})", got.status, want.status));
    }
    if want.message != got.message {
        out.push(format!(
            "message {:?} (real ZTS {:?})",
            got.message, want.message
        ));
    }
    if want.certificate != got.certificate {
        out.push(format!(
            "certificate {:?} (real ZTS {:?})",
            got.certificate, want.certificate
        ));
    }
    out
}

/// The listed differences: case → reason.
pub(super) fn listed_differences() -> BTreeMap<String, String> {
    include_str!("../../data/zts-recorded-differences.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .skip(1)
        .map(|line| {
            let (case, reason) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("case<TAB>reason: {line:?}"));
            assert!(
                !reason.trim().is_empty(),
                "{case}: a difference states its reason"
            );
            (case.to_owned(), reason.to_owned())
        })
        .collect()
}

#[test]
fn normalizing_replaces_the_instance_other_uuids_and_ports() {
    assert_eq!(
        normalized("x 127.0.0.1:4431/a uid-1 127.0.0.1: end", "uid-1"),
        "x 127.0.0.1:{port}/a {instance} 127.0.0.1: end"
    );
    assert_eq!(
        normalized(
            "3d1b1203-af68-4428-8858-629048462946.instanceid é 3d1b1203-af68",
            "x"
        ),
        "{uuid}.instanceid é 3d1b1203-af68"
    );
}

/// The recording: every row sent with reqwest (status, message, certificate) and through
/// Athenz's Java client (what it decodes), written as a [`Record`] and read back. With
/// `ZTS_RECORD_OUT` set (`harness/peers/athenz/zts/record`) the rows go to Athenz's own ZTS,
/// built from its source, and the record is written there; otherwise (every run: CI cannot
/// build ZTS) the same recording runs against the dev ZTS into a temporary file, so the
/// recorder itself is exercised on every landing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recording_writes_every_row_as_its_zts_answered() {
    let (real, out, _scratch) = match std::env::var_os("ZTS_RECORD_OUT") {
        Some(out) => (true, std::path::PathBuf::from(out), None),
        None => {
            let dir = tempfile::tempdir().unwrap();
            (false, dir.path().join("zts-recorded.json"), Some(dir))
        }
    };
    let rows = rows();
    let raw = bed_on(real, None).await;
    let java = bed_on(real, Some(Harness::Java)).await;
    let mut answers = BTreeMap::new();
    for row in &rows {
        let sent = run(&raw, &row.case).await;
        let decoded = run(&java, &row.case).await;
        let answer = answer_of(&sent, Some(&decoded));
        println!(
            "zts-record: {} {} {:?}",
            row.case, answer.status, answer.message
        );
        answers.insert(row.case.clone(), answer);
    }
    let record = Record {
        athenz: athenz_testbed::real_zts::ATHENZ_VERSION.into(),
        recorded: std::env::var("ZTS_RECORD_DATE").unwrap_or_default(),
        commit: std::env::var("ZTS_RECORD_COMMIT").unwrap_or_default(),
        command: "harness/peers/athenz/zts/record".into(),
        rows: answers,
    };
    let mut text = serde_json::to_string_pretty(&record).unwrap();
    text.push('\n');
    std::fs::write(&out, text).unwrap();
    if let ZtsUnderTest::Real { zts, .. } = &raw.zts {
        println!("zts-record: real ZTS's log: {}", zts.log().display());
    }
    // what was written reads back whole: every row, each answered over HTTP, the successes
    // with what Athenz's client decoded
    let back: Record = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(back.rows.len(), rows.len());
    for row in &rows {
        let answer = &back.rows[&row.case];
        assert_ne!(
            answer.status, 0,
            "{}: no HTTP answer: {}",
            row.case, answer.message
        );
        if answer.status < 300 && row.athenz_clients.iter().any(|c| c == "java") {
            assert!(!answer.decoded.is_empty(), "{}: nothing decoded", row.case);
        }
    }
}

/// The record covers exactly the table's rows, and the table says what real ZTS said: each
/// row's status, a message starting with the row's reason, a success's answer field by field
/// as Athenz's Java client decoded real ZTS's.
#[test]
fn the_table_says_what_real_zts_answered() {
    let record: Record =
        serde_json::from_str(include_str!("../../data/zts-recorded.json")).unwrap();
    assert_eq!(record.athenz, athenz_testbed::real_zts::ATHENZ_VERSION);
    let rows = rows();
    let cases: Vec<&String> = rows.iter().map(|r| &r.case).collect();
    assert_eq!(
        record.rows.keys().collect::<Vec<_>>(),
        {
            let mut sorted = cases.clone();
            sorted.sort();
            sorted
        },
        "the record and the table name the same rows"
    );
    let mut failures = Vec::new();
    for row in &rows {
        let real = &record.rows[&row.case];
        if real.status != row.status {
            failures.push(format!(
                "{}: the table says {}, real ZTS {}",
                row.case, row.status, real.status
            ));
        }
        if let Some(prefix) = &row.message_prefix
            && !real.message.starts_with(prefix.as_str())
        {
            failures.push(format!(
                "{}: the table's reason {prefix:?}, real ZTS's message {:?}",
                row.case, real.message
            ));
        }
        // a row's answer is what Athenz's clients decode; rows neither sends have none to hold
        let sent_by_a_client = !row.athenz_clients.is_empty();
        for (name, want) in row.answer.iter().filter(|_| sent_by_a_client) {
            match real.decoded.get(name) {
                Some(got) if got == want => {}
                got => failures.push(format!(
                    "{}: the table's {name}={want:?}, real ZTS's {got:?}",
                    row.case
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the table and real ZTS disagree:\n{}",
        failures.join("\n")
    );
}

/// The dev ZTS answers every row as real ZTS did: the same status, the same whole message, the
/// same certificate; where it cannot, the row is listed with its reason, and a listed row that
/// agrees fails (the list cannot go stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_zts_answers_as_real_zts_did() {
    let record: Record =
        serde_json::from_str(include_str!("../../data/zts-recorded.json")).unwrap();
    let listed = listed_differences();
    for case in listed.keys() {
        assert!(
            record.rows.contains_key(case),
            "{case}: listed but not recorded"
        );
    }
    let bed = bed().await;
    let mut failures = Vec::new();
    for (case, real) in &record.rows {
        let dev = answer_of(&run(&bed, case).await, None);
        let differs = differences(real, &dev);
        match (differs.is_empty(), listed.get(case)) {
            (true, None) | (false, Some(_)) => {}
            (false, None) => failures.push(format!("{case}: {}", differs.join("; "))),
            (true, Some(reason)) => failures.push(format!(
                "{case}: listed as differing ({reason}) but the dev ZTS now agrees: unlist it"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "where the dev ZTS says something else than real ZTS:\n{}",
        failures.join("\n")
    );
}
