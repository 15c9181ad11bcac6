//! Local token counts with a Hugging Face `tokenizer.json`, always on the whole text: a text
//! cut into stream chunks is never tokenised chunk by chunk (that over-counts at every cut),
//! and a chunk is never taken for one token (that under-counts speculative decoding).

use std::path::{Path, PathBuf};

use crate::LlmError;

/// A loaded tokenizer.
pub struct Counter {
    tk: tokenizers::Tokenizer,
    pub path: PathBuf,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter").field("path", &self.path).finish()
    }
}

impl Counter {
    /// Loads `tokenizer.json` (or a folder holding one).
    pub fn from_file(path: &Path) -> Result<Counter, LlmError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let tk = tokenizers::Tokenizer::from_file(&file).map_err(|e| LlmError::Tokenizer {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        Ok(Counter { tk, path: file })
    }

    fn encode(&self, text: &str) -> Result<tokenizers::Encoding, LlmError> {
        self.tk
            .encode(text, false)
            .map_err(|e| LlmError::Tokenizer {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Tokens in `text`, without special tokens.
    pub fn count(&self, text: &str) -> Result<usize, LlmError> {
        Ok(self.encode(text)?.len())
    }

    /// The start of `text` that holds exactly `n` tokens; `None` when `text` holds fewer.
    pub fn cut(&self, text: &str, n: usize) -> Result<Option<String>, LlmError> {
        let enc = self.encode(text)?;
        if enc.len() < n {
            return Ok(None);
        }
        if n == 0 {
            return Ok(Some(String::new()));
        }
        let mut end = enc.get_offsets()[n - 1].1.min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let mut s = text[..end].to_string();
        // A cut inside a word can re-tokenise differently; step back a character at a time.
        for _ in 0..8 {
            let k = self.count(&s)?;
            if k <= n {
                break;
            }
            s.pop();
        }
        Ok(Some(s))
    }

    /// Tokens of each chunk of a stream, found by tokenising the whole text once and giving
    /// each token to the chunk where it ends.
    pub fn per_chunk(&self, chunks: &[&str]) -> Result<Vec<u64>, LlmError> {
        let whole: String = chunks.concat();
        let enc = self.encode(&whole)?;
        let mut ends = Vec::with_capacity(chunks.len());
        let mut at = 0usize;
        for c in chunks {
            at += c.len();
            ends.push(at);
        }
        let mut out = vec![0u64; chunks.len()];
        for &(_, end) in enc.get_offsets() {
            let i = ends
                .partition_point(|&e| e < end)
                .min(chunks.len().saturating_sub(1));
            if let Some(o) = out.get_mut(i) {
                *o += 1;
            }
        }
        Ok(out)
    }
}

/// Spreads `total` tokens over chunks in proportion to their bytes (at least one per chunk
/// while tokens last): the estimate when neither token ids nor a tokenizer are at hand.
pub fn spread(total: u64, chunks: &[&str]) -> Vec<u64> {
    let n = chunks.len();
    if n == 0 {
        return Vec::new();
    }
    let bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum::<u64>().max(1);
    let mut out: Vec<u64> = chunks
        .iter()
        .map(|c| total * c.len() as u64 / bytes)
        .collect();
    let mut left = total.saturating_sub(out.iter().sum());
    // Give what rounding left over to empty chunks first, then from the front.
    for o in out.iter_mut().filter(|o| **o == 0) {
        if left == 0 {
            break;
        }
        *o += 1;
        left -= 1;
    }
    let mut i = 0;
    while left > 0 {
        out[i % n] += 1;
        left -= 1;
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreading_keeps_the_total_and_follows_the_bytes() {
        assert_eq!(spread(10, &["aaaa", "a", "aaaaa"]), vec![4, 1, 5]);
        assert_eq!(spread(3, &["a", "b", "c"]).iter().sum::<u64>(), 3);
        assert_eq!(spread(7, &["abc", "d"]).iter().sum::<u64>(), 7);
        assert_eq!(spread(0, &[]), Vec::<u64>::new());
    }
}
