//! No private key passes through the chart's values (docs/design.md §6): Helm keeps every value,
//! and the rendered manifest, in its release Secret. The chart has no value for a key, refuses
//! the removed ones and any value holding one, and every install the documentation shows renders
//! and stores no key.

use super::kustomize::{deploy_dir, key};
use super::render::{INSTALL_CA, helm, helm_template, helm_template_error};
use std::collections::BTreeMap;
use std::path::Path;

const PEM_KEY: &str = "PRIVATE KEY";
/// A stand-in private key, as the operator's key files hold one.
const PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----\n";
const PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nQUJD\n-----END PUBLIC KEY-----\n";

/// The removed key values are refused by the schema, naming the value and where keys go instead;
/// with the schema skipped the chart refuses them itself, and a key pasted into any other value.
#[test]
fn key_values_are_refused_naming_the_secrets_instead() {
    for args in [
        vec!["--set", "serviceKeys.athenz-callback=a key"],
        vec!["--set-string", "jwtSigningKeys.v1\\.pem=a key"],
    ] {
        let value = args[1].split('.').next().unwrap();
        for skip in [&[][..], &["--skip-schema-validation"][..]] {
            let err = helm_template_error(&[&args[..], skip].concat());
            for named in [
                value,
                "existingSecrets",
                "Install with Helm",
                "athenz-callback-key",
            ] {
                assert!(err.contains(named), "{args:?} {skip:?}: {named}: {err}");
            }
        }
    }
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), PRIVATE).unwrap();
    for value in [
        "jwtPublicKeys.v1\\.pem",
        "initializerTemplate",
        "agent.extraEnv[0].value",
    ] {
        let arg = format!("{value}={}", key_file.path().display());
        let mut args = vec!["--set-file", arg.as_str()];
        if value.starts_with("agent.extraEnv") {
            args.extend(["--set", "agent.extraEnv[0].name=KEY"]);
        }
        let err = helm_template_error(&args);
        assert!(
            err.contains("a value holds a PEM private key") && err.contains("existingSecrets"),
            "{value}: {err}"
        );
    }
}

/// values.yaml and values.schema.json hold no key value: the schema's only words on the removed
/// ones are its refusal (a constant no key equals), and the chart makes no Secret that holds data.
#[test]
fn the_chart_has_no_key_values_and_makes_no_key_secret() {
    let chart = deploy_dir().join("helm/athenz-k8s-identity");
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let parsed: serde_json::Value = serde_saphyr::from_str(&values).unwrap();
    for removed in ["serviceKeys", "jwtSigningKeys"] {
        assert!(parsed.get(removed).is_none(), "values.yaml has {removed}");
    }
    assert!(!values.contains(PEM_KEY));
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    assert!(!schema.to_string().contains(PEM_KEY));
    for removed in ["serviceKeys", "jwtSigningKeys"] {
        let refusal = &schema["properties"][removed];
        assert!(
            refusal["const"].as_str().unwrap().starts_with("removed: "),
            "{removed}: {refusal}"
        );
        assert!(refusal.get("type").is_none() && refusal.get("properties").is_none());
    }
    assert!(!chart.join("templates/secrets.yaml").exists());
    // the one Secret the chart makes is the initializer's CA's, shipped without data (the
    // initializer fills it in the cluster), whatever the release's namespace
    for namespace in ["k8s-admin", "default"] {
        let rendered = helm_template(&["--namespace", namespace]);
        let secrets: Vec<_> = rendered.keys().filter(|k| k.0 == "Secret").collect();
        assert_eq!(
            secrets,
            [&key("Secret", "k8s-admin", "athenz-initializer-ca")]
        );
        let secret = &rendered[secrets[0]];
        assert!(
            secret.get("data").is_none() && secret.get("stringData").is_none(),
            "{secret}"
        );
    }
}

