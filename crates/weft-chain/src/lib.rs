//! An error and its causes in one line, `a: b: c`: the one place weft turns an error chain
//! into text.
//!
//! Clients of HTTP libraries need it: reqwest's own message is "error sending request for url
//! (...)" and the reason (connection refused, a certificate that is not the pinned one, a
//! reset) is only in its `source()` chain. Layers often repeat their cause's text in their own
//! message; a cause whose text is already in the line is left out, so the line says each thing
//! once.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::error::Error;

/// `e` and each of its causes, `: `-joined, skipping a cause whose text an earlier part
/// already holds.
pub fn error_chain(e: &dyn Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = c.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    #[test]
    fn causes_follow_the_error_in_order() {
        let e = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "error sending request: client error (Connect): Connection refused (os error 111)"
        );
    }

    #[test]
    fn a_cause_already_said_and_an_empty_one_are_left_out() {
        let e = Layer(
            "tls handshake: invalid peer certificate: UnknownIssuer",
            Some(Box::new(Layer(
                "invalid peer certificate: UnknownIssuer",
                Some(Box::new(Layer("", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "tls handshake: invalid peer certificate: UnknownIssuer"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
