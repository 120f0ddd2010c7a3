//! The error that ends a command, and the exit statuses it carries.

/// Exit status of a command that ran and found that what it checked does
/// not work (a path that does not work, a failed transfer).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit status of bad usage or a bad config file.
pub(crate) const EXIT_USAGE: u8 = 2;

/// An error that ends the command: its one-line message and exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    /// Bad usage or configuration ([`EXIT_USAGE`]).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
    /// The command ran and what it checked does not work ([`EXIT_FAILED`]).
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_FAILED,
            message: message.into(),
        }
    }
}
