//! Errors of discovery. Each names the file it is about.

use std::io;
use std::path::PathBuf;

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// A file that must be there could not be read (a missing optional file is not an error).
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file, root prefix included.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A file's content is not what the kernel writes there.
    #[error("{}: cannot parse `{content}`: {reason}", path.display())]
    Parse {
        /// The file, root prefix included.
        path: PathBuf,
        /// The content (trimmed, cut at 200 characters).
        content: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A system call (not a file) failed on a live host.
    #[error("{call}: {source}")]
    Sys {
        /// The call, for example `getifaddrs`.
        call: &'static str,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

impl DiscoverError {
    pub(crate) fn parse(
        path: impl Into<PathBuf>,
        content: &str,
        reason: impl Into<String>,
    ) -> Self {
        const MAX: usize = 200;
        let content = match content.char_indices().nth(MAX) {
            Some((cut, _)) => format!("{}...", &content[..cut]),
            None => content.to_string(),
        };
        DiscoverError::Parse {
            path: path.into(),
            content,
            reason: reason.into(),
        }
    }

    /// The file the error is about, if it is about one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            DiscoverError::Read { path, .. } | DiscoverError::Parse { path, .. } => Some(path),
            DiscoverError::Sys { .. } => None,
        }
    }
}
