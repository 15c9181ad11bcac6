//! The files the pages load, built into the binary: htmx and its server-sent-events
//! extension (from the npm registry, pinned: `assets/README.md` says which versions and
//! the registry's integrity hashes; a test checks each file's SHA-256 here), and our CSS.

use axum::http::header;
use axum::response::IntoResponse;

/// One embedded file.
pub struct Asset {
    /// Its URL under `/console/assets/`.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// The bytes.
    pub bytes: &'static [u8],
    /// The SHA-256 the vendored file must have (`None` for our own files).
    pub sha256: Option<&'static str>,
}

/// Every file the console serves under `/console/assets/`.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "htmx.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/htmx.min.js"),
        sha256: Some("22283ef68cb7545914f0a88a1bdedc7256a703d1d580c1d255217d0a50d31313"),
    },
    Asset {
        name: "htmx-ext-sse.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/htmx-ext-sse.min.js"),
        sha256: Some("98a46496de0c3605fbffdce9167ba427bdd9553184f83f149c261891a92c0136"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../assets/console.css"),
        sha256: None,
    },
];

/// The asset named `name`, served immutable (the URL carries no version, so only a day).
pub fn serve(name: &str) -> axum::response::Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.content_type),
                (header::CACHE_CONTROL, "private, max-age=86400"),
            ],
            a.bytes,
        )
            .into_response(),
        None => (axum::http::StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vendored files are byte for byte the ones pinned (a changed file is a
    /// deliberate update of the pin in `assets/README.md` and here).
    #[test]
    fn vendored_files_have_their_pinned_sha256() {
        for a in ASSETS {
            if let Some(want) = a.sha256 {
                assert_eq!(sha256_hex(a.bytes), want, "{}", a.name);
            }
        }
        let readme = include_str!("../assets/README.md");
        for a in ASSETS.iter().filter(|a| a.sha256.is_some()) {
            assert!(
                readme.contains(a.sha256.unwrap_or_default()),
                "assets/README.md names the SHA-256 of {}",
                a.name
            );
        }
    }
}
