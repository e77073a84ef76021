//! Command-line usage errors: a message naming the flag, setting or field, and exit
//! code 64 (EX_USAGE), distinct from runtime failures (exit 1).

/// The exit code of a usage error (sysexits.h `EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

/// Bad input on the command line, in the environment or in a config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl UsageError {
    /// A usage error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// The exit code for an error returned to `main`: 64 for usage errors, 1 otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<UsageError>().is_some() {
        EXIT_USAGE
    } else {
        1
    }
}
