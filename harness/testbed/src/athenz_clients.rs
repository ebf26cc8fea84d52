//! Athenz's own client code as a test's peer: the Java harness (`harness/peers/athenz/java`: ZTS's
//! `InstanceHttpProvider`, `ZTSClient`, the ZTS model and token classes, from Maven Central) and
//! the Go harness (`harness/peers/athenz/go`: `clients/go/zts` from the Go module proxy), both built by
//! `harness/peers/athenz/build`, which also builds Athenz's command-line tools ([`cli`]).
//!
//! A harness is a long-lived child process speaking one JSON object per line: a request naming an
//! operation and its material (a CSR, a body, file paths of a certificate and key), an answer
//! saying what the server said through Athenz's code. The tests build the material and judge the
//! answers; everything on the wire and every decoding of an answer is Athenz's.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// How long one call may take: a provider that never answers costs ZTS's own read timeout
/// (InstanceHttpProvider's default 30 s), plus a JVM's first-use class loading.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest answer line read from a harness.
const MAX_ANSWER: usize = 1 << 20;

/// Which of Athenz's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    /// `harness/peers/athenz/java`: Athenz's Java libraries.
    Java,
    /// `harness/peers/athenz/go`: Athenz's Go client.
    Go,
}

impl Harness {
    /// The name the contract table's `athenz_client` column uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Java => "java",
            Self::Go => "go",
        }
    }
}

/// A harness that could not be started or answered nonsense.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// `harness/peers/athenz/build` has not run (or failed).
    #[error("the {harness} harness is not built: {} is missing (run harness/peers/athenz/build; it needs mvn and go)", missing.display())]
    NotBuilt {
        /// Which harness.
        harness: &'static str,
        /// The file it would run from.
        missing: PathBuf,
    },
    /// One of Athenz's command-line tools is not built ([`cli`]).
    #[error("Athenz's {tool} is not built: {} is missing (run harness/peers/athenz/build; it needs go)", missing.display())]
    ToolNotBuilt {
        /// Which tool (`zts-svccert`, ...).
        tool: String,
        /// Where harness/peers/athenz/build puts it.
        missing: PathBuf,
    },
    /// Its process did not start (`java` missing, say).
    #[error("starting the {harness} harness: {source}")]
    Start {
        /// Which harness.
        harness: &'static str,
        source: std::io::Error,
    },
    /// It answered late, nonsense, or not at all.
    #[error("talking to the {harness} harness: {what}")]
    Protocol {
        /// Which harness.
        harness: &'static str,
        /// What went wrong.
        what: String,
    },
}

/// What Athenz's client made of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientAnswer {
    /// The server answered: its status and message (empty on success); on success, the answer
    /// as Athenz's model and token classes read it.
    Answered {
        /// The HTTP status (for a success, the one Athenz's client requires of that route).
        status: u16,
        /// ZTS's or the provider's message.
        message: String,
        /// The success as Athenz's classes read it.
        decoded: Option<Value>,
    },
    /// Athenz's client cannot express this request at all (why).
    Unsendable(String),
}

impl ClientAnswer {
    /// Status and message, the shape the contract tests compare; an unsendable request is
    /// status 0 with the reason.
    pub fn status_and_message(&self) -> (u16, String) {
        match self {
            Self::Answered {
                status, message, ..
            } => (*status, message.clone()),
            Self::Unsendable(why) => (0, format!("unsendable: {why}")),
        }
    }
}

/// Where `harness/peers/athenz/build` puts the harnesses: `target/athenz-clients/`.
pub fn build_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::bins::repo_root().join("target"));
    target.join("athenz-clients")
}

/// One of Athenz's command-line tools (`zts-svccert`, `zts-rolecert`, `zts-accesstoken`), as
/// harness/peers/athenz/build builds it from the `utils/` programs of the Athenz Go module the Go harness
/// pins: its path, or which is missing and how to build it.
pub fn cli(tool: &str) -> Result<PathBuf, HarnessError> {
    let path = build_dir().join("go").join(tool);
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::ToolNotBuilt {
            tool: tool.to_owned(),
            missing: path,
        })
    }
}

/// A running harness. Requests are answered in order, one at a time.
pub struct AthenzClient {
    harness: Harness,
    _child: Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
    /// PEM material the requests name by path, each written once: its path by its content.
    files: tempfile::TempDir,
    written: std::collections::HashMap<String, String>,
}

