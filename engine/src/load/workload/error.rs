//! The workload file's errors: each names the file, the line when it could be found, and the
//! section and field at fault when there is one. The CLI turns them into anyhow errors.

use std::fmt;
use std::path::PathBuf;

/// Where in a workload file: `file:line`, or `file` when the line could not be found.
#[derive(Debug, Clone)]
pub struct Loc {
    pub file: PathBuf,
    pub line: Option<usize>,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "{}:{}", self.file.display(), n),
            None => write!(f, "{}", self.file.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be read (the I/O error is part of the message, not a source, so the
    /// CLI's `{err:#}` says it once).
    #[error("{}: cannot read: {error}", file.display())]
    Read { file: PathBuf, error: std::io::Error },
    /// Not TOML.
    #[error("{}: {message}", file.display())]
    Syntax { file: PathBuf, message: String },
    /// A key the section does not have.
    #[error("{at}: unknown key '{key}' in {section} (expected one of: {expected})")]
    UnknownKey { at: Loc, section: String, key: String, expected: String },
    /// A field whose value has the wrong type or is out of range.
    #[error("{at}: {section} {field}: expected {expected}")]
    Field { at: Loc, section: String, field: String, expected: String },
    /// Anything else the file gets wrong, said in words.
    #[error("{at}: {message}")]
    Invalid { at: Loc, message: String },
}
