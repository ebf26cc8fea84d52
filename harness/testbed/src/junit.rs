//! The verdicts in a ginkgo junit report (`--ginkgo.junit-report`), as csi-sanity and
//! Kubernetes' e2e suite write them: one `<testcase name=… status=…>` per spec, a `<skipped
//! message=…>` or `<failure message=…>` inside. Read rather than trusted from the suite's exit
//! status, so a test can name what ran, what passed and why anything did not.

/// One spec's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The spec's full name.
    pub name: String,
    /// `passed`, `skipped`, `failed` (ginkgo also writes `panicked`, `interrupted`, …).
    pub status: String,
    /// The skip's or failure's message (empty when it passed).
    pub message: String,
}

impl Case {
    /// Whether it passed.
    pub fn passed(&self) -> bool {
        self.status == "passed"
    }

    /// Whether the suite skipped it.
    pub fn skipped(&self) -> bool {
        self.status == "skipped"
    }
}

/// Every `<testcase>` of `report`, in order, attributes unescaped.
pub fn cases(report: &str) -> Vec<Case> {
    report
        .split("<testcase ")
        .skip(1)
        .map(|case| {
            let skipped = attribute(case, "<skipped message");
            Case {
                name: attribute(case, "name"),
                status: attribute(case, "status"),
                message: if skipped.is_empty() {
                    attribute(case, "<failure message")
                } else {
                    skipped
                },
            }
        })
        .collect()
}

/// `name="…"` in `text`, unescaped (empty when absent).
fn attribute(text: &str, name: &str) -> String {
    text.split(&format!("{name}=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(unescape)
        .unwrap_or_default()
}

/// What the report's attributes escape.
fn unescape(text: &str) -> String {
    text.replace("&#39;", "'")
        .replace("&#34;", "\"")
        .replace("&#xA;", "\n")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_case_with_its_status_and_message() {
        let report = r#"<testsuite><testcase name="[It] a &#39;ro&#39; volume" classname="x" status="passed" time="1"></testcase>
<testcase name="[It] rw one" status="skipped"><skipped message="needs &quot;rw&quot;"></skipped></testcase>
<testcase name="[SynchronizedBeforeSuite]" status="failed"><failure message="no node &lt;ready&gt;&#xA;Got &#34;x&#34;" type="failed">x</failure></testcase></testsuite>"#;
        let cases = cases(report);
        assert_eq!(cases.len(), 3);
        assert_eq!(cases[0].name, "[It] a 'ro' volume");
        assert!(cases[0].passed() && cases[0].message.is_empty());
        assert!(cases[1].skipped());
        assert_eq!(cases[1].message, "needs \"rw\"");
        assert_eq!(cases[2].status, "failed");
        assert_eq!(cases[2].message, "no node <ready>\nGot \"x\"");
        assert!(super::cases("no cases").is_empty());
    }
}