/// Every Helm install the documentation shows (docs/*.md, README.md, the chart's README), run as
/// written with an operator's files beside it (their private keys included, as the documented
/// steps make them), renders, and neither its values nor its manifest holds a private key.
#[test]
fn every_documented_helm_install_renders_and_stores_no_key() {
    let root = athenz_testbed::bins::repo_root();
    let files = tempfile::tempdir().unwrap();
    let keys = files.path().join("keys");
    let operator_keys = files.path().join("operator-keys");
    for dir in [&keys, &operator_keys] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // where the documented steps leave the signing key: beside its public half
    std::fs::write(keys.join("jwt-signing-v1.pem"), PRIVATE).unwrap();
    std::fs::write(keys.join("jwt-public-v1.pem"), PUBLIC).unwrap();
    for service in ["athenz-jwt-service", "athenz-callback"] {
        std::fs::write(operator_keys.join(format!("{service}.key")), PRIVATE).unwrap();
    }
    let ca = files.path().join("ca.pem");
    std::fs::write(&ca, INSTALL_CA).unwrap();
    let vars: BTreeMap<&str, String> = [
        ("ZTS_URL", "https://zts.acme.test:4443/zts/v1".to_owned()),
        ("ATHENZ_CA", ca.display().to_string()),
        ("KEYS", operator_keys.display().to_string()),
        ("keys", keys.display().to_string()),
    ]
    .into();

    let mut pages = vec![
        root.join("README.md"),
        deploy_dir().join("helm/athenz-k8s-identity/README.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut installs = Vec::new();
    for page in &pages {
        for command in helm_installs(&std::fs::read_to_string(page).unwrap()) {
            installs.push((page.clone(), command));
        }
    }
    let pages_with_one: std::collections::BTreeSet<_> = installs.iter().map(|(p, _)| p).collect();
    assert!(
        pages_with_one.len() >= 3,
        "the README, the chart's README and docs/operating.md each show an install: {installs:?}"
    );
    for (page, command) in &installs {
        let words = shell_words(command, &vars);
        assert_eq!(
            words[..2],
            ["helm", "upgrade"],
            "{}: {command}",
            page.display()
        );
        let args: Vec<&str> = words[2..]
            .iter()
            .map(String::as_str)
            .filter(|w| *w != "--install")
            .collect();
        check_values_hold_no_key(&args, &root, command);
        let out = std::process::Command::new(helm())
            .arg("template")
            .args(&args)
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {command}: {}",
            page.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let manifest = String::from_utf8(out.stdout).unwrap();
        assert!(
            manifest.contains("kind: DaemonSet"),
            "{command}: {manifest}"
        );
        assert!(
            !manifest.contains(PEM_KEY),
            "{command} renders a private key"
        );
    }
}

/// Each value `args` gives (`--set`, `--set-string`, `--set-file`, `-f`/`--values` files) holds
/// no private key: what Helm would keep in its release Secret besides the manifest.
fn check_values_hold_no_key(args: &[&str], root: &Path, command: &str) {
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let (flag, value) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, value),
            _ => (*word, ""),
        };
        let takes_value = [
            "--set",
            "--set-string",
            "--set-json",
            "--set-file",
            "-f",
            "--values",
        ];
        if !takes_value.contains(&flag) {
            continue;
        }
        let value = if value.is_empty() {
            *words.next().unwrap()
        } else {
            value
        };
        let text = match flag {
            "--set-file" => {
                let (_, file) = value.split_once('=').unwrap();
                std::fs::read_to_string(root.join(file)).unwrap()
            }
            "-f" | "--values" => std::fs::read_to_string(root.join(value)).unwrap(),
            _ => value.to_owned(),
        };
        assert!(
            !text.contains(PEM_KEY),
            "{command}: {flag} {value} holds a private key"
        );
    }
}

/// The `helm install`/`helm upgrade` commands in `page`'s code blocks, each with its continued
/// lines joined.
fn helm_installs(page: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_code = false;
    let mut current: Option<String> = None;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code {
            continue;
        }
        let text = match current.take() {
            Some(mut open) => {
                open.push(' ');
                open.push_str(line.trim());
                open
            }
            None if line.trim_start().starts_with("helm install")
                || line.trim_start().starts_with("helm upgrade") =>
            {
                line.trim().to_owned()
            }
            None => continue,
        };
        match text.strip_suffix('\\') {
            Some(open) => current = Some(open.trim_end().to_owned()),
            None => commands.push(text),
        }
    }
    commands
}

/// `line`'s words as `sh` splits them: quotes removed, a backslash outside quotes escaping the
/// next character, `$NAME` and `${NAME}` outside single quotes expanded from `vars` (a variable
/// not there fails, naming it).
fn shell_words(line: &str, vars: &BTreeMap<&str, String>) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let mut quote = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, '\\') => word.get_or_insert_default().extend(chars.next()),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (Some(q), c) if c == q => quote = None,
            (None | Some('"'), '$') => {
                let braced = chars.next_if_eq(&'{').is_some();
                let mut name = String::new();
                while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    name.push(c);
                }
                if braced {
                    assert_eq!(chars.next(), Some('}'), "{line}");
                }
                let value = vars
                    .get(name.as_str())
                    .unwrap_or_else(|| panic!("${name} in `{line}`: give the test its value"));
                word.get_or_insert_default().push_str(value);
            }
            (_, c) => word.get_or_insert_default().push(c),
        }
    }
    assert!(quote.is_none(), "unclosed quote in `{line}`");
    words.extend(word);
    words
}

#[test]
fn the_shell_words_are_what_sh_makes_of_the_line() {
    let vars: BTreeMap<&str, String> =
        [("keys", "/k".to_owned()), ("URL", "a b".to_owned())].into();
    assert_eq!(
        shell_words(
            r#"helm x --set u="$URL" --set-file 'v1\.pem'="${keys}/p" a\ b '$URL'"#,
            &vars
        ),
        [
            "helm",
            "x",
            "--set",
            "u=a b",
            "--set-file",
            "v1\\.pem=/k/p",
            "a b",
            "$URL"
        ]
    );
}
