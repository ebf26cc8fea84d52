//! What stops the check as a whole.
//!
//! A source file that does not parse is *not* one of these: it is a [`Problem`] in the report, so
//! one bad file names itself and the other rules still run on everything else.

use std::path::PathBuf;

/// A failure that leaves no report to print: the workspace itself cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file the check needs (a Cargo.toml, a directory listing) could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A Cargo.toml is not valid TOML.
    #[error("parsing {path}: {source}")]
    Toml {
        /// The manifest.
        path: PathBuf,
        /// The parser's error.
        source: Box<toml::de::Error>,
    },
    /// A Cargo.toml is valid TOML but not the shape the check relies on.
    #[error("{path}: {message}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// No Cargo.toml with a `[workspace]` table above the starting directory.
    #[error("no workspace Cargo.toml at or above {0}")]
    NoWorkspace(PathBuf),
    /// `git ls-files` could not run or failed (the design rules read the tracked files).
    #[error("listing tracked files with git in {root}: {message}")]
    Git {
        /// The repository root.
        root: PathBuf,
        /// What git said, or why it did not start.
        message: String,
    },
}

impl Error {
    /// An I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// A file the check could not read as Rust (or a module whose file is missing): reported, not fatal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// The file, relative to the repository root once the report is assembled.
    pub file: PathBuf,
    /// What went wrong, with a line where there is one.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}
