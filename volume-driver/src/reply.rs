//! The one JSON object the driver prints, and its exit code (docs/design.md §4.1).

use serde::Serialize;

/// Flex driver status values kubelet understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    /// The command worked.
    Success,
    /// The command failed; kubelet retries.
    Failure,
    /// The driver does not implement the command.
    #[serde(rename = "Not supported")]
    NotSupported,
}

/// Driver capabilities reported by `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// No attach/detach: the volume is node-local.
    pub attach: bool,
}

/// The answer to kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reply {
    /// Outcome.
    pub status: Status,
    /// Why, for Failure and Not supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Only for `init`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
}

impl Reply {
    /// `{"status":"Success"}`.
    pub fn success() -> Self {
        Self {
            status: Status::Success,
            message: None,
            capabilities: None,
        }
    }

    /// The `init` answer.
    pub fn init() -> Self {
        Self {
            capabilities: Some(Capabilities { attach: false }),
            ..Self::success()
        }
    }

    /// A failure with a message.
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            status: Status::Failure,
            message: Some(message.into()),
            capabilities: None,
        }
    }

    /// A command the driver does not implement.
    pub fn not_supported(command: &str) -> Self {
        Self {
            status: Status::NotSupported,
            message: Some(format!(
                "{} is not supported by athenz/volume-driver",
                athenz_core::names::Quoted::new(command)
            )),
            capabilities: None,
        }
    }

    /// The line to print: the JSON object and a newline.
    pub fn to_line(&self) -> String {
        // Serialising these plain types cannot fail; keep a hand-written fallback all the same so
        // that exactly one object is always printed.
        let json = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"status":"Failure","message":"cannot encode the reply"}"#.to_owned()
        });
        format!("{json}\n")
    }

    /// 0 for Success and Not supported, 1 for Failure.
    pub fn exit_code(&self) -> i32 {
        match self.status {
            Status::Success | Status::NotSupported => 0,
            Status::Failure => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_shapes() {
        assert_eq!(
            Reply::init().to_line(),
            "{\"status\":\"Success\",\"capabilities\":{\"attach\":false}}\n"
        );
        assert_eq!(Reply::success().to_line(), "{\"status\":\"Success\"}\n");
        assert_eq!(
            Reply::failure("x \"y\"").to_line(),
            "{\"status\":\"Failure\",\"message\":\"x \\\"y\\\"\"}\n"
        );
        assert_eq!(
            Reply::not_supported("attach").to_line(),
            "{\"status\":\"Not supported\",\"message\":\"\\\"attach\\\" is not supported by athenz/volume-driver\"}\n"
        );
        assert_eq!(Reply::failure("x").exit_code(), 1);
        assert_eq!(Reply::not_supported("x").exit_code(), 0);
    }
}
