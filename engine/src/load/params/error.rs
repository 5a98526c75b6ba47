//! What a workload file can get wrong in a request parameter or a session variable. The
//! workload parser ([`crate::load::workload`]) puts the file, the line and the page or variable
//! in front (`wl.toml:12: page 'View' params.id: uniform: lo 9 > hi 1`); these say the rest:
//! the parameter kind or key at fault, what was expected, and what was given.

use std::path::PathBuf;

/// The parameter kinds a table can give, in the order the messages list them (`learn` is a
/// modifier a session variable may add, or a kind of its own).
pub const KINDS: [&str; 9] = ["uniform", "nurand", "words", "words_file", "text", "choice", "extract", "digsyl", "when"];

#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    /// A template with a `{` that no `}` closes.
    #[error("unclosed '{{' in \"{template}\"")]
    UnclosedBrace { template: String },
    /// A `{...}` that is not a variable name.
    #[error("bad placeholder {{{name}}} in \"{template}\" (expected {{name}} with letters, digits, _)")]
    BadPlaceholder { template: String, name: String },
    /// Neither a string (a template), an integer nor a table.
    #[error("expected a string or a table like {{ uniform = [1, 10] }}, got {got}")]
    NotAParameter { got: String },
    /// A table without any of the kinds.
    #[error("expected a string or one of {{ {} }}", KINDS.join(", "))]
    NoKind,
    /// A table with two kinds or more.
    #[error("give one of {} (got {})", KINDS.join(", "), kinds.join(" and "))]
    SeveralKinds { kinds: Vec<String> },
    /// A key the kind does not take.
    #[error("{kind}: unknown key '{key}' (expected {})", expected.join(", "))]
    UnknownKey { kind: String, key: String, expected: Vec<&'static str> },
    /// A value of the wrong type or shape (`uniform = 3`, `lower = "yes"`, `nurand = [1, 2]`).
    #[error("{field}: expected {expected}, got {got}")]
    WrongType { field: String, expected: &'static str, got: String },
    /// A number out of its range (`blank = 2`, `syllables = -1`, `skip = -1`).
    #[error("{field}: expected {expected}, got {got}")]
    OutOfRange { field: String, expected: &'static str, got: String },
    /// A range whose low end is above its high end (`uniform`, `text`).
    #[error("{kind}: lo {lo} > hi {hi}")]
    Reversed { kind: String, lo: i64, hi: i64 },
    /// TPC-W's NURand(A, x, y) needs A >= 0 and x <= y.
    #[error("nurand: expected A >= 0 and x <= y, got [{a}, {x}, {y}]")]
    NURand { a: i64, x: i64, y: i64 },
    /// `words` or `choice` with no strings.
    #[error("{kind}: the list is empty")]
    EmptyList { kind: String },
    /// A `words_file` that cannot be read (the I/O error is part of the message).
    #[error("words_file {}: {error}", path.display())]
    WordsFile { path: PathBuf, error: std::io::Error },
    /// A `words_file` without a word.
    #[error("words_file {}: no words", path.display())]
    NoWords { path: PathBuf },
    /// A regex that does not compile (`extract`, `learn`).
    #[error("{kind}: bad regex: {error}")]
    BadRegex { kind: &'static str, error: regex::Error },
    /// A regex without the capture group the value is taken from.
    #[error("{kind}: the regex '{regex}' needs a capture group (...){}", if *kind == "extract" { " (or give value = \"...\")" } else { "" })]
    NoCaptureGroup { kind: &'static str, regex: String },
    /// `extract` where there is no previous response (a session variable).
    #[error("extract is only possible in page params/form (there is no previous response for a session variable)")]
    ExtractOutsidePage,
    /// `learn` outside the session variables.
    #[error("learn is only possible for session variables ([session_vars] or a session type's vars)")]
    LearnOutsideSession,
    /// A parameter nested in another one (`digsyl`, `when`'s condition and branches, `extract`'s
    /// `otherwise`) is wrong: `within` names the place.
    #[error("{within}: {error}{}", if *within == "extract otherwise" { " (or \"back\" / \"restart\")" } else { "" })]
    Nested { within: &'static str, error: Box<ParamError> },
}

impl ParamError {
    /// The innermost error of a nest (`digsyl: when: ...` gives the `when`'s).
    #[cfg(test)]
    pub fn innermost(&self) -> &ParamError {
        match self {
            ParamError::Nested { error, .. } => error.innermost(),
            e => e,
        }
    }
}