impl AthenzClient {
    /// Starts `harness` from `harness/peers/athenz/build`'s output.
    pub fn start(harness: Harness) -> Result<Self, HarnessError> {
        let name = harness.name();
        let dir = build_dir();
        let mut command = match harness {
            Harness::Java => {
                let classpath_file = dir.join("java/classpath");
                let classpath = std::fs::read_to_string(&classpath_file).map_err(|_| {
                    HarnessError::NotBuilt {
                        harness: name,
                        missing: classpath_file.clone(),
                    }
                })?;
                let mut c = tokio::process::Command::new("java");
                c.args(["-cp", classpath.trim(), "io.athenz.k8s.harness.Main"]);
                c
            }
            Harness::Go => {
                let binary = dir.join("go/athenz-go-harness");
                if !binary.is_file() {
                    return Err(HarnessError::NotBuilt {
                        harness: name,
                        missing: binary,
                    });
                }
                tokio::process::Command::new(binary)
            }
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| HarnessError::Start {
                harness: name,
                source,
            })?;
        let protocol = |what: &str| HarnessError::Protocol {
            harness: name,
            what: what.to_owned(),
        };
        let stdin = child.stdin.take().ok_or_else(|| protocol("no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| protocol("no stdout"))?;
        let files = tempfile::tempdir().map_err(|source| HarnessError::Start {
            harness: name,
            source,
        })?;
        Ok(Self {
            harness,
            _child: child,
            stdin,
            answers: BufReader::new(stdout).lines(),
            files,
            written: std::collections::HashMap::new(),
        })
    }

    /// Which harness this is.
    pub fn harness(&self) -> Harness {
        self.harness
    }

    /// The path of a file holding `pem`, for a request's `ca`, `cert` or `key`: written on
    /// first use (0600), the same path for the same material after.
    pub fn file(&mut self, pem: &str) -> Result<String, HarnessError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(path) = self.written.get(pem) {
            return Ok(path.clone());
        }
        let path = self
            .files
            .path()
            .join(format!("{}.pem", self.written.len() + 1));
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(pem.as_bytes()))
            .map_err(|e| HarnessError::Protocol {
                harness: self.harness.name(),
                what: format!("writing {}: {e}", path.display()),
            })?;
        let path = path.display().to_string();
        self.written.insert(pem.to_owned(), path.clone());
        Ok(path)
    }

    /// Sends one request (a JSON object with `op`) and reads its answer.
    pub async fn call(&mut self, request: &Value) -> Result<ClientAnswer, HarnessError> {
        let name = self.harness.name();
        let protocol = |what: String| HarnessError::Protocol {
            harness: name,
            what,
        };
        let mut line = serde_json::to_string(request).map_err(|e| protocol(e.to_string()))?;
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| protocol(format!("writing a request: {e}")))?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, self.answers.next_line())
            .await
            .map_err(|_| protocol(format!("no answer within {CALL_TIMEOUT:?}")))?
            .map_err(|e| protocol(format!("reading an answer: {e}")))?
            .ok_or_else(|| protocol("it exited".into()))?;
        if answer.len() > MAX_ANSWER {
            return Err(protocol(format!("an answer of {} bytes", answer.len())));
        }
        parse_answer(&answer).map_err(protocol)
    }
}

/// One answer line: `{"status","message","decoded"?}`, `{"unsendable"}` or `{"error"}`.
pub fn parse_answer(line: &str) -> Result<ClientAnswer, String> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!("an answer that is not JSON ({e}): {line}"))?;
    if let Some(error) = value.get("error") {
        return Err(format!("the harness failed: {error}"));
    }
    if let Some(why) = value.get("unsendable").and_then(Value::as_str) {
        return Ok(ClientAnswer::Unsendable(why.to_owned()));
    }
    let status = value
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| format!("an answer without a status: {line}"))?;
    Ok(ClientAnswer::Answered {
        status,
        message: value
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        decoded: value.get("decoded").filter(|d| !d.is_null()).cloned(),
    })
}

/// A request with `op` and the fields of `rest` (an object).
pub fn request(op: &str, rest: Value) -> Value {
    let mut request = json!({ "op": op });
    if let (Some(fields), Some(target)) = (rest.as_object(), request.as_object_mut()) {
        target.extend(fields.clone());
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_strictly() {
        assert_eq!(
            parse_answer(r#"{"status":403,"message":"no"}"#).unwrap(),
            ClientAnswer::Answered {
                status: 403,
                message: "no".into(),
                decoded: None
            }
        );
        assert_eq!(
            parse_answer(r#"{"unsendable":"a form only"}"#).unwrap(),
            ClientAnswer::Unsendable("a form only".into())
        );
        for bad in [
            "",
            "not json",
            "[]",
            r#"{"message":"no status"}"#,
            r#"{"status":70000}"#,
            r#"{"status":-1}"#,
            r#"{"error":"NullPointerException"}"#,
        ] {
            assert!(parse_answer(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_missing_tool_is_named_with_how_to_build_it() {
        let err = cli("zts-no-such-tool").unwrap_err().to_string();
        assert!(err.contains("zts-no-such-tool"), "{err}");
        assert!(err.contains("run harness/peers/athenz/build"), "{err}");
    }

    #[test]
    fn a_request_carries_its_op_and_fields() {
        let r = request(
            "register",
            json!({"url": "https://zts", "body": {"csr": "x"}}),
        );
        assert_eq!(r["op"], "register");
        assert_eq!(r["body"]["csr"], "x");
    }
}
